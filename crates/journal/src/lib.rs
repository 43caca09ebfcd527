//! gatewarden-journal: the durable message journal.
//!
//! Every message the gateway accepts is a row that moves
//! `queued → running → done | failed`, and never back except through [`Store::recover`].
//!
//! - [`Store::accept`] commits the row before it returns, so an HTTP 202 sent afterwards is a
//!   promise the journal can keep.
//! - [`Store::claim`] moves `queued → running` under the caller's incarnation and counts the
//!   attempt.
//! - [`Store::complete`] / [`Store::fail`] only act on a row that is `running` under the
//!   caller's incarnation: a run from a previous incarnation (or a duplicate worker) cannot
//!   finish a message twice.
//! - [`Store::mark_command`] finishes a run that requested a restart as `done` before the
//!   drain, so the next incarnation never replays it (bug class F: no restart cascade).
//! - [`Store::recover`], called once by each new incarnation, requeues rows left `running` by an
//!   older incarnation exactly once (attempts < 2), fails the rest with "interrupted twice", and
//!   returns every queued id in acceptance order.
//!
//! - [`Store::prune`] deletes finished (done / failed) rows past the retention bounds of
//!   `[journal]` in config.toml, by age and by size; a queued or running row is never deleted.
//!
//! Here: the [`Store`] trait and the types every store shares; [`row`], the one mapping between
//! a store's rows and those types; [`sqlite`], the home's journal ([`Journal`],
//! `<home>/journal.sqlite3`). The cluster's PostgreSQL store (crates/cluster) implements the same
//! trait over the same row mapping.

pub mod row;
pub mod sqlite;
pub mod trace;

pub use sqlite::{JOURNAL_FILE, Journal, check_schema};
pub use trace::{RunSteps, Step, TraceEvent};

use std::path::PathBuf;
use std::time::Duration;

use sqlite::SCHEMA_VERSION;

/// A run may start at most this many times (the first run plus one re-run after interruption).
pub const MAX_ATTEMPTS: i64 = 2;

/// Reason recorded for a message whose run was interrupted on both attempts.
pub const REASON_INTERRUPTED_TWICE: &str = "interrupted twice";

/// The `sessions` platform under which an HTTP API conversation (`/v1/messages` with a
/// `chat_id`) keeps its `/new`: its messages have no platform, and no adapter is named `""`
/// (config names are non-empty).
pub const HTTP_SESSIONS: &str = "";

/// Why a journal operation failed.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("journal {}: {source}", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("journal {}: schema version {found} is newer than this gatewarden understands ({SCHEMA_VERSION})", path.display())]
    SchemaTooNew { path: PathBuf, found: i64 },
    #[error("journal: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("journal: row {id} has an unknown {column} value {value:?}")]
    Corrupt { id: String, column: &'static str, value: String },
    /// A shared store (the cluster's PostgreSQL) failed or did not answer in time.
    #[error("journal store: {0}")]
    Store(String),
    /// The shared store refused a write: this gateway is not (or no longer) the active.
    #[error("journal store: fenced: {0}")]
    Fenced(String),
    /// A journal file is not a private regular file we can use (a FIFO, a symlink, a
    /// directory), or its mode could not be made private; SQLite never opens it.
    #[error("journal {}: {why}", path.display())]
    Unsafe { path: PathBuf, why: String },
    /// The journal's writer (group commit) could not take or commit the write.
    #[error("journal: {0}")]
    Writer(String),
}

/// How the client waits for the reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The HTTP request waits for the reply.
    Sync,
    /// The client got a 202 and an id, and polls.
    Async,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Sync => "sync",
            Kind::Async => "async",
        }
    }

    /// The inverse of [`Kind::as_str`] (every store keeps the same words).
    pub fn parse(s: &str) -> Option<Kind> {
        match s {
            "sync" => Some(Kind::Sync),
            "async" => Some(Kind::Async),
            _ => None,
        }
    }
}

/// Where a message is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    Queued,
    Running,
    Done,
    Failed,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Queued => "queued",
            State::Running => "running",
            State::Done => "done",
            State::Failed => "failed",
        }
    }

    /// Done or failed: the message will not change again.
    pub fn is_final(self) -> bool {
        matches!(self, State::Done | State::Failed)
    }

    /// The inverse of [`State::as_str`].
    pub fn parse(s: &str) -> Option<State> {
        match s {
            "queued" => Some(State::Queued),
            "running" => Some(State::Running),
            "done" => Some(State::Done),
            "failed" => Some(State::Failed),
            _ => None,
        }
    }
}

/// A message to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewMessage {
    pub chat_id: String,
    pub user_id: String,
    pub text: String,
    pub kind: Kind,
}

