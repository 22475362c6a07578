//! The order transaction of a segment: several messages of one bucket that share no
//! key the order rows are unique on (see `segments`). Each step of `order_body` runs
//! once for all of them with arrays (`unnest`), and the segment takes its units with
//! one conditional UPDATE that hands them to the eligible orders in arrival order, so
//! each message ends exactly as it would alone. Rare branches (an order insert that
//! conflicted) go through the same per-message helpers as `order_body`; the writes
//! after the allocation are pipelined, which keeps the hot row locked for about one
//! round trip before COMMIT.

use std::collections::{HashMap, HashSet};

use tokio_postgres::types::ToSql;
use tokio_postgres::{Row, Statement, Transaction};
use uuid::Uuid;

use super::allocation::AllocationTurn;
use super::context::{OrderInput, OrderTxContext};
use super::rows::{InboxRows, LedgerRows, OrderRows, Param, ReservationRows};
use super::sql::{
    DELETE_PROVISIONAL_ORDERS, INSERT_ORDERS, INSERT_ORDER_ITEMS, INSERT_RESERVATIONS,
    LOCK_INVENTORY, LOCK_RESERVATIONS, MARK_RESERVATIONS_ORDERED, REJECT_RESERVATIONS, TAKE_UNITS,
};
use super::steps::{
    expect_rows, explain_order_conflict, order_created_event, release, reservation_verdict,
};
use crate::domain::message::OrderCreateMessage;
use crate::domain::outcome::{OrderOutcome, ResultCode};
use crate::domain::status::{LedgerType, ReservationStatus};
use crate::store::compensation::{TaskRows, INSERT_TASKS};
use crate::store::inbox::{StoredResult, INSERT_INBOX_ROWS, LOAD_INBOX_ROWS, UPDATE_INBOX_RESULTS};
use crate::store::outbox::{EventRows, INSERT_EVENTS};
use crate::store::{StatementCache, StoreError};

/// A message that ends without an order: its index in the segment, the result its
/// inbox row gets, and the order id that result names.
type Ended = (usize, ResultCode, Option<i64>);

