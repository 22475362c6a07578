//! The admin listener (`admin.addr`): liveness, readiness and Prometheus metrics, and
//! the token-guarded operator API (`super::operations`), kept apart from the front
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
    });
    let state = web::Data::new(Admin {
        pool,
        redis: settings.redis.clone(),
        intakes,
        readiness,
        expected_intakes: settings.owned_shards().len() + 1,
    });
    crate::telemetry::metrics();
    let server = HttpServer::new(move || {
        App::new()
            .app_data(state.clone())
            .app_data(operations.clone())
            .app_data(web::JsonConfig::default().limit(4096))
            .route("/livez", web::get().to(livez))
            .route("/readyz", web::get().to(readyz))
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

/// The process runs and its runtime answers.
async fn livez() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

/// 200 only when PostgreSQL (with a current schema), RabbitMQ (every intake
/// consuming) and Redis answer; otherwise 503 naming the failing parts.
async fn readyz(admin: web::Data<Admin>) -> HttpResponse {
    let mut failing = serde_json::Map::new();
    match admin.pool.get().await {
        Ok(mut conn) => {
            if let Err(e) = migrate::verify(&mut conn.client).await {
                failing.insert("postgres".into(), json!(e.to_string()));
            }
        }
        Err(e) => {
            failing.insert("postgres".into(), json!(e.to_string()));
        }
    }
    if !admin.readiness.may_mint() {
        failing.insert(
            "node_id".into(),
            json!(format!(
                "the lease on node id {} is not current: no ids are minted",
                admin.readiness.node_id().unwrap_or_default()
            )),
        );
    }
    let consuming = admin.intakes.consuming();
    if admin.readiness.is_paused() {
        failing.insert("intake".into(), json!("paused by an operator"));
    } else if consuming < admin.expected_intakes {
        failing.insert(
            "rabbitmq".into(),
            json!(format!(
                "{consuming} of {} intakes consuming",
                admin.expected_intakes
            )),
        );
    }
    let redis = async {
        let mut conn = crate::redis::connect(&admin.redis).await?;
        crate::redis::commands::ping(&mut conn).await
    };
    if let Err(e) = redis.await {
        failing.insert("redis".into(), json!(e.to_string()));
    }
    let ready = failing.is_empty();
    metrics::gauge!(crate::telemetry::names::READY).set(if ready { 1.0 } else { 0.0 });
    if ready {
        HttpResponse::Ok().json(json!({"status": "ready"}))
    } else {
        HttpResponse::ServiceUnavailable().json(json!({"status": "not_ready", "failing": failing}))
    }
}

async fn metrics() -> HttpResponse {
    match crate::telemetry::metrics() {
        Some(handle) => HttpResponse::Ok()
            .content_type("text/plain; version=0.0.4")
            .body(handle.render()),
        None => HttpResponse::ServiceUnavailable().body("metrics recorder not installed"),
    }
}
