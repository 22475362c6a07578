//! The front stage: buyers reserve units and read their reservations and orders
//! over HTTP on `http.addr`. One file per concern:
//! - `buyer`: who a request speaks for (credentials and rate limits, as extractors);
//! - `reserve`: `POST .../reservations`, Redis then the order queue;
//! - `purchase_token`: issuing and checking purchase tokens;
//! - `lookups`: the buyer's reads of reservations, orders and order history;
//! - `sku_cache`: what is known of each SKU, refreshed by one read at a time;
//! - `links`: the Redis, broker and replica links, watched and reported;
//! - `answers`: the statuses and error bodies the handlers share.
//!
//! Every request speaks for the user its credentials name (`http::auth`).

mod answers;
mod buyer;
mod links;
mod lookups;
mod purchase_token;
mod reserve;
pub mod sku_cache;

use std::sync::Arc;
use std::time::Duration;

use actix_web::{web, App, HttpServer};
use futures_util::FutureExt;

use super::auth::Authenticator;
use super::limits::Limits;
use super::{HttpError, Running};
use crate::config::{AmqpSettings, FrontstageSettings, Settings};
use crate::domain::ids::IdGenerator;
use crate::mq::publisher::ConfirmedPublisher;
use crate::mq::topology::Names;
use crate::status::Readiness;
use crate::store::{reads, Pool};
use links::{amqp_key, Replica};
use sku_cache::{Loader, SkuCache, SkuUnavailable};

/// What the handlers share.
pub struct FrontStage {
    pool: Pool,
    /// Reconnects by itself after a Redis restart or a dropped connection.
    redis: ::redis::aio::ConnectionManager,
    key_prefix: String,
    amqp: AmqpSettings,
    /// The confirm channel and its connection, reopened when the broker closed them.
    publisher: tokio::sync::RwLock<(lapin::Connection, ConfirmedPublisher)>,
    names: Names,
    shards: u16,
    ids: Arc<IdGenerator>,
    settings: FrontstageSettings,
    marker_ttl_secs: u64,
    skus: Arc<SkuCache>,
    auth: Authenticator,
    limits: Limits,
    /// `frontstage.purchase_token.secret` when tokens are required.
    purchase_secret: Option<secrecy::SecretString>,
    replica: Option<Replica>,
    replica_max_lag_ms: i64,
    /// Where the state of the front stage's own Redis and broker links is reported
    /// (`/readyz`).
    readiness: Arc<Readiness>,
}

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route(
        "/v1/activities/{activity_id}/skus/{sku_id}/reservations",
        web::post().to(reserve::reserve),
    )
    .route(
        "/v1/reservations/{reservation_id}",
        web::get().to(lookups::reservation),
    )
    .route("/v1/orders/{order_id}", web::get().to(lookups::order))
    .route("/v1/me/orders", web::get().to(lookups::my_orders))
    .route(
        "/v1/activities/{activity_id}/skus/{sku_id}/purchase-token",
        web::get().to(purchase_token::purchase_token_for),
    );
}

/// Reads a SKU through the front stage's own pool.
fn sku_loader(pool: Pool) -> Loader {
    Arc::new(move |(activity_id, sku_id)| {
        let pool = pool.clone();
        async move {
            let conn = pool.get().await.map_err(|_| SkuUnavailable::Busy)?;
            reads::load_sku(&conn.client, activity_id, sku_id)
                .await
                .map_err(|_| SkuUnavailable::Down)
        }
        .boxed()
    })
}

impl FrontStage {
    pub async fn connect(
        settings: &Settings,
        pool: Pool,
        ids: Arc<IdGenerator>,
        readiness: Arc<Readiness>,
    ) -> Result<Self, HttpError> {
        let auth = Authenticator::new(&settings.frontstage.auth, &settings.http.addr)?;
        let tokens = &settings.frontstage.purchase_token;
        let purchase_secret = match (&tokens.secret, tokens.required) {
            (Some(secret), true) => Some(secret.clone()),
            (None, true) => {
                return Err(HttpError::Config {
                    key: "frontstage.purchase_token.secret",
                    reason: "frontstage.purchase_token.required needs it (at least 32 bytes, shared by every front-stage instance, through SECKILL__FRONTSTAGE__PURCHASE_TOKEN__SECRET)".into(),
                })
            }
            (_, false) => None,
        };
        let replica = crate::store::build_replica_pool(&settings.database)?.map(Replica::new);
        let redis = crate::redis::connect_managed(&settings.redis).await?;
        // Its own broker user when one is configured: write on the order exchange only.
        let mut amqp_settings = settings.amqp.clone();
        if let Some(url) = &settings.frontstage.amqp_url {
            amqp_settings.url = url.clone();
        }
        let amqp = crate::mq::connect_to(
            &amqp_settings,
            &amqp_settings.url,
            amqp_key(&settings.frontstage),
            "seckill-frontstage",
        )
        .await?;
        let publisher = ConfirmedPublisher::open(&amqp).await?;
        Ok(Self {
            skus: SkuCache::new(
                sku_loader(pool.clone()),
                Duration::from_millis(settings.frontstage.sold_out_recheck_ms),
            ),
            pool,
            redis,
            key_prefix: settings.redis.key_prefix.clone(),
            amqp: amqp_settings,
            publisher: tokio::sync::RwLock::new((amqp, publisher)),
            names: Names::new(&settings.amqp.namespace),
            shards: settings.amqp.shards,
            ids,
            settings: settings.frontstage.clone(),
            marker_ttl_secs: settings.compensation.released_marker_ttl_secs,
            auth,
            limits: Limits::new(&settings.frontstage.rate_limit),
            purchase_secret,
            replica,
            replica_max_lag_ms: i64::try_from(settings.database.replica_max_lag_ms)
                .unwrap_or(i64::MAX),
            readiness,
        })
    }
}

/// What `validate` says of the front stage's settings: whether it can authenticate
/// buyers and sign purchase tokens as configured (what `serve` would refuse).
pub fn check_settings(settings: &Settings) -> Result<String, String> {
    Authenticator::new(&settings.frontstage.auth, &settings.http.addr)
        .map_err(|e| e.to_string())?;
    let tokens = &settings.frontstage.purchase_token;
    if tokens.required && tokens.secret.is_none() {
        return Err("configuration key `frontstage.purchase_token.secret`: frontstage.purchase_token.required needs it".into());
    }
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
    state.check_links().await;
    links::watch(
        Arc::downgrade(&state.clone().into_inner()),
        state.replica.is_some(),
    );
    let workers = settings.frontstage.workers.max(1);
    let server = HttpServer::new(move || {
        App::new()
            .app_data(state.clone())
            .app_data(web::PayloadConfig::new(16 * 1024))
            .configure(routes)
    })
    .workers(workers)
    .disable_signals()
    .bind(&settings.http.addr)
    .map_err(|source| super::bind_error(&settings.http.addr, source))?;
    let addr = super::bound_addr(&server.addrs(), &settings.http.addr)?;
    let server = server.run();
    tracing::info!(%addr, "front stage listening");
    Ok(Running { server, addr })
}
