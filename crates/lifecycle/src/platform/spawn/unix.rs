//! Unix: sessions, process groups, descriptor hand-over, `waitpid`.

use std::io;
use std::net::TcpListener;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus};

use rustix::io::Errno;
use rustix::process::{Pid, WaitOptions, wait};

use super::Reaped;

/// The descriptor number the successor finds the listener at.
const INHERITED_FD: RawFd = 3;

pub fn detach(cmd: &mut Command, listener: Option<&TcpListener>) -> Option<String> {
    let fd = listener.map(AsRawFd::as_raw_fd);
    // SAFETY: between fork and exec only async-signal-safe system calls run (setsid, dup2,
    // fcntl through rustix's raw syscalls); nothing allocates or takes locks.
    unsafe {
        cmd.pre_exec(move || {
            // A new session: the successor survives the old gateway's process group, session
            // and terminal.
            rustix::process::setsid().map_err(io::Error::from)?;
            if let Some(fd) = fd {
                let src = rustix::fd::BorrowedFd::borrow_raw(fd);
                if fd == INHERITED_FD {
                    // dup2 onto itself would keep CLOEXEC; clear it instead.
                    rustix::io::fcntl_setfd(src, rustix::io::FdFlags::empty()).map_err(io::Error::from)?;
                } else {
                    let mut target = rustix::fd::OwnedFd::from_raw_fd(INHERITED_FD);
                    let r = rustix::io::dup2(src, &mut target);
                    // Ownership stays with the child's descriptor table, not this guard.
                    std::mem::forget(target);
                    r.map_err(io::Error::from)?;
                }
            }
            Ok(())
        });
    }
    fd.map(|_| INHERITED_FD.to_string())
}

pub fn adopt_listener(value: &str) -> io::Result<TcpListener> {
    let fd: RawFd =
        value.parse().map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "not a descriptor number"))?;
    if fd < 3 {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "refusing to adopt stdin/stdout/stderr"));
    }
    // SAFETY: the descriptor was handed to us by our predecessor at exec; we check below that
    // it is a listening TCP socket before using it, and it is owned by nothing else here.
    let l = unsafe { TcpListener::from_raw_fd(fd) };
    l.local_addr()?;
    rustix::io::fcntl_setfd(&l, rustix::io::FdFlags::CLOEXEC).map_err(io::Error::from)?;
    l.set_nonblocking(true)?;
    Ok(l)
}

/// A detached child keeps our stdout/stderr here, so a CLI can hand its work to one and still
/// show its output.
pub const DETACH_KEEPS_OUTPUT: bool = true;

/// The `--inherit-listener` value for a listener that survives an `exec` of this process.
pub fn listener_handle(l: &TcpListener) -> Option<String> {
    Some(l.as_raw_fd().to_string())
}

/// Replaces this process's image (same pid, same session), keeping `listener` open across the
/// exec; returns only on failure.
pub fn exec_in_place(mut cmd: Command, listener: Option<TcpListener>) -> io::Error {
    if let Some(l) = &listener
        && let Err(e) = rustix::io::fcntl_setfd(l, rustix::io::FdFlags::empty())
    {
        return e.into();
    }
    let err = cmd.exec();
    drop(listener);
    err
}

pub fn own_process_group(cmd: &mut Command) {
    cmd.process_group(0);
}

pub fn kill_process_group(pgid: u32) {
    signal_group(pgid, rustix::process::Signal::KILL);
}

fn signal_group(pgid: u32, sig: rustix::process::Signal) {
    if let Some(pid) = i32::try_from(pgid).ok().and_then(Pid::from_raw) {
        // ESRCH (group already gone) is the common, harmless case. The group id cannot be
        // reused while any member lives; once all are gone, a stranger would need to get this
        // very pid and make it a group leader between our reaping the leader and this call
        // (microseconds, with sequential pid allocation): accepted.
        let _ = rustix::process::kill_process_group(pid, sig);
    }
}

/// A spawned child's process group, which the child leads ([`ProcessGroup::prepare`]): every
/// descendant that does not call `setsid`/`setpgid` itself is a member.
#[derive(Debug)]
pub struct ProcessGroup {
    pgid: Option<u32>,
}

impl ProcessGroup {
    /// Before spawning: the child leads its own group.
    pub fn prepare(cmd: &mut Command) {
        own_process_group(cmd);
    }

    /// Right after spawning `pid` (its group id), before it is waited on.
    pub fn attach(pid: Option<u32>) -> ProcessGroup {
        ProcessGroup { pgid: pid }
    }

    /// Asks every member to exit (SIGTERM).
    pub fn terminate(&self) {
        if let Some(pgid) = self.pgid {
            signal_group(pgid, rustix::process::Signal::TERM);
        }
    }

    /// Kills every member at once (SIGKILL).
    pub fn kill(&self) {
        if let Some(pgid) = self.pgid {
            kill_process_group(pgid);
        }
    }
}

pub fn exit_signal(status: ExitStatus) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt;
    status.signal()
}

