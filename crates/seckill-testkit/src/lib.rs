//! The test kit of seckill-engine's suites (the integration tests in `tests/it`, the
//! bench's and the fault harness's tests). Every test gets its own PostgreSQL
//! database (cloned from a migrated template), its own AMQP namespace and its own
//! Redis key prefix, so tests run in parallel against the real services and leave
//! nothing behind. Beside that world: builders of test data (`builders`, `Sale`),
//! engines in-process (`engine`) and as processes (`process`), and waits on
//! conditions with their budgets (`wait`).

pub mod builders;
pub mod contracts;
pub mod engine;
pub mod process;
mod sale;
pub mod wait;

pub use sale::Sale;
pub use wait::{check_during, poll, poll_every, settle, wait_for, wait_until, HANG, POLL_EVERY};

use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::providers::Serialized;
use lapin::options::{ExchangeDeleteOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use seckill_engine::config::{self, Settings};
use seckill_engine::mq::topology::Names;
use seckill_engine::store::{self, migrate};
use secrecy::ExposeSecret;
use tokio::sync::OnceCell;
use tokio_postgres::Client;
use uuid::Uuid;

/// The base settings: config/default.toml plus SECKILL__* from the environment, so the
/// suite follows `scripts/services` to whatever ports are configured.
pub fn base_settings() -> Settings {
    Settings::load(None).expect("test configuration is valid")
}

/// Replaces the database name in a postgres:// URL.
pub fn with_dbname(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, format!("?{q}")),
        None => (url, String::new()),
    };
    let prefix = match base.rsplit_once('/') {
        Some((prefix, _)) if prefix.ends_with('/') => base, // "postgres://host" with no path
        Some((prefix, _)) => prefix,
        None => base,
    };
    format!("{prefix}/{name}{query}")
}

/// One test's private world.
pub struct TestEnv {
    pub settings: Settings,
    pub db_name: String,
    pub names: Names,
    extra_queues: std::sync::Mutex<Vec<String>>,
    cleaned: bool,
    /// Superuser settings on the same servers, which clean up after the test.
    admin: Settings,
}

static TEMPLATE: OnceCell<String> = OnceCell::const_new();

/// Server connection config for the `postgres` maintenance database.
pub fn admin_config() -> store::PgTarget {
    let mut config = store::admin_pg_config(&base_settings().database).expect("database URL");
    config.dbname("postgres");
    config
}

async fn template() -> String {
    TEMPLATE
        .get_or_init(|| async {
            let name = format!("seckill_tpl_{:016x}", migrate::fingerprint());
            let admin = store::connect(&admin_config())
                .await
                .expect("connect to PostgreSQL");
            // Other test processes may be creating the same template right now.
            admin
                .execute("SELECT pg_advisory_lock(727274)", &[])
                .await
                .expect("advisory lock");
            let exists = admin
                .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&name])
                .await
                .expect("query pg_database")
                .is_some();
            if !exists {
                let building = format!("{name}_building");
                let _ = admin
                    .batch_execute(&format!(
                        "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                        migrate::quote_ident(&building)
                    ))
                    .await;
                let mut db = base_settings().database;
                db.url = with_dbname(db.url.expose_secret(), &building).into();
                // One pair of group roles for every template, not one per build.
                migrate::migrate(
                    &store::admin_pg_config(&db).expect("url"),
                    Some("seckill_tests"),
                )
                .await
                .expect("migrate the template");
                // Rename only a complete template; kick out the migration session first.
                admin
                    .execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1",
                        &[&building],
                    )
                    .await
                    .expect("terminate template sessions");
                admin
                    .batch_execute(&format!(
                        "ALTER DATABASE {} RENAME TO {}",
                        migrate::quote_ident(&building),
                        migrate::quote_ident(&name)
                    ))
                    .await
                    .expect("rename template");
            }
            admin
                .execute("SELECT pg_advisory_unlock(727274)", &[])
                .await
                .expect("advisory unlock");
            name
        })
        .await
        .clone()
}

