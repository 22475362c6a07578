//! The order pipeline end to end: messages published through RabbitMQ, the engine
//! running in-process, effects checked in PostgreSQL (seed §13.2, §13.3).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use lapin::options::{BasicAckOptions, BasicGetOptions};
use seckill_engine::domain::message::OrderCreateMessage;
use seckill_engine::mq::{DEAD_KIND_HEADER, DEAD_REASON_HEADER};
use tokio_postgres::Client;

use crate::common::builders::{self, order, resend};
use crate::common::engine::EngineHandle;
use crate::common::{
    assert_invariants, check_during, consumers, count, settle, wait_until, Sale, TestEnv,
};

/// Result codes recorded in the inbox, with their counts.
async fn results(db: &Client) -> HashMap<String, i64> {
    db.query(
        "SELECT result_code, count(*) FROM consumer_inbox GROUP BY result_code",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

async fn wait_inbox(db: &Client, expected: i64) {
    let settled = wait_until(settle(), || async {
        count(db, "SELECT count(*) FROM consumer_inbox").await >= expected
    })
    .await;
    assert!(
        settled,
        "only {} of {expected} messages settled; results so far {:?}",
        count(db, "SELECT count(*) FROM consumer_inbox").await,
        results(db).await
    );
}

/// After the engine has stopped (unacked deliveries return to their queues), every
/// order queue must be empty: every message was acked.
async fn assert_all_acked(env: &TestEnv) {
    let conn = env.amqp().await;
    let channel = conn.create_channel().await.unwrap();
    for queue in env.names.order_queues(env.settings.amqp.shards) {
        let ready = env.ready_count(&channel, &queue).await;
        assert_eq!(ready, 0, "{queue} still holds {ready} messages");
    }
    seckill_engine::mq::close(&conn, &[&channel]).await;
}

/// Starts the engine, publishes `msgs` and stops it once each has its inbox row.
async fn run_to_settlement(env: &TestEnv, db: &Client, msgs: &[OrderCreateMessage]) {
    let engine = EngineHandle::start(&env.settings).await;
    let amqp = env.amqp().await;
    builders::publish(env, &amqp, msgs).await;
    wait_inbox(db, msgs.len() as i64).await;
    engine.stop().await;
}

/// The closing checks of a test that ran the engine: the §13.3 invariants hold and
/// every message was acked; then the test's database and queues go.
async fn finish(env: TestEnv, db: &Client) {
    assert_invariants(db).await;
    assert_all_acked(&env).await;
    env.cleanup().await;
}

fn code(results: &HashMap<String, i64>, code: &str) -> i64 {
    results.get(code).copied().unwrap_or(0)
}

#[actix_rt::test]
async fn ten_thousand_messages_for_one_user_make_one_order() {
    let env = TestEnv::new().await;
    let mut db = env.db().await;
    builders::activity(&mut db, 1, 1, 100, 1).await;
    let msgs: Vec<OrderCreateMessage> = (0..10_000).map(|_| order(1, 1, 42, 0)).collect();

    run_to_settlement(&env, &db, &msgs).await;

    let r = results(&db).await;
    assert_eq!(code(&r, "ORDER_CREATED"), 1, "{r:?}");
    assert_eq!(code(&r, "USER_ALREADY_ORDERED"), 9_999, "{r:?}");
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM orders WHERE activity_id = 1 AND sku_id = 1 AND user_id = 42"
        )
        .await,
        1
    );
    // Every rejected reservation asks for its Redis unit back, exactly once.
    assert_eq!(
        count(&db, "SELECT count(*) FROM inventory_reservation WHERE status = 20 AND failure_code = 'USER_ALREADY_ORDERED'").await,
        9_999
    );
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM compensation_task WHERE task_type = 10"
        )
        .await,
        9_999
    );
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM event_outbox WHERE tag = 'ORDER_CREATED'"
        )
        .await,
        1
    );
    finish(env, &db).await;
}

#[actix_rt::test]
async fn stock_of_one_goes_to_exactly_one_of_a_thousand_buyers() {
    one_unit_among_a_thousand_buyers(TestEnv::new().await).await;
}

