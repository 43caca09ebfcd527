//! gatewarden-testkit: real-process test support for the gatewarden gateway.
//!
//! * [`TempHome`]: a temporary home with path helpers for every file of `docs/protocol.md` §1.
//! * [`Gateway`]: a spawned `gatewarden run --listen 127.0.0.1:0` with stderr captured to a
//!   file, [`Gateway::wait_ready`], [`Gateway::wait_exit`], kill-on-drop.
//! * [`cli`]: run a CLI verb and capture `(code, stdout, stderr)` with a deadline.
//! * [`Decoy`]: a live process that logs every catchable signal it receives (the "recycled PID").
//! * [`wait_until`] / [`holds_for`]: condition waits with deadlines, no bare sleeps.
//! * [`http_get`] / [`http_post_json`]: a tiny blocking HTTP/1.1 client, loopback (or a podman pod's 10/8 address) only.
//! * [`browser`]: headless Chromium over WebDriver, for the dashboard's browser tests.
//! * [`servers`]: real chat servers (Synapse for Matrix, ngIRCd for IRC) in temp dirs;
//!   [`prosody`] for XMPP.
//! * [`slackfake`]: a protocol-faithful Slack (Socket Mode and the Web API) on loopback.
//! * [`mattermostfake`]: a protocol-faithful Mattermost (the v4 WebSocket and REST) on loopback.
//! * [`whatsappfake`]: a protocol-faithful WhatsApp Cloud API (Graph API and a signing,
//!   redelivering webhook sender) on loopback.
//! * [`signalfake`]: a protocol-faithful signal-cli HTTP daemon (JSON-RPC and SSE) on loopback.
//! * [`proc_start_time`], [`pid_alive`], [`lock_holders`], [`catches_signal`]: read-only process /
//!   lock inspection.
//! * [`marker_json`], [`rfc3339`]: build planned-stop / takeover markers.
//! * [`archive`]: release archives (`.tar.gz`) built byte by byte, hostile ones included.
//! * [`users::TempUser`]: a second local user made for one test (`useradd`), removed after.
//! * [`tmpfs`]: a small tmpfs of the test's own (as root), to put a home on a disk it fills.
//!
//! Everything that spawns a process kills it on drop, and on Linux also arms
//! `PR_SET_PDEATHSIG(SIGKILL)` so a crashed test never leaves a gateway behind.

// Pure fixtures (bytes in, bytes out) build on every target: unit tests of every OS use them.
pub mod archive;

