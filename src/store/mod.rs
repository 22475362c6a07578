//! PostgreSQL: the connection pool, migrations, and one module per flow with its SQL
//! next to the Rust that runs it. Everything the engine promises is decided here,
//! inside transactions; the actors only decide *when* these functions run.

pub mod activity;
pub mod compensation;
pub mod diagnose;
pub mod health;
mod inbox;
pub mod invariants;
pub mod maintain;
pub mod migrate;
pub mod node_lease;
pub mod ops;
pub mod orders;
pub mod outbox;
pub mod payments;
pub mod primary;
pub mod reads;
pub mod reconcile;
pub mod retention;
pub mod sqlstate;
pub mod sweeps;
pub mod topology;
pub(crate) mod tx;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bb8_postgres::PostgresConnectionManager;
use secrecy::SecretString;
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio_postgres::{Client, NoTls, Statement};

use crate::config::{DatabaseSettings, PgUrl};
use crate::domain::outcome::ErrorClass;
use crate::tls::{PgTls, TlsError, TlsFiles};
use sqlstate::classify_sqlstate;

/// Set in the transaction of a batch claim (`outbox::claim`, `compensation::claim`:
/// `ORDER BY` the ready index `FOR UPDATE SKIP LOCKED LIMIT n`) and of the backlog
/// gauges (`ops::backlog`), so that each walks its index in order and stops after n
/// rows. On a table never analyzed (a sale's fresh tables; autovacuum lags or is
/// off) the planner guessed about 150 ready rows and chose a bitmap scan of every
/// ready row and a sort: during a sale, when nearly every event waits, each outbox
/// claim read and sorted all of them (62 ms and a 3.8 MB temporary file at 80,000
/// events; it runs every second while orders flow). Without bitmap scans, sorts and
/// sequential scans the index is the way left, at any size and with any statistics
/// (docs/benchmarks-history.md, 2026-12-01, 48bb2c2).
const INDEX_WALK: &str = "
SET LOCAL enable_bitmapscan = off;
SET LOCAL enable_sort = off;
SET LOCAL enable_seqscan = off";

/// The engine's PostgreSQL connections: a bb8 pool whose callers are served in the
/// order they ask. bb8 0.9 alone does not queue: a connection put back wakes one
/// waiter, but a caller that arrives meanwhile takes it first, and the waiter that
/// was woken queues again at the back. With 64 buckets' transactions asking for 16
/// connections, some waited past the 1 s timeout while the mean wait was 0.1–0.2 s
/// (docs/benchmarks-history.md, 2026-12-01, c21a6aa). Here at most `pool_size` callers ask bb8 at once
/// and the others wait in a first-come-first-served queue, all within
/// `database.acquire_timeout_ms`.
#[derive(Clone)]
pub struct Pool {
    inner: bb8::Pool<PgManager>,
    queue: Arc<Semaphore>,
    acquire_timeout: Duration,
    counts: Arc<PoolCounts>,
    connect_error: Arc<std::sync::Mutex<Option<String>>>,
}

#[derive(Default)]
struct PoolCounts {
    waiting: AtomicU64,
    timed_out: AtomicU64,
}

/// What the gauges report of the pool.
#[derive(Debug, Clone, Copy)]
pub struct PoolState {
    pub connections: u32,
    pub idle: u32,
    /// Callers waiting for a connection, in the queue or in bb8.
    pub waiting: u64,
    /// Callers that gave up after `database.acquire_timeout_ms`, since the start.
    pub timed_out: u64,
}

/// A connection from the pool. Dropping it puts the connection back, then lets the
/// next caller in the queue ask, then gives back the gate's place it was taken
/// behind, if any (fields drop in this order).
pub struct PooledConn<'a> {
    conn: bb8::PooledConnection<'a, PgManager>,
    _place: SemaphorePermit<'a>,
    _gate: Option<SemaphorePermit<'a>>,
}

