//! The front stage: `POST /v1/activities/{activity_id}/skus/{sku_id}/reservations`
//! reserves a unit in Redis (the fast pre-filter) and queues the `order.create`
//! message with publisher confirms; `GET /v1/reservations/{id}` and
//! `GET /v1/orders/{id}` answer from PostgreSQL, the primary (never a replica,
//! §14.4), so a client sees its own committed order at once; `GET /v1/me/orders`
//! lists the buyer's orders from a replica while it is fresh enough. Every request
//! speaks for the user its credentials name (`http::auth`), and sees only that
//! user's reservations and orders: anyone else's are "not found".

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use chrono::{TimeDelta, Utc};
use serde::Deserialize;
use serde_json::json;
use uuid::Uuid;

use super::auth::{unauthorized, Authenticator};
use super::limits::{too_many, Limits};
use super::{HttpError, Running};
use crate::config::{AmqpSettings, FrontstageSettings, Settings};
use crate::domain::ids::{order_no, IdGenerator};
use crate::domain::lsn::Lsn;
use crate::domain::message::OrderCreateMessage;
use crate::domain::purchase_token::{self, PurchaseClaims};
use crate::domain::shard::shard_for;
use crate::mq::publisher::ConfirmedPublisher;
use crate::mq::topology::Names;
use crate::redis::commands;
use crate::redis::keys::{PendingMember, SkuKeys};
use crate::redis::scripts::{self, Reserved};
use crate::status::Readiness;
use crate::store::Pool;
use crate::store::{reads, reconcile};

/// The key of the URL the front stage publishes through.
fn amqp_key(front: &crate::config::FrontstageSettings) -> &'static str {
    if front.amqp_url.is_some() {
        "frontstage.amqp_url"
    } else {
        "amqp.url"
    }
}

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
    ids: std::sync::Arc<IdGenerator>,
    settings: FrontstageSettings,
    marker_ttl_secs: u64,
    /// What was read of each SKU, and when; `None`: no such SKU.
    skus: Mutex<HashMap<(i64, i64), CachedSku>>,
    /// When the reserve script last found each SKU sold out.
    sold_out: Mutex<HashMap<(i64, i64), std::time::Instant>>,
    sold_out_recheck: Duration,
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

