//! The steps the order paths share: the reservation's verdict, an order insert that
//! conflicted explained, rejections and give-backs, the order-created event.

use serde_json::json;
use tokio_postgres::Transaction;
use uuid::Uuid;

use super::sql::{
    FIND_SAME_REQUEST_ORDER, FIND_USER_ORDER, MARK_RESERVATION_ORDERED, REJECT_RESERVATION,
};
use crate::domain::events::{InventoryReleaseRequested, OrderCreated};
use crate::domain::message::OrderCreateMessage;
use crate::domain::outcome::ResultCode;
use crate::domain::status::{CompensationType, OrderStatus, ReservationStatus};
use crate::store::compensation::redis_release_key;
use crate::store::compensation::{insert_task, NewTask};
use crate::store::outbox::{event_payload, insert_event, Event};
use crate::store::{StatementCache, StoreError};

pub(super) fn reservation_expires_at(
    msg: &OrderCreateMessage,
) -> Result<chrono::DateTime<chrono::Utc>, StoreError> {
    msg.reservation_expires_at()
        .ok_or_else(|| StoreError::Anomaly("reservation ttl out of range".into()))
}

/// What the locked reservation row (`LOCK_RESERVATION`'s columns) says about the
/// message: `None` to go on and create the order, or the result to record (§9.2).
pub(super) fn reservation_verdict(
    msg: &OrderCreateMessage,
    row: Option<&tokio_postgres::Row>,
) -> Option<(ResultCode, Option<i64>)> {
    // No row: the insert conflicted on request_id, so this request belongs to
    // another reservation.
    let Some(row) = row else {
        return Some((ResultCode::ReservationMismatch, None));
    };
    let stored: (Uuid, i64, i64, i64, i16) =
        (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
    let reserved_order: Option<i64> = row.get(5);
    if stored
        != (
            msg.request_id,
            msg.activity_id,
            msg.sku_id,
            msg.user_id,
            msg.inventory_bucket,
        )
    {
        return Some((ResultCode::ReservationMismatch, reserved_order));
    }
    match ReservationStatus::from_code(row.get(6)) {
        Some(ReservationStatus::PendingDb) => None,
        Some(ReservationStatus::Ordered) => Some((ResultCode::OrderAlreadyCreated, reserved_order)),
        // Closed reservations (and RELEASE_PENDING, which the seed's switch lets fall
        // through: an order must not be created for stock that is being released).
        _ => Some((ResultCode::IllegalReservationState, reserved_order)),
    }
}

/// The order insert of a PENDING_DB reservation conflicted: explains the conflict
/// the unique indexes already decided, doing what the answer requires, and returns
/// the result to record.
pub(super) async fn explain_order_conflict(
    tx: &Transaction<'_>,
    st: &mut StatementCache,
    msg: &OrderCreateMessage,
) -> Result<(ResultCode, Option<i64>), StoreError> {
    if let Some(row) = tx
        .query_opt(
            &st.get(tx, FIND_SAME_REQUEST_ORDER).await?,
            &[
                &msg.reservation_id,
                &msg.request_id,
                &msg.message_id,
                &msg.user_id,
            ],
        )
        .await?
    {
        let order_id: i64 = row.get(0);
        mark_reservation_ordered(tx, st, msg.reservation_id, order_id).await?;
        return Ok((ResultCode::OrderAlreadyCreated, Some(order_id)));
    }
    if let Some(row) = tx
        .query_opt(
            &st.get(tx, FIND_USER_ORDER).await?,
            &[&msg.activity_id, &msg.sku_id, &msg.user_id],
        )
        .await?
    {
        let existing: i64 = row.get(0);
        reject(tx, st, msg, ResultCode::UserAlreadyOrdered).await?;
        return Ok((ResultCode::UserAlreadyOrdered, Some(existing)));
    }
    Err(StoreError::Anomaly(format!(
        "order_id {} or order_no {:?} is already used by another order",
        msg.order_id, msg.order_no
    )))
}

/// A statement that must touch exactly the rows this transaction holds touched
/// another number: a broken assumption, never retried.
pub(super) fn expect_rows(got: u64, want: usize, what: &str) -> Result<(), StoreError> {
    if got == want as u64 {
        Ok(())
    } else {
        Err(StoreError::Anomaly(format!(
            "{what}: {got} rows changed, {want} expected"
        )))
    }
}

/// PENDING_DB → ORDERED (§9.6). The status is a bind parameter on purpose: with a
/// literal `status = 0`, the generic plan of the prepared statement may pick the
/// partial index `idx_reservation_pending_expire` and walk its dead entries; with a
/// parameter the planner cannot prove the index predicate and uses the primary key.
pub(super) async fn mark_reservation_ordered(
    tx: &Transaction<'_>,
    st: &mut StatementCache,
    reservation_id: Uuid,
    order_id: i64,
) -> Result<(), StoreError> {
    let n = tx
        .execute(
            &st.get(tx, MARK_RESERVATION_ORDERED).await?,
            &[
                &reservation_id,
                &order_id,
                &ReservationStatus::Ordered.code(),
                &ReservationStatus::PendingDb.code(),
            ],
        )
        .await?;
    expect_rows(n, 1, "reservations locked in PENDING_DB")
}

/// Rejects the reservation and queues the Redis give-back: a compensation task for
/// the worker plus an outbox event for anyone watching (§7.4).
pub(super) async fn reject(
    tx: &Transaction<'_>,
    st: &mut StatementCache,
    msg: &OrderCreateMessage,
    code: ResultCode,
) -> Result<(), StoreError> {
    let n = tx
        .execute(
            &st.get(tx, REJECT_RESERVATION).await?,
            &[
                &msg.reservation_id,
                &code.as_str(),
                &ReservationStatus::Rejected.code(),
                &ReservationStatus::PendingDb.code(),
            ],
        )
        .await?;
    expect_rows(n, 1, "reservations locked in PENDING_DB")?;
    let (task, event) = release(msg, code)?;
    insert_task(tx, st, task).await?;
    insert_event(tx, st, event).await?;
    metrics::counter!(crate::telemetry::names::REDIS_RELEASE_REQUESTED_TOTAL, "reason" => code.label())
        .increment(1);
    Ok(())
}

/// The Redis give-back of a rejected reservation's unit: the compensation task for
/// the worker and the event announcing it, with one payload.
pub(super) fn release(
    msg: &OrderCreateMessage,
    code: ResultCode,
) -> Result<(NewTask, Event), StoreError> {
    let payload = release_payload(msg, code);
    let event = Event {
        dedup_key: format!("INVENTORY_RELEASE_REQUESTED:{}", msg.reservation_id),
        aggregate_type: "RESERVATION",
        aggregate_id: msg.reservation_id.to_string(),
        tag: "INVENTORY_RELEASE_REQUESTED",
        message_key: msg.reservation_id.to_string(),
        payload: event_payload(&payload)?,
    };
    let task = NewTask {
        task_type: CompensationType::RedisStockRelease,
        idempotency_key: redis_release_key(msg.reservation_id),
        reservation_id: Some(msg.reservation_id),
        order_id: None,
        payload,
    };
    Ok((task, event))
}

pub(super) fn release_payload(msg: &OrderCreateMessage, code: ResultCode) -> serde_json::Value {
    json!(InventoryReleaseRequested {
        reservation_id: msg.reservation_id,
        request_id: msg.request_id,
        activity_id: msg.activity_id,
        sku_id: msg.sku_id,
        user_id: msg.user_id,
        inventory_bucket: msg.inventory_bucket,
        quantity: 1,
        reason: code.as_str(),
    })
}

pub(super) fn order_created_event(msg: &OrderCreateMessage) -> Result<Event, StoreError> {
    Ok(Event {
        dedup_key: format!("ORDER_CREATED:{}", msg.order_id),
        aggregate_type: "ORDER",
        aggregate_id: msg.order_id.to_string(),
        tag: "ORDER_CREATED",
        message_key: msg.order_id.to_string(),
        payload: event_payload(&OrderCreated {
            order_id: msg.order_id,
            order_no: &msg.order_no,
            reservation_id: msg.reservation_id,
            request_id: msg.request_id,
            activity_id: msg.activity_id,
            sku_id: msg.sku_id,
            user_id: msg.user_id,
            inventory_bucket: msg.inventory_bucket,
            unit_price: msg.unit_price,
            total_amount: msg.unit_price,
            currency: &msg.currency,
            status: OrderStatus::Created.name(),
            expire_at: msg.order_expire_at,
        })?,
    })
}
