//! The reconciler owns Redis reservations that outlived their TTL. If the engine
//! processed one, its pending entry is simply forgotten (the engine's outcome takes
//! care of the unit). If PostgreSQL never heard of it (its message was lost between
//! Redis and the queue, or never published), the reconciler first records it
//! RELEASED in PostgreSQL (`store::reconcile::fence`), and gives its unit back only
//! if that record won: a message arriving later then creates no order, so a unit is
//! never both sold and given back (docs/DESIGN.md, "Redis give-backs"). The give-back
//! itself happens once per reservation (the script's marker).
//!
//! Each pass also measures Redis drift for the SKUs of the live sales
//! (`crate::drift`, `seckill_redis_drift_units`).

use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use futures_util::future::LocalBoxFuture;
use uuid::Uuid;

use super::runner::{Outcome, Service, ServiceError};
use crate::config::RedisSettings;
use crate::redis::keys::SkuKeys;
use crate::redis::{commands, scripts};
use crate::status::Live;
use crate::store::reconcile::{self, Unseen};
use crate::store::Pool;
use crate::telemetry::sampled::Series;

pub struct Reconciler {
    inner: Rc<Inner>,
}

struct Inner {
    pool: Pool,
    redis: RedisSettings,
    interval: Duration,
    marker_ttl_secs: u64,
    /// `frontstage.reservation_ttl_ms`: when a pending entry's reservation was made.
    reservation_ttl: TimeDelta,
    batch: usize,
    /// Where the drift series go (the engine's).
    live: Arc<Live>,
}

impl Reconciler {
    pub fn new(
        pool: Pool,
        redis: RedisSettings,
        interval: Duration,
        marker_ttl_secs: u64,
        reservation_ttl: Duration,
        live: Arc<Live>,
    ) -> Self {
        Self {
            inner: Rc::new(Inner {
                pool,
                redis,
                interval,
                marker_ttl_secs,
                reservation_ttl: TimeDelta::from_std(reservation_ttl).unwrap_or(TimeDelta::zero()),
                batch: 500,
                live,
            }),
        }
    }
}

impl Service for Reconciler {
    const NAME: &'static str = "reconciler";

    fn interval(&self) -> Duration {
        self.inner.interval
    }

    fn run_once(&self) -> LocalBoxFuture<'static, Result<Outcome, ServiceError>> {
        let inner = self.inner.clone();
        Box::pin(async move {
            let conn = inner.pool.get().await?;
            let skus = reconcile::live_skus(&conn.client).await?;
            let mut redis = crate::redis::connect(&inner.redis).await?;
            let (mut given_back, mut confirmed, mut more) = (0u64, 0u64, false);
            for (activity_id, sku_id) in skus {
                let keys = SkuKeys::new(&inner.redis.key_prefix, activity_id, sku_id);
                let (due, read) = commands::due_pending(
                    &mut redis,
                    &keys,
                    Utc::now().timestamp_millis(),
                    inner.batch,
                )
                .await?;
                more |= read >= inner.batch;
                let ids: Vec<Uuid> = due.iter().map(|(p, _, _)| p.reservation_id).collect();
                let known = reconcile::known_reservations(&conn.client, &ids).await?;
                // The entries PostgreSQL has not seen, and the rows that fence them.
                let (mut members, mut rows) = (Vec::new(), Vec::new());
                for (pending, member, expiry_ms) in due {
                    if known.contains(&pending.reservation_id) {
                        commands::forget_pending(&mut redis, &keys, &member).await?;
                        confirmed += 1;
                        continue;
                    }
                    let expires_at =
                        DateTime::<Utc>::from_timestamp_millis(expiry_ms).unwrap_or_default();
                    rows.push(Unseen {
                        reservation_id: pending.reservation_id,
                        request_id: pending.request_id,
                        activity_id,
                        sku_id,
                        user_id: pending.user_id,
                        bucket: pending.bucket,
                        reserved_at: expires_at - inner.reservation_ttl,
                        expires_at,
                    });
                    members.push(pending);
                }
                let fenced = reconcile::fence(&conn.client, &rows).await?;
                // Those not fenced: the engine committed their message first; the
                // next pass finds them known.
                for pending in members
                    .iter()
                    .filter(|p| fenced.contains(&p.reservation_id))
                {
                    let reservation_id = pending.reservation_id;
                    if scripts::give_back(&mut redis, &keys, pending, inner.marker_ttl_secs).await?
                    {
                        tracing::info!(%reservation_id, "orphaned Redis reservation released in PostgreSQL and given back");
                        given_back += 1;
                    }
                }
            }
            metrics::counter!(crate::telemetry::names::RECONCILER_GIVEN_BACK_TOTAL)
                .increment(given_back);
            sample_drift(
                &conn.client,
                &mut redis,
                &inner.redis.key_prefix,
                &inner.live,
            )
            .await?;
            Ok(Outcome::default()
                .count("given_back", given_back)
                .count("confirmed", confirmed)
                .more(more))
        })
    }
}

/// Measures the drift of the live sales' buckets (`crate::drift`) and replaces the
/// `seckill_redis_drift_units` series with it, one per SKU.
async fn sample_drift(
    client: &tokio_postgres::Client,
    redis: &mut ::redis::aio::MultiplexedConnection,
    key_prefix: &str,
    live: &Live,
) -> Result<(), ServiceError> {
    // Only the live sales' buckets: measuring every activity ever held
    // would read the whole inventory table on every pass.
    let mut drift = Vec::new();
    for activity in crate::store::health::live_activities(client).await? {
        drift.extend(crate::drift::measure(client, redis, key_prefix, Some(activity)).await?);
    }
    live.sampled().replace(
        crate::telemetry::names::REDIS_DRIFT_UNITS,
        crate::drift::per_sku(&drift)
            .into_iter()
            .map(|((activity, sku), drift)| {
                Series::new(
                    vec![("activity", activity.to_string()), ("sku", sku.to_string())],
                    drift as f64,
                )
            })
            .collect(),
    );
    Ok(())
}
