//! The transactional outbox (seed §9.7, §9.8): events are written in the transaction of
//! the fact they announce, claimed by publishers with `FOR UPDATE SKIP LOCKED` under a
//! lease, and completed only by the owner of the lease (fencing): a row rescued from a
//! dead publisher is never completed twice.

use std::time::Duration;

use chrono::{DateTime, Utc};

use serde::Serialize;
use serde_json::value::RawValue;
use tokio_postgres::types::Json;
use tokio_postgres::{Client, Statement, Transaction};
use uuid::Uuid;

use super::{millis, StatementCache, StoreError};
use crate::domain::ids::new_uuid;

/// The topic every outbox row is recorded under; the tag selects the routing key.
pub const EVENT_TOPIC: &str = "SECKILL_EVENTS";

/// One outbox row to write; `dedup_key` keeps one row per business event.
pub struct Event {
    pub dedup_key: String,
    pub aggregate_type: &'static str,
    pub aggregate_id: String,
    pub tag: &'static str,
    pub message_key: String,
    pub payload: Payload,
}

/// An event's payload as JSON text, serialized once when the event is built: every
/// order writes one, and building it as a `serde_json::Value` (a map of owned keys
/// and values, serialized again to be sent and then dropped) was about a tenth of
/// the engine's CPU (docs/benchmarks-history.md, 2026-12-01, 6434f2a).
pub type Payload = Box<RawValue>;

/// Serializes an event's payload.
pub fn event_payload(value: &impl Serialize) -> Result<Payload, StoreError> {
    serde_json::value::to_raw_value(value)
        .map_err(|e| StoreError::Anomaly(format!("event payload: {e}")))
}

/// Writes an event inside the caller's transaction.
pub async fn insert_event(
    tx: &Transaction<'_>,
    st: &mut StatementCache,
    event: Event,
) -> Result<(), StoreError> {
    tx.execute(
        &st.get(tx, INSERT_EVENT).await?,
        &[
            &new_uuid(),
            &event.dedup_key,
            &event.aggregate_type,
            &event.aggregate_id,
            &EVENT_TOPIC,
            &event.tag,
            &event.message_key,
            &Json(&event.payload),
        ],
    )
    .await?;
    Ok(())
}

/// Many events as the columns of one `INSERT_EVENTS`, for set-based transactions.
#[derive(Default)]
pub struct EventRows {
    event_ids: Vec<Uuid>,
    dedup_keys: Vec<String>,
    aggregate_types: Vec<&'static str>,
    aggregate_ids: Vec<String>,
    tags: Vec<&'static str>,
    message_keys: Vec<String>,
    payloads: Vec<Json<Payload>>,
}

impl EventRows {
    pub fn push(&mut self, event: Event) {
        self.event_ids.push(new_uuid());
        self.dedup_keys.push(event.dedup_key);
        self.aggregate_types.push(event.aggregate_type);
        self.aggregate_ids.push(event.aggregate_id);
        self.tags.push(event.tag);
        self.message_keys.push(event.message_key);
        self.payloads.push(Json(event.payload));
    }

    /// Writes the rows inside the transaction open on `client`; `insert` is the
    /// prepared `INSERT_EVENTS`, so several statements can be pipelined.
    pub async fn insert(
        &self,
        client: &Client,
        insert: &Statement,
    ) -> Result<(), tokio_postgres::Error> {
        if self.event_ids.is_empty() {
            return Ok(());
        }
        client
            .execute(
                insert,
                &[
                    &self.event_ids,
                    &self.dedup_keys,
                    &self.aggregate_types,
                    &self.aggregate_ids,
                    &EVENT_TOPIC,
                    &self.tags,
                    &self.message_keys,
                    &self.payloads,
                ],
            )
            .await?;
        Ok(())
    }
}

/// The AMQP routing key of an event tag: lower case, the first `_` becomes `.`
/// (`ORDER_CREATED` → `order.created`, `INVENTORY_RELEASE_REQUESTED` →
/// `inventory.release_requested`).
pub fn routing_key(tag: &str) -> String {
    tag.to_ascii_lowercase().replacen('_', ".", 1)
}

/// A claimed row, ready to publish.
#[derive(Debug, Clone)]
pub struct ClaimedEvent {
    pub event_id: Uuid,
    pub tag: Option<String>,
    pub message_key: String,
    pub schema_version: i32,
    pub payload: serde_json::Value,
    pub headers: serde_json::Value,
    pub retry_count: i32,
    pub max_retry: i32,
    pub created_at: DateTime<Utc>,
}

/// SENDING rows whose lease ran out go back to RETRY (§9.8).
pub async fn recover_expired_leases(client: &Client, lease: Duration) -> Result<u64, StoreError> {
    Ok(client.execute(RECOVER_LEASES, &[&millis(lease)]).await?)
}

