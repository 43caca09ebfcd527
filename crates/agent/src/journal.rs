//! The durable message journal: `<home>/journal.sqlite3`.
//!
//! Every message the gateway accepts is a row that moves
//! `queued → running → done | failed`, and never back except through [`Journal::recover`].
//!
//! - [`Journal::accept`] commits the row before it returns, so an HTTP 202 sent afterwards is a
//!   promise the journal can keep.
//! - [`Journal::claim`] moves `queued → running` under the caller's incarnation and counts the
//!   attempt.
//! - [`Journal::complete`] / [`Journal::fail`] only act on a row that is `running` under the
//!   caller's incarnation: a run from a previous incarnation (or a duplicate worker) cannot
//!   finish a message twice.
//! - [`Journal::mark_command`] finishes a run that requested a restart as `done` before the
//!   drain, so the next incarnation never replays it (bug class F: no restart cascade).
//! - [`Journal::recover`], called once by each new incarnation, requeues rows left `running` by an
//!   older incarnation exactly once (attempts < 2), fails the rest with "interrupted twice", and
//!   returns every queued id in acceptance order.
//!
//! Durability: WAL with `synchronous=FULL`. In WAL mode `NORMAL` survives a process crash but may
//! lose the last transactions on power loss or an OS crash; the 202 is a promise to the client,
//! so each commit is fsynced. A chat gateway's message rate makes the fsync per commit cheap.
//!
//! The API is synchronous (SQLite is); callers on an async runtime use `spawn_blocking` or a
//! dedicated thread. A [`Journal`] is `Send + Sync` (one connection behind a mutex).

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, Row, params};

/// The journal's file name inside the home.
pub const JOURNAL_FILE: &str = "journal.sqlite3";

/// A run may start at most this many times (the first run plus one re-run after interruption).
pub const MAX_ATTEMPTS: i64 = 2;

/// Reason recorded for a message whose run was interrupted on both attempts.
pub const REASON_INTERRUPTED_TWICE: &str = "interrupted twice";