/// The settings every test's world has: its namespace and Redis prefix, quick
/// retries, the token secrets and free ports.
fn common_figment(namespace: &str) -> figment::Figment {
    config::figment(None)
        .merge(Serialized::default("amqp.namespace", namespace))
        .merge(Serialized::default("redis.key_prefix", namespace))
        // Tests want retries to come back quickly.
        .merge(Serialized::default("amqp.retry_delay_ms", 200))
        // The front stage's buyers sign in with tokens signed by this (`token`).
        .merge(Serialized::default(
            "frontstage.auth.hs256_secret",
            TEST_JWT_SECRET,
        ))
        .merge(Serialized::default(
            "frontstage.purchase_token.secret",
            TEST_PURCHASE_SECRET,
        ))
        // Any free port: tests run in parallel.
        .merge(Serialized::default("http.addr", "127.0.0.1:0"))
        .merge(Serialized::default("admin.addr", "127.0.0.1:0"))
}

impl TestEnv {
    /// A fresh, migrated database and unique AMQP and Redis names.
    pub async fn new() -> TestEnv {
        Self::with(|f| f).await
    }

    /// Like `new`, with settings overrides (dotted keys, as in the config file).
    pub async fn with(overrides: impl FnOnce(figment::Figment) -> figment::Figment) -> TestEnv {
        // Logs of the engine under test, into this test's captured output, filtered
        // by RUST_LOG (default: warnings).
        seckill_engine::telemetry::init_for_tests();
        let template = template().await;
        let id = Uuid::new_v4().simple().to_string();
        let db_name = format!("seckill_t_{}", &id[..16]);
        let admin = store::connect(&admin_config()).await.expect("connect");
        // Several tests clone the template at once; PostgreSQL may briefly refuse
        // while another CREATE DATABASE holds it.
        let created = poll(HANG, || {
            let admin = &admin;
            let sql = format!(
                "CREATE DATABASE {} TEMPLATE {}",
                migrate::quote_ident(&db_name),
                migrate::quote_ident(&template)
            );
            async move {
                admin.batch_execute(&sql).await.inspect_err(|e| {
                    tracing::debug!(error = %e, "template busy, retrying");
                })
            }
        })
        .await;
        if let Err(e) = created {
            panic!("create test database: {e}");
        }
        let namespace = format!("t{}", &id[..12]);
        let base = base_settings();
        let figment = common_figment(&namespace).merge(Serialized::default(
            "database.url",
            with_dbname(base.database.url.expose_secret(), &db_name),
        ));
        let figment = overrides(figment);
        let settings = Settings::from_figment(&figment).expect("test settings");
        TestEnv {
            names: Names::new(&namespace),
            admin: settings.clone(),
            settings,
            db_name,
            extra_queues: Default::default(),
            cleaned: false,
        }
    }

    /// A test's private world on other servers than the suite's (the TLS profile)
    /// or as other users (the least-privilege roles). `admin` sets superuser URLs
    /// (and TLS files) of those servers: the database is created there, and they
    /// clean up. `runtime` then sets what the engine runs with; when it sets
    /// `database.owner_url`, that role owns the database and migrates it. The
    /// database name in the URLs is replaced by the test's own.
    pub async fn on_servers(
        admin: impl FnOnce(figment::Figment) -> figment::Figment,
        runtime: impl FnOnce(figment::Figment) -> figment::Figment,
    ) -> TestEnv {
        seckill_engine::telemetry::init_for_tests();
        let id = Uuid::new_v4().simple().to_string();
        let db_name = format!("seckill_t_{}", &id[..16]);
        let namespace = format!("t{}", &id[..12]);
        let renamed = |figment: figment::Figment| {
            let settings = Settings::from_figment(&figment).expect("test settings");
            let mut figment = figment.merge(Serialized::default(
                "database.url",
                with_dbname(settings.database.url.expose_secret(), &db_name),
            ));
            if let Some(owner) = &settings.database.owner_url {
                figment = figment.merge(Serialized::default(
                    "database.owner_url",
                    with_dbname(owner.expose_secret(), &db_name),
                ));
            }
            figment
        };
        let admin_figment = renamed(admin(common_figment(&namespace)));
        let admin_settings = Settings::from_figment(&admin_figment).expect("admin settings");
        let settings =
            Settings::from_figment(&renamed(runtime(admin_figment))).expect("runtime settings");
        let mut server = store::admin_pg_config(&admin_settings.database).expect("url");
        server.dbname("postgres");
        let admin_db = store::connect(&server)
            .await
            .expect("connect to PostgreSQL as its superuser");
        admin_db
            .batch_execute(&format!(
                "CREATE DATABASE {}",
                migrate::quote_ident(&db_name)
            ))
            .await
            .expect("create the test database");
        let owner = store::owner_pg_config(&settings.database).expect("owner url");
        if settings.database.owner_url.is_some() {
            let role = owner.get_user().expect("owner_url names a user");
            admin_db
                .batch_execute(&format!(
                    "ALTER DATABASE {} OWNER TO {}",
                    migrate::quote_ident(&db_name),
                    migrate::quote_ident(role)
                ))
                .await
                .expect("hand the test database to the owner role");
        }
        migrate::migrate(&owner, settings.database.role_prefix.as_deref())
            .await
            .expect("migrate the test database");
        TestEnv {
            // The runtime settings may name another namespace (the roles tests).
            names: Names::new(&settings.amqp.namespace),
            admin: admin_settings,
            settings,
            db_name,
            extra_queues: Default::default(),
            cleaned: false,
        }
    }

