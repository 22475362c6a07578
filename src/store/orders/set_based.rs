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
//! segment of new messages whose bucket holds their units, `run_fresh_transaction`
//! sends the whole transaction, COMMIT included, without waiting for an answer, and
//! the hot row is locked only from the UPDATE to the end of that COMMIT; it is
//! speculative: when the case is not the common one, a statement fails, the
//! transaction rolls back, and the segment is redone the careful way.

use std::collections::{HashMap, HashSet};
use std::task::Poll;

use chrono::{DateTime, Utc};
use futures_util::future::LocalBoxFuture;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Row, Transaction};
use uuid::Uuid;

use super::{
    commit_failed, expect_rows, explain_order_conflict, order_created_event, payload_hash, release,
    reservation_expires_at, reservation_verdict, AllocationTurn, OrderInput, OrderTxContext,
    StoredResult, SET_TX_SETTINGS,
};
use crate::domain::message::OrderCreateMessage;
use crate::domain::outcome::{OrderOutcome, ResultCode};
use crate::domain::status::{LedgerType, ReservationStatus};
use crate::store::compensation::{TaskRows, INSERT_TASKS};
use crate::store::outbox::{EventRows, INSERT_EVENTS};
use crate::store::{PgConn, StatementCache, StoreError};

/// A statement parameter of a `'static` type (the alias implies `+ 'static`); lists
/// holding borrowed values (the messages' `&str` columns, slices of the ledger rows)
/// are spelled `dyn ToSql + Sync`.
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
    let inbox = InboxRows::of(inputs);
    let inserted: HashSet<Uuid> = tx
        .query(
            &st.get(tx, INSERT_INBOX).await?,
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
            outcomes[i] = Some(StoredResult::from_row(row)?.answer(input.msg, &inbox.hashes[i])?);
        }
    }
    let fresh: Vec<usize> = (0..inputs.len())
        .filter(|&i| outcomes[i].is_none())
        .collect();

    // 2. Reservations (§9.2). A row this statement inserted is this message's own and
    //    invisible to everyone else; only the others need reading under a lock.
    let mut candidates = Vec::with_capacity(fresh.len());
    if !fresh.is_empty() {
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
                &OrderRows::of(&msgs).params(bucket),
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
        events.push(order_created_event(msg)?);
    }
    for msg in &denied_msgs {
        let (task, event) = release(msg, ResultCode::PostgresSoldOut)?;
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
        async { Ok(events.insert(tx.client(), &insert_events).await?) },
        async { Ok(tasks.insert(tx.client(), &insert_tasks).await?) },
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

/// The common case, a segment of new messages whose orders the bucket has units
/// for, as a whole transaction sent without waiting for any answer: BEGIN, the settings,
/// every write of `run_segment` as if each inbox, reservation and order row were
/// new (plain INSERTs: a row that exists fails its statement), the inventory UPDATE
/// for all the orders as soon as the turn comes (`TAKE_ALL`: it fails unless the
/// bucket holds every unit), and COMMIT. When all of that held, the careful path
/// would have written the same rows, with the UPDATE before the order writes and
/// each reservation inserted PENDING_DB and then marked ORDERED, where this inserts
/// it ORDERED: the result is the same. When any of it did not, a statement failed,
/// PostgreSQL aborted the transaction and the COMMIT behind it rolled it back; the
/// segment fails with `Speculation` and is redone the careful way.
///
/// The hot row is locked from the UPDATE to the end of the COMMIT right behind it,
/// never across a round trip to the engine, and the engine waits once for the whole
/// transaction instead of once per step (`send_whole`).
pub(super) async fn run_fresh_transaction(
    conn: &mut PgConn,
    ctx: &OrderTxContext,
    inputs: &[OrderInput<'_>],
    turn: &mut AllocationTurn,
) -> Result<Vec<OrderOutcome>, StoreError> {
    let bucket = inputs[0].msg;
    let n = inputs.len();
    let msgs: Vec<&OrderCreateMessage> = inputs.iter().map(|i| i.msg).collect();
    let inbox = InboxRows::of(inputs);
    // The careful way computes the expiry only for new messages, and reports it there.
    let reservations = ReservationRows::of(&msgs).map_err(|_| StoreError::Speculation)?;
    let orders = OrderRows::of(&msgs);
    let all: Vec<usize> = (0..n).collect();
    let ledgers = LedgerRows::of(inputs, &all);
    let mut events = EventRows::default();
    for msg in &msgs {
        events.push(order_created_event(msg)?);
    }
    let ordered = ReservationStatus::Ordered.code();
    let units = i32::try_from(n).map_err(|_| StoreError::Anomaly("segment too large".into()))?;

    let PgConn {
        client,
        statements: st,
        in_transaction,
        ..
    } = conn;
    let client = &*client;
    let settings = st.get(client, SET_TX_SETTINGS).await?;
    let insert_inbox = st.get(client, INSERT_NEW_INBOX).await?;
    let insert_reservations = st.get(client, INSERT_ORDERED_RESERVATIONS).await?;
    let insert_orders = st.get(client, INSERT_NEW_ORDERS).await?;
    let insert_items = st.get(client, INSERT_ORDER_ITEMS).await?;
    let insert_events = st.get(client, INSERT_EVENTS).await?;
    let take_all = st.get(client, TAKE_ALL).await?;
    let timeouts: [&Param; 2] = [&ctx.lock_timeout, &ctx.statement_timeout];
    let inbox_params = inbox.params(&ctx.consumer_group);
    let reservation_params = reservations.ordered_params(bucket, &ordered, &orders.order_ids);
    let order_params = orders.params(bucket);
    let items_params: [&Param; 5] = [
        &bucket.activity_id,
        &bucket.sku_id,
        &ctx.sku_title,
        &orders.order_ids,
        &orders.prices,
    ];
    let take_params: [&Param; 10] = [
        &bucket.activity_id,
        &bucket.sku_id,
        &bucket.inventory_bucket,
        &units,
        &LedgerType::Allocate.code(),
        &ledgers.ledger_ids,
        &ledgers.reservations,
        &ledgers.order_ids,
        &ledgers.message_ids,
        &ledgers.users,
    ];
    send_whole(
        client,
        in_transaction,
        vec![
            Box::pin(client.execute(&settings, &timeouts)),
            Box::pin(client.execute(&insert_inbox, &inbox_params)),
            Box::pin(client.execute(&insert_reservations, &reservation_params)),
            Box::pin(client.execute(&insert_orders, &order_params)),
            Box::pin(client.execute(&insert_items, &items_params)),
            Box::pin(async { events.insert(client, &insert_events).await.map(|()| 0) }),
        ],
        turn,
        (&take_all, &take_params),
    )
    .await?;
    Ok(msgs
        .iter()
        .map(|m| OrderOutcome {
            code: ResultCode::OrderCreated,
            order_id: Some(m.order_id),
            duplicate: false,
        })
        .collect())
}

/// A segment of new messages whose bucket is empty, as a whole transaction sent
/// without waiting for any answer: BEGIN, the settings, each message's inbox row
/// with its result and its reservation as REJECTED (plain INSERTs: a row that
/// exists fails its statement), its Redis give-back task and event, at its turn a
/// check that the bucket is empty and that no order holds any of the messages'
/// order keys (`CHECK_SOLD_OUT`, which fails otherwise), and COMMIT.
///
/// When all of that held, the careful path would have ended every message sold
/// out with the same rows: it inserts the reservation PENDING_DB, a provisional
/// order, finds the bucket empty, deletes the order and rejects the reservation,
/// and updates the inbox row with the result; this writes the final rows directly,
/// never touching the inventory row or the orders. A sale whose front stage lets
/// more messages through than the database holds units (its Redis lost the sale's
/// counts, or messages were published around it) settles them at a fraction of the
/// careful way's price (docs/BENCHMARKS.md, session 14). When the bucket holds a
/// unit again (a cancelled order gave it back) or an order holds a key, the check
/// fails, the transaction rolls back and the segment is redone the careful way.
pub(super) async fn run_sold_out_transaction(
    conn: &mut PgConn,
    ctx: &OrderTxContext,
    inputs: &[OrderInput<'_>],
    turn: &mut AllocationTurn,
) -> Result<Vec<OrderOutcome>, StoreError> {
    let bucket = inputs[0].msg;
    let sold_out = ResultCode::PostgresSoldOut;
    let msgs: Vec<&OrderCreateMessage> = inputs.iter().map(|i| i.msg).collect();
    let inbox = InboxRows::of(inputs);
    let reservations = ReservationRows::of(&msgs).map_err(|_| StoreError::Speculation)?;
    let orders = OrderRows::of(&msgs);
    let mut events = EventRows::default();
    let mut tasks = TaskRows::default();
    for msg in &msgs {
        let (task, event) = release(msg, sold_out)?;
        tasks.push(task);
        events.push(event);
    }
    let rejected = ReservationStatus::Rejected.code();
    let code = sold_out.as_str();

    let PgConn {
        client,
        statements: st,
        in_transaction,
        ..
    } = conn;
    let client = &*client;
    let settings = st.get(client, SET_TX_SETTINGS).await?;
    let insert_inbox = st.get(client, INSERT_SOLD_OUT_INBOX).await?;
    let insert_reservations = st.get(client, INSERT_REJECTED_RESERVATIONS).await?;
    let insert_events = st.get(client, INSERT_EVENTS).await?;
    let insert_tasks = st.get(client, INSERT_TASKS).await?;
    let check = st.get(client, CHECK_SOLD_OUT).await?;
    let timeouts: [&Param; 2] = [&ctx.lock_timeout, &ctx.statement_timeout];
    let [group, ids, topics, reservation_ids, hashes, order_ids] =
        inbox.params(&ctx.consumer_group);
    let inbox_params = [
        group,
        ids,
        topics,
        reservation_ids,
        hashes,
        order_ids,
        &code,
    ];
    let reservation_params = reservations.rejected_params(bucket, &rejected, &code);
    let check_params: [&(dyn ToSql + Sync); 9] = [
        &bucket.activity_id,
        &bucket.sku_id,
        &bucket.inventory_bucket,
        &orders.order_ids,
        &orders.order_nos,
        &orders.request_ids,
        &orders.reservation_ids,
        &orders.message_ids,
        &orders.users,
    ];
    send_whole(
        client,
        in_transaction,
        vec![
            Box::pin(client.execute(&settings, &timeouts)),
            Box::pin(client.execute(&insert_inbox, &inbox_params)),
            Box::pin(client.execute(&insert_reservations, &reservation_params)),
            Box::pin(async { events.insert(client, &insert_events).await.map(|()| 0) }),
            Box::pin(async { tasks.insert(client, &insert_tasks).await.map(|()| 0) }),
        ],
        turn,
        (&check, &check_params),
    )
    .await?;
    metrics::counter!("seckill_redis_release_requested_total", "reason" => sold_out.label())
        .increment(msgs.len() as u64);
    Ok(msgs
        .iter()
        .map(|_| OrderOutcome {
            code: sold_out,
            order_id: None,
            duplicate: false,
        })
        .collect())
}

/// A request of a transaction sent whole, answered with the rows it changed.
type Request<'c> = LocalBoxFuture<'c, Result<u64, tokio_postgres::Error>>;

/// Sends a transaction whole: BEGIN and `steps`, then, once the turn has come,
/// `at_turn` (which fails unless the transaction's assumption holds; the turn is
/// passed on when it succeeds), then COMMIT, and waits once for every answer.
/// Until the transaction is seen to end, the connection is marked
/// `in_transaction`, so that if this future is dropped half way the pool closes
/// the connection rather than reuse it. `Speculation` when the assumption did not
/// hold: PostgreSQL aborted the transaction and the COMMIT rolled it back.
async fn send_whole<'c>(
    client: &'c Client,
    in_transaction: &mut bool,
    steps: Vec<Request<'c>>,
    turn: &mut AllocationTurn,
    (at_turn, at_turn_params): (&tokio_postgres::Statement, &[&(dyn ToSql + Sync)]),
) -> Result<(), StoreError> {
    // Every request before COMMIT, in the order sent; the first failure in this
    // order is the cause (the ones after it fail because the transaction aborted).
    *in_transaction = true;
    let mut requests: Vec<Request<'c>> = vec![Box::pin(async {
        client.batch_execute("BEGIN").await.map(|()| 0)
    })];
    requests.extend(steps);
    // Sent one by one, and COMMIT only after all of them.
    let mut queued = 0;
    for request in &mut requests {
        if let Err(unsent) = sent(request).await {
            drop(requests);
            return Err(abandon(client, in_transaction, queued, unsent).await);
        }
        queued += 1;
    }
    turn.wait().await;
    let mut last: Request<'_> = Box::pin(async {
        let answer = client.query_one(at_turn, at_turn_params).await;
        if answer.is_ok() {
            turn.pass_on().await;
        }
        answer.map(|_| 0)
    });
    if let Err(unsent) = sent(&mut last).await {
        drop((requests, last));
        return Err(abandon(client, in_transaction, queued, unsent).await);
    }
    let (mut answers, last, committed) = futures_util::join!(
        futures_util::future::join_all(requests),
        last,
        client.batch_execute("COMMIT"),
    );
    answers.push(last);
    // The COMMIT was answered, so the transaction is over: committed, or rolled
    // back because a statement before it failed. Without an answer the connection
    // is broken and the pool will not hand it out again.
    if committed
        .as_ref()
        .map_or_else(|e| e.code().is_some(), |()| true)
    {
        *in_transaction = false;
    }
    if let Some(failed) = first_failure(answers) {
        return Err(failed);
    }
    committed.map_err(commit_failed)
}

