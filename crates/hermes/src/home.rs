//! A hermes home: selection and file names.
//!
//! The directory string is kept exactly as given: hermes compares `$HERMES_HOME` textually
//! (takeover markers, unit files), so the child we start must see the string the operator
//! gave. Canonical forms are for our own bookkeeping only.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use gatewarden_lifecycle::fsio::{self, ReadOutcome};

use crate::HERMES_KIND;
use crate::sys::HomeDir;

/// gatewarden's own folder inside a hermes home.
pub const OURS: &str = "gatewarden";
/// In [`OURS`]: the ledger of our actions, and a started hermes's stdout/stderr.
pub const ACTIONS_LEDGER: &str = "actions.jsonl";
pub const STDIO_LOG: &str = "gateway-stdio.log";
pub const PARKED_STATE: &str = "supervise_state.json";
/// hermes's records of its gateway (as a native home names them), relative to the home.
pub const PID_FILE: &str = "gateway.pid";
pub const STATE_FILE: &str = "gateway_state.json";
/// hermes's logs, relative to the home.
pub const GATEWAY_LOG: &str = "logs/gateway.log";
pub const HEARTBEAT: &str = "state/gateway.heartbeat";
pub const EXIT_DIAG_LOG: &str = "logs/gateway-exit-diag.log";

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
        self.dir.join(HEARTBEAT)
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
        self.dir.join(GATEWAY_LOG)
    }
    pub fn exit_diag_log(&self) -> PathBuf {
        self.dir.join(EXIT_DIAG_LOG)
    }
    /// gatewarden's own folder inside the home: never one of hermes's files.
    pub fn ours_dir(&self) -> PathBuf {
        self.dir.join(OURS)
    }
    /// Our ledger of the actions we took on this home.
    pub fn actions_ledger(&self) -> PathBuf {
        self.ours_dir().join(ACTIONS_LEDGER)
    }
    /// stdout/stderr of a hermes we started or supervise.
    pub fn stdio_log(&self) -> PathBuf {
        self.ours_dir().join(STDIO_LOG)
    }
    /// Why our supervisor parked, for `status` and `doctor`.
    pub fn parked_state(&self) -> PathBuf {
        self.ours_dir().join(PARKED_STATE)
    }

    /// The home's folder, held open: every file we read or write in the home goes through it
    /// (no links followed, regular files only, owners checked: [`crate::sys::HomeDir`]). The
    /// home may belong to someone less privileged than us.
    pub fn open_dir(&self) -> std::io::Result<HomeDir> {
        HomeDir::open(&self.dir)
    }

    /// `<home>/gatewarden/`, created 0700 for the home's owner when missing.
    pub fn open_ours(&self) -> std::io::Result<HomeDir> {
        self.open_dir()?.subdir(OURS, true)
    }

    /// Opens `rel` (`logs/gateway.log`, `gatewarden/actions.jsonl`) for reading, each folder
    /// and the file itself without following links. `Ok(None)`: it (or a folder) is missing.
    pub fn open_read(&self, rel: &str) -> std::io::Result<Option<std::fs::File>> {
        let mut parts: Vec<&str> = rel.split('/').filter(|p| !p.is_empty()).collect();
        let name = parts.pop().unwrap_or_default();
        let mut dir = match self.open_dir() {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            d => d?,
        };
        for p in parts {
            dir = match dir.subdir(p, false) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                d => d?,
            };
        }
        dir.open_read(name)
    }

    /// The home's owner (uid, gid); `Ok(None)` where the OS has no owners (Windows). A home
    /// that cannot be opened safely is an error, never "nobody": whoever runs something for
    /// it must know whom it runs as.
    pub fn owner(&self) -> std::io::Result<Option<(u32, u32)>> {
        Ok(self.open_dir()?.owner())
    }

    /// Refuses a home we must not act on (a link, a folder writable by group or others,
    /// gone), naming why: [`HomeDir::open`]'s rules.
    pub fn check(&self) -> std::io::Result<()> {
        self.open_dir().map(drop)
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
