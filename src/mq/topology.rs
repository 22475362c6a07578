//! Exchange and queue names (all prefixed by the configured namespace) and their
//! idempotent declaration.
//!
//! ```text
//! {ns}.orders (direct) --order.create.{shard}--> {ns}.order.create.{shard}   quorum, single active consumer
//! {ns}.order.create.{shard}.retry   quorum, TTL = amqp.retry_delay_ms, dead-letters back to the shard
//! {ns}.dead (direct) --order.create--> {ns}.order.create.dead
//! {ns}.events (topic)                 outbox events (order.created, ...)
//! {ns}.payments (direct) --payment.callback--> {ns}.payment.callback   quorum
//! {ns}.payment.callback.delay         quorum, TTL, dead-letters back through {ns}.payments
//! {ns}.dead --payment.callback--> {ns}.payment.callback.dead
//! {ns}.retry (direct) --{queue}--> {queue}   each retry queue, by its own name
//! ```
//! Dead-lettering between quorum queues is at-least-once (RabbitMQ 3.10+), so a message
//! moving from the retry queue back to its shard cannot be lost on a broker failure.
//!
//! Every publish names an exchange of the namespace, never the default exchange: the
//! default exchange routes to any queue by its name, so a user allowed to write on it
//! can put an order on a shard queue (docs/DESIGN.md, "Broker identities"). Declaring
//! a queue whose dead-letter exchange is the default one needs write on it too, which
//! is why the payment retry queue is `.delay` and dead-letters through
//! `{ns}.payments`: the first releases' `{ns}.payment.callback.retry` dead-lettered
//! through the default exchange, and a queue's arguments cannot change. Left on an
//! upgraded broker, it drains into the callback queue by itself and can be deleted.

use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{Channel, ExchangeKind};

use super::MqError;

/// Where a publish goes: an exchange of the namespace and a routing key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub exchange: String,
    pub routing_key: String,
}

/// Every name the engine uses, derived from the namespace.
#[derive(Debug, Clone)]
pub struct Names {
    ns: String,
}

impl Names {
    pub fn new(namespace: &str) -> Self {
        Self {
            ns: namespace.to_owned(),
        }
    }
    pub fn orders_exchange(&self) -> String {
        format!("{}.orders", self.ns)
    }
    pub fn order_routing_key(shard: u16) -> String {
        format!("order.create.{shard}")
    }
    pub fn order_queue(&self, shard: u16) -> String {
        format!("{}.order.create.{shard}", self.ns)
    }
    pub fn order_retry_queue(&self, shard: u16) -> String {
        format!("{}.order.create.{shard}.retry", self.ns)
    }
    pub fn dead_exchange(&self) -> String {
        format!("{}.dead", self.ns)
    }
    pub fn order_dead_queue(&self) -> String {
        format!("{}.order.create.dead", self.ns)
    }
    pub fn events_exchange(&self) -> String {
        format!("{}.events", self.ns)
    }
    /// The exchange payment providers publish callbacks to.
    pub fn payments_exchange(&self) -> String {
        format!("{}.payments", self.ns)
    }
    /// The exchange the engine sends a delayed retry through (each retry queue is
    /// bound by its own name).
    pub fn retry_exchange(&self) -> String {
        format!("{}.retry", self.ns)
    }
    /// Where an order for `shard` is published.
    pub fn order_route(&self, shard: u16) -> Route {
        Route {
            exchange: self.orders_exchange(),
            routing_key: Self::order_routing_key(shard),
        }
    }
    /// Where a payment callback is published.
    pub fn payment_route(&self) -> Route {
        Route {
            exchange: self.payments_exchange(),
            routing_key: PAYMENT_ROUTING_KEY.to_owned(),
        }
    }
    /// Where a copy for `retry_queue` (one of the retry queues) is published.
    pub fn retry_route(&self, retry_queue: &str) -> Route {
        Route {
            exchange: self.retry_exchange(),
            routing_key: retry_queue.to_owned(),
        }
    }
    /// Where a dead order message is published.
    pub fn order_dead_route(&self) -> Route {
        Route {
            exchange: self.dead_exchange(),
            routing_key: DEAD_ROUTING_KEY.to_owned(),
        }
    }
    /// Where a dead payment callback is published.
    pub fn payment_dead_route(&self) -> Route {
        Route {
            exchange: self.dead_exchange(),
            routing_key: PAYMENT_DEAD_ROUTING_KEY.to_owned(),
        }
    }
    pub fn payment_queue(&self) -> String {
        format!("{}.payment.callback", self.ns)
    }
    pub fn payment_retry_queue(&self) -> String {
        format!("{}.payment.callback.delay", self.ns)
    }
    pub fn payment_dead_queue(&self) -> String {
        format!("{}.payment.callback.dead", self.ns)
    }
    /// Every queue of the order topology (for tests and tooling).
    pub fn order_queues(&self, shards: u16) -> Vec<String> {
        let mut queues = vec![
            self.order_dead_queue(),
            self.payment_queue(),
            self.payment_retry_queue(),
            self.payment_dead_queue(),
        ];
        for shard in 0..shards {
            queues.push(self.order_queue(shard));
            queues.push(self.order_retry_queue(shard));
        }
        queues
    }
    pub fn exchanges(&self) -> Vec<String> {
        vec![
            self.orders_exchange(),
            self.dead_exchange(),
            self.events_exchange(),
            self.payments_exchange(),
            self.retry_exchange(),
        ]
    }
}

const DEAD_ROUTING_KEY: &str = "order.create";
const PAYMENT_DEAD_ROUTING_KEY: &str = "payment.callback";
const PAYMENT_ROUTING_KEY: &str = "payment.callback";

fn text(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s.as_bytes().to_vec()))
}

