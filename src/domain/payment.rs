//! The `payment.callback` message: a payment provider's notice that an order was
//! paid. Decoding and validation; an invalid callback is dead-lettered with its reason.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::message::{json_reason_of, supported, version_one, PoisonReason, MAX_BODY_BYTES};

/// `payment.callback`: the payment system says a payment succeeded. Published to
/// `{ns}.payment.callback`; the same (provider, callback_id) is applied once however
/// often it is repeated. Ids must not be the nil UUID (a check beyond this schema).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PaymentCallback {
    /// The contract's major version (`message::SCHEMA_VERSION`); absent means 1.
    #[serde(default = "version_one")]
    #[schema(minimum = 1, maximum = 1)]
    pub schema_version: u16,
    pub payment_id: Uuid,
    pub payment_request_id: Uuid,
    #[schema(minimum = 1)]
    pub order_id: i64,
    #[schema(min_length = 1, max_length = 32)]
    pub provider: String,
    #[schema(min_length = 1, max_length = 128)]
    pub provider_trade_no: String,
    /// The provider's id of this callback: with `provider`, the inbox key.
    #[schema(min_length = 1, max_length = 128)]
    pub callback_id: String,
    /// Minor units.
    #[schema(minimum = 0)]
    pub amount: i64,
    /// ISO 4217.
    #[schema(pattern = "^[A-Z]{3}$")]
    pub currency: String,
    pub paid_at: DateTime<Utc>,
    /// The provider's original payload, kept for audits (never logged).
    #[serde(default)]
    pub raw: Option<serde_json::Value>,
}

/// Namespace of the inbox ids derived from (provider, callback_id).
const INBOX_NAMESPACE: Uuid = Uuid::from_u128(0x5ec6_1e00_9a7e_4c0b_8a11_ca11_bac6_0000);

impl PaymentCallback {
    pub fn decode(body: &[u8]) -> Result<Self, PoisonReason> {
        if body.len() > MAX_BODY_BYTES {
            return Err(PoisonReason::new(
                "too_large",
                format!("body is {} bytes, limit {MAX_BODY_BYTES}", body.len()),
            ));
        }
        let cb: Self = serde_json::from_slice(body).map_err(|e| json_reason_of(body, e))?;
        supported(cb.schema_version)?;
        cb.validate()?;
        Ok(cb)
    }

    pub fn validate(&self) -> Result<(), PoisonReason> {
        let invalid = |field: &str, why: &str| {
            Err(PoisonReason::new(
                "invalid_value",
                format!("{field}: {why}"),
            ))
        };
        if self.payment_id.is_nil() || self.payment_request_id.is_nil() {
            return invalid("payment_id", "ids must not be the nil UUID");
        }
        if self.order_id <= 0 {
            return invalid("order_id", "must be positive");
        }
        if self.provider.is_empty() || self.provider.len() > 32 {
            return invalid("provider", "must be 1-32 characters");
        }
        if self.provider_trade_no.is_empty() || self.provider_trade_no.len() > 128 {
            return invalid("provider_trade_no", "must be 1-128 characters");
        }
        if self.callback_id.is_empty() || self.callback_id.len() > 128 {
            return invalid("callback_id", "must be 1-128 characters");
        }
        if self.amount < 0 {
            return invalid("amount", "must not be negative");
        }
        if self.currency.len() != 3 || !self.currency.bytes().all(|b| b.is_ascii_uppercase()) {
            return invalid("currency", "must be three upper-case letters (ISO 4217)");
        }
        Ok(())
    }

    /// The inbox message id: the same callback (provider, callback_id) always maps to
    /// the same id, however often the provider or the broker repeats it.
    pub fn inbox_message_id(&self) -> Uuid {
        Uuid::new_v5(
            &INBOX_NAMESPACE,
            format!("{}:{}", self.provider, self.callback_id).as_bytes(),
        )
    }
}

/// The business result of a callback, stored in the inbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PaymentResult {
    /// This callback paid the order.
    Paid,
    /// The same payment was applied before.
    AlreadyPaid,
    /// The order was cancelled first: refund queued, stock not revived (§7.6).
    PaidAfterCancel,
    /// Another payment had paid the order already: refund queued.
    DoublePayment,
    /// No such order: manual review.
    UnknownOrder,
    /// Amount or currency differ from the order: manual review, order not paid.
    AmountMismatch,
    /// The order is in a state payments cannot change (closed, refunding): manual review.
    NotPayable,
}

impl PaymentResult {
    pub const ALL: &'static [PaymentResult] = &[
        PaymentResult::Paid,
        PaymentResult::AlreadyPaid,
        PaymentResult::PaidAfterCancel,
        PaymentResult::DoublePayment,
        PaymentResult::UnknownOrder,
        PaymentResult::AmountMismatch,
        PaymentResult::NotPayable,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            PaymentResult::Paid => "PAID",
            PaymentResult::AlreadyPaid => "ALREADY_PAID",
            PaymentResult::PaidAfterCancel => "PAID_AFTER_CANCEL",
            PaymentResult::DoublePayment => "DOUBLE_PAYMENT",
            PaymentResult::UnknownOrder => "UNKNOWN_ORDER",
            PaymentResult::AmountMismatch => "AMOUNT_MISMATCH",
            PaymentResult::NotPayable => "NOT_PAYABLE",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|r| r.as_str() == s)
    }

    pub const fn label(self) -> &'static str {
        match self {
            PaymentResult::Paid => "paid",
            PaymentResult::AlreadyPaid => "already_paid",
            PaymentResult::PaidAfterCancel => "paid_after_cancel",
            PaymentResult::DoublePayment => "double_payment",
            PaymentResult::UnknownOrder => "unknown_order",
            PaymentResult::AmountMismatch => "amount_mismatch",
            PaymentResult::NotPayable => "not_payable",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sample() -> serde_json::Value {
        json!({
            "payment_id": "0190f3b4-6b1e-7c3a-9f00-000000000011",
            "payment_request_id": "0190f3b4-6b1e-7c3a-9f00-000000000012",
            "order_id": 77, "provider": "alipay", "provider_trade_no": "T1",
            "callback_id": "C1", "amount": 1999, "currency": "CNY",
            "paid_at": "2026-11-30T10:00:00Z"
        })
    }

    #[test]
    fn decodes_and_derives_a_stable_inbox_id() {
        let a = PaymentCallback::decode(sample().to_string().as_bytes()).unwrap();
        let mut v = sample();
        v["raw"] = json!({"any": "thing"});
        let b = PaymentCallback::decode(v.to_string().as_bytes()).unwrap();
        assert_eq!(a.inbox_message_id(), b.inbox_message_id());
        let mut v = sample();
        v["callback_id"] = json!("C2");
        let c = PaymentCallback::decode(v.to_string().as_bytes()).unwrap();
        assert_ne!(a.inbox_message_id(), c.inbox_message_id());
    }

    #[test]
    fn rejects_bad_callbacks() {
        let mut v = sample();
        v["amount"] = json!(-1);
        assert_eq!(
            PaymentCallback::decode(v.to_string().as_bytes())
                .unwrap_err()
                .kind,
            "invalid_value"
        );
        let mut v = sample();
        v["tip"] = json!(1);
        assert_eq!(
            PaymentCallback::decode(v.to_string().as_bytes())
                .unwrap_err()
                .kind,
            "unknown_field"
        );
        for r in PaymentResult::ALL {
            assert_eq!(PaymentResult::parse(r.as_str()), Some(*r));
        }
    }
}