/// A request turned away before any store was asked.
enum Refused {
    Limited(super::limits::Limited),
    Unauthorized(super::auth::AuthError),
    /// The purchase token's metric outcome and the reason.
    PurchaseToken(&'static str, String),
}

impl Refused {
    fn respond(self) -> HttpResponse {
        match self {
            Refused::Limited(limited) => too_many(limited),
            Refused::Unauthorized(e) => unauthorized(&e),
            Refused::PurchaseToken(outcome, reason) => purchase_token_refused(outcome, reason),
        }
    }
}

/// `database.replica_url` and how far it lags, as last measured (`watch_replica`).
struct Replica {
    pool: Pool,
    /// Milliseconds; `i64::MAX` until measured, and while it cannot be.
    lag_ms: AtomicI64,
}

/// Where a read was served, and the WAL position its answer reflects.
const READ_SOURCE: &str = "X-Read-Source";
const READ_LSN: &str = "X-Read-LSN";
/// A position the client has already seen: no older answer may be given.
const MIN_LSN: &str = "X-Min-LSN";
/// The purchase token a reservation presents.
const PURCHASE_TOKEN: &str = "X-Purchase-Token";

/// What a reservation needs to know of its SKU; cached after the first request.
type Sku = reads::SkuInfo;
/// When a SKU was read, and what was found (`None`: no such SKU).
type CachedSku = (std::time::Instant, Option<Arc<Sku>>);

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReserveRequest {
    request_id: Uuid,
    /// Refused when present: the buyer is who the credentials say, and a client
    /// still sending it should find out rather than be silently ignored.
    #[serde(default)]
    user_id: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HistoryQuery {
    limit: Option<i64>,
    before: Option<i64>,
}

/// `GET /v1/me/orders?limit=`: at most this many, this many when not given.
const HISTORY_MAX: i64 = 100;
const HISTORY_DEFAULT: i64 = 20;

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route(
        "/v1/activities/{activity_id}/skus/{sku_id}/reservations",
        web::post().to(reserve),
    )
    .route(
        "/v1/reservations/{reservation_id}",
        web::get().to(reservation),
    )
    .route("/v1/orders/{order_id}", web::get().to(order))
    .route("/v1/me/orders", web::get().to(my_orders))
    .route(
        "/v1/activities/{activity_id}/skus/{sku_id}/purchase-token",
        web::get().to(purchase_token_for),
    );
}

impl FrontStage {
    pub async fn connect(
        settings: &Settings,
        pool: Pool,
        ids: std::sync::Arc<IdGenerator>,
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
        let replica = crate::store::build_replica_pool(&settings.database)?.map(|pool| Replica {
            pool,
            lag_ms: AtomicI64::new(i64::MAX),
        });
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
            skus: Mutex::new(HashMap::new()),
            sold_out: Mutex::new(HashMap::new()),
            sold_out_recheck: Duration::from_millis(settings.frontstage.sold_out_recheck_ms),
            auth,
            limits: Limits::new(&settings.frontstage.rate_limit),
            purchase_secret,
            replica,
            replica_max_lag_ms: i64::try_from(settings.database.replica_max_lag_ms)
                .unwrap_or(i64::MAX),
            readiness,
        })
    }

    /// Checks the front stage's own links once and reports them (`/readyz`): Redis
    /// answers a PING, and the broker channel is open (reopened here if it was
    /// closed, so the first buyer after a blip does not pay for it).
    async fn check_links(&self) {
        let mut redis = self.redis.clone();
        let redis = match tokio::time::timeout(LINK_CHECK_TIMEOUT, commands::ping(&mut redis)).await
        {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(format!("redis: {e}")),
            Err(_) => Some("redis: no answer within 1 s".to_owned()),
        };
        let broker = match tokio::time::timeout(LINK_CHECK_TIMEOUT, self.publisher()).await {
            Ok(Ok(_)) => None,
            Ok(Err(e)) => Some(format!("rabbitmq: {e}")),
            Err(_) => Some("rabbitmq: no channel within 1 s".to_owned()),
        };
        let problem = match (redis, broker) {
            (None, None) => None,
            (Some(r), None) => Some(r),
            (None, Some(b)) => Some(b),
            (Some(r), Some(b)) => Some(format!("{r}; {b}")),
        };
        if self.readiness.set_frontstage(problem.clone()) {
            match &problem {
                Some(problem) => tracing::warn!(%problem, "front stage link down; answering 503"),
                None => tracing::info!("front stage links up"),
            }
        }
    }

    /// The user a request speaks for, once the address limit, the credentials and
    /// (for `count_user`) the user's own limit let it through: all from memory.
    fn admit(&self, http: &HttpRequest, count_user: bool) -> Result<i64, Refused> {
        self.limits.address(http).map_err(Refused::Limited)?;
        let user = self.auth.user(http).map_err(Refused::Unauthorized)?;
        if count_user {
            self.limits.user(user).map_err(Refused::Limited)?;
        }
        Ok(user)
    }

    /// Measures the replica's lag once: 0 when it has replayed the primary's
    /// position read just before, else the age of its last replayed transaction.
    async fn measure_replica(&self) {
        let Some(replica) = &self.replica else { return };
        let measured = async {
            let primary = {
                let conn = self.pool.get().await.ok()?;
                reads::wal_position(&conn.client, false).await.ok()?
            };
            let conn = replica.pool.get().await.ok()?;
            let replayed = reads::wal_position(&conn.client, true).await.ok()?;
            if replayed >= primary {
                return Some(0);
            }
            reads::replay_age_ms(&conn.client).await.ok().flatten()
        };
        let lag = measured.await.unwrap_or(i64::MAX);
        replica.lag_ms.store(lag, Ordering::Relaxed);
        metrics::gauge!(crate::telemetry::names::REPLICA_LAG_SECONDS).set(if lag == i64::MAX {
            f64::INFINITY
        } else {
            lag as f64 / 1000.0
        });
    }

    /// The confirm channel; reopened (on a new connection if need be) after the broker
    /// closed it, e.g. after a publish to a missing exchange.
    async fn publisher(&self) -> Result<ConfirmedPublisher, crate::mq::MqError> {
        {
            let current = self.publisher.read().await;
            if current.1.channel().status().connected() {
                return Ok(current.1.clone());
            }
        }
        let mut current = self.publisher.write().await;
        if current.1.channel().status().connected() {
            return Ok(current.1.clone());
        }
        if !current.0.status().connected() {
            current.0 = crate::mq::connect_to(
                &self.amqp,
                &self.amqp.url,
                amqp_key(&self.settings),
                "seckill-frontstage",
            )
            .await?;
        }
        current.1 = ConfirmedPublisher::open(&current.0).await?;
        Ok(current.1.clone())
    }

    /// Whether the reserve script found the SKU sold out less than
    /// `frontstage.sold_out_recheck_ms` ago. Units can come back (a rejected or cancelled order, a released
    /// reservation), so the memory is short: the first request after it runs the
    /// script again.
    fn known_sold_out(&self, sku: (i64, i64)) -> bool {
        self.sold_out
            .lock()
            .ok()
            .and_then(|m| m.get(&sku).copied())
            .is_some_and(|at| at.elapsed() < self.sold_out_recheck)
    }

    fn mark_sold_out(&self, sku: (i64, i64)) {
        if let Ok(mut m) = self.sold_out.lock() {
            m.insert(sku, std::time::Instant::now());
        }
    }

    /// The SKU as cached, read again once the entry is `SKU_REFRESH` old (so an
    /// `activity close` takes effect within it); an unknown SKU is remembered as
    /// unknown for `SKU_UNKNOWN_FOR`, so a flood of requests for SKUs that do not
    /// exist costs one read each per that time, not one per request.
    async fn sku(&self, activity_id: i64, sku_id: i64) -> Result<Option<Arc<Sku>>, HttpResponse> {
        let cached = self
            .skus
            .lock()
            .ok()
            .and_then(|m| m.get(&(activity_id, sku_id)).cloned());
        if let Some((read_at, sku)) = cached {
            let fresh_for = if sku.is_some() {
                SKU_REFRESH
            } else {
                SKU_UNKNOWN_FOR
            };
            if read_at.elapsed() < fresh_for {
                return Ok(sku);
            }
        }
        let conn = self
            .pool
            .get()
            .await
            .map_err(|_| unavailable("database busy"))?;
        let found = reads::load_sku(&conn.client, activity_id, sku_id)
            .await
            .map_err(|_| unavailable("database unavailable"))?;
        let sku = found.map(Arc::new);
        if let Ok(mut skus) = self.skus.lock() {
            skus.insert(
                (activity_id, sku_id),
                (std::time::Instant::now(), sku.clone()),
            );
        }
        Ok(sku)
    }
}

