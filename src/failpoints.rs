//! Crash points for the fault-injection suite. With the `chaos` feature, a point
//! armed through `FAILPOINTS` (the `fail` crate's syntax, e.g.
//! `FAILPOINTS=after_commit_before_ack=2%return`) aborts the process right there,
//! the way a power cut would; without the feature `failpoint!` expands to nothing.
//!
//! The points: `after_commit_before_ack` (intake), `publish_before_confirm` (every
//! confirmed publish), `outbox_after_confirm_before_sent` (outbox publisher),
//! `sweeper_between_claim_and_update`, `compensation_after_redis_before_done`.
//!
//! Points that do not abort (`failpoint_for!`), armed by in-process tests for one
//! activity: `frontstage_confirm_lost` (the front stage's publish was confirmed, and
//! is treated as if its confirm had been lost).
//!
//! Points that hang (`failpoint_hang!`), armed through `FAILPOINTS` with `return`:
//! `order_tx_before_commit` (every statement of the order transaction has been
//! answered, the stock UPDATE among them, and COMMIT is not sent). The transaction
//! stays open, holding its row locks, until the process is killed: a test sees that
//! state in PostgreSQL and then kills the process with SIGKILL at exactly that point
//! (seed §13.4).

/// Whether the named point is armed as `return(ARG)` with ARG equal to the given
/// value (its `Display`): a fault an in-process test injects for its own activity
/// only, since the tests share one process. Always false without the feature.
#[macro_export]
macro_rules! failpoint_for {
    ($name:literal, $arg:expr) => {{
        #[cfg(feature = "chaos")]
        let armed = $crate::failpoints::armed_for($name, &$arg);
        #[cfg(not(feature = "chaos"))]
        let armed = {
            let _ = &$arg;
            false
        };
        armed
    }};
}

/// Aborts the process if the named point is armed.
#[macro_export]
macro_rules! failpoint {
    ($name:literal) => {
        #[cfg(feature = "chaos")]
        $crate::failpoints::check($name);
    };
}

/// Never returns if the named point is armed (see the module docs); the caller has
/// had every statement before it answered.
#[macro_export]
macro_rules! failpoint_hang {
    ($name:literal) => {
        #[cfg(feature = "chaos")]
        $crate::failpoints::hang_if_armed($name).await;
    };
}

#[cfg(feature = "chaos")]
pub async fn hang_if_armed(name: &str) {
    if armed(name) {
        match hang(name).await {}
    }
}

/// Waits forever (until the process is killed).
#[cfg(feature = "chaos")]
pub async fn hang(name: &str) -> std::convert::Infallible {
    eprintln!("failpoint {name}: hanging until the process is killed");
    std::future::pending().await
}

/// Whether the named point is armed at all.
#[cfg(feature = "chaos")]
pub fn armed(name: &str) -> bool {
    fail::eval(name, |_| ()).is_some()
}

#[cfg(feature = "chaos")]
pub fn check(name: &str) {
    if fail::eval(name, |_| ()).is_some() {
        // stderr directly: the crash must be visible even if logging is buffered.
        eprintln!("failpoint {name}: aborting the process");
        std::process::abort();
    }
}

#[cfg(feature = "chaos")]
pub fn armed_for(name: &str, arg: &dyn std::fmt::Display) -> bool {
    fail::eval(name, |value| value) == Some(Some(arg.to_string()))
}

/// Arms one point in this process (`fail::cfg`'s syntax), for in-process tests.
#[cfg(feature = "chaos")]
pub fn set(name: &str, actions: &str) -> Result<(), String> {
    fail::cfg(name, actions)
}

/// Arms the points named in `FAILPOINTS`; the returned guard keeps them armed.
#[cfg(feature = "chaos")]
pub fn arm() -> fail::FailScenario<'static> {
    fail::FailScenario::setup()
}
