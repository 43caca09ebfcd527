//! Windows and other OSes: the home's ACL (Windows: the user profile's) is the boundary, so
//! there is no owner to check or hand files to. Files are still opened without following
//! links (reparse points) and read only when regular (gatewarden-lifecycle `fsio`).

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use gatewarden_lifecycle::fsio::{self, ReadOutcome};

/// Permission bits (unused here: the folder's ACL applies).
pub type FileMode = u32;

/// A directory of a hermes home.
#[derive(Debug)]
pub struct HomeDir {
    path: PathBuf,
}

impl HomeDir {
    pub fn open(home: &Path) -> io::Result<HomeDir> {
        let path = std::fs::canonicalize(home)?;
        if !path.is_dir() {
            return Err(io::Error::other(format!("{} is not a folder", path.display())));
        }
        Ok(HomeDir { path })
    }

    pub fn owner_uid(&self) -> Option<u32> {
        None
    }

    pub fn owner(&self) -> Option<(u32, u32)> {
        None
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn subdir(&self, name: &str, create: bool) -> io::Result<HomeDir> {
        let path = self.path.join(name);
        if create {
            std::fs::create_dir_all(&path)?;
        }
        let meta = std::fs::symlink_metadata(&path)?;
        if !meta.is_dir() {
            return Err(io::Error::other(format!("refusing {}: a link or not a folder", path.display())));
        }
        Ok(HomeDir { path })
    }

    pub fn open_read(&self, name: &str) -> io::Result<Option<File>> {
        match fsio::open_regular(&self.path.join(name)) {
            ReadOutcome::Ok((f, _)) => Ok(Some(f)),
            ReadOutcome::Missing => Ok(None),
            ReadOutcome::Unreadable(why) | ReadOutcome::Transient(why) => Err(io::Error::other(why)),
        }
    }

    pub fn open_append(&self, name: &str) -> io::Result<File> {
        fsio::open_append(&self.path.join(name))
    }

    pub fn write_atomic(&self, name: &str, bytes: &[u8], _mode: FileMode) -> io::Result<()> {
        fsio::atomic_write(&self.path.join(name), bytes)
    }

    pub fn remove(&self, name: &str) -> io::Result<()> {
        fsio::remove_if_exists(&self.path.join(name)).map(|_| ())
    }

    pub fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        std::fs::rename(self.path.join(from), self.path.join(to))
    }
}

pub fn effective_uid() -> Option<u32> {
    None
}

/// The uid that owns an open file (no uids here: the folder's ACL applies).
pub fn file_owner(_f: &File) -> Option<u32> {
    None
}

/// Whether only root can change `dir` and the folders above it (no root here).
pub fn only_root_writes(_dir: &Path) -> bool {
    false
}
