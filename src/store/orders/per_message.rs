//! The per-message order transaction body (seed §9.1–§9.7 with the branches of
//! §9.11): dedup in the inbox, record the reservation, create the order, take one
//! unit with the conditional UPDATE, write item, ledger and outbox event.

use tokio_postgres::Transaction;

use super::allocation::AllocationTurn;
use super::context::{OrderInput, OrderTxContext};
use super::sql::{
    ALLOCATE_UNITS, DELETE_PROVISIONAL_ORDER, INSERT_ALLOCATE_LEDGER, INSERT_ORDER,
    INSERT_ORDER_ITEM, INSERT_RESERVATION, LOCK_RESERVATION,
};
use super::steps::{
    expect_rows, explain_order_conflict, mark_reservation_ordered, order_created_event, reject,
    reservation_expires_at, reservation_verdict,
};
use crate::domain::message::OrderCreateMessage;
use crate::domain::outcome::{OrderOutcome, ResultCode};
use crate::domain::status::LedgerType;
use crate::store::inbox::{
    payload_hash, StoredResult, INSERT_INBOX, LOAD_INBOX, UPDATE_INBOX_RESULT,
};
use crate::store::outbox::insert_event;
use crate::store::{StatementCache, StoreError};

/// One message's part of the transaction; never commits.
pub(super) async fn order_body(
    tx: &Transaction<'_>,
    st: &mut StatementCache,
    ctx: &OrderTxContext,
    input: &OrderInput<'_>,
    turn: &mut AllocationTurn,
) -> Result<OrderOutcome, StoreError> {
    let msg = input.msg;

    // 1. The inbox decides who processes this message id (§9.1).
    if let Some(stored) = claim_inbox(tx, st, ctx, input).await? {
        return Ok(stored);
    }

    // 2. Record the reservation and lock it: serializes messages of one reservation
    //    that reach different engine instances (§9.2).
    if let Some((code, order_id)) = record_reservation(tx, st, msg).await? {
        return finish(tx, st, ctx, msg, code, order_id).await;
    }

    // 3. Insert the order first: the unique keys decide idempotency and one order
    //    per user per SKU (§9.3).
    if !insert_order(tx, st, msg).await? {
        let (code, order_id) = explain_order_conflict(tx, st, msg).await?;
        return finish(tx, st, ctx, msg, code, order_id).await;
    }

    // 4. The final stock check: a conditional UPDATE on the message's own bucket (§9.4).
    let Some(before) = allocate(tx, st, turn, msg).await? else {
        return sold_out(tx, st, ctx, msg).await;
    };

    // 5. Item, ledger, reservation and event (§9.5–§9.7).
    insert_item(tx, st, ctx, msg).await?;
    insert_allocate_ledger(tx, st, input, before).await?;
    mark_reservation_ordered(tx, st, msg.reservation_id, msg.order_id).await?;
    insert_event(tx, st, order_created_event(msg)?).await?;
    // The inbox row was inserted with ORDER_CREATED and this order id already.
    Ok(OrderOutcome {
        code: ResultCode::OrderCreated,
        order_id: Some(msg.order_id),
        duplicate: false,
    })
}

/// Step 1: inserts the message's inbox row; `Some` answers a redelivery from the stored row.
async fn claim_inbox(
    tx: &Transaction<'_>,
    st: &mut StatementCache,
    ctx: &OrderTxContext,
    input: &OrderInput<'_>,
) -> Result<Option<OrderOutcome>, StoreError> {
    let msg = input.msg;
    let message_key = msg.reservation_id.to_string();
    let payload_hash = payload_hash(msg);
    let inserted = tx
        .execute(
            &st.get(tx, INSERT_INBOX).await?,
            &[
                &ctx.consumer_group,
                &msg.message_id,
                &input.topic,
                &message_key,
                &msg.reservation_id,
                &payload_hash,
                &msg.order_id,
            ],
        )
        .await?;
    if inserted != 0 {
        return Ok(None);
    }
    let row = tx
        .query_one(
            &st.get(tx, LOAD_INBOX).await?,
            &[&ctx.consumer_group, &msg.message_id],
        )
        .await?;
    StoredResult::from_row(&row)?
        .answer(msg, &payload_hash)
        .map(Some)
}

/// Step 2: inserts and locks the reservation; `Some` is the result when it cannot be ordered.
async fn record_reservation(
    tx: &Transaction<'_>,
    st: &mut StatementCache,
    msg: &OrderCreateMessage,
) -> Result<Option<(ResultCode, Option<i64>)>, StoreError> {
    tx.execute(
        &st.get(tx, INSERT_RESERVATION).await?,
        &[
            &msg.reservation_id,
            &msg.request_id,
            &msg.message_id,
            &msg.activity_id,
            &msg.sku_id,
            &msg.user_id,
            &msg.inventory_bucket,
            &msg.reserved_at,
            &reservation_expires_at(msg)?,
        ],
    )
    .await?;
    let reservation = tx
        .query_opt(&st.get(tx, LOCK_RESERVATION).await?, &[&msg.reservation_id])
        .await?;
    Ok(reservation_verdict(msg, reservation.as_ref()))
}