/// A journal row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub id: String,
    pub chat_id: String,
    pub user_id: String,
    pub text: String,
    pub kind: Kind,
    pub state: State,
    pub reply: Option<String>,
    pub reason: Option<String>,
    pub attempts: i64,
    /// The incarnation that last claimed the row.
    pub incarnation: Option<String>,
    /// The run requested a restart (or another lifecycle command) and must never be replayed.
    pub is_command: bool,
    /// The chat platform adapter it came from (`None`: the HTTP API).
    pub platform: Option<String>,
    /// RFC 3339 UTC with microseconds.
    pub created_at: String,
    pub updated_at: String,
}

/// Row counts by state, for metrics and status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub queued: u64,
    pub running: u64,
    pub done: u64,
    pub failed: u64,
}

/// How full the journal is, for `status` and `doctor` (against `[journal]`'s caps).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Depth {
    /// Queued messages in all.
    pub queued: u64,
    /// Queued messages of the chat with the most (`None`: the store does not say).
    pub busiest_chat: Option<u64>,
    /// The live data, in bytes, that `max_size_mb` bounds (`None`: the store does not say).
    pub bytes: Option<u64>,
}

/// The journal as the runtime uses it: the home's SQLite [`Journal`], or a shared store
/// (crates/cluster's `PgStore`, when `[cluster]` is configured) whose writes are fenced by the
/// lease epoch. Synchronous like SQLite: callers on an async runtime use `spawn_blocking`, and
/// an implementation never blocks on a runtime of its caller. Each method means what
/// [`Journal`]'s implementation documents for it.
pub trait Store: Send + Sync + std::fmt::Debug {
    /// Where the journal lives, for logs (`sqlite <path>`, `postgres cluster <name>`).
    fn describe(&self) -> String;
    fn accept(&self, msg: &NewMessage) -> Result<String, JournalError>;
    fn accept_command(&self, msg: &NewMessage, reply: &str) -> Result<String, JournalError>;
    /// Records a new message already `running` under `incarnation` (its first attempt), for a
    /// caller that runs it at once and waits (crates/runtime/src/worker/run.rs
    /// `run_journaled`): never `queued`, so the async worker never takes it; a crash leaves it
    /// to [`Store::recover`] like any interrupted run.
    fn accept_claimed(&self, msg: &NewMessage, incarnation: &str) -> Result<String, JournalError>;
    fn claim(&self, id: &str, incarnation: &str) -> Result<bool, JournalError>;
    /// `running → done` with the reply, only if `incarnation` owns the run, with the run's
    /// `(prompt, completion)` tokens and its noted `steps` (backend called, providers tried,
    /// first token) and `done` step in the same commit. A platform message's reply is queued
    /// in the outbox in that commit too: never lost between the two, nor queued twice.
    fn complete_traced(
        &self,
        id: &str,
        incarnation: &str,
        reply: &str,
        usage: Option<(u64, u64)>,
        steps: &[TraceEvent],
    ) -> Result<bool, JournalError>;
    /// [`Store::complete_traced`] without usage or noted steps.
    fn complete(&self, id: &str, incarnation: &str, reply: &str) -> Result<bool, JournalError> {
        self.complete_traced(id, incarnation, reply, None, &[])
    }
    /// `running → failed` with a reason (the operator's: trace, dashboard), only if
    /// `incarnation` owns the run, with the run's `steps` and its `failed` step in the same
    /// commit; a platform message's chat is told `notice` through the outbox (what it may read:
    /// [`failure_notice_for`]).
    fn fail_traced(
        &self,
        id: &str,
        incarnation: &str,
        reason: &str,
        notice: &str,
        steps: &[TraceEvent],
    ) -> Result<bool, JournalError>;
    /// [`Store::fail_traced`] without noted steps, the chat told [`failure_notice`] of `reason`
    /// (tests and the journal's own reasons; the runtime says what a chat may read).
    fn fail(&self, id: &str, incarnation: &str, reason: &str) -> Result<bool, JournalError> {
        self.fail_traced(id, incarnation, reason, &failure_notice(reason), &[])
    }
    /// The message's trace, oldest step first (empty: unknown or pruned).
    fn trace(&self, id: &str) -> Result<Vec<TraceEvent>, JournalError>;
    /// The `(prompt, completion)` tokens recorded with a run, if any (issue 17: usage in the
    /// journal, SQLite and PostgreSQL alike).
    fn usage(&self, id: &str) -> Result<Option<(u64, u64)>, JournalError>;
    fn accept_inbound(&self, platform: &str, event_id: &str, msg: &NewMessage) -> Result<Option<String>, JournalError>;
    fn accept_inbound_command(
        &self,
        platform: &str,
        event_id: &str,
        msg: &NewMessage,
        reply: &str,
    ) -> Result<Option<String>, JournalError>;
    fn has_event(&self, platform: &str, event_id: &str) -> Result<bool, JournalError>;
    /// The id of the message journaled for `(platform, event_id)`, if any (a push platform
    /// answers its sender with it).
    fn event_message(&self, platform: &str, event_id: &str) -> Result<Option<String>, JournalError>;
    fn enqueue(&self, platform: &str, chat_id: &str, text: &str) -> Result<i64, JournalError>;
    fn outbox_pending(&self, platform: &str, limit: usize) -> Result<Vec<Outgoing>, JournalError>;
    fn outbox_done(&self, seq: i64, failed: Option<&str>) -> Result<bool, JournalError>;
    fn outbox_counts(&self, platform: &str) -> Result<(u64, u64, u64), JournalError>;
    fn new_session(&self, platform: &str, chat_id: &str) -> Result<(), JournalError>;
    /// When the current conversation of `(platform, chat)` started (its last `/new`), as the
    /// store renders it; `None` before any. A read of the existing `sessions` row: the hermes
    /// backend names its session after it.
    fn session_started(&self, platform: &str, chat_id: &str) -> Result<Option<String>, JournalError>;
    fn history(&self, before: &str, turns: usize) -> Result<Vec<(String, String)>, JournalError>;
    fn mark_command(&self, id: &str) -> Result<bool, JournalError>;
    fn recover(&self, new_incarnation: &str) -> Result<Vec<String>, JournalError>;
    fn get(&self, id: &str) -> Result<Option<Message>, JournalError>;
    fn pending(&self) -> Result<Vec<Message>, JournalError>;
    fn counts(&self) -> Result<Counts, JournalError>;
    /// The newest `limit` messages in one of `states`, newest first (the dashboard's Messages
    /// and Conversations). A store that cannot list them says so with an empty list.
    fn recent(&self, states: &[State], limit: usize) -> Result<Vec<Message>, JournalError> {
        let _ = (states, limit);
        Ok(Vec::new())
    }
    fn prune(&self, max_age: Option<Duration>, max_bytes: Option<u64>) -> Result<Pruned, JournalError>;
    /// Every message text, reply and outbox text containing `needle` (the attachment lines
    /// that name stored files: what attachment retention keeps, crates/platforms/src/
    /// attachments.rs). A store that cannot list them says so with an error, and nothing is
    /// pruned.
    fn texts_with(&self, needle: &str) -> Result<Vec<String>, JournalError> {
        let _ = needle;
        Err(JournalError::Store("this journal cannot list the texts naming attachments".into()))
    }
    /// Queued messages: `(of this chat, in all)`, for the `[journal]` queue caps.
    fn queued(&self, platform: Option<&str>, chat_id: &str) -> Result<(u64, u64), JournalError>;
    /// How full the journal is; a store that can count only the queue says only that.
    fn depth(&self) -> Result<Depth, JournalError> {
        Ok(Depth { queued: self.counts()?.queued, busiest_chat: None, bytes: None })
    }
    /// The access decisions (the pairing book, crates/runtime/src/access/pairing.rs) where a
    /// store shared by a cluster keeps them, so a promoted standby decides as the old active
    /// did; `None` before any. One home keeps them in its own `pairing.json` instead: this
    /// store does not.
    fn access_doc(&self) -> Result<Option<String>, JournalError> {
        Err(JournalError::Store("this journal keeps no pairing book (the home's pairing.json does)".into()))
    }
    /// Replaces [`Store::access_doc`] (a fenced write of the active).
    fn put_access_doc(&self, doc: &str) -> Result<(), JournalError> {
        let _ = doc;
        Err(JournalError::Store("this journal keeps no pairing book (the home's pairing.json does)".into()))
    }
}

