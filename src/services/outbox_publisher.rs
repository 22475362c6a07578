//! The outbox publisher owns delivery of committed events to RabbitMQ (seed §9.8): it
//! takes back rows whose lease expired, claims a batch with `FOR UPDATE SKIP LOCKED`,
//! publishes them outside any transaction to the topic exchange with confirms
//! (AMQP message_id = event_id), and completes each row under its lease: SENT when
//! confirmed, RETRY with backoff or DEAD otherwise. Several publishers, in one or many
//! processes, run safely at once; a duplicate can only follow a lease expiry, and
//! consumers dedup by event_id.
//!
//! It yields to the order path: while orders are in flight (`OrderLoad`), it publishes
//! one batch per `busy_interval` instead of back to back, unless its backlog is
//! older than `max_lag`. A flash sale's burst then gets the cores PostgreSQL and
//! RabbitMQ share, and its events follow within seconds (docs/BENCHMARKS.md).

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::domain::backoff::backoff;
use futures_util::future::{join_all, LocalBoxFuture};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::BasicProperties;
use uuid::Uuid;

use super::runner::{LeaseRecovery, Outcome, Service, ServiceError};
use crate::config::{AmqpSettings, OutboxSettings};
use crate::mq;
use crate::mq::publisher::ConfirmedPublisher;
use crate::mq::reconnecting::Reconnecting;
use crate::status::IntakeStats;
use crate::store::outbox::{self, ClaimedEvent};
use crate::store::Pool;

/// Settings of one publisher (see `[outbox]` in config/default.toml).
#[derive(Debug, Clone)]
pub struct OutboxConfig {
    /// Pause between runs when nothing was waiting.
    pub interval: Duration,
    /// Rows claimed per run.
    pub batch_size: i64,
    /// Age after which a SENDING row is taken back.
    pub lease: Duration,
    /// First retry delay; doubles per attempt up to `backoff_max`.
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    /// While orders are in flight, runs start at least this far apart; zero never
    /// yields.
    pub busy_interval: Duration,
    /// A claimed event older than this ends the yielding until the backlog is
    /// younger.
    pub max_lag: Duration,
}

/// Whether the order path has work in flight; the publisher yields to it.
pub trait OrderLoad {
    fn busy(&self) -> bool;
}

impl OrderLoad for IntakeStats {
    fn busy(&self) -> bool {
        self.in_flight() > 0
    }
}

impl From<&OutboxSettings> for OutboxConfig {
    fn from(s: &OutboxSettings) -> Self {
        Self {
            interval: Duration::from_millis(s.interval_ms),
            batch_size: i64::from(s.batch_size),
            lease: Duration::from_millis(s.lease_ms),
            backoff_base: Duration::from_millis(s.backoff_base_ms),
            backoff_max: Duration::from_millis(s.backoff_max_ms),
            busy_interval: Duration::from_millis(s.busy_interval_ms),
            max_lag: Duration::from_millis(s.max_lag_ms),
        }
    }
}

pub struct OutboxPublisher {
    inner: Rc<Inner>,
}

struct Inner {
    pool: Pool,
    exchange: String,
    config: OutboxConfig,
    /// Written into `locked_by`: the fencing token of this publisher's leases.
    owner: String,
    /// Its confirm channel, on a connection of its own.
    publisher: Reconnecting<ConfirmedPublisher>,
    /// When to take back expired leases.
    recovery: LeaseRecovery,
    /// The order path this publisher yields to, if any.
    load: Option<Arc<dyn OrderLoad>>,
    /// When the last batch was claimed.
    last_claim: Cell<Option<Instant>>,
    /// The last claim found an event older than `max_lag`.
    lagging: Cell<bool>,
}

impl OutboxPublisher {
    /// A publisher that yields to `load` while it is busy (see the module docs), or
    /// never, without one.
    pub fn new(
        pool: Pool,
        amqp: AmqpSettings,
        config: OutboxConfig,
        load: Option<Arc<dyn OrderLoad>>,
    ) -> Self {
        let exchange = mq::topology::Names::new(&amqp.namespace).events_exchange();
        Self {
            inner: Rc::new(Inner {
                pool,
                exchange,
                recovery: LeaseRecovery::new(config.lease),
                config,
                owner: format!("outbox-{}", Uuid::now_v7()),
                publisher: Reconnecting::new(&amqp, "seckill-outbox"),
                load,
                last_claim: Cell::new(None),
                lagging: Cell::new(false),
            }),
        }
    }

    /// The lease owner name of this publisher.
    pub fn owner(&self) -> &str {
        &self.inner.owner
    }
}

impl Service for OutboxPublisher {
    const NAME: &'static str = "outbox_publisher";

    fn interval(&self) -> Duration {
        self.inner.config.interval
    }

    fn run_once(&self) -> LocalBoxFuture<'static, Result<Outcome, ServiceError>> {
        let inner = self.inner.clone();
        Box::pin(async move { inner.run_once().await })
    }
}

