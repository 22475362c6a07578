//! The runner of a background service (outbox publisher, sweeper, compensation
//! worker), shaped like River's maintenance services: `run_once` on an interval, again
//! at once while a run reports more work, with backoff after a failed run. A run that
//! panics stops the runner and tells the supervisor, which starts a fresh one. Work is
//! never held here: every unit of work is a PostgreSQL row, so a lost runner loses
//! nothing.

use std::cell::Cell;
use std::fmt;
use std::time::{Duration, Instant};

use actix::prelude::*;
use futures_util::future::LocalBoxFuture;

use super::supervisor::{ChildFailed, StopChild};
use crate::domain::backoff;
use crate::mq::MqError;
use crate::store::StoreError;

/// One background service.
pub trait Service: Unpin + 'static {
    /// Name in logs and metrics.
    const NAME: &'static str;
    /// Pause after a run that found nothing more to do.
    fn interval(&self) -> Duration;
    /// One pass over the available work.
    fn run_once(&self) -> LocalBoxFuture<'static, Result<Outcome, ServiceError>>;
}

/// Paces a service's look for expired leases (outbox rows, compensation tasks) to
/// at most once a quarter lease, so a lease ends within about 1.25 leases. The look
/// reads every entry of the table's `*_stale_*` index older than the lease, and the
/// entries of rows that left the leased state stay there until a vacuum: looking on
/// every run made draining a backlog quadratic (docs/benchmarks-history.md, 2026-12-01, 8486495).
pub struct LeaseRecovery {
    every: Duration,
    last: Cell<Option<Instant>>,
}

impl LeaseRecovery {
    pub fn new(lease: Duration) -> Self {
        Self {
            every: lease / 4,
            last: Cell::new(None),
        }
    }

