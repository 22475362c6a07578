//! The supervised background services: outbox publisher, sweeper, compensation worker,
//! payment callbacks racing timeout cancels (seed §9.8–§9.10, §7.6).

use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{TimeDelta, Utc};
use futures_util::future::LocalBoxFuture;
use lapin::options::{
    BasicAckOptions, BasicGetOptions, ExchangeDeclareOptions, ExchangeDeleteOptions,
    QueueBindOptions,
};
use lapin::types::FieldTable;
use lapin::ExchangeKind;
use seckill_engine::redis::keys::SkuKeys;
use seckill_engine::services::children::child;
use seckill_engine::services::outbox_publisher::{OrderLoad, OutboxConfig, OutboxPublisher};
use seckill_engine::services::runner::{Outcome, Service, ServiceError};
use seckill_engine::services::supervisor::{Restarts, Supervisor};
use tokio_postgres::Client;

use crate::common::builders::{self, order};
use crate::common::engine::EngineHandle;
use crate::common::{
    assert_invariants, count, index_entries_read, redis_stocks, sequential_scans, target_of,
    wait_until, Sale, Switch, TestEnv,
};

const SETTLE: Duration = Duration::from_secs(180);

async fn wait_for(db: &Client, sql: &str, expected: i64) {
    let ok = wait_until(SETTLE, || async { count(db, sql).await == expected }).await;
    assert!(ok, "{sql}: {} != {expected}", count(db, sql).await);
}

/// A queue bound to the events exchange for `routing_key`, declared before any event
/// is published (events nobody is bound to are not kept).
async fn bind_events(
    env: &TestEnv,
    channel: &lapin::Channel,
    name: &str,
    routing_key: &str,
) -> String {
    channel
        .exchange_declare(
            env.names.events_exchange().as_str().into(),
            ExchangeKind::Topic,
            ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    let queue = format!("{}.test.{name}", env.settings.amqp.namespace);
    env.declare_queue(channel, &queue).await;
    channel
        .queue_bind(
            queue.as_str().into(),
            env.names.events_exchange().as_str().into(),
            routing_key.into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    queue
}

/// Takes every message in `queue` and counts how often each message id arrived. Call
/// it once the rows are SENT: a row is SENT only after the broker confirmed (and so
/// enqueued) its message.
async fn drain_events(channel: &lapin::Channel, queue: &str) -> HashMap<String, u32> {
    let mut seen: HashMap<String, u32> = HashMap::new();
    while let Some(msg) = channel
        .basic_get(queue.into(), BasicGetOptions::default())
        .await
        .unwrap()
    {
        let id = msg
            .delivery
            .properties
            .message_id()
            .as_ref()
            .map(|s| s.to_string())
            .unwrap_or_default();
        *seen.entry(id).or_default() += 1;
        msg.delivery
            .acker
            .ack(BasicAckOptions::default())
            .await
            .unwrap();
    }
    seen
}

#[actix_rt::test]
async fn payment_and_timeout_cancel_never_both_win() {
    let (env, db) = Sale::new()
        .set("sweeper.interval_ms", 20)
        .set("amqp.shards", 2)
        .activity(41, 1_000, 8)
        .open()
        .await;
    // Far enough out for 1,000 orders to be created first on a busy 2-core machine.
    let expire_at = Utc::now() + TimeDelta::seconds(25);
    let msgs: Vec<_> = (0..1_000)
        .map(|user| {
            let mut m = order(41, 1, user + 1, (user % 8) as i16);
            m.order_expire_at = expire_at;
            m
        })
        .collect();
    let amqp = env.amqp().await;
    let engine = EngineHandle::start(&env.settings).await;
    builders::publish(&env, &amqp, &msgs).await;
    wait_for(&db, "SELECT count(*) FROM orders WHERE status = 10", 1_000).await;
    assert!(
        Utc::now() < expire_at,
        "orders were created too slowly for the race"
    );

    // Callbacks go out just before the orders expire, so the sweeper and the payments
    // meet on the same rows.
    let wait = (expire_at - Utc::now() - TimeDelta::milliseconds(300))
        .to_std()
        .unwrap_or_default();
    tokio::time::sleep(wait).await;
    let callbacks: Vec<_> = msgs.iter().map(builders::payment_for).collect();
    builders::publish_payments(&env, &amqp, &callbacks).await;
    wait_for(
        &db,
        "SELECT count(*) FROM consumer_inbox WHERE tag = 'PAYMENT_CALLBACK'",
        1_000,
    )
    .await;
    wait_for(
        &db,
        "SELECT count(*) FROM orders WHERE status IN (30, 40)",
        1_000,
    )
    .await;
    engine.stop().await;

    let paid = count(&db, "SELECT count(*) FROM orders WHERE status = 30").await;
    let cancelled = count(&db, "SELECT count(*) FROM orders WHERE status = 40").await;
    println!("race result: {paid} paid, {cancelled} cancelled");
    assert_eq!(paid + cancelled, 1_000);
    // No paid order gave its stock back; every cancelled one did, once.
    assert_eq!(
        count(&db, "SELECT count(*) FROM orders o JOIN inventory_ledger l ON l.order_id = o.order_id AND l.ledger_type = 20 WHERE o.status = 30").await,
        0
    );
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM inventory_ledger WHERE ledger_type = 20"
        )
        .await,
        cancelled
    );
    assert_eq!(
        count(
            &db,
            "SELECT sum(allocated_stock)::bigint FROM sku_inventory WHERE activity_id = 41"
        )
        .await,
        paid
    );
    // Every cancelled order that was paid has exactly one refund task.
    assert_eq!(
        count(&db, "SELECT count(*) FROM orders o WHERE o.status = 40 AND (SELECT count(*) FROM compensation_task t WHERE t.order_id = o.order_id AND t.task_type = 20) <> 1").await,
        0
    );
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM compensation_task WHERE task_type = 20"
        )
        .await,
        cancelled
    );
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM consumer_inbox WHERE result_code = 'PAID_AFTER_CANCEL'"
        )
        .await,
        cancelled
    );
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM consumer_inbox WHERE result_code = 'PAID'"
        )
        .await,
        paid
    );
    assert_invariants(&db).await;
    // Every event of the race (created, paid, cancelled, refunds) matches its schema.
    let seen = crate::common::contracts::assert_events_match_contracts(&db).await;
    for name in ["order.created", "order.paid"] {
        assert!(seen.contains(name), "no {name} event: {seen:?}");
    }
    env.cleanup().await;
}