/// How often the front stage checks its own Redis and broker links, and how long a
/// check may take.
const LINK_CHECK_INTERVAL: Duration = Duration::from_millis(500);
const LINK_CHECK_TIMEOUT: Duration = Duration::from_secs(1);

/// How long the front stage answers from what it read of a SKU.
const SKU_REFRESH: Duration = Duration::from_millis(500);
/// How long an unknown SKU stays unknown without asking PostgreSQL again.
const SKU_UNKNOWN_FOR: Duration = Duration::from_secs(1);

/// 503: a store is unavailable for now; `Retry-After` says when to try again (the
/// Redis connection reconnects within about a second, the broker's within the
/// publish timeout).
fn unavailable(why: &str) -> HttpResponse {
    HttpResponse::ServiceUnavailable()
        .insert_header((actix_web::http::header::RETRY_AFTER, "1"))
        .json(json!({"status": "UNAVAILABLE", "error": why}))
}

fn bad_request(why: String) -> HttpResponse {
    HttpResponse::BadRequest().json(json!({"status": "INVALID_REQUEST", "error": why}))
}

/// `reservation|order_id|order_no|bucket` → the 202 body.
fn accepted(answer: &str) -> HttpResponse {
    let parts: Vec<&str> = answer.split('|').collect();
    match parts.as_slice() {
        [reservation, order_id, order_no, bucket] => HttpResponse::Accepted().json(json!({
            "reservation_id": reservation,
            "order_id": order_id.parse::<i64>().unwrap_or_default(),
            "order_no": order_no,
            "inventory_bucket": bucket.parse::<i16>().unwrap_or_default(),
            "status": "QUEUED",
        })),
        _ => unavailable("corrupt reservation record"),
    }
}

