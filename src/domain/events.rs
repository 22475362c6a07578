//! The payloads of the events the engine publishes on `{ns}.events` (through the
//! outbox, and the compensation worker's refund requests): one type each, so that
//! the JSON Schemas in docs/contracts/ (generated from these, `crate::contracts`)
//! are what is sent. Every event carries its type (`x-event-type`, the AMQP `type`)
//! and the major version of its payload (`x-schema-version`, `EVENT_SCHEMA_VERSION`)
//! as headers; a consumer dedups by `message_id` (the event id).

use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;
use uuid::Uuid;

/// The major version of the event payloads below (`x-schema-version`; the
/// `event_outbox.schema_version` column's default). A change an older consumer
/// would misread takes a new major version.
pub const EVENT_SCHEMA_VERSION: i32 = 1;

/// `order.created`: an order was created for a reservation (the §9 transaction).
#[derive(Debug, Serialize, ToSchema)]
pub struct OrderCreated<'m> {
    pub order_id: i64,
    pub order_no: &'m str,
    pub reservation_id: Uuid,
    pub request_id: Uuid,
    pub activity_id: i64,
    pub sku_id: i64,
    pub user_id: i64,
    pub inventory_bucket: i16,
    /// Minor units (cents, fen).
    pub unit_price: i64,
    /// Minor units.
    pub total_amount: i64,
    /// ISO 4217.
    pub currency: &'m str,
    /// Always `Created`.
    pub status: &'static str,
    /// When the order is cancelled unless paid.
    pub expire_at: DateTime<Utc>,
}

/// `order.paid`: a payment callback paid the order.
#[derive(Debug, Serialize, ToSchema)]
pub struct OrderPaid<'m> {
    pub order_id: i64,
    pub reservation_id: Uuid,
    pub user_id: i64,
    pub payment_id: Uuid,
    /// Minor units.
    pub amount: i64,
    pub currency: &'m str,
    pub paid_at: DateTime<Utc>,
}

/// `order.cancelled`: an unpaid order expired and was cancelled; its unit went back
/// to its bucket and is being given back in Redis.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct OrderCancelled {
    pub order_id: i64,
    pub reservation_id: Uuid,
    pub activity_id: i64,
    pub sku_id: i64,
    pub user_id: i64,
    pub inventory_bucket: i16,
    pub quantity: i16,
    /// Always `PAY_TIMEOUT`.
    pub reason: &'static str,
}

/// `inventory.release_requested`: a reservation was rejected (no order); its unit
/// is being given back in Redis.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct InventoryReleaseRequested {
    pub reservation_id: Uuid,
    pub request_id: Uuid,
    pub activity_id: i64,
    pub sku_id: i64,
    pub user_id: i64,
    pub inventory_bucket: i16,
    pub quantity: i16,
    /// The rejection's result code (`SOLD_OUT`, `DUPLICATE_USER`, ...).
    pub reason: &'static str,
}

/// `payment.refund_required` (the outbox, in the payment's transaction) and
/// `payment.refund_requested` (the compensation worker asking the payment system,
/// `message_id` = the task id): a payment must be refunded.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RefundRequired<'m> {
    pub order_id: i64,
    pub payment_id: Uuid,
    pub payment_request_id: Uuid,
    pub provider: &'m str,
    pub provider_trade_no: &'m str,
    /// Minor units.
    pub amount: i64,
    pub currency: &'m str,
    /// `DOUBLE_PAYMENT` or `PAID_AFTER_CANCEL`.
    pub reason: &'m str,
}
