//! Builds the running engine from the settings: pool, schema check, AMQP topology, the
//! actors, one intake per owned shard. Must be started inside an actix `System`; the
//! pool and the AMQP connection are created on the calling (System) arbiter, which
//! lives as long as the engine.

use std::sync::Arc;

use actix::prelude::*;
use lapin::options::{BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use uuid::Uuid;

use crate::actors::bucket::{BucketActor, BucketKey, BucketShared};
use crate::actors::db_permits::DbPermits;
use crate::actors::intake::{Intake, IntakeRoutes, IntakeStats};
use crate::actors::registry::Registry;
use crate::actors::reservation::ReservationActor;
use crate::config::Settings;
use crate::domain::ids::IdGenerator;
use crate::mq::publisher::ConfirmedPublisher;
use crate::mq::topology::{declare_order_topology, Names};
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
    /// Each stops on its own when its consumer stream ends.
    _intakes: Vec<Addr<Intake>>,
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
        let mut intakes = Vec::new();
        for shard in settings.owned_shards() {
            let queue = names.order_queue(shard);
            let channel = amqp.create_channel().await?;
            channel
                .basic_qos(settings.prefetch(), BasicQosOptions::default())
                .await?;
            let consumer = channel
                .basic_consume(
                    queue.as_str().into(),
                    format!("seckill-engine-{}", Uuid::now_v7()).as_str().into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await?;
            let routes = IntakeRoutes {
                queue: queue.as_str().into(),
                retry_queue: names.order_retry_queue(shard),
                dead_queue: names.order_dead_queue(),
                max_retries: settings.amqp.max_retries,
                retry_delay: std::time::Duration::from_millis(settings.amqp.retry_delay_ms),
            };
            let publisher = ConfirmedPublisher::open(&amqp).await?;
            let permits = permits.clone();
            let reservations = reservations.clone();
            let stats = stats.clone();
            intakes.push(Intake::create(move |ctx| {
                ctx.add_stream(consumer);
                Intake::new(stats, routes, publisher, permits, reservations)
            }));
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
            amqp,
            permits,
            stats,
            reservations,
            _intakes: intakes,
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

    /// Closes the AMQP connection: the broker requeues every unacked delivery, and a
    /// transaction that commits after this point is answered by the inbox on
    /// redelivery.
    pub async fn stop(self) {
        if let Err(e) = self.amqp.close(200, "engine stopping".into()).await {
            tracing::debug!(error = %e, "AMQP close");
        }
        tracing::info!("engine stopped");
    }
}
