//! A thin `launchctl` wrapper over a [`CommandRunner`], plus the out-of-coalition helper.
//!
//! `bootout` kills the job's whole coalition, including a CLI started from inside the gateway
//! even after it re-parented to launchd (hermes #27592, #43842, #80491). The CLI therefore
//! never runs `bootout` + `bootstrap` itself when it might be inside the job: it submits
//! [`helper_script`] as a transient job (`launchctl submit`), which lives in its own
//! coalition, waits for the old process to exit, bootstraps until launchd reports a pid, and
//! removes itself.

use super::LaunchdTarget;
use super::print::{LaunchdPrint, parse_print};
use crate::command::sh_quote;
use crate::command::{CommandError, CommandOutput, CommandRunner};

/// `launchctl print` exit code for "Could not find service".
const NOT_FOUND: i32 = 113;
/// `launchctl bootstrap` exit code for EIO ("already loaded" or "cannot manage", #114893).
pub const EIO: i32 = 5;

/// A failed `launchctl` call.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LaunchctlError {
    /// `launchctl` could not be run.
    #[error("while running `launchctl {args}`: {source}")]
    Command {
        /// The arguments.
        args: String,
        /// What went wrong.
        #[source]
        source: CommandError,
    },
    /// `launchctl` ran and failed.
    #[error("`launchctl {args}` failed with exit code {code:?}: {stderr}")]
    Failed {
        /// The arguments.
        args: String,
        /// Exit code.
        code: Option<i32>,
        /// Standard error, trimmed.
        stderr: String,
    },
}

impl LaunchctlError {
    /// Whether this is `bootstrap`'s ambiguous EIO: the caller must check with `print`
    /// rather than conclude anything.
    #[must_use]
    pub fn is_eio(&self) -> bool {
        matches!(self, Self::Failed { code: Some(EIO), .. })
    }
}

/// `launchctl` for one target.
#[derive(Debug)]
pub struct Launchctl<'r, R: CommandRunner + ?Sized> {
    runner: &'r R,
}

impl<'r, R: CommandRunner + ?Sized> Launchctl<'r, R> {
    /// A wrapper running through `runner`.
    pub fn new(runner: &'r R) -> Self {
        Self { runner }
    }

    fn raw(&self, args: &[&str]) -> Result<CommandOutput, LaunchctlError> {
        self.runner.run("launchctl", args).map_err(|source| LaunchctlError::Command { args: args.join(" "), source })
    }

    fn checked(&self, args: &[&str]) -> Result<CommandOutput, LaunchctlError> {
        let out = self.raw(args)?;
        if out.success() {
            Ok(out)
        } else {
            Err(LaunchctlError::Failed { args: args.join(" "), code: out.code, stderr: out.stderr.trim().to_owned() })
        }
    }

    /// `print <service>`; `Ok(None)` when the label is not loaded.
    pub fn print(&self, t: &LaunchdTarget) -> Result<Option<LaunchdPrint>, LaunchctlError> {
        let service = t.service();
        let out = self.raw(&["print", &service])?;
        if out.success() {
            return Ok(Some(parse_print(&out.stdout)));
        }
        if out.code == Some(NOT_FOUND) || out.stderr.contains("Could not find service") {
            return Ok(None);
        }
        Err(LaunchctlError::Failed {
            args: format!("print {service}"),
            code: out.code,
            stderr: out.stderr.trim().to_owned(),
        })
    }

    /// `kickstart [-k] <service>`.
    pub fn kickstart(&self, t: &LaunchdTarget, kill: bool) -> Result<(), LaunchctlError> {
        let service = t.service();
        if kill {
            self.checked(&["kickstart", "-k", &service]).map(drop)
        } else {
            self.checked(&["kickstart", &service]).map(drop)
        }
    }

    /// `bootstrap <domain> <plist>`. See [`LaunchctlError::is_eio`].
    pub fn bootstrap(&self, t: &LaunchdTarget) -> Result<(), LaunchctlError> {
        self.checked(&["bootstrap", &t.domain(), &t.plist_path]).map(drop)
    }

    /// `bootout <service>`. Only from outside the job's coalition.
    pub fn bootout(&self, t: &LaunchdTarget) -> Result<(), LaunchctlError> {
        self.checked(&["bootout", &t.service()]).map(drop)
    }

    /// `submit -l <helper label> -- /bin/sh -c <helper_script>`: runs the bootout/bootstrap
    /// helper as its own job, outside the gateway's coalition.
    pub fn submit_helper(&self, helper_label: &str, script: &str) -> Result<(), LaunchctlError> {
        self.checked(&["submit", "-l", helper_label, "--", "/bin/sh", "-c", script]).map(drop)
    }
}

