//! seckill-engine: the PostgreSQL side of a flash-sale order system, built as actors.
//! docs/DESIGN.md holds the promises, the topology and the full map of files;
//! `main.rs` only wires the CLI. Comments cite the reference chapter the design grew
//! from (the *seed*) as `§N.N`; DESIGN's "Reference sections" says what each is.
//!
//! # Layout
//!
//! Imports point down this list, never up or sideways (`tests/layout.rs` holds the
//! allowed arrows; DESIGN, "Allowed imports").
//!
//! - [`cli`]: one file per command; [`startup`]: the one composition root of `serve`.
//! - [`http`]: the admin listener, the operator API, the live page, buyer identity
//!   (`http::auth`: where a JWT is verified), rate limits; [`http::front`]: the front
//!   stage, one file per concern (`buyer`, `reserve`, `purchase_token`, `lookups`,
//!   `sku_cache`, `links`, `state`, `answers`).
//! - [`engine`]: builds the running engine in named phases.
//! - [`actors`]: the order pipeline (intake → DB permits → reservation → bucket).
//! - [`services`]: background services under the supervisor (outbox publisher,
//!   sweeper, compensation worker, reconciler, retention, gauges, readiness).
//! - [`drift`]: Redis against PostgreSQL, per bucket; [`rebuild`]: Redis rewritten
//!   from PostgreSQL when a sale's keys are lost.
//! - [`store`]: all SQL (the order transaction in `store::orders`; a commit with an
//!   unknown outcome is classified in `store::tx`, and sent back for redelivery by
//!   `actors::intake`); [`mq`]: AMQP; [`redis`]: every
//!   Redis command (the reserve script, which decides a reservation's bucket, in
//!   `redis::scripts`).
//! - [`contracts`]: the AsyncAPI document and JSON Schemas of the messages,
//!   generated from the types sent (docs/contracts/).
//! - [`status`]: the live state the parts share; [`telemetry`]: logs and metrics.
//! - [`config`]: the settings tree, each section validated next to its definition;
//!   [`tls`]: the one TLS stack; [`failpoints`]: the fault suite's crash points.
//! - [`domain`]: pure types and rules, no I/O.

/// The version and the commit it was built from (`--version`, the admin `/status`).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("SECKILL_COMMIT"),
    ")"
);

pub mod actors;
pub mod cli;
pub mod config;
pub mod contracts;
pub mod cores;
pub mod domain;
pub mod drift;
pub mod engine;
pub mod failpoints;
pub mod http;
pub mod mq;
pub mod rebuild;
pub mod redis;
pub mod services;
pub mod startup;
pub mod status;
pub mod store;
pub mod telemetry;
pub mod tls;
