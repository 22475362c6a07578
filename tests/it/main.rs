//! The integration suite: one binary, real PostgreSQL, RabbitMQ and Redis.

// The test kit (crates/seckill-testkit), under the name the tests use for it.
use seckill_testkit as common;

mod admin;
mod background;
mod cluster;
mod commands;
mod deploy;
mod docs;
mod door;
mod faults;
mod front_client;
mod frontstage;
mod group_commit;
mod ha;
mod health;
mod live_page;
mod openapi;
mod outages;
mod pipeline;
mod pool;
mod roles;
mod scale_out;
mod schema;
mod serve;
mod services;
mod tls;
