//! Builds the running engine from the settings, in phases (`Engine::start` reads as
//! their list): the pipeline lanes and the pool, the schema and shard layout check, the
//! node id lease, the AMQP topology, the pipeline actors, the readiness flag, and the
//! supervisor of the long-lived children: the background services, the monitors, one
//! intake per owned shard and the payment intake. Must be started inside an actix
//! `System`; the pool and the AMQP connection are created on the calling (System)
//! arbiter, which lives as long as the engine. The listeners beside it are started by
//! `startup`.

use secrecy::ExposeSecret;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use uuid::Uuid;

use crate::actors::bucket::BucketShared;
use crate::actors::db_permits::DbPermits;
use crate::actors::intake::{Intake, IntakeConfig, IntakeWork, OrderWork, PaymentWork};
use crate::actors::lanes::{self, LaneRouter, Lanes};
use crate::config::Settings;
use crate::domain::ids::IdGenerator;
use crate::domain::shard::SHARD_FUNCTION_VERSION;
use crate::mq::settlement::IntakeRoutes;
use crate::mq::topology::{declare_topology, Names, Route};
use crate::mq::{self, MqError};
use crate::services::children::{background_services, child};
use crate::services::node_lease::{
    fence_after, NodeLeaseKeeper, LIVE_WINDOW, MARGIN as LEASE_MARGIN,
};
use crate::services::readiness::{ReadinessMonitor, CHECK_TIMEOUT};
use crate::services::runner::Service as _;
use crate::services::supervisor::{ChildFactory, Shutdown, Supervisor};
use crate::status::{IntakeStats, Live, Readiness};
use crate::store::migrate::{self, MigrateError};
use crate::store::node_lease::{self, Holder};
use crate::store::primary;
use crate::store::topology::{self, ShardLayout};
use crate::store::{build_pool_on, Pool, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("PostgreSQL: {0}")]
    Store(#[from] StoreError),
    #[error(transparent)]
    Schema(#[from] MigrateError),
    #[error("RabbitMQ: {0}")]
    Mq(#[from] MqError),
    #[error(
        "amqp.shards = {} routes with {ours}, but the database records {recorded}: the \
         queued messages were routed that way. Set amqp.shards = {}, or stop every \
         engine and front stage, let the order queues drain and run \
         `seckill-engine reshard --shards {}`",
        .ours.shards, .recorded.shards, .ours.shards
    )]
    ShardLayout {
        ours: ShardLayout,
        recorded: ShardLayout,
    },
    #[error(
        "engine.node_id = {node_id} is held by {holder} (renewed {renewed_ms_ago} ms ago); \
         leave engine.node_id unset to lease a free one"
    )]
    NodeIdHeld {
        node_id: u16,
        holder: String,
        renewed_ms_ago: i64,
    },
    #[error("no node id in 0..=1000 is free: every one is leased by a live instance")]
    NoFreeNodeId,
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
    ids: Arc<IdGenerator>,
    holder: Holder,
    /// Dropped last: the pipeline's threads stop with it.
    _lanes: Lanes,
}