/// The pipeline test, on any world: the TLS profile and the least-privilege roles
/// run it too (`tls.rs`, `roles.rs`).
pub(crate) async fn one_unit_among_a_thousand_buyers(env: TestEnv) {
    let mut db = env.db().await;
    builders::activity(&mut db, 2, 1, 1, 1).await;
    let msgs: Vec<_> = (1..=1_000).map(|user| order(2, 1, user, 0)).collect();

    run_to_settlement(&env, &db, &msgs).await;

    let r = results(&db).await;
    assert_eq!(code(&r, "ORDER_CREATED"), 1, "{r:?}");
    assert_eq!(code(&r, "POSTGRES_SOLD_OUT"), 999, "{r:?}");
    let row = db
        .query_one("SELECT sum(allocated_stock)::bigint, min(available_stock) FROM sku_inventory WHERE activity_id = 2", &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, i64>(0), 1);
    assert_eq!(row.get::<_, i32>(1), 0);
    // The sold-out path removed its provisional orders: one order row in all.
    assert_eq!(count(&db, "SELECT count(*) FROM orders").await, 1);
    // The order's event and the 999 give-backs' events match their schemas.
    let seen = crate::common::contracts::assert_events_match_contracts(&db).await;
    for name in ["order.created", "inventory.release_requested"] {
        assert!(seen.contains(name), "no {name} event: {seen:?}");
    }
    finish(env, &db).await;
}

#[actix_rt::test]
async fn one_message_delivered_a_thousand_times_has_one_effect() {
    let env = TestEnv::new().await;
    let mut db = env.db().await;
    builders::activity(&mut db, 3, 1, 10, 1).await;
    let msg = order(3, 1, 7, 0);
    let copies = vec![msg.clone(); 1_000];

    let engine = EngineHandle::start(&env.settings).await;
    let amqp = env.amqp().await;
    builders::publish(&env, &amqp, &copies).await;
    // Settled means: the one inbox row exists and every copy was acked. An empty
    // queue with nothing in flight is not enough: copies delivered to the engine but
    // not yet taken by its intake are neither ready nor in flight.
    let channel = amqp.create_channel().await.unwrap();
    let drained = wait_until(settle(), || async {
        let queue = env.names.order_queue(0);
        count(&db, "SELECT count(*) FROM consumer_inbox").await == 1
            && engine.stats.acks().messages() >= copies.len() as u64
            && env.ready_count(&channel, &queue).await == 0
            && engine.stats.in_flight() == 0
    })
    .await;
    assert!(
        drained,
        "copies acked: {}, in flight: {}",
        engine.stats.acks().messages(),
        engine.stats.in_flight()
    );
    engine.stop().await;

    assert_eq!(
        count(
            &db,
            &format!(
                "SELECT count(*) FROM consumer_inbox WHERE message_id = '{}'",
                msg.message_id
            )
        )
        .await,
        1
    );
    assert_eq!(count(&db, "SELECT count(*) FROM orders").await, 1);
    assert_eq!(
        count(
            &db,
            "SELECT sum(allocated_stock)::bigint FROM sku_inventory WHERE activity_id = 3"
        )
        .await,
        1
    );
    finish(env, &db).await;
}

#[actix_rt::test]
async fn one_reservation_under_fifty_message_ids_makes_one_order() {
    let env = TestEnv::new().await;
    let mut db = env.db().await;
    builders::activity(&mut db, 4, 1, 10, 1).await;
    let first = order(4, 1, 9, 0);
    let mut msgs = vec![first.clone()];
    msgs.extend((1..50).map(|_| resend(&first)));

    run_to_settlement(&env, &db, &msgs).await;

    let r = results(&db).await;
    assert_eq!(code(&r, "ORDER_CREATED"), 1, "{r:?}");
    assert_eq!(code(&r, "ORDER_ALREADY_CREATED"), 49, "{r:?}");
    let order_ids: HashSet<i64> = db
        .query("SELECT DISTINCT order_id FROM consumer_inbox", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        order_ids,
        HashSet::from([first.order_id]),
        "every message answers with the one order"
    );
    assert_eq!(count(&db, "SELECT count(*) FROM orders").await, 1);
    finish(env, &db).await;
}

