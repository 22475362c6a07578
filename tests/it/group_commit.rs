//! Group commit is invisible: the same messages in the same order give the same
//! outcome per message and the same rows whether each runs in a transaction of its
//! own or many share one. A property test generates the mixes (redeliveries,
//! re-sending producers, repeat users, stock shortfalls, several buckets) and the
//! transaction sizes, and runs each mix on two fresh databases. The batched side
//! speculates (one round trip per batch, redone the careful way when the batch is
//! not as assumed) in some mixes, assuming every batch new with units or every
//! batch new and sold out, and not in others.

use std::cell::RefCell;
use std::collections::HashSet;
use std::sync::atomic::{AtomicI64, Ordering};

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, TestRunner};
use seckill_engine::domain::message::OrderCreateMessage;
use seckill_engine::domain::outcome::OrderOutcome;
use seckill_engine::store::orders::{
    create_orders, AllocationTurn, OrderInput, OrderTxContext, Speculation,
};
use seckill_engine::store::PgConn;
use tokio_postgres::Client;

use crate::common::builders::{self, order, resend};
use crate::common::{assert_invariants, count, index_entries_read, sequential_scans, TestEnv};

/// One message of a mix.
#[derive(Debug, Clone)]
enum Step {
    /// A fresh reservation of user `user` in bucket `bucket`.
    New { user: u16, bucket: i16 },
    /// An earlier message again (a redelivery).
    Redeliver(Index),
    /// An earlier reservation under a new message id (a re-sending producer).
    Resend(Index),
}

/// A generated case: stock and users of activity 61, its messages, and the sizes of
/// the batched side's transactions (cycled).
#[derive(Debug, Clone)]
struct Mix {
    buckets: i16,
    stock: i32,
    steps: Vec<Step>,
    chunks: Vec<usize>,
    /// What the batched side assumes of every batch.
    speculate: Speculation,
}

fn mixes() -> impl Strategy<Value = Mix> {
    (1i16..=4, 1u16..=300, 0i32..=120).prop_flat_map(|(buckets, users, stock)| {
        let step = prop_oneof![
            6 => (0..users, 0..buckets).prop_map(|(user, bucket)| Step::New { user, bucket }),
            2 => any::<Index>().prop_map(Step::Redeliver),
            2 => any::<Index>().prop_map(Step::Resend),
        ];
        (
            proptest::collection::vec(step, 1..200),
            proptest::collection::vec(1usize..=128, 1..8),
            prop_oneof![
                Just(Speculation::Careful),
                Just(Speculation::Fresh),
                Just(Speculation::SoldOut)
            ],
        )
            .prop_map(move |(steps, chunks, speculate)| Mix {
                buckets,
                stock,
                steps,
                chunks,
                speculate,
            })
    })
}

/// The messages of a mix, in order.
fn messages(mix: &Mix) -> Vec<OrderCreateMessage> {
    let mut msgs: Vec<OrderCreateMessage> = Vec::new();
    for step in &mix.steps {
        let next = match step {
            Step::Redeliver(i) if !msgs.is_empty() => i.get(&msgs).clone(),
            Step::Resend(i) if !msgs.is_empty() => resend(i.get(&msgs)),
            Step::New { user, bucket } => order(61, 1, i64::from(*user) + 1, *bucket),
            // Nothing to repeat yet.
            Step::Redeliver(_) | Step::Resend(_) => order(61, 1, 1, 0),
        };
        msgs.push(next);
    }
    msgs
}

fn context(speculate: Speculation) -> OrderTxContext {
    OrderTxContext {
        consumer_group: "seckill-engine".into(),
        sku_title: "test sku 1".into(),
        lock_timeout: "5s".into(),
        statement_timeout: "30s".into(),
        max_attempts: 3,
        speculate,
    }
}

fn connection(client: Client) -> PgConn {
    PgConn::new(client, Default::default())
}

/// Runs `msgs` in order, `chunks[i]` of them per transaction (cycling).
async fn run(
    env: &TestEnv,
    msgs: &[OrderCreateMessage],
    chunks: &[usize],
    speculate: Speculation,
) -> Vec<OrderOutcome> {
    let mut conn = connection(env.db().await);
    run_on(&mut conn, msgs, chunks, speculate).await
}

