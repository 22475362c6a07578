//! Entry point: parse the command line and hand over to the library.

use std::process::ExitCode;

use clap::Parser;
use seckill_engine::cli::{run, Cli};

fn main() -> ExitCode {
    #[cfg(feature = "chaos")]
    let _failpoints = seckill_engine::failpoints::arm();
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
