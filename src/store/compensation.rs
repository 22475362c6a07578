//! Compensation tasks: work outside PostgreSQL (Redis stock give-back, refund
//! requests, manual review) recorded in the transaction that decided it, then claimed
//! by workers with `FOR UPDATE SKIP LOCKED` under a lease and completed under fencing.

use std::time::Duration;

use tokio_postgres::{Client, Statement, Transaction};
use uuid::Uuid;

use super::{millis, StatementCache, StoreError};
use crate::domain::ids::new_uuid;
use crate::domain::status::{CompensationStatus, CompensationType};

/// A task to record inside the caller's transaction.
pub struct NewTask {
    pub task_type: CompensationType,
    /// One task per business action: a second insert with the same key is a no-op.
    pub idempotency_key: String,
    pub reservation_id: Option<Uuid>,
    pub order_id: Option<i64>,
    pub payload: serde_json::Value,
}

pub async fn insert_task(
    tx: &Transaction<'_>,
    st: &mut StatementCache,
    task: NewTask,
) -> Result<(), StoreError> {
    let status = initial_status(task.task_type);
    tx.execute(
        &st.get(tx, INSERT_TASK).await?,
        &[
            &new_uuid(),
            &task.idempotency_key,
            &task.task_type.code(),
            &task.reservation_id,
            &task.order_id,
            &task.payload,
            &status.code(),
        ],
    )
    .await?;
    Ok(())
}

/// Manual review is for people: it never enters the workers' ready queue.
fn initial_status(task_type: CompensationType) -> CompensationStatus {
    match task_type {
        CompensationType::ManualReview => CompensationStatus::ManualRequired,
        _ => CompensationStatus::Pending,
    }
}

/// Many tasks as the columns of one `INSERT_TASKS`, for set-based transactions.
#[derive(Default)]
pub struct TaskRows {
    task_ids: Vec<Uuid>,
    idempotency_keys: Vec<String>,
    task_types: Vec<i16>,
    reservation_ids: Vec<Option<Uuid>>,
    order_ids: Vec<Option<i64>>,
    payloads: Vec<serde_json::Value>,
    statuses: Vec<i16>,
}

impl TaskRows {
    pub fn push(&mut self, task: NewTask) {
        self.task_ids.push(new_uuid());
        self.idempotency_keys.push(task.idempotency_key);
        self.task_types.push(task.task_type.code());
        self.reservation_ids.push(task.reservation_id);
        self.order_ids.push(task.order_id);
        self.payloads.push(task.payload);
        self.statuses.push(initial_status(task.task_type).code());
    }

    /// Writes the rows inside the transaction open on `client`; `insert` is the
    /// prepared `INSERT_TASKS`, so several statements can be pipelined.
    pub async fn insert(
        &self,
        client: &Client,
        insert: &Statement,
    ) -> Result<(), tokio_postgres::Error> {
        if self.task_ids.is_empty() {
            return Ok(());
        }
        client
            .execute(
                insert,
                &[
                    &self.task_ids,
                    &self.idempotency_keys,
                    &self.task_types,
                    &self.reservation_ids,
                    &self.order_ids,
                    &self.payloads,
                    &self.statuses,
                ],
            )
            .await?;
        Ok(())
    }
}

#[derive(Debug, Clone)]
pub struct ClaimedTask {
    pub task_id: Uuid,
    pub task_type: i16,
    pub reservation_id: Option<Uuid>,
    pub order_id: Option<i64>,
    pub payload: serde_json::Value,
    pub retry_count: i32,
    pub max_retry: i32,
}

pub async fn claim(
    client: &mut Client,
    owner: &str,
    limit: i64,
) -> Result<Vec<ClaimedTask>, StoreError> {
    let tx = client.transaction().await?;
    tx.batch_execute(super::INDEX_WALK).await?;
    let rows = tx.query(CLAIM, &[&limit, &owner]).await?;
    tx.commit().await?;
    Ok(rows
        .iter()
        .map(|r| ClaimedTask {
            task_id: r.get(0),
            task_type: r.get(1),
            reservation_id: r.get(2),
            order_id: r.get(3),
            payload: r.get(4),
            retry_count: r.get(5),
            max_retry: r.get(6),
        })
        .collect())
}

