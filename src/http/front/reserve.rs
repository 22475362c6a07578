//! `POST /v1/activities/{activity_id}/skus/{sku_id}/reservations`: reserves a unit in
//! Redis (the fast pre-filter), queues the `order.create` message with publisher
//! confirms, and answers 202 `QUEUED`; a retry of the same `request_id` replays the
//! first answer. When the broker does not take the message, the reservation is
//! released (fenced in PostgreSQL first) and its unit given back.

use actix_web::{web, HttpRequest, HttpResponse};
use chrono::{DateTime, TimeDelta, Utc};
use redis::aio::ConnectionManager;
use serde::Deserialize;
use uuid::Uuid;

use super::answers::{
    accepted, bad_request, conflict, no_such_sku, unavailable, unavailable_with, Problem,
    ProblemStatus, Queued,
};
use super::buyer::Buyer;
use super::purchase_token::check_purchase_token;
use super::state::FrontStage;
use crate::domain::ids::order_no;
use crate::domain::message::OrderCreateMessage;
use crate::domain::shard::shard_for;
use crate::mq::topology::Names;
use crate::redis::commands;
use crate::redis::keys::{PendingMember, SkuKeys};
use crate::redis::scripts::{self, ReserveCall, Reserved};
use crate::redis::WorkerLink;
use crate::store::reads::SkuInfo;
use crate::store::reconcile;

/// A reservation request. The buyer is the one the credentials name; a body naming
/// a `user_id` is refused.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ReserveRequest {
    /// The client's id for this attempt: a retry with the same id gets the first
    /// answer (not the nil UUID).
    request_id: Uuid,
    /// Refused when present: the buyer is who the credentials say, and a client
    /// still sending it should find out rather than be silently ignored.
    #[serde(default)]
    #[schema(ignore)]
    user_id: Option<serde_json::Value>,
}

impl ReserveRequest {
    /// The request, or why it is not one (answered 400).
    fn parse(body: &[u8]) -> Result<Self, String> {
        let req: ReserveRequest = serde_json::from_slice(body).map_err(|e| e.to_string())?;
        if req.user_id.is_some() {
            return Err(
                "user_id: not accepted in the body; the buyer is the one the credentials name"
                    .into(),
            );
        }
        if req.request_id.is_nil() {
            return Err("request_id: must not be the nil UUID".into());
        }
        Ok(req)
    }
}

/// The largest reservation body read (a request id: a few dozen bytes).
pub(super) const MAX_BODY_BYTES: usize = 16 * 1024;

/// The body, read within `frontstage.limits.body_read_ms`: a client that trickles
/// it is answered 408 and its connection closed, so it holds no descriptor longer.
async fn read_body(front: &FrontStage, payload: web::Payload) -> Result<web::Bytes, HttpResponse> {
    let deadline = std::time::Duration::from_millis(front.settings.limits.body_read_ms);
    match tokio::time::timeout(deadline, payload.to_bytes_limited(MAX_BODY_BYTES)).await {
        Ok(Ok(Ok(body))) => Ok(body),
        Ok(Ok(Err(e))) => Err(bad_request(format!("body: {e}"))),
        Ok(Err(_)) => Err(Problem::new(ProblemStatus::InvalidRequest)
            .error(format!("body: larger than {MAX_BODY_BYTES} bytes"))
            .answer(HttpResponse::PayloadTooLarge().force_close().take())),
        Err(_) => Err(Problem::new(ProblemStatus::InvalidRequest)
            .error("body: not received within frontstage.limits.body_read_ms")
            .answer(HttpResponse::RequestTimeout().force_close().take())),
    }
}

