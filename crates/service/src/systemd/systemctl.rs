//! A thin `systemctl [--user] …` wrapper over a [`CommandRunner`].
//!
//! Only the verbs the lifecycle needs. Per class D invariant 5, a CLI restart asks systemd
//! directly (`restart`, or `reset-failed` + `start`) and then verifies with [`Systemctl::show`];
//! it never waits for `Restart=` to notice an exit.

use super::show::{SHOW_PROPERTIES, UnitStatus, parse_show};
use crate::command::{CommandError, CommandOutput, CommandRunner};
use crate::spec::Scope;

/// A failed `systemctl` call.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SystemctlError {
    /// `systemctl` could not be run.
    #[error("while running `systemctl {args}`: {source}")]
    Command {
        /// The arguments.
        args: String,
        /// What went wrong.
        #[source]
        source: CommandError,
    },
    /// `systemctl` ran and failed.
    #[error("`systemctl {args}` failed with exit code {code:?}: {stderr}")]
    Failed {
        /// The arguments.
        args: String,
        /// Its exit code.
        code: Option<i32>,
        /// Its standard error, trimmed.
        stderr: String,
    },
}

/// Result of `systemctl is-active`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IsActive {
    /// `active` (or `reloading`).
    Active,
    /// `activating` / `deactivating`.
    Transitioning(String),
    /// `inactive`.
    Inactive,
    /// `failed`.
    Failed,
    /// Unknown unit or another answer.
    Other(String),
}

/// `systemctl` for one scope.
#[derive(Debug)]
pub struct Systemctl<'r, R: CommandRunner + ?Sized> {
    runner: &'r R,
    scope: Scope,
}

impl<'r, R: CommandRunner + ?Sized> Systemctl<'r, R> {
    /// A wrapper for the user (`--user`) or system manager.
    pub fn new(runner: &'r R, scope: Scope) -> Self {
        Self { runner, scope }
    }

    fn raw(&self, verb_args: &[&str]) -> Result<(String, CommandOutput), SystemctlError> {
        let mut args: Vec<&str> = Vec::with_capacity(verb_args.len() + 1);
        if self.scope == Scope::User {
            args.push("--user");
        }
        args.extend_from_slice(verb_args);
        let joined = args.join(" ");
        let out = self
            .runner
            .run("systemctl", &args)
            .map_err(|source| SystemctlError::Command { args: joined.clone(), source })?;
        Ok((joined, out))
    }

    fn checked(&self, verb_args: &[&str]) -> Result<CommandOutput, SystemctlError> {
        let (args, out) = self.raw(verb_args)?;
        if out.success() {
            Ok(out)
        } else {
            Err(SystemctlError::Failed { args, code: out.code, stderr: out.stderr.trim().to_owned() })
        }
    }

    /// `daemon-reload`: pick up a rewritten unit.
    pub fn daemon_reload(&self) -> Result<(), SystemctlError> {
        self.checked(&["daemon-reload"]).map(drop)
    }

    /// `enable <unit>`.
    pub fn enable(&self, unit: &str) -> Result<(), SystemctlError> {
        self.checked(&["enable", unit]).map(drop)
    }

    /// `disable <unit>`.
    pub fn disable(&self, unit: &str) -> Result<(), SystemctlError> {
        self.checked(&["disable", unit]).map(drop)
    }

    /// `start <unit>` (blocks until systemd reports the job done; `Type=notify` means ready).
    pub fn start(&self, unit: &str) -> Result<(), SystemctlError> {
        self.checked(&["start", unit]).map(drop)
    }

    /// `stop <unit>` (blocks for up to `TimeoutStopSec=`).
    pub fn stop(&self, unit: &str) -> Result<(), SystemctlError> {
        self.checked(&["stop", unit]).map(drop)
    }

    /// `restart <unit>`.
    pub fn restart(&self, unit: &str) -> Result<(), SystemctlError> {
        self.checked(&["restart", unit]).map(drop)
    }

    /// `reset-failed <unit>`: clears the failed state and the start-rate counter.
    pub fn reset_failed(&self, unit: &str) -> Result<(), SystemctlError> {
        self.checked(&["reset-failed", unit]).map(drop)
    }

