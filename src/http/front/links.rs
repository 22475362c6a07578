//! The front stage's own links and how it watches them: the Redis connection and
//! the broker's confirm channel (checked every `LINK_CHECK_INTERVAL` and reported
//! to `/readyz`; the channel is reopened when the broker closed it), and the read
//! replica's lag (measured every `REPLICA_WATCH_INTERVAL`).

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Weak;
use std::time::Duration;

use super::FrontStage;
use crate::mq::publisher::ConfirmedPublisher;
use crate::store::{reads, Pool};

/// How often the front stage checks its own Redis and broker links, and how long a
/// check may take.
const LINK_CHECK_INTERVAL: Duration = Duration::from_millis(500);
const LINK_CHECK_TIMEOUT: Duration = Duration::from_secs(1);
/// How often the replica's lag is measured.
const REPLICA_WATCH_INTERVAL: Duration = Duration::from_millis(250);
/// How often the rate limiters and the SKU cache forget what is no longer needed.
const SHRINK_INTERVAL: Duration = Duration::from_secs(10);

/// `database.replica_url` and how far it lags, as last measured (`watch_replica`).
pub(super) struct Replica {
    pub(super) pool: Pool,
    /// Milliseconds; `i64::MAX` until measured, and while it cannot be.
    pub(super) lag_ms: AtomicI64,
}

impl Replica {
    pub(super) fn new(pool: Pool) -> Self {
        Self {
            pool,
            lag_ms: AtomicI64::new(i64::MAX),
        }
    }
}

/// The key of the URL the front stage publishes through.
pub(super) fn amqp_key(front: &crate::config::FrontstageSettings) -> &'static str {
    if front.amqp_url.is_some() {
        "frontstage.amqp_url"
    } else {
        "amqp.url"
    }
}

impl FrontStage {
    /// Checks the front stage's own links once and reports them (`/readyz`): Redis
    /// answers a PING, and the broker channel is open (reopened here if it was
    /// closed, so the first buyer after a blip does not pay for it).
    pub(super) async fn check_links(&self) {
        let mut redis = self.redis.clone();
        let redis = match tokio::time::timeout(
            LINK_CHECK_TIMEOUT,
            crate::redis::commands::ping(&mut redis),
        )
        .await
        {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(format!("redis: {e}")),
            Err(_) => Some("redis: no answer within 1 s".to_owned()),
        };
        let broker = match tokio::time::timeout(LINK_CHECK_TIMEOUT, self.publisher()).await {
            Ok(Ok(_)) => None,
            Ok(Err(e)) => Some(format!("rabbitmq: {e}")),
            Err(_) => Some("rabbitmq: no channel within 1 s".to_owned()),
        };
        let problem = match (redis, broker) {
            (None, None) => None,
            (Some(r), None) => Some(r),
            (None, Some(b)) => Some(b),
            (Some(r), Some(b)) => Some(format!("{r}; {b}")),
        };
        if self.readiness.set_frontstage(problem.clone()) {
            match &problem {
                Some(problem) => tracing::warn!(%problem, "front stage link down; answering 503"),
                None => tracing::info!("front stage links up"),
            }
        }
    }

    /// The confirm channel; reopened (on a new connection if need be) after the broker
    /// closed it, e.g. after a publish to a missing exchange.
    pub(super) async fn publisher(&self) -> Result<ConfirmedPublisher, crate::mq::MqError> {
        {
            let current = self.publisher.read().await;
            if current.1.channel().status().connected() {
                return Ok(current.1.clone());
            }
        }
        let mut current = self.publisher.write().await;
        if current.1.channel().status().connected() {
            return Ok(current.1.clone());
        }
        if !current.0.status().connected() {
            current.0 = crate::mq::connect_to(
                &self.amqp,
                &self.amqp.url,
                amqp_key(&self.settings),
                "seckill-frontstage",
            )
            .await?;
        }
        current.1 = ConfirmedPublisher::open(&current.0).await?;
        Ok(current.1.clone())
    }

    /// Measures the replica's lag once: 0 when it has replayed the primary's
    /// position read just before, else the age of its last replayed transaction.
    async fn measure_replica(&self) {
        let Some(replica) = &self.replica else { return };
        let measured = async {
            let primary = {
                let conn = self.pool.get().await.ok()?;
                reads::wal_position(&conn.client, false).await.ok()?
            };
            let conn = replica.pool.get().await.ok()?;
            let replayed = reads::wal_position(&conn.client, true).await.ok()?;
            if replayed >= primary {
                return Some(0);
            }
            reads::replay_age_ms(&conn.client).await.ok().flatten()
        };
        let lag = measured.await.unwrap_or(i64::MAX);
        replica.lag_ms.store(lag, Ordering::Relaxed);
        metrics::gauge!(crate::telemetry::names::REPLICA_LAG_SECONDS).set(if lag == i64::MAX {
            f64::INFINITY
        } else {
            lag as f64 / 1000.0
        });
    }
}

/// Starts the front stage's watchers on the caller's arbiter; each ends when the
/// front stage is gone.
pub(super) fn watch(front: Weak<FrontStage>, replica: bool) {
    if replica {
        let front = front.clone();
        actix_rt::spawn(async move {
            while let Some(front) = front.upgrade() {
                front.measure_replica().await;
                drop(front);
                tokio::time::sleep(REPLICA_WATCH_INTERVAL).await;
            }
        });
    }
    let links = front.clone();
    actix_rt::spawn(async move {
        loop {
            tokio::time::sleep(LINK_CHECK_INTERVAL).await;
            let Some(front) = links.upgrade() else { break };
            front.check_links().await;
        }
    });
    // The limiters forget keys that have fully recovered and the SKU cache the sales
    // that ended, so a sale's hundreds of thousands of buyers, and sale after sale,
    // do not stay in memory.
    actix_rt::spawn(async move {
        loop {
            tokio::time::sleep(SHRINK_INTERVAL).await;
            let Some(front) = front.upgrade() else { break };
            front.limits.shrink();
            front.skus.evict(chrono::Utc::now());
        }
    });
}
