//! What `seckill-engine diagnose` reads of the database (seed §12.3): the sessions
//! with an open transaction, oldest first; who blocks whom; the update and HOT
//! figures of the hot tables; the standbys' replication lag. Read only: every query
//! runs in one READ ONLY transaction.

use chrono::{DateTime, Utc};
use tokio_postgres::Client;

/// One session of the engine's database with an open transaction.
#[derive(Debug, Clone)]
pub struct OpenTransaction {
    pub pid: i32,
    pub application_name: String,
    pub state: String,
    pub wait: Option<String>,
    pub transaction_seconds: f64,
    pub query: String,
}

/// A session waiting for a lock, and the sessions it waits for.
#[derive(Debug, Clone)]
pub struct Blocked {
    pub pid: i32,
    pub wait: Option<String>,
    pub waiting_seconds: f64,
    pub query: String,
    pub blockers: Vec<Blocker>,
}

#[derive(Debug, Clone)]
pub struct Blocker {
    pub pid: i32,
    pub application_name: String,
    pub state: String,
    pub transaction_seconds: Option<f64>,
    pub query: String,
}

/// Update figures of one table of the engine's schema.
#[derive(Debug, Clone)]
pub struct TableHealth {
    pub table: String,
    pub live_rows: i64,
    pub dead_rows: i64,
    pub updates: i64,
    pub hot_updates: i64,
    pub last_vacuum: Option<DateTime<Utc>>,
    pub last_analyze: Option<DateTime<Utc>>,
}

impl TableHealth {
    /// Share of updates that were HOT (no index entry written), when any were made.
    pub fn hot_ratio(&self) -> Option<f64> {
        (self.updates > 0).then(|| self.hot_updates as f64 / self.updates as f64)
    }
}

/// One standby as the primary sees it.
#[derive(Debug, Clone)]
pub struct Standby {
    pub name: String,
    pub state: String,
    pub sync_state: String,
    pub replay_lag_seconds: Option<f64>,
    pub replay_bytes_behind: Option<i64>,
}

#[derive(Debug, Clone)]
pub struct Diagnosis {
    pub open_transactions: Vec<OpenTransaction>,
    pub blocked: Vec<Blocked>,
    pub tables: Vec<TableHealth>,
    /// `None` on a standby (it has no replication view of its own).
    pub standbys: Option<Vec<Standby>>,
}

/// The open transactions listed, at most.
const OPEN_TRANSACTIONS_SHOWN: i64 = 10;

pub async fn diagnose(client: &mut Client) -> Result<Diagnosis, tokio_postgres::Error> {
    let tx = client.build_transaction().read_only(true).start().await?;
    let open_transactions = tx
        .query(OPEN_TRANSACTIONS, &[&OPEN_TRANSACTIONS_SHOWN])
        .await?
        .iter()
        .map(|r| OpenTransaction {
            pid: r.get(0),
            application_name: r.get(1),
            state: r.get(2),
            wait: r.get(3),
            transaction_seconds: r.get(4),
            query: r.get(5),
        })
        .collect();
    let mut blocked: Vec<Blocked> = Vec::new();
    for r in tx.query(BLOCKED, &[]).await? {
        let pid: i32 = r.get(0);
        let blocker = Blocker {
            pid: r.get(4),
            application_name: r.get(5),
            state: r.get(6),
            transaction_seconds: r.get(7),
            query: r.get(8),
        };
        match blocked.last_mut() {
            Some(last) if last.pid == pid => last.blockers.push(blocker),
            _ => blocked.push(Blocked {
                pid,
                wait: r.get(1),
                waiting_seconds: r.get(2),
                query: r.get(3),
                blockers: vec![blocker],
            }),
        }
    }
    let tables = tx
        .query(TABLES, &[])
        .await?
        .iter()
        .map(table_health)
        .collect();
    let in_recovery: bool = tx
        .query_one("SELECT pg_is_in_recovery()", &[])
        .await?
        .get(0);
    let standbys = if in_recovery {
        None
    } else {
        Some(tx.query(STANDBYS, &[]).await?.iter().map(standby).collect())
    };
    tx.commit().await?;
    Ok(Diagnosis {
        open_transactions,
        blocked,
        tables,
        standbys,
    })
}

/// A row of `TABLES`.
pub(super) fn table_health(r: &tokio_postgres::Row) -> TableHealth {
    TableHealth {
        table: r.get(0),
        live_rows: r.get(1),
        dead_rows: r.get(2),
        updates: r.get(3),
        hot_updates: r.get(4),
        last_vacuum: r.get(5),
        last_analyze: r.get(6),
    }
}

/// A row of `STANDBYS`.
pub(super) fn standby(r: &tokio_postgres::Row) -> Standby {
    Standby {
        name: r.get(0),
        state: r.get(1),
        sync_state: r.get(2),
        replay_lag_seconds: r.get(3),
        replay_bytes_behind: r.get(4),
    }
}

/// Sessions of this database with an open transaction, oldest first (not this one).
const OPEN_TRANSACTIONS: &str = "
SELECT pid, coalesce(application_name, ''), coalesce(state, ''),
       wait_event_type || ':' || wait_event,
       extract(epoch FROM statement_timestamp() - xact_start)::float8,
       left(regexp_replace(coalesce(query, ''), '\\s+', ' ', 'g'), 200)
FROM pg_stat_activity
WHERE datname = current_database() AND xact_start IS NOT NULL
  AND pid <> pg_backend_pid()
ORDER BY xact_start
LIMIT $1";

/// Every waiting session with each session it waits for (`pg_blocking_pids`: the
/// holders of the lock and those queued ahead for a conflicting one), by waiter.
const BLOCKED: &str = "
SELECT w.pid, w.wait_event_type || ':' || w.wait_event,
       extract(epoch FROM statement_timestamp() - w.query_start)::float8,
       left(regexp_replace(coalesce(w.query, ''), '\\s+', ' ', 'g'), 200),
       b.pid, coalesce(b.application_name, ''), coalesce(b.state, ''),
       extract(epoch FROM statement_timestamp() - b.xact_start)::float8,
       left(regexp_replace(coalesce(b.query, ''), '\\s+', ' ', 'g'), 200)
FROM pg_stat_activity AS w
CROSS JOIN LATERAL unnest(pg_blocking_pids(w.pid)) AS blocker(pid)
JOIN pg_stat_activity AS b ON b.pid = blocker.pid
WHERE w.datname = current_database()
ORDER BY w.query_start, w.pid, b.pid";

/// The engine's tables by dead rows, most first.
pub(super) const TABLES: &str = "
SELECT relname::text, n_live_tup, n_dead_tup, n_tup_upd, n_tup_hot_upd,
       greatest(last_vacuum, last_autovacuum), greatest(last_analyze, last_autoanalyze)
FROM pg_stat_user_tables
WHERE schemaname = 'seckill'
ORDER BY n_dead_tup DESC, relname";

pub(super) const STANDBYS: &str = "
SELECT coalesce(application_name, ''), coalesce(state, ''), coalesce(sync_state, ''),
       extract(epoch FROM replay_lag)::float8,
       pg_wal_lsn_diff(sent_lsn, replay_lsn)::int8
FROM pg_stat_replication
ORDER BY application_name";
