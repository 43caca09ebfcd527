//! Agent backends: what turns a message into a reply.
//!
//! [`Agent`] is an object-safe trait whose methods return boxed futures. A trait object (rather
//! than an enum) lets the runtime and the test kit plug in their own agents (a fake that blocks
//! until told, one that requests a restart, …) without this crate knowing about them; the cost,
//! one allocation per run, is nothing next to a run.
//!
//! Every run gets a [`CancellationToken`]. Cancelling it (drain timeout, client gone, stop) makes
//! the run end promptly with [`AgentError::Cancelled`] after the backend has cleaned up (an exec
//! backend's process group is dead and reaped when the future resolves). Each backend also
//! enforces its configured `timeout_s`, ending with [`AgentError::Timeout`] the same way.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use gatewarden_config::{AgentConfig, BackendKind};

pub mod approval;
pub mod delivery;
mod echo;
mod exec;
pub mod files;
pub mod hermes;
mod openai;
mod process_group;
pub mod provider;
pub mod sse;
pub mod trace;
pub mod transcribe;

pub use approval::{Approvals, Pending, Question};
pub use echo::EchoAgent;
pub use exec::{ExecAgent, MAX_STDOUT_BYTES};
pub use files::AgentFile;
pub use hermes::HermesAgent;
pub use openai::{ApiKey, OpenAiAgent, Policy};
pub use transcribe::Transcriber;

/// One message for an agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentRequest {
    /// The journal id of the message; stable across a re-run after restart.
    pub run_id: String,
    pub chat_id: String,
    pub user_id: String,
    pub text: String,
    /// The conversation before `text`, oldest first (empty for a single turn). From the journal
    /// for chat platforms, from the caller's `messages` for `/v1/chat/completions`.
    pub history: Vec<Turn>,
    /// The chat platform adapter the message came through (`None`: the HTTP API).
    pub platform: Option<String>,
    /// When the chat's current conversation started (the journal's session row; `None`: no
    /// `/new` yet): with `platform` and `chat_id`, it names the hermes session.
    pub session_started: Option<String>,
    /// An HTTP API conversation (`/v1/messages` with a `chat_id`): kept like a platform chat's,
    /// so the hermes backend gives it a session too ([`HTTP_SCOPE`]).
    pub http_conversation: bool,
    /// The stored files the message carries (backend/files.rs), resolved by the runtime from
    /// the journaled text; each backend presents them its own way.
    pub attachments: Vec<AgentFile>,
}

/// The platform name an HTTP API conversation's hermes session is derived from: no adapter is
/// named `""` (config names are non-empty), so it never shares a platform chat's session.
pub const HTTP_SCOPE: &str = "";

impl AgentRequest {
    /// The platform whose conversation this is, for sessions: the adapter, [`HTTP_SCOPE`] for
    /// an HTTP API conversation, `None` for a one-shot call.
    pub fn session_scope(&self) -> Option<&str> {
        self.platform.as_deref().or(self.http_conversation.then_some(HTTP_SCOPE))
    }
}

impl AgentRequest {
    /// A message outside any chat platform, with `history`.
    pub fn new(
        run_id: impl Into<String>,
        chat_id: impl Into<String>,
        user_id: impl Into<String>,
        text: impl Into<String>,
        history: Vec<Turn>,
    ) -> AgentRequest {
        AgentRequest {
            run_id: run_id.into(),
            chat_id: chat_id.into(),
            user_id: user_id.into(),
            text: text.into(),
            history,
            platform: None,
            session_started: None,
            http_conversation: false,
            attachments: Vec::new(),
        }
    }
}

/// One earlier message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Turn {
    /// `user`, `assistant` or `system`.
    pub role: String,
    pub content: String,
}

impl Turn {
    pub fn new(role: &str, content: impl Into<String>) -> Turn {
        Turn { role: role.to_owned(), content: content.into() }
    }
}

/// The newest turns of `history` whose contents fit in `chars` characters (oldest dropped
/// first; a pair is never split from its question).
pub fn within_budget(history: Vec<Turn>, chars: usize) -> Vec<Turn> {
    let mut used = 0usize;
    let mut keep = history.len();
    for (i, t) in history.iter().enumerate().rev() {
        used += t.content.chars().count();
        if used > chars {
            break;
        }
        keep = i;
    }
    // Start at a user turn, so the first kept message is not an orphaned answer.
    while keep < history.len() && history[keep].role == "assistant" {
        keep += 1;
    }
    history.into_iter().skip(keep).collect()
}

/// The agent's full answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentReply {
    pub text: String,
    /// Files the reply carries (exec: `{"attach": "/path"}` lines of stdout): the runtime
    /// stores them and the outbox sends them after the text.
    pub files: Vec<std::path::PathBuf>,
    /// Tokens, when the upstream reported them (openai).
    pub usage: Option<Usage>,
}

