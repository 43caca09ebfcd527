use std::fs::OpenOptions;
use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use super::Halves;
use crate::Endpoint;

/// `ERROR_PIPE_BUSY`: every server instance is in use; another is created right after accept.
const ERROR_PIPE_BUSY: i32 = 231;
const ERROR_CALL_NOT_IMPLEMENTED: i32 = 120;

/// Whether the pipe's server process runs as our user: its token's user SID equals ours
/// (`GetNamedPipeServerProcessId` → `OpenProcessToken` → `TokenUser` → `EqualSid`).
fn server_is_same_user(pipe: &std::fs::File) -> io::Result<bool> {
    use std::os::windows::io::AsRawHandle;
    use windows_sys::Win32::Foundation::CloseHandle;
    use windows_sys::Win32::Security::EqualSid;
    use windows_sys::Win32::System::Pipes::GetNamedPipeServerProcessId;
    use windows_sys::Win32::System::Threading::{GetCurrentProcess, OpenProcess, PROCESS_QUERY_LIMITED_INFORMATION};

    let mut pid = 0u32;
    // SAFETY: a valid pipe handle owned by `pipe`, and a writable u32.
    if unsafe { GetNamedPipeServerProcessId(pipe.as_raw_handle(), &mut pid) } == 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: plain FFI; the handle is checked and closed below.
    let process = unsafe { OpenProcess(PROCESS_QUERY_LIMITED_INFORMATION, 0, pid) };
    if process.is_null() {
        return Err(io::Error::last_os_error());
    }
    let theirs = token_user(process);
    // SAFETY: a handle we opened above.
    unsafe { CloseHandle(process) };
    let theirs = theirs?;
    // SAFETY: the pseudo-handle of the current process needs no closing.
    let ours = token_user(unsafe { GetCurrentProcess() })?;
    // SAFETY: both buffers hold a TOKEN_USER filled by GetTokenInformation; their SID pointers
    // point into the same buffers, which live until the end of this function.
    Ok(unsafe { EqualSid(sid_of(&theirs), sid_of(&ours)) } != 0)
}

/// The `TokenUser` information of a process, in an 8-byte aligned buffer.
fn token_user(process: windows_sys::Win32::Foundation::HANDLE) -> io::Result<Vec<u64>> {
    use windows_sys::Win32::Foundation::CloseHandle;
    use windows_sys::Win32::Security::{GetTokenInformation, TOKEN_QUERY, TokenUser};
    use windows_sys::Win32::System::Threading::OpenProcessToken;

    let mut token = std::ptr::null_mut();
    // SAFETY: a valid process handle and a writable handle slot.
    if unsafe { OpenProcessToken(process, TOKEN_QUERY, &mut token) } == 0 {
        return Err(io::Error::last_os_error());
    }
    let mut len = 0u32;
    // SAFETY: a size query (null buffer, zero length) is allowed and only writes `len`.
    unsafe { GetTokenInformation(token, TokenUser, std::ptr::null_mut(), 0, &mut len) };
    let mut buf = vec![0u64; (len as usize).div_ceil(8).max(1)];
    let cap = u32::try_from(buf.len() * 8).unwrap_or(u32::MAX);
    // SAFETY: the buffer is writable for `cap` bytes.
    let ok = unsafe { GetTokenInformation(token, TokenUser, buf.as_mut_ptr().cast(), cap, &mut len) };
    // SAFETY: a handle we opened above.
    unsafe { CloseHandle(token) };
    if ok == 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(buf)
}

/// The user SID inside a `TOKEN_USER` buffer.
fn sid_of(buf: &[u64]) -> windows_sys::Win32::Security::PSID {
    let user = buf.as_ptr().cast::<windows_sys::Win32::Security::TOKEN_USER>();
    // SAFETY: the buffer holds a TOKEN_USER (see token_user); reading its first field.
    unsafe { (*user).User.Sid }
}

pub(crate) fn connect(ep: &Endpoint, _shared_folder: Option<&Path>, deadline: Instant) -> io::Result<Halves> {
    let Endpoint::Pipe(name) = ep else {
        return Err(io::Error::new(io::ErrorKind::Unsupported, "Unix sockets are not used on Windows"));
    };
    loop {
        match OpenOptions::new().read(true).write(true).open(name) {
            Ok(f) => {
                // Before believing a word: the server end must run as the same user as we do.
                match server_is_same_user(&f) {
                    Ok(true) => {}
                    Ok(false) => {
                        return Err(super::untrusted(format!(
                            "the process serving {name} runs as another user: not a gateway of ours"
                        )));
                    }
                    // Not implemented (some compatibility layers): nothing to verify with.
                    Err(e) if e.raw_os_error() == Some(ERROR_CALL_NOT_IMPLEMENTED) => {}
                    Err(e) => {
                        return Err(super::untrusted(format!("cannot verify who serves {name}: {e}")));
                    }
                }
                let r = f.try_clone()?;
                return Ok((Box::new(r), Box::new(f)));
            }
            Err(e) if e.raw_os_error() == Some(ERROR_PIPE_BUSY) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(e),
        }
    }
}

pub(crate) fn uid() -> u32 {
    0
}

/// Named pipes have no folder. Who may create or open them is decided by the pipe's DACL
/// (see crates/runtime/src/control/windows.rs); the client checks the server process's user in
/// `connect`.
pub(crate) fn check_private_dir(_dir: &std::path::Path) -> Result<(), String> {
    Ok(())
}

pub(crate) fn prepare_private_dir(_dir: &std::path::Path) -> Result<(), String> {
    Ok(())
}
