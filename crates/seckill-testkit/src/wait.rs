//! Waiting on conditions instead of sleeping, and the budgets those waits get.
//!
//! A wait polls what the test can observe (a row, a log line, a metric, a readiness
//! answer, a queue depth) until it holds. Its budget only bounds a hang unless the
//! test is about the timing: the suite runs on small shared machines (two cores,
//! several suites and builds at once), where what takes a second alone can take
//! many times that, so a budget that bounds a hang is generous and named.

use std::future::Future;
use std::time::{Duration, Instant};

/// The budget of a wait that only bounds a hang: the awaited thing does happen, but
/// a loaded machine may delay it far beyond what it takes alone (a process starting,
/// a connection coming back, a backlog draining). Failing sooner proves nothing.
pub const HANG: Duration = Duration::from_secs(120);

/// How often a wait looks again unless it says otherwise.
pub const POLL_EVERY: Duration = Duration::from_millis(50);

/// How long a scenario may take to settle before the test fails (a whole sale's
/// backlog; `SECKILL_TEST_SETTLE_SECS` overrides the 240 s).
pub fn settle() -> Duration {
    let secs = std::env::var("SECKILL_TEST_SETTLE_SECS")
        .ok()
        .and_then(|s| s.parse().ok());
    Duration::from_secs(secs.unwrap_or(240))
}

/// Polls `probe` every `every` until it answers `Ok`, or until `budget` has passed:
/// the first `Ok` value and how long it took to come, or the last `Err` value.
pub async fn poll_every<T, E, F, Fut>(
    budget: Duration,
    every: Duration,
    mut probe: F,
) -> Result<(Duration, T), E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let started = Instant::now();
    let deadline = started + budget;
    loop {
        match probe().await {
            Ok(value) => return Ok((started.elapsed(), value)),
            Err(last) if Instant::now() >= deadline => return Err(last),
            Err(_) => tokio::time::sleep(every).await,
        }
    }
}

/// `poll_every` at the usual pace.
pub async fn poll<T, E, F, Fut>(budget: Duration, probe: F) -> Result<(Duration, T), E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    poll_every(budget, POLL_EVERY, probe).await
}

/// Polls `condition` until it holds or `timeout` passes; returns whether it held.
pub async fn wait_until<F, Fut>(timeout: Duration, mut condition: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    poll(timeout, || {
        let held = condition();
        async move {
            if held.await {
                Ok(())
            } else {
                Err(())
            }
        }
    })
    .await
    .is_ok()
}

/// Waits (up to `budget`) until `condition` holds; the test fails, naming `what`
/// it waited for, if it never does.
pub async fn wait_for<F, Fut>(budget: Duration, what: &str, condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    assert!(
        wait_until(budget, condition).await,
        "waited {budget:?} for {what}"
    );
}

/// Lets `period` pass on purpose, running `check` (which asserts) every `every`:
/// the test proves that something does not happen (a backlog stays in the broker
/// while the engine must not take it), which takes time to mean anything. The last
/// check runs once `period` has passed.
pub async fn check_during<F, Fut>(period: Duration, every: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let started = Instant::now();
    while started.elapsed() < period {
        // Deliberate: time has to pass for the absence of an effect to be seen.
        tokio::time::sleep(every).await;
        check().await;
    }
}
