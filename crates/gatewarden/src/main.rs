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
    let code = match cmd::dispatch(cli, started_at, started) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("gatewarden: {e:#}");
            ExitCode::from(1)
        }
    };
    report_to_dashboard(code);
    code
}

/// A command a dashboard started for a button (crates/dashboard/src/actions.rs) leaves its exit
/// code where the page reads it.
fn report_to_dashboard(code: ExitCode) {
    use gatewarden_dashboard::actions;
    let Some(path) = std::env::var_os(actions::OUTCOME_ENV) else { return };
    // ExitCode has no getter: find the byte it was made from.
    let n = (0..=255u8).find(|n| ExitCode::from(*n) == code).map_or(1, i32::from);
    let verb = std::env::args().nth(3).unwrap_or_default();
    if let Err(e) = actions::finish(std::path::Path::new(&path), &verb, n) {
        eprintln!("gatewarden: cannot record the outcome for the dashboard: {e}");
    }
}
