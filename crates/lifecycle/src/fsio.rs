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

use crate::platform::{self, AclTag, Credentials, NodeFacts, NodeKind};

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
        let mut f = create_private(&tmp)?;
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

/// Bytes kept allocated beside each record that must be writable on a full disk
/// ([`write_json_reserved`]): one block of most filesystems, more than such a record takes, and
/// what the record it replaces gives back, so the reserve is made again even on a disk still
/// full.
pub const RESERVE_BYTES: usize = 4 << 10;

/// Whether `e` says the disk (or the user's quota) is full.
pub fn is_no_space(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded)
}

/// `.<name>.reserve` beside `path`: the space [`write_json_reserved`] falls back on.
pub fn reserve_path(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    path.with_file_name(format!(".{name}.reserve"))
}

/// [`write_json`] for a record that must land even on a full disk (the operator's stop in
/// `desired_state.json`, the update transaction): when the atomic write finds no space, the
/// bytes go over the start of the record's reserve, a file of [`RESERVE_BYTES`] whose blocks
/// were allocated while there was room, which is then cut to their length, synced and renamed
/// over `path` — atomic still, and no new block is needed (except on a copy-on-write
/// filesystem, btrfs or ZFS, which allocates anew for every write: there it fails as before).
/// The reserve is made again by the next write that has room.
pub fn write_json_reserved<T: serde::Serialize>(path: &Path, value: &T) -> io::Result<()> {
    let mut bytes = serde_json::to_vec(value).map_err(io::Error::other)?;
    bytes.push(b'\n');
    let written = match atomic_write(path, &bytes) {
        Err(e) if is_no_space(&e) => write_over_reserve(path, &bytes)
            .map_err(|r| io::Error::new(e.kind(), format!("{e}; the space reserved for it: {r}"))),
        other => other,
    };
    if written.is_ok() {
        // Best effort: on a disk still full, the next write that has room makes it.
        let _ = ensure_reserve(path);
    }
    written
}

