//! Several instances of one configuration: node id leases, shards shared by rank,
//! and fail-over between instances when one is killed, frozen or cut off.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use seckill_engine::services::node_lease::{LIVE_WINDOW, RENEW_EVERY};
use tokio_postgres::Client;

use crate::common::builders;
use crate::common::process::{engine, env_of, signal, Serve};
use crate::common::{
    assert_invariants, count, free_port, poll, poll_every, settle, wait_for, wait_until, Sale,
    TestEnv, HANG,
};

/// Promised (docs/DESIGN.md, "Scale-out" and "Heartbeat"), and what the tests below
/// are about: they stay tight whatever the machine's load. A killed instance's work
/// moves within this ...
const AFTER_A_KILL: Duration = Duration::from_secs(5);
/// ... and a frozen or cut-off one's, once the broker has dropped it by heartbeat,
/// within this.
const AFTER_A_FREEZE_OR_CUT: Duration = Duration::from_secs(15);

/// An intake that hands a shard back does not again for this long
/// (`HAND_BACK_EVERY` in src/actors/intake.rs): a shard handed to an instance that
/// does not own it stays there meanwhile.
const HAND_BACK_EVERY: Duration = Duration::from_secs(10);

/// The worst case, on an idle machine, of the instances sharing the shards out anew
/// after one joins or leaves: a killed instance's lease still counts for
/// `LIVE_WINDOW` (15 s) after its last renewal; each instance reads the leases every
/// `RENEW_EVERY` (5 s), and until all have, they disagree on the ranks and may hand a
/// shard to the wrong instance, where it stays for `HAND_BACK_EVERY`, up to twice on
/// its way: 40 s. A restart soon after a kill meets all of it (measured at 24.6 s,
/// docs/DESIGN.md), more than a 30 s budget leaves once a loaded machine delays the
/// restart, the renewals and the hand-backs.
const REBALANCE_IDLE: Duration = Duration::from_secs(
    LIVE_WINDOW.as_secs() + RENEW_EVERY.as_secs() + 2 * HAND_BACK_EVERY.as_secs(),
);

/// The budget of a wait for the shards to be shared out evenly (after a start, a
/// restart, a healed cut). Nothing promises a time for it (the sharing spreads the
/// work; single active consumer alone keeps it safe), so it only bounds a hang:
/// three times the idle worst case.
const REBALANCE: Duration = Duration::from_secs(3 * REBALANCE_IDLE.as_secs());

