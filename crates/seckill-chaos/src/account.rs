//! The account of one scenario: every message the broker confirmed is traced to an
//! effect, a recorded rejection or the dead-letter queue, and the database is checked
//! for duplicated and unexpected effects, overselling and stock conservation.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use lapin::options::{BasicAckOptions, BasicGetOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use serde::Serialize;
use tokio_postgres::Client;
use uuid::Uuid;

use super::workload::{Kind, Plan, Published};
use super::{Fault, FaultLog, Profile};
use seckill_engine::config::Settings;
use seckill_engine::mq::topology::{declare_topology, Names};
use seckill_engine::redis::keys::SkuKeys;
use seckill_engine::store::{self, activity, invariants};

/// The queue where the harness collects the outbox events the engine publishes.
fn events_queue(ns: &str) -> String {
    format!("{ns}.chaos.events")
}

/// Creates the activity (PostgreSQL and Redis) and the topology, with a queue that
/// captures every published event.
pub async fn prepare(settings: &Settings, plan: &Plan) -> anyhow::Result<()> {
    let mut db = client(settings).await?;
    let now = Utc::now();
    let ends_at = now + chrono::TimeDelta::hours(2);
    let split = activity::create_activity(
        &mut db,
        &activity::ActivitySpec {
            activity_id: plan.activity_id,
            sku_id: plan.sku_id,
            title: "chaos".into(),
            stock: plan.stock,
            buckets: plan.buckets,
            unit_price: 9_900,
            currency: "CNY".into(),
            starts_at: now - chrono::TimeDelta::minutes(1),
            ends_at,
            order_ttl_ms: 3_600_000,
        },
    )
    .await?;
    let mut redis = seckill_engine::redis::connect(&settings.redis).await?;
    let keys = SkuKeys::new(&settings.redis.key_prefix, plan.activity_id, plan.sku_id);
    seckill_engine::redis::load_stock(&mut redis, &keys, &split, ends_at).await?;
    let conn = seckill_engine::mq::connect(&settings.amqp, "seckill-chaos-setup").await?;
    let channel = conn.create_channel().await?;
    declare_topology(&channel, &settings.amqp).await?;
    let names = Names::new(&settings.amqp.namespace);
    let queue = events_queue(&settings.amqp.namespace);
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            // A quorum queue, as a downstream consumer on a cluster needs: a
            // classic queue on a stopped node takes no event (`amqp_node_stop`).
            FieldTable::from(std::collections::BTreeMap::from([(
                "x-queue-type".into(),
                lapin::types::AMQPValue::LongString("quorum".into()),
            )])),
        )
        .await?;
    channel
        .queue_bind(
            queue.as_str().into(),
            names.events_exchange().as_str().into(),
            "#".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;
    seckill_engine::mq::close(&conn, &[&channel]).await;
    Ok(())
}

async fn client(settings: &Settings) -> anyhow::Result<Client> {
    let mut config = store::pg_config(&settings.database)?;
    config.application_name("seckill-chaos");
    Ok(store::connect(&config).await?)
}

/// Inbox rows over time, to see how long the engine takes to make progress again
/// after each fault.
pub struct Progress {
    samples: std::rc::Rc<std::cell::RefCell<Vec<(Instant, i64)>>>,
    stop: std::rc::Rc<std::cell::Cell<bool>>,
    task: actix_rt::task::JoinHandle<()>,
}

