//! The front stage's own links and how it watches them: the Redis connection and
//! the broker's confirm channel (checked every `LINK_CHECK_INTERVAL` and reported
//! to `/readyz`; the channel is reopened when the broker closed it), and the read
//! replica's lag (measured every `REPLICA_WATCH_INTERVAL`).

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::config::AmqpSettings;
use crate::mq::publisher::ConfirmedPublisher;
use crate::mq::reconnecting::Reconnecting;
use crate::status::Readiness;
use crate::store::{reads, Pool};

/// How often the front stage checks its own Redis and broker links, and how long a
/// check may take.
pub(super) const LINK_CHECK_INTERVAL: Duration = Duration::from_millis(500);
const LINK_CHECK_TIMEOUT: Duration = Duration::from_secs(1);
/// How often the replica's lag is measured.
pub(super) const REPLICA_WATCH_INTERVAL: Duration = Duration::from_millis(250);

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

    /// Measures the lag once, against `primary`: 0 when the replica has replayed the
    /// primary's position read just before, else the age of its last replayed
    /// transaction.
    pub(super) async fn measure(&self, primary: &Pool) {
        let measured = async {
            let position = {
                let conn = primary.get().await.ok()?;
                reads::wal_position(&conn.client, false).await.ok()?
            };
            let conn = self.pool.get().await.ok()?;
            let replayed = reads::wal_position(&conn.client, true).await.ok()?;
            if replayed >= position {
                return Some(0);
            }
            reads::replay_age_ms(&conn.client).await.ok().flatten()
        };
        let lag = measured.await.unwrap_or(i64::MAX);
        self.lag_ms.store(lag, Ordering::Relaxed);
        metrics::gauge!(crate::telemetry::names::REPLICA_LAG_SECONDS).set(if lag == i64::MAX {
            f64::INFINITY
        } else {
            lag as f64 / 1000.0
        });
    }
}

/// The front stage's Redis connection and broker channel, and where their state is
/// reported.
pub(super) struct Links {
    /// Reconnects by itself after a Redis restart or a dropped connection, and in
    /// Sentinel mode follows the master to its new server (`check`).
    pub(super) redis: crate::redis::MasterLink,
    /// The confirm channel and its connection, reopened when the broker closed them;
    /// shared by every worker of the front stage.
    publisher: Reconnecting<ConfirmedPublisher>,
    /// Where the state of the links is reported (`/readyz`).
    readiness: Arc<Readiness>,
}

impl Links {
    /// Opens both links; `broker` is the front stage's own broker URLs and their key.
    pub(super) async fn open(
        redis: &crate::config::RedisSettings,
        amqp: AmqpSettings,
        broker: (&'static str, Vec<secrecy::SecretString>),
        readiness: Arc<Readiness>,
    ) -> Result<Self, crate::http::HttpError> {
        let redis = crate::redis::MasterLink::open(redis).await?;
        let (key, urls) = broker;
        let publisher = Reconnecting::to(&amqp, urls, key, "seckill-frontstage");
        // Opened now: a broker that refuses fails the start, not the first buyer.
        publisher.get().await?;
        Ok(Self {
            redis,
            publisher,
            readiness,
        })
    }

    /// Checks the front stage's own links once and reports them (`/readyz`): Redis
    /// answers a PING, and the broker channel is open (reopened here if it was
    /// closed, so the first buyer after a blip does not pay for it). True when the
    /// Redis master moved (Sentinel) and the front stage now follows another server.
    pub(super) async fn check(&self) -> bool {
        let mut moved = false;
        match tokio::time::timeout(LINK_CHECK_TIMEOUT, self.redis.follow()).await {
            Ok(Ok(Some(master))) => {
                moved = true;
                tracing::info!(%master, "Redis master moved (Sentinel); the front stage follows it")
            }
            Ok(Ok(None)) => {}
            // The sentinels do not answer: the current connection stays.
            Ok(Err(e)) => tracing::debug!(error = %e, "the Redis sentinels did not name a master"),
            Err(_) => tracing::debug!("the Redis sentinels did not answer within 1 s"),
        }
        let mut redis = self.redis.conn();
        let redis = crate::redis::health::check(&mut redis, LINK_CHECK_TIMEOUT)
            .await
            .err()
            .map(|why| format!("redis: {why}"));
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
        moved
    }

    /// The confirm channel; reopened (on a new connection if need be) after the broker
    /// closed it, e.g. after a publish to a missing exchange.
    pub(super) async fn publisher(&self) -> Result<ConfirmedPublisher, crate::mq::MqError> {
        self.publisher.get().await
    }
}
