//! seckill-engine: the PostgreSQL side of a flash-sale order system, built as actors.
//! See DESIGN.md for the promises and the topology; `main.rs` only wires the CLI.

pub mod actors;
pub mod cli;
pub mod config;
pub mod domain;
pub mod drift;
pub mod engine;
pub mod failpoints;
pub mod http;
pub mod mq;
pub mod redis;
pub mod services;
pub mod startup;
pub mod status;
pub mod store;
pub mod telemetry;
pub mod tls;
