//! `migrate`: creates the database if missing and applies the pending migrations
//! (`store::migrate`), as the tables' owner.

use std::process::ExitCode;

use anyhow::Context as _;

use crate::config::Settings;
use crate::store::{self, migrate};

/// Migrates and prints what it did, one line per migration applied.
pub async fn run(settings: &Settings) -> anyhow::Result<ExitCode> {
    let config = store::owner_pg_config(&settings.database)?;
    let prefix = settings.database.role_prefix();
    let report = migrate::migrate(&config, Some(&prefix))
        .await
        .context("migrating")?;
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
    println!(
        "granted {0}_runtime (serve) and {0}_readonly (history reads); CONNECT only to them",
        report.role_prefix
    );
    Ok(ExitCode::SUCCESS)
}