impl std::ops::Deref for PooledConn<'_> {
    type Target = PgConn;
    fn deref(&self) -> &PgConn {
        &self.conn
    }
}

impl std::ops::DerefMut for PooledConn<'_> {
    fn deref_mut(&mut self) -> &mut PgConn {
        &mut self.conn
    }
}

impl Pool {
    /// A connection, in the order asked; `PoolTimeout` after `acquire_timeout`.
    pub async fn get(&self) -> Result<PooledConn<'_>, StoreError> {
        self.get_behind(None).await.map(|(conn, _)| conn)
    }

    /// A place in `gate` first (held until the connection is dropped), then a
    /// connection, both within `acquire_timeout`; returns how long the gate took too.
    /// The order transactions' slots (`engine.order_transactions`) are such a gate.
    pub async fn get_gated<'a>(
        &'a self,
        gate: &'a Semaphore,
    ) -> Result<(PooledConn<'a>, Duration), StoreError> {
        self.get_behind(Some(gate)).await
    }

    async fn get_behind<'a>(
        &'a self,
        gate: Option<&'a Semaphore>,
    ) -> Result<(PooledConn<'a>, Duration), StoreError> {
        let _waiting = Waiting::new(&self.counts.waiting);
        let queued = async {
            let started = Instant::now();
            // Neither semaphore is ever closed.
            let gate = match gate {
                Some(gate) => Some(gate.acquire().await.map_err(|_| StoreError::PoolTimeout)?),
                None => None,
            };
            let gated = started.elapsed();
            let place = self
                .queue
                .acquire()
                .await
                .map_err(|_| StoreError::PoolTimeout)?;
            let conn = PooledConn {
                conn: self.inner.get().await?,
                _place: place,
                _gate: gate,
            };
            Ok((conn, gated))
        };
        let got = tokio::time::timeout(self.acquire_timeout, queued)
            .await
            .unwrap_or(Err(StoreError::PoolTimeout));
        if matches!(got, Err(StoreError::PoolTimeout)) {
            self.counts.timed_out.fetch_add(1, Ordering::Relaxed);
        }
        got
    }

    /// Why the pool could not open a connection, while it cannot (no attempt
    /// has succeeded since that one failed).
    pub fn connect_error(&self) -> Option<String> {
        self.connect_error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    pub fn state(&self) -> PoolState {
        let state = self.inner.state();
        PoolState {
            connections: state.connections,
            idle: state.idle_connections,
            waiting: self.counts.waiting.load(Ordering::Relaxed),
            timed_out: self.counts.timed_out.load(Ordering::Relaxed),
        }
    }
}

/// Counts a caller of `Pool::get` while it waits, including one whose future is
/// dropped half way.
struct Waiting<'a>(&'a AtomicU64);

