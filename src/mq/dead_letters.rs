//! Operator tools for the dead-letter queues: list what is there and why, and replay
//! messages to the queue they came from once their cause is fixed.
//!
//! Both pull with `basic_get` on a channel of their own and never ack what they only
//! looked at: closing the channel hands every message not replayed back to its queue.
//! A replay publishes the original body and properties (so the original `message_id`,
//! which the inbox dedups on) without the dead-letter and retry headers, waits for the
//! broker's confirm, and only then acks the dead-letter copy: a crash in between leaves
//! both copies, and the inbox makes the second one harmless.
//!
//! Where a replay sends a message is the project's own record, never a header the
//! message carries (a header can be written by whoever published it): a payment
//! callback goes back to the payment queue, an `order.create` to the shard queue its
//! bucket maps to (`domain::shard`, the engine's shard count). A replay looks at each
//! message at most once: only the messages in the queue when it started (a replayed
//! message that fails again lands behind them and waits for the next replay).
//!
//! The inbox answers a message only within `retention.inbox_secs` of its processing
//! (the retention service deletes older rows), so a replay refuses a message first
//! published longer ago than that, unless forced, and says why: the inbox could no
//! longer tell whether it already had its effect.

use lapin::options::{BasicAckOptions, BasicGetOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection};
use serde::Serialize;

use super::publisher::ConfirmedPublisher;
use super::topology::{Names, Route};
use super::{
    int_header, text_header, unix_millis, MqError, DEAD_AT_HEADER, DEAD_KIND_HEADER,
    DEAD_REASON_HEADER, PUBLISHED_AT_HEADER, RETRIES_HEADER,
};
use crate::config::AmqpSettings;
use crate::domain::message::OrderCreateMessage;
use crate::domain::shard::shard_for;

/// Header a replayed message carries: when it was replayed (ms since the Unix epoch).
pub const REPLAYED_AT_HEADER: &str = "x-seckill-replayed-at-ms";
/// Header a replayed message carries: when it was first published (ms since the Unix
/// epoch), kept across replays; a replay's age check reads it.
pub const FIRST_PUBLISHED_AT_HEADER: &str = "x-seckill-first-published-at-ms";

/// One dead-lettered message, without its body.
#[derive(Debug, Clone, Serialize)]
pub struct DeadLetter {
    /// The dead-letter queue holding it.
    pub dead_queue: String,
    pub message_id: Option<String>,
    pub kind: Option<String>,
    pub reason: Option<String>,
    /// Where a replay sends it: the queue its kind and (for an order) its bucket map
    /// to; `None` when the body is not a message of its queue's kind.
    pub origin_queue: Option<String>,
    pub dead_at_ms: Option<i64>,
    /// When it was first published, where known (see `first_published_ms`).
    pub first_published_ms: Option<i64>,
    pub retries: i64,
    pub body_bytes: usize,
}

/// Which messages a replay takes.
#[derive(Debug, Clone)]
pub enum Selection {
    All,
    MessageId(String),
}

/// What a replay may send back: messages first published within the inbox window,
/// or any message when forced.
#[derive(Debug, Clone, Copy)]
pub struct ReplayGuard {
    /// `retention.inbox_secs`.
    pub inbox_window: std::time::Duration,
    pub force: bool,
}

/// What a replay did.
#[derive(Debug, Default, Clone, Serialize)]
pub struct ReplayReport {
    pub replayed: u64,
    /// How many went back to each queue.
    pub replayed_to: std::collections::BTreeMap<String, u64>,
    /// The message ids replayed (the first `MAX_LISTED`; all are counted).
    pub replayed_ids: Vec<String>,
    /// Selected messages left in place because their body is not a message of their
    /// dead-letter queue's kind: no queue would take them (they are listed in
    /// `refusals` with the reason).
    pub without_origin: u64,
    /// Selected messages left in place because the inbox could no longer dedup them.
    pub refused: u64,
    /// Why, for the first `MAX_REFUSALS` of them.
    pub refusals: Vec<Refusal>,
    /// Messages looked at and left in place.
    pub left: u64,
}

/// A selected message the replay left in place, and why.
#[derive(Debug, Clone, Serialize)]
pub struct Refusal {
    pub message_id: Option<String>,
    pub reason: String,
}

/// Refusals and replayed ids listed in one report at most (all are counted).
const MAX_REFUSALS: usize = 100;
const MAX_LISTED: usize = 100;

