//! Filling a [`Snapshot`] from a home's files: the one call the runtime (or a fleet view
//! reading homes it does not run) makes. Every read goes through the lifecycle crate's
//! hostile-file rules (no links, no FIFOs, capped sizes); a file that cannot be read leaves its
//! part of the snapshot empty, and the page says so.

use std::time::SystemTime;

use gatewarden_control::proto::StatusReport;
use gatewarden_lifecycle::lock::{self, InstanceLock, LockProbe};
use gatewarden_lifecycle::records::read_state;
use gatewarden_lifecycle::{Home, desired, ledger, timefmt};

use crate::snapshot::{LockView, LogLine, Snapshot};

/// Ledger lines read for a page: enough for the last 50 incarnations at ~20 lines each, and
/// a bounded read however big the file (`ledger::MAX_TAIL_BYTES`).
pub const LEDGER_LINES: usize = 2000;

/// The snapshot of `home` around `status` (the caller's `StatusReport`: the running gateway's
/// own, or `status --json`'s), at `now`. The runtime adds runs, queue, log tail and the rest.
pub fn from_home(home: &Home, status: StatusReport, now: SystemTime) -> Snapshot {
    Snapshot {
        status,
        ledger: ledger::read_tail(&home.ledger(), Some(LEDGER_LINES)).ok().unwrap_or_default(),
        desired: desired::read(home.dir()).ok(),
        lock: lock_view(home),
        state_file: read_state(&home.state_file()).ok(),
        now_us: timefmt::to_micros(now),
        log_tail: log_tail(&home.logs_dir().join(LOG_FILE), crate::render::MAX_LOG_LINES),
        ..Snapshot::default()
    }
}

/// The update transaction's record (`<home>/update.json`, written by crates/ops/src/update):
/// its phase and versions; `committed` is blessed, a transaction still in probation is not yet.
pub fn update_view(home: &Home, version: &str) -> crate::snapshot::UpdateView {
    use gatewarden_lifecycle::fsio::{ReadOutcome, read_capped};
    let t = match read_capped(&home.dir().join("update.json"), 64 << 10) {
        ReadOutcome::Ok(b) => serde_json::from_slice::<serde_json::Value>(&b).ok(),
        _ => None,
    };
    let s = |k: &str| t.as_ref().and_then(|t| t.get(k)).and_then(|v| v.as_str()).map(str::to_owned);
    let phase = s("phase");
    let blessed = match phase.as_deref() {
        Some("committed") => Some(true),
        Some("rolled_back" | "failed") | None => None,
        Some(_) => Some(false),
    };
    crate::snapshot::UpdateView {
        version: version.to_owned(),
        last_from: s("from"),
        last_to: s("to"),
        last_phase: phase,
        blessed,
    }
}

/// The gateway's log file when it runs detached (`gatewarden start`, crates/ops/src/launch.rs).
pub const LOG_FILE: &str = "gateway.log";

/// The last `n` lines of a log file, read backwards a bounded amount (the ledger's tail
/// reader) through the no-link, regular-file-only open; none when it cannot be read.
pub fn log_tail(path: &std::path::Path, n: usize) -> Vec<LogLine> {
    let Some((mut f, len)) = gatewarden_lifecycle::fsio::open_regular(path).ok() else { return Vec::new() };
    let Ok(bytes) = ledger::tail_bytes(&mut f, len, Some(n)) else { return Vec::new() };
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].iter().map(|l| parse_log_line(l)).collect()
}

/// One line of the gateway's log (crates/runtime/src/log.rs): JSON (`level`, `msg`, `ts`),
/// `<ts> <level>: msg` or `<level>: msg`. Anything else is shown whole, level `info`. Pure.
pub fn parse_log_line(line: &str) -> LogLine {
    let (json, v) = read_log_line(line);
    let s = |k: &str| v.get(k).and_then(|v| v.as_str()).unwrap_or_default().to_owned();
    let level = Some(s("level")).filter(|l| !l.is_empty()).unwrap_or_else(|| "info".into());
    if json {
        let ts = s("ts");
        let text = if ts.is_empty() { s("msg") } else { format!("{ts} {}", s("msg")) };
        return LogLine { level, text };
    }
    LogLine { level, text: line.to_owned() }
}

/// One line of the gateway's log as an object (`logs --json`): a JSON line's own fields; a
/// plain line's `ts` (when stamped), `level` and `msg`, null where the line has none; always
/// `text`, the line itself. Pure.
pub fn log_line_json(line: &str) -> serde_json::Value {
    read_log_line(line).1
}

/// [`log_line_json`], and whether the line was written in the JSON format.
fn read_log_line(line: &str) -> (bool, serde_json::Value) {
    use serde_json::{Value, json};
    const LEVELS: [&str; 5] = ["error", "warn", "info", "debug", "trace"];
    if let Ok(Value::Object(mut m)) = serde_json::from_str::<Value>(line) {
        m.insert("text".into(), json!(line));
        return (true, Value::Object(m));
    }
    let (ts, rest) = match line.split_once(' ') {
        Some((ts, rest)) if timefmt::parse(ts).is_some() => (Some(ts), rest),
        _ => (None, line),
    };
    let v = match rest.split_once(": ").filter(|(level, _)| LEVELS.contains(level)) {
        Some((level, msg)) => json!({"ts": ts, "level": level, "msg": msg, "text": line}),
        None => json!({"ts": null, "level": null, "msg": null, "text": line}),
    };
    (false, v)
}

