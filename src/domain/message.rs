//! The `order.create` message (seed §9.11 `OrderCreateMessage`): decoding and
//! validation. A message that fails here is poison: it is dead-lettered with the
//! reason and never retried.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Largest accepted body; anything bigger is rejected before parsing.
pub const MAX_BODY_BYTES: usize = 16 * 1024;
/// The seed's `order_no VARCHAR(40)`.
pub const MAX_ORDER_NO_LEN: usize = 40;
/// `seckill_sku.inventory_bucket_count BETWEEN 1 AND 256`.
pub const MAX_BUCKET: i16 = 255;
/// The major version of the message contracts (`order.create`, `payment.callback`)
/// this engine reads and writes (`schema_version`). A change that an older engine
/// would misread takes a new major version, which older engines dead-letter as
/// `unsupported_version` rather than guess at (docs/DESIGN.md, "Message contracts").
pub const SCHEMA_VERSION: u16 = 1;

/// A message written before `schema_version` existed is version 1.
pub(crate) fn version_one() -> u16 {
    SCHEMA_VERSION
}

/// `order.create`: a reservation Redis made, for the engine to turn into an order
/// (the §9 transaction). Published by the front stage to `{ns}.order.create.{shard}`
/// with the message id as the AMQP `message_id`; ids must not be the nil UUID, and
/// `order_expire_at` is after `reserved_at` (checks beyond this schema).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OrderCreateMessage {
    /// The contract's major version (`SCHEMA_VERSION`); absent means 1.
    #[serde(default = "version_one")]
    #[schema(minimum = 1, maximum = 1)]
    pub schema_version: u16,
    /// The inbox key: one business effect per message id.
    pub message_id: Uuid,
    pub request_id: Uuid,
    pub reservation_id: Uuid,
    /// Time-ordered id chosen by the front stage.
    #[schema(minimum = 1)]
    pub order_id: i64,
    #[schema(min_length = 1, max_length = 40, pattern = r"\S")]
    pub order_no: String,
    #[schema(minimum = 1)]
    pub activity_id: i64,
    #[schema(minimum = 1)]
    pub sku_id: i64,
    #[schema(minimum = 1)]
    pub user_id: i64,
    /// The bucket the Redis reservation decremented; never changed later (§6.3).
    #[schema(minimum = 0, maximum = 255)]
    pub inventory_bucket: i16,
    /// Minor units (cents, fen).
    #[schema(minimum = 0)]
    pub unit_price: i64,
    /// ISO 4217.
    #[schema(pattern = "^[A-Z]{3}$")]
    pub currency: String,
    pub reserved_at: DateTime<Utc>,
    #[schema(minimum = 1)]
    pub reservation_ttl_ms: i64,
    pub order_expire_at: DateTime<Utc>,
}

/// Why a message is poison. `kind` is a small fixed set (a metric label); `detail`
/// is for the dead-letter header and the log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind}: {detail}")]
pub struct PoisonReason {
    pub kind: &'static str,
    pub detail: String,
}

impl PoisonReason {
    pub fn new(kind: &'static str, detail: impl Into<String>) -> Self {
        Self {
            kind,
            detail: detail.into(),
        }
    }
}

impl OrderCreateMessage {
    /// A message for a reservation made just now, with fresh ids and a unit price of
    /// 99.00 CNY: what the load generators (`bench`, the fault suite) send.
    pub fn pre_reserved(
        order_id: i64,
        (activity_id, sku_id, user_id): (i64, i64, i64),
        inventory_bucket: i16,
        now: DateTime<Utc>,
        order_expire_at: DateTime<Utc>,
    ) -> Self {
        Self {
            schema_version: SCHEMA_VERSION,
            message_id: Uuid::now_v7(),
            request_id: Uuid::now_v7(),
            reservation_id: Uuid::now_v7(),
            order_id,
            order_no: crate::domain::ids::order_no(order_id),
            activity_id,
            sku_id,
            user_id,
            inventory_bucket,
            unit_price: 9_900,
            currency: "CNY".into(),
            reserved_at: now,
            reservation_ttl_ms: 600_000,
            order_expire_at,
        }
    }

    /// Decodes and validates a body.
    pub fn decode(body: &[u8]) -> Result<Self, PoisonReason> {
        if body.len() > MAX_BODY_BYTES {
            return Err(PoisonReason::new(
                "too_large",
                format!("body is {} bytes, limit {MAX_BODY_BYTES}", body.len()),
            ));
        }
        let msg: Self = serde_json::from_slice(body).map_err(|e| json_reason_of(body, e))?;
        supported(msg.schema_version)?;
        msg.validate()?;
        Ok(msg)
    }

    pub fn validate(&self) -> Result<(), PoisonReason> {
        let invalid = |field: &str, why: &str| {
            Err(PoisonReason::new(
                "invalid_value",
                format!("{field}: {why}"),
            ))
        };
        for (field, id) in [
            ("message_id", self.message_id),
            ("request_id", self.request_id),
            ("reservation_id", self.reservation_id),
        ] {
            if id.is_nil() {
                return invalid(field, "must not be the nil UUID");
            }
        }
        for (field, id) in [
            ("order_id", self.order_id),
            ("activity_id", self.activity_id),
            ("sku_id", self.sku_id),
            ("user_id", self.user_id),
        ] {
            if id <= 0 {
                return invalid(field, "must be positive");
            }
        }
        if self.order_no.trim().is_empty() || self.order_no.len() > MAX_ORDER_NO_LEN {
            return invalid("order_no", "must be 1-40 characters");
        }
        if !(0..=MAX_BUCKET).contains(&self.inventory_bucket) {
            return invalid("inventory_bucket", "must be between 0 and 255");
        }
        if self.unit_price < 0 {
            return invalid("unit_price", "must not be negative");
        }
        if self.currency.len() != 3 || !self.currency.bytes().all(|b| b.is_ascii_uppercase()) {
            return invalid("currency", "must be three upper-case letters (ISO 4217)");
        }
        if self.reservation_ttl_ms <= 0 {
            return invalid("reservation_ttl_ms", "must be positive");
        }
        if self.reservation_expires_at().is_none() {
            return invalid("reservation_ttl_ms", "is out of range");
        }
        if self.order_expire_at <= self.reserved_at {
            return invalid("order_expire_at", "must be after reserved_at");
        }
        Ok(())
    }

