//! `gatewarden`: a thin binary. It parses the command line and hands each verb to its file in
//! `cmd/`; the logic lives in the library crates.
#![deny(clippy::print_stdout, clippy::print_stderr)]

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
    if let Some(path) = &cli.config {
        // `--config` (or GATEWARDEN_CONFIG) as one absolute path in the environment: the config
        // crate reads it there (crates/lifecycle/src/home.rs `config_path_with`), and every
        // process this one starts (a background `run`, a restart's successor) inherits it.
        let abs = std::path::absolute(path).unwrap_or_else(|_| path.clone());
        // SAFETY: nothing else runs yet (no thread was started: clap parsed, and
        // remember_self_exe only read the executable's path), so no reader of the environment
        // can race this write.
        unsafe { std::env::set_var(gatewarden_lifecycle::home::CONFIG_ENV, abs) };
    }
    let code = match cmd::dispatch(cli, started_at, started) {
        Ok(code) => code,
        Err(e) => {
            gatewarden_ops::errln!("gatewarden: {e:#}");
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
        gatewarden_ops::errln!("gatewarden: cannot record the outcome for the dashboard: {e}");
    }
}