impl<'a> Waiting<'a> {
    fn new(count: &'a AtomicU64) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Self(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("timed out waiting for a pooled connection")]
    PoolTimeout,
    #[error("database: {}", describe(.0))]
    Db(#[from] tokio_postgres::Error),
    /// COMMIT was sent and the connection failed before the answer (§7.5).
    #[error("commit outcome unknown: {}", describe(.0))]
    CommitOutcomeUnknown(tokio_postgres::Error),
    /// COMMIT was answered as a success with a warning: when a wait for a
    /// synchronous standby is cancelled, PostgreSQL commits locally and says so only
    /// in a warning (`Warnings`). Not replicated, it would not survive a fail-over:
    /// treated as an unknown outcome, never acked.
    #[error("COMMIT answered with a warning (a cancelled wait for a synchronous standby): committed locally, maybe not replicated")]
    CommitWarned,
    /// A pooled connection's server is read-only now (found by the liveness check).
    #[error("the server is read-only (no writable primary)")]
    ReadOnlyServer,
    /// The data contradicts the model (e.g. an order id collision): an operator must look.
    #[error("anomaly: {0}")]
    Anomaly(String),
    #[error("invalid database URL: {0}")]
    Url(String),
    /// `database.tls` cannot be used (a file missing, a verify mode without a CA).
    #[error("`{}`: {}", .0.key, .0.reason)]
    Tls(#[from] TlsError),
    /// The engine's runtime, which opens and drives every pooled connection, did not
    /// finish opening one (it is shutting down).
    #[error("no connection opened: {0}")]
    NotOpened(String),
    /// A batch sent whole on the assumption that its messages are new
    /// and its bucket holds their units was not so; the transaction is redone the
    /// careful way (`orders::create_orders`).
    #[error("a batch sent as new messages with units to take was not")]
    Speculation,
    /// The node id's lease is not current: no id may be minted until it is renewed.
    #[error(transparent)]
    MintingStopped(#[from] crate::domain::ids::MintingStopped),
}

/// tokio-postgres' Display says only "db error"; the server's message is in the source.
pub fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
        None => match std::error::Error::source(e) {
            Some(source) => format!("{e}: {source}"),
            None => e.to_string(),
        },
    }
}

impl StoreError {
    pub fn class(&self) -> ErrorClass {
        match self {
            StoreError::PoolTimeout => ErrorClass::Unavailable("pool_timeout"),
            StoreError::Db(_) if self.is_minted_id_conflict() => {
                ErrorClass::Transient("minted_id_conflict")
            }
            StoreError::Db(e) => match e.code() {
                Some(state) => classify_sqlstate(state.code()),
                // No SQLSTATE: the connection broke before COMMIT was sent, so
                // nothing was committed.
                None => ErrorClass::Unavailable("connection"),
            },
            StoreError::CommitOutcomeUnknown(_) | StoreError::CommitWarned => {
                ErrorClass::CommitOutcomeUnknown
            }
            StoreError::Anomaly(reason) => ErrorClass::Fatal(reason.clone()),
            StoreError::Url(reason) => ErrorClass::Fatal(reason.clone()),
            StoreError::Tls(e) => ErrorClass::Fatal(e.to_string()),
            StoreError::NotOpened(_) => ErrorClass::Unavailable("connection"),
            StoreError::ReadOnlyServer => ErrorClass::Unavailable("read_only"),
            // Nothing committed; never leaves `create_orders`.
            StoreError::Speculation => ErrorClass::Transient("speculation"),
            // Nothing was written; the message waits until the lease is renewed (or
            // another instance, with its own id, takes it).
            StoreError::MintingStopped(_) => ErrorClass::Unavailable("minting_stopped"),
        }
    }

    /// A unique violation on an id the engine minted (`sqlstate::minted_id_conflict`).
    pub fn is_minted_id_conflict(&self) -> bool {
        match self {
            StoreError::Db(e) => e
                .as_db_error()
                .is_some_and(|db| sqlstate::minted_id_conflict(db.code().code(), db.constraint())),
            _ => false,
        }
    }

    /// The SQLSTATE, for logs.
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            StoreError::Db(e) | StoreError::CommitOutcomeUnknown(e) => e.code().map(|c| c.code()),
            _ => None,
        }
    }
}

impl From<bb8::RunError<StoreError>> for StoreError {
    fn from(e: bb8::RunError<StoreError>) -> Self {
        match e {
            bb8::RunError::User(e) => e,
            bb8::RunError::TimedOut => StoreError::PoolTimeout,
        }
    }
}

/// Parses the configured URL and points the session at the `seckill` schema, so the
/// SQL in this module can name tables without a schema prefix.
pub fn pg_config(settings: &DatabaseSettings) -> Result<PgTarget, StoreError> {
    let mut config = admin_pg_config(settings)?;
    config.options("-c search_path=seckill,public");
    Ok(config)
}