async fn reserve(
    front: web::Data<FrontStage>,
    http: HttpRequest,
    path: web::Path<(i64, i64)>,
    body: web::Bytes,
) -> HttpResponse {
    let user_id = match front.admit(&http, true) {
        Ok(user) => user,
        Err(refused) => return refused.respond(),
    };
    let (activity_id, sku_id) = path.into_inner();
    let req: ReserveRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return bad_request(e.to_string()),
    };
    if req.user_id.is_some() {
        return bad_request(
            "user_id: not accepted in the body; the buyer is the one the credentials name".into(),
        );
    }
    if req.request_id.is_nil() {
        return bad_request("request_id: must not be the nil UUID".into());
    }
    if let Some(secret) = &front.purchase_secret {
        if let Err(refused) = check_purchase_token(secret, &http, (user_id, activity_id, sku_id)) {
            return refused.respond();
        }
    }
    let sku = match front.sku(activity_id, sku_id).await {
        Ok(Some(sku)) => sku,
        Ok(None) => {
            return HttpResponse::NotFound()
                .json(json!({"status": "NOT_FOUND", "error": "no such activity and sku"}))
        }
        Err(response) => return response,
    };
    let now = Utc::now();
    if sku.closed {
        return HttpResponse::Conflict().json(json!({"status": "SALE_CLOSED"}));
    }
    if now < sku.start_at || now >= sku.end_at {
        return HttpResponse::Conflict().json(json!({"status": "NOT_ACTIVE"}));
    }
    let keys = SkuKeys::new(&front.key_prefix, activity_id, sku_id);
    let mut redis = front.redis.clone();
    if front.known_sold_out((activity_id, sku_id)) {
        // Sold out a moment ago: one read, so that a retried request still gets its
        // first answer, instead of the script over every bucket.
        return match commands::request_answer(&mut redis, &keys, user_id, &req.request_id).await {
            Ok(Some(answer)) => accepted(&answer),
            Ok(None) => {
                metrics::counter!(crate::telemetry::names::SOLD_OUT_FROM_MEMORY_TOTAL).increment(1);
                HttpResponse::Conflict().json(json!({"status": "SOLD_OUT"}))
            }
            Err(e) => {
                tracing::warn!(error = %e, "Redis replay read failed");
                unavailable("reservation store unavailable")
            }
        };
    }
    let reservation_id = Uuid::now_v7();
    let Ok(order_id) = front.ids.next_id() else {
        // The engine's node id lease is not current: minting would risk a duplicate.
        return unavailable("order ids unavailable; try again");
    };
    let order_no = order_no(order_id);
    let ttl_ms = front.settings.reservation_ttl_ms as i64;
    let reserved = scripts::reserve(
        &mut redis,
        &keys,
        sku.buckets,
        user_id,
        req.request_id,
        reservation_id,
        (now + TimeDelta::milliseconds(ttl_ms)).timestamp_millis(),
        front.settings.request_ttl_secs,
        &format!("{reservation_id}|{order_id}|{order_no}"),
        sku.end_at.timestamp_millis(),
    )
    .await;
    let answer = match reserved {
        Ok(Reserved::Ok { answer }) => answer,
        Ok(Reserved::Replay { answer }) => return accepted(&answer),
        Ok(Reserved::Duplicate { .. }) => {
            return HttpResponse::Conflict().json(json!({"status": "ALREADY_RESERVED"}))
        }
        Ok(Reserved::SoldOut) => {
            front.mark_sold_out((activity_id, sku_id));
            return HttpResponse::Conflict().json(json!({"status": "SOLD_OUT"}));
        }
        Err(e) => {
            tracing::warn!(error = %e, "Redis reservation failed");
            return unavailable("reservation store unavailable");
        }
    };
    let bucket: i16 = answer
        .rsplit('|')
        .next()
        .and_then(|b| b.parse().ok())
        .unwrap_or(0);
    let msg = OrderCreateMessage {
        message_id: Uuid::now_v7(),
        request_id: req.request_id,
        reservation_id,
        order_id,
        order_no,
        activity_id,
        sku_id,
        user_id,
        inventory_bucket: bucket,
        unit_price: sku.unit_price,
        currency: sku.currency.clone(),
        reserved_at: now,
        reservation_ttl_ms: ttl_ms,
        // Clamped as `activity create` bounds it: an activity's rules edited by hand
        // must not overflow the deadline.
        order_expire_at: now
            + TimeDelta::milliseconds(
                sku.order_ttl_ms
                    .clamp(1_000, crate::store::activity::MAX_ORDER_TTL_MS),
            ),
    };
    let pending = PendingMember {
        reservation_id,
        user_id,
        bucket,
        request_id: Some(req.request_id),
    };
    match publish(&front, &msg).await {
        Ok(()) => {}
        Err(Published::Unknown(e)) => {
            // The broker may hold the message: giving the unit back could sell it
            // twice. The reservation stays pending; if no message reaches the engine,
            // the reconciler releases it in PostgreSQL and gives the unit back after
            // its TTL. A retry of the same request replays the 202.
            tracing::warn!(error = %e, message_id = %msg.message_id, %reservation_id, order_id = msg.order_id, "order message sent but not confirmed; the reservation is kept for reconciliation");
            mark_queued(&front, &mut redis, &msg, ttl_ms).await;
            return HttpResponse::ServiceUnavailable()
                .insert_header((actix_web::http::header::RETRY_AFTER, "1"))
                .json(json!({
                    "status": "UNAVAILABLE",
                    "error": "the order queue did not confirm; retry the same request_id to learn the outcome",
                    "reservation_id": reservation_id,
                }));
        }
        Err(Published::NotQueued(e)) => {
            tracing::warn!(error = %e, message_id = %msg.message_id, %reservation_id, order_id = msg.order_id, "order message not accepted by the broker; releasing the reservation");
            return release_unqueued(
                &front,
                &mut redis,
                &keys,
                &pending,
                (activity_id, sku_id),
                now,
            )
            .await;
        }
    }
    mark_queued(&front, &mut redis, &msg, ttl_ms).await;
    accepted(&answer)
}

