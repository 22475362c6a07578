//! The operator API under `/admin` on the admin listener: pause and resume intake,
//! the outbox summary and its DEAD rows, the dead-letter queues and their replay, and
//! the compensation tasks that need a person.
//!
//! Off unless `admin.token` is set (every route answers 404 then). Requests carry
//! `Authorization: Bearer <token>`, compared in constant time; an optional
//! `X-Seckill-Operator` header names who acts. Every action is logged with who, from
//! where and what, and counted in `seckill_admin_actions_total{action}`.

mod access;

use std::sync::Arc;

use actix_web::{web, HttpResponse};
use serde::Deserialize;
use serde_json::json;
use uuid::Uuid;

pub use access::Gate;
pub(crate) use access::{admin_error, bearer_is, AdminError};
use access::{audit, Authorized};

use crate::config::AmqpSettings;
use crate::mq::dead_letters::{self, ReplayGuard, Selection};
use crate::status::IntakeStats;
use crate::status::Readiness;
use crate::store::ops as queries;
use crate::store::{Pool, StoreError};

/// What the operations act on.
pub struct Operations {
    pub pool: Pool,
    pub amqp: AmqpSettings,
    pub readiness: Arc<Readiness>,
    pub intakes: Arc<IntakeStats>,
    /// `retention.inbox_secs`: a DLQ replay refuses older messages unless forced.
    pub inbox_window: std::time::Duration,
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

/// `{"paused": .., "was_paused": ..}`: intake's state after a pause or resume, and
/// before it.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct PauseAnswer {
    pub paused: bool,
    pub was_paused: bool,
}

/// What every operator route answers before its handler runs (`access`): the
/// responses each path's annotation lists once, by name.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)] // only described: `access::Refused` builds these answers
enum Refusals {
    /// Missing or wrong bearer token
    #[response(status = 401, headers(("WWW-Authenticate" = String, description = "`Bearer`")))]
    BadToken(AdminError),
    /// The admin API is off (`admin.token` unset)
    #[response(status = 404)]
    Off(AdminError),
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct Limit {
    /// Rows or messages to list, 1 to 10,000 (100 when not given; clamped).
    limit: Option<i64>,
}

impl Limit {
    fn get(&self) -> i64 {
        self.limit.unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_LIMIT)
    }
}

fn store_error(e: StoreError) -> HttpResponse {
    admin_error(HttpResponse::ServiceUnavailable(), e.to_string())
}

/// `{key: rows}`, or 503 with the database error.
fn respond<T: serde::Serialize>(key: &str, result: Result<T, StoreError>) -> HttpResponse {
    match result {
        Ok(rows) => HttpResponse::Ok().json(json!({ key: rows })),
        Err(e) => store_error(e),
    }
}

fn mq_error(e: crate::mq::MqError) -> HttpResponse {
    admin_error(HttpResponse::ServiceUnavailable(), e.to_string())
}

/// Whether intake is paused, ready and consuming, and what it holds in flight.
#[utoipa::path(
    get,
    path = "/admin/intake",
    tag = "operator",
    responses(
        (status = 200, description = "`paused`, `ready`, `consuming`, `in_flight`", body = Object),
        Refusals,
    ),
    security(("operator" = []))
)]
async fn intake_status(Authorized(_who): Authorized, ops: web::Data<Operations>) -> HttpResponse {
    HttpResponse::Ok().json(json!({
        "paused": ops.readiness.is_paused(),
        "ready": ops.readiness.is_ready(),
        "consuming": ops.intakes.consuming(),
        "in_flight": ops.intakes.in_flight(),
    }))
}

/// Pauses order intake: consumers stop taking messages; `/readyz` answers 503.
#[utoipa::path(
    post,
    path = "/admin/intake/pause",
    tag = "operator",
    responses(
        (status = 200, description = "Paused", body = PauseAnswer),
        Refusals,
    ),
    security(("operator" = []))
)]
async fn pause(Authorized(who): Authorized, ops: web::Data<Operations>) -> HttpResponse {
    let was = ops.readiness.set_paused(true);
    audit(
        &who,
        "intake_pause",
        if was { "already paused" } else { "paused" },
    );
    HttpResponse::Ok().json(PauseAnswer {
        paused: true,
        was_paused: was,
    })
}

