//! The gauge sampler owns the metrics that are states rather than events: the
//! outbox and compensation backlog and the age of their oldest row (PostgreSQL), the
//! depth of the dead-letter queues (RabbitMQ), the connection pool's state, and the
//! answers to "is the sale healthy?" (seed §12.2): the stock of each bucket of a
//! live sale, lock waits and deadlocks, the WAL position, dead rows and last vacuum
//! of each table, each standby's lag, and, every `telemetry.conservation_interval_ms`,
//! the stock invariants over the live sales. It reads them on
//! `telemetry.sample_interval_ms` and writes nothing; its runs are not logged, since
//! every run "does" something.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::LocalBoxFuture;

use super::runner::{Outcome, Service, ServiceError};
use crate::config::AmqpSettings;
use crate::mq::reconnecting::Reconnecting;
use crate::mq::topology::Names;
use crate::status::Live;
use crate::store::{health, invariants, ops, Pool};
use crate::telemetry::names;
use crate::telemetry::sampled::Series;

pub struct GaugeSampler {
    inner: Rc<Inner>,
}

struct Inner {
    pool: Pool,
    dead_queues: Vec<String>,
    interval: Duration,
    /// How often the stock invariants run, and when they last did.
    conservation_every: Duration,
    conservation_at: Cell<Option<Instant>>,
    /// Opened on first use and again after a failure.
    channel: Reconnecting<lapin::Channel>,
    /// Where the sampled series and the dead-letter depths go (the engine's).
    live: Arc<Live>,
}

impl GaugeSampler {
    pub fn new(
        pool: Pool,
        amqp: AmqpSettings,
        interval: Duration,
        conservation_every: Duration,
        live: Arc<Live>,
    ) -> Self {
        let names = Names::new(&amqp.namespace);
        Self {
            inner: Rc::new(Inner {
                pool,
                dead_queues: vec![names.order_dead_queue(), names.payment_dead_queue()],
                interval,
                conservation_every,
                conservation_at: Cell::new(None),
                channel: Reconnecting::new(&amqp, "seckill-gauges"),
                live,
            }),
        }
    }
}

impl Inner {
    fn sample_pool(&self) {
        let state = self.pool.state();
        metrics::gauge!(crate::telemetry::names::DB_POOL_CONNECTIONS, "state" => "idle")
            .set(f64::from(state.idle));
        metrics::gauge!(crate::telemetry::names::DB_POOL_CONNECTIONS, "state" => "in_use")
            .set(f64::from(state.connections.saturating_sub(state.idle)));
        metrics::gauge!(crate::telemetry::names::DB_POOL_WAITING).set(state.waiting as f64);
        metrics::counter!(crate::telemetry::names::DB_POOL_TIMEOUTS_TOTAL)
            .absolute(state.timed_out);
    }

    async fn sample_backlog(&self) -> Result<(), ServiceError> {
        let b = ops::backlog(&self.pool).await?;
        metrics::gauge!(crate::telemetry::names::OUTBOX_PENDING).set(b.outbox_pending as f64);
        metrics::gauge!(crate::telemetry::names::OUTBOX_OLDEST_PENDING_AGE_SECONDS)
            .set(b.outbox_oldest_pending_age_seconds);
        metrics::gauge!(crate::telemetry::names::OUTBOX_DEAD).set(b.outbox_dead as f64);
        metrics::gauge!(crate::telemetry::names::COMPENSATION_PENDING)
            .set(b.compensation_pending as f64);
        metrics::gauge!(crate::telemetry::names::COMPENSATION_OLDEST_PENDING_AGE_SECONDS)
            .set(b.compensation_oldest_pending_age_seconds);
        metrics::gauge!(crate::telemetry::names::COMPENSATION_MANUAL_REVIEW)
            .set(b.compensation_manual_review as f64);
        Ok(())
    }

