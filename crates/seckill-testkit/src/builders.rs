//! Builders for test data: activities, `order.create` messages, and publishing them
//! through the broker the way the front stage does.

use std::sync::LazyLock;

use chrono::{TimeDelta, Utc};
use futures_util::future::join_all;
use lapin::{BasicProperties, Connection};
use seckill_engine::domain::ids::IdGenerator;
use seckill_engine::domain::message::OrderCreateMessage;
use seckill_engine::domain::shard::shard_for;
use seckill_engine::mq::publisher::ConfirmedPublisher;
use seckill_engine::mq::topology::Names;
use seckill_engine::store::activity::{create_activity, ActivitySpec};
use tokio_postgres::Client;
use uuid::Uuid;

use super::TestEnv;

/// Test ids come from the highest node id, which no engine config uses by default.
static IDS: LazyLock<IdGenerator> = LazyLock::new(|| IdGenerator::new(1023));

/// Creates activity `activity` with one SKU `sku`, `stock` units over `buckets`.
pub async fn activity(db: &mut Client, activity: i64, sku: i64, stock: i32, buckets: i16) {
    let now = Utc::now();
    create_activity(
        db,
        &ActivitySpec {
            activity_id: activity,
            sku_id: sku,
            title: format!("test sku {sku}"),
            stock,
            buckets,
            unit_price: 1999,
            currency: "CNY".into(),
            starts_at: now - TimeDelta::minutes(1),
            ends_at: now + TimeDelta::hours(1),
            order_ttl_ms: 900_000,
        },
    )
    .await
    .expect("create activity");
}

/// A valid message for a fresh reservation of `user` in `bucket`.
pub fn order(activity: i64, sku: i64, user: i64, bucket: i16) -> OrderCreateMessage {
    let order_id = IDS
        .next_id()
        .expect("the tests' generator has no lease to lose");
    let now = Utc::now();
    OrderCreateMessage {
        schema_version: seckill_engine::domain::message::SCHEMA_VERSION,
        message_id: Uuid::now_v7(),
        request_id: Uuid::now_v7(),
        reservation_id: Uuid::now_v7(),
        order_id,
        order_no: format!("T{order_id}"),
        activity_id: activity,
        sku_id: sku,
        user_id: user,
        inventory_bucket: bucket,
        unit_price: 1999,
        currency: "CNY".into(),
        reserved_at: now,
        reservation_ttl_ms: 60_000,
        order_expire_at: now + TimeDelta::minutes(15),
    }
}

/// The same reservation sent again under a new message id (a re-sending front stage).
pub fn resend(msg: &OrderCreateMessage) -> OrderCreateMessage {
    OrderCreateMessage {
        message_id: Uuid::now_v7(),
        ..msg.clone()
    }
}

/// Publishes raw bodies to a shard's routing key with confirms, all in flight at once.
pub async fn publish_raw(env: &TestEnv, conn: &Connection, shard: u16, bodies: &[Vec<u8>]) {
    let publisher = ConfirmedPublisher::open(conn).await.expect("publisher");
    let exchange = env.names.orders_exchange();
    let routing_key = Names::order_routing_key(shard);
    for chunk in bodies.chunks(2000) {
        let results = join_all(chunk.iter().map(|body| {
            publisher.publish(
                &exchange,
                &routing_key,
                body,
                seckill_engine::mq::message_properties(&Uuid::now_v7().to_string()),
            )
        }))
        .await;
        for r in results {
            r.expect("publish confirmed");
        }
    }
}

/// Publishes messages to their shards (as producers compute them) with confirms.
pub async fn publish(env: &TestEnv, conn: &Connection, msgs: &[OrderCreateMessage]) {
    publish_to(&env.names, env.settings.amqp.shards, conn, msgs).await
}

