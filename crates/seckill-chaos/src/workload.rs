//! What the harness sends: order messages (unique buyers, a hot SKU, duplicates and
//! re-sends), payment callbacks racing their orders' expiry, and poison. The
//! publisher keeps every message until the broker confirms it, reconnecting through
//! broker faults, and remembers what was confirmed: the account starts from there.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use chrono::{TimeDelta, Utc};
use rand::seq::SliceRandom;
use rand::Rng;
use uuid::Uuid;

use seckill_engine::config::AmqpSettings;
use seckill_engine::domain::ids::{IdGenerator, MAX_NODE_ID};
use seckill_engine::domain::message::OrderCreateMessage;
use seckill_engine::domain::payment::PaymentCallback;
use seckill_engine::domain::shard::shard_for;
use seckill_engine::mq::publisher::ConfirmedPublisher;
use seckill_engine::mq::topology::Names;

/// The shape of a scenario's traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Each buyer once, over several buckets with stock for about half of them.
    Unique,
    /// One bucket, stock 500, every buyer sending about three messages.
    HotSku,
    /// Every message one to three times, plus new message ids for a third of the
    /// reservations.
    Duplicates,
    /// Orders that expire a few seconds after they are made, and payment callbacks
    /// for most of them timed around the expiry.
    PaymentsRace,
    /// The fail-over acceptance sale: each buyer once over 16 buckets with stock for
    /// all, one delivery in ten sent twice.
    Sale16,
}

/// One message to publish.
#[derive(Debug, Clone)]
pub struct Outgoing {
    pub message_id: String,
    pub exchange: String,
    pub routing_key: String,
    pub body: Vec<u8>,
    pub kind: Kind,
    /// Not before this long after the workload starts.
    pub at: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Order,
    Payment,
    Poison,
}

/// The planned traffic and what the account checks it against.
pub struct Plan {
    pub activity_id: i64,
    pub sku_id: i64,
    pub stock: i32,
    pub buckets: i16,
    pub messages: Vec<Outgoing>,
    /// Every reservation the plan sends (orders for any other are "unexpected").
    pub reservations: HashSet<Uuid>,
    /// The inbox id of every payment callback, by AMQP message id.
    pub payment_inbox: std::collections::HashMap<String, Uuid>,
}

impl Plan {
    pub fn new(shape: Shape, buyers: u32, activity_id: i64, settings: &AmqpSettings) -> Plan {
        let (stock, buckets) = match shape {
            Shape::Unique | Shape::Duplicates => ((buyers / 2).max(1) as i32, 8),
            Shape::HotSku => (500, 1),
            Shape::PaymentsRace => (buyers as i32, 4),
            Shape::Sale16 => (buyers as i32, 16),
        };
        let names = Names::new(&settings.namespace);
        let ids = IdGenerator::new(MAX_NODE_ID - 2);
        let mut rng = rand::rng();
        let now = Utc::now();
        let expire = match shape {
            // Long enough to be created and paid for, short enough to race.
            Shape::PaymentsRace => now + TimeDelta::seconds(6),
            _ => now + TimeDelta::hours(1),
        };
        let mut plan = Plan {
            activity_id,
            sku_id: 1,
            stock,
            buckets,
            messages: Vec::new(),
            reservations: HashSet::new(),
            payment_inbox: Default::default(),
        };
        let mut orders = Vec::new();
        for user in 1..=i64::from(buyers) {
            let order_id = ids
                .next_id()
                .expect("a generator without a lease always mints");
            let msg = OrderCreateMessage::pre_reserved(
                order_id,
                (activity_id, 1, user),
                rng.random_range(0..buckets),
                now,
                expire,
            );
            plan.reservations.insert(msg.reservation_id);
            let copies = match shape {
                Shape::Unique | Shape::PaymentsRace => 1,
                Shape::Sale16 => 1 + u32::from(rng.random_bool(0.1)),
                Shape::HotSku => rng.random_range(2..=4),
                Shape::Duplicates => rng.random_range(1..=3),
            };
            for _ in 0..copies {
                orders.push(msg.clone());
            }
            let resend = match shape {
                Shape::HotSku => rng.random_bool(0.3),
                Shape::Duplicates => rng.random_bool(1.0 / 3.0),
                _ => false,
            };
            if resend {
                orders.push(OrderCreateMessage {
                    message_id: Uuid::now_v7(),
                    ..msg.clone()
                });
            }
            if shape == Shape::PaymentsRace && rng.random_bool(0.7) {
                let cb = PaymentCallback {
                    schema_version: seckill_engine::domain::message::SCHEMA_VERSION,
                    payment_id: Uuid::now_v7(),
                    payment_request_id: Uuid::now_v7(),
                    order_id,
                    provider: "chaospay".into(),
                    provider_trade_no: format!("T{order_id}"),
                    callback_id: Uuid::now_v7().to_string(),
                    amount: msg.unit_price,
                    currency: "CNY".into(),
                    paid_at: expire,
                    raw: None,
                };
                let message_id = Uuid::now_v7().to_string();
                plan.payment_inbox
                    .insert(message_id.clone(), cb.inbox_message_id());
                // Around the expiry: some before, some after.
                let at = Duration::from_millis(rng.random_range(4_500..7_500));
                let route = names.payment_route();
                plan.messages.push(Outgoing {
                    message_id,
                    exchange: route.exchange,
                    routing_key: route.routing_key,
                    body: serde_json::to_vec(&cb).unwrap_or_default(),
                    kind: Kind::Payment,
                    at,
                });
            }
        }
        orders.shuffle(&mut rng);
        let poison = orders.len() / 100;
        for m in orders {
            let shard = shard_for(m.activity_id, m.sku_id, m.inventory_bucket, settings.shards);
            plan.messages.push(Outgoing {
                message_id: m.message_id.to_string(),
                exchange: names.orders_exchange(),
                routing_key: Names::order_routing_key(shard),
                body: serde_json::to_vec(&m).unwrap_or_default(),
                kind: Kind::Order,
                at: Duration::ZERO,
            });
        }
        // 1% poison, spread through the run: undecodable, or a field out of range.
        for i in 0..poison {
            let message_id = Uuid::now_v7().to_string();
            let body = if i % 2 == 0 {
                b"{\"message_id\": \"not json".to_vec()
            } else {
                let mut m = plan.sample_order(&ids, now, expire);
                m.unit_price = -1;
                serde_json::to_vec(&m).unwrap_or_default()
            };
            let position = rng.random_range(0..=plan.messages.len());
            plan.messages.insert(
                position,
                Outgoing {
                    message_id,
                    exchange: names.orders_exchange(),
                    routing_key: Names::order_routing_key(0),
                    body,
                    kind: Kind::Poison,
                    at: Duration::ZERO,
                },
            );
        }
        plan.messages.sort_by_key(|m| m.at);
        plan
    }

