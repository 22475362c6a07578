//! What reconciling Redis with PostgreSQL reads and writes: the SKUs whose sale is
//! live, which of a set of Redis reservations the engine has processed, each
//! bucket's available stock (also both in one snapshot, for the drift), and the fence
//! that records a reservation as RELEASED before its Redis unit is given back
//! (docs/DESIGN.md, "Redis give-backs"). Used by the reconciler service, the front
//! stage and `check --redis` (through `crate::drift`).

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use tokio_postgres::Client;
use uuid::Uuid;

use crate::domain::status::ReservationStatus;

/// SKUs whose sale has started and ended less than a day ago: (activity, sku).
pub async fn live_skus(client: &Client) -> Result<Vec<(i64, i64)>, tokio_postgres::Error> {
    Ok(client
        .query(LIVE_SKUS, &[])
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect())
}

/// The `failure_code` of a reservation recorded RELEASED by `fence`: no message for
/// it had reached the engine, and its Redis unit is (being) given back.
pub const FENCED: &str = "RELEASED_UNSEEN";

/// A Redis reservation to fence: what its pending entry says of it.
#[derive(Debug, Clone)]
pub struct Unseen {
    pub reservation_id: Uuid,
    /// `None` for a pending entry written before it carried the request id: the
    /// reservation id stands in (unique, and no later message can match it).
    pub request_id: Option<Uuid>,
    pub activity_id: i64,
    pub sku_id: i64,
    pub user_id: i64,
    pub bucket: i16,
    pub reserved_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

/// Records each of `unseen` as RELEASED unless the engine has a row for it, and
/// returns the ones recorded so, now or by an earlier call whose give-back may not
/// have happened: exactly those whose Redis unit may be given back. A message that
/// arrives afterwards finds its reservation RELEASED and creates no order; one the
/// engine committed first wins the row, and its reservation is not returned.
pub async fn fence(
    client: &Client,
    unseen: &[Unseen],
) -> Result<HashSet<Uuid>, tokio_postgres::Error> {
    if unseen.is_empty() {
        return Ok(HashSet::new());
    }
    let ids: Vec<Uuid> = unseen.iter().map(|u| u.reservation_id).collect();
    let requests: Vec<Uuid> = unseen
        .iter()
        .map(|u| u.request_id.unwrap_or(u.reservation_id))
        .collect();
    let activities: Vec<i64> = unseen.iter().map(|u| u.activity_id).collect();
    let skus: Vec<i64> = unseen.iter().map(|u| u.sku_id).collect();
    let users: Vec<i64> = unseen.iter().map(|u| u.user_id).collect();
    let buckets: Vec<i16> = unseen.iter().map(|u| u.bucket).collect();
    let reserved: Vec<DateTime<Utc>> = unseen.iter().map(|u| u.reserved_at).collect();
    let expires: Vec<DateTime<Utc>> = unseen.iter().map(|u| u.expires_at).collect();
    Ok(client
        .query(
            FENCE,
            &[
                &ids,
                &requests,
                &activities,
                &skus,
                &users,
                &buckets,
                &reserved,
                &expires,
                &FENCED,
            ],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

/// The ones among `ids` that the engine has a reservation row for (not counting
/// those `fence` recorded: their Redis unit is still to be, or being, given back).
pub async fn known_reservations(
    client: &Client,
    ids: &[Uuid],
) -> Result<HashSet<Uuid>, tokio_postgres::Error> {
    Ok(client
        .query(KNOWN_RESERVATIONS, &[&ids, &FENCED])
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

/// `known_reservations` of `ids` and `buckets_available` of `activity`, read in one
/// snapshot (`check --redis` and the reconciler compare them with Redis read just
/// before: a reservation settled in between must show once, not in neither read).
pub async fn known_and_available(
    client: &Client,
    ids: &[Uuid],
    activity: Option<i64>,
) -> Result<(HashSet<Uuid>, Vec<BucketAvailable>), tokio_postgres::Error> {
    client
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .await?;
    let read = async {
        let known = known_reservations(client, ids).await?;
        let available = buckets_available(client, activity).await?;
        Ok::<_, tokio_postgres::Error>((known, available))
    }
    .await;
    // Read only: ending it either way changes nothing.
    client.batch_execute("ROLLBACK").await?;
    read
}

/// One SKU as a rebuild of its Redis keys needs it, from one snapshot.
#[derive(Debug, Clone)]
pub struct SkuFigures {
    pub sku_id: i64,
    pub end_at: DateTime<Utc>,
    /// Available units per bucket, in bucket order.
    pub available: Vec<i64>,
    /// (user, reservation) of each buyer whose reservation holds a unit.
    pub holders: Vec<(i64, Uuid)>,
}

/// The SKUs of `activity` (none: no such activity).
pub async fn activity_skus(
    client: &Client,
    activity_id: i64,
) -> Result<Vec<i64>, tokio_postgres::Error> {
    Ok(client
        .query(ACTIVITY_SKUS, &[&activity_id])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

/// Opens the snapshot a rebuild of `activity` reads, under a lock that lets one
/// rebuild of it run at a time, across instances: false (nothing open) when another
/// holds it. The caller ends it with `end_rebuild` once it has written Redis.
pub async fn begin_rebuild(
    client: &Client,
    activity_id: i64,
) -> Result<bool, tokio_postgres::Error> {
    client
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .await?;
    let locked = client.query_one(TRY_REBUILD_LOCK, &[&activity_id]).await;
    match locked {
        Ok(row) if row.get::<_, bool>(0) => Ok(true),
        other => {
            client.batch_execute("ROLLBACK").await?;
            other.map(|_| false)
        }
    }
}

/// Within `begin_rebuild`'s snapshot: which of `pending` PostgreSQL knows, and each
/// SKU's figures.
pub async fn rebuild_figures(
    client: &Client,
    activity_id: i64,
    pending: &[Uuid],
) -> Result<(HashSet<Uuid>, Vec<SkuFigures>), tokio_postgres::Error> {
    let known = known_reservations(client, pending).await?;
    let holding: Vec<i16> = [
        ReservationStatus::PendingDb,
        ReservationStatus::Ordered,
        ReservationStatus::ReleasePending,
        ReservationStatus::ManualRequired,
    ]
    .iter()
    .map(|s| s.code())
    .collect();
    let mut skus: Vec<SkuFigures> = client
        .query(SKUS_WITH_END, &[&activity_id])
        .await?
        .iter()
        .map(|r| SkuFigures {
            sku_id: r.get(0),
            end_at: r.get(1),
            available: Vec::new(),
            holders: Vec::new(),
        })
        .collect();
    for b in buckets_available(client, Some(activity_id)).await? {
        if let Some(sku) = skus.iter_mut().find(|s| s.sku_id == b.sku_id) {
            sku.available.push(b.available);
        }
    }
    for r in client.query(HOLDERS, &[&activity_id, &holding]).await? {
        let sku_id: i64 = r.get(0);
        if let Some(sku) = skus.iter_mut().find(|s| s.sku_id == sku_id) {
            sku.holders.push((r.get(1), r.get(2)));
        }
    }
    Ok((known, skus))
}

/// Ends `begin_rebuild`'s snapshot and lock (read only: nothing to keep).
pub async fn end_rebuild(client: &Client) -> Result<(), tokio_postgres::Error> {
    client.batch_execute("ROLLBACK").await
}

const ACTIVITY_SKUS: &str = "SELECT sku_id FROM seckill_sku WHERE activity_id = $1 ORDER BY 1";

/// Lock class 727275: one rebuild of an activity's Redis keys at a time.
const TRY_REBUILD_LOCK: &str =
    "SELECT pg_try_advisory_xact_lock(727275, ($1::bigint % 2147483647)::int)";

const SKUS_WITH_END: &str = "
SELECT s.sku_id, a.end_at FROM seckill_sku AS s
JOIN seckill_activity AS a ON a.activity_id = s.activity_id
WHERE s.activity_id = $1 ORDER BY 1";

const HOLDERS: &str = "
SELECT sku_id, user_id, reservation_id FROM inventory_reservation
WHERE activity_id = $1 AND status = ANY($2::int2[])";

const LIVE_SKUS: &str = "
SELECT s.activity_id, s.sku_id
FROM seckill_sku AS s
JOIN seckill_activity AS a ON a.activity_id = s.activity_id
WHERE a.end_at > statement_timestamp() - interval '1 day'
  AND a.start_at <= statement_timestamp()";

const KNOWN_RESERVATIONS: &str = "
SELECT reservation_id FROM inventory_reservation
WHERE reservation_id = ANY($1) AND failure_code IS DISTINCT FROM $2";

/// The insert sees the rows committed before it (ON CONFLICT waits for one being
/// inserted); the second half reads the statement's snapshot, so a row inserted by
/// the first half is returned once. A request id the user already spent on another
/// reservation (its replay answer had expired) would conflict forever: the
/// reservation id stands in for it.
const FENCE: &str = "
WITH fenced AS (
    INSERT INTO inventory_reservation (
        reservation_id, request_id, first_message_id, activity_id, sku_id, user_id,
        inventory_bucket, quantity, status, failure_code, redis_reserved_at, expires_at,
        released_at, version
    )
    SELECT u.reservation_id,
           CASE WHEN EXISTS (SELECT 1 FROM inventory_reservation AS r
                             WHERE r.request_id = u.request_id AND r.user_id = u.user_id
                               AND r.reservation_id <> u.reservation_id)
                THEN u.reservation_id ELSE u.request_id END,
           NULL, u.activity_id, u.sku_id, u.user_id,
           u.bucket, 1, 40, $9::text, u.reserved_at, u.expires_at,
           statement_timestamp(), 1
    FROM unnest($1::uuid[], $2::uuid[], $3::int8[], $4::int8[], $5::int8[], $6::int2[],
                $7::timestamptz[], $8::timestamptz[])
         AS u(reservation_id, request_id, activity_id, sku_id, user_id, bucket,
              reserved_at, expires_at)
    ON CONFLICT DO NOTHING
    RETURNING reservation_id
)
SELECT reservation_id FROM fenced
UNION ALL
SELECT reservation_id FROM inventory_reservation
WHERE reservation_id = ANY($1) AND status = 40 AND failure_code = $9";

const BUCKETS_AVAILABLE: &str = "
SELECT activity_id, sku_id, bucket_no, available_stock::bigint FROM sku_inventory
WHERE $1::bigint IS NULL OR activity_id = $1 ORDER BY 1, 2, 3";
