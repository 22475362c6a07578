//! The front stage: buyers reserve units and read their reservations and orders
//! over HTTP on `http.addr`. One file per concern:
//! - `buyer`: who a request speaks for (credentials and rate limits, as extractors);
//! - `reserve`: `POST .../reservations`, Redis then the order queue;
//! - `purchase_token`: issuing and checking purchase tokens;
//! - `lookups`: the buyer's reads of reservations, orders and order history;
//! - `sku_cache`: what is known of each SKU, refreshed by one read at a time;
//! - `state`: what the handlers share, built from the settings;
//! - `links`: the Redis, broker and replica links, watched and reported;
//! - `answers`: the statuses and error bodies the handlers share.
//!
//! Every request speaks for the user its credentials name (`http::auth`).

mod answers;
mod buyer;
mod links;
mod lookups;
mod purchase_token;
mod rebuilds;
mod reserve;
pub mod sku_cache;
mod state;

use std::sync::{Arc, Weak};
use std::time::Duration;

use actix_web::{web, App, HttpResponse, HttpServer};

use super::auth::Authenticator;
use super::openapi::SecuritySchemes;
use super::{HttpError, Running};
use crate::config::Settings;
use crate::domain::ids::IdGenerator;
use crate::redis::WorkerLink;
use crate::status::Readiness;
use crate::store::Pool;
use state::FrontStage;

/// How often the rate limiters, the verified tokens and the SKU cache forget what is
/// no longer needed.
const SHRINK_INTERVAL: Duration = Duration::from_secs(10);

/// The front stage's OpenAPI document (`http::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "seckill-engine front stage",
        description = "Buyers reserve units of a flash sale and read their reservations and \
                       orders. Every request speaks for the user its credentials name. \
                       Errors are `Problem` bodies whose `status` a program can act on."
    ),
    paths(
        reserve::reserve,
        purchase_token::purchase_token_for,
        lookups::reservation,
        lookups::order,
        lookups::my_orders,
        openapi_json
    ),
    modifiers(&SecuritySchemes),
    tags((name = "buyer", description = "A buyer's reservations and orders"))
)]
pub struct FrontApi;

/// The document as served and committed (docs/contracts/front.openapi.json).
pub fn openapi_document() -> String {
    super::openapi::render(&<FrontApi as utoipa::OpenApi>::openapi())
}

/// This listener's OpenAPI document.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "contract",
    responses((status = 200, description = "This document", content_type = "application/json"))
)]
async fn openapi_json() -> HttpResponse {
    static DOCUMENT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    super::openapi::answer(DOCUMENT.get_or_init(openapi_document))
}

/// A path or query that does not parse: 400 with a `Problem` body, like every other
/// refusal (actix's own answer is plain text, and a 404 for a path).
fn malformed(why: String) -> actix_web::Error {
    actix_web::error::InternalError::from_response(why.clone(), answers::bad_request(why)).into()
}

/// The routes, a sale's two hot ones first: a request is matched against each in
/// turn until one fits. Anything else is a `NOT_FOUND` problem, or 405 with `Allow`
/// for a known path and another method.
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.app_data(web::PathConfig::default().error_handler(|e, _| malformed(e.to_string())))
        .app_data(web::QueryConfig::default().error_handler(|e, _| malformed(e.to_string())));
    cfg.service(
        web::resource("/v1/activities/{activity_id}/skus/{sku_id}/reservations")
            .post(reserve::reserve)
            .default_service(only("POST")),
    )
    .service(
        web::resource("/v1/activities/{activity_id}/skus/{sku_id}/purchase-token")
            .get(purchase_token::purchase_token_for)
            .default_service(only("GET")),
    )
    .service(
        web::resource("/v1/reservations/{reservation_id}")
            .get(lookups::reservation)
            .default_service(only("GET")),
    )
    .service(
        web::resource("/v1/orders/{order_id}")
            .get(lookups::order)
            .default_service(only("GET")),
    )
    .service(
        web::resource("/v1/me/orders")
            .get(lookups::my_orders)
            .default_service(only("GET")),
    )
    .service(
        web::resource("/openapi.json")
            .get(openapi_json)
            .default_service(only("GET")),
    )
    .default_service(web::to(|| async { answers::not_found() }));
}

/// A known path asked with another method: 405 with `Allow: method` (RFC 9110).
fn only(method: &'static str) -> actix_web::Route {
    web::to(move || async move {
        answers::Problem::new(answers::ProblemStatus::InvalidRequest)
            .error(format!("method not allowed here; use {method}"))
            .answer(
                HttpResponse::MethodNotAllowed()
                    .insert_header((actix_web::http::header::ALLOW, method))
                    .take(),
            )
    })
}

