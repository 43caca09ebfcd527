//! The per-OS process facade (`proc_unix.rs`, `proc_windows.rs`, identical signatures):
//! forwarding stop signals / console events, file modes and owners. Processes themselves (the
//! watched child, reaping orphans when PID 1, replacing the process image, the user id, process
//! groups) are lifecycle's per-OS facade, crates/lifecycle/src/platform/spawn;
//! [`spawn_watched`] only turns its reports into events. Decisions (what to do with an exit,
//! when to escalate) stay in the verb modules.

use gatewarden_service::supervise::ChildExit;

#[cfg_attr(unix, path = "proc_unix.rs")]
#[cfg_attr(windows, path = "proc_windows.rs")]
pub mod proc;

/// Something `supervise` is told while it waits.
#[derive(Debug)]
pub enum Event {
    /// The child ended.
    ChildExited { pid: u32, exit: ChildExit },
    /// An orphan (not our child) was reaped; we are PID 1 or a subreaper (Unix only).
    OrphanReaped { pid: u32 },
    /// A stop was requested by a signal or console event (`channel`, `what`).
    Stop { channel: &'static str, what: &'static str },
}

/// Spawns `cmd` as the supervised child (crates/lifecycle/src/platform/spawn) and reports its
/// end, and every orphan reaped meanwhile, on `tx`.
pub fn spawn_watched(cmd: &mut std::process::Command, tx: std::sync::mpsc::Sender<Event>) -> std::io::Result<u32> {
    use gatewarden_lifecycle::platform::spawn::{self, Reaped};
    spawn::spawn_watched(cmd, move |r| {
        let event = match r {
            Reaped::Child { pid, code, signal } => {
                let exit = match (code, signal) {
                    (Some(c), _) => ChildExit::Code(c),
                    (None, Some(s)) => ChildExit::Signal(s),
                    (None, None) => ChildExit::Unknown,
                };
                Event::ChildExited { pid, exit }
            }
            Reaped::Orphan { pid } => Event::OrphanReaped { pid },
        };
        // The receiver may be gone (supervise is exiting): nothing left to tell.
        let _ = tx.send(event);
    })
}
