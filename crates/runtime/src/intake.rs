//! The seam between the chat platform host (platforms.rs) and the worker (worker/intake.rs): the host
//! hands inbound messages to an [`Intake`] and is woken through a [`Wake`] channel, so neither
//! side holds the other.

use std::sync::Arc;

use gatewarden_journal::Store;
use gatewarden_platforms::{Activity, Inbound};
use tokio::sync::mpsc;

use crate::gateway::Gateway;

/// Where the platform host delivers what the adapters receive.
pub trait Intake: Send + Sync {
    /// Takes one inbound message of `adapter` (blocking: it journals): queued for a run, or,
    /// for a chat command, answered through the outbox. An error leaves the message with the
    /// platform, to be delivered again.
    fn deliver(&self, gw: &Gateway, adapter: &str, m: Inbound) -> Result<(), String>;

    /// Whether the access policy would deliver `m` (deciding nothing): its files are downloaded
    /// only then.
    fn admits(&self, adapter: &str, m: &Inbound) -> bool {
        let _ = (adapter, m);
        true
    }

    /// `[attachments]` as it is now (the download bounds).
    fn attachments(&self) -> gatewarden_config::AttachmentsConfig {
        gatewarden_config::AttachmentsConfig::default()
    }

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

/// Tells the platform host that an adapter's outbox has something (by adapter name), and what
/// the runs of its chats are doing ([`Wake::show`]). One ordered channel: a run's activity
/// reaches the adapter before the wake for its reply.
#[derive(Debug, Clone)]
pub struct Wake(mpsc::UnboundedSender<Nudge>);

/// What the [`Wake`] channel carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Nudge {
    /// The adapter's outbox has something.
    Outbox(String),
    /// A run's activity in one of the adapter's chats (`Adapter::show`).
    Show { adapter: String, chat: String, run: String, activity: Activity },
}

/// The platform host's end of the [`Wake`] channel.
pub type WakeRx = mpsc::UnboundedReceiver<Nudge>;

impl Wake {
    pub fn channel() -> (Wake, WakeRx) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Wake(tx), rx)
    }

    /// Never blocks; a wake after the host is gone is dropped (the outbox keeps the entry).
    pub fn wake(&self, adapter: &str) {
        let _ = self.0.send(Nudge::Outbox(adapter.to_owned()));
    }

    /// Shows a run's activity in a platform chat (best-effort, never blocks).
    pub fn show(&self, adapter: &str, chat: &str, run: &str, activity: Activity) {
        let _ = self.0.send(Nudge::Show {
            adapter: adapter.to_owned(),
            chat: chat.to_owned(),
            run: run.to_owned(),
            activity,
        });
    }
}
