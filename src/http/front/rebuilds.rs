//! The front stage repairing a sale whose Redis keys are gone (the reserve script
//! answers `Lost`): it starts one rebuild from PostgreSQL (`crate::rebuild`) per
//! activity in this process, and the rebuild's advisory lock leaves it to one
//! instance among many; buyers meanwhile get 503 with `Retry-After`, and sell again
//! once the keys are back. No operator is needed.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use crate::store::Pool;

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

    /// Starts a rebuild of `activity_id` unless one runs in this process already.
    pub(super) fn start(self: &Arc<Self>, activity_id: i64) {
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
            this.run(activity_id).await;
            this.running
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .remove(&activity_id);
        });
    }

    async fn run(&self, activity_id: i64) {
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
                metrics::counter!(crate::telemetry::names::REDIS_REBUILDS_TOTAL, "trigger" => "lost_keys")
                    .increment(1);
                tracing::warn!(
                    activity_id,
                    skus = skus.len(),
                    units,
                    marks,
                    "the sale's Redis keys were gone; rebuilt them from PostgreSQL"
                );
            }
            // Another instance is rebuilding: its keys will do.
            Err(crate::rebuild::RebuildError::Busy(_)) => {}
            Err(e) => {
                tracing::warn!(activity_id, error = %e, "rebuilding the sale's Redis keys failed; buyers retry");
            }
        }
    }
}
