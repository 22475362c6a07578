//! Status codes (seed §8.1): SMALLINT + CHECK in PostgreSQL, mirrored here. The
//! integration test `status_codes_match_check_constraints` reads the CHECK
//! constraints from `pg_constraint` and fails when the two disagree.

macro_rules! status_enum {
    ($(#[$meta:meta])* $name:ident : $constraint:literal { $($variant:ident = $code:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(i16)]
        pub enum $name { $($variant = $code),+ }

        impl $name {
            /// Every value, in code order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];
            /// The CHECK constraint in the schema that lists the legal codes.
            pub const CONSTRAINT: &'static str = $constraint;

            pub const fn code(self) -> i16 {
                self as i16
            }

            pub fn from_code(code: i16) -> Option<Self> {
                match code {
                    $($code => Some($name::$variant),)+
                    _ => None,
                }
            }

            pub const fn name(self) -> &'static str {
                match self {
                    $($name::$variant => stringify!($variant),)+
                }
            }
        }
    };
}

status_enum!(
    /// seckill_activity.status
    ActivityStatus: "ck_activity_status" {
        Draft = 0, Published = 10, Running = 20, Ended = 30, Cancelled = 40,
    }
);

status_enum!(
    /// seckill_sku.status
    SkuStatus: "ck_sku_status" {
        OnSale = 10, Paused = 20, SoldOut = 30, OffShelf = 40,
    }
);

status_enum!(
    /// orders.status (§8.1)
    OrderStatus: "ck_orders_status" {
        Created = 10, Paying = 20, Paid = 30, Cancelled = 40, Closed = 50, RefundPending = 60,
    }
);

status_enum!(
    /// inventory_reservation.status (§8.1)
    ReservationStatus: "ck_reservation_status" {
        PendingDb = 0, Ordered = 10, Rejected = 20, ReleasePending = 30, Released = 40,
        Expired = 50, ManualRequired = 60,
    }
);

status_enum!(
    /// event_outbox.status (§8.1)
    OutboxStatus: "ck_outbox_status" {
        Pending = 0, Sending = 10, Sent = 20, Retry = 30, Dead = 40,
    }
);

status_enum!(
    /// payment_record.status; SUCCEEDED requires paid_at (ck_payment_paid_at).
    PaymentStatus: "ck_payment_status" {
        Created = 0, Pending = 10, Succeeded = 20, Failed = 30, Closed = 40, Refunded = 50,
    }
);

status_enum!(
    /// compensation_task.status; RUNNING and the ready states (PENDING, RETRY) are the
    /// ones the seed's partial indexes select.
    CompensationStatus: "ck_compensation_status" {
        Pending = 0, Running = 10, Succeeded = 20, Retry = 30, Dead = 40, ManualRequired = 50,
    }
);

status_enum!(
    /// compensation_task.task_type
    CompensationType: "ck_compensation_type" {
        RedisStockRelease = 10, Refund = 20, ManualReview = 30, ReservationReconcile = 40,
    }
);

status_enum!(
    /// inventory_ledger.ledger_type
    LedgerType: "ck_ledger_type" {
        Allocate = 10, Release = 20, AdjustIn = 30, AdjustOut = 40,
    }
);

/// consumer_inbox.status: a row only exists once its transaction committed (§9.1).
pub const INBOX_PROCESSED: i16 = 20;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        for s in OrderStatus::ALL {
            assert_eq!(OrderStatus::from_code(s.code()), Some(*s));
        }
        for s in ReservationStatus::ALL {
            assert_eq!(ReservationStatus::from_code(s.code()), Some(*s));
        }
        assert_eq!(OrderStatus::from_code(11), None);
        assert_eq!(ReservationStatus::Ordered.name(), "Ordered");
    }
}
