use std::io;

use tokio::signal::windows::{
    CtrlBreak, CtrlC, CtrlClose, CtrlShutdown, ctrl_break, ctrl_c, ctrl_close, ctrl_shutdown,
};

use super::{Signal, SignalKind};

/// Windows has no SIGTERM: graceful stops arrive through the control pipe or a marker; these
/// console events cover an interactive console. Logoff is deliberately not handled, so a
/// gateway started from a session survives the user logging off another console. Windows does
/// not name an event's sender: every [`Signal`] has none. tokio's listeners need the runtime,
/// so they are made at the first `recv` (`install` runs before the runtime exists).
pub struct Signals {
    events: Option<Events>,
}

struct Events {
    c: CtrlC,
    brk: CtrlBreak,
    close: CtrlClose,
    shutdown: CtrlShutdown,
}

impl Signals {
    pub fn install() -> io::Result<Signals> {
        Ok(Signals { events: None })
    }

    /// Console events are only read inside the runtime: nothing is pending before it.
    pub fn take_ending(&mut self) -> Option<Signal> {
        None
    }

    pub async fn recv(&mut self) -> Signal {
        if self.events.is_none() {
            let made = (|| {
                Ok::<_, io::Error>(Events {
                    c: ctrl_c()?,
                    brk: ctrl_break()?,
                    close: ctrl_close()?,
                    shutdown: ctrl_shutdown()?,
                })
            })();
            match made {
                Ok(e) => self.events = Some(e),
                // No console events to wait for: stops still come through the pipe or a marker.
                Err(e) => {
                    crate::warn!("cannot listen for console events: {e}");
                    return std::future::pending().await;
                }
            }
        }
        let Some(e) = self.events.as_mut() else { return std::future::pending().await };
        let kind = tokio::select! {
            _ = e.c.recv() => SignalKind::Interrupt,
            _ = e.brk.recv() => SignalKind::Interrupt,
            _ = e.close.recv() => SignalKind::ConsoleClose,
            _ = e.shutdown.recv() => SignalKind::ConsoleClose,
        };
        kind.into()
    }
}