#[actix_rt::test]
async fn sixty_four_buckets_sell_exactly_what_each_bucket_holds() {
    let (env, db) = Sale::new()
        .set("amqp.shards", 4)
        .activity(5, 100, 64)
        .open()
        .await;
    let msgs: Vec<_> = (0..5_000)
        .map(|user| order(5, 1, user + 1, (user % 64) as i16))
        .collect();

    run_to_settlement(&env, &db, &msgs).await;

    // What each bucket can serve: min(its stock, the buyers routed to it).
    let stock = seckill_engine::store::activity::split_stock(100, 64);
    let mut demand = [0i64; 64];
    for m in &msgs {
        demand[m.inventory_bucket as usize] += 1;
    }
    let servable: i64 = stock
        .iter()
        .zip(demand)
        .map(|(s, d)| i64::from(*s).min(d))
        .sum();
    let r = results(&db).await;
    assert_eq!(code(&r, "ORDER_CREATED"), servable, "{r:?}");
    assert!(servable <= 100);
    assert_eq!(code(&r, "POSTGRES_SOLD_OUT"), 5_000 - servable, "{r:?}");
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM sku_inventory WHERE available_stock <> 0"
        )
        .await,
        0
    );
    finish(env, &db).await;
}

/// With one order transaction at a time over all buckets (`engine.order_transactions`
/// = 1) and each bucket still pipelining three, every order settles with the outcome
/// it would have had anyway: the slot is given back by every transaction, and eight
/// buckets' chains of turns share it without waiting on each other.
#[actix_rt::test]
async fn one_order_transaction_at_a_time_over_many_buckets_settles_every_order() {
    let (env, db) = Sale::new()
        .set("engine.order_transactions", 1)
        .set("engine.bucket_pipeline", 3)
        .activity(7, 400, 8)
        .open()
        .await;
    let msgs: Vec<_> = (0..1_200)
        .map(|user| order(7, 1, user + 1, (user % 8) as i16))
        .collect();

    run_to_settlement(&env, &db, &msgs).await;

    let r = results(&db).await;
    assert_eq!(code(&r, "ORDER_CREATED"), 400, "{r:?}");
    assert_eq!(code(&r, "POSTGRES_SOLD_OUT"), 800, "{r:?}");
    finish(env, &db).await;
}

/// Reads every message in the dead-letter queue: (kind header, reason header, body).
pub(crate) async fn drain_dead_letters(
    env: &TestEnv,
    channel: &lapin::Channel,
) -> Vec<(String, String, Vec<u8>)> {
    let mut out = Vec::new();
    let queue = env.names.order_dead_queue();
    while let Some(msg) = channel
        .basic_get(queue.as_str().into(), BasicGetOptions::default())
        .await
        .unwrap()
    {
        let header = |name: &str| {
            msg.delivery
                .properties
                .headers()
                .as_ref()
                .and_then(|h| h.inner().get(name).cloned())
                .map(|v| match v {
                    lapin::types::AMQPValue::LongString(s) => {
                        String::from_utf8_lossy(s.as_bytes()).into_owned()
                    }
                    other => format!("{other:?}"),
                })
                .unwrap_or_default()
        };
        out.push((
            header(DEAD_KIND_HEADER),
            header(DEAD_REASON_HEADER),
            msg.delivery.data.clone(),
        ));
        msg.delivery
            .acker
            .ack(BasicAckOptions::default())
            .await
            .unwrap();
    }
    out
}

/// The engine trusts no price from the queue: a message whose price or currency
/// differs from the SKU's, or whose order expiry is later than its reservation time
/// plus the activity's order TTL, is dead-lettered with the reason and makes no
/// order; the valid messages of the same batch are not held back.
#[actix_rt::test]
async fn a_message_that_contradicts_the_sku_is_dead_lettered_and_makes_nothing() {
    let env = TestEnv::new().await;
    let mut db = env.db().await;
    builders::activity(&mut db, 64, 1, 100, 1).await;
    let valid: Vec<_> = (1..=10).map(|u| order(64, 1, u, 0)).collect();
    let cheap = OrderCreateMessage {
        unit_price: 1,
        ..order(64, 1, 11, 0)
    };
    let dollars = OrderCreateMessage {
        currency: "USD".into(),
        ..order(64, 1, 12, 0)
    };
    let mut forever = order(64, 1, 13, 0);
    forever.order_expire_at = forever.reserved_at + chrono::TimeDelta::hours(2);
    let mut msgs = valid.clone();
    msgs.insert(3, cheap);
    msgs.insert(7, dollars);
    msgs.push(forever);
    let engine = EngineHandle::start(&env.settings).await;
    let amqp = env.amqp().await;
    builders::publish(&env, &amqp, &msgs).await;
    let channel = amqp.create_channel().await.unwrap();
    assert!(
        env.wait_ready_count(&channel, &env.names.order_dead_queue(), 3)
            .await,
        "three dead letters"
    );
    wait_inbox(&db, 10).await;
    engine.stop().await;
    let dead = drain_dead_letters(&env, &channel).await;
    let reasons: Vec<&str> = dead.iter().map(|(_, reason, _)| reason.as_str()).collect();
    assert_eq!(
        reasons
            .iter()
            .filter(|r| r.contains("the SKU costs 1999 CNY"))
            .count(),
        2,
        "{reasons:?}"
    );
    assert_eq!(
        reasons.iter().filter(|r| r.contains("order TTL")).count(),
        1,
        "{reasons:?}"
    );
    assert_eq!(count(&db, "SELECT count(*) FROM orders").await, 10);
    assert_eq!(
        count(&db, "SELECT count(*) FROM orders WHERE user_id > 10").await,
        0
    );
    seckill_engine::mq::close(&amqp, &[&channel]).await;
    finish(env, &db).await;
}

