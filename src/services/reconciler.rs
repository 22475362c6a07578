//! The reconciler owns Redis reservations that outlived their TTL: if PostgreSQL
//! never heard of one (its message was lost between Redis and the queue, or never
//! published), its unit is given back, exactly once (the give-back script's marker);
//! if PostgreSQL has it, the pending entry is simply forgotten.

use std::rc::Rc;
use std::time::Duration;

use chrono::Utc;
use futures_util::future::LocalBoxFuture;
use uuid::Uuid;

use super::runner::{Outcome, Service, ServiceError};
use crate::config::RedisSettings;
use crate::redis::keys::SkuKeys;
use crate::redis::{commands, scripts};
use crate::store::{reconcile, Pool};

pub struct Reconciler {
    inner: Rc<Inner>,
}

struct Inner {
    pool: Pool,
    redis: RedisSettings,
    interval: Duration,
    marker_ttl_secs: u64,
    batch: usize,
}

impl Reconciler {
    pub fn new(pool: Pool, redis: RedisSettings, interval: Duration, marker_ttl_secs: u64) -> Self {
        Self {
            inner: Rc::new(Inner {
                pool,
                redis,
                interval,
                marker_ttl_secs,
                batch: 500,
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
                let ids: Vec<Uuid> = due.iter().map(|(p, _)| p.reservation_id).collect();
                let known = reconcile::known_reservations(&conn.client, &ids).await?;
                for (pending, member) in due {
                    let reservation_id = pending.reservation_id;
                    if known.contains(&reservation_id) {
                        commands::forget_pending(&mut redis, &keys, &member).await?;
                        confirmed += 1;
                    } else if scripts::give_back(
                        &mut redis,
                        &keys,
                        pending.bucket,
                        reservation_id,
                        pending.user_id,
                        inner.marker_ttl_secs,
                    )
                    .await?
                    {
                        tracing::info!(%reservation_id, "orphaned Redis reservation given back");
                        given_back += 1;
                    }
                }
            }
            metrics::counter!(crate::telemetry::names::RECONCILER_GIVEN_BACK_TOTAL)
                .increment(given_back);
            Ok(Outcome::default()
                .count("given_back", given_back)
                .count("confirmed", confirmed)
                .more(more))
        })
    }
}