/// The configured URL with the server's default search_path, for migrations: refinery
/// keeps its history table in `public` and must find it there on every run.
pub fn admin_pg_config(settings: &DatabaseSettings) -> Result<PgTarget, StoreError> {
    let url = settings.parsed_url().map_err(url_error("database.url"))?;
    PgTarget::new(url, settings)
}

/// `database.owner_url` (the role that owns the schema), or `database.url` when
/// unset, with the server's default search_path: what `migrate` and the after-sale
/// VACUUM connect as (docs/OPERATIONS.md, "Roles").
pub fn owner_pg_config(settings: &DatabaseSettings) -> Result<PgTarget, StoreError> {
    let owner = settings
        .parsed_owner_url()
        .map_err(url_error("database.owner_url"))?;
    match owner {
        Some(url) => PgTarget::new(url, settings),
        None => admin_pg_config(settings),
    }
}

/// A URL that could not be read, naming its key: one given to `PgTarget::from_url`,
/// or one rewritten after `Settings::load` (which refuses the others).
fn url_error(key: &'static str) -> impl Fn(String) -> StoreError {
    move |reason| StoreError::Url(format!("`{key}`: {reason}"))
}

/// A PostgreSQL server to connect to: what tokio-postgres reads of the URL, and the
/// TLS its `sslmode` asks for (`tls::PgTls`, with `database.tls`). Dereferences to
/// the tokio-postgres settings.
#[derive(Clone, Debug)]
pub struct PgTarget {
    config: tokio_postgres::Config,
    tls: PgTls,
}

impl std::ops::Deref for PgTarget {
    type Target = tokio_postgres::Config;
    fn deref(&self) -> &tokio_postgres::Config {
        &self.config
    }
}

impl std::ops::DerefMut for PgTarget {
    fn deref_mut(&mut self) -> &mut tokio_postgres::Config {
        &mut self.config
    }
}

impl PgTarget {
    /// `url` (one of `settings`' URLs, as read at load) with `settings.tls`.
    pub fn new(url: PgUrl, settings: &DatabaseSettings) -> Result<PgTarget, StoreError> {
        PgTarget::with_tls(url, &settings.tls, settings.connect_timeout())
    }

    fn with_tls(
        url: PgUrl,
        files: &TlsFiles,
        connect_timeout: Duration,
    ) -> Result<PgTarget, StoreError> {
        let PgUrl {
            key,
            mut config,
            ssl_mode,
            ..
        } = url;
        let tls = PgTls::new(ssl_mode, files, key)?;
        tls.apply(&mut config);
        config
            .connect_timeout(connect_timeout)
            .application_name("seckill-engine");
        Ok(PgTarget { config, tls })
    }

    /// A URL with no `database.tls` files (its own sslmode, up to `require`).
    pub fn from_url(url: &str) -> Result<PgTarget, StoreError> {
        let url = PgUrl::parse("database.url", &SecretString::from(url.to_owned()))
            .map_err(url_error("database.url"))?;
        PgTarget::with_tls(url, &TlsFiles::default(), Duration::from_secs(10))
    }

    /// The `sslmode` of the URL.
    pub fn ssl_mode(&self) -> crate::tls::SslMode {
        self.tls.mode()
    }
}

/// A pooled connection with its own cache of prepared statements: the hot path sends
/// Bind/Execute only, instead of a Parse round trip per statement. The fields are
/// public so a transaction can borrow `client` while `statements` stays usable.
pub struct PgConn {
    pub client: Client,
    pub statements: StatementCache,
    /// When the server last answered a liveness check on this connection.
    checked_at: Instant,
    /// A transaction was begun here with a plain BEGIN (no `Transaction` to roll
    /// it back when dropped) and has not been seen to end. A connection returned to
    /// the pool like that (its caller was cancelled) is closed instead, which makes
    /// PostgreSQL roll the transaction back.
    pub(crate) in_transaction: bool,
    /// The server answered 25006: it is read-only now (a standby, a primary being
    /// fenced). The pool closes the connection instead of handing it out again;
    /// the next one it opens goes to whichever server is writable (the URL may name
    /// several, `target_session_attrs=read-write`).
    read_only: bool,
    /// The WARNING notices the server sent on this connection.
    pub warnings: Warnings,
}

