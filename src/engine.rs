//! Builds the running engine from the settings: pool, schema check, AMQP topology, the
//! actors (one intake per owned shard plus the payment intake), and the supervisor of
//! the background services. Must be started inside an actix `System`; the pool and the
//! AMQP connection are created on the calling (System) arbiter, which lives as long as
//! the engine.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use lapin::options::{BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use uuid::Uuid;

use crate::actors::bucket::{BucketActor, BucketKey, BucketShared};
use crate::actors::compensation_worker::{CompensationConfig, CompensationWorker};
use crate::actors::db_permits::DbPermits;
use crate::actors::intake::{
    Intake, IntakeRoutes, IntakeStats, IntakeWork, OrderWork, PaymentWork,
};
use crate::actors::maintenance::{Maintenance, Service};
use crate::actors::outbox_publisher::{OutboxConfig, OutboxPublisher};
use crate::actors::reconciler::Reconciler;
use crate::actors::registry::Registry;
use crate::actors::reservation::ReservationActor;
use crate::actors::supervisor::{ChildFactory, Shutdown, Supervisor};
use crate::actors::sweeper::{Sweeper, SweeperConfig};
use crate::config::Settings;
use crate::domain::ids::IdGenerator;
use crate::mq::publisher::ConfirmedPublisher;
use crate::mq::topology::{declare_order_topology, declare_payment_topology, Names};
use crate::mq::{self, MqError};
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
}

impl From<lapin::Error> for EngineError {
    fn from(e: lapin::Error) -> Self {
        EngineError::Mq(MqError::Amqp(e))
    }
}

pub struct Engine {
    pool: Pool,
    amqp: lapin::Connection,
    permits: Addr<DbPermits>,
    stats: Arc<IntakeStats>,
    reservations: Addr<Registry<Uuid, ReservationActor>>,
    supervisor: Addr<Supervisor>,
}

impl Engine {
    pub async fn start(settings: &Settings) -> Result<Engine, EngineError> {
        let pool = build_pool(&settings.database)?;
        {
            let mut conn = pool.get().await.map_err(StoreError::from)?;
            migrate::verify(&mut conn.client).await?;
        }

        let names = Names::new(&settings.amqp.namespace);
        let amqp = mq::connect(&settings.amqp, "seckill-engine").await?;
        let setup = amqp.create_channel().await?;
        declare_order_topology(
            &setup,
            &names,
            settings.amqp.shards,
            settings.amqp.retry_delay_ms,
        )
        .await?;
        declare_payment_topology(&setup, &names, settings.amqp.retry_delay_ms).await?;
        setup.close(200, "topology declared".into()).await?;

        let permits = DbPermits::new(settings.db_permits()).start();
        let shared = Arc::new(BucketShared {
            pool: pool.clone(),
            ids: IdGenerator::new(settings.engine.node_id),
            consumer_group: settings.amqp.consumer_group.clone(),
            lock_timeout: format!("{}ms", settings.database.lock_timeout_ms),
            statement_timeout: format!("{}ms", settings.database.statement_timeout_ms),
            max_attempts: settings.database.tx_max_attempts,
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
        let intake = IntakeStarter {
            amqp: &amqp,
            settings,
            permits: &permits,
            stats: &stats,
        };
        for shard in settings.owned_shards() {
            let queue: Arc<str> = names.order_queue(shard).into();
            let work = OrderWork {
                reservations: reservations.clone(),
                topic: queue.clone(),
            };
            intake
                .start(
                    queue,
                    names.order_retry_queue(shard),
                    names.order_dead_queue(),
                    work,
                )
                .await?;
        }
        let payment_queue: Arc<str> = names.payment_queue().into();
        let work = PaymentWork {
            pool: pool.clone(),
            consumer_group: settings.payment.consumer_group.as_str().into(),
            topic: payment_queue.clone(),
        };
        intake
            .start(
                payment_queue,
                names.payment_retry_queue(),
                names.payment_dead_queue(),
                work,
            )
            .await?;

        let supervisor = background_services(settings, &pool).start();
        tracing::info!(
            shards = ?settings.owned_shards(),
            permits = settings.db_permits(),
            prefetch = settings.prefetch(),
            namespace = %settings.amqp.namespace,
            "engine ready"
        );
        Ok(Engine {
            pool,
            amqp,
            permits,
            stats,
            reservations,
            supervisor,
        })
    }

    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    pub fn permits(&self) -> &Addr<DbPermits> {
        &self.permits
    }

    /// Deliveries received and not yet settled, across all intakes.
    pub fn intake_stats(&self) -> Arc<IntakeStats> {
        self.stats.clone()
    }

    pub fn reservations(&self) -> &Addr<Registry<Uuid, ReservationActor>> {
        &self.reservations
    }

    pub fn supervisor(&self) -> &Addr<Supervisor> {
        &self.supervisor
    }

    /// Stops the background services after their current run and closes the AMQP
    /// connection: the broker requeues every unacked delivery, and a transaction that
    /// commits after this point is answered by the inbox on redelivery.
    pub async fn stop(self) {
        let _ = self.supervisor.send(Shutdown).await;
        if let Err(e) = self.amqp.close(200, "engine stopping".into()).await {
            tracing::debug!(error = %e, "AMQP close");
        }
        tracing::info!("engine stopped");
    }
}

/// What every intake needs, to start one per consumed queue.
struct IntakeStarter<'a> {
    amqp: &'a lapin::Connection,
    settings: &'a Settings,
    permits: &'a Addr<DbPermits>,
    stats: &'a Arc<IntakeStats>,
}

impl IntakeStarter<'_> {
    async fn start<W: IntakeWork>(
        &self,
        queue: Arc<str>,
        retry_queue: String,
        dead_queue: String,
        work: W,
    ) -> Result<Addr<Intake<W>>, EngineError> {
        let channel = self.amqp.create_channel().await?;
        channel
            .basic_qos(self.settings.prefetch(), BasicQosOptions::default())
            .await?;
        let consumer = channel
            .basic_consume(
                queue.as_ref().into(),
                format!("seckill-engine-{}", Uuid::now_v7()).as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let routes = IntakeRoutes {
            queue,
            retry_queue,
            dead_queue,
            max_retries: self.settings.amqp.max_retries,
            retry_delay: Duration::from_millis(self.settings.amqp.retry_delay_ms),
        };
        let publisher = ConfirmedPublisher::open(self.amqp).await?;
        let permits = self.permits.clone();
        let stats = self.stats.clone();
        Ok(Intake::create(move |ctx| {
            ctx.add_stream(consumer);
            Intake::new(stats, routes, publisher, permits, work)
        }))
    }
}

/// The supervisor with the outbox publisher, the sweeper, the compensation worker
/// and the reconciler of Redis reservations.
pub fn background_services(settings: &Settings, pool: &Pool) -> Supervisor {
    let ids = Rc::new(IdGenerator::new(settings.engine.node_id));
    let outbox = {
        let (pool, amqp) = (pool.clone(), settings.amqp.clone());
        let config = OutboxConfig::from(&settings.outbox);
        child(move || OutboxPublisher::new(pool.clone(), amqp.clone(), config.clone()))
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
}

/// A supervisor child that runs a fresh service from `make` on every (re)start.
pub fn child<S: Service>(make: impl Fn() -> S + 'static) -> ChildFactory {
    Box::new(move |supervisor| {
        Maintenance::new(make(), Some(supervisor))
            .start()
            .recipient()
    })
}
