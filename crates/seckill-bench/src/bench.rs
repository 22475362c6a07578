//! `seckill-bench`: the flash-sale run. Creates an activity, drives the buyers
//! (through the HTTP front stage, or straight onto the queue as pre-reserved
//! messages to measure the engine alone), waits until every reservation is settled in
//! PostgreSQL, runs the invariant checks and reports what happened. It talks to a
//! running engine (`serve`) through the configured services.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use chrono::{TimeDelta, Utc};
use clap::{Args, ValueEnum};
use futures_util::stream::{self, StreamExt};
use indicatif::{ProgressBar, ProgressStyle};
use rand::seq::SliceRandom;
use rand::Rng;
use serde::Serialize;
use uuid::Uuid;

use crate::crowd::{self, CrowdReport};
use crate::{cpu, stalls};
pub use cpu::CpuUse;
pub use stalls::HostStalls;

use seckill_engine::actors::intake::{IntakeWork, OrderWork};
use seckill_engine::config::Settings;
use seckill_engine::domain::ids::IdGenerator;
use seckill_engine::domain::message::OrderCreateMessage;
use seckill_engine::domain::shard::shard_for;
use seckill_engine::mq::publisher::ConfirmedPublisher;
use seckill_engine::mq::reconnecting::Reconnecting;
use seckill_engine::mq::topology::Names;
use seckill_engine::mq::MqError;
use seckill_engine::redis::keys::SkuKeys;
use seckill_engine::store::activity::{create_activity, ActivitySpec};
use seckill_engine::store::invariants::run_checks;
use seckill_engine::store::{self, migrate};

use crate::http_client::HttpClient;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Buyers call the HTTP front stage (Redis reservation, then the queue).
    Http,
    /// Pre-reserved messages are published straight to the queue.
    Amqp,
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Units for sale.
    #[arg(long, default_value_t = 10_000)]
    pub stock: i32,
    /// Inventory buckets the stock is split into.
    #[arg(long, default_value_t = 64)]
    pub buckets: i16,
    /// Distinct buyers.
    #[arg(long, default_value_t = 100_000)]
    pub buyers: u32,
    /// Extra requests from buyers clicking again (a new request id each), as a share
    /// of the buyers; in amqp mode, redelivered copies of messages.
    #[arg(long, default_value_t = 0.1)]
    pub duplicate_ratio: f64,
    /// Requests (or unconfirmed publishes) in flight at once.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    #[arg(long, value_enum, default_value_t = Mode::Http)]
    pub mode: Mode,
    /// Activity id to create (default: derived from the clock).
    #[arg(long)]
    pub activity: Option<i64>,
    /// Front stage base URL (default: http://{http.addr}).
    #[arg(long)]
    pub url: Option<String>,
    /// Give up waiting for settlement after this many seconds.
    #[arg(long, default_value_t = 600)]
    pub settle_timeout: u64,
    /// For this many seconds after a failure, send again what a dependency's outage
    /// stopped: a buyer's reservation answered 503 (after its `Retry-After`) or cut
    /// off, with the same request id; in amqp mode a publish whose broker
    /// connection went, with the same message (the inbox answers a copy the broker
    /// had taken). 0: never.
    #[arg(long, default_value_t = 60)]
    pub retry_secs: u64,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// First run the database-only baseline (bench/pgbench: the engine's order
    /// transaction replayed by pgbench, same bucket count) for this many seconds,
    /// and report the engine's figure as a ratio of it.
    #[arg(long)]
    pub pgbench_seconds: Option<u64>,
    /// Publish (amqp mode) or send reservations (http mode) at this many per
    /// second instead of all at once (latency at a given load rather than behind a
    /// backlog; a sale that lasts while `--slow-clients` attack it).
    #[arg(long)]
    pub rate: Option<u32>,
    /// http mode: this many connections beside the sale that trickle a reservation
    /// body one byte per `--trickle-ms`, each opened again once the server closes
    /// it (a slowloris attack, `crowd`), while `/readyz` is probed every 250 ms.
    #[arg(long, default_value_t = 0)]
    pub slow_clients: usize,
    /// http mode: this many idle keep-alive connections beside the sale, each
    /// opened again once the server closes it.
    #[arg(long, default_value_t = 0)]
    pub idle_clients: usize,
    /// Milliseconds between two bytes of a slow client's body.
    #[arg(long, default_value_t = 10_000)]
    pub trickle_ms: u64,
    /// The engine's Prometheus endpoint, read before and after the run for the
    /// reservation → commit latency (default: http://{admin.addr}/metrics). With
    /// several engines, only the one it names is counted.
    #[arg(long)]
    pub metrics_url: Option<String>,
    /// pgbench clients for the baseline (default: the pool size,
    /// `database.pool_size`).
    #[arg(long)]
    pub pgbench_clients: Option<u32>,
    /// With --pgbench-seconds: also replay the same work batched, this many orders
    /// per transaction with set-based statements (bench/pgbench/order_tx_batch.sql),
    /// the database-only figure for group commit; set it to the engine's
    /// engine.batch_max_size.
    #[arg(long)]
    pub pgbench_batch: Option<u32>,
    /// Where the pgbench baseline scripts are (`run`, `order_tx.sql`, ...). Default:
    /// `pgbench/` next to this executable, else `bench/pgbench` under the working
    /// directory (a checkout of the repository).
    #[arg(long)]
    pub pgbench_dir: Option<PathBuf>,
    /// http mode: also write each buyer's credentials to this file before the clock
    /// starts, one line each (`user<TAB>Authorization value<TAB>purchase token`),
    /// for an external load generator to reuse against the sold-out sale
    /// (bench/wrk/sold-out.lua). The purchase tokens expire after
    /// `frontstage.purchase_token.ttl_secs`.
    #[arg(long)]
    pub credentials_out: Option<PathBuf>,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub mode: Mode,
    pub activity_id: i64,
    pub stock: i32,
    pub buckets: i16,
    pub buyers: u32,
    pub requests: u64,
    pub sold: i64,
    pub oversold: i64,
    pub drive_seconds: f64,
    pub time_to_sell_out_seconds: Option<f64>,
    pub settle_seconds: f64,
    pub orders_per_second: f64,
    pub latency_ms: Latency,
    /// Reservation → COMMIT, from the engine's histogram; None if it could not be
    /// read.
    pub commit_latency_ms: Option<RunLatency>,
    /// Publish → the engine's intake, from its histogram of order messages' age:
    /// the broker's part of `commit_latency_ms` (in HTTP mode, from the front
    /// stage's publish), so that a tail can be told apart as the broker's or the
    /// engine's. None if it could not be read.
    pub intake_age_ms: Option<RunLatency>,
    /// This host's CPU from the start of the drive until all was settled; None
    /// where `/proc` cannot be read.
    pub cpu: Option<CpuUse>,
    /// Stalls of the host's cores over the same time, seen by a probe thread; None
    /// if the probe could not run.
    pub host_stalls: Option<HostStalls>,
    /// Orders written more than 50 ms after their reservation, and how many of them
    /// were in flight (reserved before a host stall ended, written after it began)
    /// while the host stalled; None without the probe.
    pub slow_orders: Option<SlowOrders>,
    /// Requests or publishes sent again after a 503, a cut connection or a lost
    /// broker (`--retry-secs`); `responses` counts each one's last answer.
    pub retried: u64,
    pub responses: BTreeMap<String, u64>,
    pub outcomes: BTreeMap<String, i64>,
    pub checks: BTreeMap<String, i64>,
    pub passed: bool,
    /// The pgbench baselines of the same run, when asked for: one order per
    /// transaction, and `--pgbench-batch` orders per transaction.
    pub baseline: Option<Baseline>,
    pub batched_baseline: Option<Baseline>,
    /// The hostile crowd's account, with `--slow-clients` or `--idle-clients`.
    pub crowd: Option<CrowdReport>,
    /// The longest time between two consecutive orders of the sale.
    pub max_order_gap_ms: Option<f64>,
}

