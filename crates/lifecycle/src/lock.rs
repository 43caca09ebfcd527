//! The instance lock: "a gateway runs in this home" ⇔ this OS lock is held.
//!
//! The kernel releases the lock when the holder dies, however it dies, so a crashed gateway
//! can never leave a stale "running" behind. The lock file itself is never deleted: unlinking
//! a lock file while another process has it open lets two processes lock two different inodes.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{self, Seek, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::{fsio, platform};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    #[error("another process holds {}", path.display())]
    Held { path: PathBuf },
    /// A symlink (or a FIFO, device, directory) planted at the lock's name: never followed,
    /// never truncated. Fatal configuration (78): someone has to look at the home.
    #[error("refusing to use {}: {why}", path.display())]
    NotAFile { path: PathBuf, why: String },
    #[error("cannot open or lock {}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
}

/// The held lock. Dropping it (or dying) releases it.
#[derive(Debug)]
pub struct InstanceLock {
    file: File,
    path: PathBuf,
}

/// What a non-owning probe of the lock found.
#[derive(Debug)]
pub enum LockProbe {
    /// Nobody holds it. The guard keeps it held while the caller cleans stale files, so a
    /// starting gateway cannot write its records in the middle of the cleanup; drop it soon.
    Free(InstanceLock),
    /// A live process holds it.
    Held,
    /// The lock file does not exist: nothing ever ran here (or the home is gone).
    Missing,
    /// The lock file exists but could not be opened or locked.
    Error(String),
}

/// Why an existing lock path is not a lock file we may use.
enum OpenError {
    NotAFile(String),
    Io(io::Error),
}

fn open(path: &Path, create: bool) -> Result<File, OpenError> {
    // Read+write, never append: Windows refuses locks on append-only handles. Never through a
    // symlink: `gateway.lock -> /some/root/file` would otherwise be truncated by
    // `write_content`.
    let f = fsio::open_no_follow(path, OpenOptions::new().read(true).write(true).create(create).truncate(false))
        .map_err(|e| {
            if fsio::is_link_refused(&e) {
                OpenError::NotAFile("it is a symbolic link".into())
            } else {
                OpenError::Io(e)
            }
        })?;
    let meta = f.metadata().map_err(OpenError::Io)?;
    if !meta.is_file() {
        return Err(OpenError::NotAFile("it is not a regular file".into()));
    }
    if create {
        platform::set_private_file(&f).map_err(OpenError::Io)?;
    }
    Ok(f)
}

impl OpenError {
    fn into_lock_error(self, path: &Path) -> LockError {
        match self {
            OpenError::NotAFile(why) => LockError::NotAFile { path: path.to_owned(), why },
            OpenError::Io(source) => LockError::Io { path: path.to_owned(), source },
        }
    }
}

impl InstanceLock {
    /// Tries once to take the lock, creating the file if needed.
    pub fn try_acquire(path: &Path) -> Result<InstanceLock, LockError> {
        let file = open(path, true).map_err(|e| e.into_lock_error(path))?;
        match file.try_lock() {
            Ok(()) => Ok(InstanceLock { file, path: path.to_owned() }),
            Err(TryLockError::WouldBlock) => Err(LockError::Held { path: path.to_owned() }),
            Err(TryLockError::Error(source)) => Err(LockError::Io { path: path.to_owned(), source }),
        }
    }

    /// Takes the lock, retrying for up to `patience` while it is held. Probes (`status`,
    /// `stop`) hold the lock for microseconds; a starting gateway must not mistake one of them
    /// for a running instance.
    pub fn acquire(path: &Path, patience: Duration) -> Result<InstanceLock, LockError> {
        let deadline = Instant::now() + patience;
        let mut delay = Duration::from_millis(2);
        loop {
            match Self::try_acquire(path) {
                Err(LockError::Held { .. }) if Instant::now() < deadline => {
                    std::thread::sleep(delay.min(deadline.saturating_duration_since(Instant::now())));
                    delay = (delay * 2).min(Duration::from_millis(50));
                }
                other => return other,
            }
        }
    }