/// Polls a request once; `Err` if it was not sent. tokio-postgres encodes a
/// request and queues it on the connection in its first poll, and whatever fails
/// before that is returned from that poll, without a code from the server. So `Ok`
/// means it is queued, and a COMMIT queued after it cannot overtake it: without
/// that check, a request that failed to encode would leave a COMMIT behind it to
/// keep the rest of the transaction without it.
///
/// That first poll may also bring the server's answer, when the connection's task
/// runs on another thread (a multi-threaded runtime, or a connection opened on
/// another runtime) and finishes the round trip while this thread is preempted
/// between queuing and polling. Such a request was sent; its answer is kept in its
/// place, for the caller to read with the others. The engine's pool opens its
/// connections on the engine's own runtime, but `send_whole` does not rely on it.
async fn sent(request: &mut Request<'_>) -> Result<(), tokio_postgres::Error> {
    match futures_util::poll!(request.as_mut()) {
        Poll::Pending => Ok(()),
        Poll::Ready(Err(e)) if e.code().is_none() => Err(e),
        Poll::Ready(answer) => {
            *request = Box::pin(std::future::ready(answer));
            Ok(())
        }
    }
}

/// A request failed before it was sent, after `queued` requests (BEGIN first) were:
/// no COMMIT was sent, so the transaction that BEGIN opened is rolled back here.
/// If that gets no answer the connection stays marked and the pool closes it.
async fn abandon(
    client: &Client,
    in_transaction: &mut bool,
    queued: usize,
    unsent: tokio_postgres::Error,
) -> StoreError {
    if queued == 0 || client.batch_execute("ROLLBACK").await.is_ok() {
        *in_transaction = false;
    }
    StoreError::Db(unsent)
}

