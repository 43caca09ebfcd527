//! Unix half of what `supervise`, `doctor` and `update` need from the OS beyond processes
//! (those are crates/lifecycle/src/platform/spawn): stop signals, file modes (see `mod.rs`).

use std::io;
use std::sync::mpsc::Sender;

use super::Event;

/// Forwards SIGTERM, SIGINT and SIGHUP as [`Event::Stop`]. Handlers are installed before this
/// returns, so no signal is lost to the default action afterwards.
pub fn forward_stop_events(tx: Sender<Event>) -> io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let (mut term, mut int, mut hup) = {
        let _g = rt.enter();
        (signal(SignalKind::terminate())?, signal(SignalKind::interrupt())?, signal(SignalKind::hangup())?)
    };
    std::thread::Builder::new().name("supervise-signals".into()).spawn(move || {
        rt.block_on(async move {
            loop {
                let what = tokio::select! {
                    _ = term.recv() => "SIGTERM",
                    _ = int.recv() => "SIGINT",
                    _ = hup.recv() => "SIGHUP",
                };
                if tx.send(Event::Stop { channel: "signal", what }).is_err() {
                    return;
                }
            }
        });
    })?;
    Ok(())
}

/// Unix permission bits of `meta`.
pub fn mode(meta: &std::fs::Metadata) -> Option<u32> {
    use std::os::unix::fs::PermissionsExt;
    Some(meta.permissions().mode())
}

/// The owner's uid when it is not our effective uid.
pub fn foreign_owner(meta: &std::fs::Metadata) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let me = rustix::process::geteuid().as_raw();
    (meta.uid() != me).then_some(meta.uid())
}

/// Whether we run as root (`gatewarden dashboard` then says whose homes it serves).
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// `update`: a staged or swapped binary is runnable by its owner and readable by all (0755).
pub fn make_executable(path: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
}