    /// Probes the lock without creating the file.
    pub fn probe(path: &Path) -> LockProbe {
        let file = match open(path, false) {
            Ok(f) => f,
            Err(OpenError::Io(e)) if e.kind() == io::ErrorKind::NotFound => return LockProbe::Missing,
            Err(OpenError::Io(e)) => return LockProbe::Error(format!("cannot open {}: {e}", path.display())),
            Err(OpenError::NotAFile(why)) => {
                return LockProbe::Error(format!("refusing to use {}: {why}", path.display()));
            }
        };
        match file.try_lock() {
            Ok(()) => LockProbe::Free(InstanceLock { file, path: path.to_owned() }),
            Err(TryLockError::WouldBlock) => LockProbe::Held,
            Err(TryLockError::Error(e)) => LockProbe::Error(format!("cannot lock {}: {e}", path.display())),
        }
    }

    /// Replaces the lock file's content with `bytes` (hermes keeps a copy of the pid record
    /// there). Goes through our own handle, which Windows' mandatory lock still allows.
    pub fn write_content(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.file.set_len(0)?;
        self.file.rewind()?;
        self.file.write_all(bytes)?;
        self.file.sync_data()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Pids the kernel says hold the lock on `path`, where the OS can tell (Linux: `/proc/locks`);
/// `None` where it cannot. The kernel's answer beats any record: a record can be stale or
/// tampered with, the lock table cannot.
pub fn holder_pids(path: &Path) -> Option<Vec<u32>> {
    platform::lock_holders(path)
}

#[cfg(test)]
mod tests {
    #[cfg(target_os = "linux")]
    #[test]
    fn the_kernel_names_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("gateway.lock");
        let held = super::InstanceLock::try_acquire(&p).unwrap();
        assert_eq!(super::holder_pids(&p), Some(vec![std::process::id()]));
        drop(held);
        assert_eq!(super::holder_pids(&p), Some(vec![]));
    }
}

#[cfg(test)]
mod lock_tests {
    use super::*;

    #[test]
    fn exactly_one_holder_and_release_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("gateway.lock");
        assert!(matches!(InstanceLock::probe(&p), LockProbe::Missing));
        let held = InstanceLock::try_acquire(&p).unwrap();
        assert!(matches!(InstanceLock::try_acquire(&p), Err(LockError::Held { .. })));
        assert!(matches!(InstanceLock::probe(&p), LockProbe::Held));
        drop(held);
        assert!(matches!(InstanceLock::probe(&p), LockProbe::Free(_)));
        let _again = InstanceLock::acquire(&p, Duration::from_millis(10)).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn a_symlinked_lock_is_refused_and_its_target_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("precious");
        std::fs::write(&target, b"keep me").unwrap();
        let p = dir.path().join("gateway.lock");
        std::os::unix::fs::symlink(&target, &p).unwrap();
        let e = InstanceLock::try_acquire(&p).unwrap_err();
        assert!(matches!(&e, LockError::NotAFile { why, .. } if why.contains("symbolic link")), "{e}");
        assert!(e.to_string().contains("gateway.lock"), "{e}");
        assert!(matches!(InstanceLock::probe(&p), LockProbe::Error(why) if why.contains("symbolic link")));
        assert_eq!(std::fs::read(&target).unwrap(), b"keep me");
    }

    #[test]
    fn acquire_waits_out_a_short_probe() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("gateway.lock");
        let prober = InstanceLock::try_acquire(&p).unwrap();
        let p2 = p.clone();
        let t = std::thread::spawn(move || InstanceLock::acquire(&p2, Duration::from_secs(5)).map(|_| ()));
        std::thread::sleep(Duration::from_millis(30));
        drop(prober);
        t.join().unwrap().unwrap();
    }
}
