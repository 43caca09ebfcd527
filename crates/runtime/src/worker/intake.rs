//! How messages come in: the HTTP API's async messages and commands, and the chat platforms'
//! [`Intake`]: the access gate, chat commands, the queue caps, and the queue to the worker.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use gatewarden_journal::{JournalError, Kind, NewMessage, Store};
use gatewarden_lifecycle::records::GatewayState;
use gatewarden_platforms::Inbound;

use super::{CommandReply, Work};
use crate::access::Admit;
use crate::commands::{self, Channel, CommandOutcome, Sender};
use crate::gateway::Gateway;
use crate::intake::Intake;

impl Work {
    /// Why a new message of `(platform, chat)` is refused: past the `[journal]` queue caps
    /// (`None`: take it). Blocking (the journal), like the callers' other journal steps.
    pub fn queue_refusal(&self, platform: Option<&str>, chat: &str) -> Result<Option<String>, JournalError> {
        let (mine, all) = self.journal.queued(platform, chat)?;
        Ok(self.live().retention.queue_refusal(mine, all))
    }

    /// Records whether a platform chat's queue is full; `true` when it just became full (tell
    /// it once).
    fn note_full(&self, platform: &str, chat: &str, full: bool) -> bool {
        let key = format!("{platform}\0{chat}");
        let mut told = self.full_told.lock().unwrap_or_else(|p| p.into_inner());
        if full {
            told.insert(key)
        } else {
            told.remove(&key);
            false
        }
    }

    /// Queues a journaled message id for the async worker.
    pub fn enqueue(&self, id: String) {
        let _ = self.queue.send(id);
    }

    pub fn next_run_id(&self, incarnation: &str) -> String {
        format!("run-{incarnation}-{}", self.run_counter.fetch_add(1, Ordering::Relaxed))
    }

    /// Journals an async command as already finished (one statement, so a crash can never
    /// leave it queued for replay).
    pub async fn accept_command(
        &self,
        chat_id: &str,
        user_id: &str,
        text: &str,
        reply: &str,
    ) -> Result<String, String> {
        let msg = NewMessage { chat_id: chat_id.into(), user_id: user_id.into(), text: text.into(), kind: Kind::Async };
        let reply = reply.to_owned();
        self.with_journal(move |j| j.accept_command(&msg, &reply)).await
    }

    /// Journals an async message (durable before returning) and queues it if `run_now`.
    pub async fn accept_async(
        &self,
        chat_id: &str,
        user_id: &str,
        text: &str,
        run_now: bool,
    ) -> Result<String, String> {
        let msg = NewMessage { chat_id: chat_id.into(), user_id: user_id.into(), text: text.into(), kind: Kind::Async };
        let id = self.with_journal(move |j| j.accept(&msg)).await?;
        self.metrics.accepted_async.fetch_add(1, Ordering::Relaxed);
        if run_now {
            let _ = self.queue.send(id.clone());
        }
        Ok(id)
    }
}

impl Intake for Work {
    fn deliver(&self, gw: &Gateway, adapter: &str, m: Inbound) -> Result<(), String> {
        let j = &self.journal;
        // Before anything is journaled: a message the access policy does not deliver leaves
        // nothing but, for a stranger's direct message, a pairing code (access/).
        match self.gate.admit(adapter, &m, std::time::SystemTime::now()) {
            Admit::Deliver => {}
            Admit::Drop => return Ok(()),
            Admit::Reply { text, requested } => {
                // The reply leaves through the outbox, like every reply.
                j.enqueue(adapter, &m.chat_id, &text).map_err(|e| e.to_string())?;
                self.wake.wake(adapter);
                if let Some(fields) = requested {
                    gw.record("pairing_requested", fields);
                }
                return Ok(());
            }
        }
        let msg = NewMessage {
            chat_id: m.chat_id.clone(),
            user_id: m.user_id.clone(),
            // The files it carries are named by hash (or why refused) in the journaled text, so
            // the row refers to them before the platform's position moves.
            text: m.journal_text(),
            kind: Kind::Async,
        };
        let from = Sender { channel: Channel::Platform(adapter), user_id: &m.user_id };
        let out = match commands::decide(&m.text, from, &self.live().admins) {
            CommandOutcome::Message => {
                // Queued work is never pruned: past the queue caps the message is refused
                // (taken off the platform, not journaled) and the chat told, once while it
                // stays full. A redelivery of a message already journaled was taken: it is not
                // told otherwise.
                if let Some(why) = self.queue_refusal(Some(adapter), &m.chat_id).map_err(|e| e.to_string())? {
                    if !j.has_event(adapter, &m.event_id).map_err(|e| e.to_string())?
                        && self.note_full(adapter, &m.chat_id, true)
                    {
                        j.enqueue(adapter, &m.chat_id, &format!("not taken: {why}")).map_err(|e| e.to_string())?;
                        self.wake.wake(adapter);
                    }
                    return Ok(());
                }
                self.note_full(adapter, &m.chat_id, false);
                if let Some(id) = j.accept_inbound(adapter, &m.event_id, &msg).map_err(|e| e.to_string())? {
                    // A refused attachment: the message still runs (its text names the refusal,
                    // so the agent's reply can say why too), and the chat is told through the
                    // outbox, once (a redelivery is not accepted again). Best-effort: the
                    // message is committed; a failure here must not have it delivered again.
                    if let Some(why) = m.refusals() {
                        match j.enqueue(adapter, &m.chat_id, &why) {
                            Ok(_) => self.wake.wake(adapter),
                            Err(e) => crate::warn!("cannot queue the attachment notice for {id}: {e}"),
                        }
                    }
                    self.metrics.accepted_async.fetch_add(1, Ordering::Relaxed);
                    // Only a running gateway runs it; otherwise the next incarnation does.
                    if gw.phase.get() == GatewayState::Running {
                        self.enqueue(id);
                    }
                }
                return Ok(());
            }
            // A redelivered command was handled already: never restart twice.
            _ if j.has_event(adapter, &m.event_id).map_err(|e| e.to_string())? => return Ok(()),
            CommandOutcome::Refused { reply, .. } => CommandReply { reply, verdict: None },
            CommandOutcome::Run(cmd) => self.command(gw, cmd, &m.text, Some(adapter), &m.chat_id, &m.user_id),
        };
        j.accept_inbound_command(adapter, &m.event_id, &msg, &out.reply).map_err(|e| e.to_string())?;
        self.wake.wake(adapter);
        Ok(())
    }

    fn journal(&self) -> &Arc<dyn Store> {
        &self.journal
    }

    fn admits(&self, adapter: &str, m: &Inbound) -> bool {
        self.gate.would_deliver(adapter, m, std::time::SystemTime::now())
    }

    fn attachments(&self) -> gatewarden_config::AttachmentsConfig {
        self.live().attachments.clone()
    }

    /// Exports the outbox span of the message's trace (its other spans went at its finish).
    fn answered(&self, message_id: &str) {
        let Some(exporter) = self.live().telemetry.clone() else { return };
        match (self.journal.get(message_id), self.journal.trace(message_id)) {
            (Ok(Some(msg)), Ok(events)) => exporter.outbox(&msg, &events),
            (Ok(None), _) => {}
            (Err(e), _) | (_, Err(e)) => crate::warn!("cannot read the trace of {message_id} for export: {e}"),
        }
    }
}
