//! The retention service owns what the engine keeps and for how long (seed §8.5):
//! it moves SENT outbox rows to `event_outbox_history` once the audit period is
//! over, and deletes inbox rows older than the replay window, so the two tables the
//! order path writes stay small. Each batch is one short statement that skips rows
//! another transaction holds (`store::retention`); several instances may run it at
//! once.

use std::rc::Rc;
use std::time::Duration;

use futures_util::future::LocalBoxFuture;

use super::runner::{Outcome, Service, ServiceError};
use crate::config::RetentionSettings;
use crate::store::{retention, Pool};

/// Settings of the retention service (see `[retention]` in config/default.toml).
#[derive(Debug, Clone)]
pub struct RetentionConfig {
    /// Pause between runs that filled no batch.
    pub interval: Duration,
    /// Rows moved, and rows deleted, per run at most.
    pub batch_size: i64,
    /// Inbox rows processed longer ago than this are deleted.
    pub inbox_window: Duration,
    /// SENT outbox rows sent longer ago than this move to history.
    pub outbox_history_after: Duration,
}

impl From<&RetentionSettings> for RetentionConfig {
    fn from(s: &RetentionSettings) -> Self {
        Self {
            interval: Duration::from_millis(s.interval_ms),
            batch_size: i64::from(s.batch_size),
            inbox_window: s.inbox_window(),
            outbox_history_after: Duration::from_secs(s.outbox_history_secs),
        }
    }
}

pub struct Retention {
    inner: Rc<Inner>,
}

struct Inner {
    pool: Pool,
    config: RetentionConfig,
}

impl Retention {
    pub fn new(pool: Pool, config: RetentionConfig) -> Self {
        Self {
            inner: Rc::new(Inner { pool, config }),
        }
    }
}

impl Service for Retention {
    const NAME: &'static str = "retention";

    fn interval(&self) -> Duration {
        self.inner.config.interval
    }

    fn run_once(&self) -> LocalBoxFuture<'static, Result<Outcome, ServiceError>> {
        let inner = self.inner.clone();
        Box::pin(async move {
            let config = &inner.config;
            let conn = inner.pool.get().await?;
            let archived = retention::archive_sent(
                &conn.client,
                config.outbox_history_after,
                config.batch_size,
            )
            .await?;
            let pruned =
                retention::prune_inbox(&conn.client, config.inbox_window, config.batch_size)
                    .await?;
            let full = |n: u64| n >= config.batch_size as u64;
            Ok(Outcome::default()
                .count("archived", archived)
                .count("inbox_pruned", pruned)
                .more(full(archived) || full(pruned)))
        })
    }
}
