//! `scripts/services up` starts PostgreSQL, RabbitMQ and Redis when the configured
//! URLs do not answer, is idempotent, and `down` stops what it started;
//! `scripts/services psql` reaches the configured server and names its database.

use std::io::Write;
use std::net::TcpListener;
use std::process::{Command, Stdio};

use secrecy::ExposeSecret;

use crate::common::{base_settings, with_dbname};

fn free_port() -> u16 {
    // AMQP's Erlang distribution port defaults to port + 20000; keep both in range.
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if port < 45000 && TcpListener::bind(("127.0.0.1", port + 20000)).is_ok() {
            return port;
        }
    }
}

fn services(dir: &std::path::Path, ports: (u16, u16, u16), action: &str) -> (bool, String) {
    let (pg, amqp, redis) = ports;
    let out = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/services"))
        .arg(action)
        .env("SECKILL_SERVICES_DIR", dir)
        .env(
            "SECKILL__DATABASE__URL",
            format!("postgres://postgres@127.0.0.1:{pg}/seckill"),
        )
        .env(
            "SECKILL__AMQP__URL",
            format!("amqp://guest:guest@127.0.0.1:{amqp}/%2f"),
        )
        .env("SECKILL__REDIS__URL", format!("redis://127.0.0.1:{redis}"))
        .output()
        .expect("run scripts/services");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[tokio::test]
async fn services_up_starts_missing_services_on_the_configured_ports() {
    let dir = std::env::temp_dir().join(format!("seckill-services-{}", uuid::Uuid::new_v4()));
    let ports = (free_port(), free_port(), free_port());

    let (ok, text) = services(&dir, ports, "status");
    assert!(!ok, "nothing should answer yet: {text}");

    let (ok, text) = services(&dir, ports, "up");
    let result = async {
        assert!(ok, "up failed: {text}");
        // Each service now answers on its port, through the real clients.
        let pg = tokio_postgres::connect(
            &format!(
                "host=127.0.0.1 port={} user=postgres dbname=postgres",
                ports.0
            ),
            tokio_postgres::NoTls,
        )
        .await;
        let (client, conn) = pg.expect("PostgreSQL answers");
        tokio::spawn(conn);
        let one: i32 = client.query_one("SELECT 1", &[]).await.unwrap().get(0);
        assert_eq!(one, 1);
        let amqp = lapin::Connection::connect(
            &format!("amqp://guest:guest@127.0.0.1:{}/%2f", ports.1),
            lapin::ConnectionProperties::default(),
        )
        .await
        .expect("RabbitMQ answers");
        amqp.close(200, "ok".into()).await.unwrap();
        let mut redis = ::redis::Client::open(format!("redis://127.0.0.1:{}", ports.2))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .expect("Redis answers");
        let pong: String = ::redis::cmd("PING").query_async(&mut redis).await.unwrap();
        assert_eq!(pong, "PONG");

        let (ok, text) = services(&dir, ports, "up");
        assert!(ok, "second up failed: {text}");
        assert_eq!(
            text.matches("using it").count(),
            3,
            "second up must reuse all three: {text}"
        );
        let (ok, text) = services(&dir, ports, "status");
        assert!(ok, "{text}");
    };
    // Always stop what was started, even when an assertion failed.
    let outcome = futures_util::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(result)).await;
    let (down_ok, down_text) = services(&dir, ports, "down");
    let (status_ok, status_text) = services(&dir, ports, "status");
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
    assert!(down_ok, "{down_text}");
    assert!(!status_ok, "everything should be down again: {status_text}");
}

/// The bench scripts drop and recreate the engine's database through
/// `scripts/services psql`: it must connect to the configured server's maintenance
/// database and hand over the configured database's name, not a fixed one.
#[test]
fn services_psql_connects_to_the_configured_server_and_names_its_database() {
    let url = with_dbname(
        base_settings().database.url.expose_secret(),
        "seckill_named_by_the_url",
    );
    let mut child = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/services"))
        .args(["psql", "-At", "-v", "ON_ERROR_STOP=1"])
        .env("SECKILL__DATABASE__URL", &url)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run scripts/services psql");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"SELECT :'db', current_database();\n")
        .expect("write the query");
    let out = child.wait_with_output().expect("psql finishes");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "seckill_named_by_the_url|postgres\n"
    );
}