#[actix_rt::test]
async fn poison_messages_are_dead_lettered_with_their_reason_and_valid_ones_still_work() {
    let env = TestEnv::new().await;
    let mut db = env.db().await;
    builders::activity(&mut db, 6, 1, 1_000, 1).await;
    let valid: Vec<_> = (1..=300).map(|user| order(6, 1, user, 0)).collect();

    let base = serde_json::to_value(order(6, 1, 9_999, 0)).unwrap();
    let mutate = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut v = base.clone();
        f(&mut v);
        serde_json::to_vec(&v).unwrap()
    };
    let poison: Vec<(&str, Vec<u8>)> = vec![
        ("malformed_json", b"{\"message_id\": ".to_vec()),
        (
            "unknown_field",
            mutate(&|v| v["coupon"] = serde_json::json!("FREE")),
        ),
        (
            "missing_field",
            mutate(&|v| {
                v.as_object_mut().unwrap().remove("user_id");
            }),
        ),
        (
            "invalid_value",
            mutate(&|v| v["unit_price"] = serde_json::json!(-5)),
        ),
        ("too_large", {
            let mut body = mutate(&|_| {});
            body.truncate(body.len() - 1);
            body.extend(format!(", \"pad\": \"{}\"}}", "x".repeat(17 * 1024)).bytes());
            body
        }),
        (
            "invalid_value",
            mutate(&|v| v["reservation_id"] = serde_json::json!("not-a-uuid")),
        ),
        // A major version from a newer producer, with a field version 1 lacks.
        (
            "unsupported_version",
            mutate(&|v| {
                v["schema_version"] = serde_json::json!(2);
                v["gift_wrap"] = serde_json::json!(true);
            }),
        ),
        // Well-formed, but names an inventory bucket that does not exist.
        (
            "processing_failed",
            mutate(&|v| v["inventory_bucket"] = serde_json::json!(7)),
        ),
    ];

    let engine = EngineHandle::start(&env.settings).await;
    let amqp = env.amqp().await;
    // Poison interleaved with valid traffic.
    let (first, second) = valid.split_at(150);
    builders::publish(&env, &amqp, first).await;
    let bodies: Vec<Vec<u8>> = poison.iter().map(|(_, b)| b.clone()).collect();
    builders::publish_raw(&env, &amqp, 0, &bodies).await;
    builders::publish(&env, &amqp, second).await;

    wait_inbox(&db, 300).await;
    let channel = amqp.create_channel().await.unwrap();
    let dead_queue = env.names.order_dead_queue();
    let all_dead = wait_until(settle(), || async {
        env.ready_count(&channel, &dead_queue).await as usize >= poison.len()
    })
    .await;
    assert!(
        all_dead,
        "dead letters: {}",
        env.ready_count(&channel, &dead_queue).await
    );
    engine.stop().await;

    let dead = drain_dead_letters(&env, &channel).await;
    assert_eq!(
        dead.len(),
        poison.len(),
        "exactly the poison is dead-lettered"
    );
    let mut expected: Vec<&str> = poison.iter().map(|(k, _)| *k).collect();
    let mut kinds: Vec<&str> = dead.iter().map(|(k, _, _)| k.as_str()).collect();
    expected.sort();
    kinds.sort();
    assert_eq!(kinds, expected);
    for (kind, reason, body) in &dead {
        assert!(!reason.is_empty(), "{kind} has no reason");
        assert!(
            poison.iter().any(|(_, b)| b == body),
            "dead letter body changed"
        );
    }
    assert!(
        dead.iter()
            .any(|(_, r, _)| r.contains("unknown inventory bucket")),
        "{dead:?}"
    );
    let r = results(&db).await;
    assert_eq!(code(&r, "ORDER_CREATED"), 300, "{r:?}");
    finish(env, &db).await;
}

