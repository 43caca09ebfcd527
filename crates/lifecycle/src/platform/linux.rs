//! Linux: `/proc/<pid>/stat` for state and start time, `pidfd` for race-free signalling.

use std::path::Path;

use rustix::io::Errno;
use rustix::process::{Pid, PidfdFlags, pidfd_open, pidfd_send_signal};

pub use super::unix::{
    canonical, create_private_dir, create_private_dir_new, credentials, dir_facts, free_space, is_link, is_transient,
    link_refused, no_follow, node_facts, private_on_create, read_hidden_line, set_private_file, stdout_to_stderr,
    sync_dir,
};
use super::unix::{kill, kill_zero, to_rustix};
use super::{AclEntry, AclTag, NodeFacts, Signal, SignalOutcome};
use crate::identity::{IdentityCheck, ProcessIdentity, check_against};
use crate::liveness::{KillZero, Liveness, ProcStat, classify_unix};
use crate::procfs::parse_proc_stat;

fn proc_stat(pid: u32) -> ProcStat {
    match std::fs::read(Path::new("/proc").join(pid.to_string()).join("stat")) {
        Ok(bytes) => match parse_proc_stat(&bytes) {
            Some((state, start_time)) => ProcStat::Read { state, start_time },
            None => ProcStat::Unreadable,
        },
        Err(_) => ProcStat::Unreadable,
    }
}

pub fn probe(pid: u32) -> Liveness {
    let k = kill_zero(pid);
    let live = classify_unix(k, proc_stat(pid));
    if live == (Liveness::Alive { start_time: None }) && kill_zero(pid) == KillZero::NoSuchProcess {
        // The stat read lost a race with the exit.
        return Liveness::Dead;
    }
    live
}

pub fn start_time(pid: u32) -> Option<u64> {
    match proc_stat(pid) {
        ProcStat::Read { start_time, .. } => Some(start_time),
        ProcStat::Unreadable => None,
    }
}

/// Opens a pidfd first, then re-verifies the start time, then signals through the pidfd: the
/// pidfd pins the process, so a pid recycled after the check cannot receive the signal.
pub fn signal_verified(id: &ProcessIdentity, sig: Signal) -> SignalOutcome {
    let Some(pid) = i32::try_from(id.pid).ok().and_then(Pid::from_raw) else {
        return SignalOutcome::Gone;
    };
    let pidfd = match pidfd_open(pid, PidfdFlags::empty()) {
        Ok(fd) => Some(fd),
        Err(Errno::SRCH) => return SignalOutcome::Gone,
        // Kernels before 5.3, or seccomp: fall back to check-then-kill.
        Err(_) => None,
    };
    match check_against(id, probe(id.pid)) {
        IdentityCheck::Same => {}
        IdentityCheck::Gone => return SignalOutcome::Gone,
        IdentityCheck::Different { .. } => return SignalOutcome::Mismatch,
        IdentityCheck::Unverifiable(why) => return SignalOutcome::Unverifiable(why),
    }
    let sent = match &pidfd {
        Some(fd) => pidfd_send_signal(fd, to_rustix(sig)).map_err(std::io::Error::from),
        None => kill(id.pid, sig),
    };
    match sent {
        Ok(()) => SignalOutcome::Sent,
        Err(e) if e.raw_os_error() == Some(Errno::SRCH.raw_os_error()) => SignalOutcome::Gone,
        Err(e) => SignalOutcome::Failed(e.to_string()),
    }
}

/// Holders of the flock on `path`, from `/proc/locks`.
pub fn lock_holders(path: &std::path::Path) -> Option<Vec<u32>> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    let dev = meta.dev();
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    let text = std::fs::read_to_string("/proc/locks").ok()?;
    Some(crate::procfs::parse_proc_locks(&text, major, minor, meta.ino()))
}

/// The argument vector of `pid` (`/proc/<pid>/cmdline`), `None` if it is gone or unreadable, or
/// has no arguments (a zombie, a kernel thread).
pub fn cmdline(pid: u32) -> Option<Vec<String>> {
    argv(pid).filter(|a| !a.is_empty())
}

