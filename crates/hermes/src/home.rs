//! A hermes home: selection and file names.
//!
//! The directory string is kept exactly as given: hermes compares `$HERMES_HOME` textually
//! (takeover markers, unit files), so the child we start must see the string the operator
//! gave. Canonical forms are for our own bookkeeping only.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use gatewarden_lifecycle::fsio::{self, ReadOutcome};

use crate::HERMES_KIND;

/// The environment variable that selects a hermes home, like `--hermes-home`.
pub const HERMES_HOME_ENV: &str = "GATEWARDEN_HERMES_HOME";

/// A hermes gateway home (hermes's `$HERMES_HOME`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HermesHome {
    dir: PathBuf,
}

/// Why a directory is being managed as a hermes home.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SelectedBy {
    /// `--hermes-home DIR`.
    Flag,
    /// `GATEWARDEN_HERMES_HOME`.
    Env,
    /// `--home DIR` whose lock or pid record says `"kind": "hermes-gateway"`; the CLI says so.
    Recognised,
}

impl HermesHome {
    pub fn at(dir: impl Into<PathBuf>) -> HermesHome {
        HermesHome { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The exact `$HERMES_HOME` value for children and unit files.
    pub fn env_value(&self) -> &OsStr {
        self.dir.as_os_str()
    }

    /// The canonical path when it exists, for display and our own records.
    pub fn display(&self) -> String {
        self.as_lifecycle().canonical_string()
    }

    /// The same directory as a lifecycle home (identical names for lock, pid and state).
    pub fn as_lifecycle(&self) -> gatewarden_lifecycle::Home {
        gatewarden_lifecycle::Home::at(&self.dir)
    }

    pub fn lock(&self) -> PathBuf {
        self.as_lifecycle().lock()
    }
    pub fn pid_file(&self) -> PathBuf {
        self.as_lifecycle().pid_file()
    }
    pub fn state_file(&self) -> PathBuf {
        self.as_lifecycle().state_file()
    }
    pub fn heartbeat(&self) -> PathBuf {
        self.dir.join("state").join("gateway.heartbeat")
    }
    pub fn starts_log(&self) -> PathBuf {
        self.dir.join("gateway-starts.log")
    }
    pub fn planned_stop_marker(&self) -> PathBuf {
        self.as_lifecycle().marker(gatewarden_lifecycle::marker::MarkerKind::PlannedStop)
    }
    pub fn takeover_marker(&self) -> PathBuf {
        self.as_lifecycle().marker(gatewarden_lifecycle::marker::MarkerKind::Takeover)
    }
    pub fn restart_pending(&self) -> PathBuf {
        self.dir.join(".restart_pending.json")
    }
    pub fn logs_dir(&self) -> PathBuf {
        self.dir.join("logs")
    }
    pub fn gateway_log(&self) -> PathBuf {
        self.logs_dir().join("gateway.log")
    }
    pub fn exit_diag_log(&self) -> PathBuf {
        self.logs_dir().join("gateway-exit-diag.log")
    }
    /// gatewarden's own folder inside the home: never one of hermes's files.
    pub fn ours_dir(&self) -> PathBuf {
        self.dir.join("gatewarden")
    }
    /// Our ledger of the actions we took on this home.
    pub fn actions_ledger(&self) -> PathBuf {
        self.ours_dir().join("actions.jsonl")
    }
    /// stdout/stderr of a hermes we started or supervise.
    pub fn stdio_log(&self) -> PathBuf {
        self.ours_dir().join("gateway-stdio.log")
    }
    /// Why our supervisor parked, for `status` and `doctor`.
    pub fn parked_state(&self) -> PathBuf {
        self.ours_dir().join("supervise_state.json")
    }
}

/// Selects a hermes home: `--hermes-home`, else `GATEWARDEN_HERMES_HOME`, else `--home` when
/// that directory's records say hermes. `None`: manage it as a native home.
pub fn select(
    hermes_flag: Option<&Path>,
    home_flag: Option<&Path>,
    env: impl Fn(&str) -> Option<OsString>,
) -> Option<(HermesHome, SelectedBy)> {
    if let Some(p) = hermes_flag.filter(|p| !p.as_os_str().is_empty()) {
        return Some((HermesHome::at(p), SelectedBy::Flag));
    }
    if let Some(v) = env(HERMES_HOME_ENV).filter(|v| !v.is_empty()) {
        return Some((HermesHome::at(PathBuf::from(v)), SelectedBy::Env));
    }
    home_flag.filter(|p| is_hermes_home(p)).map(|p| (HermesHome::at(p), SelectedBy::Recognised))
}

/// Whether `dir`'s lock or pid record says `"kind": "hermes-gateway"`. Reads only.
pub fn is_hermes_home(dir: &Path) -> bool {
    ["gateway.lock", "gateway.pid", "gateway_state.json"]
        .iter()
        .any(|f| record_kind(&dir.join(f)).as_deref() == Some(HERMES_KIND))
}

fn record_kind(path: &Path) -> Option<String> {
    match fsio::read_json::<serde_json::Value>(path) {
        ReadOutcome::Ok(v) => v.get("kind").and_then(|k| k.as_str()).map(str::to_owned),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selection_order_and_recognition() {
        let dir = tempfile::tempdir().unwrap();
        let none = |_: &str| None;
        assert_eq!(select(None, Some(dir.path()), none), None);
        std::fs::write(dir.path().join("gateway.lock"), br#"{"pid": 5, "kind": "hermes-gateway", "start_time": 1}"#)
            .unwrap();
        let (h, by) = select(None, Some(dir.path()), none).unwrap();
        assert_eq!((h.dir(), by), (dir.path(), SelectedBy::Recognised));
        let env = |k: &str| (k == HERMES_HOME_ENV).then(|| OsString::from("/e"));
        assert_eq!(select(None, Some(dir.path()), env).unwrap().1, SelectedBy::Env);
        assert_eq!(select(Some(Path::new("/f")), None, env).unwrap(), (HermesHome::at("/f"), SelectedBy::Flag));
        // A native record is not hermes.
        std::fs::write(dir.path().join("gateway.lock"), br#"{"pid": 5, "kind": "gatewarden"}"#).unwrap();
        assert!(!is_hermes_home(dir.path()));
    }

    #[test]
    fn the_home_string_is_kept_verbatim() {
        let h = HermesHome::at("/srv/h/");
        assert_eq!(h.env_value(), OsStr::new("/srv/h/"));
        assert!(h.actions_ledger().starts_with("/srv/h/gatewarden"));
    }
}
