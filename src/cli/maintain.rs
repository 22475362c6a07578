//! `maintain`: after a sale, VACUUM (ANALYZE) the tables a sale writes
//! (`store::maintain`), as their owner, and report dead rows and sizes before and
//! after. Refused while the activity's sale is live, unless forced.

use std::process::ExitCode;

use anyhow::Context as _;

use crate::config::Settings;
use crate::store::maintain::{sale_state, vacuum_hot_tables, SaleState};
use crate::store::{self, migrate};

/// VACUUM (ANALYZE) after the sale of `activity_id`, one line per table.
pub async fn run(settings: &Settings, activity_id: i64, force: bool) -> anyhow::Result<ExitCode> {
    // VACUUM needs the tables' owner.
    let mut config = store::owner_pg_config(&settings.database)?;
    config.options("-c search_path=seckill,public");
    let mut client = store::connect(&config)
        .await
        .context("connecting to PostgreSQL")?;
    migrate::verify(&mut client).await?;
    match sale_state(&client, activity_id).await? {
        SaleState::Unknown => {
            eprintln!("error: no activity {activity_id}");
            return Ok(ExitCode::FAILURE);
        }
        SaleState::Live if !force => {
            eprintln!("error: the sale of activity {activity_id} is live (VACUUM would compete with its orders); close it first (`activity close`) or pass --force");
            return Ok(ExitCode::FAILURE);
        }
        _ => {}
    }
    println!(
        "{:<22} {:>12} {:>12} {:>12} {:>12}",
        "table", "dead before", "dead after", "MB before", "MB after"
    );
    let mut freed = 0i64;
    for t in vacuum_hot_tables(&client).await.context("vacuuming")? {
        freed += t.bytes_before - t.bytes_after;
        println!(
            "{:<22} {:>12} {:>12} {:>12.1} {:>12.1}",
            t.table,
            t.dead_rows_before,
            t.dead_rows_after,
            t.bytes_before as f64 / 1e6,
            t.bytes_after as f64 / 1e6
        );
    }
    println!(
        "vacuumed and analyzed; {:.1} MB returned to the file system (the space of the other dead rows is reused by the next sale)",
        freed.max(0) as f64 / 1e6
    );
    Ok(ExitCode::SUCCESS)
}