/// If `child` has exited: SIGKILL what is left of its process group, then reap it. The group
/// is killed *before* the reap, while the exited child still reserves its pid (and so the
/// group id): after the reap a new, unrelated group could get that id.
pub fn reap_with_group(child: &mut Child) -> io::Result<Option<ExitStatus>> {
    use rustix::process::{WaitId, WaitIdOptions, waitid};
    let Some(pid) = i32::try_from(child.id()).ok().and_then(Pid::from_raw) else { return child.try_wait() };
    let opts = WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT;
    match waitid(WaitId::Pid(pid), opts) {
        Ok(Some(_)) => {
            kill_process_group(child.id());
            child.wait().map(Some)
        }
        Ok(None) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Runs `cmd` as `uid:gid` (supplementary groups dropped by std when we are root).
pub fn run_as(cmd: &mut Command, uid: u32, gid: u32) {
    cmd.uid(uid).gid(gid);
}

/// A regular file with an execute bit (following links: a venv's `bin/python` is one).
pub fn is_executable(p: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Spawns `cmd` and reports its end (and every orphan reaped meanwhile) through `report`.
///
/// A waiter thread blocks in `waitpid(-1)`: it reaps *any* child of this process, so when we
/// are PID 1 of a PID namespace (or a subreaper) orphans re-parented to us never stay zombies.
/// The caller must not spawn other children whose status it needs while a child is watched.
pub fn spawn_watched(cmd: &mut Command, mut report: impl FnMut(Reaped) + Send + 'static) -> io::Result<u32> {
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
                        let (code, signal) = (status.exit_status(), status.terminating_signal());
                        report(Reaped::Child { pid, code, signal });
                        return;
                    }
                    report(Reaped::Orphan { pid: p });
                }
                Ok(None) | Err(Errno::INTR) => {}
                Err(_) => {
                    // ECHILD: somebody else reaped it; its status is lost.
                    report(Reaped::Child { pid, code: None, signal: None });
                    return;
                }
            }
        }
    })?;
    Ok(pid)
}

/// As PID 1 of a PID namespace (a container running `gatewarden run`), orphans are re-parented
/// to us: a background process an exec agent left, the rest of a run's process group killed
/// after its leader exited, a detached updater or backstop. Nobody else would reap them.
///
/// A thread looks at `/proc` once a second for zombie children of ours and reaps those still
/// zombies `grace` after it first saw them. It never takes a status one of our own waiters
/// wants: those reap at once (tokio's SIGCHLD handler for the exec backend, the hermes
/// supervisor's and the doctor's `try_wait` polls, at least once a second), so a zombie left
/// for `grace` has no waiter. False (nothing started) where there is no procfs.
pub fn reap_orphans(grace: std::time::Duration) -> bool {
    use std::collections::HashMap;
    use std::time::Instant;
    if !std::path::Path::new("/proc/self/stat").exists() {
        return false;
    }
    let me = std::process::id();
    let spawned = std::thread::Builder::new().name("pid1-reaper".into()).spawn(move || {
        let mut seen: HashMap<u32, Instant> = HashMap::new();
        loop {
            std::thread::sleep(std::time::Duration::from_secs(1));
            let zombies = zombie_children(me);
            seen.retain(|pid, _| zombies.contains(pid));
            for pid in zombies {
                let first = *seen.entry(pid).or_insert_with(Instant::now);
                if first.elapsed() < grace {
                    continue;
                }
                if let Some(p) = i32::try_from(pid).ok().and_then(Pid::from_raw) {
                    // ECHILD: its owner reaped it meanwhile, which is as good.
                    let _ = rustix::process::waitpid(Some(p), WaitOptions::NOHANG);
                }
                seen.remove(&pid);
            }
        }
    });
    spawned.is_ok()
}

/// The children of `me` that are zombies, from `/proc/<pid>/stat` (empty without procfs).
pub fn zombie_children(me: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_str()?.parse::<u32>().ok()?;
            let stat = std::fs::read(e.path().join("stat")).ok()?;
            let (state, ppid) = stat_state_ppid(&stat)?;
            (state == 'Z' && ppid == me).then_some(pid)
        })
        .collect()
}

/// Fields 3 (`state`) and 4 (`ppid`) of a `/proc/<pid>/stat` line, counted after the command
/// name's last `)` like [`stat_pgid`].
fn stat_state_ppid(stat: &[u8]) -> Option<(char, u32)> {
    let end = stat.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&stat[end + 1..]).ok()?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    Some((state, fields.next()?.parse().ok()?))
}

/// Whether this process is PID 1 (of the machine or of a PID namespace).
pub fn is_pid1() -> bool {
    rustix::process::getpid().is_init()
}

/// The real user id (the launchd `gui/<uid>` domain).
pub fn real_uid() -> u32 {
    rustix::process::getuid().as_raw()
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

    #[test]
    fn state_and_ppid_are_read_after_the_command_name() {
        assert_eq!(super::stat_state_ppid(b"42 (sh) Z 1 40 40 0 -1"), Some(('Z', 1)));
        assert_eq!(super::stat_state_ppid(b"42 (a) Z) (c) S 7 77 40 0"), Some(('S', 7)));
        assert_eq!(super::stat_state_ppid(b"42 (sh)"), None);
    }
}