#[actix_rt::test]
async fn a_crash_mid_flight_loses_nothing_and_duplicates_nothing() {
    let env = TestEnv::new().await;
    let mut db = env.db().await;
    builders::activity(&mut db, 7, 1, 3_000, 4).await;
    let msgs: Vec<_> = (0..5_000)
        .map(|user| order(7, 1, user + 1, (user % 4) as i16))
        .collect();

    let amqp = env.amqp().await;
    let engine = EngineHandle::start(&env.settings).await;
    builders::publish(&env, &amqp, &msgs).await;
    let started = wait_until(settle(), || async {
        count(&db, "SELECT count(*) FROM consumer_inbox").await >= 800
    })
    .await;
    assert!(started);
    engine.kill().await;
    let at_crash = count(&db, "SELECT count(*) FROM consumer_inbox").await;
    assert!(at_crash < 5_000, "the crash came too late to test anything");

    let engine = EngineHandle::start(&env.settings).await;
    wait_inbox(&db, 5_000).await;
    engine.stop().await;

    // Every published message has exactly one recorded result...
    let distinct = count(&db, "SELECT count(DISTINCT message_id) FROM consumer_inbox").await;
    assert_eq!(distinct, 5_000);
    // ...and every reservation exactly one effect: an order or a recorded rejection.
    let r = results(&db).await;
    assert_eq!(code(&r, "ORDER_CREATED"), 3_000, "{r:?}");
    assert_eq!(code(&r, "POSTGRES_SOLD_OUT"), 2_000, "{r:?}");
    assert_eq!(
        count(&db, "SELECT count(*) FROM orders").await
            + count(
                &db,
                "SELECT count(*) FROM inventory_reservation WHERE status = 20"
            )
            .await,
        5_000
    );
    finish(env, &db).await;
}

#[actix_rt::test]
async fn a_slow_database_stops_the_intake_not_the_broker() {
    let (env, db) = Sale::new()
        .set("engine.db_permits", 2)
        .set("database.lock_timeout_ms", 60_000)
        .set("database.statement_timeout_ms", 60_000)
        .activity(8, 5_000, 1)
        .open()
        .await;
    assert_eq!(env.settings.prefetch(), 2);

    // Hold the inventory row: every order transaction now waits on it.
    let holder = env.db().await;
    holder
        .batch_execute("BEGIN; SELECT * FROM sku_inventory WHERE activity_id = 8 FOR UPDATE")
        .await
        .unwrap();

    let msgs: Vec<_> = (1..=2_000).map(|user| order(8, 1, user, 0)).collect();
    let amqp = env.amqp().await;
    let engine = EngineHandle::start(&env.settings).await;
    let stats = engine.stats.clone();
    builders::publish(&env, &amqp, &msgs).await;
    let channel = amqp.create_channel().await.unwrap();
    let queue = env.names.order_queue(0);

    // The engine takes what the permits allow and no more; the backlog waits in the
    // broker, not in the engine's memory.
    assert!(wait_until(settle(), || async { engine.stats.in_flight() == 2 }).await);
    check_during(
        Duration::from_secs(1),
        Duration::from_millis(50),
        || async {
            assert!(engine.stats.in_flight() <= 2);
            assert_eq!(env.ready_count(&channel, &queue).await, 1_998);
        },
    )
    .await;
    assert_eq!(count(&db, "SELECT count(*) FROM orders").await, 0);

    holder.batch_execute("COMMIT").await.unwrap();
    wait_inbox(&db, 2_000).await;
    engine.stop().await;
    assert!(
        stats.peak() <= 2,
        "peak in flight {} exceeded prefetch",
        stats.peak()
    );
    assert_eq!(
        results(&db).await.get("ORDER_CREATED").copied(),
        Some(2_000)
    );
    finish(env, &db).await;
}

