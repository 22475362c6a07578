//! The reconciler owns Redis reservations that outlived their TTL: if PostgreSQL
//! never heard of one (its message was lost between Redis and the queue, or never
//! published), its unit is given back, exactly once (the give-back script's marker);
//! if PostgreSQL has it, the pending entry is simply forgotten.

use std::rc::Rc;
use std::time::Duration;

use chrono::Utc;
use futures_util::future::LocalBoxFuture;
use uuid::Uuid;

use super::maintenance::{Outcome, Service, ServiceError};
use crate::config::RedisSettings;
use crate::redis::keys::SkuKeys;
use crate::redis::scripts;
use crate::store::Pool;

pub struct Reconciler {
    inner: Rc<Inner>,
}

struct Inner {
    pool: Pool,
    redis: RedisSettings,
    interval: Duration,
    marker_ttl_secs: u64,
    batch: isize,
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
            let skus = conn.client.query(LIVE_SKUS, &[]).await?;
            let mut redis = crate::redis::connect(&inner.redis).await?;
            let (mut given_back, mut confirmed, mut more) = (0u64, 0u64, false);
            for sku in skus {
                let keys = SkuKeys::new(&inner.redis.key_prefix, sku.get(0), sku.get(1));
                let mut due = ::redis::cmd("ZRANGEBYSCORE");
                due.arg(keys.pending())
                    .arg("-inf")
                    .arg(Utc::now().timestamp_millis())
                    .arg("LIMIT")
                    .arg(0)
                    .arg(inner.batch);
                let members: Vec<String> =
                    crate::redis::timed("zrangebyscore", due.query_async(&mut redis)).await?;
                more |= members.len() as isize >= inner.batch;
                let parsed: Vec<(Uuid, i64, i16, &String)> = members
                    .iter()
                    .filter_map(|m| {
                        let mut parts = m.split(':');
                        Some((
                            parts.next()?.parse().ok()?,
                            parts.next()?.parse().ok()?,
                            parts.next()?.parse().ok()?,
                            m,
                        ))
                    })
                    .collect();
                let ids: Vec<Uuid> = parsed.iter().map(|p| p.0).collect();
                let known: std::collections::HashSet<Uuid> = conn
                    .client
                    .query(KNOWN_RESERVATIONS, &[&ids])
                    .await?
                    .iter()
                    .map(|r| r.get(0))
                    .collect();
                for (reservation_id, user_id, bucket, member) in parsed {
                    if known.contains(&reservation_id) {
                        let mut forget = ::redis::cmd("ZREM");
                        forget.arg(keys.pending()).arg(member);
                        let _: () =
                            crate::redis::timed("zrem", forget.query_async(&mut redis)).await?;
                        confirmed += 1;
                    } else if scripts::give_back(
                        &mut redis,
                        &keys,
                        bucket,
                        reservation_id,
                        user_id,
                        inner.marker_ttl_secs,
                    )
                    .await?
                    {
                        tracing::info!(%reservation_id, "orphaned Redis reservation given back");
                        given_back += 1;
                    }
                }
            }
            metrics::counter!("seckill_reconciler_given_back_total").increment(given_back);
            Ok(Outcome::default()
                .count("given_back", given_back)
                .count("confirmed", confirmed)
                .more(more))
        })
    }
}

/// SKUs whose sale is running or ended within the last day.
const LIVE_SKUS: &str = "
SELECT s.activity_id, s.sku_id
FROM seckill_sku AS s
JOIN seckill_activity AS a ON a.activity_id = s.activity_id
WHERE a.end_at > statement_timestamp() - interval '1 day'
  AND a.start_at <= statement_timestamp()";

const KNOWN_RESERVATIONS: &str =
    "SELECT reservation_id FROM inventory_reservation WHERE reservation_id = ANY($1)";