impl Engine {
    /// Starts the engine phase by phase; each phase fails fast with what it found,
    /// before the next one depends on it.
    pub async fn start(settings: &Settings) -> Result<Engine, EngineError> {
        let live = follow_settings(settings);
        // Without the engine role (`server.roles`): no pipeline, no intake, no
        // background service of the engine's; the node lease and the monitors stay.
        let consumes = settings.server.engine();
        let threads = match consumes {
            true => lanes::threads(settings.engine.pipeline_threads),
            false => 1,
        };
        let lanes = Lanes::start(threads).await;
        // Its connections are opened and driven on the lanes' runtimes, in turn.
        let pool = build_pool_on(&settings.database, lanes.runtimes())?;
        let postgres_problem = check_postgres(&pool, settings).await?;
        let holder = Holder {
            id: Uuid::new_v4(),
            name: holder_name(settings),
            roles: settings.server.label(),
            consumes,
        };
        let ids = lease_node_id(&pool, settings, &holder, lease_ttl(settings)).await?;
        let names = match settings.server.front() || consumes {
            true => declare_broker_topology(settings).await?,
            false => Names::new(&settings.amqp.namespace),
        };
        let pipeline = consumes.then(|| start_pipeline(settings, &pool, &ids, &lanes, &live));
        let stats = Arc::new(IntakeStats::default());
        let readiness = initial_readiness(settings, &pool, &ids, postgres_problem, live).await?;
        let supervisor =
            background_services(settings, &pool, stats.clone(), ids.clone(), &readiness);
        let supervisor = with_monitors(supervisor, settings, &pool, &ids, &holder, &readiness);
        let (supervisor, intakes) = match pipeline {
            Some((permits, router)) => {
                let intake = IntakeStarter {
                    settings,
                    permits: &permits,
                    stats: &stats,
                    readiness: &readiness,
                };
                let intakes = settings.owned_shards().len() + 1;
                let supervisor = with_intakes(supervisor, &intake, &lanes, &names, router, &pool);
                (supervisor, intakes)
            }
            None => (supervisor, 0),
        };
        let supervisor = supervisor.start();
        wait_consuming(&supervisor, &stats, intakes).await?;
        wait_first_check(&readiness).await;
        tracing::info!(
            roles = %holder.roles,
            node_id = ids.node_id(),
            shards = ?settings.owned_shards(),
            pipeline_threads = lanes.count(),
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
            ids,
            holder,
            _lanes: lanes,
        })
    }

    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The id generator of the node id this engine leased (the front stage mints
    /// order ids with it too).
    pub fn ids(&self) -> Arc<IdGenerator> {
        self.ids.clone()
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
        // Give the node id back so that a restart need not wait for the TTL.
        self.ids.fence().stop();
        if let Ok(conn) = self.pool.get().await {
            let _ = node_lease::release(&conn.client, self.ids.node_id(), &self.holder).await;
        }
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

/// This engine's live figures, following the activities the settings name, and a
/// warning about a setting that weakens a promise: both before anything runs, so
/// the first orders are traced and logged.
fn follow_settings(settings: &Settings) -> Arc<Live> {
    let live = Arc::new(Live::default());
    live.traced()
        .follow_always(&settings.telemetry.trace_activities);
    if settings.retention.inbox_secs < 86_400 {
        // Allowed (tests use seconds), but a redelivery or replay older than this
        // is no longer answered by the inbox (docs/OPERATIONS.md, "Retention").
        tracing::warn!(
            inbox_secs = settings.retention.inbox_secs,
            "retention.inbox_secs is under a day"
        );
    }
    live
}

/// The node id lease's time to live (`engine.node_lease_ttl_ms`).
fn lease_ttl(settings: &Settings) -> Duration {
    Duration::from_millis(settings.engine.node_lease_ttl_ms)
}

/// Refuses a database whose schema or shard layout is not ours; returns why the
/// primary cannot take orders yet, if it cannot (the engine then starts not ready).
async fn check_postgres(pool: &Pool, settings: &Settings) -> Result<Option<String>, EngineError> {
    // A server that refuses every connection (a certificate the CA did not
    // sign, a wrong password) shows as a pool timeout: say why instead.
    let mut conn = pool
        .get()
        .await
        .map_err(|e| match (e, pool.connect_error()) {
            (StoreError::PoolTimeout, Some(why)) => StoreError::NotOpened(why),
            (e, _) => e,
        })?;
    migrate::verify(&mut conn.client).await?;
    let ours = ShardLayout {
        shard_function: SHARD_FUNCTION_VERSION,
        shards: settings.amqp.shards,
    };
    let recorded = topology::record_or_read(&conn.client, ours)
        .await
        .map_err(StoreError::Db)?;
    if recorded != ours {
        return Err(EngineError::ShardLayout { ours, recorded });
    }
    // What an acknowledged order's durability rests on (seed §14.3).
    let state = primary::primary_state(&conn.client).await?;
    // What other clients of this database get: said, then overridden (the engine's
    // sessions commit with on, `store::target`). Not knowing it stops nothing.
    let default = match primary::default_synchronous_commit(&settings.database).await {
        Ok(default) => primary::durability_note(&default)
            .unwrap_or_else(|| "synchronous_commit = on by default here too".to_owned()),
        Err(e) => format!("the default synchronous_commit could not be read: {e}"),
    };
    tracing::info!(
        primary = %state.server,
        timeline = state.timeline,
        durability = %state.describe(),
        default = %default,
        require_sync_standby = settings.database.require_sync_standby,
        "connected to the primary"
    );
    Ok(state.problem(
        settings.database.require_sync_standby,
        settings.database.commit_stall(),
    ))
}

/// Fails fast on a broker that is unreachable or refuses our topology; the intakes
/// declare it again whenever they (re)connect.
async fn declare_broker_topology(settings: &Settings) -> Result<Names, EngineError> {
    let amqp = mq::connect(&settings.amqp, "seckill-engine-setup").await?;
    let setup = amqp.create_channel().await?;
    declare_topology(&setup, &settings.amqp).await?;
    mq::close(&amqp, &[&setup]).await;
    Ok(Names::new(&settings.amqp.namespace))
}

/// The order pipeline on the lanes: the DB permits, and the bucket and reservation
/// actors every order intake hands its deliveries to (through the router).
fn start_pipeline(
    settings: &Settings,
    pool: &Pool,
    ids: &Arc<IdGenerator>,
    lanes: &Lanes,
    live: &Arc<Live>,
) -> (Addr<DbPermits>, LaneRouter) {
    let permits = DbPermits::new(settings.db_permits()).start();
    let shared = Arc::new(BucketShared {
        pool: pool.clone(),
        ids: ids.clone(),
        consumer_group: settings.amqp.consumer_group.clone(),
        lock_timeout: format!("{}ms", settings.database.lock_timeout_ms),
        statement_timeout: format!("{}ms", settings.database.statement_timeout_ms),
        max_attempts: settings.database.tx_max_attempts,
        batch_max_size: settings.engine.batch_max_size as usize,
        pipeline: settings.engine.bucket_pipeline as usize,
        tx_slots: tokio::sync::Semaphore::new(settings.engine.order_transactions as usize),
        speculation: Default::default(),
        live: live.clone(),
    });
    let router = lanes.start_pipeline(shared);
    (permits, router)
}

/// The readiness flag as the engine starts: what the primary allows and which
/// shards this node ranks for among the live ones, before any intake consults it.
async fn initial_readiness(
    settings: &Settings,
    pool: &Pool,
    ids: &Arc<IdGenerator>,
    postgres_problem: Option<String>,
    live: Arc<Live>,
) -> Result<Arc<Readiness>, EngineError> {
    let readiness = Arc::new(Readiness::new(live));
    readiness.watch_minting(ids.clone());
    // Not ready from the start when the primary cannot take orders (the
    // monitor clears it once it can).
    if let Some(problem) = postgres_problem {
        tracing::warn!(postgres = %problem, "not ready; intakes wait");
        readiness.set_ready(false);
        readiness.set_postgres(Some(problem));
    }
    // Shards by lease rank unless listed by hand; the ranks as of now.
    readiness
        .shards()
        .steer(settings.amqp.owned_shards.is_empty());
    let conn = pool.get().await?;
    let window = LIVE_WINDOW.min(lease_ttl(settings));
    let window_ms = i64::try_from(window.as_millis()).unwrap_or(i64::MAX);
    let live = node_lease::live_node_ids(&conn.client, window_ms)
        .await
        .map_err(StoreError::Db)?;
    let (peers, rank) = node_lease::rank_of(&live, ids.node_id());
    readiness.shards().set_peers(peers, rank);
    Ok(readiness)
}

/// Adds the monitors the readiness flag follows: the node id lease keeper (no
/// minting without a lease) and the readiness prober of PostgreSQL and Redis.
fn with_monitors(
    supervisor: Supervisor,
    settings: &Settings,
    pool: &Pool,
    ids: &Arc<IdGenerator>,
    holder: &Holder,
    readiness: &Arc<Readiness>,
) -> Supervisor {
    let lease_ttl = lease_ttl(settings);
    supervisor
        .child(NodeLeaseKeeper::NAME, {
            let (pool, ids, holder) = (pool.clone(), ids.clone(), holder.clone());
            let readiness = readiness.clone();
            child(move || {
                NodeLeaseKeeper::new(
                    pool.clone(),
                    ids.clone(),
                    holder.clone(),
                    lease_ttl,
                    readiness.clone(),
                )
            })
        })
        .child(ReadinessMonitor::NAME, {
            let (pool, database, redis, readiness) = (
                pool.clone(),
                settings.database.clone(),
                settings.redis.clone(),
                readiness.clone(),
            );
            child(move || {
                ReadinessMonitor::new(
                    pool.clone(),
                    database.clone(),
                    redis.clone(),
                    readiness.clone(),
                    Duration::from_secs(1),
                )
            })
        })
}

/// Adds one intake per owned shard's order queue and the payment intake: the
/// engine's only inputs, supervised so that a lost connection is reopened.
fn with_intakes(
    mut supervisor: Supervisor,
    intake: &IntakeStarter<'_>,
    lanes: &Lanes,
    names: &Names,
    router: LaneRouter,
    pool: &Pool,
) -> Supervisor {
    let settings = intake.settings;
    // The intakes in turn over the lanes: shard s on lane s mod lanes, which is
    // where its buckets are whenever the lanes divide the shards.
    let owned = settings.owned_shards();
    let signing_secret: Option<Arc<[u8]>> = settings
        .amqp
        .order_signing_secret
        .as_ref()
        .map(|s| Arc::from(s.expose_secret().as_bytes()));
    for shard in owned.iter().copied() {
        let queue: Arc<str> = names.order_queue(shard).into();
        let work = OrderWork {
            lanes: router.clone(),
            topic: queue.clone(),
            live: intake.readiness.live().clone(),
            signing_secret: signing_secret.clone(),
        };
        supervisor = supervisor.child(
            format!("intake:{queue}"),
            intake.child(
                lanes.arbiter(usize::from(shard)),
                queue,
                Some(shard),
                names.retry_route(&names.order_retry_queue(shard)),
                names.order_dead_route(),
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
    supervisor.child(
        format!("intake:{payment_queue}"),
        intake.child(
            lanes.arbiter(owned.len()),
            payment_queue,
            None,
            names.retry_route(&names.payment_retry_queue()),
            names.payment_dead_route(),
            work,
        ),
    )
}

/// Ready means consuming: waits for every intake's first connection, and stops the
/// supervisor if they do not all come within 15 s.
async fn wait_consuming(
    supervisor: &Addr<Supervisor>,
    stats: &IntakeStats,
    intakes: usize,
) -> Result<(), EngineError> {
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
    Ok(())
}

/// Waits for the readiness monitor's first findings (its checks take
/// `CHECK_TIMEOUT` each at most), so that the listeners started next show them
/// from their first answer; a monitor that has not answered by then is logged and
/// the start goes on.
async fn wait_first_check(readiness: &Readiness) {
    if !readiness.checked(CHECK_TIMEOUT * 3).await {
        tracing::warn!("the readiness monitor has not checked the dependencies yet");
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
        arbiter: Option<ArbiterHandle>,
        queue: Arc<str>,
        shard: Option<u16>,
        retry: Route,
        dead: Route,
        work: W,
    ) -> ChildFactory {
        let config = IntakeConfig {
            name: format!("intake:{queue}"),
            shard,
            amqp: self.settings.amqp.clone(),
            prefetch: self.settings.prefetch(),
            routes: IntakeRoutes {
                queue,
                retry,
                dead,
                max_retries: self.settings.amqp.max_retries,
                retry_delay: Duration::from_millis(self.settings.amqp.retry_delay_ms),
            },
            grace: Duration::from_millis(self.settings.shutdown.grace_ms),
        };
        let (stats, permits) = (self.stats.clone(), self.permits.clone());
        let readiness = self.readiness.clone();
        Box::new(move |supervisor| {
            let (config, stats, permits) = (config.clone(), stats.clone(), permits.clone());
            let (work, readiness) = (work.clone(), readiness.clone());
            let make =
                move || Intake::new(config, stats, permits, work, Some(supervisor), readiness);
            match &arbiter {
                Some(arbiter) => Intake::start_in_arbiter(arbiter, move |_| make()).recipient(),
                None => make().start().recipient(),
            }
        })
    }
}

/// Leases this engine's node id (explicit or the lowest free one) and returns its
/// generator with the mint fence set from the lease.
async fn lease_node_id(
    pool: &Pool,
    settings: &Settings,
    holder: &Holder,
    ttl: Duration,
) -> Result<Arc<IdGenerator>, EngineError> {
    let takeover_ms = i64::try_from((ttl + LEASE_MARGIN).as_millis()).unwrap_or(i64::MAX);
    let conn = pool.get().await?;
    let started = std::time::Instant::now();
    let node_id = match settings.engine.node_id {
        Some(node_id) => {
            match node_lease::acquire(&conn.client, node_id, holder, takeover_ms)
                .await
                .map_err(StoreError::Db)?
            {
                Ok(()) => node_id,
                Err(held) => {
                    return Err(EngineError::NodeIdHeld {
                        node_id,
                        holder: held.holder_name,
                        renewed_ms_ago: held.renewed_ms_ago,
                    })
                }
            }
        }
        None => {
            let mut leased = None;
            // Instances starting together race for the lowest free id; a loser
            // finds the winner's row and tries the next one.
            for _ in 0..20 {
                leased = node_lease::acquire_any(&conn.client, holder, takeover_ms)
                    .await
                    .map_err(StoreError::Db)?;
                if leased.is_some() {
                    break;
                }
                actix_rt::time::sleep(Duration::from_millis(50)).await;
            }
            leased.ok_or(EngineError::NoFreeNodeId)?
        }
    };
    // One generator for everything this engine mints (bucket actors, sweeper, front
    // stage): two generators of one node would repeat an id within a millisecond.
    let ids = Arc::new(IdGenerator::new(node_id));
    ids.fence().allow_until(fence_after(started, ttl));
    Ok(ids)
}

/// Who holds a lease, for people: host, process and admin address.
fn holder_name(settings: &Settings) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown host".into());
    format!(
        "{host} pid {} (admin {})",
        std::process::id(),
        settings.admin.addr
    )
}
