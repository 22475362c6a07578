//! Logging (human-readable text or JSON lines, level from `RUST_LOG` or the config)
//! and the Prometheus metrics recorder; `names` is the metric catalogue, and the
//! types of an engine's live figures: `sampled` (the gauges whose series come and go
//! with the data), `recent` (the last seconds' order latency), `trace` (the
//! activities followed). Those live in the engine's `status::Live`, never in a
//! static: two engines of one process share none of them.

pub mod names;
pub mod recent;
pub mod sampled;
pub mod trace;

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::EnvFilter;

use crate::config::{LogFormat, TelemetrySettings};

/// Installs the global subscriber; a second call is a no-op.
pub fn init(settings: &TelemetrySettings) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&settings.level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match settings.format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

/// For tests that run engines in-process: logs go through the test harness's
/// capture (shown only for a failing test), at WARN unless `RUST_LOG` says
/// otherwise, so a failure's output is its own. A second call is a no-op.
pub fn init_for_tests() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}

/// Histogram buckets for every `*_seconds` metric: explicit buckets, so that the
/// exporter emits aggregatable histograms instead of per-instance summaries.
const SECONDS_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Buckets of the order latencies (`seckill_order_commit_latency_seconds` and the
/// broker's part of it, `seckill_intake_message_age_seconds`): fine around the tens
/// of milliseconds a flash sale's latency objective sits in, and down to the
/// millisecond a quiet broker delivers in (the age is stamped in milliseconds).
const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.06, 0.075, 0.1, 0.15, 0.2,
    0.3, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Buckets of `seckill_order_batch_size`: powers of two up to the largest
/// `engine.batch_max_size` worth trying.
const BATCH_SIZE_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];

/// The one process-wide static here, and by nature: the `metrics` crate's macros
/// record into a single global recorder, so every engine of a process counts into
/// the same Prometheus registry. Everything else an engine shows lives in its own
/// `status::Live`.
static METRICS: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs the process-wide Prometheus recorder (once) and returns its handle;
/// `None` if another recorder was installed first.
pub fn metrics() -> Option<&'static PrometheusHandle> {
    METRICS
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)
                .ok()?
                .set_buckets_for_metric(
                    Matcher::Full(names::ORDER_COMMIT_LATENCY_SECONDS.into()),
                    LATENCY_BUCKETS,
                )
                .ok()?
                .set_buckets_for_metric(
                    Matcher::Full(names::INTAKE_MESSAGE_AGE_SECONDS.into()),
                    LATENCY_BUCKETS,
                )
                .ok()?
                .set_buckets_for_metric(
                    Matcher::Full(names::ORDER_BATCH_SIZE.into()),
                    BATCH_SIZE_BUCKETS,
                )
                .ok()?;
            let handle = builder.install_recorder().ok()?;
            // The sampled gauges carry their help in their own rendering.
            for m in names::CATALOGUE
                .iter()
                .filter(|m| !names::SAMPLED.contains(&m.name))
            {
                match m.kind {
                    names::Kind::Counter => metrics::describe_counter!(m.name, m.help),
                    names::Kind::Gauge => metrics::describe_gauge!(m.name, m.help),
                    names::Kind::Histogram => metrics::describe_histogram!(m.name, m.help),
                }
            }
            metrics::gauge!(names::BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
            Some(handle)
        })
        .as_ref()
}
