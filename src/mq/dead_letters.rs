//! Operator tools for the dead-letter queues: list what is there and why, and replay
//! messages to the queue they came from once their cause is fixed.
//!
//! Both pull with `basic_get` on a channel of their own and never ack what they only
//! looked at: closing the channel hands every message not replayed back to its queue.
//! A replay publishes the original body and properties (so the original `message_id`,
//! which the inbox dedups on) without the dead-letter and retry headers, waits for the
//! broker's confirm, and only then acks the dead-letter copy: a crash in between leaves
//! both copies, and the inbox makes the second one harmless.

use lapin::options::{BasicAckOptions, BasicGetOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection};
use serde::Serialize;

use super::publisher::ConfirmedPublisher;
use super::topology::Names;
use super::{
    int_header, text_header, unix_millis, MqError, DEAD_AT_HEADER, DEAD_KIND_HEADER,
    DEAD_QUEUE_HEADER, DEAD_REASON_HEADER, PUBLISHED_AT_HEADER, RETRIES_HEADER,
};
use crate::config::AmqpSettings;

/// Header a replayed message carries: when it was replayed (ms since the Unix epoch).
pub const REPLAYED_AT_HEADER: &str = "x-seckill-replayed-at-ms";

/// One dead-lettered message, without its body.
#[derive(Debug, Clone, Serialize)]
pub struct DeadLetter {
    /// The dead-letter queue holding it.
    pub dead_queue: String,
    pub message_id: Option<String>,
    pub kind: Option<String>,
    pub reason: Option<String>,
    /// Where a replay sends it.
    pub origin_queue: Option<String>,
    pub dead_at_ms: Option<i64>,
    pub retries: i64,
    pub body_bytes: usize,
}

/// Which messages a replay takes.
#[derive(Debug, Clone)]
pub enum Selection {
    All,
    MessageId(String),
}

/// What a replay did.
#[derive(Debug, Default, Clone, Serialize)]
pub struct ReplayReport {
    pub replayed: u64,
    /// Selected messages left in place because they name no queue to go back to.
    pub without_origin: u64,
    /// Messages looked at and left in place.
    pub left: u64,
}

/// Lists up to `limit` messages of each dead-letter queue.
pub async fn list(settings: &AmqpSettings, limit: usize) -> Result<Vec<DeadLetter>, MqError> {
    let session = Session::open(settings).await?;
    let mut found = Vec::new();
    for queue in session.dead_queues() {
        for _ in 0..limit {
            let Some(got) = session.get(&queue).await? else {
                break;
            };
            found.push(describe(&queue, &got.delivery));
        }
    }
    session.close().await;
    Ok(found)
}

/// Replays the selected messages (up to `limit` looked at per dead-letter queue).
pub async fn replay(
    settings: &AmqpSettings,
    selection: &Selection,
    limit: usize,
) -> Result<ReplayReport, MqError> {
    let session = Session::open(settings).await?;
    let publisher = ConfirmedPublisher::open(&session.connection).await?;
    let mut report = ReplayReport::default();
    for queue in session.dead_queues() {
        for _ in 0..limit {
            let Some(got) = session.get(&queue).await? else {
                break;
            };
            let delivery = got.delivery;
            let letter = describe(&queue, &delivery);
            let selected = match selection {
                Selection::All => true,
                Selection::MessageId(id) => letter.message_id.as_deref() == Some(id.as_str()),
            };
            if !selected {
                report.left += 1;
                continue;
            }
            let Some(origin) = letter.origin_queue else {
                report.without_origin += 1;
                continue;
            };
            publisher
                .publish(
                    "",
                    &origin,
                    &delivery.data,
                    replay_properties(&delivery.properties),
                )
                .await?;
            delivery.acker.ack(BasicAckOptions::default()).await?;
            report.replayed += 1;
        }
    }
    session.close().await;
    Ok(report)
}

struct Session {
    connection: Connection,
    channel: Channel,
    names: Names,
}

impl Session {
    async fn open(settings: &AmqpSettings) -> Result<Self, MqError> {
        let connection = super::connect(settings, "seckill-admin").await?;
        let channel = connection.create_channel().await?;
        Ok(Self {
            connection,
            channel,
            names: Names::new(&settings.namespace),
        })
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

fn describe(dead_queue: &str, delivery: &lapin::message::Delivery) -> DeadLetter {
    let props = &delivery.properties;
    DeadLetter {
        dead_queue: dead_queue.to_owned(),
        message_id: props.message_id().as_ref().map(|id| id.to_string()),
        kind: text_header(props, DEAD_KIND_HEADER),
        reason: text_header(props, DEAD_REASON_HEADER),
        origin_queue: text_header(props, DEAD_QUEUE_HEADER).or_else(|| first_death_queue(props)),
        dead_at_ms: int_header(props, DEAD_AT_HEADER),
        retries: int_header(props, RETRIES_HEADER).unwrap_or(0),
        body_bytes: delivery.data.len(),
    }
}

/// A message the broker dead-lettered itself (our fallback when the dead-letter
/// publish failed) names its queue in `x-first-death-queue`.
fn first_death_queue(props: &BasicProperties) -> Option<String> {
    text_header(props, "x-first-death-queue")
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
    headers.insert(REPLAYED_AT_HEADER.into(), now.clone());
    headers.insert(PUBLISHED_AT_HEADER.into(), now);
    props.clone().with_headers(headers)
}
