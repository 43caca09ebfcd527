use std::path::Path;

/// Signal numbers, re-exported from libc for test readability.
pub mod sig {
    pub use libc::{SIGCONT, SIGHUP, SIGINT, SIGKILL, SIGPIPE, SIGQUIT, SIGSTOP, SIGTERM, SIGUSR1, SIGUSR2};
}

/// Whether `pid` has a handler installed for `signal` (`SigCgt` in `/proc/<pid>/status`): a
/// process that catches it no longer dies by its default action. `false` when unreadable.
pub fn catches_signal(pid: u32, signal: i32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let mask = status.lines().find_map(|l| l.strip_prefix("SigCgt:")).map(str::trim).unwrap_or("0");
    (1..=64).contains(&signal) && u64::from_str_radix(mask, 16).is_ok_and(|m| m & (1 << (signal - 1)) != 0)
}

/// Linux start-time fingerprint: field 22 of `/proc/<pid>/stat` (clock ticks since boot),
/// parsed after the LAST `)` so a `comm` containing `) ` cannot shift the fields.
/// `None` if the process does not exist (or on non-Linux).
pub fn proc_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    let stat = String::from_utf8_lossy(&stat);
    let rest = &stat[stat.rfind(')')? + 1..];
    // rest starts at field 3 (state); field 22 is index 19.
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// The one-letter state of `/proc/<pid>/stat` (`R`, `S`, `T` stopped, `Z` zombie, ...).
pub fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    let stat = String::from_utf8_lossy(&stat);
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().next()?.chars().next()
}

/// A process's resident memory (`VmRSS`), in bytes; 0 when it cannot be read.
pub fn rss_bytes(pid: u32) -> u64 {
    status_bytes(pid, "VmRSS:")
}

/// The anonymous part of a process's resident memory (`RssAnon`: heap and stacks, what the
/// code pages given back do not lower), in bytes; 0 when it cannot be read.
pub fn rss_anon_bytes(pid: u32) -> u64 {
    status_bytes(pid, "RssAnon:")
}

fn status_bytes(pid: u32, key: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

/// Whether `pid` names a live (non-zombie) process. Read-only: `kill(pid, 0)` sends nothing.
pub fn pid_alive(pid: u32) -> bool {
    if pid == 0 || pid > i32::MAX as u32 {
        return false;
    }
    // SAFETY: signal 0 performs only the existence/permission check.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    let alive = r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    alive && proc_state(pid).is_none_or(|s| s != 'Z' && s != 'X')
}

/// Sends `signal` to `pid`. Only use on pids the test owns (a `Child` not yet reaped).
pub fn send_signal(pid: u32, signal: i32) -> std::io::Result<()> {
    // SAFETY: plain kill(2).
    let r = unsafe { libc::kill(pid as libc::pid_t, signal) };
    if r == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

/// Pids holding any lock (flock, POSIX, OFD) on the inode of `path`, from `/proc/locks`.
/// Read-only: unlike a trial `flock`, it can never steal the lock from a gateway that is just
/// starting. (For OFD locks the kernel reports pid -1; those appear as `0`.)
pub fn lock_holders(path: &Path) -> Vec<u32> {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(path) else {
        return Vec::new();
    };
    let (ino, dev) = (meta.ino(), meta.dev());
    // dev_t is u64 on Linux and i32 on macOS.
    let (maj, min) = (libc::major(dev as libc::dev_t), libc::minor(dev as libc::dev_t));
    let Some(locks) = proc_locks() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for line in locks.lines() {
        // "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF"; blocked waiters have "->".
        if line.contains("->") {
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 6 {
            continue;
        }
        let mut parts = f[5].split(':');
        let (Some(a), Some(b), Some(i)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let ok = u64::from_str_radix(a, 16).ok() == Some(maj as u64)
            && u64::from_str_radix(b, 16).ok() == Some(min as u64)
            && i.parse::<u64>().ok() == Some(ino);
        if ok {
            out.push(f[4].parse::<i64>().map(|p| p.max(0) as u32).unwrap_or(0));
        }
    }
    out
}

/// `/proc/locks` in as few reads as the kernel allows (a page each). Each read() is one
/// snapshot of the kernel's list, and the next resumes at a line *number*: a lock taken or
/// released in between moves the lines after it, so one is skipped or shown twice.
/// `read_to_string` starts with a 32-byte probe and doubles from there (seen with strace), so
/// even a short file took several snapshots, and a holder's line went missing under a loaded
/// suite (host_env.rs).
fn proc_locks() -> Option<String> {
    use std::io::Read;
    let mut f = std::fs::File::open("/proc/locks").ok()?;
    let mut text = Vec::new();
    let mut page = vec![0u8; 64 * 1024];
    loop {
        match f.read(&mut page) {
            Ok(0) => return String::from_utf8(text).ok(),
            Ok(n) => text.extend_from_slice(&page[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
}

/// Whether any process holds a lock on `path` (see [`lock_holders`]).
pub fn lock_is_held(path: &Path) -> bool {
    !lock_holders(path).is_empty()
}

/// Linux: `cmd`'s process gets SIGKILL when the thread that spawned it ends
/// (`PR_SET_PDEATHSIG`), so a crashed or killed test never leaves a gateway or a server behind.
/// Elsewhere nothing (the test's own cleanup on drop still runs).
pub(crate) fn die_with_test(cmd: &mut std::process::Command) {
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    #[cfg(target_os = "linux")]
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0);
            Ok(())
        });
    }
    #[cfg(not(target_os = "linux"))]
    let _ = cmd;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn start_time_of_self_is_stable_and_dead_pid_has_none() {
        let me = std::process::id();
        let a = proc_start_time(me).expect("own start time");
        assert_eq!(Some(a), proc_start_time(me));
        assert!(pid_alive(me));
        let mut c = std::process::Command::new("true").spawn().unwrap();
        let pid = c.id();
        c.wait().unwrap();
        assert!(!pid_alive(pid));
        assert_eq!(proc_start_time(pid), None);
    }

    #[test]
    fn lock_holders_sees_flock() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.lock");
        let f = std::fs::File::create(&p).unwrap();
        assert!(!lock_is_held(&p));
        // SAFETY: flock on an owned fd.
        assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) }, 0);
        assert_eq!(lock_holders(&p), vec![std::process::id()]);
        drop(f);
        assert!(!lock_is_held(&p));
    }
}
