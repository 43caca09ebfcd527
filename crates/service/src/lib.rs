//! gatewarden-service: service-manager definitions and the pure policy around them.
//!
//! - [`manager`]: [`ManagerKind`], every kind of owner, and its restart ladder's parameters.
//! - [`naming`]: per-home unit / label / task names (several homes side by side).
//! - [`spec`]: the manager-neutral [`ServiceSpec`] and the stop-timeout arithmetic.
//! - [`systemd`]: unit rendering, parsing, drift, `systemctl show`, a `systemctl` wrapper.
//! - [`launchd`]: LaunchAgent plist, KeepAlive policy, the restart-verification ladder.
//! - [`windows`]: Task Scheduler XML, the SCM install description, the stop state machine.
//! - [`windows_scm`]: the Windows SCM facade (the only platform-conditional code).
//! - [`supervise`]: the restart policy of `gatewarden supervise` and its parked state.
//! - [`finding`]: the vocabulary of diagnostics ([`finding::Finding`]), shared by the drift
//!   detectors and [`doctor`].
//! - [`doctor`]: the pure checks.
//! - [`transaction`]: `service install` / `uninstall` as steps with their undo, per manager.
//! - [`command`]: running manager tools behind a trait.
//!
//! Everything except [`windows_scm`] is pure or I/O-at-the-edge and is tested on Linux.

#![warn(missing_docs)]

pub mod command;
pub mod doctor;
pub mod finding;
pub mod launchd;
pub mod manager;
pub mod naming;
pub mod spec;
pub mod supervise;
pub mod systemd;
pub mod transaction;
pub mod windows;
pub mod windows_scm;

pub use manager::ManagerKind;
pub use spec::{Scope, ServiceSpec, SpecError};

/// Process exit codes of `gatewarden run`, from the one table in `gatewarden_lifecycle::exit`.
pub mod exit_code {
    use gatewarden_lifecycle::ExitIntent;

    /// Planned stop or takeover: leave it down.
    pub const PLANNED_STOP: i32 = ExitIntent::PlannedStop.code() as i32;
    /// Unexpected signal or crash: revive it.
    pub const CRASH: i32 = ExitIntent::Unexpected.code() as i32;
    /// Planned restart (EX_TEMPFAIL): revive it now, not a failure.
    pub const PLANNED_RESTART: i32 = ExitIntent::PlannedRestart.code() as i32;
    /// Fatal configuration (EX_CONFIG): do not revive.
    pub const FATAL_CONFIG: i32 = ExitIntent::FatalConfig.code() as i32;
}