/// Tokens one run used, as its upstream reported them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

/// One upstream provider's state (openai), for `status`, `/metrics` and the ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderStatus {
    pub name: String,
    /// `healthy`, `failing` or `cooling_down`.
    pub state: String,
    /// Why it is failing or cooling down.
    pub reason: Option<String>,
    /// When a cool-down ends.
    pub until: Option<std::time::SystemTime>,
    /// HTTP requests made, and how many of them failed (this incarnation).
    pub attempts: u64,
    pub failures: u64,
}

/// A provider's state changed from `from` to `status.state`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderEvent {
    pub from: String,
    pub status: ProviderStatus,
}

/// Why a run produced no reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AgentError {
    /// The caller cancelled the run (drain, stop, client gone).
    #[error("cancelled")]
    Cancelled,
    /// The run exceeded the backend's `timeout_s`.
    #[error("timed out after {} s", .0.as_secs_f64())]
    Timeout(Duration),
    /// The backend could not produce a reply (spawn failure, non-zero exit, bad upstream JSON, …).
    #[error("{0}")]
    Failed(String),
    /// The upstream answered with a non-success HTTP status.
    #[error("upstream returned HTTP {status}: {body}")]
    Upstream { status: u16, body: String },
}

/// A boxed, `Send` future returned by [`Agent`] methods.
pub type AgentFuture<'a> = Pin<Box<dyn Future<Output = Result<AgentReply, AgentError>> + Send + 'a>>;

/// Something that answers messages. A backend implements [`Agent::start`]; `run` and
/// `run_streaming` are the two ways to call it.
pub trait Agent: Send + Sync {
    /// The backend name (`echo`, `exec`, `openai`, or a test double's).
    fn name(&self) -> &str;

    /// Runs one message to completion, sending the reply in pieces to `chunks` as they are
    /// produced when it is `Some` (echo: words, exec: stdout lines, openai: upstream deltas).
    /// The returned reply is the whole answer. A dropped receiver does not stop the run (its
    /// reply is still journaled); cancel for that.
    fn start(
        &self,
        req: AgentRequest,
        cancel: CancellationToken,
        chunks: Option<mpsc::Sender<String>>,
    ) -> AgentFuture<'_>;

    /// Runs one message to completion.
    fn run(&self, req: AgentRequest, cancel: CancellationToken) -> AgentFuture<'_> {
        self.start(req, cancel, None)
    }

    /// The upstream providers' states (empty for backends without any).
    fn providers(&self) -> Vec<ProviderStatus> {
        Vec::new()
    }

    /// Provider state changes since the last call, oldest first (for the ledger).
    fn take_provider_events(&self) -> Vec<ProviderEvent> {
        Vec::new()
    }

    /// The approvals its runs ask chats for (hermes), for the runtime to relay and answer.
    fn approvals(&self) -> Option<std::sync::Arc<Approvals>> {
        None
    }

    /// Like [`Agent::run`], streaming the reply to `chunks` as well.
    fn run_streaming(
        &self,
        req: AgentRequest,
        cancel: CancellationToken,
        chunks: mpsc::Sender<String>,
    ) -> AgentFuture<'_> {
        self.start(req, cancel, Some(chunks))
    }
}

/// Builds the backend chosen by `[agent]`, its keys from this process's environment only (no
/// home, so no `secrets.env`: tests and embedding; the gateway uses [`build_agent_with`]). The
/// config is expected to have been validated by [`gatewarden_config::Config::load`]; missing
/// pieces surface as [`AgentError::Failed`] at run time rather than as a panic here.
pub fn build_agent(config: &AgentConfig) -> Box<dyn Agent> {
    let whole = gatewarden_config::Config { agent: config.clone(), ..Default::default() };
    build_agent_with(config, &gatewarden_config::Secrets::from_environment(&whole), Vec::new(), None)
}

/// The gateway's [`build_agent`]: the keys from the resolved `secrets`
/// (crates/config/src/secrets.rs), extra environment for processes the backend starts (exec),
/// and a private folder of the gateway's for their scratch files (the exec history files).
pub fn build_agent_with(
    config: &AgentConfig,
    secrets: &gatewarden_config::Secrets,
    env: Vec<(String, String)>,
    scratch: Option<std::path::PathBuf>,
) -> Box<dyn Agent> {
    match config.backend {
        BackendKind::Echo => Box::new(EchoAgent::new(config.delay(), config.timeout())),
        BackendKind::Exec => Box::new(
            ExecAgent::new(config.command.clone(), config.timeout(), config.kill_grace())
                .with_env(env)
                .with_scratch(scratch)
                .with_max_stdout(config.max_reply_bytes),
        ),
        BackendKind::Openai => Box::new(OpenAiAgent::from_config(config, secrets)),
        BackendKind::Hermes => Box::new(HermesAgent::from_config(config, secrets)),
    }
}

