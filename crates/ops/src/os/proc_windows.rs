//! Windows half of the process facade (see `mod.rs`).

use std::io;
use std::process::Command;
use std::sync::mpsc::Sender;

use gatewarden_service::supervise::ChildExit;

use super::Event;

/// Spawns `cmd` and reports its end on `tx`. Windows has no orphan re-parenting, so there is
/// nothing else to reap.
pub fn spawn_watched(cmd: &mut Command, tx: Sender<Event>) -> io::Result<u32> {
    let mut child = cmd.spawn()?;
    let pid = child.id();
    std::thread::Builder::new().name("supervise-wait".into()).spawn(move || {
        let exit = match child.wait() {
            Ok(s) => s.code().map_or(ChildExit::Unknown, ChildExit::Code),
            Err(_) => ChildExit::Unknown,
        };
        let _ = tx.send(Event::ChildExited { pid, exit });
    })?;
    Ok(pid)
}

/// Forwards console events (Ctrl+C, Ctrl+Break, close, logoff, shutdown) as [`Event::Stop`].
pub fn forward_stop_events(tx: Sender<Event>) -> io::Result<()> {
    use tokio::signal::windows;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let (mut c, mut b, mut close, mut logoff, mut shutdown) = {
        let _g = rt.enter();
        (
            windows::ctrl_c()?,
            windows::ctrl_break()?,
            windows::ctrl_close()?,
            windows::ctrl_logoff()?,
            windows::ctrl_shutdown()?,
        )
    };
    std::thread::Builder::new().name("supervise-console".into()).spawn(move || {
        rt.block_on(async move {
            loop {
                let what = tokio::select! {
                    _ = c.recv() => "CTRL_C",
                    _ = b.recv() => "CTRL_BREAK",
                    _ = close.recv() => "CTRL_CLOSE",
                    _ = logoff.recv() => "CTRL_LOGOFF",
                    _ = shutdown.recv() => "CTRL_SHUTDOWN",
                };
                if tx.send(Event::Stop { channel: "console", what }).is_err() {
                    return;
                }
            }
        });
    })?;
    Ok(())
}

/// Windows has no PID 1.
pub fn is_pid1() -> bool {
    false
}

/// Not meaningful on Windows.
#[allow(dead_code)]
pub fn uid() -> u32 {
    0
}

/// Windows cannot replace a process image; the caller falls back to running as is.
pub fn exec_replace(_cmd: &mut Command) -> io::Error {
    io::Error::new(io::ErrorKind::Unsupported, "exec is not available on Windows")
}

/// Windows has no permission bits.
pub fn mode(_meta: &std::fs::Metadata) -> Option<u32> {
    None
}

/// Windows homes live in the per-user profile; ownership is the ACL's business.
pub fn foreign_owner(_meta: &std::fs::Metadata) -> Option<u32> {
    None
}

/// `update`: on Windows any file named `.exe` is runnable; nothing to set.
pub fn make_executable(_path: &std::path::Path) -> std::io::Result<()> {
    Ok(())
}

/// Every process and its process group, `(pid, pgid)`: Windows has no process groups of this
/// kind (a candidate's tree is not tracked there).
pub fn process_groups() -> Vec<(u32, u32)> {
    Vec::new()
}
