//! `lifecycle.jsonl`: one JSON event per line, appended, rotated past 1 MiB.

use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use crate::lock::InstanceLock;
use crate::{fsio, timefmt};
use std::time::Duration;

/// Rotate the ledger past this size (one older generation is kept). The only size policy.
pub const ROTATE_BYTES: u64 = 1 << 20;

/// A tail read scans at most this much from the end: a planted or legacy 200 MB ledger (or
/// one giant line) costs a bounded read, never the whole file.
pub const MAX_TAIL_BYTES: u64 = 16 << 20;

/// Tail reads go backwards in chunks of this size.
const TAIL_CHUNK: u64 = 64 << 10;

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
    ///
    /// A line is written whole or not at all (issue 30, item 3): a write cut short (a full
    /// disk) is taken back, and a torn last line that an earlier writer left (it crashed, or
    /// an older version could not take it back) is cut off first and said so
    /// (`ledger_repaired`). Appenders take turns on `lifecycle.jsonl.lock` for that, so no line
    /// being written is taken for a torn one; readers never wait.
    pub fn append(&self, event: &str, fields: Value) -> io::Result<()> {
        // Patience for an appender that stopped in the middle of its turn (SIGSTOP): past it,
        // the line is appended as before, with no repair.
        let turn = InstanceLock::acquire(&turn_path(&self.path), TURN_PATIENCE).ok();
        // Never through a symlink: a planted `lifecycle.jsonl -> /etc/passwd` is refused.
        let mut f = fsio::open_append(&self.path)?;
        if f.metadata().is_ok_and(|m| m.len() > ROTATE_BYTES) {
            let _ = std::fs::rename(&self.path, self.path.with_extension("jsonl.1"));
            f = fsio::open_append(&self.path)?;
        }
        if turn.is_none() {
            // One write call per line: appends of this size are not interleaved.
            return f.write_all(&self.writer.render(event, fields)?);
        }
        let (len, cut) = repair_tail(&self.path, &f)?;
        let mut bytes = Vec::new();
        if cut > 0 {
            bytes = self.writer.render("ledger_repaired", json!({"cut_bytes": cut}))?;
        }
        bytes.extend_from_slice(&self.writer.render(event, fields)?);
        f.write_all(&bytes).inspect_err(|_| {
            // Whole or not at all: nobody else appends during our turn.
            let _ = f.set_len(len);
        })
    }
}

/// How long an append waits for its turn.
const TURN_PATIENCE: Duration = Duration::from_secs(1);

/// The lock appenders take turns on: `lifecycle.jsonl.lock`, never deleted.
fn turn_path(ledger: &Path) -> PathBuf {
    ledger.with_extension("jsonl.lock")
}

/// Cuts a torn last line (the file does not end with a newline) back to the last whole line;
/// the ledger's length afterwards and the bytes cut. A tail with no line end in its last
/// [`TAIL_CHUNK`] bytes is not a torn line (lines are far shorter): it is ended, not cut.
fn repair_tail(path: &Path, f: &std::fs::File) -> io::Result<(u64, u64)> {
    let len = f.metadata()?.len();
    if len == 0 {
        return Ok((0, 0));
    }
    let fsio::ReadOutcome::Ok((mut r, _)) = fsio::open_regular(path) else { return Ok((len, 0)) };
    // The usual case, a whole last line, costs one byte read.
    let mut last = [0u8; 1];
    r.seek(SeekFrom::Start(len - 1))?;
    r.read_exact(&mut last)?;
    if last[0] == b'\n' {
        return Ok((len, 0));
    }
    let from = len.saturating_sub(TAIL_CHUNK);
    let mut tail = vec![0; usize::try_from(len - from).unwrap_or(0)];
    r.seek(SeekFrom::Start(from))?;
    r.read_exact(&mut tail)?;
    let keep = match tail.iter().rposition(|&b| b == b'\n') {
        Some(i) => from + i as u64 + 1,
        None if from == 0 => 0,
        None => {
            let mut w = f;
            w.write_all(b"\n")?;
            return Ok((len + 1, 0));
        }
    };
    f.set_len(keep)?;
    Ok((keep, len - keep))
}

impl Writer {
    /// One ledger line (with its newline): `ts`, `event`, the writer's stamp, then `fields`
    /// (a JSON object, or null). Shared with ledgers kept elsewhere (a hermes home's).
    pub fn render(&self, event: &str, fields: Value) -> io::Result<Vec<u8>> {
        let mut obj = Map::new();
        obj.insert("ts".into(), json!(timefmt::now()));
        obj.insert("event".into(), json!(event));
        obj.insert("pid".into(), json!(self.pid));
        obj.insert("start_time".into(), json!(self.start_time));
        if let Some(inc) = &self.incarnation {
            obj.insert("incarnation".into(), json!(inc));
        }
        if let Value::Object(extra) = fields {
            obj.extend(extra);
        }
        let mut line = serde_json::to_vec(&Value::Object(obj)).map_err(io::Error::other)?;
        line.push(b'\n');
        Ok(line)
    }
}

/// One line of the ledger as read back.
#[derive(Debug, Clone, PartialEq)]
pub enum Line {
    Event(Map<String, Value>),
    /// Not a JSON object; the text is lossily decoded so it can be shown.
    Garbage(String),
}

