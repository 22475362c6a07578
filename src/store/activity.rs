//! Creating a flash sale: the activity, its SKU and the SKU's inventory buckets, in one
//! transaction (`total = available + allocated`, bucket totals sum to the plan).

use chrono::{DateTime, Utc};
use serde_json::json;
use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

use crate::domain::status::{ActivityStatus, SkuStatus};

#[derive(Debug, Clone)]
pub struct ActivitySpec {
    pub activity_id: i64,
    pub sku_id: i64,
    pub title: String,
    pub stock: i32,
    pub buckets: i16,
    pub unit_price: i64,
    pub currency: String,
    pub starts_at: DateTime<Utc>,
    pub ends_at: DateTime<Utc>,
    /// How long a created order may stay unpaid (stored in the activity rules).
    pub order_ttl_ms: i64,
}

#[derive(Debug, thiserror::Error)]
pub enum ActivityError {
    #[error("activity {0} already exists; choose another --activity id")]
    Exists(i64),
    #[error("invalid activity: {0}")]
    Invalid(String),
    #[error("database: {0}")]
    Db(#[from] tokio_postgres::Error),
}

/// Splits `stock` over `buckets` evenly, the remainder going to the lowest buckets.
pub fn split_stock(stock: i32, buckets: i16) -> Vec<i32> {
    let n = i32::from(buckets.max(1));
    (0..n)
        .map(|b| stock / n + i32::from(b < stock % n))
        .collect()
}

impl ActivitySpec {
    fn validate(&self) -> Result<(), ActivityError> {
        let bad = |s: &str| Err(ActivityError::Invalid(s.to_owned()));
        if self.activity_id <= 0 || self.sku_id <= 0 {
            return bad("--activity and --sku must be positive");
        }
        if self.stock < 0 {
            return bad("--stock must not be negative");
        }
        if !(1..=256).contains(&self.buckets) {
            return bad("--buckets must be between 1 and 256");
        }
        if self.unit_price < 0 {
            return bad("--price must not be negative");
        }
        if self.starts_at >= self.ends_at {
            return bad("--starts-at must be before --ends-at");
        }
        // An unpaid order is held at most a week: the sweeper's deadline must stay a
        // representable time, and stock held longer is no longer a flash sale's.
        if !(1_000..=MAX_ORDER_TTL_MS).contains(&self.order_ttl_ms) {
            return bad("--order-ttl must be between 1 and 604800 seconds");
        }
        if self.title.is_empty() || self.title.chars().count() > 128 {
            return bad("--title must be 1-128 characters");
        }
        Ok(())
    }
}

/// The longest an unpaid order may hold its unit (`--order-ttl`).
pub const MAX_ORDER_TTL_MS: i64 = 7 * 86_400_000;

/// Creates the activity; returns the stock of each bucket.
pub async fn create_activity(
    client: &mut Client,
    spec: &ActivitySpec,
) -> Result<Vec<i32>, ActivityError> {
    spec.validate()?;
    let split = split_stock(spec.stock, spec.buckets);
    let tx = client.transaction().await?;
    let rules = json!({ "order_ttl_ms": spec.order_ttl_ms });
    let inserted = tx
        .execute(
            "INSERT INTO seckill_activity (activity_id, activity_name, status, start_at, end_at, rules)
             VALUES ($1, $2, $3, $4, $5, $6)",
            &[
                &spec.activity_id,
                &spec.title,
                &ActivityStatus::Running.code(),
                &spec.starts_at,
                &spec.ends_at,
                &rules,
            ],
        )
        .await;
    match inserted {
        Err(e) if e.code() == Some(&SqlState::UNIQUE_VIOLATION) => {
            return Err(ActivityError::Exists(spec.activity_id))
        }
        other => other?,
    };
    tx.execute(
        "INSERT INTO seckill_sku (activity_id, sku_id, sku_title, status, unit_price, currency,
                                  planned_stock, inventory_bucket_count)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        &[
            &spec.activity_id,
            &spec.sku_id,
            &spec.title,
            &SkuStatus::OnSale.code(),
            &spec.unit_price,
            &spec.currency,
            &spec.stock,
            &spec.buckets,
        ],
    )
    .await?;
    let buckets: Vec<i16> = (0..spec.buckets).collect();
    tx.execute(
        "INSERT INTO sku_inventory (activity_id, sku_id, bucket_no, total_stock, available_stock)
         SELECT $1, $2, b, s, s FROM unnest($3::smallint[], $4::int[]) AS t(b, s)",
        &[&spec.activity_id, &spec.sku_id, &buckets, &split],
    )
    .await?;
    tx.commit().await?;
    Ok(split)
}

/// What `close_activity` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closed {
    /// The activity is ended now.
    Now,
    /// It was ended or cancelled already.
    Already,
    /// No such activity.
    Unknown,
}

/// Ends an activity (status `Ended`): its front stages stop selling within a
/// second (they re-read what they cache of a SKU that often). Orders already made
/// keep their course: payment, or cancellation at their expiry.
pub async fn close_activity(
    client: &Client,
    activity_id: i64,
) -> Result<Closed, tokio_postgres::Error> {
    let ended = ActivityStatus::Ended.code();
    let cancelled = ActivityStatus::Cancelled.code();
    let changed = client
        .execute(
            "UPDATE seckill_activity
                SET status = $2, updated_at = statement_timestamp(), version = version + 1
              WHERE activity_id = $1 AND status NOT IN ($2, $3)",
            &[&activity_id, &ended, &cancelled],
        )
        .await?;
    if changed > 0 {
        return Ok(Closed::Now);
    }
    let exists = client
        .query_opt(
            "SELECT 1 FROM seckill_activity WHERE activity_id = $1",
            &[&activity_id],
        )
        .await?
        .is_some();
    Ok(if exists {
        Closed::Already
    } else {
        Closed::Unknown
    })
}

#[cfg(test)]
mod tests {
    use super::split_stock;

    #[test]
    fn split_gives_remainder_to_lowest_buckets() {
        assert_eq!(split_stock(10, 4), vec![3, 3, 2, 2]);
        assert_eq!(split_stock(100, 64).iter().sum::<i32>(), 100);
        assert_eq!(split_stock(3, 8), vec![1, 1, 1, 0, 0, 0, 0, 0]);
        assert_eq!(split_stock(5, 1), vec![5]);
    }
}
