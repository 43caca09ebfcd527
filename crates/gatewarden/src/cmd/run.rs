//! `gatewarden run`: the gateway in the foreground; its exit code is the intent table's.

use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime};

use gatewarden_lifecycle::{ExitIntent, Home, Supervisor};
use gatewarden_runtime::{RunOptions, log};

use crate::cli::{LogFormat, RunArgs, SupervisorArg};

pub fn run(home: Home, args: RunArgs, started_at: SystemTime, started: Instant) -> ExitCode {
    let format = match args.log_format {
        LogFormat::Plain => log::Format::Plain,
        LogFormat::Json => log::Format::Json,
    };
    match &args.log_file {
        Some(path) => {
            if let Err(e) = log::init_file(path, format) {
                eprintln!("gatewarden: cannot write the log file {}: {e}", path.display());
                return ExitCode::from(ExitIntent::FatalConfig.code());
            }
        }
        None => log::init(format),
    }
    let opts = RunOptions {
        home,
        listen: args.listen,
        replace: args.replace,
        takeover_timeout: Duration::from_secs(args.takeover_timeout),
        drain_timeout: args.drain_timeout.map(Duration::from_secs),
        supervisor: args.supervisor.map(|s| match s {
            SupervisorArg::Systemd => Supervisor::Systemd,
            SupervisorArg::Launchd => Supervisor::Launchd,
            SupervisorArg::Container => Supervisor::Container,
            SupervisorArg::External => Supervisor::External,
            SupervisorArg::None => Supervisor::None,
        }),
        successor: args.successor,
        inherit_listener: args.inherit_listener,
        ready_stdout: args.ready_stdout,
        log_file: args.log_file,
        log_json: args.log_format == LogFormat::Json,
    };
    let outcome = gatewarden_runtime::run(opts, started_at, started);
    let code = outcome.intent.code();
    match outcome.intent {
        ExitIntent::FatalConfig => gatewarden_runtime::error!("{} (exit {code})", outcome.reason),
        ExitIntent::Unexpected => gatewarden_runtime::warn!("exiting: {} (exit {code})", outcome.reason),
        _ => gatewarden_runtime::info!("exited: {} (exit {code})", outcome.reason),
    }
    ExitCode::from(code)
}
