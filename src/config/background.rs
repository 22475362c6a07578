//! The background services' sections: `[outbox]`, `[retention]`, `[sweeper]`,
//! `[compensation]`, `[payment]`, `[supervisor]` and `[shutdown]`. Every rule on them
//! is a numeric bound (`config::BOUNDS`), a cap never below its base among them.

use std::time::Duration;

use serde::Deserialize;

/// The outbox publisher (`services::outbox_publisher`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutboxSettings {
    pub interval_ms: u64,
    pub batch_size: u32,
    pub busy_interval_ms: u64,
    pub max_lag_ms: u64,
    pub lease_ms: u64,
    pub backoff_base_ms: u64,
    pub backoff_max_ms: u64,
}

/// `[retention]` (seed §8.5): what the retention service keeps and for how long.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionSettings {
    pub interval_ms: u64,
    pub batch_size: u32,
    pub inbox_secs: u64,
    pub outbox_history_secs: u64,
}

impl RetentionSettings {
    /// How long an inbox row is kept: the window in which a redelivered or replayed
    /// message is still answered by the inbox.
    pub fn inbox_window(&self) -> Duration {
        Duration::from_secs(self.inbox_secs)
    }
}

/// The sweeper, which cancels expired unpaid orders (`services::sweeper`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweeperSettings {
    pub interval_ms: u64,
    pub batch_size: u32,
}

/// The compensation worker, which gives Redis units back (`services::compensation_worker`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompensationSettings {
    pub interval_ms: u64,
    pub batch_size: u32,
    pub lease_ms: u64,
    pub backoff_base_ms: u64,
    pub backoff_max_ms: u64,
    pub released_marker_ttl_secs: u64,
}

/// Payment callbacks.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PaymentSettings {
    pub consumer_group: String,
}

/// Restarts of failed services and intakes (`services::supervisor`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SupervisorSettings {
    pub restart_base_ms: u64,
    pub restart_max_ms: u64,
}

/// What SIGTERM and SIGINT leave time for.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShutdownSettings {
    pub grace_ms: u64,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::result_large_err)] // Jail's closures return figment's error.

    #[test]
    fn a_value_out_of_bounds_names_its_key_and_source() {
        for (var, value, key) in [
            ("SECKILL__OUTBOX__BATCH_SIZE", "0", "outbox.batch_size"),
            (
                "SECKILL__RETENTION__INBOX_SECS",
                "0",
                "retention.inbox_secs",
            ),
            ("SECKILL__SWEEPER__INTERVAL_MS", "0", "sweeper.interval_ms"),
            (
                "SECKILL__COMPENSATION__BACKOFF_MAX_MS",
                "999",
                "compensation.backoff_max_ms",
            ),
            (
                "SECKILL__SUPERVISOR__RESTART_MAX_MS",
                "199",
                "supervisor.restart_max_ms",
            ),
            (
                "SECKILL__SHUTDOWN__GRACE_MS",
                "3600001",
                "shutdown.grace_ms",
            ),
        ] {
            crate::config::check::tests::refusal(var, value, key);
        }
    }
}
