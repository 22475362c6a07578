//! The operator API under `/admin` on the admin listener: pause and resume intake,
//! the outbox summary and its DEAD rows, the dead-letter queues and their replay, and
//! the compensation tasks that need a person.
//!
//! Off unless `admin.token` is set (every route answers 404 then). Requests carry
//! `Authorization: Bearer <token>`, compared in constant time; an optional
//! `X-Seckill-Operator` header names who acts. Every action is logged with who, from
//! where and what, and counted in `seckill_admin_actions_total{action}`.

use std::sync::Arc;

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use serde_json::json;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::config::AmqpSettings;
use crate::mq::dead_letters::{self, ReplayGuard, Selection};
use crate::status::IntakeStats;
use crate::status::Readiness;
use crate::store::ops as queries;
use crate::store::{Pool, StoreError};

/// What the operations act on.
pub struct Operations {
    pub token: Option<SecretString>,
    pub pool: Pool,
    pub amqp: AmqpSettings,
    pub readiness: Arc<Readiness>,
    pub intakes: Arc<IntakeStats>,
    /// `retention.inbox_secs`: a DLQ replay refuses older messages unless forced.
    pub inbox_window: std::time::Duration,
    /// Refused requests, logged at most once a second.
    pub refusals: RefusalLog,
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

/// Rows or messages listed per request unless `?limit=` says otherwise.
const DEFAULT_LIMIT: i64 = 100;
const MAX_LIMIT: i64 = 10_000;

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::scope("/admin")
            .route("/intake", web::get().to(intake_status))
            .route("/intake/pause", web::post().to(pause))
            .route("/intake/resume", web::post().to(resume))
            .route("/outbox", web::get().to(outbox_summary))
            .route("/outbox/dead", web::get().to(outbox_dead))
            .route("/outbox/dead/retry", web::post().to(outbox_retry))
            .route("/dlq", web::get().to(dlq_list))
            .route("/dlq/replay", web::post().to(dlq_replay))
            .route("/compensation/review", web::get().to(compensation_review))
            .route("/maintain", web::post().to(maintain))
            .route("/trace", web::get().to(traced))
            .route("/trace", web::post().to(trace)),
    );
}

/// Who is acting, for the log line.
struct Operator {
    name: String,
    peer: String,
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
            Refused::Off => HttpResponse::NotFound()
                .json(json!({"error": "the admin API is off: set admin.token to enable it"})),
            Refused::BadToken => HttpResponse::Unauthorized()
                .insert_header((header::WWW_AUTHENTICATE, "Bearer"))
                .json(json!({"error": "missing or wrong bearer token"})),
        }
    }
}

/// Checks the bearer token.
fn authorize(req: &HttpRequest, ops: &Operations) -> Result<Operator, Refused> {
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
struct Authorized(Operator);

impl actix_web::FromRequest for Authorized {
    type Error = RefusedError;
    type Future = std::future::Ready<Result<Self, Self::Error>>;

    fn from_request(req: &HttpRequest, _: &mut actix_web::dev::Payload) -> Self::Future {
        let checked = match req.app_data::<web::Data<Operations>>() {
            Some(ops) => authorize(req, ops),
            None => Err(Refused::Off),
        };
        std::future::ready(checked.map(Authorized).map_err(RefusedError))
    }
}

/// A refusal as an actix error, answered as `Refused::response`.
#[derive(Debug)]
struct RefusedError(Refused);

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

fn audit(who: &Operator, action: &'static str, detail: &str) {
    metrics::counter!(crate::telemetry::names::ADMIN_ACTIONS_TOTAL, "action" => action)
        .increment(1);
    tracing::info!(operator = %who.name, peer = %who.peer, action, detail, "admin action");
}

#[derive(Debug, Deserialize)]
struct Limit {
    limit: Option<i64>,
}

impl Limit {
    fn get(&self) -> i64 {
        self.limit.unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_LIMIT)
    }
}

fn store_error(e: StoreError) -> HttpResponse {
    HttpResponse::ServiceUnavailable().json(json!({"error": e.to_string()}))
}

/// `{key: rows}`, or 503 with the database error.
fn respond<T: serde::Serialize>(key: &str, result: Result<T, StoreError>) -> HttpResponse {
    match result {
        Ok(rows) => HttpResponse::Ok().json(json!({ key: rows })),
        Err(e) => store_error(e),
    }
}

