//! The sweeper owns two clean-ups: cancelling orders left unpaid past their expiry
//! (their stock returns to their own bucket and Redis gets its unit back, §9.10), and
//! taking compensation tasks back from workers whose lease expired.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::LocalBoxFuture;

use super::runner::{LeaseRecovery, Outcome, Service, ServiceError};
use crate::config::{CompensationSettings, SweeperSettings};
use crate::domain::ids::IdGenerator;
use crate::store::{compensation, sweeps, Pool, StoreError};

/// Settings of the sweeper (see `[sweeper]` in config/default.toml).
#[derive(Debug, Clone)]
pub struct SweeperConfig {
    /// Pause between runs when nothing had expired.
    pub interval: Duration,
    /// Orders cancelled per run at most, one transaction each.
    pub batch_size: u32,
    /// Compensation tasks RUNNING longer than this are taken back.
    pub compensation_lease: Duration,
}

impl SweeperConfig {
    pub fn new(sweeper: &SweeperSettings, compensation: &CompensationSettings) -> Self {
        Self {
            interval: Duration::from_millis(sweeper.interval_ms),
            batch_size: sweeper.batch_size,
            compensation_lease: Duration::from_millis(compensation.lease_ms),
        }
    }
}

pub struct Sweeper {
    inner: Rc<Inner>,
}

struct Inner {
    pool: Pool,
    ids: Arc<IdGenerator>,
    config: SweeperConfig,
    /// When to take back expired compensation leases.
    recovery: LeaseRecovery,
}

impl Sweeper {
    pub fn new(pool: Pool, ids: Arc<IdGenerator>, config: SweeperConfig) -> Self {
        Self {
            inner: Rc::new(Inner {
                pool,
                ids,
                recovery: LeaseRecovery::new(config.compensation_lease),
                config,
            }),
        }
    }
}

impl Service for Sweeper {
    const NAME: &'static str = "sweeper";

    fn interval(&self) -> Duration {
        self.inner.config.interval
    }

    fn run_once(&self) -> LocalBoxFuture<'static, Result<Outcome, ServiceError>> {
        let inner = self.inner.clone();
        Box::pin(async move {
            let mut conn = inner.pool.get().await?;
            let mut cancelled = 0u64;
            while cancelled < u64::from(inner.config.batch_size) {
                let ledger_id = inner.ids.next_id().map_err(StoreError::from)?;
                match sweeps::cancel_next_expired(&mut conn, ledger_id).await? {
                    Some(order) => {
                        tracing::debug!(order_id = order.order_id, reservation_id = %order.reservation_id, "unpaid order cancelled");
                        cancelled += 1;
                    }
                    None => break,
                }
            }
            let recovered = if inner.recovery.due() {
                compensation::recover_expired_leases(&conn.client, inner.config.compensation_lease)
                    .await?
            } else {
                0
            };
            metrics::counter!(crate::telemetry::names::ORDERS_CANCELLED_TOTAL).increment(cancelled);
            Ok(Outcome::default()
                .count("cancelled", cancelled)
                .count("tasks_recovered", recovered)
                .more(cancelled >= u64::from(inner.config.batch_size)))
        })
    }
}