/// What [`Store::prune`] deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    /// Finished rows older than the age bound.
    pub by_age: u64,
    /// The oldest finished rows, deleted while the data exceeded the size bound.
    pub by_size: u64,
    /// Outbox entries left for good (sent or failed) and chat sessions, by age or size.
    pub outbox: u64,
}

/// A reply waiting in (or gone through) the outbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    pub seq: i64,
    pub chat_id: String,
    pub text: String,
    /// The journaled message this answers (`None` for notices).
    pub message_id: Option<String>,
    pub created_at: String,
}

/// What a platform chat is told when its message failed for one of the journal's own reasons
/// ([`REASON_INTERRUPTED_TWICE`]): one wording for every store.
pub fn failure_notice(reason: &str) -> String {
    format!("sorry, that failed: {reason}")
}

/// What a chat or an API caller is told when its message `id` failed (issue 27 §5): `text`
/// (`[agent] failure_text`) and the reference `gatewarden trace` takes, with the reason only
/// when it may be `shown` (to an admin who opted in, or a reason about the gateway's own
/// handling of the message); the whole reason stays the operator's.
pub fn failure_notice_for(text: &str, id: &str, shown: Option<&str>) -> String {
    match shown {
        Some(reason) => format!("{text}: {reason} (ref {id})"),
        None => format!("{text} (ref {id})"),
    }
}
