//! `diagnose`: one screen on the engine's database and backlog. Prints what
//! `store::diagnose` and the backlog gauges (`store::ops`) read, then the
//! dead-letter queues' depths (or why the broker could not say). Writes nothing.

use std::process::ExitCode;

use anyhow::Context as _;
use chrono::{DateTime, Utc};

use crate::config::Settings;
use crate::store::diagnose::{Blocked, OpenTransaction, Standby, TableHealth};
use crate::store::{self, ops};

/// Prints the database's state, the backlog and the dead letters, in that order.
pub async fn run(settings: &Settings) -> anyhow::Result<ExitCode> {
    let config = store::pg_config(&settings.database)?;
    let mut client = store::connect(&config)
        .await
        .context("connecting to PostgreSQL")?;
    let d = store::diagnose::diagnose(&mut client)
        .await
        .context("reading the database's state")?;
    print_open_transactions(&d.open_transactions);
    print_blocked(&d.blocked);
    print_tables(&d.tables);
    print_replication(d.standbys.as_deref());
    print_wal_archiving(store::wal::wal_archiving(&client).await.as_ref());
    print_backlog(settings).await?;
    print_dead_letters(settings).await;
    Ok(ExitCode::SUCCESS)
}

fn print_open_transactions(open: &[OpenTransaction]) {
    println!("open transactions (oldest first, at most 10):");
    if open.is_empty() {
        println!("  none");
    }
    for t in open {
        println!(
            "  pid {:<7} {:>9.3} s  {:<20} {:<8} wait {:<24} {}",
            t.pid,
            t.transaction_seconds,
            t.application_name,
            t.state,
            t.wait.as_deref().unwrap_or("-"),
            t.query
        );
    }
}

/// Each blocked session, and under it who blocks it.
fn print_blocked(blocked: &[Blocked]) {
    println!("blocked sessions:");
    if blocked.is_empty() {
        println!("  none");
    }
    for b in blocked {
        println!(
            "  pid {} waits {:.3} s on {}: {}",
            b.pid,
            b.waiting_seconds,
            b.wait.as_deref().unwrap_or("-"),
            b.query
        );
        for blocker in &b.blockers {
            println!(
                "    blocked by pid {} ({}, {}, transaction open {}): {}",
                blocker.pid,
                if blocker.application_name.is_empty() {
                    "no application name"
                } else {
                    &blocker.application_name
                },
                blocker.state,
                blocker
                    .transaction_seconds
                    .map(|s| format!("{s:.3} s"))
                    .unwrap_or_else(|| "-".into()),
                blocker.query
            );
        }
    }
}

fn print_tables(tables: &[TableHealth]) {
    println!("tables (most dead rows first):");
    println!(
        "  {:<22} {:>10} {:>10} {:>10} {:>7}  last vacuum / analyze",
        "table", "live", "dead", "updates", "HOT"
    );
    for t in tables {
        let when = |at: Option<DateTime<Utc>>| {
            at.map(|at| at.format("%Y-%m-%d %H:%M:%S").to_string())
                .unwrap_or_else(|| "never".into())
        };
        println!(
            "  {:<22} {:>10} {:>10} {:>10} {:>7}  {} / {}",
            t.table,
            t.live_rows,
            t.dead_rows,
            t.updates,
            t.hot_ratio()
                .map(|r| format!("{:.0} %", r * 100.0))
                .unwrap_or_else(|| "-".into()),
            when(t.last_vacuum),
            when(t.last_analyze)
        );
    }
}

/// The standbys of this server (`None`: it is a standby itself).
fn print_replication(standbys: Option<&[Standby]>) {
    match standbys {
        None => println!("replication: this server is a standby"),
        Some([]) => println!("replication: no standby connected"),
        Some(standbys) => {
            println!("replication:");
            for s in standbys {
                println!(
                    "  {:<16} {:<10} {:<6} replay lag {}, {} bytes behind",
                    s.name,
                    s.state,
                    s.sync_state,
                    s.replay_lag_seconds
                        .map(|l| format!("{l:.3} s"))
                        .unwrap_or_else(|| "-".into()),
                    s.replay_bytes_behind
                        .map(|b| b.to_string())
                        .unwrap_or_else(|| "-".into())
                );
            }
        }
    }
}

/// The outbox and compensation backlog, as the gauges read it.
/// The archiver and the checkpoints: a failing archive keeps WAL on the primary's
/// disk until it fills (docs/OPERATIONS.md, "WAL archive failing").
fn print_wal_archiving(w: Result<&store::wal::WalArchiving, &tokio_postgres::Error>) {
    let w = match w {
        Ok(w) => w,
        Err(e) => return println!("wal archive: unknown ({e})"),
    };
    let ago = |s: Option<f64>| s.map_or_else(|| "never".to_owned(), |s| format!("{s:.0} s ago"));
    if !w.enabled {
        println!("wal archive: off (archive_mode)");
    } else {
        println!(
            "wal archive: {}; {} archived, last {}; {} failed, last {}; {} segments waiting",
            if w.failing { "FAILING" } else { "ok" },
            w.archived,
            ago(w.since_success_seconds),
            w.failed,
            ago(w.since_failure_seconds),
            w.segments_waiting
                .map_or_else(|| "unknown".to_owned(), |n| n.to_string()),
        );
    }
    println!(
        "checkpoints: {} timed, {} requested (many requested: max_wal_size is small for this WAL rate)",
        w.checkpoints_timed, w.checkpoints_requested
    );
}

async fn print_backlog(settings: &Settings) -> anyhow::Result<()> {
    let pool = {
        let mut db = settings.database.clone();
        db.pool_size = 1;
        store::build_pool(&db).context("a connection for the backlog")?
    };
    let backlog = ops::backlog(&pool).await.context("reading the backlog")?;
    let capped = |n: i64| {
        if n >= ops::BACKLOG_COUNT_CAP {
            format!("{n}+")
        } else {
            n.to_string()
        }
    };
    println!(
        "backlog: outbox {} waiting (oldest {:.1} s), {} dead; compensation {} waiting (oldest {:.1} s), {} for review",
        capped(backlog.outbox_pending),
        backlog.outbox_oldest_pending_age_seconds,
        backlog.outbox_dead,
        capped(backlog.compensation_pending),
        backlog.compensation_oldest_pending_age_seconds,
        backlog.compensation_manual_review
    );
    Ok(())
}

/// The dead-letter queues' depths, or why the broker could not say.
async fn print_dead_letters(settings: &Settings) {
    let names = crate::mq::topology::Names::new(&settings.amqp.namespace);
    let depths = async {
        let connection = crate::mq::connect(&settings.amqp, "seckill-diagnose").await?;
        let channel = connection.create_channel().await?;
        let mut depths = Vec::new();
        for queue in [names.order_dead_queue(), names.payment_dead_queue()] {
            let counts = crate::mq::queue_counts(&channel, &queue).await?;
            depths.push(format!("{queue} {}", counts.messages));
        }
        crate::mq::close(&connection, &[&channel]).await;
        Ok::<_, crate::mq::MqError>(depths)
    };
    match depths.await {
        Ok(depths) => println!("dead letters: {}", depths.join(", ")),
        Err(e) => println!("dead letters: unknown ({e})"),
    }
}