/// What `validate` says of the front stage's settings: whether it can authenticate
/// buyers and sign purchase tokens as configured (what `serve` would refuse).
pub fn check_settings(settings: &Settings) -> Result<String, String> {
    settings.frontstage_ready().map_err(|e| e.to_string())?;
    Authenticator::new(&settings.frontstage.auth).map_err(|e| e.to_string())?;
    let tokens = &settings.frontstage.purchase_token;
    Ok(format!(
        "buyers by {:?}, purchase tokens {}",
        settings.frontstage.auth.mode,
        if tokens.required { "required" } else { "off" }
    ))
}

/// Starts the front stage. Its Redis and AMQP connections are opened here, on the
/// caller's (long-lived) arbiter, and shared by the workers. It mints order ids with
/// `ids`: the engine's generator, under the engine's node id lease; it reports its
/// links to `readiness` (the engine's, so that `/readyz` shows them).
pub async fn start(
    settings: &Settings,
    pool: Pool,
    ids: Arc<IdGenerator>,
    readiness: Arc<Readiness>,
) -> Result<Running, HttpError> {
    let state = web::Data::new(FrontStage::connect(settings, pool, ids, readiness).await?);
    state.links.check().await;
    watch(Arc::downgrade(&state.clone().into_inner()));
    let workers = match settings.frontstage.workers {
        0 => crate::cores::Cores::detect().auto_workers(),
        n => n,
    };
    let descriptors = super::descriptor_limits();
    let per_worker =
        super::front_connection_cap(settings, descriptors.map_or(1024, |(soft, _)| soft));
    tracing::info!(
        workers,
        connections_per_worker = per_worker,
        descriptors_soft = descriptors.map(|d| d.0),
        "front stage connection cap"
    );
    let deadlines = super::Deadlines::new(&settings.frontstage.limits);
    let server = HttpServer::new(move || {
        // Made on each worker's own thread: its Redis calls go through a connection
        // that worker drives (`redis::WorkerLink`).
        let worker = web::Data::new(WorkerLink::new(state.redis.clone()));
        App::new()
            .app_data(state.clone())
            .app_data(worker)
            .app_data(web::PayloadConfig::new(reserve::MAX_BODY_BYTES))
            .configure(routes)
    })
    .workers(workers)
    .max_connections(per_worker)
    .client_request_timeout(deadlines.header_read)
    .keep_alive(deadlines.keep_alive)
    .client_disconnect_timeout(super::DISCONNECT_TIMEOUT)
    .disable_signals()
    .bind(&settings.http.addr)
    .map_err(|source| super::bind_error(&settings.http.addr, source))?;
    let addr = super::bound_addr(&server.addrs(), &settings.http.addr)?;
    let server = server.run();
    tracing::info!(%addr, "front stage listening");
    Ok(Running { server, addr })
}

/// Starts the front stage's watchers on the caller's arbiter; each ends when the
/// front stage is gone.
fn watch(front: Weak<FrontStage>) {
    if front.upgrade().is_some_and(|f| f.replica.is_some()) {
        let front = front.clone();
        actix_rt::spawn(async move {
            while let Some(front) = front.upgrade() {
                if let Some(replica) = &front.replica {
                    replica.measure(&front.pool).await;
                }
                drop(front);
                tokio::time::sleep(links::REPLICA_WATCH_INTERVAL).await;
            }
        });
    }
    let links = front.clone();
    actix_rt::spawn(async move {
        loop {
            tokio::time::sleep(links::LINK_CHECK_INTERVAL).await;
            let Some(front) = links.upgrade() else { break };
            // A promoted replica may lack the old master's last writes: the live
            // sales' keys are recomputed from PostgreSQL (issue 48).
            if front.links.check().await {
                front.rebuilds.start_live(rebuilds::Trigger::MasterMoved);
            }
        }
    });
    // The limiters forget keys that have fully recovered, the authenticator the
    // tokens that expired and the SKU cache the sales that ended, so a sale's hundreds of thousands of buyers, and sale after sale,
    // do not stay in memory.
    actix_rt::spawn(async move {
        loop {
            tokio::time::sleep(SHRINK_INTERVAL).await;
            let Some(front) = front.upgrade() else { break };
            front.limits.shrink();
            front.auth.forget_expired();
            front.skus.evict(chrono::Utc::now());
        }
    });
}
