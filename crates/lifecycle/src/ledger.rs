//! `lifecycle.jsonl`: one JSON event per line, appended, rotated past 1 MiB.

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use crate::{fsio, timefmt};

/// Rotate the ledger past this size (one older generation is kept).
pub const ROTATE_BYTES: u64 = 1 << 20;

/// Who writes: stamped on every event.
#[derive(Debug, Clone)]
pub struct Writer {
    pub pid: u32,
    pub start_time: Option<u64>,
    pub incarnation: Option<String>,
}

impl Writer {
    /// The calling process, with no incarnation (CLI commands).
    pub fn current() -> Writer {
        let pid = std::process::id();
        Writer { pid, start_time: crate::platform::start_time(pid), incarnation: None }
    }
}

#[derive(Debug, Clone)]
pub struct Ledger {
    path: PathBuf,
    writer: Writer,
}

impl Ledger {
    pub fn new(path: PathBuf, writer: Writer) -> Ledger {
        Ledger { path, writer }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one event. `fields` must be a JSON object (or null); its keys are merged in.
    /// Errors are returned, not swallowed; callers that must not fail on a full disk log them.
    pub fn append(&self, event: &str, fields: Value) -> io::Result<()> {
        let mut obj = Map::new();
        obj.insert("ts".into(), json!(timefmt::now()));
        obj.insert("event".into(), json!(event));
        obj.insert("pid".into(), json!(self.writer.pid));
        obj.insert("start_time".into(), json!(self.writer.start_time));
        if let Some(inc) = &self.writer.incarnation {
            obj.insert("incarnation".into(), json!(inc));
        }
        if let Value::Object(extra) = fields {
            obj.extend(extra);
        }
        let mut line = serde_json::to_vec(&Value::Object(obj)).map_err(io::Error::other)?;
        line.push(b'\n');
        if std::fs::metadata(&self.path).is_ok_and(|m| m.len() > ROTATE_BYTES) {
            let _ = std::fs::rename(&self.path, self.path.with_extension("jsonl.1"));
        }
        let mut f = OpenOptions::new().create(true).append(true).open(&self.path)?;
        // One write call per line: appends of this size are not interleaved.
        f.write_all(&line)
    }
}

/// One line of the ledger as read back.
#[derive(Debug, Clone, PartialEq)]
pub enum Line {
    Event(Map<String, Value>),
    /// Not a JSON object; the text is lossily decoded so it can be shown.
    Garbage(String),
}

/// Reads the last `n` lines (all when `None`), oldest first. Tolerates any bytes.
pub fn read_tail(path: &Path, n: Option<usize>) -> fsio::ReadOutcome<Vec<Line>> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return fsio::ReadOutcome::Missing,
        Err(e) => return fsio::ReadOutcome::Unreadable(e.to_string()),
    };
    let lines: Vec<&[u8]> = bytes.split(|&b| b == b'\n').filter(|l| !l.iter().all(u8::is_ascii_whitespace)).collect();
    let skip = n.map_or(0, |n| lines.len().saturating_sub(n));
    fsio::ReadOutcome::Ok(lines[skip..].iter().map(|l| parse_line(l)).collect())
}

pub fn parse_line(l: &[u8]) -> Line {
    match std::str::from_utf8(l).ok().and_then(|s| serde_json::from_str::<Value>(s).ok()) {
        Some(Value::Object(m)) => Line::Event(m),
        _ => Line::Garbage(String::from_utf8_lossy(l).into_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn append_and_read_back_with_garbage() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("lifecycle.jsonl");
        let l = Ledger::new(p.clone(), Writer { pid: 1, start_time: Some(2), incarnation: Some("ab".into()) });
        l.append("started", json!({"argv": ["x"]})).unwrap();
        std::fs::OpenOptions::new().append(true).open(&p).unwrap().write_all(b"\xff\xfe garbage\n").unwrap();
        l.append("exited", json!({"code": 0})).unwrap();
        let lines = read_tail(&p, None).ok().unwrap();
        assert_eq!(lines.len(), 3);
        assert!(matches!(&lines[0], Line::Event(m) if m["event"] == "started" && m["incarnation"] == "ab"));
        assert!(matches!(&lines[1], Line::Garbage(s) if s.contains("garbage")));
        let last = read_tail(&p, Some(1)).ok().unwrap();
        assert!(matches!(&last[0], Line::Event(m) if m["code"] == 0));
    }
}
