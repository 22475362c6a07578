//! Retry delays, the one place their arithmetic lives: exponential from a base,
//! capped, and (for units or instances that would otherwise retry in lockstep)
//! jittered. Each caller keeps its own numbers: the outbox and compensation rows
//! (`backoff`: doubling from the configured base, up to 20 % jitter), the
//! maintenance runner after a failed run (doubling from its interval, up to 25 %
//! jitter), the supervisor's restarts (doubling, no jitter) and the order
//! transaction's retries in place (doubling from 15 ms, up to 20 ms of jitter).

use std::time::Duration;

use rand::Rng;

/// `base * 2^attempts`, at most `max`, plus up to 20 % jitter (the retries of
/// outbox events and compensation tasks).
pub fn backoff(base: Duration, max: Duration, attempts: i32) -> Duration {
    let doublings = attempts.clamp(0, 20).unsigned_abs();
    jittered(exponential(base, max, doublings), 20)
}

/// `base * 2^doublings`, at most `max`; no jitter.
pub fn exponential(base: Duration, max: Duration, doublings: u32) -> Duration {
    let factor = 1u32.checked_shl(doublings).unwrap_or(u32::MAX);
    base.saturating_mul(factor).min(max)
}

/// `delay` plus a random extra of up to `percent` % of it (whole milliseconds).
pub fn jittered(delay: Duration, percent: u64) -> Duration {
    let most = millis(delay).saturating_mul(percent) / 100;
    plus_up_to(delay, Duration::from_millis(most))
}

/// `delay` plus a random extra of up to `most` (whole milliseconds).
pub fn plus_up_to(delay: Duration, most: Duration) -> Duration {
    delay.saturating_add(Duration::from_millis(
        rand::rng().random_range(0..=millis(most)),
    ))
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_and_caps() {
        let base = Duration::from_millis(100);
        let max = Duration::from_secs(2);
        let first = backoff(base, max, 0);
        assert!(first >= base && first <= base * 12 / 10);
        let third = backoff(base, max, 2);
        assert!(third >= Duration::from_millis(400) && third <= Duration::from_millis(480));
        let late = backoff(base, max, 30);
        assert!(late >= max && late <= max * 12 / 10);
    }

    #[test]
    fn exponential_is_exact_and_saturates() {
        let base = Duration::from_millis(100);
        let max = Duration::from_secs(30);
        assert_eq!(exponential(base, max, 0), base);
        assert_eq!(exponential(base, max, 3), Duration::from_millis(800));
        assert_eq!(exponential(base, max, 16), max);
        assert_eq!(exponential(base, max, 40), max, "no overflow past 31");
    }

    #[test]
    fn jitter_stays_within_its_share() {
        let delay = Duration::from_millis(1000);
        for _ in 0..100 {
            let d = jittered(delay, 25);
            assert!(d >= delay && d <= Duration::from_millis(1250), "{d:?}");
        }
        assert_eq!(jittered(delay, 0), delay);
    }
}