    /// A client on the test database (search_path = seckill).
    pub async fn db(&self) -> Client {
        store::connect(&store::pg_config(&self.settings.database).expect("url"))
            .await
            .expect("connect to the test database")
    }

    /// A client on the test database as the servers' superuser: for what a test
    /// does behind the engine's back (rewinding a deadline), which the runtime
    /// role of the least-privilege worlds may not.
    pub async fn admin_db(&self) -> Client {
        store::connect(&store::pg_config(&self.admin.database).expect("url"))
            .await
            .expect("connect to the test database as its superuser")
    }

    /// The engine's pool on the test database, with a single connection: statistics
    /// read afterwards (`sequential_scans`) belong to that one backend.
    pub fn one_connection_pool(&self) -> store::Pool {
        let mut one = self.settings.database.clone();
        one.pool_size = 1;
        store::build_pool(&one).expect("pool")
    }

    pub async fn amqp(&self) -> lapin::Connection {
        seckill_engine::mq::connect(&self.settings.amqp, "seckill-test")
            .await
            .expect("connect to RabbitMQ")
    }

    pub async fn redis(&self) -> ::redis::aio::MultiplexedConnection {
        seckill_engine::redis::connect(&self.settings.redis)
            .await
            .expect("connect to Redis")
    }

    /// Declares a queue owned by this test (deleted at cleanup).
    pub async fn declare_queue(&self, channel: &lapin::Channel, name: &str) {
        channel
            .queue_declare(
                name.into(),
                QueueDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("declare test queue");
        self.extra_queues.lock().unwrap().push(name.to_owned());
    }

    /// Ready messages in a queue (unacked ones are not counted by the broker here).
    pub async fn ready_count(&self, channel: &lapin::Channel, queue: &str) -> u32 {
        seckill_engine::mq::queue_counts(channel, queue)
            .await
            .expect("passive declare")
            .messages
    }

    /// Waits (up to `settle()`) until `queue` holds exactly `n` ready messages.
    pub async fn wait_ready_count(&self, channel: &lapin::Channel, queue: &str, n: u32) -> bool {
        wait_until(settle(), || async {
            self.ready_count(channel, queue).await == n
        })
        .await
    }

    /// Drops the database, the AMQP names and the Redis keys of this test.
    pub async fn cleanup(mut self) {
        self.cleaned = true;
        let queues = self.extra_queues.lock().unwrap().clone();
        cleanup(
            self.db_name.clone(),
            self.names.clone(),
            self.admin.clone(),
            queues,
        )
        .await;
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        if self.cleaned {
            return;
        }
        // A failed test still leaves nothing behind.
        let db = self.db_name.clone();
        let names = self.names.clone();
        let settings = self.admin.clone();
        let queues = self
            .extra_queues
            .lock()
            .map(|q| q.clone())
            .unwrap_or_default();
        let _ = std::thread::spawn(move || {
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                rt.block_on(cleanup(db, names, settings, queues));
            }
        })
        .join();
    }
}

