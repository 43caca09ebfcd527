//! Unix: every file of a hermes home is reached from a handle on the home directory, one
//! component at a time with `O_NOFOLLOW`, and checked by `fstat` on the handle it opened.
//!
//! The home may belong to someone less privileged than us (root managing a user's hermes), so
//! a name in it proves nothing: a planted symlink, a FIFO, a hard link to a root-owned file or
//! a folder swapped for a link must never make us write, read or chown outside it. Paths are
//! never re-resolved after a check; ownership changes go through the descriptor (`fchown`).

use std::fs::File;
use std::hash::{BuildHasher, Hasher};
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Gid, Mode, OFlags, Uid};

/// Permission bits as the OS spells them (`mode_t`: u32 on Linux, u16 on macOS).
pub type FileMode = rustix::fs::RawMode;

/// A directory of a hermes home, held open, with the home's owner.
#[derive(Debug)]
pub struct HomeDir {
    fd: OwnedFd,
    /// The home's owner (uid, gid): what files in it must belong to.
    owner: (u32, u32),
    path: PathBuf,
}

fn refused(path: &Path, why: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, format!("refusing {}: {why}", path.display()))
}

fn me() -> u32 {
    rustix::process::geteuid().as_raw()
}

impl HomeDir {
    /// Opens the home directory itself, refusing it as a native home is refused: the home
    /// named must not be a link (its owner could point it at a folder it does not own, a
    /// world-writable one included), and the folder must not be writable by group or others
    /// (anyone could plant the records we read in it). Links further up the path are resolved
    /// once (canonical form), and the final directory is opened without following a link.
    pub fn open(home: &Path) -> io::Result<HomeDir> {
        // `home/` would make lstat follow a link: the name itself is judged.
        let named: PathBuf = home.components().collect();
        if std::fs::symlink_metadata(&named)?.file_type().is_symlink() {
            let to = std::fs::read_link(&named).map(|t| format!(" (to {})", t.display())).unwrap_or_default();
            return Err(refused(home, format_args!("the hermes home is a symbolic link{to}; name the folder itself")));
        }
        let canon = std::fs::canonicalize(home)?;
        let fd = rustix::fs::open(&canon, dir_flags(), Mode::empty()).map_err(|e| link_error(&canon, e))?;
        let st = rustix::fs::fstat(&fd)?;
        let mode = st.st_mode & 0o7777;
        if mode & 0o022 != 0 {
            return Err(refused(
                &canon,
                format_args!(
                    "the hermes home is writable by group or others (mode {mode:o}); a hermes home must not be"
                ),
            ));
        }
        Ok(HomeDir { fd, owner: (st.st_uid, st.st_gid), path: canon })
    }

    /// The uid that owns the home.
    pub fn owner_uid(&self) -> Option<u32> {
        Some(self.owner.0)
    }

