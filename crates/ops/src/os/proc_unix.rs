//! Unix half of the process facade (see `mod.rs`).

use std::io;
use std::process::Command;
use std::sync::mpsc::Sender;

use gatewarden_service::supervise::ChildExit;
use rustix::io::Errno;
use rustix::process::{WaitOptions, wait};

use super::Event;

/// Spawns `cmd` and reports its end (and every orphan reaped meanwhile) on `tx`.
///
/// A waiter thread blocks in `waitpid(-1)`: it reaps *any* child of this process, so when we
/// are PID 1 of a PID namespace (or a subreaper) orphans re-parented to us never stay zombies.
/// The caller must not spawn other children whose status it needs while a child is watched.
pub fn spawn_watched(cmd: &mut Command, tx: Sender<Event>) -> io::Result<u32> {
    let child = cmd.spawn()?;
    let pid = child.id();
    // std never reaps on drop; the waiter below does.
    drop(child);
    std::thread::Builder::new().name("supervise-wait".into()).spawn(move || {
        loop {
            match wait(WaitOptions::empty()) {
                Ok(Some((p, status))) => {
                    let p = u32::try_from(p.as_raw_nonzero().get()).unwrap_or(0);
                    if p == pid {
                        let exit = match (status.exit_status(), status.terminating_signal()) {
                            (Some(c), _) => ChildExit::Code(c),
                            (None, Some(s)) => ChildExit::Signal(s),
                            (None, None) => ChildExit::Unknown,
                        };
                        let _ = tx.send(Event::ChildExited { pid, exit });
                        return;
                    }
                    let _ = tx.send(Event::OrphanReaped { pid: p });
                }
                Ok(None) | Err(Errno::INTR) => {}
                Err(_) => {
                    // ECHILD: somebody else reaped it; its status is lost.
                    let _ = tx.send(Event::ChildExited { pid, exit: ChildExit::Unknown });
                    return;
                }
            }
        }
    })?;
    Ok(pid)
}

/// Forwards SIGTERM, SIGINT and SIGHUP as [`Event::Stop`]. Handlers are installed before this
/// returns, so no signal is lost to the default action afterwards.
pub fn forward_stop_events(tx: Sender<Event>) -> io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let (mut term, mut int, mut hup) = {
        let _g = rt.enter();
        (signal(SignalKind::terminate())?, signal(SignalKind::interrupt())?, signal(SignalKind::hangup())?)
    };
    std::thread::Builder::new().name("supervise-signals".into()).spawn(move || {
        rt.block_on(async move {
            loop {
                let what = tokio::select! {
                    _ = term.recv() => "SIGTERM",
                    _ = int.recv() => "SIGINT",
                    _ = hup.recv() => "SIGHUP",
                };
                if tx.send(Event::Stop { channel: "signal", what }).is_err() {
                    return;
                }
            }
        });
    })?;
    Ok(())
}

/// Whether this process is PID 1 (of the machine or of a PID namespace).
pub fn is_pid1() -> bool {
    rustix::process::getpid().is_init()
}

/// The real user id (the launchd `gui/<uid>` domain).
#[cfg_attr(not(target_os = "macos"), allow(dead_code))]
pub fn uid() -> u32 {
    rustix::process::getuid().as_raw()
}

/// Replaces this process with `cmd`; returns only on failure.
pub fn exec_replace(cmd: &mut Command) -> io::Error {
    use std::os::unix::process::CommandExt;
    cmd.exec()
}

/// Unix permission bits of `meta`.
pub fn mode(meta: &std::fs::Metadata) -> Option<u32> {
    use std::os::unix::fs::PermissionsExt;
    Some(meta.permissions().mode())
}

/// The owner's uid when it is not our effective uid.
pub fn foreign_owner(meta: &std::fs::Metadata) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let me = rustix::process::geteuid().as_raw();
    (meta.uid() != me).then_some(meta.uid())
}

/// `update`: a staged or swapped binary is runnable by its owner and readable by all (0755).
pub fn make_executable(path: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
}

/// Every process and its process group, `(pid, pgid)`, from `/proc/<pid>/stat` (empty where
/// there is no procfs, e.g. macOS: there `update` cannot end candidates by group).
pub fn process_groups() -> Vec<(u32, u32)> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_str()?.parse::<u32>().ok()?;
            let stat = std::fs::read(e.path().join("stat")).ok()?;
            Some((pid, stat_pgid(&stat)?))
        })
        .collect()
}

/// Field 5 (`pgrp`) of a `/proc/<pid>/stat` line; the command name (field 2) may hold spaces
/// and parentheses, so fields are counted after its last `)`.
fn stat_pgid(stat: &[u8]) -> Option<u32> {
    let end = stat.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&stat[end + 1..]).ok()?;
    rest.split_whitespace().nth(2)?.parse().ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn pgid_is_read_after_the_command_name() {
        assert_eq!(super::stat_pgid(b"42 (sh) S 1 40 40 0 -1"), Some(40));
        assert_eq!(super::stat_pgid(b"42 (a) b) (c) S 1 77 40 0"), Some(77));
        assert_eq!(super::stat_pgid(b"garbage"), None);
    }
}