/// Reads the last `n` lines (all when `None`), oldest first. Tolerates any bytes. Reads
/// backwards from the end, only as far as `n` lines need (at most [`MAX_TAIL_BYTES`]), through
/// the one read helper ([`fsio::open_regular`]): no symlinks, FIFOs or devices.
pub fn read_tail(path: &Path, n: Option<usize>) -> fsio::ReadOutcome<Vec<Line>> {
    fsio::open_regular(path).map(|(f, len)| match tail_lines(f, len, n) {
        Ok(lines) => fsio::ReadOutcome::Ok(lines),
        Err(e) => fsio::ReadOutcome::Unreadable(e.to_string()),
    })
}

/// The last `n` lines (all when `None`) of an open regular file of `len` bytes, oldest first,
/// read backwards as [`read_tail`] does. For files opened by other rules (a hermes home's).
pub fn tail_lines(mut f: impl Read + Seek, len: u64, n: Option<usize>) -> io::Result<Vec<Line>> {
    let bytes = tail_bytes(&mut f, len, n)?;
    let lines: Vec<&[u8]> = bytes.split(|&b| b == b'\n').filter(|l| !l.iter().all(u8::is_ascii_whitespace)).collect();
    let skip = n.map_or(0, |n| lines.len().saturating_sub(n));
    Ok(lines[skip..].iter().map(|l| parse_line(l)).collect())
}

/// The bytes of the last `n` complete lines (or of the last [`MAX_TAIL_BYTES`]), starting at a
/// line boundary (possibly a few lines more than `n`). Read backwards from `len`.
pub fn tail_bytes(f: &mut (impl Read + Seek), len: u64, n: Option<usize>) -> io::Result<Vec<u8>> {
    let floor = len.saturating_sub(MAX_TAIL_BYTES);
    let mut start = len;
    let mut buf: Vec<u8> = Vec::new();
    // A trailing newline ends the last line; it does not start another.
    let want = n.map(|n| n + 1);
    while start > floor {
        let next = start.saturating_sub(TAIL_CHUNK).max(floor);
        let mut chunk = vec![0; usize::try_from(start - next).unwrap_or(0)];
        f.seek(SeekFrom::Start(next))?;
        f.read_exact(&mut chunk)?;
        chunk.extend_from_slice(&buf);
        buf = chunk;
        start = next;
        let newlines = buf.iter().filter(|&&b| b == b'\n').count();
        if want.is_some_and(|w| newlines >= w) {
            break;
        }
    }
    if start > 0 {
        // Began mid-line: drop the partial first line.
        let cut = buf.iter().position(|&b| b == b'\n').map_or(buf.len(), |i| i + 1);
        buf.drain(..cut);
    }
    Ok(buf)
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

    #[test]
    fn a_torn_last_line_is_cut_at_the_next_append_and_said_so() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("lifecycle.jsonl");
        let l = Ledger::new(p.clone(), Writer { pid: 1, start_time: Some(2), incarnation: None });
        l.append("started", json!({})).unwrap();
        // What a write cut short by a full disk leaves.
        std::fs::OpenOptions::new().append(true).open(&p).unwrap().write_all(b"{\"ts\":\"2026-").unwrap();
        l.append("exited", json!({"code": 0})).unwrap();
        let lines = read_tail(&p, None).ok().unwrap();
        let events: Vec<&str> = lines
            .iter()
            .map(|l| match l {
                Line::Event(m) => m["event"].as_str().unwrap_or("?"),
                Line::Garbage(g) => panic!("a torn line was kept: {g:?}"),
            })
            .collect();
        assert_eq!(events, ["started", "ledger_repaired", "exited"]);
        assert!(matches!(&lines[1], Line::Event(m) if m["cut_bytes"] == 12));
        // A torn first line: the file is cut to nothing before the line.
        let q = dir.path().join("other.jsonl");
        std::fs::write(&q, b"{\"partial").unwrap();
        Ledger::new(q.clone(), Writer::current()).append("x", json!({})).unwrap();
        assert_eq!(read_tail(&q, None).ok().unwrap().len(), 2);
        let text = std::fs::read_to_string(&q).unwrap();
        assert!(text.lines().all(|l| serde_json::from_str::<Value>(l).is_ok()), "{text}");
    }

    #[test]
    fn tail_reads_only_what_it_needs_and_cuts_at_line_boundaries() {
        let mut text = Vec::new();
        for i in 0..50_000 {
            text.extend_from_slice(format!("{{\"event\":\"e{i}\"}}\n").as_bytes());
        }
        let len = text.len() as u64;
        let mut cur = std::io::Cursor::new(text);
        let got = tail_bytes(&mut cur, len, Some(2)).unwrap();
        assert!(got.ends_with(b"{\"event\":\"e49998\"}\n{\"event\":\"e49999\"}\n"));
        assert!(got.starts_with(b"{\"event\""), "starts at a line boundary");
        assert!(got.len() < 2 * TAIL_CHUNK as usize);
        let all = tail_bytes(&mut cur, len, None).unwrap();
        assert_eq!(all.len() as u64, len);
    }
}
