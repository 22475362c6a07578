//! The order latency of the last few seconds, for the live page (`GET /status`): the
//! Prometheus histogram counts since the start, which a page cannot turn into "now"
//! without a Prometheus. Two windows of `WINDOW` each, the current and the last one;
//! a quantile reads both, so it covers between one and two windows. Recorded once
//! per order, beside `seckill_order_commit_latency_seconds`.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Bucket upper bounds in seconds (the last one catches everything above).
const BOUNDS: &[f64] = &[
    0.001,
    0.0025,
    0.005,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.04,
    0.05,
    0.06,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    f64::INFINITY,
];
const WINDOW: Duration = Duration::from_secs(5);

struct Windows {
    started: Instant,
    current: Vec<u64>,
    last: Vec<u64>,
}

impl Windows {
    fn roll(&mut self, now: Instant) {
        let age = now.saturating_duration_since(self.started);
        if age >= WINDOW * 2 {
            self.last.iter_mut().for_each(|c| *c = 0);
            self.current.iter_mut().for_each(|c| *c = 0);
            self.started = now;
        } else if age >= WINDOW {
            std::mem::swap(&mut self.last, &mut self.current);
            self.current.iter_mut().for_each(|c| *c = 0);
            self.started += WINDOW;
        }
    }
}

static RECENT: Mutex<Option<Windows>> = Mutex::new(None);

fn with<T>(f: impl FnOnce(&mut Windows) -> T) -> Option<T> {
    let mut guard = RECENT.lock().ok()?;
    let now = Instant::now();
    let windows = guard.get_or_insert_with(|| Windows {
        started: now,
        current: vec![0; BOUNDS.len()],
        last: vec![0; BOUNDS.len()],
    });
    windows.roll(now);
    Some(f(windows))
}

/// Records one order's latency.
pub fn record(latency: Duration) {
    let secs = latency.as_secs_f64();
    let bucket = BOUNDS
        .iter()
        .position(|b| secs <= *b)
        .unwrap_or(BOUNDS.len() - 1);
    with(|w| w.current[bucket] += 1);
}

/// Orders recorded in the last one to two windows, and the upper bounds (seconds)
/// of the buckets holding their 50th and 99th percentiles; `None` without orders.
pub fn summary() -> Option<(u64, f64, f64)> {
    let counts: Vec<u64> = with(|w| w.current.iter().zip(&w.last).map(|(a, b)| a + b).collect())?;
    quantiles(&counts)
}

fn quantiles(counts: &[u64]) -> Option<(u64, f64, f64)> {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return None;
    }
    let at = |q: f64| {
        let rank = (q * total as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (count, bound) in counts.iter().zip(BOUNDS) {
            seen += count;
            if seen >= rank {
                return *bound;
            }
        }
        f64::INFINITY
    };
    Some((total, at(0.5), at(0.99)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_the_upper_bounds_of_their_buckets() {
        let mut counts = vec![0; BOUNDS.len()];
        counts[3] = 99; // <= 10 ms
        counts[12] = 1; // <= 100 ms
                        // The 99th of 100 is in the first bucket...
        assert_eq!(quantiles(&counts), Some((100, 0.01, 0.01)));
        // ...the 100th of 101 in the second.
        counts[12] = 2;
        assert_eq!(quantiles(&counts), Some((101, 0.01, 0.1)));
        assert_eq!(quantiles(&vec![0; BOUNDS.len()]), None);
    }

    #[test]
    fn a_window_rolls_into_the_last_and_then_out() {
        let start = Instant::now();
        let mut w = Windows {
            started: start,
            current: vec![1; BOUNDS.len()],
            last: vec![0; BOUNDS.len()],
        };
        w.roll(start + WINDOW);
        assert_eq!((w.current[0], w.last[0]), (0, 1));
        w.roll(start + WINDOW * 4);
        assert_eq!((w.current[0], w.last[0]), (0, 0));
    }
}
