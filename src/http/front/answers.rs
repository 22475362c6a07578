//! The answers the front stage gives that more than one handler gives: the status
//! names and error bodies of the HTTP API (docs/DESIGN.md, "HTTP API").

use actix_web::http::header::RETRY_AFTER;
use actix_web::HttpResponse;
use serde_json::json;

use crate::redis::scripts::ReservationAnswer;

/// 503: a store is unavailable for now; `Retry-After` says when to try again (the
/// Redis connection reconnects within about a second, the broker's within the
/// publish timeout).
pub(super) fn unavailable(why: &str) -> HttpResponse {
    HttpResponse::ServiceUnavailable()
        .insert_header((RETRY_AFTER, "1"))
        .json(json!({"status": "UNAVAILABLE", "error": why}))
}

pub(super) fn bad_request(why: String) -> HttpResponse {
    HttpResponse::BadRequest().json(json!({"status": "INVALID_REQUEST", "error": why}))
}

pub(super) fn not_found() -> HttpResponse {
    HttpResponse::NotFound().json(json!({"status": "NOT_FOUND"}))
}

pub(super) fn no_such_sku() -> HttpResponse {
    HttpResponse::NotFound()
        .json(json!({"status": "NOT_FOUND", "error": "no such activity and sku"}))
}

/// 409 with one of the sale's states: `SALE_CLOSED`, `NOT_ACTIVE`, `SOLD_OUT`,
/// `ALREADY_RESERVED`.
pub(super) fn conflict(status: &'static str) -> HttpResponse {
    HttpResponse::Conflict().json(json!({"status": status}))
}

/// 202 `QUEUED`: the reservation's answer, the same for every retry of its request.
pub(super) fn accepted(answer: &ReservationAnswer) -> HttpResponse {
    HttpResponse::Accepted().json(json!({
        "reservation_id": answer.reservation_id,
        "order_id": answer.order_id,
        "order_no": answer.order_no,
        "inventory_bucket": answer.bucket,
        "status": "QUEUED",
    }))
}

/// `RefundPending` → `REFUND_PENDING`: the status names the API answers with.
pub(super) fn screaming_snake(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::screaming_snake;

    #[test]
    fn status_names_are_screaming_snake_case() {
        assert_eq!(screaming_snake("RefundPending"), "REFUND_PENDING");
        assert_eq!(screaming_snake("Created"), "CREATED");
    }
}
