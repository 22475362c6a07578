//! The compensation worker owns carrying out compensation tasks outside PostgreSQL:
//! claims them with `FOR UPDATE SKIP LOCKED` under a lease, runs them (Redis stock
//! give-back, refund requests), and completes each under its lease: done, retry with
//! backoff, or dead. Every task is idempotent, so a task run twice (after a lease
//! expiry) changes nothing the second time.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use crate::domain::backoff::backoff;
use futures_util::future::LocalBoxFuture;
use lapin::BasicProperties;
use uuid::Uuid;

use super::runner::{Outcome, Service, ServiceError};
use crate::config::{AmqpSettings, CompensationSettings, RedisSettings};
use crate::domain::status::CompensationType;
use crate::mq::publisher::ConfirmedPublisher;
use crate::mq::reconnecting::Reconnecting;
use crate::mq::{self, MqError};
use crate::redis::keys::{PendingMember, SkuKeys};
use crate::redis::scripts;
use crate::store::compensation::{self, ClaimedTask};
use crate::store::Pool;

/// Settings of the worker (see `[compensation]` in config/default.toml).
#[derive(Debug, Clone)]
pub struct CompensationConfig {
    pub interval: Duration,
    pub batch_size: i64,
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    /// How long Redis remembers a reservation's give-back.
    pub released_marker_ttl_secs: u64,
}

impl From<&CompensationSettings> for CompensationConfig {
    fn from(s: &CompensationSettings) -> Self {
        Self {
            interval: Duration::from_millis(s.interval_ms),
            batch_size: i64::from(s.batch_size),
            backoff_base: Duration::from_millis(s.backoff_base_ms),
            backoff_max: Duration::from_millis(s.backoff_max_ms),
            released_marker_ttl_secs: s.released_marker_ttl_secs,
        }
    }
}

pub struct CompensationWorker {
    inner: Rc<Inner>,
}

struct Inner {
    pool: Pool,
    redis: RedisSettings,
    amqp: AmqpSettings,
    config: CompensationConfig,
    owner: String,
    redis_conn: RefCell<Option<::redis::aio::MultiplexedConnection>>,
    publisher: Reconnecting<ConfirmedPublisher>,
}

#[derive(Debug, thiserror::Error)]
enum TaskError {
    #[error("Redis: {0}")]
    Redis(#[from] ::redis::RedisError),
    #[error("RabbitMQ: {0}")]
    Mq(#[from] MqError),
    #[error("payload: {0}")]
    Payload(String),
}

/// What the Redis give-back needs from a task's payload.
#[derive(serde::Deserialize)]
struct GiveBack {
    reservation_id: Uuid,
    activity_id: i64,
    sku_id: i64,
    user_id: i64,
    inventory_bucket: i16,
    /// Names the reservation's pending member in Redis (`redis::keys::PendingMember`).
    #[serde(default)]
    request_id: Option<Uuid>,
}

impl CompensationWorker {
    pub fn new(
        pool: Pool,
        redis: RedisSettings,
        amqp: AmqpSettings,
        config: CompensationConfig,
    ) -> Self {
        Self {
            inner: Rc::new(Inner {
                pool,
                redis,
                publisher: Reconnecting::new(&amqp, "seckill-compensation"),
                amqp,
                config,
                owner: format!("compensation-{}", Uuid::now_v7()),
                redis_conn: RefCell::new(None),
            }),
        }
    }
}

impl Service for CompensationWorker {
    const NAME: &'static str = "compensation_worker";

    fn interval(&self) -> Duration {
        self.inner.config.interval
    }

    fn run_once(&self) -> LocalBoxFuture<'static, Result<Outcome, ServiceError>> {
        let inner = self.inner.clone();
        Box::pin(async move { inner.run_once().await })
    }
}

impl Inner {
    async fn run_once(&self) -> Result<Outcome, ServiceError> {
        let mut conn = self.pool.get().await?;
        let tasks =
            compensation::claim(&mut conn.client, &self.owner, self.config.batch_size).await?;
        let claimed = tasks.len();
        let (mut done, mut failed, mut dead, mut manual) = (0u64, 0u64, 0u64, 0u64);
        for task in &tasks {
            match self.run_task(task).await {
                Ok(true) => {
                    crate::failpoint!("compensation_after_redis_before_done");
                    compensation::mark_done(&conn.client, task.task_id, &self.owner).await?;
                    done += 1;
                }
                Ok(false) => {
                    compensation::mark_manual(
                        &conn.client,
                        task.task_id,
                        &self.owner,
                        "no worker carries out this task type",
                    )
                    .await?;
                    manual += 1;
                }
                Err(e) => {
                    failed += 1;
                    // Reconnect on the next attempt.
                    match e {
                        TaskError::Redis(_) => drop(self.redis_conn.borrow_mut().take()),
                        TaskError::Mq(_) => self.publisher.reset().await,
                        TaskError::Payload(_) => {}
                    }
                    let went_dead = compensation::mark_failed(
                        &conn.client,
                        task.task_id,
                        &self.owner,
                        self.backoff(task.retry_count),
                        &e.to_string(),
                    )
                    .await?;
                    if went_dead == Some(true) {
                        dead += 1;
                        tracing::error!(task_id = %task.task_id, task_type = task.task_type, error = %e, "compensation task is DEAD; an operator must act");
                    } else {
                        tracing::debug!(task_id = %task.task_id, error = %e, "compensation task failed; retrying later");
                    }
                }
            }
        }
        metrics::counter!(crate::telemetry::names::COMPENSATION_ATTEMPTS_TOTAL, "result" => "done")
            .increment(done);
        metrics::counter!(crate::telemetry::names::COMPENSATION_ATTEMPTS_TOTAL, "result" => "failed")
            .increment(failed);
        metrics::counter!(crate::telemetry::names::COMPENSATION_DEAD_TOTAL).increment(dead);
        Ok(Outcome::default()
            .count("done", done)
            .count("failed", failed)
            .count("dead", dead)
            .count("manual", manual)
            .more(claimed as i64 >= self.config.batch_size && failed == 0))
    }