impl Progress {
    pub async fn start(settings: &Settings) -> anyhow::Result<Progress> {
        let samples = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let stop = std::rc::Rc::new(std::cell::Cell::new(false));
        let (s, st, settings) = (samples.clone(), stop.clone(), settings.clone());
        let task = actix_rt::spawn(async move {
            let mut db: Option<Client> = None;
            while !st.get() {
                let limit = Duration::from_secs(2);
                if db.is_none() {
                    db = tokio::time::timeout(limit, client(&settings))
                        .await
                        .ok()
                        .and_then(Result::ok);
                }
                if let Some(c) = &db {
                    let read = c.query_one("SELECT count(*) FROM consumer_inbox", &[]);
                    match tokio::time::timeout(limit, read).await {
                        Ok(Ok(row)) => s.borrow_mut().push((Instant::now(), row.get(0))),
                        _ => db = None,
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        Ok(Progress {
            samples,
            stop,
            task,
        })
    }

    pub async fn stop(self) -> Vec<(Instant, i64)> {
        self.stop.set(true);
        let _ = self.task.await;
        self.samples.take()
    }
}

fn confirmed_ids(plan: &Plan, published: &Published, kind: Kind) -> Vec<String> {
    plan.messages
        .iter()
        .filter(|m| m.kind == kind && published.confirmed.contains(&m.message_id))
        .map(|m| m.message_id.clone())
        .collect::<HashSet<_>>()
        .into_iter()
        .collect()
}

fn uuids(ids: &[String]) -> Vec<Uuid> {
    ids.iter().filter_map(|id| id.parse().ok()).collect()
}

/// Waits until every confirmed message has its inbox row (or, for poison, the DLQ
/// holds it), the outbox and compensation work is done and no order is overdue.
pub async fn wait_drained(
    settings: &Settings,
    plan: &Plan,
    published: &Published,
    timeout: Duration,
) -> bool {
    let orders = uuids(&confirmed_ids(plan, published, Kind::Order));
    let payments: Vec<Uuid> = confirmed_ids(plan, published, Kind::Payment)
        .iter()
        .filter_map(|id| plan.payment_inbox.get(id).copied())
        .collect();
    let expected = (orders.len() + payments.len()) as i64;
    let deadline = Instant::now() + timeout;
    let mut last_report = Instant::now();
    while Instant::now() < deadline {
        let done = async {
            let db = client(settings).await.ok()?;
            let row = db
                .query_one(
                    "SELECT
                        (SELECT count(*) FROM consumer_inbox
                          WHERE message_id = ANY($1) OR message_id = ANY($2)),
                        (SELECT count(*) FROM event_outbox WHERE status <> 20),
                        (SELECT count(*) FROM compensation_task WHERE status IN (0, 10, 30)),
                        (SELECT count(*) FROM orders
                          WHERE status IN (10, 20) AND expire_at < now())",
                    &[&orders, &payments],
                )
                .await
                .ok()?;
            let (inbox, outbox, tasks, overdue): (i64, i64, i64, i64) =
                (row.get(0), row.get(1), row.get(2), row.get(3));
            Some((inbox, outbox, tasks, overdue))
        };
        match tokio::time::timeout(Duration::from_secs(10), done).await {
            Ok(Some((inbox, 0, 0, 0))) if inbox >= expected => return true,
            Ok(Some((inbox, outbox, tasks, overdue)))
                if last_report.elapsed() > Duration::from_secs(10) =>
            {
                last_report = Instant::now();
                eprintln!(
                    "chaos: draining: inbox {inbox}/{expected}, outbox unsent {outbox}, compensation open {tasks}, overdue orders {overdue}"
                );
            }
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    false
}

/// What Redis's stock should be at the end of a scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum RedisModel {
    /// As loaded plus the units given back: the harness publishes straight to the
    /// queues, so no reservation takes a unit from Redis.
    Untouched,
    /// Not comparable: the front stage rebuilt the keys from PostgreSQL after a
    /// Redis fail-over, and the orders the harness made after that (straight to
    /// the queues) took no unit from Redis.
    Rebuilt,
    /// Not comparable: Redis lost its data and the harness's keys with it.
    Lost,
}

impl RedisModel {
    /// Why a scenario's Redis drift is not reported.
    pub fn unchecked(self) -> &'static str {
        match self {
            RedisModel::Untouched => "",
            RedisModel::Rebuilt => "n/a (rebuilt from PostgreSQL mid-sale)",
            RedisModel::Lost => "n/a (Redis lost its data)",
        }
    }
}

pub struct Inputs<'a> {
    pub scenario: &'static str,
    pub fault: Fault,
    pub settings: &'a Settings,
    pub plan: &'a Plan,
    pub published: &'a Published,
    pub faults: &'a FaultLog,
    pub samples: &'a [(Instant, i64)],
    pub logs: &'a [PathBuf],
    pub drained: bool,
    pub redis: RedisModel,
    /// Asynchronous standbys: losing acknowledged orders in a fail-over is the
    /// measured consequence, reported, not a broken promise.
    pub loss_allowed: bool,
    pub elapsed: Duration,
}

/// One scenario's figures (Jepsen-style: every confirmed message accounted for).
#[derive(Debug, Clone, Serialize)]
pub struct Account {
    pub scenario: String,
    pub fault: String,
    pub attempted: usize,
    pub broker_acked: usize,
    /// Confirmed messages with an inbox row (an effect or a recorded rejection).
    pub with_effect: usize,
    /// Confirmed, no inbox row, not dead-lettered.
    pub lost: usize,
    pub duplicated_effects: i64,
    pub unexpected: i64,
    /// Commits whose outcome was unknown to the engine, and how many of them had in
    /// fact committed (found on redelivery).
    pub commit_unknown: usize,
    pub recovered: usize,
    pub oversold: i64,
    pub conservation_errors: i64,
    pub dead_lettered: usize,
    pub poison: usize,
    pub events_lost: usize,
    pub events_redelivered: usize,
    pub redis_drift: Option<i64>,
    pub redis_model: RedisModel,
    pub faults: u32,
    pub recover_p50_ms: Option<u64>,
    pub recover_p99_ms: Option<u64>,
    pub orders: i64,
    pub drained: bool,
    pub seconds: f64,
    /// See `Inputs::loss_allowed`.
    pub loss_allowed: bool,
}

impl Account {
    /// Every promise held.
    pub fn ok(&self) -> bool {
        (self.lost == 0 || self.loss_allowed)
            && self.duplicated_effects == 0
            && self.unexpected == 0
            && self.oversold == 0
            && self.conservation_errors == 0
            && self.dead_lettered == self.poison
            && self.events_lost == 0
            && self.redis_drift.unwrap_or(0) == 0
            && self.drained
    }

    pub fn summary(&self) -> String {
        format!(
            "{}: {} | attempted {} acked {} effect {} lost {} dup {} unexpected {} unknown {} (committed {}) oversold {} conservation {} dlq {}/{} events lost {} redis drift {:?} faults {} recover p50/p99 {:?}/{:?} ms, {:.0} s",
            self.scenario,
            if self.ok() { "OK" } else { "FAILED" },
            self.attempted,
            self.broker_acked,
            self.with_effect,
            self.lost,
            self.duplicated_effects,
            self.unexpected,
            self.commit_unknown,
            self.recovered,
            self.oversold,
            self.conservation_errors,
            self.dead_lettered,
            self.poison,
            self.events_lost,
            self.redis_drift,
            self.faults,
            self.recover_p50_ms,
            self.recover_p99_ms,
            self.seconds
        )
    }
}

pub async fn account(i: Inputs<'_>) -> anyhow::Result<Account> {
    let db = client(i.settings).await?;
    let names = Names::new(&i.settings.amqp.namespace);
    let amqp = seckill_engine::mq::connect(&i.settings.amqp, "seckill-chaos-account").await?;
    let channel = amqp.create_channel().await?;

    // Dead letters: drained here, so the queues can be checked empty afterwards.
    let mut dead = HashSet::new();
    for queue in [names.order_dead_queue(), names.payment_dead_queue()] {
        while let Some(got) = channel
            .basic_get(queue.as_str().into(), BasicGetOptions::default())
            .await?
        {
            if let Some(id) = got.delivery.properties.message_id() {
                dead.insert(id.to_string());
            }
            got.delivery.acker.ack(BasicAckOptions::default()).await?;
        }
    }
    let mut events = HashMap::<String, u32>::new();
    let events_q = events_queue(&i.settings.amqp.namespace);
    while let Some(got) = channel
        .basic_get(events_q.as_str().into(), BasicGetOptions::default())
        .await?
    {
        if let Some(id) = got.delivery.properties.message_id() {
            *events.entry(id.to_string()).or_default() += 1;
        }
        got.delivery.acker.ack(BasicAckOptions::default()).await?;
    }
    let mut left_in_queues = 0;
    for queue in names.order_queues(i.settings.amqp.shards) {
        left_in_queues += seckill_engine::mq::queue_counts(&channel, &queue)
            .await?
            .messages;
    }
    seckill_engine::mq::close(&amqp, &[&channel]).await;

    // Retention deletes inbox rows older than its window: the account compares only
    // rows within it, and a scenario longer than the window could not be accounted.
    let window = i.settings.retention.inbox_window();
    anyhow::ensure!(
        i.elapsed < window,
        "the scenario ran {:?}, longer than retention.inbox_secs ({:?}): its first inbox rows may be pruned",
        i.elapsed,
        window
    );
    let window_ms = i64::try_from(window.as_millis()).unwrap_or(i64::MAX);
    let inbox: HashMap<String, DateTime<Utc>> = db
        .query(
            "SELECT message_id::text, created_at FROM consumer_inbox
             WHERE processed_at > statement_timestamp() - $1::bigint * interval '1 millisecond'",
            &[&window_ms],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let orders = confirmed_ids(i.plan, i.published, Kind::Order);
    let payments = confirmed_ids(i.plan, i.published, Kind::Payment);
    let poison = confirmed_ids(i.plan, i.published, Kind::Poison);
    let mut with_effect = 0;
    let mut lost = 0;
    for id in &orders {
        if inbox.contains_key(id) {
            with_effect += 1;
        } else if !dead.contains(id) {
            lost += 1;
        }
    }
    for id in &payments {
        let inbox_id = i.plan.payment_inbox.get(id).map(Uuid::to_string);
        if inbox_id.is_some_and(|k| inbox.contains_key(&k)) {
            with_effect += 1;
        } else if !dead.contains(id) {
            lost += 1;
        }
    }
    lost += poison.iter().filter(|id| !dead.contains(*id)).count();
    // Valid messages must never be dead-lettered; poison must be, once each.
    let dead_lettered = dead.len();

    let count = |sql: &'static str| {
        let db = &db;
        async move { db.query_one(sql, &[]).await.map(|r| r.get::<_, i64>(0)) }
    };
    let duplicated_effects = count(
        "SELECT (SELECT count(*) - count(DISTINCT reservation_id) FROM orders)
              + (SELECT count(*) FROM (SELECT 1 FROM orders
                   GROUP BY activity_id, sku_id, user_id HAVING count(*) > 1) d)
              + (SELECT count(*) FROM (SELECT 1 FROM inventory_ledger
                   GROUP BY order_id, ledger_type HAVING count(*) > 1) l)
              + (SELECT count(*) FROM (SELECT 1 FROM payment_record WHERE status = 20
                   GROUP BY order_id HAVING count(*) > 1) p)",
    )
    .await?;
    let reservations: Vec<Uuid> = i.plan.reservations.iter().copied().collect();
    let unexpected: i64 = db
        .query_one(
            "SELECT count(*) FROM orders WHERE NOT (reservation_id = ANY($1))",
            &[&reservations],
        )
        .await?
        .get(0);
    let planned: HashSet<String> = i
        .plan
        .messages
        .iter()
        .map(|m| m.message_id.clone())
        .chain(i.plan.payment_inbox.values().map(Uuid::to_string))
        .collect();
    let unexpected_inbox = inbox.keys().filter(|id| !planned.contains(*id)).count() as i64;
    let oversold = count(
        "SELECT (SELECT count(*) FROM sku_inventory
                  WHERE available_stock < 0 OR allocated_stock > total_stock)
              + GREATEST(0, (SELECT count(*) FROM orders WHERE status IN (10, 20, 30))
                            - (SELECT sum(total_stock) FROM sku_inventory))",
    )
    .await?;
    let checks = invariants::run_checks(&db, None, window).await?;
    let conservation_errors: i64 = checks
        .iter()
        .filter(|c| c.name != "duplicate_orders")
        .map(|c| c.violations)
        .sum();
    let order_count = count("SELECT count(*) FROM orders").await?;

    let outbox: Vec<String> = db
        .query("SELECT event_id::text FROM event_outbox", &[])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let events_lost = outbox.iter().filter(|id| !events.contains_key(*id)).count();
    let events_redelivered = events.values().map(|n| (n - 1) as usize).sum();

    let redis_drift = if i.redis == RedisModel::Untouched {
        let mut redis = seckill_engine::redis::connect(&i.settings.redis).await?;
        let keys = SkuKeys::new(
            &i.settings.redis.key_prefix,
            i.plan.activity_id,
            i.plan.sku_id,
        );
        let mut total = 0i64;
        for bucket in 0..i.plan.buckets {
            let v: Option<i64> = ::redis::cmd("GET")
                .arg(keys.stock(bucket))
                .query_async(&mut redis)
                .await?;
            total += v.unwrap_or(0);
        }
        let given_back = count(
            "SELECT count(*) FROM compensation_task
             WHERE task_type = 10 AND status = 20",
        )
        .await?;
        Some(total - i64::from(i.plan.stock) - given_back)
    } else {
        None
    };

    let (commit_unknown, recovered) = unknown_commits(i.logs, &inbox);
    let (p50, p99) = recovery(i.faults, i.samples);
    Ok(Account {
        scenario: i.scenario.to_owned(),
        fault: fault_label(i.fault),
        attempted: i
            .plan
            .messages
            .iter()
            .map(|m| &m.message_id)
            .collect::<HashSet<_>>()
            .len(),
        broker_acked: i.published.confirmed.len(),
        with_effect,
        lost,
        duplicated_effects,
        unexpected: unexpected + unexpected_inbox,
        commit_unknown,
        recovered,
        oversold,
        conservation_errors,
        dead_lettered,
        poison: poison.len(),
        events_lost,
        events_redelivered,
        redis_drift,
        redis_model: i.redis,
        faults: i.faults.injected,
        recover_p50_ms: p50,
        recover_p99_ms: p99,
        orders: order_count,
        drained: i.drained && left_in_queues == 0,
        seconds: i.elapsed.as_secs_f64(),
        loss_allowed: i.loss_allowed,
    })
}

fn fault_label(f: Fault) -> String {
    match f {
        Fault::Failpoint(name, p) => format!("failpoint {name} ({p}% abort)"),
        other => format!("{other:?}"),
    }
}

/// Message ids the engines logged as "commit outcome unknown", and how many of them
/// had committed (their inbox row is older than the log line).
fn unknown_commits(logs: &[PathBuf], inbox: &HashMap<String, DateTime<Utc>>) -> (usize, usize) {
    let mut unknown = HashMap::<String, DateTime<Utc>>::new();
    for log in logs {
        let Ok(text) = std::fs::read_to_string(log) else {
            continue;
        };
        for line in text
            .lines()
            .filter(|l| l.contains("commit outcome unknown"))
        {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            let (Some(id), Some(at)) = (v["message_id"].as_str(), v["timestamp"].as_str()) else {
                continue;
            };
            if let Ok(at) = at.parse::<DateTime<Utc>>() {
                unknown.entry(id.to_owned()).or_insert(at);
            }
        }
    }
    let recovered = unknown
        .iter()
        .filter(|(id, at)| inbox.get(*id).is_some_and(|created| created <= *at))
        .count();
    (unknown.len(), recovered)
}

/// For each healed fault, how long until the inbox grew again (only while work was
/// left); p50 and p99 in ms.
fn recovery(faults: &FaultLog, samples: &[(Instant, i64)]) -> (Option<u64>, Option<u64>) {
    let last = samples.last().map_or(0, |s| s.1);
    let mut times: Vec<u64> = faults
        .healed
        .iter()
        .filter_map(|healed| {
            // The first count read after the heal: work committed before the fault
            // may still show up in it, so progress means growing beyond it.
            let base = samples.iter().find(|(t, _)| t > healed).map(|s| s.1)?;
            if base >= last {
                return None;
            }
            samples
                .iter()
                .find(|(t, n)| t > healed && *n > base)
                .map(|(t, _)| t.duration_since(*healed).as_millis() as u64)
        })
        .collect();
    times.sort_unstable();
    let pick = |q: f64| {
        (!times.is_empty()).then(|| times[((times.len() as f64 - 1.0) * q).round() as usize])
    };
    (pick(0.5), pick(0.99))
}

/// The Markdown report of a run: how it was made, then one row per scenario.
pub fn markdown(accounts: &[Account], profile: Profile) -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0 / 1024.0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let command: Vec<String> = std::env::args().collect();
    let mut out = format!(
        "# Reliability: the fault-injection account\n\n\
         Written by `seckill-chaos` (the engine built with its cargo feature `chaos`); do not edit by hand.\n\n\
         - Command: `{}`\n- Build: {}\n- Date: {}\n- Machine: {cpus} CPUs, {mem_gib:.0} GiB, Linux {}; \
         PostgreSQL, RabbitMQ and Redis private instances started by `scripts/services` on the same machine\n\n\
         Each scenario runs on its own database, namespace and Redis prefix: the harness publishes the \
         workload with confirms (1% poison), injects its fault on a schedule while the workload runs and \
         3 s after, heals everything, waits for the backlog to drain, stops the engines with SIGTERM and \
         accounts for every message the broker confirmed. *lost*: confirmed, no inbox row, not \
         dead-lettered. *duplicated*: more than one order per reservation or per user, ledger rows or \
         successful payments repeated. *unexpected*: orders or inbox rows for nothing the harness sent. \
         *commit unknown (found committed)*: transactions whose COMMIT got no clean answer, and how many of \
         them the redelivery found already committed. *events lost*: outbox rows never received on the \
         events exchange (redelivered events are allowed: consumers dedup by event id). *Redis drift*: \
         Redis stock minus loaded stock minus completed give-backs. *recover*: from the end of a fault to \
         the next committed message.\n\n",
        command.join(" "),
        seckill_engine::VERSION,
        Utc::now().format("%Y-%m-%d %H:%M UTC"),
        kernel.trim()
    );
    out.push_str(&format!(
        "| scenario | fault | attempted | broker-acked | with effect | lost | duplicated | unexpected | commit unknown (found committed) | oversold | conservation errors | dead-lettered / poison | events lost (redelivered) | Redis drift | faults | recover p50 / p99 ms | orders | drained | s |\n|{}\n",
        "---|".repeat(19)
    ));
    for a in accounts {
        let ms = |v: Option<u64>| v.map_or("-".to_owned(), |v| v.to_string());
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | **{}** | **{}** | **{}** | {} ({}) | **{}** | **{}** | {} / {} | {} ({}) | {} | {} | {} / {} | {} | {} | {:.0} |\n",
            a.scenario,
            a.fault,
            a.attempted,
            a.broker_acked,
            a.with_effect,
            if a.loss_allowed {
                format!("{} (async standbys: measured, allowed)", a.lost)
            } else {
                a.lost.to_string()
            },
            a.duplicated_effects,
            a.unexpected,
            a.commit_unknown,
            a.recovered,
            a.oversold,
            a.conservation_errors,
            a.dead_lettered,
            a.poison,
            a.events_lost,
            a.events_redelivered,
            a.redis_drift
                .map_or(a.redis_model.unchecked().to_owned(), |d| d.to_string()),
            a.faults,
            ms(a.recover_p50_ms),
            ms(a.recover_p99_ms),
            a.orders,
            if a.drained { "yes" } else { "NO" },
            a.seconds
        ));
    }
    out.push_str(&format!(
        "\nProfile: {profile:?}. Every row passes when lost, duplicated, unexpected, oversold and conservation errors are 0, dead-lettered equals the poison injected, no event is lost, Redis drift is 0 and everything drained.\n"
    ));
    out
}