/// Ledger ids, unique across the runs of a test binary.
static NEXT_LEDGER_ID: AtomicI64 = AtomicI64::new(1);

/// `run` on a given connection.
async fn run_on(
    conn: &mut PgConn,
    msgs: &[OrderCreateMessage],
    chunks: &[usize],
    speculate: Speculation,
) -> Vec<OrderOutcome> {
    let ctx = context(speculate);
    let mut outcomes = Vec::new();
    let mut at = 0;
    for size in chunks.iter().cycle() {
        if at >= msgs.len() {
            break;
        }
        let end = (at + size).min(msgs.len());
        let (done, _) = create_orders(
            conn,
            &ctx,
            &inputs(&msgs[at..end]),
            &mut AllocationTurn::free(),
        )
        .await
        .expect("the mix has no invalid message");
        outcomes.extend(done);
        at = end;
    }
    outcomes
}

/// Every row that matters, as text, without generated ids and timestamps.
async fn snapshot(db: &Client) -> Vec<String> {
    // Every column written from the messages, so that a value bound to the wrong
    // column shows; the times the transactions stamp themselves differ by nature.
    let queries = [
        "SELECT row(order_id, order_no, request_id, reservation_id, source_message_id, activity_id,
                    sku_id, user_id, inventory_bucket, quantity, unit_price, total_amount,
                    currency, status, expire_at)::text FROM orders",
        "SELECT row(order_id, line_no, activity_id, sku_id, sku_title, quantity, unit_price,
                    line_amount)::text FROM order_items",
        "SELECT row(bucket_no, total_stock, available_stock, allocated_stock, version)::text FROM sku_inventory",
        "SELECT row(reservation_id, request_id, first_message_id, activity_id, sku_id, user_id,
                    inventory_bucket, quantity, status, failure_code, order_id, redis_reserved_at,
                    expires_at, version, ordered_at IS NULL)::text
           FROM inventory_reservation",
        "SELECT row(consumer_group, message_id, topic, tag, message_key, reservation_id,
                    payload_hash, status, result_code, order_id)::text FROM consumer_inbox",
        "SELECT row(ledger_id IS NULL, idempotency_key, reservation_id, order_id, source_message_id,
                    activity_id, sku_id, user_id, inventory_bucket, ledger_type, available_delta,
                    allocated_delta, before_available, after_available, before_allocated,
                    after_allocated, reason)::text FROM inventory_ledger",
        "SELECT row(dedup_key, aggregate_type, aggregate_id, topic, tag, message_key, payload)::text
           FROM event_outbox",
        "SELECT row(idempotency_key, task_type)::text FROM compensation_task",
    ];
    let mut out = Vec::new();
    for q in queries {
        let mut rows: Vec<String> = db
            .query(q, &[])
            .await
            .unwrap_or_else(|e| panic!("{q}: {e}"))
            .iter()
            .map(|r| r.get(0))
            .collect();
        rows.sort();
        out.push(format!("-- {q}"));
        out.extend(rows);
    }
    out
}

/// Runs `mix` alone and in batches; returns the outcomes of the first.
async fn check(mix: &Mix) -> Vec<OrderOutcome> {
    let alone = TestEnv::new().await;
    let grouped = TestEnv::new().await;
    for env in [&alone, &grouped] {
        let mut db = env.db().await;
        builders::activity(&mut db, 61, 1, mix.stock, mix.buckets).await;
    }
    let msgs = messages(mix);
    let one_by_one = run(&alone, &msgs, &[1], Speculation::Careful).await;
    let batched = run(&grouped, &msgs, &mix.chunks, mix.speculate).await;
    assert_eq!(one_by_one.len(), msgs.len());
    for (i, (a, b)) in one_by_one.iter().zip(&batched).enumerate() {
        assert_eq!(a, b, "message {i} differs alone vs in batches");
    }
    let (db_a, db_b) = (alone.db().await, grouped.db().await);
    assert_eq!(snapshot(&db_a).await, snapshot(&db_b).await);
    assert_invariants(&db_a).await;
    assert_invariants(&db_b).await;
    alone.cleanup().await;
    grouped.cleanup().await;
    one_by_one
}

