//! `[telemetry]`: the log format and filter, the gauges' sampling, and the
//! activities whose orders are logged at INFO (`telemetry::trace`).

use serde::Deserialize;

use super::check::{Check, ConfigError};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetrySettings {
    pub format: LogFormat,
    pub level: String,
    /// How often the gauges read from PostgreSQL and RabbitMQ (outbox and
    /// compensation backlog, dead-letter depth, pool state) are refreshed.
    pub sample_interval_ms: u64,
    /// How often the sampler runs the stock invariants over the live sales
    /// (`seckill_conservation_violations`).
    pub conservation_interval_ms: u64,
    /// Activities whose order transactions are logged at INFO (`telemetry::trace`).
    pub trace_activities: Vec<i64>,
}

/// The most activities followed at once, configured or added by `POST /admin/trace`:
/// every line of theirs is logged.
pub const MAX_TRACED_ACTIVITIES: usize = 100;

impl TelemetrySettings {
    pub(super) fn validate(&self, ctx: &Check) -> Result<(), ConfigError> {
        if self.trace_activities.len() > MAX_TRACED_ACTIVITIES {
            return Err(ctx.invalid(
                "telemetry.trace_activities",
                format!("at most {MAX_TRACED_ACTIVITIES} activities"),
            ));
        }
        tracing_subscriber::EnvFilter::try_new(&self.level)
            .map(drop)
            .map_err(|e| ctx.invalid("telemetry.level", format!("not a log filter: {e}")))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::result_large_err)] // Jail's closures return figment's error.

    #[test]
    fn a_bad_value_names_its_key_and_source() {
        let many = format!("[{}]", vec!["1"; 101].join(", "));
        for (var, value, key) in [
            ("SECKILL__TELEMETRY__LEVEL", "info,=[", "telemetry.level"),
            (
                "SECKILL__TELEMETRY__TRACE_ACTIVITIES",
                &many,
                "telemetry.trace_activities",
            ),
            (
                "SECKILL__TELEMETRY__SAMPLE_INTERVAL_MS",
                "99",
                "telemetry.sample_interval_ms",
            ),
        ] {
            crate::config::check::tests::refusal(var, value, key);
        }
    }
}
