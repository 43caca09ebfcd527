//! Which gateway an agent run's processes belong to: the tag every run of an incarnation
//! carries in its environment (`GATEWARDEN_RUN_TAG=<home hash>:<incarnation>`), so what its
//! runs leave behind can be found and ended by whoever ends it: the next incarnation at boot
//! (crates/runtime/src/claim.rs, `sweep_orphan_runs`) and the stopper after a kill (`stopper.rs`).

use gatewarden_lifecycle::{Home, platform};

/// The environment variable tagging every process an agent run starts.
pub const RUN_TAG: &str = "GATEWARDEN_RUN_TAG";

/// `<home hash>:<incarnation>`: which gateway a run process belongs to.
pub fn run_tag(home: &Home, incarnation: &str) -> String {
    format!("{:016x}:{incarnation}", crate::endpoint::fnv1a(home.dir().to_string_lossy().as_bytes()))
}

/// Kills what the runs of `incarnation` of `home` left, each process pinned (pidfd) and its tag
/// read again before the signal; the pids killed. Empty where the OS cannot tell (Windows: a
/// job object ends with its gateway).
pub fn end_runs(home: &Home, incarnation: &str) -> Vec<u32> {
    let tag = run_tag(home, incarnation);
    platform::kill_tagged(RUN_TAG, &|v| v == tag)
}
