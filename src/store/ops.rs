//! Operator queries: the backlog gauges (outbox and compensation work waiting, and how
//! old the oldest is), the outbox summary, DEAD outbox rows and their retry, and the
//! compensation tasks that need a person. Read-mostly; the one write (retrying DEAD
//! outbox rows) only moves rows that are still DEAD.

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use super::{Pool, StoreError};

/// Work waiting in PostgreSQL, for the gauges. Each count stops at
/// `BACKLOG_COUNT_CAP`; the oldest ages are exact while fewer rows than that are
/// SENDING (RUNNING), as leases keep them.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Backlog {
    /// Outbox rows not yet published (PENDING, SENDING, RETRY).
    pub outbox_pending: i64,
    pub outbox_oldest_pending_age_seconds: f64,
    pub outbox_dead: i64,
    /// Compensation tasks not yet done (PENDING, RUNNING, RETRY).
    pub compensation_pending: i64,
    pub compensation_oldest_pending_age_seconds: f64,
    /// DEAD or MANUAL_REVIEW compensation tasks.
    pub compensation_manual_review: i64,
}

/// The backlog counts read at most this many rows each, and report at most this
/// many. During a sale the outbox yields to the orders and its backlog grows by
/// every order; counted in full every few seconds, 80,000 waiting events took a
/// core for 37 ms on a clean table and for hundreds on one just written, in the
/// middle of the sale, and the orders committed then were the run's slowest
/// (docs/benchmarks-history.md, 2026-12-04, d8589e7). The oldest age, not the count, is the signal
/// to alert on.
pub const BACKLOG_COUNT_CAP: i64 = 10_000;

pub async fn backlog(pool: &Pool) -> Result<Backlog, StoreError> {
    let mut conn = pool.get().await?;
    let tx = conn.client.transaction().await?;
    tx.batch_execute(super::INDEX_WALK).await?;
    let row = tx.query_one(BACKLOG, &[&BACKLOG_COUNT_CAP]).await?;
    tx.commit().await?;
    Ok(Backlog {
        outbox_pending: row.get(0),
        outbox_oldest_pending_age_seconds: row.get(1),
        outbox_dead: row.get(2),
        compensation_pending: row.get(3),
        compensation_oldest_pending_age_seconds: row.get(4),
        compensation_manual_review: row.get(5),
    })
}

/// One line of the outbox summary.
#[derive(Debug, Clone, Serialize)]
pub struct OutboxStatusCount {
    pub status: &'static str,
    pub count: i64,
    pub oldest_created_at: Option<DateTime<Utc>>,
}

pub async fn outbox_summary(pool: &Pool) -> Result<Vec<OutboxStatusCount>, StoreError> {
    let rows = pool.get().await?.client.query(OUTBOX_SUMMARY, &[]).await?;
    Ok(rows
        .iter()
        .map(|r| OutboxStatusCount {
            status: outbox_status_name(r.get(0)),
            count: r.get(1),
            oldest_created_at: r.get(2),
        })
        .collect())
}

fn outbox_status_name(status: i16) -> &'static str {
    match status {
        0 => "PENDING",
        10 => "SENDING",
        20 => "SENT",
        30 => "RETRY",
        40 => "DEAD",
        _ => "UNKNOWN",
    }
}