/// Instances started with one configuration lease different node ids; one asked
/// for an id a live instance holds refuses to start, naming the holder; a clean stop
/// gives the ids back.
#[tokio::test]
async fn instances_lease_distinct_node_ids_and_a_held_id_is_refused() {
    let env = TestEnv::new().await;
    let db = env.db().await;
    let (a, ready_a) = Serve::start(env_of(&mut engine(), &env), "engine ready").await;
    let (b, ready_b) = Serve::start(env_of(&mut engine(), &env), "engine ready").await;
    assert!(ready_a && ready_b);
    let leases: Vec<(i16, String)> = db
        .query(
            "SELECT node_id, holder_name FROM node_lease ORDER BY node_id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(leases.len(), 2, "{leases:?}");
    assert_ne!(leases[0].0, leases[1].0);
    let (held, holder) = leases
        .iter()
        .find(|(_, name)| name.contains(&format!("pid {} ", a.pid())))
        .cloned()
        .expect("a lease names its holder's pid");

    let mut cmd = engine();
    env_of(&mut cmd, &env).env("SECKILL__ENGINE__NODE_ID", held.to_string());
    let (c, ready_c) = Serve::start(&mut cmd, "engine ready").await;
    let (status, text) = c.wait().await;
    assert!(!ready_c && !status.success(), "{text}");
    assert!(
        text.contains(&format!("engine.node_id = {held} is held by {holder}")),
        "{text}"
    );

    for serve in [a, b] {
        let (status, text) = serve.terminate().await;
        assert!(status.success(), "{text}");
    }
    let left: i64 = db
        .query_one("SELECT count(*) FROM node_lease", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "a clean stop gives the lease back");
    env.cleanup().await;
}

/// How long after `from` the order count first grew past what it was 300 ms after
/// `from` (what the stopped instance had in flight), within `limit`.
async fn orders_resume(db: &Client, from: Instant, limit: Duration) -> Option<Duration> {
    // On purpose: what the stopped instance's open transactions commit in the first
    // 300 ms is not a resumption; nothing tells those commits apart from others.
    tokio::time::sleep_until((from + Duration::from_millis(300)).into()).await;
    let orders = "SELECT count(*) FROM orders";
    let base = count(db, orders).await;
    poll(limit.saturating_sub(from.elapsed()), || async {
        if count(db, orders).await > base {
            Ok(from.elapsed())
        } else {
            Err(())
        }
    })
    .await
    .ok()
    .map(|(_, at)| at)
}

/// Orders for an activity's SKU 1 published at a steady pace until stopped.
struct SteadyLoad {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<i64>,
}

impl SteadyLoad {
    /// `per_tick` new buyers every 100 ms, over `buckets` buckets, to `shards` shards.
    async fn start(
        env: &TestEnv,
        shards: u16,
        activity: i64,
        per_tick: usize,
        buckets: i64,
    ) -> SteadyLoad {
        let stop = Arc::new(AtomicBool::new(false));
        let (names, amqp) = (env.names.clone(), env.amqp().await);
        let task = {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut user = 0i64;
                while !stop.load(Ordering::Relaxed) {
                    let batch: Vec<_> = (0..per_tick)
                        .map(|_| {
                            user += 1;
                            builders::order(activity, 1, user, (user % buckets) as i16)
                        })
                        .collect();
                    builders::publish_to(&names, shards, &amqp, &batch).await;
                    // The load's pace, not a wait.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                user
            })
        };
        SteadyLoad { stop, task }
    }

    /// Stops publishing: how many messages went out.
    async fn stop(self) -> i64 {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap()
    }
}

/// Two instances consume one shard; RabbitMQ's single active consumer makes the
/// first active. SIGKILL of the active one: the standby makes orders within 5 s.
/// SIGSTOP of the new active one for 20 s (its TCP connection stays open): the
/// heartbeat lets the broker drop it and a restarted instance makes orders within
/// 15 s; after SIGCONT, every message still has exactly one effect.
#[actix_rt::test]
async fn a_standby_takes_the_shard_within_seconds_of_a_kill_or_a_freeze() {
    let (env, db) = Sale::new().activity(91, 100_000, 8).open().await;
    let (a, ready_a) = Serve::start(env_of(&mut engine(), &env), "engine ready").await;
    let b_admin = format!("127.0.0.1:{}", free_port());
    let (b, ready_b) = Serve::start(
        env_of(&mut engine(), &env).env("SECKILL__ADMIN__ADDR", &b_admin),
        "engine ready",
    )
    .await;
    assert!(ready_a && ready_b);

    // A steady load: 20 new buyers every 100 ms over 8 buckets.
    let load = SteadyLoad::start(&env, env.settings.amqp.shards, 91, 20, 8).await;
    wait_for(HANG, "orders before the faults", || async {
        count(&db, "SELECT count(*) FROM orders").await > 100
    })
    .await;

    let killed_at = Instant::now();
    signal(a.pid(), "-KILL");
    let after_kill = orders_resume(&db, killed_at, Duration::from_secs(10)).await;
    let (_, text_a) = a.wait().await;
    assert!(
        after_kill.is_some_and(|d| d <= AFTER_A_KILL),
        "orders resumed {after_kill:?} after the SIGKILL\n{text_a}"
    );

    // A restarted instance stands by behind b, which is active now.
    let (c, ready_c) = Serve::start(env_of(&mut engine(), &env), "engine ready").await;
    assert!(ready_c);
    let client = awc::Client::default();
    let b_counts = || async {
        (
            metric_sum(&client, &b_admin, "seckill_orders_total").await,
            metric_sum(&client, &b_admin, "seckill_intake_ack_failures_total").await,
        )
    };
    let b_before = b_counts().await;
    let stopped_at = Instant::now();
    signal(b.pid(), "-STOP");
    let after_stop = orders_resume(&db, stopped_at, Duration::from_secs(20)).await;
    // On purpose: b stays frozen for 20 s in all, well past the heartbeat's verdict.
    let left = Duration::from_secs(20).saturating_sub(stopped_at.elapsed());
    tokio::time::sleep(left).await;
    signal(b.pid(), "-CONT");
    let sent = load.stop().await;
    let settled = wait_until(settle(), || async {
        count(&db, "SELECT count(*) FROM consumer_inbox").await >= sent
    })
    .await;
    // What the frozen instance did once it woke: the transactions it held went on
    // (its PostgreSQL sessions were still open) and their acks met a closed channel.
    let b_after = b_counts().await;
    let (status_b, text_b) = b.terminate().await;
    let (status_c, text_c) = c.terminate().await;
    assert!(
        after_stop.is_some_and(|d| d <= AFTER_A_FREEZE_OR_CUT),
        "orders resumed {after_stop:?} after the SIGSTOP\n{text_b}\n{text_c}"
    );
    assert!(settled, "not every message settled");
    assert!(
        status_b.success() && status_c.success(),
        "{text_b}\n{text_c}"
    );
    // One effect each: one inbox row and one order per message, nothing else.
    assert_eq!(
        count(&db, "SELECT count(*) FROM consumer_inbox").await,
        sent
    );
    assert_eq!(count(&db, "SELECT count(*) FROM orders").await, sent);
    assert_invariants(&db).await;
    let delta = |after: Option<f64>, before: Option<f64>| after.zip(before).map(|(a, b)| a - b);
    eprintln!(
        "fail-over: {sent} messages; orders resumed {after_kill:?} after SIGKILL, {after_stop:?} after SIGSTOP; \
         the frozen instance, from SIGSTOP to its stop, settled {:?} messages and failed {:?} acks",
        delta(b_after.0, b_before.0),
        delta(b_after.1, b_before.1)
    );
    env.cleanup().await;
}

