//! The metrics that answer "is the sale healthy?" (seed §12.2), read from a `serve`
//! process's /metrics, as a scraper reads them (the sampled gauges live in the
//! engine's `status::Live`; a process of its own keeps the scrape whole).

use std::time::Duration;

use crate::common::builders::{self, order};
use crate::common::process::{engine, env_of, Serve};
use crate::common::{count, free_port, poll_every, wait_until, TestEnv, HANG};

/// The value of one series of a Prometheus text (`name{labels}` exactly, or a bare
/// name).
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        line.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

async fn scrape(client: &awc::Client, admin: &str) -> String {
    let Ok(mut res) = client.get(format!("http://{admin}/metrics")).send().await else {
        return String::new();
    };
    let body = res.body().await.unwrap_or_default();
    String::from_utf8_lossy(&body).into_owned()
}

/// Scrapes until the text satisfies `ok` (`HANG` at most: the gauges are sampled
/// every few hundred milliseconds, later on a loaded machine); the last text
/// otherwise.
async fn until(
    client: &awc::Client,
    admin: &str,
    ok: impl Fn(&str) -> bool,
) -> Result<String, String> {
    poll_every(HANG, Duration::from_millis(100), || async {
        let text = scrape(client, admin).await;
        if ok(&text) {
            Ok(text)
        } else {
            Err(text)
        }
    })
    .await
    .map(|(_, text)| text)
}

#[actix_rt::test]
async fn per_bucket_stock_locks_tables_drift_and_conservation_are_exported_while_the_sale_is_live()
{
    let env = TestEnv::new().await;
    let mut db = env.db().await;
    builders::activity(&mut db, 96, 1, 10, 2).await;
    let mut redis = env.redis().await;
    let keys = seckill_engine::redis::keys::SkuKeys::new(&env.settings.redis.key_prefix, 96, 1);
    for bucket in [0, 1] {
        let _: () = ::redis::cmd("SET")
            .arg(keys.stock(bucket))
            .arg(5)
            .query_async(&mut redis)
            .await
            .unwrap();
    }
    let admin = format!("127.0.0.1:{}", free_port());
    let mut cmd = engine();
    env_of(&mut cmd, &env)
        .env("SECKILL__ADMIN__ADDR", &admin)
        .env("SECKILL__TELEMETRY__SAMPLE_INTERVAL_MS", "200")
        .env("SECKILL__TELEMETRY__CONSERVATION_INTERVAL_MS", "1000")
        .env("SECKILL__FRONTSTAGE__RECONCILE_INTERVAL_MS", "200")
        // Long enough for the sampler to see an order transaction waiting.
        .env("SECKILL__DATABASE__LOCK_TIMEOUT_MS", "3000")
        .env("SECKILL__DATABASE__STATEMENT_TIMEOUT_MS", "10000");
    let (serve, ready) = Serve::start(&mut cmd, "engine ready").await;
    let client = awc::Client::builder()
        .timeout(Duration::from_secs(10))
        .finish();
    async {
        assert!(ready, "serve did not start");
        let bucket = |name: &str, b: i16| format!("{name}{{activity=\"96\",sku=\"1\",bucket=\"{b}\"}}");
        let drift = "seckill_redis_drift_units{activity=\"96\",sku=\"1\"}";

        // A live sale, untouched: every bucket full, Redis agrees, nothing violated.
        let text = until(&client, &admin, |t| {
            value(t, &bucket("seckill_bucket_available_units", 0)) == Some(5.0)
                && value(t, drift) == Some(0.0)
                && value(t, "seckill_conservation_violations") == Some(0.0)
        })
        .await
        .unwrap_or_else(|t| panic!("the live sale's gauges never showed: {t}"));
        assert_eq!(value(&text, &bucket("seckill_bucket_sold_out", 0)), Some(0.0));
        assert!(value(&text, "seckill_db_wal_bytes").is_some_and(|b| b > 0.0), "{text}");
        assert!(
            value(&text, "seckill_table_dead_tuples{table=\"sku_inventory\"}").is_some(),
            "{text}"
        );

        // Sell bucket 0 out (straight to the queue, as the front stage would after
        // taking the units from Redis).
        let amqp = env.amqp().await;
        let msgs: Vec<_> = (1..=5).map(|u| order(96, 1, u, 0)).collect();
        builders::publish(&env, &amqp, &msgs).await;
        let _: () = ::redis::cmd("SET")
            .arg(keys.stock(0))
            .arg(0)
            .query_async(&mut redis)
            .await
            .unwrap();
        let text = until(&client, &admin, |t| {
            value(t, &bucket("seckill_bucket_sold_out", 0)) == Some(1.0)
                && value(t, &bucket("seckill_bucket_allocated_units", 0)) == Some(5.0)
                && value(t, drift) == Some(0.0)
        })
        .await
        .unwrap_or_else(|t| panic!("bucket 0 never showed sold out: {t}"));
        assert_eq!(value(&text, &bucket("seckill_bucket_available_units", 1)), Some(5.0));

        // Redis holds two units PostgreSQL does not know of: drift -2.
        let _: () = ::redis::cmd("INCRBY")
            .arg(keys.stock(1))
            .arg(2)
            .query_async(&mut redis)
            .await
            .unwrap();
        until(&client, &admin, |t| value(t, drift) == Some(-2.0))
            .await
            .unwrap_or_else(|t| panic!("the drift never showed: {t}"));

        // An order transaction waiting on a row the test holds: a lock wait, then
        // (after database.lock_timeout_ms) a lock-timeout abort.
        let mut holder = env.db().await;
        let tx = holder.transaction().await.unwrap();
        tx.batch_execute(
            "SELECT 1 FROM sku_inventory WHERE activity_id = 96 AND bucket_no = 1 FOR UPDATE",
        )
        .await
        .unwrap();
        builders::publish(&env, &amqp, &[order(96, 1, 6, 1)]).await;
        until(&client, &admin, |t| {
            value(t, "seckill_db_lock_waiting_sessions").is_some_and(|n| n >= 1.0)
                && value(t, "seckill_db_lock_wait_max_seconds").is_some_and(|s| s > 0.0)
        })
        .await
        .unwrap_or_else(|t| panic!("the lock wait never showed: {t}"));
        until(&client, &admin, |t| {
            value(t, "seckill_db_lock_timeouts_total").is_some_and(|n| n >= 1.0)
        })
        .await
        .unwrap_or_else(|t| panic!("the lock timeout never counted: {t}"));
        tx.rollback().await.unwrap();
        assert!(
            wait_until(HANG, || async {
                count(&db, "SELECT count(*) FROM orders").await == 6
            })
            .await,
            "the held order was not made after the lock was released"
        );

        // A vacuum shows as the table's last vacuum; a broken invariant as a violation.
        db.batch_execute("VACUUM seckill.sku_inventory").await.unwrap();
        db.batch_execute(
            "UPDATE sku_inventory SET total_stock = total_stock + 1, available_stock = available_stock + 1
             WHERE activity_id = 96 AND bucket_no = 1",
        )
        .await
        .unwrap();
        until(&client, &admin, |t| {
            value(t, "seckill_table_last_vacuum_age_seconds{table=\"sku_inventory\"}").is_some()
                && value(t, "seckill_conservation_violations") == Some(1.0)
        })
        .await
        .unwrap_or_else(|t| panic!("the vacuum or the violation never showed: {t}"));

        // The sale ends: its per-bucket and per-SKU series go.
        seckill_engine::store::activity::close_activity(&db, 96)
            .await
            .unwrap();
        until(&client, &admin, |t| {
            !t.contains("seckill_bucket_available_units{") && !t.contains("seckill_redis_drift_units{")
        })
        .await
        .unwrap_or_else(|t| panic!("the ended sale's series stayed: {t}"));
    }
    .await;
    // On a failed assertion above, dropping `serve` kills the process.
    let (status, text) = serve.terminate().await;
    assert!(status.success(), "{text}");
    env.cleanup().await;
}

