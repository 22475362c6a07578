//! The server the engine writes to, as the engine needs to know it (seed §14): that
//! it is a writable primary, whether its commits wait for a synchronous standby,
//! and whether a COMMIT has been waiting for one too long. Read by the readiness
//! monitor on every check, and by `serve` and `validate` at start.

use std::time::Duration;

use tokio_postgres::Client;

use super::StoreError;

/// One round trip. `pg_stat_replication` shows its `sync_state` only to roles
/// with `pg_monitor` (or superusers); to any other role the count is 0. The stalled
/// COMMIT is seen from `pg_stat_activity` (a backend waiting on `SyncRep`, which
/// is only ever a COMMIT's wait): this role's own sessions are visible to it.
const PRIMARY_STATE: &str = "
SELECT pg_is_in_recovery() OR current_setting('transaction_read_only')::bool,
       current_setting('synchronous_commit'),
       current_setting('synchronous_standby_names'),
       (SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum')),
       (SELECT coalesce(max(extract(epoch FROM clock_timestamp() - query_start) * 1000), 0)::bigint
          FROM pg_stat_activity
         WHERE wait_event = 'SyncRep' AND datname = current_database()),
       coalesce(host(inet_server_addr()) || ':' || inet_server_port(), 'a local socket'),
       (SELECT timeline_id FROM pg_control_checkpoint())";

/// What `PRIMARY_STATE` answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrimaryState {
    /// A standby, or a primary whose sessions are read-only
    /// (`default_transaction_read_only`, as a fail-over tool fences one).
    pub read_only: bool,
    /// This session's `synchronous_commit`.
    pub synchronous_commit: String,
    /// The server's `synchronous_standby_names`.
    pub standby_names: String,
    /// Standbys that are synchronous now (`sync` or `quorum`).
    pub sync_standbys: i64,
    /// How long the oldest COMMIT of this database has been waiting for a
    /// synchronous standby, in milliseconds (0: none waits).
    pub stalled_commit_ms: i64,
    /// The server as this connection reached it (`host:port`).
    pub server: String,
    /// Its timeline (as of its last checkpoint): a promoted standby starts a new one.
    pub timeline: i32,
}

pub async fn primary_state(client: &Client) -> Result<PrimaryState, StoreError> {
    let row = client.query_one(PRIMARY_STATE, &[]).await?;
    Ok(PrimaryState {
        read_only: row.get(0),
        synchronous_commit: row.get(1),
        standby_names: row.get(2),
        sync_standbys: row.get(3),
        stalled_commit_ms: row.get(4),
        server: row.get(5),
        timeline: row.get(6),
    })
}

/// The `synchronous_commit` this role gets in this database when it asks for nothing
/// (server, database and role defaults, and the URL's own options): what any
/// other client of the database commits with. The engine overrides it
/// (`target::SESSION_OPTIONS`); `validate` and `serve` say what it is.
pub async fn default_synchronous_commit(
    settings: &crate::config::DatabaseSettings,
) -> Result<String, StoreError> {
    let client = super::connect(&super::admin_pg_config(settings)?).await?;
    let row = client
        .query_one("SELECT current_setting('synchronous_commit')", &[])
        .await?;
    Ok(row.get(0))
}

/// What the default `synchronous_commit` would mean without the engine's `on`, for
/// `validate` and the start-up log; `None` when it is `on` already.
pub fn durability_note(default: &str) -> Option<String> {
    let meaning = match default {
        "on" => return None,
        "off" => "a COMMIT would return before its WAL is flushed: an acknowledged order could vanish in a crash",
        "local" => "a COMMIT would not wait for a synchronous standby: a fail-over could lose an acknowledged order",
        "remote_write" => "a COMMIT would wait only until a standby has written, not flushed, its WAL: a standby crash with the primary's could lose an acknowledged order",
        "remote_apply" => "a COMMIT would also wait for the standby to apply it (stronger than on, and slower)",
        _ => "an unknown level",
    };
    Some(format!(
        "the default here is synchronous_commit = {default}: {meaning}; the engine commits with on, whatever the default"
    ))
}

/// The readiness check's answer when the server cannot take orders now.
pub const NO_WRITABLE_PRIMARY: &str = "no writable primary";
pub const WAITING_FOR_STANDBY: &str = "waiting for synchronous standby";
pub const NO_SYNC_STANDBY: &str = "no synchronous standby";