#[actix_rt::test]
async fn every_created_order_is_announced_once_even_with_two_publishers() {
    let (env, db) = Sale::new()
        .set("amqp.shards", 4)
        .activity(42, 5_000, 16)
        .open()
        .await;
    let amqp = env.amqp().await;
    let channel = amqp.create_channel().await.unwrap();
    let queue = bind_events(&env, &channel, "created", "order.created").await;

    // Two engines: two publishers claiming from the same outbox.
    let first = EngineHandle::start(&env.settings).await;
    let second = EngineHandle::start(&env.settings).await;
    let msgs: Vec<_> = (0..5_000)
        .map(|u| order(42, 1, u + 1, (u % 16) as i16))
        .collect();
    builders::publish(&env, &amqp, &msgs).await;
    wait_for(
        &db,
        "SELECT count(*) FROM event_outbox WHERE tag = 'ORDER_CREATED' AND status = 20",
        5_000,
    )
    .await;
    let seen = drain_events(&channel, &queue).await;
    first.stop().await;
    second.stop().await;

    assert_eq!(seen.len(), 5_000);
    let duplicates: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        duplicates.is_empty(),
        "published twice without a lease expiry: {duplicates:?}"
    );
    let event_ids: HashSet<String> = db
        .query(
            "SELECT event_id::text FROM event_outbox WHERE tag = 'ORDER_CREATED'",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        event_ids,
        seen.keys().cloned().collect::<HashSet<_>>(),
        "AMQP message_id = event_id"
    );
    env.cleanup().await;
}

/// Creates `n` orders of activity `activity` with an engine whose publisher sleeps, so
/// their events stay PENDING in the outbox.
async fn orders_with_unpublished_events(env: &TestEnv, db: &mut Client, activity: i64, n: i64) {
    builders::activity(db, activity, 1, 100, 1).await;
    let mut quiet = env.settings.clone();
    quiet.outbox.interval_ms = 3_600_000;
    let engine = EngineHandle::start(&quiet).await;
    let amqp = env.amqp().await;
    let msgs: Vec<_> = (0..n).map(|u| order(activity, 1, u + 1, 0)).collect();
    builders::publish(env, &amqp, &msgs).await;
    wait_for(db, "SELECT count(*) FROM event_outbox WHERE status = 0", n).await;
    engine.stop().await;
}

/// Orders in flight, as the test says.
struct Load(AtomicBool);