/// Lets the status query tell a queued reservation from an unknown one.
async fn mark_queued(
    front: &FrontStage,
    redis: &mut ::redis::aio::ConnectionManager,
    msg: &OrderCreateMessage,
    ttl_ms: i64,
) {
    let _ = commands::mark_queued(
        redis,
        &front.key_prefix,
        &msg.reservation_id,
        (msg.activity_id, msg.sku_id, msg.user_id),
        ttl_ms.saturating_mul(2),
    )
    .await;
}

/// The broker does not hold the reservation's message: record the reservation
/// RELEASED in PostgreSQL, then give its unit back and forget the request, so the
/// buyer can try again at once. Without PostgreSQL the unit stays reserved and the
/// reconciler settles it after its TTL (docs/DESIGN.md, "Redis give-backs").
async fn release_unqueued(
    front: &FrontStage,
    redis: &mut ::redis::aio::ConnectionManager,
    keys: &SkuKeys,
    pending: &PendingMember,
    (activity_id, sku_id): (i64, i64),
    now: chrono::DateTime<Utc>,
) -> HttpResponse {
    let unseen = reconcile::Unseen {
        reservation_id: pending.reservation_id,
        request_id: pending.request_id,
        activity_id,
        sku_id,
        user_id: pending.user_id,
        bucket: pending.bucket,
        reserved_at: now,
        expires_at: now + TimeDelta::milliseconds(front.settings.reservation_ttl_ms as i64),
    };
    let fenced = match front.pool.get().await {
        Ok(conn) => reconcile::fence(&conn.client, std::slice::from_ref(&unseen))
            .await
            .map(|won| won.contains(&pending.reservation_id)),
        Err(_) => Ok(false),
    };
    if !matches!(fenced, Ok(true)) {
        return unavailable("order queue unavailable; try again");
    }
    let given_back = scripts::give_back(redis, keys, pending, front.marker_ttl_secs).await;
    let request_id = pending.request_id.unwrap_or_default();
    let forgot = commands::forget_request(redis, keys, pending.user_id, &request_id).await;
    if given_back.is_err() || forgot.is_err() {
        // Released in PostgreSQL: the reconciler gives the unit back (its pending
        // entry is still there), and a retry replays this request's answer.
        tracing::warn!(reservation_id = %pending.reservation_id, "released reservation not yet given back to Redis; the reconciler will");
    }
    unavailable("order queue unavailable, reservation released; try again")
}

/// How a publish ended when it did not succeed.
enum Published {
    /// The broker does not hold the message (never sent, refused, unroutable).
    NotQueued(String),
    /// Sent, but not confirmed: the broker may hold it.
    Unknown(String),
}

async fn publish(front: &FrontStage, msg: &OrderCreateMessage) -> Result<(), Published> {
    let body = serde_json::to_vec(msg).map_err(|e| Published::NotQueued(e.to_string()))?;
    let shard = shard_for(
        msg.activity_id,
        msg.sku_id,
        msg.inventory_bucket,
        front.shards,
    );
    let (exchange, routing_key) = (
        front.names.orders_exchange(),
        Names::order_routing_key(shard),
    );
    // Reopening the channel (and the connection) after a broker blip is bounded like
    // the publish itself: a broker that does not answer is a 503, not a request
    // that hangs.
    let publisher = match tokio::time::timeout(PUBLISH_TIMEOUT, front.publisher()).await {
        Ok(publisher) => publisher.map_err(|e| Published::NotQueued(e.to_string()))?,
        Err(_) => {
            return Err(Published::NotQueued(
                "no broker channel within the publish timeout".into(),
            ))
        }
    };
    let publish = publisher.publish(
        &exchange,
        &routing_key,
        &body,
        crate::mq::message_properties(&msg.message_id.to_string()),
    );
    match tokio::time::timeout(PUBLISH_TIMEOUT, publish).await {
        Ok(Ok(())) if crate::failpoint_for!("frontstage_confirm_lost", msg.activity_id) => Err(
            Published::Unknown("failpoint frontstage_confirm_lost".into()),
        ),
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) if e.maybe_queued() => Err(Published::Unknown(e.to_string())),
        Ok(Err(e)) => Err(Published::NotQueued(e.to_string())),
        // The frames may have left: a confirm that does not come in time is not a no.
        Err(_) => Err(Published::Unknown("publish confirm timed out".into())),
    }
}