#[derive(Debug, Serialize)]
pub struct SlowOrders {
    /// Reservation → order row (INSERT) over 50 ms.
    pub over_50ms: i64,
    pub in_host_stalls: i64,
}

/// The database-only figure: `bench/pgbench/run` on the same server.
#[derive(Debug, Serialize)]
pub struct Baseline {
    pub clients: u32,
    /// Orders per transaction.
    pub batch: u32,
    pub orders_per_second: f64,
    pub latency_ms: f64,
    /// The engine's orders/s divided by the baseline's.
    pub engine_ratio: f64,
}

/// One of the engine's latency histograms over the run (the difference of two
/// scrapes): percentiles interpolated within its buckets, and the exact share of
/// messages within 50 ms (a bucket bound).
#[derive(Debug, Serialize)]
pub struct RunLatency {
    pub messages: u64,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub within_50ms: f64,
}

#[derive(Debug, Serialize)]
pub struct Latency {
    /// From the reservation (HTTP) or the publish (amqp) to the order row written in
    /// the committing transaction (its INSERT's statement time, before the COMMIT).
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

pub async fn run(settings: &Settings, args: BenchArgs) -> anyhow::Result<Report> {
    if args.stock < 0 || args.buyers == 0 || args.concurrency == 0 {
        bail!("--stock must be >= 0, --buyers and --concurrency > 0");
    }
    // Purchase tokens are fetched before the clock starts: a paced run longer than
    // their lifetime would see its last buyers refused (403) for a setting, not for
    // anything the sale did.
    let tokens = &settings.frontstage.purchase_token;
    if let (Mode::Http, Some(rate), true) =
        (args.mode, args.rate.filter(|r| *r > 0), tokens.required)
    {
        let requests = f64::from(args.buyers) * (1.0 + args.duplicate_ratio);
        let lasts = (requests / f64::from(rate)).ceil() as u64;
        if lasts + 5 > tokens.ttl_secs {
            bail!(
                "--rate {rate} makes the drive last about {lasts} s, and purchase tokens expire after frontstage.purchase_token.ttl_secs = {} s: set SECKILL__FRONTSTAGE__PURCHASE_TOKEN__TTL_SECS to at least {} for the engine and the bench",
                tokens.ttl_secs,
                lasts + 30
            );
        }
    }
    refuse_a_run_the_limits_would_stop(settings, &args)?;
    let activity_id = args
        .activity
        .unwrap_or_else(|| Utc::now().timestamp_millis());
    let config = store::pg_config(&settings.database)?;
    let mut db = store::connect(&config)
        .await
        .context("connecting to PostgreSQL")?;
    migrate::verify(&mut db).await?;
    if args.mode == Mode::Amqp {
        check_order_queues(settings, args.settle_timeout).await?;
    }
    let clients = args.pgbench_clients.unwrap_or(settings.database.pool_size);
    let baselines = match args.pgbench_seconds {
        Some(seconds) => {
            let script = pgbench_script(args.pgbench_dir.as_deref())?;
            let single = pgbench(&script, &config, args.buckets, clients, seconds, 1)?;
            let batched = match args.pgbench_batch {
                Some(batch) if batch > 1 => Some(pgbench(
                    &script,
                    &config,
                    args.buckets,
                    clients,
                    seconds,
                    batch,
                )?),
                Some(_) => bail!("--pgbench-batch must be at least 2"),
                None => None,
            };
            vec![Some(single), batched]
        }
        None if args.pgbench_batch.is_some() => {
            bail!("--pgbench-batch needs --pgbench-seconds")
        }
        None => vec![None, None],
    };
    let now = Utc::now();
    let spec = ActivitySpec {
        activity_id,
        sku_id: 1,
        title: "bench".into(),
        stock: args.stock,
        buckets: args.buckets,
        unit_price: 9_900,
        currency: "CNY".into(),
        starts_at: now - TimeDelta::seconds(1),
        ends_at: now + TimeDelta::hours(2),
        order_ttl_ms: 3_600_000,
    };
    let split = create_activity(&mut db, &spec).await?;
    let keys = SkuKeys::new(&settings.redis.key_prefix, activity_id, 1);
    let mut redis = seckill_engine::redis::connect(&settings.redis).await?;
    seckill_engine::redis::load_stock(&mut redis, &keys, &split, spec.ends_at).await?;
    // From here the sale exists: a run that fails closes it, so no live sale is
    // left behind selling to nobody (issue 51).
    let outcome: anyhow::Result<Report> = async {
    println!(
        "bench: activity {activity_id}, stock {} over {} buckets, {} buyers, {:.0}% duplicates, mode {:?}, concurrency {}",
        args.stock, args.buckets, args.buyers, args.duplicate_ratio * 100.0, args.mode, args.concurrency
    );

    let metrics_url = args
        .metrics_url
        .clone()
        .unwrap_or_else(|| format!("http://{}/metrics", settings.admin.addr));
    // Buyers sign in and fetch their purchase tokens before the clock starts.
    let buyers = match args.mode {
        Mode::Http => Some(prepare_http(settings, &args, activity_id).await?),
        Mode::Amqp => None,
    };
    if let Some(path) = &args.credentials_out {
        let buyers = buyers
            .as_ref()
            .context("--credentials-out needs --mode http")?;
        write_credentials(path, &buyers.credentials)?;
    }
    let crowd = match &buyers {
        Some(buyers) if args.slow_clients + args.idle_clients > 0 => {
            Some(start_crowd(settings, &args, buyers, activity_id, &metrics_url).await?)
        }
        None if args.slow_clients + args.idle_clients > 0 => {
            bail!("--slow-clients and --idle-clients need --mode http")
        }
        _ => None,
    };
    let metrics_before = scrape(&metrics_url).await;
    let cpu_before = cpu::Reading::take();
    let probe = stalls::Probe::start();
    let started = Instant::now();
    let start_time = Utc::now();
    let (responses, expected, retried) = match args.mode {
        Mode::Http => drive_http(&args, buyers.context("buyers prepared for http")?).await?,
        Mode::Amqp => drive_amqp(settings, &args, activity_id).await?,
    };
    let drive_seconds = started.elapsed().as_secs_f64();
    let requests = responses.values().sum();

    // Wait until every reservation that reached the queue has its outcome.
    let spinner = ProgressBar::new(expected);
    spinner.set_style(bar_style("settling"));
    let deadline = Instant::now() + Duration::from_secs(args.settle_timeout);
    loop {
        let row = match db.query_one(SETTLED, &[&activity_id]).await {
            Ok(row) => row,
            // The bench's own session broke (a fail-over, a restart): the engine
            // rides through it, and so does the count, on a new session.
            Err(e) if db.is_closed() => {
                spinner.suspend(|| {
                    println!("bench: the database session broke ({e}); reconnecting")
                });
                db = reconnect(&config, deadline).await?;
                continue;
            }
            Err(e) => return Err(e).context("counting settled reservations"),
        };
        let (settled, pending): (i64, i64) = (row.get(0), row.get(1));
        spinner.set_position(settled.max(0) as u64);
        if settled as u64 >= expected && pending == 0 {
            break;
        }
        if Instant::now() > deadline {
            spinner.abandon();
            bail!(
                "only {settled} of {expected} reservations settled within {}s",
                args.settle_timeout
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    spinner.finish_and_clear();
    let settle_seconds = started.elapsed().as_secs_f64();
    if args.mode == Mode::Amqp {
        // The amqp mode publishes orders straight to the queues: no unit was taken
        // from Redis, yet the engine's give-backs of rejected reservations return
        // theirs. Once they are done, the sale's keys are set to PostgreSQL's
        // figures, so `check --redis` reads the run clean (issue 51).
        loop {
            let left: i64 = db.query_one(GIVE_BACKS_LEFT, &[&activity_id]).await?.get(0);
            if left == 0 {
                break;
            }
            if Instant::now() > deadline {
                bail!("{left} Redis give-backs still pending after {}s", args.settle_timeout);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // On a connection of its own: Redis may have restarted since the stock was
        // loaded, and the rebuild puts back whatever it lost.
        loop {
            let rebuilt = match seckill_engine::redis::connect(&settings.redis).await {
                Ok(mut fresh) => seckill_engine::rebuild::rebuild_activity(
                    &db,
                    &mut fresh,
                    &settings.redis.key_prefix,
                    activity_id,
                )
                .await
                .map(drop)
                .map_err(anyhow::Error::from),
                Err(e) => Err(e.into()),
            };
            match rebuilt {
                Ok(()) => break,
                Err(e) if Instant::now() < deadline => {
                    println!("bench: setting the sale's Redis keys failed ({e:#}); trying again");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Err(e) => {
                    return Err(e).context("setting the sale's Redis keys to PostgreSQL's figures")
                }
            }
        }
        println!("bench: amqp mode took no unit from Redis; the sale's Redis keys now hold PostgreSQL's figures");
    }
    let crowd = match crowd {
        Some(crowd) => Some(crowd.finish().await),
        None => None,
    };
    let cpu_after = cpu::Reading::take();
    let host_stalls = probe.and_then(stalls::Probe::finish);
    let (commit_latency, intake_age) = match (metrics_before, scrape(&metrics_url).await) {
        (Ok(before), Ok(after)) => {
            let run = |name: &str, labels: &str| {
                run_latency(
                    &parse_buckets(&before, name, labels),
                    &parse_buckets(&after, name, labels),
                )
            };
            (
                run(
                    seckill_engine::telemetry::names::ORDER_COMMIT_LATENCY_SECONDS,
                    "",
                ),
                run(
                    seckill_engine::telemetry::names::INTAKE_MESSAGE_AGE_SECONDS,
                    &kind_labels(<OrderWork as IntakeWork>::KIND),
                ),
            )
        }
        (Err(e), _) | (_, Err(e)) => {
            println!("bench: no commit or intake latency from the engine ({metrics_url}: {e:#})");
            (None, None)
        }
    };

    let (starts, ends): (Vec<f64>, Vec<f64>) = host_stalls
        .iter()
        .flat_map(|h| h.windows.iter().copied())
        .unzip();
    let stats = db
        .query_one(STATS, &[&activity_id, &start_time, &starts, &ends])
        .await?;
    let sold: i64 = stats.get(0);
    let last_order: Option<f64> = stats.get(1);
    let lat: Vec<Option<f64>> = vec![stats.get(2), stats.get(3), stats.get(4), stats.get(5)];
    let slow_orders = host_stalls.as_ref().map(|_| SlowOrders {
        over_50ms: stats.get(6),
        in_host_stalls: stats.get(7),
    });
    let outcomes: BTreeMap<String, i64> = db
        .query(OUTCOMES, &[&activity_id])
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let checks_run = run_checks(&db, Some(activity_id), settings.retention.inbox_window()).await?;
    let oversold = (sold - i64::from(args.stock)).max(0);
    // Messages the broker refused never reached the engine: such a run measured less
    // than it was asked to, whatever its checks say.
    let refused = responses.get(PUBLISH_FAILED).copied().unwrap_or(0);
    let max_order_gap_ms: Option<f64> = db.query_one(ORDER_GAP, &[&activity_id]).await?.get(0);
    // Under attack, the door held: readiness answered throughout, and orders were
    // made throughout (no pause of 2 s or more between two of them).
    let held = crowd
        .as_ref()
        .is_none_or(|c| c.readyz_failed == 0 && max_order_gap_ms.is_none_or(|gap| gap < 2_000.0));
    let passed = oversold == 0 && refused == 0 && held && checks_run.iter().all(|c| c.ok());
    let window = last_order.unwrap_or(drive_seconds).max(1e-3);
    let report = Report {
        mode: args.mode,
        activity_id,
        stock: args.stock,
        buckets: args.buckets,
        buyers: args.buyers,
        requests,
        sold,
        oversold,
        drive_seconds,
        time_to_sell_out_seconds: (sold == i64::from(args.stock)).then_some(window),
        settle_seconds,
        orders_per_second: sold as f64 / window,
        latency_ms: Latency {
            p50: lat[0].unwrap_or(0.0),
            p95: lat[1].unwrap_or(0.0),
            p99: lat[2].unwrap_or(0.0),
            max: lat[3].unwrap_or(0.0),
        },
        commit_latency_ms: commit_latency,
        intake_age_ms: intake_age,
        cpu: cpu_before
            .zip(cpu_after)
            .map(|(before, after)| before.until(&after, sold)),
        host_stalls,
        slow_orders,
        retried,
        responses,
        outcomes,
        checks: checks_run
            .iter()
            .map(|c| (c.name.to_owned(), c.violations))
            .collect(),
        passed,
        baseline: None,
        batched_baseline: None,
        crowd,
        max_order_gap_ms,
    };
    let engine = sold as f64 / window;
    let [single, batched] = [baselines[0], baselines[1]].map(|b| {
        b.map(|(batch, orders, latency)| Baseline {
            clients,
            batch,
            orders_per_second: orders,
            latency_ms: latency,
            engine_ratio: engine / orders.max(1e-9),
        })
    });
    let report = Report {
        baseline: single,
        batched_baseline: batched,
        ..report
    };
    print_report(&report);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
        Ok(report)
    }
    .await;
    if let Err(e) = &outcome {
        match close_after_abort(&config, activity_id).await {
            Ok(()) => println!("bench: aborted ({e:#}); activity {activity_id} closed"),
            Err(close) => println!(
                "bench: aborted ({e:#}); activity {activity_id} could not be closed ({close:#}): \
                 close it with `seckill-engine activity close --activity {activity_id}`"
            ),
        }
    }
    outcome
}

/// A new session, retried until `deadline` (a promoted standby takes a few seconds
/// to accept writes; `database.url` names every server).
async fn reconnect(
    config: &store::PgTarget,
    deadline: Instant,
) -> anyhow::Result<tokio_postgres::Client> {
    loop {
        match store::connect(config).await {
            Ok(db) => return Ok(db),
            Err(e) if Instant::now() > deadline => {
                return Err(e).context("reconnecting to PostgreSQL")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

/// Closes the bench's sale after an aborted run, on a connection of its own (the
/// run's may be the reason it aborted).
async fn close_after_abort(config: &store::PgTarget, activity_id: i64) -> anyhow::Result<()> {
    let db = store::connect(config).await?;
    seckill_engine::store::activity::close_activity(&db, activity_id).await?;
    Ok(())
}

/// Refuses, before anything is created, an HTTP run the engine's own rate limits
/// would stop: the bench's buyers all come from this host's one address, so the
/// per-address limit (read from the same configuration as the engine's) refuses
/// them after its burst.
fn refuse_a_run_the_limits_would_stop(settings: &Settings, args: &BenchArgs) -> anyhow::Result<()> {
    let limits = &settings.frontstage.rate_limit;
    if args.mode != Mode::Http || limits.per_address_per_s == 0 {
        return Ok(());
    }
    let requests = (f64::from(args.buyers) * (1.0 + args.duplicate_ratio)).ceil() as u64;
    let within = u64::from(limits.per_address_burst);
    let paced = args
        .rate
        .is_some_and(|rate| rate > 0 && rate <= limits.per_address_per_s);
    if requests > within && !paced {
        bail!(
            "the engine's per-address limit (frontstage.rate_limit.per_address_per_s = {}, burst {}) would refuse \
             this run: its {requests} requests all come from one address. For a load test set \
             SECKILL__FRONTSTAGE__RATE_LIMIT__PER_ADDRESS_PER_S=0 for the engine and the bench, or pace the \
             run with --rate {} or less",
            limits.per_address_per_s,
            limits.per_address_burst,
            limits.per_address_per_s
        );
    }
    Ok(())
}

/// The labels of one of the intake's series for a queue kind (`IntakeWork::KIND`),
/// as exported before `le`.
fn kind_labels(kind: &str) -> String {
    format!("kind=\"{kind}\",")
}

/// The engine's metrics page.
async fn scrape(url: &str) -> anyhow::Result<String> {
    let res = HttpClient::new(Duration::from_secs(5))
        .get(url, &[])
        .await?;
    Ok(String::from_utf8_lossy(&res.body).into_owned())
}

/// The cumulative buckets (upper bound in seconds, count) of one histogram of a
/// Prometheus text page: its `NAME_bucket{LABELSle="X"} N` lines, where `labels`
/// is the series' other labels as exported (`kind="x",`; empty for none). A
/// histogram never recorded has none.
fn parse_buckets(page: &str, name: &str, labels: &str) -> Vec<(f64, u64)> {
    let prefix = format!("{name}_bucket{{{labels}le=\"");
    let mut buckets: Vec<(f64, u64)> = page
        .lines()
        .filter_map(|line| {
            let (le, count) = line.strip_prefix(&prefix)?.split_once("\"} ")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, count.trim().parse().ok()?))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    buckets
}

/// The run's share of a histogram: `after` minus `before`, bucket by bucket.
fn run_latency(before: &[(f64, u64)], after: &[(f64, u64)]) -> Option<RunLatency> {
    let run: Vec<(f64, u64)> = after
        .iter()
        .map(|&(le, n)| {
            let earlier = before.iter().find(|b| b.0 == le).map_or(0, |b| b.1);
            (le, n.saturating_sub(earlier))
        })
        .collect();
    let total = run.last()?.1;
    if total == 0 {
        return None;
    }
    // Linear within the bucket the rank falls in, from the bound below it.
    let quantile = |q: f64| {
        let rank = q * total as f64;
        let (mut lower, mut below) = (0.0, 0u64);
        for &(le, n) in &run {
            if n as f64 >= rank {
                if le.is_infinite() {
                    return lower * 1000.0;
                }
                let share = (rank - below as f64) / (n - below).max(1) as f64;
                return (lower + (le - lower) * share) * 1000.0;
            }
            (lower, below) = (le, n);
        }
        lower * 1000.0
    };
    let within = run.iter().find(|b| b.0 == 0.05).map(|b| b.1)?;
    Some(RunLatency {
        messages: total,
        p50: quantile(0.50),
        p95: quantile(0.95),
        p99: quantile(0.99),
        within_50ms: within as f64 / total as f64,
    })
}

/// The reference schema (migration V1) the pgbench replay is set up with.
const V1_SCHEMA: &str = include_str!("../../../migrations/V1__schema.sql");

/// Finds the pgbench baseline's `run` script at run time, so a copied binary can
/// run its baseline too: the flag, else `pgbench/` beside the executable, else
/// `bench/pgbench` under the working directory.
fn pgbench_script(dir: Option<&std::path::Path>) -> anyhow::Result<PathBuf> {
    let candidates: Vec<PathBuf> = match dir {
        Some(dir) => vec![dir.to_path_buf()],
        None => {
            let mut c = Vec::new();
            if let Some(exe_dir) = std::env::current_exe()
                .ok()
                .and_then(|exe| exe.parent().map(|d| d.to_path_buf()))
            {
                c.push(exe_dir.join("pgbench"));
            }
            c.push(PathBuf::from("bench/pgbench"));
            c
        }
    };
    for dir in &candidates {
        let script = dir.join("run");
        if script.is_file() {
            return Ok(script);
        }
    }
    let tried: Vec<String> = candidates.iter().map(|d| d.display().to_string()).collect();
    bail!(
        "the pgbench baseline scripts were not found (looked for run in {}); pass --pgbench-dir",
        tried.join(", ")
    )
}

/// Runs the pgbench baseline's `run` script against the engine's PostgreSQL server:
/// (batch, orders/s, latency ms).
fn pgbench(
    script: &std::path::Path,
    config: &tokio_postgres::Config,
    buckets: i16,
    clients: u32,
    seconds: u64,
    batch: u32,
) -> anyhow::Result<(u32, f64, f64)> {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        _ => "127.0.0.1".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user().unwrap_or("postgres");
    println!(
        "bench: pgbench baseline, {buckets} buckets, {clients} clients, {batch} orders per transaction, {seconds} s ..."
    );
    // The reference DDL the replay runs on, carried in this binary so that a copied
    // bench needs only its pgbench/ folder beside it.
    let schema =
        std::env::temp_dir().join(format!("seckill-bench-schema-{}.sql", std::process::id()));
    std::fs::write(&schema, V1_SCHEMA).with_context(|| format!("writing {}", schema.display()))?;
    let out = std::process::Command::new(script)
        .args([
            "--buckets",
            &buckets.to_string(),
            "--clients",
            &clients.to_string(),
            "--seconds",
            &seconds.to_string(),
            "--batch",
            &batch.to_string(),
        ])
        .env("PGHOST", host)
        .env("PGPORT", port.to_string())
        .env("PGUSER", user)
        .env("SECKILL_SCHEMA_FILE", &schema)
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    let _ = std::fs::remove_file(&schema);
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!("{} failed ({}): {text}", script.display(), out.status);
    }
    let line = text
        .lines()
        .find(|l| l.starts_with("pgbench "))
        .with_context(|| format!("no result line in: {text}"))?;
    let field = |name: &str| {
        line.split_whitespace()
            .find_map(|kv| {
                kv.strip_prefix(name)?
                    .strip_prefix('=')?
                    .parse::<f64>()
                    .ok()
            })
            .with_context(|| format!("no {name} in {line}"))
    };
    Ok((batch, field("orders_per_s")?, field("latency_ms")?))
}

fn bar_style(what: &str) -> ProgressStyle {
    ProgressStyle::with_template(&format!(
        "{what:>9} [{{elapsed_precise}}] {{bar:40}} {{pos}}/{{len}} {{per_sec}}"
    ))
    .unwrap_or_else(|_| ProgressStyle::default_bar())
}

/// `--credentials-out`: one line per buyer, in user order.
fn write_credentials(
    path: &std::path::Path,
    credentials: &HashMap<i64, Credentials>,
) -> anyhow::Result<()> {
    use std::io::Write;
    let mut users: Vec<&i64> = credentials.keys().collect();
    users.sort_unstable();
    let file =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut out = std::io::BufWriter::new(file);
    for user in users {
        let (bearer, purchase) = &credentials[user];
        writeln!(
            out,
            "{user}\t{bearer}\t{}",
            purchase.as_deref().unwrap_or("")
        )?;
    }
    out.flush()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Buyers, shuffled, with `duplicate_ratio` extra clicks from random buyers.
fn buyer_sequence(args: &BenchArgs) -> Vec<i64> {
    let mut rng = rand::rng();
    let buyers = i64::from(args.buyers);
    let extra = (f64::from(args.buyers) * args.duplicate_ratio.max(0.0)) as usize;
    let mut users: Vec<i64> = (1..=buyers).collect();
    users.extend((0..extra).map(|_| rng.random_range(1..=buyers)));
    users.shuffle(&mut rng);
    users
}

/// The http run's buyers, signed in before the clock: the click sequence, and each
/// buyer's bearer token and purchase token (`None` where none is required).
struct HttpBuyers {
    url: String,
    users: Vec<i64>,
    credentials: HashMap<i64, Credentials>,
}

/// A buyer's `Authorization` value and purchase token (`None`: none is required).
type Credentials = (String, Option<String>);

/// Signs each buyer's JWT with the configured secret and fetches each one's
/// purchase token for the sale (a 404 "not required" leaves it out).
async fn prepare_http(
    settings: &Settings,
    args: &BenchArgs,
    activity_id: i64,
) -> anyhow::Result<HttpBuyers> {
    let base = args
        .url
        .clone()
        .unwrap_or_else(|| format!("http://{}", settings.http.addr));
    let secret = settings.frontstage.auth.hs256_secret.clone().context(
        "--mode http needs frontstage.auth.hs256_secret (SECKILL__FRONTSTAGE__AUTH__HS256_SECRET), the engine's, to sign the buyers' tokens",
    )?;
    let users = buyer_sequence(args);
    let distinct: Vec<i64> = {
        let mut d = users.clone();
        d.sort_unstable();
        d.dedup();
        d
    };
    let client = HttpClient::new(Duration::from_secs(30));
    let token_url = format!("{base}/v1/activities/{activity_id}/skus/1/purchase-token");
    let bar = ProgressBar::new(distinct.len() as u64);
    bar.set_style(bar_style("signing in"));
    let fetched: Vec<anyhow::Result<(i64, Credentials)>> = stream::iter(distinct)
        .map(|user| {
            let (client, token_url, bar, secret) = (&client, &token_url, &bar, &secret);
            async move {
                let bearer = format!(
                    "Bearer {}",
                    seckill_engine::http::auth::issue_hs256(
                        secret,
                        user,
                        Duration::from_secs(3600)
                    )?
                );
                let res = client
                    .get(token_url, &[("Authorization", bearer.as_str())])
                    .await
                    .map_err(|e| anyhow::anyhow!("purchase token for user {user}: {e}"))?;
                let status = res.status;
                let body = res.json();
                bar.inc(1);
                let purchase = match status {
                    200 => Some(
                        body["token"]
                            .as_str()
                            .context("purchase-token answer without a token")?
                            .to_owned(),
                    ),
                    404 if body["error"] == "purchase tokens are not required here" => None,
                    _ => bail!("purchase token for user {user}: {status} {body}"),
                };
                Ok((user, (bearer, purchase)))
            }
        })
        .buffer_unordered(args.concurrency)
        .collect()
        .await;
    bar.finish_and_clear();
    Ok(HttpBuyers {
        url: format!("{base}/v1/activities/{activity_id}/skus/1/reservations"),
        users,
        credentials: fetched.into_iter().collect::<anyhow::Result<_>>()?,
    })
}

/// The crowd beside an http run: its slow clients sign in as users who are not
/// buyers, the front stage's address is the run's, `/readyz` is beside the
/// metrics. It gets two seconds to gather before the sale starts.
async fn start_crowd(
    settings: &Settings,
    args: &BenchArgs,
    buyers: &HttpBuyers,
    activity_id: i64,
    metrics_url: &str,
) -> anyhow::Result<crowd::Crowd> {
    raise_open_files(args.slow_clients + args.idle_clients);
    let base = buyers.url.split("/v1/").next().unwrap_or_default();
    let front = base
        .trim_start_matches("http://")
        .to_socket_addrs_first()
        .context("the front stage's address (--url)")?;
    let secret = settings
        .frontstage
        .auth
        .hs256_secret
        .clone()
        .context("the crowd signs in like buyers: frontstage.auth.hs256_secret")?;
    let bearers = (0..args.slow_clients.clamp(1, 5_000))
        .map(|i| {
            seckill_engine::http::auth::issue_hs256(
                &secret,
                900_000_000 + i as i64,
                Duration::from_secs(3_600),
            )
            .map(|t| format!("Bearer {t}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let target = crowd::Target {
        front,
        path: format!("/v1/activities/{activity_id}/skus/1/reservations"),
        bearers,
        readyz: metrics_url.replace("/metrics", "/readyz"),
        trickle: Duration::from_millis(args.trickle_ms.max(1)),
    };
    let crowd = crowd::Crowd::start(target, args.slow_clients, args.idle_clients);
    tokio::time::sleep(Duration::from_secs(2)).await;
    Ok(crowd)
}

/// The crowd needs a descriptor per connection: the soft limit goes up to the hard
/// one (as the engine does), and says so if that is still short.
fn raise_open_files(connections: usize) {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let limit = getrlimit(Resource::Nofile);
    let mut raised = limit;
    raised.current = limit.maximum;
    let _ = setrlimit(Resource::Nofile, raised);
    let now = getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX);
    if now < connections as u64 + 256 {
        println!("bench: only {now} open files allowed; the crowd of {connections} will see connect errors");
    }
}

trait FirstAddr {
    fn to_socket_addrs_first(&self) -> Option<std::net::SocketAddr>;
}

impl FirstAddr for str {
    fn to_socket_addrs_first(&self) -> Option<std::net::SocketAddr> {
        use std::net::ToSocketAddrs;
        self.trim_end_matches('/').to_socket_addrs().ok()?.next()
    }
}

/// Returns the response counts and how many reservations reached the queue.
async fn drive_http(
    args: &BenchArgs,
    buyers: HttpBuyers,
) -> anyhow::Result<(BTreeMap<String, u64>, u64, u64)> {
    let HttpBuyers {
        url,
        users,
        credentials,
    } = buyers;
    let bar = ProgressBar::new(users.len() as u64);
    bar.set_style(bar_style("buyers"));
    let client = HttpClient::new(Duration::from_secs(30));
    let rate = args.rate.filter(|r| *r > 0).map(f64::from);
    let start = tokio::time::Instant::now();
    let retried = AtomicU64::new(0);
    let retry_for = Duration::from_secs(args.retry_secs);
    let statuses: Vec<String> = stream::iter(users.into_iter().enumerate())
        .map(|(k, user)| {
            let (client, url, bar, credentials, retried) =
                (&client, &url, &bar, &credentials, &retried);
            async move {
                if let Some(rate) = rate {
                    tokio::time::sleep_until(start + Duration::from_secs_f64(k as f64 / rate))
                        .await;
                }
                let body = serde_json::json!({"request_id": Uuid::now_v7()});
                let Some((bearer, purchase)) = credentials.get(&user) else {
                    bar.inc(1);
                    return "error: a buyer without credentials".to_owned();
                };
                let mut headers = vec![("Authorization", bearer.as_str())];
                if let Some(purchase) = purchase {
                    headers.push(("X-Purchase-Token", purchase.as_str()));
                }
                // A buyer whose reservation met an outage (503, or no answer) tries
                // again with the same request id, as the API asks: the front stage
                // answers a retried request with its first outcome.
                let deadline = tokio::time::Instant::now() + retry_for;
                let label = loop {
                    let answer = client.post_json(url, &headers, &body).await;
                    let wait = match &answer {
                        Ok(res) if res.status == 503 => {
                            res.retry_after.unwrap_or(Duration::from_secs(1))
                        }
                        Ok(_) => Duration::ZERO,
                        Err(_) => Duration::from_millis(500),
                    };
                    if wait.is_zero() || tokio::time::Instant::now() + wait > deadline {
                        break match answer {
                            Ok(res) => {
                                let json = res.json();
                                format!("{} {}", res.status, json["status"].as_str().unwrap_or(""))
                            }
                            Err(e) => format!("error {e}"),
                        };
                    }
                    retried.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(wait.min(MAX_RETRY_WAIT)).await;
                };
                bar.inc(1);
                label
            }
        })
        .buffer_unordered(args.concurrency)
        .collect()
        .await;
    bar.finish_and_clear();
    let mut counts = BTreeMap::new();
    for s in statuses {
        *counts.entry(s).or_insert(0) += 1;
    }
    let queued = counts.get("202 QUEUED").copied().unwrap_or(0);
    Ok((counts, queued, retried.into_inner()))
}

/// The longest a retry waits, whatever a `Retry-After` says.
const MAX_RETRY_WAIT: Duration = Duration::from_secs(5);

/// Before anything is created or published: every order queue must exist, or the
/// broker would drop (or refuse) what is routed to it. A missing queue means that no
/// engine with this configuration has declared the topology: none started yet, or
/// one with another `amqp.namespace`. A queue that nobody consumes is fine, since a
/// backlog run starts its engine after publishing, but worth a word: without an
/// engine the run only ends at the settle timeout.
async fn check_order_queues(settings: &Settings, settle_timeout: u64) -> anyhow::Result<()> {
    let conn = seckill_engine::mq::connect(&settings.amqp, "seckill-bench-check")
        .await
        .context("connecting to RabbitMQ")?;
    let channel = conn.create_channel().await?;
    let names = Names::new(&settings.amqp.namespace);
    let mut unconsumed = Vec::new();
    let mut missing = None;
    for shard in 0..settings.amqp.shards {
        let queue = names.order_queue(shard);
        match seckill_engine::mq::queue_counts(&channel, &queue).await {
            Ok(counts) if counts.consumers == 0 => unconsumed.push(queue),
            Ok(_) => {}
            Err(e) => {
                missing = Some((queue, e));
                break;
            }
        }
    }
    seckill_engine::mq::close(&conn, &[&channel]).await;
    if let Some((queue, e)) = missing {
        bail!(
            "the order queue {queue} cannot be used ({e}); start `seckill-engine serve` \
             with this configuration first: it declares the queues"
        );
    }
    if !unconsumed.is_empty() {
        eprintln!(
            "bench: nothing consumes {} yet; the run waits up to {settle_timeout} s (--settle-timeout) for an engine to settle its messages",
            unconsumed.join(", ")
        );
    }
    Ok(())
}

async fn drive_amqp(
    settings: &Settings,
    args: &BenchArgs,
    activity_id: i64,
) -> anyhow::Result<(BTreeMap<String, u64>, u64, u64)> {
    let ids = IdGenerator::new(seckill_engine::domain::ids::MAX_NODE_ID - 1);
    let now = Utc::now();
    let msgs: Vec<OrderCreateMessage> = (1..=i64::from(args.buyers))
        .map(|user| {
            let order_id = ids
                .next_id()
                .expect("a generator without a lease always mints");
            OrderCreateMessage::pre_reserved(
                order_id,
                (activity_id, 1, user),
                seckill_engine::redis::scripts::user_bucket(user, args.buckets),
                now,
                now + TimeDelta::hours(1),
            )
        })
        .collect();
    // Redelivered copies: the same message (same message_id) again.
    let extra = (msgs.len() as f64 * args.duplicate_ratio.max(0.0)) as usize;
    let mut order: Vec<usize> = (0..msgs.len()).collect();
    let mut rng = rand::rng();
    order.extend((0..extra).map(|_| rng.random_range(0..msgs.len())));
    order.shuffle(&mut rng);

    // Reopened after the broker or the connection went (`--retry-secs`).
    let publisher = Reconnecting::<ConfirmedPublisher>::new(&settings.amqp, "seckill-bench");
    publisher.get().await?;
    let retried = AtomicU64::new(0);
    let retry_for = Duration::from_secs(args.retry_secs);
    let names = Names::new(&settings.amqp.namespace);
    let exchange = names.orders_exchange();
    let bar = ProgressBar::new(order.len() as u64);
    bar.set_style(bar_style("publish"));
    let failures = Arc::new(AtomicU64::new(0));
    // Which messages the broker took, at least one copy each: only those can settle.
    let accepted: Vec<AtomicBool> = (0..msgs.len()).map(|_| AtomicBool::new(false)).collect();
    // A redelivered copy must be byte-identical to the first: bodies are built once,
    // stamped at their first publish (latency is measured from there).
    let bodies: Vec<std::sync::OnceLock<Vec<u8>>> = (0..msgs.len())
        .map(|_| std::sync::OnceLock::new())
        .collect();
    let started = tokio::time::Instant::now();
    let rate = args.rate.filter(|r| *r > 0).map(f64::from);
    stream::iter(order.into_iter().enumerate())
        .for_each_concurrent(args.concurrency, |(k, i)| {
            let (publisher, exchange, bar, failures, accepted, msgs, bodies, retried) = (
                &publisher, &exchange, &bar, &failures, &accepted, &msgs, &bodies, &retried,
            );
            async move {
                if let Some(rate) = rate {
                    // Due times rounded up to a pacing tick: the messages of one tick
                    // go out together, one timer wakeup for all of them.
                    let ticks = (k as f64 / rate / PACING_TICK.as_secs_f64()).ceil();
                    tokio::time::sleep_until(started + PACING_TICK.mul_f64(ticks)).await;
                }
                let m = &msgs[i];
                let shard = shard_for(
                    m.activity_id,
                    m.sku_id,
                    m.inventory_bucket,
                    settings.amqp.shards,
                );
                let body = bodies[i].get_or_init(|| {
                    let mut m = m.clone();
                    m.reserved_at = Utc::now();
                    serde_json::to_vec(&m).unwrap_or_default()
                });
                let props = seckill_engine::mq::order_properties(
                    &m.message_id.to_string(),
                    body,
                    settings.amqp.order_signing_secret.as_ref(),
                );
                let key = Names::order_routing_key(shard);
                let deadline = tokio::time::Instant::now() + retry_for;
                loop {
                    let sent = match publisher.get().await {
                        Ok(channel) => channel.publish(exchange, &key, body, props.clone()).await,
                        Err(e) => Err(e),
                    };
                    match sent {
                        Ok(()) => accepted[i].store(true, Ordering::Relaxed),
                        // The broker or the link went: the same message again on a
                        // new connection (a copy it had taken is answered by the
                        // inbox). A refusal (nack, nowhere to route) is final.
                        Err(e) if lost_broker(&e) && tokio::time::Instant::now() < deadline => {
                            retried.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(200)).await;
                            continue;
                        }
                        Err(_) => {
                            failures.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    break;
                }
                bar.inc(1);
            }
        })
        .await;
    bar.finish_and_clear();
    publisher.close().await;
    let failed = failures.load(Ordering::Relaxed);
    let mut counts = BTreeMap::new();
    counts.insert("published".to_owned(), (msgs.len() + extra) as u64 - failed);
    if failed > 0 {
        counts.insert(PUBLISH_FAILED.to_owned(), failed);
    }
    let queued = accepted
        .iter()
        .filter(|a| a.load(Ordering::Relaxed))
        .count();
    Ok((counts, queued as u64, retried.into_inner()))
}

/// Whether a publish failed because the broker or the link to it went (the
/// connection, the channel, no confirm), not because the broker refused it.
fn lost_broker(e: &MqError) -> bool {
    !e.is_refusal()
}

/// The responses key of publishes the broker did not confirm (amqp mode).
const PUBLISH_FAILED: &str = "publish_failed";

/// With `--rate`, messages are published in bursts this far apart (each burst holds
/// the messages due in it), not each on its own timer: one wakeup per message cost
/// the bench, on the same cores as the engine, more CPU than publishing (see
/// docs/benchmarks-history.md, 2026-12-01, 1909aa1). Latency is measured from each message's actual
/// publish, so the rounding adds nothing to it.
const PACING_TICK: Duration = Duration::from_millis(5);

fn print_report(r: &Report) {
    println!();
    println!(
        "flash sale report (activity {}, mode {:?})",
        r.activity_id, r.mode
    );
    println!(
        "  stock {:>10}   sold {:>10}   oversold {}",
        r.stock, r.sold, r.oversold
    );
    println!("  buyers {:>9}   requests {:>6}", r.buyers, r.requests);
    match r.time_to_sell_out_seconds {
        Some(t) => println!("  time to sell out   {t:.2} s"),
        None => println!("  not sold out"),
    }
    println!("  orders/s           {:.0}", r.orders_per_second);
    for b in [&r.baseline, &r.batched_baseline].into_iter().flatten() {
        println!(
            "  pgbench baseline   {:.0} orders/s ({} clients, {} per transaction, {:.1} ms per transaction); engine/baseline {:.2}",
            b.orders_per_second, b.clients, b.batch, b.latency_ms, b.engine_ratio
        );
    }
    println!(
        "  latency ms         p50 {:.1}  p95 {:.1}  p99 {:.1}  max {:.1}",
        r.latency_ms.p50, r.latency_ms.p95, r.latency_ms.p99, r.latency_ms.max
    );
    if let Some(c) = &r.commit_latency_ms {
        println!(
            "  reservation → commit ms  p50 {:.1}  p95 {:.1}  p99 {:.1}  within 50 ms {:.2} %  ({} messages, engine histogram)",
            c.p50, c.p95, c.p99, c.within_50ms * 100.0, c.messages
        );
    }
    if let Some(a) = &r.intake_age_ms {
        println!(
            "    of it publish → intake ms  p50 {:.1}  p95 {:.1}  p99 {:.1}  within 50 ms {:.2} %  (the broker's part)",
            a.p50, a.p95, a.p99, a.within_50ms * 100.0
        );
    }
    println!(
        "  drive {:.2} s, all settled after {:.2} s",
        r.drive_seconds, r.settle_seconds
    );
    if let Some(c) = &r.cpu {
        let list = |m: &BTreeMap<&str, f64>, unit: &str| {
            m.iter()
                .map(|(k, v)| format!("{k} {v:.0}{unit}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        println!(
            "  cpu per order      {}  (this host, {} cores, {:.1} s)",
            list(&c.per_order_us, " µs"),
            c.cores,
            c.seconds
        );
        println!("  cpu share          {}", list(&c.share_percent, " %"));
        println!("  host               {}", list(&c.host_percent, " %"));
    }
    if let Some(h) = &r.host_stalls {
        println!(
            "  host stalls        {} ({:.0} ms in all, longest {:.0} ms); a piece of work took {:.0} µs at best, {:.0} µs at the median, up to {:.0}x the best ({} probes)",
            h.stalls, h.stalled_ms, h.longest_ms, h.piece_us, h.piece_p50_us, h.worst_slowdown, h.probes
        );
    }
    if let Some(s) = &r.slow_orders {
        println!(
            "  orders over 50 ms  {} (reservation → order row), {} of them in flight during a host stall",
            s.over_50ms, s.in_host_stalls
        );
    }
    if let Some(c) = &r.crowd {
        println!(
            "  crowd              {} slow + {} idle connections: {} opened, {} closed by the server, {} connects failed, {} bytes trickled",
            c.slow_clients, c.idle_clients, c.opened, c.closed_by_server, c.connect_errors, c.trickled_bytes
        );
        println!(
            "  /readyz            {} probes, {} without a 200 within 1 s, slowest {:.0} ms",
            c.readyz_probes, c.readyz_failed, c.readyz_max_ms
        );
    }
    if let Some(gap) = r.max_order_gap_ms {
        println!("  longest order gap  {gap:.0} ms");
    }
    if r.retried > 0 {
        println!(
            "  retried            {} (after a 503, a cut connection or a lost broker)",
            r.retried
        );
    }
    println!("  responses:");
    for (k, v) in &r.responses {
        println!("    {k:<28} {v}");
    }
    println!("  outcomes in PostgreSQL:");
    for (k, v) in &r.outcomes {
        println!("    {k:<28} {v}");
    }
    println!("  invariants:");
    for (k, v) in &r.checks {
        println!("    {} {k:<28} {v}", if *v == 0 { "ok  " } else { "FAIL" });
    }
    println!("  result: {}", if r.passed { "PASS" } else { "FAIL" });
}

/// Reservations with an outcome, and reservations still pending in PostgreSQL.
/// The Redis give-backs of the run's reservations not yet done (pending, running
/// or waiting to retry).
const GIVE_BACKS_LEFT: &str = "
SELECT count(*) FROM compensation_task t
JOIN inventory_reservation r ON r.reservation_id = t.reservation_id
WHERE t.task_type = 10 AND t.status IN (0, 10, 30) AND r.activity_id = $1";

const SETTLED: &str = "
SELECT count(*) FILTER (WHERE status <> 0), count(*) FILTER (WHERE status = 0)
FROM inventory_reservation WHERE activity_id = $1";

/// The run's orders: count, time of the last, reservation → order row percentiles,
/// and the orders over 50 ms with those of them in flight during a host stall
/// (`$3`, `$4`: the stalls' starts and ends). The bench and PostgreSQL read one clock
/// (same host), so the stall windows and the orders' times compare directly.
const STATS: &str = "
SELECT count(*),
       extract(epoch FROM max(t.written) - $2::timestamptz)::float8,
       percentile_cont(0.50) WITHIN GROUP (ORDER BY t.lat * 1000)::float8,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY t.lat * 1000)::float8,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY t.lat * 1000)::float8,
       (max(t.lat) * 1000)::float8,
       count(*) FILTER (WHERE t.lat > 0.05),
       count(*) FILTER (WHERE t.lat > 0.05 AND EXISTS (
           SELECT 1 FROM unnest($3::float8[], $4::float8[]) AS s(start_s, end_s)
           WHERE extract(epoch FROM t.reserved)::float8 <= s.end_s
             AND extract(epoch FROM t.written)::float8 >= s.start_s))
FROM (SELECT r.redis_reserved_at AS reserved,
             o.created_at AS written,
             extract(epoch FROM o.created_at - r.redis_reserved_at)::float8 AS lat
      FROM orders AS o
      JOIN inventory_reservation AS r ON r.reservation_id = o.reservation_id
      WHERE o.activity_id = $1) AS t";

/// The longest time between two consecutive orders of the sale, in ms.
const ORDER_GAP: &str = "
SELECT (max(gap) * 1000)::float8
FROM (SELECT extract(epoch FROM created_at - lag(created_at) OVER (ORDER BY created_at)) AS gap
      FROM orders WHERE activity_id = $1) g";

const OUTCOMES: &str = "
SELECT c.result_code, count(*)
FROM consumer_inbox AS c
JOIN inventory_reservation AS r ON r.reservation_id = c.reservation_id
WHERE r.activity_id = $1
GROUP BY c.result_code";

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = r#"# TYPE x_seconds histogram
x_seconds_bucket{le="0.01"} 10
x_seconds_bucket{le="0.05"} 90
x_seconds_bucket{le="0.1"} 100
x_seconds_bucket{le="+Inf"} 100
x_seconds_sum 3.2
x_seconds_count 100
y_seconds_bucket{le="0.01"} 7
z_seconds_bucket{kind="a",le="0.01"} 3
z_seconds_bucket{kind="a",le="+Inf"} 4
z_seconds_bucket{kind="b",le="0.01"} 5
z_seconds_bucket{kind="b",le="+Inf"} 6
"#;

    #[test]
    fn buckets_are_read_for_the_named_histogram_only() {
        assert_eq!(
            parse_buckets(PAGE, "x_seconds", ""),
            vec![(0.01, 10), (0.05, 90), (0.1, 100), (f64::INFINITY, 100)]
        );
        assert!(parse_buckets(PAGE, "w_seconds", "").is_empty());
    }

    #[test]
    fn a_labelled_series_is_read_alone() {
        assert_eq!(
            parse_buckets(PAGE, "z_seconds", &kind_labels("b")),
            vec![(0.01, 5), (f64::INFINITY, 6)]
        );
        // Without its labels a labelled histogram is not one series.
        assert!(parse_buckets(PAGE, "z_seconds", "").is_empty());
    }

    #[test]
    fn the_run_is_the_difference_of_two_scrapes() {
        let before = [(0.01, 5), (0.05, 5), (0.1, 5), (f64::INFINITY, 5)];
        let after = parse_buckets(PAGE, "x_seconds", "");
        let c = run_latency(&before, &after).expect("a run with messages");
        assert_eq!(c.messages, 95);
        // 85 of the run's 95 messages are within 50 ms.
        assert!((c.within_50ms - 85.0 / 95.0).abs() < 1e-9);
        // p50: rank 47.5 falls in (10 ms, 50 ms], 42.5 of its 80 → 31.25 ms.
        assert!((c.p50 - 31.25).abs() < 1e-9, "p50 {}", c.p50);
        // p99: rank 94.05 falls in (50 ms, 100 ms], 9.05 of its 10.
        assert!((c.p99 - 95.25).abs() < 1e-9, "p99 {}", c.p99);
        assert!(run_latency(&after, &after).is_none());
    }
}