/// The cause of a failed fresh transaction: its first failed statement in the order
/// sent. A unique key that was taken (23505) or a bucket short of units (`SK001`
/// from `TAKE_ALL`) means the speculation did not hold; any other answer from
/// PostgreSQL also aborted the transaction. Without an answer (the connection
/// broke) a COMMIT sent behind may have run.
fn first_failure(answers: Vec<Result<u64, tokio_postgres::Error>>) -> Option<StoreError> {
    let e = answers.into_iter().find_map(Result::err)?;
    Some(match e.code().map(|c| c.code()) {
        Some("23505" | "SK001") => {
            tracing::debug!(
                reason = e.as_db_error().map(|d| d.message()),
                "speculative order transaction rolled back"
            );
            StoreError::Speculation
        }
        Some(_) => StoreError::Db(e),
        None => StoreError::CommitOutcomeUnknown(e),
    })
}

/// The inbox rows of a segment's messages, as the columns of `insert_inbox!`.
struct InboxRows<'a> {
    message_ids: Vec<Uuid>,
    topics: Vec<&'a str>,
    reservation_ids: Vec<Uuid>,
    hashes: Vec<Vec<u8>>,
    order_ids: Vec<i64>,
}

impl<'a> InboxRows<'a> {
    fn of(inputs: &[OrderInput<'a>]) -> Self {
        Self {
            message_ids: inputs.iter().map(|i| i.msg.message_id).collect(),
            topics: inputs.iter().map(|i| i.topic).collect(),
            reservation_ids: inputs.iter().map(|i| i.msg.reservation_id).collect(),
            hashes: inputs.iter().map(|i| payload_hash(i.msg)).collect(),
            order_ids: inputs.iter().map(|i| i.msg.order_id).collect(),
        }
    }

    fn params<'p>(&'p self, consumer_group: &'p String) -> [&'p (dyn ToSql + Sync); 6] {
        [
            consumer_group,
            &self.message_ids,
            &self.topics,
            &self.reservation_ids,
            &self.hashes,
            &self.order_ids,
        ]
    }
}