const SCHEMA_VERSION: i64 = 1;

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

    fn parse(s: &str) -> Option<Kind> {
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

    fn parse(s: &str) -> Option<State> {
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

/// The journal. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct Journal {
    conn: Mutex<Connection>,
    path: PathBuf,
}

const COLUMNS: &str = "id, chat_id, user_id, text, kind, state, reply, reason, attempts, \
                       incarnation, is_command, created_at, updated_at";

impl Journal {
    /// Opens (creating if needed) the journal at `path`, usually `<home>/journal.sqlite3`.
    pub fn open(path: &Path) -> Result<Journal, JournalError> {
        let wrap = |source| JournalError::Open { path: path.to_path_buf(), source };
        let conn = Connection::open(path).map_err(wrap)?;
        // Another process (a CLI reading history) may hold the lock briefly.
        conn.busy_timeout(Duration::from_secs(5)).map_err(wrap)?;
        conn.pragma_update(None, "journal_mode", "WAL").map_err(wrap)?;
        conn.pragma_update(None, "synchronous", "FULL").map_err(wrap)?;
        let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0)).map_err(wrap)?;
        if version > SCHEMA_VERSION {
            return Err(JournalError::SchemaTooNew { path: path.to_path_buf(), found: version });
        }
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS messages (
                 id          TEXT PRIMARY KEY,
                 chat_id     TEXT NOT NULL,
                 user_id     TEXT NOT NULL,
                 text        TEXT NOT NULL,
                 kind        TEXT NOT NULL CHECK (kind IN ('sync', 'async')),
                 state       TEXT NOT NULL CHECK (state IN ('queued', 'running', 'done', 'failed')),
                 reply       TEXT,
                 reason      TEXT,
                 attempts    INTEGER NOT NULL DEFAULT 0,
                 incarnation TEXT,
                 is_command  INTEGER NOT NULL DEFAULT 0,
                 created_at  TEXT NOT NULL,
                 updated_at  TEXT NOT NULL
             );
             CREATE INDEX IF NOT EXISTS messages_state ON messages (state);
             PRAGMA user_version = 1;",
        )
        .map_err(wrap)?;
        Ok(Journal { conn: Mutex::new(conn), path: path.to_path_buf() })
    }

    /// Opens `<home>/journal.sqlite3`.
    pub fn open_in(home: &Path) -> Result<Journal, JournalError> {
        Journal::open(&home.join(JOURNAL_FILE))
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn conn(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the lock cannot leave SQLite half-written (transactions roll
        // back), so a poisoned lock is still usable.
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a new `queued` message and returns its id; the row is durable when this returns.
    pub fn accept(&self, msg: &NewMessage) -> Result<String, JournalError> {
        let now = now_rfc3339();
        let conn = self.conn();
        // 96 random bits from SQLite's CSPRNG: unique without coordination.
        let id: String = conn.query_row(
            "INSERT INTO messages (id, chat_id, user_id, text, kind, state, attempts, is_command,
                                   created_at, updated_at)
             VALUES (lower(hex(randomblob(12))), ?1, ?2, ?3, ?4, 'queued', 0, 0, ?5, ?5)
             RETURNING id",
            params![msg.chat_id, msg.user_id, msg.text, msg.kind.as_str(), now],
            |r| r.get(0),
        )?;
        Ok(id)
    }

    /// Records a lifecycle command (`/restart`, `/stop`, …) that was answered at once, as a row
    /// that is already `done` with `reply` and flagged as a command, in one statement: there is
    /// no instant at which a crash could leave it queued, so it can never be replayed.
    pub fn accept_command(&self, msg: &NewMessage, reply: &str) -> Result<String, JournalError> {
        let now = now_rfc3339();
        let conn = self.conn();
        let id: String = conn.query_row(
            "INSERT INTO messages (id, chat_id, user_id, text, kind, state, reply, attempts,
                                   is_command, created_at, updated_at)
             VALUES (lower(hex(randomblob(12))), ?1, ?2, ?3, ?4, 'done', ?5, 0, 1, ?6, ?6)
             RETURNING id",
            params![msg.chat_id, msg.user_id, msg.text, msg.kind.as_str(), reply, now],
            |r| r.get(0),
        )?;
        Ok(id)
    }

    /// `queued → running` under `incarnation`, counting the attempt. False if the row is not
    /// queued (already claimed, finished, or unknown).
    pub fn claim(&self, id: &str, incarnation: &str) -> Result<bool, JournalError> {
        let n = self.conn().execute(
            "UPDATE messages SET state = 'running', attempts = attempts + 1, incarnation = ?2,
                                 updated_at = ?3
             WHERE id = ?1 AND state = 'queued'",
            params![id, incarnation, now_rfc3339()],
        )?;
        Ok(n == 1)
    }

    /// `running → done` with the reply, only if `incarnation` owns the run.
    pub fn complete(&self, id: &str, incarnation: &str, reply: &str) -> Result<bool, JournalError> {
        let n = self.conn().execute(
            "UPDATE messages SET state = 'done', reply = ?3, reason = NULL, updated_at = ?4
             WHERE id = ?1 AND state = 'running' AND incarnation = ?2",
            params![id, incarnation, reply, now_rfc3339()],
        )?;
        Ok(n == 1)
    }

    /// `running → failed` with a reason, only if `incarnation` owns the run.
    pub fn fail(&self, id: &str, incarnation: &str, reason: &str) -> Result<bool, JournalError> {
        let n = self.conn().execute(
            "UPDATE messages SET state = 'failed', reason = ?3, updated_at = ?4
             WHERE id = ?1 AND state = 'running' AND incarnation = ?2",
            params![id, incarnation, reason, now_rfc3339()],
        )?;
        Ok(n == 1)
    }

    /// Marks a message as a lifecycle command (e.g. the run that requested a restart) and
    /// finishes it as `done` now, before the drain, so that no later incarnation replays it.
    /// Returns false if the row was already final (it is still flagged) or unknown.
    pub fn mark_command(&self, id: &str) -> Result<bool, JournalError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let now = now_rfc3339();
        let finished = tx.execute(
            "UPDATE messages SET state = 'done', is_command = 1, reason = NULL, updated_at = ?2
             WHERE id = ?1 AND state IN ('queued', 'running')",
            params![id, now],
        )?;
        tx.execute("UPDATE messages SET is_command = 1 WHERE id = ?1", params![id])?;
        tx.commit()?;
        Ok(finished == 1)
    }

    /// Called once by a new incarnation before it runs anything. Rows `running` under another
    /// incarnation were interrupted (stop, restart, crash): requeued if they have had fewer than
    /// [`MAX_ATTEMPTS`] attempts, else failed with [`REASON_INTERRUPTED_TWICE`]. Command rows are
    /// never requeued. Returns the ids of all queued rows, oldest first: the work to run.
    pub fn recover(&self, new_incarnation: &str) -> Result<Vec<String>, JournalError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let now = now_rfc3339();
        // Defence in depth: a command row is final already, but never let one run again.
        tx.execute(
            "UPDATE messages SET state = 'done', updated_at = ?1
             WHERE is_command = 1 AND state IN ('queued', 'running')",
            params![now],
        )?;
        tx.execute(
            "UPDATE messages SET state = 'failed', reason = ?3, updated_at = ?2
             WHERE state = 'running' AND incarnation IS NOT ?1 AND attempts >= ?4",
            params![new_incarnation, now, REASON_INTERRUPTED_TWICE, MAX_ATTEMPTS],
        )?;
        tx.execute(
            "UPDATE messages SET state = 'queued', updated_at = ?2
             WHERE state = 'running' AND incarnation IS NOT ?1 AND attempts < ?3",
            params![new_incarnation, now, MAX_ATTEMPTS],
        )?;
        let ids = {
            let mut stmt = tx.prepare(
                "SELECT id FROM messages WHERE state = 'queued' AND is_command = 0
                 ORDER BY created_at, rowid",
            )?;
            stmt.query_map([], |r| r.get::<_, String>(0))?.collect::<Result<Vec<_>, _>>()?
        };
        tx.commit()?;
        Ok(ids)
    }

    /// One message by id.
    pub fn get(&self, id: &str) -> Result<Option<Message>, JournalError> {
        let conn = self.conn();
        let raw = conn
            .query_row(&format!("SELECT {COLUMNS} FROM messages WHERE id = ?1"), params![id], RawRow::read)
            .optional()?;
        raw.map(RawRow::into_message).transpose()
    }

    /// Messages not yet final (queued or running), oldest first.
    pub fn pending(&self) -> Result<Vec<Message>, JournalError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(&format!(
            "SELECT {COLUMNS} FROM messages WHERE state IN ('queued', 'running')
             ORDER BY created_at, rowid"
        ))?;
        let rows = stmt.query_map([], RawRow::read)?.collect::<Result<Vec<_>, _>>()?;
        rows.into_iter().map(RawRow::into_message).collect()
    }

    /// Row counts by state.
    pub fn counts(&self) -> Result<Counts, JournalError> {
        let conn = self.conn();
        let mut stmt = conn.prepare("SELECT state, COUNT(*) FROM messages GROUP BY state")?;
        let mut counts = Counts::default();
        let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
        for row in rows {
            let (state, n) = row?;
            let n = u64::try_from(n).unwrap_or(0);
            match State::parse(&state) {
                Some(State::Queued) => counts.queued = n,
                Some(State::Running) => counts.running = n,
                Some(State::Done) => counts.done = n,
                Some(State::Failed) => counts.failed = n,
                None => {}
            }
        }
        Ok(counts)
    }
}

