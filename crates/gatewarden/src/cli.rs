//! The command line: one variant per verb.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};
use gatewarden_ops as ops;

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

    /// The configuration file, for this command and every gateway it starts [default:
    /// <home>/config.toml]
    #[arg(long, global = true, env = "GATEWARDEN_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Colour: auto (on a terminal, unless NO_COLOR is set), always or never
    #[arg(long, global = true, value_enum, default_value_t = Color::Auto, value_name = "WHEN")]
    pub color: Color,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Set up this home: one chat platform and one agent backend, asked on a terminal or given
    /// as flags; secrets go to secrets.env, the rest to a commented config.toml; credentials are
    /// tried, `check` is run, and the next step is printed
    Init(InitArgs),
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
        /// One JSON document on stdout: the outcome and the status left (lines go to stderr)
        #[arg(long)]
        json: bool,
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
        /// Start with the settings of the last gateway that ran here (its recorded --listen
        /// and --drain-timeout), not only the config's; --listen / --drain-timeout still win
        #[arg(long)]
        as_before: bool,
        /// One JSON document on stdout: the outcome and the status left (lines go to stderr)
        #[arg(long)]
        json: bool,
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
        /// One JSON document on stdout: the outcome and the status left (lines go to stderr)
        #[arg(long)]
        json: bool,
    },
    /// Cancel the drain of a restart: the gateway runs on (exit 0 once it answers `running`)
    CancelDrain {
        /// One JSON document on stdout: the outcome and the status left (lines go to stderr)
        #[arg(long)]
        json: bool,
    },
    /// Re-read config.toml and the secrets and apply what can change live (as SIGHUP does);
    /// names the keys that need a restart. Exit 0 applied, 78 refused (the file, line and key
    /// are printed; nothing changed), 3 not running
    Reload {
        /// One JSON document on stdout
        #[arg(long)]
        json: bool,
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
        /// One JSON document on stdout: the reply (or the message id) and the notices
        #[arg(long)]
        json: bool,
    },
    /// Show the gateway's log (written by background starts)
    Logs {
        /// Keep printing new lines
        #[arg(short = 'f', long)]
        follow: bool,
        /// Number of lines to show
        #[arg(short = 'n', default_value_t = 50)]
        n: usize,
        /// One JSON object per line (`text`, and `ts`, `level`, `message` where the line has them)
        #[arg(long)]
        json: bool,
    },
    /// Install, remove or inspect this home's service (systemd, launchd, Windows task/service)
    Service(ServiceArgs),
    /// Run the gateway as a child and supervise it (for places without a service manager)
    Supervise(SuperviseArgs),
    /// Check the service definition, stale files, port, permissions, a parked supervisor, and what
    /// users see: failing providers, degraded platforms, failing runs, full queues, the clock
    Doctor(DoctorArgs),
    /// Replace the gateway binary as a verified transaction (stage, preflight, swap, restart,
    /// probation), rolling back on failure
    Update(UpdateArgs),
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
    /// Serve one dashboard page for every gateway home of this user (the per-user registry
    /// each gateway joins at start); every page asks for its token (GATEWARDEN_DASHBOARD_TOKEN,
    /// or the file GATEWARDEN_DASHBOARD_TOKEN_FILE names; at least 16 bytes, else a random one
    /// printed at start)
    Dashboard {
        /// Address to serve on: loopback unless a token is given (port 0 picks
        /// a free port; the URL is printed)
        #[arg(long, default_value = "127.0.0.1:7879", value_name = "ADDR")]
        listen: String,
        /// Also list this gatewarden home (repeatable)
        #[arg(long = "home-dir", value_name = "DIR")]
        homes: Vec<PathBuf>,
        /// Also list this hermes home (repeatable)
        #[arg(long = "hermes", value_name = "DIR")]
        hermes_homes: Vec<PathBuf>,
    },
    /// A live view of the gateway, redrawn every second: its CPU, memory and threads, each
    /// platform's state and lag, the queue, runs in flight, providers, messages per minute
    Top {
        /// Print one snapshot and exit
        #[arg(long)]
        once: bool,
        /// Log lines shown
        #[arg(short = 'n', default_value_t = 8)]
        n: usize,
        /// One snapshot as a JSON document (implies --once)
        #[arg(long)]
        json: bool,
    },
    /// Show a message's path through the gateway: received, journaled, claimed, backend
    /// called, providers tried, first token, done or failed, outbox sent
    Trace {
        /// The message id (`/v1/messages` answers it; the dashboard lists it)
        #[arg(value_name = "MESSAGE_ID")]
        id: String,
        /// One JSON object with the steps
        #[arg(long)]
        json: bool,
    },
    /// Print the shell completion script for SHELL (bash, zsh, fish) on stdout
    Completions {
        #[arg(value_enum)]
        shell: CompletionShell,
    },
    /// Print the man page (roff) on stdout: `gatewarden man > gatewarden.1`
    Man,
    /// Who may reach the agent: list pairing codes and approved senders, approve a code,
    /// revoke a sender (takes effect at once in the running gateway)
    Pairing {
        #[command(subcommand)]
        action: PairingAction,
    },
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

