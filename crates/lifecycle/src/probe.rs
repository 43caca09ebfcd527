//! The one liveness primitive, and the pure decision logic behind it.
//!
//! [`probe`] is total: it never panics, never returns an error and never sends a signal.
//! The OS-specific facts are gathered in [`crate::platform`]; how those facts map to
//! [`Liveness`] lives here as pure functions so every mapping (including Windows error
//! codes) is unit-tested on any host.

/// The answer to "is this pid alive?".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Liveness {
    /// Alive. `start_time` is `None` when the OS would not tell (another user's process on
    /// macOS, `hidepid` on Linux).
    Alive { start_time: Option<u64> },
    /// Not running: never existed, exited, or a zombie.
    Dead,
    /// The OS gave an answer we cannot interpret. Callers must decide explicitly; the safe
    /// reading is "do not signal, do not assume dead".
    Unknown { reason: String },
}

impl Liveness {
    pub fn is_alive(&self) -> bool {
        matches!(self, Liveness::Alive { .. })
    }
}

/// Probes `pid`. See the module docs.
pub fn probe(pid: i64) -> Liveness {
    match valid_pid(pid) {
        Some(pid) => crate::platform::probe(pid),
        None => Liveness::Dead,
    }
}

/// [`probe`] for a pid already known to be positive, the shape marker classification takes.
pub fn probe_u32(pid: u32) -> Liveness {
    probe(i64::from(pid))
}

/// A pid we may hand to the OS: `1..=i32::MAX`. Zero and negatives address process groups on
/// Unix (`kill(0, _)`, `kill(-1, _)`), and values above `i32::MAX` become negative there.
pub fn valid_pid(pid: i64) -> Option<u32> {
    if (1..=i64::from(i32::MAX)).contains(&pid) { Some(pid as u32) } else { None }
}

/// Unix: what `kill(pid, 0)` said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillZero {
    Ok,
    /// ESRCH
    NoSuchProcess,
    /// EPERM: it exists but belongs to someone else.
    PermissionDenied,
    Other(i32),
}

/// Unix: the process state letter and start time from the process table, if readable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcStat {
    Read { state: char, start_time: u64 },
    Unreadable,
}

/// Pure Unix mapping. A zombie (or `X`, dead) is Dead even though `kill(pid, 0)` succeeds.
pub fn classify_unix(kill0: KillZero, stat: ProcStat) -> Liveness {
    match kill0 {
        KillZero::NoSuchProcess => Liveness::Dead,
        KillZero::Other(errno) => Liveness::Unknown { reason: format!("kill(pid, 0) failed with errno {errno}") },
        KillZero::Ok | KillZero::PermissionDenied => match stat {
            ProcStat::Read { state: 'Z' | 'X' | 'x', .. } => Liveness::Dead,
            ProcStat::Read { start_time, .. } => Liveness::Alive { start_time: Some(start_time) },
            ProcStat::Unreadable => Liveness::Alive { start_time: None },
        },
    }
}

/// Windows: `ERROR_ACCESS_DENIED`.
pub const WIN_ERROR_ACCESS_DENIED: u32 = 5;
/// Windows: `ERROR_INVALID_PARAMETER`, what `OpenProcess` says for a pid that does not exist.
pub const WIN_ERROR_INVALID_PARAMETER: u32 = 87;
/// Windows: `WAIT_OBJECT_0`: the process handle is signalled, i.e. the process has exited.
pub const WIN_WAIT_OBJECT_0: u32 = 0;
/// Windows: `WAIT_TIMEOUT`: not signalled, still running.
pub const WIN_WAIT_TIMEOUT: u32 = 0x102;

/// Windows: the facts gathered about one pid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WinOpen {
    /// `OpenProcess` failed with this `GetLastError` code.
    Failed(u32),
    /// `OpenProcess` succeeded; `wait` is what `WaitForSingleObject(h, 0)` returned and
    /// `created` the creation time in centiseconds since the Unix epoch, if `GetProcessTimes`
    /// answered.
    Opened { wait: u32, created: Option<u64> },
}

/// Pure Windows mapping: 87 → Dead, 5 → Alive, opened-but-exited → Dead, any other code →
/// Unknown. This is the decision hermes-agent got wrong one exception type at a time.
pub fn classify_windows(open: WinOpen) -> Liveness {
    match open {
        WinOpen::Failed(WIN_ERROR_INVALID_PARAMETER) => Liveness::Dead,
        WinOpen::Failed(WIN_ERROR_ACCESS_DENIED) => Liveness::Alive { start_time: None },
        WinOpen::Failed(code) => Liveness::Unknown { reason: format!("OpenProcess failed with Windows error {code}") },
        WinOpen::Opened { wait: WIN_WAIT_OBJECT_0, .. } => Liveness::Dead,
        WinOpen::Opened { wait: WIN_WAIT_TIMEOUT, created } => Liveness::Alive { start_time: created },
        WinOpen::Opened { wait, .. } => Liveness::Unknown { reason: format!("WaitForSingleObject returned {wait:#x}") },
    }
}

/// Windows `FILETIME` (100 ns ticks since 1601) → centiseconds since the Unix epoch, the unit
/// hermes-agent stores (`round(create_time * 100)`). `None` before 1970.
pub fn filetime_to_centis(ft: u64) -> Option<u64> {
    const EPOCH_DIFF_100NS: u64 = 116_444_736_000_000_000;
    ft.checked_sub(EPOCH_DIFF_100NS).map(|t| (t + 50_000) / 100_000)
}

