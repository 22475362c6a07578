//! The readiness monitor owns the engine's answer to "may I take work now?": it is
//! the one prober of the engine's dependencies. On an interval it checks PostgreSQL
//! (a writable primary that can take orders, and a schema this build knows) and
//! Redis, records each finding with its time in the shared `Readiness` (what
//! `/readyz` shows, never probing itself), and publishes the answer in the shared
//! flag and in `seckill_ready`, which nothing else writes. A queue consumer gets no
//! load-balancer traffic to stop, so readiness has to act: while the flag is down
//! the intakes cancel their consumers (the backlog waits in RabbitMQ, where another
//! instance may take it) and consume again once it is up.

use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::LocalBoxFuture;

use super::runner::{Outcome, Service, ServiceError};
use crate::config::{DatabaseSettings, RedisSettings};
use crate::status::{Checks, Readiness};
use crate::store::primary::{self, NO_WRITABLE_PRIMARY};
use crate::store::{migrate, Pool, PooledConn, StoreError};

pub struct ReadinessMonitor {
    inner: Rc<Inner>,
}

struct Inner {
    pool: Pool,
    database: DatabaseSettings,
    redis: RedisSettings,
    readiness: Arc<Readiness>,
    interval: Duration,
    /// The primary the last check reached (server, timeline): a change is a
    /// fail-over (or a switch-over) and is said once, at INFO.
    primary: std::cell::RefCell<Option<(String, i32)>>,
}

/// How long one dependency may take to answer before it counts as down.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

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
                primary: Default::default(),
            }),
        }
    }
}

impl Inner {
    /// Every dependency, once: the findings, stamped with when they were made.
    async fn check(&self) -> Checks {
        let (postgres, schema) = self.database().await;
        let redis = crate::redis::health::check_new(&self.redis, CHECK_TIMEOUT)
            .await
            .err();
        Checks {
            postgres,
            schema,
            redis,
            at: Some(Instant::now()),
            ..Checks::default()
        }
    }

    /// The database: why orders may not run on it, and (when they may) why its
    /// schema is not this build's; each within `CHECK_TIMEOUT`. The schema's finding
    /// is only shown: a schema migrated ahead does not stop intake.
    async fn database(&self) -> (Option<String>, Option<String>) {
        let primary = tokio::time::timeout(CHECK_TIMEOUT, self.primary()).await;
        let mut conn = match primary {
            Ok(Ok(conn)) => conn,
            Ok(Err(problem)) => return (Some(problem), None),
            Err(_) => return (Some("no answer within 2 s".to_owned()), None),
        };
        let schema = tokio::time::timeout(CHECK_TIMEOUT, migrate::verify(&mut conn.client)).await;
        let schema = match schema {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(_) => Some("no answer within 2 s".to_owned()),
        };
        (None, schema)
    }

    /// A connection to a primary on which orders may run; otherwise why not.
    async fn primary(&self) -> Result<PooledConn<'_>, String> {
        let conn = self.pool.get().await.map_err(|e| self.no_connection(e))?;
        let state = primary::primary_state(&conn.client)
            .await
            .map_err(|e| e.to_string())?;
        self.note_primary(&state);
        match state.problem(
            self.database.require_sync_standby,
            self.database.commit_stall(),
        ) {
            Some(problem) => Err(problem),
            None => Ok(conn),
        }
    }

    /// Says, once, that the writable primary is another server or timeline than at
    /// the last check: after a fail-over the operator learns where the engine now
    /// writes without querying each server.
    fn note_primary(&self, state: &primary::PrimaryState) {
        if state.read_only {
            return;
        }
        let now = (state.server.clone(), state.timeline);
        let before = self.primary.replace(Some(now.clone()));
        if let Some((server, timeline)) = before.filter(|b| *b != now) {
            tracing::info!(
                primary = %now.0,
                timeline = now.1,
                previous = %server,
                previous_timeline = timeline,
                "the engine writes to another primary now"
            );
        }
    }

    /// Why the pool gave no connection, in the words of the last refusal.
    fn no_connection(&self, e: StoreError) -> String {
        match self.pool.connect_error() {
            // tokio-postgres' words when every server named is read-only.
            Some(why) if why.contains("does not allow writes") => {
                format!("{NO_WRITABLE_PRIMARY}: {why}")
            }
            Some(why) => format!("no connection: {why}"),
            None => e.to_string(),
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
            let found = inner.check().await;
            // PostgreSQL alone decides every order: Redis down stops the front
            // stage's reservations, never the intakes (docs/DESIGN.md, "Readiness").
            let ready = found.postgres.is_none();
            let (postgres, redis) = (found.postgres.clone(), found.redis.clone());
            let before = inner.readiness.record_checks(found);
            let was = inner.readiness.set_ready(ready);
            metrics::gauge!(crate::telemetry::names::READY).set(if ready { 1.0 } else { 0.0 });
            if was != ready || before.postgres != postgres {
                if ready {
                    tracing::info!("the database answers again; intakes resume consuming");
                } else {
                    tracing::warn!(postgres, "not ready; intakes stop consuming");
                }
            }
            if before.redis.is_none() != redis.is_none() {
                match &redis {
                    Some(why) => tracing::warn!(
                        redis = %why,
                        "Redis does not answer; intakes keep consuming, give-backs wait as compensation tasks, the front stage cannot reserve"
                    ),
                    None => tracing::info!("Redis answers again"),
                }
            }
            Ok(Outcome::default().count("transitions", u64::from(was != ready)))
        })
    }
}
