//! The bucket actor owns all database work for one inventory row (activity, sku,
//! bucket): it runs that bucket's order transactions one at a time, so inside one
//! engine instance the hot row is never contended and never waits on a PostgreSQL row
//! lock. Group commit (many orders per transaction) will live here too.

use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;

use crate::domain::ids::IdGenerator;
use crate::domain::message::OrderCreateMessage;
use crate::domain::outcome::{ErrorClass, OrderOutcome, ResultCode};
use crate::store::orders::{create_order, load_bucket_sku, OrderTxContext};
use crate::store::{Pool, StoreError};

/// Identifies one inventory row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BucketKey {
    pub activity_id: i64,
    pub sku_id: i64,
    pub bucket: i16,
}

impl BucketKey {
    pub fn of(msg: &OrderCreateMessage) -> Self {
        Self {
            activity_id: msg.activity_id,
            sku_id: msg.sku_id,
            bucket: msg.inventory_bucket,
        }
    }
}

/// Settings shared by every bucket actor.
pub struct BucketShared {
    pub pool: Pool,
    pub ids: Arc<IdGenerator>,
    pub consumer_group: String,
    pub lock_timeout: String,
    pub statement_timeout: String,
    pub max_attempts: u32,
}

pub struct BucketActor {
    key: BucketKey,
    shared: Arc<BucketShared>,
    /// SKU title snapshot, loaded with the first order of this actor's life.
    sku_title: Option<String>,
}

/// Run the order transaction for one message of this bucket.
#[derive(Message)]
#[rtype(result = "Result<OrderOutcome, ErrorClass>")]
pub struct RunOrder {
    pub msg: OrderCreateMessage,
    /// The queue the message was consumed from (recorded in the inbox).
    pub topic: Arc<str>,
}

impl BucketActor {
    pub fn new(key: BucketKey, shared: Arc<BucketShared>) -> Self {
        Self {
            key,
            shared,
            sku_title: None,
        }
    }
}

impl Actor for BucketActor {
    type Context = Context<Self>;
}

impl Handler<RunOrder> for BucketActor {
    // Atomic: the next message waits until this transaction has ended.
    type Result = AtomicResponse<Self, Result<OrderOutcome, ErrorClass>>;

    fn handle(&mut self, run: RunOrder, _: &mut Self::Context) -> Self::Result {
        let shared = self.shared.clone();
        let key = self.key;
        let cached = self.sku_title.clone();
        let work = async move {
            let started = Instant::now();
            let result = run_order(&shared, key, cached, &run).await;
            let elapsed = started.elapsed();
            let msg = &run.msg;
            // The fields of seed §12.1; DEBUG, since it is one line per message.
            match &result {
                Ok(done) => {
                    let outcome = &done.outcome;
                    metrics::histogram!("seckill_order_tx_duration_seconds", "outcome" => outcome.label())
                        .record(elapsed.as_secs_f64());
                    tracing::debug!(
                        request_id = %msg.request_id, reservation_id = %msg.reservation_id,
                        message_id = %msg.message_id, order_id = outcome.order_id,
                        activity_id = key.activity_id, sku_id = key.sku_id, user_id = msg.user_id,
                        bucket = key.bucket, consumer_group = %shared.consumer_group,
                        attempt = done.attempts,
                        // The conditional stock UPDATE took a unit exactly when the
                        // message created its order.
                        affected_rows = u8::from(outcome.code == ResultCode::OrderCreated && !outcome.duplicate),
                        db_duration_ms = elapsed.as_millis() as u64,
                        pool_acquire_ms = done.pool_acquire.as_millis() as u64,
                        commit_result = outcome.label(),
                        "order transaction committed"
                    );
                }
                Err(e) => {
                    tracing::debug!(
                        request_id = %msg.request_id, reservation_id = %msg.reservation_id,
                        message_id = %msg.message_id, activity_id = key.activity_id,
                        sku_id = key.sku_id, user_id = msg.user_id, bucket = key.bucket,
                        consumer_group = %shared.consumer_group, sqlstate = e.sqlstate(),
                        db_duration_ms = elapsed.as_millis() as u64,
                        commit_result = e.class().label(), error = %e,
                        "order transaction failed"
                    );
                    metrics::histogram!("seckill_order_tx_duration_seconds", "outcome" => "error")
                        .record(elapsed.as_secs_f64());
                }
            }
            result
        };
        AtomicResponse::new(Box::pin(work.into_actor(self).map(
            |result, actor, _| match result {
                Ok(done) => {
                    actor.sku_title = Some(done.sku_title);
                    Ok(done.outcome)
                }
                Err(e) => Err(e.class()),
            },
        )))
    }
}

/// A committed order transaction and what it cost.
struct Done {
    outcome: OrderOutcome,
    sku_title: String,
    attempts: u32,
    pool_acquire: std::time::Duration,
}

async fn run_order(
    shared: &BucketShared,
    key: BucketKey,
    cached_title: Option<String>,
    run: &RunOrder,
) -> Result<Done, StoreError> {
    let acquire = Instant::now();
    let mut conn = shared.pool.get().await?;
    let pool_acquire = acquire.elapsed();
    metrics::histogram!("seckill_db_pool_acquire_seconds").record(pool_acquire.as_secs_f64());
    let title = match cached_title {
        Some(title) => title,
        None => load_bucket_sku(&mut conn, key.activity_id, key.sku_id, key.bucket)
            .await?
            .ok_or_else(|| {
                StoreError::Anomaly(format!(
                    "unknown inventory bucket (activity {}, sku {}, bucket {})",
                    key.activity_id, key.sku_id, key.bucket
                ))
            })?,
    };
    let ctx = OrderTxContext {
        consumer_group: shared.consumer_group.clone(),
        topic: run.topic.to_string(),
        sku_title: title.clone(),
        ledger_id: shared.ids.next_id(),
        lock_timeout: shared.lock_timeout.clone(),
        statement_timeout: shared.statement_timeout.clone(),
        max_attempts: shared.max_attempts,
    };
    let (outcome, attempts) = create_order(&mut conn, &ctx, &run.msg).await?;
    Ok(Done {
        outcome,
        sku_title: title,
        attempts,
        pool_acquire,
    })
}
