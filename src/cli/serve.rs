//! `serve`: the process's signals around `startup`. Starts everything `startup`
//! composes, waits for SIGTERM or SIGINT, drains; a second signal exits at once.

use std::process::ExitCode;

use anyhow::Context as _;
use tokio::signal::unix::{signal, SignalKind};

use crate::config::Settings;
use crate::startup;

/// Serves until a signal, then drains (exit 0), or exits 130 on a second signal.
pub async fn run(settings: &Settings) -> anyhow::Result<ExitCode> {
    // Handlers first: a signal that arrives while the engine starts is not lost.
    let mut term = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    let served = startup::start(settings).await?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tracing::info!("signal received, stopping");
    tokio::select! {
        _ = startup::drain(served) => Ok(ExitCode::SUCCESS),
        // Still safe: whatever is unacked is redelivered, and the inbox answers it.
        _ = async { tokio::select! { _ = term.recv() => {} _ = int.recv() => {} } } => {
            tracing::warn!("second signal: exiting without waiting; unsettled deliveries will be redelivered");
            Ok(ExitCode::from(130))
        }
    }
}
