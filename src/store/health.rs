//! The gauge sampler's reads for "is the sale healthy?" (seed §12.2): the stock of
//! each bucket of a live sale, lock waits, deadlocks and the WAL position, the
//! health of each table and the lag of each standby. Each is one cheap, read-only
//! statement over catalog views or a handful of rows.

use tokio_postgres::Client;

use super::diagnose::{standby, table_health, Standby, TableHealth, STANDBYS, TABLES};
use crate::domain::status::ActivityStatus;

/// One bucket of a live sale.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveBucket {
    pub activity_id: i64,
    pub sku_id: i64,
    pub bucket: i16,
    pub available: i32,
    pub allocated: i32,
    /// When the bucket last changed (an order, a give-back).
    pub updated_at: chrono::DateTime<chrono::Utc>,
}

/// The buckets of every live sale: published or running, started, not ended.
pub async fn live_buckets(client: &Client) -> Result<Vec<LiveBucket>, tokio_postgres::Error> {
    Ok(client
        .query(LIVE_BUCKETS, &live_statuses())
        .await?
        .iter()
        .map(|r| LiveBucket {
            activity_id: r.get(0),
            sku_id: r.get(1),
            bucket: r.get(2),
            available: r.get(3),
            allocated: r.get(4),
            updated_at: r.get(5),
        })
        .collect())
}

/// The live sales (as `live_buckets` defines them).
pub async fn live_activities(client: &Client) -> Result<Vec<i64>, tokio_postgres::Error> {
    Ok(client
        .query(LIVE_ACTIVITIES, &live_statuses())
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

fn live_statuses() -> [&'static (dyn tokio_postgres::types::ToSql + Sync); 2] {
    const PUBLISHED: i16 = ActivityStatus::Published.code();
    const RUNNING: i16 = ActivityStatus::Running.code();
    [&PUBLISHED, &RUNNING]
}

/// Sessions of this database waiting for a lock, and the longest wait so far.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LockWaits {
    pub sessions: i64,
    pub longest_seconds: f64,
}

pub async fn lock_waits(client: &Client) -> Result<LockWaits, tokio_postgres::Error> {
    let row = client.query_one(LOCK_WAITS, &[]).await?;
    Ok(LockWaits {
        sessions: row.get(0),
        longest_seconds: row.get(1),
    })
}

/// Server-wide figures: deadlocks detected in this database, and the WAL position
/// (replayed, on a standby).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DatabaseStats {
    pub deadlocks: i64,
    pub wal_bytes: i64,
}

pub async fn database_stats(client: &Client) -> Result<DatabaseStats, tokio_postgres::Error> {
    let row = client.query_one(DATABASE_STATS, &[]).await?;
    Ok(DatabaseStats {
        deadlocks: row.get(0),
        wal_bytes: row.get(1),
    })
}

/// Dead rows and last vacuum of every table of the engine's schema.
pub async fn tables(client: &Client) -> Result<Vec<TableHealth>, tokio_postgres::Error> {
    Ok(client
        .query(TABLES, &[])
        .await?
        .iter()
        .map(table_health)
        .collect())
}

/// The standbys this server streams to (none on a standby).
pub async fn standbys(client: &Client) -> Result<Vec<Standby>, tokio_postgres::Error> {
    Ok(client
        .query(STANDBYS, &[])
        .await?
        .iter()
        .map(standby)
        .collect())
}

const LIVE_BUCKETS: &str = "
SELECT i.activity_id, i.sku_id, i.bucket_no, i.available_stock, i.allocated_stock,
       i.updated_at
FROM sku_inventory AS i
JOIN seckill_activity AS a ON a.activity_id = i.activity_id
WHERE a.status IN ($1, $2)
  AND a.start_at <= statement_timestamp() AND a.end_at > statement_timestamp()
ORDER BY i.activity_id, i.sku_id, i.bucket_no";

const LIVE_ACTIVITIES: &str = "
SELECT activity_id FROM seckill_activity
WHERE status IN ($1, $2)
  AND start_at <= statement_timestamp() AND end_at > statement_timestamp()
ORDER BY activity_id";

const LOCK_WAITS: &str = "
SELECT count(*),
       coalesce(max(extract(epoch FROM statement_timestamp() - state_change)), 0)::float8
FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock'";

const DATABASE_STATS: &str = "
SELECT coalesce((SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()), 0),
       pg_wal_lsn_diff(
           CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()
                ELSE pg_current_wal_lsn() END,
           '0/0')::int8";
