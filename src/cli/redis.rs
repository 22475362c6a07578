//! `redis rebuild`: rewrites a sale's Redis keys from PostgreSQL (`crate::rebuild`)
//! and prints what changed, bucket by bucket. Idempotent and safe during a live sale;
//! the front stage does the same by itself when it finds a live SKU's keys gone.

use std::process::ExitCode;

use anyhow::Context as _;

use crate::config::Settings;
use crate::store;

pub async fn rebuild(settings: &Settings, activity_id: i64) -> anyhow::Result<ExitCode> {
    let client = store::connect(&store::pg_config(&settings.database)?)
        .await
        .context("connecting to PostgreSQL")?;
    let mut redis = crate::redis::connect(&settings.redis)
        .await
        .context("connecting to Redis")?;
    let skus = crate::rebuild::rebuild_activity(
        &client,
        &mut redis,
        &settings.redis.key_prefix,
        activity_id,
    )
    .await
    .context("rebuilding")?;
    metrics::counter!(crate::telemetry::names::REDIS_REBUILDS_TOTAL, "trigger" => "command")
        .increment(1);
    for sku in &skus {
        println!(
            "activity {} sku {}: {} buyers' marks restored{}",
            sku.activity_id,
            sku.sku_id,
            sku.marks_added,
            if sku.changed() {
                ""
            } else {
                "; nothing changed"
            }
        );
        for b in &sku.buckets {
            let before = b
                .before
                .map_or_else(|| "missing".to_owned(), |n| n.to_string());
            println!(
                "  bucket {:>3}: stock {before} -> {} ({} held by reservations PostgreSQL has not seen)",
                b.bucket, b.after, b.unsettled
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