/// Resumes order intake.
#[utoipa::path(
    post,
    path = "/admin/intake/resume",
    tag = "operator",
    responses(
        (status = 200, description = "Resumed", body = PauseAnswer),
        Refusals,
    ),
    security(("operator" = []))
)]
async fn resume(Authorized(who): Authorized, ops: web::Data<Operations>) -> HttpResponse {
    let was = ops.readiness.set_paused(false);
    audit(
        &who,
        "intake_resume",
        if was { "resumed" } else { "was not paused" },
    );
    HttpResponse::Ok().json(PauseAnswer {
        paused: false,
        was_paused: was,
    })
}

/// The outbox rows by status.
#[utoipa::path(
    get,
    path = "/admin/outbox",
    tag = "operator",
    responses(
        (status = 200, description = "`statuses`: rows and oldest age by status", body = Object),
        Refusals,
        (status = 503, description = "PostgreSQL is unavailable", body = AdminError),
    ),
    security(("operator" = []))
)]
async fn outbox_summary(Authorized(_who): Authorized, ops: web::Data<Operations>) -> HttpResponse {
    respond("statuses", queries::outbox_summary(&ops.pool).await)
}

/// The outbox events that ran out of attempts (DEAD).
#[utoipa::path(
    get,
    path = "/admin/outbox/dead",
    tag = "operator",
    params(Limit),
    responses(
        (status = 200, description = "`dead`: the DEAD rows", body = Object),
        Refusals,
        (status = 400, description = "The body or query is malformed", body = AdminError),
        (status = 503, description = "PostgreSQL is unavailable", body = AdminError),
    ),
    security(("operator" = []))
)]
async fn outbox_dead(
    Authorized(_who): Authorized,
    ops: web::Data<Operations>,
    limit: web::Query<Limit>,
) -> HttpResponse {
    respond("dead", queries::dead_events(&ops.pool, limit.get()).await)
}

/// `{"event_id": "..."}` for one row, `{"all": true}` for every DEAD row.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RetryRequest {
    event_id: Option<Uuid>,
    #[serde(default)]
    all: bool,
}