/// Step 3: inserts the provisional order; false when a unique key already holds one.
async fn insert_order(
    tx: &Transaction<'_>,
    st: &mut StatementCache,
    msg: &OrderCreateMessage,
) -> Result<bool, StoreError> {
    let created = tx
        .query_opt(
            &st.get(tx, INSERT_ORDER).await?,
            &[
                &msg.order_id,
                &msg.order_no,
                &msg.request_id,
                &msg.reservation_id,
                &msg.message_id,
                &msg.activity_id,
                &msg.sku_id,
                &msg.user_id,
                &msg.inventory_bucket,
                &msg.unit_price,
                &msg.currency,
                &msg.order_expire_at,
            ],
        )
        .await?;
    Ok(created.is_some())
}

/// Step 4's other end: the bucket is empty, so the order goes and the reservation is rejected.
async fn sold_out(
    tx: &Transaction<'_>,
    st: &mut StatementCache,
    ctx: &OrderTxContext,
    msg: &OrderCreateMessage,
) -> Result<OrderOutcome, StoreError> {
    // The order row was inserted by this transaction a moment ago and nothing
    // references it yet, so it can simply go (§9.11).
    tx.execute(
        &st.get(tx, DELETE_PROVISIONAL_ORDER).await?,
        &[&msg.order_id],
    )
    .await?;
    reject(tx, st, msg, ResultCode::PostgresSoldOut).await?;
    finish(tx, st, ctx, msg, ResultCode::PostgresSoldOut, None).await
}

/// Step 5a: the order's item row, with the SKU's title as sold.
async fn insert_item(
    tx: &Transaction<'_>,
    st: &mut StatementCache,
    ctx: &OrderTxContext,
    msg: &OrderCreateMessage,
) -> Result<(), StoreError> {
    tx.execute(
        &st.get(tx, INSERT_ORDER_ITEM).await?,
        &[
            &msg.order_id,
            &msg.activity_id,
            &msg.sku_id,
            &ctx.sku_title,
            &msg.unit_price,
        ],
    )
    .await?;
    Ok(())
}

/// Step 5b: the ALLOCATE ledger row, the bucket's before/after as the UPDATE answered.
async fn insert_allocate_ledger(
    tx: &Transaction<'_>,
    st: &mut StatementCache,
    input: &OrderInput<'_>,
    before: Allocation,
) -> Result<(), StoreError> {
    let msg = input.msg;
    let ledger = tx
        .execute(
            &st.get(tx, INSERT_ALLOCATE_LEDGER).await?,
            &[
                &input.ledger_id,
                &msg.reservation_id,
                &msg.order_id,
                &msg.message_id,
                &msg.activity_id,
                &msg.sku_id,
                &msg.user_id,
                &msg.inventory_bucket,
                &LedgerType::Allocate.code(),
                &before.available,
                &(before.available - 1),
                &before.allocated,
                &(before.allocated + 1),
            ],
        )
        .await?;
    expect_rows(
        ledger,
        1,
        "allocate ledger rows for reservations without an order",
    )
}

/// The bucket as it was before the unit was taken.
#[derive(Debug, Clone, Copy)]
pub(super) struct Allocation {
    pub(super) available: i32,
    pub(super) allocated: i32,
}

/// Takes the message's unit from its bucket (§9.4), in turn: the conditional
/// UPDATE. `None`: the bucket is empty.
pub(super) async fn allocate(
    tx: &Transaction<'_>,
    st: &mut StatementCache,
    turn: &mut AllocationTurn,
    msg: &OrderCreateMessage,
) -> Result<Option<Allocation>, StoreError> {
    let take = st.get(tx, ALLOCATE_UNITS).await?;
    turn.wait().await;
    let row = tx
        .query_opt(
            &take,
            &[&msg.activity_id, &msg.sku_id, &msg.inventory_bucket, &1i32],
        )
        .await?;
    Ok(row.map(|row| Allocation::from_row(&row)))
}

impl Allocation {
    /// From `ALLOCATE_UNITS`'s `before_available, before_allocated`.
    pub(super) fn from_row(row: &tokio_postgres::Row) -> Self {
        Self {
            available: row.get(0),
            allocated: row.get(1),
        }
    }
}

/// Records a non-creating result in the inbox.
pub(super) async fn finish(
    tx: &Transaction<'_>,
    st: &mut StatementCache,
    ctx: &OrderTxContext,
    msg: &OrderCreateMessage,
    code: ResultCode,
    order_id: Option<i64>,
) -> Result<OrderOutcome, StoreError> {
    let updated = tx
        .execute(
            &st.get(tx, UPDATE_INBOX_RESULT).await?,
            &[
                &ctx.consumer_group,
                &msg.message_id,
                &code.as_str(),
                &order_id,
            ],
        )
        .await?;
    expect_rows(updated, 1, "inbox rows of this transaction")?;
    Ok(OrderOutcome {
        code,
        order_id,
        duplicate: false,
    })
}
