//! The admin listener (`admin.addr`): liveness, readiness and Prometheus metrics, the
//! live page of the sale and its `/status` (`super::live_page`), and the
//! token-guarded operator API (`super::operations`), kept apart from the front
//! stage so that probes, scrapes and operators never queue behind buyers.

use std::sync::Arc;

use actix_web::{web, App, HttpResponse, HttpServer};
use serde_json::json;

use super::openapi::SecuritySchemes;
use super::operations::{admin_error, AdminError, Gate, Operations};
use super::{HttpError, Running};
use crate::config::Settings;
use crate::status::IntakeStats;
use crate::status::Readiness;
use crate::store::Pool;

/// What the admin endpoints read: the engine's pool (the live page's figures) and
/// its shared state (readiness, the readiness monitor's findings, the live figures).
pub struct Admin {
    pool: Pool,
    intakes: Arc<IntakeStats>,
    readiness: Arc<Readiness>,
    /// The intakes this process runs: none without the engine role.
    expected_intakes: usize,
    /// `server.roles` as people read them (`/readyz`).
    roles: String,
    /// `admin.metrics_token`: `/metrics` answers 401 without it.
    metrics_token: Option<secrecy::SecretString>,
    /// Since when the intakes have been short of consumers with the database fine
    /// (ms since the Unix epoch): the live page's broker outage.
    broker_down_since: std::sync::Mutex<Option<i64>>,
}

pub async fn start(
    settings: &Settings,
    pool: Pool,
    intakes: Arc<IntakeStats>,
    readiness: Arc<Readiness>,
) -> Result<Running, HttpError> {
    let gate = web::Data::new(Gate {
        token: settings.admin.token.clone(),
        refusals: Default::default(),
    });
    let operations = web::Data::new(Operations {
        pool: pool.clone(),
        amqp: settings.amqp.clone(),
        readiness: readiness.clone(),
        intakes: intakes.clone(),
        inbox_window: settings.retention.inbox_window(),
    });
    let hosts = web::Data::new(AllowedHosts(settings.admin.allowed_hosts.clone()));
    let state = web::Data::new(Admin {
        pool,
        intakes,
        readiness,
        expected_intakes: match settings.server.engine() {
            true => settings.owned_shards().len() + 1,
            false => 0,
        },
        roles: settings.server.label(),
        metrics_token: settings.admin.metrics_token.clone(),
        broker_down_since: Default::default(),
    });
    crate::telemetry::metrics();
    let deadlines = super::Deadlines::new(&settings.frontstage.limits);
    let server = HttpServer::new(move || {
        App::new()
            .wrap(actix_web::middleware::from_fn(known_host))
            .wrap(security_headers())
            .app_data(state.clone())
            .app_data(hosts.clone())
            .app_data(operations.clone())
            .app_data(gate.clone())
            .app_data(
                web::JsonConfig::default()
                    .limit(4096)
                    .error_handler(|e, _| malformed(e.to_string())),
            )
            .app_data(web::QueryConfig::default().error_handler(|e, _| malformed(e.to_string())))
            .route("/livez", web::get().to(livez))
            .route("/readyz", web::get().to(readyz))
            .route("/", web::get().to(live_page))
            .route("/status", web::get().to(status))
            .route("/metrics", web::get().to(metrics))
            .route("/openapi.json", web::get().to(openapi_json))
            .configure(super::operations::routes)
            // An unknown path (or method) gets the listener's JSON error, not an
            // empty body.
            .default_service(web::to(|| async {
                admin_error(
                    HttpResponse::NotFound(),
                    "no such endpoint: see GET /openapi.json",
                )
            }))
    })
    .workers(1)
    .max_connections(super::ADMIN_MAX_CONNECTIONS)
    .client_request_timeout(deadlines.header_read)
    .keep_alive(deadlines.keep_alive)
    .client_disconnect_timeout(super::DISCONNECT_TIMEOUT)
    .disable_signals()
    .bind(&settings.admin.addr)
    .map_err(|source| super::bind_error(&settings.admin.addr, source))?;
    let addr = super::bound_addr(&server.addrs(), &settings.admin.addr)?;
    tracing::info!(%addr, "admin endpoints listening");
    Ok(Running {
        server: server.run(),
        addr,
    })
}

