//! Atomic writes and lenient reads for the small files in the home.
//!
//! Every file in the home is opened through [`open_no_follow`]: a symlink planted in the home
//! (`gateway.lock -> /etc/shadow`) is refused, never followed. Every read goes through
//! [`read_capped`]: non-blocking, regular files only, size-capped, so a FIFO, a device or a
//! 1 GB file is reported as unreadable instead of hanging or exhausting memory.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
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
        // O_EXCL|O_NOFOLLOW: never write through anything planted at the temp name. The rename
        // below replaces a symlink at `path` rather than following it.
        let mut f = open_no_follow(&tmp, OpenOptions::new().write(true).create_new(true))?;
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

/// A file in the home is a symbolic link (or a Windows reparse point) and was not followed.
#[derive(Debug, thiserror::Error)]
#[error("{} is a symbolic link; refusing to follow it (a file in the gateway home must be a regular file)", path.display())]
pub struct LinkRefused {
    pub path: PathBuf,
}

/// Whether `e` is a [`LinkRefused`] from [`open_no_follow`].
pub fn is_link_refused(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<LinkRefused>())
}

/// Opens `path` with `opts`, refusing (with [`LinkRefused`]) to follow a symlink at the last
/// component. Non-blocking, so a FIFO planted at the name cannot hang the open; regular files
/// ignore the flag.
pub fn open_no_follow(path: &Path, opts: &OpenOptions) -> io::Result<File> {
    let mut opts = opts.clone();
    platform::no_follow(&mut opts, true);
    let refused = || io::Error::other(LinkRefused { path: path.to_owned() });
    match opts.open(path) {
        Ok(f) if platform::is_link(&f) => Err(refused()),
        Ok(f) => Ok(f),
        Err(e) if platform::link_refused(&e) => Err(refused()),
        Err(e) => Err(e),
    }
}

/// Opens a home file for appending (ledger, logs), creating it 0600, never through a symlink.
pub fn open_append(path: &Path) -> io::Result<File> {
    let f = open_no_follow(path, OpenOptions::new().create(true).append(true))?;
    let meta = f.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::other(format!("{} is not a regular file", path.display())));
    }
    if meta.len() == 0 {
        // Just created (or empty): private like every other file in the home.
        let _ = platform::set_private_file(&f);
    }
    Ok(f)
}

/// The outcome of reading a file that may be missing, damaged or foreign.
#[derive(Debug, Clone, PartialEq)]
pub enum ReadOutcome<T> {
    Missing,
    Ok(T),
    /// Present but not usable (bad content, not a regular file, a symlink, too big); the
    /// string says why, for humans. Healers may remove such a file.
    Unreadable(String),
    /// Could not be read for a reason that says nothing about the file (no free file
    /// descriptors, no memory): try again later, never remove it as bad.
    Transient(String),
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
            ReadOutcome::Transient(why) => format!("not readable right now: {why}"),
        }
    }

    /// Keeps `Missing`, `Unreadable` and `Transient`, for callers that parse the bytes.
    pub fn map<U>(self, f: impl FnOnce(T) -> ReadOutcome<U>) -> ReadOutcome<U> {
        match self {
            ReadOutcome::Ok(v) => f(v),
            ReadOutcome::Missing => ReadOutcome::Missing,
            ReadOutcome::Unreadable(why) => ReadOutcome::Unreadable(why),
            ReadOutcome::Transient(why) => ReadOutcome::Transient(why),
        }
    }
}

/// Opens a home file for reading, for callers that read it their own way (the ledger's
/// tail): non-blocking, never through a symlink, regular files only. `Ok` carries the file
/// and its size.
pub fn open_regular(path: &Path) -> ReadOutcome<(File, u64)> {
    let f = match open_no_follow(path, OpenOptions::new().read(true)) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return ReadOutcome::Missing,
        Err(e) if platform::is_transient(&e) => return ReadOutcome::Transient(e.to_string()),
        Err(e) => return ReadOutcome::Unreadable(e.to_string()),
    };
    let meta = match f.metadata() {
        Ok(m) => m,
        Err(e) if platform::is_transient(&e) => return ReadOutcome::Transient(e.to_string()),
        Err(e) => return ReadOutcome::Unreadable(e.to_string()),
    };
    if !meta.is_file() {
        let what = if meta.is_dir() { "a directory" } else { "not a regular file (a FIFO, socket or device)" };
        return ReadOutcome::Unreadable(format!("{} is {what}", path.display()));
    }
    ReadOutcome::Ok((f, meta.len()))
}

/// Reads a whole home file of at most `cap` bytes (see [`open_regular`]). A bigger file is
/// refused from its size, before anything is allocated.
pub fn read_capped(path: &Path, cap: u64) -> ReadOutcome<Vec<u8>> {
    open_regular(path).map(|(f, len)| {
        if len > cap {
            return ReadOutcome::Unreadable(format!("{} is larger than {} bytes ({len})", path.display(), cap));
        }
        let mut buf = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
        // The size can grow after fstat: the cap holds for the read too.
        match f.take(cap + 1).read_to_end(&mut buf) {
            Ok(_) if buf.len() as u64 > cap => {
                ReadOutcome::Unreadable(format!("{} is larger than {} bytes", path.display(), cap))
            }
            Ok(_) => ReadOutcome::Ok(buf),
            Err(e) if platform::is_transient(&e) => ReadOutcome::Transient(e.to_string()),
            Err(e) => ReadOutcome::Unreadable(e.to_string()),
        }
    })
}

/// Reads a record-sized home file: at most [`MAX_RECORD_BYTES`] (see [`read_capped`]).
pub fn read_bytes(path: &Path) -> ReadOutcome<Vec<u8>> {
    read_capped(path, MAX_RECORD_BYTES)
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
    read_bytes(path).map(|bytes| {
        match parse_json_value(&bytes).and_then(|v| serde_json::from_value(v).map_err(|e| e.to_string())) {
            Ok(v) => ReadOutcome::Ok(v),
            Err(why) => ReadOutcome::Unreadable(why),
        }
    })
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

    #[cfg(unix)]
    #[test]
    fn symlinks_fifos_and_huge_files_are_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, b"{}").unwrap();
        let link = dir.path().join("link.json");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(matches!(read_bytes(&link), ReadOutcome::Unreadable(why) if why.contains("symbolic link")));
        let e = open_append(&link).unwrap_err();
        assert!(is_link_refused(&e), "{e}");
        atomic_write(&link, b"x").unwrap();
        // The rename replaced the link itself; the target is untouched.
        assert_eq!(std::fs::read(&target).unwrap(), b"{}");
        assert!(!std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());

        let fifo = dir.path().join("fifo.json");
        // mkfifo(1) exists on every Unix (rustix's mknodat does not build on macOS).
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        assert!(matches!(read_bytes(&fifo), ReadOutcome::Unreadable(why) if why.contains("FIFO")));

        let huge = dir.path().join("huge.toml");
        std::fs::File::create(&huge).unwrap().set_len(1 << 30).unwrap();
        assert!(matches!(read_bytes(&huge), ReadOutcome::Unreadable(why) if why.contains("larger")));
        assert!(matches!(read_bytes(dir.path()), ReadOutcome::Unreadable(why) if why.contains("directory")));
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