/// Each standby's lag, as the primary sees it, one series per standby.
#[actix_rt::test]
async fn each_standby_s_replay_lag_is_exported() {
    let cluster = crate::ha::HaCluster::start(false).await;
    let env = crate::ha::ha_env(&cluster, |f| f).await;
    let db = crate::ha::primary_client(&env).await.expect("primary");
    let standbys: Vec<String> = db
        .query("SELECT application_name FROM pg_stat_replication", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(!standbys.is_empty(), "the cluster streams to no standby");
    let admin = format!("127.0.0.1:{}", free_port());
    let mut cmd = engine();
    env_of(&mut cmd, &env)
        .env("SECKILL__ADMIN__ADDR", &admin)
        .env("SECKILL__TELEMETRY__SAMPLE_INTERVAL_MS", "200");
    let (serve, ready) = Serve::start(&mut cmd, "engine ready").await;
    assert!(ready, "serve did not start");
    let client = awc::Client::builder()
        .timeout(Duration::from_secs(10))
        .finish();
    let text = until(&client, &admin, |t| {
        standbys.iter().all(|name| {
            value(
                t,
                &format!("seckill_standby_replay_lag_seconds{{standby=\"{name}\"}}"),
            )
            .is_some()
                && value(
                    t,
                    &format!("seckill_standby_replay_lag_bytes{{standby=\"{name}\"}}"),
                )
                .is_some()
        })
    })
    .await
    .unwrap_or_else(|t| panic!("standbys {standbys:?} not all exported: {t}"));
    let series = text
        .lines()
        .filter(|l| l.starts_with("seckill_standby_replay_lag_seconds{"))
        .count();
    assert_eq!(series, standbys.len(), "one series per standby: {text}");
    let (status, log) = serve.terminate().await;
    assert!(status.success(), "{log}");
    env.cleanup().await;
}