impl PrimaryState {
    /// Whether a COMMIT here waits until a standby has the commit record: only
    /// then does an acknowledged order survive a fail-over to that standby.
    pub fn commits_wait_for_standby(&self) -> bool {
        !self.standby_names.trim().is_empty()
            && matches!(
                self.synchronous_commit.as_str(),
                "on" | "remote_write" | "remote_apply"
            )
    }

    /// Why orders must not run now, if they must not. A stalled COMMIT is never
    /// cancelled and durability is never lowered to keep going (§14.3): intake
    /// stops, and resumes by itself once the standby is back.
    pub fn problem(&self, require_sync_standby: bool, commit_stall: Duration) -> Option<String> {
        if self.read_only {
            return Some(format!("{NO_WRITABLE_PRIMARY}: the server is read-only"));
        }
        let stall_ms = i64::try_from(commit_stall.as_millis()).unwrap_or(i64::MAX);
        if self.stalled_commit_ms >= stall_ms {
            return Some(format!(
                "{WAITING_FOR_STANDBY}: a COMMIT has waited {} ms (database.commit_stall_ms = {stall_ms})",
                self.stalled_commit_ms
            ));
        }
        if require_sync_standby {
            if !self.commits_wait_for_standby() {
                return Some(format!(
                    "{NO_SYNC_STANDBY}: commits do not wait for one (synchronous_commit = {}, synchronous_standby_names = '{}'; database.require_sync_standby)",
                    self.synchronous_commit, self.standby_names
                ));
            }
            if self.sync_standbys == 0 {
                return Some(format!(
                    "{NO_SYNC_STANDBY}: none is connected (database.require_sync_standby)"
                ));
            }
        }
        None
    }

    /// One line for logs and `validate`.
    pub fn describe(&self) -> String {
        format!(
            "synchronous_commit = {}, synchronous_standby_names = '{}', {} synchronous standby(s) connected",
            self.synchronous_commit, self.standby_names, self.sync_standbys
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn healthy() -> PrimaryState {
        PrimaryState {
            read_only: false,
            synchronous_commit: "on".into(),
            standby_names: "ANY 1 (pg0, pg1, pg2)".into(),
            sync_standbys: 1,
            stalled_commit_ms: 0,
            server: "10.0.0.1:5432".into(),
            timeline: 1,
        }
    }

    const STALL: Duration = Duration::from_millis(2000);

    #[test]
    fn every_weaker_default_is_named_and_on_is_quiet() {
        assert_eq!(durability_note("on"), None);
        for level in ["off", "local", "remote_write", "remote_apply"] {
            let note = durability_note(level).unwrap();
            assert!(
                note.contains(&format!("synchronous_commit = {level}")),
                "{note}"
            );
            assert!(note.contains("the engine commits with on"), "{note}");
        }
    }

    #[test]
    fn a_primary_with_a_sync_standby_is_fine() {
        assert_eq!(healthy().problem(true, STALL), None);
        assert!(healthy().commits_wait_for_standby());
    }

    #[test]
    fn each_problem_is_named() {
        let read_only = PrimaryState {
            read_only: true,
            ..healthy()
        };
        assert!(read_only
            .problem(false, STALL)
            .is_some_and(|p| p.starts_with(NO_WRITABLE_PRIMARY)));
        let stalled = PrimaryState {
            stalled_commit_ms: 2500,
            sync_standbys: 0,
            ..healthy()
        };
        assert!(stalled
            .problem(false, STALL)
            .is_some_and(|p| p.starts_with(WAITING_FOR_STANDBY)));
        let gone = PrimaryState {
            sync_standbys: 0,
            ..healthy()
        };
        assert_eq!(gone.problem(false, STALL), None);
        assert!(gone
            .problem(true, STALL)
            .is_some_and(|p| p.starts_with(NO_SYNC_STANDBY)));
        for (commit, names) in [("local", "ANY 1 (a)"), ("off", "a"), ("on", " ")] {
            let weak = PrimaryState {
                synchronous_commit: commit.into(),
                standby_names: names.into(),
                ..healthy()
            };
            assert!(!weak.commits_wait_for_standby(), "{commit} {names}");
            assert!(weak
                .problem(true, STALL)
                .is_some_and(|p| p.starts_with(NO_SYNC_STANDBY)));
        }
    }
}