impl PgConn {
    /// A connection that has just been opened, with no statement prepared yet.
    pub fn new(client: Client, warnings: Warnings) -> Self {
        Self {
            client,
            statements: StatementCache::default(),
            checked_at: Instant::now(),
            in_transaction: false,
            read_only: false,
            warnings,
        }
    }

    /// Passes `result` on, noting an answer that says the server is read-only.
    pub fn observe<T>(&mut self, result: Result<T, StoreError>) -> Result<T, StoreError> {
        if let Err(e) = &result {
            if e.sqlstate() == Some(READ_ONLY_SQL_TRANSACTION) {
                self.read_only = true;
            }
        }
        result
    }
}

/// SQLSTATE 25006, read_only_sql_transaction.
const READ_ONLY_SQL_TRANSACTION: &str = "25006";

/// The per-connection statement cache, keyed by the static SQL text.
#[derive(Default)]
pub struct StatementCache(HashMap<&'static str, Statement>);

impl StatementCache {
    /// The prepared statement for `sql`, preparing it on first use on this connection.
    pub async fn get<C: tokio_postgres::GenericClient>(
        &mut self,
        client: &C,
        sql: &'static str,
    ) -> Result<Statement, tokio_postgres::Error> {
        if let Some(stmt) = self.0.get(sql) {
            return Ok(stmt.clone());
        }
        let stmt = client.prepare(sql).await?;
        self.0.insert(sql, stmt.clone());
        Ok(stmt)
    }
}

/// The WARNING notices the server sent on one connection, counted by the task that
/// drives it. A COMMIT answered with a warning may not be what it seems: when a
/// wait for a synchronous standby is cancelled (`pg_cancel_backend`, as an operator
/// or a pooler does to "stuck" sessions), PostgreSQL answers the COMMIT as a
/// success with only `WARNING: canceling wait for synchronous replication …
/// committed locally, but might not have been replicated`. `tx::commit` compares
/// the count before and after: any warning during COMMIT makes its outcome unknown.
/// The severity is read from the field PostgreSQL never translates, so this holds
/// whatever `lc_messages` the server runs with.
#[derive(Debug, Clone, Default)]
pub struct Warnings(Arc<AtomicU64>);

impl Warnings {
    /// Warnings seen so far on the connection.
    pub fn seen(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    fn saw(&self, notice: &tokio_postgres::error::DbError) {
        if notice.parsed_severity() == Some(tokio_postgres::error::Severity::Warning) {
            self.0.fetch_add(1, Ordering::AcqRel);
            tracing::warn!(
                sqlstate = notice.code().code(),
                server_message = notice.message(),
                detail = notice.detail(),
                "PostgreSQL sent a warning"
            );
        }
    }
}

/// Opens a connection and drives it on the current runtime, counting its warnings.
/// The notices arrive in protocol order, so a warning sent before a statement's
/// answer is counted before the caller sees that answer.
async fn open(target: &PgTarget, warnings: Warnings) -> Result<Client, tokio_postgres::Error> {
    let (tls, encrypted) = target.tls.connector();
    let (client, mut connection) = target.config.connect(tls).await?;
    target.tls.opened(&encrypted);
    tokio::spawn(async move {
        loop {
            match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(tokio_postgres::AsyncMessage::Notice(notice))) => warnings.saw(&notice),
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "PostgreSQL connection closed");
                    break;
                }
                None => break,
            }
        }
    });
    Ok(client)
}