impl OrderLoad for Load {
    fn busy(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

#[actix_rt::test]
async fn the_publisher_yields_to_orders_in_flight_until_its_backlog_is_too_old() {
    let env = TestEnv::new().await;
    let mut db = env.db().await;
    orders_with_unpublished_events(&env, &mut db, 49, 30).await;
    let sent = "SELECT count(*) FROM event_outbox WHERE status = 20";
    let pool = seckill_engine::store::build_pool(&env.settings.database).unwrap();
    let load = Arc::new(Load(AtomicBool::new(true)));
    let config = OutboxConfig {
        interval: Duration::from_millis(20),
        batch_size: 10,
        busy_interval: Duration::from_secs(3_600),
        max_lag: Duration::from_secs(3_600),
        ..OutboxConfig::from(&env.settings.outbox)
    };
    let publisher = OutboxPublisher::new(
        pool.clone(),
        env.settings.amqp.clone(),
        config.clone(),
        Some(load.clone()),
    );
    let runner = actix::Actor::start(seckill_engine::services::runner::Maintenance::new(
        publisher, None,
    ));
    // One batch, then nothing more while orders are in flight: 25 runs of the
    // runner's interval go by.
    wait_for(&db, sent, 10).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        count(&db, sent).await,
        10,
        "published while orders were in flight"
    );
    // The orders are done: the rest goes at once.
    load.0.store(false, Ordering::Relaxed);
    wait_for(&db, sent, 30).await;
    let _ = runner
        .send(seckill_engine::services::supervisor::StopChild)
        .await;

    // Busy again, but these events are older than the lag it allows.
    orders_with_unpublished_events(&env, &mut db, 50, 30).await;
    load.0.store(true, Ordering::Relaxed);
    let publisher = OutboxPublisher::new(
        pool,
        env.settings.amqp.clone(),
        OutboxConfig {
            max_lag: Duration::ZERO,
            ..config
        },
        Some(load),
    );
    let runner = actix::Actor::start(seckill_engine::services::runner::Maintenance::new(
        publisher, None,
    ));
    wait_for(&db, sent, 60).await;
    let _ = runner
        .send(seckill_engine::services::supervisor::StopChild)
        .await;
    env.cleanup().await;
}

#[actix_rt::test]
async fn a_publisher_that_died_after_publishing_is_replaced_and_the_event_comes_again() {
    let env = Sale::new().set("outbox.lease_ms", 1_000).env().await;
    let mut db = env.db().await;
    let amqp = env.amqp().await;
    let channel = amqp.create_channel().await.unwrap();
    let queue = bind_events(&env, &channel, "created", "order.created").await;
    orders_with_unpublished_events(&env, &mut db, 43, 20).await;

    // The dying publisher: claims, publishes with confirms, dies before SENT.
    let pool = seckill_engine::store::build_pool(&env.settings.database).unwrap();
    let mut conn = pool.get().await.unwrap();
    let claimed = seckill_engine::store::outbox::claim(&mut conn.client, "dying-publisher", 100)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 20);
    let publisher = seckill_engine::mq::publisher::ConfirmedPublisher::open(&amqp)
        .await
        .unwrap();
    let results = seckill_engine::services::outbox_publisher::publish_all(
        &publisher,
        &env.names.events_exchange(),
        &claimed,
    )
    .await;
    assert!(results.iter().all(|r| r.is_ok()));
    drop(conn);

    // A new publisher takes the rows back after the lease and sends them again.
    let engine = EngineHandle::start(&env.settings).await;
    wait_for(
        &db,
        "SELECT count(*) FROM event_outbox WHERE status = 20",
        20,
    )
    .await;
    engine.stop().await;
    // The old owner can no longer complete them (fencing).
    let ids: Vec<uuid::Uuid> = claimed.iter().map(|e| e.event_id).collect();
    let late = seckill_engine::store::outbox::mark_sent(
        &pool.get().await.unwrap().client,
        &ids,
        "dying-publisher",
    )
    .await
    .unwrap();
    assert_eq!(late, 0);

    let seen = drain_events(&channel, &queue).await;
    let total: u32 = seen.values().sum();
    assert_eq!(seen.len(), 20, "no event lost");
    assert_eq!(
        total, 40,
        "each event arrived twice, with the same event_id: {seen:?}"
    );
    for event in &claimed {
        assert_eq!(seen.get(&event.event_id.to_string()), Some(&2));
    }
    env.cleanup().await;
}

