//! The per-OS facade: identical signatures, no decisions.
//!
//! - `environ(pid) -> Option<Vec<u8>>`: the NUL-separated environment of a process
//! - `cmdline(pid) -> Option<Vec<String>>`
//! - `cgroup(pid) -> Option<String>`
//! - `processes_with_env(key, value, argv_words) -> Vec<u32>`: processes by environment
//!   and argv (Linux; empty elsewhere)
//! - `process_uid(pid) -> Option<u32>`: the uid a process runs as (Linux; `None` elsewhere)
//! - `HomeDir`: a folder of a hermes home held open; every file in it opened without following
//!   links, regular files only, owner checked, created files given to the home's owner
//!   (`open`, `subdir`, `open_read`, `open_append`, `write_atomic`, `rename`, `owner`)
//! - `effective_uid() -> Option<u32>`: whether a child must run as the home's owner
//!
//! Starting and ending processes (detach, process groups, reaping, running as the home's owner)
//! is lifecycle's per-OS facade, crates/lifecycle/src/platform/spawn.

#[cfg_attr(target_os = "linux", path = "linux.rs")]
#[cfg_attr(not(target_os = "linux"), path = "noproc.rs")]
mod procinfo;

pub use procinfo::*;

#[cfg_attr(unix, path = "homefs_unix.rs")]
#[cfg_attr(not(unix), path = "homefs_other.rs")]
mod homefs;

pub use homefs::*;
