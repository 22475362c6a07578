//! Who a front-stage request speaks for, decided from the request head alone and
//! from memory: the per-address limit, then the credentials (`http::auth`), then,
//! for requests that spend stock or tokens, the buyer's own limit. As extractors
//! (like the operator API's `Authorized`), so every handler states what it needs in
//! its signature and a refused request never reaches the handler's body.

use std::future::{ready, Ready};

use actix_web::dev::Payload;
use actix_web::http::header::{RETRY_AFTER, WWW_AUTHENTICATE};
use actix_web::{web, FromRequest, HttpRequest, HttpResponse, ResponseError};

use super::answers::{unavailable, Problem, ProblemStatus};
use super::state::FrontStage;
use crate::http::auth::{challenge, AuthError};
use crate::http::limits::{self, Limited};

/// A buyer about to spend something (a reservation, a purchase token): counted
/// against the address and the per-user limits.
pub(super) struct Buyer(pub i64);

/// A buyer reading their own reservations and orders: counted against the address
/// limit and the user's read limit (apart from what they spend).
pub(super) struct Reader(pub i64);

/// A request turned away before any store was asked.
#[derive(Debug)]
pub(super) enum Refused {
    Limited(Limited),
    Unauthorized(AuthError),
    /// The handler's state is missing: a wiring error, answered as unavailable.
    Unwired,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Limited(l) => write!(f, "over the {} limit", l.scope),
            Refused::Unauthorized(e) => write!(f, "{e}"),
            Refused::Unwired => f.write_str("front stage state missing"),
        }
    }
}

impl ResponseError for Refused {
    fn error_response(&self) -> HttpResponse {
        match self {
            // 429 with `Retry-After`, saying which limit.
            Refused::Limited(limited) => Problem {
                scope: Some(limited.scope.to_owned()),
                ..Problem::new(ProblemStatus::RateLimited)
            }
            .answer(
                HttpResponse::TooManyRequests()
                    .insert_header((RETRY_AFTER, limits::refused(*limited).to_string()))
                    .take(),
            ),
            // 401 with `WWW-Authenticate: Bearer` (RFC 6750), saying why.
            Refused::Unauthorized(e) => Problem::new(ProblemStatus::Unauthorized)
                .reason(e.to_string())
                .answer(
                    HttpResponse::Unauthorized()
                        .insert_header((WWW_AUTHENTICATE, challenge(e)))
                        .take(),
                ),
            Refused::Unwired => unavailable("front stage not ready"),
        }
    }
}

/// What a request counts against once its user is known.
#[derive(Clone, Copy)]
enum Counts {
    Spending,
    Reading,
}

/// The user `http` speaks for, once the address limit, the credentials and the
/// user's own limit (spending or reading) let it through.
fn admit(http: &HttpRequest, counts: Counts) -> Result<i64, Refused> {
    let front = http
        .app_data::<web::Data<FrontStage>>()
        .ok_or(Refused::Unwired)?;
    front.limits.address(http).map_err(Refused::Limited)?;
    let user = front.auth.user(http).map_err(Refused::Unauthorized)?;
    match counts {
        Counts::Spending => front.limits.user(user),
        Counts::Reading => front.limits.user_read(user),
    }
    .map_err(Refused::Limited)?;
    Ok(user)
}

impl FromRequest for Buyer {
    type Error = Refused;
    type Future = Ready<Result<Self, Refused>>;

    fn from_request(http: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(admit(http, Counts::Spending).map(Buyer))
    }
}

impl FromRequest for Reader {
    type Error = Refused;
    type Future = Ready<Result<Self, Refused>>;

    fn from_request(http: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(admit(http, Counts::Reading).map(Reader))
    }
}
