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
use crate::config::{DatabaseSettings, RedisSettings};
use crate::status::Readiness;
use crate::store::primary::{self, NO_WRITABLE_PRIMARY};
use crate::store::Pool;

pub struct ReadinessMonitor {
    inner: Rc<Inner>,
}

struct Inner {
    pool: Pool,
    database: DatabaseSettings,
    redis: RedisSettings,
    readiness: Arc<Readiness>,
    interval: Duration,
}

/// How long one dependency may take to answer before it counts as down.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

impl ReadinessMonitor {
    pub fn new(
        pool: Pool,
        database: DatabaseSettings,
        redis: RedisSettings,
        readiness: Arc<Readiness>,
        interval: Duration,
    ) -> Self {
        Self {
            inner: Rc::new(Inner {
                pool,
                database,
                redis,
                readiness,
                interval,
            }),
        }
    }
}

impl Inner {
    /// `Ok` while orders may run on the database; otherwise why not.
    async fn postgres(&self) -> Result<(), String> {
        let conn = match self.pool.get().await {
            Ok(conn) => conn,
            Err(e) => {
                return Err(match self.pool.connect_error() {
                    // tokio-postgres' words when every server named is read-only.
                    Some(why) if why.contains("does not allow writes") => {
                        format!("{NO_WRITABLE_PRIMARY}: {why}")
                    }
                    Some(why) => format!("no connection: {why}"),
                    None => e.to_string(),
                });
            }
        };
        let state = primary::primary_state(&conn.client)
            .await
            .map_err(|e| e.to_string())?;
        match state.problem(
            self.database.require_sync_standby,
            self.database.commit_stall(),
        ) {
            Some(problem) => Err(problem),
            None => Ok(()),
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
            let postgres = match tokio::time::timeout(CHECK_TIMEOUT, inner.postgres()).await {
                Ok(answer) => answer,
                Err(_) => Err("no answer within 2 s".to_owned()),
            };
            let postgres_up = postgres.is_ok();
            let changed = inner.readiness.set_postgres(postgres.clone().err());
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
            if was != ready || changed {
                if ready {
                    tracing::info!("dependencies answer again; intakes resume consuming");
                } else {
                    let postgres = postgres.err();
                    tracing::warn!(
                        postgres_up,
                        postgres,
                        redis_up,
                        "not ready; intakes stop consuming"
                    );
                }
            }
            Ok(Outcome::default().count("transitions", u64::from(was != ready)))
        })
    }
}