/// Runs the segment's messages; one outcome per message, in order.
pub(super) async fn run_segment(
    tx: &Transaction<'_>,
    st: &mut StatementCache,
    ctx: &OrderTxContext,
    inputs: &[OrderInput<'_>],
    turn: &mut AllocationTurn,
) -> Result<Vec<OrderOutcome>, StoreError> {
    let bucket = inputs[0].msg;
    let mut outcomes: Vec<Option<OrderOutcome>> = vec![None; inputs.len()];
    // Messages that end without an order: the result their inbox row gets.
    let mut results: Vec<Ended> = Vec::new();

    // 1. Inbox (§9.1): the messages whose row already existed are redeliveries.
    let fresh = claim_inbox(tx, st, ctx, inputs, &mut outcomes).await?;

    // 2. Reservations (§9.2). A row this statement inserted is this message's own and
    //    invisible to everyone else; only the others need reading under a lock.
    let candidates = record_reservations(tx, st, inputs, bucket, &fresh, &mut results).await?;

    // 3. Orders (§9.3): the unique keys decide; a conflict is explained per message.
    let eligible = insert_orders(tx, st, inputs, bucket, &candidates, &mut results).await?;

    // 4. One conditional UPDATE for the whole segment (§9.4), which also writes the
    //    ledger rows of the orders it gives a unit: the first `units` eligible
    //    orders get one, the rest are sold out.
    let units = if eligible.is_empty() {
        0
    } else {
        take_units(tx, st, turn, bucket, &LedgerRows::of(inputs, &eligible)).await?
    };
    let (granted, denied) = eligible.split_at(units);
    results.extend(
        denied
            .iter()
            .map(|&i| (i, ResultCode::PostgresSoldOut, None)),
    );

    // 5. Everything else, pipelined (§9.5–§9.7, §9.11).
    let rest = RestRows::of(inputs, granted, denied, &results)?;
    write_rest(tx, st, ctx, bucket, &rest).await?;
    if !denied.is_empty() {
        metrics::counter!(
            crate::telemetry::names::REDIS_RELEASE_REQUESTED_TOTAL,
            "reason" => ResultCode::PostgresSoldOut.label()
        )
        .increment(denied.len() as u64);
    }

    answer(inputs, outcomes, granted, results)
}

/// Step 1: inserts the inbox rows, answers redeliveries from theirs; returns the fresh messages.
async fn claim_inbox(
    tx: &Transaction<'_>,
    st: &mut StatementCache,
    ctx: &OrderTxContext,
    inputs: &[OrderInput<'_>],
    outcomes: &mut [Option<OrderOutcome>],
) -> Result<Vec<usize>, StoreError> {
    let inbox = InboxRows::of(inputs);
    let inserted: HashSet<Uuid> = tx
        .query(
            &st.get(tx, INSERT_INBOX_ROWS).await?,
            &inbox.params(&ctx.consumer_group),
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if inserted.len() < inputs.len() {
        let seen: Vec<Uuid> = inbox
            .message_ids
            .iter()
            .filter(|id| !inserted.contains(id))
            .copied()
            .collect();
        let rows = tx
            .query(
                &st.get(tx, LOAD_INBOX_ROWS).await?,
                &[&ctx.consumer_group, &seen],
            )
            .await?;
        let stored: HashMap<Uuid, &Row> = rows.iter().map(|r| (r.get(3), r)).collect();
        for (i, input) in inputs.iter().enumerate() {
            if inserted.contains(&input.msg.message_id) {
                continue;
            }
            let row = stored.get(&input.msg.message_id).ok_or_else(|| {
                StoreError::Anomaly("inbox row that blocked an insert is gone".into())
            })?;
            outcomes[i] = Some(StoredResult::from_row(row)?.answer(input.msg, &inbox.hashes[i])?);
        }
    }
    Ok((0..inputs.len())
        .filter(|&i| outcomes[i].is_none())
        .collect())
}

/// Step 2: inserts the reservations, judges contested ones under a lock; returns the candidates.
async fn record_reservations(
    tx: &Transaction<'_>,
    st: &mut StatementCache,
    inputs: &[OrderInput<'_>],
    bucket: &OrderCreateMessage,
    fresh: &[usize],
    results: &mut Vec<Ended>,
) -> Result<Vec<usize>, StoreError> {
    let mut candidates = Vec::with_capacity(fresh.len());
    if fresh.is_empty() {
        return Ok(candidates);
    }
    let msgs: Vec<_> = fresh.iter().map(|&i| inputs[i].msg).collect();
    let reservations = ReservationRows::of(&msgs)?;
    let ours: HashSet<Uuid> = tx
        .query(
            &st.get(tx, INSERT_RESERVATIONS).await?,
            &reservations.params(bucket),
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let contested: Vec<Uuid> = fresh
        .iter()
        .map(|&i| inputs[i].msg.reservation_id)
        .filter(|id| !ours.contains(id))
        .collect();
    let locked_rows = if contested.is_empty() {
        Vec::new()
    } else {
        tx.query(&st.get(tx, LOCK_RESERVATIONS).await?, &[&contested])
            .await?
    };
    let locked: HashMap<Uuid, &Row> = locked_rows.iter().map(|r| (r.get(7), r)).collect();
    for &i in fresh {
        let msg = inputs[i].msg;
        if ours.contains(&msg.reservation_id) {
            candidates.push(i);
            continue;
        }
        match reservation_verdict(msg, locked.get(&msg.reservation_id).copied()) {
            None => candidates.push(i),
            Some((code, order_id)) => results.push((i, code, order_id)),
        }
    }
    Ok(candidates)
}

/// Step 3: inserts the candidates' orders, explains each conflict; returns the eligible ones.
async fn insert_orders(
    tx: &Transaction<'_>,
    st: &mut StatementCache,
    inputs: &[OrderInput<'_>],
    bucket: &OrderCreateMessage,
    candidates: &[usize],
    results: &mut Vec<Ended>,
) -> Result<Vec<usize>, StoreError> {
    let mut eligible = Vec::with_capacity(candidates.len());
    if candidates.is_empty() {
        return Ok(eligible);
    }
    let msgs: Vec<_> = candidates.iter().map(|&i| inputs[i].msg).collect();
    let created: HashSet<i64> = tx
        .query(
            &st.get(tx, INSERT_ORDERS).await?,
            &OrderRows::of(&msgs).params(bucket),
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    for &i in candidates {
        let msg = inputs[i].msg;
        if created.contains(&msg.order_id) {
            eligible.push(i);
        } else {
            let (code, order_id) = explain_order_conflict(tx, st, msg).await?;
            results.push((i, code, order_id));
        }
    }
    Ok(eligible)
}

/// What step 5 writes, all gathered before its first statement is sent: the granted
/// orders' items and reservations, the denied ones' rollback, the inbox results,
/// events and tasks.
struct RestRows {
    g_order_ids: Vec<i64>,
    g_reservations: Vec<Uuid>,
    g_prices: Vec<i64>,
    d_order_ids: Vec<i64>,
    d_reservations: Vec<Uuid>,
    events: EventRows,
    tasks: TaskRows,
    r_message_ids: Vec<Uuid>,
    r_codes: Vec<&'static str>,
    r_order_ids: Vec<Option<i64>>,
}

impl RestRows {
    /// Fails if an event's or a task's payload cannot be built.
    fn of(
        inputs: &[OrderInput<'_>],
        granted: &[usize],
        denied: &[usize],
        results: &[Ended],
    ) -> Result<Self, StoreError> {
        let granted_msgs: Vec<_> = granted.iter().map(|&i| inputs[i].msg).collect();
        let denied_msgs: Vec<_> = denied.iter().map(|&i| inputs[i].msg).collect();
        let g_order_ids: Vec<i64> = granted_msgs.iter().map(|m| m.order_id).collect();
        let g_reservations: Vec<Uuid> = granted_msgs.iter().map(|m| m.reservation_id).collect();
        let d_order_ids: Vec<i64> = denied_msgs.iter().map(|m| m.order_id).collect();
        let d_reservations: Vec<Uuid> = denied_msgs.iter().map(|m| m.reservation_id).collect();
        let mut events = EventRows::default();
        let mut tasks = TaskRows::default();
        for msg in &granted_msgs {
            events.push(order_created_event(msg)?);
        }
        for msg in &denied_msgs {
            let (task, event) = release(msg, ResultCode::PostgresSoldOut)?;
            tasks.push(task);
            events.push(event);
        }
        Ok(Self {
            g_order_ids,
            g_reservations,
            g_prices: granted_msgs.iter().map(|m| m.unit_price).collect(),
            d_order_ids,
            d_reservations,
            events,
            tasks,
            r_message_ids: results
                .iter()
                .map(|&(i, _, _)| inputs[i].msg.message_id)
                .collect(),
            r_codes: results.iter().map(|&(_, code, _)| code.as_str()).collect(),
            r_order_ids: results.iter().map(|&(_, _, id)| id).collect(),
        })
    }
}

/// Step 5: every write after the allocation, sent back to back and awaited together.
async fn write_rest(
    tx: &Transaction<'_>,
    st: &mut StatementCache,
    ctx: &OrderTxContext,
    bucket: &OrderCreateMessage,
    rows: &RestRows,
) -> Result<(), StoreError> {
    let insert_items = st.get(tx, INSERT_ORDER_ITEMS).await?;
    let mark_ordered = st.get(tx, MARK_RESERVATIONS_ORDERED).await?;
    let delete_orders = st.get(tx, DELETE_PROVISIONAL_ORDERS).await?;
    let reject = st.get(tx, REJECT_RESERVATIONS).await?;
    let update_inbox = st.get(tx, UPDATE_INBOX_RESULTS).await?;
    let insert_events = st.get(tx, INSERT_EVENTS).await?;
    let insert_tasks = st.get(tx, INSERT_TASKS).await?;
    // Every statement is at hand: the five writes go out back to back, with no
    // answer awaited in between, so the hot row stays locked about one round trip.
    futures_util::try_join!(
        write_granted(tx, &insert_items, &mark_ordered, ctx, bucket, rows),
        write_denied(tx, &delete_orders, &reject, rows),
        record_results(tx, &update_inbox, ctx, rows),
        async { Ok(rows.events.insert(tx.client(), &insert_events).await?) },
        async { Ok(rows.tasks.insert(tx.client(), &insert_tasks).await?) },
    )?;
    Ok(())
}

/// Step 5, granted orders: their items and their reservations ORDERED, sent together.
async fn write_granted(
    tx: &Transaction<'_>,
    insert_items: &Statement,
    mark_ordered: &Statement,
    ctx: &OrderTxContext,
    bucket: &OrderCreateMessage,
    rows: &RestRows,
) -> Result<(), StoreError> {
    let granted = rows.g_order_ids.len();
    if granted == 0 {
        return Ok(());
    }
    let (ordered, pending) = (
        ReservationStatus::Ordered.code(),
        ReservationStatus::PendingDb.code(),
    );
    let items_params: [&Param; 5] = [
        &bucket.activity_id,
        &bucket.sku_id,
        &ctx.sku_title,
        &rows.g_order_ids,
        &rows.g_prices,
    ];
    let mark_params: [&Param; 4] = [&ordered, &pending, &rows.g_reservations, &rows.g_order_ids];
    let (items, marked) = futures_util::try_join!(
        tx.execute(insert_items, &items_params),
        tx.execute(mark_ordered, &mark_params),
    )?;
    expect_rows(items, granted, "order items")?;
    expect_rows(marked, granted, "reservations locked in PENDING_DB")
}

/// Step 5, sold-out orders: provisional orders deleted, reservations REJECTED, sent together.
async fn write_denied(
    tx: &Transaction<'_>,
    delete_orders: &Statement,
    reject: &Statement,
    rows: &RestRows,
) -> Result<(), StoreError> {
    let denied = rows.d_order_ids.len();
    if denied == 0 {
        return Ok(());
    }
    let (pending, rejected) = (
        ReservationStatus::PendingDb.code(),
        ReservationStatus::Rejected.code(),
    );
    let sold_out = ResultCode::PostgresSoldOut.as_str();
    let delete_params: [&Param; 1] = [&rows.d_order_ids];
    let reject_params: [&Param; 4] = [&rejected, &pending, &sold_out, &rows.d_reservations];
    let (deleted, rejected) = futures_util::try_join!(
        tx.execute(delete_orders, &delete_params),
        tx.execute(reject, &reject_params),
    )?;
    expect_rows(deleted, denied, "provisional orders")?;
    expect_rows(rejected, denied, "reservations locked in PENDING_DB")
}

/// Step 5, messages without an order: the result each inbox row gets.
async fn record_results(
    tx: &Transaction<'_>,
    update_inbox: &Statement,
    ctx: &OrderTxContext,
    rows: &RestRows,
) -> Result<(), StoreError> {
    if rows.r_message_ids.is_empty() {
        return Ok(());
    }
    let n = tx
        .execute(
            update_inbox,
            &[
                &ctx.consumer_group,
                &rows.r_message_ids,
                &rows.r_codes,
                &rows.r_order_ids,
            ],
        )
        .await?;
    expect_rows(
        n,
        rows.r_message_ids.len(),
        "inbox rows of this transaction",
    )
}

/// The outcomes in message order: created for the granted, the recorded result for the rest.
fn answer(
    inputs: &[OrderInput<'_>],
    mut outcomes: Vec<Option<OrderOutcome>>,
    granted: &[usize],
    results: Vec<Ended>,
) -> Result<Vec<OrderOutcome>, StoreError> {
    for &i in granted {
        outcomes[i] = Some(OrderOutcome {
            code: ResultCode::OrderCreated,
            order_id: Some(inputs[i].msg.order_id),
            duplicate: false,
        });
    }
    for (i, code, order_id) in results {
        outcomes[i] = Some(OrderOutcome {
            code,
            order_id,
            duplicate: false,
        });
    }
    outcomes
        .into_iter()
        .map(|o| o.ok_or_else(|| StoreError::Anomaly("a message got no outcome".into())))
        .collect()
}

/// Takes a unit for each of `ledgers`' orders, in turn, and writes their ledger
/// rows; returns the units taken. When the bucket holds fewer, the row is locked and
/// what is left goes to the first orders.
pub(super) async fn take_units(
    tx: &Transaction<'_>,
    st: &mut StatementCache,
    turn: &mut AllocationTurn,
    bucket: &OrderCreateMessage,
    ledgers: &LedgerRows,
) -> Result<usize, StoreError> {
    let take = st.get(tx, TAKE_UNITS).await?;
    let wanted = ledgers.len();
    turn.wait().await;
    if take_first(tx, &take, bucket, ledgers, wanted).await? {
        return Ok(wanted);
    }
    let left: Option<i32> = tx
        .query_opt(
            &st.get(tx, LOCK_INVENTORY).await?,
            &[
                &bucket.activity_id,
                &bucket.sku_id,
                &bucket.inventory_bucket,
            ],
        )
        .await?
        .map(|row| row.get(0));
    let units = usize::try_from(left.unwrap_or(0)).unwrap_or(0).min(wanted);
    if units == 0 {
        return Ok(0);
    }
    // The row is locked: the rest of the bucket is there to take.
    if take_first(tx, &take, bucket, ledgers, units).await? {
        Ok(units)
    } else {
        Err(StoreError::Anomaly("locked inventory row changed".into()))
    }
}

/// Runs `TAKE_UNITS` for the first `units` orders; false if the bucket holds fewer.
pub(super) async fn take_first(
    tx: &Transaction<'_>,
    take: &tokio_postgres::Statement,
    bucket: &OrderCreateMessage,
    ledgers: &LedgerRows,
    units: usize,
) -> Result<bool, StoreError> {
    let n = i32::try_from(units).map_err(|_| StoreError::Anomaly("segment too large".into()))?;
    let (ids, reservations, orders, messages, users) = (
        &ledgers.ledger_ids[..units],
        &ledgers.reservations[..units],
        &ledgers.order_ids[..units],
        &ledgers.message_ids[..units],
        &ledgers.users[..units],
    );
    let params: [&(dyn ToSql + Sync); 10] = [
        &bucket.activity_id,
        &bucket.sku_id,
        &bucket.inventory_bucket,
        &n,
        &LedgerType::Allocate.code(),
        &ids,
        &reservations,
        &orders,
        &messages,
        &users,
    ];
    let Some(row) = tx.query_opt(take, &params).await? else {
        return Ok(false);
    };
    let written: i64 = row.get(0);
    expect_rows(
        u64::try_from(written).unwrap_or_default(),
        units,
        "allocate ledger rows for reservations without an order",
    )?;
    Ok(true)
}
