//! The command line: migrate is idempotent, validate names the failing key and its
//! source, the engine refuses an unmigrated schema.

use std::process::Command;

use seckill_engine::store;
use secrecy::ExposeSecret;

use crate::common::{base_settings, with_dbname};

fn engine() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_seckill-engine"));
    cmd.env("RUST_LOG", "warn");
    cmd
}

struct Output {
    ok: bool,
    text: String,
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("run seckill-engine");
    Output {
        ok: out.status.success(),
        text: format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

async fn drop_database(name: &str) {
    let mut admin = store::admin_pg_config(&base_settings().database).unwrap();
    admin.dbname("postgres");
    let client = store::connect(&admin).await.unwrap();
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
        4,
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
    let mut admin = store::admin_pg_config(&base_settings().database).unwrap();
    admin.dbname("postgres");
    let client = store::connect(&admin).await.unwrap();
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
