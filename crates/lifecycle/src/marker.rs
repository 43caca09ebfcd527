//! Planned-stop and takeover markers.
//!
//! A marker is obeyed only by the incarnation it names (pid, start time, home, written after
//! that incarnation started). Any reader heals what it finds: stale, malformed, future-dated
//! markers, and markers naming a dead or recycled process, are removed; a marker for another
//! live process is left alone. See docs/protocol.md §2.3.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde_json::{Map, Value, json};

use crate::fsio::{self, ReadOutcome};
use crate::identity::ProcessIdentity;
use crate::liveness::Liveness;
use crate::timefmt;

/// Markers older than this are stale.
pub const MARKER_TTL: Duration = Duration::from_secs(60);
/// Tolerated clock skew before a marker counts as future-dated.
pub const FUTURE_SKEW: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkerKind {
    PlannedStop,
    Takeover,
}

impl MarkerKind {
    pub fn file_name(self) -> &'static str {
        match self {
            MarkerKind::PlannedStop => ".gateway-planned-stop.json",
            MarkerKind::Takeover => ".gateway-takeover.json",
        }
    }

    fn writer_prefix(self) -> &'static str {
        match self {
            MarkerKind::PlannedStop => "stopper",
            MarkerKind::Takeover => "replacer",
        }
    }
}

/// A parsed marker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marker {
    pub kind: MarkerKind,
    pub target_pid: u32,
    pub target_start_time: Option<u64>,
    pub home: Option<String>,
    pub writer_pid: Option<u32>,
    pub writer_argv: Vec<String>,
    pub written_at: SystemTime,
}

impl Marker {
    /// "pid 5151 (gatewarden stop)", for logs and the ledger.
    pub fn writer(&self) -> String {
        match (self.writer_pid, self.writer_argv.is_empty()) {
            (Some(pid), false) => format!("pid {pid} ({})", self.writer_argv.join(" ")),
            (Some(pid), true) => format!("pid {pid}"),
            (None, _) => "an unknown writer".into(),
        }
    }
}

/// Who is asking: the running gateway's own identity.
#[derive(Debug, Clone)]
pub struct SelfIdentity {
    pub pid: u32,
    pub start_time: Option<u64>,
    /// Canonical home, as stored in records.
    pub home: String,
    /// Wall clock when this incarnation started.
    pub started_at: SystemTime,
}

/// What reading a marker found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Absent,
    /// It names the asking incarnation.
    ForSelf(Marker),
    /// It names another live process (or another home); left in place.
    ForOther(Marker),
    /// It was bad and has been removed (or removal was attempted); never obeyed.
    Removed {
        why: String,
    },
    /// It could not be read for a reason that says nothing about it (no free file
    /// descriptors, no memory): it is kept, and the caller looks again later.
    Retry {
        why: String,
    },
}

/// How often and how long [`consume`] retries a marker it cannot open for lack of resources:
/// a SIGTERM is classified once, so a planned stop must not turn into "unexpected" because
/// an fd was briefly missing.
const TRANSIENT_RETRIES: u32 = 5;
const TRANSIENT_BACKOFF: Duration = Duration::from_millis(20);

/// Parses marker bytes. Total over arbitrary input.
pub fn parse(kind: MarkerKind, bytes: &[u8]) -> Result<Marker, String> {
    let v = fsio::parse_json_value(bytes)?;
    let obj = v.as_object().ok_or("not a JSON object")?;
    let target_pid =
        obj.get("target_pid").and_then(Value::as_i64).and_then(crate::probe::valid_pid).ok_or("no valid target_pid")?;
    let target_start_time = match obj.get("target_start_time").or_else(|| obj.get("start_time")) {
        None | Some(Value::Null) => None,
        Some(v) => Some(v.as_u64().ok_or("target_start_time is not a non-negative integer")?),
    };
    let home =
        ["home", "target_hermes_home"].iter().find_map(|k| obj.get(*k).and_then(Value::as_str)).map(str::to_owned);
    let prefix = kind.writer_prefix();
    let writer_pid = obj.get(&format!("{prefix}_pid")).and_then(Value::as_u64).and_then(|p| u32::try_from(p).ok());
    let writer_argv = obj
        .get(&format!("{prefix}_argv"))
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_owned)).collect())
        .unwrap_or_default();
    let written_at =
        obj.get("written_at").and_then(Value::as_str).and_then(timefmt::parse).ok_or("no parseable written_at")?;
    Ok(Marker { kind, target_pid, target_start_time, home, writer_pid, writer_argv, written_at })
}