/// A DEAD outbox row (its payload stays in the database).
#[derive(Debug, Clone, Serialize)]
pub struct DeadEvent {
    pub event_id: Uuid,
    pub tag: String,
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub retry_count: i32,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

pub async fn dead_events(pool: &Pool, limit: i64) -> Result<Vec<DeadEvent>, StoreError> {
    let rows = pool
        .get()
        .await?
        .client
        .query(DEAD_EVENTS, &[&limit])
        .await?;
    Ok(rows
        .iter()
        .map(|r| DeadEvent {
            event_id: r.get(0),
            tag: r.get(1),
            aggregate_type: r.get(2),
            aggregate_id: r.get(3),
            retry_count: r.get(4),
            last_error: r.get(5),
            created_at: r.get(6),
            updated_at: r.get(7),
        })
        .collect())
}

/// Gives DEAD outbox rows (one, or all when `event_id` is `None`) a fresh set of
/// attempts; the publisher picks them up on its next run. Returns how many moved.
pub async fn retry_dead_events(pool: &Pool, event_id: Option<Uuid>) -> Result<u64, StoreError> {
    let conn = pool.get().await?;
    Ok(conn.client.execute(RETRY_DEAD_EVENTS, &[&event_id]).await?)
}

/// A compensation task that gave up or needs a decision.
#[derive(Debug, Clone, Serialize)]
pub struct ReviewTask {
    pub task_id: Uuid,
    pub task_type: i16,
    pub status: &'static str,
    pub reservation_id: Option<Uuid>,
    pub order_id: Option<i64>,
    pub retry_count: i32,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

pub async fn compensation_review(pool: &Pool, limit: i64) -> Result<Vec<ReviewTask>, StoreError> {
    let rows = pool
        .get()
        .await?
        .client
        .query(COMPENSATION_REVIEW, &[&limit])
        .await?;
    Ok(rows
        .iter()
        .map(|r| ReviewTask {
            task_id: r.get(0),
            task_type: r.get(1),
            status: if r.get::<_, i16>(2) == 40 {
                "DEAD"
            } else {
                "MANUAL_REVIEW"
            },
            reservation_id: r.get(3),
            order_id: r.get(4),
            retry_count: r.get(5),
            last_error: r.get(6),
            created_at: r.get(7),
            updated_at: r.get(8),
        })
        .collect())
}

// Every count and age reads one partial index (the claim, lease-recovery, retry-age
// and terminal-state indexes), never the whole table, and at most $1 entries of it
// (with `INDEX_WALK`, also on tables never analyzed): SENT outbox rows stay for a
// day, a sale's events wait while it sells, and this runs every few seconds. A
// PENDING row's available_at (next_run_at) is its created_at, so the oldest ready
// row is either the ready index's first or the oldest RETRY row (V4's indexes); a
// SENDING (RUNNING) row holds a lease, so there are few of them. LEAST skips NULLs.
const BACKLOG: &str = "
SELECT
    LEAST($1,
        (SELECT count(*) FROM (SELECT FROM event_outbox WHERE status IN (0, 30) LIMIT $1) w)
        + (SELECT count(*) FROM (SELECT FROM event_outbox WHERE status = 10 LIMIT $1) s)),
    COALESCE(EXTRACT(EPOCH FROM statement_timestamp() - LEAST(
        (SELECT created_at FROM event_outbox WHERE status IN (0, 30)
         ORDER BY available_at, created_at, event_id LIMIT 1),
        (SELECT min(created_at) FROM event_outbox WHERE status = 30),
        (SELECT min(created_at)
         FROM (SELECT created_at FROM event_outbox WHERE status = 10 LIMIT $1) s)))::float8, 0),
    (SELECT count(*) FROM (SELECT FROM event_outbox WHERE status = 40 LIMIT $1) d),
    LEAST($1,
        (SELECT count(*) FROM (SELECT FROM compensation_task WHERE status IN (0, 30) LIMIT $1) w)
        + (SELECT count(*) FROM (SELECT FROM compensation_task WHERE status = 10 LIMIT $1) r)),
    COALESCE(EXTRACT(EPOCH FROM statement_timestamp() - LEAST(
        (SELECT created_at FROM compensation_task WHERE status IN (0, 30)
         ORDER BY next_run_at, created_at, task_id LIMIT 1),
        (SELECT min(created_at) FROM compensation_task WHERE status = 30),
        (SELECT min(created_at)
         FROM (SELECT created_at FROM compensation_task WHERE status = 10 LIMIT $1) r)))::float8,
        0),
    (SELECT count(*) FROM (SELECT FROM compensation_task WHERE status IN (40, 50) LIMIT $1) d)";

const OUTBOX_SUMMARY: &str = "
SELECT status, count(*), min(created_at)
FROM event_outbox
GROUP BY status
ORDER BY status";

const DEAD_EVENTS: &str = "
SELECT event_id, tag, aggregate_type, aggregate_id, retry_count, last_error, created_at,
       updated_at
FROM event_outbox
WHERE status = 40
ORDER BY updated_at, event_id
LIMIT $1";

const RETRY_DEAD_EVENTS: &str = "
UPDATE event_outbox
SET status = 30,
    retry_count = 0,
    available_at = statement_timestamp(),
    last_error = LEFT('RETRIED_BY_OPERATOR; was: ' || COALESCE(last_error, ''), 4000),
    updated_at = statement_timestamp()
WHERE status = 40
  AND ($1::uuid IS NULL OR event_id = $1)";

const COMPENSATION_REVIEW: &str = "
SELECT task_id, task_type, status, reservation_id, order_id, retry_count, last_error,
       created_at, updated_at
FROM compensation_task
WHERE status IN (40, 50)
ORDER BY updated_at, task_id
LIMIT $1";
