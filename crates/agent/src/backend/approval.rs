//! Approvals a run asks its chat for (the hermes backend: hermes's `approval.request` event).
//!
//! The backend registers a question with [`Approvals::ask`]; the runtime relays each
//! [`Question`] to the chat it names (the journal's outbox) and, when someone in that chat
//! types `/approve` or `/deny`, looks up who asked ([`Approvals::pending`]), checks that the
//! sender may answer (crates/runtime/src/commands.rs), and resolves it with
//! [`Approvals::answer`]. The backend waits for the answer up to `[agent] approval_timeout_s`
//! and answers "deny" itself when none came. A run that ends withdraws its questions.
//!
//! Questions only go to chat platforms: a run without a chat (the HTTP API) is denied at once,
//! and so is every run while no runtime listens ([`Approvals::take_questions`] not called).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::{mpsc, oneshot};

/// Most approvals waiting at once; past it a new one is denied (a hostile agent cannot grow
/// memory without bound).
const MAX_PENDING: usize = 1024;

/// Something to tell a chat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Question {
    pub platform: String,
    pub chat_id: String,
    pub text: String,
}

/// An approval waiting for its chat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    /// The journal id of the run that asked.
    pub run_id: String,
    /// The user whose message started the run: with the admins, the one who may answer.
    pub user_id: String,
    /// What is asked, for `status`-like listings.
    pub what: String,
}

struct Waiting {
    platform: String,
    chat_id: String,
    pending: Pending,
    answer: oneshot::Sender<bool>,
}

/// The approvals of one agent, shared with the runtime.
pub struct Approvals {
    waiting: Mutex<VecDeque<Waiting>>,
    tx: mpsc::UnboundedSender<Question>,
    rx: Mutex<Option<mpsc::UnboundedReceiver<Question>>>,
    listening: AtomicBool,
}

impl std::fmt::Debug for Approvals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Approvals").field("waiting", &self.lock().len()).finish()
    }
}

impl Default for Approvals {
    fn default() -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Approvals {
            waiting: Mutex::new(VecDeque::new()),
            tx,
            rx: Mutex::new(Some(rx)),
            listening: AtomicBool::new(false),
        }
    }
}

impl Approvals {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Waiting>> {
        self.waiting.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The questions to relay to chats (once: the runtime that calls it relays them all).
    pub fn take_questions(&self) -> Option<mpsc::UnboundedReceiver<Question>> {
        let rx = self.rx.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        if rx.is_some() {
            self.listening.store(true, Ordering::SeqCst);
        }
        rx
    }

    /// Tells a chat something (the question, its expiry).
    pub fn tell(&self, platform: &str, chat_id: &str, text: String) {
        let _ = self.tx.send(Question { platform: platform.to_owned(), chat_id: chat_id.to_owned(), text });
    }

    /// Registers a question of run `pending.run_id` for `(platform, chat)` and tells the chat.
    /// `None`: nobody can be asked (no chat, no runtime listening, too many waiting): deny.
    pub fn ask(
        &self,
        platform: Option<&str>,
        chat_id: &str,
        pending: Pending,
        text: String,
    ) -> Option<oneshot::Receiver<bool>> {
        let platform = platform?;
        if !self.listening.load(Ordering::SeqCst) {
            return None;
        }
        let (answer, rx) = oneshot::channel();
        {
            let mut w = self.lock();
            w.retain(|x| !x.answer.is_closed());
            if w.len() >= MAX_PENDING {
                return None;
            }
            w.push_back(Waiting { platform: platform.to_owned(), chat_id: chat_id.to_owned(), pending, answer });
        }
        self.tell(platform, chat_id, text);
        Some(rx)
    }

    /// The oldest approval waiting in `(platform, chat)`.
    pub fn pending(&self, platform: &str, chat_id: &str) -> Option<Pending> {
        let w = self.lock();
        w.iter()
            .find(|x| x.platform == platform && x.chat_id == chat_id && !x.answer.is_closed())
            .map(|x| x.pending.clone())
    }

    /// Answers the approval of run `run_id` in `(platform, chat)`; false when it no longer waits.
    pub fn answer(&self, platform: &str, chat_id: &str, run_id: &str, approve: bool) -> bool {
        let mut w = self.lock();
        let Some(i) =
            w.iter().position(|x| x.platform == platform && x.chat_id == chat_id && x.pending.run_id == run_id)
        else {
            return false;
        };
        w.remove(i).is_some_and(|x| x.answer.send(approve).is_ok())
    }

    /// Forgets every question of run `run_id` (the run ended, or its wait expired).
    pub fn withdraw(&self, run_id: &str) {
        self.lock().retain(|x| x.pending.run_id != run_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(run: &str) -> Pending {
        Pending { run_id: run.into(), user_id: "u".into(), what: "rm".into() }
    }

    #[tokio::test]
    async fn only_a_listening_runtime_and_a_chat_are_asked() {
        let a = Approvals::default();
        assert!(a.ask(Some("tg"), "c", p("r"), "q".into()).is_none(), "nobody listens yet");
        let mut q = a.take_questions().expect("first take");
        assert!(a.take_questions().is_none());
        assert!(a.ask(None, "c", p("r"), "q".into()).is_none(), "no chat to ask");
        let rx = a.ask(Some("tg"), "c", p("r"), "q?".into()).expect("asked");
        assert_eq!(q.recv().await.map(|q| q.text), Some("q?".into()));
        assert_eq!(a.pending("tg", "c").map(|p| p.run_id), Some("r".into()));
        assert!(a.pending("tg", "other").is_none());
        assert!(!a.answer("tg", "c", "other-run", true));
        assert!(a.answer("tg", "c", "r", true));
        assert_eq!(rx.await, Ok(true));
        assert!(a.pending("tg", "c").is_none(), "answered once");
    }

    #[tokio::test]
    async fn withdrawn_questions_cannot_be_answered() {
        let a = Approvals::default();
        let _q = a.take_questions();
        let rx = a.ask(Some("tg"), "c", p("r"), "q".into()).expect("asked");
        a.withdraw("r");
        assert!(a.pending("tg", "c").is_none());
        assert!(!a.answer("tg", "c", "r", true));
        assert!(rx.await.is_err());
    }
}
