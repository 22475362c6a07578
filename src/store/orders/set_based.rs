//! The order transaction of a segment: several messages of one bucket that share no
//! key the order rows are unique on (see `segments`). Each step of `order_body` runs
//! once for all of them with arrays (`unnest`), and the segment takes its units with
//! one conditional UPDATE that hands them to the eligible orders in arrival order, so
//! each message ends exactly as it would alone. Rare branches (an order insert that
//! conflicted) go through the same per-message helpers as `order_body`; the writes
//! after the allocation are pipelined, which keeps the hot row locked for about one
//! round trip before COMMIT.
//!
//! That is the careful way, a round trip per step. In the common case, a
//! segment of new messages whose bucket holds their units, `run_fresh_segment`
//! sends all of it at once and the hot row is locked only from the UPDATE to
//! COMMIT; it is speculative, and falls back to the careful way when the case is
//! not the common one.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Row, Transaction};
use uuid::Uuid;

use super::{
    expect_rows, explain_order_conflict, order_created_event, payload_hash, release,
    reservation_expires_at, reservation_verdict, AllocationTurn, OrderInput, OrderTxContext,
    StoredResult,
};
use crate::domain::message::OrderCreateMessage;
use crate::domain::outcome::{OrderOutcome, ResultCode};
use crate::domain::status::{LedgerType, ReservationStatus};
use crate::store::compensation::{TaskRows, INSERT_TASKS};
use crate::store::outbox::{EventRows, INSERT_EVENTS};
use crate::store::{StatementCache, StoreError};

