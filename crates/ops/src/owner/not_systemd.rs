//! The facade functions that only systemd (`linux.rs`) fills in, as every other OS has them.

use gatewarden_service::ServiceSpec;
use gatewarden_service::doctor::Finding;

/// No host-wide findings (linger, a user manager) outside systemd.
pub fn host_findings(_spec: &ServiceSpec) -> Vec<Finding> {
    Vec::new()
}

/// Nothing to prepare: only systemd counts planned restarts against a start limit.
pub fn prepare_restart(_spec: &ServiceSpec) {}

/// Only systemd runs the gateway itself and can give up on it (see `linux.rs`).
pub fn gave_up(_spec: &ServiceSpec) -> bool {
    false
}

/// No asynchronous relaunch ladder: restarts are verified by the caller's status loop (and
/// `kick`). launchd has one (`macos.rs`).
#[cfg_attr(target_os = "macos", allow(dead_code))]
pub fn verify_restart(
    _spec: &ServiceSpec,
    _old: Option<(u32, String)>,
    _budget: std::time::Duration,
) -> Option<crate::Result<u32>> {
    None
}
