//! What an order attempt can end in, and how each ending is acknowledged on the queue
//! (docs/DESIGN.md, "Failure handling").

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
    /// serialization, lock or statement timeout. Counts toward the message's retry
    /// budget (`amqp.max_retries`). `reason` is a small fixed label.
    Transient(&'static str),
    /// Nothing was committed because the database (or this engine) could not take
    /// the work at all: no pooled connection, no writable primary (25006), a lost
    /// connection (class 08), a server shutting down (57P01–57P03), the engine
    /// stopping. Says nothing about the message, so it never counts toward the
    /// retry budget: while the database is the problem the message waits in the
    /// broker, for as long as that takes (docs/DESIGN.md, "Failure handling").
    Unavailable(&'static str),
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
            ErrorClass::Transient(_) | ErrorClass::Unavailable(_) => "rolled_back_transient",
            ErrorClass::CommitOutcomeUnknown => "unknown",
            ErrorClass::Fatal(_) => "rolled_back_fatal",
        }
    }
}

/// What the intake does with the delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Disposition {
    /// The effect (or its recorded rejection) is committed.
    Ack,
    /// Send to the delayed-retry queue, counting one retry of the message's budget;
    /// nothing is acked before a commit.
    Retry { reason: &'static str },
    /// Send to the delayed-retry queue without counting a retry: the failure was
    /// the database's or the engine's, not the message's (`ErrorClass::Unavailable`,
    /// `ErrorClass::CommitOutcomeUnknown`).
    Wait { reason: &'static str },
    /// Send to the dead-letter queue with the reason.
    DeadLetter { reason: String },
}

pub fn disposition<T>(result: Result<&T, &ErrorClass>) -> Disposition {
    match result {
        Ok(_) => Disposition::Ack,
        Err(ErrorClass::Transient(reason)) => Disposition::Retry { reason },
        Err(ErrorClass::Unavailable(reason)) => Disposition::Wait { reason },
        Err(ErrorClass::CommitOutcomeUnknown) => Disposition::Wait {
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
            Disposition::Wait {
                reason: "commit_outcome_unknown"
            }
        );
    }

    #[test]
    fn unavailability_waits_without_spending_the_budget() {
        assert_eq!(
            disposition::<OrderOutcome>(Err(&ErrorClass::Unavailable("pool_timeout"))),
            Disposition::Wait {
                reason: "pool_timeout"
            }
        );
        assert_eq!(
            disposition::<OrderOutcome>(Err(&ErrorClass::Transient("deadlock"))),
            Disposition::Retry { reason: "deadlock" }
        );
    }
}
