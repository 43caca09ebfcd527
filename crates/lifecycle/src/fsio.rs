//! Atomic writes and lenient reads for the small files in the home.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::de::DeserializeOwned;

use crate::platform;

/// Files in the home are small; anything bigger is garbage, not something to load.
pub const MAX_RECORD_BYTES: u64 = 1 << 20;

/// Writes `bytes` to `path` atomically: a temp file in the same directory, fsync, rename,
/// fsync of the directory. Readers see the old content or the new, never a torn file.
pub fn atomic_write(path: &Path, bytes: &[u8]) -> io::Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp-{}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed)));
    let result = (|| {
        let mut f = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        platform::set_private_file(&f)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        rename_with_retry(&tmp, path)?;
        platform::sync_dir(dir);
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Windows refuses a rename over a file that another process (an antivirus scanner, a reader
/// without FILE_SHARE_DELETE) holds open; those windows are short, so retry briefly.
fn rename_with_retry(from: &Path, to: &Path) -> io::Result<()> {
    let mut delay = std::time::Duration::from_millis(5);
    for _ in 0..6 {
        match std::fs::rename(from, to) {
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied && cfg!(windows) => {
                std::thread::sleep(delay);
                delay *= 2;
            }
            other => return other,
        }
    }
    std::fs::rename(from, to)
}

/// Serializes `value` as compact JSON and writes it atomically.
pub fn write_json<T: serde::Serialize>(path: &Path, value: &T) -> io::Result<()> {
    let mut bytes = serde_json::to_vec(value).map_err(io::Error::other)?;
    bytes.push(b'\n');
    atomic_write(path, &bytes)
}

/// The outcome of reading a file that may be missing, damaged or foreign.
#[derive(Debug, Clone, PartialEq)]
pub enum ReadOutcome<T> {
    Missing,
    Ok(T),
    /// Present but not usable; the string says why, for humans.
    Unreadable(String),
}

impl<T> ReadOutcome<T> {
    pub fn ok(self) -> Option<T> {
        match self {
            ReadOutcome::Ok(v) => Some(v),
            _ => None,
        }
    }

    /// `ok`, `missing` or `unreadable: <why>`, as status reports it.
    pub fn describe(&self) -> String {
        match self {
            ReadOutcome::Missing => "missing".into(),
            ReadOutcome::Ok(_) => "ok".into(),
            ReadOutcome::Unreadable(why) => format!("unreadable: {why}"),
        }
    }
}

/// Reads at most [`MAX_RECORD_BYTES`] from `path`.
pub fn read_bytes(path: &Path) -> ReadOutcome<Vec<u8>> {
    let f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return ReadOutcome::Missing,
        Err(e) => return ReadOutcome::Unreadable(e.to_string()),
    };
    let mut buf = Vec::new();
    match f.take(MAX_RECORD_BYTES + 1).read_to_end(&mut buf) {
        Ok(_) if buf.len() as u64 > MAX_RECORD_BYTES => ReadOutcome::Unreadable("larger than 1 MiB".into()),
        Ok(_) => ReadOutcome::Ok(buf),
        Err(e) => ReadOutcome::Unreadable(e.to_string()),
    }
}

/// Parses bytes as a UTF-8 JSON value, naming what is wrong otherwise.
pub fn parse_json_value(bytes: &[u8]) -> Result<serde_json::Value, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| format!("not UTF-8 ({e})"))?;
    if text.trim().is_empty() {
        return Err("empty".into());
    }
    serde_json::from_str(text).map_err(|e| format!("not valid JSON ({e})"))
}

/// Reads and deserializes a JSON file leniently.
pub fn read_json<T: DeserializeOwned>(path: &Path) -> ReadOutcome<T> {
    match read_bytes(path) {
        ReadOutcome::Ok(bytes) => {
            match parse_json_value(&bytes).and_then(|v| serde_json::from_value(v).map_err(|e| e.to_string())) {
                Ok(v) => ReadOutcome::Ok(v),
                Err(why) => ReadOutcome::Unreadable(why),
            }
        }
        ReadOutcome::Missing => ReadOutcome::Missing,
        ReadOutcome::Unreadable(why) => ReadOutcome::Unreadable(why),
    }
}

/// Removes a file, treating "already gone" as success. Returns whether this call removed it.
pub fn remove_if_exists(path: &Path) -> io::Result<bool> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_and_leaves_no_temp_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.json");
        atomic_write(&p, b"one").unwrap();
        atomic_write(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn lenient_reads_name_the_problem() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s.json");
        assert_eq!(read_json::<serde_json::Value>(&p), ReadOutcome::Missing);
        for (bytes, needle) in [(&b""[..], "empty"), (b"\x17\x03\x03\xc7", "UTF-8"), (b"{\"pid\": 4", "JSON")] {
            std::fs::write(&p, bytes).unwrap();
            match read_json::<serde_json::Value>(&p) {
                ReadOutcome::Unreadable(why) => assert!(why.contains(needle), "{why}"),
                other => panic!("{other:?}"),
            }
        }
    }
}
