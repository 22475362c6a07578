//! WAL archiving and checkpoints (seed §13.4's failing archive): what
//! `pg_stat_archiver` and the checkpointer's counters say, for the gauge sampler,
//! `diagnose` and the alerts. A failing `archive_command` keeps every WAL segment
//! until the disk fills and the primary stops; checkpoints requested by WAL volume
//! rather than by time mean `max_wal_size` is too small for the sale.

use tokio_postgres::Client;

/// The archiver and checkpointer, as last read.
#[derive(Debug, Clone, PartialEq)]
pub struct WalArchiving {
    /// `archive_mode` is not `off`.
    pub enabled: bool,
    pub archived: i64,
    pub failed: i64,
    /// Since the last segment archived, and the last failure; `None`: never.
    pub since_success_seconds: Option<f64>,
    pub since_failure_seconds: Option<f64>,
    /// The last attempt failed: a failure after the last success (or none yet).
    pub failing: bool,
    /// Segments ready and not yet archived; `None` when this role may not list
    /// `pg_wal/archive_status` (it needs `pg_monitor`).
    pub segments_waiting: Option<i64>,
    pub checkpoints_timed: i64,
    pub checkpoints_requested: i64,
}

/// PostgreSQL 15 and 16 keep the checkpoint counters in `pg_stat_bgwriter`.
const ARCHIVER_BGWRITER: &str = "
SELECT current_setting('archive_mode') <> 'off',
       a.archived_count, a.failed_count,
       extract(epoch FROM clock_timestamp() - a.last_archived_time)::float8,
       extract(epoch FROM clock_timestamp() - a.last_failed_time)::float8,
       c.checkpoints_timed, c.checkpoints_req
FROM pg_stat_archiver AS a, pg_stat_bgwriter AS c";

/// PostgreSQL 17 and later moved them to `pg_stat_checkpointer`.
const ARCHIVER_CHECKPOINTER: &str = "
SELECT current_setting('archive_mode') <> 'off',
       a.archived_count, a.failed_count,
       extract(epoch FROM clock_timestamp() - a.last_archived_time)::float8,
       extract(epoch FROM clock_timestamp() - a.last_failed_time)::float8,
       c.num_timed, c.num_requested
FROM pg_stat_archiver AS a, pg_stat_checkpointer AS c";

const SEGMENTS_WAITING: &str =
    "SELECT count(*) FROM pg_ls_archive_statusdir() WHERE name LIKE '%.ready'";

const SERVER_VERSION: &str = "SELECT current_setting('server_version_num')::int";

pub async fn wal_archiving(client: &Client) -> Result<WalArchiving, tokio_postgres::Error> {
    let version: i32 = client.query_one(SERVER_VERSION, &[]).await?.get(0);
    let sql = if version >= 170_000 {
        ARCHIVER_CHECKPOINTER
    } else {
        ARCHIVER_BGWRITER
    };
    let row = client.query_one(sql, &[]).await?;
    let since_success_seconds: Option<f64> = row.get(3);
    let since_failure_seconds: Option<f64> = row.get(4);
    // A role without pg_monitor may not list the directory: unknown, not an error.
    let segments_waiting = client
        .query_one(SEGMENTS_WAITING, &[])
        .await
        .ok()
        .map(|r| r.get(0));
    Ok(WalArchiving {
        enabled: row.get(0),
        archived: row.get(1),
        failed: row.get(2),
        since_success_seconds,
        since_failure_seconds,
        failing: failing(since_success_seconds, since_failure_seconds),
        segments_waiting,
        checkpoints_timed: row.get(5),
        checkpoints_requested: row.get(6),
    })
}

/// Whether the archiver's last attempt failed: a failure more recent than the last
/// success, or failures and no success yet.
fn failing(since_success: Option<f64>, since_failure: Option<f64>) -> bool {
    match (since_success, since_failure) {
        (_, None) => false,
        (None, Some(_)) => true,
        (Some(success), Some(failure)) => failure < success,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_archive_is_failing_while_its_last_attempt_failed() {
        assert!(!failing(None, None));
        assert!(!failing(Some(5.0), None));
        assert!(failing(None, Some(5.0)));
        assert!(failing(Some(60.0), Some(5.0)));
        assert!(!failing(Some(5.0), Some(60.0)));
    }
}
