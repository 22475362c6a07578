//! Who may use the operator API: the bearer token (`admin.token`, or
//! `admin.metrics_token` for the figures), compared in constant time; the
//! operator's name for the audit line; refusals, logged at most once a second.

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use secrecy::{ExposeSecret, SecretString};
use sha2::{Digest, Sha256};

/// Who may pass: `admin.token` (the API answers 404 while it is unset), and the
/// refusals' log.
pub struct Gate {
    pub token: Option<SecretString>,
    /// Refused requests, logged at most once a second.
    pub refusals: RefusalLog,
}

/// Every refusal and failure of the operator API: what was wrong, for a person.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct AdminError {
    pub error: String,
}

/// `builder`'s answer with `{"error": why}`.
pub(crate) fn admin_error(
    mut builder: actix_web::HttpResponseBuilder,
    why: impl Into<String>,
) -> HttpResponse {
    builder.json(AdminError { error: why.into() })
}

/// Refused admin requests as log lines: at most one a second, saying how many were
/// refused since the last one, so a probe with a wrong token (thousands of requests)
/// is a handful of lines, not thousands.
#[derive(Debug, Default)]
pub struct RefusalLog {
    state: std::sync::Mutex<RefusalState>,
}

#[derive(Debug, Default)]
struct RefusalState {
    logged_at: Option<std::time::Instant>,
    unlogged: u64,
}

impl RefusalLog {
    const EVERY: std::time::Duration = std::time::Duration::from_secs(1);

    /// Counts one refusal at `now`; the count to log now (this one and those not
    /// logged before it), or `None` within a second of the last line.
    fn note(&self, now: std::time::Instant) -> Option<u64> {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        state.unlogged += 1;
        if state
            .logged_at
            .is_some_and(|at| now.saturating_duration_since(at) < Self::EVERY)
        {
            return None;
        }
        state.logged_at = Some(now);
        Some(std::mem::take(&mut state.unlogged))
    }
}

/// Who is acting, for the log line.
pub(super) struct Operator {
    pub(super) name: String,
    pub(super) peer: String,
}

/// Why a request was refused.
#[derive(Debug)]
enum Refused {
    Off,
    BadToken,
}

impl Refused {
    fn response(&self) -> HttpResponse {
        match self {
            Refused::Off => admin_error(
                HttpResponse::NotFound(),
                "the admin API is off: set admin.token to enable it",
            ),
            Refused::BadToken => admin_error(
                HttpResponse::Unauthorized()
                    .insert_header((header::WWW_AUTHENTICATE, "Bearer"))
                    .take(),
                "missing or wrong bearer token",
            ),
        }
    }
}

/// Checks the bearer token.
fn authorize(req: &HttpRequest, ops: &Gate) -> Result<Operator, Refused> {
    let Some(token) = &ops.token else {
        return Err(Refused::Off);
    };
    if !bearer_is(req, token) {
        if let Some(refused) = ops.refusals.note(std::time::Instant::now()) {
            tracing::warn!(peer = ?req.peer_addr(), path = req.path(), refused, "admin requests refused: bad or missing token (the last one's peer and path)");
        }
        return Err(Refused::BadToken);
    }
    let name = req
        .headers()
        .get("x-seckill-operator")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.chars().filter(|c| !c.is_control()).take(64).collect())
        .unwrap_or_else(|| "unnamed".to_owned());
    let peer = req
        .peer_addr()
        .map_or_else(|| "unknown".to_owned(), |a| a.to_string());
    Ok(Operator { name, peer })
}

/// The operator, once the bearer token checked out: the first argument of every
/// handler. Actix extracts in order, so a request without the right token is
/// refused before its body is read.
pub(super) struct Authorized(pub(super) Operator);

impl actix_web::FromRequest for Authorized {
    type Error = RefusedError;
    type Future = std::future::Ready<Result<Self, Self::Error>>;

    fn from_request(req: &HttpRequest, _: &mut actix_web::dev::Payload) -> Self::Future {
        let checked = match req.app_data::<web::Data<Gate>>() {
            Some(ops) => authorize(req, ops),
            None => Err(Refused::Off),
        };
        std::future::ready(checked.map(Authorized).map_err(RefusedError))
    }
}

/// A refusal as an actix error, answered as `Refused::response`.
#[derive(Debug)]
pub(super) struct RefusedError(Refused);

impl std::fmt::Display for RefusedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.0 {
            Refused::Off => "the admin API is off",
            Refused::BadToken => "missing or wrong bearer token",
        })
    }
}

impl actix_web::ResponseError for RefusedError {
    fn error_response(&self) -> HttpResponse {
        self.0.response()
    }
}

/// Whether the request's `Authorization: Bearer` value is `token` (the admin API's,
/// or `/metrics`'s), compared in constant time.
pub(crate) fn bearer_is(req: &HttpRequest, token: &SecretString) -> bool {
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    constant_time_eq(presented, token.expose_secret())
}

/// Compares digests, so neither the content nor the length of the token leaks
/// through timing.
fn constant_time_eq(presented: &str, expected: &str) -> bool {
    let a = Sha256::digest(presented.as_bytes());
    let b = Sha256::digest(expected.as_bytes());
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

/// Logs and counts an operator action.
pub(super) fn audit(who: &Operator, action: &'static str, detail: &str) {
    metrics::counter!(crate::telemetry::names::ADMIN_ACTIONS_TOTAL, "action" => action)
        .increment(1);
    tracing::info!(operator = %who.name, peer = %who.peer, action, detail, "admin action");
}

#[cfg(test)]
mod tests {
    #[test]
    fn token_comparison() {
        assert!(super::constant_time_eq(
            "0123456789abcdef",
            "0123456789abcdef"
        ));
        assert!(!super::constant_time_eq(
            "0123456789abcdeF",
            "0123456789abcdef"
        ));
        assert!(!super::constant_time_eq("", "0123456789abcdef"));
        assert!(!super::constant_time_eq(
            "0123456789abcdef0",
            "0123456789abcdef"
        ));
    }
}