/// Orders that arrive while a bucket's transaction runs wait for it to reach the
/// inventory row and then go together: a transaction started for each of the first
/// arrivals would only queue behind the running one, one order each, at a
/// transaction's full price (docs/benchmarks-history.md, 2026-12-01, e25e0b5; reverted there, back since c21a6aa).
#[actix_rt::test]
async fn orders_arriving_during_a_transaction_go_together() {
    let (env, db) = Sale::new()
        .set("database.lock_timeout_ms", 60_000)
        .set("database.statement_timeout_ms", 60_000)
        .activity(9, 100, 1)
        .open()
        .await;
    let holder = env.db().await;
    holder
        .batch_execute("BEGIN; SELECT * FROM sku_inventory WHERE activity_id = 9 FOR UPDATE")
        .await
        .unwrap();

    let msgs: Vec<_> = (1..=41).map(|user| order(9, 1, user, 0)).collect();
    let amqp = env.amqp().await;
    let engine = EngineHandle::start(&env.settings).await;
    // The first order's transaction waits on the held row ...
    builders::publish(&env, &amqp, &msgs[..1]).await;
    let waiting = "SELECT count(*) FROM pg_stat_activity
                   WHERE wait_event_type = 'Lock' AND query LIKE '%UPDATE sku_inventory%'";
    assert!(wait_until(settle(), || async { count(&db, waiting).await == 1 }).await);
    // ... while the other forty reach the bucket, with two pipeline slots free.
    builders::publish(&env, &amqp, &msgs[1..]).await;
    assert!(wait_until(settle(), || async { engine.stats.in_flight() == 41 }).await);
    // The intake counts a delivery before its last in-process hops (permit,
    // reservation and bucket actors), which nothing outside the engine can see (the
    // mailbox gauges are process-wide, shared with the tests running beside this
    // one): a fixed margin, then. The hops take microseconds; the margin covers a
    // machine loaded by several suites, where 500 ms could pass before they ran.
    tokio::time::sleep(Duration::from_secs(2)).await;

    holder.batch_execute("COMMIT").await.unwrap();
    wait_inbox(&db, 41).await;
    engine.stop().await;
    assert_eq!(results(&db).await.get("ORDER_CREATED").copied(), Some(41));
    // Rows written in one transaction share its xmin.
    let transactions = count(&db, "SELECT count(DISTINCT xmin::text) FROM consumer_inbox").await;
    assert_eq!(
        transactions, 2,
        "the forty went in more than one transaction"
    );
    finish(env, &db).await;
}

#[actix_rt::test]
async fn an_intake_whose_consumer_the_broker_cancelled_comes_back() {
    let (env, db) = Sale::new()
        .set("supervisor.restart_base_ms", 50)
        .activity(9, 100, 1)
        .open()
        .await;
    let engine = EngineHandle::start(&env.settings).await;
    let amqp = env.amqp().await;
    let queue = env.names.order_queue(0);
    // Deleting the queue cancels the engine's consumer (basic.cancel from the broker).
    let channel = amqp.create_channel().await.unwrap();
    channel
        .queue_delete(
            queue.as_str().into(),
            lapin::options::QueueDeleteOptions::default(),
        )
        .await
        .unwrap();
    // The supervisor restarts the intake, which declares its queue again.
    let back = wait_until(settle(), || async {
        let Ok(probe) = amqp.create_channel().await else {
            return false;
        };
        let declared = probe
            .queue_declare(
                queue.as_str().into(),
                lapin::options::QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                lapin::types::FieldTable::default(),
            )
            .await;
        declared.is_ok_and(|q| q.consumer_count() == 1)
    })
    .await;
    assert!(back, "the queue and its consumer did not come back");
    let msgs: Vec<_> = (1..=50).map(|user| order(9, 1, user, 0)).collect();
    builders::publish(&env, &amqp, &msgs).await;
    wait_inbox(&db, 50).await;
    engine.stop().await;
    assert_eq!(count(&db, "SELECT count(*) FROM orders").await, 50);
    env.cleanup().await;
}

