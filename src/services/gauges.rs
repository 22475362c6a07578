//! The gauge sampler owns the metrics that are states rather than events: the
//! outbox and compensation backlog and the age of their oldest row (PostgreSQL), the
//! depth of the dead-letter queues (RabbitMQ), and the connection pool's state. It
//! reads them on `telemetry.sample_interval_ms` and writes nothing; its runs are not
//! logged, since every run "does" something.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use futures_util::future::LocalBoxFuture;

use super::runner::{Outcome, Service, ServiceError};
use crate::config::AmqpSettings;
use crate::mq::topology::Names;
use crate::store::{ops, Pool};

pub struct GaugeSampler {
    inner: Rc<Inner>,
}

struct Inner {
    pool: Pool,
    amqp: AmqpSettings,
    dead_queues: Vec<String>,
    interval: Duration,
    /// Opened on first use and again after a failure.
    channel: RefCell<Option<(Rc<lapin::Connection>, lapin::Channel)>>,
}

impl GaugeSampler {
    pub fn new(pool: Pool, amqp: AmqpSettings, interval: Duration) -> Self {
        let names = Names::new(&amqp.namespace);
        Self {
            inner: Rc::new(Inner {
                pool,
                dead_queues: vec![names.order_dead_queue(), names.payment_dead_queue()],
                amqp,
                interval,
                channel: RefCell::new(None),
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

    async fn sample_dead_letters(&self) -> Result<(), ServiceError> {
        let existing = self.channel.borrow().clone();
        let (connection, channel) = match existing {
            Some(open) if open.1.status().connected() => open,
            _ => {
                let connection = crate::mq::connect(&self.amqp, "seckill-gauges").await?;
                let channel = connection.create_channel().await?;
                let open = (Rc::new(connection), channel);
                *self.channel.borrow_mut() = Some(open.clone());
                open
            }
        };
        let _keep_alive = connection;
        for queue in &self.dead_queues {
            let declared = crate::mq::queue_counts(&channel, queue).await;
            match declared {
                Ok(counts) => {
                    metrics::gauge!(crate::telemetry::names::DLQ_MESSAGES, "queue" => queue.clone())
                        .set(f64::from(counts.messages))
                }
                Err(e) => {
                    // A failed passive declare closes the channel; open a new one next run.
                    *self.channel.borrow_mut() = None;
                    return Err(e.into());
                }
            }
        }
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
            inner.sample_dead_letters().await?;
            Ok(Outcome::default())
        })
    }
}
