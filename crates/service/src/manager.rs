//! Which manager owns a gateway, as one enum, and its restart ladder's parameters as data: the
//! restart ladder (crates/ops/src/restart/) is one generic loop that reads
//! these instead of comparing manager names.

use std::time::Duration;

use serde::Serialize;

/// Every kind of owner a gateway can have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ManagerKind {
    /// A systemd unit runs the gateway itself.
    Systemd,
    /// A launchd job runs `gatewarden supervise`.
    Launchd,
    /// A Windows scheduled task runs `gatewarden supervise`.
    TaskScheduler,
    /// A Windows service (SCM) runs `gatewarden supervise --scm`.
    #[serde(rename = "windows-service")]
    Scm,
    /// `gatewarden supervise` started by hand (or by an outer manager we do not see).
    Supervise,
    /// The gateway is PID 1 of a PID namespace and re-executes in place.
    ContainerPid1,
    /// Nobody: the CLI starts and restarts it.
    #[default]
    None,
}

/// How long a restart waits for the manager before starting the gateway itself, with no
/// restart delay reported; see [`ManagerKind::kick_after`].
const MARGIN: Duration = Duration::from_secs(2);

impl ManagerKind {
    /// The name `status --json` shows (`service.manager`).
    pub fn as_str(self) -> &'static str {
        match self {
            ManagerKind::Systemd => "systemd",
            ManagerKind::Launchd => "launchd",
            ManagerKind::TaskScheduler => "task-scheduler",
            ManagerKind::Scm => "windows-service",
            ManagerKind::Supervise => "supervise",
            ManagerKind::ContainerPid1 => "container-pid1",
            ManagerKind::None => "none",
        }
    }

    /// What the manager calls the thing it runs.
    pub fn unit_word(self) -> &'static str {
        match self {
            ManagerKind::Systemd => "unit",
            ManagerKind::Launchd => "job",
            ManagerKind::TaskScheduler => "task",
            _ => "service",
        }
    }

    /// The manager's main process is the gateway itself, so the gateway's exit 75 is what it
    /// revives (after its restart delay), and its cgroup is the gateway's.
    pub fn runs_gateway_directly(self) -> bool {
        self == ManagerKind::Systemd
    }

    /// Relaunches are asynchronous with quirks (throttling, pended spawns, unloaded labels) that
    /// need a verification ladder running beside the restart wait.
    pub fn needs_relaunch_ladder(self) -> bool {
        self == ManagerKind::Launchd
    }

    /// How long a restart lets the lock stay free before starting the gateway through the
    /// manager (or directly) instead of waiting for a revival. A manager that revives at once
    /// gets its delay plus a margin; one with a long delay is not waited for at all (its
    /// `kick` ends the delay); a supervisor wrapper restarts its child at once.
    pub fn kick_after(self, restart_delay: Option<Duration>) -> Duration {
        match self {
            ManagerKind::Systemd => match restart_delay {
                Some(d) if d <= Duration::from_secs(1) => d + MARGIN,
                _ => Duration::ZERO,
            },
            // The launchd ladder owns escalation; this is only the last resort.
            ManagerKind::Launchd => Duration::from_secs(15),
            ManagerKind::TaskScheduler | ManagerKind::Scm | ManagerKind::Supervise => MARGIN * 2,
            ManagerKind::ContainerPid1 | ManagerKind::None => MARGIN,
        }
    }
}

impl std::fmt::Display for ManagerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ladder_parameters() {
        let ms = Duration::from_millis;
        assert_eq!(ManagerKind::Systemd.kick_after(Some(ms(100))), ms(2100));
        assert_eq!(ManagerKind::Systemd.kick_after(Some(ms(300_000))), Duration::ZERO);
        assert_eq!(ManagerKind::Systemd.kick_after(None), Duration::ZERO);
        assert_eq!(ManagerKind::None.kick_after(None), MARGIN);
        assert!(ManagerKind::Launchd.needs_relaunch_ladder() && !ManagerKind::Systemd.needs_relaunch_ladder());
        assert_eq!(serde_json::to_value(ManagerKind::Scm).unwrap(), serde_json::json!("windows-service"));
        assert_eq!(serde_json::to_value(ManagerKind::TaskScheduler).unwrap(), serde_json::json!("task-scheduler"));
    }
}