fn write_over_reserve(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let reserve = reserve_path(path);
    let mut f = open_no_follow(&reserve, OpenOptions::new().write(true))?;
    let meta = f.metadata()?;
    if !meta.is_file() || meta.len() < bytes.len() as u64 {
        return Err(io::Error::other(format!("{} is not a reserve of {RESERVE_BYTES} bytes", reserve.display())));
    }
    // Over blocks already allocated: nothing new is needed until the rename frees the old ones.
    f.write_all(bytes)?;
    f.set_len(bytes.len() as u64)?;
    f.sync_all()?;
    drop(f);
    rename_with_retry(&reserve, path)?;
    platform::sync_dir(path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")));
    Ok(())
}

/// Makes the reserve of `path` ([`write_json_reserved`]) unless it is there: written data,
/// never a hole (a sparse or all-zero file may own no block), through a temporary file and a
/// rename, so a half-made reserve is never taken for one.
pub fn ensure_reserve(path: &Path) -> io::Result<()> {
    let reserve = reserve_path(path);
    if std::fs::symlink_metadata(&reserve).is_ok_and(|m| m.is_file() && m.len() >= RESERVE_BYTES as u64) {
        return Ok(());
    }
    // Bytes no filesystem compresses away: xorshift, seeded by the address of the buffer.
    let mut buf = vec![0u8; RESERVE_BYTES];
    let mut x = (buf.as_ptr() as u64) | 1;
    for b in &mut buf {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = (x >> 24) as u8;
    }
    atomic_write(&reserve, &buf)
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

/// Creates the new file `path` for writing: 0600 from the first instant (the mode it is created
/// with, not a chmod after), never an existing file, never through a symlink (issue 31 §2: a
/// file created with the umask's mode, then narrowed, was read by a user watching with inotify).
pub fn create_private(path: &Path) -> io::Result<File> {
    let mut opts = OpenOptions::new();
    opts.write(true).create_new(true);
    platform::private_on_create(&mut opts);
    open_no_follow(path, &opts)
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
    open_regular(path).map(|(f, len)| read_open(path, f, len, cap))
}

fn read_open(path: &Path, f: File, len: u64, cap: u64) -> ReadOutcome<Vec<u8>> {
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
}

/// The largest file holding secrets that is read (a token, a password, `secrets.env`).
pub const MAX_SECRET_BYTES: u64 = 64 << 10;

/// Why a file holding secrets must not be used, or `None`. Pure. Another local user must be
/// able neither to plant the value nor to read it, while what a correctly configured
/// deployment makes is taken as it is (docs/security.md, "Secret files"):
///
/// - owned by us, or by root (who can read it anyway: a systemd credential, a Kubernetes
///   Secret volume's files);
/// - writable by nobody but its owner, readable by no "other";
/// - readable by its group only when that group is one of ours (a Secret volume's `fsGroup`,
///   `defaultMode: 0440`); with a POSIX ACL the group bits are its mask, so the entries decide:
///   a named user may only be us (systemd's credential of a `User=` unit: 0400 root plus
///   `user:<us>:r`), a group only one of ours.
pub fn secret_file_insecurity(f: &NodeFacts, me: &Credentials) -> Option<String> {
    if f.kind != NodeKind::File {
        return Some("it is not a regular file".into());
    }
    if f.owner != me.uid && f.owner != 0 {
        return Some(format!("it is owned by uid {}, not by uid {} or root (chown it)", f.owner, me.uid));
    }
    if f.mode & 0o022 != 0 {
        return Some(format!("it is writable by group or others (mode {:o}; chmod 400 it)", f.mode));
    }
    if f.mode & 0o004 != 0 {
        return Some(format!("it is readable by others (mode {:o}; chmod 600 it)", f.mode));
    }
    if f.mode & 0o040 == 0 {
        return None;
    }
    let ours = |g: u32| me.groups.contains(&g);
    let group_refused = |g: u32| {
        format!(
            "it is readable by group {g}, which uid {} is not in (mode {:o}; chmod 600 it, or give it a group of yours)",
            me.uid, f.mode
        )
    };
    let Some(acl) = &f.acl else {
        return (!ours(f.group)).then(|| group_refused(f.group));
    };
    let mask = acl.iter().find(|e| e.tag == AclTag::Mask).map_or(0o7, |e| e.perm);
    for e in acl.iter().filter(|e| e.perm & mask & 0o4 != 0) {
        match e.tag {
            AclTag::User if e.id != me.uid && e.id != 0 => {
                return Some(format!("its ACL lets uid {} read it (setfacl -b it)", e.id));
            }
            AclTag::Group if !ours(e.id) => {
                return Some(format!("its ACL lets group {} read it (setfacl -b it)", e.id));
            }
            AclTag::GroupObj if !ours(f.group) => return Some(group_refused(f.group)),
            _ => {}
        }
    }
    None
}

/// Why a folder or a symbolic link on the way to a secret must not be passed, or `None`.
/// Pure. Whoever can change a folder on the way, or made a link there, could put another
/// file in the secret's place: each must be ours or root's, and a folder writable by group or
/// others only with the sticky bit (`/tmp`; a Secret volume's tmpfs), where nobody else can
/// replace what root or we made in it.
pub fn secret_way_insecurity(n: &NodeFacts, me: &Credentials) -> Option<String> {
    let what = match n.kind {
        NodeKind::Dir => "a folder on the way to a secret",
        NodeKind::Link => "a symbolic link to a secret",
        NodeKind::File | NodeKind::Other => return Some("it is not a folder".into()),
    };
    if n.owner != me.uid && n.owner != 0 {
        return Some(format!(
            "it is owned by uid {}, neither uid {} nor root, and {what} must be yours or root's",
            n.owner, me.uid
        ));
    }
    if n.kind == NodeKind::Dir && n.mode & 0o022 != 0 && n.mode & 0o1000 == 0 {
        return Some(format!(
            "it is writable by group or others (mode {:o}) and not sticky: whoever can write it can replace the secret",
            n.mode
        ));
    }
    None
}

/// One path of [`walk_secret_path`]: its facts and, for a link, its target.
#[derive(Debug, Clone)]
pub struct Step {
    pub facts: NodeFacts,
    pub target: Option<PathBuf>,
}

/// Why [`walk_secret_path`] ended without a file.
#[derive(Debug)]
pub enum WalkEnd {
    Missing,
    /// Refused by the rule, naming the path and why.
    Refused(String),
    Io(io::Error),
}

/// The most links one secret path may pass (Linux's own limit).
const MAX_LINKS: usize = 40;

/// Resolves the absolute `path` as [`secret_way_insecurity`] allows, component by component
/// with `look` (`lstat`, and `readlink` for a link): every folder on the way (from `/`) and
/// every link followed must pass, so a Kubernetes Secret volume's `token -> ..data/token`,
/// `..data -> ..2026_12_04_…` (root's, in root's folders) is followed and a link another
/// user could have planted is not. Returns the path of the file itself (no link left in it),
/// for the caller to open without following links and judge with
/// [`secret_file_insecurity`]. Pure but for `look`.
pub fn walk_secret_path(
    path: &Path,
    me: &Credentials,
    look: &dyn Fn(&Path) -> io::Result<Step>,
) -> Result<PathBuf, WalkEnd> {
    let refuse = |p: &Path, why: String| WalkEnd::Refused(format!("{}: {why}", p.display()));
    let step = |p: &Path| {
        look(p).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => WalkEnd::Missing,
            _ => WalkEnd::Io(e),
        })
    };
    if !path.is_absolute() {
        return Err(refuse(path, "not an absolute path".into()));
    }
    let root = PathBuf::from("/");
    let s = step(&root)?;
    if let Some(why) = secret_way_insecurity(&s.facts, me) {
        return Err(refuse(&root, why));
    }
    let mut todo = names(path);
    let (mut at, mut links) = (root.clone(), 0);
    while let Some(name) = todo.pop_front() {
        if name == "/" {
            at = root.clone();
            continue;
        }
        if name == ".." {
            // Its parent was passed on the way here.
            at.pop();
            continue;
        }
        let next = at.join(&name);
        let s = step(&next)?;
        let last = todo.is_empty();
        match s.facts.kind {
            NodeKind::Link => {
                if let Some(why) = secret_way_insecurity(&s.facts, me) {
                    return Err(refuse(&next, why));
                }
                links += 1;
                if links > MAX_LINKS {
                    return Err(refuse(path, format!("more than {MAX_LINKS} symbolic links on the way")));
                }
                let target = s.target.ok_or_else(|| refuse(&next, "a link without a target".into()))?;
                // The target's components first, then what was left of the path.
                let mut parts = names(&target);
                parts.extend(todo.drain(..));
                todo = parts;
            }
            NodeKind::Dir if last => return Err(refuse(&next, "it is a folder, not a file".into())),
            NodeKind::Dir => {
                if let Some(why) = secret_way_insecurity(&s.facts, me) {
                    return Err(refuse(&next, why));
                }
                at = next;
            }
            NodeKind::File | NodeKind::Other if last => return Ok(next),
            NodeKind::File | NodeKind::Other => return Err(refuse(&next, "it is not a folder".into())),
        }
    }
    Err(refuse(path, "it names no file".into()))
}

