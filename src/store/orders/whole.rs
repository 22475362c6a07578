//! The order transaction sent whole. In the common case, a
//! segment of new messages whose bucket holds their units, `run_fresh_transaction`
//! sends the whole transaction, COMMIT included, without waiting for an answer, and
//! the hot row is locked only from the UPDATE to the end of that COMMIT; it is
//! speculative: when the case is not the common one, a statement fails, the
//! transaction rolls back, and the segment is redone the careful way.

use std::task::Poll;

use futures_util::future::LocalBoxFuture;
use tokio_postgres::types::ToSql;
use tokio_postgres::Client;

use super::allocation::AllocationTurn;
use super::context::{OrderInput, OrderTxContext};
use super::rows::{InboxRows, LedgerRows, OrderRows, Param, ReservationRows};
use super::sql::{
    CHECK_SOLD_OUT, INSERT_NEW_ORDERS, INSERT_ORDERED_RESERVATIONS, INSERT_ORDER_ITEMS,
    INSERT_REJECTED_RESERVATIONS, SET_TX_SETTINGS, TAKE_ALL,
};
use super::steps::{order_created_event, release};
use crate::domain::message::OrderCreateMessage;
use crate::domain::outcome::{OrderOutcome, ResultCode};
use crate::domain::status::{LedgerType, ReservationStatus};
use crate::store::compensation::{TaskRows, INSERT_TASKS};
use crate::store::inbox::{INSERT_NEW_INBOX_ROWS, INSERT_SOLD_OUT_INBOX_ROWS};
use crate::store::outbox::{EventRows, INSERT_EVENTS};
use crate::store::tx::{commit_failed, unwarned};
use crate::store::{PgConn, StoreError, Warnings};

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
        warnings,
        ..
    } = conn;
    let client = &*client;
    let settings = st.get(client, SET_TX_SETTINGS).await?;
    let insert_inbox = st.get(client, INSERT_NEW_INBOX_ROWS).await?;
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
        warnings,
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
/// careful way's price (docs/benchmarks-history.md, 2026-12-01, 2ef46aa). When the bucket holds a
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
        warnings,
        ..
    } = conn;
    let client = &*client;
    let settings = st.get(client, SET_TX_SETTINGS).await?;
    let insert_inbox = st.get(client, INSERT_SOLD_OUT_INBOX_ROWS).await?;
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
        warnings,
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
    metrics::counter!(crate::telemetry::names::REDIS_RELEASE_REQUESTED_TOTAL, "reason" => sold_out.label())
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
pub(super) async fn send_whole<'c>(
    client: &'c Client,
    in_transaction: &mut bool,
    warnings: &Warnings,
    steps: Vec<Request<'c>>,
    turn: &mut AllocationTurn,
    (at_turn, at_turn_params): (&tokio_postgres::Statement, &[&(dyn ToSql + Sync)]),
) -> Result<(), StoreError> {
    // Every request before COMMIT, in the order sent; the first failure in this
    // order is the cause (the ones after it fail because the transaction aborted).
    // A warning anywhere in the transaction makes a successful COMMIT's outcome
    // unknown (`tx::commit`); none of its statements warns otherwise.
    let warned_before = warnings.seen();
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
    #[cfg(feature = "chaos")]
    if crate::failpoints::armed("order_tx_before_commit") {
        // Every statement answered (the stock UPDATE among them), COMMIT not sent.
        let _ = futures_util::join!(futures_util::future::join_all(requests), last);
        match crate::failpoints::hang("order_tx_before_commit").await {}
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
    committed.map_err(commit_failed)?;
    unwarned(warnings, warned_before)
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
pub(super) async fn sent(request: &mut Request<'_>) -> Result<(), tokio_postgres::Error> {
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
pub(super) async fn abandon(
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
pub(super) fn first_failure(
    answers: Vec<Result<u64, tokio_postgres::Error>>,
) -> Option<StoreError> {
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