fn mq_error(e: crate::mq::MqError) -> HttpResponse {
    HttpResponse::ServiceUnavailable().json(json!({"error": e.to_string()}))
}

async fn intake_status(Authorized(_who): Authorized, ops: web::Data<Operations>) -> HttpResponse {
    HttpResponse::Ok().json(json!({
        "paused": ops.readiness.is_paused(),
        "ready": ops.readiness.is_ready(),
        "consuming": ops.intakes.consuming(),
        "in_flight": ops.intakes.in_flight(),
    }))
}

async fn pause(Authorized(who): Authorized, ops: web::Data<Operations>) -> HttpResponse {
    let was = ops.readiness.set_paused(true);
    audit(
        &who,
        "intake_pause",
        if was { "already paused" } else { "paused" },
    );
    HttpResponse::Ok().json(json!({"paused": true, "was_paused": was}))
}

async fn resume(Authorized(who): Authorized, ops: web::Data<Operations>) -> HttpResponse {
    let was = ops.readiness.set_paused(false);
    audit(
        &who,
        "intake_resume",
        if was { "resumed" } else { "was not paused" },
    );
    HttpResponse::Ok().json(json!({"paused": false, "was_paused": was}))
}

async fn outbox_summary(Authorized(_who): Authorized, ops: web::Data<Operations>) -> HttpResponse {
    respond("statuses", queries::outbox_summary(&ops.pool).await)
}

async fn outbox_dead(
    Authorized(_who): Authorized,
    ops: web::Data<Operations>,
    limit: web::Query<Limit>,
) -> HttpResponse {
    respond("dead", queries::dead_events(&ops.pool, limit.get()).await)
}

/// `{"event_id": "..."}` for one row, `{"all": true}` for every DEAD row.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RetryRequest {
    event_id: Option<Uuid>,
    #[serde(default)]
    all: bool,
}

async fn outbox_retry(
    Authorized(who): Authorized,
    ops: web::Data<Operations>,
    body: web::Json<RetryRequest>,
) -> HttpResponse {
    let target = match (&body.event_id, body.all) {
        (Some(id), false) => Some(*id),
        (None, true) => None,
        _ => {
            return HttpResponse::BadRequest()
                .json(json!({"error": "give exactly one of event_id or \"all\": true"}))
        }
    };
    match queries::retry_dead_events(&ops.pool, target).await {
        Ok(moved) => {
            let detail = match target {
                Some(id) => format!("event {id}: {moved} row(s) moved to RETRY"),
                None => format!("all DEAD events: {moved} row(s) moved to RETRY"),
            };
            audit(&who, "outbox_retry", &detail);
            HttpResponse::Ok().json(json!({"retried": moved}))
        }
        Err(e) => store_error(e),
    }
}

async fn dlq_list(
    Authorized(_who): Authorized,
    ops: web::Data<Operations>,
    limit: web::Query<Limit>,
) -> HttpResponse {
    match dead_letters::list(&ops.amqp, limit.get() as usize).await {
        Ok(letters) => HttpResponse::Ok().json(json!({"messages": letters})),
        Err(e) => mq_error(e),
    }
}

/// `{"message_id": "..."}` for every copy of one message, `{"all": true}` for all.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplayRequest {
    message_id: Option<String>,
    #[serde(default)]
    all: bool,
    limit: Option<i64>,
    /// Replay even messages older than the inbox window.
    #[serde(default)]
    force: bool,
}

async fn dlq_replay(
    Authorized(who): Authorized,
    ops: web::Data<Operations>,
    body: web::Json<ReplayRequest>,
) -> HttpResponse {
    let selection = match (&body.message_id, body.all) {
        (Some(id), false) => Selection::MessageId(id.clone()),
        (None, true) => Selection::All,
        _ => {
            return HttpResponse::BadRequest()
                .json(json!({"error": "give exactly one of message_id or \"all\": true"}))
        }
    };
    let limit = Limit { limit: body.limit }.get() as usize;
    let guard = ReplayGuard {
        inbox_window: ops.inbox_window,
        force: body.force,
    };
    match dead_letters::replay(&ops.amqp, &selection, limit, guard).await {
        Ok(report) => {
            let detail = format!(
                "{selection:?} force={}: {} replayed, {} without origin, {} refused, {} left",
                body.force, report.replayed, report.without_origin, report.refused, report.left
            );
            audit(&who, "dlq_replay", &detail);
            HttpResponse::Ok().json(report)
        }
        Err(e) => mq_error(e),
    }
}