async fn cleanup(db_name: String, names: Names, settings: Settings, queues: Vec<String>) {
    let Ok(mut server) = store::admin_pg_config(&settings.database) else {
        return;
    };
    server.dbname("postgres");
    if let Ok(admin) = store::connect(&server).await {
        let _ = admin
            .batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                migrate::quote_ident(&db_name)
            ))
            .await;
        // A database migrated here (not cloned) got group roles named after it.
        let prefix = seckill_engine::domain::roles::role_prefix_for(&db_name);
        let _ = admin
            .batch_execute(&format!(
                "DROP ROLE IF EXISTS {}, {}",
                migrate::quote_ident(&format!("{prefix}_runtime")),
                migrate::quote_ident(&format!("{prefix}_readonly"))
            ))
            .await;
    }
    if let Ok(conn) = seckill_engine::mq::connect(&settings.amqp, "seckill-test-cleanup").await {
        if let Ok(channel) = conn.create_channel().await {
            // Tests may start engines with more shards than their settings say (the
            // reshard test); deleting a missing queue is harmless.
            for queue in names
                .order_queues(settings.amqp.shards.max(8))
                .into_iter()
                .chain(queues)
            {
                let _ = channel
                    .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                    .await;
            }
            for exchange in names.exchanges() {
                let _ = channel
                    .exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default())
                    .await;
            }
            seckill_engine::mq::close(&conn, &[&channel]).await;
        }
        let _ = conn.close(200, "cleanup".into()).await;
    }
    if let Ok(mut redis) = seckill_engine::redis::connect(&settings.redis).await {
        // SCAN, not KEYS: KEYS holds the shared server for its whole keyspace, and
        // after a few demo sales (millions of keys) every other test's call waited
        // up to a second behind each clean-up and timed out.
        let pattern = format!("{}:*", settings.redis.key_prefix);
        let _ = try_delete_matching(&mut redis, &pattern).await;
    }
}

/// The repository's root directory (this crate lives in `crates/seckill-testkit`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs a project script (`script`, from the repository root, run there) with
/// `env` set; its output, stdout then stderr. The test fails if the script does.
pub async fn project_script(script: &str, args: &[&str], env: &[(&str, String)]) -> String {
    let root = repo_root();
    let mut cmd = std::process::Command::new(root.join(script));
    cmd.args(args).current_dir(&root);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .expect("join")
        .expect("run script");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{script} {args:?} failed:\n{text}");
    text
}

/// The tests' `frontstage.auth.hs256_secret`.
pub const TEST_JWT_SECRET: &str = "a-test-secret-that-is-long-enough-for-hs256";

/// The tests' `frontstage.purchase_token.secret`.
pub const TEST_PURCHASE_SECRET: &str = "a-test-purchase-token-secret-long-enough";

/// A bearer token for `user`, valid for an hour, signed with `secret`.
pub fn token(secret: &secrecy::SecretString, user: i64) -> String {
    seckill_engine::http::auth::issue_hs256(secret, user, Duration::from_secs(3600))
        .expect("sign a test token")
}

/// Counts rows with a query that returns one bigint.
pub async fn count(db: &Client, sql: &str) -> i64 {
    db.query_one(sql, &[]).await.expect(sql).get(0)
}

/// The tables among `tables` that were read sequentially, with their scan counts,
/// once the statistics of `backend` (the session that ran the statements under test)
/// are flushed and `db` takes a fresh snapshot of them.
pub async fn sequential_scans(
    backend: &Client,
    db: &Client,
    tables: &[&str],
) -> Vec<(String, i64)> {
    statistics(
        backend,
        db,
        "SELECT relname::text, seq_scan FROM pg_stat_user_tables
         WHERE relname = ANY ($1) AND seq_scan > 0
         ORDER BY relname",
        tables,
    )
    .await
}

/// The entries read from each of `indexes` by index scans, read like `sequential_scans`.
pub async fn index_entries_read(
    backend: &Client,
    db: &Client,
    indexes: &[&str],
) -> Vec<(String, i64)> {
    statistics(
        backend,
        db,
        "SELECT indexrelname::text, idx_tup_read FROM pg_stat_user_indexes
         WHERE indexrelname = ANY ($1)
         ORDER BY indexrelname",
        indexes,
    )
    .await
}