/// `PROPTEST_CASES` (default 24) mixes; a failing one is shrunk to a small mix and
/// saved under `proptest-regressions/`, which is replayed first on later runs.
#[test]
fn batched_transactions_give_every_message_its_single_outcome() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24);
    let mut runner = TestRunner::new(Config {
        cases,
        source_file: Some(file!()),
        ..Config::default()
    });
    let seen = RefCell::new(HashSet::new());
    runner
        .run(&mixes(), |mix| {
            let outcomes = rt.block_on(check(&mix));
            seen.borrow_mut().extend(outcomes.iter().map(|o| o.label()));
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
    // Together the mixes exercise every branch.
    let seen = seen.into_inner();
    for label in [
        "created",
        "duplicate",
        "already_created",
        "user_already_ordered",
        "sold_out",
    ] {
        assert!(seen.contains(label), "no {label} in {seen:?}");
    }
}

/// Runs `msgs` as one transaction in `turn`.
async fn run_in_turn(
    env: &TestEnv,
    msgs: &[OrderCreateMessage],
    mut turn: AllocationTurn,
    speculate: Speculation,
) -> Vec<OrderOutcome> {
    let mut conn = connection(env.db().await);
    let (outcomes, _) = create_orders(&mut conn, &context(speculate), &inputs(msgs), &mut turn)
        .await
        .expect("valid messages");
    turn.finish().await;
    outcomes
}

/// One transaction's inputs.
fn inputs(msgs: &[OrderCreateMessage]) -> Vec<OrderInput<'_>> {
    msgs.iter()
        .map(|msg| OrderInput {
            msg,
            topic: "test.order.create.0",
            ledger_id: NEXT_LEDGER_ID.fetch_add(1, Ordering::Relaxed),
        })
        .collect()
}

/// A speculative batch takes one attempt when all its messages are new and its
/// bucket holds their units; otherwise it is redone the careful way (a second
/// attempt), with the outcomes the careful way gives. The speculative attempt sends
/// its COMMIT without waiting for its statements: when one of them failed, that
/// COMMIT must have rolled back and left the connection outside any transaction.
#[tokio::test]
async fn a_speculative_batch_is_redone_carefully_unless_all_new_with_units() {
    let env = TestEnv::new().await;
    builders::activity(&mut env.db().await, 64, 1, 14, 1).await;
    let mut conn = connection(env.db().await);
    let fresh: Vec<_> = (1..=10).map(|u| order(64, 1, u, 0)).collect();
    // A redelivery while the bucket still holds the units: the unique keys tell, not
    // the stock.
    let again = vec![order(64, 1, 21, 0), fresh[0].clone()];
    let short: Vec<_> = (11..=14).map(|u| order(64, 1, u, 0)).collect();
    let fresh_way = Speculation::Fresh;
    assert_eq!(
        attempt(&mut conn, fresh_way, &fresh).await,
        (vec!["created"; 10], 1)
    );
    // The event every order announces itself with, field for field.
    let m = &fresh[0];
    let payload: serde_json::Value = env
        .db()
        .await
        .query_one(
            "SELECT payload FROM event_outbox WHERE dedup_key = 'ORDER_CREATED:' || $1::int8",
            &[&m.order_id],
        )
        .await
        .expect("the order's event")
        .get(0);
    assert_eq!(
        payload,
        serde_json::json!({
            "order_id": m.order_id,
            "order_no": m.order_no,
            "reservation_id": m.reservation_id,
            "request_id": m.request_id,
            "activity_id": m.activity_id,
            "sku_id": m.sku_id,
            "user_id": m.user_id,
            "inventory_bucket": m.inventory_bucket,
            "unit_price": m.unit_price,
            "total_amount": m.unit_price,
            "currency": m.currency,
            "status": "Created",
            "expire_at": m.order_expire_at,
        })
    );
    assert_eq!(
        attempt(&mut conn, fresh_way, &again).await,
        (vec!["created", "duplicate"], 2)
    );
    // A batch of one message speculates too.
    let single = [order(64, 1, 31, 0)];
    assert_eq!(
        attempt(&mut conn, fresh_way, &single).await,
        (vec!["created"], 1)
    );
    assert_eq!(
        attempt(&mut conn, fresh_way, &single).await,
        (vec!["duplicate"], 2)
    );
    // Messages that share a key cannot all be new: the careful way at once.
    let twice = [order(64, 1, 41, 0), order(64, 1, 41, 0)];
    assert_eq!(
        attempt(&mut conn, fresh_way, &twice).await,
        (vec!["created", "user_already_ordered"], 1)
    );
    assert_eq!(
        attempt(&mut conn, fresh_way, &short).await,
        (vec!["created", "sold_out", "sold_out", "sold_out"], 2)
    );
    let db = env.db().await;
    assert_eq!(count(&db, "SELECT count(*) FROM orders").await, 14);
    assert_invariants(&db).await;
    env.cleanup().await;
}

