//! OS signals and console events, mapped to intents. One file per OS, one signature:
//! `Signals::install() -> io::Result<Signals>` (callable before the async runtime exists),
//! `Signals::recv(&mut self) -> Signal` (inside it) and `Signals::take_ending(&mut self) ->
//! Option<Signal>` (a pending stop or restart signal, without waiting).
//!
//! What each signal does is the README's signal table; [`SignalKind::action`] is that table
//! as data. On Unix every signal comes with its sender where the OS tells (`si_pid`/`si_uid`
//! from an `SA_SIGINFO` handler, unix.rs), so the ledger can say who sent it.

#[cfg_attr(unix, path = "unix.rs")]
#[cfg_attr(windows, path = "windows.rs")]
mod imp;

pub use imp::Signals;
use serde_json::{Value, json};

/// What arrived, independent of the OS vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignalKind {
    /// SIGTERM: planned only if a marker names us.
    Terminate,
    /// SIGINT / Ctrl-C / Ctrl-Break: an operator's planned stop; a second one forces.
    Interrupt,
    /// SIGUSR1: planned restart.
    Restart,
    /// SIGHUP: re-read the configuration and the secrets (reload.rs).
    Reload,
    /// SIGQUIT: nobody's planned stop; drained and ended like a bare SIGTERM.
    Quit,
    /// SIGUSR2: no meaning here; recorded, and the gateway runs on.
    User2,
    /// SIGPIPE sent by another process (one raised by our own write to a closed pipe is not
    /// reported: the write fails with EPIPE where it happens). Recorded; runs on.
    Pipe,
    /// Console closed or system shutting down (Windows): planned stop.
    ConsoleClose,
}

/// What the gateway does with a signal (the README's signal table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Drained and ended; the exit code is `classify`'s (main_loop/classify.rs).
    End,
    /// A planned restart.
    Restart,
    /// The configuration is reloaded in place.
    Reload,
    /// Recorded (`signal_ignored`) and otherwise ignored.
    Ignore,
}

impl SignalKind {
    pub fn name(self) -> &'static str {
        match self {
            SignalKind::Terminate => "SIGTERM",
            SignalKind::Interrupt => "SIGINT",
            SignalKind::Restart => "SIGUSR1",
            SignalKind::Reload => "SIGHUP",
            SignalKind::Quit => "SIGQUIT",
            SignalKind::User2 => "SIGUSR2",
            SignalKind::Pipe => "SIGPIPE",
            SignalKind::ConsoleClose => "console close",
        }
    }

    pub fn action(self) -> Action {
        match self {
            SignalKind::Terminate | SignalKind::Interrupt | SignalKind::Quit | SignalKind::ConsoleClose => Action::End,
            SignalKind::Restart => Action::Restart,
            SignalKind::Reload => Action::Reload,
            SignalKind::User2 | SignalKind::Pipe => Action::Ignore,
        }
    }
}

/// Who sent a signal, as the OS told (`si_pid`, `si_uid`) and `/proc` added (the command
/// line, read when the signal is taken, so a sender that exited at once has none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignalSender {
    pub pid: u32,
    pub uid: u32,
    pub argv: Vec<String>,
}

/// One signal and, where the OS tells, its sender: the data `classify` decides on (a bare
/// SIGTERM is the owner's stop only from the owner: [`Signal::term_sender`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signal {
    pub kind: SignalKind,
    pub sender: Option<SignalSender>,
}

impl From<SignalKind> for Signal {
    fn from(kind: SignalKind) -> Signal {
        Signal { kind, sender: None }
    }
}

impl Signal {
    /// `SIGTERM from pid 77 (kill -TERM 42), uid 1000`, or the bare name.
    pub fn describe(&self) -> String {
        match &self.sender {
            Some(s) if s.argv.is_empty() => format!("{} from pid {}, uid {}", self.kind.name(), s.pid, s.uid),
            Some(s) => format!("{} from pid {} ({}), uid {}", self.kind.name(), s.pid, s.argv.join(" "), s.uid),
            None => self.kind.name().to_owned(),
        }
    }

    /// Who sent it, for the owner's-stop rule (`Supervisor::bare_sigterm`): no sender is
    /// `si_pid` 0 (outside our PID namespace, or the kernel).
    pub fn term_sender(&self, parent: Option<u32>) -> gatewarden_lifecycle::supervisor::TermSender {
        gatewarden_lifecycle::supervisor::TermSender::of(self.sender.as_ref().map(|s| s.pid), parent)
    }

    /// The ledger's `requester` for this signal: the sender, or nulls when the OS did not say.
    pub fn requester(&self) -> Value {
        match &self.sender {
            Some(s) => {
                json!({"pid": s.pid, "uid": s.uid, "argv": s.argv, "channel": "signal", "signal": self.kind.name()})
            }
            None => json!({"pid": null, "uid": null, "argv": [], "channel": "signal", "signal": self.kind.name()}),
        }
    }
}

/// Where a gateway's OS signals come from: the installed handlers ([`Signals`], in `run`), or a
/// channel that a test sends [`SignalKind`]s or [`Signal`]s on (`serve` takes either).
pub trait Shutdown: Send {
    /// The next signal; pending for ever when there are no more.
    fn recv(&mut self) -> impl std::future::Future<Output = Signal> + Send;
}

impl Shutdown for Signals {
    fn recv(&mut self) -> impl std::future::Future<Output = Signal> + Send {
        Signals::recv(self)
    }
}

impl<T: Into<Signal> + Send> Shutdown for tokio::sync::mpsc::UnboundedReceiver<T> {
    async fn recv(&mut self) -> Signal {
        match tokio::sync::mpsc::UnboundedReceiver::recv(self).await {
            Some(s) => s.into(),
            None => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signal_table() {
        let table: Vec<(&str, Action)> = [
            SignalKind::Terminate,
            SignalKind::Interrupt,
            SignalKind::Restart,
            SignalKind::Reload,
            SignalKind::Quit,
            SignalKind::User2,
            SignalKind::Pipe,
        ]
        .iter()
        .map(|k| (k.name(), k.action()))
        .collect();
        assert_eq!(
            table,
            vec![
                ("SIGTERM", Action::End),
                ("SIGINT", Action::End),
                ("SIGUSR1", Action::Restart),
                ("SIGHUP", Action::Reload),
                ("SIGQUIT", Action::End),
                ("SIGUSR2", Action::Ignore),
                ("SIGPIPE", Action::Ignore),
            ]
        );
    }

    #[test]
    fn a_sender_is_named() {
        let s = Signal {
            kind: SignalKind::Terminate,
            sender: Some(SignalSender { pid: 77, uid: 1000, argv: vec!["kill".into(), "42".into()] }),
        };
        assert_eq!(s.describe(), "SIGTERM from pid 77 (kill 42), uid 1000");
        assert_eq!(s.requester()["pid"], json!(77));
        let bare = Signal::from(SignalKind::Reload);
        assert_eq!(bare.describe(), "SIGHUP");
        assert_eq!(bare.requester()["pid"], Value::Null);
    }
}
