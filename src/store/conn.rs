//! One pooled connection as the engine holds it: the client with its cache of
//! prepared statements, and the count of warnings the server sent on it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Statement};

use super::error::StoreError;

/// A pooled connection with its own cache of prepared statements: the hot path sends
/// Bind/Execute only, instead of a Parse round trip per statement. The fields are
/// public so a transaction can borrow `client` while `statements` stays usable.
pub struct PgConn {
    pub client: Client,
    pub statements: StatementCache,
    /// When the server last answered a liveness check on this connection.
    pub(super) checked_at: Instant,
    /// A transaction was begun here with a plain BEGIN (no `Transaction` to roll
    /// it back when dropped) and has not been seen to end. A connection returned to
    /// the pool like that (its caller was cancelled) is closed instead, which makes
    /// PostgreSQL roll the transaction back.
    pub(crate) in_transaction: bool,
    /// The server answered 25006: it is read-only now (a standby, a primary being
    /// fenced). The pool closes the connection instead of handing it out again;
    /// the next one it opens goes to whichever server is writable (the URL may name
    /// several, `target_session_attrs=read-write`).
    pub(super) read_only: bool,
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

    pub(super) fn saw(&self, notice: &tokio_postgres::error::DbError) {
        if notice.parsed_severity() == Some(tokio_postgres::error::Severity::Warning) {
            self.0.fetch_add(1, Ordering::AcqRel);
            // A server that stops or crashes warns every session it ends: one line
            // per pooled connection for one event, which the readiness prober
            // reports once (docs/OPERATIONS.md, "Logs"). Still counted above.
            let ends_session =
                [SqlState::ADMIN_SHUTDOWN, SqlState::CRASH_SHUTDOWN].contains(notice.code());
            if ends_session {
                tracing::debug!(
                    sqlstate = notice.code().code(),
                    server_message = notice.message(),
                    "PostgreSQL ends this session"
                );
            } else {
                tracing::warn!(
                    sqlstate = notice.code().code(),
                    server_message = notice.message(),
                    detail = notice.detail(),
                    "PostgreSQL sent a warning"
                );
            }
        }
    }
}