/// A row as stored, before its enums are checked.
struct RawRow {
    id: String,
    chat_id: String,
    user_id: String,
    text: String,
    kind: String,
    state: String,
    reply: Option<String>,
    reason: Option<String>,
    attempts: i64,
    incarnation: Option<String>,
    is_command: bool,
    created_at: String,
    updated_at: String,
}

impl RawRow {
    fn read(r: &Row<'_>) -> rusqlite::Result<RawRow> {
        Ok(RawRow {
            id: r.get(0)?,
            chat_id: r.get(1)?,
            user_id: r.get(2)?,
            text: r.get(3)?,
            kind: r.get(4)?,
            state: r.get(5)?,
            reply: r.get(6)?,
            reason: r.get(7)?,
            attempts: r.get(8)?,
            incarnation: r.get(9)?,
            is_command: r.get::<_, i64>(10)? != 0,
            created_at: r.get(11)?,
            updated_at: r.get(12)?,
        })
    }

    fn into_message(self) -> Result<Message, JournalError> {
        let kind = Kind::parse(&self.kind).ok_or_else(|| JournalError::Corrupt {
            id: self.id.clone(),
            column: "kind",
            value: self.kind.clone(),
        })?;
        let state = State::parse(&self.state).ok_or_else(|| JournalError::Corrupt {
            id: self.id.clone(),
            column: "state",
            value: self.state.clone(),
        })?;
        Ok(Message {
            id: self.id,
            chat_id: self.chat_id,
            user_id: self.user_id,
            text: self.text,
            kind,
            state,
            reply: self.reply,
            reason: self.reason,
            attempts: self.attempts,
            incarnation: self.incarnation,
            is_command: self.is_command,
            created_at: self.created_at,
            updated_at: self.updated_at,
        })
    }
}

