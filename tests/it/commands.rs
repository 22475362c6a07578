//! The one-shot commands: migrate is idempotent, validate names the failing key and
//! its source, the engine refuses an unmigrated schema; activity, check, diagnose,
//! reshard and maintain; no secret in any output.

use std::process::Command;

use seckill_engine::store;
use secrecy::ExposeSecret;

use crate::common::process::{engine, env_of, run, Serve};
use crate::common::{admin_config, base_settings, wait_until, with_dbname, Sale, HANG};

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
    // config, postgres, durability, owner, rabbitmq, redis, frontstage, and what
    // each of the three links runs over.
    assert_eq!(
        valid.text.lines().filter(|l| l.starts_with("ok")).count(),
        10,
        "{}",
        valid.text
    );
    for link in ["postgres tls", "rabbitmq tls", "redis tls"] {
        assert!(
            valid
                .text
                .lines()
                .any(|l| l.starts_with(&format!("ok   {link}")) && l.contains("plaintext (")),
            "{link}: {}",
            valid.text
        );
    }

    // A database whose default would lose acknowledged commits: said by name, with
    // the engine's override, and not a failure (the engine is safe on it).
    let admin = seckill_engine::store::connect(&crate::common::admin_config())
        .await
        .unwrap();
    admin
        .batch_execute(&format!(
            "ALTER DATABASE {name} SET synchronous_commit = off"
        ))
        .await
        .unwrap();
    let off = run(engine().env("SECKILL__DATABASE__URL", &url).arg("validate"));
    assert!(off.ok, "{}", off.text);
    let line = off
        .text
        .lines()
        .find(|l| l.contains("durability"))
        .unwrap_or_else(|| panic!("no durability line: {}", off.text));
    assert!(line.contains("synchronous_commit = off"), "{line}");
    assert!(line.contains("the engine commits with on"), "{line}");
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

/// Issue 50: `--version` names the build's commit (git's HEAD here); a role that is
/// not one is refused naming the roles there are, and so is an empty `server.roles`.
#[test]
fn version_names_the_commit_and_roles_are_checked() {
    let out = run(engine().arg("--version"));
    assert!(out.ok, "{}", out.text);
    let head = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .unwrap();
    let head = String::from_utf8_lossy(&head.stdout).trim().to_owned();
    assert!(!head.is_empty());
    assert!(
        out.text.contains(&format!("(commit {head})"))
            && out.text.contains(env!("CARGO_PKG_VERSION")),
        "{} (HEAD {head})",
        out.text
    );

    let out = run(engine().args(["serve", "--role", "frontend"]));
    assert!(!out.ok);
    assert!(
        out.text.contains("one of all, front, engine, admin"),
        "{}",
        out.text
    );
    let out = run(engine().env("SECKILL__SERVER__ROLES", "[]").arg("validate"));
    assert!(!out.ok);
    assert!(out.text.contains("server.roles"), "{}", out.text);
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
    let (env, db) = Sale::new().activity(32, 5, 1).open().await;
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
    let (env, db) = Sale::new().activity(33, 5, 1).open().await;
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
        wait_until(HANG, || async {
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
        &scripts::ReserveCall {
            user_id: 5,
            request_id: uuid::Uuid::now_v7(),
            reservation_id: id,
            order_id: 1,
            order_no: "S1",
            expires_at_ms: expiry,
            request_ttl_secs: 60,
            sale_end_ms: crate::common::sale_end().timestamp_millis(),
        },
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

    // `redis rebuild` repairs it from PostgreSQL, keeping the unit of the
    // reservation still on its way; a second run changes nothing.
    let rebuild =
        || run(env_of(&mut engine(), &env).args(["redis", "rebuild", "--activity", "71"]));
    let check = || run(env_of(&mut engine(), &env).args(["check", "--redis", "--activity", "71"]));
    let out = rebuild();
    assert!(out.ok, "{}", out.text);
    assert!(out.text.contains("1 held by reservations"), "{}", out.text);
    assert!(check().ok, "{}", check().text);
    let again = rebuild();
    assert!(again.text.contains("nothing changed"), "{}", again.text);

    // Every key gone (a Redis restart without persistence): the stock comes back,
    // all of it sellable (the pending set is gone with the rest).
    let pattern = format!("{}:*", env.settings.redis.key_prefix);
    assert!(crate::common::redis_delete_matching(&mut redis, &pattern).await > 0);
    let out = rebuild();
    assert!(out.ok, "{}", out.text);
    assert_eq!(
        out.text.matches("stock missing -> 4").count(),
        2,
        "{}",
        out.text
    );
    assert!(check().ok, "{}", check().text);
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
            // whatever it logs at start, then stop it. The moment is deliberate (a
            // running serve has no last line to wait for); the others exit sooner,
            // which the loop polls for.
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

/// `maintain` refuses a live sale without --force and names the activity; after
/// the sale it vacuums the tables a sale writes and reports their dead rows before
/// and after (issue 35 pt 5).
#[tokio::test]
async fn maintain_vacuums_the_hot_tables_after_the_sale_and_reports_dead_rows() {
    let (env, db) = Sale::new().activity(34, 5, 1).open().await;
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
        wait_until(HANG, || async {
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