/// Reservation rows for messages, as the columns of `INSERT_RESERVATIONS`,
/// `INSERT_ORDERED_RESERVATIONS` and `INSERT_REJECTED_RESERVATIONS`.
struct ReservationRows {
    reservation_ids: Vec<Uuid>,
    request_ids: Vec<Uuid>,
    message_ids: Vec<Uuid>,
    users: Vec<i64>,
    reserved_at: Vec<DateTime<Utc>>,
    expires: Vec<DateTime<Utc>>,
}

impl ReservationRows {
    /// Fails if a message's reservation has no valid expiry.
    fn of(msgs: &[&OrderCreateMessage]) -> Result<Self, StoreError> {
        Ok(Self {
            reservation_ids: msgs.iter().map(|m| m.reservation_id).collect(),
            request_ids: msgs.iter().map(|m| m.request_id).collect(),
            message_ids: msgs.iter().map(|m| m.message_id).collect(),
            users: msgs.iter().map(|m| m.user_id).collect(),
            reserved_at: msgs.iter().map(|m| m.reserved_at).collect(),
            expires: msgs
                .iter()
                .map(|m| reservation_expires_at(m))
                .collect::<Result<_, _>>()?,
        })
    }

    /// `INSERT_RESERVATIONS`' parameters.
    fn params<'p>(&'p self, bucket: &'p OrderCreateMessage) -> [&'p Param; 9] {
        [
            &bucket.activity_id,
            &bucket.sku_id,
            &bucket.inventory_bucket,
            &self.reservation_ids,
            &self.request_ids,
            &self.message_ids,
            &self.users,
            &self.reserved_at,
            &self.expires,
        ]
    }

    /// `INSERT_ORDERED_RESERVATIONS`' parameters: those of `params`, then the
    /// ORDERED status code and the messages' orders.
    fn ordered_params<'p>(
        &'p self,
        bucket: &'p OrderCreateMessage,
        ordered: &'p i16,
        order_ids: &'p Vec<i64>,
    ) -> [&'p Param; 11] {
        let [a, b, c, d, e, f, g, h, i] = self.params(bucket);
        [a, b, c, d, e, f, g, h, i, ordered, order_ids]
    }

    /// `INSERT_REJECTED_RESERVATIONS`' parameters: those of `params`, then the
    /// REJECTED status code and the failure code.
    fn rejected_params<'p>(
        &'p self,
        bucket: &'p OrderCreateMessage,
        rejected: &'p i16,
        failure: &'p &str,
    ) -> [&'p (dyn ToSql + Sync); 11] {
        let [a, b, c, d, e, f, g, h, i] = self.params(bucket);
        [a, b, c, d, e, f, g, h, i, rejected, failure]
    }
}