    /// `show -p … <unit>`, parsed.
    pub fn show(&self, unit: &str) -> Result<UnitStatus, SystemctlError> {
        let out = self.checked(&["show", "-p", SHOW_PROPERTIES, unit])?;
        Ok(parse_show(&out.stdout))
    }

    /// `is-enabled <unit>`: whether it starts at boot or login (`enabled`,
    /// `enabled-runtime`). A non-zero exit is an answer here, not an error.
    pub fn is_enabled(&self, unit: &str) -> Result<bool, SystemctlError> {
        let (_, out) = self.raw(&["is-enabled", unit])?;
        Ok(matches!(out.stdout.lines().next().unwrap_or("").trim(), "enabled" | "enabled-runtime"))
    }

    /// `is-active <unit>`. A non-zero exit is an answer here, not an error.
    pub fn is_active(&self, unit: &str) -> Result<IsActive, SystemctlError> {
        let (_, out) = self.raw(&["is-active", unit])?;
        let word = out.stdout.lines().next().unwrap_or("").trim();
        Ok(match word {
            "active" | "reloading" => IsActive::Active,
            "activating" | "deactivating" => IsActive::Transitioning(word.to_owned()),
            "inactive" => IsActive::Inactive,
            "failed" => IsActive::Failed,
            other => IsActive::Other(other.to_owned()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{CommandOutput, ScriptedRunner};
    use crate::systemd::ActiveState;

    #[test]
    fn user_scope_passes_user_flag_and_parses_show() {
        let r = ScriptedRunner::new()
            .expect("systemctl --user daemon-reload", CommandOutput::ok(""))
            .expect("systemctl --user reset-failed gw.service", CommandOutput::ok(""))
            .expect("systemctl --user start gw.service", CommandOutput::ok(""))
            .expect(
                &format!("systemctl --user show -p {SHOW_PROPERTIES} gw.service"),
                CommandOutput::ok("MainPID=7\nActiveState=active\n"),
            );
        let sc = Systemctl::new(&r, Scope::User);
        sc.daemon_reload().unwrap();
        sc.reset_failed("gw.service").unwrap();
        sc.start("gw.service").unwrap();
        let st = sc.show("gw.service").unwrap();
        assert_eq!(st.main_pid, Some(7));
        assert_eq!(st.active_state, Some(ActiveState::Active));
        assert!(r.is_exhausted());
    }

    #[test]
    fn system_scope_has_no_user_flag_and_failures_are_typed() {
        let r = ScriptedRunner::new()
            .expect("systemctl enable gw.service", CommandOutput::ok(""))
            .expect("systemctl stop gw.service", CommandOutput::fail(5, "Unit gw.service not loaded.\n"))
            .expect(
                "systemctl is-active gw.service",
                CommandOutput { code: Some(3), stdout: "inactive\n".into(), stderr: String::new() },
            );
        let sc = Systemctl::new(&r, Scope::System);
        sc.enable("gw.service").unwrap();
        match sc.stop("gw.service") {
            Err(SystemctlError::Failed { code: Some(5), stderr, .. }) => {
                assert_eq!(stderr, "Unit gw.service not loaded.");
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(sc.is_active("gw.service").unwrap(), IsActive::Inactive);
    }

    #[test]
    fn is_enabled_reads_the_word_not_the_exit_code() {
        let r = ScriptedRunner::new()
            .expect("systemctl --user is-enabled a.service", CommandOutput::ok("enabled\n"))
            .expect(
                "systemctl --user is-enabled b.service",
                CommandOutput { code: Some(1), stdout: "disabled\n".into(), stderr: String::new() },
            );
        let sc = Systemctl::new(&r, Scope::User);
        assert!(sc.is_enabled("a.service").unwrap());
        assert!(!sc.is_enabled("b.service").unwrap());
    }

    #[test]
    fn runner_failure_is_a_command_error() {
        let r = ScriptedRunner::new();
        let sc = Systemctl::new(&r, Scope::User);
        assert!(matches!(sc.disable("x"), Err(SystemctlError::Command { .. })));
        assert!(matches!(sc.restart("x"), Err(SystemctlError::Command { .. })));
    }
}
