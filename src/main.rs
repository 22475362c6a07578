//! Entry point: parse the command line and hand over to the library.

use std::process::ExitCode;

use clap::Parser;
use seckill_engine::cli::{run, Cli};

/// mimalloc instead of glibc's malloc, whose calls took about 12 % of the engine's
/// CPU in the demo sale: a request allocates and frees many small buffers
/// (docs/BENCHMARKS.md, "CPU per order").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