/// Order rows for messages, as the columns of `INSERT_ORDERS` and `INSERT_NEW_ORDERS`.
struct OrderRows<'m> {
    order_ids: Vec<i64>,
    order_nos: Vec<&'m str>,
    request_ids: Vec<Uuid>,
    reservation_ids: Vec<Uuid>,
    message_ids: Vec<Uuid>,
    users: Vec<i64>,
    prices: Vec<i64>,
    currencies: Vec<&'m str>,
    expire_at: Vec<DateTime<Utc>>,
}

impl<'m> OrderRows<'m> {
    fn of(msgs: &[&'m OrderCreateMessage]) -> Self {
        Self {
            order_ids: msgs.iter().map(|m| m.order_id).collect(),
            order_nos: msgs.iter().map(|m| m.order_no.as_str()).collect(),
            request_ids: msgs.iter().map(|m| m.request_id).collect(),
            reservation_ids: msgs.iter().map(|m| m.reservation_id).collect(),
            message_ids: msgs.iter().map(|m| m.message_id).collect(),
            users: msgs.iter().map(|m| m.user_id).collect(),
            prices: msgs.iter().map(|m| m.unit_price).collect(),
            currencies: msgs.iter().map(|m| m.currency.as_str()).collect(),
            expire_at: msgs.iter().map(|m| m.order_expire_at).collect(),
        }
    }

    fn params<'p>(&'p self, bucket: &'p OrderCreateMessage) -> [&'p (dyn ToSql + Sync); 12] {
        [
            &bucket.activity_id,
            &bucket.sku_id,
            &bucket.inventory_bucket,
            &self.order_ids,
            &self.order_nos,
            &self.request_ids,
            &self.reservation_ids,
            &self.message_ids,
            &self.users,
            &self.prices,
            &self.currencies,
            &self.expire_at,
        ]
    }
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

/// The inbox rows of a segment's messages, with the result and order id given as
/// SQL; see `INSERT_INBOX`, `INSERT_NEW_INBOX` and `INSERT_SOLD_OUT_INBOX`.
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
const INSERT_INBOX: &str = insert_inbox!(
    "'ORDER_CREATED'",
    "m.order_id",
    "
ON CONFLICT (consumer_group, message_id) DO NOTHING
RETURNING message_id"
);

/// For messages taken to be new: a redelivery fails the statement (23505).
const INSERT_NEW_INBOX: &str = insert_inbox!("'ORDER_CREATED'", "m.order_id", "");

/// For messages taken to be new and sold out, with the result $7 and no order: a
/// redelivery fails the statement (23505).
const INSERT_SOLD_OUT_INBOX: &str = insert_inbox!("$7::text", "NULL::int8", "");

// The inbox is read and updated one row per message, found by its full key in a
// subquery of its own. As a join of the arrays to the table on (consumer_group,
// message_id), the generic plan PostgreSQL makes on the sale's first few rows (no
// statistics yet) reads every row of the consumer group with the index's first
// column instead, and keeps doing so as the inbox grows: quadratic over a sale
// (docs/BENCHMARKS.md, session 13). Inside the subquery the message id is a known
// value, so the only index path takes both columns: one probe, at any size.

/// `StoredResult`'s columns, then the message id.
const LOAD_INBOX: &str = "
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
const UPDATE_INBOX_RESULTS: &str = "
UPDATE consumer_inbox AS i
SET result_code = m.code, order_id = m.order_id, processed_at = statement_timestamp()
FROM unnest($2::uuid[], $3::text[], $4::int8[]) AS m(message_id, code, order_id)
WHERE i.ctid = (
    SELECT ctid FROM consumer_inbox WHERE consumer_group = $1 AND message_id = m.message_id
)";

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
/// For reservations taken to be new: one that exists fails the statement (23505).
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
          order_id)";

