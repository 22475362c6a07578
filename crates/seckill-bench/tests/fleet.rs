//! Issue 50: a fleet from one configuration, roles by flag. One `serve --role front`
//! and two `serve --role engine` processes sell a sale driven by `seckill-bench`
//! through the front's HTTP port: every order is made by an engine process (their
//! own metrics), none by the front; each `/readyz` names its role; the engines opened
//! no buyer-facing port; and after one engine is SIGKILLed, the other makes the next
//! sale's orders within seconds.

use seckill_testkit as common;

use std::process::Command;
use std::time::Duration;

use common::process::{run, Serve};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A killed engine's shards are taken over within this (the broker's single active
/// consumer hands them to the standby as soon as the connection is gone).
const AFTER_A_KILL: Duration = Duration::from_secs(5);

fn bench_cmd() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_seckill-bench"));
    cmd.env("RUST_LOG", "warn");
    cmd
}

/// The test's private world and the secrets the front stage and the bench share.
fn env_of<'a>(cmd: &'a mut Command, env: &common::TestEnv) -> &'a mut Command {
    common::process::env_of(cmd, env)
        .env(
            "SECKILL__FRONTSTAGE__AUTH__HS256_SECRET",
            common::TEST_JWT_SECRET,
        )
        .env(
            "SECKILL__FRONTSTAGE__PURCHASE_TOKEN__SECRET",
            common::TEST_PURCHASE_SECRET,
        )
        // All the bench's buyers come from one address.
        .env("SECKILL__FRONTSTAGE__RATE_LIMIT__PER_ADDRESS_PER_S", "0")
}

/// The body of a plain HTTP/1.0 GET on 127.0.0.1:`port`, or "" if nothing answered.
async fn get(port: u16, path: &str) -> String {
    let fetch = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
            .await?;
        let mut text = String::new();
        stream.read_to_string(&mut text).await?;
        Ok::<_, std::io::Error>(text)
    };
    let text = tokio::time::timeout(Duration::from_secs(5), fetch)
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
    text.split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default()
}

