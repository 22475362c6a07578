//! The integration suite: one binary, real PostgreSQL, RabbitMQ and Redis.

#[path = "../common/mod.rs"]
mod common;

mod admin;
mod background;
#[cfg(feature = "chaos")]
mod chaos;
mod cli;
mod deploy;
mod frontstage;
mod group_commit;
mod pipeline;
mod pool;
mod schema;
mod services;
