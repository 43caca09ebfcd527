use std::io;
use std::net::TcpListener;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::Command;

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
