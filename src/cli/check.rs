//! `check`: the invariant checks of PostgreSQL (`store::invariants`) and, with
//! `--redis`, the drift between Redis and PostgreSQL per bucket (`crate::drift`).
//! One line per check; exits non-zero if any is violated.

use std::process::ExitCode;

use anyhow::Context as _;
use tokio_postgres::Client;

use crate::config::Settings;
use crate::drift::{self, BucketDrift};
use crate::store::{self, invariants::run_checks};

/// Runs the checks of `activity` (all when `None`), and the drift with `with_redis`.
pub async fn run(
    settings: &Settings,
    activity: Option<i64>,
    with_redis: bool,
) -> anyhow::Result<ExitCode> {
    let config = store::pg_config(&settings.database)?;
    let client = store::connect(&config)
        .await
        .context("connecting to PostgreSQL")?;
    let results = run_checks(&client, activity, settings.retention.inbox_window())
        .await
        .context("running checks")?;
    let mut failed = false;
    for r in &results {
        let status = if r.ok() { "ok  " } else { "FAIL" };
        failed |= !r.ok();
        println!(
            "{status} {:<30} {:>8}  {}",
            r.name, r.violations, r.description
        );
    }
    if with_redis {
        failed |= !check_redis(settings, &client, activity).await?;
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// Prints the `redis_drift` check and each drifting bucket; whether none drifts.
async fn check_redis(
    settings: &Settings,
    client: &Client,
    activity: Option<i64>,
) -> anyhow::Result<bool> {
    let drift = redis_drift(settings, client, activity).await?;
    let drifting: Vec<_> = drift.iter().filter(|d| d.drift != 0).collect();
    let status = if drifting.is_empty() { "ok  " } else { "FAIL" };
    println!(
        "{status} {:<30} {:>8}  bucket whose PostgreSQL available stock differs from Redis stock + Redis reservations not yet in PostgreSQL",
        "redis_drift",
        drifting.len()
    );
    for d in &drifting {
        println!(
            "       activity {} sku {} bucket {}: postgres available {}, redis stock {}, unsettled reservations {}, drift {}",
            d.activity_id, d.sku_id, d.bucket, d.pg_available, d.redis_stock, d.unsettled, d.drift
        );
    }
    Ok(drifting.is_empty())
}

/// Every bucket's drift between Redis and PostgreSQL (`crate::drift`).
async fn redis_drift(
    settings: &Settings,
    client: &Client,
    activity: Option<i64>,
) -> anyhow::Result<Vec<BucketDrift>> {
    let mut redis = crate::redis::connect(&settings.redis)
        .await
        .context("connecting to Redis")?;
    Ok(drift::measure(client, &mut redis, &settings.redis.key_prefix, activity).await?)
}