    /// Whether to look now; a `true` counts as the look.
    pub fn due(&self) -> bool {
        let due = self.last.get().is_none_or(|at| at.elapsed() >= self.every);
        if due {
            self.last.set(Some(Instant::now()));
        }
        due
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("PostgreSQL: {0}")]
    Store(#[from] StoreError),
    #[error("RabbitMQ: {0}")]
    Mq(#[from] MqError),
    #[error("Redis: {0}")]
    Redis(#[from] ::redis::RedisError),
}

impl From<tokio_postgres::Error> for ServiceError {
    fn from(e: tokio_postgres::Error) -> Self {
        ServiceError::Store(StoreError::Db(e))
    }
}

impl From<crate::drift::DriftError> for ServiceError {
    fn from(e: crate::drift::DriftError) -> Self {
        match e {
            crate::drift::DriftError::Store(e) => ServiceError::Store(e),
            crate::drift::DriftError::Redis(e) => ServiceError::Redis(e),
        }
    }
}

impl From<lapin::Error> for ServiceError {
    fn from(e: lapin::Error) -> Self {
        ServiceError::Mq(MqError::Amqp(e))
    }
}

/// What a run did: named counts, and whether a full batch suggests more work waits.
#[derive(Debug, Default, Clone)]
pub struct Outcome {
    pub counts: Vec<(&'static str, u64)>,
    pub more: bool,
}

impl Outcome {
    pub fn count(mut self, name: &'static str, n: u64) -> Self {
        self.counts.push((name, n));
        self
    }
    pub fn more(mut self, more: bool) -> Self {
        self.more = more;
        self
    }
    pub fn did_work(&self) -> bool {
        self.counts.iter().any(|(_, n)| *n > 0)
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (name, n)) in self.counts.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{name}={n}")?;
        }
        Ok(())
    }
}

#[derive(Message)]
#[rtype(result = "()")]
struct Tick;

/// How often a busy service's summary is logged at most.
const LOG_EVERY: Duration = Duration::from_secs(10);
const MAX_FAILURE_BACKOFF: Duration = Duration::from_secs(30);

pub struct Maintenance<S: Service> {
    service: S,
    supervisor: Option<Recipient<ChildFailed>>,
    failures: u32,
    stopping: bool,
    totals: Vec<(&'static str, u64)>,
    last_log: Instant,
}

impl<S: Service> Maintenance<S> {
    pub fn new(service: S, supervisor: Option<Recipient<ChildFailed>>) -> Self {
        Self {
            service,
            supervisor,
            failures: 0,
            stopping: false,
            totals: Vec::new(),
            last_log: Instant::now(),
        }
    }

    fn record(&mut self, outcome: &Outcome) {
        for (name, n) in &outcome.counts {
            metrics::counter!(crate::telemetry::names::MAINTENANCE_ITEMS_TOTAL, "service" => S::NAME, "item" => *name)
                .increment(*n);
            match self.totals.iter_mut().find(|(k, _)| k == name) {
                Some((_, total)) => *total += n,
                None => self.totals.push((name, *n)),
            }
        }
        if self.last_log.elapsed() >= LOG_EVERY && self.totals.iter().any(|(_, n)| *n > 0) {
            let summary = Outcome {
                counts: std::mem::take(&mut self.totals),
                more: false,
            };
            tracing::info!(service = S::NAME, %summary, "background work done");
            self.last_log = Instant::now();
        }
    }
}

impl<S: Service> Actor for Maintenance<S> {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.notify(Tick);
    }
}

impl<S: Service> Handler<Tick> for Maintenance<S> {
    type Result = ();

    fn handle(&mut self, _: Tick, ctx: &mut Self::Context) {
        if self.stopping {
            ctx.stop();
            return;
        }
        metrics::counter!(crate::telemetry::names::MAINTENANCE_RUNS_TOTAL, "service" => S::NAME)
            .increment(1);
        // A task of its own, so that a panic is caught as a JoinError instead of
        // taking the arbiter down.
        let run = actix::spawn(self.service.run_once());
        ctx.wait(run.into_actor(self).map(|result, runner, ctx| match result {
            Ok(Ok(outcome)) => {
                if runner.failures > 0 {
                    tracing::info!(
                        service = S::NAME,
                        failures = runner.failures,
                        "background service works again"
                    );
                }
                runner.failures = 0;
                if outcome.did_work() {
                    tracing::debug!(service = S::NAME, %outcome, "run did work");
                }
                runner.record(&outcome);
                let next = if outcome.more {
                    Duration::ZERO
                } else {
                    runner.service.interval()
                };
                ctx.notify_later(Tick, next);
            }
            Ok(Err(e)) => {
                runner.failures += 1;
                metrics::counter!(crate::telemetry::names::MAINTENANCE_FAILURES_TOTAL, "service" => S::NAME)
                    .increment(1);
                let delay = failure_backoff(runner.service.interval(), runner.failures);
                // One WARN when a service starts failing, one INFO when it works again:
                // an outage is two lines per service, not one per retry (issue 51).
                // The failures in between are counted (the metric) and at DEBUG.
                if runner.failures == 1 {
                    tracing::warn!(service = S::NAME, error = %e, retry_in_ms = delay.as_millis() as u64, "background service failing; retrying with backoff");
                } else {
                    tracing::debug!(service = S::NAME, error = %e, failures = runner.failures, retry_in_ms = delay.as_millis() as u64, "background run failed again");
                }
                ctx.notify_later(Tick, delay);
            }
            Err(join) => {
                tracing::error!(service = S::NAME, error = %join, "background service panicked; the supervisor restarts it");
                if let Some(supervisor) = &runner.supervisor {
                    supervisor.do_send(ChildFailed {
                        name: S::NAME.to_owned(),
                        kind: S::NAME,
                    });
                }
                ctx.stop();
            }
        }));
    }
}

impl<S: Service> Handler<StopChild> for Maintenance<S> {
    type Result = ();

    fn handle(&mut self, _: StopChild, ctx: &mut Self::Context) {
        // A run in progress finishes first (ctx.wait), then the next tick stops.
        self.stopping = true;
        ctx.notify(Tick);
    }
}

/// Doubling from the interval, capped, with up to 25 % jitter so that instances
/// spread out.
fn failure_backoff(interval: Duration, failures: u32) -> Duration {
    let base = interval.max(Duration::from_millis(100));
    let exp = backoff::exponential(base, MAX_FAILURE_BACKOFF, failures.min(10));
    backoff::jittered(exp, 25)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_recovery_looks_at_most_once_a_quarter_lease() {
        let recovery = LeaseRecovery::new(Duration::from_millis(40));
        assert!(recovery.due(), "the first run looks");
        assert!(!recovery.due(), "not again within a quarter lease");
        std::thread::sleep(Duration::from_millis(10));
        assert!(recovery.due(), "again once a quarter lease has passed");
        assert!(!recovery.due());
    }
}