/// One speculative transaction of `msgs`: their outcomes' labels and the attempts it
/// took (2: redone the careful way). Either way the connection must be left outside
/// any transaction.
async fn attempt(
    conn: &mut PgConn,
    speculate: Speculation,
    msgs: &[OrderCreateMessage],
) -> (Vec<&'static str>, u32) {
    let (outcomes, attempts) = create_orders(
        conn,
        &context(speculate),
        &inputs(msgs),
        &mut AllocationTurn::free(),
    )
    .await
    .expect("valid messages");
    assert!(
        outside_transaction(&conn.client).await,
        "left inside a transaction"
    );
    (outcomes.iter().map(|o| o.label()).collect(), attempts)
}

/// A batch sent as sold out takes one attempt when its messages are new, no order
/// holds any of their keys and the bucket is empty, and leaves the rows the careful
/// way leaves; otherwise it is redone the careful way, with the outcomes that way
/// gives.
#[tokio::test]
async fn a_sold_out_batch_is_sent_whole_only_when_new_and_its_bucket_empty() {
    let env = TestEnv::new().await;
    builders::activity(&mut env.db().await, 67, 1, 3, 1).await;
    let mut conn = connection(env.db().await);
    let sold_out_way = Speculation::SoldOut;
    let users: Vec<_> = (1..=12).map(|u| order(67, 1, u, 0)).collect();
    // The bucket holds units: the careful way.
    assert_eq!(
        attempt(&mut conn, sold_out_way, &users[..4]).await,
        (vec!["created", "created", "created", "sold_out"], 2)
    );
    assert_eq!(
        attempt(&mut conn, sold_out_way, &users[4..8]).await,
        (vec!["sold_out"; 4], 1)
    );
    // A user who has an order, a reservation that has one, a redelivery: each
    // keeps the answer the careful way gives it.
    let repeat_user = order(67, 1, 2, 0);
    let resent = resend(&users[0]);
    for (new, odd, answer) in [
        (&users[8], &repeat_user, "user_already_ordered"),
        (&users[9], &resent, "already_created"),
        (&users[10], &users[5], "duplicate"),
    ] {
        assert_eq!(
            attempt(&mut conn, sold_out_way, &[new.clone(), odd.clone()]).await,
            (vec!["sold_out", answer], 2),
            "{answer}"
        );
    }
    let db = env.db().await;
    assert_eq!(count(&db, "SELECT count(*) FROM orders").await, 3);
    assert_invariants(&db).await;
    env.cleanup().await;

    // The rows and outcomes are those of one message per transaction.
    let steps = (0..40).map(|user| Step::New { user, bucket: 0 }).collect();
    check(&Mix {
        buckets: 1,
        stock: 5,
        steps,
        chunks: vec![6, 3, 8],
        speculate: sold_out_way,
    })
    .await;
}

/// Whether the connection is outside any transaction block: a simple query there
/// is its own transaction, which starts with it; inside a block opened earlier,
/// now() is that block's start.
async fn outside_transaction(client: &Client) -> bool {
    let answer = client
        .simple_query("SELECT now() = statement_timestamp()")
        .await
        .expect("the connection answers");
    answer.iter().any(
        |m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(row) if row.get(0) == Some("t")),
    )
}