#[actix_rt::test]
async fn events_wait_in_retry_while_the_broker_refuses_them_and_all_go_out_after() {
    let (env, db) = Sale::new()
        .set("outbox.backoff_base_ms", 100)
        .set("outbox.backoff_max_ms", 1_000)
        .set("outbox.interval_ms", 50)
        .activity(44, 100, 1)
        .open()
        .await;
    let amqp = env.amqp().await;
    let channel = amqp.create_channel().await.unwrap();
    let engine = EngineHandle::start(&env.settings).await;
    // The broker refuses every publish to the events exchange while it is missing.
    channel
        .exchange_delete(
            env.names.events_exchange().as_str().into(),
            ExchangeDeleteOptions::default(),
        )
        .await
        .unwrap();
    let msgs: Vec<_> = (0..30).map(|u| order(44, 1, u + 1, 0)).collect();
    builders::publish(&env, &amqp, &msgs).await;
    wait_for(
        &db,
        "SELECT count(*) FROM event_outbox WHERE status = 30 AND retry_count >= 3",
        30,
    )
    .await;
    // Backoff grows: later retries are scheduled further out.
    let spread: f64 = db
        .query_one(
            "SELECT extract(epoch FROM max(available_at - updated_at))::float8 FROM event_outbox",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(spread >= 0.3, "retry delay did not grow: {spread}");
    assert_eq!(
        count(&db, "SELECT count(*) FROM event_outbox WHERE status = 40").await,
        0
    );

    let queue = bind_events(&env, &channel, "after", "order.created").await;
    wait_for(
        &db,
        "SELECT count(*) FROM event_outbox WHERE status = 20",
        30,
    )
    .await;
    engine.stop().await;
    assert_eq!(drain_events(&channel, &queue).await.len(), 30);
    assert_eq!(
        count(&db, "SELECT count(*) FROM event_outbox WHERE status = 40").await,
        0
    );
    env.cleanup().await;
}

#[actix_rt::test]
async fn the_sweeper_returns_expired_stock_and_redis_gets_each_unit_back_once() {
    let (env, db) = Sale::new()
        .set("sweeper.interval_ms", 50)
        .set("compensation.interval_ms", 50)
        .activity(45, 40, 4)
        .open()
        .await;
    let keys = SkuKeys::new(&env.settings.redis.key_prefix, 45, 1);
    let mut redis = env.redis().await;
    seckill_engine::redis::load_stock(
        &mut redis,
        &keys,
        &[10, 10, 10, 10],
        crate::common::sale_end(),
    )
    .await
    .unwrap();

    let expire_at = Utc::now() + TimeDelta::seconds(2);
    let msgs: Vec<_> = (0..20)
        .map(|u| {
            let mut m = order(45, 1, u + 1, (u % 4) as i16);
            m.order_expire_at = expire_at;
            m
        })
        .collect();
    let amqp = env.amqp().await;
    let engine = EngineHandle::start(&env.settings).await;
    builders::publish(&env, &amqp, &msgs).await;
    wait_for(&db, "SELECT count(*) FROM orders WHERE status = 40", 20).await;
    wait_for(
        &db,
        "SELECT count(*) FROM compensation_task WHERE task_type = 10 AND status = 20",
        20,
    )
    .await;

    assert_eq!(
        redis_stocks(&mut redis, &keys, 4).await,
        vec![15, 15, 15, 15],
        "each unit given back once"
    );

    // Run every give-back again, as a worker would after a lease expiry: no change.
    db.execute(
        "UPDATE compensation_task SET status = 30, next_run_at = now() WHERE task_type = 10",
        &[],
    )
    .await
    .unwrap();
    wait_for(
        &db,
        "SELECT count(*) FROM compensation_task WHERE task_type = 10 AND status = 20",
        20,
    )
    .await;
    engine.stop().await;
    assert_eq!(
        redis_stocks(&mut redis, &keys, 4).await,
        vec![15, 15, 15, 15],
        "a second run changes nothing"
    );

    // PostgreSQL: the exact stock is back in its buckets, with a RELEASE ledger row each.
    assert_eq!(
        count(
            &db,
            "SELECT sum(allocated_stock)::bigint FROM sku_inventory WHERE activity_id = 45"
        )
        .await,
        0
    );
    assert_eq!(
        count(
            &db,
            "SELECT sum(available_stock)::bigint FROM sku_inventory WHERE activity_id = 45"
        )
        .await,
        40
    );
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM inventory_ledger WHERE ledger_type = 20"
        )
        .await,
        20
    );
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM inventory_reservation WHERE status = 40"
        )
        .await,
        20
    );
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM event_outbox WHERE tag = 'ORDER_CANCELLED'"
        )
        .await,
        20
    );
    assert_invariants(&db).await;
    // The sweeper's cancellations match the `order.cancelled` schema.
    let seen = crate::common::contracts::assert_events_match_contracts(&db).await;
    assert!(
        seen.contains("order.cancelled"),
        "no order.cancelled event: {seen:?}"
    );
    env.cleanup().await;
}

/// The real publisher, except that its first run claims rows and then panics.
struct PanicOnce {
    inner: OutboxPublisher,
    pool: seckill_engine::store::Pool,
    armed: Rc<Cell<bool>>,
}

impl Service for PanicOnce {
    const NAME: &'static str = "outbox_publisher";
    fn interval(&self) -> Duration {
        self.inner.interval()
    }
    fn run_once(&self) -> LocalBoxFuture<'static, Result<Outcome, ServiceError>> {
        if !self.armed.replace(false) {
            return self.inner.run_once();
        }
        let pool = self.pool.clone();
        let owner = self.inner.owner().to_owned();
        Box::pin(async move {
            let mut conn = pool.get().await.unwrap();
            let claimed = seckill_engine::store::outbox::claim(&mut conn.client, &owner, 1_000)
                .await
                .unwrap();
            assert!(!claimed.is_empty());
            panic!("publisher dies holding {} claimed rows", claimed.len());
        })
    }
}

#[actix_rt::test]
async fn a_publisher_that_panics_is_restarted_and_no_row_is_lost() {
    let env = Sale::new().set("outbox.lease_ms", 500).env().await;
    let mut db = env.db().await;
    orders_with_unpublished_events(&env, &mut db, 46, 25).await;

    let pool = seckill_engine::store::build_pool(&env.settings.database).unwrap();
    let armed = Rc::new(Cell::new(true));
    let factory = {
        let (pool, amqp_settings, armed) = (pool.clone(), env.settings.amqp.clone(), armed.clone());
        let config = OutboxConfig::from(&env.settings.outbox);
        child(move || PanicOnce {
            inner: OutboxPublisher::new(pool.clone(), amqp_settings.clone(), config.clone(), None),
            pool: pool.clone(),
            armed: armed.clone(),
        })
    };
    let supervisor = actix::Actor::start(
        Supervisor::new(Duration::from_millis(50), Duration::from_secs(1))
            .child("outbox_publisher", factory),
    );
    wait_for(
        &db,
        "SELECT count(*) FROM event_outbox WHERE status = 20",
        25,
    )
    .await;
    let restarts = supervisor.send(Restarts).await.unwrap();
    assert_eq!(restarts.get("outbox_publisher"), Some(&1));
    assert!(!armed.get(), "the first run did panic");
    // The rows the dead publisher held came back through lease recovery.
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM event_outbox WHERE last_error IS NULL AND status <> 20"
        )
        .await,
        0
    );
    env.cleanup().await;
}

