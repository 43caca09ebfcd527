//! Platforms without a supported service manager. See `mod.rs` for the facade.

use std::path::PathBuf;

use gatewarden_service::ServiceSpec;
use gatewarden_service::doctor::Finding;

use super::ServiceState;

pub const MANAGER: gatewarden_service::ManagerKind = gatewarden_service::ManagerKind::None;

fn unsupported<T>() -> crate::Result<T> {
    crate::bail!("no supported service manager on this platform; run `gatewarden supervise` from your init system")
}

pub fn definition_path(_spec: &ServiceSpec) -> Option<PathBuf> {
    None
}
pub fn render(_spec: &ServiceSpec) -> crate::Result<String> {
    unsupported()
}
pub fn install(_spec: &ServiceSpec, _start: bool) -> crate::Result<()> {
    unsupported()
}
pub fn uninstall(_spec: &ServiceSpec) -> crate::Result<()> {
    unsupported()
}
pub fn query(spec: &ServiceSpec) -> ServiceState {
    ServiceState { manager: MANAGER, scope: Some(spec.scope), ..ServiceState::default() }
}
pub fn stop(_spec: &ServiceSpec) -> crate::Result<()> {
    unsupported()
}
pub fn kick(_spec: &ServiceSpec) -> crate::Result<()> {
    unsupported()
}
pub fn drift(_spec: &ServiceSpec) -> Vec<Finding> {
    Vec::new()
}
pub fn host_findings(_spec: &ServiceSpec) -> Vec<Finding> {
    Vec::new()
}

/// No asynchronous relaunch ladder here: restarts are verified by the caller's status loop
/// (and `kick`).
pub fn verify_restart(
    _spec: &ServiceSpec,
    _old: Option<(u32, String)>,
    _budget: std::time::Duration,
) -> Option<crate::Result<u32>> {
    None
}

/// Nothing to prepare: only systemd counts planned restarts against a start limit.
pub fn prepare_restart(_spec: &ServiceSpec) {}

/// Only systemd runs the gateway itself and can give up on it (see `linux.rs`).
pub fn gave_up(_spec: &ServiceSpec) -> bool {
    false
}

super::definition_manager!(
    /// No supported service manager on this OS: a definition that cannot be installed.
    Unsupported
);

/// The facade's constructor: this OS's manager for `spec`, with what it says now.
pub fn definition(spec: ServiceSpec) -> super::Owner {
    let state = query(&spec);
    std::sync::Arc::new(Unsupported(super::Managed { spec, state }))
}
