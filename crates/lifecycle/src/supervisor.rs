//! Who supervises this process — **proven, not guessed** (bug-classes D, E; hermes #62128,
//! #53861). A planned restart is an exit 75 for a manager only with evidence that the manager
//! will revive *this* process; an environment variable inherited from some other unit is not
//! evidence. Detection only chooses *who* performs a restart ([`RestartRoute`]); it never
//! changes the exit-code table.

use std::ffi::OsString;

use serde::{Deserialize, Serialize};

/// The environment variable that declares the supervisor (same values as `--supervisor`).
pub const SUPERVISOR_ENV: &str = "GATEWARDEN_SUPERVISOR";

/// What a service manager hands to the process it runs. A launcher (`gatewarden start`)
/// removes these from what it launches: they describe the launcher's unit, not the gateway's,
/// and a gateway notifying someone else's `NOTIFY_SOCKET` would confuse that unit.
pub const MANAGER_ENV: &[&str] = &[
    SUPERVISOR_ENV,
    "NOTIFY_SOCKET",
    "INVOCATION_ID",
    "SYSTEMD_EXEC_PID",
    "JOURNAL_STREAM",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "LISTEN_PID",
    "LISTEN_FDS",
    "LISTEN_FDNAMES",
    "XPC_SERVICE_NAME",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Supervisor {
    Systemd,
    Launchd,
    /// PID 1 of its PID namespace (a container's init): nothing revives it, so a planned
    /// restart re-executes in place.
    Container,
    /// Declared by the operator (`--supervisor external` or `GATEWARDEN_SUPERVISOR=external`),
    /// e.g. s6, runit, PM2 or `gatewarden supervise`.
    External,
    None,
}

/// Who sent a SIGTERM, as far as the owner's-stop rule asks (`si_pid` against our parent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TermSender {
    /// `si_pid` 0: a process outside our PID namespace (the container runtime, to its init)
    /// or the kernel.
    Outside,
    /// Our parent process: the supervisor that started us.
    Parent,
    /// Any other process: a stray `kill`, a script, another user's tool.
    Other,
}

impl TermSender {
    /// From the sender's pid (`None`: `si_pid` 0) and our parent's.
    pub fn of(sender: Option<u32>, parent: Option<u32>) -> TermSender {
        match sender {
            None => TermSender::Outside,
            Some(pid) if parent == Some(pid) => TermSender::Parent,
            Some(_) => TermSender::Other,
        }
    }
}

/// What a SIGTERM that no marker of ours explains means, by who supervises us and who sent it:
/// the one table (crates/runtime/README.md, "SIGTERM"). The gateway's own verbs never send a bare
/// SIGTERM (the stopper writes a marker first), so a bare one comes from outside, and it is the
/// owner's stop only when it comes from the owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BareTerm {
    /// The owner of the process stops it: a container runtime (`docker stop`, `podman stop`, a
    /// pod deletion) to its PID 1, or a declared supervisor (s6, runit). A planned stop (exit 0)
    /// within the owner's grace time, and not the operator's durable `stopped`: the owner keeps
    /// the desired state, so its next start runs.
    OwnerStop {
        /// Who, in the ledger's words (`stop_requested`'s `by`).
        by: &'static str,
    },
    /// Nobody we know of: an unexpected signal (exit 1), which a manager revives.
    Unexpected,
}

/// Who starts the next incarnation of a planned restart: the one decision table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartRoute {
    /// Exit 75; the manager relaunches (and the requester's backstop verifies it did).
    ExitForManager,
    /// Same pid, new image (`exec`), listener kept: nothing else would revive PID 1.
    ReexecInPlace,
    /// Start a successor in its own session that inherits the listener and waits for the lock.
    SpawnSuccessor,
}

