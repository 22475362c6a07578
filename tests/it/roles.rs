//! One role per job (docs/OPERATIONS.md, "Roles"): the roles of
//! `scripts/lib/roles.sql` on the suite's PostgreSQL server, a test database owned
//! and migrated by `seckill_owner`, and the engine (in-process and `serve`) running
//! as `seckill_engine`, which can read and write its tables and change nothing else.

use figment::providers::Serialized;
use secrecy::ExposeSecret;
use tokio_postgres::error::SqlState;

use crate::cli::{engine, env_of, Serve};
use crate::common::{admin_config, base_settings, TestEnv};

/// The suite's server URL as `user`.
fn url_as(user: &str) -> String {
    let admin = admin_config();
    let host = match admin.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        _ => "127.0.0.1".to_owned(),
    };
    let port = admin.get_ports().first().copied().unwrap_or(5432);
    format!("postgres://{user}@{host}:{port}/seckill?sslmode=disable")
}

/// A test world whose database `seckill_owner` owns and migrated, and whose engine
/// connects as `seckill_engine`.
async fn roles_env() -> TestEnv {
    let admin = seckill_engine::store::connect(&admin_config())
        .await
        .unwrap();
    admin
        .batch_execute(include_str!("../../scripts/lib/roles.sql"))
        .await
        .expect("scripts/lib/roles.sql");
    let superuser = base_settings().database.url.expose_secret().to_owned();
    TestEnv::on_servers(
        |f| f.merge(Serialized::default("database.url", superuser)),
        |f| {
            f.merge(Serialized::default(
                "database.url",
                url_as("seckill_engine"),
            ))
            .merge(Serialized::default(
                "database.owner_url",
                url_as("seckill_owner"),
            ))
        },
    )
    .await
}

#[actix_rt::test]
async fn serve_runs_as_the_runtime_role_which_cannot_change_the_schema() {
    let env = roles_env().await;
    let db = env.db().await;
    let row = db
        .query_one(
            "SELECT current_user::text, pg_has_role('pg_monitor', 'member')",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "seckill_engine");
    assert!(row.get::<_, bool>(1), "the runtime role lacks pg_monitor");
    for ddl in [
        "CREATE TABLE seckill.intruder (i int)",
        "CREATE TABLE public.intruder (i int)",
        "CREATE SCHEMA intruder",
        "ALTER TABLE seckill.orders ADD COLUMN intruder int",
        "DROP TABLE seckill.consumer_inbox",
        "TRUNCATE seckill.orders",
    ] {
        let e = db.batch_execute(ddl).await.expect_err(ddl);
        assert_eq!(
            e.code(),
            Some(&SqlState::INSUFFICIENT_PRIVILEGE),
            "{ddl}: {e}"
        );
    }

    // History reads: a member of seckill_readonly reads, and writes nothing.
    let mut history = seckill_engine::store::PgTarget::from_url(&crate::common::with_dbname(
        &url_as("seckill_history"),
        &env.db_name,
    ))
    .unwrap();
    history.options("-c search_path=seckill,public");
    let history = seckill_engine::store::connect(&history).await.unwrap();
    history
        .query_one("SELECT count(*) FROM orders", &[])
        .await
        .unwrap();
    let e = history
        .batch_execute("DELETE FROM orders")
        .await
        .expect_err("the read-only role deleted");
    assert_eq!(e.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE), "{e}");

    // `serve` as the runtime role: ready, and no permission error on the way.
    let (serve, ready) = Serve::start(env_of(&mut engine(), &env), "engine ready").await;
    let (status, text) = serve.terminate().await;
    assert!(ready, "serve never got ready as the runtime role:\n{text}");
    assert!(status.success(), "{text}");
    assert!(!text.contains("permission denied"), "{text}");

    crate::pipeline::one_unit_among_a_thousand_buyers(env).await;
}