/// bb8 manager: opens connections that count their warnings, keeps a statement
/// cache per connection, and drops a connection that turned out to be on a
/// read-only server.
pub struct PgManager {
    config: PgTarget,
    /// Its liveness check (which never opens a connection, hence `NoTls`).
    inner: PostgresConnectionManager<NoTls>,
    /// Where connections are opened and their tasks run, whoever asks for one, in
    /// turn (the engine's pipeline lanes, `actors::lanes`). bb8 opens a connection
    /// in the task that finds the pool short, and the connection's task would run
    /// on that task's runtime: an HTTP worker's, when a front-stage request made the
    /// pool grow. The order transactions that reuse such a connection would hop
    /// threads on every round trip, and it would close when the front stage stops,
    /// ahead of the engine's drain.
    runtimes: Vec<tokio::runtime::Handle>,
    next: std::sync::atomic::AtomicUsize,
    /// Why the last attempt to open a connection failed, while no attempt has
    /// succeeded since (readiness reports it: "no writable primary", refused, …).
    connect_error: Arc<std::sync::Mutex<Option<String>>>,
}

impl PgManager {
    fn connected<T>(&self, result: Result<T, tokio_postgres::Error>) -> Result<T, StoreError> {
        let mut last = self
            .connect_error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match result {
            Ok(client) => {
                *last = None;
                Ok(client)
            }
            Err(e) => {
                *last = Some(describe(&e));
                Err(StoreError::Db(e))
            }
        }
    }
}

impl bb8::ManageConnection for PgManager {
    type Connection = PgConn;
    type Error = StoreError;

    async fn connect(&self) -> Result<PgConn, StoreError> {
        let turn = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let runtime = &self.runtimes[turn % self.runtimes.len()];
        let config = self.config.clone();
        let warnings = Warnings::default();
        let opening = warnings.clone();
        let client = match runtime
            .spawn(async move { open(&config, opening).await })
            .await
        {
            Ok(client) => client,
            // That runtime has stopped (its lane ended before a late caller, such as
            // a front stage outliving an in-process engine): open it here instead.
            Err(e) if e.is_cancelled() => open(&self.config, warnings.clone()).await,
            Err(e) => return Err(StoreError::NotOpened(e.to_string())),
        };
        Ok(PgConn::new(self.connected(client)?, warnings))
    }

    /// The check is a round trip (two: liveness, and whether the server is still
    /// writable), and a checkout happens for every order transaction.
    /// It only narrows the window in which a dead backend is handed out: a backend can
    /// die in the middle of a transaction anyway, and every caller handles that. So a
    /// connection that answered a check within `RECHECK_AFTER` is taken as alive,
    /// unless its connection task has already seen the server go (a terminated
    /// backend sends FATAL and closes): then the check fails at once and the pool
    /// opens another connection instead of handing out one that cannot work.
    async fn is_valid(&self, conn: &mut PgConn) -> Result<(), StoreError> {
        if !conn.client.is_closed() && conn.checked_at.elapsed() < RECHECK_AFTER {
            return Ok(());
        }
        self.inner.is_valid(&mut conn.client).await?;
        // The server may have turned read-only since (a standby after all, a
        // primary fenced by a fail-over tool): such a connection is closed, whoever
        // saw or did not see a 25006 on it, and the pool opens one on the primary.
        let read_only = conn
            .client
            .simple_query("SHOW transaction_read_only")
            .await?
            .iter()
            .any(|m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(r) if r.get(0) == Some("on")));
        if read_only {
            conn.read_only = true;
            return Err(StoreError::ReadOnlyServer);
        }
        conn.checked_at = Instant::now();
        Ok(())
    }

    fn has_broken(&self, conn: &mut PgConn) -> bool {
        conn.client.is_closed() || conn.in_transaction || conn.read_only
    }
}

/// How long a pooled connection that answered a liveness check is handed out without
/// another one.
const RECHECK_AFTER: Duration = Duration::from_secs(1);

