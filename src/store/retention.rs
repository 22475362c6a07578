//! Retention's statements (seed §8.5): SENT outbox rows move to
//! `event_outbox_history` after the audit period, and inbox rows older than the
//! replay window are deleted. Each call is one statement in its own transaction over
//! at most `limit` rows, claimed with `SKIP LOCKED`: it never waits for a row the
//! order path holds, and holds the rows it takes only for that one short statement.

use std::time::Duration;

use tokio_postgres::Client;

use super::{millis, StoreError};

/// Moves up to `limit` SENT outbox rows sent more than `after` ago into
/// `event_outbox_history`, oldest first; returns how many moved. Delete and insert
/// are one statement, so a row is in exactly one of the two tables.
pub async fn archive_sent(client: &Client, after: Duration, limit: i64) -> Result<u64, StoreError> {
    Ok(client
        .execute(ARCHIVE_SENT, &[&millis(after), &limit])
        .await?)
}

/// Deletes up to `limit` inbox rows processed more than `window` ago; returns how
/// many. A message redelivered after its row is gone is no longer answered by the
/// inbox: the reservation's state and the unique keys of orders and payments still
/// refuse a second effect, and the dead-letter replay refuses such a message unless
/// forced (`mq::dead_letters`).
pub async fn prune_inbox(client: &Client, window: Duration, limit: i64) -> Result<u64, StoreError> {
    Ok(client
        .execute(PRUNE_INBOX, &[&millis(window), &limit])
        .await?)
}

const ARCHIVE_SENT: &str = "
WITH moved AS (
    DELETE FROM event_outbox
    WHERE event_id IN (
        SELECT event_id FROM event_outbox
        WHERE status = 20
          AND sent_at < statement_timestamp() - $1::bigint * interval '1 millisecond'
        ORDER BY sent_at
        LIMIT $2
        FOR UPDATE SKIP LOCKED)
    RETURNING event_id, dedup_key, aggregate_type, aggregate_id, topic, tag, message_key,
              schema_version, payload, headers, status, available_at, retry_count,
              max_retry, locked_by, locked_at, sent_at, last_error, created_at, updated_at)
INSERT INTO event_outbox_history (
    event_id, dedup_key, aggregate_type, aggregate_id, topic, tag, message_key,
    schema_version, payload, headers, status, available_at, retry_count, max_retry,
    locked_by, locked_at, sent_at, last_error, created_at, updated_at)
SELECT event_id, dedup_key, aggregate_type, aggregate_id, topic, tag, message_key,
       schema_version, payload, headers, status, available_at, retry_count, max_retry,
       locked_by, locked_at, sent_at, last_error, created_at, updated_at
FROM moved";

const PRUNE_INBOX: &str = "
DELETE FROM consumer_inbox
WHERE (consumer_group, message_id) IN (
    SELECT consumer_group, message_id FROM consumer_inbox
    WHERE processed_at < statement_timestamp() - $1::bigint * interval '1 millisecond'
    LIMIT $2
    FOR UPDATE SKIP LOCKED)";