/// How long a reservation's publish (and reopening the channel for it) may take.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(5);

fn purchase_token_refused(outcome: &'static str, reason: String) -> HttpResponse {
    metrics::counter!(crate::telemetry::names::PURCHASE_TOKENS_TOTAL, "outcome" => outcome)
        .increment(1);
    HttpResponse::Forbidden().json(json!({"status": "PURCHASE_TOKEN_INVALID", "reason": reason}))
}

/// A reservation's `X-Purchase-Token`: genuine, unexpired, this user's, this SKU's.
fn check_purchase_token(
    secret: &secrecy::SecretString,
    http: &HttpRequest,
    bound: (i64, i64, i64),
) -> Result<(), Refused> {
    use secrecy::ExposeSecret;
    let Some(token) = http
        .headers()
        .get(PURCHASE_TOKEN)
        .and_then(|v| v.to_str().ok())
    else {
        return Err(Refused::PurchaseToken(
            "missing",
            format!("{PURCHASE_TOKEN} is required: fetch one from GET .../purchase-token during the sale"),
        ));
    };
    purchase_token::verify(
        secret.expose_secret().as_bytes(),
        token,
        bound,
        Utc::now().timestamp_millis(),
    )
    .map(|_| ())
    .map_err(|e| {
        let outcome = match e {
            purchase_token::InvalidToken::Expired => "expired",
            purchase_token::InvalidToken::Mismatch => "mismatch",
            _ => "invalid",
        };
        Refused::PurchaseToken(outcome, e.to_string())
    })
}

/// `GET /v1/activities/{a}/skus/{s}/purchase-token`: a token for this buyer and SKU,
/// only during the sale and at most `frontstage.purchase_token.max_per_user` times.
async fn purchase_token_for(
    front: web::Data<FrontStage>,
    http: HttpRequest,
    path: web::Path<(i64, i64)>,
) -> HttpResponse {
    use secrecy::ExposeSecret;
    let user_id = match front.admit(&http, true) {
        Ok(user) => user,
        Err(refused) => return refused.respond(),
    };
    let (activity_id, sku_id) = path.into_inner();
    let Some(secret) = &front.purchase_secret else {
        return HttpResponse::NotFound().json(
            json!({"status": "NOT_FOUND", "error": "purchase tokens are not required here"}),
        );
    };
    let sku = match front.sku(activity_id, sku_id).await {
        Ok(Some(sku)) => sku,
        Ok(None) => {
            return HttpResponse::NotFound()
                .json(json!({"status": "NOT_FOUND", "error": "no such activity and sku"}))
        }
        Err(response) => return response,
    };
    let now = Utc::now();
    if now < sku.start_at {
        return HttpResponse::Conflict()
            .json(json!({"status": "NOT_STARTED", "starts_at": sku.start_at}));
    }
    if now >= sku.end_at || sku.closed {
        return HttpResponse::Conflict().json(json!({"status": "SALE_CLOSED"}));
    }
    let keys = SkuKeys::new(&front.key_prefix, activity_id, sku_id);
    let mut redis = front.redis.clone();
    let count =
        commands::count_purchase_token(&mut redis, &keys, user_id, sku.end_at.timestamp_millis())
            .await;
    match count {
        Ok(n) if n > i64::from(front.settings.purchase_token.max_per_user) => {
            return HttpResponse::TooManyRequests().json(json!({
                "status": "TOO_MANY_TOKENS",
                "max_per_user": front.settings.purchase_token.max_per_user,
            }))
        }
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(error = %e, "Redis purchase-token count failed");
            return unavailable("reservation store unavailable");
        }
    }
    let ttl_ms = i64::try_from(front.settings.purchase_token.ttl_secs.saturating_mul(1000))
        .unwrap_or(i64::MAX);
    let expires_at_ms =
        (now.timestamp_millis().saturating_add(ttl_ms)).min(sku.end_at.timestamp_millis());
    let token = purchase_token::issue(
        secret.expose_secret().as_bytes(),
        &PurchaseClaims {
            user_id,
            activity_id,
            sku_id,
            expires_at_ms,
        },
    );
    metrics::counter!(crate::telemetry::names::PURCHASE_TOKENS_TOTAL, "outcome" => "issued")
        .increment(1);
    HttpResponse::Ok().json(json!({
        "token": token,
        "expires_at": chrono::DateTime::<Utc>::from_timestamp_millis(expires_at_ms),
    }))
}

