//! The rows of a segment as the column arrays its set-based statements take
//! (`unnest`), with each statement's parameter list: shared by the segment
//! (`set_based`) and the transaction sent whole (`whole`).

use chrono::{DateTime, Utc};
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use super::context::OrderInput;
use super::steps::reservation_expires_at;
use crate::domain::message::OrderCreateMessage;
use crate::store::inbox::payload_hash;
use crate::store::StoreError;

/// A statement parameter of a `'static` type (the alias implies `+ 'static`); lists
/// holding borrowed values (the messages' `&str` columns, slices of the ledger rows)
/// are spelled `dyn ToSql + Sync`.
pub(super) type Param = dyn ToSql + Sync;

/// The inbox rows of a segment's messages, as the columns of `insert_inbox!`.
pub(super) struct InboxRows<'a> {
    pub(super) message_ids: Vec<Uuid>,
    pub(super) topics: Vec<&'a str>,
    pub(super) reservation_ids: Vec<Uuid>,
    pub(super) hashes: Vec<Vec<u8>>,
    pub(super) order_ids: Vec<i64>,
}

impl<'a> InboxRows<'a> {
    pub(super) fn of(inputs: &[OrderInput<'a>]) -> Self {
        Self {
            message_ids: inputs.iter().map(|i| i.msg.message_id).collect(),
            topics: inputs.iter().map(|i| i.topic).collect(),
            reservation_ids: inputs.iter().map(|i| i.msg.reservation_id).collect(),
            hashes: inputs.iter().map(|i| payload_hash(i.msg)).collect(),
            order_ids: inputs.iter().map(|i| i.msg.order_id).collect(),
        }
    }

    pub(super) fn params<'p>(&'p self, consumer_group: &'p String) -> [&'p (dyn ToSql + Sync); 6] {
        [
            consumer_group,
            &self.message_ids,
            &self.topics,
            &self.reservation_ids,
            &self.hashes,
            &self.order_ids,
        ]
    }
}

/// Reservation rows for messages, as the columns of `INSERT_RESERVATIONS`,
/// `INSERT_ORDERED_RESERVATIONS` and `INSERT_REJECTED_RESERVATIONS`.
pub(super) struct ReservationRows {
    pub(super) reservation_ids: Vec<Uuid>,
    pub(super) request_ids: Vec<Uuid>,
    pub(super) message_ids: Vec<Uuid>,
    pub(super) users: Vec<i64>,
    pub(super) reserved_at: Vec<DateTime<Utc>>,
    pub(super) expires: Vec<DateTime<Utc>>,
}

impl ReservationRows {
    /// Fails if a message's reservation has no valid expiry.
    pub(super) fn of(msgs: &[&OrderCreateMessage]) -> Result<Self, StoreError> {
        Ok(Self {
            reservation_ids: msgs.iter().map(|m| m.reservation_id).collect(),
            request_ids: msgs.iter().map(|m| m.request_id).collect(),
            message_ids: msgs.iter().map(|m| m.message_id).collect(),
            users: msgs.iter().map(|m| m.user_id).collect(),
            reserved_at: msgs.iter().map(|m| m.reserved_at).collect(),
            expires: msgs
                .iter()
                .map(|m| reservation_expires_at(m))
                .collect::<Result<_, _>>()?,
        })
    }

