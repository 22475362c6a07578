//! Request limits of the front stage, per user (what they spend, and apart, what
//! they read) and per client address (`http::client`: behind trusted proxies the
//! forwarded client, IPv6 per network), GCRA from the `governor` crate, answered
//! from memory before Redis, RabbitMQ or PostgreSQL see the request: over a limit,
//! 429 `RATE_LIMITED` with an integer `Retry-After`. `frontstage.rate_limit.*`; a
//! rate of 0 turns that limit off.

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use actix_web::HttpRequest;
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

use super::client::{limit_key, Proxies};
use crate::config::{Cidr, RateLimitSettings};

pub struct Limits {
    per_user: Option<DefaultKeyedRateLimiter<i64>>,
    per_user_reads: Option<DefaultKeyedRateLimiter<i64>>,
    per_address: Option<DefaultKeyedRateLimiter<IpAddr>>,
    proxies: Proxies,
    ipv6_prefix_len: u8,
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
    /// `trusted_proxies`: `frontstage.auth.trusted_proxies`.
    pub fn new(settings: &RateLimitSettings, trusted_proxies: &[Cidr]) -> Self {
        Self {
            per_user: limiter(settings.per_user_per_s, settings.per_user_burst),
            per_user_reads: limiter(settings.per_user_reads_per_s, settings.per_user_reads_burst),
            per_address: limiter(settings.per_address_per_s, settings.per_address_burst),
            proxies: Proxies::new(trusted_proxies),
            ipv6_prefix_len: settings.ipv6_prefix_len,
            clock: DefaultClock::default(),
        }
    }

    fn check<K: std::hash::Hash + Eq + Clone>(
        &self,
        limiter: &Option<DefaultKeyedRateLimiter<K>>,
        key: &K,
        scope: &'static str,
    ) -> Result<(), Limited> {
        let Some(limiter) = limiter else {
            return Ok(());
        };
        limiter.check_key(key).map_err(|not_until| Limited {
            scope,
            wait: not_until.wait_time_from(self.clock.now()),
        })
    }

    /// Counts a request from the client's address (`http::client`).
    pub fn address(&self, req: &HttpRequest) -> Result<(), Limited> {
        if self.per_address.is_none() {
            return Ok(());
        }
        let Some(client) = self.proxies.client_of(req) else {
            return Ok(());
        };
        let key = limit_key(client, self.ipv6_prefix_len);
        self.check(&self.per_address, &key, "address")
    }

    /// Counts something `user` spends (a reservation, a purchase token).
    pub fn user(&self, user: i64) -> Result<(), Limited> {
        self.check(&self.per_user, &user, "user")
    }

    /// Counts a read of `user`'s own reservations, orders or history.
    pub fn user_read(&self, user: i64) -> Result<(), Limited> {
        self.check(&self.per_user_reads, &user, "user_reads")
    }

    /// Forgets keys whose limits have fully recovered (a sale's buyers come once).
    pub fn shrink(&self) {
        for l in [&self.per_user, &self.per_user_reads].into_iter().flatten() {
            l.retain_recent();
            l.shrink_to_fit();
        }
        if let Some(l) = &self.per_address {
            l.retain_recent();
            l.shrink_to_fit();
        }
    }
}

/// Counts a refusal; the `Retry-After` of its 429, in whole seconds (at least 1).
pub fn refused(limited: Limited) -> u64 {
    metrics::counter!(crate::telemetry::names::HTTP_RATE_LIMITED_TOTAL, "scope" => limited.scope)
        .increment(1);
    let secs = limited.wait.as_secs() + u64::from(limited.wait.subsec_nanos() > 0);
    secs.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> RateLimitSettings {
        RateLimitSettings {
            per_user_per_s: 2,
            per_user_burst: 5,
            per_address_per_s: 0,
            per_address_burst: 0,
            per_user_reads_per_s: 1,
            per_user_reads_burst: 3,
            ipv6_prefix_len: 64,
        }
    }

    #[test]
    fn a_user_gets_the_burst_then_waits_and_others_are_unaffected() {
        let limits = Limits::new(&settings(), &[]);
        for _ in 0..5 {
            assert!(limits.user(1).is_ok());
        }
        let limited = limits.user(1).unwrap_err();
        assert!(limited.wait > Duration::ZERO && limited.wait <= Duration::from_millis(500));
        assert!(limits.user(2).is_ok());
        // Reads have their own budget: spent spending, a user still reads, and
        // reading does not spend.
        for _ in 0..3 {
            assert!(limits.user_read(1).is_ok());
        }
        assert_eq!(limits.user_read(1).unwrap_err().scope, "user_reads");
        assert!(limits.user_read(2).is_ok());
        let req = actix_web::test::TestRequest::default()
            .peer_addr("10.0.0.1:1".parse().unwrap())
            .to_http_request();
        for _ in 0..100 {
            assert!(limits.address(&req).is_ok(), "the address limit is off");
        }
    }
}