#[derive(Debug, Subcommand)]
pub enum PairingAction {
    /// Each platform's access, pending codes and approved senders
    List {
        /// One JSON document
        #[arg(long)]
        json: bool,
    },
    /// Approve the sender a pairing code was given to
    Approve {
        /// The `[[platform]]`'s kind, or its name where the home has two of one kind
        platform: String,
        /// The code the sender got (any case)
        code: String,
        /// One JSON document
        #[arg(long)]
        json: bool,
    },
    /// Take a sender's approval back: its messages no longer reach the agent
    Revoke {
        /// The `[[platform]]`'s kind, or its name where the home has two of one kind
        platform: String,
        /// The sender's id, as the platform names it (`pairing list` shows it)
        user: String,
        /// One JSON document
        #[arg(long)]
        json: bool,
    },
}

impl PairingAction {
    /// The request, and whether JSON was asked for.
    pub fn request(self) -> (gatewarden_ops::pairing::PairingRequest, bool) {
        use gatewarden_ops::pairing::PairingRequest as R;
        match self {
            PairingAction::List { json } => (R::List, json),
            PairingAction::Approve { platform, code, json } => (R::Approve { platform, code }, json),
            PairingAction::Revoke { platform, user, json } => (R::Revoke { platform, user }, json),
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct InitArgs {
    /// The chat platform (asked on a terminal; `none`: the HTTP API only)
    #[arg(long, value_name = "KIND", value_parser = ["telegram", "none"])]
    pub platform: Option<String>,
    /// The agent backend (asked on a terminal; `echo` answers with the message, for a first try)
    #[arg(long, value_name = "KIND", value_parser = ["openai", "echo"])]
    pub backend: Option<String>,
    /// The provider's OpenAI-compatible base URL [default: https://api.openai.com/v1]
    #[arg(long, value_name = "URL")]
    pub base_url: Option<String>,
    /// The model the provider serves
    #[arg(long, value_name = "NAME")]
    pub model: Option<String>,
    /// The variable holding the provider's API key, in secrets.env [default: OPENAI_API_KEY];
    /// without a terminal its value is taken from init's own environment
    #[arg(long, value_name = "NAME")]
    pub api_key_env: Option<String>,
    /// The variable holding the bot token, in secrets.env [default: TELEGRAM_BOT_TOKEN];
    /// without a terminal its value is taken from init's own environment
    #[arg(long, value_name = "NAME")]
    pub token_env: Option<String>,
    /// Another Bot API server (written as the platform's api_base) [default: https://api.telegram.org]
    #[arg(long, value_name = "URL")]
    pub api_base: Option<String>,
    /// The owner's user id on the platform (may run /restart, /stop, /update); repeatable
    #[arg(long = "admin", value_name = "ID")]
    pub admins: Vec<String>,
    /// HTTP listen address [default: 127.0.0.1:7878]
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Replace an existing config.toml (the old one is kept as config.toml.bak-<time>)
    #[arg(long)]
    pub force: bool,
    /// Do not try the credentials over the network
    #[arg(long)]
    pub offline: bool,
    /// Never ask: a missing answer is an error (the default without a terminal)
    #[arg(long)]
    pub no_input: bool,
    /// One JSON document on stdout: what was written, what was found, the check, the next step
    #[arg(long)]
    pub json: bool,
}

impl From<InitArgs> for ops::options::InitArgs {
    fn from(a: InitArgs) -> Self {
        ops::options::InitArgs {
            platform: a.platform,
            backend: a.backend,
            base_url: a.base_url,
            model: a.model,
            api_key_env: a.api_key_env,
            token_env: a.token_env,
            api_base: a.api_base,
            admins: a.admins,
            listen: a.listen,
            force: a.force,
            offline: a.offline,
            no_input: a.no_input,
            json: a.json,
        }
    }
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
    #[arg(long, value_enum, default_value_t = LogFormat::Plain, env = "GATEWARDEN_LOG_FORMAT")]
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
    /// Internal: only say whether a gateway could start with these arguments, then exit (a
    /// restart's preflight)
    #[arg(long, hide = true)]
    pub preflight: bool,
}

/// `--supervisor` goes through the lifecycle crate's one parser, like `GATEWARDEN_SUPERVISOR`.
fn parse_supervisor(s: &str) -> Result<gatewarden_lifecycle::Supervisor, String> {
    gatewarden_lifecycle::Supervisor::parse(s)
        .ok_or_else(|| format!("{s:?} is not a supervisor (systemd, launchd, container, external, none)"))
}

/// The shells release tarballs ship completions for (scripts/release).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CompletionShell {
    Bash,
    Zsh,
    Fish,
}

/// `--color`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Color {
    Auto,
    Always,
    Never,
}

impl From<Color> for ops::ui::ColorChoice {
    fn from(c: Color) -> Self {
        match c {
            Color::Auto => ops::ui::ColorChoice::Auto,
            Color::Always => ops::ui::ColorChoice::Always,
            Color::Never => ops::ui::ColorChoice::Never,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Plain,
    Json,
}

#[derive(Debug, clap::Args)]
pub struct ServiceArgs {
    #[command(subcommand)]
    pub action: ServiceAction,
}

#[derive(Debug, clap::Subcommand)]
pub enum ServiceAction {
    /// Install (and start) this home's gateway as a service: a systemd user unit, a macOS
    /// LaunchAgent or a Windows scheduled task; a system unit / Windows service with --system
    Install(InstallArgs),
    /// Stop the service gracefully and remove its definition
    Uninstall(UninstallArgs),
    /// Show the service manager's view: manager, unit, installed, active, main pid
    /// (exit 0 active, 3 installed but not active, 4 not installed)
    Status {
        /// Print as JSON
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, clap::Args)]
pub struct InstallArgs {
    /// Install for the whole system (systemd system unit, Windows SCM service; needs root / admin)
    #[arg(long)]
    pub system: bool,
    /// Print the definition instead of installing it
    #[arg(long)]
    pub print: bool,
    /// Account the system service runs as (systemd `User=`, SCM account)
    #[arg(long, value_name = "USER", requires = "system")]
    pub run_as: Option<String>,
    /// Install and enable, but do not start now
    #[arg(long)]
    pub no_start: bool,
    /// hermes homes: disable hermes's own enabled unit for the home (after a planned stop) and install ours
    #[arg(long)]
    pub adopt: bool,
    /// hermes homes: the hermes executable the unit runs [default: $GATEWARDEN_HERMES, else `hermes` on PATH]
    #[arg(long, value_name = "CMD")]
    pub hermes: Option<std::path::PathBuf>,
    /// Internal (tests): systemd RestartSec in milliseconds
    #[arg(long, hide = true, value_name = "MS")]
    pub restart_sec_ms: Option<u64>,
    /// Internal (tests): systemd WatchdogSec in seconds (0 = none)
    #[arg(long, hide = true, value_name = "SECS")]
    pub watchdog_s: Option<u64>,
    /// Internal (tests): crash-loop brake burst
    #[arg(long, hide = true)]
    pub start_limit_burst: Option<u32>,
    /// One JSON document on stdout: the outcome and the service's state (lines go to stderr)
    #[arg(long, conflicts_with = "print")]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct UninstallArgs {
    /// Remove the system-wide definition (default: whichever is installed, user first)
    #[arg(long)]
    pub system: bool,
    /// One JSON document on stdout: the outcome and the service's state (lines go to stderr)
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, clap::Args)]
pub struct UpdateArgs {
    /// The release: a gatewarden binary or a .tar.gz holding one, as a local path or an http(s) URL
    #[arg(long, value_name = "PATH|URL", conflicts_with_all = ["status", "rollback"])]
    pub from: Option<String>,
    /// Expected sha256 of the release (hex); required for URLs
    #[arg(long, value_name = "HEX")]
    pub sha256: Option<String>,
    /// Detached minisign signature [default: <from>.minisig] (needed when [update] public_key is set)
    #[arg(long, value_name = "PATH|URL")]
    pub signature: Option<String>,
    /// Seconds the new incarnation has to become ready with the new version
    #[arg(long, default_value_t = 60, value_name = "SECS")]
    pub timeout: u64,
    /// Print the outcome as JSON
    #[arg(long)]
    pub json: bool,
    /// Show the last (or the unfinished) update transaction
    #[arg(long)]
    pub status: bool,
    /// Go back to the last known good binary (the one the last update replaced)
    #[arg(long, conflicts_with = "status")]
    pub rollback: bool,
    /// Internal: finish an unfinished transaction whose updater died
    #[arg(long, hide = true)]
    pub resume: bool,
    /// Internal: run by systemd's `ExecStopPost=` (from the last known good copy) after the
    /// gateway exited: reverts an unfinished update whose release died
    #[arg(long, hide = true)]
    pub after_exit: bool,
    /// Install a release not newer than the running version (refused otherwise, signed or
    /// not; chat `/update` never downgrades). `--rollback` needs no flag
    #[arg(long, conflicts_with_all = ["status", "rollback"])]
    pub allow_downgrade: bool,
    /// Internal: the chat that asked (`/update`); it gets the outcome notice
    #[arg(long, hide = true, value_name = "CHAT")]
    pub chat: Option<String>,
    /// Internal: the chat platform adapter `--chat` belongs to (its notice goes through the
    /// outbox); without it the chat is an HTTP one
    #[arg(long, hide = true, value_name = "ADAPTER", requires = "chat")]
    pub chat_platform: Option<String>,
}

#[derive(Debug, Clone, clap::Args)]
pub struct SuperviseArgs {
    /// HTTP listen address passed to the gateway (overrides config.toml)
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Seconds a stop waits for active runs, passed to the gateway (overrides config.toml)
    #[arg(long, value_name = "SECS")]
    pub drain_timeout: Option<u64>,
    /// hermes homes: the hermes executable to run [default: $GATEWARDEN_HERMES, else `hermes` on PATH]
    #[arg(long, value_name = "CMD")]
    pub hermes: Option<std::path::PathBuf>,
    /// Internal: run as a Windows SCM service (the service definition passes it)
    #[arg(long, hide = true)]
    pub scm: bool,
    /// Internal (tests): restarts allowed within the brake window before parking
    #[arg(long, hide = true, default_value_t = 5)]
    pub brake_restarts: usize,
    /// Internal (tests): crash-loop brake window in seconds
    #[arg(long, hide = true, default_value_t = 60)]
    pub brake_window_s: u64,
    /// Internal (tests): first crash backoff in milliseconds
    #[arg(long, hide = true, default_value_t = 100)]
    pub backoff_ms: u64,
    /// Internal (tests): the longest crash backoff, also every braked restart's, in milliseconds
    #[arg(long, hide = true, default_value_t = 30_000)]
    pub max_backoff_ms: u64,
}

#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// Apply the fixes that can be applied automatically
    #[arg(long)]
    pub fix: bool,
    /// Print the findings as JSON
    #[arg(long)]
    pub json: bool,
}

// The operations take plain option structs (crates/ops): the conversions below are the whole
// of the binary's knowledge of them.

impl From<ServiceArgs> for ops::options::ServiceArgs {
    fn from(a: ServiceArgs) -> Self {
        let action = match a.action {
            ServiceAction::Install(i) => ops::options::ServiceAction::Install(ops::options::InstallArgs {
                system: i.system,
                print: i.print,
                run_as: i.run_as,
                no_start: i.no_start,
                adopt: i.adopt,
                hermes: i.hermes,
                restart_sec_ms: i.restart_sec_ms,
                watchdog_s: i.watchdog_s,
                start_limit_burst: i.start_limit_burst,
                json: i.json,
            }),
            ServiceAction::Uninstall(u) => {
                ops::options::ServiceAction::Uninstall(ops::options::UninstallArgs { system: u.system, json: u.json })
            }
            ServiceAction::Status { json } => ops::options::ServiceAction::Status { json },
        };
        ops::options::ServiceArgs { action }
    }
}

impl From<UpdateArgs> for ops::options::UpdateArgs {
    fn from(a: UpdateArgs) -> Self {
        ops::options::UpdateArgs {
            from: a.from,
            sha256: a.sha256,
            signature: a.signature,
            timeout: a.timeout,
            json: a.json,
            status: a.status,
            rollback: a.rollback,
            resume: a.resume,
            after_exit: a.after_exit,
            allow_downgrade: a.allow_downgrade,
            chat: a.chat,
            chat_platform: a.chat_platform,
        }
    }
}

impl From<SuperviseArgs> for ops::options::SuperviseArgs {
    fn from(a: SuperviseArgs) -> Self {
        ops::options::SuperviseArgs {
            listen: a.listen,
            drain_timeout: a.drain_timeout,
            hermes: a.hermes,
            scm: a.scm,
            brake_restarts: a.brake_restarts,
            brake_window_s: a.brake_window_s,
            backoff_ms: a.backoff_ms,
            max_backoff_ms: a.max_backoff_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// Verbs that report nothing a program would read: each with why. Every other verb has
    /// `--json` (docs/protocol.md §6.3); a verb added without it fails [`every_verb_that_reports_has_json`].
    const NO_JSON: &[(&str, &str)] = &[
        ("run", "the gateway itself: it serves until it stops (its log has --log-format json)"),
        ("supervise", "a supervisor: it runs until its child stays down"),
        ("dashboard", "a web server: it serves until Ctrl-C"),
        ("crash-backoff", "internal (the unit's ExecStopPost=): it only waits"),
        ("completions", "prints a shell script"),
        ("man", "prints a man page"),
        ("service", "a group: its subcommands are walked"),
        ("pairing", "a group: its subcommands are walked"),
    ];

    fn walk(cmd: &clap::Command, path: &str, out: &mut Vec<(String, bool)>) {
        for sub in cmd.get_subcommands() {
            let name = if path.is_empty() { sub.get_name().to_owned() } else { format!("{path} {}", sub.get_name()) };
            let json = sub.get_arguments().any(|a| a.get_long() == Some("json"));
            out.push((name.clone(), json));
            walk(sub, &name, out);
        }
    }

    #[test]
    fn every_verb_that_reports_has_json() {
        let mut verbs = Vec::new();
        walk(&Cli::command(), "", &mut verbs);
        assert!(verbs.len() > 20, "{verbs:?}");
        let exempt = |v: &str| NO_JSON.iter().any(|(n, _)| *n == v);
        let missing: Vec<&str> =
            verbs.iter().filter(|(v, json)| !json && !exempt(v)).map(|(v, _)| v.as_str()).collect();
        assert!(missing.is_empty(), "verbs without --json (add it, documented in docs/protocol.md §6.3): {missing:?}");
        // The exemptions name verbs that exist, and none of them grew a --json.
        for (name, why) in NO_JSON {
            let found = verbs.iter().find(|(v, _)| v == name);
            assert!(found.is_some_and(|(_, json)| !json), "{name} ({why}) is not a verb without --json any more");
        }
    }

    #[test]
    fn config_and_color_are_global() {
        let cli =
            Cli::try_parse_from(["gatewarden", "status", "--config", "/etc/gw.toml", "--color", "never"]).unwrap();
        assert_eq!(cli.config.as_deref(), Some(std::path::Path::new("/etc/gw.toml")));
        assert_eq!(cli.color, Color::Never);
        assert!(Cli::try_parse_from(["gatewarden", "--color", "sometimes", "status"]).is_err());
    }
}
