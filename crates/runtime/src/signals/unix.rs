use std::io;

use tokio::signal::unix::{Signal, SignalKind as K, signal};

use super::SignalKind;

pub struct Signals {
    term: Signal,
    int: Signal,
    usr1: Signal,
}

impl Signals {
    pub fn install() -> io::Result<Signals> {
        Ok(Signals { term: signal(K::terminate())?, int: signal(K::interrupt())?, usr1: signal(K::user_defined1())? })
    }

    pub async fn recv(&mut self) -> SignalKind {
        tokio::select! {
            _ = self.term.recv() => SignalKind::Terminate,
            _ = self.int.recv() => SignalKind::Interrupt,
            _ = self.usr1.recv() => SignalKind::Restart,
        }
    }
}