/// Moves one DEAD event, or all, back to RETRY.
#[utoipa::path(
    post,
    path = "/admin/outbox/dead/retry",
    tag = "operator",
    request_body(content = RetryRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "`retried`: rows moved", body = Object),
        Refusals,
        (status = 400, description = "The body or query is malformed", body = AdminError),
        (status = 503, description = "PostgreSQL is unavailable", body = AdminError),
    ),
    security(("operator" = []))
)]
async fn outbox_retry(
    Authorized(who): Authorized,
    ops: web::Data<Operations>,
    body: web::Json<RetryRequest>,
) -> HttpResponse {
    let target = match (&body.event_id, body.all) {
        (Some(id), false) => Some(*id),
        (None, true) => None,
        _ => {
            return admin_error(
                HttpResponse::BadRequest(),
                "give exactly one of event_id or \"all\": true",
            )
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

/// The messages on the dead-letter queues, with why each was dead-lettered.
#[utoipa::path(
    get,
    path = "/admin/dlq",
    tag = "operator",
    params(Limit),
    responses(
        (status = 200, description = "`messages`: the dead letters", body = Object),
        Refusals,
        (status = 400, description = "The body or query is malformed", body = AdminError),
        (status = 503, description = "The broker is unavailable", body = AdminError),
    ),
    security(("operator" = []))
)]
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
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ReplayRequest {
    message_id: Option<String>,
    #[serde(default)]
    all: bool,
    limit: Option<i64>,
    /// Replay even messages older than the inbox window.
    #[serde(default)]
    force: bool,
}

/// Replays dead letters to the queue they came from.
#[utoipa::path(
    post,
    path = "/admin/dlq/replay",
    tag = "operator",
    request_body(content = ReplayRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "`replayed`, `without_origin`, `refused`, `left`", body = Object),
        Refusals,
        (status = 400, description = "The body or query is malformed", body = AdminError),
        (status = 503, description = "The broker is unavailable", body = AdminError),
    ),
    security(("operator" = []))
)]
async fn dlq_replay(
    Authorized(who): Authorized,
    ops: web::Data<Operations>,
    body: web::Json<ReplayRequest>,
) -> HttpResponse {
    let selection = match (&body.message_id, body.all) {
        (Some(id), false) => Selection::MessageId(id.clone()),
        (None, true) => Selection::All,
        _ => {
            return admin_error(
                HttpResponse::BadRequest(),
                "give exactly one of message_id or \"all\": true",
            )
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

/// The compensation tasks that need a person.
#[utoipa::path(
    get,
    path = "/admin/compensation/review",
    tag = "operator",
    params(Limit),
    responses(
        (status = 200, description = "`tasks`: the tasks", body = Object),
        Refusals,
        (status = 400, description = "The body or query is malformed", body = AdminError),
        (status = 503, description = "PostgreSQL is unavailable", body = AdminError),
    ),
    security(("operator" = []))
)]
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

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct MaintainRequest {
    activity_id: i64,
    #[serde(default)]
    force: bool,
}

/// `POST /admin/maintain {"activity_id": A, "force": false}`: what `seckill-engine
/// maintain` does (`store::maintain`), answered with each table's figures.
#[utoipa::path(
    post,
    path = "/admin/maintain",
    tag = "operator",
    request_body(content = MaintainRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "`tables`: each table's dead rows and bytes before and after", body = Object),
        Refusals,
        (status = 400, description = "The body or query is malformed", body = AdminError),
        (status = 409, description = "The sale is live: close it first, or send `force: true`", body = AdminError),
        (status = 503, description = "PostgreSQL is unavailable", body = AdminError),
    ),
    security(("operator" = []))
)]
async fn maintain(
    Authorized(who): Authorized,
    ops: web::Data<Operations>,
    body: web::Json<MaintainRequest>,
) -> HttpResponse {
    use crate::store::maintain::{sale_state, vacuum_hot_tables, SaleState};
    let Ok(conn) = ops.pool.get().await else {
        return admin_error(HttpResponse::ServiceUnavailable(), "no database connection");
    };
    match sale_state(&conn.client, body.activity_id).await {
        Ok(SaleState::Unknown) => {
            return admin_error(HttpResponse::NotFound(), format!("no activity {}", body.activity_id))
        }
        Ok(SaleState::Live) if !body.force => {
            return admin_error(HttpResponse::Conflict(), "the sale is live (VACUUM would compete with its orders): close it first, or send \"force\": true")
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

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct TraceRequest {
    activity_id: i64,
    ttl_secs: u64,
}

/// The longest `POST /admin/trace` follows an activity.
const MAX_TRACE_SECS: u64 = 86_400;

/// `POST /admin/trace {"activity_id": A, "ttl_secs": 600}`: the order transactions of
/// activity A are logged at INFO for that long (`telemetry::trace`).
#[utoipa::path(
    post,
    path = "/admin/trace",
    tag = "operator",
    request_body(content = TraceRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "`followed`: the activities followed and the seconds left for each", body = Object),
        Refusals,
        (status = 400, description = "The body or query is malformed", body = AdminError),
        (status = 409, description = "As many activities as may be are followed already", body = AdminError),
    ),
    security(("operator" = []))
)]
async fn trace(
    Authorized(who): Authorized,
    ops: web::Data<Operations>,
    body: web::Json<TraceRequest>,
) -> HttpResponse {
    if !(1..=MAX_TRACE_SECS).contains(&body.ttl_secs) {
        return admin_error(
            HttpResponse::BadRequest(),
            format!("ttl_secs: must be between 1 and {MAX_TRACE_SECS}"),
        );
    }
    let ttl = std::time::Duration::from_secs(body.ttl_secs);
    let traced = ops.readiness.live().traced();
    if !traced.follow_for(body.activity_id, ttl) {
        return admin_error(
            HttpResponse::Conflict(),
            format!(
                "{} activities are followed already",
                crate::telemetry::trace::MAX_TRACED
            ),
        );
    }
    audit(
        &who,
        "trace",
        &format!("activity {} for {} s", body.activity_id, body.ttl_secs),
    );
    traced_list(traced)
}

/// `GET /admin/trace`: the activities followed now and the seconds left for each.
#[utoipa::path(
    get,
    path = "/admin/trace",
    tag = "operator",
    responses(
        (status = 200, description = "`followed`", body = Object),
        Refusals,
    ),
    security(("operator" = []))
)]
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

/// The operator API's part of the admin listener's OpenAPI document.
#[derive(utoipa::OpenApi)]
#[openapi(paths(
    intake_status,
    pause,
    resume,
    outbox_summary,
    outbox_dead,
    outbox_retry,
    dlq_list,
    dlq_replay,
    compensation_review,
    maintain,
    trace,
    traced
))]
pub(super) struct OperationsApi;
