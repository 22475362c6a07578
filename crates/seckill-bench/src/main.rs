//! `seckill-bench`: runs a flash sale against a running engine (through the HTTP
//! front stage or straight onto the queue), optionally beside the pgbench baselines,
//! and reports throughput, latency and the invariant checks. A tool, not part of the
//! production binary: its HTTP client and probes stay out of the engine's tree.

mod bench;
mod cpu;
mod crowd;
mod http_client;
mod stalls;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use seckill_engine::config::Settings;

#[derive(Debug, Parser)]
#[command(
    name = "seckill-bench",
    version,
    about = "Flash-sale load generator for seckill-engine"
)]
struct Cli {
    /// A TOML file layered over config/default.toml (environment variables
    /// SECKILL__SECTION__KEY override both), the same file the engine reads.
    #[arg(long, env = "SECKILL_CONFIG")]
    config: Option<PathBuf>,
    #[command(flatten)]
    args: bench::BenchArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let settings = match Settings::load(cli.config.as_deref()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    seckill_engine::telemetry::init(&settings.telemetry);
    match actix_rt::System::new().block_on(bench::run(&settings, cli.args)) {
        Ok(report) if report.passed => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