impl Supervisor {
    pub fn as_str(self) -> &'static str {
        match self {
            Supervisor::Systemd => "systemd",
            Supervisor::Launchd => "launchd",
            Supervisor::Container => "container",
            Supervisor::External => "external",
            Supervisor::None => "none",
        }
    }

    /// The one parser for `--supervisor` and `GATEWARDEN_SUPERVISOR`.
    pub fn parse(s: &str) -> Option<Supervisor> {
        Some(match s.trim().to_ascii_lowercase().as_str() {
            "systemd" => Supervisor::Systemd,
            "launchd" => Supervisor::Launchd,
            "container" | "pid1" => Supervisor::Container,
            "external" | "supervised" => Supervisor::External,
            "none" | "" => Supervisor::None,
            _ => return None,
        })
    }

    pub fn route(self) -> RestartRoute {
        match self {
            Supervisor::Systemd | Supervisor::Launchd | Supervisor::External => RestartRoute::ExitForManager,
            Supervisor::Container => RestartRoute::ReexecInPlace,
            Supervisor::None => RestartRoute::SpawnSuccessor,
        }
    }

    /// What a bare SIGTERM from `from` means under this supervisor. A container's runtime
    /// signals its init from outside the PID namespace (or through an init of its own, our
    /// parent); a declared supervisor is our parent. Anyone else's SIGTERM (a stray `kill` of a
    /// supervised gateway, from inside the container) is nobody's plan, so the owner revives
    /// it. systemd and launchd stop through their own channels (our units stop with SIGINT,
    /// `KillSignal=SIGINT`); with none proven, a SIGTERM is nobody's plan either.
    pub fn bare_sigterm(self, from: TermSender) -> BareTerm {
        match (self, from) {
            (Supervisor::Container, TermSender::Outside | TermSender::Parent) => {
                BareTerm::OwnerStop { by: "container runtime" }
            }
            (Supervisor::External, TermSender::Parent) => BareTerm::OwnerStop { by: "declared supervisor" },
            (Supervisor::Container | Supervisor::External, _)
            | (Supervisor::Systemd | Supervisor::Launchd | Supervisor::None, _) => BareTerm::Unexpected,
        }
    }

    /// Whether a planned restart should be an exit 75 for the manager to act on.
    pub fn restarts_on_exit(self) -> bool {
        self.route() == RestartRoute::ExitForManager
    }

    /// Detects the supervisor of this process from the real environment.
    pub fn detect(declared: Option<Supervisor>) -> Detection {
        let pid = std::process::id();
        detect_with(&Facts {
            declared,
            env: &|k| std::env::var_os(k),
            pid,
            ppid: crate::platform::parent_pid(pid),
            systemd_main_pid: &crate::platform::systemd_main_pid,
        })
    }
}

/// The supervisor and the evidence for it, as `status --json` and `doctor` show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Detection {
    pub supervisor: Supervisor,
    pub evidence: String,
}

/// What detection looks at; injected so the decision is a pure, tested function.
pub struct Facts<'a> {
    /// `--supervisor`, which wins over everything.
    pub declared: Option<Supervisor>,
    pub env: &'a dyn Fn(&str) -> Option<OsString>,
    /// Our pid as our PID namespace sees it (1 when we are a container's init).
    pub pid: u32,
    pub ppid: Option<u32>,
    /// `MainPID` of the systemd unit whose cgroup we are in; asked only when needed.
    pub systemd_main_pid: &'a dyn Fn() -> Option<u32>,
}

