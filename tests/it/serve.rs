//! `serve`: readiness, liveness and metrics, the logs, and stopping on a signal (a
//! drain, a second signal).

use std::time::{Duration, Instant};

use crate::common::builders;
use crate::common::engine::EngineHandle;
use crate::common::process::{engine, env_of, without_colours, Serve};
use crate::common::{
    assert_invariants, count, free_port, settle, wait_for, wait_until, Sale, TestEnv, HANG,
};

/// Following one activity's orders (issue 35 pt 1): the activities of
/// `telemetry.trace_activities`, and one added by `POST /admin/trace`, get an INFO
/// line per order transaction with the §12.1 fields, at the default level; another
/// activity's orders log nothing at INFO.
#[actix_rt::test]
async fn traced_activities_log_each_order_at_info_and_others_do_not() {
    let env = TestEnv::new().await;
    let mut db = env.db().await;
    for activity in [82, 83, 84] {
        builders::activity(&mut db, activity, 1, 10, 1).await;
    }
    let admin = format!("127.0.0.1:{}", free_port());
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
                .map(|u| builders::order(activity, 1, u, 0))
                .collect()
        };
        let settled = |n: i64| {
            let db = &db;
            async move {
                wait_until(HANG, || async {
                    count(db, "SELECT count(*) FROM consumer_inbox").await == n
                })
                .await
            }
        };
        builders::publish(&env, &amqp, &batch(82)).await;
        builders::publish(&env, &amqp, &batch(83)).await;
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
        builders::publish(&env, &amqp, &batch(84)).await;
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
    let env = TestEnv::new().await;
    let (serve, ready) = Serve::start(env_of(&mut engine(), &env), "engine ready").await;
    let (status, text) = serve.terminate().await;
    assert!(ready, "the engine never logged readiness:\n{text}");
    assert!(status.success(), "serve exited with {status}:\n{text}");
    assert!(text.contains("engine stopped"), "{text}");
    env.cleanup().await;
}

#[actix_rt::test]
async fn serve_exposes_liveness_readiness_and_metrics_that_count_outcomes() {
    let (env, db) = Sale::new().activity(81, 10, 1).open().await;
    let admin = format!("127.0.0.1:{}", free_port());
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
        let msgs: Vec<_> = (1..=20).map(|u| builders::order(81, 1, u, 0)).collect();
        builders::publish(&env, &amqp, &msgs).await;
        let settled = wait_until(HANG, || async {
            count(&db, "SELECT count(*) FROM consumer_inbox").await == 20
        })
        .await;
        assert!(settled);
        // A COMMIT is visible in PostgreSQL before the engine has read its answer and
        // counted the outcome, so the inbox rows alone do not mean the counters are in.
        let counted = wait_until(HANG, || async {
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
        let sampled = wait_until(HANG, || async {
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
    let (env, db) = Sale::new().activity(82, 3_000, 4).open().await;
    let grace_ms = 20_000;
    let mut cmd = engine();
    env_of(&mut cmd, &env).env("SECKILL__SHUTDOWN__GRACE_MS", grace_ms.to_string());
    let (serve, ready) = Serve::start(&mut cmd, "engine ready").await;
    assert!(ready, "serve never became ready");

    let amqp = env.amqp().await;
    let msgs: Vec<_> = (0..5_000)
        .map(|u| builders::order(82, 1, u + 1, (u % 4) as i16))
        .collect();
    builders::publish(&env, &amqp, &msgs).await;
    let started = wait_until(HANG, || async {
        count(&db, "SELECT count(*) FROM consumer_inbox").await >= 500
    })
    .await;
    assert!(started);
    let signalled_at = Instant::now();
    let (status, text) = serve.terminate().await;
    let took = signalled_at.elapsed();
    assert!(status.success(), "serve exited with {status}:\n{text}");
    assert!(took < Duration::from_millis(grace_ms), "exit took {took:?}");
    assert!(text.contains("every delivery settled"), "{text}");
    let at_stop = count(&db, "SELECT count(*) FROM consumer_inbox").await;
    assert!(at_stop < 5_000, "the signal came too late to test a drain");

    let engine = EngineHandle::start(&env.settings).await;
    let done = wait_until(settle(), || async {
        count(&db, "SELECT count(*) FROM consumer_inbox").await >= 5_000
    })
    .await;
    engine.stop().await;
    assert!(done);
    assert_eq!(
        count(&db, "SELECT count(DISTINCT message_id) FROM consumer_inbox").await,
        5_000
    );
    assert_eq!(count(&db, "SELECT count(*) FROM orders").await, 3_000);
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM inventory_reservation WHERE status = 20"
        )
        .await,
        2_000
    );
    assert_invariants(&db).await;
    env.cleanup().await;
}

#[actix_rt::test]
async fn a_second_signal_exits_at_once_and_a_restart_loses_nothing() {
    let (env, db) = Sale::new().activity(83, 100, 1).open().await;
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
    let msgs: Vec<_> = (1..=10).map(|u| builders::order(83, 1, u, 0)).collect();
    builders::publish(&env, &amqp, &msgs).await;
    wait_for(HANG, "a transaction waiting on the held row", || async {
        count(
            &db,
            "SELECT count(*) FROM pg_stat_activity \
             WHERE wait_event_type = 'Lock' AND datname = current_database()",
        )
        .await
            >= 1
    })
    .await;
    serve.signal();
    // The second signal counts once the first has been taken (and logged).
    assert!(
        serve.wait_for_line("signal received, stopping", HANG).await,
        "the first signal was never taken"
    );
    let second = Instant::now();
    serve.signal();
    let (status, text) = serve.wait().await;
    assert!(
        second.elapsed() < Duration::from_secs(5),
        "the second signal did not end it at once ({:?})",
        second.elapsed()
    );
    assert_eq!(status.code(), Some(130), "{text}");
    assert!(text.contains("second signal"), "{text}");
    lock.rollback().await.unwrap();

    let engine = EngineHandle::start(&env.settings).await;
    let done = wait_until(HANG, || async {
        count(&db, "SELECT count(*) FROM consumer_inbox").await >= 10
    })
    .await;
    engine.stop().await;
    assert!(done, "the unsettled deliveries came back");
    assert_eq!(count(&db, "SELECT count(*) FROM orders").await, 10);
    assert_invariants(&db).await;
    env.cleanup().await;
}