    /// `INSERT_RESERVATIONS`' parameters.
    pub(super) fn params<'p>(&'p self, bucket: &'p OrderCreateMessage) -> [&'p Param; 9] {
        [
            &bucket.activity_id,
            &bucket.sku_id,
            &bucket.inventory_bucket,
            &self.reservation_ids,
            &self.request_ids,
            &self.message_ids,
            &self.users,
            &self.reserved_at,
            &self.expires,
        ]
    }

    /// `INSERT_ORDERED_RESERVATIONS`' parameters: those of `params`, then the
    /// ORDERED status code and the messages' orders.
    pub(super) fn ordered_params<'p>(
        &'p self,
        bucket: &'p OrderCreateMessage,
        ordered: &'p i16,
        order_ids: &'p Vec<i64>,
    ) -> [&'p Param; 11] {
        let [a, b, c, d, e, f, g, h, i] = self.params(bucket);
        [a, b, c, d, e, f, g, h, i, ordered, order_ids]
    }

    /// `INSERT_REJECTED_RESERVATIONS`' parameters: those of `params`, then the
    /// REJECTED status code and the failure code.
    pub(super) fn rejected_params<'p>(
        &'p self,
        bucket: &'p OrderCreateMessage,
        rejected: &'p i16,
        failure: &'p &str,
    ) -> [&'p (dyn ToSql + Sync); 11] {
        let [a, b, c, d, e, f, g, h, i] = self.params(bucket);
        [a, b, c, d, e, f, g, h, i, rejected, failure]
    }
}

/// Order rows for messages, as the columns of `INSERT_ORDERS` and `INSERT_NEW_ORDERS`.
pub(super) struct OrderRows<'m> {
    pub(super) order_ids: Vec<i64>,
    pub(super) order_nos: Vec<&'m str>,
    pub(super) request_ids: Vec<Uuid>,
    pub(super) reservation_ids: Vec<Uuid>,
    pub(super) message_ids: Vec<Uuid>,
    pub(super) users: Vec<i64>,
    pub(super) prices: Vec<i64>,
    pub(super) currencies: Vec<&'m str>,
    pub(super) expire_at: Vec<DateTime<Utc>>,
}

impl<'m> OrderRows<'m> {
    pub(super) fn of(msgs: &[&'m OrderCreateMessage]) -> Self {
        Self {
            order_ids: msgs.iter().map(|m| m.order_id).collect(),
            order_nos: msgs.iter().map(|m| m.order_no.as_str()).collect(),
            request_ids: msgs.iter().map(|m| m.request_id).collect(),
            reservation_ids: msgs.iter().map(|m| m.reservation_id).collect(),
            message_ids: msgs.iter().map(|m| m.message_id).collect(),
            users: msgs.iter().map(|m| m.user_id).collect(),
            prices: msgs.iter().map(|m| m.unit_price).collect(),
            currencies: msgs.iter().map(|m| m.currency.as_str()).collect(),
            expire_at: msgs.iter().map(|m| m.order_expire_at).collect(),
        }
    }

    pub(super) fn params<'p>(
        &'p self,
        bucket: &'p OrderCreateMessage,
    ) -> [&'p (dyn ToSql + Sync); 12] {
        [
            &bucket.activity_id,
            &bucket.sku_id,
            &bucket.inventory_bucket,
            &self.order_ids,
            &self.order_nos,
            &self.request_ids,
            &self.reservation_ids,
            &self.message_ids,
            &self.users,
            &self.prices,
            &self.currencies,
            &self.expire_at,
        ]
    }
}

/// The ledger rows of a segment's eligible orders, in arrival order; the first
/// `units` of them are written by the UPDATE that takes `units`.
pub(super) struct LedgerRows {
    pub(super) ledger_ids: Vec<i64>,
    pub(super) reservations: Vec<Uuid>,
    pub(super) order_ids: Vec<i64>,
    pub(super) message_ids: Vec<Uuid>,
    pub(super) users: Vec<i64>,
}

impl LedgerRows {
    pub(super) fn of(inputs: &[OrderInput<'_>], eligible: &[usize]) -> Self {
        let msgs = || eligible.iter().map(|&i| inputs[i].msg);
        Self {
            ledger_ids: eligible.iter().map(|&i| inputs[i].ledger_id).collect(),
            reservations: msgs().map(|m| m.reservation_id).collect(),
            order_ids: msgs().map(|m| m.order_id).collect(),
            message_ids: msgs().map(|m| m.message_id).collect(),
            users: msgs().map(|m| m.user_id).collect(),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.ledger_ids.len()
    }
}
