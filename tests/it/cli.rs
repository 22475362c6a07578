//! The command line: migrate is idempotent, validate names the failing key and its
//! source, the engine refuses an unmigrated schema.

use std::process::Command;

use seckill_engine::store;
use secrecy::ExposeSecret;

use crate::common::process::{engine, env_of, run, signal, without_colours, Serve};
use crate::common::{admin_config, base_settings, with_dbname};

async fn drop_database(name: &str) {
    let client = store::connect(&admin_config()).await.unwrap();
    client
        .batch_execute(&format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            store::migrate::quote_ident(name)
        ))
        .await
        .unwrap();
}

#[tokio::test]
async fn migrate_creates_the_database_and_is_idempotent() {
    let name = format!(
        "seckill_cli_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let url = with_dbname(base_settings().database.url.expose_secret(), &name);

    // Before migrating, validate reports the unmigrated schema and fails.
    let before = run(engine().env("SECKILL__DATABASE__URL", &url).arg("validate"));
    assert!(!before.ok, "{}", before.text);

    let first = run(engine().env("SECKILL__DATABASE__URL", &url).arg("migrate"));
    assert!(first.ok, "{}", first.text);
    assert!(first.text.contains("created database"), "{}", first.text);
    assert!(first.text.contains("applied V1__schema"), "{}", first.text);

    let second = run(engine().env("SECKILL__DATABASE__URL", &url).arg("migrate"));
    assert!(second.ok, "{}", second.text);
    assert!(
        second.text.contains("schema is up to date"),
        "{}",
        second.text
    );
    assert!(!second.text.contains("applied"), "{}", second.text);

    let valid = run(engine().env("SECKILL__DATABASE__URL", &url).arg("validate"));
    assert!(valid.ok, "{}", valid.text);
    assert_eq!(
        valid.text.lines().filter(|l| l.starts_with("ok")).count(),
        5,
        "{}",
        valid.text
    );
    drop_database(&name).await;
}

#[test]
fn validate_names_the_key_of_an_unreachable_database() {
    // Port 1 on loopback: nothing listens there.
    let out = run(engine()
        .env(
            "SECKILL__DATABASE__URL",
            "postgres://postgres:hunter2@127.0.0.1:1/seckill",
        )
        .arg("validate"));
    assert!(!out.ok, "{}", out.text);
    let line = out
        .text
        .lines()
        .find(|l| l.contains("postgres"))
        .unwrap_or_default();
    assert!(line.starts_with("FAIL"), "{}", out.text);
    assert!(line.contains("database.url"), "{}", out.text);
    assert!(line.contains("SECKILL__DATABASE__URL"), "{}", out.text);
    assert!(
        !out.text.contains("hunter2"),
        "the password leaked: {}",
        out.text
    );
}

#[test]
fn malformed_values_name_the_key_and_the_source() {
    let out = run(engine()
        .env("SECKILL__DATABASE__POOL_SIZE", "lots")
        .arg("validate"));
    assert!(!out.ok);
    assert!(out.text.contains("database.pool_size"), "{}", out.text);
    assert!(
        out.text.contains("SECKILL__DATABASE__POOL_SIZE"),
        "{}",
        out.text
    );

    let dir = std::env::temp_dir().join(format!("seckill-cfg-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("bad.toml");
    std::fs::write(&file, "[amqp]\nshards = 0\n").unwrap();
    let out = run(engine().arg("--config").arg(&file).arg("validate"));
    assert!(!out.ok);
    assert!(out.text.contains("amqp.shards"), "{}", out.text);
    assert!(out.text.contains("bad.toml"), "{}", out.text);

    let out = run(engine()
        .env("SECKILL__AMQP__URL", "http://guest:hunter2@nowhere")
        .arg("validate"));
    assert!(!out.ok);
    assert!(out.text.contains("amqp.url"), "{}", out.text);
    assert!(
        !out.text.contains("hunter2"),
        "the password leaked: {}",
        out.text
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[actix_rt::test]
async fn the_engine_refuses_an_unmigrated_database() {
    let name = format!(
        "seckill_cli_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let client = store::connect(&admin_config()).await.unwrap();
    client
        .batch_execute(&format!(
            "CREATE DATABASE {}",
            store::migrate::quote_ident(&name)
        ))
        .await
        .unwrap();
    let mut settings = base_settings();
    settings.database.url = with_dbname(settings.database.url.expose_secret(), &name).into();
    let err = seckill_engine::engine::Engine::start(&settings)
        .await
        .err()
        .expect("an unmigrated database is refused");
    assert!(err.to_string().contains("not migrated"), "{err}");
    drop_database(&name).await;
}

#[tokio::test]
async fn activity_create_loads_postgres_and_redis_and_refuses_to_overwrite() {
    let env = crate::common::TestEnv::new().await;
    let args = [
        "activity",
        "create",
        "--activity",
        "31",
        "--sku",
        "5",
        "--stock",
        "10",
        "--buckets",
        "4",
        "--price",
        "4999",
    ];
    let out = run(env_of(&mut engine(), &env).args(args));
    assert!(out.ok, "{}", out.text);
    let db = env.db().await;
    let rows: Vec<(i16, i32, i32, i32)> = db
        .query(
            "SELECT bucket_no, total_stock, available_stock, allocated_stock FROM sku_inventory
             WHERE activity_id = 31 AND sku_id = 5 ORDER BY bucket_no",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    assert_eq!(
        rows,
        vec![(0, 3, 3, 0), (1, 3, 3, 0), (2, 2, 2, 0), (3, 2, 2, 0)]
    );
    let mut redis = env.redis().await;
    let keys = seckill_engine::redis::keys::SkuKeys::new(&env.settings.redis.key_prefix, 31, 5);
    for (bucket, stock) in [(0, 3), (1, 3), (2, 2), (3, 2)] {
        let got: i32 = ::redis::cmd("GET")
            .arg(keys.stock(bucket))
            .query_async(&mut redis)
            .await
            .unwrap();
        assert_eq!(got, stock, "bucket {bucket}");
    }

    let again = run(env_of(&mut engine(), &env).args(args));
    assert!(!again.ok, "{}", again.text);
    assert!(again.text.contains("already exists"), "{}", again.text);
    let planned: i32 = db
        .query_one(
            "SELECT planned_stock FROM seckill_sku WHERE activity_id = 31",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(planned, 10, "the second run must not overwrite");
    // An order TTL of zero or of centuries is refused, naming the flag, not a panic.
    for ttl in ["0", "99999999999999"] {
        let out = run(env_of(&mut engine(), &env).args([
            "activity",
            "create",
            "--activity",
            "39",
            "--sku",
            "1",
            "--stock",
            "1",
            "--buckets",
            "1",
            "--price",
            "1",
            "--order-ttl",
            ttl,
        ]));
        assert!(!out.ok, "{}", out.text);
        assert!(
            out.text.contains("--order-ttl must be between"),
            "{}",
            out.text
        );
    }
    env.cleanup().await;
}

#[tokio::test]
async fn check_passes_on_clean_data_and_fails_on_a_broken_invariant() {
    let env = crate::common::TestEnv::new().await;
    let mut db = env.db().await;
    crate::common::builders::activity(&mut db, 32, 1, 5, 1).await;
    let out = run(env_of(&mut engine(), &env).arg("check"));
    assert!(out.ok, "{}", out.text);
    assert_eq!(
        out.text.lines().filter(|l| l.starts_with("ok")).count(),
        8,
        "{}",
        out.text
    );

    // An order that took no stock and has no ledger row: an oversell in disguise.
    let m = crate::common::builders::order(32, 1, 77, 0);
    db.execute(
        "INSERT INTO orders (order_id, order_no, request_id, reservation_id, source_message_id,
            activity_id, sku_id, user_id, inventory_bucket, unit_price, total_amount, expire_at)
         VALUES ($1, $2, $3, $4, $5, 32, 1, 77, 0, 1, 1, now() + interval '1 hour')",
        &[
            &m.order_id,
            &m.order_no,
            &m.request_id,
            &m.reservation_id,
            &m.message_id,
        ],
    )
    .await
    .unwrap();
    let out = run(env_of(&mut engine(), &env).args(["check", "--activity", "32"]));
    assert!(!out.ok, "{}", out.text);
    for check in [
        "ledger_order_consistency",
        "allocated_matches_orders",
        "inbox_order_consistency",
    ] {
        let line = out.text.lines().find(|l| l.contains(check)).unwrap();
        assert!(line.starts_with("FAIL"), "{line}");
    }
    // Another activity is unaffected.
    let out = run(env_of(&mut engine(), &env).args(["check", "--activity", "999"]));
    assert!(out.ok, "{}", out.text);
    env.cleanup().await;
}

/// `diagnose` names the session that holds a lock another waits for, lists the open
/// transactions and the tables, and writes nothing: it runs here on connections
/// that refuse any write (issue 35 pt 3).
#[tokio::test]
async fn diagnose_names_the_blocker_and_writes_nothing() {
    let env = crate::common::TestEnv::new().await;
    let mut db = env.db().await;
    crate::common::builders::activity(&mut db, 33, 1, 5, 1).await;
    // The engine's queues, so that their dead-letter depths can be read.
    crate::common::engine::EngineHandle::start(&env.settings)
        .await
        .stop()
        .await;
    let mut holder = env.db().await;
    holder
        .batch_execute("SET application_name = 'it-lock-holder'")
        .await
        .unwrap();
    let holder_pid: i32 = holder
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let hold = holder.transaction().await.unwrap();
    hold.execute(
        "UPDATE sku_inventory SET version = version + 1 WHERE activity_id = 33",
        &[],
    )
    .await
    .unwrap();
    let waiter = env.db().await;
    let waiter_pid: i32 = waiter
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let waiting = tokio::spawn(async move {
        waiter
            .execute(
                "UPDATE sku_inventory SET version = version + 1 WHERE activity_id = 33",
                &[],
            )
            .await
    });
    assert!(
        crate::common::wait_until(std::time::Duration::from_secs(10), || async {
            crate::common::count(
                &db,
                &format!(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = {waiter_pid} AND wait_event_type = 'Lock'"
                ),
            )
            .await
                == 1
        })
        .await
    );
    let url = env.settings.database.url.expose_secret();
    let sep = if url.contains('?') { '&' } else { '?' };
    let read_only = format!("{url}{sep}options=-c%20default_transaction_read_only%3Don");
    let out = run(env_of(&mut engine(), &env)
        .env("SECKILL__DATABASE__URL", read_only)
        .arg("diagnose"));
    assert!(out.ok, "{}", out.text);
    assert!(
        out.text.contains(&format!("pid {waiter_pid} waits")),
        "{}",
        out.text
    );
    assert!(
        out.text
            .contains(&format!("blocked by pid {holder_pid} (it-lock-holder")),
        "{}",
        out.text
    );
    for line in [
        "open transactions",
        "sku_inventory",
        "backlog: outbox",
        "dead letters: ",
    ] {
        assert!(out.text.contains(line), "{line}: {}", out.text);
    }
    assert!(!out.text.contains("dead letters: unknown"), "{}", out.text);
    hold.rollback().await.unwrap();
    waiting.await.unwrap().unwrap();
    env.cleanup().await;
}

/// Following one activity's orders (issue 35 pt 1): the activities of
/// `telemetry.trace_activities`, and one added by `POST /admin/trace`, get an INFO
/// line per order transaction with the §12.1 fields, at the default level; another
/// activity's orders log nothing at INFO.
#[actix_rt::test]
async fn traced_activities_log_each_order_at_info_and_others_do_not() {
    let env = crate::common::TestEnv::new().await;
    let mut db = env.db().await;
    for activity in [82, 83, 84] {
        crate::common::builders::activity(&mut db, activity, 1, 10, 1).await;
    }
    let admin = format!("127.0.0.1:{}", crate::common::free_port());
    let token = "test-admin-token-0123456789";
    let mut cmd = engine();
    env_of(&mut cmd, &env)
        .env("SECKILL__ADMIN__ADDR", &admin)
        .env("SECKILL__ADMIN__TOKEN", token)
        .env("SECKILL__TELEMETRY__TRACE_ACTIVITIES", "[82]");
    let (serve, ready) = Serve::start(&mut cmd, "admin endpoints listening").await;
    let result = async {
        assert!(ready, "serve never listened");
        let amqp = env.amqp().await;
        let batch = |activity: i64| -> Vec<_> {
            (1..=5)
                .map(|u| crate::common::builders::order(activity, 1, u, 0))
                .collect()
        };
        let settled = |n: i64| {
            let db = &db;
            async move {
                crate::common::wait_until(std::time::Duration::from_secs(60), || async {
                    crate::common::count(db, "SELECT count(*) FROM consumer_inbox").await == n
                })
                .await
            }
        };
        crate::common::builders::publish(&env, &amqp, &batch(82)).await;
        crate::common::builders::publish(&env, &amqp, &batch(83)).await;
        assert!(settled(10).await);
        let mut res = awc::Client::default()
            .post(format!("http://{admin}/admin/trace"))
            .insert_header(("Authorization", format!("Bearer {token}")))
            .send_json(&serde_json::json!({"activity_id": 84, "ttl_secs": 600}))
            .await
            .unwrap();
        let body: serde_json::Value = res.json().await.unwrap();
        assert_eq!(res.status().as_u16(), 200, "{body}");
        let followed: Vec<i64> = body["followed"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["activity_id"].as_i64().unwrap())
            .collect();
        assert_eq!(followed, vec![82, 84], "{body}");
        crate::common::builders::publish(&env, &amqp, &batch(84)).await;
        assert!(settled(15).await);
    };
    result.await;
    let (_, text) = serve.terminate().await;
    let text = without_colours(&text);
    let committed = |activity: i64| -> Vec<&str> {
        text.lines()
            .filter(|l| l.contains("order transaction committed"))
            .filter(|l| l.contains(&format!("activity_id={activity} ")))
            .collect()
    };
    assert_eq!(committed(82).len(), 5, "{text}");
    assert_eq!(committed(84).len(), 5, "{text}");
    assert_eq!(committed(83).len(), 0, "{text}");
    for line in committed(82).iter().chain(committed(84).iter()) {
        assert!(line.contains(" INFO "), "{line}");
        for field in [
            "message_id=",
            "reservation_id=",
            "order_id=",
            "request_id=",
            "bucket=",
            "db_duration_ms=",
            "commit_result=",
        ] {
            assert!(line.contains(field), "{field} missing: {line}");
        }
    }
    assert!(
        text.lines()
            .any(|l| l.contains("message processed") && l.contains("reservation_id=")),
        "{text}"
    );
    env.cleanup().await;
}

#[tokio::test]
async fn serve_starts_and_exits_cleanly_on_sigterm() {
    let env = crate::common::TestEnv::new().await;
    let (serve, ready) = Serve::start(env_of(&mut engine(), &env), "engine ready").await;
    let (status, text) = serve.terminate().await;
    assert!(ready, "the engine never logged readiness:\n{text}");
    assert!(status.success(), "serve exited with {status}:\n{text}");
    assert!(text.contains("engine stopped"), "{text}");
    env.cleanup().await;
}

#[tokio::test]
async fn check_redis_reports_drift_between_redis_and_postgres() {
    use seckill_engine::redis::keys::SkuKeys;
    use seckill_engine::redis::scripts;
    let env = crate::common::TestEnv::new().await;
    let create = run(env_of(&mut engine(), &env).args([
        "activity",
        "create",
        "--activity",
        "71",
        "--sku",
        "1",
        "--stock",
        "8",
        "--buckets",
        "2",
        "--price",
        "100",
    ]));
    assert!(create.ok, "{}", create.text);
    let out = run(env_of(&mut engine(), &env).args(["check", "--redis"]));
    assert!(out.ok, "{}", out.text);
    assert!(
        out.text
            .lines()
            .any(|l| l.starts_with("ok") && l.contains("redis_drift")),
        "{}",
        out.text
    );

    // A reservation whose message is still on its way: Redis has one unit less, and
    // that is no drift.
    let keys = SkuKeys::new(&env.settings.redis.key_prefix, 71, 1);
    let mut redis = env.redis().await;
    let id = uuid::Uuid::now_v7();
    let expiry = chrono::Utc::now().timestamp_millis() + 60_000;
    scripts::reserve(
        &mut redis,
        &keys,
        2,
        5,
        uuid::Uuid::now_v7(),
        id,
        expiry,
        60,
        &format!("{id}|1|S1"),
        crate::common::sale_end().timestamp_millis(),
    )
    .await
    .unwrap();
    let out = run(env_of(&mut engine(), &env).args(["check", "--redis", "--activity", "71"]));
    assert!(out.ok, "{}", out.text);

    // A unit that vanished from Redis is drift.
    let _: i64 = ::redis::cmd("DECR")
        .arg(keys.stock(1))
        .query_async(&mut redis)
        .await
        .unwrap();
    let out = run(env_of(&mut engine(), &env).args(["check", "--redis", "--activity", "71"]));
    assert!(!out.ok, "{}", out.text);
    assert!(
        out.text
            .contains("bucket 1: postgres available 4, redis stock"),
        "{}",
        out.text
    );
    assert!(out.text.contains("drift 1"), "{}", out.text);
    env.cleanup().await;
}

#[actix_rt::test]
async fn serve_exposes_liveness_readiness_and_metrics_that_count_outcomes() {
    let env = crate::common::TestEnv::new().await;
    let mut db = env.db().await;
    crate::common::builders::activity(&mut db, 81, 1, 10, 1).await;
    let admin = format!("127.0.0.1:{}", crate::common::free_port());
    let mut cmd = engine();
    env_of(&mut cmd, &env)
        .env("SECKILL__ADMIN__ADDR", &admin)
        .env("SECKILL__HTTP__ADDR", "127.0.0.1:0")
        .env("SECKILL__TELEMETRY__FORMAT", "json")
        .env("SECKILL__TELEMETRY__SAMPLE_INTERVAL_MS", "100");
    let (serve, ready) = Serve::start_logging(
        &mut cmd,
        "admin endpoints listening",
        "info,seckill_engine=debug",
    )
    .await;
    let result = async {
        assert!(ready, "serve never listened");
        let client = awc::Client::default();
        let get = |path: &str| {
            let req = client.get(format!("http://{admin}{path}"));
            async move {
                let mut res = req.send().await.unwrap();
                let body = res.body().await.unwrap();
                (
                    res.status().as_u16(),
                    String::from_utf8_lossy(&body).into_owned(),
                )
            }
        };
        assert_eq!(get("/livez").await.0, 200);
        let (status, body) = get("/readyz").await;
        assert_eq!(status, 200, "{body}");

        let amqp = env.amqp().await;
        let msgs: Vec<_> = (1..=20)
            .map(|u| crate::common::builders::order(81, 1, u, 0))
            .collect();
        crate::common::builders::publish(&env, &amqp, &msgs).await;
        let settled = crate::common::wait_until(std::time::Duration::from_secs(60), || async {
            crate::common::count(&db, "SELECT count(*) FROM consumer_inbox").await == 20
        })
        .await;
        assert!(settled);
        // A COMMIT is visible in PostgreSQL before the engine has read its answer and
        // counted the outcome, so the inbox rows alone do not mean the counters are in.
        let counted = crate::common::wait_until(std::time::Duration::from_secs(10), || async {
            let text = get("/metrics").await.1;
            let outcomes: f64 = text
                .lines()
                .filter(|l| l.starts_with("seckill_orders_total{"))
                .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
                .sum();
            outcomes == 20.0
        })
        .await;
        assert!(counted, "the engine never counted 20 outcomes");
        let (status, text) = get("/metrics").await;
        assert_eq!(status, 200);
        // Prometheus text: comments, or `name{labels} value`.
        for line in text
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
        {
            let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("{line}"));
            assert!(value.parse::<f64>().is_ok(), "{line}");
            let name = series.split('{').next().unwrap();
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
                "{line}"
            );
        }
        let value = |series: &str| {
            text.lines()
                .find(|l| l.starts_with(series))
                .and_then(|l| l.rsplit_once(' '))
                .map(|(_, v)| v.parse::<f64>().unwrap())
        };
        assert_eq!(
            value("seckill_orders_total{outcome=\"created\"}"),
            Some(10.0),
            "{text}"
        );
        assert_eq!(
            value("seckill_orders_total{outcome=\"sold_out\"}"),
            Some(10.0),
            "{text}"
        );
        assert!(
            text.contains("seckill_order_tx_duration_seconds_bucket{"),
            "histograms, not summaries"
        );
        assert!(text.contains("seckill_build_info{version=\""), "{text}");
        // The gauges sampled from PostgreSQL, RabbitMQ and the pool, and the rest of
        // the list.
        let sampled = crate::common::wait_until(std::time::Duration::from_secs(10), || async {
            get("/metrics").await.1.contains("seckill_outbox_pending")
        })
        .await;
        assert!(sampled, "the gauge sampler never ran");
        let (_, text) = get("/metrics").await;
        for series in [
            "seckill_outbox_pending ",
            "seckill_outbox_oldest_pending_age_seconds ",
            "seckill_compensation_pending ",
            "seckill_compensation_oldest_pending_age_seconds ",
            "seckill_compensation_manual_review ",
            "seckill_db_pool_connections{state=\"idle\"} ",
            "seckill_db_pool_connections{state=\"in_use\"} ",
            "seckill_db_pool_waiting ",
            "seckill_db_permits_available ",
            "seckill_mailbox_depth{kind=\"bucket\"} ",
            "seckill_mailbox_depth_max{kind=\"bucket\"} ",
            // Fine buckets, as the commit latency has (the broker's part of it), down
            // to the millisecond.
            "seckill_intake_message_age_seconds_bucket{kind=\"order_create\",le=\"0.001\"}",
            "seckill_intake_message_age_seconds_bucket{kind=\"order_create\",le=\"0.015\"}",
            "seckill_redis_command_duration_seconds_bucket{command=\"ping\",le=",
            "seckill_ready ",
        ] {
            assert!(text.contains(series), "no {series} in\n{text}");
        }
        let dlq = format!(
            "seckill_dlq_messages{{queue=\"{}\"}} 0",
            env.names.order_dead_queue()
        );
        assert!(text.contains(&dlq), "no {dlq} in\n{text}");
        assert_eq!(value("seckill_mailbox_depth{kind=\"bucket\"}"), Some(0.0));
        msgs
    };
    let outcome = futures_util::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(result)).await;
    let (status, text) = serve.terminate().await;
    let msgs = match outcome {
        Ok(msgs) => msgs,
        Err(panic) => {
            eprintln!("{text}");
            std::panic::resume_unwind(panic);
        }
    };
    assert!(status.success(), "serve exited with {status}:\n{text}");
    // JSON lines, one per event; each order transaction logged with the fields of
    // seed §12.1, and no message body anywhere.
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let committed: Vec<_> = lines
        .iter()
        .filter(|l| l["message"] == "order transaction committed")
        .collect();
    assert_eq!(committed.len(), 20, "one line per transaction");
    for field in [
        "request_id",
        "reservation_id",
        "message_id",
        "activity_id",
        "sku_id",
        "user_id",
        "bucket",
        "consumer_group",
        "attempt",
        "affected_rows",
        "db_duration_ms",
        "pool_acquire_ms",
        "commit_result",
    ] {
        assert!(
            committed.iter().all(|l| !l[field].is_null()),
            "{field} missing in {:?}",
            committed[0]
        );
    }
    let taken: i64 = committed
        .iter()
        .map(|l| l["affected_rows"].as_i64().unwrap())
        .sum();
    assert_eq!(taken, 10, "ten units taken");
    for m in &msgs {
        assert!(
            !text.contains(&m.order_no),
            "a message body field was logged"
        );
    }
    assert!(
        !text.contains("\"ERROR\""),
        "no ERROR at a clean shutdown:\n{text}"
    );
    env.cleanup().await;
}

#[actix_rt::test]
async fn sigterm_mid_run_drains_and_a_restart_finishes_with_one_effect_each() {
    let env = crate::common::TestEnv::new().await;
    let mut db = env.db().await;
    crate::common::builders::activity(&mut db, 82, 1, 3_000, 4).await;
    let grace_ms = 20_000;
    let mut cmd = engine();
    env_of(&mut cmd, &env).env("SECKILL__SHUTDOWN__GRACE_MS", grace_ms.to_string());
    let (serve, ready) = Serve::start(&mut cmd, "engine ready").await;
    assert!(ready, "serve never became ready");

    let amqp = env.amqp().await;
    let msgs: Vec<_> = (0..5_000)
        .map(|u| crate::common::builders::order(82, 1, u + 1, (u % 4) as i16))
        .collect();
    crate::common::builders::publish(&env, &amqp, &msgs).await;
    let started = crate::common::wait_until(std::time::Duration::from_secs(120), || async {
        crate::common::count(&db, "SELECT count(*) FROM consumer_inbox").await >= 500
    })
    .await;
    assert!(started);
    let signalled_at = std::time::Instant::now();
    let (status, text) = serve.terminate().await;
    let took = signalled_at.elapsed();
    assert!(status.success(), "serve exited with {status}:\n{text}");
    assert!(
        took < std::time::Duration::from_millis(grace_ms),
        "exit took {took:?}"
    );
    assert!(text.contains("every delivery settled"), "{text}");
    let at_stop = crate::common::count(&db, "SELECT count(*) FROM consumer_inbox").await;
    assert!(at_stop < 5_000, "the signal came too late to test a drain");

    let engine = crate::common::engine::EngineHandle::start(&env.settings).await;
    let done = crate::common::wait_until(std::time::Duration::from_secs(240), || async {
        crate::common::count(&db, "SELECT count(*) FROM consumer_inbox").await >= 5_000
    })
    .await;
    engine.stop().await;
    assert!(done);
    assert_eq!(
        crate::common::count(&db, "SELECT count(DISTINCT message_id) FROM consumer_inbox").await,
        5_000
    );
    assert_eq!(
        crate::common::count(&db, "SELECT count(*) FROM orders").await,
        3_000
    );
    assert_eq!(
        crate::common::count(
            &db,
            "SELECT count(*) FROM inventory_reservation WHERE status = 20"
        )
        .await,
        2_000
    );
    crate::common::assert_invariants(&db).await;
    env.cleanup().await;
}

#[actix_rt::test]
async fn a_second_signal_exits_at_once_and_a_restart_loses_nothing() {
    let env = crate::common::TestEnv::new().await;
    let mut db = env.db().await;
    crate::common::builders::activity(&mut db, 83, 1, 100, 1).await;
    // Transactions wait on the held row instead of timing out, so the drain after
    // the first signal has something to wait for.
    let mut cmd = engine();
    env_of(&mut cmd, &env)
        .env("SECKILL__DATABASE__LOCK_TIMEOUT_MS", "120000")
        .env("SECKILL__DATABASE__STATEMENT_TIMEOUT_MS", "120000");
    let (serve, ready) = Serve::start(&mut cmd, "engine ready").await;
    assert!(ready, "serve never became ready");
    let mut holder = env.db().await;
    let lock = holder.transaction().await.unwrap();
    lock.execute("SELECT 1 FROM sku_inventory FOR UPDATE", &[])
        .await
        .unwrap();

    let amqp = env.amqp().await;
    let msgs: Vec<_> = (1..=10)
        .map(|u| crate::common::builders::order(83, 1, u, 0))
        .collect();
    crate::common::builders::publish(&env, &amqp, &msgs).await;
    let waiting = crate::common::wait_until(std::time::Duration::from_secs(30), || async {
        crate::common::count(
            &db,
            "SELECT count(*) FROM pg_stat_activity \
             WHERE wait_event_type = 'Lock' AND datname = current_database()",
        )
        .await
            >= 1
    })
    .await;
    assert!(waiting, "no transaction ever waited on the held row");
    serve.signal();
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let second = std::time::Instant::now();
    serve.signal();
    let (status, text) = serve.wait().await;
    assert!(
        second.elapsed() < std::time::Duration::from_secs(5),
        "the second signal did not end it at once ({:?})",
        second.elapsed()
    );
    assert_eq!(status.code(), Some(130), "{text}");
    assert!(text.contains("second signal"), "{text}");
    lock.rollback().await.unwrap();

    let engine = crate::common::engine::EngineHandle::start(&env.settings).await;
    let done = crate::common::wait_until(std::time::Duration::from_secs(60), || async {
        crate::common::count(&db, "SELECT count(*) FROM consumer_inbox").await >= 10
    })
    .await;
    engine.stop().await;
    assert!(done, "the unsettled deliveries came back");
    assert_eq!(
        crate::common::count(&db, "SELECT count(*) FROM orders").await,
        10
    );
    crate::common::assert_invariants(&db).await;
    env.cleanup().await;
}

/// The first engine records the shard layout; an engine with another shard count
/// refuses to start, naming both; `reshard` refuses while an order queue holds a
/// message and changes the layout once the queues are empty.
#[tokio::test]
async fn a_changed_shard_count_is_refused_until_resharded_on_empty_queues() {
    use lapin::options::{BasicPublishOptions, QueuePurgeOptions};
    let env = crate::common::TestEnv::new().await;
    let with_shards = |cmd: &mut Command, shards: &str| {
        env_of(cmd, &env).env("SECKILL__AMQP__SHARDS", shards);
    };

    let mut cmd = engine();
    with_shards(&mut cmd, "2");
    let (serve, ready) = Serve::start(&mut cmd, "engine ready").await;
    let (status, text) = serve.terminate().await;
    assert!(ready && status.success(), "{text}");

    let mut cmd = engine();
    with_shards(&mut cmd, "3");
    let (serve, ready) = Serve::start(&mut cmd, "engine ready").await;
    let (status, text) = serve.wait().await;
    assert!(!ready && !status.success(), "{text}");
    assert!(
        text.contains("amqp.shards = 3") && text.contains("records 2 shards"),
        "{text}"
    );

    // A message waits in shard 1's queue: resharding would strand it.
    let amqp = env.amqp().await;
    let channel = amqp.create_channel().await.unwrap();
    let queue = env.names.order_queue(1);
    channel
        .basic_publish(
            "".into(),
            queue.as_str().into(),
            BasicPublishOptions::default(),
            b"{}",
            lapin::BasicProperties::default(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    assert!(env.wait_ready_count(&channel, &queue, 1).await);
    let mut cmd = engine();
    env_of(&mut cmd, &env).args(["reshard", "--shards", "3"]);
    let out = run(&mut cmd);
    assert!(!out.ok, "{}", out.text);
    assert!(
        out.text.contains(&format!("{queue}: 1 messages")),
        "{}",
        out.text
    );

    channel
        .queue_purge(queue.as_str().into(), QueuePurgeOptions::default())
        .await
        .unwrap();
    let mut cmd = engine();
    env_of(&mut cmd, &env).args(["reshard", "--shards", "3"]);
    let out = run(&mut cmd);
    assert!(out.ok, "{}", out.text);
    assert!(
        out.text.contains("3 shards, shard function v2"),
        "{}",
        out.text
    );

    let mut cmd = engine();
    with_shards(&mut cmd, "3");
    let (serve, ready) = Serve::start(&mut cmd, "engine ready").await;
    let (status, text) = serve.terminate().await;
    assert!(ready && status.success(), "{text}");
    seckill_engine::mq::close(&amqp, &[&channel]).await;
    env.cleanup().await;
}

/// No secret is ever printed: for each secret-bearing key, a malformed value and a
/// well-formed but unreachable one, through `validate` and `serve`.
#[test]
fn no_secret_appears_in_any_output_for_bad_values() {
    const SECRET: &str = "s3cr3t-Pa55";
    let cases: &[(&str, String)] = &[
        // The URI parser quoted a URL missing `//` whole, password included.
        (
            "SECKILL__AMQP__URL",
            format!("amqp:guest:{SECRET}@127.0.0.1:5672/%2f"),
        ),
        (
            "SECKILL__AMQP__URL",
            format!("amqp://guest:{SECRET}@127.0.0.1:1/%2f"),
        ),
        (
            "SECKILL__AMQP__URL",
            format!("amqp://guest:{SECRET}@127.0.0.1:5672/%2f?heartbeat=x"),
        ),
        (
            "SECKILL__DATABASE__URL",
            format!("postgres://postgres:{SECRET}@127.0.0.1:1/seckill"),
        ),
        (
            "SECKILL__DATABASE__URL",
            format!("postgres://postgres:{SECRET}@127.0.0.1:5432"),
        ),
        (
            "SECKILL__DATABASE__URL",
            format!("postgres//postgres:{SECRET}@127.0.0.1/x"),
        ),
        (
            "SECKILL__REDIS__URL",
            format!("redis://:{SECRET}@127.0.0.1:1"),
        ),
        ("SECKILL__REDIS__URL", format!("redis:/:{SECRET}@127.0.0.1")),
        ("SECKILL__ADMIN__TOKEN", SECRET.to_owned()),
        ("SECKILL__ADMIN__METRICS_TOKEN", SECRET.to_owned()),
        (
            "SECKILL__DATABASE__REPLICA_URL",
            format!("postgres//reader:{SECRET}@127.0.0.1/x"),
        ),
        (
            "SECKILL__DATABASE__OWNER_URL",
            format!("postgres//owner:{SECRET}@127.0.0.1/x"),
        ),
        (
            "SECKILL__DATABASE__URL",
            format!("postgres://postgres:{SECRET}@127.0.0.1:5432/x?sslmode=verify-everything"),
        ),
        (
            "SECKILL__FRONTSTAGE__AMQP_URL",
            format!("amqp:front:{SECRET}@127.0.0.1:5672/%2f"),
        ),
        (
            "SECKILL__REDIS__URL",
            format!("rediss://:{SECRET}@127.0.0.1:1/#insecure"),
        ),
        // Too short to be accepted: the error names the key, never the value.
        ("SECKILL__FRONTSTAGE__AUTH__HS256_SECRET", SECRET.to_owned()),
        (
            "SECKILL__FRONTSTAGE__PURCHASE_TOKEN__SECRET",
            SECRET.to_owned(),
        ),
    ];
    for (key, value) in cases {
        for command in ["validate", "serve"] {
            let mut cmd = engine();
            // Any free ports, so a serve that does start binds nothing in use; a
            // serve that got that far is stopped by its failing dependency or below.
            cmd.env(key, value)
                .env("SECKILL__HTTP__ADDR", "127.0.0.1:0")
                .env("SECKILL__ADMIN__ADDR", "127.0.0.1:0")
                .env("SECKILL__DATABASE__CONNECT_TIMEOUT_MS", "2000")
                .env("RUST_LOG", "debug")
                .arg(command)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            let mut child = cmd.spawn().unwrap();
            // `serve` with only the admin token set runs: give it a moment to log
            // whatever it logs at start, then stop it.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
            while child.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(!text.is_empty(), "{key} {command}: no output at all");
            assert!(
                !text.contains(SECRET),
                "{key}={value:?} {command} printed the secret:\n{text}"
            );
        }
    }
}

/// Instances started with one configuration lease different node ids; one asked
/// for an id a live instance holds refuses to start, naming the holder; a clean stop
/// gives the ids back.
#[tokio::test]
async fn instances_lease_distinct_node_ids_and_a_held_id_is_refused() {
    let env = crate::common::TestEnv::new().await;
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
async fn orders_resume(
    db: &tokio_postgres::Client,
    from: std::time::Instant,
    limit: std::time::Duration,
) -> Option<std::time::Duration> {
    tokio::time::sleep_until((from + std::time::Duration::from_millis(300)).into()).await;
    let base = crate::common::count(db, "SELECT count(*) FROM orders").await;
    while from.elapsed() < limit {
        if crate::common::count(db, "SELECT count(*) FROM orders").await > base {
            return Some(from.elapsed());
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    None
}

/// Two instances consume one shard; RabbitMQ's single active consumer makes the
/// first active. SIGKILL of the active one: the standby makes orders within 5 s.
/// SIGSTOP of the new active one for 20 s (its TCP connection stays open): the
/// heartbeat lets the broker drop it and a restarted instance makes orders within
/// 15 s; after SIGCONT, every message still has exactly one effect.
#[actix_rt::test]
async fn a_standby_takes_the_shard_within_seconds_of_a_kill_or_a_freeze() {
    use crate::common::builders;
    let env = crate::common::TestEnv::new().await;
    let mut db = env.db().await;
    builders::activity(&mut db, 91, 1, 100_000, 8).await;
    let (a, ready_a) = Serve::start(env_of(&mut engine(), &env), "engine ready").await;
    let b_admin = format!("127.0.0.1:{}", crate::common::free_port());
    let (b, ready_b) = Serve::start(
        env_of(&mut engine(), &env).env("SECKILL__ADMIN__ADDR", &b_admin),
        "engine ready",
    )
    .await;
    assert!(ready_a && ready_b);

    // A steady load: 20 new buyers every 100 ms over 8 buckets.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let published = std::sync::Arc::new(std::sync::atomic::AtomicI64::new(0));
    let publisher = {
        let (stop, published) = (stop.clone(), published.clone());
        let (names, shards) = (env.names.clone(), env.settings.amqp.shards);
        let amqp = env.amqp().await;
        tokio::spawn(async move {
            let mut user = 0i64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let msgs: Vec<_> = (0..20)
                    .map(|_| {
                        user += 1;
                        builders::order(91, 1, user, (user % 8) as i16)
                    })
                    .collect();
                builders::publish_to(&names, shards, &amqp, &msgs).await;
                published.fetch_add(20, std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        })
    };
    let flowing = crate::common::wait_until(std::time::Duration::from_secs(20), || async {
        crate::common::count(&db, "SELECT count(*) FROM orders").await > 100
    })
    .await;
    assert!(flowing, "no orders before the faults");

    let killed_at = std::time::Instant::now();
    signal(a.pid(), "-KILL");
    let after_kill = orders_resume(&db, killed_at, std::time::Duration::from_secs(10)).await;
    let (_, text_a) = a.wait().await;
    assert!(
        after_kill.is_some_and(|d| d <= std::time::Duration::from_secs(5)),
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
    let stopped_at = std::time::Instant::now();
    signal(b.pid(), "-STOP");
    let after_stop = orders_resume(&db, stopped_at, std::time::Duration::from_secs(20)).await;
    let left = std::time::Duration::from_secs(20).saturating_sub(stopped_at.elapsed());
    tokio::time::sleep(left).await;
    signal(b.pid(), "-CONT");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    publisher.await.unwrap();
    let sent = published.load(std::sync::atomic::Ordering::Relaxed);
    let settled = crate::common::wait_until(std::time::Duration::from_secs(60), || async {
        crate::common::count(&db, "SELECT count(*) FROM consumer_inbox").await >= sent
    })
    .await;
    // What the frozen instance did once it woke: the transactions it held went on
    // (its PostgreSQL sessions were still open) and their acks met a closed channel.
    let b_after = b_counts().await;
    let (status_b, text_b) = b.terminate().await;
    let (status_c, text_c) = c.terminate().await;
    assert!(
        after_stop.is_some_and(|d| d <= std::time::Duration::from_secs(15)),
        "orders resumed {after_stop:?} after the SIGSTOP\n{text_b}\n{text_c}"
    );
    assert!(settled, "not every message settled");
    assert!(
        status_b.success() && status_c.success(),
        "{text_b}\n{text_c}"
    );
    // One effect each: one inbox row and one order per message, nothing else.
    assert_eq!(
        crate::common::count(&db, "SELECT count(*) FROM consumer_inbox").await,
        sent
    );
    assert_eq!(
        crate::common::count(&db, "SELECT count(*) FROM orders").await,
        sent
    );
    crate::common::assert_invariants(&db).await;
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
/// the live leases) within 30 s while traffic flows; 9,000 messages over 64 buckets,
/// a tenth of them delivered twice, each have one effect, and every instance made
/// orders.
#[actix_rt::test]
async fn three_instances_share_six_shards_two_each() {
    use crate::common::builders;
    let (env, db, instances) = three_instances_on_six_shards(92, 100_000).await;
    let last_start = std::time::Instant::now();

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
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        sent.len() as i64
    });

    let client = awc::Client::default();
    let admins: Vec<String> = instances.iter().map(|(_, a)| a.clone()).collect();
    let limit = std::time::Duration::from_secs(30).saturating_sub(last_start.elapsed());
    let spread = wait_shards(&client, &admins, limit, |all| {
        all.iter().all(|a| a.len() == 2)
    })
    .await
    .map(|(_, shards)| (last_start.elapsed(), shards));
    let messages = publisher.await.unwrap();
    let settled = crate::common::wait_until(std::time::Duration::from_secs(90), || async {
        crate::common::count(&db, "SELECT count(*) FROM consumer_inbox").await >= messages
    })
    .await;
    let mut texts = String::new();
    for (serve, _) in instances {
        let (status, text) = serve.terminate().await;
        assert!(status.success(), "{text}");
        texts.push_str(&text);
    }
    let (took, active_shards) =
        spread.unwrap_or_else(|| panic!("no even spread within 30 s\n{texts}"));
    let mut union: Vec<u64> = active_shards.iter().flatten().copied().collect();
    union.sort_unstable();
    assert_eq!(union, vec![0, 1, 2, 3, 4, 5], "{active_shards:?}");
    assert!(settled, "not every message settled");
    assert_eq!(
        crate::common::count(&db, "SELECT count(*) FROM consumer_inbox").await,
        messages
    );
    assert_eq!(
        crate::common::count(&db, "SELECT count(*) FROM orders").await,
        messages
    );
    crate::common::assert_invariants(&db).await;
    // The node id is bits 12..22 of a ledger id: every instance made orders.
    let nodes = crate::common::count(
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
) -> (
    crate::common::TestEnv,
    tokio_postgres::Client,
    Vec<(Serve, String)>,
) {
    let env = crate::common::TestEnv::with(|f| {
        f.merge(figment::providers::Serialized::default("amqp.shards", 6))
    })
    .await;
    let mut db = env.db().await;
    crate::common::builders::activity(&mut db, activity, 1, stock, 64).await;
    let mut instances = Vec::new();
    for _ in 0..3 {
        instances.push(serve_on_shards(&env, 6).await);
    }
    (env, db, instances)
}

/// Starts `serve` for `env` with `shards` shards on a known admin address.
async fn serve_on_shards(env: &crate::common::TestEnv, shards: u16) -> (Serve, String) {
    serve_on_shards_via(env, shards, None).await
}

/// `serve_on_shards`, reaching the broker at `amqp_url` when given.
async fn serve_on_shards_via(
    env: &crate::common::TestEnv,
    shards: u16,
    amqp_url: Option<&str>,
) -> (Serve, String) {
    let admin = format!("127.0.0.1:{}", crate::common::free_port());
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

/// Polls the instances until `done` holds for their active shards, within `limit`.
async fn wait_shards(
    client: &awc::Client,
    admins: &[String],
    limit: std::time::Duration,
    done: impl Fn(&[Vec<u64>]) -> bool,
) -> Option<(std::time::Duration, Vec<Vec<u64>>)> {
    let from = std::time::Instant::now();
    while from.elapsed() < limit {
        let mut all = Vec::new();
        for admin in admins {
            all.push(active_shards(client, admin).await.unwrap_or_default());
        }
        if done(&all) {
            return Some((from.elapsed(), all));
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    None
}

/// SIGKILL of the instance active on shard 0 under a steady load: the others are
/// active on its shards within 5 s; a restarted instance gets two shards back within
/// 30 s; every message has one effect.
#[actix_rt::test]
async fn a_killed_instance_s_shards_move_and_a_restart_gets_its_share_back() {
    use crate::common::builders;
    let (env, db, mut instances) = three_instances_on_six_shards(93, 200_000).await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (names, amqp) = (env.names.clone(), env.amqp().await);
    let publisher = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut user = 0i64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let batch: Vec<_> = (0..30)
                    .map(|_| {
                        user += 1;
                        builders::order(93, 1, user, (user % 64) as i16)
                    })
                    .collect();
                builders::publish_to(&names, 6, &amqp, &batch).await;
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            user
        })
    };
    let client = awc::Client::default();
    let admins: Vec<String> = instances.iter().map(|(_, a)| a.clone()).collect();
    let two_each = |all: &[Vec<u64>]| all.iter().all(|a| a.len() == 2);
    let spread = wait_shards(
        &client,
        &admins,
        std::time::Duration::from_secs(30),
        two_each,
    )
    .await;
    assert!(spread.is_some(), "no even spread within 30 s");

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
    let taken = wait_shards(
        &client,
        &survivors,
        std::time::Duration::from_secs(5),
        all_six,
    )
    .await;

    instances.push(serve_on_shards(&env, 6).await);
    let admins: Vec<String> = instances.iter().map(|(_, a)| a.clone()).collect();
    let back = wait_shards(
        &client,
        &admins,
        std::time::Duration::from_secs(30),
        two_each,
    )
    .await;

    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let messages = publisher.await.unwrap();
    let settled = crate::common::wait_until(std::time::Duration::from_secs(90), || async {
        crate::common::count(&db, "SELECT count(*) FROM consumer_inbox").await >= messages
    })
    .await;
    let mut texts = String::new();
    for (serve, _) in instances {
        let (_, text) = serve.terminate().await;
        texts.push_str(&text);
    }
    assert!(
        taken.is_some(),
        "the killed instance's shards were not all taken within 5 s\n{texts}"
    );
    assert!(
        back.is_some(),
        "the restarted instance did not get its share within 30 s\n{texts}"
    );
    assert!(settled, "not every message settled");
    assert_eq!(
        crate::common::count(&db, "SELECT count(*) FROM consumer_inbox").await,
        messages
    );
    assert_eq!(
        crate::common::count(&db, "SELECT count(*) FROM orders").await,
        messages
    );
    crate::common::assert_invariants(&db).await;
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
/// within 15 s; once the cut heals it gets its two shards back within 30 s; every
/// message has one effect. Its PostgreSQL link is never cut: what it held when cut
/// still commits, and its acks fail (counted and printed).
#[actix_rt::test]
async fn a_cut_off_instance_s_shards_move_within_15_s_and_come_back() {
    use crate::common::builders;
    use secrecy::ExposeSecret;
    let env = crate::common::TestEnv::with(|f| {
        f.merge(figment::providers::Serialized::default("amqp.shards", 6))
    })
    .await;
    let mut db = env.db().await;
    builders::activity(&mut db, 94, 1, 200_000, 64).await;
    let url = env.settings.amqp.url.expose_secret().to_owned();
    let switch = crate::common::Switch::start(crate::common::target_of(&url, 5672)).await;
    let mut instances = Vec::new();
    for _ in 0..2 {
        instances.push(serve_on_shards(&env, 6).await);
    }
    let through = switch.url_through(&url);
    instances.push(serve_on_shards_via(&env, 6, Some(&through)).await);
    let cut_admin = instances[2].1.clone();

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (names, amqp) = (env.names.clone(), env.amqp().await);
    let publisher = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut user = 0i64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let batch: Vec<_> = (0..30)
                    .map(|_| {
                        user += 1;
                        builders::order(94, 1, user, (user % 64) as i16)
                    })
                    .collect();
                builders::publish_to(&names, 6, &amqp, &batch).await;
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            user
        })
    };
    let client = awc::Client::default();
    let admins: Vec<String> = instances.iter().map(|(_, a)| a.clone()).collect();
    let two_each = |all: &[Vec<u64>]| all.iter().all(|a| a.len() == 2);
    let spread = wait_shards(
        &client,
        &admins,
        std::time::Duration::from_secs(30),
        two_each,
    )
    .await;
    assert!(spread.is_some(), "no even spread within 30 s");
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
    let taken = wait_shards(
        &client,
        &survivors,
        std::time::Duration::from_secs(20),
        all_six,
    )
    .await;
    // Longer than the instance's own heartbeat timeout and a reconnect attempt.
    let cut_for = std::time::Duration::from_secs(20);
    if let Some((t, _)) = &taken {
        tokio::time::sleep(cut_for.saturating_sub(*t)).await;
    }
    // Its admin listener is not cut: what it did while cut off.
    let at_heal = counts().await;
    switch.set(true);
    let back = wait_shards(
        &client,
        &admins,
        std::time::Duration::from_secs(30),
        two_each,
    )
    .await;

    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let messages = publisher.await.unwrap();
    let settled = crate::common::wait_until(std::time::Duration::from_secs(90), || async {
        crate::common::count(&db, "SELECT count(*) FROM consumer_inbox").await >= messages
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
        took <= std::time::Duration::from_secs(15),
        "the cut instance's shards were taken after {took:?} ({shards:?})\n{texts}"
    );
    assert!(
        back.is_some(),
        "the healed instance did not get its share within 30 s\n{texts}"
    );
    assert!(settled, "not every message settled");
    assert_eq!(
        crate::common::count(&db, "SELECT count(*) FROM consumer_inbox").await,
        messages
    );
    assert_eq!(
        crate::common::count(&db, "SELECT count(*) FROM orders").await,
        messages
    );
    crate::common::assert_invariants(&db).await;
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

/// `maintain` refuses a live sale without --force and names the activity; after
/// the sale it vacuums the tables a sale writes and reports their dead rows before
/// and after (issue 35 pt 5).
#[tokio::test]
async fn maintain_vacuums_the_hot_tables_after_the_sale_and_reports_dead_rows() {
    let env = crate::common::TestEnv::new().await;
    let mut db = env.db().await;
    crate::common::builders::activity(&mut db, 34, 1, 5, 1).await;
    // Dead rows, as a sale leaves them on the inventory row; autovacuum (eager on
    // this table) must not take them first.
    db.batch_execute("ALTER TABLE sku_inventory SET (autovacuum_enabled = false)")
        .await
        .unwrap();
    for _ in 0..500 {
        db.execute(
            "UPDATE sku_inventory SET version = version + 1 WHERE activity_id = 34",
            &[],
        )
        .await
        .unwrap();
    }
    let live = run(env_of(&mut engine(), &env).args(["maintain", "--activity", "34"]));
    assert!(!live.ok, "{}", live.text);
    assert!(live.text.contains("is live"), "{}", live.text);
    let unknown = run(env_of(&mut engine(), &env).args(["maintain", "--activity", "999"]));
    assert!(
        !unknown.ok && unknown.text.contains("no activity 999"),
        "{}",
        unknown.text
    );

    seckill_engine::store::activity::close_activity(&db, 34)
        .await
        .unwrap();
    // The statistics of the updates above reach the shared counters by the time the
    // command reads them; wait for them rather than assume.
    assert!(
        crate::common::wait_until(std::time::Duration::from_secs(10), || async {
            db.batch_execute("SELECT pg_stat_clear_snapshot()")
                .await
                .unwrap();
            crate::common::count(
                &db,
                "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'sku_inventory'",
            )
            .await
                > 0
        })
        .await
    );
    let out = run(env_of(&mut engine(), &env).args(["maintain", "--activity", "34"]));
    assert!(out.ok, "{}", out.text);
    let line = out
        .text
        .lines()
        .find(|l| l.starts_with("sku_inventory"))
        .unwrap_or_else(|| panic!("{}", out.text));
    let numbers: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .map(|n| n.parse().unwrap())
        .collect();
    assert!(numbers[0] > 0.0, "dead rows before: {line}");
    assert_eq!(numbers[1], 0.0, "dead rows after: {line}");
    for table in [
        "orders",
        "consumer_inbox",
        "event_outbox",
        "inventory_reservation",
    ] {
        assert!(out.text.contains(table), "{table}: {}", out.text);
    }
    let analyzed = crate::common::count(
        &db,
        "SELECT count(*) FROM pg_stat_user_tables
         WHERE relname = 'sku_inventory' AND last_analyze IS NOT NULL AND last_vacuum IS NOT NULL",
    )
    .await;
    assert_eq!(analyzed, 1, "vacuumed and analyzed");
    env.cleanup().await;
}
