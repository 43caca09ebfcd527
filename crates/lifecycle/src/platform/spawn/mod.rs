//! The per-OS process facade: starting, watching and ending children, one file per OS with
//! identical signatures (`unix.rs`, `windows.rs`, `other.rs`; what the last two share without
//! Unix process groups is `without_groups.rs`), no decisions. The gateway
//! (crates/runtime), hermes homes (crates/hermes) and the CLI's `supervise` all start their
//! processes through it, so each OS's way of doing so is written once.
//!
//! - `detach(cmd: &mut Command, listener: Option<&TcpListener>) -> Option<String>`: the child
//!   outlives its starter, in its own session (Unix) or detached from the console in a new
//!   process group (Windows), so a terminal's signals and hangup never reach it; with a
//!   listener, returns the `--inherit-listener` value to pass when the OS can hand it over
//! - `adopt_listener(value: &str) -> io::Result<TcpListener>`: take that listener over in the child
//! - `listener_handle(&TcpListener) -> Option<String>`, `exec_in_place(Command,
//!   Option<TcpListener>) -> io::Error`: re-execute this very process (same pid: PID 1 of a
//!   container, `supervise`'s hand-over), keeping the listener; returns only on failure
//! - `DETACH_KEEPS_OUTPUT: bool`: a detached child still writes to our stdout/stderr
//! - `own_process_group(cmd: &mut Command)`: its own process group, for supervised children
//! - `kill_process_group(pgid: u32)`: SIGKILL what is left of a group (no-op elsewhere)
//! - `reap_with_group(child) -> io::Result<Option<ExitStatus>>`: once the child exited, kill
//!   its group's leftovers, then reap
//! - `exit_signal(status) -> Option<i32>`: the signal that ended a child (Unix);
//!   [`describe_exit`] (here, the same on every OS) says it in words
//! - `ProcessGroup`: `prepare(cmd)` before the spawn, `attach(pid)` after it, then
//!   `terminate()` / `kill()` the child's whole tree (a process group on Unix, a job object on
//!   Windows, nothing elsewhere); the agent's exec backend runs its children in one
//! - `run_as(cmd: &mut Command, uid: u32, gid: u32)`: run a child as another user (Unix)
//! - `is_executable(path) -> bool`: a file we could run
//! - `spawn_watched(cmd, report) -> io::Result<u32>`: the supervised child: spawns it and
//!   reports its end ([`Reaped::Child`]) and every orphan reaped meanwhile when we are PID 1
//!   ([`Reaped::Orphan`]) from a waiter thread
//! - `reap_orphans(grace) -> bool`: as PID 1, reap re-parented orphans no waiter of ours
//!   collects (`gatewarden run` as a container's init); `zombie_children(pid) -> Vec<u32>`
//! - `is_pid1() -> bool`, `real_uid() -> u32`, `process_groups() -> Vec<(u32, u32)>` (every
//!   `(pid, pgid)`, where the OS tells)
//! - `self_exe()` / `remember_self_exe()` (here, the same on every OS): this executable's path

#[cfg_attr(unix, path = "unix.rs")]
#[cfg_attr(windows, path = "windows.rs")]
#[cfg_attr(not(any(unix, windows)), path = "other.rs")]
mod imp;

#[cfg(not(unix))]
mod without_groups;

pub use imp::*;

/// What [`spawn_watched`]'s waiter reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reaped {
    /// The watched child ended: its exit code, or the signal that ended it (both `None` when
    /// its status was lost, e.g. reaped by someone else).
    Child { pid: u32, code: Option<i32>, signal: Option<i32> },
    /// An orphan (not our child) was reaped; we are PID 1 or a subreaper (Unix only).
    Orphan { pid: u32 },
}

/// This executable's path, as it was when [`remember_self_exe`] first ran (early in `main`).
///
/// An update renames a new binary over ours while we run; Linux then reports our image as
/// `<path> (deleted)`, which cannot be started. Successors, backstops and re-executions must
/// start the *path* (now the new binary), so the path is captured before any swap can happen.
pub fn self_exe() -> std::io::Result<std::path::PathBuf> {
    match SELF_EXE.get() {
        Some(p) => Ok(p.clone()),
        None => std::env::current_exe().map(undeleted),
    }
}

/// Captures [`self_exe`]; call first thing in `main`.
pub fn remember_self_exe() {
    if let Ok(p) = std::env::current_exe() {
        let _ = SELF_EXE.set(undeleted(p));
    }
}

/// `<path> (deleted)` → `<path>` when `<path>` exists: a swap that landed between our exec and
/// [`remember_self_exe`] (the overlap soak: `start` 167 ms into a rollback could not start the
/// gateway) leaves the path holding the new binary, which is what we mean to start.
fn undeleted(p: std::path::PathBuf) -> std::path::PathBuf {
    let s = p.to_string_lossy();
    match s.strip_suffix(" (deleted)").map(std::path::PathBuf::from) {
        Some(live) if live.exists() => live,
        _ => p,
    }
}

static SELF_EXE: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

/// How a child ended, for people: "exit status 3", "killed by signal 9".
pub fn describe_exit(status: std::process::ExitStatus) -> String {
    match (status.code(), exit_signal(status)) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        (None, None) => status.to_string(),
    }
}

#[cfg(test)]
mod undeleted_tests {
    #[test]
    fn a_replaced_executable_is_started_by_its_path() {
        let d = tempfile::tempdir().unwrap();
        let exe = d.path().join("gatewarden");
        std::fs::write(&exe, "new").unwrap();
        let deleted = std::path::PathBuf::from(format!("{} (deleted)", exe.display()));
        assert_eq!(super::undeleted(deleted), exe);
        let gone = d.path().join("gone (deleted)");
        assert_eq!(super::undeleted(gone.clone()), gone, "no live path: unchanged");
    }
}