/// The sold-out way's reservations, written as `REJECT_RESERVATIONS` would leave
/// them after `INSERT_RESERVATIONS`: status $10 with failure code $11, at version 1.
/// For reservations taken to be new: one that exists fails the statement (23505).
const INSERT_REJECTED_RESERVATIONS: &str = "
INSERT INTO inventory_reservation (
    reservation_id, request_id, first_message_id, activity_id, sku_id, user_id,
    inventory_bucket, quantity, status, failure_code, redis_reserved_at, expires_at,
    version
)
SELECT m.reservation_id, m.request_id, m.message_id, $1::int8, $2::int8, m.user_id,
       $3::int2, 1, $10::int2, $11::text, m.reserved_at, m.expires_at, 1
FROM unnest($4::uuid[], $5::uuid[], $6::uuid[], $7::int8[], $8::timestamptz[],
            $9::timestamptz[])
     AS m(reservation_id, request_id, message_id, user_id, reserved_at, expires_at)";

/// `reservation_verdict`'s columns, then the reservation id; locked in key order so
/// two transactions locking overlapping sets cannot deadlock.
const LOCK_RESERVATIONS: &str = "
SELECT request_id, activity_id, sku_id, user_id, inventory_bucket, order_id, status,
       reservation_id
FROM inventory_reservation
WHERE reservation_id = ANY ($1::uuid[])
ORDER BY reservation_id
FOR UPDATE";