type Param = dyn ToSql + Sync;

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
    let mut results: Vec<(usize, ResultCode, Option<i64>)> = Vec::new();

    // 1. Inbox (§9.1): the messages whose row already existed are redeliveries.
    let hashes: Vec<Vec<u8>> = inputs.iter().map(|i| payload_hash(i.msg)).collect();
    let message_ids: Vec<Uuid> = inputs.iter().map(|i| i.msg.message_id).collect();
    let topics: Vec<&str> = inputs.iter().map(|i| i.topic).collect();
    let reservation_ids: Vec<Uuid> = inputs.iter().map(|i| i.msg.reservation_id).collect();
    let order_ids: Vec<i64> = inputs.iter().map(|i| i.msg.order_id).collect();
    let inserted: HashSet<Uuid> = tx
        .query(
            &st.get(tx, INSERT_INBOX).await?,
            &[
                &ctx.consumer_group,
                &message_ids,
                &topics,
                &reservation_ids,
                &hashes,
                &order_ids,
            ],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if inserted.len() < inputs.len() {
        let seen: Vec<Uuid> = message_ids
            .iter()
            .filter(|id| !inserted.contains(id))
            .copied()
            .collect();
        let rows = tx
            .query(
                &st.get(tx, LOAD_INBOX).await?,
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
            outcomes[i] = Some(StoredResult::from_row(row)?.answer(input.msg, &hashes[i])?);
        }
    }
    let fresh: Vec<usize> = (0..inputs.len())
        .filter(|&i| outcomes[i].is_none())
        .collect();

    // 2. Reservations (§9.2). A row this statement inserted is this message's own and
    //    invisible to everyone else; only the others need reading under a lock.
    let mut candidates = Vec::with_capacity(fresh.len());
    if !fresh.is_empty() {
        let pick = |f: &dyn Fn(&OrderInput<'_>) -> Uuid| -> Vec<Uuid> {
            fresh.iter().map(|&i| f(&inputs[i])).collect()
        };
        let expires: Vec<DateTime<Utc>> = fresh
            .iter()
            .map(|&i| reservation_expires_at(inputs[i].msg))
            .collect::<Result<_, _>>()?;
        let reserved_at: Vec<DateTime<Utc>> =
            fresh.iter().map(|&i| inputs[i].msg.reserved_at).collect();
        let users: Vec<i64> = fresh.iter().map(|&i| inputs[i].msg.user_id).collect();
        let ours: HashSet<Uuid> = tx
            .query(
                &st.get(tx, INSERT_RESERVATIONS).await?,
                &[
                    &bucket.activity_id,
                    &bucket.sku_id,
                    &bucket.inventory_bucket,
                    &pick(&|i| i.msg.reservation_id),
                    &pick(&|i| i.msg.request_id),
                    &pick(&|i| i.msg.message_id),
                    &users,
                    &reserved_at,
                    &expires,
                ],
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
        for &i in &fresh {
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
    }

    // 3. Orders (§9.3): the unique keys decide; a conflict is explained per message.
    let mut eligible = Vec::with_capacity(candidates.len());
    if !candidates.is_empty() {
        let msgs: Vec<_> = candidates.iter().map(|&i| inputs[i].msg).collect();
        let created: HashSet<i64> = tx
            .query(
                &st.get(tx, INSERT_ORDERS).await?,
                &[
                    &bucket.activity_id,
                    &bucket.sku_id,
                    &bucket.inventory_bucket,
                    &msgs.iter().map(|m| m.order_id).collect::<Vec<_>>(),
                    &msgs.iter().map(|m| m.order_no.as_str()).collect::<Vec<_>>(),
                    &msgs.iter().map(|m| m.request_id).collect::<Vec<_>>(),
                    &msgs.iter().map(|m| m.reservation_id).collect::<Vec<_>>(),
                    &msgs.iter().map(|m| m.message_id).collect::<Vec<_>>(),
                    &msgs.iter().map(|m| m.user_id).collect::<Vec<_>>(),
                    &msgs.iter().map(|m| m.unit_price).collect::<Vec<_>>(),
                    &msgs.iter().map(|m| m.currency.as_str()).collect::<Vec<_>>(),
                    &msgs.iter().map(|m| m.order_expire_at).collect::<Vec<_>>(),
                ],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        for &i in &candidates {
            let msg = inputs[i].msg;
            if created.contains(&msg.order_id) {
                eligible.push(i);
            } else {
                let (code, order_id) = explain_order_conflict(tx, st, msg).await?;
                results.push((i, code, order_id));
            }
        }
    }

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
    let granted_msgs: Vec<_> = granted.iter().map(|&i| inputs[i].msg).collect();
    let denied_msgs: Vec<_> = denied.iter().map(|&i| inputs[i].msg).collect();
    let g_order_ids: Vec<i64> = granted_msgs.iter().map(|m| m.order_id).collect();
    let g_reservations: Vec<Uuid> = granted_msgs.iter().map(|m| m.reservation_id).collect();
    let d_order_ids: Vec<i64> = denied_msgs.iter().map(|m| m.order_id).collect();
    let d_reservations: Vec<Uuid> = denied_msgs.iter().map(|m| m.reservation_id).collect();
    let mut events = EventRows::default();
    let mut tasks = TaskRows::default();
    for msg in &granted_msgs {
        events.push(order_created_event(msg));
    }
    for msg in &denied_msgs {
        let (task, event) = release(msg, ResultCode::PostgresSoldOut);
        tasks.push(task);
        events.push(event);
    }
    let r_message_ids: Vec<Uuid> = results
        .iter()
        .map(|&(i, _, _)| inputs[i].msg.message_id)
        .collect();
    let r_codes: Vec<&str> = results.iter().map(|&(_, code, _)| code.as_str()).collect();
    let r_order_ids: Vec<Option<i64>> = results.iter().map(|&(_, _, id)| id).collect();

    let insert_items = st.get(tx, INSERT_ORDER_ITEMS).await?;
    let mark_ordered = st.get(tx, MARK_RESERVATIONS_ORDERED).await?;
    let delete_orders = st.get(tx, DELETE_PROVISIONAL_ORDERS).await?;
    let reject = st.get(tx, REJECT_RESERVATIONS).await?;
    let update_inbox = st.get(tx, UPDATE_INBOX_RESULTS).await?;
    let insert_events = st.get(tx, INSERT_EVENTS).await?;
    let insert_tasks = st.get(tx, INSERT_TASKS).await?;
    let g_prices: Vec<i64> = granted_msgs.iter().map(|m| m.unit_price).collect();
    let (ordered, pending, rejected) = (
        ReservationStatus::Ordered.code(),
        ReservationStatus::PendingDb.code(),
        ReservationStatus::Rejected.code(),
    );
    let sold_out = ResultCode::PostgresSoldOut.as_str();
    let granted_writes = async {
        if granted.is_empty() {
            return Ok::<_, StoreError>(());
        }
        let items_params: [&Param; 5] = [
            &bucket.activity_id,
            &bucket.sku_id,
            &ctx.sku_title,
            &g_order_ids,
            &g_prices,
        ];
        let mark_params: [&Param; 4] = [&ordered, &pending, &g_reservations, &g_order_ids];
        let (items, marked) = futures_util::try_join!(
            tx.execute(&insert_items, &items_params),
            tx.execute(&mark_ordered, &mark_params),
        )?;
        expect_rows(items, granted.len(), "order items")?;
        expect_rows(marked, granted.len(), "reservations locked in PENDING_DB")
    };
    let denied_writes = async {
        if denied.is_empty() {
            return Ok::<_, StoreError>(());
        }
        let delete_params: [&Param; 1] = [&d_order_ids];
        let reject_params: [&Param; 4] = [&rejected, &pending, &sold_out, &d_reservations];
        let (deleted, rejected) = futures_util::try_join!(
            tx.execute(&delete_orders, &delete_params),
            tx.execute(&reject, &reject_params),
        )?;
        expect_rows(deleted, denied.len(), "provisional orders")?;
        expect_rows(rejected, denied.len(), "reservations locked in PENDING_DB")
    };
    let recorded = async {
        if results.is_empty() {
            return Ok::<_, StoreError>(());
        }
        let n = tx
            .execute(
                &update_inbox,
                &[&ctx.consumer_group, &r_message_ids, &r_codes, &r_order_ids],
            )
            .await?;
        expect_rows(n, results.len(), "inbox rows of this transaction")
    };
    futures_util::try_join!(
        granted_writes,
        denied_writes,
        recorded,
        async { Ok(events.insert(tx, &insert_events).await?) },
        async { Ok(tasks.insert(tx, &insert_tasks).await?) },
    )?;
    if !denied.is_empty() {
        metrics::counter!(
            "seckill_redis_release_requested_total",
            "reason" => ResultCode::PostgresSoldOut.label()
        )
        .increment(denied.len() as u64);
    }

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

/// The common case in one round trip: a segment of new messages, whose orders the
/// bucket has units for. Every step of `run_segment` is sent at once, as if each
/// inbox, reservation and order row were new and every order got a unit, and the
/// inventory UPDATE follows as soon as the turn comes. When all of that held, the
/// careful path would have written the same rows, with the UPDATE before the order
/// writes and each reservation inserted PENDING_DB and then marked ORDERED, where
/// this inserts it ORDERED: the result is the same. When any of it did not, the
/// segment fails with `Speculation` and the transaction is redone the careful way;
/// nothing of this one commits.
pub(super) async fn run_fresh_segment(
    tx: &Transaction<'_>,
    st: &mut StatementCache,
    ctx: &OrderTxContext,
    inputs: &[OrderInput<'_>],
    turn: &mut AllocationTurn,
) -> Result<Vec<OrderOutcome>, StoreError> {
    let bucket = inputs[0].msg;
    let n = inputs.len();
    let msgs: Vec<&OrderCreateMessage> = inputs.iter().map(|i| i.msg).collect();
    let hashes: Vec<Vec<u8>> = msgs.iter().map(|m| payload_hash(m)).collect();
    let message_ids: Vec<Uuid> = msgs.iter().map(|m| m.message_id).collect();
    let topics: Vec<&str> = inputs.iter().map(|i| i.topic).collect();
    let reservation_ids: Vec<Uuid> = msgs.iter().map(|m| m.reservation_id).collect();
    let request_ids: Vec<Uuid> = msgs.iter().map(|m| m.request_id).collect();
    let order_ids: Vec<i64> = msgs.iter().map(|m| m.order_id).collect();
    let order_nos: Vec<&str> = msgs.iter().map(|m| m.order_no.as_str()).collect();
    let users: Vec<i64> = msgs.iter().map(|m| m.user_id).collect();
    let prices: Vec<i64> = msgs.iter().map(|m| m.unit_price).collect();
    let currencies: Vec<&str> = msgs.iter().map(|m| m.currency.as_str()).collect();
    let order_expiry: Vec<DateTime<Utc>> = msgs.iter().map(|m| m.order_expire_at).collect();
    let reserved_at: Vec<DateTime<Utc>> = msgs.iter().map(|m| m.reserved_at).collect();
    // The careful way computes this only for new messages, and reports it there.
    let expires: Vec<DateTime<Utc>> = msgs
        .iter()
        .map(|m| reservation_expires_at(m))
        .collect::<Result<_, _>>()
        .map_err(|_| StoreError::Speculation)?;
    let all: Vec<usize> = (0..n).collect();
    let ledgers = LedgerRows::of(inputs, &all);
    let mut events = EventRows::default();
    for msg in &msgs {
        events.push(order_created_event(msg));
    }
    let ordered = ReservationStatus::Ordered.code();

    let insert_inbox = st.get(tx, INSERT_INBOX).await?;
    let insert_reservations = st.get(tx, INSERT_ORDERED_RESERVATIONS).await?;
    let insert_orders = st.get(tx, INSERT_ORDERS).await?;
    let insert_items = st.get(tx, INSERT_ORDER_ITEMS).await?;
    let insert_events = st.get(tx, INSERT_EVENTS).await?;
    let take = st.get(tx, TAKE_UNITS).await?;
    let inbox_params: [&(dyn ToSql + Sync); 6] = [
        &ctx.consumer_group,
        &message_ids,
        &topics,
        &reservation_ids,
        &hashes,
        &order_ids,
    ];
    let reservation_params: [&(dyn ToSql + Sync); 11] = [
        &bucket.activity_id,
        &bucket.sku_id,
        &bucket.inventory_bucket,
        &reservation_ids,
        &request_ids,
        &message_ids,
        &users,
        &reserved_at,
        &expires,
        &ordered,
        &order_ids,
    ];
    let order_params: [&(dyn ToSql + Sync); 12] = [
        &bucket.activity_id,
        &bucket.sku_id,
        &bucket.inventory_bucket,
        &order_ids,
        &order_nos,
        &request_ids,
        &reservation_ids,
        &message_ids,
        &users,
        &prices,
        &currencies,
        &order_expiry,
    ];
    let items_params: [&(dyn ToSql + Sync); 5] = [
        &bucket.activity_id,
        &bucket.sku_id,
        &ctx.sku_title,
        &order_ids,
        &prices,
    ];
    // Sent in this order; a statement after one that failed fails too (the
    // transaction is aborted), so the first failure in this order is the cause.
    let (inbox, reservations, orders, items, written, taken) = futures_util::join!(
        tx.execute(&insert_inbox, &inbox_params),
        tx.execute(&insert_reservations, &reservation_params),
        tx.execute(&insert_orders, &order_params),
        tx.execute(&insert_items, &items_params),
        events.insert(tx, &insert_events),
        async {
            turn.wait().await;
            take_first(tx, &take, bucket, &ledgers, n).await
        },
    );
    // In the order sent: a statement that failed only because an earlier one did
    // not insert every row must not be taken for the cause.
    let all_new = n as u64;
    if inbox? != all_new || reservations? != all_new || orders? != all_new {
        return Err(StoreError::Speculation);
    }
    expect_rows(items?, n, "order items")?;
    written?;
    if !taken? {
        return Err(StoreError::Speculation);
    }
    Ok(msgs
        .iter()
        .map(|m| OrderOutcome {
            code: ResultCode::OrderCreated,
            order_id: Some(m.order_id),
            duplicate: false,
        })
        .collect())
}

/// The ledger rows of a segment's eligible orders, in arrival order; the first
/// `units` of them are written by the UPDATE that takes `units`.
struct LedgerRows {
    ledger_ids: Vec<i64>,
    reservations: Vec<Uuid>,
    order_ids: Vec<i64>,
    message_ids: Vec<Uuid>,
    users: Vec<i64>,
}

impl LedgerRows {
    fn of(inputs: &[OrderInput<'_>], eligible: &[usize]) -> Self {
        let msgs = || eligible.iter().map(|&i| inputs[i].msg);
        Self {
            ledger_ids: eligible.iter().map(|&i| inputs[i].ledger_id).collect(),
            reservations: msgs().map(|m| m.reservation_id).collect(),
            order_ids: msgs().map(|m| m.order_id).collect(),
            message_ids: msgs().map(|m| m.message_id).collect(),
            users: msgs().map(|m| m.user_id).collect(),
        }
    }

    fn len(&self) -> usize {
        self.ledger_ids.len()
    }
}

/// Takes a unit for each of `ledgers`' orders, in turn, and writes their ledger
/// rows; returns the units taken. When the bucket holds fewer, the row is locked and
/// what is left goes to the first orders.
async fn take_units(
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
async fn take_first(
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

const INSERT_INBOX: &str = "
INSERT INTO consumer_inbox (
    consumer_group, message_id, topic, tag, message_key, reservation_id, payload_hash,
    status, result_code, order_id
)
SELECT $1::text, m.message_id, m.topic, 'ORDER_CREATE', m.reservation_id::text,
       m.reservation_id, m.payload_hash, 20, 'ORDER_CREATED', m.order_id
FROM unnest($2::uuid[], $3::text[], $4::uuid[], $5::bytea[], $6::int8[])
     AS m(message_id, topic, reservation_id, payload_hash, order_id)
ON CONFLICT (consumer_group, message_id) DO NOTHING
RETURNING message_id";

/// `StoredResult`'s columns, then the message id.
const LOAD_INBOX: &str = "
SELECT result_code, order_id, payload_hash, message_id
FROM consumer_inbox
WHERE consumer_group = $1 AND message_id = ANY ($2::uuid[])";

const UPDATE_INBOX_RESULTS: &str = "
UPDATE consumer_inbox AS i
SET result_code = m.code, order_id = m.order_id, processed_at = statement_timestamp()
FROM unnest($2::uuid[], $3::text[], $4::int8[]) AS m(message_id, code, order_id)
WHERE i.consumer_group = $1 AND i.message_id = m.message_id";

const INSERT_RESERVATIONS: &str = "
INSERT INTO inventory_reservation (
    reservation_id, request_id, first_message_id, activity_id, sku_id, user_id,
    inventory_bucket, quantity, status, redis_reserved_at, expires_at
)
SELECT m.reservation_id, m.request_id, m.message_id, $1::int8, $2::int8, m.user_id,
       $3::int2, 1, 0, m.reserved_at, m.expires_at
FROM unnest($4::uuid[], $5::uuid[], $6::uuid[], $7::int8[], $8::timestamptz[],
            $9::timestamptz[])
     AS m(reservation_id, request_id, message_id, user_id, reserved_at, expires_at)
ON CONFLICT DO NOTHING
RETURNING reservation_id";

/// The fresh way's reservations, written as `MARK_RESERVATIONS_ORDERED` would leave
/// them after `INSERT_RESERVATIONS`: ORDERED with their order, at version 1. One
/// heap tuple per reservation instead of an inserted one and its updated copy, and
/// four index entries instead of nine (the update changes the indexed `order_id`).
const INSERT_ORDERED_RESERVATIONS: &str = "
INSERT INTO inventory_reservation (
    reservation_id, request_id, first_message_id, activity_id, sku_id, user_id,
    inventory_bucket, quantity, status, order_id, redis_reserved_at, expires_at,
    ordered_at, version
)
SELECT m.reservation_id, m.request_id, m.message_id, $1::int8, $2::int8, m.user_id,
       $3::int2, 1, $10::int2, m.order_id, m.reserved_at, m.expires_at,
       statement_timestamp(), 1
FROM unnest($4::uuid[], $5::uuid[], $6::uuid[], $7::int8[], $8::timestamptz[],
            $9::timestamptz[], $11::int8[])
     AS m(reservation_id, request_id, message_id, user_id, reserved_at, expires_at,
          order_id)
ON CONFLICT DO NOTHING";

/// `reservation_verdict`'s columns, then the reservation id; locked in key order so
/// two transactions locking overlapping sets cannot deadlock.
const LOCK_RESERVATIONS: &str = "
SELECT request_id, activity_id, sku_id, user_id, inventory_bucket, order_id, status,
       reservation_id
FROM inventory_reservation
WHERE reservation_id = ANY ($1::uuid[])
ORDER BY reservation_id
FOR UPDATE";

const INSERT_ORDERS: &str = "
INSERT INTO orders (
    order_id, order_no, request_id, reservation_id, source_message_id,
    activity_id, sku_id, user_id, inventory_bucket, quantity,
    unit_price, total_amount, currency, status, expire_at
)
SELECT m.order_id, m.order_no, m.request_id, m.reservation_id, m.message_id,
       $1::int8, $2::int8, m.user_id, $3::int2, 1,
       m.unit_price, m.unit_price, m.currency, 10, m.expire_at
FROM unnest($4::int8[], $5::text[], $6::uuid[], $7::uuid[], $8::uuid[], $9::int8[],
            $10::int8[], $11::text[], $12::timestamptz[])
     AS m(order_id, order_no, request_id, reservation_id, message_id, user_id,
          unit_price, currency, expire_at)
ON CONFLICT DO NOTHING
RETURNING order_id";

const DELETE_PROVISIONAL_ORDERS: &str = "DELETE FROM orders WHERE order_id = ANY ($1::int8[])";

const INSERT_ORDER_ITEMS: &str = "
INSERT INTO order_items (
    order_id, line_no, activity_id, sku_id, sku_title, quantity, unit_price, line_amount
)
SELECT m.order_id, 1, $1::int8, $2::int8, $3::text, 1, m.unit_price, m.unit_price
FROM unnest($4::int8[], $5::int8[]) AS m(order_id, unit_price)";

/// Takes $4 units from the bucket if it holds them (as `ALLOCATE_UNITS`) and writes
/// the ledger rows of the orders that get them, in one statement; no row when the
/// bucket holds fewer. The k-th order sees the bucket as if the units had been taken
/// one at a time: its before values are the after values of order k-1.
const TAKE_UNITS: &str = "
WITH taken AS (
    UPDATE sku_inventory
    SET available_stock = available_stock - $4,
        allocated_stock = allocated_stock + $4,
        version = version + $4,
        updated_at = statement_timestamp()
    WHERE activity_id = $1
      AND sku_id = $2
      AND bucket_no = $3
      AND available_stock >= $4
    RETURNING available_stock + $4 AS before_available,
              allocated_stock - $4 AS before_allocated
), ledger AS (
    INSERT INTO inventory_ledger (
        ledger_id, idempotency_key, reservation_id, order_id, source_message_id,
        activity_id, sku_id, user_id, inventory_bucket, ledger_type,
        available_delta, allocated_delta,
        before_available, after_available, before_allocated, after_allocated, reason
    )
    SELECT m.ledger_id, 'ALLOCATE:' || m.reservation_id::text, m.reservation_id,
           m.order_id, m.message_id, $1::int8, $2::int8, m.user_id, $3::int2, $5::int2,
           -1, 1,
           t.before_available - (m.k::int4 - 1), t.before_available - m.k::int4,
           t.before_allocated + (m.k::int4 - 1), t.before_allocated + m.k::int4,
           'ORDER_CREATED'
    FROM taken AS t
    CROSS JOIN unnest($6::int8[], $7::uuid[], $8::int8[], $9::uuid[], $10::int8[])
         WITH ORDINALITY AS m(ledger_id, reservation_id, order_id, message_id, user_id, k)
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING 1
)
SELECT (SELECT count(*) FROM ledger) FROM taken";

const LOCK_INVENTORY: &str = "
SELECT available_stock
FROM sku_inventory
WHERE activity_id = $1 AND sku_id = $2 AND bucket_no = $3
FOR UPDATE";

/// See `MARK_RESERVATION_ORDERED` for why the statuses are parameters.
const MARK_RESERVATIONS_ORDERED: &str = "
UPDATE inventory_reservation AS r
SET status = $1,
    order_id = m.order_id,
    ordered_at = statement_timestamp(),
    version = r.version + 1,
    updated_at = statement_timestamp()
FROM unnest($3::uuid[], $4::int8[]) AS m(reservation_id, order_id)
WHERE r.reservation_id = m.reservation_id
  AND r.status = $2";

const REJECT_RESERVATIONS: &str = "
UPDATE inventory_reservation AS r
SET status = $1,
    failure_code = $3,
    version = r.version + 1,
    updated_at = statement_timestamp()
FROM unnest($4::uuid[]) AS m(reservation_id)
WHERE r.reservation_id = m.reservation_id
  AND r.status = $2";