/// Consumers on a queue right now (passive declare on a fresh channel).
#[actix_rt::test]
async fn intake_stops_consuming_while_postgres_is_unreachable_and_resumes_after() {
    use secrecy::ExposeSecret;
    let env = TestEnv::new().await;
    let mut db = env.db().await;
    builders::activity(&mut db, 10, 1, 100, 1).await;
    // The engine reaches PostgreSQL only through a switch the test controls.
    let url = env.settings.database.url.expose_secret().to_owned();
    let switch = crate::common::Switch::start(crate::common::target_of(&url, 5432)).await;
    let (scheme, rest) = url.split_once("://").unwrap();
    let (authority, path) = rest.split_once('/').unwrap();
    let user = authority
        .rsplit_once('@')
        .map(|(u, _)| format!("{u}@"))
        .unwrap_or_default();
    let mut settings = env.settings.clone();
    settings.database.url = format!("{scheme}://{user}{}/{path}", switch.addr).into();

    let engine = EngineHandle::start(&settings).await;
    let admin = engine.admin(&settings).await;
    let admin_handle = admin.server.handle();
    actix_rt::spawn(admin.server);
    let readyz = format!("http://{}/readyz", admin.addr);
    let client = awc::Client::default();
    let ready_status = || {
        let req = client.get(readyz.as_str());
        async move { req.send().await.map(|r| r.status().as_u16()).unwrap_or(0) }
    };
    let amqp = env.amqp().await;
    let queue = env.names.order_queue(0);
    assert_eq!(consumers(&amqp, &queue).await, Some(1));
    assert_eq!(ready_status().await, 200);

    switch.set(false);
    let paused = wait_until(settle(), || async {
        consumers(&amqp, &queue).await == Some(0)
    })
    .await;
    assert!(
        paused,
        "the intake kept consuming while PostgreSQL was unreachable"
    );
    assert_eq!(ready_status().await, 503);
    let msgs: Vec<_> = (1..=20).map(|user| order(10, 1, user, 0)).collect();
    builders::publish(&env, &amqp, &msgs).await;
    let channel = amqp.create_channel().await.unwrap();
    check_during(
        Duration::from_secs(1),
        Duration::from_millis(100),
        || async {
            assert_eq!(
                env.ready_count(&channel, &queue).await,
                20,
                "the backlog waits in the broker"
            );
        },
    )
    .await;

    switch.set(true);
    let resumed = wait_until(settle(), || async {
        consumers(&amqp, &queue).await == Some(1)
    })
    .await;
    assert!(resumed, "the intake did not resume");
    assert!(wait_until(settle(), || async { ready_status().await == 200 }).await);
    wait_inbox(&db, 20).await;
    admin_handle.stop(true).await;
    engine.stop().await;
    assert_eq!(count(&db, "SELECT count(*) FROM orders").await, 20);
    assert_invariants(&db).await;
    env.cleanup().await;
}

#[actix_rt::test]
async fn group_commit_in_the_engine_keeps_every_promise_and_isolates_a_bad_message() {
    let (env, db) = Sale::new()
        .set("engine.batch_max_size", 32)
        .set("engine.db_permits", 64)
        .set("amqp.prefetch", 64)
        .activity(62, 50, 1)
        .open()
        .await;
    let mut msgs: Vec<_> = (1..=2_000).map(|user| order(62, 1, user, 0)).collect();
    // Another reservation claiming an order id already taken: the data rejects it,
    // and it must not take the rest of its batch down with it.
    let mut clash = order(62, 1, 5_000, 0);
    clash.order_id = msgs[10].order_id;
    clash.order_no = msgs[10].order_no.clone();
    msgs.insert(11, clash);
    let copies: Vec<_> = msgs[..200].to_vec();
    msgs.extend(copies);

    let engine = EngineHandle::start(&env.settings).await;
    let amqp = env.amqp().await;
    builders::publish(&env, &amqp, &msgs).await;
    wait_inbox(&db, 2_000).await;
    let channel = amqp.create_channel().await.unwrap();
    let dead_queue = env.names.order_dead_queue();
    assert!(
        env.wait_ready_count(&channel, &dead_queue, 2).await,
        "the losing one of the clashing pair is dead-lettered, with its redelivered copy"
    );
    let queue = env.names.order_queue(0);
    // Acked too: a copy delivered to the engine but not yet taken by its intake is
    // neither ready nor in flight.
    assert!(
        wait_until(settle(), || async {
            engine.stats.acks().messages() >= msgs.len() as u64
                && env.ready_count(&channel, &queue).await == 0
                && engine.stats.in_flight() == 0
        })
        .await,
        "every copy settles: {} acked",
        engine.stats.acks().messages()
    );
    let stats = engine.stats.clone();
    engine.stop().await;
    // Deliveries settled together leave as one `multiple` ack.
    let (acked, frames) = (stats.acks().messages(), stats.acks().frames());
    assert!(acked >= msgs.len() as u64, "{acked} acked");
    assert!(
        frames * 4 <= acked,
        "{frames} ack frames for {acked} deliveries: acks were not merged"
    );
    let dead = drain_dead_letters(&env, &channel).await;
    assert!(
        dead.iter()
            .all(|(kind, reason, _)| kind == "processing_failed" && reason.contains("already used")),
        "{dead:?}"
    );

    let r = results(&db).await;
    assert_eq!(code(&r, "ORDER_CREATED"), 50, "{r:?}");
    assert_eq!(code(&r, "POSTGRES_SOLD_OUT"), 1_950, "{r:?}");
    assert_eq!(count(&db, "SELECT count(*) FROM orders").await, 50);
    // Many messages shared a transaction: rows written together share their xmin.
    let transactions = count(&db, "SELECT count(DISTINCT xmin::text) FROM consumer_inbox").await;
    assert!(
        transactions < 1_000,
        "{transactions} transactions for 2,000 messages: no group commit happened"
    );
    finish(env, &db).await;
}

