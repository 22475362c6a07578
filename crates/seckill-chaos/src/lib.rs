//! The fault-injection harness (`seckill-chaos`; the engine's failpoints need its
//! feature `chaos`): runs the
//! engine as separate processes against private PostgreSQL, RabbitMQ and Redis
//! instances, drives a workload, injects one kind of fault on a schedule, waits for
//! everything to drain, and accounts for every message the way Jepsen's queue and bank
//! checkers do: lost, duplicated, unexpected, oversold, conservation, dead-lettered.

mod account;
mod cluster;
mod workload;

use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use anyhow::Context;
use figment::providers::Serialized;
use rand::Rng;

pub use account::Account;
use cluster::{Cluster, EngineProc, Extra, HaTopology, ServiceTopology};
use workload::{Plan, Shape};

use seckill_engine::config::{self, Settings};
use seckill_engine::store;

/// `seckill-chaos`.
#[derive(Debug, clap::Args)]
pub struct ChaosArgs {
    /// `short` (a few scenarios, small workloads: CI) or `full` (every scenario).
    #[arg(long, default_value = "short")]
    pub profile: Profile,
    /// Run only these scenarios (names as in the report).
    #[arg(long)]
    pub scenario: Vec<String>,
    /// Write the account as a Markdown report to this file.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Where the private services keep their data (default: a new temporary dir).
    #[arg(long)]
    pub services_dir: Option<PathBuf>,
    /// The engine binary, built with `--features chaos` (default: `seckill-engine`
    /// next to this executable).
    #[arg(long)]
    pub engine: Option<PathBuf>,
    /// `scripts/services` of the repository (default: found in the working directory
    /// or above it).
    #[arg(long)]
    pub services_script: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Profile {
    Short,
    Full,
}

/// One kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    None,
    /// SIGKILL the engine every 2–5 s and start it again.
    SigKill,
    /// SIGSTOP one of two engines for longer than the leases, then SIGCONT.
    SigStop,
    /// `pg_terminate_backend` of every engine connection, every second.
    PgTerminate,
    /// PostgreSQL `stop -m immediate`, then started again.
    PgCrash,
    /// RabbitMQ `close_all_connections` every 3 s.
    RabbitClose,
    /// RabbitMQ `stop_app` / `start_app`.
    RabbitRestart,
    /// Redis `CLIENT PAUSE` for 2.5 s every 4 s.
    RedisPause,
    /// Redis killed (its data is gone: it keeps nothing on disk) and started again.
    RedisKill,
    /// iptables on the private ports: PostgreSQL packets dropped, AMQP connections
    /// reset, 20% of Redis packets dropped, for 3 s every 7 s.
    NetCut,
    /// A failpoint armed to abort the process (`name=P%return`); the harness
    /// restarts the engine after each crash, disarmed after a few.
    Failpoint(&'static str, u32),
    /// The HA primary crashed (`stop -m immediate`), a standby promoted by
    /// `scripts/failover promote`, the old primary rejoined 4 s later; every 10 s.
    PgFailover,
    /// Both HA standbys stopped for 4 s, then started again; every 8 s.
    StandbyLoss,
    /// The primary turned read-only (`default_transaction_read_only`, as a fencing
    /// tool does; sessions keep running and get 25006) for 4 s, every 8 s.
    PgReadOnly,
    /// The Sentinel topology's Redis master SIGKILLed; once a replica is promoted,
    /// the old master restarted as its replica; every 8 s.
    RedisMasterKill,
    /// The RabbitMQ cluster node holding the engine's order intakes stopped
    /// (`stop_app`) for 5 s, then started again; every 12 s.
    AmqpNodeStop,
    /// The HA primary's `archive_command` made to fail (`exit 1`) for the whole
    /// sale, with a WAL switch every 2 s; the count is of failed archive attempts.
    WalArchiveFailing,
    /// Both synchronous standbys stopped, the primary crashed 3 s later, a standby
    /// promoted: what the primary committed alone is lost, so an order acked
    /// without a standby would be lost; every 12 s.
    SyncStandbyLost,
}

pub struct Scenario {
    pub name: &'static str,
    pub shape: Shape,
    /// Buyers in the short and the full profile.
    pub buyers: (u32, u32),
    pub fault: Fault,
    pub engines: usize,
    pub in_short: bool,
    /// Engine settings this scenario overrides (environment variables).
    pub engine_env: &'static [(&'static str, &'static str)],
    /// Order shard queues (`amqp.shards`) for the harness and its engines.
    pub shards: u16,
    /// Runs on a PostgreSQL HA topology of its own: `Some(true)` with a synchronous
    /// standby quorum of one, `Some(false)` with asynchronous standbys.
    pub ha: Option<bool>,
    /// Runs on a Redis Sentinel topology or a RabbitMQ cluster of its own.
    pub extra: Option<Extra>,
    /// `ALTER DATABASE … SET synchronous_commit` before the engines start: a
    /// database default the engine must override (issue 48).
    pub database_synchronous_commit: Option<&'static str>,
}

impl Scenario {
    /// Asynchronous standbys: a fail-over may lose what the primary acknowledged
    /// and had not shipped yet (seed §14.3). The account reports it, and it does
    /// not fail the run.
    pub fn loss_allowed(&self) -> bool {
        self.ha == Some(false)
    }
}

/// The matrix. The short profile is what CI runs.
pub fn scenarios() -> Vec<Scenario> {
    use Fault::*;
    let s = |name, shape, buyers, fault, engines, in_short| Scenario {
        name,
        shape,
        buyers,
        fault,
        engines,
        in_short,
        engine_env: &[],
        shards: 2,
        ha: Option::None,
        extra: Option::None,
        database_synchronous_commit: Option::None,
    };
    vec![
        s(
            "duplicates",
            Shape::Duplicates,
            (1_500, 6_000),
            None,
            1,
            true,
        ),
        s("sigkill", Shape::Unique, (2_000, 8_000), SigKill, 1, true),
        s(
            "pg_terminate",
            Shape::HotSku,
            (800, 20_000),
            PgTerminate,
            1,
            true,
        ),
        // One transaction per message: many more COMMITs for the terminations to
        // land in, so the unknown-outcome path is exercised (grouped commits make
        // a blind termination during COMMIT rare).
        Scenario {
            engine_env: &[("SECKILL__ENGINE__BATCH_MAX_SIZE", "1")],
            ..s(
                "pg_terminate_per_message",
                Shape::HotSku,
                (800, 20_000),
                PgTerminate,
                1,
                false,
            )
        },
        s(
            "fp_after_commit_before_ack",
            Shape::Unique,
            (1_500, 6_000),
            Failpoint("after_commit_before_ack", 2),
            1,
            true,
        ),
        // Three engines sharing six shards by themselves (node id leases, shards
        // steered by lease rank): the one killed or frozen again and again holds
        // shards that move to the others and back.
        Scenario {
            shards: 6,
            ..s(
                "spread_sigkill",
                Shape::Unique,
                (2_000, 8_000),
                SigKill,
                3,
                false,
            )
        },
        Scenario {
            shards: 6,
            ..s(
                "spread_sigstop",
                Shape::Unique,
                (2_000, 6_000),
                SigStop,
                3,
                false,
            )
        },
        s(
            "sigstop",
            Shape::PaymentsRace,
            (600, 2_000),
            SigStop,
            2,
            false,
        ),
        s(
            "hot_sku_sigkill",
            Shape::HotSku,
            (1_000, 20_000),
            SigKill,
            1,
            false,
        ),
        s(
            "payments_sigkill",
            Shape::PaymentsRace,
            (600, 2_000),
            SigKill,
            1,
            false,
        ),
        s("pg_crash", Shape::Unique, (2_000, 8_000), PgCrash, 1, false),
        s(
            "rabbit_close",
            Shape::Duplicates,
            (1_500, 6_000),
            RabbitClose,
            1,
            false,
        ),
        s(
            "rabbit_restart",
            Shape::Unique,
            (2_000, 6_000),
            RabbitRestart,
            1,
            false,
        ),
        s(
            "redis_pause",
            Shape::PaymentsRace,
            (600, 2_000),
            RedisPause,
            1,
            false,
        ),
        // Redis's data lost (it keeps nothing on disk): in CI's short profile, since
        // losing Redis must never lose or stop an order (issue 48).
        s(
            "redis_kill",
            Shape::PaymentsRace,
            (600, 2_000),
            RedisKill,
            1,
            true,
        ),
        s("net_cut", Shape::Unique, (2_000, 8_000), NetCut, 1, false),
        // PostgreSQL high availability (docs/DESIGN.md): the engine is given the
        // three servers' multi-host URL and a small retry budget, which no outage
        // may spend.
        Scenario {
            engine_env: &[
                ("SECKILL__DATABASE__REQUIRE_SYNC_STANDBY", "true"),
                ("SECKILL__AMQP__MAX_RETRIES", "3"),
            ],
            ha: Some(true),
            ..s(
                "pg_failover",
                Shape::Sale16,
                (1_500, 5_455),
                PgFailover,
                1,
                true,
            )
        },
        Scenario {
            engine_env: &[("SECKILL__AMQP__MAX_RETRIES", "3")],
            ha: Some(false),
            ..s(
                "pg_failover_async",
                Shape::Sale16,
                (1_500, 5_455),
                PgFailover,
                1,
                false,
            )
        },
        Scenario {
            engine_env: &[
                ("SECKILL__DATABASE__REQUIRE_SYNC_STANDBY", "true"),
                ("SECKILL__AMQP__MAX_RETRIES", "3"),
            ],
            ha: Some(true),
            ..s(
                "standby_loss",
                Shape::Unique,
                (1_500, 6_000),
                StandbyLoss,
                1,
                false,
            )
        },
        Scenario {
            engine_env: &[("SECKILL__AMQP__MAX_RETRIES", "3")],
            ..s(
                "pg_read_only",
                Shape::Unique,
                (1_500, 6_000),
                PgReadOnly,
                1,
                false,
            )
        },
        // Issue 48: no single server. A Redis master lost with Sentinel, a RabbitMQ
        // node lost in a three-node cluster, a failing WAL archive, and a
        // synchronous standby lost while the database default is `local`.
        Scenario {
            extra: Some(Extra::RedisHa),
            ..s(
                "redis_master_kill",
                Shape::PaymentsRace,
                (600, 2_000),
                RedisMasterKill,
                1,
                false,
            )
        },
        Scenario {
            extra: Some(Extra::AmqpCluster),
            ..s(
                "amqp_node_stop",
                Shape::Unique,
                (1_500, 6_000),
                AmqpNodeStop,
                1,
                false,
            )
        },
        Scenario {
            ha: Some(true),
            ..s(
                "wal_archive_failing",
                Shape::Unique,
                (1_500, 6_000),
                WalArchiveFailing,
                1,
                false,
            )
        },
        Scenario {
            engine_env: &[("SECKILL__AMQP__MAX_RETRIES", "3")],
            ha: Some(true),
            database_synchronous_commit: Some("local"),
            ..s(
                "sync_standby_lost",
                Shape::Sale16,
                (1_500, 5_455),
                SyncStandbyLost,
                1,
                false,
            )
        },
        s(
            "fp_publish_before_confirm",
            Shape::Unique,
            (1_500, 6_000),
            Failpoint("publish_before_confirm", 1),
            1,
            false,
        ),
        s(
            "fp_outbox_after_confirm_before_sent",
            Shape::Unique,
            (1_500, 6_000),
            Failpoint("outbox_after_confirm_before_sent", 5),
            1,
            false,
        ),
        s(
            "fp_sweeper_between_claim_and_update",
            Shape::PaymentsRace,
            (600, 2_000),
            Failpoint("sweeper_between_claim_and_update", 5),
            1,
            false,
        ),
        s(
            "fp_compensation_after_redis_before_done",
            Shape::Duplicates,
            (1_500, 6_000),
            Failpoint("compensation_after_redis_before_done", 5),
            1,
            false,
        ),
    ]
}

/// Crashes a failpoint scenario causes before the harness disarms it.
const FAILPOINT_CRASHES: u32 = 4;

/// Runs the selected scenarios and returns one account each.
pub async fn run(args: &ChaosArgs) -> anyhow::Result<Vec<Account>> {
    let selected: Vec<Scenario> = scenarios()
        .into_iter()
        .filter(|s| {
            if args.scenario.is_empty() {
                args.profile == Profile::Full || s.in_short
            } else {
                args.scenario.iter().any(|n| n == s.name)
            }
        })
        .collect();
    if selected.is_empty() {
        anyhow::bail!("no scenario matches {:?}", args.scenario);
    }
    let dir = match &args.services_dir {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir().join(format!("seckill-chaos-{}", uuid::Uuid::new_v4())),
    };
    let exe = match &args.engine {
        Some(exe) => exe.clone(),
        None => std::env::current_exe()
            .context("locating the engine binary")?
            .with_file_name("seckill-engine"),
    };
    if !exe.is_file() {
        anyhow::bail!(
            "the engine binary {} does not exist; build it with `cargo build --release --workspace --target-dir target/chaos` (it runs target/chaos/release/seckill-engine) or pass --engine",
            exe.display()
        );
    }
    let script = match &args.services_script {
        Some(script) => script.clone(),
        None => cluster::find_services_script()?,
    };
    eprintln!("chaos: starting private services under {}", dir.display());
    let cluster = Cluster::start(&dir, script)?;
    let mut accounts = Vec::new();
    let mut failure = None;
    for scenario in &selected {
        eprintln!("chaos: scenario {} ...", scenario.name);
        match run_scenario(&cluster, &exe, scenario, args.profile).await {
            Ok(account) => {
                eprintln!("chaos: {}", account.summary());
                accounts.push(account);
            }
            Err(e) => {
                failure = Some(e.context(format!("scenario {}", scenario.name)));
                break;
            }
        }
    }
    cluster.stop();
    if args.services_dir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    if let Some(report) = &args.report {
        std::fs::write(report, account::markdown(&accounts, args.profile))
            .with_context(|| format!("writing {}", report.display()))?;
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(accounts),
    }
}

/// Settings of one scenario: its own database, namespace and Redis prefix on the
/// private services.
fn scenario_settings(
    cluster: &Cluster,
    topology: Topology<'_>,
    name: &str,
    shards: u16,
) -> anyhow::Result<Settings> {
    let tag = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let db = format!("chaos_{name}_{tag}");
    let extra = topology.extra.map(ServiceTopology::settings);
    let figment = config::figment(extra.as_deref())
        .merge(Serialized::default(
            "database.url",
            match topology.ha {
                Some(ha) => ha.url(&db),
                None => cluster.pg_url(&db),
            },
        ))
        .merge(Serialized::default("amqp.url", cluster.amqp_url()))
        .merge(Serialized::default("redis.url", cluster.redis_url()))
        .merge(Serialized::default(
            "amqp.namespace",
            format!("chaos-{tag}"),
        ))
        .merge(Serialized::default(
            "redis.key_prefix",
            format!("chaos-{tag}"),
        ))
        .merge(Serialized::default("amqp.shards", shards))
        // Queue arguments: the harness declares the topology too, so it must agree
        // with the engines (see engine_env).
        .merge(Serialized::default("amqp.retry_delay_ms", 200));
    Ok(Settings::from_figment(&figment)?)
}

fn engine_env(settings: &Settings) -> Vec<(String, String)> {
    use secrecy::ExposeSecret;
    let pairs = [
        (
            "SECKILL__DATABASE__URL",
            settings.database.url.expose_secret().to_owned(),
        ),
        (
            "SECKILL__AMQP__URL",
            settings.amqp.url.expose_secret().to_owned(),
        ),
        (
            "SECKILL__REDIS__URL",
            settings.redis.url.expose_secret().to_owned(),
        ),
        ("SECKILL__AMQP__NAMESPACE", settings.amqp.namespace.clone()),
        (
            "SECKILL__REDIS__KEY_PREFIX",
            settings.redis.key_prefix.clone(),
        ),
        ("SECKILL__AMQP__SHARDS", settings.amqp.shards.to_string()),
        ("SECKILL__AMQP__RETRY_DELAY_MS", "200".into()),
        // The default retry budget (amqp.max_retries): no outage of PostgreSQL may
        // spend it (docs/DESIGN.md, "Error classes"), and the account counts any
        // valid message dead-lettered.
        ("SECKILL__OUTBOX__LEASE_MS", "1500".into()),
        ("SECKILL__COMPENSATION__LEASE_MS", "1500".into()),
        ("SECKILL__SWEEPER__INTERVAL_MS", "100".into()),
        ("SECKILL__SHUTDOWN__GRACE_MS", "5000".into()),
        // No engine.node_id: each engine leases one, as a restarted instance does in
        // production (a killed engine's id stays leased until its lease expires).
        ("SECKILL__HTTP__ADDR", "127.0.0.1:0".into()),
        // The front stage verifies buyers' tokens; the harness publishes straight
        // to the queues, so any secret will do.
        (
            "SECKILL__FRONTSTAGE__AUTH__HS256_SECRET",
            uuid::Uuid::new_v4().simple().to_string(),
        ),
        (
            "SECKILL__FRONTSTAGE__PURCHASE_TOKEN__SECRET",
            uuid::Uuid::new_v4().simple().to_string(),
        ),
        ("SECKILL__TELEMETRY__FORMAT", "json".into()),
        ("RUST_LOG", "info".into()),
    ];
    pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

/// What the fault task did.
#[derive(Default)]
pub struct FaultLog {
    pub injected: u32,
    /// When each fault ended (the engine restarted, the service came back, ...).
    pub healed: Vec<Instant>,
}

async fn run_scenario(
    cluster: &Cluster,
    exe: &Path,
    scenario: &Scenario,
    profile: Profile,
) -> anyhow::Result<Account> {
    let started = Instant::now();
    let ha = match scenario.ha {
        Some(sync) => Some(HaTopology::start(cluster, scenario.name, sync)?),
        None => None,
    };
    let extra = match scenario.extra {
        Some(kind) => match ServiceTopology::start(cluster, scenario.name, kind) {
            Ok(extra) => Some(extra),
            Err(e) => {
                if let Some(ha) = &ha {
                    ha.stop();
                }
                return Err(e);
            }
        },
        None => None,
    };
    let topology = Topology {
        ha: ha.as_ref(),
        extra: extra.as_ref(),
    };
    let result = run_on(cluster, topology, exe, scenario, profile, started).await;
    if let Some(ha) = &ha {
        ha.stop();
    }
    if let Some(extra) = &extra {
        extra.stop();
    }
    result
}

/// The topologies a scenario runs on besides the cluster's single servers.
#[derive(Clone, Copy)]
struct Topology<'a> {
    ha: Option<&'a HaTopology>,
    extra: Option<&'a ServiceTopology>,
}

async fn run_on(
    cluster: &Cluster,
    topology: Topology<'_>,
    exe: &Path,
    scenario: &Scenario,
    profile: Profile,
    started: Instant,
) -> anyhow::Result<Account> {
    let Topology { ha, extra } = topology;
    let settings = scenario_settings(cluster, topology, scenario.name, scenario.shards)?;
    store::migrate::migrate(
        &store::admin_pg_config(&settings.database)?,
        settings.database.role_prefix.as_deref(),
    )
    .await?;
    if let Some(level) = scenario.database_synchronous_commit {
        // A static statement per level: the database name is quoted by PostgreSQL.
        let admin = pg_admin(&settings).await?;
        admin
            .execute(
                "SELECT set_config('seckill.chaos_level', $1, false)",
                &[&level],
            )
            .await?;
        admin
            .batch_execute(
                "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET synchronous_commit = %L', \
                 current_database(), current_setting('seckill.chaos_level')); END $$",
            )
            .await?;
    }
    let buyers = match profile {
        Profile::Short => scenario.buyers.0,
        Profile::Full => scenario.buyers.1,
    };
    let plan = Plan::new(scenario.shape, buyers, 7, &settings.amqp);
    account::prepare(&settings, &plan).await?;

    let logs = cluster
        .dir
        .join(format!("engine-{}", settings.amqp.namespace));
    std::fs::create_dir_all(&logs)?;
    let mut started_engines = Vec::new();
    for i in 0..scenario.engines {
        let mut env = engine_env(&settings);
        if let Some(extra) = extra {
            // The topology's list settings (sentinels, node URLs), as an operator
            // would pass them.
            env.push((
                "SECKILL_CONFIG".to_owned(),
                extra.settings().display().to_string(),
            ));
        }
        env.extend(
            scenario
                .engine_env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
        let mut e = EngineProc::new(exe, env, logs.join(format!("engine-{i}.log")));
        if let Fault::Failpoint(name, percent) = scenario.fault {
            e.failpoints = Some(format!("{name}={percent}%return"));
        }
        e.spawn()?;
        if !e.wait_ready(Duration::from_secs(60)).await {
            anyhow::bail!("engine {i} never became ready (log in {})", logs.display());
        }
        started_engines.push(e);
    }
    let engines = Rc::new(RefCell::new(started_engines));

    let progress = account::Progress::start(&settings).await?;
    let stop = Rc::new(Cell::new(false));
    let faults = Rc::new(RefCell::new(FaultLog::default()));
    let fault_task = actix_rt::spawn(inject(
        scenario.fault,
        ClusterRef::new(cluster),
        (ha.cloned(), extra.cloned()),
        settings.clone(),
        engines.clone(),
        stop.clone(),
        faults.clone(),
    ));

    // Slow enough that the faults land while work is still arriving.
    let rate = match profile {
        Profile::Short => 200,
        Profile::Full => 500,
    };
    let published = workload::publish(
        &settings.amqp,
        &plan.messages,
        rate,
        Duration::from_secs(600),
    )
    .await;
    eprintln!(
        "chaos: published {} of {} ({} attempts); faults go on for 3 s more",
        published.confirmed.len(),
        plan.messages.len(),
        published.attempts
    );
    // Faults keep coming while the backlog drains, for a while.
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.set(true);
    let _ = fault_task.await;
    heal(cluster, topology, &settings, &engines).await?;
    eprintln!("chaos: healed; draining");

    let drained =
        account::wait_drained(&settings, &plan, &published, Duration::from_secs(240)).await;
    eprintln!("chaos: drained = {drained}; stopping the engines");
    // The fault task has ended: nothing else holds the engines now.
    let mut all = std::mem::take(&mut *engines.borrow_mut());
    for e in &mut all {
        e.stop(Duration::from_secs(15)).await;
    }
    let faults = std::mem::take(&mut *faults.borrow_mut());
    let log_files: Vec<PathBuf> = all.iter().map(|e| e.log.clone()).collect();
    let samples = progress.stop().await;
    account::account(account::Inputs {
        scenario: scenario.name,
        fault: scenario.fault,
        settings: &settings,
        plan: &plan,
        published: &published,
        faults: &faults,
        samples: &samples,
        logs: &log_files,
        drained,
        redis: match scenario.fault {
            Fault::RedisKill => account::RedisModel::Lost,
            Fault::RedisMasterKill => account::RedisModel::Rebuilt,
            _ => account::RedisModel::Untouched,
        },
        loss_allowed: scenario.loss_allowed(),
        elapsed: started.elapsed(),
    })
    .await
}

/// The cluster as the fault task needs it (ports and directory; no ownership).
#[derive(Clone)]
struct ClusterRef {
    dir: PathBuf,
    script: PathBuf,
    ports: (u16, u16, u16),
}

impl ClusterRef {
    fn new(c: &Cluster) -> Self {
        Self {
            dir: c.dir.clone(),
            script: c.script.clone(),
            ports: (c.pg_port, c.amqp_port, c.redis_port),
        }
    }
    fn get(&self) -> Cluster {
        Cluster {
            dir: self.dir.clone(),
            script: self.script.clone(),
            pg_port: self.ports.0,
            amqp_port: self.ports.1,
            redis_port: self.ports.2,
        }
    }
}

/// Brings every service and engine back before draining.
async fn heal(
    cluster: &Cluster,
    topology: Topology<'_>,
    settings: &Settings,
    engines: &Rc<RefCell<Vec<EngineProc>>>,
) -> anyhow::Result<()> {
    let Topology { ha, extra } = topology;
    for rule in cluster.net_rules() {
        // Rules still in place from an interrupted cut; an absent rule is fine.
        while cluster::iptables("-D", &rule).is_ok() {}
    }
    cluster.services(&["up"])?;
    if let Some(ha) = ha {
        // Every server that is down comes back as a standby of the primary.
        ha.failover(&["rejoin"])?;
    }
    // A primary left read-only by an interrupted PgReadOnly step; the topology's
    // own archive_command back after WalArchiveFailing.
    if let Ok(admin) = pg_admin(settings).await {
        let _ = admin
            .batch_execute("ALTER SYSTEM RESET default_transaction_read_only")
            .await;
        let _ = admin
            .batch_execute("ALTER SYSTEM RESET archive_command")
            .await;
        let _ = admin.batch_execute("SELECT pg_reload_conf()").await;
    }
    match extra {
        Some(extra) if extra.kind == Extra::AmqpCluster => {
            for node in ["1", "2", "3"] {
                let _ = extra.services(&["amqp-cluster-ctl", node, "start_app"]);
            }
        }
        // Every Redis server that is down comes back as a replica.
        Some(extra) => {
            for port in &extra.ports[..2] {
                let _ = extra.services(&["redis-ha-restart", &port.to_string()]);
            }
        }
        None => {}
    }
    let _ = cluster.rabbitmqctl(&["start_app"]);
    if let Ok(mut redis) = cluster.redis().await {
        let _: Result<(), _> = ::redis::cmd("CLIENT")
            .arg("UNPAUSE")
            .query_async(&mut redis)
            .await;
    }
    for e in engines.borrow_mut().iter_mut() {
        let _ = e.sigcont();
        if e.exited() {
            e.failpoints = None;
            e.spawn()?;
        }
    }
    Ok(())
}

/// A session of the harness on the scenario's (primary) server, writable even while
/// the fault has made the server's default read-only.
async fn pg_admin(settings: &Settings) -> anyhow::Result<tokio_postgres::Client> {
    let mut config = store::admin_pg_config(&settings.database)?;
    config
        .application_name("seckill-chaos")
        .options("-c default_transaction_read_only=off");
    Ok(store::connect(&config).await?)
}

/// Restarts engines that died (failpoint aborts); injects the scenario's fault on
/// its schedule until `stop`.
async fn inject(
    fault: Fault,
    cluster: ClusterRef,
    (ha, extra): (Option<HaTopology>, Option<ServiceTopology>),
    settings: Settings,
    engines: Rc<RefCell<Vec<EngineProc>>>,
    stop: Rc<Cell<bool>>,
    log: Rc<RefCell<FaultLog>>,
) {
    let cluster = cluster.get();
    let mut next = Instant::now() + Duration::from_secs(2);
    let mut crashes = 0u32;
    let db_name = store::pg_config(&settings.database)
        .ok()
        .and_then(|c| c.get_dbname().map(str::to_owned))
        .unwrap_or_default();
    let mut admin: Option<tokio_postgres::Client> = None;
    // WalArchiveFailing: the archiver's failed count when the fault began.
    let mut archive_failed_at_start: Option<i64> = None;
    let mut archive_admin: Option<tokio_postgres::Client> = None;
    while !stop.get() {
        tokio::time::sleep(Duration::from_millis(50)).await;
        // Supervise: an engine that exited on its own is started again.
        for e in engines.borrow_mut().iter_mut() {
            if e.exited() {
                crashes += 1;
                if let Fault::Failpoint(..) = fault {
                    log.borrow_mut().injected += 1;
                }
                if crashes >= FAILPOINT_CRASHES {
                    e.failpoints = None;
                }
                if e.spawn().is_ok() {
                    log.borrow_mut().healed.push(Instant::now());
                }
            }
        }
        if Instant::now() < next {
            continue;
        }
        let mut rng = rand::rng();
        let result: anyhow::Result<()> = async {
            match fault {
                Fault::None | Fault::Failpoint(..) => {
                    next = Instant::now() + Duration::from_secs(3600);
                }
                Fault::SigKill => {
                    {
                        let mut all = engines.borrow_mut();
                        let e = &mut all[0];
                        e.kill9();
                        e.spawn()?;
                    }
                    log.borrow_mut().injected += 1;
                    log.borrow_mut().healed.push(Instant::now());
                    next = Instant::now() + Duration::from_millis(rng.random_range(2_000..5_000));
                }
                Fault::SigStop => {
                    engines.borrow()[0].sigstop()?;
                    // Longer than the outbox and compensation leases (1.5 s).
                    tokio::time::sleep(Duration::from_millis(4_000)).await;
                    engines.borrow()[0].sigcont()?;
                    log.borrow_mut().injected += 1;
                    log.borrow_mut().healed.push(Instant::now());
                    next = Instant::now() + Duration::from_secs(3);
                }
                Fault::PgTerminate => {
                    if admin.is_none() {
                        let mut config = store::admin_pg_config(&settings.database)?;
                        config.application_name("seckill-chaos");
                        admin = Some(store::connect(&config).await?);
                    }
                    if let Some(client) = &admin {
                        let killed = client
                            .query(
                                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                                 WHERE datname = $1 AND pid <> pg_backend_pid()
                                   AND application_name <> 'seckill-chaos'",
                                &[&db_name],
                            )
                            .await;
                        match killed {
                            Ok(rows) if !rows.is_empty() => {
                                log.borrow_mut().injected += 1;
                                log.borrow_mut().healed.push(Instant::now());
                            }
                            Ok(_) => {}
                            Err(_) => admin = None,
                        }
                    }
                    next = Instant::now() + Duration::from_secs(1);
                }
                Fault::PgCrash => {
                    cluster.pg_crash().await?;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    cluster.services(&["up"])?;
                    log.borrow_mut().injected += 1;
                    log.borrow_mut().healed.push(Instant::now());
                    next = Instant::now() + Duration::from_secs(8);
                }
                Fault::RabbitClose => {
                    cluster.rabbitmqctl(&["close_all_connections", "chaos"])?;
                    log.borrow_mut().injected += 1;
                    log.borrow_mut().healed.push(Instant::now());
                    next = Instant::now() + Duration::from_secs(3);
                }
                Fault::RabbitRestart => {
                    cluster.rabbitmqctl(&["stop_app"])?;
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    cluster.rabbitmqctl(&["start_app"])?;
                    log.borrow_mut().injected += 1;
                    log.borrow_mut().healed.push(Instant::now());
                    next = Instant::now() + Duration::from_secs(10);
                }
                Fault::RedisPause => {
                    let mut redis = cluster.redis().await?;
                    let _: () = ::redis::cmd("CLIENT")
                        .arg("PAUSE")
                        .arg(2_500)
                        .arg("ALL")
                        .query_async(&mut redis)
                        .await?;
                    log.borrow_mut().injected += 1;
                    tokio::time::sleep(Duration::from_millis(2_500)).await;
                    log.borrow_mut().healed.push(Instant::now());
                    next = Instant::now() + Duration::from_secs(4);
                }
                Fault::NetCut => {
                    let rules = cluster.net_rules();
                    cluster::iptables_ensure()?;
                    for rule in &rules {
                        cluster::iptables("-I", rule)?;
                    }
                    log.borrow_mut().injected += 1;
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    for rule in &rules {
                        cluster::iptables("-D", rule)?;
                    }
                    log.borrow_mut().healed.push(Instant::now());
                    next = Instant::now() + Duration::from_secs(7);
                }
                Fault::PgFailover => {
                    let ha = ha.as_ref().context("PgFailover needs an HA topology")?;
                    ha.failover(&["crash"])?;
                    ha.failover(&["promote"])?;
                    log.borrow_mut().injected += 1;
                    log.borrow_mut().healed.push(Instant::now());
                    tokio::time::sleep(Duration::from_secs(4)).await;
                    ha.failover(&["rejoin"])?;
                    next = Instant::now() + Duration::from_secs(6);
                }
                Fault::StandbyLoss => {
                    let ha = ha.as_ref().context("StandbyLoss needs an HA topology")?;
                    ha.failover(&["stop", "pg1"])?;
                    ha.failover(&["stop", "pg2"])?;
                    log.borrow_mut().injected += 1;
                    tokio::time::sleep(Duration::from_secs(4)).await;
                    ha.failover(&["start", "pg1"])?;
                    ha.failover(&["start", "pg2"])?;
                    log.borrow_mut().healed.push(Instant::now());
                    next = Instant::now() + Duration::from_secs(4);
                }
                Fault::PgReadOnly => {
                    let admin = pg_admin(&settings).await?;
                    admin
                        .batch_execute("ALTER SYSTEM SET default_transaction_read_only = on")
                        .await?;
                    admin.batch_execute("SELECT pg_reload_conf()").await?;
                    log.borrow_mut().injected += 1;
                    tokio::time::sleep(Duration::from_secs(4)).await;
                    admin
                        .batch_execute("ALTER SYSTEM RESET default_transaction_read_only")
                        .await?;
                    admin.batch_execute("SELECT pg_reload_conf()").await?;
                    log.borrow_mut().healed.push(Instant::now());
                    next = Instant::now() + Duration::from_secs(4);
                }
                Fault::RedisMasterKill => {
                    let extra = extra.as_ref().context("RedisMasterKill needs --redis-ha")?;
                    let out = extra.services(&["redis-ha-kill-master"])?;
                    let port = out
                        .lines()
                        .filter_map(|l| l.trim().parse::<u16>().ok())
                        .next_back()
                        .with_context(|| format!("no port in {out:?}"))?;
                    log.borrow_mut().injected += 1;
                    // Waits for the sentinels to promote the replica, then brings
                    // the old master back as its replica.
                    extra.services(&["redis-ha-restart", &port.to_string()])?;
                    log.borrow_mut().healed.push(Instant::now());
                    next = Instant::now() + Duration::from_secs(8);
                }
                Fault::AmqpNodeStop => {
                    let extra = extra
                        .as_ref()
                        .context("AmqpNodeStop needs --amqp-cluster")?;
                    // Asked of a node that runs (every node is up between faults).
                    let node = extra.node_of_intakes(1)?.unwrap_or(1);
                    let node = node.to_string();
                    extra.services(&["amqp-cluster-ctl", &node, "stop_app"])?;
                    log.borrow_mut().injected += 1;
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    extra.services(&["amqp-cluster-ctl", &node, "start_app"])?;
                    log.borrow_mut().healed.push(Instant::now());
                    next = Instant::now() + Duration::from_secs(12);
                }
                Fault::WalArchiveFailing => {
                    if archive_admin.is_none() {
                        archive_admin = Some(pg_admin(&settings).await?);
                    }
                    let admin = archive_admin.as_ref().context("no session")?;
                    let failed: i64 = admin
                        .query_one("SELECT failed_count FROM pg_stat_archiver", &[])
                        .await?
                        .get(0);
                    match archive_failed_at_start {
                        None => {
                            admin
                                .batch_execute("ALTER SYSTEM SET archive_command = 'exit 1'")
                                .await?;
                            admin.batch_execute("SELECT pg_reload_conf()").await?;
                            archive_failed_at_start = Some(failed);
                        }
                        Some(at_start) => {
                            log.borrow_mut().injected =
                                u32::try_from(failed - at_start).unwrap_or(0);
                        }
                    }
                    // A segment to archive (and fail) every 2 s, as a busy primary
                    // fills them.
                    admin.batch_execute("SELECT pg_switch_wal()").await?;
                    next = Instant::now() + Duration::from_secs(2);
                }
                Fault::SyncStandbyLost => {
                    let ha = ha
                        .as_ref()
                        .context("SyncStandbyLost needs an HA topology")?;
                    let standbys = ha.standbys()?;
                    if standbys.is_empty() {
                        anyhow::bail!("no standby to stop");
                    }
                    for standby in &standbys {
                        ha.failover(&["stop", standby])?;
                    }
                    // COMMITs wait for a standby here (the engine sets
                    // synchronous_commit = on over the database's `local`).
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    ha.failover(&["crash"])?;
                    for standby in &standbys {
                        ha.failover(&["start", standby])?;
                    }
                    ha.failover(&["promote"])?;
                    log.borrow_mut().injected += 1;
                    log.borrow_mut().healed.push(Instant::now());
                    tokio::time::sleep(Duration::from_secs(4)).await;
                    ha.failover(&["rejoin"])?;
                    next = Instant::now() + Duration::from_secs(8);
                }
                Fault::RedisKill => {
                    let mut redis = cluster.redis().await?;
                    let _: Result<(), _> = ::redis::cmd("SHUTDOWN")
                        .arg("NOSAVE")
                        .query_async(&mut redis)
                        .await;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    cluster.services(&["up"])?;
                    log.borrow_mut().injected += 1;
                    log.borrow_mut().healed.push(Instant::now());
                    next = Instant::now() + Duration::from_secs(8);
                }
            }
            Ok(())
        }
        .await;
        if let Err(e) = result {
            eprintln!("chaos: fault {fault:?} failed: {e:#}");
            archive_admin = None;
            next = Instant::now() + Duration::from_secs(1);
        }
    }
}
