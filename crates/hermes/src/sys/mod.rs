//! The per-OS facade of a hermes home's files: identical signatures, no decisions.
//!
//! - `HomeDir`: a folder of a hermes home held open; every file in it opened without following
//!   links, regular files only, owner checked, created files given to the home's owner
//!   (`open`, `subdir`, `open_read`, `open_append`, `write_atomic`, `rename`, `owner`)
//! - `effective_uid() -> Option<u32>`: whether a child must run as the home's owner
//! - `file_owner(&File) -> Option<u32>`, `only_root_writes(&Path) -> bool`: who could have
//!   written a record whose argv we would run (crates/hermes/src/launch.rs)
//!
//! Processes are lifecycle's per-OS facade (crates/lifecycle/src/platform): what `/proc` tells
//! of one (`argv`, `environ`, `cgroup`, `process_uid`, `processes_with_env`), and starting and
//! ending them (`platform::spawn`: detach, process groups, reaping, running as the home's owner).

#[cfg_attr(unix, path = "homefs_unix.rs")]
#[cfg_attr(not(unix), path = "homefs_other.rs")]
mod homefs;

pub use homefs::*;
