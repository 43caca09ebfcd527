//! The per-OS facade: identical signatures, no decisions.
//!
//! - `environ(pid) -> Option<Vec<u8>>`: the NUL-separated environment of a process
//! - `cmdline(pid) -> Option<Vec<String>>`
//! - `cgroup(pid) -> Option<String>`
//! - `processes_with_env(key, value, argv_words) -> Vec<u32>`: processes by environment
//!   and argv (Linux; empty elsewhere)
//! - `detach(cmd: &mut Command)`: run the child in its own session (Unix) or detached
//!   process group (Windows), so a terminal's signals and hangup never reach it
//! - `own_process_group(cmd: &mut Command)`: its own process group, for supervised children
//! - `kill_process_group(pgid: u32)`: SIGKILL what is left of a group (no-op elsewhere)
//! - `reap_with_group(child)`: once the child exited, kill its group's leftovers, then reap
//! - `is_executable(path) -> bool`: a file we could run
//! - `exit_signal(status) -> Option<i32>`: the signal that ended a child (Unix)
//! - `process_uid(pid) -> Option<u32>`: the uid a process runs as (Linux; `None` elsewhere)
//! - `HomeDir`: a folder of a hermes home held open; every file in it opened without following
//!   links, regular files only, owner checked, created files given to the home's owner
//!   (`open`, `subdir`, `open_read`, `open_append`, `write_atomic`, `rename`, `owner`)
//! - `effective_uid() -> Option<u32>`, `run_as(cmd, uid, gid)`: run a child as the home's owner

#[cfg_attr(target_os = "linux", path = "linux.rs")]
#[cfg_attr(not(target_os = "linux"), path = "noproc.rs")]
mod procinfo;

#[cfg_attr(unix, path = "unix.rs")]
#[cfg_attr(windows, path = "windows.rs")]
#[cfg_attr(not(any(unix, windows)), path = "other.rs")]
mod spawn;

pub use procinfo::*;
pub use spawn::*;

#[cfg_attr(unix, path = "homefs_unix.rs")]
#[cfg_attr(not(unix), path = "homefs_other.rs")]
mod homefs;

pub use homefs::*;