/// Linux `/proc/<pid>/stat` → (state, starttime field 22). The command name may contain spaces
/// and parentheses, so split after the **last** `)`.
pub fn parse_proc_stat(content: &[u8]) -> Option<(char, u64)> {
    let close = content.iter().rposition(|&c| c == b')')?;
    let rest = std::str::from_utf8(content.get(close + 1..)?).ok()?;
    let mut fields = rest.split_ascii_whitespace();
    // After ")" come field 3 (state) .. field 22 (starttime): index 0 is field 3.
    let state = fields.next()?.chars().next()?;
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

/// The value of `key` in a NUL-separated environment block (`/proc/<pid>/environ`).
pub fn environ_value<'a>(environ: &'a [u8], key: &str) -> Option<&'a str> {
    environ.split(|&b| b == 0).find_map(|kv| {
        let rest = kv.strip_prefix(key.as_bytes())?.strip_prefix(b"=")?;
        std::str::from_utf8(rest).ok()
    })
}

/// Linux `/proc/<pid>/stat` → parent pid (field 4).
pub fn parse_proc_stat_ppid(content: &[u8]) -> Option<u32> {
    let close = content.iter().rposition(|&c| c == b')')?;
    let rest = std::str::from_utf8(content.get(close + 1..)?).ok()?;
    rest.split_ascii_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_pids_are_dead_without_asking_the_os() {
        for pid in [0, -1, -4242, i64::from(i32::MAX) + 1, i64::MAX, i64::MIN] {
            assert_eq!(probe(pid), Liveness::Dead, "pid {pid}");
        }
    }

    #[test]
    fn own_pid_is_alive_with_start_time() {
        match probe(i64::from(std::process::id())) {
            Liveness::Alive { start_time: Some(_) } => {}
            other => panic!("own process probed as {other:?}"),
        }
    }

    #[test]
    fn reaped_child_is_dead_and_zombie_is_dead() {
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .arg("--list")
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let pid = i64::from(child.id());
        // Not yet reaped: on Unix the exited child is a zombie until wait(); either way it
        // must never read as Alive once it has exited.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            match probe(pid) {
                Liveness::Dead => break,
                Liveness::Alive { .. } if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(5))
                }
                other => panic!("exited child probed as {other:?}"),
            }
        }
        child.wait().unwrap();
        assert_eq!(probe(pid), Liveness::Dead);
    }

    #[test]
    fn unix_mapping() {
        let read = ProcStat::Read { state: 'S', start_time: 7 };
        assert_eq!(classify_unix(KillZero::Ok, read.clone()), Liveness::Alive { start_time: Some(7) });
        assert_eq!(
            classify_unix(KillZero::PermissionDenied, ProcStat::Unreadable),
            Liveness::Alive { start_time: None }
        );
        assert_eq!(classify_unix(KillZero::NoSuchProcess, read), Liveness::Dead);
        assert_eq!(classify_unix(KillZero::Ok, ProcStat::Read { state: 'Z', start_time: 7 }), Liveness::Dead);
        assert!(matches!(classify_unix(KillZero::Other(5), ProcStat::Unreadable), Liveness::Unknown { .. }));
    }

    #[test]
    fn windows_mapping_for_every_code() {
        assert_eq!(classify_windows(WinOpen::Failed(87)), Liveness::Dead);
        assert_eq!(classify_windows(WinOpen::Failed(5)), Liveness::Alive { start_time: None });
        for code in [11, 6, 31, 1_450, u32::MAX] {
            assert!(matches!(classify_windows(WinOpen::Failed(code)), Liveness::Unknown { .. }), "{code}");
        }
        assert_eq!(classify_windows(WinOpen::Opened { wait: 0, created: Some(1) }), Liveness::Dead);
        assert_eq!(
            classify_windows(WinOpen::Opened { wait: 0x102, created: Some(9) }),
            Liveness::Alive { start_time: Some(9) }
        );
        assert!(matches!(
            classify_windows(WinOpen::Opened { wait: 0xFFFF_FFFF, created: None }),
            Liveness::Unknown { .. }
        ));
    }

    #[test]
    fn filetime_conversion_matches_hermes_centiseconds() {
        // 2026-01-01T00:00:00Z = 1767225600 s since the epoch.
        let ft = 116_444_736_000_000_000 + 1_767_225_600 * 10_000_000;
        assert_eq!(filetime_to_centis(ft), Some(176_722_560_000));
        assert_eq!(filetime_to_centis(0), None);
    }

    #[test]
    fn environ_lookup() {
        let env = b"A=1\0GATEWARDEN_RUN_TAG=ab:cd\0GATEWARDEN_RUN_TAGX=no\0\xff=\0";
        assert_eq!(environ_value(env, "GATEWARDEN_RUN_TAG"), Some("ab:cd"));
        assert_eq!(environ_value(env, "A"), Some("1"));
        assert_eq!(environ_value(env, "B"), None);
        assert_eq!(environ_value(b"", "A"), None);
    }

    #[test]
    fn proc_stat_with_hostile_comm() {
        let mut line = b"4242 (we ird) (x) R 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 3921877 19 20".to_vec();
        assert_eq!(parse_proc_stat(&line), Some(('R', 3_921_877)));
        assert_eq!(parse_proc_stat_ppid(&line), Some(1));
        line.truncate(20);
        assert_eq!(parse_proc_stat(&line), None);
        assert_eq!(parse_proc_stat(b"\xff\xfe)"), None);
    }

    proptest::proptest! {
        #[test]
        fn proc_stat_parser_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..300)) {
            let _ = parse_proc_stat(&bytes);
        }
    }
}