/// A path's components as names to walk: `/` for the root, `..` for a parent.
fn names(path: &Path) -> std::collections::VecDeque<std::ffi::OsString> {
    use std::path::Component;
    path.components()
        .filter_map(|c| match c {
            Component::RootDir => Some("/".into()),
            Component::ParentDir => Some("..".into()),
            Component::Normal(n) => Some(n.to_owned()),
            Component::CurDir | Component::Prefix(_) => None,
        })
        .collect()
}

/// Reads a file holding secrets: [`read_capped`]'s rules (regular files only, a size cap, no
/// link at the last step) after [`walk_secret_path`] (links followed only where nobody else
/// could have made them), then [`secret_file_insecurity`] on the opened file (`fstat`, so a
/// rename between the check and the read changes nothing). Where the OS has no Unix owner and
/// mode (Windows), the profile's ACL is what protects it and links are refused.
pub fn read_private(path: &Path, cap: u64) -> ReadOutcome<Vec<u8>> {
    let transient = |e: io::Error| match platform::is_transient(&e) {
        true => ReadOutcome::Transient(e.to_string()),
        false => ReadOutcome::Unreadable(format!("{}: {e}", path.display())),
    };
    let me = platform::credentials();
    let real = match &me {
        None => path.to_owned(),
        Some(me) => {
            let abs = match path.is_absolute() {
                true => path.to_owned(),
                false => match std::env::current_dir() {
                    Ok(d) => d.join(path),
                    Err(e) => return transient(e),
                },
            };
            match walk_secret_path(&abs, me, &look_up) {
                Ok(p) => p,
                Err(WalkEnd::Missing) => return ReadOutcome::Missing,
                Err(WalkEnd::Refused(why)) if why.starts_with(&format!("{}:", abs.display())) => {
                    return ReadOutcome::Unreadable(why);
                }
                Err(WalkEnd::Refused(why)) => return ReadOutcome::Unreadable(format!("{}: {why}", path.display())),
                Err(WalkEnd::Io(e)) => return transient(e),
            }
        }
    };
    open_regular(&real).map(|(f, len)| {
        match (platform::open_node_facts(&f), &me) {
            (Ok(Some(facts)), Some(me)) => {
                if let Some(why) = secret_file_insecurity(&facts, me) {
                    let shown = match real == path {
                        true => path.display().to_string(),
                        false => format!("{} (-> {})", path.display(), real.display()),
                    };
                    return ReadOutcome::Unreadable(format!("{shown}: {why}"));
                }
            }
            (Ok(_), _) => {}
            (Err(e), _) => return transient(e),
        }
        read_open(path, f, len, cap)
    })
}

