//! Liveness, and the pure mapping of each OS's answers onto it (including Windows error
//! codes), so every mapping is unit-tested on any host. The per-OS facade
//! (crates/lifecycle/src/platform) gathers the facts and calls these; [`crate::probe`] asks it.

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
