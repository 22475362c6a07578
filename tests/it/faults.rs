//! The fault tests of seed §13.4 that need a fault placed exactly, not at random: a
//! process killed with SIGKILL between the stock UPDATE and COMMIT, a deadlock
//! provoked on purpose, the pool exhausted by held connections, and VACUUM running on
//! the hot tables during a sale.

use std::time::{Duration, Instant};

use tokio_postgres::Client;

use crate::common::builders::{self, order};
use crate::common::engine::EngineHandle;
use crate::common::process::{engine, env_of, signal, Serve};
use crate::common::{assert_invariants, count, settle, wait_until, Sale, TestEnv, HANG};

/// (available, allocated, total) of one bucket.
async fn bucket(db: &Client, activity: i64, bucket: i16) -> (i32, i32, i32) {
    let row = db
        .query_one(
            "SELECT available_stock, allocated_stock, total_stock FROM sku_inventory
             WHERE activity_id = $1 AND sku_id = 1 AND bucket_no = $2",
            &[&activity, &bucket],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1), row.get(2))
}

/// Sessions of this database other than the test's own that wait for a lock.
const WAITING_FOR_A_LOCK: &str = "SELECT count(*) FROM pg_stat_activity
     WHERE datname = current_database() AND pid <> pg_backend_pid()
       AND wait_event_type = 'Lock'";

/// A `serve` process armed with `order_tx_before_commit` has run every statement of
/// the order transaction, the stock UPDATE among them, and hangs before COMMIT; the
/// test sees the bucket row locked by that open transaction, then kills the process
/// with SIGKILL. PostgreSQL rolls the transaction back, the broker gives the unacked
/// message to the next engine, and it makes the order once.
#[actix_rt::test]
async fn sigkill_between_the_stock_update_and_commit_loses_nothing_and_takes_nothing() {
    let env = TestEnv::new().await;
    let mut db = env.db().await;
    builders::activity(&mut db, 91, 1, 5, 1).await;
    let mut cmd = engine();
    env_of(&mut cmd, &env).env("FAILPOINTS", "order_tx_before_commit=return");
    let (serve, ready) = Serve::start(&mut cmd, "engine ready").await;
    assert!(ready, "serve did not start");
    let amqp = env.amqp().await;
    let msg = order(91, 1, 7, 0);
    builders::publish(&env, &amqp, std::slice::from_ref(&msg)).await;

    // The UPDATE ran and holds the bucket row: another writer cannot lock it.
    let row_locked = || async {
        let probe = env.db().await;
        probe
            .batch_execute(
                "BEGIN; SET LOCAL lock_timeout = '50ms';
                 SELECT 1 FROM sku_inventory WHERE activity_id = 91 FOR UPDATE; ROLLBACK;",
            )
            .await
            .err()
            .and_then(|e| e.code().cloned())
            == Some(tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE)
    };
    assert!(
        wait_until(HANG, row_locked).await,
        "the engine never reached the point before COMMIT"
    );
    let open = count(
        &db,
        "SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND state = 'idle in transaction'",
    )
    .await;
    assert_eq!(open, 1, "one transaction open, waiting for its COMMIT");
    assert_eq!(bucket(&db, 91, 0).await, (5, 0, 5), "nothing visible yet");

    signal(serve.pid(), "-KILL");
    let (status, text) = serve.wait().await;
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(9), "{text}");
    assert!(
        text.contains("failpoint order_tx_before_commit"),
        "killed at the failpoint: {text}"
    );

    // PostgreSQL rolled it back: no lock, no order, no stock taken.
    assert!(
        wait_until(HANG, || async { !row_locked().await }).await,
        "the killed transaction still holds the row"
    );
    assert_eq!(bucket(&db, 91, 0).await, (5, 0, 5));
    for table in [
        "orders",
        "consumer_inbox",
        "inventory_reservation",
        "inventory_ledger",
    ] {
        let n = count(&db, &format!("SELECT count(*) FROM {table}")).await;
        assert_eq!(n, 0, "{table} after the rollback");
    }

    // The next engine gets the message back and makes its order, once.
    let next = EngineHandle::start(&env.settings).await;
    assert!(
        wait_until(settle(), || async {
            count(&db, "SELECT count(*) FROM consumer_inbox").await == 1
        })
        .await,
        "the message was not processed after the crash"
    );
    next.stop().await;
    assert_eq!(
        count(&db, "SELECT count(*) FROM orders WHERE user_id = 7").await,
        1
    );
    assert_eq!(bucket(&db, 91, 0).await, (4, 1, 5));
    assert_invariants(&db).await;
    env.cleanup().await;
}

