//! `seckill-bench` against in-process engines: both paths sell out with clean
//! invariants; the amqp path refuses a missing queue and waits only for what the
//! broker took.

// The test kit (crates/seckill-testkit), under the name the engine's suite uses.
use seckill_testkit as common;

use std::process::Command;

use common::process::run;

fn bench_cmd() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_seckill-bench"));
    cmd.env("RUST_LOG", "warn");
    cmd
}

/// The test's private world, as for the engine (`process::env_of`), and the engine's
/// JWT secret: the bench signs each buyer's token with it.
fn env_of<'a>(cmd: &'a mut Command, env: &common::TestEnv) -> &'a mut Command {
    common::process::env_of(cmd, env).env(
        "SECKILL__FRONTSTAGE__AUTH__HS256_SECRET",
        common::TEST_JWT_SECRET,
    )
}

#[actix_rt::test]
async fn bench_sells_out_through_both_paths_with_clean_invariants() {
    // All the bench's buyers come from one address.
    let env = common::Sale::new()
        .set("frontstage.rate_limit.per_address_per_s", 0)
        .env()
        .await;
    let running_engine = common::engine::EngineHandle::start(&env.settings).await;
    let running = running_engine.front(&env.settings).await;
    let handle = running.server.handle();
    actix_rt::spawn(running.server);
    let dir = std::env::temp_dir().join(format!("seckill-bench-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();

    for (mode, activity) in [("http", "61"), ("amqp", "62")] {
        let json = dir.join(format!("{mode}.json"));
        let mut cmd = bench_cmd();
        // The bench reads the engine's configuration: with the limit on it would
        // refuse the run, naming the setting.
        cmd.env("SECKILL__FRONTSTAGE__RATE_LIMIT__PER_ADDRESS_PER_S", "0");
        env_of(&mut cmd, &env).args([
            "--mode",
            mode,
            "--activity",
            activity,
            "--stock",
            "60",
            "--buckets",
            "4",
            "--buyers",
            "400",
            "--duplicate-ratio",
            "0.2",
            "--concurrency",
            "16",
            "--url",
        ]);
        cmd.arg(format!("http://{}", running.addr))
            .arg("--json")
            .arg(&json);
        let out = tokio::task::spawn_blocking(move || run(&mut cmd))
            .await
            .unwrap();
        assert!(out.ok, "{mode}: {}", out.text);
        assert!(out.text.contains("result: PASS"), "{}", out.text);
        let report: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        assert_eq!(report["sold"], 60, "{mode}: {report}");
        assert_eq!(report["oversold"], 0);
        assert!(report["checks"]
            .as_object()
            .unwrap()
            .values()
            .all(|v| v == 0));
        // The host probe ran through the drive, and its stalls were set beside the
        // orders' times.
        let stalls = &report["host_stalls"];
        assert!(stalls["probes"].as_u64().unwrap() > 0, "{mode}: {report}");
        assert_eq!(
            stalls["stalls"].as_u64().unwrap(),
            stalls["windows"].as_array().unwrap().len() as u64
        );
        let slow = &report["slow_orders"];
        assert!(
            slow["in_host_stalls"].as_i64().unwrap() <= slow["over_50ms"].as_i64().unwrap(),
            "{mode}: {report}"
        );
    }
    // The amqp run took no unit from Redis; the bench set the sale's keys to
    // PostgreSQL's figures after it, so `check --redis` reads it clean.
    let mut check = common::process::engine();
    env_of(&mut check, &env).args(["check", "--activity", "62", "--redis"]);
    let checked = tokio::task::spawn_blocking(move || run(&mut check))
        .await
        .unwrap();
    assert!(
        checked.ok,
        "check --redis after the amqp run: {}",
        checked.text
    );
    // With the per-address limit on, as the engine's configuration has it by
    // default, an HTTP run is refused before it creates anything, naming the key.
    let mut limited = bench_cmd();
    env_of(&mut limited, &env).args([
        "--mode",
        "http",
        "--activity",
        "63",
        "--buyers",
        "5000",
        "--url",
    ]);
    limited.arg(format!("http://{}", running.addr));
    let refused = tokio::task::spawn_blocking(move || run(&mut limited))
        .await
        .unwrap();
    assert!(!refused.ok, "{}", refused.text);
    assert!(
        refused
            .text
            .contains("frontstage.rate_limit.per_address_per_s"),
        "{}",
        refused.text
    );
    let db = env.db().await;
    assert_eq!(
        common::count(
            &db,
            "SELECT count(*) FROM seckill_activity WHERE activity_id = 63"
        )
        .await,
        0,
        "nothing created"
    );
    handle.stop(true).await;
    running_engine.stop().await;
    std::fs::remove_dir_all(dir).unwrap();
    env.cleanup().await;
}

#[tokio::test]
async fn bench_amqp_checks_its_queues_and_waits_only_for_what_the_broker_took() {
    let env = common::TestEnv::new().await;
    let bench = |activity: &str, settle_timeout: &str| {
        let mut cmd = bench_cmd();
        env_of(&mut cmd, &env).args([
            "--mode",
            "amqp",
            "--activity",
            activity,
            "--stock",
            "5",
            "--buckets",
            "1",
            "--buyers",
            "5",
            "--duplicate-ratio",
            "0",
            "--settle-timeout",
            settle_timeout,
        ]);
        cmd
    };
    let queue = env.names.order_queue(0);
    let activity_exists = |activity: i64| {
        let env = &env;
        async move {
            env.db()
                .await
                .query_one(
                    "SELECT count(*) FROM seckill_activity WHERE activity_id = $1",
                    &[&activity],
                )
                .await
                .unwrap()
                .get::<_, i64>(0)
                == 1
        }
    };

    // No engine has declared this namespace's queues: refused before anything is
    // created or published.
    let mut cmd = bench("71", "1");
    let out = tokio::task::spawn_blocking(move || run(&mut cmd))
        .await
        .unwrap();
    assert!(!out.ok, "{}", out.text);
    assert!(
        out.text
            .contains(&format!("the order queue {queue} cannot be used")),
        "{}",
        out.text
    );
    assert!(out.text.contains("seckill-engine serve"), "{}", out.text);
    assert!(!activity_exists(71).await);

    // Declared but consumed by nothing: the run goes ahead and says what it waits for.
    let amqp = env.amqp().await;
    let channel = amqp.create_channel().await.unwrap();
    seckill_engine::mq::topology::declare_topology(&channel, &env.settings.amqp)
        .await
        .unwrap();
    let mut cmd = bench("72", "1");
    let out = tokio::task::spawn_blocking(move || run(&mut cmd))
        .await
        .unwrap();
    assert!(
        out.text.contains(&format!("nothing consumes {queue} yet")),
        "{}",
        out.text
    );
    assert!(
        out.text.contains("only 0 of 5 reservations settled"),
        "{}",
        out.text
    );
    assert!(activity_exists(72).await);
    // The messages wait for an engine.
    assert!(env.wait_ready_count(&channel, &queue, 5).await);

    // A queue nothing is routed to: the broker returns every message, the run waits
    // for none of them and fails. (Without counting them out, it waited its whole
    // settle timeout.)
    channel
        .queue_unbind(
            queue.as_str().into(),
            env.names.orders_exchange().as_str().into(),
            seckill_engine::mq::topology::Names::order_routing_key(0)
                .as_str()
                .into(),
            lapin::types::FieldTable::default(),
        )
        .await
        .unwrap();
    let mut cmd = bench("73", "60");
    let started = std::time::Instant::now();
    let out = tokio::task::spawn_blocking(move || run(&mut cmd))
        .await
        .unwrap();
    assert!(!out.ok, "{}", out.text);
    assert!(out.text.contains("publish_failed"), "{}", out.text);
    assert!(out.text.contains("result: FAIL"), "{}", out.text);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(60),
        "{}",
        out.text
    );
    seckill_engine::mq::close(&amqp, &[&channel]).await;
    env.cleanup().await;
}

/// Issue 49, "one failure cannot travel": a crowd of slow-body and idle keep-alive
/// connections, more than the engine's process may hold open (`prlimit` lowers its
/// descriptors to 512), beside a paced HTTP sale. Every unit sells, orders are made
/// throughout (no gap of 2 s), `/readyz` answers 200 within 1 s on every probe, and
/// the deadlines cut every crowd connection at least once.
#[actix_rt::test]
async fn a_crowd_beyond_the_descriptor_limit_cannot_stop_a_sale() {
    let env = common::TestEnv::new().await;
    let (http, admin) = (common::free_port(), common::free_port());
    let mut cmd = Command::new("prlimit");
    cmd.args(["--nofile=512:512", "--"])
        .arg(common::process::engine_binary())
        .env("RUST_LOG", "warn")
        .env(
            "SECKILL__FRONTSTAGE__PURCHASE_TOKEN__SECRET",
            common::TEST_PURCHASE_SECRET,
        );
    env_of(&mut cmd, &env)
        .env("SECKILL__HTTP__ADDR", format!("127.0.0.1:{http}"))
        .env("SECKILL__ADMIN__ADDR", format!("127.0.0.1:{admin}"))
        .env("SECKILL__FRONTSTAGE__RATE_LIMIT__PER_ADDRESS_PER_S", "0")
        .env("SECKILL__FRONTSTAGE__LIMITS__HEADER_READ_MS", "1000")
        .env("SECKILL__FRONTSTAGE__LIMITS__BODY_READ_MS", "1000")
        .env("SECKILL__FRONTSTAGE__LIMITS__KEEP_ALIVE_MS", "2000");
    // Logged once both listeners are up (the front stage's comes first).
    let (serve, ready) = common::process::Serve::start(&mut cmd, "admin endpoints listening").await;
    assert!(ready, "serve never got ready: {}", serve.logged());
    let json = std::env::temp_dir().join(format!("seckill-crowd-{}.json", uuid::Uuid::new_v4()));
    let mut bench = bench_cmd();
    env_of(&mut bench, &env)
        .args([
            "--mode",
            "http",
            "--stock",
            "300",
            "--buckets",
            "4",
            "--buyers",
            "300",
            "--duplicate-ratio",
            "0",
            "--concurrency",
            "32",
            "--rate",
            "60",
            "--slow-clients",
            "500",
            "--idle-clients",
            "200",
            "--trickle-ms",
            "400",
        ])
        .arg("--url")
        .arg(format!("http://127.0.0.1:{http}"))
        .arg("--metrics-url")
        .arg(format!("http://127.0.0.1:{admin}/metrics"))
        .arg("--json")
        .arg(&json);
    let out = tokio::task::spawn_blocking(move || run(&mut bench))
        .await
        .unwrap();
    let (_, logged) = serve.terminate().await;
    assert!(out.ok, "{}\n{logged}", out.text);
    assert!(out.text.contains("result: PASS"), "{}", out.text);
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    assert_eq!(report["sold"], 300, "{report}");
    let crowd = &report["crowd"];
    assert_eq!(crowd["readyz_failed"], 0, "{crowd}");
    assert!(crowd["readyz_probes"].as_u64().unwrap() >= 10, "{crowd}");
    assert!(
        crowd["closed_by_server"].as_u64().unwrap() >= 700,
        "the deadlines cut each crowd connection at least once: {crowd}"
    );
    assert!(
        report["max_order_gap_ms"].as_f64().unwrap() < 2_000.0,
        "{report}"
    );
    assert!(!logged.contains("Too many open files"), "{logged}");
    env.cleanup().await;
}

/// Issue 51, "tools that survive their drills": the bench rides through its
/// dependencies' outages. The broker goes away for 4 s (for the engine and the
/// bench alike) in the middle of a paced amqp run, and Redis (for the front stage)
/// in the middle of a paced http run, longer than the front stage's Redis timeout
/// (2 s), so that buyers get 503s. The bench sends again what each outage
/// stopped (the same message; the same request id after the 503's `Retry-After`),
/// and both runs sell every unit and print PASS.
#[actix_rt::test]
async fn the_bench_rides_through_a_lost_broker_and_a_lost_redis() {
    use secrecy::ExposeSecret;
    let base = common::base_settings();
    let amqp_url = base.amqp.url.expose_secret().to_owned();
    let redis_url = base.redis.url.expose_secret().to_owned();
    let broker = common::Switch::start(common::target_of(&amqp_url, 5672)).await;
    let redis = common::Switch::start(common::target_of(&redis_url, 6379)).await;
    let (amqp_url, redis_url) = (broker.url_through(&amqp_url), redis.url_through(&redis_url));
    let env = common::Sale::new()
        .set("frontstage.rate_limit.per_address_per_s", 0)
        .set("amqp.url", amqp_url.clone())
        .set("redis.url", redis_url.clone())
        .env()
        .await;
    let running_engine = common::engine::EngineHandle::start(&env.settings).await;
    let running = running_engine.front(&env.settings).await;
    let handle = running.server.handle();
    actix_rt::spawn(running.server);
    let dir = std::env::temp_dir().join(format!("seckill-bench-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let db = env.db().await;

    for (mode, activity, switch) in [("amqp", 66_i64, &broker), ("http", 67, &redis)] {
        let json = dir.join(format!("{mode}.json"));
        let mut cmd = bench_cmd();
        // The bench's own links go through the switches too.
        cmd.env("SECKILL__FRONTSTAGE__RATE_LIMIT__PER_ADDRESS_PER_S", "0")
            .env("SECKILL__AMQP__URL", &amqp_url)
            .env("SECKILL__REDIS__URL", &redis_url);
        env_of(&mut cmd, &env)
            .args(["--mode", mode, "--activity", &activity.to_string()])
            .args(["--stock", "200", "--buckets", "4", "--buyers", "300"])
            .args(["--duplicate-ratio", "0", "--concurrency", "16"])
            // Paced, so that the sale is still selling when the service goes.
            .args(["--rate", "100", "--settle-timeout", "120", "--url"])
            .arg(format!("http://{}", running.addr))
            .arg("--json")
            .arg(&json);
        let run = tokio::task::spawn_blocking(move || run(&mut cmd));
        let sql = format!("SELECT count(*) FROM orders WHERE activity_id = {activity}");
        let selling = common::wait_until(std::time::Duration::from_secs(60), || async {
            common::count(&db, &sql).await >= 40
        })
        .await;
        assert!(selling, "{mode}: the sale never got going");
        switch.set(false);
        tokio::time::sleep(std::time::Duration::from_secs(4)).await;
        switch.set(true);
        let out = run.await.unwrap();
        eprintln!("{mode}:\n{}", out.text);
        assert!(out.ok, "{mode}: {}", out.text);
        assert!(out.text.contains("result: PASS"), "{mode}: {}", out.text);
        let report: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        assert_eq!(report["sold"], 200, "{mode}: {}", out.text);
        assert!(
            report["retried"].as_u64().unwrap() > 0,
            "{mode}: the outage stopped nothing? {}",
            out.text
        );
    }
    handle.stop(true).await;
    running_engine.stop().await;
    std::fs::remove_dir_all(dir).unwrap();
    env.cleanup().await;
}
