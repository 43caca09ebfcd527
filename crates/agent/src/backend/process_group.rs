//! The exec backend's children run in their own process group (a job object on Windows), so a
//! cancelled or timed-out run ends the whole tree. The per-OS work is the lifecycle crate's
//! (crates/lifecycle/src/platform/spawn, `ProcessGroup`); here is only the decision that a
//! group nobody released is killed when dropped.

use gatewarden_lifecycle::platform::spawn::ProcessGroup;
use tokio::process::{Child, Command};

/// Prepares `cmd` so that the spawned child leads its own group.
pub(super) fn configure(cmd: &mut Command) {
    ProcessGroup::prepare(cmd.as_std_mut());
}

/// Handle on a spawned child's group.
pub(super) struct Group {
    group: ProcessGroup,
    released: bool,
}

impl Group {
    /// Must be called right after spawn, before the child is waited on.
    pub(super) fn attach(child: &Child) -> Group {
        Group { group: ProcessGroup::attach(child.id()), released: false }
    }

    /// Asks every member to exit (SIGTERM on Unix; a kill on Windows, which has no polite
    /// signal for a console-less child).
    pub(super) fn terminate(&self) {
        self.group.terminate();
    }

    /// Kills every member at once (SIGKILL on Unix). Safe to call more than once.
    pub(super) fn kill(&self) {
        self.group.kill();
    }

    /// The run is over and the group was killed and its leader reaped: drop the handle without
    /// the kill that dropping an unreleased group does (the backstop for a run future that is
    /// dropped half-way instead of being cancelled).
    pub(super) fn release(mut self) {
        self.released = true;
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        if !self.released {
            self.group.kill();
        }
    }
}

/// Human-readable description of how a child ended ("exit status 3", "killed by signal 9").
pub(super) fn describe_exit(status: std::process::ExitStatus) -> String {
    gatewarden_lifecycle::platform::spawn::describe_exit(status)
}
