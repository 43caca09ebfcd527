//! Who supervises this process. Detection only chooses *who* performs a restart; it never
//! changes the exit-code table.

use std::ffi::OsString;
use std::path::Path;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Supervisor {
    Systemd,
    Launchd,
    Container,
    /// Declared by the operator (`--supervisor external` or `GATEWARDEN_SUPERVISOR=external`),
    /// e.g. s6, runit, PM2 or `gatewarden supervise`.
    External,
    None,
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

    pub fn parse(s: &str) -> Option<Supervisor> {
        Some(match s.trim().to_ascii_lowercase().as_str() {
            "systemd" => Supervisor::Systemd,
            "launchd" => Supervisor::Launchd,
            "container" => Supervisor::Container,
            "external" | "supervised" => Supervisor::External,
            "none" | "" => Supervisor::None,
            _ => return None,
        })
    }

    /// Whether a planned restart should be an exit 75 for the manager to act on.
    pub fn restarts_on_exit(self) -> bool {
        !matches!(self, Supervisor::None)
    }

    /// Detects the supervisor from the real environment.
    pub fn detect(override_: Option<Supervisor>) -> Supervisor {
        detect_with(override_, |k| std::env::var_os(k), |p| p.exists())
    }
}

/// Pure detection. Order: explicit override, `GATEWARDEN_SUPERVISOR`, systemd
/// (`INVOCATION_ID` or `NOTIFY_SOCKET`), launchd (`XPC_SERVICE_NAME` set, not empty and not
/// `"0"`, which interactive macOS shells inherit), container (`/.dockerenv`,
/// `/run/.containerenv`), none.
pub fn detect_with(
    override_: Option<Supervisor>,
    env: impl Fn(&str) -> Option<OsString>,
    exists: impl Fn(&Path) -> bool,
) -> Supervisor {
    if let Some(s) = override_ {
        return s;
    }
    let set = |k: &str| env(k).filter(|v| !v.is_empty());
    if let Some(s) = set("GATEWARDEN_SUPERVISOR").and_then(|v| Supervisor::parse(&v.to_string_lossy())) {
        return s;
    }
    if set("INVOCATION_ID").is_some() || set("NOTIFY_SOCKET").is_some() {
        return Supervisor::Systemd;
    }
    if set("XPC_SERVICE_NAME").is_some_and(|v| v != "0") {
        return Supervisor::Launchd;
    }
    if exists(Path::new("/.dockerenv")) || exists(Path::new("/run/.containerenv")) {
        return Supervisor::Container;
    }
    Supervisor::None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detect(vars: &[(&str, &str)], files: &[&str]) -> Supervisor {
        detect_with(
            None,
            |k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| OsString::from(v)),
            |p| files.iter().any(|f| Path::new(f) == p),
        )
    }

    #[test]
    fn detection_table() {
        assert_eq!(detect(&[], &[]), Supervisor::None);
        assert_eq!(detect(&[("INVOCATION_ID", "abc")], &[]), Supervisor::Systemd);
        assert_eq!(detect(&[("NOTIFY_SOCKET", "/run/x")], &[]), Supervisor::Systemd);
        assert_eq!(detect(&[("XPC_SERVICE_NAME", "ai.gatewarden.gateway")], &[]), Supervisor::Launchd);
        assert_eq!(detect(&[("XPC_SERVICE_NAME", "0")], &[]), Supervisor::None);
        assert_eq!(detect(&[("XPC_SERVICE_NAME", "")], &[]), Supervisor::None);
        assert_eq!(detect(&[], &["/.dockerenv"]), Supervisor::Container);
        assert_eq!(detect(&[], &["/run/.containerenv"]), Supervisor::Container);
        assert_eq!(detect(&[("GATEWARDEN_SUPERVISOR", "external"), ("INVOCATION_ID", "x")], &[]), Supervisor::External);
        assert_eq!(detect(&[("GATEWARDEN_SUPERVISOR", "none"), ("INVOCATION_ID", "x")], &[]), Supervisor::None);
        assert_eq!(detect(&[("GATEWARDEN_SUPERVISOR", "bogus"), ("INVOCATION_ID", "x")], &[]), Supervisor::Systemd);
        assert_eq!(detect_with(Some(Supervisor::Launchd), |_| None, |_| false), Supervisor::Launchd);
    }
}
