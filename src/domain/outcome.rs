//! What an order attempt can end in, and how each ending is acknowledged on the queue
//! (DESIGN.md "Outcomes and acks").

use std::fmt;

/// The business result of one `order.create` message, stored in
/// `consumer_inbox.result_code`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResultCode {
    /// This message created the order.
    OrderCreated,
    /// The reservation already has its order (another message for it won).
    OrderAlreadyCreated,
    /// The user already holds an order for this (activity, sku): reservation rejected,
    /// Redis stock handed back.
    UserAlreadyOrdered,
    /// The message's bucket had no stock left in PostgreSQL: reservation rejected,
    /// Redis stock handed back.
    PostgresSoldOut,
    /// The reservation was already closed (rejected, released, expired, manual).
    IllegalReservationState,
    /// The reservation row exists with other attributes (user, sku, bucket) than this
    /// message claims: recorded, no effect.
    ReservationMismatch,
}

impl ResultCode {
    pub const ALL: &'static [ResultCode] = &[
        ResultCode::OrderCreated,
        ResultCode::OrderAlreadyCreated,
        ResultCode::UserAlreadyOrdered,
        ResultCode::PostgresSoldOut,
        ResultCode::IllegalReservationState,
        ResultCode::ReservationMismatch,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            ResultCode::OrderCreated => "ORDER_CREATED",
            ResultCode::OrderAlreadyCreated => "ORDER_ALREADY_CREATED",
            ResultCode::UserAlreadyOrdered => "USER_ALREADY_ORDERED",
            ResultCode::PostgresSoldOut => "POSTGRES_SOLD_OUT",
            ResultCode::IllegalReservationState => "ILLEGAL_RESERVATION_STATE",
            ResultCode::ReservationMismatch => "RESERVATION_MISMATCH",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|c| c.as_str() == s)
    }

    /// Metric label for an outcome that was decided by this message itself.
    pub const fn label(self) -> &'static str {
        match self {
            ResultCode::OrderCreated => "created",
            ResultCode::OrderAlreadyCreated => "already_created",
            ResultCode::UserAlreadyOrdered => "user_already_ordered",
            ResultCode::PostgresSoldOut => "sold_out",
            ResultCode::IllegalReservationState => "illegal_state",
            ResultCode::ReservationMismatch => "mismatch",
        }
    }
}

impl fmt::Display for ResultCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The committed result of one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OrderOutcome {
    pub code: ResultCode,
    /// The order this message created or found, when there is one.
    pub order_id: Option<i64>,
    /// The inbox already held this message id: the result is the stored one and
    /// nothing was written.
    pub duplicate: bool,
}

impl OrderOutcome {
    pub fn label(&self) -> &'static str {
        if self.duplicate {
            "duplicate"
        } else {
            self.code.label()
        }
    }
}

/// How a failed attempt must be treated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorClass {
    /// Nothing was committed and trying again later may succeed: deadlock,
    /// serialization, lock or statement timeout, pool timeout, connection lost before
    /// COMMIT, database shutting down. `reason` is a small fixed label.
    Transient(&'static str),
    /// COMMIT was sent and no answer came back: the transaction may or may not have
    /// committed. Never called failed; the redelivery resolves it through the inbox
    /// and the unique keys (§7.5).
    CommitOutcomeUnknown,
    /// Retrying cannot help (the message contradicts the data): dead-letter it with
    /// the reason so an operator can look.
    Fatal(String),
}

impl ErrorClass {
    /// Log label (the `commit_result` of a failed transaction).
    pub fn label(&self) -> &'static str {
        match self {
            ErrorClass::Transient(_) => "rolled_back_transient",
            ErrorClass::CommitOutcomeUnknown => "unknown",
            ErrorClass::Fatal(_) => "rolled_back_fatal",
        }
    }
}

/// Classifies a PostgreSQL SQLSTATE of an error raised before or at COMMIT.
pub fn classify_sqlstate(code: &str) -> ErrorClass {
    match code {
        "40001" => ErrorClass::Transient("serialization_failure"),
        "40P01" => ErrorClass::Transient("deadlock"),
        "55P03" => ErrorClass::Transient("lock_timeout"),
        "57014" => ErrorClass::Transient("statement_timeout"),
        "25P04" => ErrorClass::Transient("idle_session_timeout"),
        // admin_shutdown, crash_shutdown, cannot_connect_now, database_dropped
        "57P01" | "57P02" | "57P03" | "57P04" => ErrorClass::Transient("server_shutdown"),
        c if c.starts_with("08") => ErrorClass::Transient("connection"),
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

/// Whether a whole-transaction retry inside the engine is worth it (seed
/// `isWholeTransactionRetryable`): only for serialization failures and deadlocks.
pub fn retry_in_place(code: &str) -> bool {
    matches!(code, "40001" | "40P01")
}

/// What the intake does with the delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Disposition {
    /// The effect (or its recorded rejection) is committed.
    Ack,
    /// Send to the delayed-retry queue; nothing is acked before a commit.
    Retry { reason: &'static str },
    /// Send to the dead-letter queue with the reason.
    DeadLetter { reason: String },
}

pub fn disposition<T>(result: Result<&T, &ErrorClass>) -> Disposition {
    match result {
        Ok(_) => Disposition::Ack,
        Err(ErrorClass::Transient(reason)) => Disposition::Retry { reason },
        Err(ErrorClass::CommitOutcomeUnknown) => Disposition::Retry {
            reason: "commit_outcome_unknown",
        },
        Err(ErrorClass::Fatal(reason)) => Disposition::DeadLetter {
            reason: reason.clone(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_recorded_outcome_is_acked() {
        for code in ResultCode::ALL {
            for duplicate in [false, true] {
                let o = OrderOutcome {
                    code: *code,
                    order_id: None,
                    duplicate,
                };
                assert_eq!(disposition(Ok(&o)), Disposition::Ack);
            }
            assert_eq!(ResultCode::parse(code.as_str()), Some(*code));
        }
    }

    #[test]
    fn commit_outcome_unknown_is_never_acked_nor_dead_lettered() {
        assert_eq!(
            disposition::<OrderOutcome>(Err(&ErrorClass::CommitOutcomeUnknown)),
            Disposition::Retry {
                reason: "commit_outcome_unknown"
            }
        );
    }

    #[test]
    fn sqlstates_that_retry() {
        for (code, reason) in [
            ("40001", "serialization_failure"),
            ("40P01", "deadlock"),
            ("55P03", "lock_timeout"),
            ("57014", "statement_timeout"),
            ("57P01", "server_shutdown"),
            ("08006", "connection"),
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
