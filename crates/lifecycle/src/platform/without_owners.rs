//! What an OS without Unix owners, mode bits or a process table we may read does (Windows and
//! the rest): one copy, re-exported by `windows.rs` and `fallback.rs`. On Windows the per-user
//! profile directory's ACL protects the home and what is created in it.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;

use super::{Credentials, DirFacts, NodeFacts};

pub fn create_private_dir(path: &Path) -> io::Result<()> {
    std::fs::create_dir_all(path)
}

/// Not recursive: an existing directory is an error.
pub fn create_private_dir_new(path: &Path) -> io::Result<()> {
    std::fs::create_dir(path)
}

pub fn private_on_create(_opts: &mut OpenOptions) {}

/// No Unix owner or mode bits to report.
pub fn dir_facts(_path: &Path, _follow: bool) -> io::Result<Option<DirFacts>> {
    Ok(None)
}

pub fn node_facts(_path: &Path) -> io::Result<Option<NodeFacts>> {
    Ok(None)
}

pub fn open_node_facts(_file: &File) -> io::Result<Option<NodeFacts>> {
    Ok(None)
}

pub fn credentials() -> Option<Credentials> {
    None
}

pub fn link_refused(_e: &io::Error) -> bool {
    false
}

pub fn is_link(file: &File) -> bool {
    file.metadata().is_ok_and(|m| m.file_type().is_symlink())
}

pub fn set_private_file(_file: &File) -> io::Result<()> {
    Ok(())
}

/// NTFS journals a rename itself, and directories cannot be opened for flushing.
pub fn sync_dir(_path: &Path) {}

/// The OS does not say who holds a byte-range lock: unknown.
pub fn lock_holders(_path: &Path) -> Option<Vec<u32>> {
    None
}

/// Not needed (no launchd-style supervision check): unknown.
pub fn parent_pid(_pid: u32) -> Option<u32> {
    None
}

/// No sweep: on Windows exec runs live in a job object that is killed when the gateway's
/// handle closes, however the gateway dies (platform/spawn/windows.rs).
pub fn kill_tagged(_key: &str, _accept: &dyn Fn(&str) -> bool) -> Vec<u32> {
    Vec::new()
}