/// Flushes the statistics of `backend`, takes a fresh snapshot in `db` and runs
/// `sql` (name, count) for `names`.
async fn statistics(
    backend: &Client,
    db: &Client,
    sql: &str,
    names: &[&str],
) -> Vec<(String, i64)> {
    backend
        .batch_execute("SELECT pg_stat_force_next_flush()")
        .await
        .expect("flush statistics");
    db.batch_execute("SELECT pg_stat_clear_snapshot()")
        .await
        .expect("fresh statistics snapshot");
    db.query(sql, &[&names])
        .await
        .expect("statistics")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// Asserts that every §13.3 invariant holds (the inbox within the default window).
pub async fn assert_invariants(db: &Client) {
    let window = std::time::Duration::from_secs(14 * 86_400);
    let results = seckill_engine::store::invariants::run_checks(db, None, window)
        .await
        .expect("run checks");
    let failed: Vec<_> = results.iter().filter(|r| !r.ok()).collect();
    assert!(failed.is_empty(), "invariants violated: {failed:#?}");
}

/// A TCP port nothing listens on right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A TCP proxy in front of a real service that can be switched off (every connection
/// cut, new ones refused) and on again: the service "goes down" for the engine only.
/// Or cut like a network: `black_hole` keeps every connection open on both sides
/// and forwards nothing, new ones included, until `set(true)`; no side sees a reset,
/// only silence (what a partition or a dropped route does).
pub struct Switch {
    pub addr: std::net::SocketAddr,
    /// Every connection follows it; a new value (even an equal one) is a change.
    state: std::sync::Arc<tokio::sync::watch::Sender<SwitchState>>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum SwitchState {
    Up,
    Down,
    BlackHole,
}

impl Switch {
    pub async fn start(target: std::net::SocketAddr) -> Switch {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = std::sync::Arc::new(tokio::sync::watch::Sender::new(SwitchState::Up));
        // The proxy outlives the handle, as a network outlives a test's view of it.
        let sender = state.clone();
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                // Sees the switch's changes from now on.
                let mut changes = sender.subscribe();
                let now = *changes.borrow_and_update();
                match now {
                    SwitchState::Down => continue, // dropped: the client sees it closed
                    SwitchState::BlackHole => {
                        // Held open, never answered, until the switch is set again.
                        tokio::spawn(async move {
                            let _ = changes.changed().await;
                            drop(inbound);
                        });
                        continue;
                    }
                    SwitchState::Up => {}
                }
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => return,
                        _ = changes.changed() => {}
                    }
                    if *changes.borrow_and_update() == SwitchState::BlackHole {
                        // Both ends stay open and hear nothing until the cut heals;
                        // then they close, as the peers will have given up by then.
                        let _ = changes.changed().await;
                    }
                });
            }
        });
        Switch { addr, state }
    }

    pub fn set(&self, up: bool) {
        self.state.send_replace(if up {
            SwitchState::Up
        } else {
            SwitchState::Down
        });
    }

    /// `url` (scheme://[user:password@]host:port/vhost) pointed at this switch.
    pub fn url_through(&self, url: &str) -> String {
        let (scheme, rest) = url.split_once("://").unwrap();
        let (creds, after) = rest
            .rsplit_once('@')
            .map(|(c, a)| (format!("{c}@"), a))
            .unwrap_or((String::new(), rest));
        let vhost = after.split_once('/').map(|(_, v)| v).unwrap_or("");
        format!("{scheme}://{creds}{}/{vhost}", self.addr)
    }

    /// Cuts like a network: nothing passes, nobody is told.
    pub fn black_hole(&self) {
        self.state.send_replace(SwitchState::BlackHole);
    }
}

/// The host:port a service URL points at.
pub fn target_of(url: &str, default_port: u16) -> std::net::SocketAddr {
    let rest = url.split("://").nth(1).unwrap();
    let hostport = rest.rsplit('@').next().unwrap().split('/').next().unwrap();
    let (host, port) = hostport.rsplit_once(':').unwrap_or((hostport, ""));
    let port = port.parse().unwrap_or(default_port);
    format!(
        "{}:{port}",
        if host == "localhost" {
            "127.0.0.1"
        } else {
            host
        }
    )
    .parse()
    .unwrap()
}

/// A topology a project script starts for one test (`scripts/services up
/// --redis-ha`, `--amqp-cluster`): free ports given through `ports_var`, files under a
/// directory of the test's own; `scripts/services down` and the directory removed
/// when dropped.
pub struct Topology {
    pub dir: PathBuf,
    pub ports: Vec<u16>,
    ports_var: &'static str,
}