/// A speculative transaction sends BEGIN without a guard that rolls back on drop.
/// Dropped half way (its caller cancelled while it waits for its turn, BEGIN and
/// its writes sent), it must not leave its connection to the next user inside that
/// transaction: the pool closes the connection, and nothing is committed.
#[tokio::test]
async fn a_speculative_transaction_dropped_half_way_leaves_no_open_transaction() {
    let env = TestEnv::new().await;
    builders::activity(&mut env.db().await, 65, 1, 5, 1).await;
    let pool = env.one_connection_pool();
    let msgs: Vec<_> = (1..=3).map(|u| order(65, 1, u, 0)).collect();
    // The turn before this one never passes, so the transaction stops before its
    // inventory UPDATE, with BEGIN and its writes sent.
    let (before, next) = AllocationTurn::after(None);
    let (mut turn, _) = AllocationTurn::after(Some(next));
    {
        let mut conn = pool.get().await.expect("a connection");
        let (ctx, inputs) = (context(Speculation::Fresh), inputs(&msgs));
        let run = create_orders(&mut conn, &ctx, &inputs, &mut turn);
        let waited = tokio::time::timeout(std::time::Duration::from_millis(500), run).await;
        assert!(waited.is_err(), "the transaction did not wait for its turn");
    }
    let conn = pool.get().await.expect("a connection");
    assert!(
        outside_transaction(&conn.client).await,
        "the pool handed out a connection inside the dropped transaction"
    );
    drop(conn);
    let db = env.db().await;
    assert_eq!(count(&db, "SELECT count(*) FROM consumer_inbox").await, 0);
    assert_eq!(count(&db, "SELECT count(*) FROM orders").await, 0);
    drop(before);
    env.cleanup().await;
}

/// The speculative transaction sends its COMMIT only after every other request of
/// the transaction was queued on the connection, and takes a request as queued when
/// its first poll left it pending (src/store/orders/whole.rs, `sent`). That is
/// tokio-postgres' behaviour, pinned here: a request that cannot be encoded is
/// answered in its first poll, a valid one is not.
#[tokio::test]
async fn tokio_postgres_answers_a_request_it_cannot_send_in_its_first_poll() {
    let env = TestEnv::new().await;
    let client = env.db().await;
    let statement = client.prepare("SELECT $1::int4").await.expect("prepare");
    let wrong: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&"not an int4"];
    let mut unsendable = std::pin::pin!(client.execute(&statement, &wrong));
    match futures_util::poll!(unsendable.as_mut()) {
        std::task::Poll::Ready(Err(e)) => assert!(e.code().is_none(), "{e}"),
        other => panic!("expected an immediate encoding error, got {other:?}"),
    }
    let mut valid = std::pin::pin!(client.execute(&statement, &[&7i32]));
    assert!(futures_util::poll!(valid.as_mut()).is_pending());
    assert_eq!(valid.await.expect("answered"), 1);
    env.cleanup().await;
}

/// Overlapping transactions of one bucket (engine.bucket_pipeline > 1) take units in
/// the order of their turns, whichever reaches the database first: the second
/// reaches the row only when the first has finished. Both ways: speculative, and
/// careful.
#[actix_rt::test]
async fn overlapping_transactions_of_a_bucket_allocate_in_turn_order() {
    for speculate in [Speculation::Fresh, Speculation::Careful] {
        let env = TestEnv::new().await;
        builders::activity(&mut env.db().await, 62, 1, 5, 1).await;
        let first: Vec<_> = (1..=5).map(|u| order(62, 1, u, 0)).collect();
        let second: Vec<_> = (101..=105).map(|u| order(62, 1, u, 0)).collect();
        let (turn_a, next) = AllocationTurn::after(None);
        let (turn_b, _) = AllocationTurn::after(Some(next));

        // The second batch starts first; it must stop before its inventory UPDATE.
        let mut second_run = Box::pin(run_in_turn(&env, &second, turn_b, speculate));
        let early =
            tokio::time::timeout(std::time::Duration::from_millis(500), &mut second_run).await;
        assert!(early.is_err(), "the second batch allocated before its turn");
        let (a, b) = tokio::join!(run_in_turn(&env, &first, turn_a, speculate), second_run);
        assert!(a.iter().all(|o| o.label() == "created"), "{a:?}");
        assert!(b.iter().all(|o| o.label() == "sold_out"), "{b:?}");
        assert_invariants(&env.db().await).await;
        env.cleanup().await;
    }
}

