//! Which activities' orders are followed (seed §12.1, "follow one order"): the
//! per-message lines of their order transactions are logged at INFO instead of
//! DEBUG, without raising the level of anything else. Activities come from
//! `telemetry.trace_activities` (for the engine's life) and from
//! `POST /admin/trace` (for a while). This module owns the set's rules; the set of
//! an engine lives in its `status::Live`, read by every bucket actor of that engine.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::RwLock;
use std::time::{Duration, Instant};

/// The most activities followed at once: a bound of the configuration too
/// (`telemetry.trace_activities`), so it lives there.
pub use crate::config::MAX_TRACED_ACTIVITIES as MAX_TRACED;

/// The activities one engine follows.
#[derive(Debug, Default)]
pub struct Traced {
    /// Activity → until when it is followed (`None`: for good).
    until: RwLock<HashMap<i64, Option<Instant>>>,
    /// Whether any activity was ever followed: until one is, the order path does
    /// not touch the lock.
    any: AtomicBool,
}

impl Traced {
    /// Follows these activities for the engine's life (`telemetry.trace_activities`).
    pub fn follow_always(&self, activities: &[i64]) {
        let mut traced = self
            .until
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for activity in activities {
            traced.insert(*activity, None);
            self.any.store(true, Ordering::Relaxed);
        }
    }

    /// Follows `activity` for `ttl` (longer if it was followed longer already);
    /// false when `MAX_TRACED` other activities are followed.
    pub fn follow_for(&self, activity: i64, ttl: Duration) -> bool {
        let until = Instant::now() + ttl;
        let mut traced = self
            .until
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        traced.retain(|_, until| until.is_none_or(|until| until > Instant::now()));
        if traced.len() >= MAX_TRACED && !traced.contains_key(&activity) {
            return false;
        }
        self.any.store(true, Ordering::Relaxed);
        let entry = traced.entry(activity).or_insert(Some(until));
        if let Some(current) = entry {
            *current = (*current).max(until);
        }
        true
    }

    /// Whether the orders of `activity` are followed now. A read lock and a lookup:
    /// cheap enough for every order transaction.
    pub fn followed(&self, activity: i64) -> bool {
        if !self.any.load(Ordering::Relaxed) {
            return false;
        }
        self.until
            .read()
            .map(|traced| {
                traced
                    .get(&activity)
                    .is_some_and(|until| until.is_none_or(|until| until > Instant::now()))
            })
            .unwrap_or(false)
    }

    /// The activities followed now, with the seconds left (`None`: for good).
    pub fn followed_now(&self) -> Vec<(i64, Option<u64>)> {
        let now = Instant::now();
        let traced = self
            .until
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
}

/// Logs at INFO when the activity is followed by `$traced` (a `Traced`), else at
/// DEBUG; the same fields.
#[macro_export]
macro_rules! order_log {
    ($traced:expr, $activity:expr, $($fields:tt)+) => {
        if $traced.followed($activity) {
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
        let traced = Traced::default();
        assert!(!traced.followed(9_000_001));
        traced.follow_always(&[9_000_001]);
        assert!(traced.followed(9_000_001));
        assert!(traced.follow_for(9_000_002, Duration::from_millis(30)));
        assert!(traced.followed(9_000_002));
        std::thread::sleep(Duration::from_millis(60));
        assert!(!traced.followed(9_000_002));
        assert!(traced
            .followed_now()
            .iter()
            .any(|(a, left)| *a == 9_000_001 && left.is_none()));
    }

    #[test]
    fn two_sets_share_nothing() {
        let (a, b) = (Traced::default(), Traced::default());
        a.follow_always(&[7]);
        assert!(a.followed(7) && !b.followed(7));
    }
}
