//! The replica pool: a few connections on `database.replica_url`, read-only, for
//! the reads that may be stale.

use super::error::StoreError;
use super::pool::{pool_of, Pool};
use super::target::{url_error, PgTarget};
use crate::config::DatabaseSettings;

/// A small pool on `database.replica_url` for the reads that may be stale (seed
/// §14.4), opened on the current runtime; `None` when no replica is configured.
pub fn build_replica_pool(settings: &DatabaseSettings) -> Result<Option<Pool>, StoreError> {
    let replica = settings
        .parsed_replica_url()
        .map_err(url_error("database.replica_url"))?;
    let Some(url) = replica else {
        return Ok(None);
    };
    let runtime = tokio::runtime::Handle::try_current()
        .map_err(|e| StoreError::NotOpened(format!("building the replica pool: {e}")))?;
    let mut config = PgTarget::new(url, settings)?;
    config
        .application_name("seckill-engine-replica-reads")
        .options("-c search_path=seckill,public -c default_transaction_read_only=on");
    Ok(Some(pool_of(
        config,
        REPLICA_POOL_SIZE,
        settings.acquire_timeout(),
        vec![runtime],
    )))
}

/// History reads are short; a few connections serve many.
const REPLICA_POOL_SIZE: u32 = 4;
