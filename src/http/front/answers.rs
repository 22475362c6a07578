//! The answers of the front stage: the body types of the HTTP API and the statuses
//! and error bodies more than one handler gives (docs/DESIGN.md, "HTTP API"). Every
//! body is one of the types here, so the OpenAPI document generated from them
//! (`http::openapi`, docs/contracts/front.openapi.json) is what the handlers send.

use actix_web::http::header::RETRY_AFTER;
use actix_web::{HttpResponse, HttpResponseBuilder};
use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;
use uuid::Uuid;

use crate::domain::status::OrderStatus;
use crate::redis::scripts::ReservationAnswer;

/// What every refusal and failure says: a status a program can act on and, for a
/// person, what was wrong. Only the fields the status names are present.
#[derive(Debug, Serialize, ToSchema)]
pub struct Problem {
    pub status: ProblemStatus,
    /// What was wrong, for a person (400, 404, 503).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Why the credentials or the purchase token were refused (401, 403).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// `RATE_LIMITED`: which limit (`address`, `user`, `user_reads`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// `NOT_STARTED`: when the sale opens.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub starts_at: Option<DateTime<Utc>>,
    /// `TOO_MANY_TOKENS`: purchase tokens one buyer may fetch for one SKU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_per_user: Option<u32>,
    /// `UNAVAILABLE` after an unconfirmed publish: the reservation kept; retry the
    /// same `request_id` to learn its outcome.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reservation_id: Option<Uuid>,
}

/// The statuses of a refusal or failure.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ProblemStatus {
    /// 400: the request is malformed; 408/413: its body was too slow or too large.
    InvalidRequest,
    /// 401: no valid credentials.
    Unauthorized,
    /// 403: the purchase token is missing, expired, forged or for another SKU.
    PurchaseTokenInvalid,
    /// 404: no such resource, or not this buyer's.
    NotFound,
    /// 409: the sale has not opened yet (purchase tokens).
    NotStarted,
    /// 409: the sale has ended or was closed.
    SaleClosed,
    /// 409: outside the sale's window.
    NotActive,
    /// 409: no units left.
    SoldOut,
    /// 409: this buyer holds a reservation for this SKU already.
    AlreadyReserved,
    /// 429: over a rate limit; `Retry-After` says when to try again.
    RateLimited,
    /// 429: over the purchase tokens one buyer may fetch for one SKU.
    TooManyTokens,
    /// 503: a store is unavailable for now; `Retry-After` says when to try again.
    Unavailable,
}

impl Problem {
    pub fn new(status: ProblemStatus) -> Self {
        Self {
            status,
            error: None,
            reason: None,
            scope: None,
            starts_at: None,
            max_per_user: None,
            reservation_id: None,
        }
    }

    pub fn error(mut self, error: impl Into<String>) -> Self {
        self.error = Some(error.into());
        self
    }

    pub fn reason(mut self, reason: impl Into<String>) -> Self {
        self.reason = Some(reason.into());
        self
    }

    /// The answer, with `builder`'s status and headers.
    pub fn answer(self, mut builder: HttpResponseBuilder) -> HttpResponse {
        builder.json(self)
    }
}

/// 503: a store is unavailable for now; `Retry-After` says when to try again (the
/// Redis connection reconnects within about a second, the broker's within the
/// publish timeout).
pub(crate) fn unavailable(why: &str) -> HttpResponse {
    unavailable_with(Problem::new(ProblemStatus::Unavailable).error(why))
}

/// 503 with `problem`, and `Retry-After: 1`.
pub(super) fn unavailable_with(problem: Problem) -> HttpResponse {
    let mut builder = HttpResponse::ServiceUnavailable();
    builder.insert_header((RETRY_AFTER, "1"));
    problem.answer(builder)
}

pub(crate) fn bad_request(why: String) -> HttpResponse {
    Problem::new(ProblemStatus::InvalidRequest)
        .error(why)
        .answer(HttpResponse::BadRequest())
}

pub(crate) fn not_found() -> HttpResponse {
    Problem::new(ProblemStatus::NotFound).answer(HttpResponse::NotFound())
}

pub(super) fn no_such_sku() -> HttpResponse {
    Problem::new(ProblemStatus::NotFound)
        .error("no such activity and sku")
        .answer(HttpResponse::NotFound())
}

/// 409 with one of the sale's states: `SALE_CLOSED`, `NOT_ACTIVE`, `SOLD_OUT`,
/// `ALREADY_RESERVED`.
pub(super) fn conflict(status: ProblemStatus) -> HttpResponse {
    Problem::new(status).answer(HttpResponse::Conflict())
}