/// An operator's stock top-up locks the bucket row, then the reservation an order
/// transaction holds while that transaction waits for the bucket row: a deadlock.
/// PostgreSQL aborts the engine's transaction with 40P01 (the operator's session
/// waits longer before it looks for deadlocks); the engine redoes it in place, and
/// each transaction has its effect once: ten more units, one order.
#[actix_rt::test]
async fn a_provoked_deadlock_is_retried_and_each_transaction_has_its_effect_once() {
    // The engine must wait for the row long enough for the deadlock check (1 s).
    let (env, db) = Sale::new()
        .set("database.lock_timeout_ms", 20_000)
        .activity(92, 5, 1)
        .open()
        .await;
    let msg = order(92, 1, 7, 0);
    // The reservation is already recorded (PENDING_DB): the engine then locks it
    // before it takes stock from the bucket, which is the order the operator's
    // transaction reverses.
    db.execute(
        "INSERT INTO inventory_reservation (
            reservation_id, request_id, first_message_id, activity_id, sku_id, user_id,
            inventory_bucket, quantity, status, redis_reserved_at, expires_at)
         VALUES ($1, $2, $3, 92, 1, 7, 0, 1, 0, $4::timestamptz, $4::timestamptz + interval '10 minutes')",
        &[
            &msg.reservation_id,
            &msg.request_id,
            &msg.message_id,
            &msg.reserved_at,
        ],
    )
    .await
    .unwrap();
    let deadlocks = "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()";
    let deadlocks_before = count(&db, deadlocks).await;

    let mut operator = env.db().await;
    let top_up = operator.transaction().await.unwrap();
    top_up
        .batch_execute(
            "SET LOCAL deadlock_timeout = '20s';
             UPDATE sku_inventory
             SET total_stock = total_stock + 10, available_stock = available_stock + 10
             WHERE activity_id = 92 AND sku_id = 1 AND bucket_no = 0;
             UPDATE seckill_sku SET planned_stock = planned_stock + 10
             WHERE activity_id = 92 AND sku_id = 1;",
        )
        .await
        .unwrap();

    let engine = EngineHandle::start(&env.settings).await;
    let amqp = env.amqp().await;
    builders::publish(&env, &amqp, std::slice::from_ref(&msg)).await;
    assert!(
        wait_until(HANG, || async { count(&db, WAITING_FOR_A_LOCK).await == 1 }).await,
        "the order transaction never waited for the bucket row"
    );
    // Close the cycle: the operator now wants the reservation the engine holds. It
    // gets it once PostgreSQL has aborted the engine's transaction.
    let started = Instant::now();
    top_up
        .query_one(
            "SELECT status FROM inventory_reservation WHERE reservation_id = $1 FOR UPDATE",
            &[&msg.reservation_id],
        )
        .await
        .expect("the engine's transaction, not the operator's, is the deadlock's victim");
    top_up.commit().await.unwrap();
    let waited = started.elapsed();

    assert!(
        wait_until(settle(), || async {
            count(&db, "SELECT count(*) FROM consumer_inbox").await == 1
        })
        .await,
        "the order was not made after the deadlock"
    );
    engine.stop().await;
    assert_eq!(
        count(&db, deadlocks).await,
        deadlocks_before + 1,
        "PostgreSQL found exactly one deadlock"
    );
    // About the timing: PostgreSQL breaks the cycle after its deadlock_timeout.
    assert!(waited < Duration::from_secs(10), "{waited:?}");
    assert_eq!(
        count(&db, "SELECT count(*) FROM orders WHERE user_id = 7").await,
        1,
        "one order"
    );
    assert_eq!(
        bucket(&db, 92, 0).await,
        (14, 1, 15),
        "ten more units, one sold"
    );
    let result: String = db
        .query_one("SELECT result_code FROM consumer_inbox", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(result, "ORDER_CREATED");
    assert_invariants(&db).await;
    env.cleanup().await;
}

/// Every connection of the engine's pool held by someone else: order transactions
/// time out waiting for one (`database.acquire_timeout_ms`), which is the
/// database's state, not the messages' fault. They are retried, none is
/// dead-lettered, and all are made once the connections come back.
#[actix_rt::test]
async fn an_exhausted_pool_delays_orders_and_loses_none() {
    let (env, db) = Sale::new()
        .set("database.pool_size", 2)
        .set("database.acquire_timeout_ms", 100)
        .activity(93, 100, 4)
        .open()
        .await;
    let engine = EngineHandle::start(&env.settings).await;
    let held = {
        let pool = engine.pool.clone();
        let (a, b) = (pool.clone(), pool);
        // Held on this thread for as long as the test says.
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let (holding_tx, holding) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let first = a.get().await.expect("first connection");
            let second = b.get().await.expect("second connection");
            let _ = holding_tx.send(());
            let _ = released.await;
            drop((first, second));
        });
        holding.await.expect("both connections held");
        (release, task)
    };
    let timeouts_before = engine.pool.state().timed_out;
    let amqp = env.amqp().await;
    let msgs: Vec<_> = (1..=40).map(|u| order(93, 1, u, (u % 4) as i16)).collect();
    builders::publish(&env, &amqp, &msgs).await;
    assert!(
        wait_until(HANG, || async {
            engine.pool.state().timed_out >= timeouts_before + 5
        })
        .await,
        "orders never waited for the held pool"
    );
    assert_eq!(count(&db, "SELECT count(*) FROM orders").await, 0);

    let (release, task) = held;
    let _ = release.send(());
    task.await.unwrap();
    assert!(
        wait_until(settle(), || async {
            count(&db, "SELECT count(*) FROM consumer_inbox").await == 40
        })
        .await,
        "not every order was made once the pool came back"
    );
    let channel = amqp.create_channel().await.unwrap();
    assert_eq!(
        env.ready_count(&channel, &env.names.order_dead_queue())
            .await,
        0,
        "nothing dead-lettered"
    );
    engine.stop().await;
    assert_eq!(
        count(&db, "SELECT count(*) FROM orders").await,
        40,
        "each order once"
    );
    assert_invariants(&db).await;
    env.cleanup().await;
}