async fn compensation_review(
    Authorized(_who): Authorized,
    ops: web::Data<Operations>,
    limit: web::Query<Limit>,
) -> HttpResponse {
    respond(
        "tasks",
        queries::compensation_review(&ops.pool, limit.get()).await,
    )
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MaintainRequest {
    activity_id: i64,
    #[serde(default)]
    force: bool,
}

/// `POST /admin/maintain {"activity_id": A, "force": false}`: what `seckill-engine
/// maintain` does (`store::maintain`), answered with each table's figures.
async fn maintain(
    Authorized(who): Authorized,
    ops: web::Data<Operations>,
    body: web::Json<MaintainRequest>,
) -> HttpResponse {
    use crate::store::maintain::{sale_state, vacuum_hot_tables, SaleState};
    let Ok(conn) = ops.pool.get().await else {
        return HttpResponse::ServiceUnavailable().json(json!({"error": "no database connection"}));
    };
    match sale_state(&conn.client, body.activity_id).await {
        Ok(SaleState::Unknown) => {
            return HttpResponse::NotFound()
                .json(json!({"error": format!("no activity {}", body.activity_id)}))
        }
        Ok(SaleState::Live) if !body.force => {
            return HttpResponse::Conflict().json(json!({
                "error": "the sale is live (VACUUM would compete with its orders): close it first, or send \"force\": true"
            }))
        }
        Ok(_) => {}
        Err(e) => return store_error(e.into()),
    }
    match vacuum_hot_tables(&conn.client).await {
        Ok(tables) => {
            audit(&who, "maintain", &format!("activity {}", body.activity_id));
            HttpResponse::Ok().json(json!({
                "tables": tables.iter().map(|t| json!({
                    "table": t.table,
                    "dead_rows_before": t.dead_rows_before,
                    "dead_rows_after": t.dead_rows_after,
                    "bytes_before": t.bytes_before,
                    "bytes_after": t.bytes_after,
                })).collect::<Vec<_>>(),
            }))
        }
        Err(e) => store_error(e.into()),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TraceRequest {
    activity_id: i64,
    ttl_secs: u64,
}

/// The longest `POST /admin/trace` follows an activity.
const MAX_TRACE_SECS: u64 = 86_400;

/// `POST /admin/trace {"activity_id": A, "ttl_secs": 600}`: the order transactions of
/// activity A are logged at INFO for that long (`telemetry::trace`).
async fn trace(
    Authorized(who): Authorized,
    ops: web::Data<Operations>,
    body: web::Json<TraceRequest>,
) -> HttpResponse {
    if !(1..=MAX_TRACE_SECS).contains(&body.ttl_secs) {
        return HttpResponse::BadRequest()
            .json(json!({"error": format!("ttl_secs: must be between 1 and {MAX_TRACE_SECS}")}));
    }
    let ttl = std::time::Duration::from_secs(body.ttl_secs);
    let traced = ops.readiness.live().traced();
    if !traced.follow_for(body.activity_id, ttl) {
        return HttpResponse::Conflict().json(json!({
            "error": format!("{} activities are followed already", crate::telemetry::trace::MAX_TRACED)
        }));
    }
    audit(
        &who,
        "trace",
        &format!("activity {} for {} s", body.activity_id, body.ttl_secs),
    );
    traced_list(traced)
}

/// `GET /admin/trace`: the activities followed now and the seconds left for each.
async fn traced(Authorized(_who): Authorized, ops: web::Data<Operations>) -> HttpResponse {
    traced_list(ops.readiness.live().traced())
}

fn traced_list(traced: &crate::telemetry::trace::Traced) -> HttpResponse {
    let followed: Vec<_> = traced
        .followed_now()
        .into_iter()
        .map(|(activity, left)| json!({"activity_id": activity, "seconds_left": left}))
        .collect();
    HttpResponse::Ok().json(json!({ "followed": followed }))
}
