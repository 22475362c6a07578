//! Retry delays: exponential from a base, capped, with jitter so that many failing
//! units (or instances) do not retry in lockstep.

use std::time::Duration;

use rand::Rng;

/// `base * 2^attempts`, at most `max`, plus up to 20 % jitter.
pub fn backoff(base: Duration, max: Duration, attempts: i32) -> Duration {
    let exp = base.saturating_mul(1 << attempts.clamp(0, 20)).min(max);
    exp + Duration::from_millis(rand::rng().random_range(0..=exp.as_millis() as u64 / 5))
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
}
