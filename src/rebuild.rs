//! Rebuilding a sale's Redis keys from PostgreSQL (docs/DESIGN.md, "Redis lost"):
//! after a Redis restart without persistence, a fail-over to a replica that missed
//! writes, or a flush, the front stage has nothing (or the wrong count) to sell
//! while PostgreSQL holds the stock. For each SKU of the activity, each bucket's
//! stock becomes PostgreSQL's available units minus the units Redis handed to
//! reservations PostgreSQL has not seen yet (as far as the pending set survived);
//! every buyer whose reservation holds a unit gets their one-per-SKU mark back; the
//! bucket count, a generation and the keys' expiry are written with them.
//!
//! Safe during a live sale and idempotent: Redis is read, then PostgreSQL in one
//! snapshot, then one script per SKU writes only if the pending set is still the
//! one counted (otherwise it reads again). A unit PostgreSQL sold after its snapshot
//! can at worst be offered once more by Redis, and PostgreSQL refuses it (never an
//! oversell). One rebuild of an activity runs at a time across instances (an
//! advisory lock). Run by `seckill-engine redis rebuild` and by the front stage when
//! a live SKU's keys are gone.
//!
//! Not a service and not a store, like `drift`: it reads both stores and writes
//! Redis.

use std::collections::HashMap;

use tokio_postgres::Client;

use crate::redis::keys::{PendingMember, SkuKeys};
use crate::redis::scripts::{self, RebuildCall, Rebuilt};
use crate::redis::Conn;
use crate::store::reconcile;

/// Attempts before a rebuild gives up on a pending set that keeps changing.
const ATTEMPTS: u32 = 5;

#[derive(Debug, thiserror::Error)]
pub enum RebuildError {
    #[error("PostgreSQL: {0}")]
    Store(#[from] tokio_postgres::Error),
    #[error("Redis: {0}")]
    Redis(#[from] ::redis::RedisError),
    #[error("activity {0} does not exist")]
    NoSuchActivity(i64),
    #[error("another rebuild of activity {0} is running")]
    Busy(i64),
    #[error("the pending reservations of activity {0} kept changing; try again")]
    Unsettled(i64),
}

/// One bucket's stock in Redis before and after.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketChange {
    pub bucket: i16,
    /// `None`: the key was gone.
    pub before: Option<i64>,
    pub after: i64,
    /// Units held by reservations PostgreSQL has not seen, kept out of `after`.
    pub unsettled: i64,
}

/// What a rebuild did to one SKU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkuRebuilt {
    pub activity_id: i64,
    pub sku_id: i64,
    pub buckets: Vec<BucketChange>,
    pub marks_added: i64,
}

impl SkuRebuilt {
    /// Whether anything changed (a second rebuild of an intact sale changes nothing).
    pub fn changed(&self) -> bool {
        self.marks_added > 0 || self.buckets.iter().any(|b| b.before != Some(b.after))
    }
}

/// Rebuilds every SKU of `activity_id`.
pub async fn rebuild_activity(
    client: &Client,
    redis: &mut impl Conn,
    key_prefix: &str,
    activity_id: i64,
) -> Result<Vec<SkuRebuilt>, RebuildError> {
    let skus = reconcile::activity_skus(client, activity_id).await?;
    if skus.is_empty() {
        return Err(RebuildError::NoSuchActivity(activity_id));
    }
    for _ in 0..ATTEMPTS {
        // Redis first, then PostgreSQL in one snapshot (as `drift` reads them).
        let mut pending: HashMap<i64, Vec<String>> = HashMap::new();
        for sku_id in &skus {
            let keys = SkuKeys::new(key_prefix, activity_id, *sku_id);
            pending.insert(
                *sku_id,
                crate::redis::commands::pending_members(redis, &keys).await?,
            );
        }
        let ids: Vec<uuid::Uuid> = pending
            .values()
            .flatten()
            .filter_map(|m| PendingMember::parse(m))
            .map(|m| m.reservation_id)
            .collect();
        if !reconcile::begin_rebuild(client, activity_id).await? {
            return Err(RebuildError::Busy(activity_id));
        }
        let written = write(client, redis, key_prefix, activity_id, &ids, &pending).await;
        reconcile::end_rebuild(client).await?;
        if let Some(done) = written? {
            return Ok(done);
        }
    }
    Err(RebuildError::Unsettled(activity_id))
}

/// Within the snapshot: the figures, then one script per SKU. `None` when a SKU's
/// pending set changed under it (nothing of that SKU written; the caller reads
/// again, and SKUs already written are written again, the same way).
async fn write(
    client: &Client,
    redis: &mut impl Conn,
    key_prefix: &str,
    activity_id: i64,
    ids: &[uuid::Uuid],
    pending: &HashMap<i64, Vec<String>>,
) -> Result<Option<Vec<SkuRebuilt>>, RebuildError> {
    let (known, skus) = reconcile::rebuild_figures(client, activity_id, ids).await?;
    let generation_ms = chrono::Utc::now().timestamp_millis();
    let mut done = Vec::with_capacity(skus.len());
    for sku in skus {
        let members = pending.get(&sku.sku_id).map(Vec::as_slice).unwrap_or(&[]);
        let mut unsettled = vec![0_i64; sku.available.len()];
        for m in members.iter().filter_map(|m| PendingMember::parse(m)) {
            let slot = usize::try_from(m.bucket).ok();
            if let Some(count) = slot.and_then(|b| unsettled.get_mut(b)) {
                if !known.contains(&m.reservation_id) {
                    *count += 1;
                }
            }
        }
        let stock: Vec<i64> = sku
            .available
            .iter()
            .zip(&unsettled)
            .map(|(available, held)| (available - held).max(0))
            .collect();
        let keys = SkuKeys::new(key_prefix, activity_id, sku.sku_id);
        let call = RebuildCall {
            stock: &stock,
            pending: members,
            holders: &sku.holders,
            sale_end_ms: sku.end_at.timestamp_millis(),
            generation_ms,
        };
        match scripts::rebuild(redis, &keys, &call).await? {
            Rebuilt::Changed => return Ok(None),
            Rebuilt::Done {
                before,
                marks_added,
            } => done.push(SkuRebuilt {
                activity_id,
                sku_id: sku.sku_id,
                buckets: (0..)
                    .zip(stock.iter().zip(&unsettled))
                    .map(|(bucket, (after, held))| BucketChange {
                        bucket,
                        before: before.get(bucket as usize).copied().flatten(),
                        after: *after,
                        unsettled: *held,
                    })
                    .collect(),
                marks_added,
            }),
        }
    }
    Ok(Some(done))
}
