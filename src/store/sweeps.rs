//! Timeout cancellation (seed §9.10, §7.7): an unpaid order past its expiry is
//! cancelled and its unit returned to its own bucket, in one transaction per order.
//! The conditional cancel UPDATE races the payment's conditional PAID UPDATE on the
//! same row: exactly one of them wins (§7.6).

use serde_json::json;
use tokio_postgres::{Row, Transaction};
use uuid::Uuid;

use super::compensation::redis_release_key;
use super::compensation::{insert_task, NewTask};
use super::outbox::{event_payload, insert_event, Event};
use super::tx::commit;
use super::{PgConn, StatementCache, StoreError};
use crate::domain::events::OrderCancelled;
use crate::domain::status::{CompensationType, LedgerType, ReservationStatus};

/// An order this sweeper cancelled.
#[derive(Debug, Clone)]
pub struct Cancelled {
    pub order_id: i64,
    pub reservation_id: Uuid,
}

/// Claims the next expired order no one else holds (SKIP LOCKED on
/// `idx_orders_expirable`), cancels it, releases its stock, and queues the event and
/// the Redis give-back. `None` when nothing has expired.
pub async fn cancel_next_expired(
    conn: &mut PgConn,
    ledger_id: i64,
) -> Result<Option<Cancelled>, StoreError> {
    let PgConn {
        client,
        statements,
        warnings,
        ..
    } = conn;
    let tx = client.transaction().await?;
    let st = statements;
    let Some(candidate) = tx
        .query_opt(&st.get(&tx, CLAIM_EXPIRED).await?, &[])
        .await?
    else {
        commit(tx, warnings).await?;
        return Ok(None);
    };
    let order_id: i64 = candidate.get(0);
    crate::failpoint!("sweeper_between_claim_and_update");
    // §9.10: only a row returned here may release stock.
    let Some(order) = tx
        .query_opt(&st.get(&tx, CANCEL_ORDER).await?, &[&order_id])
        .await?
    else {
        commit(tx, warnings).await?;
        return Ok(None);
    };
    let order = CancelledOrder::from_row(order_id, &order);
    release_reservation(&tx, st, &order).await?;
    let stock = release_inventory(&tx, st, &order).await?;
    insert_release_ledger(&tx, st, ledger_id, &order, &stock).await?;
    queue_give_back(&tx, st, &order).await?;
    commit(tx, warnings).await?;
    Ok(Some(Cancelled {
        order_id,
        reservation_id: order.reservation_id,
    }))
}

/// The order `CANCEL_ORDER` cancelled, as it returned it: what every later step
/// releases, records and announces.
struct CancelledOrder {
    order_id: i64,
    reservation_id: Uuid,
    activity_id: i64,
    sku_id: i64,
    user_id: i64,
    bucket: i16,
    quantity: i16,
    source_message_id: Uuid,
}

impl CancelledOrder {
    /// From `CANCEL_ORDER`'s `RETURNING` row.
    fn from_row(order_id: i64, order: &Row) -> Self {
        Self {
            order_id,
            reservation_id: order.get(0),
            activity_id: order.get(1),
            sku_id: order.get(2),
            user_id: order.get(3),
            bucket: order.get(4),
            quantity: order.get(5),
            source_message_id: order.get(6),
        }
    }
}

/// Step 1: the reservation goes RELEASED; its own step, as any other state is an anomaly.
async fn release_reservation(
    tx: &Transaction<'_>,
    st: &mut StatementCache,
    order: &CancelledOrder,
) -> Result<(), StoreError> {
    let (order_id, reservation_id) = (order.order_id, order.reservation_id);
    let released = tx
        .execute(
            &st.get(tx, RELEASE_RESERVATION).await?,
            &[
                &reservation_id,
                &ReservationStatus::Released.code(),
                &ReservationStatus::Ordered.code(),
                &ReservationStatus::ReleasePending.code(),
            ],
        )
        .await?;
    if released != 1 {
        return Err(StoreError::Anomaly(format!(
            "order {order_id} cancelled but its reservation {reservation_id} was not ORDERED"
        )));
    }
    Ok(())
}

/// The bucket's stock before and after the unit went back, for the ledger row.
struct ReleasedStock {
    before_available: i32,
    after_available: i32,
    before_allocated: i32,
    after_allocated: i32,
}

/// Step 2: the units go back to their own bucket, which answers the ledger's before/after.
async fn release_inventory(
    tx: &Transaction<'_>,
    st: &mut StatementCache,
    order: &CancelledOrder,
) -> Result<ReleasedStock, StoreError> {
    let CancelledOrder {
        order_id,
        activity_id,
        sku_id,
        bucket,
        ..
    } = *order;
    let qty = i32::from(order.quantity);
    let Some(inv) = tx
        .query_opt(
            &st.get(tx, RELEASE_INVENTORY).await?,
            &[&activity_id, &sku_id, &bucket, &qty],
        )
        .await?
    else {
        return Err(StoreError::Anomaly(format!(
            "bucket ({activity_id}, {sku_id}, {bucket}) holds less allocated stock than order {order_id}"
        )));
    };
    Ok(ReleasedStock {
        before_available: inv.get(0),
        after_available: inv.get(1),
        before_allocated: inv.get(2),
        after_allocated: inv.get(3),
    })
}