/// The argument vector of `pid` as the kernel has it: empty for a zombie or a kernel thread
/// (something readable that is no program's command line), `None` if it is gone or unreadable.
pub fn argv(pid: u32) -> Option<Vec<String>> {
    let bytes = std::fs::read(proc_file(pid, "cmdline")).ok()?;
    Some(bytes.split(|b| *b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect())
}

/// The NUL-separated environment of `pid` (`/proc/<pid>/environ`); `None` if it is gone or
/// another user's.
pub fn environ(pid: u32) -> Option<Vec<u8>> {
    std::fs::read(proc_file(pid, "environ")).ok()
}

/// `/proc/<pid>/cgroup`.
pub fn cgroup(pid: u32) -> Option<String> {
    std::fs::read_to_string(proc_file(pid, "cgroup")).ok()
}

/// The uid a process runs as: `/proc/<pid>` belongs to it.
pub fn process_uid(pid: u32) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(Path::new("/proc").join(pid.to_string())).ok().map(|m| m.uid())
}

/// pids of processes whose environment has `key=value` and whose argv contains every word
/// of `argv_words` (`["gateway", "run"]`), ascending. Other users' processes are skipped
/// (unreadable).
pub fn processes_with_env(key: &str, value: &std::ffi::OsStr, argv_words: &[&str]) -> Vec<u32> {
    use std::os::unix::ffi::OsStrExt;
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    let want = value.as_bytes();
    let mut out = Vec::new();
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Some(env) = environ(pid) else { continue };
        let hit = env
            .split(|&b| b == 0)
            .any(|kv| kv.strip_prefix(key.as_bytes()).and_then(|r| r.strip_prefix(b"=")) == Some(want));
        if hit && argv(pid).is_some_and(|a| argv_words.iter().all(|w| a.iter().any(|x| x == w))) {
            out.push(pid);
        }
    }
    out.sort_unstable();
    out
}

fn proc_file(pid: u32, name: &str) -> std::path::PathBuf {
    Path::new("/proc").join(pid.to_string()).join(name)
}

/// The parent pid, from field 4 of `/proc/<pid>/stat`.
pub fn parent_pid(pid: u32) -> Option<u32> {
    let bytes = std::fs::read(Path::new("/proc").join(pid.to_string()).join("stat")).ok()?;
    crate::procfs::parse_proc_stat_ppid(&bytes)
}

/// Kills (SIGKILL) every process whose environment has `key=value` with `accept(value)`,
/// except this one. Each candidate is pinned with a pidfd, its environment re-read through
/// /proc after pinning, and signalled through the pidfd, so a recycled pid is never hit.
/// Processes of other users are skipped (their environment is unreadable). Returns the pids
/// killed.
pub fn kill_tagged(key: &str, accept: &dyn Fn(&str) -> bool) -> Vec<u32> {
    let me = std::process::id();
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    let tagged = |pid: u32| -> bool {
        environ(pid).is_some_and(|env| crate::procfs::environ_value(&env, key).is_some_and(accept))
    };
    let mut killed = Vec::new();
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        if pid == me || !tagged(pid) {
            continue;
        }
        let Some(raw) = i32::try_from(pid).ok().and_then(Pid::from_raw) else { continue };
        let Ok(fd) = pidfd_open(raw, PidfdFlags::empty()) else { continue };
        if tagged(pid) && pidfd_send_signal(&fd, rustix::process::Signal::KILL).is_ok() {
            killed.push(pid);
        }
    }
    killed
}

/// `MainPID` of the systemd unit whose cgroup we are in (`systemctl show`, bounded): the
/// evidence that the unit runs *this* process rather than an ancestor we inherited from.
pub fn systemd_main_pid() -> Option<u32> {
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let (unit, user) = crate::procfs::cgroup_service(&cgroup)?;
    let mut cmd = std::process::Command::new("systemctl");
    if user {
        cmd.arg("--user");
    }
    cmd.args(["show", "-p", "MainPID", "--value", &unit]);
    cmd.stdin(std::process::Stdio::null()).stderr(std::process::Stdio::null()).stdout(std::process::Stdio::piped());
    let mut child = cmd.spawn().ok()?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take()?, &mut out).ok()?;
    out.trim().parse().ok().filter(|p| *p != 0)
}

