//! `seckill-chaos`: the fault-injection suite. Starts private PostgreSQL, RabbitMQ and
//! Redis instances, runs engine processes (built with `--features chaos`) against
//! them, injects faults and accounts for every message; exits non-zero if any
//! promise was broken.

use std::process::ExitCode;

use clap::Parser;
use seckill_chaos::{run, ChaosArgs};

#[derive(Debug, Parser)]
#[command(
    name = "seckill-chaos",
    version,
    about = "Fault-injection suite for seckill-engine"
)]
struct Cli {
    #[command(flatten)]
    args: ChaosArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The harness logs like the engine would with its defaults (RUST_LOG overrides).
    match seckill_engine::config::Settings::load(None) {
        Ok(settings) => seckill_engine::telemetry::init(&settings.telemetry),
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    }
    match actix_rt::System::new().block_on(run(&cli.args)) {
        Ok(accounts) if accounts.iter().all(|a| a.ok()) => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
