//! The front stage's reads: what a reservation needs to know of its SKU, the status
//! of a reservation or an order (always on the primary), a buyer's order history
//! (on a replica when one is fresh enough, seed §14.4), and the WAL position each
//! answer reflects (`X-Read-LSN`).

use chrono::{DateTime, Utc};
use tokio_postgres::Client;
use uuid::Uuid;

/// A SKU as the front stage sells it.
#[derive(Debug, Clone)]
pub struct SkuInfo {
    pub buckets: i16,
    pub unit_price: i64,
    pub currency: String,
    pub order_ttl_ms: i64,
    pub start_at: DateTime<Utc>,
    pub end_at: DateTime<Utc>,
    /// The activity was ended or cancelled (`activity close`).
    pub closed: bool,
}

pub async fn load_sku(
    client: &Client,
    activity_id: i64,
    sku_id: i64,
) -> Result<Option<SkuInfo>, tokio_postgres::Error> {
    Ok(client
        .query_opt(LOAD_SKU, &[&activity_id, &sku_id])
        .await?
        .map(|row| SkuInfo {
            buckets: row.get(0),
            unit_price: row.get(1),
            currency: row.get(2),
            order_ttl_ms: row.get(3),
            start_at: row.get(4),
            end_at: row.get(5),
            closed: row.get(6),
        }))
}

/// A reservation PostgreSQL has seen, with its order if it has one.
#[derive(Debug, Clone)]
pub struct ReservationView {
    pub user_id: i64,
    pub status: i16,
    pub failure_code: Option<String>,
    pub order_id: Option<i64>,
    pub order_no: Option<String>,
    pub expire_at: Option<DateTime<Utc>>,
}

pub async fn load_reservation(
    client: &Client,
    reservation_id: Uuid,
) -> Result<Option<ReservationView>, tokio_postgres::Error> {
    Ok(client
        .query_opt(LOAD_RESERVATION, &[&reservation_id])
        .await?
        .map(|row| ReservationView {
            status: row.get(0),
            failure_code: row.get(1),
            order_id: row.get(2),
            order_no: row.get(3),
            expire_at: row.get(4),
            user_id: row.get(5),
        }))
}

/// An order as its buyer sees it.
#[derive(Debug, Clone)]
pub struct OrderView {
    pub order_id: i64,
    pub order_no: String,
    pub status: i16,
    pub activity_id: i64,
    pub sku_id: i64,
    pub user_id: i64,
    pub total_amount: i64,
    pub currency: String,
    pub expire_at: DateTime<Utc>,
    pub paid_at: Option<DateTime<Utc>>,
    pub cancelled_at: Option<DateTime<Utc>>,
}

pub async fn load_order(
    client: &Client,
    order_id: i64,
) -> Result<Option<OrderView>, tokio_postgres::Error> {
    Ok(client
        .query_opt(LOAD_ORDER, &[&order_id])
        .await?
        .map(|row| order_view(&row)))
}

fn order_view(row: &tokio_postgres::Row) -> OrderView {
    OrderView {
        order_id: row.get(10),
        order_no: row.get(0),
        status: row.get(1),
        activity_id: row.get(2),
        sku_id: row.get(3),
        user_id: row.get(4),
        total_amount: row.get(5),
        currency: row.get(6),
        expire_at: row.get(7),
        paid_at: row.get(8),
        cancelled_at: row.get(9),
    }
}

/// A buyer's orders, newest first, at most `limit`, older than `before` if given.
pub async fn order_history(
    client: &Client,
    user_id: i64,
    before: Option<i64>,
    limit: i64,
) -> Result<Vec<OrderView>, tokio_postgres::Error> {
    Ok(client
        .query(ORDER_HISTORY, &[&user_id, &before, &limit])
        .await?
        .iter()
        .map(order_view)
        .collect())
}

/// Where a server stands in the WAL, as a number (`pg_lsn` minus `0/0`): the
/// primary's current position, or how far a replica has replayed.
pub async fn wal_position(client: &Client, replica: bool) -> Result<i64, tokio_postgres::Error> {
    let sql = if replica {
        REPLAYED_POSITION
    } else {
        CURRENT_POSITION
    };
    Ok(client.query_one(sql, &[]).await?.get(0))
}

/// The age of the last transaction a replica replayed, in milliseconds; `None`
/// when it has replayed none since it started.
pub async fn replay_age_ms(client: &Client) -> Result<Option<i64>, tokio_postgres::Error> {
    Ok(client.query_one(REPLAY_AGE, &[]).await?.get(0))
}

const LOAD_SKU: &str = "
SELECT s.inventory_bucket_count, s.unit_price, s.currency,
       coalesce((a.rules->>'order_ttl_ms')::bigint, 900000), a.start_at, a.end_at,
       a.status IN (30, 40)
FROM seckill_sku AS s
JOIN seckill_activity AS a ON a.activity_id = s.activity_id
WHERE s.activity_id = $1 AND s.sku_id = $2";

const LOAD_RESERVATION: &str = "
SELECT r.status, r.failure_code, r.order_id, o.order_no, o.expire_at, r.user_id
FROM inventory_reservation AS r
LEFT JOIN orders AS o ON o.order_id = r.order_id
WHERE r.reservation_id = $1";

const LOAD_ORDER: &str = "
SELECT order_no, status, activity_id, sku_id, user_id, total_amount, currency, expire_at,
       paid_at, cancelled_at, order_id
FROM orders WHERE order_id = $1";

/// A buyer has an order or two per sale (one per SKU): `idx_orders_user_created`
/// finds them, and the sort is of those few.
const ORDER_HISTORY: &str = "
SELECT order_no, status, activity_id, sku_id, user_id, total_amount, currency, expire_at,
       paid_at, cancelled_at, order_id
FROM orders
WHERE user_id = $1 AND ($2::bigint IS NULL OR order_id < $2)
ORDER BY order_id DESC
LIMIT $3";

const CURRENT_POSITION: &str = "SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint";
const REPLAYED_POSITION: &str =
    "SELECT coalesce((pg_last_wal_replay_lsn() - '0/0'::pg_lsn)::bigint, 0)";
const REPLAY_AGE: &str = "
SELECT (extract(epoch FROM clock_timestamp() - pg_last_xact_replay_timestamp()) * 1000)::bigint";
