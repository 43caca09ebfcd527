use std::io;

use tokio::signal::windows::{
    CtrlBreak, CtrlC, CtrlClose, CtrlShutdown, ctrl_break, ctrl_c, ctrl_close, ctrl_shutdown,
};

use super::SignalKind;

/// Windows has no SIGTERM: graceful stops arrive through the control pipe or a marker; these
/// console events cover an interactive console. Logoff is deliberately not handled, so a
/// gateway started from a session survives the user logging off another console.
pub struct Signals {
    c: CtrlC,
    brk: CtrlBreak,
    close: CtrlClose,
    shutdown: CtrlShutdown,
}

impl Signals {
    pub fn install() -> io::Result<Signals> {
        Ok(Signals { c: ctrl_c()?, brk: ctrl_break()?, close: ctrl_close()?, shutdown: ctrl_shutdown()? })
    }

    pub async fn recv(&mut self) -> SignalKind {
        tokio::select! {
            _ = self.c.recv() => SignalKind::Interrupt,
            _ = self.brk.recv() => SignalKind::Interrupt,
            _ = self.close.recv() => SignalKind::ConsoleClose,
            _ = self.shutdown.recv() => SignalKind::ConsoleClose,
        }
    }
}