/// `engine.batch_max_size = 1` is the seed's per-message path, the side the
/// differential test compares batches against: the engine must never send such a
/// transaction speculatively. Only the speculative transaction calls
/// `abort_unless`, so PostgreSQL's function statistics tell; with batches of 32 the
/// same run must call it, or the check could not fail.
#[actix_rt::test]
async fn one_message_per_transaction_never_speculates() {
    for (batch_max_size, speculates) in [(1usize, false), (32, true)] {
        let env = Sale::new()
            .set("engine.batch_max_size", batch_max_size)
            .env()
            .await;
        let mut db = env.db().await;
        // For the engine's sessions, opened after this.
        db.batch_execute(
            "DO $$ BEGIN
                 EXECUTE format('ALTER DATABASE %I SET track_functions = ''pl''', current_database());
             END $$",
        )
        .await
        .expect("track function calls");
        builders::activity(&mut db, 66, 1, 100, 1).await;
        let msgs: Vec<_> = (1..=60).map(|user| order(66, 1, user, 0)).collect();
        // Stopping the engine ends its sessions, and a backend reports its
        // statistics when it exits at the latest.
        run_to_settlement(&env, &db, &msgs).await;
        let inserted = || async {
            count(
                &db,
                "SELECT coalesce(sum(n_tup_ins), 0)::int8 FROM pg_stat_user_tables WHERE relname = 'orders'",
            )
            .await
        };
        assert!(
            wait_until(settle(), || async { inserted().await == 60 }).await,
            "the engine's statistics never arrived"
        );
        let calls = count(
            &db,
            "SELECT coalesce(sum(calls), 0)::int8 FROM pg_stat_user_functions WHERE funcname = 'abort_unless'",
        )
        .await;
        assert_eq!(
            calls > 0,
            speculates,
            "batch_max_size {batch_max_size}: abort_unless called {calls} times"
        );
        assert_eq!(count(&db, "SELECT count(*) FROM orders").await, 60);
        assert_invariants(&db).await;
        env.cleanup().await;
    }
}

/// A unique violation on a ledger id the engine minted is the engine's fault, not the
/// message's: the message is tried again with fresh ids, never dead-lettered. A
/// trigger plays the other instance that took the id, twice.
#[actix_rt::test]
async fn a_collision_on_a_minted_id_is_retried_not_dead_lettered() {
    let env = TestEnv::new().await;
    let mut db = env.db().await;
    builders::activity(&mut db, 81, 1, 5, 1).await;
    db.batch_execute(
        // A sequence, because the failing transaction rolls back anything else.
        "CREATE SEQUENCE ledger_inserts;
         CREATE FUNCTION collide() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF nextval('ledger_inserts') <= 2 THEN
                 RAISE EXCEPTION 'duplicate key value violates unique constraint'
                     USING ERRCODE = 'unique_violation',
                           CONSTRAINT = 'inventory_ledger_pkey';
             END IF;
             RETURN NEW;
         END $$;
         CREATE TRIGGER collide BEFORE INSERT ON inventory_ledger
             FOR EACH ROW EXECUTE FUNCTION collide();",
    )
    .await
    .unwrap();
    let msgs = vec![order(81, 1, 1, 0)];
    run_to_settlement(&env, &db, &msgs).await;
    let r = results(&db).await;
    assert_eq!(code(&r, "ORDER_CREATED"), 1, "{r:?}");
    assert_eq!(
        count(&db, "SELECT last_value FROM ledger_inserts").await,
        3,
        "two collisions, then the order's ledger row"
    );
    // Nothing in the dead-letter queue.
    let amqp = env.amqp().await;
    let channel = amqp.create_channel().await.unwrap();
    assert_eq!(
        env.ready_count(&channel, &env.names.order_dead_queue())
            .await,
        0
    );
    seckill_engine::mq::close(&amqp, &[&channel]).await;
    db.batch_execute("DROP TRIGGER collide ON inventory_ledger")
        .await
        .unwrap();
    finish(env, &db).await;
}