/// A prepared statement runs on a generic plan from its sixth execution, planned for
/// the table as it was then. Small batches on a sale's fresh tables must still find
/// their rows by key, not by scanning a table that keeps growing.
#[tokio::test]
async fn small_batches_on_fresh_tables_never_scan_them() {
    let env = TestEnv::new().await;
    let mut db = env.db().await;
    builders::activity(&mut db, 63, 1, 300, 1).await;
    let msgs: Vec<_> = (1..=600).map(|user| order(63, 1, user, 0)).collect();
    let mut conn = connection(env.db().await);
    // Every way: new batches with units, careful ones until the bucket is empty and
    // after, then batches sent as sold out.
    run_on(&mut conn, &msgs[..200], &[4], Speculation::Fresh).await;
    run_on(&mut conn, &msgs[200..400], &[4], Speculation::Careful).await;
    let orders_indexes = [
        "orders_pkey",
        "uq_orders_order_no",
        "uq_orders_request",
        "uq_orders_reservation",
        "uq_orders_source_message",
        "uq_orders_user_sku",
        "idx_orders_user_created",
        "idx_orders_activity_status",
    ];
    let before = index_entries_read(&conn.client, &db, &orders_indexes).await;
    let sold_out = run_on(&mut conn, &msgs[400..], &[4], Speculation::SoldOut).await;
    assert!(
        sold_out.iter().all(|o| o.label() == "sold_out"),
        "{sold_out:?}"
    );
    // Every key the sold-out check looks up is new: by key, next to nothing is
    // read. By the SKU, each batch read all 300 orders.
    let after = index_entries_read(&conn.client, &db, &orders_indexes).await;
    let read: Vec<_> = before
        .iter()
        .zip(&after)
        .map(|((index, a), (_, b))| (index.clone(), b - a))
        .filter(|(_, n)| *n > 50)
        .collect();
    assert_eq!(
        read,
        vec![],
        "orders index entries read by 50 sold-out batches of 4"
    );
    let scans = sequential_scans(
        &conn.client,
        &db,
        &[
            "inventory_reservation",
            "orders",
            "consumer_inbox",
            "inventory_ledger",
            "event_outbox",
            "order_items",
        ],
    )
    .await;
    assert_eq!(
        scans,
        vec![],
        "150 order transactions of 4 scanned these tables"
    );
    assert_eq!(count(&db, "SELECT count(*) FROM orders").await, 300);
    assert_invariants(&db).await;
    env.cleanup().await;
}

/// A batch that ends without orders (sold out, redelivered) reads and updates its
/// inbox rows by their full key. Joined on (consumer_group, message_id) to the
/// batch's arrays, the generic plan PostgreSQL froze on the sale's first rows read
/// every row of the consumer group instead, once per batch: quadratic in the inbox,
/// and what made a sold-out backlog crawl (docs/benchmarks-history.md, 2026-12-01, c21a6aa).
#[tokio::test]
async fn batches_without_orders_read_the_inbox_by_key() {
    let env = TestEnv::new().await;
    let mut db = env.db().await;
    builders::activity(&mut db, 65, 1, 10, 1).await;
    let msgs: Vec<_> = (1..=400).map(|user| order(65, 1, user, 0)).collect();
    let mut conn = connection(env.db().await);
    // 10 created and 390 sold out, then every message redelivered.
    run_on(&mut conn, &msgs, &[4], Speculation::Careful).await;
    let again = run_on(&mut conn, &msgs, &[4], Speculation::Careful).await;
    assert!(again.iter().all(|o| o.duplicate), "{again:?}");
    let read = index_entries_read(&conn.client, &db, &["pk_consumer_inbox"]).await;
    // By key: about one entry per message for each of the insert's conflict check
    // and the read or update after it. The whole group per batch: about 60,000.
    assert!(
        read.iter().all(|(_, n)| *n <= 4 * 800),
        "inbox index entries read for 800 messages in batches of 4: {read:?}"
    );
    assert_eq!(count(&db, "SELECT count(*) FROM orders").await, 10);
    assert_invariants(&db).await;
    env.cleanup().await;
}
