//! The bb8 connection manager: opens each pooled connection on the engine's lanes,
//! counts its warnings, checks it before it is handed out, and drops one that broke
//! or turned read-only.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bb8_postgres::PostgresConnectionManager;
use tokio_postgres::{Client, NoTls};

use super::conn::{PgConn, Warnings};
use super::error::{describe, StoreError};
use super::target::PgTarget;

/// Opens a connection and drives it on the current runtime, counting its warnings.
/// The notices arrive in protocol order, so a warning sent before a statement's
/// answer is counted before the caller sees that answer.
pub(super) async fn open(
    target: &PgTarget,
    warnings: Warnings,
) -> Result<Client, tokio_postgres::Error> {
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
    pub(super) config: PgTarget,
    /// Its liveness check (which never opens a connection, hence `NoTls`).
    pub(super) inner: PostgresConnectionManager<NoTls>,
    /// Where connections are opened and their tasks run, whoever asks for one, in
    /// turn (the engine's pipeline lanes, `actors::lanes`). bb8 opens a connection
    /// in the task that finds the pool short, and the connection's task would run
    /// on that task's runtime: an HTTP worker's, when a front-stage request made the
    /// pool grow. The order transactions that reuse such a connection would hop
    /// threads on every round trip, and it would close when the front stage stops,
    /// ahead of the engine's drain.
    pub(super) runtimes: Vec<tokio::runtime::Handle>,
    pub(super) next: std::sync::atomic::AtomicUsize,
    /// Why the last attempt to open a connection failed, while no attempt has
    /// succeeded since (readiness reports it: "no writable primary", refused, …).
    pub(super) connect_error: Arc<std::sync::Mutex<Option<String>>>,
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
