//! The buyer's reads: `GET /v1/reservations/{id}` and `GET /v1/orders/{id}` answer
//! from the primary (never a replica, §14.4), so a client sees its own committed
//! order at once; `GET /v1/me/orders` lists the buyer's orders from a replica while
//! it is fresh enough. A buyer sees only their own reservations and orders: anyone
//! else's are "not found". Every answer says where it was read (`X-Read-Source`) and
//! the WAL position it reflects (`X-Read-LSN`).

use std::sync::atomic::Ordering;

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;
use uuid::Uuid;

use super::answers::{
    bad_request, not_found, unavailable, Order, OrderHistory, OrderState, Problem, Reservation,
    ReservationState,
};
use super::buyer::Reader;
use super::links::Replica;
use super::state::FrontStage;
use crate::domain::lsn::Lsn;
use crate::domain::status::ReservationStatus;
use crate::redis::commands;
use crate::store::reads::{self, OrderView, ReservationView};

/// Where a read was served, and the WAL position its answer reflects.
const READ_SOURCE: &str = "X-Read-Source";
const READ_LSN: &str = "X-Read-LSN";
/// A position the client has already seen: no older answer may be given.
const MIN_LSN: &str = "X-Min-LSN";

/// `GET /v1/me/orders?limit=`: at most this many, this many when not given.
const HISTORY_MAX: i64 = 100;
const HISTORY_DEFAULT: i64 = 20;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct HistoryQuery {
    /// How many orders, 1 to 100 (20 when not given).
    #[param(minimum = 1, maximum = 100)]
    limit: Option<i64>,
    /// Only orders older than this order id: the previous page's `next_before`.
    before: Option<i64>,
}

/// The answer of a read on the primary: where from, and (when it could be read)
/// the position it reflects, read after the answer so that a client passing it
/// back as `X-Min-LSN` is never shown anything older.
async fn from_primary(
    front: &FrontStage,
    mut answer: actix_web::HttpResponseBuilder,
    body: impl serde::Serialize,
) -> HttpResponse {
    answer.insert_header((READ_SOURCE, "primary"));
    if let Ok(conn) = front.pool.get().await {
        if let Ok(position) = reads::wal_position(&conn.client, false).await {
            answer.insert_header((READ_LSN, Lsn::from_offset(position).to_string()));
        }
    }
    answer.json(body)
}

/// A reservation PostgreSQL has recorded, as the buyer sees it.
fn reservation_json(reservation_id: Uuid, r: &ReservationView) -> Reservation {
    match ReservationStatus::from_code(r.status) {
        Some(ReservationStatus::Ordered) => Reservation {
            order_id: r.order_id,
            order_no: r.order_no.clone(),
            expire_at: r.expire_at,
            ..Reservation::new(reservation_id, ReservationState::Ordered)
        },
        Some(ReservationStatus::Rejected) => Reservation {
            reason: r.failure_code.clone(),
            ..Reservation::new(reservation_id, ReservationState::Rejected)
        },
        Some(ReservationStatus::Released) => Reservation {
            order_id: r.order_id,
            ..Reservation::new(reservation_id, ReservationState::Released)
        },
        _ => Reservation::new(reservation_id, ReservationState::Pending),
    }
}

/// A reservation of the buyer's: `QUEUED` until PostgreSQL has it.
#[utoipa::path(
    get,
    path = "/v1/reservations/{reservation_id}",
    tag = "buyer",
    params(("reservation_id" = Uuid, Path, description = "From the 202 of the reservation")),
    responses(
        (status = 200, description = "The reservation", body = Reservation, headers(
                ("X-Read-Source" = String, description = "`primary` or `replica`: where it was read"),
                ("X-Read-LSN" = String, description = "The WAL position the answer reflects, when known; pass it back as `X-Min-LSN`"),
            )),
        (status = 404, description = "No such reservation, or not this buyer's (`NOT_FOUND`)", body = Problem),
        (status = 400, description = "A parameter is malformed (`INVALID_REQUEST`)", body = Problem),
        (status = 401, description = "No valid credentials (`UNAUTHORIZED`)", body = Problem,
            headers(("WWW-Authenticate" = String, description = "`Bearer`, RFC 6750"))),
        (status = 429, description = "Over the per-address or per-user read limit (`RATE_LIMITED`)", body = Problem,
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
        (status = 503, description = "PostgreSQL is unavailable for now (`UNAVAILABLE`)", body = Problem,
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
    ),
    security(("buyer" = []))
)]
pub(super) async fn reservation(
    Reader(user_id): Reader,
    front: web::Data<FrontStage>,
    path: web::Path<Uuid>,
) -> HttpResponse {
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
        let body = reservation_json(reservation_id, &r);
        return from_primary(&front, HttpResponse::Ok(), body).await;
    }
    let mut redis = front.redis.conn();
    let owner = commands::queued_owner(&mut redis, &front.key_prefix, &reservation_id)
        .await
        .unwrap_or(None);
    match owner {
        Some(owner) if owner == user_id => {
            HttpResponse::Ok().json(Reservation::new(reservation_id, ReservationState::Queued))
        }
        _ => not_found(),
    }
}

