//! Who a front-stage request speaks for, decided from the request head alone and
//! from memory: the per-address limit, then the credentials (`http::auth`), then,
//! for requests that spend stock or tokens, the buyer's own limit. As extractors
//! (like the operator API's `Authorized`), so every handler states what it needs in
//! its signature and a refused request never reaches the handler's body.

use std::future::{ready, Ready};

use actix_web::dev::Payload;
use actix_web::{web, FromRequest, HttpRequest, HttpResponse, ResponseError};

use super::answers::unavailable;
use super::state::FrontStage;
use crate::http::auth::{unauthorized, AuthError};
use crate::http::limits::{too_many, Limited};

/// A buyer about to spend something (a reservation, a purchase token): counted
/// against the address and the per-user limits.
pub(super) struct Buyer(pub i64);

/// A buyer reading their own reservations and orders: counted against the address
/// limit only.
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
            Refused::Limited(limited) => too_many(*limited),
            Refused::Unauthorized(e) => unauthorized(e),
            Refused::Unwired => unavailable("front stage not ready"),
        }
    }
}

/// The user `http` speaks for, once the address limit, the credentials and (for
/// `count_user`) the user's own limit let it through.
fn admit(http: &HttpRequest, count_user: bool) -> Result<i64, Refused> {
    let front = http
        .app_data::<web::Data<FrontStage>>()
        .ok_or(Refused::Unwired)?;
    front.limits.address(http).map_err(Refused::Limited)?;
    let user = front.auth.user(http).map_err(Refused::Unauthorized)?;
    if count_user {
        front.limits.user(user).map_err(Refused::Limited)?;
    }
    Ok(user)
}

impl FromRequest for Buyer {
    type Error = Refused;
    type Future = Ready<Result<Self, Refused>>;

    fn from_request(http: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(admit(http, true).map(Buyer))
    }
}

impl FromRequest for Reader {
    type Error = Refused;
    type Future = Ready<Result<Self, Refused>>;

    fn from_request(http: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(admit(http, false).map(Reader))
    }
}