/// Now as RFC 3339 UTC with microseconds (`2026-11-29T15:04:05.123456+00:00`), the protocol's
/// timestamp format.
/// Timestamps in the protocol's one format (`gatewarden_lifecycle::timefmt`).
fn now_rfc3339() -> String {
    gatewarden_lifecycle::timefmt::now()
}

/// The migration dry run for `gatewarden check` (a staged release against the live home):
/// opens the journal read-only — never creating, migrating or locking it for long — and says
/// which schema version it has; an error when this build could not open it. A missing journal
/// is version 0 (created at first start).
pub fn check_schema(home: &Path) -> Result<i64, JournalError> {
    let path = home.join(JOURNAL_FILE);
    if !path.exists() {
        return Ok(0);
    }
    let wrap = |source| JournalError::Open { path: path.clone(), source };
    let conn = Connection::open_with_flags(&path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).map_err(wrap)?;
    conn.busy_timeout(Duration::from_secs(5)).map_err(wrap)?;
    let found: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0)).map_err(wrap)?;
    if found > SCHEMA_VERSION {
        return Err(JournalError::SchemaTooNew { path, found });
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, HashMap};

    fn msg(text: &str) -> NewMessage {
        NewMessage { chat_id: "c1".into(), user_id: "u1".into(), text: text.into(), kind: Kind::Async }
    }

    fn journal() -> (tempfile::TempDir, Journal) {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open_in(dir.path()).unwrap();
        (dir, j)
    }

    #[test]
    fn pragmas_and_schema() {
        let (_d, j) = journal();
        let conn = j.conn();
        let mode: String = conn.pragma_query_value(None, "journal_mode", |r| r.get(0)).unwrap();
        assert_eq!(mode, "wal");
        let sync: i64 = conn.pragma_query_value(None, "synchronous", |r| r.get(0)).unwrap();
        assert_eq!(sync, 2, "synchronous=FULL");
    }

    #[test]
    fn lifecycle_of_one_message() {
        let (dir, j) = journal();
        let id = j.accept(&msg("hello")).unwrap();
        assert_eq!(id.len(), 24);
        let m = j.get(&id).unwrap().unwrap();
        assert_eq!((m.state, m.attempts, m.kind), (State::Queued, 0, Kind::Async));
        assert_eq!(m.text, "hello");
        assert!(m.created_at.ends_with("+00:00"));
        assert!(!j.complete(&id, "inc1", "x").unwrap(), "not running yet");
        assert!(j.claim(&id, "inc1").unwrap());
        assert!(!j.claim(&id, "inc1").unwrap(), "claimed once");
        assert!(!j.complete(&id, "inc0", "x").unwrap(), "other incarnation");
        assert!(j.complete(&id, "inc1", "world").unwrap());
        assert!(!j.complete(&id, "inc1", "again").unwrap(), "completed once");
        assert!(!j.fail(&id, "inc1", "late").unwrap());
        drop(j);
        // Durable across reopen.
        let j = Journal::open_in(dir.path()).unwrap();
        let m = j.get(&id).unwrap().unwrap();
        assert_eq!((m.state, m.reply.as_deref(), m.attempts), (State::Done, Some("world"), 1));
        assert_eq!(j.get("nope").unwrap(), None);
        assert_eq!(j.counts().unwrap(), Counts { done: 1, ..Counts::default() });
    }

    #[test]
    fn interrupted_run_is_rerun_once_then_failed() {
        let (_d, j) = journal();
        let id = j.accept(&msg("x")).unwrap();
        let queued = j.accept(&msg("never claimed")).unwrap();
        assert!(j.claim(&id, "a").unwrap());
        // Crash; incarnation b recovers.
        assert_eq!(j.recover("b").unwrap(), vec![id.clone(), queued.clone()]);
        // The old incarnation can no longer finish it.
        assert!(!j.complete(&id, "a", "stale").unwrap());
        assert!(j.claim(&id, "b").unwrap());
        // Crash again; c recovers: second interruption fails it.
        assert_eq!(j.recover("c").unwrap(), vec![queued.clone()]);
        let m = j.get(&id).unwrap().unwrap();
        assert_eq!(m.state, State::Failed);
        assert_eq!(m.reason.as_deref(), Some(REASON_INTERRUPTED_TWICE));
        assert_eq!(m.attempts, 2);
        // Recovery is idempotent for the same incarnation.
        assert_eq!(j.recover("c").unwrap(), vec![queued]);
    }

    #[test]
    fn running_rows_of_the_current_incarnation_are_left_alone() {
        let (_d, j) = journal();
        let id = j.accept(&msg("x")).unwrap();
        assert!(j.claim(&id, "a").unwrap());
        assert_eq!(j.recover("a").unwrap(), Vec::<String>::new());
        assert_eq!(j.get(&id).unwrap().unwrap().state, State::Running);
    }

    #[test]
    fn command_message_is_never_recovered() {
        let (_d, j) = journal();
        let cmd = j.accept(&msg("/restart")).unwrap();
        let bystander = j.accept(&msg("hello")).unwrap();
        assert!(j.claim(&cmd, "a").unwrap());
        assert!(j.claim(&bystander, "a").unwrap());
        // The restart request is finished before the drain…
        assert!(j.mark_command(&cmd).unwrap());
        let m = j.get(&cmd).unwrap().unwrap();
        assert_eq!((m.state, m.is_command), (State::Done, true));
        // …so the requester's own completion cannot land twice…
        assert!(!j.complete(&cmd, "a", "restarting").unwrap());
        // …and after the restart only the bystander is replayed.
        assert_eq!(j.recover("b").unwrap(), vec![bystander.clone()]);
        assert_eq!(j.recover("c").unwrap(), vec![bystander]);
        assert_eq!(j.get(&cmd).unwrap().unwrap().state, State::Done);
        // A command row left running by some other path is still never returned.
        let cmd2 = j.accept(&msg("/restart")).unwrap();
        j.conn()
            .execute(
                "UPDATE messages SET state='running', is_command=1, incarnation='c', attempts=1 WHERE id=?1",
                params![cmd2],
            )
            .unwrap();
        assert!(!j.recover("d").unwrap().contains(&cmd2));
        assert_eq!(j.get(&cmd2).unwrap().unwrap().state, State::Done);
        assert!(!j.mark_command(&cmd2).unwrap(), "already final");
    }

    #[test]
    fn accepted_command_is_final_and_never_recovered() {
        let (_d, j) = journal();
        let id = j.accept_command(&msg("/restart"), "restarting").unwrap();
        let m = j.get(&id).unwrap().unwrap();
        assert_eq!((m.state, m.is_command, m.attempts), (State::Done, true, 0));
        assert_eq!(m.reply.as_deref(), Some("restarting"));
        assert!(!j.claim(&id, "a").unwrap());
        assert_eq!(j.recover("b").unwrap(), Vec::<String>::new());
        assert!(j.pending().unwrap().is_empty());
    }

    #[test]
    fn pending_and_counts() {
        let (_d, j) = journal();
        let a = j.accept(&msg("a")).unwrap();
        let b = j.accept(&msg("b")).unwrap();
        let c = j.accept(&NewMessage { kind: Kind::Sync, ..msg("c") }).unwrap();
        assert!(j.claim(&a, "i").unwrap());
        assert!(j.claim(&b, "i").unwrap());
        assert!(j.fail(&b, "i", "boom").unwrap());
        let pending: Vec<_> = j.pending().unwrap().into_iter().map(|m| m.id).collect();
        assert_eq!(pending, vec![a, c.clone()]);
        assert_eq!(j.get(&c).unwrap().unwrap().kind, Kind::Sync);
        assert_eq!(j.counts().unwrap(), Counts { queued: 1, running: 1, done: 0, failed: 1 });
    }

    #[test]
    fn newer_schema_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(JOURNAL_FILE);
        Connection::open(&path).unwrap().pragma_update(None, "user_version", 99).unwrap();
        assert!(matches!(Journal::open(&path), Err(JournalError::SchemaTooNew { found: 99, .. })));
    }

    #[test]
    fn garbage_file_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(JOURNAL_FILE);
        std::fs::write(&path, b"this is not a database, just some text padding it out...").unwrap();
        let err = Journal::open(&path).unwrap_err();
        assert!(err.to_string().contains("journal"), "{err}");
    }

    #[derive(Debug, Clone)]
    enum Op {
        Accept,
        /// Claim the n-th accepted message (modulo), as the current incarnation.
        Claim(usize),
        Complete(usize),
        Fail(usize),
        /// A worker of an older incarnation tries to finish the n-th message.
        StaleComplete(usize),
        /// The n-th message requested a restart.
        Command(usize),
        /// Process dies; a new incarnation reopens the file and recovers.
        Crash,
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            3 => Just(Op::Accept),
            3 => any::<usize>().prop_map(Op::Claim),
            2 => any::<usize>().prop_map(Op::Complete),
            1 => any::<usize>().prop_map(Op::Fail),
            1 => any::<usize>().prop_map(Op::StaleComplete),
            1 => any::<usize>().prop_map(Op::Command),
            1 => Just(Op::Crash),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config { cases: 48, ..Default::default() })]

        /// Every accepted message ends exactly once (done or failed), nothing is finished
        /// twice, a run is started at most twice, and command messages are never recovered.
        #[test]
        fn every_message_ends_exactly_once(ops in proptest::collection::vec(op(), 1..60)) {
            let dir = tempfile::tempdir().unwrap();
            let mut j = Journal::open_in(dir.path()).unwrap();
            let mut generation = 0u32;
            let mut inc = format!("inc{generation}");
            let mut ids: Vec<String> = Vec::new();
            let mut finishes: HashMap<String, u32> = HashMap::new();
            let mut commands: Vec<String> = Vec::new();
            let pick = |ids: &Vec<String>, n: usize| ids.get(n % ids.len().max(1)).cloned();

            let crash = |j: &mut Journal, generation: &mut u32, inc: &mut String,
                             commands: &Vec<String>| {
                *generation += 1;
                *inc = format!("inc{generation}");
                *j = Journal::open_in(dir.path()).unwrap();
                let ids = j.recover(inc).unwrap();
                for c in commands {
                    assert!(!ids.contains(c), "command {c} recovered");
                }
                ids
            };

            for op in ops {
                match op {
                    Op::Accept => ids.push(j.accept(&msg("m")).unwrap()),
                    Op::Claim(n) => if let Some(id) = pick(&ids, n) {
                        j.claim(&id, &inc).unwrap();
                    },
                    Op::Complete(n) => if let Some(id) = pick(&ids, n)
                        && j.complete(&id, &inc, "ok").unwrap() {
                        *finishes.entry(id).or_default() += 1;
                    },
                    Op::Fail(n) => if let Some(id) = pick(&ids, n)
                        && j.fail(&id, &inc, "boom").unwrap() {
                        *finishes.entry(id).or_default() += 1;
                    },
                    Op::StaleComplete(n) => if let Some(id) = pick(&ids, n) && generation > 0 {
                        let old = format!("inc{}", generation - 1);
                        assert!(!j.complete(&id, &old, "stale").unwrap(), "stale worker finished {id}");
                    },
                    Op::Command(n) => if let Some(id) = pick(&ids, n)
                        && j.mark_command(&id).unwrap() {
                        *finishes.entry(id.clone()).or_default() += 1;
                        commands.push(id);
                    },
                    Op::Crash => {
                        crash(&mut j, &mut generation, &mut inc, &commands);
                    }
                }
            }

            // Let the system settle: restarts that run everything they are handed.
            for _ in 0..3 {
                let todo = crash(&mut j, &mut generation, &mut inc, &commands);
                for id in todo {
                    proptest::prop_assert!(j.claim(&id, &inc).unwrap());
                    proptest::prop_assert!(j.complete(&id, &inc, "ok").unwrap());
                    *finishes.entry(id).or_default() += 1;
                }
            }

            let mut states: BTreeMap<&str, u32> = BTreeMap::new();
            for id in &ids {
                let m = j.get(id).unwrap().unwrap();
                proptest::prop_assert!(m.state.is_final(), "{id} ended {:?}", m.state);
                proptest::prop_assert!(m.attempts <= MAX_ATTEMPTS, "{id} ran {} times", m.attempts);
                let recorded = finishes.get(id).copied().unwrap_or(0);
                if m.reason.as_deref() == Some(REASON_INTERRUPTED_TWICE) {
                    // Finished by recovery itself, not by a worker.
                    proptest::prop_assert_eq!(recorded, 0);
                } else {
                    proptest::prop_assert_eq!(recorded, 1, "{} finished {} times", id, recorded);
                }
                *states.entry(m.state.as_str()).or_default() += 1;
            }
            let c = j.counts().unwrap();
            proptest::prop_assert_eq!(c.queued + c.running, 0);
            proptest::prop_assert_eq!((c.done + c.failed) as usize, ids.len());
        }
    }
}
