//! The hermes-agent 0.19 venv (`scripts/hermes-venv`) and what its processes must not inherit,
//! shared by the hermes crate's tests and the `--hermes-home` CLI tests.

use std::path::PathBuf;

/// The venv holding `bin/hermes`: `GATEWARDEN_HERMES_VENV`, else
/// `~/.cache/gatewarden/hermes-venv`. Missing: [`crate::unavailable`] (fails under `CI`).
pub fn venv() -> Option<PathBuf> {
    let dir = std::env::var_os("GATEWARDEN_HERMES_VENV")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/gatewarden/hermes-venv")));
    match dir {
        Some(d) if d.join("bin/hermes").is_file() => Some(d),
        Some(d) => crate::unavailable("hermes-agent", &format!("no venv at {} (run scripts/hermes-venv)", d.display())),
        None => crate::unavailable("hermes-agent", "neither GATEWARDEN_HERMES_VENV nor HOME is set"),
    }
}

/// Variables a hermes child must not inherit: they would make it believe it is supervised, or
/// point it at the real user's state.
pub const SCRUB: &[&str] = &[
    "INVOCATION_ID",
    "NOTIFY_SOCKET",
    "JOURNAL_STREAM",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "LISTEN_PID",
    "LISTEN_FDS",
    "XPC_SERVICE_NAME",
    "HERMES_GATEWAY_EXTERNAL_SUPERVISOR",
    "HERMES_S6_SUPERVISED_CHILD",
    "HERMES_GATEWAY_LOCK_DIR",
    "GATEWARDEN_HERMES_HOME",
];