    /// Ok(true): done; Ok(false): needs an operator.
    async fn run_task(&self, task: &ClaimedTask) -> Result<bool, TaskError> {
        match CompensationType::from_code(task.task_type) {
            Some(CompensationType::RedisStockRelease) => {
                let g: GiveBack = serde_json::from_value(task.payload.clone())
                    .map_err(|e| TaskError::Payload(e.to_string()))?;
                let keys = SkuKeys::new(&self.redis.key_prefix, g.activity_id, g.sku_id);
                let mut conn = self.redis().await?;
                let member = PendingMember {
                    reservation_id: g.reservation_id,
                    user_id: g.user_id,
                    bucket: g.inventory_bucket,
                    request_id: g.request_id,
                };
                let changed = scripts::give_back(
                    &mut conn,
                    &keys,
                    &member,
                    self.config.released_marker_ttl_secs,
                )
                .await?;
                metrics::counter!(crate::telemetry::names::REDIS_GIVE_BACK_TOTAL, "changed" => if changed { "yes" } else { "no" }).increment(1);
                Ok(true)
            }
            Some(CompensationType::Refund) => {
                // The payment system is outside the engine: ask it to refund, with
                // the task id as the message id so it can dedup.
                let publisher = self.publisher.get().await?;
                let names = mq::topology::Names::new(&self.amqp.namespace);
                let body = serde_json::to_vec(&task.payload)
                    .map_err(|e| TaskError::Payload(e.to_string()))?;
                publisher
                    .publish(
                        &names.events_exchange(),
                        "payment.refund_requested",
                        &body,
                        refund_request_properties(task.task_id),
                    )
                    .await?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn redis(&self) -> Result<::redis::aio::MultiplexedConnection, ::redis::RedisError> {
        let current = self.redis_conn.borrow().clone();
        if let Some(conn) = current {
            return Ok(conn);
        }
        let conn = crate::redis::connect(&self.redis).await?;
        *self.redis_conn.borrow_mut() = Some(conn.clone());
        Ok(conn)
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

/// A refund request's properties: the task id as the message id (the payment
/// system dedups by it), and its type and payload version as every event has
/// (docs/contracts/asyncapi.json).
fn refund_request_properties(task_id: uuid::Uuid) -> BasicProperties {
    use lapin::types::{AMQPValue, FieldTable, LongString};
    let mut headers = FieldTable::default();
    headers.insert(
        "x-event-type".into(),
        AMQPValue::LongString(LongString::from(&b"PAYMENT_REFUND_REQUESTED"[..])),
    );
    headers.insert(
        "x-schema-version".into(),
        AMQPValue::LongInt(crate::domain::events::EVENT_SCHEMA_VERSION),
    );
    BasicProperties::default()
        .with_message_id(task_id.to_string().as_str().into())
        .with_content_type("application/json".into())
        .with_type("PAYMENT_REFUND_REQUESTED".into())
        .with_headers(headers)
}