fn order_json(o: &OrderView) -> Order {
    Order {
        order_id: o.order_id,
        order_no: o.order_no.clone(),
        status: OrderState::of(o.status),
        activity_id: o.activity_id,
        sku_id: o.sku_id,
        user_id: o.user_id,
        total_amount: o.total_amount,
        currency: o.currency.clone(),
        expire_at: o.expire_at,
        paid_at: o.paid_at,
        cancelled_at: o.cancelled_at,
    }
}

/// An order of the buyer's, read from the primary.
#[utoipa::path(
    get,
    path = "/v1/orders/{order_id}",
    tag = "buyer",
    params(("order_id" = i64, Path, minimum = 1, description = "From the 202 of the reservation")),
    responses(
        (status = 200, description = "The order", body = Order, headers(
                ("X-Read-Source" = String, description = "`primary` or `replica`: where it was read"),
                ("X-Read-LSN" = String, description = "The WAL position the answer reflects, when known; pass it back as `X-Min-LSN`"),
            )),
        (status = 404, description = "No such order, or not this buyer's (`NOT_FOUND`)", body = Problem),
        (status = 400, description = "A parameter is malformed (`INVALID_REQUEST`)", body = Problem),
        (status = 401, description = "No valid credentials (`UNAUTHORIZED`)", body = Problem,
            headers(("WWW-Authenticate" = String, description = "`Bearer`, RFC 6750"))),
        (status = 429, description = "Over the per-address or per-user read limit (`RATE_LIMITED`)", body = Problem,
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
        (status = 503, description = "PostgreSQL is unavailable for now (`UNAVAILABLE`)", body = Problem,
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
    ),
    security(("buyer" = []))
)]
pub(super) async fn order(
    Reader(user_id): Reader,
    front: web::Data<FrontStage>,
    path: web::Path<i64>,
) -> HttpResponse {
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
/// are allowed here (§14.4): a replica serves while its lag is within
/// `database.replica_max_lag_ms` and it has replayed at least the client's
/// `X-Min-LSN`; otherwise the primary does.
#[utoipa::path(
    get,
    path = "/v1/me/orders",
    tag = "buyer",
    params(
        HistoryQuery,
        ("X-Min-LSN" = Option<String>, Header, nullable = false, min_length = 3, max_length = 17, pattern = r"^[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}$",
            description = "An `X-Read-LSN` seen before: no older answer is given"),
    ),
    responses(
        (status = 200, description = "The buyer's orders, newest first", body = OrderHistory, headers(
                ("X-Read-Source" = String, description = "`primary` or `replica`: where it was read"),
                ("X-Read-LSN" = String, description = "The WAL position the answer reflects, when known; pass it back as `X-Min-LSN`"),
            )),
        (status = 400, description = "A parameter is malformed (`INVALID_REQUEST`)", body = Problem),
        (status = 401, description = "No valid credentials (`UNAUTHORIZED`)", body = Problem,
            headers(("WWW-Authenticate" = String, description = "`Bearer`, RFC 6750"))),
        (status = 429, description = "Over the per-address or per-user read limit (`RATE_LIMITED`)", body = Problem,
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
        (status = 503, description = "PostgreSQL is unavailable for now (`UNAVAILABLE`)", body = Problem,
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
    ),
    security(("buyer" = []))
)]
pub(super) async fn my_orders(
    Reader(user_id): Reader,
    front: web::Data<FrontStage>,
    http: HttpRequest,
    query: web::Query<HistoryQuery>,
) -> HttpResponse {
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

fn history_json(orders: &[OrderView], limit: i64) -> OrderHistory {
    let next = (orders.len() as i64 == limit)
        .then(|| orders.last().map(|o| o.order_id))
        .flatten();
    OrderHistory {
        orders: orders.iter().map(order_json).collect(),
        next_before: next,
    }
}