/// The admin listener's OpenAPI document (`http::openapi`): the probes, the live
/// page's data, the metrics and, merged in, the operator API.
#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "seckill-engine admin listener",
        description = "Probes, metrics, the live page and its data, and the operator API \
                       (off unless `admin.token` is set). Not for buyers: keep it off the \
                       public network. Every path answers 421 Misdirected Request when the \
                       request's Host is not an IP address, localhost or one of \
                       `admin.allowed_hosts` (DNS rebinding)."
    ),
    paths(livez, readyz, live_page, status, metrics, openapi_json),
    modifiers(&SecuritySchemes),
    tags(
        (name = "probes", description = "Liveness, readiness, metrics and the live page"),
        (name = "operator", description = "Pause and resume intake, the outbox, dead letters, maintenance")
    )
)]
pub struct AdminApi;

/// The document as served and committed (docs/contracts/admin.openapi.json).
pub fn openapi_document() -> String {
    let mut document = <AdminApi as utoipa::OpenApi>::openapi();
    document.merge(<super::operations::OperationsApi as utoipa::OpenApi>::openapi());
    super::openapi::render(&document)
}

/// This listener's OpenAPI document.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "probes",
    responses((status = 200, description = "This document", content_type = "application/json"))
)]
async fn openapi_json() -> HttpResponse {
    static DOCUMENT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    super::openapi::answer(DOCUMENT.get_or_init(openapi_document))
}

/// A body or query that does not parse: 400 `{"error": ..}`, like every other
/// refusal of the operator API (actix's own answer is plain text).
fn malformed(why: String) -> actix_web::Error {
    let answer = admin_error(HttpResponse::BadRequest(), why.clone());
    actix_web::error::InternalError::from_response(why, answer).into()
}

/// `admin.allowed_hosts`.
struct AllowedHosts(Vec<String>);

