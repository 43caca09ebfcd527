//! OS signals and console events, mapped to intents. One file per OS, one signature:
//! `Signals::install() -> io::Result<Signals>` and `Signals::recv(&mut self) -> SignalKind`.

#[cfg_attr(unix, path = "unix.rs")]
#[cfg_attr(windows, path = "windows.rs")]
mod imp;

pub use imp::Signals;

/// What arrived, independent of the OS vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignalKind {
    /// SIGTERM: planned only if a marker names us.
    Terminate,
    /// SIGINT / Ctrl-C / Ctrl-Break: an operator's planned stop; a second one forces.
    Interrupt,
    /// SIGUSR1: planned restart.
    Restart,
    /// Console closed or system shutting down (Windows): planned stop.
    ConsoleClose,
}

impl SignalKind {
    pub fn name(self) -> &'static str {
        match self {
            SignalKind::Terminate => "SIGTERM",
            SignalKind::Interrupt => "SIGINT",
            SignalKind::Restart => "SIGUSR1",
            SignalKind::ConsoleClose => "console close",
        }
    }
}

/// Where a gateway's OS signals come from: the installed handlers ([`Signals`], in `run`), or a
/// channel that a test sends [`SignalKind`]s on (`serve` takes either).
pub trait Shutdown: Send {
    /// The next signal; pending for ever when there are no more.
    fn recv(&mut self) -> impl std::future::Future<Output = SignalKind> + Send;
}

impl Shutdown for Signals {
    fn recv(&mut self) -> impl std::future::Future<Output = SignalKind> + Send {
        Signals::recv(self)
    }
}

impl Shutdown for tokio::sync::mpsc::UnboundedReceiver<SignalKind> {
    async fn recv(&mut self) -> SignalKind {
        match tokio::sync::mpsc::UnboundedReceiver::recv(self).await {
            Some(s) => s,
            None => std::future::pending().await,
        }
    }
}