/// Runs `work` with a child of `cancel`, giving up after `timeout`.
///
/// On timeout the child token is cancelled and `work` is still awaited, because the backend's
/// cancellation path is its cleanup (killing a process group, closing a stream): nothing may
/// outlive the run. Backends must therefore resolve promptly once their token is cancelled.
async fn with_timeout<F, Fut>(timeout: Duration, cancel: &CancellationToken, work: F) -> Result<AgentReply, AgentError>
where
    F: FnOnce(CancellationToken) -> Fut,
    Fut: Future<Output = Result<AgentReply, AgentError>>,
{
    let inner = cancel.child_token();
    let fut = work(inner.clone());
    tokio::pin!(fut);
    tokio::select! {
        result = &mut fut => result,
        () = tokio::time::sleep(timeout) => {
            inner.cancel();
            match fut.await {
                // It finished in the same instant; a reply is a reply.
                Ok(reply) => Ok(reply),
                Err(_) if cancel.is_cancelled() => Err(AgentError::Cancelled),
                Err(_) => Err(AgentError::Timeout(timeout)),
            }
        }
    }
}

/// Sends a chunk unless the run is cancelled first (a stuck consumer must not wedge a run).
/// A closed channel is ignored: see [`Agent::run_streaming`].
async fn send_chunk(
    chunks: &mpsc::Sender<String>,
    cancel: &CancellationToken,
    chunk: String,
) -> Result<(), AgentError> {
    if chunk.is_empty() || chunks.is_closed() {
        return Ok(());
    }
    trace::note(trace::Note::FirstToken { at: std::time::SystemTime::now() });
    tokio::select! {
        sent = chunks.send(chunk) => {
            if sent.is_ok() {
                delivery::sending();
            }
            Ok(())
        }
        () = cancel.cancelled() => Err(AgentError::Cancelled),
    }
}

/// At most `max` bytes of `s`, cut on a character boundary.
fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// The last `max` bytes of `s`, cut on a character boundary, with a marker when shortened.
fn tail(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    format!("…{}", &s[start..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncate_respects_chars() {
        assert_eq!(truncate("héllo", 2), "h…");
        assert_eq!(truncate("abc", 3), "abc");
    }

    #[test]
    fn tail_cuts_on_char_boundaries() {
        assert_eq!(tail("abc", 5), "abc");
        assert_eq!(tail("abcdef", 3), "…def");
        assert_eq!(tail("ééé", 3), "…é");
    }

    #[test]
    fn agent_is_object_safe_and_shareable() {
        fn assert_send_sync<T: Send + Sync + ?Sized>() {}
        assert_send_sync::<dyn Agent>();
        let a: std::sync::Arc<dyn Agent> = build_agent(&AgentConfig::default()).into();
        assert_eq!(a.name(), "echo");
    }

    #[tokio::test]
    async fn timeout_waits_for_cleanup_and_reports_timeout() {
        let cancel = CancellationToken::new();
        let cleaned = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let c2 = cleaned.clone();
        let r = with_timeout(Duration::from_millis(20), &cancel, |tok| async move {
            tok.cancelled().await;
            c2.store(true, std::sync::atomic::Ordering::SeqCst);
            Err(AgentError::Cancelled)
        })
        .await;
        assert_eq!(r, Err(AgentError::Timeout(Duration::from_millis(20))));
        assert!(cleaned.load(std::sync::atomic::Ordering::SeqCst));
    }

    #[tokio::test]
    async fn outer_cancel_is_cancelled_not_timeout() {
        let cancel = CancellationToken::new();
        cancel.cancel();
        let r = with_timeout(Duration::from_secs(60), &cancel, |tok| async move {
            tok.cancelled().await;
            Err(AgentError::Cancelled)
        })
        .await;
        assert_eq!(r, Err(AgentError::Cancelled));
    }
}

#[cfg(test)]
mod history_tests {
    use super::*;

    #[test]
    fn budget_keeps_the_newest_whole_turns() {
        let h = vec![
            Turn::new("user", "aaaa"),
            Turn::new("assistant", "bbbb"),
            Turn::new("user", "cc"),
            Turn::new("assistant", "dd"),
        ];
        assert_eq!(within_budget(h.clone(), 100), h);
        assert_eq!(within_budget(h.clone(), 4), h[2..].to_vec());
        // 6 chars fit "bbbb" + "cc" + "dd" minus one: never start on an orphaned answer.
        assert_eq!(within_budget(h.clone(), 9), h[2..].to_vec());
        assert!(within_budget(h, 1).is_empty());
    }
}
