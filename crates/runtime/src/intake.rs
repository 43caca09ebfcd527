//! The seam between the chat platform host (platforms.rs) and the worker (worker.rs): the host
//! hands inbound messages to an [`Intake`] and is woken through a [`Wake`] channel, so neither
//! side holds the other.

use std::sync::Arc;

use gatewarden_journal::Store;
use gatewarden_platforms::Inbound;
use tokio::sync::mpsc;

use crate::gateway::Gateway;

/// Where the platform host delivers what the adapters receive.
pub trait Intake: Send + Sync {
    /// Takes one inbound message of `adapter` (blocking: it journals): queued for a run, or,
    /// for a chat command, answered through the outbox. An error leaves the message with the
    /// platform, to be delivered again.
    fn deliver(&self, gw: &Gateway, adapter: &str, m: Inbound) -> Result<(), String>;

    /// The journal whose outbox the adapters send.
    fn journal(&self) -> &Arc<dyn Store>;

    /// The reply to message `message_id` left through the outbox (recorded as sent, or failed
    /// for good): the last step of its trace, for telemetry (blocking: it reads the journal).
    fn answered(&self, message_id: &str) {
        let _ = message_id;
    }
}

/// Delivers `m` unless the intake is sealed (`Gateway::seal_intake`, just before the home
/// lock is released): a message that arrives after that is refused, so the platform keeps it
/// for the next incarnation instead of it being journaled behind that one's recovery.
pub fn deliver(gw: &Gateway, intake: &dyn Intake, adapter: &str, m: Inbound) -> Result<(), String> {
    gw.with_intake(|| intake.deliver(gw, adapter, m)).unwrap_or_else(|| {
        Err("the gateway is handing over: the platform keeps this message for the next incarnation".into())
    })
}

/// Tells the platform host that an adapter's outbox has something (by adapter name).
#[derive(Debug, Clone)]
pub struct Wake(mpsc::UnboundedSender<String>);

/// The platform host's end of the [`Wake`] channel.
pub type WakeRx = mpsc::UnboundedReceiver<String>;

impl Wake {
    pub fn channel() -> (Wake, WakeRx) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Wake(tx), rx)
    }

    /// Never blocks; a wake after the host is gone is dropped (the outbox keeps the entry).
    pub fn wake(&self, adapter: &str) {
        let _ = self.0.send(adapter.to_owned());
    }
}