#[actix_rt::test]
async fn events_wait_while_the_broker_is_down_and_all_go_out_when_it_returns() {
    use secrecy::ExposeSecret;
    let env = TestEnv::new().await;
    let mut db = env.db().await;
    orders_with_unpublished_events(&env, &mut db, 47, 30).await;
    let amqp = env.amqp().await;
    let channel = amqp.create_channel().await.unwrap();
    let queue = bind_events(&env, &channel, "down", "order.created").await;

    // The publisher reaches the broker only through the switch.
    let url = env.settings.amqp.url.expose_secret().to_owned();
    let switch = Switch::start(target_of(&url, 5672)).await;
    switch.set(false);
    let mut amqp_settings = env.settings.amqp.clone();
    amqp_settings.url = switch.url_through(&url).into();
    let config = OutboxConfig {
        interval: Duration::from_millis(50),
        backoff_base: Duration::from_millis(100),
        backoff_max: Duration::from_millis(1_000),
        ..OutboxConfig::from(&env.settings.outbox)
    };
    let pool = seckill_engine::store::build_pool(&env.settings.database).unwrap();
    let publisher = OutboxPublisher::new(pool, amqp_settings, config, None);
    let runner = actix::Actor::start(seckill_engine::services::runner::Maintenance::new(
        publisher, None,
    ));

    wait_for(
        &db,
        "SELECT count(*) FROM event_outbox WHERE status = 30 AND retry_count >= 3",
        30,
    )
    .await;
    let growing: bool = db
        .query_one(
            "SELECT bool_and(available_at - updated_at >= interval '0.4 second') FROM event_outbox",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(growing, "the retry delay grows with the attempts");
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM event_outbox WHERE status IN (20, 40)"
        )
        .await,
        0
    );

    switch.set(true);
    wait_for(
        &db,
        "SELECT count(*) FROM event_outbox WHERE status = 20",
        30,
    )
    .await;
    let _ = runner
        .send(seckill_engine::services::supervisor::StopChild)
        .await;
    assert_eq!(drain_events(&channel, &queue).await.len(), 30);
    assert_eq!(
        count(&db, "SELECT count(*) FROM event_outbox WHERE status = 40").await,
        0
    );
    env.cleanup().await;
}

#[actix_rt::test]
async fn redis_give_backs_wait_while_redis_is_down_and_run_once_when_it_returns() {
    use seckill_engine::services::compensation_worker::{CompensationConfig, CompensationWorker};
    use secrecy::ExposeSecret;
    let env = TestEnv::new().await;
    let mut db = env.db().await;
    builders::activity(&mut db, 48, 1, 10, 1).await;
    let keys = SkuKeys::new(&env.settings.redis.key_prefix, 48, 1);
    let mut redis = env.redis().await;
    seckill_engine::redis::load_stock(&mut redis, &keys, &[10], crate::common::sale_end())
        .await
        .unwrap();
    // 15 buyers for 10 units: 5 sold-out rejections, each with a give-back task.
    let mut quiet = env.settings.clone();
    quiet.compensation.interval_ms = 3_600_000;
    let engine = EngineHandle::start(&quiet).await;
    let amqp = env.amqp().await;
    let msgs: Vec<_> = (0..15).map(|u| order(48, 1, u + 1, 0)).collect();
    builders::publish(&env, &amqp, &msgs).await;
    wait_for(
        &db,
        "SELECT count(*) FROM compensation_task WHERE task_type = 10",
        5,
    )
    .await;
    engine.stop().await;

    let switch = Switch::start(target_of(env.settings.redis.url.expose_secret(), 6379)).await;
    switch.set(false);
    let mut redis_settings = env.settings.redis.clone();
    redis_settings.url = format!("redis://{}", switch.addr).into();
    let config = CompensationConfig {
        interval: Duration::from_millis(50),
        backoff_base: Duration::from_millis(100),
        backoff_max: Duration::from_millis(1_000),
        ..CompensationConfig::from(&env.settings.compensation)
    };
    let pool = seckill_engine::store::build_pool(&env.settings.database).unwrap();
    let worker = CompensationWorker::new(pool, redis_settings, env.settings.amqp.clone(), config);
    let runner = actix::Actor::start(seckill_engine::services::runner::Maintenance::new(
        worker, None,
    ));
    wait_for(
        &db,
        "SELECT count(*) FROM compensation_task WHERE status = 30 AND retry_count >= 3",
        5,
    )
    .await;
    // Backoff, not a storm: a handful of attempts per task in this window.
    assert!(
        count(
            &db,
            "SELECT max(retry_count)::bigint FROM compensation_task"
        )
        .await
            <= 8
    );
    assert_eq!(
        redis_stocks(&mut redis, &keys, 1).await[0],
        10,
        "nothing given back yet"
    );

    switch.set(true);
    wait_for(
        &db,
        "SELECT count(*) FROM compensation_task WHERE status = 20",
        5,
    )
    .await;
    let _ = runner
        .send(seckill_engine::services::supervisor::StopChild)
        .await;
    assert_eq!(
        redis_stocks(&mut redis, &keys, 1).await[0],
        15,
        "each rejected unit given back once"
    );
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM compensation_task WHERE status = 40"
        )
        .await,
        0
    );
    env.cleanup().await;
}