/// Pure detection. Order: `--supervisor`, `GATEWARDEN_SUPERVISOR` (the same parser; a bad value
/// is ignored with a note), PID 1, systemd (`SYSTEMD_EXEC_PID` is our pid, or `NOTIFY_SOCKET` and
/// the unit's `MainPID` is us), launchd (`XPC_SERVICE_NAME` set, not `"0"`, and our parent is
/// launchd), none. `INVOCATION_ID` alone proves nothing: every child of a unit inherits it.
pub fn detect_with(f: &Facts<'_>) -> Detection {
    let found = |supervisor, evidence: String| Detection { supervisor, evidence };
    let set = |k: &str| (f.env)(k).filter(|v| !v.is_empty());
    let exec_pid = set("SYSTEMD_EXEC_PID").and_then(|v| v.to_string_lossy().trim().parse::<u32>().ok());
    if let Some(s) = f.declared {
        // The generated unit declares itself (crates/service/src/systemd/render.rs): say what
        // confirms it too.
        if s == Supervisor::Systemd && exec_pid == Some(f.pid) {
            return found(s, format!("declared by --supervisor; SYSTEMD_EXEC_PID={} is this process", f.pid));
        }
        return found(s, "declared by --supervisor".into());
    }
    let mut notes = Vec::new();
    if let Some(v) = set(SUPERVISOR_ENV) {
        match Supervisor::parse(&v.to_string_lossy()) {
            Some(s) => return found(s, format!("declared by {SUPERVISOR_ENV}")),
            None => notes.push(format!("ignored {SUPERVISOR_ENV}={:?} (not a supervisor name)", v.to_string_lossy())),
        }
    }
    if f.pid == 1 {
        return found(Supervisor::Container, "PID 1 of its PID namespace: restarts re-execute in place".into());
    }
    if exec_pid == Some(f.pid) {
        return found(Supervisor::Systemd, format!("SYSTEMD_EXEC_PID={} is this process", f.pid));
    }
    if set("NOTIFY_SOCKET").is_some() {
        match (f.systemd_main_pid)() {
            Some(main) if main == f.pid => {
                return found(Supervisor::Systemd, format!("NOTIFY_SOCKET set and the unit's MainPID is {main}"));
            }
            Some(main) => notes.push(format!("NOTIFY_SOCKET inherited: the unit's MainPID is {main}, not us")),
            None => notes.push("NOTIFY_SOCKET inherited from a unit that does not run us".into()),
        }
    } else if let Some(p) = exec_pid {
        notes.push(format!("SYSTEMD_EXEC_PID={p} inherited (not this process)"));
    } else if set("INVOCATION_ID").is_some() {
        notes.push("INVOCATION_ID inherited (not evidence of a unit that runs us)".into());
    }
    if let Some(name) = set("XPC_SERVICE_NAME").filter(|v| v != "0") {
        if f.ppid == Some(1) {
            return found(
                Supervisor::Launchd,
                format!("XPC_SERVICE_NAME={} and the parent is launchd", name.to_string_lossy()),
            );
        }
        notes.push(format!(
            "XPC_SERVICE_NAME={} inherited, but the parent (pid {}) is not launchd",
            name.to_string_lossy(),
            f.ppid.map_or("?".into(), |p| p.to_string())
        ));
    }
    let mut evidence = String::from("no service manager proven: a restart starts its successor itself");
    if !notes.is_empty() {
        evidence.push_str(" (");
        evidence.push_str(&notes.join("; "));
        evidence.push(')');
    }
    found(Supervisor::None, evidence)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detect_full(
        declared: Option<Supervisor>,
        vars: &[(&str, &str)],
        pid: u32,
        ppid: u32,
        main: Option<u32>,
    ) -> Detection {
        let env = |k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| OsString::from(v));
        let main_pid = move || main;
        detect_with(&Facts { declared, env: &env, pid, ppid: Some(ppid), systemd_main_pid: &main_pid })
    }

    fn detect(vars: &[(&str, &str)]) -> Supervisor {
        detect_full(None, vars, 4242, 77, None).supervisor
    }

    #[test]
    fn inherited_systemd_variables_are_not_evidence() {
        assert_eq!(detect(&[]), Supervisor::None);
        assert_eq!(detect(&[("INVOCATION_ID", "abc")]), Supervisor::None);
        assert_eq!(detect(&[("NOTIFY_SOCKET", "/run/x")]), Supervisor::None);
        assert_eq!(detect(&[("INVOCATION_ID", "abc"), ("SYSTEMD_EXEC_PID", "99")]), Supervisor::None);
        let d = detect_full(None, &[("NOTIFY_SOCKET", "/run/x")], 4242, 77, Some(99));
        assert_eq!(d.supervisor, Supervisor::None);
        assert!(d.evidence.contains("MainPID is 99"), "{}", d.evidence);
    }

    #[test]
    fn systemd_is_proven_by_exec_pid_or_main_pid() {
        assert_eq!(detect(&[("SYSTEMD_EXEC_PID", "4242")]), Supervisor::Systemd);
        let d = detect_full(None, &[("NOTIFY_SOCKET", "/run/x")], 4242, 1, Some(4242));
        assert_eq!(d.supervisor, Supervisor::Systemd);
    }

    #[test]
    fn launchd_needs_the_parent_to_be_launchd() {
        let v = [("XPC_SERVICE_NAME", "ai.gatewarden.gateway")];
        assert_eq!(detect_full(None, &v, 4242, 1, None).supervisor, Supervisor::Launchd);
        assert_eq!(detect_full(None, &v, 4242, 300, None).supervisor, Supervisor::None);
        assert_eq!(detect_full(None, &[("XPC_SERVICE_NAME", "0")], 4242, 1, None).supervisor, Supervisor::None);
        assert_eq!(detect_full(None, &[("XPC_SERVICE_NAME", "")], 4242, 1, None).supervisor, Supervisor::None);
    }

    #[test]
    fn pid_one_re_executes_in_place() {
        let d = detect_full(None, &[("INVOCATION_ID", "x")], 1, 0, None);
        assert_eq!(d.supervisor, Supervisor::Container);
        assert_eq!(d.supervisor.route(), RestartRoute::ReexecInPlace);
    }

    #[test]
    fn declarations_win_and_share_one_parser() {
        assert_eq!(
            detect(&[("GATEWARDEN_SUPERVISOR", "external"), ("SYSTEMD_EXEC_PID", "4242")]),
            Supervisor::External
        );
        assert_eq!(detect(&[("GATEWARDEN_SUPERVISOR", "supervised")]), Supervisor::External);
        assert_eq!(detect(&[("GATEWARDEN_SUPERVISOR", "none"), ("SYSTEMD_EXEC_PID", "4242")]), Supervisor::None);
        let d = detect_full(None, &[("GATEWARDEN_SUPERVISOR", "bogus"), ("SYSTEMD_EXEC_PID", "4242")], 4242, 1, None);
        assert_eq!(d.supervisor, Supervisor::Systemd);
        assert_eq!(detect_full(Some(Supervisor::Launchd), &[], 4242, 7, None).supervisor, Supervisor::Launchd);
        // The unit's own declaration wins over a manager-wide GATEWARDEN_SUPERVISOR=none, and
        // says what confirms it.
        let d = detect_full(
            Some(Supervisor::Systemd),
            &[("GATEWARDEN_SUPERVISOR", "none"), ("SYSTEMD_EXEC_PID", "4242")],
            4242,
            1,
            None,
        );
        assert_eq!(d.supervisor, Supervisor::Systemd);
        assert!(d.evidence.contains("SYSTEMD_EXEC_PID=4242 is this process"), "{}", d.evidence);
    }

    #[test]
    fn a_bare_sigterm_is_the_owners_stop_only_from_the_owner() {
        use TermSender::{Other, Outside, Parent};
        assert_eq!(TermSender::of(None, Some(7)), Outside, "si_pid 0");
        assert_eq!(TermSender::of(Some(7), Some(7)), Parent);
        assert_eq!(TermSender::of(Some(8), Some(7)), Other);
        assert_eq!(TermSender::of(Some(8), None), Other);
        let runtime = BareTerm::OwnerStop { by: "container runtime" };
        let pid1 = detect_full(None, &[], 1, 0, None).supervisor;
        assert_eq!(pid1.bare_sigterm(Outside), runtime, "the runtime, from outside the PID namespace");
        assert_eq!(pid1.bare_sigterm(Other), BareTerm::Unexpected, "a kill from inside the container");
        let declared = detect(&[("GATEWARDEN_SUPERVISOR", "container")]);
        assert_eq!(declared.bare_sigterm(Parent), runtime, "the container's own init, forwarding it");
        let external = detect(&[("GATEWARDEN_SUPERVISOR", "external")]);
        assert_eq!(external.bare_sigterm(Parent), BareTerm::OwnerStop { by: "declared supervisor" });
        for from in [Other, Outside] {
            assert_eq!(external.bare_sigterm(from), BareTerm::Unexpected, "a stray kill of a supervised child");
        }
        for s in [Supervisor::Systemd, Supervisor::Launchd, Supervisor::None] {
            for from in [Outside, Parent, Other] {
                assert_eq!(s.bare_sigterm(from), BareTerm::Unexpected, "{s:?} {from:?}");
            }
        }
        // Inherited unit variables prove nothing: still nobody's plan.
        assert_eq!(detect(&[("INVOCATION_ID", "abc")]).bare_sigterm(Parent), BareTerm::Unexpected);
    }

    #[test]
    fn routes() {
        assert_eq!(Supervisor::Systemd.route(), RestartRoute::ExitForManager);
        assert_eq!(Supervisor::External.route(), RestartRoute::ExitForManager);
        assert_eq!(Supervisor::None.route(), RestartRoute::SpawnSuccessor);
        assert!(!Supervisor::Container.restarts_on_exit());
    }
}
