//! What ends an incarnation: the causes the main loop classifies ([`Cause`], a reload among
//! them, which ends nothing) and the decision it reports ([`Outcome`]). A leaf module, so every producer of causes (control channel, chat
//! commands, the marker watch, the adapters' role task) and the restart routes depend on it
//! rather than on the crate root.

use gatewarden_control::Requester;
use gatewarden_lifecycle::ExitIntent;

use crate::signals::Signal;

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
    /// An OS signal, with its sender where the OS tells (signals/).
    Signal(Signal),
    Control {
        kind: ControlKind,
        requester: Requester,
        /// Who is told whether a restart was carried out or refused (`Asker::Nobody` for stops).
        asker: Asker,
    },
    /// Cancel the drain under way (only a restart's can be: `drain::may_cancel`); the answer
    /// goes back on `reply` once the gateway runs again, or says why not.
    CancelDrain { requester: Requester, reply: tokio::sync::oneshot::Sender<gatewarden_control::Response> },
    /// Re-read the configuration and apply what can change live (reload.rs). `requester` is
    /// the ledger's (a control client, or a SIGHUP's sender); the answer goes back on `reply`
    /// when someone waits for it.
    Reload { requester: serde_json::Value, reply: Option<tokio::sync::oneshot::Sender<gatewarden_control::Response>> },
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
    /// The owner's stop (a bare SIGTERM to a container's PID 1 or under a declared
    /// supervisor): drained within `drain::Budget::owner_stop` instead of the configured drain.
    pub owner_stop: bool,
}

impl Outcome {
    pub fn new(intent: ExitIntent, reason: impl Into<String>) -> Outcome {
        Outcome { intent, reason: reason.into(), reexec: None, owner_stop: false }
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

/// Who waits to hear whether a restart goes ahead (`restart::begin`): `Ok` with what happens,
/// or `Err` with why not (the running incarnation keeps serving).
#[derive(Debug, Default)]
pub enum Asker {
    /// A signal, or a request already answered: the ledger and the log say it.
    #[default]
    Nobody,
    /// A control client or an HTTP caller waits for the verdict.
    Waiting(tokio::sync::oneshot::Sender<Verdict>),
    /// A chat platform's chat, answered "restarting…" already: a refusal follows through the
    /// outbox.
    Chat { platform: String, chat_id: String },
}

/// What a restart request taken on hears: accepted, joined or refused by what the main loop
/// decided first, or `Err` with why the next incarnation cannot run (this one keeps serving).
pub type Verdict = Result<RestartAnswer, String>;

impl Asker {
    /// A waiting asker and its end of the channel.
    pub fn waiting() -> (Asker, tokio::sync::oneshot::Receiver<Verdict>) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        (Asker::Waiting(tx), rx)
    }
}

/// The answer to a restart request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestartAnswer {
    /// Taken on: this incarnation drains and restarts for it.
    Accepted,
    /// A restart was already under way; this request joined it.
    Joined,
    /// A stop is under way (or recorded by the operator): not restarted, and why.
    Refused(String),
}

impl RestartAnswer {
    /// The words a chat (or `gatewarden send`) reads.
    pub fn reply(&self) -> String {
        match self {
            RestartAnswer::Accepted => "restarting…".into(),
            RestartAnswer::Joined => gatewarden_control::proto::JOINED.into(),
            RestartAnswer::Refused(why) => {
                format!("not restarting: the gateway is stopping ({why}); start it again with `gatewarden start`")
            }
        }
    }
}