    fn sample_order(
        &self,
        ids: &IdGenerator,
        now: chrono::DateTime<Utc>,
        expire: chrono::DateTime<Utc>,
    ) -> OrderCreateMessage {
        OrderCreateMessage::pre_reserved(
            ids.next_id()
                .expect("a generator without a lease always mints"),
            (self.activity_id, self.sku_id, 1),
            0,
            now,
            expire,
        )
    }
}

/// What the publisher managed.
#[derive(Debug, Default)]
pub struct Published {
    /// Publish attempts, including retries after broker faults.
    pub attempts: u64,
    /// Message ids the broker confirmed (at least once).
    pub confirmed: HashSet<String>,
}

/// Publishes the plan at up to `rate` messages per second, each until confirmed
/// (reconnecting as needed) or until `deadline` passes.
pub async fn publish(
    settings: &AmqpSettings,
    messages: &[Outgoing],
    rate: u32,
    deadline: Duration,
) -> Published {
    let started = Instant::now();
    let mut out = Published::default();
    let mut publisher: Option<(lapin::Connection, ConfirmedPublisher)> = None;
    let window = 64;
    let mut next = 0;
    let mut sent = vec![false; messages.len()];
    while next < messages.len() && started.elapsed() < deadline {
        let now = started.elapsed();
        if let Some(wait) = messages[next].at.checked_sub(now).filter(|w| !w.is_zero()) {
            tokio::time::sleep(wait).await;
            continue;
        }
        let end = next
            + messages[next..]
                .iter()
                .take(window)
                .take_while(|m| m.at <= now)
                .count();
        let current = match &publisher {
            Some((conn, p)) if conn.status().connected() && p.channel().status().connected() => {
                p.clone()
            }
            _ => {
                let opened = async {
                    let conn =
                        seckill_engine::mq::connect(settings, "seckill-chaos-publisher").await?;
                    let p = ConfirmedPublisher::open(&conn).await?;
                    Ok::<_, seckill_engine::mq::MqError>((conn, p))
                };
                match opened.await {
                    Ok((conn, p)) => {
                        publisher = Some((conn, p.clone()));
                        p
                    }
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    }
                }
            }
        };
        // Per copy, not per id: the duplicates workload sends one id several times.
        let due: Vec<usize> = (next..end).filter(|i| !sent[*i]).collect();
        out.attempts += due.len() as u64;
        let sends = futures_util::future::join_all(due.iter().map(|i| {
            let m = &messages[*i];
            current.publish(
                &m.exchange,
                &m.routing_key,
                &m.body,
                seckill_engine::mq::message_properties(&m.message_id),
            )
        }));
        // A broker that stops answering must not stall the workload forever.
        let results = match tokio::time::timeout(Duration::from_secs(10), sends).await {
            Ok(results) => results,
            Err(_) => due
                .iter()
                .map(|_| Err(seckill_engine::mq::MqError::Nacked))
                .collect(),
        };
        let mut all_ok = true;
        for (i, r) in due.iter().zip(results) {
            match r {
                Ok(()) => {
                    sent[*i] = true;
                    out.confirmed.insert(messages[*i].message_id.clone());
                }
                Err(_) => all_ok = false,
            }
        }
        if all_ok {
            let pace = Duration::from_secs_f64((end - next) as f64 / f64::from(rate.max(1)));
            next = end;
            tokio::time::sleep(pace).await;
        } else {
            // Retry the unconfirmed ones of this window on a fresh channel.
            publisher = None;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    out
}
