//! `gatewarden run`: the gateway in the foreground; its exit code is the intent table's.

use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime};

use gatewarden_lifecycle::{ExitIntent, Home};
use gatewarden_runtime::{RunOptions, log};

use crate::cli::{LogFormat, RunArgs};

pub fn run(home: Home, args: RunArgs, started_at: SystemTime, started: Instant) -> ExitCode {
    let format = match args.log_format {
        LogFormat::Plain => log::Format::Plain,
        LogFormat::Json => log::Format::Json,
    };
    match &args.log_file {
        Some(path) => {
            if let Err(e) = log::init_file(path, format) {
                gatewarden_ops::errln!("gatewarden: cannot write the log file {}: {e}", path.display());
                return ExitCode::from(ExitIntent::FatalConfig.code());
            }
        }
        None => log::init(format),
    }
    // An update whose updater died is finished (or handed on) before this start goes on; a
    // preflight starts nothing and writes nothing.
    if !args.preflight {
        gatewarden_ops::update::on_gateway_start(&home);
    }
    let opts = RunOptions {
        home,
        listen: args.listen,
        replace: args.replace,
        takeover_timeout: Duration::from_secs(args.takeover_timeout),
        drain_timeout: args.drain_timeout.map(Duration::from_secs),
        supervisor: args.supervisor,
        successor: args.successor,
        inherit_listener: args.inherit_listener,
        ready_stdout: args.ready_stdout,
        desired_seq: args.desired_seq,
        preflight: args.preflight,
        log_file: args.log_file,
        log_json: args.log_format == LogFormat::Json,
    };
    let mut outcome = gatewarden_runtime::run(opts, started_at, started);
    if let Some(plan) = outcome.reexec.take() {
        // PID 1's planned restart: a new image in this same process. Returns only on failure,
        // and then nothing would revive PID 1: exit as a crash so it is at least visible.
        gatewarden_runtime::info!("re-executing in place: {}", outcome.reason);
        let e = plan.exec();
        gatewarden_runtime::error!("cannot re-execute in place: {e} (exit 1)");
        return ExitCode::from(ExitIntent::Unexpected.code());
    }
    let code = outcome.intent.code();
    match outcome.intent {
        ExitIntent::FatalConfig => gatewarden_runtime::error!("{} (exit {code})", outcome.reason),
        ExitIntent::Unexpected => gatewarden_runtime::warn!("exiting: {} (exit {code})", outcome.reason),
        _ => gatewarden_runtime::info!("exited: {} (exit {code})", outcome.reason),
    }
    ExitCode::from(code)
}