/// `lstat` and, for a link, `readlink`: the walk's view of the file system.
fn look_up(p: &Path) -> io::Result<Step> {
    let facts = platform::node_facts(p)?.ok_or_else(|| io::Error::other("no file ownership on this OS"))?;
    let target = match facts.kind {
        NodeKind::Link => Some(std::fs::read_link(p)?),
        _ => None,
    };
    Ok(Step { facts, target })
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
    fn private_files_are_0600_from_creation_and_never_reuse_what_is_there() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("h.json");
        let f = create_private(&p).unwrap();
        // Before any write or chmod: the mode it was created with.
        assert_eq!(f.metadata().unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(create_private(&p).unwrap_err().kind(), io::ErrorKind::AlreadyExists);
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), &link).unwrap();
        assert!(create_private(&link).is_err());
        assert!(!dir.path().join("elsewhere").exists(), "created through a link");
        let d = dir.path().join("d");
        platform::create_private_dir_new(&d).unwrap();
        assert_eq!(std::fs::metadata(&d).unwrap().permissions().mode() & 0o777, 0o700);
        assert_eq!(platform::create_private_dir_new(&d).unwrap_err().kind(), io::ErrorKind::AlreadyExists);
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

    fn me() -> Credentials {
        Credentials { uid: 10001, groups: vec![10001, 20] }
    }

    fn node(kind: NodeKind, owner: u32, group: u32, mode: u32) -> NodeFacts {
        NodeFacts { kind, owner, group, mode, acl: None }
    }

    fn acl(entries: &[(AclTag, u32, u32)]) -> Option<Vec<platform::AclEntry>> {
        Some(entries.iter().map(|&(tag, id, perm)| platform::AclEntry { tag, id, perm }).collect())
    }

    #[test]
    fn secret_files_are_ours_or_roots_and_readable_only_by_us_or_our_group() {
        let me = me();
        let file = |owner, group, mode| node(NodeKind::File, owner, group, mode);
        for (f, what) in [
            (file(10001, 10001, 0o600), "ours, 0600"),
            (file(10001, 10001, 0o400), "ours, 0400"),
            (file(0, 0, 0o400), "root's copy (systemd, a user manager's or a unit without User=)"),
            (file(0, 10001, 0o440), "a Secret volume's file: root's, group fsGroup, defaultMode 0440"),
            (file(0, 20, 0o640), "root's, in a supplementary group of ours"),
        ] {
            assert_eq!(secret_file_insecurity(&f, &me), None, "{what}");
        }
        let refused = |f: NodeFacts, needle: &str| {
            let why = secret_file_insecurity(&f, &me).unwrap_or_else(|| panic!("taken: {f:?}"));
            assert!(why.contains(needle), "{needle:?} not in {why:?}");
        };
        refused(file(1001, 10001, 0o600), "owned by uid 1001, not by uid 10001 or root");
        refused(file(0, 4242, 0o440), "readable by group 4242, which uid 10001 is not in");
        refused(file(10001, 10001, 0o604), "readable by others (mode 604");
        refused(file(0, 10001, 0o444), "readable by others");
        for mode in [0o620, 0o660, 0o602, 0o622, 0o460] {
            refused(file(10001, 10001, mode), &format!("writable by group or others (mode {mode:o}"));
        }
        refused(node(NodeKind::Other, 10001, 10001, 0o600), "not a regular file");
        refused(node(NodeKind::Link, 10001, 10001, 0o777), "not a regular file");
    }

    #[test]
    fn an_acl_decides_who_the_group_bits_are() {
        let me = me();
        // systemd's credential for a unit with User=10001: 0400 root plus user:10001:r, which
        // stat shows as 0440 root:root (the group bits are the mask).
        let systemd = NodeFacts {
            acl: acl(&[
                (AclTag::UserObj, u32::MAX, 4),
                (AclTag::User, 10001, 4),
                (AclTag::GroupObj, u32::MAX, 0),
                (AclTag::Mask, u32::MAX, 4),
                (AclTag::Other, u32::MAX, 0),
            ]),
            ..node(NodeKind::File, 0, 0, 0o440)
        };
        assert_eq!(secret_file_insecurity(&systemd, &me), None);
        // The same mode without the ACL: root's group, not ours.
        assert!(secret_file_insecurity(&NodeFacts { acl: None, ..systemd.clone() }, &me).is_some());
        let with = |entries: &[(AclTag, u32, u32)]| NodeFacts { acl: acl(entries), ..systemd.clone() };
        let other_user = with(&[(AclTag::User, 4242, 4), (AclTag::Mask, u32::MAX, 4)]);
        assert!(secret_file_insecurity(&other_user, &me).is_some_and(|w| w.contains("ACL lets uid 4242")));
        let other_group = with(&[(AclTag::Group, 4242, 4), (AclTag::Mask, u32::MAX, 4)]);
        assert!(secret_file_insecurity(&other_group, &me).is_some_and(|w| w.contains("ACL lets group 4242")));
        let owning_group = with(&[(AclTag::GroupObj, u32::MAX, 4), (AclTag::Mask, u32::MAX, 4)]);
        assert!(secret_file_insecurity(&owning_group, &me).is_some_and(|w| w.contains("group 0")));
        // An entry the mask takes everything from gives nothing.
        assert_eq!(secret_file_insecurity(&with(&[(AclTag::User, 4242, 4), (AclTag::Mask, u32::MAX, 0)]), &me), None);
        assert_eq!(secret_file_insecurity(&with(&[(AclTag::Group, 20, 4), (AclTag::Mask, u32::MAX, 4)]), &me), None);
    }

    #[test]
    fn folders_and_links_on_the_way_are_ours_or_roots_and_nobody_else_writes_them() {
        let me = me();
        for n in [
            node(NodeKind::Dir, 0, 0, 0o755),
            node(NodeKind::Dir, 10001, 10001, 0o700),
            node(NodeKind::Dir, 0, 0, 0o1777),
            node(NodeKind::Dir, 0, 10001, 0o3777),
            node(NodeKind::Dir, 0, 10001, 0o2755),
            node(NodeKind::Link, 0, 10001, 0o777),
            node(NodeKind::Link, 10001, 10001, 0o777),
        ] {
            assert_eq!(secret_way_insecurity(&n, &me), None, "{n:?}");
        }
        let w = secret_way_insecurity(&node(NodeKind::Dir, 0, 10001, 0o775), &me).unwrap();
        assert!(w.contains("writable by group or others (mode 775) and not sticky"), "{w}");
        assert!(secret_way_insecurity(&node(NodeKind::Dir, 0, 0, 0o757), &me).is_some());
        let w = secret_way_insecurity(&node(NodeKind::Dir, 1001, 1001, 0o700), &me).unwrap();
        assert!(w.contains("owned by uid 1001"), "{w}");
        let w = secret_way_insecurity(&node(NodeKind::Link, 1001, 1001, 0o777), &me).unwrap();
        assert!(w.contains("a symbolic link to a secret must be yours or root's"), "{w}");
    }

    /// A file system of paths, for the walk.
    fn fake(entries: &[(&str, NodeFacts, Option<&str>)]) -> impl Fn(&Path) -> io::Result<Step> + use<> {
        let map: std::collections::HashMap<PathBuf, Step> = entries
            .iter()
            .map(|(p, f, t)| (PathBuf::from(p), Step { facts: f.clone(), target: t.map(PathBuf::from) }))
            .collect();
        move |p: &Path| map.get(p).cloned().ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
    }

    // Its fake tree is Unix paths ("/run/…" has no drive: not absolute on Windows).
    #[cfg(unix)]
    #[test]
    fn the_walk_follows_a_secret_volumes_links_and_no_planted_one() {
        let me = me();
        let dir = |owner, mode| node(NodeKind::Dir, owner, 10001, mode);
        let link = |owner| node(NodeKind::Link, owner, owner, 0o777);
        let secret = node(NodeKind::File, 0, 10001, 0o440);
        // A Kubernetes Secret volume at /run/secrets/gw (root's tmpfs, sticky, fsGroup 10001).
        let mut fs = vec![
            ("/", dir(0, 0o755), None),
            ("/run", dir(0, 0o755), None),
            ("/run/secrets", dir(0, 0o755), None),
            ("/run/secrets/gw", dir(0, 0o3777), None),
            ("/run/secrets/gw/..2026_12_04_10_00_00.1", dir(0, 0o2755), None),
            ("/run/secrets/gw/..2026_12_04_10_00_00.1/token", secret.clone(), None),
            ("/run/secrets/gw/..data", link(0), Some("..2026_12_04_10_00_00.1")),
            ("/run/secrets/gw/token", link(0), Some("..data/token")),
            // A link of ours elsewhere, absolute, to the volume's link.
            ("/home", dir(0, 0o755), None),
            ("/home/gw", dir(10001, 0o700), None),
            ("/home/gw/tok", link(10001), Some("/run/secrets/gw/token")),
            ("/home/gw/up", link(10001), Some("../../run/./secrets/gw/token")),
            ("/home/gw/loop", link(10001), Some("loop")),
            ("/home/gw/sub", dir(10001, 0o700), None),
            // Planted: a link in a folder others may write, one of another user's in a
            // sticky folder, one through another user's folder.
            ("/srv", dir(0, 0o777), None),
            ("/srv/tok", link(0), Some("/run/secrets/gw/token")),
            ("/tmp", dir(0, 0o1777), None),
            ("/tmp/tok", link(4242), Some("/run/secrets/gw/token")),
            ("/tmp/mine", link(10001), Some("/run/secrets/gw/token")),
            ("/opt", dir(4242, 0o755), None),
            ("/opt/tok", node(NodeKind::File, 10001, 10001, 0o600), None),
        ];
        let look = fake(&fs);
        let real = PathBuf::from("/run/secrets/gw/..2026_12_04_10_00_00.1/token");
        for p in ["/run/secrets/gw/token", "/home/gw/tok", "/home/gw/up", "/home/gw/sub/../tok", "/tmp/mine"] {
            match walk_secret_path(Path::new(p), &me, &look) {
                Ok(r) => assert_eq!(r, real, "{p}"),
                Err(e) => panic!("{p}: {e:?}"),
            }
        }
        let refused = |p: &str, needle: &str| match walk_secret_path(Path::new(p), &me, &look) {
            Err(WalkEnd::Refused(why)) => assert!(why.contains(needle), "{p}: {needle:?} not in {why:?}"),
            other => panic!("{p}: {other:?}"),
        };
        refused("/srv/tok", "/srv: it is writable by group or others (mode 777) and not sticky");
        refused("/tmp/tok", "/tmp/tok: it is owned by uid 4242");
        refused("/opt/tok", "/opt: it is owned by uid 4242");
        refused("/home/gw/loop", "more than 40 symbolic links");
        refused("/home/gw/sub", "it is a folder, not a file");
        refused("/home/gw/sub/../tok/x", "it is not a folder");
        refused("relative/token", "not an absolute path");
        assert!(matches!(walk_secret_path(Path::new("/home/gw/none"), &me, &look), Err(WalkEnd::Missing)));
        // The volume's own links, made by another user: refused.
        fs[6].1 = link(4242);
        let look = fake(&fs);
        assert!(
            matches!(walk_secret_path(Path::new("/home/gw/tok"), &me, &look), Err(WalkEnd::Refused(w)) if w.contains("..data: it is owned by uid 4242"))
        );
    }

    #[cfg(unix)]
    fn chmod(p: &Path, mode: u32) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[cfg(unix)]
    fn refused_with(p: &Path, needle: &str) {
        match read_private(p, MAX_SECRET_BYTES) {
            ReadOutcome::Unreadable(w) => assert!(w.contains(needle), "{}: {needle:?} not in {w:?}", p.display()),
            other => panic!("{}: {other:?}", p.display()),
        }
    }

    #[cfg(unix)]
    #[test]
    fn private_reads_check_the_opened_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("token");
        std::fs::write(&p, b"s3cret\n").unwrap();
        chmod(&p, 0o600);
        assert_eq!(read_private(&p, MAX_SECRET_BYTES), ReadOutcome::Ok(b"s3cret\n".to_vec()));
        chmod(&p, 0o644);
        refused_with(&p, "readable by others (mode 644");
        chmod(&p, 0o660);
        refused_with(&p, "writable by group or others (mode 660");
        // Group-readable in our own group (a file we made has our effective gid).
        chmod(&p, 0o640);
        assert_eq!(read_private(&p, MAX_SECRET_BYTES), ReadOutcome::Ok(b"s3cret\n".to_vec()));
        chmod(&p, 0o600);
        assert!(matches!(read_private(&p, 3), ReadOutcome::Unreadable(w) if w.contains("larger")));
        assert_eq!(read_private(&dir.path().join("none"), MAX_SECRET_BYTES), ReadOutcome::Missing);
        refused_with(dir.path(), "it is a folder, not a file");
        let fifo = dir.path().join("fifo");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        refused_with(&fifo, "FIFO");
    }

    /// A Kubernetes Secret volume as the kubelet lays it out (`token -> ..data/token`,
    /// `..data -> ..<timestamp>`, the file group-readable) is read through its links; a link to
    /// the same file from a folder others can write is not.
    #[cfg(unix)]
    #[test]
    fn a_secret_volumes_links_are_followed_and_planted_ones_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let vol = dir.path().join("secrets");
        let stamp = vol.join("..2026_12_04_10_00_00.123456789");
        std::fs::create_dir_all(&stamp).unwrap();
        chmod(&vol, 0o1777);
        std::fs::write(stamp.join("token"), b"from-a-secret-volume\n").unwrap();
        chmod(&stamp.join("token"), 0o440);
        std::os::unix::fs::symlink(stamp.file_name().unwrap(), vol.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/token", vol.join("token")).unwrap();
        let want = ReadOutcome::Ok(b"from-a-secret-volume\n".to_vec());
        assert_eq!(read_private(&vol.join("token"), MAX_SECRET_BYTES), want);
        // The same file through a link in a folder anyone may write.
        let open = dir.path().join("open");
        std::fs::create_dir(&open).unwrap();
        chmod(&open, 0o777);
        std::os::unix::fs::symlink(vol.join("token"), open.join("token")).unwrap();
        refused_with(&open.join("token"), "open: it is writable by group or others (mode 777) and not sticky");
        // A link to a file others can read is followed to the file, which is refused.
        let shared = dir.path().join("shared");
        std::fs::write(&shared, b"x").unwrap();
        chmod(&shared, 0o644);
        std::os::unix::fs::symlink(&shared, dir.path().join("to-shared")).unwrap();
        refused_with(&dir.path().join("to-shared"), "readable by others");
        if platform::credentials().is_some_and(|c| c.uid == 0) {
            // Another user's link in the sticky volume, and a file of a group not ours.
            let theirs = vol.join("theirs");
            std::os::unix::fs::symlink("..data/token", &theirs).unwrap();
            rustix::fs::chownat(
                rustix::fs::CWD,
                &theirs,
                Some(rustix::fs::Uid::from_raw(4242)),
                None,
                rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
            )
            .unwrap();
            refused_with(&theirs, "theirs: it is owned by uid 4242");
            std::os::unix::fs::chown(stamp.join("token"), None, Some(4242)).unwrap();
            refused_with(&vol.join("token"), "readable by group 4242");
        }
    }

    /// systemd's credential of a unit with `User=`: 0400, root's (here: ours), and an ACL entry
    /// for the service's user, which `stat` shows as mode 0440. Taken; an entry for anyone else
    /// is not.
    #[cfg(target_os = "linux")]
    #[test]
    fn an_acl_for_us_alone_is_taken() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("cred");
        std::fs::write(&p, b"from-systemd").unwrap();
        chmod(&p, 0o400);
        let me = platform::credentials().unwrap();
        let set = |user: u32| {
            let mut v = 2u32.to_le_bytes().to_vec();
            for (tag, perm, id) in [
                (0x01u16, 4u16, u32::MAX),
                (0x02, 4, user),
                (0x04, 0, u32::MAX),
                (0x10, 4, u32::MAX),
                (0x20, 0, u32::MAX),
            ] {
                v.extend(tag.to_le_bytes());
                v.extend(perm.to_le_bytes());
                v.extend(id.to_le_bytes());
            }
            rustix::fs::setxattr(&p, "system.posix_acl_access", &v, rustix::fs::XattrFlags::empty())
        };
        set(me.uid).expect("POSIX ACLs on the temporary folder's file system");
        assert_eq!(
            std::fs::metadata(&p).map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777).unwrap(),
            0o440
        );
        assert_eq!(read_private(&p, MAX_SECRET_BYTES), ReadOutcome::Ok(b"from-systemd".to_vec()));
        set(me.uid + 4242).unwrap();
        refused_with(&p, &format!("its ACL lets uid {} read it", me.uid + 4242));
    }

    #[test]
    fn a_reserved_record_lands_through_its_reserve_when_the_write_has_no_space() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("desired_state.json");
        write_json_reserved(&p, &serde_json::json!({"want": "run"})).unwrap();
        let reserve = reserve_path(&p);
        assert_eq!(std::fs::metadata(&reserve).unwrap().len(), RESERVE_BYTES as u64);
        // What the fallback does when the atomic write finds the disk full.
        write_over_reserve(&p, b"{\"want\":\"stopped\"}\n").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"{\"want\":\"stopped\"}\n");
        assert!(!reserve.exists(), "the reserve became the record");
        assert!(write_over_reserve(&p, b"{}").is_err(), "no reserve left: an error, never a torn record");
        ensure_reserve(&p).unwrap();
        assert_eq!(std::fs::metadata(&reserve).unwrap().len(), RESERVE_BYTES as u64);
        assert!(is_no_space(&io::Error::from(io::ErrorKind::StorageFull)));
        assert!(!is_no_space(&io::Error::from(io::ErrorKind::PermissionDenied)));
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
