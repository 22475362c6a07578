//! PostgreSQL: the connection pool, migrations, and one module per flow with its SQL
//! next to the Rust that runs it. Everything the engine promises is decided here,
//! inside transactions; the actors only decide *when* these functions run.
//!
//! The pool is `pool` (its queue and how it is built), `manager` (how a connection
//! is opened and checked), `conn` (a connection with its statement cache and
//! warnings), `target` (the URLs and their TLS), `replica` (the replica pool) and
//! `error` (`StoreError`), all re-exported here; this file keeps what the flows
//! share.

pub mod activity;
pub mod compensation;
mod conn;
pub mod diagnose;
mod error;
pub mod grants;
pub mod health;
mod inbox;
pub mod invariants;
pub mod maintain;
mod manager;
pub mod migrate;
pub mod node_lease;
pub mod ops;
pub mod orders;
pub mod outbox;
pub mod payments;
mod pool;
pub mod primary;
pub mod reads;
pub mod reconcile;
mod replica;
pub mod retention;
pub mod sqlstate;
pub mod sweeps;
mod target;
pub mod topology;
pub(crate) mod tx;
pub mod wal;

use std::time::Duration;

use tokio_postgres::Client;

pub use conn::{PgConn, StatementCache, Warnings};
pub use error::{describe, StoreError};
pub use manager::PgManager;
pub use pool::{build_pool, build_pool_on, Pool, PoolState, PooledConn};
pub use replica::build_replica_pool;
pub use target::{admin_pg_config, owner_pg_config, pg_config, PgTarget};

/// Set in the transaction of a batch claim (`outbox::claim`, `compensation::claim`:
/// `ORDER BY` the ready index `FOR UPDATE SKIP LOCKED LIMIT n`) and of the backlog
/// gauges (`ops::backlog`), so that each walks its index in order and stops after n
/// rows. On a table never analyzed (a sale's fresh tables; autovacuum lags or is
/// off) the planner guessed about 150 ready rows and chose a bitmap scan of every
/// ready row and a sort: during a sale, when nearly every event waits, each outbox
/// claim read and sorted all of them (62 ms and a 3.8 MB temporary file at 80,000
/// events; it runs every second while orders flow). Without bitmap scans, sorts and
/// sequential scans the index is the way left, at any size and with any statistics
/// (docs/benchmarks-history.md, 2026-12-01, 48bb2c2).
const INDEX_WALK: &str = "
SET LOCAL enable_bitmapscan = off;
SET LOCAL enable_sort = off;
SET LOCAL enable_seqscan = off";

/// A duration as whole milliseconds, for `$n::bigint * interval '1 millisecond'`.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Connects one client outside the pool (migrations, CLI commands).
pub async fn connect(target: &PgTarget) -> Result<Client, tokio_postgres::Error> {
    let (tls, encrypted) = target.tls.connector();
    let (client, connection) = target.config.connect(tls).await?;
    target.tls.opened(&encrypted);
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "PostgreSQL connection closed");
        }
    });
    Ok(client)
}

/// A round trip on the connection (readiness).
pub async fn ping(client: &Client) -> Result<(), tokio_postgres::Error> {
    client.simple_query("SELECT 1").await.map(|_| ())
}
