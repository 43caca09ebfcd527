//! `gatewarden`: a thin binary. It parses the command line and hands each verb to its file in
//! `cmd/`; the logic lives in the library crates.

mod cli;
mod cmd;

use std::process::ExitCode;
use std::time::{Instant, SystemTime};

use clap::Parser;

fn main() -> ExitCode {
    // Captured first: markers written before this instant are for a predecessor.
    let started_at = SystemTime::now();
    let started = Instant::now();
    gatewarden_lifecycle::platform::spawn::remember_self_exe();
    let cli = cli::Cli::parse();
    match cmd::dispatch(cli, started_at, started) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("gatewarden: {e:#}");
            ExitCode::from(1)
        }
    }
}