    /// `reserved_at + reservation_ttl`, the reservation's `expires_at`.
    pub fn reservation_expires_at(&self) -> Option<DateTime<Utc>> {
        self.reserved_at
            .checked_add_signed(chrono::TimeDelta::try_milliseconds(
                self.reservation_ttl_ms,
            )?)
    }
}

/// Refuses a major version this engine does not know.
pub(crate) fn supported(version: u16) -> Result<(), PoisonReason> {
    if version == SCHEMA_VERSION {
        return Ok(());
    }
    Err(PoisonReason::new(
        "unsupported_version",
        format!("schema_version {version}: this engine reads version {SCHEMA_VERSION}"),
    ))
}

/// Why a body did not decode: a major version this engine does not know (whose
/// fields it could not be expected to read) when the body names one, else the
/// JSON error's kind. Read only after the one full parse failed.
pub(crate) fn json_reason_of(body: &[u8], e: serde_json::Error) -> PoisonReason {
    #[derive(Deserialize)]
    struct Version {
        schema_version: Option<u16>,
    }
    match serde_json::from_slice::<Version>(body) {
        Ok(Version {
            schema_version: Some(v),
        }) if v != SCHEMA_VERSION => supported(v).unwrap_err(),
        _ => json_reason(e),
    }
}

/// Classifies a JSON decoding error into a poison kind.
pub(crate) fn json_reason(e: serde_json::Error) -> PoisonReason {
    use serde_json::error::Category;
    let text = e.to_string();
    let kind = match e.classify() {
        Category::Io | Category::Syntax | Category::Eof => "malformed_json",
        Category::Data if text.starts_with("unknown field") => "unknown_field",
        Category::Data if text.starts_with("missing field") => "missing_field",
        Category::Data => "invalid_value",
    };
    PoisonReason::new(kind, text)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    pub fn sample() -> serde_json::Value {
        json!({
            "message_id": "0190f3b4-6b1e-7c3a-9f00-000000000001",
            "request_id": "0190f3b4-6b1e-7c3a-9f00-000000000002",
            "reservation_id": "0190f3b4-6b1e-7c3a-9f00-000000000003",
            "order_id": 4242,
            "order_no": "S4242",
            "activity_id": 1, "sku_id": 2, "user_id": 3,
            "inventory_bucket": 0,
            "unit_price": 999, "currency": "CNY",
            "reserved_at": "2026-11-30T10:00:00Z",
            "reservation_ttl_ms": 60000,
            "order_expire_at": "2026-11-30T10:15:00Z"
        })
    }

    fn kind_of(v: serde_json::Value) -> &'static str {
        OrderCreateMessage::decode(v.to_string().as_bytes())
            .unwrap_err()
            .kind
    }

    #[test]
    fn the_schema_version_is_written_defaults_to_1_and_an_unknown_major_is_poison() {
        let m = OrderCreateMessage::decode(sample().to_string().as_bytes()).unwrap();
        assert_eq!(m.schema_version, 1, "absent means 1");
        let written = serde_json::to_value(&m).unwrap();
        assert_eq!(written["schema_version"], 1);
        let mut v2 = sample();
        v2["schema_version"] = json!(2);
        assert_eq!(kind_of(v2.clone()), "unsupported_version");
        // A version 2 body with fields version 1 does not know is still refused for
        // its version, not for a field.
        v2["gift_wrap"] = json!(true);
        assert_eq!(kind_of(v2), "unsupported_version");
        let mut v1 = sample();
        v1["schema_version"] = json!(1);
        assert!(OrderCreateMessage::decode(v1.to_string().as_bytes()).is_ok());
    }

    #[test]
    fn valid_message_decodes() {
        let m = OrderCreateMessage::decode(sample().to_string().as_bytes()).unwrap();
        assert_eq!(m.order_id, 4242);
        assert_eq!(
            m.reservation_expires_at().unwrap().to_rfc3339(),
            "2026-11-30T10:01:00+00:00"
        );
    }

    #[test]
    fn poison_is_classified() {
        let mut v = sample();
        v["extra"] = json!(1);
        assert_eq!(kind_of(v), "unknown_field");
        let mut v = sample();
        v.as_object_mut().unwrap().remove("user_id");
        assert_eq!(kind_of(v), "missing_field");
        let mut v = sample();
        v["unit_price"] = json!(-1);
        assert_eq!(kind_of(v), "invalid_value");
        let mut v = sample();
        v["message_id"] = json!("not-a-uuid");
        assert_eq!(kind_of(v), "invalid_value");
        let mut v = sample();
        v["currency"] = json!("cny");
        assert_eq!(kind_of(v), "invalid_value");
        let mut v = sample();
        v["order_expire_at"] = json!("2026-11-30T09:00:00Z");
        assert_eq!(kind_of(v), "invalid_value");
        assert_eq!(
            OrderCreateMessage::decode(b"{not json").unwrap_err().kind,
            "malformed_json"
        );
        let big = vec![b' '; MAX_BODY_BYTES + 1];
        assert_eq!(
            OrderCreateMessage::decode(&big).unwrap_err().kind,
            "too_large"
        );
    }
}