/// Step 3: the RELEASE ledger row, the one record of the stock that moved back.
async fn insert_release_ledger(
    tx: &Transaction<'_>,
    st: &mut StatementCache,
    ledger_id: i64,
    order: &CancelledOrder,
    stock: &ReleasedStock,
) -> Result<(), StoreError> {
    let qty = i32::from(order.quantity);
    tx.execute(
        &st.get(tx, INSERT_RELEASE_LEDGER).await?,
        &[
            &ledger_id,
            &order.reservation_id,
            &order.order_id,
            &order.source_message_id,
            &order.activity_id,
            &order.sku_id,
            &order.user_id,
            &order.bucket,
            &LedgerType::Release.code(),
            &qty,
            &stock.before_available,
            &stock.after_available,
            &stock.before_allocated,
            &stock.after_allocated,
        ],
    )
    .await?;
    Ok(())
}

/// Step 4: the `ORDER_CANCELLED` event and the Redis give-back task, sharing one payload.
async fn queue_give_back(
    tx: &Transaction<'_>,
    st: &mut StatementCache,
    order: &CancelledOrder,
) -> Result<(), StoreError> {
    let (order_id, reservation_id) = (order.order_id, order.reservation_id);
    let payload = json!(OrderCancelled {
        order_id,
        reservation_id,
        activity_id: order.activity_id,
        sku_id: order.sku_id,
        user_id: order.user_id,
        inventory_bucket: order.bucket,
        quantity: order.quantity,
        reason: "PAY_TIMEOUT",
    });
    insert_event(
        tx,
        st,
        Event {
            dedup_key: format!("ORDER_CANCELLED:{order_id}"),
            aggregate_type: "ORDER",
            aggregate_id: order_id.to_string(),
            tag: "ORDER_CANCELLED",
            message_key: order_id.to_string(),
            payload: event_payload(&payload)?,
        },
    )
    .await?;
    insert_task(
        tx,
        st,
        NewTask {
            task_type: CompensationType::RedisStockRelease,
            idempotency_key: redis_release_key(reservation_id),
            reservation_id: Some(reservation_id),
            order_id: Some(order_id),
            payload,
        },
    )
    .await
}

const CLAIM_EXPIRED: &str = "
SELECT order_id
FROM orders
WHERE status IN (10, 20)
  AND expire_at <= statement_timestamp()
ORDER BY expire_at, order_id
LIMIT 1
FOR UPDATE SKIP LOCKED";

const CANCEL_ORDER: &str = "
UPDATE orders
SET status = 40,
    cancelled_at = statement_timestamp(),
    cancel_reason = 'PAY_TIMEOUT',
    version = version + 1,
    updated_at = statement_timestamp()
WHERE order_id = $1
  AND status IN (10, 20)
  AND expire_at <= statement_timestamp()
RETURNING reservation_id, activity_id, sku_id, user_id, inventory_bucket, quantity,
          source_message_id";

const RELEASE_RESERVATION: &str = "
UPDATE inventory_reservation
SET status = $2,
    released_at = statement_timestamp(),
    version = version + 1,
    updated_at = statement_timestamp()
WHERE reservation_id = $1
  AND status IN ($3, $4)";

const RELEASE_INVENTORY: &str = "
UPDATE sku_inventory
SET available_stock = available_stock + $4,
    allocated_stock = allocated_stock - $4,
    version = version + 1,
    updated_at = statement_timestamp()
WHERE activity_id = $1
  AND sku_id = $2
  AND bucket_no = $3
  AND allocated_stock >= $4
RETURNING
    available_stock - $4 AS before_available,
    available_stock AS after_available,
    allocated_stock + $4 AS before_allocated,
    allocated_stock AS after_allocated";

const INSERT_RELEASE_LEDGER: &str = "
INSERT INTO inventory_ledger (
    ledger_id, idempotency_key, reservation_id, order_id, source_message_id,
    activity_id, sku_id, user_id, inventory_bucket, ledger_type,
    available_delta, allocated_delta,
    before_available, after_available, before_allocated, after_allocated, reason
)
VALUES (
    $1, 'RELEASE:' || $2::uuid::text, $2, $3, $4, $5, $6, $7, $8, $9,
    $10::int, -($10::int), $11, $12, $13, $14, 'PAY_TIMEOUT'
)
ON CONFLICT (idempotency_key) DO NOTHING";