    /// The home's owner (uid, gid).
    pub fn owner(&self) -> Option<(u32, u32)> {
        Some(self.owner)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A sub-folder (`gatewarden`, `logs`, `state`), never through a link; created 0700 and
    /// given to the home's owner when `create` and missing. It must belong to the home's owner
    /// (or to us).
    pub fn subdir(&self, name: &str, create: bool) -> io::Result<HomeDir> {
        let path = self.path.join(name);
        let open = || rustix::fs::openat(&self.fd, name, dir_flags(), Mode::empty());
        let fd = match open() {
            Err(rustix::io::Errno::NOENT) if create => {
                match rustix::fs::mkdirat(&self.fd, name, Mode::from_raw_mode(0o700)) {
                    Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                    Err(e) => return Err(e.into()),
                }
                let fd = open().map_err(|e| link_error(&path, e))?;
                self.give_to_owner(&fd)?;
                fd
            }
            other => other.map_err(|e| link_error(&path, e))?,
        };
        let st = rustix::fs::fstat(&fd)?;
        if st.st_uid != self.owner.0 && st.st_uid != me() {
            return Err(refused(&path, format_args!("owned by uid {}, not by the home's owner", st.st_uid)));
        }
        Ok(HomeDir { fd, owner: self.owner, path })
    }

    /// Opens a file for reading: a regular file (never a link, FIFO or device), belonging to
    /// the home's owner, or to us and not hard-linked elsewhere. `Ok(None)` when missing.
    pub fn open_read(&self, name: &str) -> io::Result<Option<File>> {
        let path = self.path.join(name);
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY;
        let fd = match rustix::fs::openat(&self.fd, name, flags, Mode::empty()) {
            Err(rustix::io::Errno::NOENT) => return Ok(None),
            other => other.map_err(|e| link_error(&path, e))?,
        };
        self.check_file(&fd, &path)?;
        Ok(Some(File::from(fd)))
    }

    /// Opens a file for appending, created 0600 and given to the home's owner: a regular
    /// file with one link, belonging to the home's owner or to us.
    pub fn open_append(&self, name: &str) -> io::Result<File> {
        let path = self.path.join(name);
        let flags = OFlags::WRONLY
            | OFlags::APPEND
            | OFlags::CREATE
            | OFlags::NOFOLLOW
            | OFlags::NONBLOCK
            | OFlags::CLOEXEC
            | OFlags::NOCTTY;
        let fd =
            rustix::fs::openat(&self.fd, name, flags, Mode::from_raw_mode(0o600)).map_err(|e| link_error(&path, e))?;
        self.check_file(&fd, &path)?;
        self.give_to_owner(&fd)?;
        Ok(File::from(fd))
    }

    /// Writes `name` atomically (a randomly named temp file created `O_EXCL|O_NOFOLLOW`, fsync,
    /// rename within this directory), with `mode`, belonging to the home's owner.
    pub fn write_atomic(&self, name: &str, bytes: &[u8], mode: FileMode) -> io::Result<()> {
        let tmp = format!(".{name}.gatewarden-{}-{:016x}", std::process::id(), random());
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(&self.fd, tmp.as_str(), flags, Mode::from_raw_mode(mode))?;
        let result = (|| {
            // Exactly `mode`, whatever the umask.
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode))?;
            self.give_to_owner(&fd)?;
            let mut f = File::from(fd.try_clone()?);
            f.write_all(bytes)?;
            f.sync_all()?;
            rustix::fs::renameat(&self.fd, tmp.as_str(), &self.fd, name)?;
            let _ = rustix::fs::fsync(&self.fd);
            Ok(())
        })();
        if result.is_err() {
            let _ = rustix::fs::unlinkat(&self.fd, tmp.as_str(), AtFlags::empty());
        }
        result
    }

    /// Removes a file of this directory (never what a link points to); missing is fine.
    pub fn remove(&self, name: &str) -> io::Result<()> {
        match rustix::fs::unlinkat(&self.fd, name, AtFlags::empty()) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Renames within this directory (log rotation).
    pub fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        Ok(rustix::fs::renameat(&self.fd, from, &self.fd, to)?)
    }

    fn check_file(&self, fd: &OwnedFd, path: &Path) -> io::Result<()> {
        let st = rustix::fs::fstat(fd)?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(refused(path, "not a regular file"));
        }
        let mine = st.st_uid == me();
        if st.st_uid != self.owner.0 && !mine {
            return Err(refused(path, format_args!("owned by uid {}, not by the home's owner", st.st_uid)));
        }
        // A second link to a file of ours could be a hard link the home's owner planted to a
        // file they may not touch (root's, when we are root).
        if st.st_uid != self.owner.0 && st.st_nlink > 1 {
            return Err(refused(path, "a hard link to a file the home's owner does not own"));
        }
        Ok(())
    }

    /// When we run as root in a home of another user, what we create belongs to that user
    /// (so their hermes can read and remove it). Through the descriptor, never a path.
    fn give_to_owner(&self, fd: &OwnedFd) -> io::Result<()> {
        if me() == 0 && self.owner.0 != 0 {
            let st = rustix::fs::fstat(fd)?;
            // Folders cannot be hard-linked; a file with a second link may be someone else's.
            let single = FileType::from_raw_mode(st.st_mode) == FileType::Directory || st.st_nlink <= 1;
            if st.st_uid == 0 && single {
                let (u, g) = (Uid::from_raw(self.owner.0), Gid::from_raw(self.owner.1));
                rustix::fs::fchown(fd, Some(u), Some(g))?;
            }
        }
        Ok(())
    }
}

fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

/// ELOOP / ENOTDIR from `O_NOFOLLOW`: a link where a file or folder of the home should be.
fn link_error(path: &Path, e: rustix::io::Errno) -> io::Error {
    match e {
        rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR | rustix::io::Errno::MLINK => {
            refused(path, "a symbolic link (or not a folder) where the home should have its own file")
        }
        rustix::io::Errno::NXIO => refused(path, "not a regular file (a FIFO or socket)"),
        e => io::Error::from(e).into_with_path(path),
    }
}

trait WithPath {
    fn into_with_path(self, path: &Path) -> io::Error;
}

impl WithPath for io::Error {
    fn into_with_path(self, path: &Path) -> io::Error {
        io::Error::new(self.kind(), format!("{}: {self}", path.display()))
    }
}

/// A random 64-bit value from std's per-process hash keys (no extra dependency): temp names
/// in a home someone else controls must not be predictable.
fn random() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    h.finish()
}

/// Our effective uid.
pub fn effective_uid() -> Option<u32> {
    Some(me())
}

/// The uid that owns an open file: who wrote it, or could have.
pub fn file_owner(f: &File) -> Option<u32> {
    rustix::fs::fstat(f).ok().map(|st| st.st_uid)
}

/// Whether only root can change `dir` and every folder above it: each owned by root and not
/// writable by group or others, or sticky (/tmp: others can add names to it, but not rename or
/// remove root's, so the root-owned folder below it stays root's).
pub fn only_root_writes(dir: &Path) -> bool {
    dir.ancestors().all(|d| {
        std::fs::symlink_metadata(d).is_ok_and(|m| {
            use std::os::unix::fs::MetadataExt;
            m.is_dir() && m.uid() == 0 && (m.mode() & 0o022 == 0 || m.mode() & 0o1000 != 0)
        })
    })
}