/// Whether the process is stopped (`T`) or traced (`t`); `None` when it cannot be read.
pub fn is_stopped(pid: u32) -> Option<bool> {
    let bytes = std::fs::read(Path::new("/proc").join(pid.to_string()).join("stat")).ok()?;
    crate::procfs::stat_state(&bytes).map(|c| c == 'T' || c == 't')
}

/// Who listens on TCP `port` (v4 or v6): socket inodes from `/proc/net/tcp*`, matched against
/// every readable `/proc/<pid>/fd`; each listener's gateway home is the directory of a
/// `gateway.lock` it holds open.
pub fn port_listeners(port: u16) -> Vec<super::PortListener> {
    let mut inodes = Vec::new();
    for f in ["/proc/net/tcp", "/proc/net/tcp6"] {
        if let Ok(t) = std::fs::read_to_string(f) {
            inodes.extend(crate::procfs::listening_inodes(&t, port));
        }
    }
    if inodes.is_empty() {
        return Vec::new();
    }
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut out = Vec::new();
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else { continue };
        let mut listens = false;
        let mut home = None;
        for fd in fds.flatten() {
            let Ok(target) = std::fs::read_link(fd.path()) else { continue };
            let t = target.to_string_lossy();
            if crate::procfs::socket_inode(&t).is_some_and(|i| inodes.contains(&i)) {
                listens = true;
            } else if target.file_name().is_some_and(|n| n == "gateway.lock") {
                home = target.parent().map(Path::to_path_buf);
            }
        }
        if listens {
            let program = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default().trim().to_owned();
            out.push(super::PortListener { pid, program, home });
        }
    }
    out
}

/// Gives back the pages of our own executable that start-up touched (see
/// [`crate::procfs::clean_file_mappings`]: clean file copies only), so an idle gateway keeps
/// only the code it runs while idle. The kernel maps a page again from the page cache the next
/// time it runs. Returns the bytes released from our page tables.
pub fn release_startup_pages() -> usize {
    let Ok(exe) = std::fs::read_link("/proc/self/exe") else { return 0 };
    let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else { return 0 };
    let mut released = 0;
    for (start, len) in crate::procfs::clean_file_mappings(&smaps, &exe.to_string_lossy()) {
        // SAFETY: the range is a whole mapping of our own executable that is private, not
        // writable and holds no anonymous page (checked in smaps just now; a read-only mapping
        // cannot gain one without an mprotect, which nothing here does), so its contents are
        // exactly the file's and MADV_DONTNEED only drops page-table entries.
        let r = unsafe { rustix::mm::madvise(start as *mut std::ffi::c_void, len, rustix::mm::Advice::LinuxDontNeed) };
        if r.is_ok() {
            released += len;
        }
    }
    released
}

/// CPU time, resident memory and threads from `/proc/<pid>/stat`.
pub fn process_usage(pid: u32) -> Option<super::ProcessUsage> {
    let bytes = std::fs::read(Path::new("/proc").join(pid.to_string()).join("stat")).ok()?;
    let (ticks, threads, pages) = crate::procfs::stat_usage(&bytes)?;
    let hz = rustix::param::clock_ticks_per_second().max(1);
    Some(super::ProcessUsage {
        cpu_s: ticks as f64 / hz as f64,
        rss_bytes: pages.saturating_mul(rustix::param::page_size() as u64),
        threads,
    })
}

/// An open file's facts with its POSIX access ACL, when it has one beyond the mode.
pub fn open_node_facts(file: &std::fs::File) -> std::io::Result<Option<NodeFacts>> {
    let mut n = super::unix::node(&file.metadata()?);
    // No attribute (ENODATA) or no ACLs on this file system: the mode says it all.
    let mut buf = [0u8; 4 + 8 * 64];
    if let Ok(len) = rustix::fs::fgetxattr(file, "system.posix_acl_access", &mut buf[..]) {
        n.acl = parse_acl(buf.get(..len).unwrap_or_default());
    }
    Ok(Some(n))
}

