//! The command-line interface: argument types (clap) and one function per command.
//! `main.rs` parses, sets up telemetry and calls `run`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use clap::{Args, Parser, Subcommand};

use crate::config::{self, Settings};
use crate::domain::shard::SHARD_FUNCTION_VERSION;
use crate::redis::commands as redis_commands;
use crate::redis::keys::SkuKeys;
use crate::store::activity::{create_activity, ActivitySpec};
use crate::store::invariants::run_checks;
use crate::store::topology::{self, ShardLayout};
use crate::store::{self, migrate};

#[derive(Debug, Parser)]
#[command(name = "seckill-engine", version, about = "Flash-sale order engine")]
pub struct Cli {
    /// A TOML file layered over config/default.toml (environment variables
    /// SECKILL__SECTION__KEY override both).
    #[arg(long, global = true, env = "SECKILL_CONFIG")]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create the database if missing and apply pending migrations.
    Migrate,
    /// Validate the configuration and check that PostgreSQL, RabbitMQ and Redis answer.
    Validate,
    /// Run the engine until SIGINT or SIGTERM.
    Serve,
    /// Manage flash-sale activities.
    #[command(subcommand)]
    Activity(ActivityCommand),
    /// Change the number of order shard queues. Refused while any order queue or
    /// retry queue of either layout holds a message or has a consumer: stop every
    /// engine and front stage and let the queues drain first.
    Reshard {
        /// The new shard count (1 to 1024); set amqp.shards to it everywhere.
        #[arg(long)]
        shards: u16,
    },
    /// Run the invariant checks (seed §13.3); exits non-zero if any is violated.
    Check {
        /// Only this activity.
        #[arg(long)]
        activity: Option<i64>,
        /// Also compare, per bucket, Redis stock plus the Redis reservations PostgreSQL
        /// has not seen yet with PostgreSQL's available stock, and report drift.
        #[arg(long)]
        redis: bool,
    },
    /// One screen on the engine's database and backlog (seed §12.3): open
    /// transactions, who blocks whom, dead rows and HOT updates of the tables,
    /// replication lag, outbox and compensation backlog, dead-letter depths. Writes
    /// nothing.
    Diagnose,
    /// After a sale (seed §10.6): VACUUM (ANALYZE) the tables a sale writes and
    /// report dead rows and sizes before and after. Refused while the activity's
    /// sale is live, unless --force.
    Maintain {
        /// The activity whose sale is over.
        #[arg(long)]
        activity: i64,
        /// Run even though the sale is live (VACUUM then competes with the orders).
        #[arg(long)]
        force: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum ActivityCommand {
    /// Create an activity with one SKU split into inventory buckets, and load the
    /// per-bucket stock into Redis for the front stage.
    Create(CreateActivity),
    /// End an activity now: front stages answer 409 SALE_CLOSED within a second;
    /// orders already made are paid or cancelled at their expiry as usual.
    Close {
        #[arg(long)]
        activity: i64,
    },
}

#[derive(Debug, Args)]
pub struct CreateActivity {
    #[arg(long)]
    pub activity: i64,
    #[arg(long)]
    pub sku: i64,
    #[arg(long)]
    pub stock: i32,
    #[arg(long, default_value_t = 1)]
    pub buckets: i16,
    /// Unit price in minor units.
    #[arg(long)]
    pub price: i64,
    #[arg(long, default_value = "CNY")]
    pub currency: String,
    #[arg(long, default_value = "Flash sale")]
    pub title: String,
    /// RFC 3339; default now.
    #[arg(long)]
    pub starts_at: Option<DateTime<Utc>>,
    /// RFC 3339; default one day after the start.
    #[arg(long)]
    pub ends_at: Option<DateTime<Utc>>,
    /// Unpaid orders are cancelled after this many seconds.
    #[arg(long, default_value_t = 900)]
    pub order_ttl: i64,
}

/// Runs a parsed command. Config errors and failed checks become a non-zero exit.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    // Before any connection: every TLS client of the process uses this provider.
    crate::tls::install_provider();
    let settings = match Settings::load(cli.config.as_deref()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    crate::telemetry::init(&settings.telemetry);
    if matches!(cli.command, Command::Serve) {
        // Before any actor records a metric.
        crate::telemetry::metrics();
    }
    match cli.command {
        Command::Serve => {
            // actix needs its own System; everything else runs on a plain runtime.
            actix_rt::System::new().block_on(serve(settings))
        }
        command => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting the runtime")?;
            runtime.block_on(async move {
                match command {
                    Command::Migrate => migrate_cmd(&settings).await,
                    Command::Validate => validate(&settings, cli.config.as_deref()).await,
                    Command::Activity(ActivityCommand::Create(args)) => {
                        activity_create(&settings, args).await
                    }
                    Command::Activity(ActivityCommand::Close { activity }) => {
                        activity_close(&settings, activity).await
                    }
                    Command::Check { activity, redis } => check(&settings, activity, redis).await,
                    Command::Diagnose => diagnose(&settings).await,
                    Command::Maintain { activity, force } => {
                        maintain(&settings, activity, force).await
                    }
                    Command::Reshard { shards } => reshard(&settings, shards).await,
                    Command::Serve => unreachable!("handled above"),
                }
            })
        }
    }
}

async fn serve(settings: Settings) -> anyhow::Result<ExitCode> {
    use tokio::signal::unix::{signal, SignalKind};
    // Handlers first: a signal that arrives while the engine starts is not lost.
    let mut term = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    let served = crate::startup::start(&settings).await?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tracing::info!("signal received, stopping");
    tokio::select! {
        _ = crate::startup::drain(served) => Ok(ExitCode::SUCCESS),
        // Still safe: whatever is unacked is redelivered, and the inbox answers it.
        _ = async { tokio::select! { _ = term.recv() => {} _ = int.recv() => {} } } => {
            tracing::warn!("second signal: exiting without waiting; unsettled deliveries will be redelivered");
            Ok(ExitCode::from(130))
        }
    }
}

async fn migrate_cmd(settings: &Settings) -> anyhow::Result<ExitCode> {
    let config = store::owner_pg_config(&settings.database)?;
    let report = migrate::migrate(&config).await.context("migrating")?;
    if report.database_created {
        println!(
            "created database {}",
            config.get_dbname().unwrap_or_default()
        );
    }
    if report.applied.is_empty() {
        println!("schema is up to date");
    }
    for m in &report.applied {
        println!("applied {m}");
    }
    Ok(ExitCode::SUCCESS)
}

async fn validate(
    settings: &Settings,
    config_file: Option<&std::path::Path>,
) -> anyhow::Result<ExitCode> {
    let figment = config::figment(config_file);
    let from = |key: &str| format!("{key} from {}", config::origin(&figment, key));
    println!("ok   config");
    let mut failed = false;
    let mut report = |name: &str, key: &str, result: Result<String, String>| match result {
        Ok(detail) => println!("ok   {name:<10} {detail} ({})", from(key)),
        Err(e) => {
            failed = true;
            println!("FAIL {name:<10} {e} ({})", from(key));
        }
    };

    let pg = async {
        let config = store::pg_config(&settings.database)
            .map_err(|e| format!("{:#}", anyhow::Error::from(e)))?;
        let mut client = store::connect(&config)
            .await
            .map_err(|e| format!("{:#}", anyhow::Error::from(e)))?;
        migrate::verify(&mut client)
            .await
            .map_err(|e| format!("reachable, but {e}"))?;
        let state = store::primary::primary_state(&client)
            .await
            .map_err(|e| format!("reachable, but {e}"))?;
        match state.problem(
            settings.database.require_sync_standby,
            settings.database.commit_stall(),
        ) {
            None => Ok(format!("reachable, schema current; {}", state.describe())),
            Some(problem) => Err(format!("reachable, schema current, but {problem}")),
        }
    };
    report("postgres", "database.url", pg.await);

    let amqp = async {
        let conn = crate::mq::connect(&settings.amqp, "seckill-validate")
            .await
            .map_err(|e| format!("{:#}", anyhow::Error::from(e)))?;
        let _ = conn.close(200, "validated".into()).await;
        Ok("reachable".to_owned())
    };
    report("rabbitmq", "amqp.url", amqp.await);

    let redis = async {
        let mut conn = crate::redis::connect(&settings.redis)
            .await
            .map_err(|e| format!("{:#}", anyhow::Error::from(e)))?;
        redis_commands::ping(&mut conn)
            .await
            .map_err(|e| format!("{:#}", anyhow::Error::from(e)))?;
        Ok("reachable".to_owned())
    };
    report("redis", "redis.url", redis.await);
    report(
        "frontstage",
        "frontstage.auth.mode",
        crate::http::front::check_settings(settings),
    );

    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

async fn activity_create(settings: &Settings, args: CreateActivity) -> anyhow::Result<ExitCode> {
    let starts_at = args.starts_at.unwrap_or_else(Utc::now);
    let spec = ActivitySpec {
        activity_id: args.activity,
        sku_id: args.sku,
        title: args.title,
        stock: args.stock,
        buckets: args.buckets,
        unit_price: args.price,
        currency: args.currency,
        starts_at,
        ends_at: args
            .ends_at
            .unwrap_or(starts_at + chrono::TimeDelta::days(1)),
        order_ttl_ms: args.order_ttl.saturating_mul(1000),
    };
    let config = store::pg_config(&settings.database)?;
    let mut client = store::connect(&config)
        .await
        .context("connecting to PostgreSQL")?;
    migrate::verify(&mut client).await?;
    let split = match create_activity(&mut client, &spec).await {
        Ok(split) => split,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(ExitCode::FAILURE);
        }
    };
    let keys = SkuKeys::new(&settings.redis.key_prefix, spec.activity_id, spec.sku_id);
    let mut redis = crate::redis::connect(&settings.redis).await.context(
        "connecting to Redis (the activity exists in PostgreSQL; its Redis stock is not loaded)",
    )?;
    crate::redis::load_stock(&mut redis, &keys, &split, spec.ends_at)
        .await
        .context("loading Redis stock (the activity exists in PostgreSQL)")?;
    println!(
        "created activity {} sku {}: stock {} over {} buckets",
        spec.activity_id, spec.sku_id, spec.stock, spec.buckets
    );
    Ok(ExitCode::SUCCESS)
}

async fn activity_close(settings: &Settings, activity_id: i64) -> anyhow::Result<ExitCode> {
    use crate::store::activity::{close_activity, Closed};
    let config = store::pg_config(&settings.database)?;
    let mut client = store::connect(&config)
        .await
        .context("connecting to PostgreSQL")?;
    migrate::verify(&mut client).await?;
    Ok(match close_activity(&client, activity_id).await? {
        Closed::Now => {
            println!(
                "closed activity {activity_id}: front stages answer SALE_CLOSED within a second"
            );
            ExitCode::SUCCESS
        }
        Closed::Already => {
            println!("activity {activity_id} was closed already");
            ExitCode::SUCCESS
        }
        Closed::Unknown => {
            eprintln!("error: no activity {activity_id}");
            ExitCode::FAILURE
        }
    })
}

/// `maintain`: VACUUM (ANALYZE) after the sale of `activity_id`, one line per table.
async fn maintain(settings: &Settings, activity_id: i64, force: bool) -> anyhow::Result<ExitCode> {
    use crate::store::maintain::{sale_state, vacuum_hot_tables, SaleState};
    // VACUUM needs the tables' owner.
    let mut config = store::owner_pg_config(&settings.database)?;
    config.options("-c search_path=seckill,public");
    let mut client = store::connect(&config)
        .await
        .context("connecting to PostgreSQL")?;
    migrate::verify(&mut client).await?;
    match sale_state(&client, activity_id).await? {
        SaleState::Unknown => {
            eprintln!("error: no activity {activity_id}");
            return Ok(ExitCode::FAILURE);
        }
        SaleState::Live if !force => {
            eprintln!("error: the sale of activity {activity_id} is live (VACUUM would compete with its orders); close it first (`activity close`) or pass --force");
            return Ok(ExitCode::FAILURE);
        }
        _ => {}
    }
    println!(
        "{:<22} {:>12} {:>12} {:>12} {:>12}",
        "table", "dead before", "dead after", "MB before", "MB after"
    );
    let mut freed = 0i64;
    for t in vacuum_hot_tables(&client).await.context("vacuuming")? {
        freed += t.bytes_before - t.bytes_after;
        println!(
            "{:<22} {:>12} {:>12} {:>12.1} {:>12.1}",
            t.table,
            t.dead_rows_before,
            t.dead_rows_after,
            t.bytes_before as f64 / 1e6,
            t.bytes_after as f64 / 1e6
        );
    }
    println!(
        "vacuumed and analyzed; {:.1} MB returned to the file system (the space of the other dead rows is reused by the next sale)",
        freed.max(0) as f64 / 1e6
    );
    Ok(ExitCode::SUCCESS)
}

/// `diagnose`: prints what `store::diagnose` and the backlog gauges read, then the
/// dead-letter queues' depths (or why the broker could not say).
async fn diagnose(settings: &Settings) -> anyhow::Result<ExitCode> {
    let config = store::pg_config(&settings.database)?;
    let mut client = store::connect(&config)
        .await
        .context("connecting to PostgreSQL")?;
    let d = store::diagnose::diagnose(&mut client)
        .await
        .context("reading the database's state")?;
    println!("open transactions (oldest first, at most 10):");
    if d.open_transactions.is_empty() {
        println!("  none");
    }
    for t in &d.open_transactions {
        println!(
            "  pid {:<7} {:>9.3} s  {:<20} {:<8} wait {:<24} {}",
            t.pid,
            t.transaction_seconds,
            t.application_name,
            t.state,
            t.wait.as_deref().unwrap_or("-"),
            t.query
        );
    }
    println!("blocked sessions:");
    if d.blocked.is_empty() {
        println!("  none");
    }
    for b in &d.blocked {
        println!(
            "  pid {} waits {:.3} s on {}: {}",
            b.pid,
            b.waiting_seconds,
            b.wait.as_deref().unwrap_or("-"),
            b.query
        );
        for blocker in &b.blockers {
            println!(
                "    blocked by pid {} ({}, {}, transaction open {}): {}",
                blocker.pid,
                if blocker.application_name.is_empty() {
                    "no application name"
                } else {
                    &blocker.application_name
                },
                blocker.state,
                blocker
                    .transaction_seconds
                    .map(|s| format!("{s:.3} s"))
                    .unwrap_or_else(|| "-".into()),
                blocker.query
            );
        }
    }
    println!("tables (most dead rows first):");
    println!(
        "  {:<22} {:>10} {:>10} {:>10} {:>7}  last vacuum / analyze",
        "table", "live", "dead", "updates", "HOT"
    );
    for t in &d.tables {
        let when = |at: Option<chrono::DateTime<chrono::Utc>>| {
            at.map(|at| at.format("%Y-%m-%d %H:%M:%S").to_string())
                .unwrap_or_else(|| "never".into())
        };
        println!(
            "  {:<22} {:>10} {:>10} {:>10} {:>7}  {} / {}",
            t.table,
            t.live_rows,
            t.dead_rows,
            t.updates,
            t.hot_ratio()
                .map(|r| format!("{:.0} %", r * 100.0))
                .unwrap_or_else(|| "-".into()),
            when(t.last_vacuum),
            when(t.last_analyze)
        );
    }
    match &d.standbys {
        None => println!("replication: this server is a standby"),
        Some(standbys) if standbys.is_empty() => println!("replication: no standby connected"),
        Some(standbys) => {
            println!("replication:");
            for s in standbys {
                println!(
                    "  {:<16} {:<10} {:<6} replay lag {}, {} bytes behind",
                    s.name,
                    s.state,
                    s.sync_state,
                    s.replay_lag_seconds
                        .map(|l| format!("{l:.3} s"))
                        .unwrap_or_else(|| "-".into()),
                    s.replay_bytes_behind
                        .map(|b| b.to_string())
                        .unwrap_or_else(|| "-".into())
                );
            }
        }
    }
    let pool = {
        let mut db = settings.database.clone();
        db.pool_size = 1;
        store::build_pool(&db).context("a connection for the backlog")?
    };
    let backlog = store::ops::backlog(&pool)
        .await
        .context("reading the backlog")?;
    let capped = |n: i64| {
        if n >= store::ops::BACKLOG_COUNT_CAP {
            format!("{n}+")
        } else {
            n.to_string()
        }
    };
    println!(
        "backlog: outbox {} waiting (oldest {:.1} s), {} dead; compensation {} waiting (oldest {:.1} s), {} for review",
        capped(backlog.outbox_pending),
        backlog.outbox_oldest_pending_age_seconds,
        backlog.outbox_dead,
        capped(backlog.compensation_pending),
        backlog.compensation_oldest_pending_age_seconds,
        backlog.compensation_manual_review
    );
    let names = crate::mq::topology::Names::new(&settings.amqp.namespace);
    let depths = async {
        let connection = crate::mq::connect(&settings.amqp, "seckill-diagnose").await?;
        let channel = connection.create_channel().await?;
        let mut depths = Vec::new();
        for queue in [names.order_dead_queue(), names.payment_dead_queue()] {
            let counts = crate::mq::queue_counts(&channel, &queue).await?;
            depths.push(format!("{queue} {}", counts.messages));
        }
        crate::mq::close(&connection, &[&channel]).await;
        Ok::<_, crate::mq::MqError>(depths)
    };
    match depths.await {
        Ok(depths) => println!("dead letters: {}", depths.join(", ")),
        Err(e) => println!("dead letters: unknown ({e})"),
    }
    Ok(ExitCode::SUCCESS)
}

async fn check(
    settings: &Settings,
    activity: Option<i64>,
    with_redis: bool,
) -> anyhow::Result<ExitCode> {
    let config = store::pg_config(&settings.database)?;
    let client = store::connect(&config)
        .await
        .context("connecting to PostgreSQL")?;
    let results = run_checks(&client, activity, settings.retention.inbox_window())
        .await
        .context("running checks")?;
    let mut failed = false;
    for r in &results {
        let status = if r.ok() { "ok  " } else { "FAIL" };
        failed |= !r.ok();
        println!(
            "{status} {:<30} {:>8}  {}",
            r.name, r.violations, r.description
        );
    }
    if with_redis {
        let drift = redis_drift(settings, &client, activity).await?;
        let drifting: Vec<_> = drift.iter().filter(|d| d.drift != 0).collect();
        let status = if drifting.is_empty() { "ok  " } else { "FAIL" };
        failed |= !drifting.is_empty();
        println!(
            "{status} {:<30} {:>8}  bucket whose PostgreSQL available stock differs from Redis stock + Redis reservations not yet in PostgreSQL",
            "redis_drift",
            drifting.len()
        );
        for d in drifting {
            println!(
                "       activity {} sku {} bucket {}: postgres available {}, redis stock {}, unsettled reservations {}, drift {}",
                d.activity_id, d.sku_id, d.bucket, d.pg_available, d.redis_stock, d.unsettled, d.drift
            );
        }
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

async fn reshard(settings: &Settings, shards: u16) -> anyhow::Result<ExitCode> {
    if !(1..=1024).contains(&shards) {
        eprintln!("error: --shards must be between 1 and 1024, got {shards}");
        return Ok(ExitCode::from(2));
    }
    let config = store::pg_config(&settings.database)?;
    let mut client = store::connect(&config)
        .await
        .context("connecting to PostgreSQL")?;
    migrate::verify(&mut client).await?;
    let recorded = topology::read(&client).await?;
    let old = recorded.map_or(settings.amqp.shards, |l| l.shards);
    let names = crate::mq::topology::Names::new(&settings.amqp.namespace);
    let conn = crate::mq::connect(&settings.amqp, "seckill-reshard")
        .await
        .context("connecting to RabbitMQ")?;
    let mut busy = Vec::new();
    for shard in 0..old.max(shards) {
        for queue in [names.order_queue(shard), names.order_retry_queue(shard)] {
            // A passive declare of a missing queue closes its channel: one each.
            let channel = conn.create_channel().await?;
            match crate::mq::queue_counts(&channel, &queue).await {
                Ok(c) if c.messages > 0 || c.consumers > 0 => busy.push(format!(
                    "{queue}: {} messages, {} consumers",
                    c.messages, c.consumers
                )),
                Ok(_) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e).with_context(|| format!("reading {queue}")),
            }
            let _ = channel.close(200, "counted".into()).await;
        }
    }
    let _ = conn.close(200, "done".into()).await;
    if !busy.is_empty() {
        eprintln!(
            "error: refusing to change the shard layout from {old} to {shards} shards while order queues are in use (stop every engine and front stage and let them drain):"
        );
        for b in busy {
            eprintln!("  {b}");
        }
        return Ok(ExitCode::FAILURE);
    }
    let layout = ShardLayout {
        shard_function: SHARD_FUNCTION_VERSION,
        shards,
    };
    topology::replace(&client, layout).await?;
    println!(
        "shard layout: {} → {layout}; set amqp.shards = {shards} for every engine and front stage",
        recorded.map_or_else(|| "none recorded".to_owned(), |l| l.to_string())
    );
    Ok(ExitCode::SUCCESS)
}

/// Every bucket's drift between Redis and PostgreSQL (`crate::drift`).
async fn redis_drift(
    settings: &Settings,
    client: &tokio_postgres::Client,
    activity: Option<i64>,
) -> anyhow::Result<Vec<crate::drift::BucketDrift>> {
    let mut redis = crate::redis::connect(&settings.redis)
        .await
        .context("connecting to Redis")?;
    Ok(crate::drift::measure(client, &mut redis, &settings.redis.key_prefix, activity).await?)
}
