//! The readiness monitor owns the engine's answer to "may I take work now?": it
//! checks PostgreSQL and Redis on an interval and publishes the answer in a shared
//! flag. A queue consumer gets no load-balancer traffic to stop, so readiness has to
//! act: while the flag is down the intakes cancel their consumers (the backlog waits
//! in RabbitMQ, where another instance may take it) and consume again once it is up.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::LocalBoxFuture;

use super::runner::{Outcome, Service, ServiceError};
use crate::config::RedisSettings;
use crate::status::Readiness;
use crate::store::Pool;

pub struct ReadinessMonitor {
    inner: Rc<Inner>,
}

struct Inner {
    pool: Pool,
    redis: RedisSettings,
    readiness: Arc<Readiness>,
    interval: Duration,
}

/// How long one dependency may take to answer before it counts as down.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

impl ReadinessMonitor {
    pub fn new(
        pool: Pool,
        redis: RedisSettings,
        readiness: Arc<Readiness>,
        interval: Duration,
    ) -> Self {
        Self {
            inner: Rc::new(Inner {
                pool,
                redis,
                readiness,
                interval,
            }),
        }
    }
}

impl Service for ReadinessMonitor {
    const NAME: &'static str = "readiness";

    fn interval(&self) -> Duration {
        self.inner.interval
    }

    fn run_once(&self) -> LocalBoxFuture<'static, Result<Outcome, ServiceError>> {
        let inner = self.inner.clone();
        Box::pin(async move {
            let postgres = async {
                let conn = inner.pool.get().await.ok()?;
                crate::store::ping(&conn.client).await.ok()
            };
            let postgres_up = matches!(
                tokio::time::timeout(CHECK_TIMEOUT, postgres).await,
                Ok(Some(_))
            );
            let redis = async {
                let mut conn = crate::redis::connect(&inner.redis).await.ok()?;
                crate::redis::commands::ping(&mut conn).await.ok()
            };
            let redis_up = matches!(
                tokio::time::timeout(CHECK_TIMEOUT, redis).await,
                Ok(Some(_))
            );
            let ready = postgres_up && redis_up;
            let was = inner.readiness.set_ready(ready);
            metrics::gauge!(crate::telemetry::names::READY).set(if ready { 1.0 } else { 0.0 });
            if was != ready {
                if ready {
                    tracing::info!("dependencies answer again; intakes resume consuming");
                } else {
                    tracing::warn!(postgres_up, redis_up, "not ready; intakes stop consuming");
                }
            }
            Ok(Outcome::default().count("transitions", u64::from(was != ready)))
        })
    }
}