/// Claims up to `limit` ready rows for `owner` and commits the claim.
pub async fn claim(
    client: &mut Client,
    owner: &str,
    limit: i64,
) -> Result<Vec<ClaimedEvent>, StoreError> {
    let tx = client.transaction().await?;
    tx.batch_execute(super::INDEX_WALK).await?;
    let rows = tx.query(CLAIM, &[&limit, &owner]).await?;
    tx.commit().await?;
    Ok(rows
        .iter()
        .map(|r| ClaimedEvent {
            event_id: r.get(0),
            tag: r.get(1),
            message_key: r.get(2),
            schema_version: r.get(3),
            payload: r.get(4),
            headers: r.get(5),
            retry_count: r.get(6),
            max_retry: r.get(7),
            created_at: r.get(8),
        })
        .collect())
}

/// Confirmed rows → SENT, only while `owner` still holds their lease.
pub async fn mark_sent(client: &Client, ids: &[Uuid], owner: &str) -> Result<u64, StoreError> {
    Ok(client.execute(MARK_SENT, &[&ids, &owner]).await?)
}

/// A failed publish → RETRY after `backoff`, or DEAD once `max_retry` is reached.
/// Returns whether the row went DEAD (None: the lease was lost meanwhile).
pub async fn mark_failed(
    client: &Client,
    id: Uuid,
    owner: &str,
    backoff: Duration,
    error: &str,
) -> Result<Option<bool>, StoreError> {
    let row = client
        .query_opt(MARK_FAILED, &[&id, &owner, &millis(backoff), &error])
        .await?;
    Ok(row.map(|r| r.get::<_, i16>(0) == crate::domain::status::OutboxStatus::Dead.code()))
}

const INSERT_EVENT: &str = "
INSERT INTO event_outbox (
    event_id, dedup_key, aggregate_type, aggregate_id, topic, tag, message_key,
    schema_version, payload, status
)
VALUES ($1, $2, $3, $4, $5, $6, $7, 1, $8, 0)
ON CONFLICT (dedup_key) DO NOTHING";

/// `INSERT_EVENT` for arrays of rows.
pub const INSERT_EVENTS: &str = "
INSERT INTO event_outbox (
    event_id, dedup_key, aggregate_type, aggregate_id, topic, tag, message_key,
    schema_version, payload, status
)
SELECT m.event_id, m.dedup_key, m.aggregate_type, m.aggregate_id, $5::text, m.tag,
       m.message_key, 1, m.payload, 0
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $6::text[], $7::text[],
            $8::jsonb[])
     AS m(event_id, dedup_key, aggregate_type, aggregate_id, tag, message_key, payload)
ON CONFLICT (dedup_key) DO NOTHING";

const RECOVER_LEASES: &str = "
UPDATE event_outbox
SET status = 30,
    available_at = statement_timestamp(),
    locked_by = NULL,
    locked_at = NULL,
    last_error = 'SEND_LEASE_EXPIRED',
    updated_at = statement_timestamp()
WHERE status = 10
  AND locked_at < statement_timestamp() - $1::bigint * interval '1 millisecond'";

const CLAIM: &str = "
WITH candidates AS (
    SELECT event_id
    FROM event_outbox
    WHERE status IN (0, 30)
      AND available_at <= statement_timestamp()
    ORDER BY available_at, created_at, event_id
    FOR UPDATE SKIP LOCKED
    LIMIT $1
)
UPDATE event_outbox AS o
SET status = 10,
    locked_by = $2,
    locked_at = statement_timestamp(),
    updated_at = statement_timestamp()
FROM candidates AS c
WHERE o.event_id = c.event_id
RETURNING o.event_id, o.tag, o.message_key, o.schema_version, o.payload, o.headers,
          o.retry_count, o.max_retry, o.created_at";

/// The lease is checked by `locked_by` alone: only a claim sets it, together with
/// SENDING, and every way out of SENDING clears it, so the owner's token matches a
/// SENDING row only. With `status = 10` in the condition as well, PostgreSQL
/// (custom or generic plan, tables never analyzed) joined the keys' lookup with a
/// bitmap scan of all of `idx_outbox_stale_sending`, whose entries for rows already
/// SENT stay until a vacuum: each batch read every event sent before it, and
/// draining a sale's backlog took quadratic time (docs/benchmarks-history.md, 2026-12-01, 8486495).
const MARK_SENT: &str = "
UPDATE event_outbox
SET status = 20,
    sent_at = statement_timestamp(),
    locked_by = NULL,
    locked_at = NULL,
    last_error = NULL,
    updated_at = statement_timestamp()
WHERE event_id = ANY($1)
  AND locked_by = $2";

const MARK_FAILED: &str = "
UPDATE event_outbox
SET status = CASE WHEN retry_count + 1 >= max_retry THEN 40 ELSE 30 END,
    retry_count = retry_count + 1,
    available_at = statement_timestamp() + $3::bigint * interval '1 millisecond',
    locked_by = NULL,
    locked_at = NULL,
    last_error = LEFT($4, 4000),
    updated_at = statement_timestamp()
WHERE event_id = $1
  AND status = 10
  AND locked_by = $2
RETURNING status";

#[cfg(test)]
mod tests {
    #[test]
    fn routing_keys() {
        assert_eq!(super::routing_key("ORDER_CREATED"), "order.created");
        assert_eq!(
            super::routing_key("INVENTORY_RELEASE_REQUESTED"),
            "inventory.release_requested"
        );
        assert_eq!(
            super::routing_key("PAYMENT_REFUND_REQUIRED"),
            "payment.refund_required"
        );
    }
}
