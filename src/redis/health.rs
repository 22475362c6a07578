//! Whether Redis answers: the one health check every prober of Redis goes through
//! (the readiness monitor, the front stage's link check, `validate`), so that they
//! agree on what "up" means and say "down" in the same words. A PING, bounded by the
//! caller's time limit; a hung server is an answer too ("no answer within ...").

use std::time::Duration;

use ::redis::RedisError;

use super::{connect, timed, Conn};
use crate::config::RedisSettings;

/// `conn` answers a PING within `timeout`; otherwise why not.
pub async fn check(conn: &mut impl Conn, timeout: Duration) -> Result<(), String> {
    answer(conn, timeout, timeout).await
}

/// `check` on a new connection to `redis.url`, opened and asked within the same
/// `timeout` (for a prober that holds no connection of its own).
pub async fn check_new(settings: &RedisSettings, timeout: Duration) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut conn = match tokio::time::timeout_at(deadline, connect(settings)).await {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => return Err(e.to_string()),
        Err(_) => return Err(no_answer(timeout)),
    };
    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
    answer(&mut conn, left, timeout).await
}

/// The check itself: a PING answered within `left`; a late answer names `limit`,
/// the caller's whole time limit.
async fn answer(conn: &mut impl Conn, left: Duration, limit: Duration) -> Result<(), String> {
    match tokio::time::timeout(left, ping(conn)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(no_answer(limit)),
    }
}

/// `PING`: the connection answers.
async fn ping(conn: &mut impl Conn) -> Result<(), RedisError> {
    timed("ping", ::redis::cmd("PING").query_async::<String>(conn))
        .await
        .map(|_| ())
}

/// "no answer within 2 s" (or "... 500 ms").
fn no_answer(timeout: Duration) -> String {
    if timeout.subsec_millis() == 0 {
        format!("no answer within {} s", timeout.as_secs())
    } else {
        format!("no answer within {} ms", timeout.as_millis())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_is_named_in_its_unit() {
        assert_eq!(no_answer(Duration::from_secs(2)), "no answer within 2 s");
        assert_eq!(
            no_answer(Duration::from_millis(500)),
            "no answer within 500 ms"
        );
    }
}