/// What the OS lock says: the kernel's holder where it names one (Linux `/proc/locks`),
/// otherwise a probe (which holds a free lock for an instant, as `status` does).
pub fn lock_view(home: &Home) -> LockView {
    match lock::holder_pids(&home.lock()) {
        Some(pids) if !pids.is_empty() => LockView::Held { pid: pids.first().copied() },
        Some(_) => LockView::Free,
        None => match InstanceLock::probe(&home.lock()) {
            LockProbe::Held => LockView::Held { pid: None },
            LockProbe::Free(_) | LockProbe::Missing => LockView::Free,
            LockProbe::Error(_) => LockView::Unknown,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A home whose files are links, FIFOs or huge: the snapshot is empty where they are, and
    /// gathering it neither follows a link nor blocks.
    #[cfg(unix)]
    #[test]
    fn hostile_home_files_leave_their_parts_empty() {
        let t = tempfile::tempdir().unwrap();
        let home = Home::at(t.path());
        let secret = t.path().join("secret");
        std::fs::write(&secret, include_str!("../tests/fixtures/start_stop_twice.jsonl")).unwrap();
        std::os::unix::fs::symlink(&secret, home.ledger()).unwrap();
        assert!(std::process::Command::new("mkfifo").arg(home.state_file()).status().unwrap().success());
        std::fs::File::create(desired::path(home.dir())).unwrap().set_len(1 << 30).unwrap();
        std::fs::create_dir_all(home.logs_dir()).unwrap();
        std::os::unix::fs::symlink(&secret, home.logs_dir().join(LOG_FILE)).unwrap();
        let s = from_home(&home, StatusReport::default(), SystemTime::now());
        assert!(s.ledger.is_empty() && s.state_file.is_none() && s.desired.is_none() && s.log_tail.is_empty());
        assert_eq!(s.lock, LockView::Free, "no lock file: nothing holds it");

        // The same ledger as a regular file is read.
        std::fs::remove_file(home.ledger()).unwrap();
        std::fs::copy(&secret, home.ledger()).unwrap();
        let s = from_home(&home, StatusReport::default(), SystemTime::now());
        assert_eq!(crate::timeline::incarnations(&s.ledger, None).len(), 2);
        // A held lock is seen as held, by this process.
        let _held = InstanceLock::try_acquire(&home.lock()).unwrap();
        let view = lock_view(&home);
        assert!(
            matches!(view, LockView::Held { pid: Some(p) } if p == std::process::id())
                || view == LockView::Held { pid: None },
            "{view:?}"
        );
    }

    #[test]
    fn log_lines_in_every_format() {
        let l = parse_log_line(r#"{"ts":"2026-12-01T10:00:00+00:00","level":"warn","msg":"slow"}"#);
        assert_eq!((l.level.as_str(), l.text.as_str()), ("warn", "2026-12-01T10:00:00+00:00 slow"));
        let l = parse_log_line("2026-12-01T14:51:34.717429+00:00 error: it broke: badly");
        assert_eq!(l.level, "error");
        assert_eq!(parse_log_line("debug: x").level, "debug");
        assert_eq!(parse_log_line("something else: entirely").level, "info");
        let plain = "2026-12-01T10:00:00.000001+00:00 warn: adapter tg: degraded [platform=tg]";
        let v = log_line_json(plain);
        assert_eq!((v["ts"].as_str(), v["level"].as_str()), (Some("2026-12-01T10:00:00.000001+00:00"), Some("warn")));
        assert_eq!((v["msg"].as_str(), v["text"].as_str()), (Some("adapter tg: degraded [platform=tg]"), Some(plain)));
        let j = r#"{"ts":"2026-12-01T10:00:00+00:00","level":"info","msg":"ready","message_id":"m1"}"#;
        let v = log_line_json(j);
        assert_eq!((v["message_id"].as_str(), v["text"].as_str()), (Some("m1"), Some(j)));
        let v = log_line_json("a stray line: with a colon");
        assert!(v["ts"].is_null() && v["level"].is_null() && v["text"] == "a stray line: with a colon");
    }

    #[test]
    fn log_tail_is_bounded_and_never_follows_links() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("gateway.log");
        let text: String = (0..500).map(|k| format!("info: line {k}\n")).collect();
        std::fs::write(&p, text).unwrap();
        let tail = log_tail(&p, 200);
        assert_eq!(tail.len(), 200);
        assert_eq!(tail[199].text, "info: line 499");
        assert!(log_tail(&t.path().join("missing.log"), 10).is_empty());
        #[cfg(unix)]
        {
            let link = t.path().join("link.log");
            std::os::unix::fs::symlink(&p, &link).unwrap();
            assert!(log_tail(&link, 10).is_empty());
        }
    }
}
