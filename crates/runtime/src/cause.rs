//! What ends an incarnation: the causes the main loop classifies ([`Cause`]) and the decision
//! it reports ([`Outcome`]). A leaf module, so every producer of causes (control channel, chat
//! commands, the marker watch, the adapters' role task) and the restart routes depend on it
//! rather than on the crate root.

use gatewarden_control::Requester;
use gatewarden_lifecycle::ExitIntent;

use crate::signals::SignalKind;

/// What the control channel asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlKind {
    Stop,
    Takeover,
    Restart,
}

/// Everything that can end (or try to end) the main loop.
#[derive(Debug)]
pub enum Cause {
    Signal(SignalKind),
    Control {
        kind: ControlKind,
        requester: Requester,
    },
    /// Cancel the drain under way (only a restart's can be: `drain::may_cancel`); the answer
    /// goes back on `reply` once the gateway runs again, or says why not.
    CancelDrain {
        requester: Requester,
        reply: tokio::sync::oneshot::Sender<gatewarden_control::Response>,
    },
    /// A marker file changed; the main loop re-probes.
    MarkerChanged,
    /// The gateway cannot serve as configured (a cluster active's only adapter finds its
    /// credential held by another gateway): exit 78.
    Fatal(String),
}

/// How the incarnation ended.
#[derive(Debug)]
pub struct Outcome {
    pub intent: ExitIntent,
    pub reason: String,
    /// PID 1's planned restart: the binary executes this instead of exiting
    /// ([`Reexec::exec`]), after the lock and the runtime are gone.
    pub reexec: Option<Reexec>,
}

impl Outcome {
    pub fn new(intent: ExitIntent, reason: impl Into<String>) -> Outcome {
        Outcome { intent, reason: reason.into(), reexec: None }
    }
}

/// A new image for this very process (PID 1), performed by the binary after the lock and the
/// runtime are gone.
#[derive(Debug)]
pub struct Reexec {
    pub exe: std::path::PathBuf,
    pub args: Vec<std::ffi::OsString>,
    /// Our own duplicate of the HTTP listener; the new image adopts it.
    pub listener: Option<std::net::TcpListener>,
}

impl Reexec {
    /// Replaces this process's image; returns only on failure.
    pub fn exec(self) -> std::io::Error {
        let mut cmd = std::process::Command::new(&self.exe);
        cmd.args(&self.args);
        gatewarden_lifecycle::platform::spawn::exec_in_place(cmd, self.listener)
    }
}