/// Lists up to `limit` messages of each dead-letter queue.
pub async fn list(settings: &AmqpSettings, limit: usize) -> Result<Vec<DeadLetter>, MqError> {
    let session = Session::open(settings).await?;
    let mut found = Vec::new();
    for queue in session.dead_queues() {
        for _ in 0..limit {
            let Some(got) = session.get(&queue).await? else {
                break;
            };
            found.push(session.describe(&queue, &got.delivery));
        }
    }
    session.close().await;
    Ok(found)
}

/// Replays the selected messages (up to `limit` looked at per dead-letter queue, and
/// never more than the queue held when the replay reached it).
pub async fn replay(
    settings: &AmqpSettings,
    selection: &Selection,
    limit: usize,
    guard: ReplayGuard,
) -> Result<ReplayReport, MqError> {
    let session = Session::open(settings).await?;
    let publisher = ConfirmedPublisher::open(&session.connection).await?;
    let mut report = ReplayReport::default();
    for queue in session.dead_queues() {
        let mut budget = limit;
        while budget > 0 {
            let Some(got) = session.get(&queue).await? else {
                break;
            };
            // What was behind this message when it was taken: a message replayed now
            // and dead-lettered again lands after them and is not taken twice.
            budget = (budget - 1).min(usize::try_from(got.message_count).unwrap_or(usize::MAX));
            let delivery = got.delivery;
            let letter = session.describe(&queue, &delivery);
            let selected = match selection {
                Selection::All => true,
                Selection::MessageId(id) => letter.message_id.as_deref() == Some(id.as_str()),
            };
            if !selected {
                report.left += 1;
                continue;
            }
            let (origin, route) = match session.origin(&queue, &delivery.data) {
                Ok(origin) => origin,
                Err(reason) => {
                    report.without_origin += 1;
                    report.refuse(letter.message_id, reason);
                    continue;
                }
            };
            if let Some(reason) = too_old(letter.first_published_ms, guard, unix_millis()) {
                report.refused += 1;
                report.refuse(letter.message_id, reason);
                continue;
            }
            publisher
                .publish(
                    &route.exchange,
                    &route.routing_key,
                    &delivery.data,
                    replay_properties(&delivery.properties),
                )
                .await?;
            delivery.acker.ack(BasicAckOptions::default()).await?;
            report.replayed += 1;
            *report.replayed_to.entry(origin).or_default() += 1;
            if let Some(id) = letter.message_id {
                if report.replayed_ids.len() < MAX_LISTED {
                    report.replayed_ids.push(id);
                }
            }
        }
    }
    session.close().await;
    Ok(report)
}

impl ReplayReport {
    fn refuse(&mut self, message_id: Option<String>, reason: String) {
        if self.refusals.len() < MAX_REFUSALS {
            self.refusals.push(Refusal { message_id, reason });
        }
    }
}

struct Session {
    connection: Connection,
    channel: Channel,
    names: Names,
    shards: u16,
}

impl Session {
    async fn open(settings: &AmqpSettings) -> Result<Self, MqError> {
        let connection = super::connect(settings, "seckill-admin").await?;
        let channel = connection.create_channel().await?;
        Ok(Self {
            connection,
            channel,
            names: Names::new(&settings.namespace),
            shards: settings.shards,
        })
    }

    /// The queue a message of `dead_queue` came from, as the project routes it: the
    /// payment queue, or the shard queue of the order's bucket. An error says why
    /// there is none.
    fn origin(&self, dead_queue: &str, body: &[u8]) -> Result<(String, Route), String> {
        if dead_queue == self.names.payment_dead_queue() {
            return Ok((self.names.payment_queue(), self.names.payment_route()));
        }
        let msg = OrderCreateMessage::decode(body).map_err(|poison| {
            format!(
                "not an order.create message ({}: {}): a replay would dead-letter it again",
                poison.kind, poison.detail
            )
        })?;
        let shard = shard_for(
            msg.activity_id,
            msg.sku_id,
            msg.inventory_bucket,
            self.shards,
        );
        Ok((self.names.order_queue(shard), self.names.order_route(shard)))
    }

    fn describe(&self, dead_queue: &str, delivery: &lapin::message::Delivery) -> DeadLetter {
        let props = &delivery.properties;
        DeadLetter {
            dead_queue: dead_queue.to_owned(),
            message_id: props.message_id().as_ref().map(|id| id.to_string()),
            kind: text_header(props, DEAD_KIND_HEADER),
            reason: text_header(props, DEAD_REASON_HEADER),
            origin_queue: self
                .origin(dead_queue, &delivery.data)
                .ok()
                .map(|(queue, _)| queue),
            dead_at_ms: int_header(props, DEAD_AT_HEADER),
            first_published_ms: first_published_ms(props),
            retries: int_header(props, RETRIES_HEADER).unwrap_or(0),
            body_bytes: delivery.data.len(),
        }
    }