/// The sum of a counter's series in the Prometheus text of `port`'s `/metrics`.
async fn counter(port: u16, name: &str) -> f64 {
    get(port, "/metrics")
        .await
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// One `serve --role ROLE` process with its own admin port (and buyers' port).
async fn serve(env: &common::TestEnv, role: &str, admin: u16, http: u16) -> Serve {
    let mut cmd = common::process::engine();
    env_of(&mut cmd, env)
        .args(["serve", "--role", role])
        .env("SECKILL__ADMIN__ADDR", format!("127.0.0.1:{admin}"))
        .env("SECKILL__HTTP__ADDR", format!("127.0.0.1:{http}"));
    let (serve, ready) = Serve::start(&mut cmd, "admin endpoints listening").await;
    assert!(
        ready,
        "serve --role {role} never got ready: {}",
        serve.logged()
    );
    serve
}

/// `seckill-bench --mode http` against the front: one sale of `stock` units to
/// `buyers` buyers, at `rate` requests a second if given; the command and where it
/// writes its report.
fn sale(
    env: &common::TestEnv,
    activity: &str,
    (stock, buyers): (&str, &str),
    rate: Option<&str>,
    front: u16,
) -> (Command, std::path::PathBuf) {
    let json = std::env::temp_dir().join(format!("seckill-fleet-{}.json", uuid::Uuid::new_v4()));
    let mut bench = bench_cmd();
    bench.env("SECKILL__FRONTSTAGE__RATE_LIMIT__PER_ADDRESS_PER_S", "0");
    env_of(&mut bench, env)
        .args([
            "--mode",
            "http",
            "--activity",
            activity,
            "--stock",
            stock,
            "--buckets",
            "4",
            "--buyers",
            buyers,
            "--duplicate-ratio",
            "0",
            "--concurrency",
            "16",
        ])
        .args(rate.map(|r| ["--rate", r]).into_iter().flatten())
        .arg("--url")
        .arg(format!("http://127.0.0.1:{front}"))
        .arg("--json")
        .arg(&json);
    (bench, json)
}

/// Runs a `sale` to its end; its report, once it passed.
async fn sold((mut bench, json): (Command, std::path::PathBuf)) -> serde_json::Value {
    let out = tokio::task::spawn_blocking(move || run(&mut bench))
        .await
        .unwrap();
    assert!(out.ok, "{}", out.text);
    assert!(out.text.contains("result: PASS"), "{}", out.text);
    let report = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    report
}

#[actix_rt::test]
async fn a_fleet_of_one_front_and_two_engines_sells_with_orders_made_by_the_engines() {
    let env = common::TestEnv::new().await;
    let port = common::free_port;
    let (front_http, front_admin) = (port(), port());
    let (a_http, a_admin, b_http, b_admin) = (port(), port(), port(), port());
    let engine_a = serve(&env, "engine", a_admin, a_http).await;
    let engine_b = serve(&env, "engine", b_admin, b_http).await;
    let front = serve(&env, "front", front_admin, front_http).await;

    for (port, role) in [
        (front_admin, "front"),
        (a_admin, "engine"),
        (b_admin, "engine"),
    ] {
        let readyz: serde_json::Value =
            serde_json::from_str(&get(port, "/readyz").await).expect("readyz");
        assert_eq!(readyz["role"], role, "{readyz}");
        assert_eq!(readyz["ready"], true, "{readyz}");
        // Intakes only where the engine runs; the front stage's own links only
        // where it runs.
        let checks = &readyz["checks"];
        assert_eq!(checks.get("intake").is_some(), role == "engine", "{readyz}");
        assert_eq!(
            checks.get("frontstage").is_some(),
            role == "front",
            "{readyz}"
        );
    }
    // The engines opened no buyer-facing port.
    for http in [a_http, b_http] {
        assert!(
            tokio::net::TcpStream::connect(("127.0.0.1", http))
                .await
                .is_err(),
            "an engine listens on its http.addr"
        );
    }

    // Each process leased a node id of its own; only the engines take a rank in
    // the shard split (a front stage mints ids but consumes no order queue).
    let db = env.db().await;
    let leases: Vec<(i16, String, bool)> = db
        .query(
            "SELECT node_id, roles, consumes FROM node_lease ORDER BY node_id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(leases.len(), 3, "{leases:?}");
    let engines: Vec<u16> = leases
        .iter()
        .filter(|(_, roles, _)| roles == "engine")
        .map(|(id, _, consumes)| {
            assert!(consumes);
            *id as u16
        })
        .collect();
    assert_eq!(engines.len(), 2, "{leases:?}");
    assert!(leases.iter().any(|l| l.1 == "front" && !l.2), "{leases:?}");
    let ranked = seckill_engine::store::node_lease::live_node_ids(&db, 15_000)
        .await
        .unwrap();
    assert_eq!(ranked, engines);

    let report = sold(sale(&env, "71", ("300", "600"), None, front_http)).await;
    assert_eq!(report["sold"], 300, "{report}");
    let (a, b) = (
        counter(a_admin, "seckill_orders_total").await,
        counter(b_admin, "seckill_orders_total").await,
    );
    // Which engine is active on which shard is the broker's single active consumer
    // and the lease ranks' to decide (a new instance gets its share within tens of
    // seconds, tests/it/scale_out.rs); here only that engines made them all.
    assert_eq!(a + b, 300.0, "orders by engine a {a}, b {b}");
    assert_eq!(counter(front_admin, "seckill_orders_total").await, 0.0);
    // The one that made most of them dies (it is active on shards); the other
    // survives.
    let (victim, (survivor, survivor_admin, before)) = match a >= b {
        true => (engine_a, (engine_b, b_admin, b)),
        false => (engine_b, (engine_a, a_admin, a)),
    };

    // A paced sale (about 8 s); one engine is SIGKILLed once it is under way. The
    // other takes over its shards: no pause between two orders reaches 5 s.
    let second = actix_rt::spawn(sold(sale(
        &env,
        "72",
        ("320", "320"),
        Some("40"),
        front_http,
    )));
    common::wait::wait_for(
        Duration::from_secs(60),
        "the paced sale's first orders",
        || async {
            common::count(&db, "SELECT count(*) FROM orders WHERE activity_id = 72").await >= 40
        },
    )
    .await;
    common::process::signal(victim.pid(), "-KILL");
    let made_before_kill =
        common::count(&db, "SELECT count(*) FROM orders WHERE activity_id = 72").await;
    let _ = victim.wait().await;
    let report = second.await.unwrap();
    assert_eq!(report["sold"], 320, "{report}");
    let gap = report["max_order_gap_ms"].as_f64().unwrap();
    eprintln!("longest pause between two orders of the paced sale: {gap:.0} ms");
    assert!(
        gap < AFTER_A_KILL.as_secs_f64() * 1_000.0,
        "orders paused {gap:.0} ms around the kill"
    );
    let by_survivor = counter(survivor_admin, "seckill_orders_total").await - before;
    assert!(
        by_survivor >= (320 - made_before_kill) as f64,
        "the surviving engine made {by_survivor} orders of the paced sale; {made_before_kill} were made before the kill"
    );

    let (_, front_log) = front.terminate().await;
    let (_, b_log) = survivor.terminate().await;
    assert!(front_log.contains("front"), "{front_log}");
    assert!(b_log.contains("engine ready"), "{b_log}");
    env.cleanup().await;
}
