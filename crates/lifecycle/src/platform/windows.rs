//! Windows: `OpenProcess` + `WaitForSingleObject` + `GetProcessTimes`; never `kill(pid, 0)`,
//! which CPython maps to `TerminateProcess` and which is how hermes-agent killed processes it
//! only meant to probe.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::windows::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use windows_sys::Win32::Foundation::{CloseHandle, FILETIME, GetLastError, HANDLE};
use windows_sys::Win32::System::Threading::{
    GetProcessTimes, OpenProcess, PROCESS_QUERY_LIMITED_INFORMATION, PROCESS_SYNCHRONIZE, PROCESS_TERMINATE,
    TerminateProcess, WaitForSingleObject,
};

use super::{Signal, SignalOutcome};
use crate::identity::ProcessIdentity;
use crate::liveness::{Liveness, WinOpen, classify_windows, filetime_to_centis};

struct Handle(HANDLE);

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: the handle came from OpenProcess and is closed exactly once.
        unsafe { CloseHandle(self.0) };
    }
}

fn open(pid: u32, access: u32) -> Result<Handle, u32> {
    // SAFETY: plain FFI call; a null return is handled.
    let h = unsafe { OpenProcess(access, 0, pid) };
    if h.is_null() {
        // SAFETY: reads the calling thread's last-error value.
        Err(unsafe { GetLastError() })
    } else {
        Ok(Handle(h))
    }
}

fn created(h: &Handle) -> Option<u64> {
    let zero = FILETIME { dwLowDateTime: 0, dwHighDateTime: 0 };
    let (mut c, mut e, mut k, mut u) = (zero, zero, zero, zero);
    // SAFETY: valid handle and four writable FILETIMEs.
    let ok = unsafe { GetProcessTimes(h.0, &mut c, &mut e, &mut k, &mut u) };
    if ok == 0 {
        return None;
    }
    filetime_to_centis((u64::from(c.dwHighDateTime) << 32) | u64::from(c.dwLowDateTime))
}

fn facts(h: &Handle) -> WinOpen {
    // SAFETY: valid handle opened with SYNCHRONIZE.
    let wait = unsafe { WaitForSingleObject(h.0, 0) };
    WinOpen::Opened { wait, created: created(h) }
}

pub fn probe(pid: u32) -> Liveness {
    if pid == 4 {
        // The System process: never ours, never signalled, always there.
        return Liveness::Alive { start_time: None };
    }
    match open(pid, PROCESS_QUERY_LIMITED_INFORMATION | PROCESS_SYNCHRONIZE) {
        Ok(h) => classify_windows(facts(&h)),
        Err(code) => classify_windows(WinOpen::Failed(code)),
    }
}

pub fn start_time(pid: u32) -> Option<u64> {
    open(pid, PROCESS_QUERY_LIMITED_INFORMATION).ok().and_then(|h| created(&h))
}

/// Verification and termination use the same handle, so the pid cannot be recycled between
/// the check and the kill.
pub fn signal_verified(id: &ProcessIdentity, sig: Signal) -> SignalOutcome {
    if sig != Signal::Kill {
        return SignalOutcome::Unsupported;
    }
    let h = match open(id.pid, PROCESS_QUERY_LIMITED_INFORMATION | PROCESS_SYNCHRONIZE | PROCESS_TERMINATE) {
        Ok(h) => h,
        Err(code) => {
            return match classify_windows(WinOpen::Failed(code)) {
                Liveness::Dead => SignalOutcome::Gone,
                Liveness::Alive { .. } => SignalOutcome::Unverifiable(format!("access denied (Windows error {code})")),
                Liveness::Unknown { reason } => SignalOutcome::Unverifiable(reason),
            };
        }
    };
    match classify_windows(facts(&h)) {
        Liveness::Dead => SignalOutcome::Gone,
        Liveness::Alive { start_time: Some(t) } if t == id.start_time => {
            // SAFETY: valid handle opened with PROCESS_TERMINATE.
            if unsafe { TerminateProcess(h.0, 1) } != 0 {
                SignalOutcome::Sent
            } else {
                // SAFETY: reads the calling thread's last-error value.
                SignalOutcome::Failed(format!("TerminateProcess failed with Windows error {}", unsafe {
                    GetLastError()
                }))
            }
        }
        Liveness::Alive { start_time: Some(_) } => SignalOutcome::Mismatch,
        Liveness::Alive { start_time: None } => SignalOutcome::Unverifiable("creation time unreadable".into()),
        Liveness::Unknown { reason } => SignalOutcome::Unverifiable(reason),
    }
}