/// Whether a request's `Host` is one the admin listener answers to: an IP address,
/// `localhost`, or a configured name. A DNS-rebinding page (its name re-pointed at
/// this address) makes the browser send its own name, and is refused, so it cannot
/// read `/status` or drive the operator API from an operator's browser.
fn host_allowed(host: &str, allowed: &[String]) -> bool {
    let name = match host.strip_prefix('[') {
        Some(v6) => {
            return v6
                .split(']')
                .next()
                .is_some_and(|ip| ip.parse::<std::net::Ipv6Addr>().is_ok())
        }
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    name.parse::<std::net::IpAddr>().is_ok()
        || name.eq_ignore_ascii_case("localhost")
        || allowed.iter().any(|a| a.eq_ignore_ascii_case(name))
}

/// Refuses, 421, a request whose `Host` is not one the listener answers to.
async fn known_host(
    req: actix_web::dev::ServiceRequest,
    next: actix_web::middleware::Next<impl actix_web::body::MessageBody + 'static>,
) -> Result<actix_web::dev::ServiceResponse<impl actix_web::body::MessageBody>, actix_web::Error> {
    let host = req
        .headers()
        .get(actix_web::http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    let allowed = req
        .app_data::<web::Data<AllowedHosts>>()
        .is_some_and(|a| host_allowed(host, &a.0));
    if !allowed {
        let refused = HttpResponse::MisdirectedRequest()
            .json(json!({"error": "unknown Host; list it in admin.allowed_hosts"}));
        return Ok(req.into_response(refused).map_into_right_body());
    }
    next.call(req).await.map(|res| res.map_into_left_body())
}

/// Headers on every admin answer: never framed (clickjacking the pause button), no
/// MIME sniffing, no referrer, and a policy that loads nothing; the live page sets a
/// policy of its own that runs its one script (`live_page`).
fn security_headers() -> actix_web::middleware::DefaultHeaders {
    use actix_web::http::header;
    actix_web::middleware::DefaultHeaders::new()
        .add((header::X_FRAME_OPTIONS, "DENY"))
        .add((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .add((header::REFERRER_POLICY, "no-referrer"))
        .add((
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
        ))
}

/// "ok": every check of `/readyz` that passed says so.
const OK: &str = "ok";

/// How old the readiness monitor's findings may be before `/readyz` stops trusting
/// them: the monitor runs every second and each of its checks takes 2 s at most, so
/// findings older than this mean the monitor itself is stuck or gone.
const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(10);

/// Every part that reports readiness, each "ok" or its reason; whether all are ok;
/// and the age of the monitor's findings. Reads shared state only, never a
/// dependency: it answers at once whatever they do.
fn readiness_checks(
    admin: &Admin,
) -> (
    bool,
    serde_json::Map<String, serde_json::Value>,
    Option<std::time::Duration>,
) {
    let mut checks = serde_json::Map::new();
    let found = admin.readiness.checks();
    let age = found.at.map(|at| at.elapsed());
    // The monitor's findings: it knows a stalled COMMIT or a missing standby,
    // which a fresh connection would not show.
    let verdict = |problem: Option<String>| match (problem, age) {
        (Some(problem), _) => problem,
        (None, None) => "not checked yet".to_owned(),
        (None, Some(age)) if age > STALE_AFTER => {
            format!("last checked {} s ago", age.as_secs())
        }
        (None, Some(_)) => OK.to_owned(),
    };
    checks.insert(
        "postgres".into(),
        json!(verdict(found.postgres.or(found.schema))),
    );
    let consuming = admin.intakes.consuming();
    let paused = admin.readiness.is_paused();
    // Without the engine role there is no intake: the broker is the front stage's
    // link, checked as its own.
    if admin.expected_intakes > 0 {
        let rabbitmq = if paused || consuming >= admin.expected_intakes {
            OK.to_owned()
        } else {
            format!(
                "{consuming} of {} intakes consuming",
                admin.expected_intakes
            )
        };
        checks.insert("rabbitmq".into(), json!(rabbitmq));
    }
    // Redis down is the front stage's problem (its own check, when one runs here),
    // not the engine's: orders keep being made, so it is shown, not counted.
    let redis = match found.redis {
        Some(why) => format!("degraded: {why} (intakes keep consuming; reservations wait)"),
        None => verdict(None),
    };
    checks.insert("redis".into(), json!(redis));
    own_checks(admin, paused, &mut checks);
    let ready = checks
        .iter()
        .filter(|(name, _)| name.as_str() != "redis")
        .all(|(_, v)| v == OK);
    (ready, checks, age)
}

/// The checks of this process's own state: the front stage's links, the pause and
/// the node id lease.
fn own_checks(
    admin: &Admin,
    paused: bool,
    checks: &mut serde_json::Map<String, serde_json::Value>,
) {
    // The front stage's own connections: its buyers get 503s while one is down,
    // whatever the engine's are doing.
    if let Some(front) = admin.readiness.frontstage_problem() {
        checks.insert(
            "frontstage".into(),
            json!(front.unwrap_or_else(|| OK.to_owned())),
        );
    }
    if admin.expected_intakes > 0 {
        checks.insert(
            "intake".into(),
            json!(if paused { "paused by an operator" } else { OK }),
        );
    }
    let node_id = admin.readiness.node_id();
    checks.insert(
        "node_id".into(),
        json!(if admin.readiness.may_mint() {
            OK.to_owned()
        } else {
            format!(
                "the lease on node id {} is not current: no ids are minted",
                node_id.unwrap_or_default()
            )
        }),
    );
}

/// The process runs and its runtime answers.
#[utoipa::path(
    get,
    path = "/livez",
    tag = "probes",
    responses((status = 200, description = "`{\"status\": \"ok\"}`", body = Object))
)]
async fn livez() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

/// One shape for every part that reports readiness:
/// `{"ready": bool, "role": "all"|"front"|"engine"|"admin", "node_id": N,
/// "active_shards": [..], "checked_ms_ago": N|null, "checks": {"postgres":
/// "ok"|reason, "rabbitmq": .. and "intake": .. (with the engine role), "redis": ..,
/// "frontstage": .. (with the front role: its own Redis and broker links),
/// "node_id": ..}}`. PostgreSQL and Redis are as the readiness monitor last found
/// them, `checked_ms_ago` before. 200 when every check is "ok", Redis excepted (it
/// reads "degraded: ..." while down: orders do not need it, and the front stage's
/// own check says when its buyers do); 503 otherwise (an operator pause included). Standing by for shards another instance is active on
/// is ready. `seckill_ready` is the monitor's to set, not this probe's.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "probes",
    responses(
        (status = 200, description = "Ready: every check `ok` (Redis may read `degraded: ..`)", body = Object),
        (status = 503, description = "Not ready: the same body, the failing checks with their reasons", body = Object),
    )
)]
async fn readyz(admin: web::Data<Admin>) -> HttpResponse {
    let (ready, checks, age) = readiness_checks(&admin);
    let body = json!({
        "ready": ready,
        "role": admin.roles,
        "node_id": admin.readiness.node_id(),
        "active_shards": admin.readiness.shards().active(),
        "checked_ms_ago": age.map(|age| u64::try_from(age.as_millis()).unwrap_or(u64::MAX)),
        "checks": checks,
    });
    if ready {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable().json(body)
    }
}