impl Topology {
    /// Runs `scripts/services up <flag>` on `count` free ports and checks that it
    /// wrote `settings_file` (its settings for the engine) in the directory.
    pub async fn start(
        flag: &str,
        ports_var: &'static str,
        count: usize,
        settings_file: &str,
    ) -> Topology {
        let dir = std::env::temp_dir().join(format!("seckill-topo-{}", Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("topology dir");
        let topology = Topology {
            dir,
            ports: (0..count).map(|_| free_port()).collect(),
            ports_var,
        };
        let out = topology.services(&["up", flag]).await;
        assert!(topology.dir.join(settings_file).exists(), "{out}");
        topology
    }

    /// `scripts/services ARGS` against this topology; its output.
    pub async fn services(&self, args: &[&str]) -> String {
        let ports = self
            .ports
            .iter()
            .map(u16::to_string)
            .collect::<Vec<_>>()
            .join(" ");
        project_script(
            "scripts/services",
            args,
            &[
                ("SECKILL_SERVICES_DIR", self.dir.display().to_string()),
                (self.ports_var, ports),
            ],
        )
        .await
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        let _ = std::process::Command::new(repo_root().join("scripts/services"))
            .arg("down")
            .env("SECKILL_SERVICES_DIR", &self.dir)
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Deletes every key matching `pattern` (a test's own prefix: `{prefix}:*`), as a
/// Redis restart without persistence would, through SCAN: `KEYS` walks the whole
/// shared server at once and can outlast the connection's timeout on a busy machine.
pub async fn redis_delete_matching(
    redis: &mut ::redis::aio::MultiplexedConnection,
    pattern: &str,
) -> usize {
    try_delete_matching(redis, pattern)
        .await
        .expect("SCAN and DEL")
}

/// `redis_delete_matching`, its error returned (a clean-up ignores it).
async fn try_delete_matching(
    redis: &mut ::redis::aio::MultiplexedConnection,
    pattern: &str,
) -> Result<usize, ::redis::RedisError> {
    let mut cursor: u64 = 0;
    let mut deleted = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = ::redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1_000)
            .query_async(redis)
            .await?;
        if !keys.is_empty() {
            let n: usize = ::redis::cmd("DEL").arg(&keys).query_async(redis).await?;
            deleted += n;
        }
        if next == 0 {
            return Ok(deleted);
        }
        cursor = next;
    }
}

/// Redis stock of buckets `0..buckets` of a SKU (a missing key reads as 0).
pub async fn redis_stocks(
    redis: &mut ::redis::aio::MultiplexedConnection,
    keys: &seckill_engine::redis::keys::SkuKeys,
    buckets: i16,
) -> Vec<i64> {
    let mut out = Vec::new();
    for b in 0..buckets {
        let v: Option<i64> = ::redis::cmd("GET")
            .arg(keys.stock(b))
            .query_async(redis)
            .await
            .expect("read Redis stock");
        out.push(v.unwrap_or(0));
    }
    out
}

/// How many consumers the broker counts on a queue (`None` if it cannot be asked).
pub async fn consumers(amqp: &lapin::Connection, queue: &str) -> Option<u32> {
    let channel = amqp.create_channel().await.ok()?;
    let q = channel
        .queue_declare(
            queue.into(),
            lapin::options::QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            lapin::types::FieldTable::default(),
        )
        .await
        .ok()?;
    let _ = channel.close(200, "probe".into()).await;
    Some(q.consumer_count())
}

/// A Redis server of the test's own (`redis-server`, which `scripts/services`
/// installs), on a free port with its append-only file in a directory of its own,
/// so that a test can kill its clients or restart it without touching the Redis the
/// other tests share.
pub struct PrivateRedis {
    pub port: u16,
    dir: std::path::PathBuf,
    child: Option<std::process::Child>,
}

impl PrivateRedis {
    pub async fn start() -> PrivateRedis {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("seckill-it-redis-{port}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("the private Redis's directory");
        let mut redis = PrivateRedis {
            port,
            dir,
            child: None,
        };
        redis.run().await;
        redis
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Starts the server (again, on the same port and data) and waits for a PING.
    pub async fn run(&mut self) {
        let child = std::process::Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server (installed by scripts/services)");
        self.child = Some(child);
        let url = self.url();
        assert!(
            wait_until(HANG, || {
                let url = url.clone();
                async move {
                    let Ok(client) = ::redis::Client::open(url) else {
                        return false;
                    };
                    let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
                        return false;
                    };
                    ::redis::cmd("PING")
                        .query_async::<String>(&mut conn)
                        .await
                        .is_ok()
                }
            })
            .await,
            "the private Redis did not answer"
        );
    }

    /// Shuts the server down as an operator would (its data kept) and waits for it.
    pub async fn stop(&mut self) {
        if let Ok(client) = ::redis::Client::open(self.url()) {
            if let Ok(mut conn) = client.get_multiplexed_async_connection().await {
                let _: Result<(), _> = ::redis::cmd("SHUTDOWN").query_async(&mut conn).await;
            }
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
        }
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The end of a test's sale, for the Redis keys' expiry: a day from now.
pub fn sale_end() -> chrono::DateTime<chrono::Utc> {
    chrono::Utc::now() + chrono::TimeDelta::days(1)
}
