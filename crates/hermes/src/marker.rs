//! hermes's planned-stop marker, in hermes's exact format.
//!
//! hermes 0.19 (`gateway/status.py` `write_planned_stop_marker`) writes
//! `{"target_pid", "target_start_time", "stopper_pid", "written_at"}`. We write the same four
//! fields and nothing else:
//! - `written_at` always carries `+00:00`: hermes subtracts it from an aware `now`, and a
//!   naive timestamp raises, so the marker counts as stale and the stop as unplanned (exit 1).
//! - no `replacer_hermes_home`/home field: hermes compares that one byte for byte with its
//!   `$HERMES_HOME` (a trailing `/` is enough to make it ignore the marker).
//! - `target_start_time` is the kernel's value for the target; hermes compares it exactly
//!   where it can read its own (Linux), and ignores it elsewhere.

use std::io;
use std::time::SystemTime;

use gatewarden_lifecycle::fsio::{self, ReadOutcome};
use gatewarden_lifecycle::{ProcessIdentity, timefmt};
use serde::Serialize;

use crate::home::HermesHome;

#[derive(Debug, Serialize)]
struct PlannedStop<'a> {
    target_pid: u32,
    target_start_time: u64,
    stopper_pid: u32,
    written_at: &'a str,
}

/// The marker bytes naming `target`, written by `stopper_pid` at `now`.
pub fn render_planned_stop(target: ProcessIdentity, stopper_pid: u32, now: SystemTime) -> Vec<u8> {
    let written_at = timefmt::format(now);
    let m = PlannedStop {
        target_pid: target.pid,
        target_start_time: target.start_time,
        stopper_pid,
        written_at: &written_at,
    };
    // Serializing four plain fields cannot fail; an empty marker would simply be ignored.
    serde_json::to_vec(&m).unwrap_or_default()
}

/// Writes the marker atomically (a randomly named `O_EXCL|O_NOFOLLOW` temp file + rename:
/// hermes's watcher never reads a torn one), 0644 and owned by the home's owner: a root-owned
/// 0600 marker is unreadable to a user's hermes, which then treats the stop as unplanned
/// (hermes PR #24351). The home may be someone else's: nothing planted in it is followed.
pub fn write_planned_stop(home: &HermesHome, target: ProcessIdentity) -> io::Result<()> {
    let bytes = render_planned_stop(target, std::process::id(), SystemTime::now());
    let path = home.planned_stop_marker();
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or(".gateway-planned-stop.json");
    home.open_dir()?.write_atomic(name, &bytes, 0o644)
}

/// Whether a marker naming `target` is still in place (hermes unlinks it when its handler
/// consumes it, so "gone" means hermes acted on it).
pub fn planned_stop_names(home: &HermesHome, target: ProcessIdentity) -> bool {
    match fsio::read_json::<serde_json::Value>(&home.planned_stop_marker()) {
        ReadOutcome::Ok(v) => {
            v.get("target_pid").and_then(serde_json::Value::as_u64) == Some(u64::from(target.pid))
                && v.get("target_start_time").and_then(serde_json::Value::as_u64) == Some(target.start_time)
        }
        _ => false,
    }
}

/// A `written_at` without a UTC offset (what hermes rejects as stale).
pub fn is_naive_timestamp(s: &str) -> bool {
    timefmt::parse(s).is_none() && looks_like_datetime(s)
}

fn looks_like_datetime(s: &str) -> bool {
    let b = s.trim().as_bytes();
    b.len() >= 19 && b[4] == b'-' && b[7] == b'-' && (b[10] == b'T' || b[10] == b' ') && b[13] == b':'
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_hermes_fields_and_an_aware_timestamp() {
        let t = timefmt::parse("2026-11-30T15:28:04.758116+00:00").unwrap();
        let bytes = render_planned_stop(ProcessIdentity { pid: 15184, start_time: 451_406 }, 15450, t);
        assert_eq!(
            String::from_utf8(bytes).unwrap(),
            r#"{"target_pid":15184,"target_start_time":451406,"stopper_pid":15450,"written_at":"2026-11-30T15:28:04.758116+00:00"}"#
        );
    }

    #[cfg(unix)]
    #[test]
    fn the_marker_belongs_to_the_homes_owner_and_is_readable() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let dir = tempfile::tempdir().unwrap();
        let root = rustix::process::geteuid().is_root();
        if root {
            // A home owned by another user, as when root stops a user's hermes.
            rustix::fs::chown(dir.path(), Some(rustix::fs::Uid::from_raw(65534)), None).unwrap();
        }
        let home = HermesHome::at(dir.path());
        let target = ProcessIdentity { pid: 7, start_time: 8 };
        write_planned_stop(&home, target).unwrap();
        let meta = std::fs::metadata(home.planned_stop_marker()).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o644);
        assert_eq!(meta.uid(), std::fs::metadata(dir.path()).unwrap().uid());
        assert!(planned_stop_names(&home, target));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "no temp file left");
    }

    #[test]
    fn never_renders_a_naive_timestamp() {
        for secs in [0u64, 1, 1_796_052_350, 4_102_444_800] {
            let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_micros(secs * 1_000_000 + 123);
            let v: serde_json::Value =
                serde_json::from_slice(&render_planned_stop(ProcessIdentity { pid: 1, start_time: 2 }, 3, t)).unwrap();
            let w = v["written_at"].as_str().unwrap();
            assert!(w.ends_with("+00:00") && !is_naive_timestamp(w), "{w}");
            assert_eq!(v.as_object().unwrap().len(), 4);
        }
        assert!(is_naive_timestamp("2026-11-30T15:28:04.758116"));
        assert!(!is_naive_timestamp("2026-11-30T15:28:04Z"));
        assert!(!is_naive_timestamp("garbage"));
    }
}