/// The Prometheus metrics (docs/OPERATIONS.md, "Metrics").
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "probes",
    responses(
        (status = 200, description = "Prometheus text exposition format 0.0.4", content_type = "text/plain"),
        (status = 401, description = "`admin.metrics_token` is set and was not given", body = AdminError,
            headers(("WWW-Authenticate" = String, description = "`Bearer`"))),
        (status = 503, description = "No metrics recorder is installed", content_type = "text/plain"),
    ),
    security((), ("metrics" = []))
)]
async fn metrics(admin: web::Data<Admin>, req: actix_web::HttpRequest) -> HttpResponse {
    if let Some(token) = &admin.metrics_token {
        if !super::operations::bearer_is(&req, token) {
            return admin_error(
                HttpResponse::Unauthorized()
                    .insert_header((actix_web::http::header::WWW_AUTHENTICATE, "Bearer"))
                    .take(),
                "missing or wrong bearer token (admin.metrics_token)",
            );
        }
    }
    match crate::telemetry::metrics() {
        Some(handle) => {
            let mut text = handle.render();
            admin.readiness.live().sampled().render(&mut text);
            HttpResponse::Ok()
                .content_type("text/plain; version=0.0.4")
                .body(text)
        }
        None => HttpResponse::ServiceUnavailable().body("metrics recorder not installed"),
    }
}

/// The live page; its numbers only when `/status` would answer this request.
#[utoipa::path(
    get,
    path = "/",
    tag = "probes",
    responses((status = 200, description = "The live page", content_type = "text/html")),
    security((), ("metrics" = []))
)]
async fn live_page(admin: web::Data<Admin>, req: actix_web::HttpRequest) -> HttpResponse {
    let allowed = admin
        .metrics_token
        .as_ref()
        .is_none_or(|token| super::operations::bearer_is(&req, token));
    let status = if allowed {
        Some(collect_status(&admin).await)
    } else {
        None
    };
    // A fresh nonce per answer: only the page's own script runs, never one injected
    // through data it shows. Its styles include the bars' inline widths.
    let nonce = format!("{:032x}", rand::random::<u128>());
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .insert_header((actix_web::http::header::CACHE_CONTROL, "no-store"))
        .insert_header((
            actix_web::http::header::CONTENT_SECURITY_POLICY,
            format!(
                "default-src 'none'; script-src 'nonce-{nonce}'; style-src 'unsafe-inline'; \
                 connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
            ),
        ))
        .body(super::live_page::page(status.as_ref(), &nonce))
}

/// What the live page polls (behind `admin.metrics_token` when it is set).
#[utoipa::path(
    get,
    path = "/status",
    tag = "probes",
    responses(
        (status = 200, description = "The live figures: readiness, the sales, latency, backlog, dead letters, `version`", body = Object),
        (status = 401, description = "`admin.metrics_token` is set and was not given", body = AdminError,
            headers(("WWW-Authenticate" = String, description = "`Bearer`"))),
    ),
    security((), ("metrics" = []))
)]
async fn status(admin: web::Data<Admin>, req: actix_web::HttpRequest) -> HttpResponse {
    if let Some(token) = &admin.metrics_token {
        if !super::operations::bearer_is(&req, token) {
            return admin_error(
                HttpResponse::Unauthorized()
                    .insert_header((actix_web::http::header::WWW_AUTHENTICATE, "Bearer"))
                    .take(),
                "missing or wrong bearer token (admin.metrics_token)",
            );
        }
    }
    HttpResponse::Ok()
        .insert_header((actix_web::http::header::CACHE_CONTROL, "no-store"))
        .json(collect_status(&admin).await)
}

/// How long the live page's figures may take to read from PostgreSQL: a page
/// refreshed during an outage answers within it, with the figures unknown.
const STATUS_READ_DEADLINE: std::time::Duration = std::time::Duration::from_millis(200);

