//! The owners a running gateway declares instead of an installed definition (its state
//! record's `supervisor`, crates/lifecycle/src/supervisor.rs): `gatewarden supervise` or
//! another external supervisor, a container's PID 1 (which re-executes in place), or nobody.
//! None of them has a definition to install or check; a start they are asked for is a
//! direct start of `gatewarden start` in its own session.

use std::process::{Command, Stdio};

use gatewarden_lifecycle::platform::spawn;
use gatewarden_lifecycle::records::read_state;
use gatewarden_lifecycle::{Home, Supervisor};
use gatewarden_service::doctor::Finding;
use gatewarden_service::{ManagerKind, Scope, ServiceSpec};

use super::{Managed, Owner, ServiceManager, ServiceState};

/// The owner the gateway in `home` declared (`Unmanaged` when it declared none we act on).
pub fn declared(home: &Home) -> Owner {
    let declared = read_state(&home.state_file()).ok().and_then(|s| s.supervisor).and_then(|s| Supervisor::parse(&s));
    let kind = match declared {
        Some(Supervisor::External) => ManagerKind::Supervise,
        Some(Supervisor::Container) => ManagerKind::ContainerPid1,
        _ => ManagerKind::None,
    };
    let spec =
        super::spec_for(home, Scope::User).unwrap_or_else(|_| ServiceSpec::new(std::path::PathBuf::new(), home.dir()));
    let m = Managed { spec, state: ServiceState { manager: kind, ..ServiceState::default() } };
    let home = home.clone();
    match kind {
        ManagerKind::Supervise => std::sync::Arc::new(Supervised { m, home }),
        ManagerKind::ContainerPid1 => std::sync::Arc::new(ContainerPid1 { m, home }),
        _ => std::sync::Arc::new(Unmanaged { m, home }),
    }
}

fn no_definition<T>(kind: ManagerKind) -> crate::Result<T> {
    crate::bail!("a gateway owned by {kind} has no service definition; install one with `gatewarden service install`")
}

/// Implements [`ServiceManager`] for a runtime owner: no definition, a direct start.
macro_rules! runtime_owner {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone)]
        pub struct $name {
            m: Managed,
            home: Home,
        }

        impl ServiceManager for $name {
            fn managed(&self) -> &Managed {
                &self.m
            }
            fn render(&self) -> crate::Result<String> {
                no_definition(self.kind())
            }
            fn check_manager(&self) -> crate::Result<()> {
                no_definition(self.kind())
            }
            fn save(&self) -> crate::Result<super::Saved> {
                no_definition(self.kind())
            }
            fn load(&self) -> crate::Result<()> {
                no_definition(self.kind())
            }
            fn enable(&self) -> crate::Result<()> {
                no_definition(self.kind())
            }
            fn restore(&self, _saved: &super::Saved) -> crate::Result<()> {
                no_definition(self.kind())
            }
            fn remove(&self) -> crate::Result<()> {
                no_definition(self.kind())
            }
            fn query(&self) -> ServiceState {
                self.m.state.clone()
            }
            fn drift(&self) -> Vec<Finding> {
                Vec::new()
            }
            fn host_findings(&self) -> Vec<Finding> {
                Vec::new()
            }
            /// Nothing to ask: the caller's stopper (crates/control stopper) ends the gateway,
            /// and the supervisor sees a planned stop (exit 0) and stays down.
            fn stop(&self) -> crate::Result<()> {
                Ok(())
            }
            fn start(&self, on_behalf: u64) -> crate::Result<()> {
                start_directly(&self.home, on_behalf).map_err(crate::Error::msg)
            }
        }
    };
}

runtime_owner!(
    /// `gatewarden supervise` (or another external supervisor) runs the gateway as its child and
    /// restarts it after an exit 75.
    Supervised
);

runtime_owner!(
    /// The gateway is PID 1 of its PID namespace and re-executes in place for a restart.
    ContainerPid1
);

runtime_owner!(
    /// Nobody: the CLI starts and restarts the gateway.
    Unmanaged
);

/// `gatewarden start` as a detached child (its own session), so a restart keeps watching.
fn start_directly(home: &Home, seq: u64) -> Result<(), String> {
    let exe = super::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(exe);
    cmd.arg("--home").arg(home.dir()).arg("start").args(["--desired-seq", &seq.to_string()]);
    cmd.env_remove(crate::env::ORCHESTRATOR_ENV);
    // As the incarnation it replaces ran (previous.rs).
    cmd.args(crate::previous::of(home).args());
    cmd.env_remove(gatewarden_control::runs::RUN_TAG);
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    spawn::detach(&mut cmd, None);
    let child = cmd.spawn().map_err(|e| e.to_string())?;
    crate::intent::note_spawned(home, child.id());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_declared_supervisor_picks_the_owner() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::at(dir.path().to_owned());
        assert_eq!(declared(&home).kind(), ManagerKind::None, "no state record: nobody");
        for (sup, kind) in [
            ("external", ManagerKind::Supervise),
            ("container", ManagerKind::ContainerPid1),
            ("none", ManagerKind::None),
            ("systemd", ManagerKind::None),
        ] {
            let rec = serde_json::json!({"pid": 1, "gateway_state": "running", "supervisor": sup});
            std::fs::write(home.state_file(), rec.to_string()).unwrap();
            let o = declared(&home);
            assert_eq!(o.kind(), kind, "{sup}");
            assert!(o.load().is_err() && o.drift().is_empty() && o.stop().is_ok());
            assert!(!o.managed().state.installed);
        }
    }
}
