//! The consumer inbox's statements (seed §8.2, `consumer_inbox`): the row that
//! dedups a message and stores its result, so a redelivery is answered from it. The
//! per-message statements and the set-based ones (`*_ROWS`, one statement for a
//! segment's messages) live together, with the result a row stores.

use sha2::{Digest, Sha256};

use crate::domain::message::OrderCreateMessage;
use crate::domain::outcome::{OrderOutcome, ResultCode};
use crate::store::StoreError;

/// The result an earlier delivery of a message id left in the inbox.
pub(super) struct StoredResult {
    pub(super) code: ResultCode,
    pub(super) order_id: Option<i64>,
    pub(super) payload_hash: Option<Vec<u8>>,
}

impl StoredResult {
    /// From `result_code, order_id, payload_hash`.
    pub(super) fn from_row(row: &tokio_postgres::Row) -> Result<Self, StoreError> {
        let stored: String = row.get(0);
        let code = ResultCode::parse(&stored).ok_or_else(|| {
            StoreError::Anomaly(format!("inbox holds unknown result code {stored:?}"))
        })?;
        Ok(Self {
            code,
            order_id: row.get(1),
            payload_hash: row.get(2),
        })
    }

    /// The answer to a redelivery: the stored result, marked duplicate.
    pub(super) fn answer(
        self,
        msg: &OrderCreateMessage,
        payload_hash: &[u8],
    ) -> Result<OrderOutcome, StoreError> {
        if self.payload_hash.as_deref() != Some(payload_hash) {
            // Same id, other content: the producer reused a message id. The first
            // message's effect stands; make the reuse visible.
            tracing::warn!(message_id = %msg.message_id, "message id reused with a different body");
            metrics::counter!(crate::telemetry::names::INBOX_PAYLOAD_MISMATCH_TOTAL).increment(1);
        }
        Ok(OrderOutcome {
            code: self.code,
            order_id: self.order_id,
            duplicate: true,
        })
    }
}

pub(super) fn payload_hash(msg: &OrderCreateMessage) -> Vec<u8> {
    // Field order of the struct makes the serialization canonical.
    let bytes = serde_json::to_vec(msg).unwrap_or_default();
    Sha256::digest(bytes).to_vec()
}

pub(super) const INSERT_INBOX: &str = "
INSERT INTO consumer_inbox (
    consumer_group, message_id, topic, tag, message_key, reservation_id, payload_hash,
    status, result_code, order_id
)
VALUES ($1, $2, $3, 'ORDER_CREATE', $4, $5, $6, 20, 'ORDER_CREATED', $7)
ON CONFLICT (consumer_group, message_id) DO NOTHING";

pub(super) const LOAD_INBOX: &str = "
SELECT result_code, order_id, payload_hash
FROM consumer_inbox
WHERE consumer_group = $1 AND message_id = $2";

pub(super) const UPDATE_INBOX_RESULT: &str = "
UPDATE consumer_inbox
SET result_code = $3, order_id = $4, processed_at = statement_timestamp()
WHERE consumer_group = $1 AND message_id = $2";

/// The inbox rows of a segment's messages, with the result and order id given as
/// SQL; see `INSERT_INBOX_ROWS`, `INSERT_NEW_INBOX_ROWS` and `INSERT_SOLD_OUT_INBOX_ROWS`.
macro_rules! insert_inbox {
    ($result:literal, $order_id:literal, $tail:literal) => {
        concat!(
            "
INSERT INTO consumer_inbox (
    consumer_group, message_id, topic, tag, message_key, reservation_id, payload_hash,
    status, result_code, order_id
)
SELECT $1::text, m.message_id, m.topic, 'ORDER_CREATE', m.reservation_id::text,
       m.reservation_id, m.payload_hash, 20, ",
            $result,
            ", ",
            $order_id,
            "
FROM unnest($2::uuid[], $3::text[], $4::uuid[], $5::bytea[], $6::int8[])
     AS m(message_id, topic, reservation_id, payload_hash, order_id)",
            $tail
        )
    };
}

/// Returns the messages that are new; a redelivery's row is left as it is.
pub(super) const INSERT_INBOX_ROWS: &str = insert_inbox!(
    "'ORDER_CREATED'",
    "m.order_id",
    "
ON CONFLICT (consumer_group, message_id) DO NOTHING
RETURNING message_id"
);

/// For messages taken to be new: a redelivery fails the statement (23505).
pub(super) const INSERT_NEW_INBOX_ROWS: &str = insert_inbox!("'ORDER_CREATED'", "m.order_id", "");

/// For messages taken to be new and sold out, with the result $7 and no order: a
/// redelivery fails the statement (23505).
pub(super) const INSERT_SOLD_OUT_INBOX_ROWS: &str = insert_inbox!("$7::text", "NULL::int8", "");

// The inbox is read and updated one row per message, found by its full key in a
// subquery of its own. As a join of the arrays to the table on (consumer_group,
// message_id), the generic plan PostgreSQL makes on the sale's first few rows (no
// statistics yet) reads every row of the consumer group with the index's first
// column instead, and keeps doing so as the inbox grows: quadratic over a sale
// (docs/benchmarks-history.md, 2026-12-01, c21a6aa). Inside the subquery the message id is a known
// value, so the only index path takes both columns: one probe, at any size.

/// `StoredResult`'s columns, then the message id.
pub(super) const LOAD_INBOX_ROWS: &str = "
SELECT i.result_code, i.order_id, i.payload_hash, i.message_id
FROM unnest($2::uuid[]) AS m(message_id)
CROSS JOIN LATERAL (
    SELECT result_code, order_id, payload_hash, message_id
    FROM consumer_inbox
    WHERE consumer_group = $1 AND message_id = m.message_id
    OFFSET 0
) AS i";

/// For inbox rows this transaction inserted (so nobody else can change them): each
/// found by its key, then updated by its address.
pub(super) const UPDATE_INBOX_RESULTS: &str = "
UPDATE consumer_inbox AS i
SET result_code = m.code, order_id = m.order_id, processed_at = statement_timestamp()
FROM unnest($2::uuid[], $3::text[], $4::int8[]) AS m(message_id, code, order_id)
WHERE i.ctid = (
    SELECT ctid FROM consumer_inbox WHERE consumer_group = $1 AND message_id = m.message_id
)";