/// `publish` without the environment (for a task that outlives a borrow of it).
pub async fn publish_to(
    names: &Names,
    shards: u16,
    conn: &Connection,
    msgs: &[OrderCreateMessage],
) {
    let publisher = ConfirmedPublisher::open(conn).await.expect("publisher");
    let exchange = names.orders_exchange();
    let bodies: Vec<(String, Vec<u8>, String)> = msgs
        .iter()
        .map(|m| {
            let shard = shard_for(m.activity_id, m.sku_id, m.inventory_bucket, shards);
            (
                Names::order_routing_key(shard),
                serde_json::to_vec(m).expect("serialize"),
                m.message_id.to_string(),
            )
        })
        .collect();
    for chunk in bodies.chunks(2000) {
        let results = join_all(chunk.iter().map(|(rk, body, id)| {
            publisher.publish(
                &exchange,
                rk,
                body,
                seckill_engine::mq::message_properties(id),
            )
        }))
        .await;
        for r in results {
            r.expect("publish confirmed");
        }
    }
}

/// A payment callback paying `msg`'s order in full.
pub fn payment_for(msg: &OrderCreateMessage) -> seckill_engine::domain::payment::PaymentCallback {
    seckill_engine::domain::payment::PaymentCallback {
        schema_version: seckill_engine::domain::message::SCHEMA_VERSION,
        payment_id: Uuid::now_v7(),
        payment_request_id: Uuid::now_v7(),
        order_id: msg.order_id,
        provider: "testpay".into(),
        provider_trade_no: format!("TP{}", msg.order_id),
        callback_id: format!("CB{}", msg.order_id),
        amount: msg.unit_price,
        currency: msg.currency.clone(),
        paid_at: Utc::now(),
        raw: None,
    }
}

/// Publishes payment callbacks through the payments exchange, as a provider does,
/// with confirms.
pub async fn publish_payments(
    env: &TestEnv,
    conn: &Connection,
    callbacks: &[seckill_engine::domain::payment::PaymentCallback],
) {
    let publisher = ConfirmedPublisher::open(conn).await.expect("publisher");
    let route = env.names.payment_route();
    for chunk in callbacks.chunks(2000) {
        let results = join_all(chunk.iter().map(|cb| {
            let body = serde_json::to_vec(cb).expect("serialize");
            let publisher = &publisher;
            let route = &route;
            async move {
                publisher
                    .publish(
                        &route.exchange,
                        &route.routing_key,
                        &body,
                        BasicProperties::default(),
                    )
                    .await
            }
        }))
        .await;
        for r in results {
            r.expect("publish confirmed");
        }
    }
}

/// One outbox event per entry of `statuses`, in order: SENDING ones (10) hold a lease,
/// SENT ones (20) carry `sent_at`, the rest are as the order path writes them.
pub async fn outbox_events(db: &Client, statuses: &[i16]) {
    db.execute(
        "INSERT INTO event_outbox (event_id, dedup_key, aggregate_type, aggregate_id, topic,
                                   tag, message_key, schema_version, payload, status,
                                   locked_by, locked_at, sent_at)
         SELECT gen_random_uuid(), 'T:' || g, 'ORDER', g::text, 'SECKILL_EVENTS', 'T',
                g::text, 1, '{\"n\": 1}'::jsonb, s,
                CASE WHEN s = 10 THEN 'test' END,
                CASE WHEN s = 10 THEN statement_timestamp() END,
                CASE WHEN s = 20 THEN statement_timestamp() END
         FROM unnest($1::smallint[]) WITH ORDINALITY AS t(s, g)",
        &[&statuses],
    )
    .await
    .expect("outbox events");
}

/// One compensation task per entry of `statuses`, in order: RUNNING ones (10) hold a
/// lease, DONE ones (20) carry `completed_at`.
pub async fn compensation_tasks(db: &Client, statuses: &[i16]) {
    db.execute(
        "INSERT INTO compensation_task (task_id, idempotency_key, task_type, payload, status,
                                        locked_by, locked_at, completed_at)
         SELECT gen_random_uuid(), 'T:' || g, 10, '{}'::jsonb, s,
                CASE WHEN s = 10 THEN 'test' END,
                CASE WHEN s = 10 THEN statement_timestamp() END,
                CASE WHEN s = 20 THEN statement_timestamp() END
         FROM unnest($1::smallint[]) WITH ORDINALITY AS t(s, g)",
        &[&statuses],
    )
    .await
    .expect("compensation tasks");
}