/// The label of the transient helper job for `target`.
#[must_use]
pub fn helper_label(t: &LaunchdTarget) -> String {
    format!("{}.reload-helper", t.label)
}

/// The `/bin/sh` script the helper job runs: bootout, wait (bounded) for `old_pid` to exit so
/// a bootstrap cannot start a second gateway beside a draining one, bootstrap until launchd
/// lists a pid (EIO and transient errors are retried, never read as "unsupported"), then
/// remove itself (`submit` jobs are kept alive otherwise). Bounded by `budget_s` overall.
#[must_use]
pub fn helper_script(t: &LaunchdTarget, old_pid: Option<u32>, budget_s: u64) -> String {
    let service = sh_quote(&t.service());
    let domain = sh_quote(&t.domain());
    let plist = sh_quote(&t.plist_path);
    let me = sh_quote(&helper_label(t));
    let pid = old_pid.unwrap_or(0);
    format!(
        "deadline=$(( $(date +%s) + {budget_s} ))\n\
         launchctl bootout {service} >/dev/null 2>&1\n\
         while [ {pid} -gt 0 ] && kill -0 {pid} 2>/dev/null && [ \"$(date +%s)\" -lt \"$deadline\" ]; do sleep 0.2; done\n\
         while :; do\n\
         \x20 launchctl bootstrap {domain} {plist} >/dev/null 2>&1\n\
         \x20 if launchctl print {service} 2>/dev/null | grep -Eq '^[[:space:]]*pid = [0-9]+'; then break; fi\n\
         \x20 launchctl kickstart {service} >/dev/null 2>&1\n\
         \x20 [ \"$(date +%s)\" -ge \"$deadline\" ] && break\n\
         \x20 sleep 0.5\n\
         done\n\
         launchctl remove {me}\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::ScriptedRunner;

    fn target() -> LaunchdTarget {
        LaunchdTarget::new(501, "ai.gatewarden.gateway", "/Users/a/Library/LaunchAgents/ai.gatewarden.gateway.plist")
    }

    #[test]
    fn print_maps_not_found_to_none() {
        let r = ScriptedRunner::new()
            .expect(
                "launchctl print gui/501/ai.gatewarden.gateway",
                CommandOutput::fail(113, "Could not find service \"ai.gatewarden.gateway\" in domain for port"),
            )
            .expect(
                "launchctl print gui/501/ai.gatewarden.gateway",
                CommandOutput::ok("gui/501/ai.gatewarden.gateway = {\n\tpid = 7\n}\n"),
            );
        let l = Launchctl::new(&r);
        assert_eq!(l.print(&target()).unwrap(), None);
        assert_eq!(l.print(&target()).unwrap().unwrap().pid, Some(7));
    }

    #[test]
    fn bootstrap_eio_is_recognisable() {
        let r = ScriptedRunner::new()
            .expect(
                "launchctl bootstrap gui/501 /Users/a/Library/LaunchAgents/ai.gatewarden.gateway.plist",
                CommandOutput::fail(5, "Bootstrap failed: 5: Input/output error"),
            )
            .expect("launchctl kickstart gui/501/ai.gatewarden.gateway", CommandOutput::ok(""))
            .expect("launchctl kickstart -k gui/501/ai.gatewarden.gateway", CommandOutput::ok(""));
        let l = Launchctl::new(&r);
        assert!(l.bootstrap(&target()).unwrap_err().is_eio());
        l.kickstart(&target(), false).unwrap();
        l.kickstart(&target(), true).unwrap();
        assert!(r.is_exhausted());
    }

    #[test]
    fn helper_script_waits_for_old_pid_and_removes_itself() {
        let s = helper_script(&target(), Some(4242), 130);
        assert!(s.contains("launchctl bootout gui/501/ai.gatewarden.gateway"));
        assert!(s.contains("kill -0 4242"));
        assert!(s.contains("+ 130 ))"));
        assert!(s.contains("launchctl bootstrap gui/501 /Users/a/Library/LaunchAgents/ai.gatewarden.gateway.plist"));
        assert!(s.trim_end().ends_with("launchctl remove ai.gatewarden.gateway.reload-helper"));
        // bootout comes before bootstrap, the wait in between.
        let (b, w, s2) = (s.find("bootout").unwrap(), s.find("kill -0").unwrap(), s.find("bootstrap").unwrap());
        assert!(b < w && w < s2);
    }

    #[test]
    fn helper_script_quotes_awkward_paths() {
        let t = LaunchdTarget::new(501, "x", "/Users/o'neil/Library/LaunchAgents/x.plist");
        assert!(helper_script(&t, None, 10).contains(r"'/Users/o'\''neil/Library/LaunchAgents/x.plist'"));
    }
}