fn quorum_args() -> FieldTable {
    let mut args = FieldTable::default();
    args.insert("x-queue-type".into(), text("quorum"));
    args
}

fn at_least_once_dead_letter(args: &mut FieldTable, exchange: &str, routing_key: &str) {
    args.insert("x-dead-letter-exchange".into(), text(exchange));
    args.insert("x-dead-letter-routing-key".into(), text(routing_key));
    args.insert("x-dead-letter-strategy".into(), text("at-least-once"));
    // at-least-once dead-lettering requires reject-publish overflow.
    args.insert("x-overflow".into(), text("reject-publish"));
}

fn durable() -> QueueDeclareOptions {
    QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    }
}

async fn bind(
    channel: &Channel,
    queue: &str,
    exchange: &str,
    routing_key: &str,
) -> Result<(), MqError> {
    channel
        .queue_bind(
            queue.into(),
            exchange.into(),
            routing_key.into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;
    Ok(())
}

/// A quorum dead-letter queue bound to the dead-letter exchange with `routing_key`.
async fn declare_dead_queue(
    channel: &Channel,
    names: &Names,
    queue: &str,
    routing_key: &str,
) -> Result<(), MqError> {
    channel
        .queue_declare(queue.into(), durable(), quorum_args())
        .await?;
    bind(channel, queue, &names.dead_exchange(), routing_key).await
}

/// A quorum retry queue whose messages dead-letter, after `ttl_ms`, to `exchange`
/// with `routing_key`: the delayed redelivery.
async fn declare_retry_queue(
    channel: &Channel,
    queue: &str,
    ttl_ms: u64,
    exchange: &str,
    routing_key: &str,
) -> Result<(), MqError> {
    let mut args = quorum_args();
    args.insert(
        "x-message-ttl".into(),
        AMQPValue::LongLongInt(i64::try_from(ttl_ms).unwrap_or(i64::MAX)),
    );
    at_least_once_dead_letter(&mut args, exchange, routing_key);
    channel.queue_declare(queue.into(), durable(), args).await?;
    Ok(())
}

/// Declares the order topology for `shards` shards. Idempotent: declaring again with
/// the same arguments is a no-op on the broker.
pub async fn declare_order_topology(
    channel: &Channel,
    names: &Names,
    shards: u16,
    retry_delay_ms: u64,
) -> Result<(), MqError> {
    let exchange_opts = ExchangeDeclareOptions {
        durable: true,
        ..ExchangeDeclareOptions::default()
    };
    for (name, kind) in [
        (names.orders_exchange(), ExchangeKind::Direct),
        (names.dead_exchange(), ExchangeKind::Direct),
        (names.events_exchange(), ExchangeKind::Topic),
        (names.payments_exchange(), ExchangeKind::Direct),
        (names.retry_exchange(), ExchangeKind::Direct),
    ] {
        channel
            .exchange_declare(
                name.as_str().into(),
                kind,
                exchange_opts,
                FieldTable::default(),
            )
            .await?;
    }

    declare_dead_queue(channel, names, &names.order_dead_queue(), DEAD_ROUTING_KEY).await?;

    for shard in 0..shards {
        let queue = names.order_queue(shard);
        let routing_key = Names::order_routing_key(shard);
        let mut args = quorum_args();
        // Several instances may consume a shard; only one is active, the others
        // stand by and RabbitMQ fails over to them.
        args.insert("x-single-active-consumer".into(), AMQPValue::Boolean(true));
        // A rejected message (fallback path of poison handling) goes to the DLQ.
        at_least_once_dead_letter(&mut args, &names.dead_exchange(), DEAD_ROUTING_KEY);
        channel
            .queue_declare(queue.as_str().into(), durable(), args)
            .await?;
        bind(channel, &queue, &names.orders_exchange(), &routing_key).await?;

        let retry_queue = names.order_retry_queue(shard);
        declare_retry_queue(
            channel,
            &retry_queue,
            retry_delay_ms,
            &names.orders_exchange(),
            &routing_key,
        )
        .await?;
        bind(channel, &retry_queue, &names.retry_exchange(), &retry_queue).await?;
    }
    Ok(())
}

/// Declares the payment-callback queues (after `declare_order_topology`, which
/// declares the dead-letter exchange). Idempotent.
pub async fn declare_payment_topology(
    channel: &Channel,
    names: &Names,
    retry_delay_ms: u64,
) -> Result<(), MqError> {
    declare_dead_queue(
        channel,
        names,
        &names.payment_dead_queue(),
        PAYMENT_DEAD_ROUTING_KEY,
    )
    .await?;
    let queue = names.payment_queue();
    let mut args = quorum_args();
    at_least_once_dead_letter(&mut args, &names.dead_exchange(), PAYMENT_DEAD_ROUTING_KEY);
    channel
        .queue_declare(queue.as_str().into(), durable(), args)
        .await?;
    let route = names.payment_route();
    bind(channel, &queue, &route.exchange, &route.routing_key).await?;
    let retry_queue = names.payment_retry_queue();
    declare_retry_queue(
        channel,
        &retry_queue,
        retry_delay_ms,
        &route.exchange,
        &route.routing_key,
    )
    .await?;
    bind(channel, &retry_queue, &names.retry_exchange(), &retry_queue).await?;
    Ok(())
}

/// Everything the engine consumes from or publishes to. Idempotent.
pub async fn declare_topology(
    channel: &Channel,
    settings: &crate::config::AmqpSettings,
) -> Result<(), MqError> {
    let names = Names::new(&settings.namespace);
    declare_order_topology(channel, &names, settings.shards, settings.retry_delay_ms).await?;
    declare_payment_topology(channel, &names, settings.retry_delay_ms).await
}
