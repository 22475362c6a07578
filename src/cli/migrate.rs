//! `migrate`: creates the database if missing and applies the pending migrations
//! (`store::migrate`), as the tables' owner.

use std::process::ExitCode;

use anyhow::Context as _;

use crate::config::Settings;
use crate::store::{self, migrate};

/// Migrates and prints what it did, one line per migration applied.
pub async fn run(settings: &Settings) -> anyhow::Result<ExitCode> {
    let config = store::owner_pg_config(&settings.database)?;
    let report = migrate::migrate(&config).await.context("migrating")?;
    if report.database_created {
        println!(
            "created database {}",
            config.get_dbname().unwrap_or_default()
        );
    }
    if report.applied.is_empty() {
        println!("schema is up to date");
    }
    for m in &report.applied {
        println!("applied {m}");
    }
    Ok(ExitCode::SUCCESS)
}