/// Retention (seed §8.5) with windows of seconds: SENT events past the audit period
/// move to history, inbox rows past the replay window are deleted, in batches, and
/// everything younger stays; `check` then compares inbox rows only within the window.
#[actix_rt::test]
async fn retention_moves_sent_events_to_history_and_prunes_the_inbox_past_its_window() {
    let env = Sale::new()
        .set("retention.interval_ms", 20)
        .set("retention.batch_size", 3)
        .set("retention.inbox_secs", 30)
        .set("retention.outbox_history_secs", 30)
        .env()
        .await;
    let mut db = env.db().await;
    orders_with_unpublished_events(&env, &mut db, 49, 10).await;
    // Seven events were sent long ago, three just now; four orders (with their inbox
    // rows) are an hour old.
    db.batch_execute(
        "UPDATE event_outbox SET status = 20, sent_at = now() - interval '2 hours'
         WHERE event_id IN (SELECT event_id FROM event_outbox ORDER BY event_id LIMIT 7);
         UPDATE event_outbox SET status = 20, sent_at = now() WHERE status = 0;
         UPDATE consumer_inbox SET processed_at = now() - interval '1 hour'
         WHERE order_id IN (SELECT order_id FROM orders ORDER BY order_id LIMIT 4);
         UPDATE orders SET created_at = now() - interval '1 hour'
         WHERE order_id IN (SELECT order_id FROM orders ORDER BY order_id LIMIT 4);",
    )
    .await
    .unwrap();
    let old_events: Vec<uuid::Uuid> = db
        .query(
            "SELECT event_id FROM event_outbox WHERE sent_at < now() - interval '1 hour'",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(old_events.len(), 7);

    let engine = EngineHandle::start(&env.settings).await;
    wait_for(&db, "SELECT count(*) FROM event_outbox_history", 7).await;
    wait_for(&db, "SELECT count(*) FROM consumer_inbox", 6).await;
    engine.stop().await;
    // Moved whole: each old event is in history, with its payload, and nowhere else.
    let moved: i64 = db
        .query_one(
            "SELECT count(*) FROM event_outbox_history AS h
             JOIN unnest($1::uuid[]) AS o(event_id) USING (event_id)
             WHERE h.status = 20 AND h.payload IS NOT NULL AND h.archived_at IS NOT NULL",
            &[&old_events],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(moved, 7);
    assert_eq!(count(&db, "SELECT count(*) FROM event_outbox").await, 3);
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM consumer_inbox WHERE processed_at < now() - interval '1 minute'"
        )
        .await,
        0
    );

    // The check within the window passes; the same check over a window that still
    // reaches the pruned rows finds their four orders without an inbox row, so the
    // window is what makes the difference.
    let check = |window: Duration| {
        let db = &db;
        async move {
            seckill_engine::store::invariants::run_checks(db, None, window)
                .await
                .unwrap()
                .into_iter()
                .find(|r| r.name == "inbox_order_consistency")
                .unwrap()
                .violations
        }
    };
    assert_eq!(check(env.settings.retention.inbox_window()).await, 0);
    assert_eq!(check(Duration::from_secs(86_400)).await, 4);
    env.cleanup().await;
}

/// Retention never waits for a row another transaction holds: it takes the rest and
/// the held row on a later run.
#[actix_rt::test]
async fn retention_skips_rows_the_order_path_holds() {
    let env = TestEnv::new().await;
    let mut db = env.db().await;
    orders_with_unpublished_events(&env, &mut db, 50, 4).await;
    db.batch_execute(
        "UPDATE event_outbox SET status = 20, sent_at = now() - interval '2 hours';
         UPDATE consumer_inbox SET processed_at = now() - interval '2 hours';",
    )
    .await
    .unwrap();
    let mut holder = env.db().await;
    let tx = holder.transaction().await.unwrap();
    tx.batch_execute(
        "SELECT 1 FROM event_outbox
         WHERE event_id = (SELECT event_id FROM event_outbox ORDER BY event_id LIMIT 1) FOR UPDATE;
         SELECT 1 FROM consumer_inbox
         WHERE message_id = (SELECT message_id FROM consumer_inbox ORDER BY message_id LIMIT 1)
         FOR UPDATE;",
    )
    .await
    .unwrap();
    let hour = Duration::from_secs(3600);
    let started = std::time::Instant::now();
    let archived = seckill_engine::store::retention::archive_sent(&db, hour, 100)
        .await
        .unwrap();
    let pruned = seckill_engine::store::retention::prune_inbox(&db, hour, 100)
        .await
        .unwrap();
    assert_eq!((archived, pruned), (3, 3), "the held rows are skipped");
    // About the timing: skipping the held rows means not waiting for them.
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "no wait on the held rows: {:?}",
        started.elapsed()
    );
    tx.rollback().await.unwrap();
    let archived = seckill_engine::store::retention::archive_sent(&db, hour, 100)
        .await
        .unwrap();
    let pruned = seckill_engine::store::retention::prune_inbox(&db, hour, 100)
        .await
        .unwrap();
    assert_eq!((archived, pruned), (1, 1), "taken once released");
    env.cleanup().await;
}