/// The kernel's `system.posix_acl_access` value: a little-endian version 2 header, then
/// `(tag: u16, perm: u16, id: u32)` per entry (linux/posix_acl_xattr.h). `None` when it is not
/// that, so a value we cannot read is judged by the mode alone (whose group bits are the mask,
/// the most any entry gets).
pub(crate) fn parse_acl(bytes: &[u8]) -> Option<Vec<AclEntry>> {
    let (head, rest) = bytes.split_first_chunk::<4>()?;
    if u32::from_le_bytes(*head) != 2 || rest.len() % 8 != 0 {
        return None;
    }
    rest.chunks_exact(8)
        .map(|e| {
            let tag = match u16::from_le_bytes([e[0], e[1]]) {
                0x01 => AclTag::UserObj,
                0x02 => AclTag::User,
                0x04 => AclTag::GroupObj,
                0x08 => AclTag::Group,
                0x10 => AclTag::Mask,
                0x20 => AclTag::Other,
                _ => return None,
            };
            let perm = u32::from(u16::from_le_bytes([e[2], e[3]]) & 0o7);
            Some(AclEntry { tag, id: u32::from_le_bytes([e[4], e[5], e[6], e[7]]), perm })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;

    #[test]
    fn kill_tagged_hits_only_matching_processes() {
        let key = format!("GW_TEST_TAG_{}", std::process::id());
        let spawn = |tag: &str| std::process::Command::new("sleep").arg("100").env(&key, tag).spawn().unwrap();
        let mut old = spawn("h1:old");
        let mut other_home = spawn("h2:old");
        let mut current = spawn("h1:new");
        let killed = super::kill_tagged(&key, &|v| v.starts_with("h1:") && v != "h1:new");
        assert_eq!(killed, vec![old.id()]);
        assert_eq!(old.wait().unwrap().signal(), Some(9));
        for c in [&mut other_home, &mut current] {
            assert!(c.try_wait().unwrap().is_none(), "a non-matching process was killed");
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    #[test]
    fn posix_acls_are_read_as_the_kernel_writes_them() {
        // What systemd leaves on a credential of a unit with User=1000 (0400 root, user:1000:r).
        let mut v = 2u32.to_le_bytes().to_vec();
        for (tag, perm, id) in
            [(0x01u16, 4u16, u32::MAX), (0x02, 4, 1000), (0x04, 0, u32::MAX), (0x10, 4, u32::MAX), (0x20, 0, u32::MAX)]
        {
            v.extend(tag.to_le_bytes());
            v.extend(perm.to_le_bytes());
            v.extend(id.to_le_bytes());
        }
        let acl = super::parse_acl(&v).unwrap();
        assert_eq!(acl.len(), 5);
        assert_eq!(acl[1], super::AclEntry { tag: super::AclTag::User, id: 1000, perm: 4 });
        assert_eq!(super::parse_acl(&v[..7]), None, "a torn value is not an ACL");
        assert_eq!(super::parse_acl(&[1, 0, 0, 0]), None, "an unknown version");
    }

    #[test]
    fn released_code_pages_run_again() {
        // The test binary's own code leaves its page tables, and runs again afterwards.
        let rss_file = || {
            let s = std::fs::read_to_string("/proc/self/status").unwrap();
            let line = s.lines().find(|l| l.starts_with("RssFile:")).unwrap().to_owned();
            line.split_ascii_whitespace().nth(1).unwrap().parse::<u64>().unwrap()
        };
        let before = rss_file();
        assert!(super::release_startup_pages() > 0, "no clean mapping of the test binary found");
        let after = rss_file();
        assert!(after < before, "RssFile {before} kB -> {after} kB");
        assert_eq!(crate::procfs::stat_state(b"1 (x) S 0"), Some('S'));
    }
}
