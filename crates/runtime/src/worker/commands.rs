//! Chat commands carried out ([`Work::command`]; decided in crates/runtime/src/commands.rs),
//! with what they reach: `/cancel`, the agent's approvals, pairing decisions and `/update`.

use std::sync::Arc;

use gatewarden_control::Requester;
use gatewarden_lifecycle::platform::spawn;
use serde_json::json;

use super::{Work, chat_key};
use crate::cause::RestartAnswer;
use crate::cause::{Asker, ControlKind};
use crate::commands::{self, Channel, Command, Sender};
use crate::gateway::Gateway;
use crate::notices;

/// A carried-out command: the reply, and for a restart taken on over HTTP, where its verdict
/// comes (restart.rs: `Ok` carried out, `Err` refused while this incarnation serves on).
pub struct CommandReply {
    pub reply: String,
    pub verdict: Option<tokio::sync::oneshot::Receiver<crate::cause::Verdict>>,
}

/// Who made a pairing decision, for the ledger: the channel (`cli`, `dashboard`, `chat`,
/// `control`) and who on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecidedBy {
    pub channel: String,
    pub who: String,
}

impl DecidedBy {
    fn text(&self) -> String {
        format!("{} ({})", self.channel, self.who)
    }
}

impl Work {
    /// Carries out a command its sender may run ([`commands::decide`] said so); `platform` is
    /// the adapter it came through (`None`: HTTP).
    pub fn command(
        &self,
        gw: &Gateway,
        cmd: Command,
        text: &str,
        platform: Option<&str>,
        chat_id: &str,
        user_id: &str,
    ) -> CommandReply {
        let requester = Requester {
            pid: std::process::id(),
            argv: vec![format!("chat:{chat_id}"), format!("user:{user_id}")],
            channel: "chat".into(),
        };
        let reply = |reply: String| CommandReply { reply, verdict: None };
        match cmd {
            Command::Help => reply(commands::HELP.into()),
            Command::New => {
                // An HTTP API conversation (a `chat_id`) keeps its sessions under a name no
                // platform has; a one-shot call (and /v1/chat/completions) has no history.
                let scope = match platform {
                    Some(p) => Some(p),
                    None => super::http_chat::is_conversation(chat_id).then_some(gatewarden_journal::HTTP_SESSIONS),
                };
                reply(match scope.map(|p| self.journal.new_session(p, chat_id)) {
                    Some(Err(e)) => format!("cannot start a new conversation: {e}"),
                    _ => "new conversation: earlier messages are forgotten".into(),
                })
            }
            Command::Status => {
                let s = gw.status();
                reply(format!(
                    "gatewarden {} · incarnation {} · {} · {} active run(s) · up {:.0}s",
                    s.version.unwrap_or_default(),
                    s.incarnation.unwrap_or_default(),
                    s.state.unwrap_or_default(),
                    s.active_runs.unwrap_or(0),
                    s.uptime_s.unwrap_or(0.0)
                ))
            }
            Command::Restart => restart(gw, &requester, platform, chat_id, user_id),
            Command::Stop => match gw.request_stop(ControlKind::Stop, &requester) {
                Ok(()) => reply("stopping…".into()),
                Err(warning) => reply(format!("stopping… (warning: {warning})")),
            },
            Command::Update => reply(self.start_update(gw, platform, chat_id, user_id)),
            Command::Cancel => reply(self.cancel_chat(platform, chat_id)),
            Command::Approve | Command::Deny => {
                reply(self.answer_approval(platform, chat_id, user_id, cmd == Command::Approve))
            }
            Command::Pair | Command::Revoke => reply(self.pairing_command(gw, cmd, text, platform, user_id)),
        }
    }

    /// `/approve CODE` (`Command::Pair`) or `/revoke USER` from a platform chat's admin.
    fn pairing_command(&self, gw: &Gateway, cmd: Command, text: &str, platform: Option<&str>, user_id: &str) -> String {
        let Some(p) = platform else {
            return "pairing decisions are made on the chat platform, or with `gatewarden pairing approve PLATFORM CODE`"
                .into();
        };
        let by = DecidedBy { channel: "chat".into(), who: format!("{p} {user_id}") };
        let Some(arg) = commands::argument(text) else {
            return format!("{} needs an argument: /approve CODE or /revoke USER", cmd.name());
        };
        match cmd {
            Command::Pair => match self.approve_pairing(gw, p, arg, &by) {
                Ok(user) => format!("approved {user}: their messages reach the agent now"),
                Err(e) => e,
            },
            _ => match self.revoke_pairing(gw, p, arg, &by) {
                Ok(()) => format!("revoked {arg}: their messages no longer reach the agent"),
                Err(e) => e,
            },
        }
    }

    /// Approves the sender holding `code` on `platform` (at once: the next message is
    /// delivered), records `pairing_approved` and tells the sender through the outbox.
    /// Blocking (the book, the journal). Returns the sender's id.
    pub fn approve_pairing(&self, gw: &Gateway, platform: &str, code: &str, by: &DecidedBy) -> Result<String, String> {
        let p =
            self.gate.approve(platform, code, &by.text(), std::time::SystemTime::now()).map_err(|e| e.to_string())?;
        gw.record(
            "pairing_approved",
            json!({"platform": platform, "sender": p.user, "code": p.code, "channel": by.channel, "by": by.who}),
        );
        crate::info!("[[platform]] {platform}: {} approved by {}", p.user, by.text());
        match self.journal.enqueue(platform, &p.chat, crate::access::WELCOME) {
            Ok(_) => self.wake.wake(platform),
            Err(e) => crate::warn!("cannot tell {} they are approved: {e}", p.user),
        }
        Ok(p.user)
    }