    fn dead_queues(&self) -> [String; 2] {
        [
            self.names.order_dead_queue(),
            self.names.payment_dead_queue(),
        ]
    }

    async fn get(&self, queue: &str) -> Result<Option<lapin::message::BasicGetMessage>, MqError> {
        Ok(self
            .channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: false })
            .await?)
    }

    /// Closing returns every message taken and not acked to its queue.
    async fn close(self) {
        super::close(&self.connection, &[&self.channel]).await;
    }
}

/// When a message was first published: the header a replay keeps, else our
/// publishers' header, else the AMQP timestamp property (seconds).
fn first_published_ms(props: &BasicProperties) -> Option<i64> {
    int_header(props, FIRST_PUBLISHED_AT_HEADER)
        .or_else(|| int_header(props, PUBLISHED_AT_HEADER))
        .or_else(|| {
            props
                .timestamp()
                .and_then(|secs| i64::try_from(secs).ok())
                .map(|secs| secs.saturating_mul(1000))
        })
}

/// Why a message first published at `published_ms` may not be replayed at `now_ms`,
/// or `None` when it may.
fn too_old(published_ms: Option<i64>, guard: ReplayGuard, now_ms: i64) -> Option<String> {
    if guard.force {
        return None;
    }
    let window_ms = i64::try_from(guard.inbox_window.as_millis()).unwrap_or(i64::MAX);
    match published_ms {
        None => Some(
            "its first publication time is unknown, so the inbox may no longer dedup it; replay with force to send it anyway".into(),
        ),
        Some(at) if now_ms.saturating_sub(at) > window_ms => Some(format!(
            "first published {} s ago, beyond the inbox window of {} s (retention.inbox_secs): the inbox may no longer dedup it; replay with force to send it anyway",
            now_ms.saturating_sub(at) / 1000,
            window_ms / 1000
        )),
        Some(_) => None,
    }
}

/// The original properties without what dead-lettering and retries added.
fn replay_properties(props: &BasicProperties) -> BasicProperties {
    let mut headers = FieldTable::default();
    if let Some(original) = props.headers() {
        for (name, value) in original.inner() {
            let name = name.as_str();
            let added = name.starts_with("x-seckill-dead-")
                || name == RETRIES_HEADER
                || name.starts_with("x-death")
                || name.starts_with("x-first-death")
                || name.starts_with("x-last-death")
                || name == PUBLISHED_AT_HEADER;
            if !added {
                headers.insert(name.into(), value.clone());
            }
        }
    }
    let now = AMQPValue::LongLongInt(unix_millis());
    if let Some(first) = first_published_ms(props) {
        headers.insert(
            FIRST_PUBLISHED_AT_HEADER.into(),
            AMQPValue::LongLongInt(first),
        );
    }
    headers.insert(REPLAYED_AT_HEADER.into(), now.clone());
    headers.insert(PUBLISHED_AT_HEADER.into(), now);
    props.clone().with_headers(headers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_replay_refuses_what_the_inbox_can_no_longer_dedup() {
        let guard = ReplayGuard {
            inbox_window: Duration::from_secs(60),
            force: false,
        };
        let now = 1_000_000_000;
        assert_eq!(too_old(Some(now - 59_000), guard, now), None);
        let refused = too_old(Some(now - 61_000), guard, now).expect("refused");
        assert!(refused.contains("61 s ago"), "{refused}");
        assert!(refused.contains("retention.inbox_secs"), "{refused}");
        assert!(too_old(None, guard, now).is_some());
        let forced = ReplayGuard {
            force: true,
            ..guard
        };
        assert_eq!(too_old(Some(0), forced, now), None);
        assert_eq!(too_old(None, forced, now), None);
    }

    #[test]
    fn the_first_publication_time_survives_a_replay() {
        let mut headers = FieldTable::default();
        headers.insert(PUBLISHED_AT_HEADER.into(), AMQPValue::LongLongInt(42));
        let original = BasicProperties::default().with_headers(headers);
        let replayed = replay_properties(&original);
        assert_eq!(first_published_ms(&replayed), Some(42));
        assert_eq!(first_published_ms(&replay_properties(&replayed)), Some(42));
        let stamped = BasicProperties::default().with_timestamp(7);
        assert_eq!(first_published_ms(&stamped), Some(7_000));
    }
}
