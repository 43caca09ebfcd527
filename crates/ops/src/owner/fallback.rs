//! Platforms without a supported service manager. See `mod.rs` for the facade.

use std::path::PathBuf;

use gatewarden_service::ServiceSpec;
use gatewarden_service::doctor::Finding;

use super::ServiceState;
pub use super::not_systemd::{gave_up, host_findings, prepare_restart, verify_restart};

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
pub fn check_manager(_spec: &ServiceSpec) -> crate::Result<()> {
    unsupported()
}
pub fn save(_spec: &ServiceSpec) -> crate::Result<super::Saved> {
    unsupported()
}
pub fn load(_spec: &ServiceSpec) -> crate::Result<()> {
    unsupported()
}
pub fn enable(_spec: &ServiceSpec) -> crate::Result<()> {
    unsupported()
}
pub fn restore(_spec: &ServiceSpec, _saved: &super::Saved) -> crate::Result<()> {
    unsupported()
}
pub fn remove(_spec: &ServiceSpec) -> crate::Result<()> {
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

super::definition_manager!(
    /// No supported service manager on this OS: a definition that cannot be installed.
    Unsupported
);

/// The facade's constructor: this OS's manager for `spec`, with what it says now.
pub fn definition(spec: ServiceSpec) -> super::Owner {
    let state = query(&spec);
    std::sync::Arc::new(Unsupported(super::Managed { spec, state }))
}