/// Items of the kit that need real processes, signals and /proc.
macro_rules! unix_only {
    ($($item:item)*) => { $( #[cfg(unix)] $item )* };
}

// Real processes, signals and /proc: the rest of the kit (and every test using it) is
// Unix-only. On other targets only [`archive`] is here, so `cargo test --workspace` still builds.
unix_only! {
pub use serde_json;
pub use tempfile;

pub mod api;
pub mod browser;
mod cli;
mod decoy;
mod gateway;
pub mod hermes;
mod home;
#[cfg(all(unix, feature = "tls"))]
pub mod mail;
pub mod mattermostfake;
mod http;
pub mod llmfake;
pub mod netfakes;
pub mod otlp;
pub mod podman;
pub mod postgres;
pub mod prosody;
mod proc;
pub mod servers;
pub mod signalfake;
pub mod slackfake;
pub mod sweep;
pub mod terminal;
mod time;
#[cfg(feature = "tls")]
pub mod tls;
pub mod users;
pub mod whatsappfake;
#[cfg(target_os = "linux")]
pub mod tmpfs;
mod wait;

pub use cli::{CliOutput, cli, cli_env, cli_host, cli_on_terminal, cli_reader_gone, cli_with};
pub use decoy::Decoy;
pub use gateway::{Gateway, GatewayBuilder, exit_code, exit_signal};
pub use home::TempHome;
pub use http::{HttpResponse, http_get, http_post_json, request as http_request};
pub use terminal::Terminal;
pub use proc::{catches_signal, lock_holders, lock_is_held, pid_alive, proc_start_time, rss_anon_bytes, rss_bytes, send_signal, sig};
pub use time::{marker_json, rfc3339, rfc3339_now, rfc3339_offset};
pub use wait::{holds_for, must_wait_until, wait_until};

/// Environment variables scrubbed from every spawned gateway / CLI, so the host environment
/// (a developer's shell under systemd, CI) cannot change supervisor detection or the home.
pub const SCRUBBED_ENV: &[&str] = &[
    "GATEWARDEN_HOME",
    "GATEWARDEN_CONFIG",
    "NO_COLOR",
    "NOTIFY_SOCKET",
    "INVOCATION_ID",
    "JOURNAL_STREAM",
    "LISTEN_PID",
    "LISTEN_FDS",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "XPC_SERVICE_NAME",
    "SYSTEMD_EXEC_PID",
    "RUST_LOG",
];

/// The host's real environment for a command (`GatewayBuilder::host_default`, [`cli_host`]):
/// only the home is left to the command line, and what it detaches is swept when the test ends,
/// as under [`test_env`].
pub fn host_env(cmd: &mut std::process::Command) {
    cmd.env_remove("GATEWARDEN_HOME");
    cmd.env(sweep::TAG_VAR, sweep::process_tag());
}

/// Applies the deterministic test environment to a command: scrubbed env, supervisor `none`.
/// Tests of the default detection path use `GatewayBuilder::host_default` / [`cli_host`]
/// instead, so the suite also runs the binary as a user's shell does.
pub fn test_env(cmd: &mut std::process::Command) {
    for k in SCRUBBED_ENV {
        cmd.env_remove(k);
    }
    cmd.env("GATEWARDEN_SUPERVISOR", "none");
    // Whatever it detaches is swept when the test ends (a test's own `Sweeper` tag replaces it).
    cmd.env(sweep::TAG_VAR, sweep::process_tag());
    // Test gateways stay out of the developer's fleet (`gatewarden dashboard`); a test of the
    // fleet names its own registry.
    if std::env::var_os("GATEWARDEN_REGISTRY").is_none() {
        cmd.env("GATEWARDEN_REGISTRY", "none");
    }
    // Nor do they touch the developer's hermes credential locks (crates/hermes/src/scoped.rs);
    // a test of those names its own directory.
    if std::env::var_os("HERMES_GATEWAY_LOCK_DIR").is_none() {
        let dir = std::env::temp_dir().join(format!("gw-hermes-locks-test-{}", std::process::id()));
        cmd.env("HERMES_GATEWAY_LOCK_DIR", dir);
    }
}

/// Whether a systemd user manager answers (`scripts/systemd-user` starts one). Without one a
/// test prints why and returns `false` to skip — except under `CI`, where it fails instead.
pub fn have_user_manager() -> bool {
    let state = std::process::Command::new("systemctl")
        .args(["--user", "is-system-running"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    if matches!(state.as_str(), "running" | "degraded") {
        return true;
    }
    let why = format!(
        "no systemd user manager (`systemctl --user is-system-running` says {state:?}); \
         run `eval \"$(scripts/systemd-user)\"` first"
    );
    unavailable::<()>("systemd user manager", &why).is_some()
}

/// Whether this run is CI's (`CI` set, and neither empty nor `false`): there, a component a
/// test needs must be present.
pub fn under_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "false")
}

/// The one rule for a component a test needs but this machine lacks (a server, a package, a
/// user manager): under `CI` the test fails; elsewhere it prints `SKIPPED:` and why, and gets
/// `None`.
#[track_caller]
pub fn unavailable<T>(what: &str, reason: &str) -> Option<T> {
    assert!(!under_ci(), "CI: {what} unavailable: {reason}");
    eprintln!("SKIPPED: {what} unavailable: {reason}");
    None
}
}
