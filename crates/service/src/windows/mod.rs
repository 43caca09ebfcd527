//! Windows: the per-user scheduled task, the SCM service description, the stop state machine
//! and the pure parts of the SCM service host.
//!
//! Everything here is plain data and logic, tested on Linux; the Win32 calls live in
//! [`crate::windows_scm`].

pub mod stop;
pub mod task;

use std::time::Duration;

pub use stop::{Probe, StopConfig, StopMachine, StopOutcome, StopStep};
pub use task::{
    decode_task_xml, drift, element_text, render_task_xml, task_command, task_xml_utf16le, xml_escape, xml_unescape,
};

use crate::launchd::SUPERVISE_VERB;
use crate::spec::{ServiceSpec, SpecError, utf8};

/// Flag telling `gatewarden supervise` that it runs under the SCM and must enter the service
/// dispatcher ([`crate::windows_scm::run_service`]).
pub const SCM_FLAG: &str = "--scm";

/// Quotes one argument for `CommandLineToArgvW` / the MSVC runtime: quote when empty or when
/// it holds whitespace or `"`; inside quotes, backslashes are literal except before a `"`,
/// where they (and the quote) are escaped.
#[must_use]
pub fn quote_windows_arg(arg: &str) -> String {
    if !arg.is_empty() && !arg.contains([' ', '\t', '\n', '\u{b}', '"']) {
        return arg.to_owned();
    }
    let mut out = String::from("\"");
    let mut backslashes = 0usize;
    for c in arg.chars() {
        match c {
            '\\' => backslashes += 1,
            '"' => {
                out.extend(std::iter::repeat_n('\\', backslashes * 2 + 1));
                out.push('"');
                backslashes = 0;
            }
            _ => {
                out.extend(std::iter::repeat_n('\\', backslashes));
                out.push(c);
                backslashes = 0;
            }
        }
    }
    out.extend(std::iter::repeat_n('\\', backslashes * 2));
    out.push('"');
    out
}

/// What to register with the SCM for a system-scope install.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScmInstall {
    /// Service name (`gatewarden` / `gatewarden-<hash>`).
    pub name: String,
    /// Display name.
    pub display_name: String,
    /// Description shown in services.msc.
    pub description: String,
    /// Executable.
    pub exe: String,
    /// Launch arguments: `supervise --home H --scm …`.
    pub args: Vec<String>,
    /// Account (`None` = LocalSystem).
    pub account: Option<String>,
    /// Restart delays the SCM applies if the supervisor process itself fails.
    pub failure_restart_delays: Vec<Duration>,
    /// Failure counter reset period.
    pub failure_reset_period: Duration,
    /// Preshutdown timeout: how long Windows waits for our drain at shutdown.
    pub preshutdown_timeout: Duration,
}

/// The SCM registration for `spec`.
pub fn scm_install(spec: &ServiceSpec) -> Result<ScmInstall, SpecError> {
    spec.validate_windows()?;
    let exe = utf8("exe", &spec.exe)?;
    let home = utf8("home", &spec.home)?;
    let name = spec.names().windows_name();
    let mut args = vec![SUPERVISE_VERB.to_owned(), "--home".to_owned(), home.to_owned(), SCM_FLAG.to_owned()];
    args.extend(spec.extra_args.iter().cloned());
    Ok(ScmInstall {
        display_name: format!("gatewarden agent gateway ({name})"),
        description: format!("gatewarden agent gateway for {home}"),
        name,
        exe: exe.to_owned(),
        args,
        account: spec.run_as_user.clone(),
        failure_restart_delays: vec![Duration::from_secs(1), Duration::from_secs(5), Duration::from_secs(30)],
        failure_reset_period: Duration::from_secs(86_400),
        preshutdown_timeout: Duration::from_secs(spec.stop_timeout_s()),
    })
}

/// Progress reports while the service is stopping: the SCM considers a service hung when
/// neither its checkpoint nor its state changes within the wait hint, so each report bumps the
/// checkpoint and repeats a wait hint comfortably longer than the report interval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopPendingProgress {
    checkpoint: u32,
    /// Interval between reports.
    pub interval: Duration,
    /// Wait hint sent with each report.
    pub wait_hint: Duration,
}

impl Default for StopPendingProgress {
    fn default() -> Self {
        Self { checkpoint: 0, interval: Duration::from_secs(1), wait_hint: Duration::from_secs(10) }
    }
}

impl StopPendingProgress {
    /// The next report: `(checkpoint, wait_hint)`. Checkpoints start at 1 and never wrap to 0
    /// (0 means "no pending operation").
    pub fn next_report(&mut self) -> (u32, Duration) {
        self.checkpoint = self.checkpoint.checked_add(1).unwrap_or(1);
        (self.checkpoint, self.wait_hint)
    }
}

/// Maps a supervisor exit code to the SCM's `(win32 exit code, service-specific code)`:
/// 0 is `NO_ERROR`; anything else is `ERROR_SERVICE_SPECIFIC_ERROR` with the code, so the SCM
/// records a failure and applies its failure actions.
#[must_use]
pub fn scm_exit_code(code: i32) -> ScmExit {
    if code == 0 { ScmExit::NoError } else { ScmExit::ServiceSpecific(u32::from_ne_bytes(code.to_ne_bytes())) }
}

/// The SCM's view of an exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScmExit {
    /// `NO_ERROR`.
    NoError,
    /// `ERROR_SERVICE_SPECIFIC_ERROR` with this code.
    ServiceSpecific(u32),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_quoting_follows_argv_rules() {
        assert_eq!(quote_windows_arg("plain"), "plain");
        assert_eq!(quote_windows_arg(""), "\"\"");
        assert_eq!(quote_windows_arg(r"C:\Program Files\x"), r#""C:\Program Files\x""#);
        assert_eq!(quote_windows_arg(r"C:\dir with space\"), r#""C:\dir with space\\""#);
        assert_eq!(quote_windows_arg(r#"say "hi""#), r#""say \"hi\"""#);
        assert_eq!(quote_windows_arg(r#"a\"b c"#), r#""a\\\"b c""#);
        assert_eq!(quote_windows_arg(r"no\space\needed"), r"no\space\needed");
    }

    #[test]
    fn scm_install_runs_supervise_with_scm_flag() {
        let spec = ServiceSpec::new(r"C:\gw\gatewarden.exe", r"C:\ProgramData\gatewarden");
        let i = scm_install(&spec).unwrap();
        assert_eq!(i.args, ["supervise", "--home", r"C:\ProgramData\gatewarden", "--scm"]);
        assert!(i.name.starts_with("gatewarden-"));
        assert_eq!(i.preshutdown_timeout, Duration::from_secs(100));
        assert!(scm_install(&ServiceSpec::new("/usr/bin/gw", "/h")).is_err());
    }

    #[test]
    fn stop_pending_checkpoints_increase_from_one() {
        let mut p = StopPendingProgress::default();
        let reports: Vec<u32> = (0..4).map(|_| p.next_report().0).collect();
        assert_eq!(reports, [1, 2, 3, 4]);
        assert!(p.wait_hint > p.interval);
        let mut wrap = StopPendingProgress { checkpoint: u32::MAX, ..StopPendingProgress::default() };
        assert_eq!(wrap.next_report().0, 1);
    }

    #[test]
    fn exit_codes_map_to_scm() {
        assert_eq!(scm_exit_code(0), ScmExit::NoError);
        assert_eq!(scm_exit_code(78), ScmExit::ServiceSpecific(78));
        assert_eq!(scm_exit_code(-1), ScmExit::ServiceSpecific(u32::MAX));
    }
}