/// Builds the pool without connecting; the first `get` opens connections. Call it on
/// a runtime that lives as long as the engine: connections are opened and driven
/// there, whichever runtime asks for one.
pub fn build_pool(settings: &DatabaseSettings) -> Result<Pool, StoreError> {
    let runtime = tokio::runtime::Handle::try_current()
        .map_err(|e| StoreError::NotOpened(format!("building the pool: {e}")))?;
    build_pool_on(settings, vec![runtime])
}

/// `build_pool` with its connections opened and driven on `runtimes` in turn (the
/// engine's pipeline lanes), which must live as long as the pool is used.
pub fn build_pool_on(
    settings: &DatabaseSettings,
    runtimes: Vec<tokio::runtime::Handle>,
) -> Result<Pool, StoreError> {
    if runtimes.is_empty() {
        return Err(StoreError::NotOpened(
            "building the pool: no runtime to open connections on".into(),
        ));
    }
    let mut config = pg_config(settings)?;
    // The engine writes: a server that is read-only (a standby; a primary with
    // default_transaction_read_only) is passed over when the URL names several,
    // and is no connection at all when it names one (libpq's
    // target_session_attrs=read-write, whatever the URL says).
    config.target_session_attrs(tokio_postgres::config::TargetSessionAttrs::ReadWrite);
    Ok(pool_of(
        config,
        settings.pool_size,
        settings.acquire_timeout(),
        runtimes,
    ))
}

/// A small pool on `database.replica_url` for the reads that may be stale (seed
/// §14.4), opened on the current runtime; `None` when no replica is configured.
pub fn build_replica_pool(settings: &DatabaseSettings) -> Result<Option<Pool>, StoreError> {
    let replica = settings
        .parsed_replica_url()
        .map_err(url_error("database.replica_url"))?;
    let Some(url) = replica else {
        return Ok(None);
    };
    let runtime = tokio::runtime::Handle::try_current()
        .map_err(|e| StoreError::NotOpened(format!("building the replica pool: {e}")))?;
    let mut config = PgTarget::new(url, settings)?;
    config
        .application_name("seckill-engine-replica-reads")
        .options("-c search_path=seckill,public -c default_transaction_read_only=on");
    Ok(Some(pool_of(
        config,
        REPLICA_POOL_SIZE,
        settings.acquire_timeout(),
        vec![runtime],
    )))
}

/// History reads are short; a few connections serve many.
const REPLICA_POOL_SIZE: u32 = 4;

fn pool_of(
    config: PgTarget,
    size: u32,
    acquire_timeout: Duration,
    runtimes: Vec<tokio::runtime::Handle>,
) -> Pool {
    let connect_error = Arc::default();
    let manager = PgManager {
        inner: PostgresConnectionManager::new(config.config.clone(), NoTls),
        config,
        runtimes,
        next: std::sync::atomic::AtomicUsize::new(0),
        connect_error: Arc::clone(&connect_error),
    };
    let inner = bb8::Pool::builder()
        .max_size(size)
        .connection_timeout(acquire_timeout)
        .idle_timeout(Some(Duration::from_secs(300)))
        .build_unchecked(manager);
    Pool {
        inner,
        queue: Arc::new(Semaphore::new(size as usize)),
        acquire_timeout,
        counts: Arc::default(),
        connect_error,
    }
}

/// A duration as whole milliseconds, for `$n::bigint * interval '1 millisecond'`.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Connects one client outside the pool (migrations, CLI commands).
pub async fn connect(target: &PgTarget) -> Result<Client, tokio_postgres::Error> {
    let (tls, encrypted) = target.tls.connector();
    let (client, connection) = target.config.connect(tls).await?;
    target.tls.opened(&encrypted);
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "PostgreSQL connection closed");
        }
    });
    Ok(client)
}

/// A round trip on the connection (readiness).
pub async fn ping(client: &Client) -> Result<(), tokio_postgres::Error> {
    client.simple_query("SELECT 1").await.map(|_| ())
}