/// RUNNING → SUCCEEDED, only while `owner` holds the lease.
pub async fn mark_done(client: &Client, task_id: Uuid, owner: &str) -> Result<bool, StoreError> {
    Ok(client.execute(MARK_DONE, &[&task_id, &owner]).await? == 1)
}

/// RUNNING → MANUAL_REQUIRED (a task type no worker can carry out).
pub async fn mark_manual(
    client: &Client,
    task_id: Uuid,
    owner: &str,
    why: &str,
) -> Result<bool, StoreError> {
    Ok(client
        .execute(MARK_MANUAL, &[&task_id, &owner, &why])
        .await?
        == 1)
}

/// RUNNING → RETRY after `backoff`, or DEAD after max_retry. None: lease lost.
pub async fn mark_failed(
    client: &Client,
    task_id: Uuid,
    owner: &str,
    backoff: Duration,
    error: &str,
) -> Result<Option<bool>, StoreError> {
    let row = client
        .query_opt(MARK_FAILED, &[&task_id, &owner, &millis(backoff), &error])
        .await?;
    Ok(row.map(|r| r.get::<_, i16>(0) == CompensationStatus::Dead.code()))
}

/// RUNNING tasks whose lease ran out go back to RETRY.
pub async fn recover_expired_leases(client: &Client, lease: Duration) -> Result<u64, StoreError> {
    Ok(client.execute(RECOVER_LEASES, &[&millis(lease)]).await?)
}

const INSERT_TASK: &str = "
INSERT INTO compensation_task (task_id, idempotency_key, task_type, reservation_id, order_id,
                               payload, status)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (idempotency_key) DO NOTHING";

/// `INSERT_TASK` for arrays of rows.
pub const INSERT_TASKS: &str = "
INSERT INTO compensation_task (task_id, idempotency_key, task_type, reservation_id, order_id,
                               payload, status)
SELECT *
FROM unnest($1::uuid[], $2::text[], $3::int2[], $4::uuid[], $5::int8[], $6::jsonb[],
            $7::int2[])
ON CONFLICT (idempotency_key) DO NOTHING";

const CLAIM: &str = "
WITH candidates AS (
    SELECT task_id
    FROM compensation_task
    WHERE status IN (0, 30)
      AND next_run_at <= statement_timestamp()
    ORDER BY next_run_at, created_at, task_id
    FOR UPDATE SKIP LOCKED
    LIMIT $1
)
UPDATE compensation_task AS t
SET status = 10,
    locked_by = $2,
    locked_at = statement_timestamp(),
    updated_at = statement_timestamp()
FROM candidates AS c
WHERE t.task_id = c.task_id
RETURNING t.task_id, t.task_type, t.reservation_id, t.order_id, t.payload, t.retry_count,
          t.max_retry";

const MARK_DONE: &str = "
UPDATE compensation_task
SET status = 20,
    completed_at = statement_timestamp(),
    locked_by = NULL,
    locked_at = NULL,
    last_error = NULL,
    updated_at = statement_timestamp()
WHERE task_id = $1 AND status = 10 AND locked_by = $2";

const MARK_MANUAL: &str = "
UPDATE compensation_task
SET status = 50,
    locked_by = NULL,
    locked_at = NULL,
    last_error = LEFT($3, 4000),
    updated_at = statement_timestamp()
WHERE task_id = $1 AND status = 10 AND locked_by = $2";

const MARK_FAILED: &str = "
UPDATE compensation_task
SET status = CASE WHEN retry_count + 1 >= max_retry THEN 40 ELSE 30 END,
    retry_count = retry_count + 1,
    next_run_at = statement_timestamp() + $3::bigint * interval '1 millisecond',
    locked_by = NULL,
    locked_at = NULL,
    last_error = LEFT($4, 4000),
    updated_at = statement_timestamp()
WHERE task_id = $1 AND status = 10 AND locked_by = $2
RETURNING status";

const RECOVER_LEASES: &str = "
UPDATE compensation_task
SET status = 30,
    next_run_at = statement_timestamp(),
    locked_by = NULL,
    locked_at = NULL,
    last_error = 'LEASE_EXPIRED',
    updated_at = statement_timestamp()
WHERE status = 10
  AND locked_at < statement_timestamp() - $1::bigint * interval '1 millisecond'";

/// One Redis give-back per reservation, whichever flow asks for it.
pub fn redis_release_key(reservation_id: Uuid) -> String {
    format!("REDIS_STOCK_RELEASE:{reservation_id}")
}