/// Three instances started with one configuration and six shards share them by
/// themselves: each becomes active on two (the shards of its node id's rank among
/// the live leases) while traffic flows (within `REBALANCE`); 9,000 messages over 64
/// buckets, a tenth of them delivered twice, each have one effect, and every
/// instance made orders.
#[actix_rt::test]
async fn three_instances_share_six_shards_two_each() {
    let (env, db, instances) = three_instances_on_six_shards(92, 100_000).await;
    let last_start = Instant::now();

    // 9,000 deliveries at about 300 a second: 8,182 messages, and a tenth as many
    // copies of earlier ones (same message id: duplicate deliveries).
    let (names, shards) = (env.names.clone(), 6u16);
    let amqp = env.amqp().await;
    let publisher = tokio::spawn(async move {
        let mut sent: Vec<seckill_engine::domain::message::OrderCreateMessage> = Vec::new();
        let mut deliveries = 0;
        let mut user = 0i64;
        while deliveries < 9_000 {
            let mut batch = Vec::new();
            for _ in 0..30 {
                if deliveries % 11 == 10 && !sent.is_empty() {
                    batch.push(sent[(deliveries * 7919) % sent.len()].clone());
                } else {
                    user += 1;
                    let msg = builders::order(92, 1, user, (user % 64) as i16);
                    sent.push(msg.clone());
                    batch.push(msg);
                }
                deliveries += 1;
            }
            builders::publish_to(&names, shards, &amqp, &batch).await;
            // The load's pace, not a wait.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        sent.len() as i64
    });

    let client = awc::Client::default();
    let admins: Vec<String> = instances.iter().map(|(_, a)| a.clone()).collect();
    // The spread needs deliveries to steer by: it must come before the traffic ends.
    let limit = REBALANCE.saturating_sub(last_start.elapsed());
    let spread = wait_shards(&client, &admins, limit, |all| {
        all.iter().all(|a| a.len() == 2)
    })
    .await
    .map(|(_, shards)| (last_start.elapsed(), shards));
    let messages = publisher.await.unwrap();
    let settled = wait_until(settle(), || async {
        count(&db, "SELECT count(*) FROM consumer_inbox").await >= messages
    })
    .await;
    let mut texts = String::new();
    for (serve, _) in instances {
        let (status, text) = serve.terminate().await;
        assert!(status.success(), "{text}");
        texts.push_str(&text);
    }
    let (took, active_shards) =
        spread.unwrap_or_else(|| panic!("no even spread within {REBALANCE:?}\n{texts}"));
    let mut union: Vec<u64> = active_shards.iter().flatten().copied().collect();
    union.sort_unstable();
    assert_eq!(union, vec![0, 1, 2, 3, 4, 5], "{active_shards:?}");
    assert!(settled, "not every message settled");
    assert_eq!(
        count(&db, "SELECT count(*) FROM consumer_inbox").await,
        messages
    );
    assert_eq!(count(&db, "SELECT count(*) FROM orders").await, messages);
    assert_invariants(&db).await;
    // The node id is bits 12..22 of a ledger id: every instance made orders.
    let nodes = count(
        &db,
        "SELECT count(DISTINCT (ledger_id >> 12) & 1023) FROM inventory_ledger",
    )
    .await;
    assert_eq!(nodes, 3, "orders were made by {nodes} instances");
    eprintln!("spread: {active_shards:?} after {took:?}; {messages} messages, 9,000 deliveries");
    env.cleanup().await;
}

/// A test environment with six shards, activity `activity` (SKU 1, `stock` units over
/// 64 buckets) and three `serve` processes on known admin addresses.
async fn three_instances_on_six_shards(
    activity: i64,
    stock: i32,
) -> (TestEnv, Client, Vec<(Serve, String)>) {
    let (env, db) = Sale::new()
        .set("amqp.shards", 6)
        .activity(activity, stock, 64)
        .open()
        .await;
    let mut instances = Vec::new();
    for _ in 0..3 {
        instances.push(serve_on_shards(&env, 6).await);
    }
    (env, db, instances)
}

/// Starts `serve` for `env` with `shards` shards on a known admin address.
async fn serve_on_shards(env: &TestEnv, shards: u16) -> (Serve, String) {
    serve_on_shards_via(env, shards, None).await
}

/// `serve_on_shards`, reaching the broker at `amqp_url` when given.
async fn serve_on_shards_via(
    env: &TestEnv,
    shards: u16,
    amqp_url: Option<&str>,
) -> (Serve, String) {
    let admin = format!("127.0.0.1:{}", free_port());
    let mut cmd = engine();
    env_of(&mut cmd, env)
        .env("SECKILL__AMQP__SHARDS", shards.to_string())
        .env("SECKILL__ADMIN__ADDR", &admin)
        // Two pipeline lanes: the instances that share shards also run the lanes.
        .env("SECKILL__ENGINE__PIPELINE_THREADS", "2");
    if let Some(url) = amqp_url {
        cmd.env("SECKILL__AMQP__URL", url);
    }
    let (serve, ready) = Serve::start(&mut cmd, "engine ready").await;
    assert!(ready, "an instance did not start");
    (serve, admin)
}

/// The shards an instance's /readyz says it is active on (None: no answer).
async fn active_shards(client: &awc::Client, admin: &str) -> Option<Vec<u64>> {
    let mut res = client
        .get(format!("http://{admin}/readyz"))
        .send()
        .await
        .ok()?;
    let body: serde_json::Value = res.json().await.ok()?;
    Some(
        body["active_shards"]
            .as_array()?
            .iter()
            .filter_map(|s| s.as_u64())
            .collect(),
    )
}

/// Polls the instances until `done` holds for their active shards, within `limit`:
/// how long it took and their shards then.
async fn wait_shards(
    client: &awc::Client,
    admins: &[String],
    limit: Duration,
    done: impl Fn(&[Vec<u64>]) -> bool,
) -> Option<(Duration, Vec<Vec<u64>>)> {
    poll_every(limit, Duration::from_millis(250), || async {
        let mut all = Vec::new();
        for admin in admins {
            all.push(active_shards(client, admin).await.unwrap_or_default());
        }
        if done(&all) {
            Ok(all)
        } else {
            Err(())
        }
    })
    .await
    .ok()
}

/// SIGKILL of the instance active on shard 0 under a steady load: the others are
/// active on its shards within 5 s; a restarted instance gets two shards back (within
/// `REBALANCE`: its predecessor's lease first ages out of the ranks); every message
/// has one effect.
#[actix_rt::test]
async fn a_killed_instance_s_shards_move_and_a_restart_gets_its_share_back() {
    let (env, db, mut instances) = three_instances_on_six_shards(93, 200_000).await;
    let load = SteadyLoad::start(&env, 6, 93, 30, 64).await;
    let client = awc::Client::default();
    let admins: Vec<String> = instances.iter().map(|(_, a)| a.clone()).collect();
    let two_each = |all: &[Vec<u64>]| all.iter().all(|a| a.len() == 2);
    let spread = wait_shards(&client, &admins, REBALANCE, two_each).await;
    assert!(spread.is_some(), "no even spread within {REBALANCE:?}");

    let victim = {
        let mut found = None;
        for (i, admin) in admins.iter().enumerate() {
            if active_shards(&client, admin)
                .await
                .unwrap_or_default()
                .contains(&0)
            {
                found = Some(i);
            }
        }
        found.expect("an instance is active on shard 0")
    };
    let (killed, _) = instances.remove(victim);
    signal(killed.pid(), "-KILL");
    let _ = killed.wait().await;
    let survivors: Vec<String> = instances.iter().map(|(_, a)| a.clone()).collect();
    let all_six = |all: &[Vec<u64>]| {
        let mut union: Vec<u64> = all.iter().flatten().copied().collect();
        union.sort_unstable();
        union.dedup();
        union.len() == 6
    };
    let taken = wait_shards(&client, &survivors, AFTER_A_KILL, all_six).await;

    // Started while the killed instance's lease still counts among the live ones:
    // the shards are shared among four, then among three once it has aged out.
    instances.push(serve_on_shards(&env, 6).await);
    let admins: Vec<String> = instances.iter().map(|(_, a)| a.clone()).collect();
    let back = wait_shards(&client, &admins, REBALANCE, two_each).await;

    let messages = load.stop().await;
    let settled = wait_until(settle(), || async {
        count(&db, "SELECT count(*) FROM consumer_inbox").await >= messages
    })
    .await;
    let mut texts = String::new();
    for (serve, _) in instances {
        let (_, text) = serve.terminate().await;
        texts.push_str(&text);
    }
    assert!(
        taken.is_some(),
        "the killed instance's shards were not all taken within {AFTER_A_KILL:?}\n{texts}"
    );
    assert!(
        back.is_some(),
        "the restarted instance did not get its share within {REBALANCE:?}\n{texts}"
    );
    assert!(settled, "not every message settled");
    assert_eq!(
        count(&db, "SELECT count(*) FROM consumer_inbox").await,
        messages
    );
    assert_eq!(count(&db, "SELECT count(*) FROM orders").await, messages);
    assert_invariants(&db).await;
    eprintln!(
        "kill: shards taken after {:?}; the restart had two after {:?} ({:?}); {messages} messages",
        taken.map(|t| t.0),
        back.as_ref().map(|b| b.0),
        back.as_ref().map(|b| b.1.clone())
    );
    env.cleanup().await;
}

/// The sum of every series of a counter or gauge in an instance's /metrics (0 when it
/// has none yet; None when the instance does not answer).
async fn metric_sum(client: &awc::Client, admin: &str, name: &str) -> Option<f64> {
    let mut res = client
        .get(format!("http://{admin}/metrics"))
        .send()
        .await
        .ok()?;
    let body = res.body().limit(16 << 20).await.ok()?;
    let text = String::from_utf8_lossy(&body);
    Some(
        text.lines()
            .filter(|l| {
                l.strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum(),
    )
}

/// A network cut between one of three instances and the broker (its connections stay
/// open and silent, new ones hang, as behind a dropped route) under a steady load:
/// the broker drops it by heartbeat and the other two are active on all six shards
/// within 15 s; once the cut heals it gets its two shards back (within `REBALANCE`); every
/// message has one effect. Its PostgreSQL link is never cut: what it held when cut
/// still commits, and its acks fail (counted and printed).
#[actix_rt::test]
async fn a_cut_off_instance_s_shards_move_within_15_s_and_come_back() {
    use secrecy::ExposeSecret;
    let (env, db) = Sale::new()
        .set("amqp.shards", 6)
        .activity(94, 200_000, 64)
        .open()
        .await;
    let url = env.settings.amqp.url.expose_secret().to_owned();
    let switch = crate::common::Switch::start(crate::common::target_of(&url, 5672)).await;
    let mut instances = Vec::new();
    for _ in 0..2 {
        instances.push(serve_on_shards(&env, 6).await);
    }
    let through = switch.url_through(&url);
    instances.push(serve_on_shards_via(&env, 6, Some(&through)).await);
    let cut_admin = instances[2].1.clone();

    let load = SteadyLoad::start(&env, 6, 94, 30, 64).await;
    let client = awc::Client::default();
    let admins: Vec<String> = instances.iter().map(|(_, a)| a.clone()).collect();
    let two_each = |all: &[Vec<u64>]| all.iter().all(|a| a.len() == 2);
    let spread = wait_shards(&client, &admins, REBALANCE, two_each).await;
    assert!(spread.is_some(), "no even spread within {REBALANCE:?}");
    let counts = || async {
        (
            metric_sum(&client, &cut_admin, "seckill_orders_total").await,
            metric_sum(&client, &cut_admin, "seckill_intake_ack_failures_total").await,
        )
    };
    let at_cut = counts().await;
    switch.black_hole();
    let survivors: Vec<String> = admins[..2].to_vec();
    let all_six = |all: &[Vec<u64>]| {
        let mut union: Vec<u64> = all.iter().flatten().copied().collect();
        union.sort_unstable();
        union.dedup();
        union.len() == 6
    };
    // Watched a little past the promise, to say by how much it was missed.
    let taken = wait_shards(&client, &survivors, Duration::from_secs(20), all_six).await;
    // On purpose: cut for longer than the instance's own heartbeat timeout and a
    // reconnect attempt.
    let cut_for = Duration::from_secs(20);
    if let Some((t, _)) = &taken {
        tokio::time::sleep(cut_for.saturating_sub(*t)).await;
    }
    // Its admin listener is not cut: what it did while cut off.
    let at_heal = counts().await;
    switch.set(true);
    let back = wait_shards(&client, &admins, REBALANCE, two_each).await;

    let messages = load.stop().await;
    let settled = wait_until(settle(), || async {
        count(&db, "SELECT count(*) FROM consumer_inbox").await >= messages
    })
    .await;
    let mut texts = String::new();
    for (serve, _) in instances {
        let (status, text) = serve.terminate().await;
        assert!(status.success(), "{text}");
        texts.push_str(&text);
    }
    let (took, shards) =
        taken.unwrap_or_else(|| panic!("the cut instance's shards were not taken\n{texts}"));
    assert!(
        took <= AFTER_A_FREEZE_OR_CUT,
        "the cut instance's shards were taken after {took:?} ({shards:?})\n{texts}"
    );
    assert!(
        back.is_some(),
        "the healed instance did not get its share within {REBALANCE:?}\n{texts}"
    );
    assert!(settled, "not every message settled");
    assert_eq!(
        count(&db, "SELECT count(*) FROM consumer_inbox").await,
        messages
    );
    assert_eq!(count(&db, "SELECT count(*) FROM orders").await, messages);
    assert_invariants(&db).await;
    // Acks sent into the cut are written to a socket nobody reads: they do not fail
    // where the instance can see it, and the broker redelivers those messages.
    let delta = |after: Option<f64>, before: Option<f64>| after.zip(before).map(|(a, b)| a - b);
    eprintln!(
        "network cut: shards taken after {took:?}; the healed instance had two after {:?}; \
         while cut off it settled {:?} messages and saw {:?} acks fail; {messages} messages",
        back.as_ref().map(|b| b.0),
        delta(at_heal.0, at_cut.0),
        delta(at_heal.1, at_cut.1)
    );
    env.cleanup().await;
}