    async fn sample_health(&self) -> Result<(), ServiceError> {
        let conn = self.pool.get().await?;
        let client = &conn.client;
        let buckets = health::live_buckets(client).await?;
        let labels = |b: &health::LiveBucket| {
            vec![
                ("activity", b.activity_id.to_string()),
                ("sku", b.sku_id.to_string()),
                ("bucket", b.bucket.to_string()),
            ]
        };
        let series = |value: fn(&health::LiveBucket) -> f64| {
            buckets
                .iter()
                .map(|b| Series::new(labels(b), value(b)))
                .collect::<Vec<_>>()
        };
        self.live.sampled().replace(
            names::BUCKET_AVAILABLE_UNITS,
            series(|b| f64::from(b.available)),
        );
        self.live.sampled().replace(
            names::BUCKET_ALLOCATED_UNITS,
            series(|b| f64::from(b.allocated)),
        );
        self.live.sampled().replace(
            names::BUCKET_SOLD_OUT,
            series(|b| if b.available == 0 { 1.0 } else { 0.0 }),
        );

        let waits = health::lock_waits(client).await?;
        metrics::gauge!(crate::telemetry::names::DB_LOCK_WAITING_SESSIONS)
            .set(waits.sessions as f64);
        metrics::gauge!(crate::telemetry::names::DB_LOCK_WAIT_MAX_SECONDS)
            .set(waits.longest_seconds);
        let stats = health::database_stats(client).await?;
        metrics::counter!(crate::telemetry::names::DB_DEADLOCKS_TOTAL)
            .absolute(u64::try_from(stats.deadlocks).unwrap_or(0));
        metrics::gauge!(crate::telemetry::names::DB_WAL_BYTES).set(stats.wal_bytes as f64);
        record_wal_archiving(&crate::store::wal::wal_archiving(client).await?);

        let tables = health::tables(client).await?;
        let table = |t: &crate::store::diagnose::TableHealth| vec![("table", t.table.clone())];
        self.live.sampled().replace(
            names::TABLE_DEAD_TUPLES,
            tables
                .iter()
                .map(|t| Series::new(table(t), t.dead_rows as f64))
                .collect(),
        );
        let now = chrono::Utc::now();
        self.live.sampled().replace(
            names::TABLE_LAST_VACUUM_AGE_SECONDS,
            tables
                .iter()
                .filter_map(|t| {
                    let age = (now - t.last_vacuum?).num_milliseconds() as f64 / 1000.0;
                    Some(Series::new(table(t), age.max(0.0)))
                })
                .collect(),
        );

        let standbys = health::standbys(client).await?;
        let standby = |s: &crate::store::diagnose::Standby| vec![("standby", s.name.clone())];
        self.live.sampled().replace(
            names::STANDBY_REPLAY_LAG_SECONDS,
            standbys
                .iter()
                .map(|s| Series::new(standby(s), s.replay_lag_seconds.unwrap_or(0.0)))
                .collect(),
        );
        self.live.sampled().replace(
            names::STANDBY_REPLAY_LAG_BYTES,
            standbys
                .iter()
                .map(|s| Series::new(standby(s), s.replay_bytes_behind.unwrap_or(0) as f64))
                .collect(),
        );

        let due = self
            .conservation_at
            .get()
            .is_none_or(|at| at.elapsed() >= self.conservation_every);
        if due {
            self.conservation_at.set(Some(Instant::now()));
            let mut violations = 0;
            for activity in health::live_activities(client).await? {
                violations += invariants::conservation_violations(client, activity).await?;
            }
            if violations > 0 {
                tracing::error!(
                    violations,
                    "stock invariants violated in a live sale: run `seckill-engine check`"
                );
            }
            metrics::gauge!(crate::telemetry::names::CONSERVATION_VIOLATIONS)
                .set(violations as f64);
        }
        Ok(())
    }

    async fn sample_dead_letters(&self) -> Result<(), ServiceError> {
        let channel = self.channel.get().await?;
        let mut depths = Vec::with_capacity(self.dead_queues.len());
        for queue in &self.dead_queues {
            let declared = crate::mq::queue_counts(&channel, queue).await;
            match declared {
                Ok(counts) => {
                    metrics::gauge!(crate::telemetry::names::DLQ_MESSAGES, "queue" => queue.clone())
                        .set(f64::from(counts.messages));
                    depths.push((queue.clone(), counts.messages));
                }
                Err(e) => {
                    // A failed passive declare closes the channel; open a new one
                    // (on a new connection) next run.
                    self.channel.reset().await;
                    return Err(e.into());
                }
            }
        }
        self.live.set_dead_letter_depths(depths);
        Ok(())
    }
}

impl Service for GaugeSampler {
    const NAME: &'static str = "gauges";

    fn interval(&self) -> Duration {
        self.inner.interval
    }

    fn run_once(&self) -> LocalBoxFuture<'static, Result<Outcome, ServiceError>> {
        let inner = self.inner.clone();
        Box::pin(async move {
            inner.sample_pool();
            inner.sample_backlog().await?;
            inner.sample_health().await?;
            inner.sample_dead_letters().await?;
            Ok(Outcome::default())
        })
    }
}

/// The archiver's and checkpointer's figures (`store::wal`), for the alerts on a
/// failing archive and on checkpoints forced by WAL volume.
fn record_wal_archiving(w: &crate::store::wal::WalArchiving) {
    use crate::telemetry::names;
    let flag = |on: bool| if on { 1.0 } else { 0.0 };
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    metrics::gauge!(names::DB_WAL_ARCHIVE_ENABLED).set(flag(w.enabled));
    metrics::counter!(names::DB_WAL_ARCHIVED_TOTAL).absolute(count(w.archived));
    metrics::counter!(names::DB_WAL_ARCHIVE_FAILED_TOTAL).absolute(count(w.failed));
    metrics::gauge!(names::DB_WAL_ARCHIVE_FAILING).set(flag(w.enabled && w.failing));
    if let Some(age) = w.since_success_seconds {
        metrics::gauge!(names::DB_WAL_ARCHIVE_LAST_SUCCESS_AGE_SECONDS).set(age);
    }
    if let Some(waiting) = w.segments_waiting {
        metrics::gauge!(names::DB_WAL_SEGMENTS_WAITING).set(waiting as f64);
    }
    metrics::counter!(names::DB_CHECKPOINTS_TIMED_TOTAL).absolute(count(w.checkpoints_timed));
    metrics::counter!(names::DB_CHECKPOINTS_REQUESTED_TOTAL)
        .absolute(count(w.checkpoints_requested));
}