/// Serializes a marker naming `target`, written by the current process.
pub fn render(kind: MarkerKind, target: ProcessIdentity, home: &str, now: SystemTime) -> Vec<u8> {
    let argv: Vec<String> = std::env::args_os().map(|a| a.to_string_lossy().into_owned()).collect();
    let prefix = kind.writer_prefix();
    let mut m = Map::new();
    m.insert("target_pid".into(), json!(target.pid));
    m.insert("target_start_time".into(), json!(target.start_time));
    m.insert("home".into(), json!(home));
    if kind == MarkerKind::Takeover {
        // hermes-agent reads these names.
        m.insert("target_hermes_home".into(), json!(home));
        m.insert("replacer_hermes_home".into(), json!(home));
    }
    m.insert(format!("{prefix}_pid"), json!(std::process::id()));
    m.insert(format!("{prefix}_argv"), json!(argv));
    m.insert("written_at".into(), json!(timefmt::format(now)));
    let mut bytes = serde_json::to_vec(&Value::Object(m)).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

/// Writes a marker naming `target` into `home_dir` atomically.
pub fn write(home_dir: &Path, kind: MarkerKind, target: ProcessIdentity, home: &str) -> std::io::Result<()> {
    fsio::atomic_write(&home_dir.join(kind.file_name()), &render(kind, target, home, SystemTime::now()))
}

/// Removes the marker if it still names `target` (the replacer's cleanup after a takeover).
pub fn clear_if_targets(home_dir: &Path, kind: MarkerKind, target: ProcessIdentity) {
    let path = home_dir.join(kind.file_name());
    if let ReadOutcome::Ok(bytes) = fsio::read_bytes(&path)
        && let Ok(m) = parse(kind, &bytes)
        && m.target_pid == target.pid
    {
        let _ = fsio::remove_if_exists(&path);
    }
}

/// Pure classification of a parsed marker from the point of view of `me` (or of a
/// bystander such as `status` when `me` is `None`). `live` probes the target pid.
pub fn classify(
    m: &Marker,
    me: Option<&SelfIdentity>,
    now: SystemTime,
    live: impl Fn(u32) -> Liveness,
) -> Result<bool, String> {
    if m.written_at > now + FUTURE_SKEW {
        return Err(format!("written_at is in the future ({})", timefmt::format(m.written_at)));
    }
    if now.duration_since(m.written_at).is_ok_and(|age| age > MARKER_TTL) {
        return Err(format!("stale (written {})", timefmt::format(m.written_at)));
    }
    if let Some(me) = me.filter(|me| me.pid == m.target_pid) {
        if m.home.as_deref().is_some_and(|h| h != me.home) {
            // Same pid number, another home: not ours to obey or to delete.
            return Ok(false);
        }
        if let (Some(theirs), Some(mine)) = (m.target_start_time, me.start_time)
            && theirs != mine
        {
            return Err(format!("names pid {} with start {theirs}, a previous process", m.target_pid));
        }
        if m.written_at < me.started_at {
            return Err("written before this gateway started (left for a predecessor)".into());
        }
        return Ok(true);
    }
    match live(m.target_pid) {
        Liveness::Dead => Err(format!("names pid {}, which is not running", m.target_pid)),
        Liveness::Alive { start_time: Some(t) } if m.target_start_time.is_some_and(|want| want != t) => {
            Err(format!("names pid {} with another start time (pid recycled)", m.target_pid))
        }
        // Alive (or unknowable): someone else's marker, leave it.
        _ => Ok(false),
    }
}

/// Non-destructive for a marker naming `me` or another live process; removes bad markers.
pub fn probe(home_dir: &Path, kind: MarkerKind, me: Option<&SelfIdentity>, live: impl Fn(u32) -> Liveness) -> Verdict {
    let path = home_dir.join(kind.file_name());
    let bytes = match fsio::read_bytes(&path) {
        ReadOutcome::Missing => return Verdict::Absent,
        ReadOutcome::Ok(b) => b,
        ReadOutcome::Unreadable(why) => {
            let _ = fsio::remove_if_exists(&path);
            return Verdict::Removed { why };
        }
        ReadOutcome::Transient(why) => return Verdict::Retry { why },
    };
    verdict_for(&path, kind, &bytes, me, live)
}

fn verdict_for(
    path: &Path,
    kind: MarkerKind,
    bytes: &[u8],
    me: Option<&SelfIdentity>,
    live: impl Fn(u32) -> Liveness,
) -> Verdict {
    let m = match parse(kind, bytes) {
        Ok(m) => m,
        Err(why) => {
            let _ = fsio::remove_if_exists(path);
            return Verdict::Removed { why: format!("malformed: {why}") };
        }
    };
    match classify(&m, me, SystemTime::now(), live) {
        Ok(true) => Verdict::ForSelf(m),
        Ok(false) => Verdict::ForOther(m),
        Err(why) => {
            let _ = fsio::remove_if_exists(path);
            Verdict::Removed { why }
        }
    }
}

/// Atomically takes a marker naming `me`: rename to a private name (only one reader can win
/// the rename), re-check that copy, remove it. Returns the marker if it was ours.
/// A marker that cannot be read for lack of resources is retried a few times, briefly, and
/// never removed.
pub fn consume(home_dir: &Path, kind: MarkerKind, me: &SelfIdentity, live: impl Fn(u32) -> Liveness) -> Option<Marker> {
    let mut tries = 0;
    loop {
        match probe(home_dir, kind, Some(me), &live) {
            Verdict::ForSelf(_) => break,
            Verdict::Retry { .. } if tries < TRANSIENT_RETRIES => {
                tries += 1;
                std::thread::sleep(TRANSIENT_BACKOFF * tries);
            }
            _ => return None,
        }
    }
    let path = home_dir.join(kind.file_name());
    let private: PathBuf = home_dir.join(format!("{}.consumed-{}", kind.file_name(), me.pid));
    std::fs::rename(&path, &private).ok()?;
    let mut tries = 0;
    let bytes = loop {
        match fsio::read_bytes(&private) {
            ReadOutcome::Transient(_) if tries < TRANSIENT_RETRIES => {
                tries += 1;
                std::thread::sleep(TRANSIENT_BACKOFF * tries);
            }
            ReadOutcome::Transient(_) => {
                // Still no resources: put it back for the next look rather than lose it.
                let _ = std::fs::rename(&private, &path);
                return None;
            }
            other => break other.ok(),
        }
    };
    let _ = fsio::remove_if_exists(&private);
    let m = parse(kind, &bytes?).ok()?;
    matches!(classify(&m, Some(me), SystemTime::now(), live), Ok(true)).then_some(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me(home: &str) -> SelfIdentity {
        SelfIdentity {
            pid: 100,
            start_time: Some(5000),
            home: home.into(),
            started_at: SystemTime::now() - Duration::from_secs(10),
        }
    }

    fn raw(target_pid: i64, start: Option<u64>, home: Option<&str>, written_at: SystemTime) -> Vec<u8> {
        let mut m = Map::new();
        m.insert("target_pid".into(), json!(target_pid));
        m.insert("target_start_time".into(), json!(start));
        if let Some(h) = home {
            m.insert("home".into(), json!(h));
        }
        m.insert("stopper_pid".into(), json!(77));
        m.insert("written_at".into(), json!(timefmt::format(written_at)));
        serde_json::to_vec(&Value::Object(m)).unwrap()
    }

    fn dead(_: u32) -> Liveness {
        Liveness::Dead
    }

    fn setup(bytes: &[u8]) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(MarkerKind::PlannedStop.file_name());
        std::fs::write(&p, bytes).unwrap();
        (dir, p)
    }

    #[test]
    fn obeys_only_its_own_incarnation() {
        let now = SystemTime::now();
        let (dir, p) = setup(&raw(100, Some(5000), Some("/h"), now));
        assert!(matches!(probe(dir.path(), MarkerKind::PlannedStop, Some(&me("/h")), dead), Verdict::ForSelf(_)));
        assert!(p.exists(), "probe must not consume");
        let m = consume(dir.path(), MarkerKind::PlannedStop, &me("/h"), dead).unwrap();
        assert_eq!(m.writer(), "pid 77");
        assert!(!p.exists());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn hermes_marker_without_home_or_start_time_is_honoured_if_written_after_start() {
        let (dir, _) = setup(&raw(100, None, None, SystemTime::now()));
        assert!(consume(dir.path(), MarkerKind::PlannedStop, &me("/h"), dead).is_some());
    }

    #[test]
    fn predecessor_stale_future_and_recycled_markers_are_removed() {
        let now = SystemTime::now();
        let cases = [
            raw(100, Some(4999), None, now),                             // our pid, previous process
            raw(100, None, None, now - Duration::from_secs(20)),         // before our start
            raw(100, Some(5000), None, now - Duration::from_secs(120)),  // stale
            raw(100, Some(5000), None, now + Duration::from_secs(3600)), // future
            raw(555, Some(1), None, now),                                // dead target
            b"\x17\x03\x03\xc7".to_vec(),
            b"{\"target_pid\": 0, \"written_at\": \"x\"}".to_vec(),
            b"[]".to_vec(),
        ];
        for bytes in cases {
            let (dir, p) = setup(&bytes);
            let v = probe(dir.path(), MarkerKind::PlannedStop, Some(&me("/h")), dead);
            assert!(matches!(v, Verdict::Removed { .. }), "{:?} -> {v:?}", String::from_utf8_lossy(&bytes));
            assert!(!p.exists());
            assert!(consume(dir.path(), MarkerKind::PlannedStop, &me("/h"), dead).is_none());
        }
    }

    #[test]
    fn marker_for_another_live_process_or_home_is_left_alone() {
        let now = SystemTime::now();
        let alive = |_| Liveness::Alive { start_time: Some(42) };
        let (dir, p) = setup(&raw(555, Some(42), None, now));
        assert!(matches!(probe(dir.path(), MarkerKind::PlannedStop, Some(&me("/h")), alive), Verdict::ForOther(_)));
        assert!(p.exists());
        let (dir, p) = setup(&raw(100, Some(5000), Some("/other"), now));
        assert!(matches!(probe(dir.path(), MarkerKind::PlannedStop, Some(&me("/h")), dead), Verdict::ForOther(_)));
        assert!(p.exists());
        // A recycled pid (alive, other start time) is healed.
        let (dir, p) = setup(&raw(555, Some(41), None, now));
        assert!(matches!(probe(dir.path(), MarkerKind::PlannedStop, None, alive), Verdict::Removed { .. }));
        assert!(!p.exists());
    }

    #[test]
    fn rendered_markers_parse_back_for_both_kinds() {
        let target = ProcessIdentity { pid: 9, start_time: 8 };
        for kind in [MarkerKind::PlannedStop, MarkerKind::Takeover] {
            let m = parse(kind, &render(kind, target, "/h", SystemTime::now())).unwrap();
            assert_eq!((m.target_pid, m.target_start_time, m.home.as_deref()), (9, Some(8), Some("/h")));
            assert_eq!(m.writer_pid, Some(std::process::id()));
            assert!(!m.writer_argv.is_empty());
        }
    }

    /// Finding 3 of issue 8: with no free file descriptor, a marker for us is kept (Retry), not
    /// removed as bad. Exhausts this process's fds, so it needs a process of its own: nextest
    /// (the suite's runner, scripts/test) gives every test one.
    #[cfg(unix)]
    #[test]
    fn a_marker_unreadable_for_lack_of_fds_is_kept() {
        use rustix::process::{Resource, getrlimit, setrlimit};
        if std::env::var_os("NEXTEST_RUN_ID").is_none() {
            eprintln!("skipped: exhausting fds needs a process per test (run it under cargo nextest)");
            return;
        }
        let (dir, p) = setup(&raw(100, Some(5000), Some("/h"), SystemTime::now()));
        let saved = getrlimit(Resource::Nofile);
        setrlimit(Resource::Nofile, rustix::process::Rlimit { current: Some(64), maximum: saved.maximum }).unwrap();
        let mut hog = Vec::new();
        while let Ok(f) = std::fs::File::open("/dev/null") {
            hog.push(f);
        }
        let verdict = probe(dir.path(), MarkerKind::PlannedStop, Some(&me("/h")), dead);
        drop(hog);
        setrlimit(Resource::Nofile, saved).unwrap();
        assert!(matches!(verdict, Verdict::Retry { .. }), "{verdict:?}");
        assert!(p.exists(), "a transient failure must not remove the marker");
        assert!(consume(dir.path(), MarkerKind::PlannedStop, &me("/h"), dead).is_some());
    }

    proptest::proptest! {
        #[test]
        fn parser_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..200)) {
            let _ = parse(MarkerKind::PlannedStop, &bytes);
            let _ = parse(MarkerKind::Takeover, &bytes);
        }

        #[test]
        fn parser_never_panics_on_jsonish(pid in proptest::num::i64::ANY, st in proptest::option::of(proptest::num::i64::ANY), w in ".{0,40}") {
            let s = json!({"target_pid": pid, "target_start_time": st, "written_at": w}).to_string();
            let _ = parse(MarkerKind::PlannedStop, s.as_bytes());
        }
    }
}
