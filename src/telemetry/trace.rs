//! Which activities' orders are followed (seed §12.1, "follow one order"): the
//! per-message lines of their order transactions are logged at INFO instead of
//! DEBUG, without raising the level of anything else. Activities come from
//! `telemetry.trace_activities` (for the process's life) and from
//! `POST /admin/trace` (for a while). One set per process: every bucket actor of
//! this engine reads it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{LazyLock, RwLock};
use std::time::{Duration, Instant};

/// Activity → until when it is followed (`None`: for good).
static TRACED: LazyLock<RwLock<HashMap<i64, Option<Instant>>>> =
    LazyLock::new(|| RwLock::new(HashMap::new()));

/// Whether any activity was ever followed: until one is, the order path does not
/// touch the lock.
static ANY: AtomicBool = AtomicBool::new(false);

/// The most activities followed at once: a bound of the configuration too
/// (`telemetry.trace_activities`), so it lives there.
pub use crate::config::MAX_TRACED_ACTIVITIES as MAX_TRACED;

/// Follows these activities for the life of the process (`telemetry.trace_activities`).
pub fn follow_always(activities: &[i64]) {
    let mut traced = TRACED
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for activity in activities {
        traced.insert(*activity, None);
        ANY.store(true, Ordering::Relaxed);
    }
}

/// Follows `activity` for `ttl` (longer if it was followed longer already);
/// false when `MAX_TRACED` other activities are followed.
pub fn follow_for(activity: i64, ttl: Duration) -> bool {
    let until = Instant::now() + ttl;
    let mut traced = TRACED
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    traced.retain(|_, until| until.is_none_or(|until| until > Instant::now()));
    if traced.len() >= MAX_TRACED && !traced.contains_key(&activity) {
        return false;
    }
    ANY.store(true, Ordering::Relaxed);
    let entry = traced.entry(activity).or_insert(Some(until));
    if let Some(current) = entry {
        *current = (*current).max(until);
    }
    true
}

/// Whether the orders of `activity` are followed now. A read lock and a lookup:
/// cheap enough for every order transaction.
pub fn followed(activity: i64) -> bool {
    if !ANY.load(Ordering::Relaxed) {
        return false;
    }
    TRACED
        .read()
        .map(|traced| {
            traced
                .get(&activity)
                .is_some_and(|until| until.is_none_or(|until| until > Instant::now()))
        })
        .unwrap_or(false)
}

/// The activities followed now, with the seconds left (`None`: for good).
pub fn followed_now() -> Vec<(i64, Option<u64>)> {
    let now = Instant::now();
    let traced = TRACED
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut out: Vec<_> = traced
        .iter()
        .filter(|(_, until)| until.is_none_or(|until| until > now))
        .map(|(activity, until)| (*activity, until.map(|u| (u - now).as_secs())))
        .collect();
    out.sort_unstable();
    out
}

/// Logs at INFO when the activity is followed, else at DEBUG; the same fields.
#[macro_export]
macro_rules! order_log {
    ($activity:expr, $($fields:tt)+) => {
        if $crate::telemetry::trace::followed($activity) {
            tracing::info!($($fields)+)
        } else {
            tracing::debug!($($fields)+)
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_activity_is_followed_until_its_time_runs_out() {
        assert!(!followed(9_000_001));
        follow_always(&[9_000_001]);
        assert!(followed(9_000_001));
        assert!(follow_for(9_000_002, Duration::from_millis(30)));
        assert!(followed(9_000_002));
        std::thread::sleep(Duration::from_millis(60));
        assert!(!followed(9_000_002));
        assert!(followed_now()
            .iter()
            .any(|(a, left)| *a == 9_000_001 && left.is_none()));
    }
}
