//! The front stage repairing a sale's Redis keys from PostgreSQL (`crate::rebuild`):
//! when they are gone (the reserve script answers `Lost`), and when a Sentinel
//! fail-over promoted a replica, which may have missed the old master's last writes
//! (a reservation's decrement or a give-back's increment; asynchronous replication).
//! One rebuild per activity runs in this process, and the rebuild's advisory lock
//! leaves it to one instance among many; buyers of a sale whose keys are gone get 503
//! with `Retry-After` meanwhile, and sell again once the keys are back. No operator is
//! needed.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use crate::store::Pool;

/// Why a rebuild runs (the `trigger` label of `seckill_redis_rebuilds_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Trigger {
    /// The sale's keys were gone.
    LostKeys,
    /// The Sentinels promoted another Redis server.
    MasterMoved,
}

impl Trigger {
    fn label(self) -> &'static str {
        match self {
            Trigger::LostKeys => "lost_keys",
            Trigger::MasterMoved => "master_moved",
        }
    }
}

pub(super) struct Rebuilds {
    running: Mutex<HashSet<i64>>,
    pool: Pool,
    redis: crate::redis::MasterLink,
    key_prefix: String,
}

impl Rebuilds {
    pub(super) fn new(
        pool: Pool,
        redis: crate::redis::MasterLink,
        key_prefix: String,
    ) -> Arc<Self> {
        Arc::new(Self {
            running: Mutex::default(),
            pool,
            redis,
            key_prefix,
        })
    }

    /// Starts a rebuild of every live sale (after a Redis fail-over).
    pub(super) fn start_live(self: &Arc<Self>, trigger: Trigger) {
        let this = self.clone();
        actix_rt::spawn(async move {
            let live = match this.pool.get().await {
                Ok(conn) => crate::store::health::live_activities(&conn.client).await,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot rebuild the live sales' Redis keys: no database connection");
                    return;
                }
            };
            match live {
                Ok(ids) => ids.into_iter().for_each(|id| this.start(id, trigger)),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot rebuild the live sales' Redis keys: listing them failed")
                }
            }
        });
    }

    /// Starts a rebuild of `activity_id` unless one runs in this process already.
    pub(super) fn start(self: &Arc<Self>, activity_id: i64, trigger: Trigger) {
        let fresh = self
            .running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(activity_id);
        if !fresh {
            return;
        }
        let this = self.clone();
        actix_rt::spawn(async move {
            this.run(activity_id, trigger).await;
            this.running
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .remove(&activity_id);
        });
    }

    async fn run(&self, activity_id: i64, trigger: Trigger) {
        let conn = match self.pool.get().await {
            Ok(conn) => conn,
            Err(e) => {
                tracing::warn!(activity_id, error = %e, "cannot rebuild the sale's Redis keys: no database connection");
                return;
            }
        };
        let mut redis = self.redis.conn();
        match crate::rebuild::rebuild_activity(
            &conn.client,
            &mut redis,
            &self.key_prefix,
            activity_id,
        )
        .await
        {
            Ok(skus) => {
                let units: i64 = skus.iter().flat_map(|s| &s.buckets).map(|b| b.after).sum();
                let marks: i64 = skus.iter().map(|s| s.marks_added).sum();
                metrics::counter!(crate::telemetry::names::REDIS_REBUILDS_TOTAL, "trigger" => trigger.label())
                    .increment(1);
                match trigger {
                    Trigger::LostKeys => tracing::warn!(
                        activity_id,
                        skus = skus.len(),
                        units,
                        marks,
                        "the sale's Redis keys were gone; rebuilt them from PostgreSQL"
                    ),
                    Trigger::MasterMoved => tracing::info!(
                        activity_id,
                        skus = skus.len(),
                        units,
                        marks,
                        "Redis master moved; rebuilt the sale's keys from PostgreSQL"
                    ),
                }
            }
            // Another instance is rebuilding: its keys will do.
            Err(crate::rebuild::RebuildError::Busy(_)) => {}
            Err(e) => {
                tracing::warn!(activity_id, error = %e, "rebuilding the sale's Redis keys failed; buyers retry");
            }
        }
    }
}