/// A reservation queued: the answer of `POST .../reservations`, the same for every
/// retry of its request.
#[derive(Debug, Serialize, ToSchema)]
pub struct Queued {
    pub reservation_id: Uuid,
    /// The order the engine will create for it (time-ordered, unique).
    pub order_id: i64,
    pub order_no: String,
    /// The inventory bucket the unit was taken from.
    pub inventory_bucket: i16,
    pub status: QueuedStatus,
}

/// Always `QUEUED`: the order message is on the queue.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum QueuedStatus {
    Queued,
}

/// 202 `QUEUED`: the reservation's answer, the same for every retry of its request.
pub(super) fn accepted(answer: &ReservationAnswer) -> HttpResponse {
    HttpResponse::Accepted().json(Queued {
        reservation_id: answer.reservation_id,
        order_id: answer.order_id,
        order_no: answer.order_no.clone(),
        inventory_bucket: answer.bucket,
        status: QueuedStatus::Queued,
    })
}

/// A purchase token: send it as `X-Purchase-Token` with the reservation.
#[derive(Debug, Serialize, ToSchema)]
pub struct PurchaseToken {
    pub token: String,
    /// When it stops being accepted: its lifetime, or the sale's end if sooner.
    pub expires_at: Option<DateTime<Utc>>,
}

/// A reservation as its buyer sees it.
#[derive(Debug, Serialize, ToSchema)]
pub struct Reservation {
    pub reservation_id: Uuid,
    pub status: ReservationState,
    /// `ORDERED` and `RELEASED`: the order made for it (a released one may have none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub order_id: Option<i64>,
    /// `ORDERED`: the order's number.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub order_no: Option<String>,
    /// `ORDERED`: when the order is cancelled unless paid.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expire_at: Option<DateTime<Utc>>,
    /// `REJECTED`: the engine's failure code.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl Reservation {
    pub fn new(reservation_id: Uuid, status: ReservationState) -> Self {
        Self {
            reservation_id,
            status,
            order_id: None,
            order_no: None,
            expire_at: None,
            reason: None,
        }
    }
}

/// Where a reservation stands: `QUEUED` (on the order queue, not yet in
/// PostgreSQL), `PENDING` (recorded, no order yet), `ORDERED`, `REJECTED` (no order
/// was made) or `RELEASED` (its unit given back).
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ReservationState {
    Queued,
    Pending,
    Ordered,
    Rejected,
    Released,
}

/// An order as its buyer sees it.
#[derive(Debug, Serialize, ToSchema)]
pub struct Order {
    pub order_id: i64,
    pub order_no: String,
    pub status: OrderState,
    pub activity_id: i64,
    pub sku_id: i64,
    pub user_id: i64,
    /// Minor units (cents, fen).
    pub total_amount: i64,
    pub currency: String,
    pub expire_at: DateTime<Utc>,
    pub paid_at: Option<DateTime<Utc>>,
    pub cancelled_at: Option<DateTime<Utc>>,
}

/// Where an order stands; `UNKNOWN` for a state this engine does not name (one a
/// newer engine wrote).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum OrderState {
    Created,
    Paying,
    Paid,
    Cancelled,
    Closed,
    RefundPending,
    Unknown,
}

impl OrderState {
    pub fn of(code: i16) -> Self {
        match OrderStatus::from_code(code) {
            Some(OrderStatus::Created) => Self::Created,
            Some(OrderStatus::Paying) => Self::Paying,
            Some(OrderStatus::Paid) => Self::Paid,
            Some(OrderStatus::Cancelled) => Self::Cancelled,
            Some(OrderStatus::Closed) => Self::Closed,
            Some(OrderStatus::RefundPending) => Self::RefundPending,
            None => Self::Unknown,
        }
    }
}

/// A page of the buyer's orders, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub struct OrderHistory {
    pub orders: Vec<Order>,
    /// Pass as `before` for the next page; null on the last page.
    pub next_before: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::OrderState;
    use crate::domain::status::OrderStatus;

    /// Every order status has its own name in the API, the same as the schema's.
    #[test]
    fn every_order_status_has_its_api_name() {
        for status in OrderStatus::ALL {
            let named = serde_json::to_value(OrderState::of(status.code())).unwrap();
            let mut want = String::new();
            for (i, c) in status.name().chars().enumerate() {
                if c.is_ascii_uppercase() && i > 0 {
                    want.push('_');
                }
                want.push(c.to_ascii_uppercase());
            }
            assert_eq!(named, serde_json::Value::String(want));
        }
        assert_eq!(
            serde_json::to_value(OrderState::of(-1)).unwrap(),
            serde_json::json!("UNKNOWN")
        );
    }
}