/// The answer of a read on the primary: where from, and (when it could be read)
/// the position it reflects, read after the answer so that a client passing it
/// back as `X-Min-LSN` is never shown anything older.
async fn from_primary(
    front: &FrontStage,
    mut answer: actix_web::HttpResponseBuilder,
    body: serde_json::Value,
) -> HttpResponse {
    answer.insert_header((READ_SOURCE, "primary"));
    if let Ok(conn) = front.pool.get().await {
        if let Ok(position) = reads::wal_position(&conn.client, false).await {
            answer.insert_header((READ_LSN, Lsn::from_offset(position).to_string()));
        }
    }
    answer.json(body)
}

fn not_found() -> HttpResponse {
    HttpResponse::NotFound().json(json!({"status": "NOT_FOUND"}))
}

async fn reservation(
    front: web::Data<FrontStage>,
    http: HttpRequest,
    path: web::Path<Uuid>,
) -> HttpResponse {
    let user_id = match front.admit(&http, false) {
        Ok(user) => user,
        Err(refused) => return refused.respond(),
    };
    let reservation_id = path.into_inner();
    let Ok(conn) = front.pool.get().await else {
        return unavailable("database busy");
    };
    let found = match reads::load_reservation(&conn.client, reservation_id).await {
        Ok(found) => found,
        Err(_) => return unavailable("database unavailable"),
    };
    drop(conn);
    if let Some(r) = found {
        // Another user's reservation does not exist, as far as this one can tell.
        if r.user_id != user_id {
            return not_found();
        }
        let body = match r.status {
            10 => json!({
                "reservation_id": reservation_id, "status": "ORDERED",
                "order_id": r.order_id, "order_no": r.order_no,
                "expire_at": r.expire_at,
            }),
            20 => {
                json!({"reservation_id": reservation_id, "status": "REJECTED", "reason": r.failure_code})
            }
            40 => {
                json!({"reservation_id": reservation_id, "status": "RELEASED", "order_id": r.order_id})
            }
            _ => json!({"reservation_id": reservation_id, "status": "PENDING"}),
        };
        return from_primary(&front, HttpResponse::Ok(), body).await;
    }
    let mut redis = front.redis.clone();
    let owner = commands::queued_owner(&mut redis, &front.key_prefix, &reservation_id)
        .await
        .unwrap_or(None);
    match owner {
        Some(owner) if owner == user_id => {
            HttpResponse::Ok().json(json!({"reservation_id": reservation_id, "status": "QUEUED"}))
        }
        _ => not_found(),
    }
}

fn order_json(o: &reads::OrderView) -> serde_json::Value {
    let name = crate::domain::status::OrderStatus::from_code(o.status)
        .map(|s| s.name())
        .unwrap_or("UNKNOWN");
    json!({
        "order_id": o.order_id,
        "order_no": o.order_no,
        "status": screaming_snake(name),
        "activity_id": o.activity_id,
        "sku_id": o.sku_id,
        "user_id": o.user_id,
        "total_amount": o.total_amount,
        "currency": o.currency,
        "expire_at": o.expire_at,
        "paid_at": o.paid_at,
        "cancelled_at": o.cancelled_at,
    })
}

async fn order(
    front: web::Data<FrontStage>,
    http: HttpRequest,
    path: web::Path<i64>,
) -> HttpResponse {
    let user_id = match front.admit(&http, false) {
        Ok(user) => user,
        Err(refused) => return refused.respond(),
    };
    let order_id = path.into_inner();
    let Ok(conn) = front.pool.get().await else {
        return unavailable("database busy");
    };
    let found = reads::load_order(&conn.client, order_id).await;
    drop(conn);
    match found {
        Ok(Some(o)) if o.user_id == user_id => {
            from_primary(&front, HttpResponse::Ok(), order_json(&o)).await
        }
        // Not this user's (order ids are time-ordered, so they can be guessed).
        Ok(_) => not_found(),
        Err(_) => unavailable("database unavailable"),
    }
}

