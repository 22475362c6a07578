//! `activity create` and `activity close`: an activity's rows in PostgreSQL
//! (`store::activity`) and, on creation, its per-bucket stock in Redis for the
//! front stage.

use std::process::ExitCode;

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use clap::Args;

use crate::config::Settings;
use crate::redis::keys::SkuKeys;
use crate::store::activity::{close_activity, create_activity, ActivitySpec, Closed};
use crate::store::{self, migrate};

#[derive(Debug, Args)]
pub struct CreateActivity {
    #[arg(long)]
    pub activity: i64,
    #[arg(long)]
    pub sku: i64,
    #[arg(long)]
    pub stock: i32,
    #[arg(long, default_value_t = 1)]
    pub buckets: i16,
    /// Unit price in minor units.
    #[arg(long)]
    pub price: i64,
    #[arg(long, default_value = "CNY")]
    pub currency: String,
    #[arg(long, default_value = "Flash sale")]
    pub title: String,
    /// RFC 3339; default now.
    #[arg(long)]
    pub starts_at: Option<DateTime<Utc>>,
    /// RFC 3339; default one day after the start.
    #[arg(long)]
    pub ends_at: Option<DateTime<Utc>>,
    /// Unpaid orders are cancelled after this many seconds.
    #[arg(long, default_value_t = 900)]
    pub order_ttl: i64,
}

impl CreateActivity {
    /// The activity the arguments describe, with the defaults of its times.
    fn spec(self) -> ActivitySpec {
        let starts_at = self.starts_at.unwrap_or_else(Utc::now);
        ActivitySpec {
            activity_id: self.activity,
            sku_id: self.sku,
            title: self.title,
            stock: self.stock,
            buckets: self.buckets,
            unit_price: self.price,
            currency: self.currency,
            starts_at,
            ends_at: self
                .ends_at
                .unwrap_or(starts_at + chrono::TimeDelta::days(1)),
            order_ttl_ms: self.order_ttl.saturating_mul(1000),
        }
    }
}

/// Creates the activity in PostgreSQL, then loads its stock into Redis.
pub async fn create(settings: &Settings, args: CreateActivity) -> anyhow::Result<ExitCode> {
    let spec = args.spec();
    let config = store::pg_config(&settings.database)?;
    let mut client = store::connect(&config)
        .await
        .context("connecting to PostgreSQL")?;
    migrate::verify(&mut client).await?;
    let split = match create_activity(&mut client, &spec).await {
        Ok(split) => split,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(ExitCode::FAILURE);
        }
    };
    let keys = SkuKeys::new(&settings.redis.key_prefix, spec.activity_id, spec.sku_id);
    let mut redis = crate::redis::connect(&settings.redis).await.context(
        "connecting to Redis (the activity exists in PostgreSQL; its Redis stock is not loaded)",
    )?;
    crate::redis::load_stock(&mut redis, &keys, &split, spec.ends_at)
        .await
        .context("loading Redis stock (the activity exists in PostgreSQL)")?;
    println!(
        "created activity {} sku {}: stock {} over {} buckets",
        spec.activity_id, spec.sku_id, spec.stock, spec.buckets
    );
    Ok(ExitCode::SUCCESS)
}

/// Ends the activity now; closing one already closed succeeds.
pub async fn close(settings: &Settings, activity_id: i64) -> anyhow::Result<ExitCode> {
    let config = store::pg_config(&settings.database)?;
    let mut client = store::connect(&config)
        .await
        .context("connecting to PostgreSQL")?;
    migrate::verify(&mut client).await?;
    Ok(match close_activity(&client, activity_id).await? {
        Closed::Now => {
            println!(
                "closed activity {activity_id}: front stages answer SALE_CLOSED within a second"
            );
            ExitCode::SUCCESS
        }
        Closed::Already => {
            println!("activity {activity_id} was closed already");
            ExitCode::SUCCESS
        }
        Closed::Unknown => {
            eprintln!("error: no activity {activity_id}");
            ExitCode::FAILURE
        }
    })
}