/// During a sale nearly every event waits in the outbox, and the publisher claims a
/// batch every second; a mass cancellation queues compensation tasks the same way.
/// Each claim must read its batch from the ready index, in order, never every ready
/// row, on tables never analyzed (autovacuum may be off).
#[actix_rt::test]
async fn batch_claims_read_their_batch_not_the_whole_backlog() {
    let env = TestEnv::new().await;
    let db = env.db().await;
    builders::outbox_events(&db, &[0; 20_000]).await;
    builders::compensation_tasks(&db, &[0; 20_000]).await;
    let pool = env.one_connection_pool();
    let mut backend = pool.get().await.unwrap();

    let events = seckill_engine::store::outbox::claim(&mut backend.client, "claimer", 200)
        .await
        .unwrap();
    let tasks = seckill_engine::store::compensation::claim(&mut backend.client, "claimer", 50)
        .await
        .unwrap();
    let mut got: Vec<uuid::Uuid> = events.iter().map(|e| e.event_id).collect();
    got.sort();
    let mut first: Vec<uuid::Uuid> = db
        .query(
            "SELECT event_id FROM event_outbox ORDER BY available_at, created_at, event_id
             LIMIT 200",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    first.sort();
    assert_eq!(
        got, first,
        "the outbox claim takes the first 200 in the index's order"
    );
    assert_eq!(tasks.len(), 50);

    let read = index_entries_read(
        &backend.client,
        &db,
        &["idx_outbox_ready", "idx_compensation_ready"],
    )
    .await;
    assert_eq!(read.len(), 2, "{read:?}");
    assert!(
        read.iter().all(|(_, n)| *n < 1_000),
        "index entries read for batches of 200 and 50: {read:?}"
    );
    env.cleanup().await;
}

/// After a sale the publisher drains its backlog a batch per run, and the entries of
/// every event already SENT stay in `idx_outbox_stale_sending` until a vacuum
/// (autovacuum may be off). Neither completing a batch nor looking for expired
/// leases on every run may read them all again: 20,000 events sent an hour ago,
/// then ten runs of 200.
#[actix_rt::test]
async fn draining_a_backlog_does_not_read_every_event_sent_before_on_each_run() {
    let env = TestEnv::new().await;
    let db = env.db().await;
    let amqp = env.amqp().await;
    let channel = amqp.create_channel().await.unwrap();
    bind_events(&env, &channel, "drain", "#").await;
    let pool = env.one_connection_pool();
    let publisher = OutboxPublisher::new(
        pool.clone(),
        env.settings.amqp.clone(),
        OutboxConfig::from(&env.settings.outbox),
        None,
    );
    let index = ["idx_outbox_stale_sending"];
    // Set up through the publisher's own connection, so that the reading below
    // flushes the set-up's statistics too.
    let before = {
        let backend = pool.get().await.unwrap();
        let mut statuses = vec![10i16; 20_000];
        statuses.extend([0i16; 2_000]);
        builders::outbox_events(&backend.client, &statuses).await;
        backend
            .client
            .batch_execute(
                "UPDATE event_outbox SET locked_at = now() - interval '1 hour' WHERE status = 10;
                 UPDATE event_outbox SET status = 20, locked_by = NULL, locked_at = NULL,
                                         sent_at = now() - interval '1 hour'
                 WHERE status = 10;",
            )
            .await
            .unwrap();
        index_entries_read(&backend.client, &db, &index).await
    };
    for _ in 0..10 {
        publisher.run_once().await.unwrap();
    }
    let after = {
        let backend = pool.get().await.unwrap();
        index_entries_read(&backend.client, &db, &index).await
    };
    assert_eq!(
        count(&db, "SELECT count(*) FROM event_outbox WHERE status = 20").await,
        22_000
    );
    let read = after[0].1 - before[0].1;
    // One look for expired leases reads the 20,000 once; each run looking again, or
    // each batch's completion reading the index, adds 20,000 or more per run.
    assert!(
        read < 40_000,
        "{read} entries of idx_outbox_stale_sending read for 10 batches of 200"
    );
    env.cleanup().await;
}

/// During a sale the outbox yields to the orders and every order adds a waiting
/// event, so the gauges meet a backlog of tens of thousands every few seconds while
/// the cores are busiest: they must read a bounded share of it (counting 80,000 in
/// full took a core for tens of milliseconds or more). Twice the cap of PENDING events and tasks, with
/// an older RETRY row waiting behind its backoff, then an older SENDING row, then an
/// older PENDING one: the counts stop at the cap, the oldest age is always the
/// oldest row's, and the ready indexes give up little more than the cap's entries
/// (that neither table is read whole instead is the next test's).
#[actix_rt::test]
async fn the_backlog_gauges_read_a_bounded_share_of_a_sale_s_backlog() {
    use seckill_engine::store::ops::{backlog, BACKLOG_COUNT_CAP as CAP};
    let env = TestEnv::new().await;
    let db = env.db().await;
    let mut statuses = vec![0i16; 2 * CAP as usize];
    statuses.extend([30, 10]);
    builders::outbox_events(&db, &statuses).await;
    builders::compensation_tasks(&db, &statuses).await;
    db.batch_execute(
        "UPDATE event_outbox SET created_at = now() - interval '2 hours',
                                 available_at = now() + interval '1 hour'
         WHERE status = 30;
         UPDATE compensation_task SET created_at = now() - interval '2 hours',
                                      next_run_at = now() + interval '1 hour'
         WHERE status = 30;",
    )
    .await
    .unwrap();
    let pool = env.one_connection_pool();
    let indexes = ["idx_compensation_ready", "idx_outbox_ready"];
    let read = |before: Vec<(String, i64)>| {
        let (pool, db) = (pool.clone(), &db);
        async move {
            let backend = pool.get().await.unwrap();
            let after = index_entries_read(&backend.client, db, &indexes).await;
            after
                .iter()
                .zip(&before)
                .map(|(a, b)| a.1 - b.1)
                .sum::<i64>()
        }
    };
    let before = {
        let backend = pool.get().await.unwrap();
        index_entries_read(&backend.client, &db, &indexes).await
    };
    let b = backlog(&pool).await.unwrap();
    assert_eq!((b.outbox_pending, b.compensation_pending), (CAP, CAP));
    let hours = |age: f64| (age / 3600.0 * 100.0).round() / 100.0;
    assert_eq!(
        (
            hours(b.outbox_oldest_pending_age_seconds),
            hours(b.compensation_oldest_pending_age_seconds)
        ),
        (2.0, 2.0),
        "the RETRY rows are the oldest"
    );
    let entries = read(before).await;
    assert!(
        entries < 2 * CAP + 1_000,
        "{entries} entries of the ready indexes read for counts capped at {CAP}"
    );

    // Then an older SENDING (RUNNING) row, then an older PENDING one, in each table.
    let steps = [
        (
            "UPDATE event_outbox SET created_at = now() - interval '3 hours' WHERE status = 10;
             UPDATE compensation_task SET created_at = now() - interval '3 hours'
             WHERE status = 10;",
            3.0,
            "a SENDING (RUNNING) row is the oldest",
        ),
        (
            "UPDATE event_outbox SET created_at = now() - interval '4 hours',
                                     available_at = now() - interval '4 hours'
             WHERE event_id = (SELECT event_id FROM event_outbox WHERE status = 0 LIMIT 1);
             UPDATE compensation_task SET created_at = now() - interval '4 hours',
                                          next_run_at = now() - interval '4 hours'
             WHERE task_id = (SELECT task_id FROM compensation_task WHERE status = 0 LIMIT 1);",
            4.0,
            "a PENDING row is the oldest",
        ),
    ];
    for (sql, age, what) in steps {
        db.batch_execute(sql).await.unwrap();
        let b = backlog(&pool).await.unwrap();
        assert_eq!(
            (
                hours(b.outbox_oldest_pending_age_seconds),
                hours(b.compensation_oldest_pending_age_seconds)
            ),
            (age, age),
            "{what}"
        );
    }
    env.cleanup().await;
}

/// The backlog gauges run every few seconds over tables that keep a day of finished
/// rows (SENT events, DONE tasks): every count must come from a partial index, never
/// from reading the whole table. A few rows in each counted state, among many
/// finished ones, none of them analyzed (autovacuum may be off).
#[actix_rt::test]
async fn the_backlog_gauges_count_without_reading_whole_tables() {
    let env = TestEnv::new().await;
    let db = env.db().await;
    // Events: 3 pending, 2 sending, 1 dead, the rest sent. Tasks: 2 retrying,
    // 1 running, 2 waiting for review, the rest done.
    let mut events = vec![20; 20_000];
    events[..6].copy_from_slice(&[0, 0, 0, 10, 10, 40]);
    builders::outbox_events(&db, &events).await;
    let mut tasks = vec![20; 20_000];
    tasks[..5].copy_from_slice(&[30, 30, 10, 50, 50]);
    builders::compensation_tasks(&db, &tasks).await;
    let pool = env.one_connection_pool();

    let backlog = seckill_engine::store::ops::backlog(&pool).await.unwrap();
    assert_eq!(
        (
            backlog.outbox_pending,
            backlog.outbox_dead,
            backlog.compensation_pending,
            backlog.compensation_manual_review
        ),
        (5, 1, 3, 2)
    );
    assert!(backlog.outbox_oldest_pending_age_seconds >= 0.0);
    let backend = pool.get().await.unwrap();
    let scans =
        sequential_scans(&backend.client, &db, &["event_outbox", "compensation_task"]).await;
    assert_eq!(scans, vec![], "the backlog gauges read these tables whole");
    env.cleanup().await;
}

/// A lease taken over by another instance (here: its row rewritten) stops minting at
/// the next renewal, and with it intake: readiness says why.
#[actix_rt::test]
async fn a_lost_node_id_lease_stops_minting_and_intake() {
    let env = TestEnv::new().await;
    let engine = crate::common::engine::EngineHandle::start(&env.settings).await;
    assert!(engine.readiness.may_mint() && engine.readiness.accepting());
    assert!(engine.ids.next_id().is_ok());
    let db = env.db().await;
    let taken = db
        .execute(
            "UPDATE node_lease SET holder = gen_random_uuid(), holder_name = 'the usurper'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(taken, 1);
    // The keeper renews every 5 s; a loaded machine may delay that renewal.
    let readiness = engine.readiness.clone();
    assert!(
        crate::common::wait_until(crate::common::HANG, || {
            let readiness = readiness.clone();
            async move { !readiness.may_mint() }
        })
        .await,
        "minting went on after the lease was lost"
    );
    assert!(!engine.readiness.accepting());
    assert!(engine.ids.next_id().is_err());
    engine.stop().await;
    env.cleanup().await;
}