async fn collect_status(admin: &Admin) -> super::live_page::Status {
    use super::live_page::{DeadLetters, Latency, Status};
    let (ready, checks, _) = readiness_checks(admin);
    let found = admin.readiness.checks();
    let mut errors = Vec::new();
    let read = tokio::time::timeout(STATUS_READ_DEADLINE, async {
        let conn = admin.pool.get().await?;
        let buckets = crate::store::health::live_buckets(&conn.client)
            .await
            .map_err(crate::store::StoreError::from)?;
        drop(conn);
        let backlog = crate::store::ops::backlog(&admin.pool).await?;
        Ok::<_, crate::store::StoreError>((super::live_page::sales(buckets), backlog))
    })
    .await;
    let (sales, backlog, unread) = match read {
        Ok(Ok((sales, backlog))) => (Some(sales), Some(backlog), None),
        Ok(Err(e)) => (None, None, Some(format!("cannot be read: {e}"))),
        Err(_) => (
            None,
            None,
            Some(format!(
                "no answer within {} ms",
                STATUS_READ_DEADLINE.as_millis()
            )),
        ),
    };
    if let Some(why) = &unread {
        errors.push(format!("PostgreSQL {why}: sales and backlog unknown"));
    }
    let outages = outages(admin, &found, unread);
    let (intake, intake_ok) = intake_state(admin, found.postgres.as_deref());
    Status {
        version: crate::VERSION,
        time_ms: chrono::Utc::now().timestamp_millis(),
        ready,
        checks,
        paused: admin.readiness.is_paused(),
        intake,
        intake_ok,
        outages,
        node_id: admin.readiness.node_id(),
        in_flight: admin.intakes.in_flight(),
        latency: admin
            .readiness
            .live()
            .recent()
            .summary()
            .map(|(orders, p50, p99)| Latency {
                orders,
                p50_ms: p50 * 1000.0,
                p99_ms: p99 * 1000.0,
            }),
        backlog,
        dead_letters: admin
            .readiness
            .live()
            .dead_letter_depths()
            .into_iter()
            .map(|(queue, messages)| DeadLetters { queue, messages })
            .collect(),
        sales,
        errors,
    }
}

/// What is down now, with since when: the readiness monitor's findings, the
/// page's own failed read, the intakes' and the front stage's links.
fn outages(
    admin: &Admin,
    found: &crate::status::Checks,
    unread: Option<String>,
) -> Vec<super::live_page::Outage> {
    use super::live_page::Outage;
    let now = chrono::Utc::now().timestamp_millis();
    let mut outages = Vec::new();
    match (&found.postgres, unread) {
        (Some(why), _) => outages.push(Outage {
            link: "PostgreSQL",
            reason: why.clone(),
            since_ms: found.postgres_since_ms,
        }),
        // Seen by the page before the monitor's next check.
        (None, Some(why)) => outages.push(Outage {
            link: "PostgreSQL",
            reason: why,
            since_ms: None,
        }),
        (None, None) => {}
    }
    if let Some(why) = &found.redis {
        outages.push(Outage {
            link: "Redis",
            reason: why.clone(),
            since_ms: found.redis_since_ms,
        });
    }
    let consuming = admin.intakes.consuming();
    let broker_down = admin.expected_intakes > 0
        && !admin.readiness.is_paused()
        && found.postgres.is_none()
        && consuming < admin.expected_intakes;
    let since = {
        let mut since = admin
            .broker_down_since
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *since = broker_down.then(|| since.unwrap_or(now));
        *since
    };
    if broker_down {
        outages.push(Outage {
            link: "RabbitMQ",
            reason: format!(
                "{consuming} of {} intakes consuming: the broker connection is down or reconnecting",
                admin.expected_intakes
            ),
            since_ms: since,
        });
    }
    if let Some(Some(why)) = admin.readiness.frontstage_problem() {
        outages.push(Outage {
            link: "front stage links",
            reason: why,
            since_ms: None,
        });
    }
    outages
}

/// The intake's state in words, and whether it is as it should be. Never
/// "running" while it does not consume: paused, stopped for the database, or
/// short of consumers.
fn intake_state(admin: &Admin, postgres: Option<&str>) -> (String, bool) {
    if admin.expected_intakes == 0 {
        return (
            format!("not run here (server.roles = {})", admin.roles),
            true,
        );
    }
    if admin.readiness.is_paused() {
        return ("paused by an operator".to_owned(), false);
    }
    if let Some(why) = postgres {
        return (format!("stopped: the database is not ready ({why})"), false);
    }
    let consuming = admin.intakes.consuming();
    if consuming < admin.expected_intakes {
        return (
            format!(
                "{consuming} of {} intakes consuming",
                admin.expected_intakes
            ),
            false,
        );
    }
    ("running".to_owned(), true)
}

#[cfg(test)]
mod tests {
    use super::host_allowed;

    #[test]
    fn only_addresses_localhost_and_listed_names_are_answered() {
        let listed = vec!["seckill-admin.internal".to_owned()];
        for host in [
            "127.0.0.1:9090",
            "10.0.0.7:9090",
            "[::1]:9090",
            "localhost:9090",
            "LOCALHOST",
            "seckill-admin.internal:9090",
        ] {
            assert!(host_allowed(host, &listed), "{host}");
        }
        for host in [
            "attacker.example:9090",
            "attacker.example",
            "",
            "[evil]:1",
            "127.0.0.1.nip.io:9090",
        ] {
            assert!(!host_allowed(host, &listed), "{host}");
        }
    }
}
