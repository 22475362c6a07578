//! The command line: the argument types (clap) and `run`, which loads the settings
//! and dispatches each command to its own file here. `main.rs` parses and calls
//! `run`; what a command does lives in its file, what `serve` runs in `startup`.

mod activity;
mod check;
mod diagnose;
mod health;
mod maintain;
mod migrate;
mod redis;
mod reshard;
mod serve;
mod validate;

use std::future::Future;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};

pub use activity::CreateActivity;

use crate::config::Settings;

#[derive(Debug, Parser)]
#[command(name = "seckill-engine", version = crate::VERSION, about = "Flash-sale order engine")]
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
    Serve(ServeArgs),
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
    /// Whether this host's engine is ready: GET /readyz on admin.addr; exits 0 on
    /// 200, else 1 (a container's HEALTHCHECK).
    Health,
    /// The front stage's Redis keys.
    #[command(subcommand)]
    Redis(RedisCommand),
}

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// What this process runs: all, front, engine or admin (repeat for several;
    /// overrides `server.roles`). Every role keeps the admin listener.
    #[arg(long, value_parser = parse_role)]
    pub role: Vec<crate::config::Role>,
}

fn parse_role(s: &str) -> Result<crate::config::Role, String> {
    s.parse()
}

#[derive(Debug, Subcommand)]
pub enum RedisCommand {
    /// Rebuild a sale's Redis keys from PostgreSQL: each bucket's stock (PostgreSQL's
    /// available units minus those Redis holds for reservations PostgreSQL has not
    /// seen), the buyers' marks, the bucket count. Idempotent, safe during a live
    /// sale; prints what changed.
    Rebuild {
        #[arg(long)]
        activity: i64,
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
    let config_file = cli.config.as_deref();
    match cli.command {
        Command::Serve(args) => {
            let mut settings = settings;
            if !args.role.is_empty() {
                settings.server.roles = args.role;
            }
            // Before any actor records a metric.
            crate::telemetry::metrics();
            // actix needs its own System; everything else runs on a plain runtime.
            actix_rt::System::new().block_on(serve::run(&settings))
        }
        Command::Migrate => on_runtime(migrate::run(&settings)),
        Command::Validate => on_runtime(validate::run(&settings, config_file)),
        Command::Activity(ActivityCommand::Create(args)) => {
            on_runtime(activity::create(&settings, args))
        }
        Command::Activity(ActivityCommand::Close { activity }) => {
            on_runtime(activity::close(&settings, activity))
        }
        Command::Check { activity, redis } => on_runtime(check::run(&settings, activity, redis)),
        Command::Diagnose => on_runtime(diagnose::run(&settings)),
        Command::Maintain { activity, force } => {
            on_runtime(maintain::run(&settings, activity, force))
        }
        Command::Reshard { shards } => on_runtime(reshard::run(&settings, shards)),
        Command::Health => health::run(&settings),
        Command::Redis(RedisCommand::Rebuild { activity }) => {
            on_runtime(redis::rebuild(&settings, activity))
        }
    }
}

/// Runs a command other than `serve` to completion on a plain single-threaded runtime.
fn on_runtime(command: impl Future<Output = anyhow::Result<ExitCode>>) -> anyhow::Result<ExitCode> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?
        .block_on(command)
}
