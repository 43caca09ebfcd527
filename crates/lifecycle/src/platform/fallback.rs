//! Unsupported OS: every probe is Unknown and nothing is ever signalled.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

use super::{Credentials, DirFacts, NodeFacts, Signal, SignalOutcome};
use crate::identity::ProcessIdentity;
use crate::liveness::Liveness;

pub fn probe(_pid: u32) -> Liveness {
    Liveness::Unknown { reason: "process probing is not supported on this OS".into() }
}

pub fn start_time(_pid: u32) -> Option<u64> {
    None
}

pub fn signal_verified(_id: &ProcessIdentity, _sig: Signal) -> SignalOutcome {
    SignalOutcome::Unsupported
}

pub fn create_private_dir(path: &Path) -> io::Result<()> {
    std::fs::create_dir_all(path)
}

pub fn create_private_dir_new(path: &Path) -> io::Result<()> {
    std::fs::create_dir(path)
}

pub fn private_on_create(_opts: &mut OpenOptions) {}

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

pub fn no_follow(_opts: &mut OpenOptions, _nonblocking: bool) {}

pub fn link_refused(_e: &io::Error) -> bool {
    false
}

pub fn is_link(file: &File) -> bool {
    file.metadata().is_ok_and(|m| m.file_type().is_symlink())
}

pub fn is_transient(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::OutOfMemory | io::ErrorKind::Interrupted)
}

pub fn set_private_file(_file: &File) -> io::Result<()> {
    Ok(())
}

pub fn canonical(path: &Path) -> io::Result<PathBuf> {
    std::fs::canonicalize(path)
}

pub fn sync_dir(_path: &Path) {}

pub fn free_space(_path: &Path) -> Option<u64> {
    None
}

pub fn lock_holders(_path: &Path) -> Option<Vec<u32>> {
    None
}

pub fn parent_pid(_pid: u32) -> Option<u32> {
    None
}

pub fn kill_tagged(_key: &str, _accept: &dyn Fn(&str) -> bool) -> Vec<u32> {
    Vec::new()
}

pub use super::without_procfs::{
    argv, cgroup, cmdline, environ, is_stopped, port_listeners, process_uid, process_usage, processes_with_env,
    release_startup_pages, systemd_main_pid,
};

/// Nothing to redirect with here: the caller keeps writing to stdout.
pub fn stdout_to_stderr() -> io::Result<File> {
    Err(io::Error::new(io::ErrorKind::Unsupported, "no way to redirect stdout on this OS"))
}

/// No terminal control here: the line is read as typed (and shown).
pub fn read_hidden_line() -> io::Result<String> {
    use std::io::BufRead;
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    Ok(line)
}
