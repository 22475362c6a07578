//! The supervisor owns the engine's long-lived children (the intakes and the
//! background services): it starts each one, restarts one that failed (a service
//! panicked, an intake lost its broker connection) after an exponential, capped
//! backoff, counts restarts, and stops them all on shutdown. A restart loses nothing: every unit of work is a
//! PostgreSQL row or an unacked AMQP message.

use std::collections::HashMap;
use std::time::Duration;

use actix::prelude::*;

/// From a child: it stopped and wants to be started again.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ChildFailed {
    /// The name it was registered under.
    pub name: String,
    /// A small fixed label for metrics ("outbox_publisher", "intake", ...).
    pub kind: &'static str,
}

/// To a child: stop after the current run.
#[derive(Message)]
#[rtype(result = "()")]
pub struct StopChild;

/// Starts a child and returns its stop handle; it reports failure to the recipient.
pub type ChildFactory = Box<dyn Fn(Recipient<ChildFailed>) -> Recipient<StopChild>>;

struct Child {
    start: ChildFactory,
    running: Option<Recipient<StopChild>>,
    /// Restarts in all (reported by `Restarts`).
    restarts: u32,
    /// Failures since the child last ran for `STABLE`: the backoff grows with these
    /// only, so a child that failed now and then over days is not held back 30 s.
    streak: u32,
    started_at: Option<std::time::Instant>,
}

/// A child that ran this long before failing starts its backoff over.
const STABLE: Duration = Duration::from_secs(60);

/// The failure streak after a failure of a child that ran for `ran`.
fn next_streak(streak: u32, ran: Option<Duration>) -> u32 {
    if ran.is_some_and(|ran| ran >= STABLE) {
        1
    } else {
        streak.saturating_add(1)
    }
}

pub struct Supervisor {
    children: HashMap<String, Child>,
    base: Duration,
    max: Duration,
}

/// Restarts per child so far.
#[derive(Message)]
#[rtype(result = "HashMap<String, u32>")]
pub struct Restarts;

/// Stop every child after its current unit of work.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Shutdown;

impl Supervisor {
    pub fn new(base: Duration, max: Duration) -> Self {
        Self {
            children: HashMap::new(),
            base,
            max,
        }
    }

    /// Registers a child under `name` (started with the supervisor).
    pub fn child(mut self, name: impl Into<String>, start: ChildFactory) -> Self {
        self.children.insert(
            name.into(),
            Child {
                start,
                running: None,
                restarts: 0,
                streak: 0,
                started_at: None,
            },
        );
        self
    }

    /// Doubling from the base per failure of the streak, capped; no jitter: one
    /// child's restarts are spread out already.
    fn backoff(&self, restarts: u32) -> Duration {
        crate::domain::backoff::exponential(self.base, self.max, restarts.saturating_sub(1).min(16))
    }
}

impl Actor for Supervisor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let me = ctx.address().recipient();
        for child in self.children.values_mut() {
            child.running = Some((child.start)(me.clone()));
            child.started_at = Some(std::time::Instant::now());
        }
    }
}

impl Handler<ChildFailed> for Supervisor {
    type Result = ();

    fn handle(&mut self, failed: ChildFailed, ctx: &mut Self::Context) {
        let Some(child) = self.children.get_mut(&failed.name) else {
            return;
        };
        child.running = None;
        child.restarts += 1;
        child.streak = next_streak(child.streak, child.started_at.map(|at| at.elapsed()));
        let (restarts, streak) = (child.restarts, child.streak);
        metrics::counter!(crate::telemetry::names::ACTOR_RESTARTS_TOTAL, "actor" => failed.kind)
            .increment(1);
        let delay = self.backoff(streak);
        tracing::warn!(
            actor = %failed.name,
            restarts,
            delay_ms = delay.as_millis() as u64,
            "restarting a failed child"
        );
        let name = failed.name;
        ctx.run_later(delay, move |supervisor, ctx| {
            let me = ctx.address().recipient();
            if let Some(child) = supervisor.children.get_mut(&name) {
                child.running = Some((child.start)(me));
                child.started_at = Some(std::time::Instant::now());
            }
        });
    }
}

impl Handler<Restarts> for Supervisor {
    type Result = MessageResult<Restarts>;

    fn handle(&mut self, _: Restarts, _: &mut Self::Context) -> Self::Result {
        MessageResult(
            self.children
                .iter()
                .map(|(name, child)| (name.clone(), child.restarts))
                .collect(),
        )
    }
}

impl Handler<Shutdown> for Supervisor {
    type Result = ();

    fn handle(&mut self, _: Shutdown, ctx: &mut Self::Context) {
        for child in self.children.values_mut() {
            if let Some(running) = child.running.take() {
                running.do_send(StopChild);
            }
        }
        ctx.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_that_ran_a_while_starts_its_backoff_over() {
        assert_eq!(next_streak(0, Some(Duration::from_millis(10))), 1);
        assert_eq!(next_streak(7, Some(Duration::from_secs(1))), 8);
        assert_eq!(next_streak(7, Some(STABLE)), 1);
        assert_eq!(next_streak(u32::MAX, None), u32::MAX);
    }
}
