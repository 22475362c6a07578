//! The engine's connection pool: a bb8 pool behind a first-come-first-served queue,
//! what its gauges read of it, and how the primary's pool is built.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bb8_postgres::PostgresConnectionManager;
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio_postgres::NoTls;

use super::conn::PgConn;
use super::error::StoreError;
use super::manager::PgManager;
use super::target::{pg_config, PgTarget};
use crate::config::DatabaseSettings;

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

pub(super) fn pool_of(
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
