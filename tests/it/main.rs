//! The integration suite: one binary, real PostgreSQL, RabbitMQ and Redis.

#[path = "../common/mod.rs"]
mod common;

mod cli;
mod pipeline;
mod schema;
mod services;
