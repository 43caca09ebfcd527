//! The environment variables gatewarden's own processes pass each other.

/// Set in a restarting verb's detached orchestrator (`orchestrator.rs`); `restart` passes the
/// desired-state sequence it recorded in it. Removed from everything the orchestrator starts.
pub const ORCHESTRATOR_ENV: &str = "GATEWARDEN_RESTART_ORCHESTRATOR";

/// Set in the environment of a restart that already moved out of the unit's cgroup.
pub const SCOPED_ENV: &str = "GATEWARDEN_RESTART_SCOPED";
