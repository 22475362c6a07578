//! The order latency of the last few seconds, for the live page (`GET /status`): the
//! Prometheus histogram counts since the start, which a page cannot turn into "now"
//! without a Prometheus. Two windows of `WINDOW` each, the current and the last one;
//! a quantile reads both, so it covers between one and two windows. Recorded once
//! per order, beside `seckill_order_commit_latency_seconds`, with atomic adds only:
//! it is on the order path of every lane. This module owns the arithmetic; the
//! windows of an engine live in its `status::Live`.

use std::sync::atomic::{AtomicU64, Ordering};
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
const BUCKETS: usize = 23;
const _: () = assert!(BOUNDS.len() == BUCKETS);
const WINDOW: Duration = Duration::from_secs(5);

/// The latency windows of one engine. Window `n` (counted from `origin`) lives in
/// slot `n % 2`; a slot still holding an older window is cleared by the first
/// recorder that finds it so. A record racing that clear may be lost or counted in
/// the wrong window: a figure for a page, not an account.
#[derive(Debug)]
pub struct Recent {
    origin: Instant,
    window: [AtomicU64; 2],
    counts: [[AtomicU64; BUCKETS]; 2],
}

impl Default for Recent {
    fn default() -> Self {
        Self::new(Instant::now())
    }
}

impl Recent {
    fn new(origin: Instant) -> Self {
        Self {
            origin,
            window: [AtomicU64::new(0), AtomicU64::new(u64::MAX)],
            counts: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
        }
    }

    fn number(&self, now: Instant) -> u64 {
        (now.saturating_duration_since(self.origin).as_millis() / WINDOW.as_millis()) as u64
    }

    /// The slot of window `n`, cleared first if it held an older one.
    fn slot(&self, n: u64) -> usize {
        let slot = (n % 2) as usize;
        let held = self.window[slot].load(Ordering::Acquire);
        if held != n
            && self.window[slot]
                .compare_exchange(held, n, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            for count in &self.counts[slot] {
                count.store(0, Ordering::Relaxed);
            }
        }
        slot
    }

    /// Records one order's latency.
    pub fn record(&self, latency: Duration) {
        self.record_at(Instant::now(), latency.as_secs_f64());
    }

    /// Orders recorded in the last one to two windows, and the upper bounds
    /// (seconds) of the buckets holding their 50th and 99th percentiles; `None`
    /// without orders.
    pub fn summary(&self) -> Option<(u64, f64, f64)> {
        quantiles(&self.counts(Instant::now()))
    }

    fn record_at(&self, now: Instant, secs: f64) {
        let bucket = BOUNDS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(BUCKETS - 1);
        let slot = self.slot(self.number(now));
        self.counts[slot][bucket].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts of the current window and the one before it, if that is the last.
    fn counts(&self, now: Instant) -> [u64; BUCKETS] {
        let n = self.number(now);
        let mut sum = [0; BUCKETS];
        for (slot, window) in self.window.iter().enumerate() {
            let held = window.load(Ordering::Acquire);
            if held == n || (n > 0 && held == n - 1) {
                for (total, count) in sum.iter_mut().zip(&self.counts[slot]) {
                    *total += count.load(Ordering::Relaxed);
                }
            }
        }
        sum
    }
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
        let w = Recent::new(start);
        w.record_at(start, 0.0005);
        assert_eq!(w.counts(start)[0], 1);
        // The next window still sees the last one...
        w.record_at(start + WINDOW, 0.0005);
        assert_eq!(w.counts(start + WINDOW)[0], 2);
        // ...and one two windows on sees only its own.
        w.record_at(start + WINDOW * 2, 0.0005);
        assert_eq!(w.counts(start + WINDOW * 2)[0], 2);
        assert_eq!(w.counts(start + WINDOW * 4)[0], 0);
    }
}
