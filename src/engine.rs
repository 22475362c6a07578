//! Builds the running engine from the settings: pool, schema check, AMQP topology, the
//! actors, and the supervisor of the long-lived children: one intake per owned shard,
//! the payment intake, and the background services. Must be started inside an actix `System`; the pool and the
//! AMQP connection are created on the calling (System) arbiter, which lives as long as
//! the engine.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use uuid::Uuid;

use crate::actors::bucket::{BucketActor, BucketKey, BucketShared};
use crate::actors::db_permits::DbPermits;
use crate::actors::intake::{Intake, IntakeConfig, IntakeWork, OrderWork, PaymentWork};
use crate::actors::registry::Registry;
use crate::actors::reservation::ReservationActor;
use crate::config::Settings;
use crate::domain::ids::IdGenerator;
use crate::mq::settlement::IntakeRoutes;
use crate::mq::topology::{declare_topology, Names};
use crate::mq::{self, MqError};
use crate::services::compensation_worker::{CompensationConfig, CompensationWorker};
use crate::services::gauges::GaugeSampler;
use crate::services::outbox_publisher::{OrderLoad, OutboxConfig, OutboxPublisher};
use crate::services::readiness::ReadinessMonitor;
use crate::services::reconciler::Reconciler;
use crate::services::runner::{Maintenance, Service};
use crate::services::supervisor::{ChildFactory, Shutdown, Supervisor};
use crate::services::sweeper::{Sweeper, SweeperConfig};
use crate::status::{IntakeStats, Readiness};
use crate::store::migrate::{self, MigrateError};
use crate::store::{build_pool, Pool, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("PostgreSQL: {0}")]
    Store(#[from] StoreError),
    #[error(transparent)]
    Schema(#[from] MigrateError),
    #[error("RabbitMQ: {0}")]
    Mq(#[from] MqError),
    #[error("only {consuming} of {expected} intakes started consuming within 15 s")]
    NotConsuming { consuming: usize, expected: usize },
}

impl From<lapin::Error> for EngineError {
    fn from(e: lapin::Error) -> Self {
        EngineError::Mq(MqError::Amqp(e))
    }
}

pub struct Engine {
    pool: Pool,
    stats: Arc<IntakeStats>,
    readiness: Arc<Readiness>,
    supervisor: Addr<Supervisor>,
    grace: Duration,
}

impl Engine {
    pub async fn start(settings: &Settings) -> Result<Engine, EngineError> {
        let pool = build_pool(&settings.database)?;
        {
            let mut conn = pool.get().await?;
            migrate::verify(&mut conn.client).await?;
        }

        // Fail fast on a broker that is unreachable or refuses our topology; the
        // intakes declare it again whenever they (re)connect.
        let amqp = mq::connect(&settings.amqp, "seckill-engine-setup").await?;
        let setup = amqp.create_channel().await?;
        declare_topology(&setup, &settings.amqp).await?;
        mq::close(&amqp, &[&setup]).await;
        let names = Names::new(&settings.amqp.namespace);

        let permits = DbPermits::new(settings.db_permits()).start();
        let shared = Arc::new(BucketShared {
            pool: pool.clone(),
            ids: IdGenerator::for_node(settings.engine.node_id),
            consumer_group: settings.amqp.consumer_group.clone(),
            lock_timeout: format!("{}ms", settings.database.lock_timeout_ms),
            statement_timeout: format!("{}ms", settings.database.statement_timeout_ms),
            max_attempts: settings.database.tx_max_attempts,
            batch_max_size: settings.engine.batch_max_size as usize,
            pipeline: settings.engine.bucket_pipeline as usize,
            tx_slots: tokio::sync::Semaphore::new(settings.engine.order_transactions as usize),
            speculation: Default::default(),
        });
        let buckets = Registry::new("bucket", move |key: &BucketKey| {
            BucketActor::new(*key, shared.clone()).start()
        })
        .start();
        let reservations = Registry::new("reservation", move |_: &Uuid| {
            ReservationActor::new(buckets.clone()).start()
        })
        .start();

        let stats = Arc::new(IntakeStats::default());
        let readiness = Arc::new(Readiness::default());
        let mut supervisor =
            background_services(settings, &pool, stats.clone()).child(ReadinessMonitor::NAME, {
                let (pool, redis, readiness) =
                    (pool.clone(), settings.redis.clone(), readiness.clone());
                child(move || {
                    ReadinessMonitor::new(
                        pool.clone(),
                        redis.clone(),
                        readiness.clone(),
                        Duration::from_secs(1),
                    )
                })
            });
        let intake = IntakeStarter {
            settings,
            permits: &permits,
            stats: &stats,
            readiness: &readiness,
        };
        for shard in settings.owned_shards() {
            let queue: Arc<str> = names.order_queue(shard).into();
            let work = OrderWork {
                reservations: reservations.clone(),
                topic: queue.clone(),
            };
            supervisor = supervisor.child(
                format!("intake:{queue}"),
                intake.child(
                    queue,
                    names.order_retry_queue(shard),
                    names.order_dead_queue(),
                    work,
                ),
            );
        }
        let payment_queue: Arc<str> = names.payment_queue().into();
        let work = PaymentWork {
            pool: pool.clone(),
            consumer_group: settings.payment.consumer_group.as_str().into(),
            topic: payment_queue.clone(),
        };
        supervisor = supervisor.child(
            format!("intake:{payment_queue}"),
            intake.child(
                payment_queue,
                names.payment_retry_queue(),
                names.payment_dead_queue(),
                work,
            ),
        );
        let intakes = settings.owned_shards().len() + 1;
        let supervisor = supervisor.start();
        // Ready means consuming: wait for every intake's first connection.
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        while stats.consuming() < intakes {
            if std::time::Instant::now() > deadline {
                supervisor.do_send(Shutdown);
                return Err(EngineError::NotConsuming {
                    consuming: stats.consuming(),
                    expected: intakes,
                });
            }
            actix_rt::time::sleep(Duration::from_millis(10)).await;
        }
        tracing::info!(
            shards = ?settings.owned_shards(),
            permits = settings.db_permits(),
            prefetch = settings.prefetch(),
            namespace = %settings.amqp.namespace,
            "engine ready"
        );
        Ok(Engine {
            pool,
            stats,
            readiness,
            supervisor,
            grace: Duration::from_millis(settings.shutdown.grace_ms),
        })
    }

    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Deliveries received and not yet settled, across all intakes.
    pub fn intake_stats(&self) -> Arc<IntakeStats> {
        self.stats.clone()
    }

    /// The flag the intakes follow (readiness and the operator's pause).
    pub fn readiness(&self) -> Arc<Readiness> {
        self.readiness.clone()
    }

    /// Drains: consumers are cancelled at once, the deliveries already taken get
    /// `shutdown.grace_ms` to settle, then the connections close (the broker
    /// requeues whatever is still unacked, and the inbox answers it on redelivery).
    /// The background services stop after their current run. Returns once the
    /// intakes have also sent their last acks and closed their connections (within
    /// another grace period): a process that exited before that had the broker
    /// redeliver what it settled last, which the inbox answers, but not a clean stop.
    pub async fn stop(self) {
        let _ = self.supervisor.send(Shutdown).await;
        let settled = self.stats.drained(self.grace).await;
        let closed = self.stats.closed(self.grace).await;
        if settled && closed {
            tracing::info!("engine stopped, every delivery settled");
        } else {
            tracing::warn!(
                in_flight = self.stats.in_flight(),
                closing = self.stats.consuming() + self.stats.closing(),
                "engine stopped with deliveries unsettled or connections still open after the grace period; they will be redelivered"
            );
        }
    }
}

/// What every intake needs, to make one supervised child per consumed queue.
struct IntakeStarter<'a> {
    settings: &'a Settings,
    permits: &'a Addr<DbPermits>,
    stats: &'a Arc<IntakeStats>,
    readiness: &'a Arc<Readiness>,
}

impl IntakeStarter<'_> {
    fn child<W: IntakeWork>(
        &self,
        queue: Arc<str>,
        retry_queue: String,
        dead_queue: String,
        work: W,
    ) -> ChildFactory {
        let config = IntakeConfig {
            name: format!("intake:{queue}"),
            amqp: self.settings.amqp.clone(),
            prefetch: self.settings.prefetch(),
            routes: IntakeRoutes {
                queue,
                retry_queue,
                dead_queue,
                max_retries: self.settings.amqp.max_retries,
                retry_delay: Duration::from_millis(self.settings.amqp.retry_delay_ms),
            },
            grace: Duration::from_millis(self.settings.shutdown.grace_ms),
        };
        let (stats, permits) = (self.stats.clone(), self.permits.clone());
        let readiness = self.readiness.clone();
        Box::new(move |supervisor| {
            Intake::new(
                config.clone(),
                stats.clone(),
                permits.clone(),
                work.clone(),
                Some(supervisor),
                readiness.clone(),
            )
            .start()
            .recipient()
        })
    }
}

