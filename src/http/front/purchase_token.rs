//! Purchase tokens at the door: `GET /v1/activities/{a}/skus/{s}/purchase-token`
//! issues one to a buyer during the sale (at most
//! `frontstage.purchase_token.max_per_user` per sale), and a reservation presents
//! it as `X-Purchase-Token`. The token format is `domain::purchase_token`'s.

use actix_web::{web, HttpRequest, HttpResponse};
use chrono::Utc;
use secrecy::{ExposeSecret, SecretString};

use super::answers::{no_such_sku, unavailable, Problem, ProblemStatus, PurchaseToken};
use super::buyer::Buyer;
use super::state::FrontStage;
use crate::domain::purchase_token::{self, InvalidToken, PurchaseClaims};
use crate::redis::commands;
use crate::redis::keys::SkuKeys;
use crate::redis::WorkerLink;

/// The purchase token a reservation presents.
pub(super) const PURCHASE_TOKEN: &str = "X-Purchase-Token";

/// A reservation's purchase token refused: the metric outcome and the reason.
pub(super) struct TokenRefused {
    outcome: &'static str,
    reason: String,
}

impl TokenRefused {
    /// 403 `PURCHASE_TOKEN_INVALID`, counted under its metric outcome.
    pub(super) fn respond(self) -> HttpResponse {
        metrics::counter!(crate::telemetry::names::PURCHASE_TOKENS_TOTAL, "outcome" => self.outcome)
            .increment(1);
        Problem::new(ProblemStatus::PurchaseTokenInvalid)
            .reason(self.reason)
            .answer(HttpResponse::Forbidden())
    }
}

/// A reservation's `X-Purchase-Token`: genuine, unexpired, this user's, this SKU's.
pub(super) fn check_purchase_token(
    secret: &SecretString,
    http: &HttpRequest,
    bound: (i64, i64, i64),
) -> Result<(), TokenRefused> {
    let Some(token) = http
        .headers()
        .get(PURCHASE_TOKEN)
        .and_then(|v| v.to_str().ok())
    else {
        return Err(TokenRefused {
            outcome: "missing",
            reason: format!("{PURCHASE_TOKEN} is required: fetch one from GET .../purchase-token during the sale"),
        });
    };
    purchase_token::verify(
        secret.expose_secret().as_bytes(),
        token,
        bound,
        Utc::now().timestamp_millis(),
    )
    .map(|_| ())
    .map_err(|e| {
        let outcome = match e {
            InvalidToken::Expired => "expired",
            InvalidToken::Mismatch => "mismatch",
            _ => "invalid",
        };
        TokenRefused {
            outcome,
            reason: e.to_string(),
        }
    })
}

/// `GET /v1/activities/{a}/skus/{s}/purchase-token`: a token for this buyer and SKU,
/// only during the sale and at most `frontstage.purchase_token.max_per_user` times.
#[utoipa::path(
    get,
    path = "/v1/activities/{activity_id}/skus/{sku_id}/purchase-token",
    tag = "buyer",
    params(
        ("activity_id" = i64, Path, minimum = 1, description = "The sale"),
        ("sku_id" = i64, Path, minimum = 1, description = "The SKU on sale"),
    ),
    responses(
        (status = 200, description = "A purchase token for this buyer and SKU", body = PurchaseToken),
        (status = 400, description = "A path parameter is not a positive integer (`INVALID_REQUEST`)", body = Problem),
        (status = 401, description = "No valid credentials (`UNAUTHORIZED`)", body = Problem,
            headers(("WWW-Authenticate" = String, description = "`Bearer`, RFC 6750"))),
        (status = 404, description = "No such activity and SKU, or purchase tokens are off (`NOT_FOUND`)", body = Problem),
        (status = 409, description = "`NOT_STARTED` (with `starts_at`) or `SALE_CLOSED`", body = Problem),
        (status = 429, description = "`RATE_LIMITED` (with `Retry-After`) or `TOO_MANY_TOKENS` (with `max_per_user`)", body = Problem,
            headers(("Retry-After" = u64, description = "Seconds to wait (`RATE_LIMITED`)"))),
        (status = 503, description = "Redis or PostgreSQL is unavailable for now (`UNAVAILABLE`)", body = Problem,
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
    ),
    security(("buyer" = []))
)]
pub(super) async fn purchase_token_for(
    Buyer(user_id): Buyer,
    front: web::Data<FrontStage>,
    worker: web::Data<WorkerLink>,
    path: web::Path<(i64, i64)>,
) -> HttpResponse {
    let (activity_id, sku_id) = path.into_inner();
    let Some(secret) = &front.purchase_secret else {
        return Problem::new(ProblemStatus::NotFound)
            .error("purchase tokens are not required here")
            .answer(HttpResponse::NotFound());
    };
    let sku = match front.skus.get((activity_id, sku_id)).await {
        Ok(Some(sku)) => sku,
        Ok(None) => return no_such_sku(),
        Err(e) => return unavailable(e.reason()),
    };
    let now = Utc::now();
    if now < sku.start_at {
        return Problem {
            starts_at: Some(sku.start_at),
            ..Problem::new(ProblemStatus::NotStarted)
        }
        .answer(HttpResponse::Conflict());
    }
    if now >= sku.end_at || sku.closed {
        return Problem::new(ProblemStatus::SaleClosed).answer(HttpResponse::Conflict());
    }
    let keys = SkuKeys::new(&front.key_prefix, activity_id, sku_id);
    let mut redis = worker.conn();
    let max_per_user = front.settings.purchase_token.max_per_user;
    match commands::count_purchase_token(&mut redis, &keys, user_id, sku.end_at.timestamp_millis())
        .await
    {
        Ok(n) if n > i64::from(max_per_user) => {
            return Problem {
                max_per_user: Some(max_per_user),
                ..Problem::new(ProblemStatus::TooManyTokens)
            }
            .answer(HttpResponse::TooManyRequests())
        }
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(error = %e, "Redis purchase-token count failed");
            return unavailable("reservation store unavailable");
        }
    }
    let ttl_ms = i64::try_from(front.settings.purchase_token.ttl_secs.saturating_mul(1000))
        .unwrap_or(i64::MAX);
    let expires_at_ms =
        (now.timestamp_millis().saturating_add(ttl_ms)).min(sku.end_at.timestamp_millis());
    let token = purchase_token::issue(
        secret.expose_secret().as_bytes(),
        &PurchaseClaims {
            user_id,
            activity_id,
            sku_id,
            expires_at_ms,
        },
    );
    metrics::counter!(crate::telemetry::names::PURCHASE_TOKENS_TOTAL, "outcome" => "issued")
        .increment(1);
    HttpResponse::Ok().json(PurchaseToken {
        token,
        expires_at: chrono::DateTime::<Utc>::from_timestamp_millis(expires_at_ms),
    })
}
