//! Transport security (docs/DESIGN.md, "Transport security"): the engine against the
//! TLS profile of `scripts/services up --tls` (PostgreSQL, RabbitMQ and Redis with
//! TLS listeners only and a throwaway CA, on free ports under a directory of the
//! test's own). What each test proves: the pipeline and the front stage work with
//! `sslmode=verify-full`, `amqps://` and `rediss://`, the servers see every
//! connection encrypted, a server whose certificate the configured CA did not sign
//! is refused at start with the service named, and a TLS URL never falls back to
//! plaintext.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use figment::providers::Serialized;
use figment::Figment;
use seckill_engine::config::Settings;
use seckill_engine::store;
use secrecy::ExposeSecret;

use crate::common::engine::EngineHandle;
use crate::common::{free_port, TestEnv};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The TLS profile of the test's own, stopped and removed when dropped.
struct TlsProfile {
    dir: PathBuf,
    /// PostgreSQL, AMQPS, Redis.
    ports: [u16; 3],
}

impl TlsProfile {
    async fn start() -> TlsProfile {
        let dir =
            std::env::temp_dir().join(format!("seckill-tls-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("profile dir");
        // The PostgreSQL server runs as `postgres` when the tests run as root.
        let _ = Command::new("chmod").arg("755").arg(&dir).status();
        let profile = TlsProfile {
            dir,
            ports: [free_port(), free_port(), free_port()],
        };
        let out = profile.script(&["up", "--tls"]).await;
        assert!(out.contains("engine settings in"), "{out}");
        profile
    }

    async fn script(&self, args: &[&str]) -> String {
        let env = [
            ("SECKILL_SERVICES_DIR", self.dir.display().to_string()),
            (
                "SECKILL_TLS_PORTS",
                self.ports.map(|p| p.to_string()).join(" "),
            ),
        ];
        crate::common::project_script("scripts/services", args, &env).await
    }

    fn pki(&self, file: &str) -> PathBuf {
        self.dir.join("tls/pki").join(file)
    }

    /// The profile's URLs and files, every link verified against `ca`.
    fn settings(&self, figment: Figment, ca: &Path) -> Figment {
        let [pg, amqps, redis] = self.ports;
        figment
            .merge(Serialized::default(
                "database.url",
                format!("postgres://postgres@127.0.0.1:{pg}/seckill?sslmode=verify-full"),
            ))
            .merge(Serialized::default("database.tls.ca_file", ca))
            .merge(Serialized::default(
                "amqp.url",
                format!("amqps://guest:guest@127.0.0.1:{amqps}/%2f"),
            ))
            .merge(Serialized::default("amqp.tls.ca_file", ca))
            .merge(Serialized::default(
                "redis.url",
                format!("rediss://127.0.0.1:{redis}"),
            ))
            .merge(Serialized::default("redis.tls.ca_file", ca))
            .merge(Serialized::default(
                "redis.tls.cert_file",
                self.pki("client.crt"),
            ))
            .merge(Serialized::default(
                "redis.tls.key_file",
                self.pki("client.key"),
            ))
    }

    /// A test world on the profile's servers.
    async fn env(&self) -> TestEnv {
        let ca = self.pki("ca.crt");
        TestEnv::on_servers(|f| self.settings(f, &ca), |f| f).await
    }
}

impl Drop for TlsProfile {
    fn drop(&mut self) {
        let _ = Command::new(repo().join("scripts/services"))
            .arg("down")
            .env("SECKILL_SERVICES_DIR", &self.dir)
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[actix_rt::test]
async fn the_pipeline_and_the_front_stage_run_over_tls_only_links() {
    let profile = TlsProfile::start().await;
    crate::pipeline::one_unit_among_a_thousand_buyers(profile.env().await).await;
    crate::frontstage::front_stage_reports_every_state(profile.env().await).await;

    // While an engine and a front stage run: what the servers say of their
    // connections.
    let env = profile.env().await;
    let engine = EngineHandle::start(&env.settings).await;
    let front = seckill_engine::http::front::start(
        &env.settings,
        engine.pool.clone(),
        engine.ids.clone(),
        engine.readiness.clone(),
    )
    .await
    .expect("front stage over TLS");
    let server = front.server.handle();
    actix_rt::spawn(front.server);

    let db = env.db().await;
    let rows = db
        .query(
            "SELECT a.application_name, s.ssl, coalesce(s.version, '') \
             FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
             WHERE a.datname = current_database() AND a.backend_type = 'client backend'",
            &[],
        )
        .await
        .unwrap();
    let engine_rows: Vec<_> = rows
        .iter()
        .filter(|r| r.get::<_, String>(0).starts_with("seckill-engine"))
        .collect();
    assert!(!engine_rows.is_empty(), "no engine connection seen");
    for row in &rows {
        let (app, ssl, version): (String, bool, String) = (row.get(0), row.get(1), row.get(2));
        assert!(
            ssl && version.starts_with("TLSv1."),
            "{app}: ssl={ssl} {version}"
        );
    }

    let listed = profile
        .script(&[
            "tls-rabbitmqctl",
            "list_connections",
            "-q",
            "--no-table-headers",
            "ssl",
            "ssl_protocol",
            "client_properties",
        ])
        .await;
    let ours: Vec<&str> = listed.lines().filter(|l| l.contains("seckill-")).collect();
    assert!(
        ours.iter().any(|l| l.contains("seckill-frontstage"))
            && ours.iter().any(|l| l.contains("seckill-intake:")),
        "engine and front-stage connections not listed:\n{listed}"
    );
    for line in &ours {
        assert!(line.starts_with("true\ttlsv1."), "{line}");
    }

    // The TLS Redis has no plaintext port: that the front stage's connection and
    // this one answer is the proof; CLIENT INFO shows the TLS port it came in on.
    let mut redis = env.redis().await;
    let info: String = ::redis::cmd("CLIENT")
        .arg("INFO")
        .query_async(&mut redis)
        .await
        .unwrap();
    assert!(
        info.contains(&format!("laddr=127.0.0.1:{}", profile.ports[2])),
        "{info}"
    );
    let clients: String = ::redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut redis)
        .await
        .unwrap();
    assert!(
        clients.lines().count() >= 2,
        "only this client connected:\n{clients}"
    );

    server.stop(true).await;
    engine.stop().await;
    env.cleanup().await;
}

/// Runs `serve` with `env` set and returns its output once it exited, which it must
/// (within `HANG`: a refused link ends it at once, a loaded machine only delays that).
async fn serve_exits(env: Vec<(String, String)>) -> (bool, String) {
    let mut cmd = crate::common::process::engine();
    cmd.arg("serve")
        .env("SECKILL__HTTP__ADDR", "127.0.0.1:0")
        .env("SECKILL__ADMIN__ADDR", "127.0.0.1:0")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd.spawn().expect("spawn serve");
    let pid = child.id();
    let waited = tokio::time::timeout(
        crate::common::HANG,
        tokio::task::spawn_blocking(move || child.wait_with_output()),
    )
    .await;
    let Ok(out) = waited else {
        crate::common::process::signal(pid, "-KILL");
        panic!("serve still running {:?} after start", crate::common::HANG);
    };
    let out = out.expect("join").expect("serve output");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[actix_rt::test]
async fn a_server_certificate_another_ca_signed_is_refused_at_start_naming_the_service() {
    let profile = TlsProfile::start().await;
    let env = profile.env().await;
    let s = &env.settings;
    let (other, right) = (profile.pki("other-ca.crt"), profile.pki("ca.crt"));
    let [pg, amqps, redis] = profile.ports;
    let base = |ca: [&Path; 3]| -> Vec<(String, String)> {
        [
            (
                "SECKILL__DATABASE__URL",
                format!(
                    "postgres://postgres@127.0.0.1:{pg}/{}?sslmode=verify-full",
                    env.db_name
                ),
            ),
            (
                "SECKILL__DATABASE__TLS__CA_FILE",
                ca[0].display().to_string(),
            ),
            (
                "SECKILL__AMQP__URL",
                format!("amqps://guest:guest@127.0.0.1:{amqps}/%2f"),
            ),
            ("SECKILL__AMQP__TLS__CA_FILE", ca[1].display().to_string()),
            ("SECKILL__REDIS__URL", format!("rediss://127.0.0.1:{redis}")),
            ("SECKILL__REDIS__TLS__CA_FILE", ca[2].display().to_string()),
            (
                "SECKILL__REDIS__TLS__CERT_FILE",
                profile.pki("client.crt").display().to_string(),
            ),
            (
                "SECKILL__REDIS__TLS__KEY_FILE",
                profile.pki("client.key").display().to_string(),
            ),
            ("SECKILL__AMQP__NAMESPACE", s.amqp.namespace.clone()),
            ("SECKILL__REDIS__KEY_PREFIX", s.redis.key_prefix.clone()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    };
    for (i, service) in ["PostgreSQL", "RabbitMQ", "Redis"].into_iter().enumerate() {
        let mut cas = [right.as_path(); 3];
        cas[i] = other.as_path();
        let started = Instant::now();
        let (ok, out) = serve_exits(base(cas)).await;
        eprintln!(
            "{service} with the wrong CA ({:?}):\n{out}",
            started.elapsed()
        );
        assert!(!ok, "serve started with the wrong CA for {service}:\n{out}");
        assert!(
            out.contains(service),
            "the error does not name {service}:\n{out}"
        );
        assert!(
            out.contains("UnknownIssuer")
                || out.contains("unknown issuer")
                || out.contains("certificate"),
            "the error does not say the certificate was refused:\n{out}"
        );
    }
    env.cleanup().await;
}

/// A plaintext server answering PostgreSQL's SSLRequest with 'N', as a server with
/// `ssl = off` does, then waiting for a startup message that must never come.
async fn server_without_tls() -> (u16, tokio::task::JoinHandle<bool>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut request = [0u8; 8];
        socket.read_exact(&mut request).await.unwrap();
        // Length 8, code 80877103: SSLRequest.
        assert_eq!(request, [0, 0, 0, 8, 4, 210, 22, 47]);
        socket.write_all(b"N").await.unwrap();
        // Anything more would be a plaintext startup message.
        let mut more = [0u8; 1];
        matches!(
            tokio::time::timeout(Duration::from_secs(2), socket.read(&mut more)).await,
            Ok(Ok(0)) | Ok(Err(_))
        )
    });
    (port, task)
}

#[actix_rt::test]
async fn a_tls_url_never_connects_in_plaintext() {
    let base = crate::common::base_settings();

    // sslmode=require against a server without TLS: refused, nothing sent after.
    let (port, server) = server_without_tls().await;
    let target = store::PgTarget::from_url(&format!(
        "postgres://postgres@127.0.0.1:{port}/seckill?sslmode=require"
    ))
    .unwrap();
    let e = store::connect(&target)
        .await
        .expect_err("connected in plaintext");
    assert!(e.to_string().contains("TLS"), "{e}");
    assert!(server.await.unwrap(), "the client went on in plaintext");

    // amqps:// against the plaintext AMQP port.
    let mut amqp = base.amqp.clone();
    let plain = seckill_engine::mq::connect(&amqp, "seckill-test").await;
    assert!(plain.is_ok(), "the plaintext broker is not up");
    let url = amqp.url.expose_secret().replacen("amqp://", "amqps://", 1);
    amqp.url = url.into();
    let e = seckill_engine::mq::connect(&amqp, "seckill-test")
        .await
        .expect_err("amqps:// connected to a plaintext port");
    assert!(
        e.to_string()
            .contains("TLS with the broker failed (amqp.url is amqps://)"),
        "{e}"
    );

    // rediss:// against the plaintext Redis port.
    let mut redis = base.redis.clone();
    let url = redis
        .url
        .expose_secret()
        .replacen("redis://", "rediss://", 1);
    redis.url = url.into();
    let e = seckill_engine::redis::connect(&redis)
        .await
        .expect_err("rediss:// connected to a plaintext port");
    assert!(
        e.to_string()
            .contains("no TLS session with the server (redis.url is rediss://)"),
        "{e}"
    );

    // A verify mode without a CA, and TLS files without a TLS URL, are
    // configuration errors naming the key.
    let refused = |figment: Figment, key: &str| {
        let e = Settings::from_figment(&figment).expect_err("accepted");
        assert!(e.to_string().contains(&format!("`{key}`")), "{e}");
    };
    refused(
        seckill_engine::config::figment(None).merge(Serialized::default(
            "database.url",
            "postgres://postgres@127.0.0.1:5432/seckill?sslmode=verify-full",
        )),
        "database.tls.ca_file",
    );
    refused(
        seckill_engine::config::figment(None)
            .merge(Serialized::default("amqp.tls.ca_file", "/nonexistent.crt")),
        "amqp.tls",
    );
    refused(
        seckill_engine::config::figment(None).merge(Serialized::default(
            "redis.url",
            "rediss://127.0.0.1:6379/#insecure",
        )),
        "redis.url",
    );
    refused(
        seckill_engine::config::figment(None)
            .merge(Serialized::default(
                "database.url",
                "postgres://postgres@127.0.0.1:5432/seckill?sslmode=require",
            ))
            .merge(Serialized::default(
                "database.tls.ca_file",
                "/nonexistent.crt",
            )),
        "database.tls.ca_file",
    );
}
