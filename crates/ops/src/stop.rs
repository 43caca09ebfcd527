//! `gatewarden stop`: the one stop procedure (`halt.rs`).

use std::process::ExitCode;

use gatewarden_lifecycle::Home;

/// Stops the gateway (`--no-kill`: never kill) and records that it stays down (`--json`: one
/// document, `outcome::outcome`).
pub fn stop(home: &Home, timeout_s: u64, no_kill: bool, json: bool) -> crate::Result<ExitCode> {
    crate::outcome::outcome(home, "stop", json, || crate::halt::stop(home, timeout_s, no_kill))
}
