//! The admin listener (`admin.addr`): liveness, readiness and Prometheus metrics, the
//! live page of the sale and its `/status` (`super::live_page`), and the
//! token-guarded operator API (`super::operations`), kept apart from the front
//! stage so that probes, scrapes and operators never queue behind buyers.

use std::sync::Arc;

use actix_web::{web, App, HttpResponse, HttpServer};
use serde_json::json;

use super::operations::Operations;
use super::{HttpError, Running};
use crate::config::{RedisSettings, Settings};
use crate::status::IntakeStats;
use crate::status::Readiness;
use crate::store::{migrate, Pool};

/// What readiness looks at.
pub struct Admin {
    pool: Pool,
    redis: RedisSettings,
    intakes: Arc<IntakeStats>,
    readiness: Arc<Readiness>,
    expected_intakes: usize,
    /// `admin.metrics_token`: `/metrics` answers 401 without it.
    metrics_token: Option<secrecy::SecretString>,
}

pub async fn start(
    settings: &Settings,
    pool: Pool,
    intakes: Arc<IntakeStats>,
    readiness: Arc<Readiness>,
) -> Result<Running, HttpError> {
    let operations = web::Data::new(Operations {
        token: settings.admin.token.clone(),
        pool: pool.clone(),
        amqp: settings.amqp.clone(),
        readiness: readiness.clone(),
        intakes: intakes.clone(),
        inbox_window: settings.retention.inbox_window(),
        refusals: Default::default(),
    });
    let state = web::Data::new(Admin {
        pool,
        redis: settings.redis.clone(),
        intakes,
        readiness,
        expected_intakes: settings.owned_shards().len() + 1,
        metrics_token: settings.admin.metrics_token.clone(),
    });
    crate::telemetry::metrics();
    let server = HttpServer::new(move || {
        App::new()
            .wrap(security_headers())
            .app_data(state.clone())
            .app_data(operations.clone())
            .app_data(web::JsonConfig::default().limit(4096))
            .route("/livez", web::get().to(livez))
            .route("/readyz", web::get().to(readyz))
            .route("/", web::get().to(live_page))
            .route("/status", web::get().to(status))
            .route("/metrics", web::get().to(metrics))
            .configure(super::operations::routes)
    })
    .workers(1)
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

/// Every part that reports readiness, each "ok" or its reason; whether all are ok.
async fn readiness_checks(admin: &Admin) -> (bool, serde_json::Map<String, serde_json::Value>) {
    const OK: &str = "ok";
    let mut checks = serde_json::Map::new();
    // The monitor's finding first: it knows a stalled COMMIT or a missing
    // standby, which a fresh connection would not show.
    let postgres = match admin.readiness.postgres_problem() {
        Some(problem) => problem,
        None => match admin.pool.get().await {
            Ok(mut conn) => match migrate::verify(&mut conn.client).await {
                Ok(()) => OK.to_owned(),
                Err(e) => e.to_string(),
            },
            Err(e) => e.to_string(),
        },
    };
    checks.insert("postgres".into(), json!(postgres));
    let consuming = admin.intakes.consuming();
    let paused = admin.readiness.is_paused();
    let rabbitmq = if paused || consuming >= admin.expected_intakes {
        OK.to_owned()
    } else {
        format!(
            "{consuming} of {} intakes consuming",
            admin.expected_intakes
        )
    };
    checks.insert("rabbitmq".into(), json!(rabbitmq));
    let redis = async {
        let mut conn = crate::redis::connect(&admin.redis).await?;
        crate::redis::commands::ping(&mut conn).await
    };
    let redis = match redis.await {
        Ok(()) => OK.to_owned(),
        Err(e) => e.to_string(),
    };
    checks.insert("redis".into(), json!(redis));
    // The front stage's own connections: its buyers get 503s while one is down,
    // whatever the engine's are doing.
    if let Some(front) = admin.readiness.frontstage_problem() {
        checks.insert(
            "frontstage".into(),
            json!(front.unwrap_or_else(|| OK.to_owned())),
        );
    }
    checks.insert(
        "intake".into(),
        json!(if paused { "paused by an operator" } else { OK }),
    );
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
    let ready = checks.values().all(|v| v == OK);
    (ready, checks)
}

/// The process runs and its runtime answers.
async fn livez() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

/// One shape for every part that reports readiness:
/// `{"ready": bool, "node_id": N, "active_shards": [..], "checks": {"postgres":
/// "ok"|reason, "rabbitmq": .., "redis": .., "frontstage": .. (when one runs in this
/// process: its own Redis and broker links), "intake": .., "node_id": ..}}`. 200 when
/// every check is "ok"; 503 otherwise (an operator pause included). Standing by for
/// shards another instance is active on is ready.
async fn readyz(admin: web::Data<Admin>) -> HttpResponse {
    let (ready, checks) = readiness_checks(&admin).await;
    let node_id = admin.readiness.node_id();
    metrics::gauge!(crate::telemetry::names::READY).set(if ready { 1.0 } else { 0.0 });
    let body = json!({
        "ready": ready,
        "node_id": node_id,
        "active_shards": admin.readiness.shards().active(),
        "checks": checks,
    });
    if ready {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable().json(body)
    }
}

async fn metrics(admin: web::Data<Admin>, req: actix_web::HttpRequest) -> HttpResponse {
    if let Some(token) = &admin.metrics_token {
        if !super::operations::bearer_is(&req, token) {
            return HttpResponse::Unauthorized()
                .insert_header((actix_web::http::header::WWW_AUTHENTICATE, "Bearer"))
                .json(json!({"error": "missing or wrong bearer token (admin.metrics_token)"}));
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
async fn status(admin: web::Data<Admin>, req: actix_web::HttpRequest) -> HttpResponse {
    if let Some(token) = &admin.metrics_token {
        if !super::operations::bearer_is(&req, token) {
            return HttpResponse::Unauthorized()
                .insert_header((actix_web::http::header::WWW_AUTHENTICATE, "Bearer"))
                .json(json!({"error": "missing or wrong bearer token (admin.metrics_token)"}));
        }
    }
    HttpResponse::Ok()
        .insert_header((actix_web::http::header::CACHE_CONTROL, "no-store"))
        .json(collect_status(&admin).await)
}

async fn collect_status(admin: &Admin) -> super::live_page::Status {
    use super::live_page::{DeadLetters, Latency, Status};
    let (ready, checks) = readiness_checks(admin).await;
    let mut errors = Vec::new();
    let (sales, backlog) = match admin.pool.get().await {
        Ok(conn) => {
            let sales = match crate::store::health::live_buckets(&conn.client).await {
                Ok(buckets) => super::live_page::sales(buckets),
                Err(e) => {
                    errors.push(format!("live sales: {e}"));
                    Vec::new()
                }
            };
            drop(conn);
            let backlog = match crate::store::ops::backlog(&admin.pool).await {
                Ok(b) => Some(b),
                Err(e) => {
                    errors.push(format!("backlog: {e}"));
                    None
                }
            };
            (sales, backlog)
        }
        Err(e) => {
            errors.push(format!("PostgreSQL: {e}"));
            (Vec::new(), None)
        }
    };
    Status {
        time_ms: chrono::Utc::now().timestamp_millis(),
        ready,
        checks,
        paused: admin.readiness.is_paused(),
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
