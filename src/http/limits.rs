//! Request limits of the front stage, per user and per client address (GCRA, the
//! `governor` crate), answered from memory before Redis, RabbitMQ or PostgreSQL see
//! the request: over a limit, 429 `RATE_LIMITED` with an integer `Retry-After`.
//! `frontstage.rate_limit.*`; a rate of 0 turns that limit off.

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use actix_web::http::header::RETRY_AFTER;
use actix_web::{HttpRequest, HttpResponse};
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use serde_json::json;

use crate::config::RateLimitSettings;

pub struct Limits {
    per_user: Option<DefaultKeyedRateLimiter<i64>>,
    per_address: Option<DefaultKeyedRateLimiter<IpAddr>>,
    clock: DefaultClock,
}

/// What was over its limit, and for how long.
#[derive(Debug, Clone, Copy)]
pub struct Limited {
    pub scope: &'static str,
    pub wait: Duration,
}

fn limiter<K: std::hash::Hash + Eq + Clone>(
    per_s: u32,
    burst: u32,
) -> Option<DefaultKeyedRateLimiter<K>> {
    let rate = NonZeroU32::new(per_s)?;
    // Validated at start: a burst of at least 1 while the rate is on.
    let burst = NonZeroU32::new(burst).unwrap_or(rate);
    Some(RateLimiter::keyed(
        Quota::per_second(rate).allow_burst(burst),
    ))
}

impl Limits {
    pub fn new(settings: &RateLimitSettings) -> Self {
        Self {
            per_user: limiter(settings.per_user_per_s, settings.per_user_burst),
            per_address: limiter(settings.per_address_per_s, settings.per_address_burst),
            clock: DefaultClock::default(),
        }
    }

    /// Counts a request from the client's address (the TCP peer).
    pub fn address(&self, req: &HttpRequest) -> Result<(), Limited> {
        let (Some(limiter), Some(peer)) = (&self.per_address, req.peer_addr()) else {
            return Ok(());
        };
        limiter.check_key(&peer.ip()).map_err(|not_until| Limited {
            scope: "address",
            wait: not_until.wait_time_from(self.clock.now()),
        })
    }

    /// Counts a request of `user`.
    pub fn user(&self, user: i64) -> Result<(), Limited> {
        let Some(limiter) = &self.per_user else {
            return Ok(());
        };
        limiter.check_key(&user).map_err(|not_until| Limited {
            scope: "user",
            wait: not_until.wait_time_from(self.clock.now()),
        })
    }

    /// Forgets keys whose limits have fully recovered (a sale's buyers come once).
    pub fn shrink(&self) {
        if let Some(l) = &self.per_user {
            l.retain_recent();
            l.shrink_to_fit();
        }
        if let Some(l) = &self.per_address {
            l.retain_recent();
            l.shrink_to_fit();
        }
    }
}

/// 429 `RATE_LIMITED` with `Retry-After` in whole seconds (at least 1).
pub fn too_many(limited: Limited) -> HttpResponse {
    metrics::counter!(crate::telemetry::names::HTTP_RATE_LIMITED_TOTAL, "scope" => limited.scope)
        .increment(1);
    let secs = limited.wait.as_secs() + u64::from(limited.wait.subsec_nanos() > 0);
    HttpResponse::TooManyRequests()
        .insert_header((RETRY_AFTER, secs.max(1).to_string()))
        .json(json!({"status": "RATE_LIMITED", "scope": limited.scope}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_gets_the_burst_then_waits_and_others_are_unaffected() {
        let limits = Limits::new(&RateLimitSettings {
            per_user_per_s: 2,
            per_user_burst: 5,
            per_address_per_s: 0,
            per_address_burst: 0,
        });
        for _ in 0..5 {
            assert!(limits.user(1).is_ok());
        }
        let limited = limits.user(1).unwrap_err();
        assert!(limited.wait > Duration::ZERO && limited.wait <= Duration::from_millis(500));
        assert!(limits.user(2).is_ok());
        let req = actix_web::test::TestRequest::default()
            .peer_addr("10.0.0.1:1".parse().unwrap())
            .to_http_request();
        for _ in 0..100 {
            assert!(limits.address(&req).is_ok(), "the address limit is off");
        }
    }
}
