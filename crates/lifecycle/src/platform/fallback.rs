//! Unsupported OS: every probe is Unknown and nothing is ever signalled.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

use super::{Signal, SignalOutcome};
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

pub fn no_follow(_opts: &mut OpenOptions, _nonblocking: bool) {}

pub fn is_transient(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::OutOfMemory | io::ErrorKind::Interrupted)
}

pub fn canonical(path: &Path) -> io::Result<PathBuf> {
    std::fs::canonicalize(path)
}

pub fn free_space(_path: &Path) -> Option<u64> {
    None
}

pub use super::without_owners::{
    create_private_dir, create_private_dir_new, credentials, dir_facts, is_link, kill_tagged, link_refused,
    lock_holders, node_facts, open_node_facts, parent_pid, private_on_create, set_private_file, sync_dir,
};
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