/// The orders of a segment's messages; see `INSERT_ORDERS` and `INSERT_NEW_ORDERS`.
macro_rules! insert_orders_then {
    ($tail:literal) => {
        concat!(
            "
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
          unit_price, currency, expire_at)",
            $tail
        )
    };
}

/// Returns the orders written; one that conflicts with an existing order on any of
/// its unique keys is not.
const INSERT_ORDERS: &str = insert_orders_then!(
    "
ON CONFLICT DO NOTHING
RETURNING order_id"
);

/// For orders taken to be new: one that conflicts fails the statement (23505).
const INSERT_NEW_ORDERS: &str = insert_orders_then!("");

const DELETE_PROVISIONAL_ORDERS: &str = "DELETE FROM orders WHERE order_id = ANY ($1::int8[])";

const INSERT_ORDER_ITEMS: &str = "
INSERT INTO order_items (
    order_id, line_no, activity_id, sku_id, sku_title, quantity, unit_price, line_amount
)
SELECT m.order_id, 1, $1::int8, $2::int8, $3::text, 1, m.unit_price, m.unit_price
FROM unnest($4::int8[], $5::int8[]) AS m(order_id, unit_price)";

/// Takes $4 units from the bucket if it holds them (`allocate_units!`) and writes
/// the ledger rows of the orders that get them. The k-th order sees the bucket as if
/// the units had been taken one at a time: its before values are the after values of
/// order k-1. A macro so that both statements below stay static SQL.
macro_rules! take_units_then {
    ($select:literal) => {
        concat!(
            "
WITH taken AS (",
            allocate_units!(),
            "
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
",
            $select
        )
    };
}

/// `take_units_then` returning the ledger rows written; no row when the bucket
/// holds fewer than $4 units.
const TAKE_UNITS: &str = take_units_then!("SELECT (SELECT count(*) FROM ledger) FROM taken");

/// `take_units_then` for all $4 orders or none: when the bucket holds fewer units
/// (or an order already has its ledger row), the statement fails with SQLSTATE
/// SK001 and aborts the transaction, so a COMMIT sent right behind it rolls back.
const TAKE_ALL: &str = take_units_then!(
    "SELECT abort_unless((SELECT count(*) FROM ledger) = $4, 'the bucket holds fewer units than the batch takes')"
);

/// Fails with SK001 unless the bucket is empty and no order holds any of the
/// segment's order keys: then the careful way would insert every provisional order,
/// take no unit and delete them all. Each key is looked up in an index that leads
/// with it. A user's orders are found one user at a time, by user alone, and the
/// SKU is checked on the rows (`IS NOT DISTINCT FROM` is no index condition). On a
/// sale's fresh tables the generic plan PostgreSQL makes for the plain form (the
/// activity and SKU as index conditions) read every order of the SKU from
/// `idx_orders_activity_status` once per batch, and the one for `user_id = ANY`
/// read the whole of `uq_orders_user_sku` by its last column (docs/BENCHMARKS.md,
/// session 14).
const CHECK_SOLD_OUT: &str = "
SELECT abort_unless(
    (SELECT available_stock = 0 FROM sku_inventory
     WHERE activity_id = $1 AND sku_id = $2 AND bucket_no = $3)
    AND NOT EXISTS (SELECT 1 FROM orders WHERE order_id = ANY ($4::int8[]))
    AND NOT EXISTS (SELECT 1 FROM orders WHERE order_no = ANY ($5::text[]))
    AND NOT EXISTS (SELECT 1 FROM orders WHERE request_id = ANY ($6::uuid[]))
    AND NOT EXISTS (SELECT 1 FROM orders WHERE reservation_id = ANY ($7::uuid[]))
    AND NOT EXISTS (SELECT 1 FROM orders WHERE source_message_id = ANY ($8::uuid[]))
    AND NOT EXISTS (
        SELECT 1
        FROM unnest($9::int8[]) AS m(user_id)
        CROSS JOIN LATERAL (
            SELECT 1 FROM orders
            WHERE user_id = m.user_id
              AND (activity_id, sku_id) IS NOT DISTINCT FROM ($1, $2)
            OFFSET 0
        ) AS o
    ),
    'the bucket holds a unit, or an order holds a key of the batch')";

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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_request_answered_in_its_first_poll_was_sent_and_keeps_its_answer() {
        let mut request: Request<'_> = Box::pin(async { Ok(3) });
        assert!(sent(&mut request).await.is_ok());
        assert_eq!(request.await.ok(), Some(3));
    }

    #[tokio::test]
    async fn a_request_still_waiting_for_its_answer_was_sent() {
        let (answer, answered) = tokio::sync::oneshot::channel::<u64>();
        let mut request: Request<'_> = Box::pin(async { Ok(answered.await.unwrap_or_default()) });
        assert!(sent(&mut request).await.is_ok());
        let _ = answer.send(5);
        assert_eq!(request.await.ok(), Some(5));
    }

    #[tokio::test]
    async fn a_request_that_failed_without_the_servers_answer_was_not_sent() {
        // What tokio-postgres returns from a first poll that could not queue the
        // request: an error without an SQLSTATE (here one from parsing a config).
        let mut request: Request<'_> = Box::pin(async {
            "port=not-a-number"
                .parse::<tokio_postgres::Config>()
                .map(|_| 0)
        });
        let unsent = sent(&mut request).await.err();
        assert!(unsent.is_some_and(|e| e.code().is_none()));
    }
}