/// `GET /v1/me/orders?limit=&before=`: the buyer's orders, newest first. Stale reads
/// are allowed here (seed §14.4): a replica serves while its lag is within
/// `database.replica_max_lag_ms` and it has replayed at least the client's
/// `X-Min-LSN`; otherwise the primary does.
async fn my_orders(
    front: web::Data<FrontStage>,
    http: HttpRequest,
    query: web::Query<HistoryQuery>,
) -> HttpResponse {
    let user_id = match front.admit(&http, false) {
        Ok(user) => user,
        Err(refused) => return refused.respond(),
    };
    let limit = query.limit.unwrap_or(HISTORY_DEFAULT);
    if !(1..=HISTORY_MAX).contains(&limit) {
        return bad_request(format!("limit: must be between 1 and {HISTORY_MAX}"));
    }
    let min = match http
        .headers()
        .get(MIN_LSN)
        .map(|v| v.to_str().map(str::parse::<Lsn>))
    {
        None => None,
        Some(Ok(Ok(lsn))) => Some(lsn),
        Some(_) => return bad_request(format!("{MIN_LSN}: {}", crate::domain::lsn::BadLsn)),
    };
    if let Some(replica) = &front.replica {
        if replica.lag_ms.load(Ordering::Relaxed) <= front.replica_max_lag_ms {
            if let Some(answer) = replica_history(replica, user_id, query.before, limit, min).await
            {
                metrics::counter!(crate::telemetry::names::READS_TOTAL, "source" => "replica")
                    .increment(1);
                return answer;
            }
        }
    }
    let Ok(conn) = front.pool.get().await else {
        return unavailable("database busy");
    };
    let orders = match reads::order_history(&conn.client, user_id, query.before, limit).await {
        Ok(orders) => orders,
        Err(_) => return unavailable("database unavailable"),
    };
    drop(conn);
    metrics::counter!(crate::telemetry::names::READS_TOTAL, "source" => "primary").increment(1);
    from_primary(&front, HttpResponse::Ok(), history_json(&orders, limit)).await
}

/// The history from the replica, if it has replayed at least `min`. The position
/// checked against `min` is read before the list (a lower bound of what the list
/// shows); the one reported is read after it (an upper bound).
async fn replica_history(
    replica: &Replica,
    user_id: i64,
    before: Option<i64>,
    limit: i64,
    min: Option<Lsn>,
) -> Option<HttpResponse> {
    let conn = replica.pool.get().await.ok()?;
    let replayed = Lsn::from_offset(reads::wal_position(&conn.client, true).await.ok()?);
    if min.is_some_and(|min| replayed < min) {
        return None;
    }
    let orders = reads::order_history(&conn.client, user_id, before, limit)
        .await
        .ok()?;
    let after = Lsn::from_offset(reads::wal_position(&conn.client, true).await.ok()?);
    Some(
        HttpResponse::Ok()
            .insert_header((READ_SOURCE, "replica"))
            .insert_header((READ_LSN, after.to_string()))
            .json(history_json(&orders, limit)),
    )
}

fn history_json(orders: &[reads::OrderView], limit: i64) -> serde_json::Value {
    let next = (orders.len() as i64 == limit)
        .then(|| orders.last().map(|o| o.order_id))
        .flatten();
    json!({
        "orders": orders.iter().map(order_json).collect::<Vec<_>>(),
        "next_before": next,
    })
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
    ids: std::sync::Arc<IdGenerator>,
    readiness: Arc<Readiness>,
) -> Result<Running, HttpError> {
    let state = web::Data::new(FrontStage::connect(settings, pool, ids, readiness).await?);
    state.check_links().await;
    watch_links(Arc::downgrade(&state.clone().into_inner()));
    if state.replica.is_some() {
        watch_replica(Arc::downgrade(&state.clone().into_inner()));
    }
    shrink_limits(Arc::downgrade(&state.clone().into_inner()));
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

/// How often the replica's lag is measured.
const REPLICA_WATCH_INTERVAL: Duration = Duration::from_millis(250);

/// Measures the replica's lag every `REPLICA_WATCH_INTERVAL` while the front stage
/// lives, on the caller's arbiter.
fn watch_replica(front: std::sync::Weak<FrontStage>) {
    actix_rt::spawn(async move {
        while let Some(front) = front.upgrade() {
            front.measure_replica().await;
            drop(front);
            tokio::time::sleep(REPLICA_WATCH_INTERVAL).await;
        }
    });
}

/// Checks the links every `LINK_CHECK_INTERVAL` while the front stage lives.
fn watch_links(front: std::sync::Weak<FrontStage>) {
    actix_rt::spawn(async move {
        loop {
            tokio::time::sleep(LINK_CHECK_INTERVAL).await;
            let Some(front) = front.upgrade() else { break };
            front.check_links().await;
        }
    });
}

/// Every 10 s, while the front stage lives, the limiters forget keys that have
/// fully recovered, so a sale's hundreds of thousands of buyers do not stay in
/// memory.
fn shrink_limits(front: std::sync::Weak<FrontStage>) {
    actix_rt::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(10)).await;
            let Some(front) = front.upgrade() else { break };
            front.limits.shrink();
        }
    });
}

/// `RefundPending` → `REFUND_PENDING`: the status names the API answers with.
fn screaming_snake(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::screaming_snake;

    #[test]
    fn status_names_are_screaming_snake_case() {
        assert_eq!(screaming_snake("RefundPending"), "REFUND_PENDING");
        assert_eq!(screaming_snake("Created"), "CREATED");
    }
}
