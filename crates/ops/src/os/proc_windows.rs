//! Windows half of what `supervise`, `doctor` and `update` need from the OS beyond processes
//! (those are crates/lifecycle/src/platform/spawn): console events, file modes (see `mod.rs`).

use std::io;
use std::sync::mpsc::Sender;

use super::Event;

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

/// Windows has no permission bits.
pub fn mode(_meta: &std::fs::Metadata) -> Option<u32> {
    None
}

/// Windows homes live in the per-user profile; ownership is the ACL's business.
pub fn foreign_owner(_meta: &std::fs::Metadata) -> Option<u32> {
    None
}

/// Windows has no root account that could serve another user's homes.
pub fn is_root() -> bool {
    false
}

/// `update`: on Windows any file named `.exe` is runnable; nothing to set.
pub fn make_executable(_path: &std::path::Path) -> std::io::Result<()> {
    Ok(())
}