/// `FILE_FLAG_OPEN_REPARSE_POINT`: open a symlink or junction itself instead of its target, so
/// [`is_link`] can refuse it.
const FILE_FLAG_OPEN_REPARSE_POINT: u32 = 0x0020_0000;

pub fn no_follow(opts: &mut OpenOptions, _nonblocking: bool) {
    // Named pipes cannot live in a directory, so there is nothing to block on.
    opts.custom_flags(FILE_FLAG_OPEN_REPARSE_POINT);
}

/// ERROR_TOO_MANY_OPEN_FILES, ERROR_NOT_ENOUGH_MEMORY, ERROR_OUTOFMEMORY,
/// ERROR_SHARING_VIOLATION, ERROR_LOCK_VIOLATION (a scanner holding the file briefly).
pub fn is_transient(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(4 | 8 | 14 | 32 | 33))
}

pub fn canonical(path: &Path) -> io::Result<PathBuf> {
    let p = std::fs::canonicalize(path)?;
    // Strip the verbatim prefix so the path matches what users and hermes write.
    let s = p.to_string_lossy();
    Ok(match s.strip_prefix(r"\\?\") {
        Some(rest) if !rest.starts_with("UNC\\") => PathBuf::from(rest),
        _ => p,
    })
}

/// Bytes the calling user may still write on the volume holding `path`
/// (`GetDiskFreeSpaceExW`, which honours quotas); `None` when it cannot be asked.
pub fn free_space(path: &Path) -> Option<u64> {
    use std::os::windows::ffi::OsStrExt;
    let wide: Vec<u16> = path.as_os_str().encode_wide().chain(std::iter::once(0)).collect();
    let mut free: u64 = 0;
    // SAFETY: a NUL-terminated wide path and one writable u64; the other outputs are optional.
    let ok = unsafe {
        windows_sys::Win32::Storage::FileSystem::GetDiskFreeSpaceExW(
            wide.as_ptr(),
            &mut free,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    (ok != 0).then_some(free)
}

pub use super::without_owners::{
    create_private_dir, create_private_dir_new, credentials, dir_facts, is_link, kill_tagged, link_refused,
    lock_holders, node_facts, open_node_facts, parent_pid, private_on_create, set_private_file, sync_dir,
};
pub use super::without_procfs::{
    argv, cgroup, cmdline, environ, is_stopped, port_listeners, process_uid, process_usage, processes_with_env,
    release_startup_pages, systemd_main_pid,
};

/// Makes the standard error handle the standard output handle too and returns the original.
pub fn stdout_to_stderr() -> io::Result<File> {
    use std::os::windows::io::{AsRawHandle, FromRawHandle};
    use windows_sys::Win32::Foundation::{DUPLICATE_SAME_ACCESS, DuplicateHandle};
    use windows_sys::Win32::System::Console::{STD_OUTPUT_HANDLE, SetStdHandle};
    use windows_sys::Win32::System::Threading::GetCurrentProcess;
    let out = std::io::stdout().as_raw_handle() as HANDLE;
    let err = std::io::stderr().as_raw_handle() as HANDLE;
    let mut saved: HANDLE = std::ptr::null_mut();
    // SAFETY: both handles are this process's standard handles, valid for the call; `saved`
    // is a fresh handle owned by the File returned.
    unsafe {
        let me = GetCurrentProcess();
        if DuplicateHandle(me, out, me, &mut saved, 0, 0, DUPLICATE_SAME_ACCESS) == 0 {
            return Err(io::Error::last_os_error());
        }
        if SetStdHandle(STD_OUTPUT_HANDLE, err) == 0 {
            let e = io::Error::last_os_error();
            CloseHandle(saved);
            return Err(e);
        }
        Ok(File::from_raw_handle(saved as _))
    }
}

/// One line from stdin; on a console its echo is off while it is typed.
pub fn read_hidden_line() -> io::Result<String> {
    use std::io::BufRead;
    use std::os::windows::io::AsRawHandle;
    use windows_sys::Win32::System::Console::{ENABLE_ECHO_INPUT, GetConsoleMode, SetConsoleMode};
    let handle = std::io::stdin().as_raw_handle() as HANDLE;
    let mut mode = 0u32;
    // SAFETY: the process's own stdin handle and a local out-parameter.
    let console = unsafe { GetConsoleMode(handle, &mut mode) } != 0;
    if console {
        // SAFETY: as above.
        unsafe { SetConsoleMode(handle, mode & !ENABLE_ECHO_INPUT) };
    }
    let mut line = String::new();
    let read = std::io::stdin().lock().read_line(&mut line);
    if console {
        // SAFETY: as above; the mode read before.
        unsafe { SetConsoleMode(handle, mode) };
        eprintln!();
    }
    read.map(|_| line)
}