/// How long a reservation's publish (and reopening the channel for it) may take.
const PUBLISH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Reserves one unit for the buyer and queues its order.
#[utoipa::path(
    post,
    path = "/v1/activities/{activity_id}/skus/{sku_id}/reservations",
    tag = "buyer",
    params(
        ("activity_id" = i64, Path, minimum = 1, description = "The sale"),
        ("sku_id" = i64, Path, minimum = 1, description = "The SKU on sale"),
        ("X-Purchase-Token" = Option<String>, Header, nullable = false,
            description = "Required when `frontstage.purchase_token.required`: the token \
                           GET .../purchase-token gave this buyer for this SKU"),
    ),
    request_body(content = ReserveRequest, content_type = "application/json"),
    responses(
        (status = 202, description = "Reserved and queued; the same answer for every retry of `request_id`", body = Queued),
        (status = 400, description = "The body is not a reservation request (`INVALID_REQUEST`)", body = Problem),
        (status = 401, description = "No valid credentials (`UNAUTHORIZED`)", body = Problem,
            headers(("WWW-Authenticate" = String, description = "`Bearer`, RFC 6750"))),
        (status = 403, description = "The purchase token is missing or not good for this buyer and SKU (`PURCHASE_TOKEN_INVALID`)", body = Problem),
        (status = 404, description = "No such activity and SKU (`NOT_FOUND`)", body = Problem),
        (status = 408, description = "The body did not arrive within `frontstage.limits.body_read_ms` (`INVALID_REQUEST`)", body = Problem),
        (status = 409, description = "`SALE_CLOSED`, `NOT_ACTIVE`, `SOLD_OUT` or `ALREADY_RESERVED`", body = Problem),
        (status = 413, description = "The body is larger than 16 KiB (`INVALID_REQUEST`)", body = Problem),
        (status = 429, description = "Over the per-address or per-user limit (`RATE_LIMITED`)", body = Problem,
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
        (status = 503, description = "Redis, the broker or PostgreSQL is unavailable for now (`UNAVAILABLE`); retry the same `request_id`", body = Problem,
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
    ),
    security(("buyer" = []))
)]
pub(super) async fn reserve(
    Buyer(user_id): Buyer,
    front: web::Data<FrontStage>,
    worker: web::Data<WorkerLink>,
    http: HttpRequest,
    path: web::Path<(i64, i64)>,
    payload: web::Payload,
) -> HttpResponse {
    let (activity_id, sku_id) = path.into_inner();
    let body = match read_body(&front, payload).await {
        Ok(body) => body,
        Err(response) => return response,
    };
    let req = match ReserveRequest::parse(&body) {
        Ok(req) => req,
        Err(why) => return bad_request(why),
    };
    if let Some(secret) = &front.purchase_secret {
        if let Err(refused) = check_purchase_token(secret, &http, (user_id, activity_id, sku_id)) {
            return refused.respond();
        }
    }
    let sku = match front.skus.get((activity_id, sku_id)).await {
        Ok(Some(sku)) => sku,
        Ok(None) => return no_such_sku(),
        Err(e) => return unavailable(e.reason()),
    };
    let now = Utc::now();
    if sku.closed {
        return conflict(ProblemStatus::SaleClosed);
    }
    if now < sku.start_at || now >= sku.end_at {
        return conflict(ProblemStatus::NotActive);
    }
    let keys = SkuKeys::new(&front.key_prefix, activity_id, sku_id);
    let mut redis = worker.conn();
    if front.skus.known_sold_out((activity_id, sku_id)) {
        return replay_or_sold_out(&mut redis, &keys, user_id, &req.request_id).await;
    }
    let reservation_id = Uuid::now_v7();
    let Ok(order_id) = front.ids.next_id() else {
        // The engine's node id lease is not current: minting would risk a duplicate.
        return unavailable("order ids unavailable; try again");
    };
    let order_no = order_no(order_id);
    let ttl_ms = front.settings.reservation_ttl_ms as i64;
    let call = ReserveCall {
        user_id,
        request_id: req.request_id,
        reservation_id,
        order_id,
        order_no: &order_no,
        expires_at_ms: (now + TimeDelta::milliseconds(ttl_ms)).timestamp_millis(),
        request_ttl_secs: front.settings.request_ttl_secs,
        sale_end_ms: sku.end_at.timestamp_millis(),
    };
    let answer = match scripts::reserve(&mut redis, &keys, sku.buckets, &call).await {
        Ok(Reserved::Ok(answer)) => answer,
        Ok(Reserved::Replay(answer)) => return accepted(&answer),
        Ok(Reserved::Duplicate { .. }) => return conflict(ProblemStatus::AlreadyReserved),
        Ok(Reserved::SoldOut) => {
            front.skus.mark_sold_out((activity_id, sku_id));
            return conflict(ProblemStatus::SoldOut);
        }
        Ok(Reserved::Lost) => {
            front
                .rebuilds
                .start(activity_id, super::rebuilds::Trigger::LostKeys);
            return unavailable("the sale's Redis keys are being rebuilt from PostgreSQL; retry");
        }
        Err(e) => {
            tracing::warn!(error = %e, "Redis reservation failed");
            return unavailable("reservation store unavailable");
        }
    };
    let msg = order_message(
        &call,
        (activity_id, sku_id),
        answer.bucket,
        &sku,
        now,
        ttl_ms,
    );
    match publish(&front, &msg).await {
        Ok(()) => {
            mark_queued(&mut redis, &front, &msg, ttl_ms).await;
            accepted(&answer)
        }
        Err(Published::Unknown(e)) => {
            // The broker may hold the message: giving the unit back could sell it
            // twice. The reservation stays pending; if no message reaches the engine,
            // the reconciler releases it in PostgreSQL and gives the unit back after
            // its TTL. A retry of the same request replays the 202.
            tracing::warn!(error = %e, message_id = %msg.message_id, %reservation_id, order_id, "order message sent but not confirmed; the reservation is kept for reconciliation");
            mark_queued(&mut redis, &front, &msg, ttl_ms).await;
            unavailable_with(Problem {
                reservation_id: Some(reservation_id),
                ..Problem::new(ProblemStatus::Unavailable).error(
                    "the order queue did not confirm; retry the same request_id to learn the outcome",
                )
            })
        }
        Err(Published::NotQueued(e)) => {
            tracing::warn!(error = %e, message_id = %msg.message_id, %reservation_id, order_id, "order message not accepted by the broker; releasing the reservation");
            let pending = PendingMember {
                reservation_id,
                user_id,
                bucket: answer.bucket,
                request_id: Some(req.request_id),
            };
            release_unqueued(&front, &keys, &pending, (activity_id, sku_id), now).await
        }
    }
}

