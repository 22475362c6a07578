//! The store's error type: what can go wrong talking to PostgreSQL, and how each
//! failure is classified for retries, acks and alerts (`StoreError::class`).

use crate::domain::outcome::ErrorClass;
use crate::tls::TlsError;

use super::sqlstate::{self, classify_sqlstate};

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