/// A sale's order latency (publish to commit, from the reservation's Redis time to
/// the order's creation), p50 and p99 in ms.
async fn latency_ms(db: &Client, activity: i64) -> (f64, f64) {
    let row = db
        .query_one(
            "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms),
                    percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)
             FROM (SELECT extract(epoch FROM o.created_at - r.redis_reserved_at) * 1000 AS ms
                   FROM orders AS o
                   JOIN inventory_reservation AS r USING (reservation_id)
                   WHERE o.activity_id = $1) AS l",
            &[&activity],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

/// VACUUM on the hot tables during a sale (what autovacuum does, at the moment the
/// test chooses): it takes no lock the order path waits for, so the sale completes
/// with every order once. Latency with and without is recorded in the test's
/// output.
#[actix_rt::test]
async fn vacuum_on_the_hot_tables_during_a_sale_blocks_no_order() {
    let env = TestEnv::new().await;
    let mut db = env.db().await;
    let orders = 1_000;
    builders::activity(&mut db, 94, 1, orders, 4).await;
    builders::activity(&mut db, 95, 1, orders, 4).await;
    let engine = EngineHandle::start(&env.settings).await;
    let amqp = env.amqp().await;
    let sale = |activity: i64| {
        let (env, amqp, db) = (&env, &amqp, &db);
        async move {
            let msgs: Vec<_> = (1..=i64::from(orders))
                .map(|u| order(activity, 1, u, (u % 4) as i16))
                .collect();
            let started = Instant::now();
            builders::publish(env, amqp, &msgs).await;
            let sql = format!("SELECT count(*) FROM orders WHERE activity_id = {activity}");
            assert!(
                wait_until(settle(), || async {
                    count(db, &sql).await == i64::from(orders)
                })
                .await,
                "activity {activity}: not every order was made"
            );
            started.elapsed()
        }
    };
    let quiet = sale(94).await;

    // Vacuum the hot tables back to back while the second sale runs.
    let vacuums = "SELECT coalesce(sum(vacuum_count), 0)::int8 FROM pg_stat_user_tables
                   WHERE relname IN ('sku_inventory', 'event_outbox', 'consumer_inbox')";
    let before = count(&db, vacuums).await;
    let vacuumer = env.db().await;
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let vacuuming = tokio::spawn(async move {
        let mut runs = 0u32;
        while stopped.try_recv().is_err() {
            // One statement each: VACUUM cannot run inside a transaction block.
            for sql in [
                "VACUUM (ANALYZE) sku_inventory",
                "VACUUM event_outbox",
                "VACUUM consumer_inbox",
            ] {
                vacuumer.batch_execute(sql).await.expect("vacuum");
            }
            runs += 1;
        }
        runs
    });
    let busy = sale(95).await;
    let _ = stop.send(());
    let runs = vacuuming.await.unwrap();
    engine.stop().await;
    let after = count(&db, vacuums).await;
    assert!(
        runs >= 2 && after - before >= 6,
        "VACUUM ran during the sale: {runs} rounds, vacuum_count +{}",
        after - before
    );
    let (quiet_p50, quiet_p99) = latency_ms(&db, 94).await;
    let (busy_p50, busy_p99) = latency_ms(&db, 95).await;
    println!(
        "{orders} orders: without VACUUM {quiet:?} (latency p50 {quiet_p50:.0} ms, p99 {quiet_p99:.0} ms); \
         with VACUUM running ({runs} rounds) {busy:?} (p50 {busy_p50:.0} ms, p99 {busy_p99:.0} ms)"
    );
    // A lock the order path waited for would show as lock timeouts (150 ms), retries
    // and a sale several times slower; allow for a noisy host, not for that.
    assert!(
        busy < quiet * 4 + Duration::from_secs(2),
        "with VACUUM {busy:?}, without {quiet:?}"
    );
    assert_invariants(&db).await;
    env.cleanup().await;
}
