//! The command line: one variant per verb.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
// `--version` prints the stamped VERSION: `update` reads a release's version from it.
#[command(name = "gatewarden", version = gatewarden_lifecycle::VERSION, about = "An agent gateway whose lifecycle cannot wedge")]
pub struct Cli {
    /// State directory of the gateway [default: per-OS state dir, e.g. ~/.local/state/gatewarden]
    #[arg(long, global = true, env = "GATEWARDEN_HOME", value_name = "DIR")]
    pub home: Option<PathBuf>,

    /// Manage the hermes-agent gateway whose home ($HERMES_HOME) is DIR, with the same verbs
    /// [env: GATEWARDEN_HERMES_HOME=]
    #[arg(long, global = true, value_name = "DIR")]
    pub hermes_home: Option<PathBuf>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gateway in the foreground
    Run(RunArgs),
    /// Show whether a gateway runs in this home (exit 0 running, 3 not running, 4 unknown)
    Status {
        /// Print the status as JSON
        #[arg(long)]
        json: bool,
    },
    /// Stop the gateway gracefully; kill it (after re-verifying its identity) if it does not stop in time
    Stop {
        /// Seconds to wait for a graceful stop
        #[arg(long, default_value_t = 60, value_name = "SECS")]
        timeout: u64,
        /// Never kill: exit 1 if the gateway is still running after the timeout
        #[arg(long)]
        no_kill: bool,
    },
    /// Start the gateway in the background and wait until it is ready
    Start {
        /// HTTP listen address, overriding config.toml
        #[arg(long, value_name = "ADDR")]
        listen: Option<String>,
        /// Seconds to wait for readiness
        #[arg(long, default_value_t = 30, value_name = "SECS")]
        timeout: u64,
        /// Seconds a stop waits for active runs, overriding config.toml
        #[arg(long, value_name = "SECS")]
        drain_timeout: Option<u64>,
        /// Internal: start on behalf of the request recorded under this desired-state sequence
        /// (a restart's kick): obey a later stop, record nothing
        #[arg(long, hide = true, value_name = "SEQ")]
        desired_seq: Option<u64>,
    },
    /// Restart the gateway and exit 0 only when a new incarnation is ready
    Restart {
        /// Seconds to wait for the new incarnation
        #[arg(long, default_value_t = 90, value_name = "SECS")]
        timeout: u64,
        /// Internal: the gateway's backstop for a restart no CLI verifies (the old incarnation)
        #[arg(long, hide = true, value_name = "INCARNATION")]
        backstop: Option<String>,
        /// Internal: the desired-state sequence the backstop's restart was requested under
        #[arg(long, hide = true, value_name = "SEQ", requires = "backstop")]
        desired_seq: Option<u64>,
    },
    /// Send a message (or a chat command such as /status) to the running gateway
    Send {
        /// The message text
        text: String,
        /// Chat id
        #[arg(long, default_value = "cli")]
        chat: String,
        /// User id (/stop and /restart go through the control socket as the local owner)
        #[arg(long, default_value = "cli")]
        user: String,
        /// Journal the message and return its id instead of waiting for the reply
        #[arg(long = "async")]
        is_async: bool,
    },
    /// Show the gateway's log (written by background starts)
    Logs {
        /// Keep printing new lines
        #[arg(short = 'f', long)]
        follow: bool,
        /// Number of lines to show
        #[arg(short = 'n', default_value_t = 50)]
        n: usize,
    },
    /// Install, remove or inspect this home's service (systemd, launchd, Windows task/service)
    Service(crate::cmd::service::ServiceArgs),
    /// Run the gateway as a child and supervise it (for places without a service manager)
    Supervise(crate::cmd::supervise::SuperviseArgs),
    /// Check the service definition, stale files, port, permissions and a parked supervisor
    Doctor(crate::cmd::doctor::DoctorArgs),
    /// Replace the gateway binary as a verified transaction (stage, preflight, swap, restart,
    /// probation), rolling back on failure
    Update(crate::cmd::update::UpdateArgs),
    /// Would this binary start in this home? Config, journal schema, listen address, service
    /// definition (read-only; `update` runs it from the staged release)
    Check {
        /// The executable the service definition should run [default: this one]
        #[arg(long, hide = true, value_name = "PATH")]
        target: Option<PathBuf>,
        /// Print the findings as JSON
        #[arg(long)]
        json: bool,
    },
    /// Internal: the systemd unit's `ExecStopPost=` where systemd has no `RestartSteps=` (< 254):
    /// after an unplanned exit, waits the crash loop's growing delay before systemd restarts
    #[command(hide = true)]
    CrashBackoff,
    /// Show the lifecycle ledger, newest last
    History {
        /// Number of events to show
        #[arg(short = 'n', default_value_t = 20)]
        n: usize,
        /// One JSON object per line
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// HTTP listen address, overriding config.toml (default 127.0.0.1:7878; port 0 picks a free port)
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Take over from a gateway already running in this home
    #[arg(long)]
    pub replace: bool,
    /// Seconds `--replace` waits for the previous gateway before killing it
    #[arg(long, default_value_t = 10, value_name = "SECS")]
    pub takeover_timeout: u64,
    /// Seconds a stop waits for active runs, overriding config.toml (default 30)
    #[arg(long, value_name = "SECS")]
    pub drain_timeout: Option<u64>,
    /// Declare the supervisor instead of detecting it: systemd, launchd, container, external or
    /// none (`GATEWARDEN_SUPERVISOR` declares it too, parsed by the same rules)
    #[arg(long, value_name = "KIND", value_parser = parse_supervisor)]
    pub supervisor: Option<gatewarden_lifecycle::Supervisor>,
    /// Log format
    #[arg(long, value_enum, default_value_t = LogFormat::Plain)]
    pub log_format: LogFormat,
    /// Write the log to this file (rotated by size) instead of stderr
    #[arg(long, value_name = "FILE")]
    pub log_file: Option<PathBuf>,
    /// Internal: this process succeeds a restarting gateway (wait for its lock)
    #[arg(long, hide = true)]
    pub successor: bool,
    /// Internal: adopt an inherited listening socket
    #[arg(long, hide = true, value_name = "FD")]
    pub inherit_listener: Option<String>,
    /// Internal: print a readiness line on stdout (used by `start`)
    #[arg(long, hide = true)]
    pub ready_stdout: bool,
    /// Internal: the desired-state sequence this start carries out (`start`, a successor):
    /// a later stop makes it exit before it is ready
    #[arg(long, hide = true, value_name = "SEQ")]
    pub desired_seq: Option<u64>,
}

/// `--supervisor` goes through the lifecycle crate's one parser, like `GATEWARDEN_SUPERVISOR`.
fn parse_supervisor(s: &str) -> Result<gatewarden_lifecycle::Supervisor, String> {
    gatewarden_lifecycle::Supervisor::parse(s)
        .ok_or_else(|| format!("{s:?} is not a supervisor (systemd, launchd, container, external, none)"))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Plain,
    Json,
}
