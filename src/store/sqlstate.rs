//! The SQLSTATE table: which PostgreSQL errors are worth retrying (and how) and
//! which mean the message does not fit the data. Every database error the engine
//! classifies goes through here.

use crate::domain::outcome::ErrorClass;

/// Classifies a PostgreSQL SQLSTATE of an error raised before or at COMMIT.
pub fn classify_sqlstate(code: &str) -> ErrorClass {
    match code {
        "40001" => ErrorClass::Transient("serialization_failure"),
        "40P01" => ErrorClass::Transient("deadlock"),
        "55P03" => ErrorClass::Transient("lock_timeout"),
        "57014" => ErrorClass::Transient("statement_timeout"),
        "25P04" => ErrorClass::Transient("idle_session_timeout"),
        // The server (or this session) is read-only: a standby, a primary being
        // fenced during a fail-over, or `default_transaction_read_only = on`. Not
        // the message's fault; the pool closes the connection (`PgConn::observe`).
        "25006" => ErrorClass::Unavailable("read_only"),
        // admin_shutdown, crash_shutdown, cannot_connect_now: the server is going
        // or not there yet (a restart or a fail-over).
        "57P01" | "57P02" | "57P03" => ErrorClass::Unavailable("server_shutdown"),
        "57P04" => ErrorClass::Transient("database_dropped"),
        c if c.starts_with("08") => ErrorClass::Unavailable("connection"),
        // insufficient resources (too many connections, out of memory, disk full)
        c if c.starts_with("53") => ErrorClass::Transient("insufficient_resources"),
        c if c.starts_with("58") => ErrorClass::Transient("system_error"),
        // Integrity and data errors mean the message does not fit the data; retrying
        // would fail the same way forever.
        c if c.starts_with("23") || c.starts_with("22") => {
            ErrorClass::Fatal(format!("database rejected the data (SQLSTATE {c})"))
        }
        // Anything else (a bug in our SQL, a missing relation during a bad deploy) is
        // retried with delay and dead-lettered after amqp.max_retries.
        _ => ErrorClass::Transient("database_error"),
    }
}

/// The unique keys on ids the engine mints itself (ledger ids from its node id;
/// event and task ids, UUIDv7). A violation of one is the engine's fault, not the
/// message's: two instances minted with one node id, or a clock went back. The
/// message is tried again (with fresh ids) instead of being dead-lettered.
const MINTED_ID_KEYS: &[&str] = &[
    "inventory_ledger_pkey",
    "event_outbox_pkey",
    "compensation_task_pkey",
];

/// Whether an error with this SQLSTATE on this constraint is a collision of ids
/// the engine minted.
pub fn minted_id_conflict(code: &str, constraint: Option<&str>) -> bool {
    code == "23505" && constraint.is_some_and(|c| MINTED_ID_KEYS.contains(&c))
}

/// Whether a whole-transaction retry inside the engine is worth it (seed
/// `isWholeTransactionRetryable`): only for serialization failures and deadlocks.
pub fn retry_in_place(code: &str) -> bool {
    matches!(code, "40001" | "40P01")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::outcome::{disposition, Disposition, OrderOutcome};

    #[test]
    fn sqlstates_that_retry() {
        for (code, reason) in [
            ("40001", "serialization_failure"),
            ("40P01", "deadlock"),
            ("55P03", "lock_timeout"),
            ("57014", "statement_timeout"),
            ("53300", "insufficient_resources"),
        ] {
            assert_eq!(
                classify_sqlstate(code),
                ErrorClass::Transient(reason),
                "{code}"
            );
            assert_eq!(
                disposition::<OrderOutcome>(Err(&classify_sqlstate(code))),
                Disposition::Retry { reason }
            );
        }
        assert!(retry_in_place("40001") && retry_in_place("40P01"));
    }

    /// The database's unavailability never spends a message's retry budget
    /// (a fail-over, a read-only primary, a restart).
    #[test]
    fn sqlstates_that_wait() {
        for (code, reason) in [
            ("25006", "read_only"),
            ("57P01", "server_shutdown"),
            ("57P02", "server_shutdown"),
            ("57P03", "server_shutdown"),
            ("08006", "connection"),
            ("08001", "connection"),
        ] {
            assert_eq!(
                classify_sqlstate(code),
                ErrorClass::Unavailable(reason),
                "{code}"
            );
            assert_eq!(
                disposition::<OrderOutcome>(Err(&classify_sqlstate(code))),
                Disposition::Wait { reason }
            );
        }
        assert!(!retry_in_place("55P03") && !retry_in_place("23505"));
    }

    #[test]
    fn data_errors_dead_letter() {
        for code in ["23514", "23505", "22003"] {
            assert!(
                matches!(classify_sqlstate(code), ErrorClass::Fatal(_)),
                "{code}"
            );
            assert!(matches!(
                disposition::<OrderOutcome>(Err(&classify_sqlstate(code))),
                Disposition::DeadLetter { .. }
            ));
        }
    }
}