/// Sold out a moment ago: one read, so that a retried request still gets its first
/// answer, instead of the script over every bucket.
async fn replay_or_sold_out(
    redis: &mut ConnectionManager,
    keys: &SkuKeys,
    user_id: i64,
    request_id: &Uuid,
) -> HttpResponse {
    match commands::request_answer(redis, keys, user_id, request_id).await {
        Ok(Some(answer)) => accepted(&answer),
        Ok(None) => {
            metrics::counter!(crate::telemetry::names::SOLD_OUT_FROM_MEMORY_TOTAL).increment(1);
            conflict(ProblemStatus::SoldOut)
        }
        Err(e) => {
            tracing::warn!(error = %e, "Redis replay read failed");
            unavailable("reservation store unavailable")
        }
    }
}

/// The `order.create` message of a reservation the script granted from `bucket`.
fn order_message(
    call: &ReserveCall<'_>,
    (activity_id, sku_id): (i64, i64),
    bucket: i16,
    sku: &SkuInfo,
    now: DateTime<Utc>,
    ttl_ms: i64,
) -> OrderCreateMessage {
    OrderCreateMessage {
        schema_version: crate::domain::message::SCHEMA_VERSION,
        message_id: Uuid::now_v7(),
        request_id: call.request_id,
        reservation_id: call.reservation_id,
        order_id: call.order_id,
        order_no: call.order_no.to_owned(),
        activity_id,
        sku_id,
        user_id: call.user_id,
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
    }
}

/// Lets the status query tell a queued reservation from an unknown one.
async fn mark_queued(
    redis: &mut ConnectionManager,
    front: &FrontStage,
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
    keys: &SkuKeys,
    pending: &PendingMember,
    (activity_id, sku_id): (i64, i64),
    now: DateTime<Utc>,
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
    let mut redis = front.redis.conn();
    let given_back = scripts::give_back(&mut redis, keys, pending, front.marker_ttl_secs).await;
    let request_id = pending.request_id.unwrap_or_default();
    let forgot = commands::forget_request(&mut redis, keys, pending.user_id, &request_id).await;
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
    let publisher = match tokio::time::timeout(PUBLISH_TIMEOUT, front.links.publisher()).await {
        Ok(publisher) => publisher.map_err(|e| Published::NotQueued(e.to_string()))?,
        Err(_) => {
            return Err(Published::NotQueued(
                "no broker channel within the publish timeout".into(),
            ))
        }
    };
    let properties = crate::mq::order_properties(
        &msg.message_id.to_string(),
        &body,
        front.signing_secret.as_ref(),
    );
    let publish = publisher.publish(&exchange, &routing_key, &body, properties);
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