impl Inner {
    /// Whether this run gives way to the order path.
    fn yields(&self) -> bool {
        let busy = self.load.as_ref().is_some_and(|load| load.busy());
        let recent = self
            .last_claim
            .get()
            .is_some_and(|at| at.elapsed() < self.config.busy_interval);
        busy && recent && !self.lagging.get()
    }

    async fn run_once(&self) -> Result<Outcome, ServiceError> {
        if self.yields() {
            return Ok(Outcome::default());
        }
        let mut conn = self.pool.get().await?;
        let recovered = if self.recovery.due() {
            outbox::recover_expired_leases(&conn.client, self.config.lease).await?
        } else {
            0
        };
        let events = outbox::claim(&mut conn.client, &self.owner, self.config.batch_size).await?;
        let claimed = events.len();
        self.last_claim.set(Some(Instant::now()));
        let oldest = events.iter().map(|e| e.created_at).min();
        self.lagging.set(oldest.is_some_and(|created| {
            (chrono::Utc::now() - created)
                .to_std()
                .is_ok_and(|age| age > self.config.max_lag)
        }));
        let (mut sent, mut failed, mut dead) = (0u64, 0u64, 0u64);
        if !events.is_empty() {
            let results = match self.publisher.get().await {
                Ok(publisher) => publish_all(&publisher, &self.exchange, &events).await,
                Err(e) => events.iter().map(|_| Err(e.to_string())).collect(),
            };
            let mut confirmed = Vec::with_capacity(events.len());
            for (event, result) in events.iter().zip(results) {
                match result {
                    Ok(()) => confirmed.push(event.event_id),
                    Err(error) => {
                        failed += 1;
                        let backoff = self.backoff(event.retry_count);
                        let went_dead = outbox::mark_failed(
                            &conn.client,
                            event.event_id,
                            &self.owner,
                            backoff,
                            &error,
                        )
                        .await?;
                        if went_dead == Some(true) {
                            dead += 1;
                            tracing::error!(event_id = %event.event_id, error = %error, "outbox event is DEAD after its last retry; an operator must replay it");
                        }
                    }
                }
            }
            if failed > 0 {
                // Start from a fresh connection next time.
                self.publisher.reset().await;
            }
            if !confirmed.is_empty() {
                crate::failpoint!("outbox_after_confirm_before_sent");
            }
            sent = outbox::mark_sent(&conn.client, &confirmed, &self.owner).await?;
        }
        metrics::counter!(crate::telemetry::names::OUTBOX_PUBLISHED_TOTAL).increment(sent);
        metrics::counter!(crate::telemetry::names::OUTBOX_FAILURES_TOTAL).increment(failed);
        Ok(Outcome::default()
            .count("recovered", recovered)
            .count("sent", sent)
            .count("failed", failed)
            .count("dead", dead)
            .more(claimed as i64 >= self.config.batch_size && failed == 0))
    }

    /// The row's next retry delay: `domain::backoff` with this service's base and cap.
    fn backoff(&self, retry_count: i32) -> Duration {
        backoff(
            self.config.backoff_base,
            self.config.backoff_max,
            retry_count,
        )
    }
}

/// Publishes every event with confirms, all in flight at once.
pub async fn publish_all(
    publisher: &ConfirmedPublisher,
    exchange: &str,
    events: &[ClaimedEvent],
) -> Vec<Result<(), String>> {
    join_all(events.iter().map(|event| async move {
        let tag = event.tag.as_deref().unwrap_or("EVENT");
        let body = serde_json::to_vec(&event.payload).map_err(|e| e.to_string())?;
        let started = std::time::Instant::now();
        // Not mandatory: an event type nobody subscribes to yet is not a failure.
        let result = publisher
            .publish_with(
                exchange,
                &outbox::routing_key(tag),
                &body,
                properties(event, tag),
                false,
            )
            .await
            .map_err(|e| e.to_string());
        metrics::histogram!(crate::telemetry::names::OUTBOX_PUBLISH_DURATION_SECONDS)
            .record(started.elapsed().as_secs_f64());
        result
    }))
    .await
}

fn properties(event: &ClaimedEvent, tag: &str) -> BasicProperties {
    let text = |s: &str| AMQPValue::LongString(LongString::from(s.as_bytes().to_vec()));
    let mut headers = FieldTable::default();
    if let Some(map) = event.headers.as_object() {
        for (k, v) in map {
            let value = match v {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            headers.insert(k.as_str().into(), text(&value));
        }
    }
    headers.insert("x-event-type".into(), text(tag));
    headers.insert(
        "x-schema-version".into(),
        AMQPValue::LongInt(event.schema_version),
    );
    BasicProperties::default()
        .with_message_id(event.event_id.to_string().as_str().into())
        .with_content_type("application/json".into())
        .with_type(tag.into())
        .with_headers(headers)
}
