//! What reconciling Redis with PostgreSQL reads: the SKUs whose sale is live, which
//! of a set of Redis reservations PostgreSQL knows, and each bucket's available
//! stock. Used by the reconciler service and by `check --redis`.

use std::collections::HashSet;

use tokio_postgres::Client;
use uuid::Uuid;

/// SKUs whose sale has started and ended less than a day ago: (activity, sku).
pub async fn live_skus(client: &Client) -> Result<Vec<(i64, i64)>, tokio_postgres::Error> {
    Ok(client
        .query(LIVE_SKUS, &[])
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect())
}

/// The ones among `ids` that PostgreSQL has a reservation row for.
pub async fn known_reservations(
    client: &Client,
    ids: &[Uuid],
) -> Result<HashSet<Uuid>, tokio_postgres::Error> {
    Ok(client
        .query(KNOWN_RESERVATIONS, &[&ids])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

/// One bucket's available stock in PostgreSQL.
#[derive(Debug, Clone, Copy)]
pub struct BucketAvailable {
    pub activity_id: i64,
    pub sku_id: i64,
    pub bucket: i16,
    pub available: i64,
}

/// Every bucket's available stock, of one activity or all, in key order.
pub async fn buckets_available(
    client: &Client,
    activity: Option<i64>,
) -> Result<Vec<BucketAvailable>, tokio_postgres::Error> {
    Ok(client
        .query(BUCKETS_AVAILABLE, &[&activity])
        .await?
        .iter()
        .map(|r| BucketAvailable {
            activity_id: r.get(0),
            sku_id: r.get(1),
            bucket: r.get(2),
            available: r.get(3),
        })
        .collect())
}

const LIVE_SKUS: &str = "
SELECT s.activity_id, s.sku_id
FROM seckill_sku AS s
JOIN seckill_activity AS a ON a.activity_id = s.activity_id
WHERE a.end_at > statement_timestamp() - interval '1 day'
  AND a.start_at <= statement_timestamp()";

const KNOWN_RESERVATIONS: &str =
    "SELECT reservation_id FROM inventory_reservation WHERE reservation_id = ANY($1)";

const BUCKETS_AVAILABLE: &str = "
SELECT activity_id, sku_id, bucket_no, available_stock::bigint FROM sku_inventory
WHERE $1::bigint IS NULL OR activity_id = $1 ORDER BY 1, 2, 3";
