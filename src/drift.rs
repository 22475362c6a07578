//! Redis drift: per bucket, PostgreSQL's available stock minus Redis stock minus the
//! units Redis handed to reservations PostgreSQL has not seen yet (their messages
//! are in flight). Zero when the two agree. `seckill-engine check --redis` prints it
//! for any activity; the reconciler measures it for the live sales on every pass
//! (`seckill_redis_drift_units`).
//!
//! Redis is read first, then PostgreSQL in one snapshot, so a reservation settled
//! between the two reads is counted once (its unit is gone from Redis stock, and
//! PostgreSQL's snapshot shows it either as taken or as not seen). During a sale the
//! figure can still be off for a moment by the reservations made and settled within
//! that gap; only a drift that lasts means the stores disagree.
//!
//! Not a service and not a store: it reads both stores (PostgreSQL through
//! `store::reconcile`, Redis through `redis::commands`) and compares them, for the
//! reconciler (`services`) and the command line alike.

use std::collections::{BTreeSet, HashMap, HashSet};

use tokio_postgres::Client;

use crate::redis::commands;
use crate::redis::keys::SkuKeys;
use crate::store::{reconcile, StoreError};

/// Why a measure failed: one of the two stores did not answer.
#[derive(Debug, thiserror::Error)]
pub enum DriftError {
    #[error("PostgreSQL: {0}")]
    Store(#[from] StoreError),
    #[error("Redis: {0}")]
    Redis(#[from] ::redis::RedisError),
}

impl From<tokio_postgres::Error> for DriftError {
    fn from(e: tokio_postgres::Error) -> Self {
        DriftError::Store(StoreError::Db(e))
    }
}

/// One bucket's Redis/PostgreSQL comparison.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketDrift {
    pub activity_id: i64,
    pub sku_id: i64,
    pub bucket: i16,
    pub pg_available: i64,
    pub redis_stock: i64,
    pub unsettled: i64,
    pub drift: i64,
}

/// Measures every bucket of `activity` (all activities when `None`).
pub async fn measure(
    client: &Client,
    redis: &mut ::redis::aio::MultiplexedConnection,
    key_prefix: &str,
    activity: Option<i64>,
) -> Result<Vec<BucketDrift>, DriftError> {
    let buckets: Vec<(i64, i64, i16)> = reconcile::buckets_available(client, activity)
        .await?
        .into_iter()
        .map(|b| (b.activity_id, b.sku_id, b.bucket))
        .collect();
    let skus: BTreeSet<(i64, i64)> = buckets.iter().map(|&(a, s, _)| (a, s)).collect();

    // Redis first.
    let mut pending = Vec::new();
    for &(activity_id, sku_id) in &skus {
        let keys = SkuKeys::new(key_prefix, activity_id, sku_id);
        for p in commands::all_pending(redis, &keys).await? {
            pending.push((activity_id, sku_id, p.bucket, p.reservation_id));
        }
    }
    let mut redis_stock = HashMap::new();
    for &(activity_id, sku_id, bucket) in &buckets {
        let keys = SkuKeys::new(key_prefix, activity_id, sku_id);
        let stock = commands::bucket_stock(redis, &keys, bucket).await?;
        redis_stock.insert((activity_id, sku_id, bucket), stock);
    }

    // Then PostgreSQL, in one snapshot.
    let ids: Vec<uuid::Uuid> = pending.iter().map(|p| p.3).collect();
    let (known, available): (HashSet<uuid::Uuid>, _) =
        reconcile::known_and_available(client, &ids, activity).await?;

    let mut unsettled: HashMap<(i64, i64, i16), i64> = HashMap::new();
    for (activity_id, sku_id, bucket, reservation_id) in pending {
        if !known.contains(&reservation_id) {
            *unsettled.entry((activity_id, sku_id, bucket)).or_default() += 1;
        }
    }
    Ok(available
        .into_iter()
        .filter_map(|b| {
            let key = (b.activity_id, b.sku_id, b.bucket);
            let redis_stock = *redis_stock.get(&key)?;
            let unsettled = unsettled.get(&key).copied().unwrap_or(0);
            Some(BucketDrift {
                activity_id: b.activity_id,
                sku_id: b.sku_id,
                bucket: b.bucket,
                pg_available: b.available,
                redis_stock,
                unsettled,
                drift: b.available - redis_stock - unsettled,
            })
        })
        .collect())
}

/// Drift per SKU: the sum over its buckets.
pub fn per_sku(buckets: &[BucketDrift]) -> Vec<((i64, i64), i64)> {
    let mut skus: std::collections::BTreeMap<(i64, i64), i64> = Default::default();
    for b in buckets {
        *skus.entry((b.activity_id, b.sku_id)).or_default() += b.drift;
    }
    skus.into_iter().collect()
}
