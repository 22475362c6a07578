//! Crash points for the fault-injection suite. With the `chaos` feature, a point
//! armed through `FAILPOINTS` (the `fail` crate's syntax, e.g.
//! `FAILPOINTS=after_commit_before_ack=2%return`) aborts the process right there,
//! the way a power cut would; without the feature `failpoint!` expands to nothing.
//!
//! The points: `after_commit_before_ack` (intake), `publish_before_confirm` (every
//! confirmed publish), `outbox_after_confirm_before_sent` (outbox publisher),
//! `sweeper_between_claim_and_update`, `compensation_after_redis_before_done`.

/// Aborts the process if the named point is armed.
#[macro_export]
macro_rules! failpoint {
    ($name:literal) => {
        #[cfg(feature = "chaos")]
        $crate::failpoints::check($name);
    };
}

#[cfg(feature = "chaos")]
pub fn check(name: &str) {
    if fail::eval(name, |_| ()).is_some() {
        // stderr directly: the crash must be visible even if logging is buffered.
        eprintln!("failpoint {name}: aborting the process");
        std::process::abort();
    }
}

/// Arms the points named in `FAILPOINTS`; the returned guard keeps them armed.
#[cfg(feature = "chaos")]
pub fn arm() -> fail::FailScenario<'static> {
    fail::FailScenario::setup()
}