/// The supervisor with the outbox publisher, the sweeper, the compensation worker,
/// the reconciler of Redis reservations and the gauge sampler; the outbox publisher
/// yields to the orders `load` counts.
pub fn background_services(
    settings: &Settings,
    pool: &Pool,
    load: Arc<dyn OrderLoad>,
) -> Supervisor {
    let ids = IdGenerator::for_node(settings.engine.node_id);
    let outbox = {
        let (pool, amqp) = (pool.clone(), settings.amqp.clone());
        let config = OutboxConfig::from(&settings.outbox);
        child(move || {
            OutboxPublisher::new(
                pool.clone(),
                amqp.clone(),
                config.clone(),
                Some(load.clone()),
            )
        })
    };
    let sweeper = {
        let pool = pool.clone();
        let config = SweeperConfig::new(&settings.sweeper, &settings.compensation);
        child(move || Sweeper::new(pool.clone(), ids.clone(), config.clone()))
    };
    let compensation = {
        let (pool, redis, amqp) = (pool.clone(), settings.redis.clone(), settings.amqp.clone());
        let config = CompensationConfig::from(&settings.compensation);
        child(move || {
            CompensationWorker::new(pool.clone(), redis.clone(), amqp.clone(), config.clone())
        })
    };
    let gauges = {
        let (pool, amqp) = (pool.clone(), settings.amqp.clone());
        let interval = Duration::from_millis(settings.telemetry.sample_interval_ms);
        child(move || GaugeSampler::new(pool.clone(), amqp.clone(), interval))
    };
    let reconciler = {
        let (pool, redis) = (pool.clone(), settings.redis.clone());
        let interval = Duration::from_millis(settings.frontstage.reconcile_interval_ms);
        let marker_ttl = settings.compensation.released_marker_ttl_secs;
        child(move || Reconciler::new(pool.clone(), redis.clone(), interval, marker_ttl))
    };
    Supervisor::new(
        Duration::from_millis(settings.supervisor.restart_base_ms),
        Duration::from_millis(settings.supervisor.restart_max_ms),
    )
    .child(OutboxPublisher::NAME, outbox)
    .child(Sweeper::NAME, sweeper)
    .child(CompensationWorker::NAME, compensation)
    .child(Reconciler::NAME, reconciler)
    .child(GaugeSampler::NAME, gauges)
}

/// A supervisor child that runs a fresh service from `make` on every (re)start.
pub fn child<S: Service>(make: impl Fn() -> S + 'static) -> ChildFactory {
    Box::new(move |supervisor| {
        Maintenance::new(make(), Some(supervisor))
            .start()
            .recipient()
    })
}