    /// Takes `user`'s approval on `platform` back (at once), and records `pairing_revoked`.
    pub fn revoke_pairing(&self, gw: &Gateway, platform: &str, user: &str, by: &DecidedBy) -> Result<(), String> {
        self.gate.revoke(platform, user).map_err(|e| e.to_string())?;
        gw.record(
            "pairing_revoked",
            json!({"platform": platform, "sender": user, "channel": by.channel, "by": by.who}),
        );
        crate::info!("[[platform]] {platform}: {user} revoked by {}", by.text());
        Ok(())
    }

    /// `/cancel`: stops this chat's runs in flight (the hermes backend stops hermes's run);
    /// they fail with "cancelled", never re-run.
    fn cancel_chat(&self, platform: Option<&str>, chat_id: &str) -> String {
        let runs = self.chat_runs.lock().unwrap_or_else(|p| p.into_inner()).get(&chat_key(platform, chat_id)).cloned();
        let runs = runs.unwrap_or_default();
        if runs.is_empty() {
            return "nothing to cancel".into();
        }
        let mut marked = self.cancelled_by_chat.lock().unwrap_or_else(|p| p.into_inner());
        for (id, token) in &runs {
            marked.insert(id.clone());
            token.cancel();
        }
        format!("cancelling {} run(s)", runs.len())
    }

    /// `/approve`, `/deny`: answers the oldest approval the agent asks in this chat, when the
    /// sender may ([`commands::Admins::may_answer`]).
    fn answer_approval(&self, platform: Option<&str>, chat_id: &str, user_id: &str, approve: bool) -> String {
        let live = self.live();
        let (Some(approvals), Some(p)) = (live.agent.approvals(), platform) else {
            return "nothing waits for an approval here".into();
        };
        let Some(pending) = approvals.pending(p, chat_id) else {
            return "nothing waits for an approval here".into();
        };
        let from = Sender { channel: Channel::Platform(p), user_id };
        if !live.admins.may_answer(from, &pending.user_id) {
            return "only the user who asked, or an admin, can answer this approval".into();
        }
        match (approvals.answer(p, chat_id, &pending.run_id, approve), approve) {
            (false, _) => "that approval is no longer waiting".into(),
            (true, true) => format!("approved: {}", pending.what),
            (true, false) => format!("denied: {}", pending.what),
        }
    }

    /// Relays the questions the agent asks (hermes approvals) to their chats through the
    /// outbox, as long as the worker runs.
    pub(super) fn relay_questions(self: &Arc<Self>) {
        let Some(mut rx) = self.live().agent.approvals().and_then(|a| a.take_questions()) else { return };
        let me = Arc::clone(self);
        tokio::spawn(async move {
            while let Some(q) = rx.recv().await {
                let (p, c, t) = (q.platform.clone(), q.chat_id.clone(), q.text);
                match me.with_journal(move |j| j.enqueue(&p, &c, &t)).await {
                    Ok(_) => me.wake.wake(&q.platform),
                    Err(e) => crate::warn!("cannot tell chat {} the agent's question: {e}", q.chat_id),
                }
            }
        });
    }

    /// `/update`: a detached `gatewarden update --from <[update] source> --chat <chat>`. It
    /// restarts us through the restart ladder like `/restart` (never a run, so the drain does
    /// not wait on it) and leaves exactly one outcome notice for this chat: an HTTP chat
    /// collects it with its notices, a platform chat gets it through the outbox
    /// (notices.rs). The caller checked who asked ([`commands::decide`]).
    fn start_update(&self, gw: &Gateway, platform: Option<&str>, chat_id: &str, user_id: &str) -> String {
        let Some(source) = self.update_source() else {
            return "no release to install: set [update] source in config.toml".into();
        };
        let Ok(exe) = spawn::self_exe() else { return "cannot locate the gatewarden executable".into() };
        let mut cmd = std::process::Command::new(exe);
        cmd.arg("--home").arg(gw.home.dir()).args(["update", "--from", &source, "--chat", chat_id]);
        if let Some(p) = platform {
            cmd.args(["--chat-platform", p]);
        }
        // Not one of our runs: the next incarnation's sweep must not kill it.
        cmd.env_remove(crate::options::RUN_TAG);
        cmd.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
        spawn::detach(&mut cmd, None);
        match cmd.spawn() {
            Ok(child) => {
                gw.record(
                    "update_requested",
                    json!({"chat_id": chat_id, "platform": platform, "user_id": user_id, "updater_pid": child.id()}),
                );
                format!("updating from {source}…")
            }
            Err(e) => format!("cannot start the update: {e}"),
        }
    }
}

/// `/restart`. The gateway decides the answer (issue 30, item 2): taken on, joined to a restart
/// under way, or refused because a stop is under way; the ledger has each. One taken on is told
/// the verdict once the next incarnation is proven (restart.rs): a platform chat hears of a
/// refusal through its outbox; an HTTP caller waits for it (http/messages.rs).
fn restart(gw: &Gateway, requester: &Requester, platform: Option<&str>, chat_id: &str, user_id: &str) -> CommandReply {
    let (asker, verdict) = match platform {
        Some(p) => (Asker::Chat { platform: p.to_owned(), chat_id: chat_id.to_owned() }, None),
        None => {
            let (asker, verdict) = Asker::waiting();
            (asker, Some(verdict))
        }
    };
    let answer = gw.request_restart(requester, asker, || {
        notices::record_restart_requester(gw.home.dir(), chat_id, user_id, platform, &gw.me.id);
    });
    let verdict = verdict.filter(|_| answer == RestartAnswer::Accepted);
    CommandReply { reply: answer.reply(), verdict }
}
