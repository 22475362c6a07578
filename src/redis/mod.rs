//! Redis, the front stage's fast pre-filter: key layout and the stock it is loaded
//! with. PostgreSQL stays the source of truth; Redis only says "probably yes".

pub mod commands;
pub mod keys;
pub mod scripts;

use secrecy::ExposeSecret;

use crate::config::RedisSettings;
use keys::SkuKeys;

/// Opens a multiplexed connection (cheap to clone, reconnects on its own).
pub async fn connect(
    settings: &RedisSettings,
) -> Result<::redis::aio::MultiplexedConnection, ::redis::RedisError> {
    ::redis::Client::open(settings.url.expose_secret())?
        .get_multiplexed_async_connection()
        .await
}

/// Loads the stock of every bucket of a SKU, and the bucket count, atomically.
pub async fn load_stock(
    conn: &mut ::redis::aio::MultiplexedConnection,
    keys: &SkuKeys,
    per_bucket: &[i32],
) -> Result<(), ::redis::RedisError> {
    let mut pipe = ::redis::pipe();
    pipe.atomic();
    for (bucket, stock) in per_bucket.iter().enumerate() {
        pipe.set(keys.stock(bucket as i16), *stock).ignore();
    }
    pipe.set(keys.bucket_count(), per_bucket.len()).ignore();
    pipe.query_async::<()>(conn).await
}

/// Runs one Redis command, recording its duration and whether it failed under the
/// command's name (a small fixed set: the scripts and the commands we send).
pub async fn timed<T>(
    command: &'static str,
    call: impl std::future::Future<Output = Result<T, ::redis::RedisError>>,
) -> Result<T, ::redis::RedisError> {
    let started = std::time::Instant::now();
    let result = call.await;
    metrics::histogram!(crate::telemetry::names::REDIS_COMMAND_DURATION_SECONDS, "command" => command)
        .record(started.elapsed().as_secs_f64());
    if result.is_err() {
        metrics::counter!(crate::telemetry::names::REDIS_ERRORS_TOTAL, "command" => command)
            .increment(1);
    }
    result
}
