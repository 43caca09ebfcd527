//! `<home>/supervise_state.json`: why `supervise` parked, for `status` and `doctor`.
//!
//! Written atomically (temp file in the home, fsync, rename, fsync of the directory) like every
//! JSON file of the protocol; read leniently: missing, empty, truncated or non-JSON content is
//! a typed [`ParkedStateRead`] outcome, never an error that stops `status`.

use gatewarden_lifecycle::fsio::{self, ReadOutcome};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::ChildExit;

/// File name inside the home.
pub const PARKED_STATE_FILE: &str = "supervise_state.json";

/// Why the supervisor parked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ParkKind {
    /// The gateway exited 78.
    FatalConfig,
    /// The crash-loop brake tripped (written by versions before the brake kept retrying at the
    /// cap; still read, reported and cleared).
    CrashLoop,
}

/// The parked record.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ParkedState {
    /// Schema version (1).
    pub v: u32,
    /// `parked`.
    pub state: String,
    /// Why.
    pub kind: ParkKind,
    /// Human-readable reason.
    pub reason: String,
    /// The exit that triggered parking.
    pub last_exit: ChildExit,
    /// Restarts within the brake window at the time.
    pub restarts_in_window: u32,
    /// The supervisor's pid.
    pub supervisor_pid: u32,
    /// Canonical home.
    pub home: String,
    /// RFC 3339 UTC timestamp.
    pub parked_at: String,
}

impl ParkedState {
    /// A record stamped now.
    #[must_use]
    pub fn new(
        kind: ParkKind,
        reason: impl Into<String>,
        last_exit: ChildExit,
        restarts_in_window: u32,
        supervisor_pid: u32,
        home: impl Into<String>,
    ) -> Self {
        Self {
            v: 1,
            state: "parked".into(),
            kind,
            reason: reason.into(),
            last_exit,
            restarts_in_window,
            supervisor_pid,
            home: home.into(),
            parked_at: rfc3339_utc(SystemTime::now()),
        }
    }
}

/// Reading the parked state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParkedStateRead {
    /// No file: not parked.
    Missing,
    /// A valid record.
    Parked(ParkedState),
    /// A file that cannot be used.
    Unreadable(String),
}

/// Writing or clearing the parked state failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ParkedStateError {
    /// Serializing (should not happen).
    #[error("while serializing the parked state: {0}")]
    Serialize(#[from] serde_json::Error),
    /// File-system error.
    #[error("while {op} {path}: {source}")]
    Io {
        /// What we were doing.
        op: &'static str,
        /// Which path.
        path: PathBuf,
        /// OS error.
        #[source]
        source: std::io::Error,
    },
}

fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> ParkedStateError + use<> {
    let path = path.to_owned();
    move |source| ParkedStateError::Io { op, path, source }
}

/// Atomically writes `state` to `<home>/supervise_state.json`.
pub fn write_parked_state(home: &Path, state: &ParkedState) -> Result<(), ParkedStateError> {
    let body = serde_json::to_vec_pretty(state)?;
    let path = home.join(PARKED_STATE_FILE);
    let tmp = home.join(format!(".{PARKED_STATE_FILE}.tmp-{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        // Never through a symlink planted at the temp name; the rename replaces a link at
        // `path` rather than following it.
        let _ = fs::remove_file(&tmp);
        let mut f = fsio::open_no_follow(&tmp, OpenOptions::new().write(true).create_new(true))?;
        f.write_all(&body)?;
        f.write_all(b"\n")?;
        f.sync_all()
    };
    if let Err(e) = write() {
        let _ = fs::remove_file(&tmp);
        return Err(io("writing", &tmp)(e));
    }
    if let Err(e) = fs::rename(&tmp, &path) {
        let _ = fs::remove_file(&tmp);
        return Err(io("renaming onto", &path)(e));
    }
    // Directory fsync makes the rename durable on Unix; opening a directory fails on Windows,
    // where the rename is already durable enough, so errors are ignored.
    let _ = File::open(home).and_then(|d| d.sync_all());
    Ok(())
}

/// Reads `<home>/supervise_state.json` leniently.
#[must_use]
pub fn read_parked_state(home: &Path) -> ParkedStateRead {
    let path = home.join(PARKED_STATE_FILE);
    // The home's one read helper: no symlinks, FIFOs or devices, size-capped.
    let bytes = match gatewarden_lifecycle::fsio::read_bytes(&path) {
        ReadOutcome::Ok(b) => b,
        ReadOutcome::Missing => return ParkedStateRead::Missing,
        ReadOutcome::Unreadable(why) | ReadOutcome::Transient(why) => return ParkedStateRead::Unreadable(why),
    };
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return ParkedStateRead::Unreadable("empty file".into());
    }
    match serde_json::from_slice::<ParkedState>(&bytes) {
        Ok(s) => ParkedStateRead::Parked(s),
        Err(e) => ParkedStateRead::Unreadable(e.to_string()),
    }
}

/// Removes the parked state (on `start`, or when the supervisor runs a healthy child again).
/// A missing file is fine.
pub fn clear_parked_state(home: &Path) -> Result<(), ParkedStateError> {
    let path = home.join(PARKED_STATE_FILE);
    match fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io("removing", &path)(e)),
    }
}

/// RFC 3339 UTC with microseconds (`2026-11-29T15:04:05.123456+00:00`), the protocol's one
/// timestamp format (`gatewarden_lifecycle::timefmt`).
#[must_use]
pub fn rfc3339_utc(t: SystemTime) -> String {
    gatewarden_lifecycle::timefmt::format(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn rfc3339_formats_known_instants() {
        assert_eq!(rfc3339_utc(UNIX_EPOCH), "1970-01-01T00:00:00.000000+00:00");
        let t = UNIX_EPOCH + Duration::from_micros(1_795_791_845_123_456);
        assert_eq!(rfc3339_utc(t), "2026-11-27T15:04:05.123456+00:00");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(rfc3339_utc(leap), "2000-02-29T00:00:00.000000+00:00");
    }

    #[test]
    fn write_read_clear_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_parked_state(dir.path()), ParkedStateRead::Missing);
        let s = ParkedState::new(ParkKind::CrashLoop, "loop", ChildExit::Signal(9), 5, 77, "/h");
        write_parked_state(dir.path(), &s).unwrap();
        assert_eq!(read_parked_state(dir.path()), ParkedStateRead::Parked(s));
        // No temp files left behind.
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
        clear_parked_state(dir.path()).unwrap();
        clear_parked_state(dir.path()).unwrap();
        assert_eq!(read_parked_state(dir.path()), ParkedStateRead::Missing);
    }

    #[test]
    fn garbage_reads_as_unreadable() {
        let dir = tempfile::tempdir().unwrap();
        for junk in [&b""[..], b"  \n", b"{\"v\":1", b"\xff\xfe\x00", b"[]", b"{\"v\":1}"] {
            fs::write(dir.path().join(PARKED_STATE_FILE), junk).unwrap();
            assert!(matches!(read_parked_state(dir.path()), ParkedStateRead::Unreadable(_)), "{junk:?}");
        }
    }

    #[test]
    fn write_into_missing_home_is_a_typed_error() {
        let dir = tempfile::tempdir().unwrap();
        let s = ParkedState::new(ParkKind::FatalConfig, "78", ChildExit::Code(78), 0, 1, "/h");
        assert!(matches!(write_parked_state(&dir.path().join("nope"), &s), Err(ParkedStateError::Io { .. })));
    }
}
