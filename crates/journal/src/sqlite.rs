//! The home's journal: `<home>/journal.sqlite3`, the [`Store`] a gateway without `[cluster]` uses.
//!
//! Durability: WAL with `synchronous=FULL`. In WAL mode `NORMAL` survives a process crash but may
//! lose the last transactions on power loss or an OS crash; the 202 is a promise to the client,
//! so each commit is fsynced. Group commit pays for that fsync once per batch rather than once
//! per write: one writer thread owns the write connection and commits everything queued while
//! the previous commit was fsyncing in one transaction, a savepoint per request (see
//! [`Journal`]). A write returns only once the commit holding its rows is durable.
//!
//! The API is synchronous (SQLite is); callers on an async runtime use `spawn_blocking` or a
//! dedicated thread, and concurrent callers are what fills a batch. A [`Journal`] is
//! `Send + Sync` (a channel to the writer, and a read connection behind a mutex).

use std::path::{Path, PathBuf};
use std::sync::{LazyLock, Mutex, MutexGuard};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::row::{self, Cells, MESSAGE_COLUMNS, OUTGOING_COLUMNS};
use crate::trace::{Step, TRACE_COLUMNS, TraceEvent};
use crate::{
    Counts, Depth, JournalError, MAX_ATTEMPTS, Message, NewMessage, Outgoing, Pruned, REASON_INTERRUPTED_TWICE, State,
    Store, failure_notice,
};

/// The journal's file name inside the home.
pub const JOURNAL_FILE: &str = "journal.sqlite3";

/// Each connection's page cache: 512 KiB, as SQLite's negative `cache_size` counts it.
/// SQLite's default (2,000 KiB) filled up as the journal grew and stayed resident, twice (the
/// writer and the readers); the hot pages are the tail of `messages` and its indexes.
const CACHE_KIB: i64 = -512;

pub(crate) const SCHEMA_VERSION: i64 = 2;

/// The journal. Cheap to share behind an `Arc`.
///
/// Group commit: every write goes to one writer thread that owns the write connection. It takes
/// all the writes queued while the previous commit was fsyncing, runs them in ONE transaction
/// (each under its own savepoint, so a failing request fails alone) and commits once; then it
/// answers each request. A write method returns only after the commit that holds its rows is
/// durable (`synchronous=FULL`), so a 202 or a platform acknowledgement sent afterwards is still
/// a promise the journal keeps; concurrent writers share one fsync instead of queueing for one
/// each. Reads use their own connection (WAL: a read never waits for the writer, and sees every
/// commit that has answered).
#[derive(Debug)]
pub struct Journal {
    read: Mutex<Connection>,
    writer: Writer,
    path: PathBuf,
}

/// [`MESSAGE_COLUMNS`] as SQLite keeps them (timestamps are RFC 3339 text already).
static COLUMNS: LazyLock<String> = LazyLock::new(|| row::select_list(&MESSAGE_COLUMNS, str::to_owned));

/// [`OUTGOING_COLUMNS`], likewise.
static OUTGOING: LazyLock<String> = LazyLock::new(|| row::select_list(&OUTGOING_COLUMNS, str::to_owned));

impl Cells for Row<'_> {
    fn text(&self, i: usize) -> Result<String, JournalError> {
        Ok(self.get(i)?)
    }
    fn text_opt(&self, i: usize) -> Result<Option<String>, JournalError> {
        Ok(self.get(i)?)
    }
    fn int(&self, i: usize) -> Result<i64, JournalError> {
        Ok(self.get(i)?)
    }
    fn int_opt(&self, i: usize) -> Result<Option<i64>, JournalError> {
        Ok(self.get(i)?)
    }
    fn flag(&self, i: usize) -> Result<bool, JournalError> {
        // Stored as INTEGER 0/1.
        Ok(self.get::<_, i64>(i)? != 0)
    }
}

impl Journal {
    /// The `(prompt, completion)` tokens recorded with a run, if any.
    pub fn usage(&self, id: &str) -> Result<Option<(u64, u64)>, JournalError> {
        let conn = self.read();
        let row: Option<(Option<i64>, Option<i64>)> = conn
            .query_row("SELECT prompt_tokens, completion_tokens FROM messages WHERE id = ?1", params![id], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()?;
        Ok(row.and_then(|(p, c)| crate::row::usage_from(p, c)))
    }

    /// Opens (creating if needed) the journal at `path`, usually `<home>/journal.sqlite3`.
    pub fn open(path: &Path) -> Result<Journal, JournalError> {
        // Two gateways (or a gateway and a CLI) opening a fresh journal at once contend for the
        // lock that switching to WAL needs, and SQLite answers that with SQLITE_BUSY at once
        // rather than through the busy handler (seen on Windows): retry the open, bounded.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            match Journal::open_once(path) {
                Err(JournalError::Open { source: rusqlite::Error::SqliteFailure(e, _), .. })
                    if matches!(e.code, rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                other => return other,
            }
        }
    }

    fn open_once(path: &Path) -> Result<Journal, JournalError> {
        let wrap = |source| JournalError::Open { path: path.to_path_buf(), source };
        make_private(path)?;
        let conn = Connection::open_with_flags(path, open_flags()).map_err(wrap)?;
        // Another process (a CLI reading history) may hold the lock briefly.
        conn.busy_timeout(Duration::from_secs(5)).map_err(wrap)?;
        conn.pragma_update(None, "journal_mode", "WAL").map_err(wrap)?;
        conn.pragma_update(None, "synchronous", "FULL").map_err(wrap)?;
        conn.pragma_update(None, "cache_size", CACHE_KIB).map_err(wrap)?;
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
             CREATE INDEX IF NOT EXISTS messages_finished ON messages (updated_at)
                 WHERE state IN ('done', 'failed');",
        )
        .map_err(wrap)?;
        if version < 2 {
            migrate_to_2(&conn).map_err(wrap)?;
        }
        add_usage_columns(&conn).map_err(wrap)?;
        add_trace_table(&conn).map_err(wrap)?;
        // The readers' connection: the file is WAL already; `query_only` keeps every write on
        // the writer's connection, where it is batched and fsynced.
        let read = Connection::open_with_flags(path, open_flags()).map_err(wrap)?;
        read.busy_timeout(Duration::from_secs(5)).map_err(wrap)?;
        read.pragma_update(None, "query_only", true).map_err(wrap)?;
        read.pragma_update(None, "cache_size", CACHE_KIB).map_err(wrap)?;
        let writer = Writer::start(conn).map_err(|e| JournalError::Writer(format!("cannot start its writer: {e}")))?;
        Ok(Journal { read: Mutex::new(read), writer, path: path.to_path_buf() })
    }

    /// Opens `<home>/journal.sqlite3`.
    pub fn open_in(home: &Path) -> Result<Journal, JournalError> {
        Journal::open(&home.join(JOURNAL_FILE))
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The readers' connection.
    fn read(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the lock cannot leave SQLite half-written (reads only), so a
        // poisoned lock is still usable.
        self.read.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on the writer's connection inside the next group commit (under its own
    /// savepoint: an error rolls back `f`'s statements only) and returns its result once that
    /// commit is durable. `f` must not begin or end transactions itself.
    fn write<R: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<R, JournalError> + Send + 'static,
    ) -> Result<R, JournalError> {
        self.writer.submit(f, false)
    }
}

impl Store for Journal {
    fn describe(&self) -> String {
        format!("sqlite {}", self.path.display())
    }

    /// Records a new `queued` message and returns its id; the row is durable when this returns.
    fn accept(&self, msg: &NewMessage) -> Result<String, JournalError> {
        let (msg, received) = (msg.clone(), now_rfc3339());
        self.write(move |conn| {
            // 96 random bits from SQLite's CSPRNG: unique without coordination.
            let id: String = conn
                .prepare_cached(
                    "INSERT INTO messages (id, chat_id, user_id, text, kind, state, attempts, is_command,
                                       created_at, updated_at)
                 VALUES (lower(hex(randomblob(12))), ?1, ?2, ?3, ?4, 'queued', 0, 0, ?5, ?5)
                 RETURNING id",
                )?
                .query_row(params![msg.chat_id, msg.user_id, msg.text, msg.kind.as_str(), now_rfc3339()], |r| {
                    r.get(0)
                })?;
            trace_accepted(conn, &id, &received, None)?;
            Ok(id)
        })
    }

    fn accept_claimed(&self, msg: &NewMessage, incarnation: &str) -> Result<String, JournalError> {
        let (msg, incarnation, received) = (msg.clone(), incarnation.to_owned(), now_rfc3339());
        self.write(move |conn| {
            let id: String = conn
                .prepare_cached(
                    "INSERT INTO messages (id, chat_id, user_id, text, kind, state, attempts, incarnation,
                                       is_command, created_at, updated_at)
                 VALUES (lower(hex(randomblob(12))), ?1, ?2, ?3, ?4, 'running', 1, ?5, 0, ?6, ?6)
                 RETURNING id",
                )?
                .query_row(
                    params![msg.chat_id, msg.user_id, msg.text, msg.kind.as_str(), incarnation, now_rfc3339()],
                    |r| r.get(0),
                )?;
            trace_accepted(conn, &id, &received, None)?;
            trace_step(conn, &id, &TraceEvent::at(Step::Claimed, std::time::SystemTime::now()).subject(incarnation))?;
            Ok(id)
        })
    }

    /// Records a lifecycle command (`/restart`, `/stop`, …) that was answered at once, as a row
    /// that is already `done` with `reply` and flagged as a command, in one statement: there is
    /// no instant at which a crash could leave it queued, so it can never be replayed.
    fn accept_command(&self, msg: &NewMessage, reply: &str) -> Result<String, JournalError> {
        let (msg, reply, received) = (msg.clone(), reply.to_owned(), now_rfc3339());
        self.write(move |conn| {
            let id: String = conn
                .prepare_cached(
                    "INSERT INTO messages (id, chat_id, user_id, text, kind, state, reply, attempts,
                                       is_command, created_at, updated_at)
                 VALUES (lower(hex(randomblob(12))), ?1, ?2, ?3, ?4, 'done', ?5, 0, 1, ?6, ?6)
                 RETURNING id",
                )?
                .query_row(
                    params![msg.chat_id, msg.user_id, msg.text, msg.kind.as_str(), reply, now_rfc3339()],
                    |r| r.get(0),
                )?;
            trace_accepted(conn, &id, &received, None)?;
            trace_step(conn, &id, &TraceEvent::at(Step::Done, std::time::SystemTime::now()).outcome("command"))?;
            Ok(id)
        })
    }

    /// `queued → running` under `incarnation`, counting the attempt. False if the row is not
    /// queued (already claimed, finished, or unknown).
    fn claim(&self, id: &str, incarnation: &str) -> Result<bool, JournalError> {
        let (id, incarnation) = (id.to_owned(), incarnation.to_owned());
        self.write(move |conn| {
            let n = conn
                .prepare_cached(
                    "UPDATE messages SET state = 'running', attempts = attempts + 1, incarnation = ?2,
                                     updated_at = ?3
                 WHERE id = ?1 AND state = 'queued'",
                )?
                .execute(params![id, incarnation, now_rfc3339()])?;
            if n == 1 {
                trace_step(
                    conn,
                    &id,
                    &TraceEvent::at(Step::Claimed, std::time::SystemTime::now()).subject(incarnation),
                )?;
            }
            Ok(n == 1)
        })
    }

    fn complete_traced(
        &self,
        id: &str,
        incarnation: &str,
        reply: &str,
        usage: Option<(u64, u64)>,
        steps: &[TraceEvent],
    ) -> Result<bool, JournalError> {
        let (id, incarnation, reply) = (id.to_owned(), incarnation.to_owned(), reply.to_owned());
        let steps = bounded(steps);
        let (prompt, completion) = crate::row::usage_columns(usage);
        self.write(move |conn| {
            let now = now_rfc3339();
            let n = conn
                .prepare_cached(
                    "UPDATE messages SET state = 'done', reply = ?3, reason = NULL, updated_at = ?4,
                                     prompt_tokens = ?5, completion_tokens = ?6
                 WHERE id = ?1 AND state = 'running' AND incarnation = ?2",
                )?
                .execute(params![id, incarnation, reply, now, prompt, completion])?;
            if n == 1 {
                trace_run(conn, &id, &steps, TraceEvent::at(Step::Done, std::time::SystemTime::now()))?;
                queue_reply(conn, &id, &reply, &now)?;
            }
            Ok(n == 1)
        })
    }

    /// `running → failed` with a reason, only if `incarnation` owns the run. A platform
    /// message's chat is told that it failed (through the outbox, in the same transaction).
    fn fail_traced(
        &self,
        id: &str,
        incarnation: &str,
        reason: &str,
        notice: &str,
        steps: &[TraceEvent],
    ) -> Result<bool, JournalError> {
        let (id, incarnation, reason, notice) =
            (id.to_owned(), incarnation.to_owned(), reason.to_owned(), notice.to_owned());
        let steps = bounded(steps);
        self.write(move |conn| {
            let now = now_rfc3339();
            let n = conn
                .prepare_cached(
                    "UPDATE messages SET state = 'failed', reason = ?3, updated_at = ?4
                 WHERE id = ?1 AND state = 'running' AND incarnation = ?2",
                )?
                .execute(params![id, incarnation, reason, now])?;
            if n == 1 {
                let failed = TraceEvent::at(Step::Failed, std::time::SystemTime::now()).outcome(reason.as_str());
                trace_run(conn, &id, &steps, failed)?;
                queue_reply(conn, &id, &notice, &now)?;
            }
            Ok(n == 1)
        })
    }

    /// Journals a message from a chat platform, keyed by its platform event id: `None` when that
    /// event is already journaled (a redelivery after a crash between commit and the platform's
    /// acknowledgement). Durable when this returns.
    fn accept_inbound(&self, platform: &str, event_id: &str, msg: &NewMessage) -> Result<Option<String>, JournalError> {
        let (platform, event_id, msg) = (platform.to_owned(), event_id.to_owned(), msg.clone());
        let received = now_rfc3339();
        self.write(move |conn| {
            let id = conn
                .prepare_cached(
                    "INSERT OR IGNORE INTO messages (id, chat_id, user_id, text, kind, state, attempts,
                                           is_command, platform, event_id, created_at, updated_at)
                     VALUES (lower(hex(randomblob(12))), ?1, ?2, ?3, 'async', 'queued', 0, 0, ?4, ?5, ?6, ?6)
                     RETURNING id",
                )?
                .query_row(params![msg.chat_id, msg.user_id, msg.text, platform, event_id, now_rfc3339()], |r| {
                    r.get::<_, String>(0)
                })
                .optional()?;
            if let Some(id) = &id {
                trace_accepted(conn, id, &received, Some(&platform))?;
            }
            Ok(id)
        })
    }

    /// Journals a chat command from a platform as a finished command row and queues its reply,
    /// in one transaction. `None` when the event is already journaled (nothing is queued again).
    fn accept_inbound_command(
        &self,
        platform: &str,
        event_id: &str,
        msg: &NewMessage,
        reply: &str,
    ) -> Result<Option<String>, JournalError> {
        let (platform, event_id, msg, reply) =
            (platform.to_owned(), event_id.to_owned(), msg.clone(), reply.to_owned());
        let received = now_rfc3339();
        self.write(move |conn| {
            let now = now_rfc3339();
            let id = conn
                .prepare_cached(
                    "INSERT OR IGNORE INTO messages (id, chat_id, user_id, text, kind, state, reply, attempts,
                                           is_command, platform, event_id, created_at, updated_at)
                     VALUES (lower(hex(randomblob(12))), ?1, ?2, ?3, 'async', 'done', ?4, 0, 1, ?5, ?6, ?7, ?7)
                     RETURNING id",
                )?
                .query_row(params![msg.chat_id, msg.user_id, msg.text, reply, platform, event_id, now], |r| {
                    r.get::<_, String>(0)
                })
                .optional()?;
            if let Some(id) = &id {
                trace_accepted(conn, id, &received, Some(&platform))?;
                trace_step(conn, id, &TraceEvent::at(Step::Done, std::time::SystemTime::now()).outcome("command"))?;
                queue_reply(conn, id, &reply, &now)?;
            }
            Ok(id)
        })
    }

    /// Whether `(platform, event_id)` is journaled already.
    fn has_event(&self, platform: &str, event_id: &str) -> Result<bool, JournalError> {
        let n: i64 = self.read().query_row(
            "SELECT COUNT(*) FROM messages WHERE platform = ?1 AND event_id = ?2",
            params![platform, event_id],
            |r| r.get(0),
        )?;
        Ok(n > 0)
    }

    fn event_message(&self, platform: &str, event_id: &str) -> Result<Option<String>, JournalError> {
        let id = self
            .read()
            .query_row(
                "SELECT id FROM messages WHERE platform = ?1 AND event_id = ?2",
                params![platform, event_id],
                |r| r.get(0),
            )
            .optional()?;
        Ok(id)
    }

    /// Queues a message to a platform chat that answers no journaled message (a notice).
    fn enqueue(&self, platform: &str, chat_id: &str, text: &str) -> Result<i64, JournalError> {
        let (platform, chat_id, text) = (platform.to_owned(), chat_id.to_owned(), text.to_owned());
        self.write(move |conn| {
            let seq = conn.query_row(
                "INSERT INTO outbox (platform, chat_id, text, created_at, updated_at)
                 VALUES (?1, ?2, ?3, ?4, ?4) RETURNING seq",
                params![platform, chat_id, text, now_rfc3339()],
                |r| r.get(0),
            )?;
            Ok(seq)
        })
    }

    /// Pending outbox entries for `platform`, oldest first.
    fn outbox_pending(&self, platform: &str, limit: usize) -> Result<Vec<Outgoing>, JournalError> {
        let conn = self.read();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {} FROM outbox WHERE platform = ?1 AND state = 'pending' ORDER BY seq LIMIT ?2",
            *OUTGOING
        ))?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut rows = stmt.query(params![platform, limit])?;
        let mut out = Vec::new();
        while let Some(r) = rows.next()? {
            out.push(row::read_outgoing(r)?);
        }
        Ok(out)
    }

    /// An outbox entry left for good: `sent`, or `failed` with the platform's reason (a chat
    /// that no longer exists; retrying cannot help).
    fn outbox_done(&self, seq: i64, failed: Option<&str>) -> Result<bool, JournalError> {
        let failed = failed.map(str::to_owned);
        self.write(move |conn| {
            let state = if failed.is_some() { "failed" } else { "sent" };
            let n = conn
                .prepare_cached(
                    "UPDATE outbox SET state = ?2, reason = ?3, updated_at = ?4 WHERE seq = ?1 AND state = 'pending'",
                )?
                .execute(params![seq, state, failed, now_rfc3339()])?;
            if n == 1 {
                let step = if failed.is_some() { Step::OutboxFailed } else { Step::OutboxSent };
                conn.prepare_cached(
                    "INSERT INTO trace (message_id, step, at, subject, outcome)
                     SELECT message_id, ?2, ?3, platform, ?4 FROM outbox WHERE seq = ?1 AND message_id IS NOT NULL",
                )?
                .execute(params![
                    seq,
                    step.as_str(),
                    now_rfc3339(),
                    failed.as_deref().unwrap_or("ok")
                ])?;
            }
            Ok(n == 1)
        })
    }

    /// Outbox entries by state for `platform`: (pending, sent, failed).
    fn outbox_counts(&self, platform: &str) -> Result<(u64, u64, u64), JournalError> {
        let conn = self.read();
        let mut stmt = conn.prepare("SELECT state, COUNT(*) FROM outbox WHERE platform = ?1 GROUP BY state")?;
        let mut out = (0, 0, 0);
        let rows = stmt.query_map(params![platform], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
        for row in rows {
            let (state, n) = row?;
            let n = u64::try_from(n).unwrap_or(0);
            match state.as_str() {
                "pending" => out.0 = n,
                "sent" => out.1 = n,
                _ => out.2 = n,
            }
        }
        Ok(out)
    }

    /// Starts a fresh conversation in `(platform, chat)`: earlier turns are no longer history.
    fn new_session(&self, platform: &str, chat_id: &str) -> Result<(), JournalError> {
        let (platform, chat_id) = (platform.to_owned(), chat_id.to_owned());
        self.write(move |conn| {
            conn.execute(
                "INSERT INTO sessions (platform, chat_id, started_at) VALUES (?1, ?2, ?3)
                 ON CONFLICT (platform, chat_id) DO UPDATE SET started_at = excluded.started_at",
                params![platform, chat_id, now_rfc3339()],
            )?;
            Ok(())
        })
    }

    fn session_started(&self, platform: &str, chat_id: &str) -> Result<Option<String>, JournalError> {
        let conn = self.read();
        let mut stmt = conn.prepare_cached("SELECT started_at FROM sessions WHERE platform = ?1 AND chat_id = ?2")?;
        let mut rows = stmt.query(params![platform, chat_id])?;
        Ok(match rows.next()? {
            Some(r) => Some(r.get::<_, String>(0)?),
            None => None,
        })
    }

    /// The conversation before message `before` in its `(platform, chat)`: the last `turns`
    /// answered (non-command) messages of the current session, oldest first, as
    /// `(user text, reply)` pairs. An HTTP API message (no platform) has the HTTP messages of
    /// its `chat_id` as its conversation, its `/new` kept under the platform [`crate::HTTP_SESSIONS`].
    fn history(&self, before: &str, turns: usize) -> Result<Vec<(String, String)>, JournalError> {
        if turns == 0 {
            return Ok(Vec::new());
        }
        let conn = self.read();
        let mut stmt = conn.prepare_cached(
            "SELECT h.text, h.reply FROM messages m
             JOIN messages h ON h.platform IS m.platform AND h.chat_id = m.chat_id
             LEFT JOIN sessions s ON s.platform = COALESCE(m.platform, '') AND s.chat_id = m.chat_id
             WHERE m.id = ?1 AND h.id != m.id
               AND h.state = 'done' AND h.is_command = 0 AND h.reply IS NOT NULL
               AND (h.created_at < m.created_at OR (h.created_at = m.created_at AND h.rowid < m.rowid))
               AND (s.started_at IS NULL OR h.created_at > s.started_at)
             ORDER BY h.created_at DESC, h.rowid DESC LIMIT ?2",
        )?;
        let limit = i64::try_from(turns).unwrap_or(i64::MAX);
        let mut rows = stmt
            .query_map(params![before, limit], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?
            .collect::<Result<Vec<_>, _>>()?;
        rows.reverse();
        Ok(rows)
    }

    /// Marks a message as a lifecycle command (e.g. the run that requested a restart) and
    /// finishes it as `done` now, before the drain, so that no later incarnation replays it.
    /// Returns false if the row was already final (it is still flagged) or unknown.
    fn mark_command(&self, id: &str) -> Result<bool, JournalError> {
        let id = id.to_owned();
        self.write(move |conn| {
            let finished = conn.execute(
                "UPDATE messages SET state = 'done', is_command = 1, reason = NULL, updated_at = ?2
                 WHERE id = ?1 AND state IN ('queued', 'running')",
                params![id, now_rfc3339()],
            )?;
            conn.execute("UPDATE messages SET is_command = 1 WHERE id = ?1", params![id])?;
            if finished == 1 {
                trace_step(conn, &id, &TraceEvent::at(Step::Done, std::time::SystemTime::now()).outcome("command"))?;
            }
            Ok(finished == 1)
        })
    }

    /// Called once by a new incarnation before it runs anything. Rows `running` under another
    /// incarnation were interrupted (stop, restart, crash): requeued if they have had fewer than
    /// [`MAX_ATTEMPTS`] attempts, else failed with [`REASON_INTERRUPTED_TWICE`]. Command rows are
    /// never requeued. Returns the ids of all queued rows, oldest first: the work to run.
    fn recover(&self, new_incarnation: &str) -> Result<Vec<String>, JournalError> {
        let new_incarnation = new_incarnation.to_owned();
        self.write(move |tx| {
            let now = now_rfc3339();
            // Defence in depth: a command row is final already, but never let one run again.
            tx.execute(
                "UPDATE messages SET state = 'done', updated_at = ?1
                 WHERE is_command = 1 AND state IN ('queued', 'running')",
                params![now],
            )?;
            // The trace says which interrupted runs are given up and which run again.
            tx.execute(
                "INSERT INTO trace (message_id, step, at, subject, outcome)
                 SELECT id, CASE WHEN attempts >= ?4 THEN 'given_up' ELSE 'requeued' END, ?2, ?1,
                        CASE WHEN attempts >= ?4 THEN ?3 ELSE 'interrupted' END
                 FROM messages WHERE state = 'running' AND incarnation IS NOT ?1 AND is_command = 0",
                params![new_incarnation, now, REASON_INTERRUPTED_TWICE, MAX_ATTEMPTS],
            )?;
            // A platform chat whose message is given up is told so, as for any failed run.
            tx.execute(
                "INSERT INTO outbox (platform, chat_id, text, message_id, created_at, updated_at)
                 SELECT platform, chat_id, ?3, id, ?2, ?2 FROM messages
                 WHERE state = 'running' AND incarnation IS NOT ?1 AND attempts >= ?4
                   AND is_command = 0 AND platform IS NOT NULL",
                params![new_incarnation, now, failure_notice(REASON_INTERRUPTED_TWICE), MAX_ATTEMPTS],
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
            let mut stmt = tx.prepare(
                "SELECT id FROM messages WHERE state = 'queued' AND is_command = 0
                 ORDER BY created_at, rowid",
            )?;
            let ids = stmt.query_map([], |r| r.get::<_, String>(0))?.collect::<Result<Vec<_>, _>>()?;
            Ok(ids)
        })
    }

    /// One message by id.
    fn get(&self, id: &str) -> Result<Option<Message>, JournalError> {
        let conn = self.read();
        let mut stmt = conn.prepare_cached(&format!("SELECT {} FROM messages WHERE id = ?1", *COLUMNS))?;
        let mut rows = stmt.query(params![id])?;
        rows.next()?.map(row::read_message).transpose()
    }

    /// The message's steps in the order they were recorded.
    fn usage(&self, id: &str) -> Result<Option<(u64, u64)>, JournalError> {
        Journal::usage(self, id)
    }

    fn trace(&self, id: &str) -> Result<Vec<TraceEvent>, JournalError> {
        let conn = self.read();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {} FROM trace WHERE message_id = ?1 ORDER BY seq",
            TRACE_COLUMNS.join(", ")
        ))?;
        let mut rows = stmt.query(params![id])?;
        let mut out = Vec::new();
        while let Some(r) = rows.next()? {
            out.push(crate::trace::read_event(id, r)?);
        }
        Ok(out)
    }

    /// Messages not yet final (queued or running), oldest first.
    fn pending(&self) -> Result<Vec<Message>, JournalError> {
        let conn = self.read();
        let mut stmt = conn.prepare(&format!(
            "SELECT {} FROM messages WHERE state IN ('queued', 'running')
             ORDER BY created_at, rowid",
            *COLUMNS
        ))?;
        let mut rows = stmt.query([])?;
        let mut out = Vec::new();
        while let Some(r) = rows.next()? {
            out.push(row::read_message(r)?);
        }
        Ok(out)
    }

    /// The newest `limit` messages in `states` (by last update), newest first.
    fn recent(&self, states: &[State], limit: usize) -> Result<Vec<Message>, JournalError> {
        if states.is_empty() || limit == 0 {
            return Ok(Vec::new());
        }
        // The states are the enum's own fixed words: nothing from outside reaches the SQL.
        let list: Vec<String> = states.iter().map(|s| format!("'{}'", s.as_str())).collect();
        let conn = self.read();
        let mut stmt = conn.prepare(&format!(
            "SELECT {} FROM messages WHERE state IN ({}) ORDER BY updated_at DESC, rowid DESC LIMIT ?1",
            *COLUMNS,
            list.join(", ")
        ))?;
        let mut rows = stmt.query(params![i64::try_from(limit).unwrap_or(i64::MAX)])?;
        let mut out = Vec::new();
        while let Some(r) = rows.next()? {
            out.push(row::read_message(r)?);
        }
        Ok(out)
    }

    /// Row counts by state.
    fn counts(&self) -> Result<Counts, JournalError> {
        let conn = self.read();
        let mut stmt = conn.prepare("SELECT state, COUNT(*) FROM messages GROUP BY state")?;
        let mut counts = Counts::default();
        let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
        for row in rows {
            let (state, n) = row?;
            counts.record(&state, n);
        }
        Ok(counts)
    }

    /// Applies the retention bounds to every table: finished messages and outbox entries left
    /// for good (sent, failed) last updated more than `max_age` ago go, and chat sessions started
    /// before then; then the oldest finished messages and outbox entries (by acceptance) while
    /// the live data (pages in use) exceeds `max_bytes`. Queued and running messages and pending
    /// outbox entries are never deleted, whatever their age or size: queued work is bounded by
    /// refusing new messages past the queue caps instead (`[journal] max_queued*`). Freed pages
    /// are reused by later rows, so the file stops growing at about the bound.
    fn prune(&self, max_age: Option<Duration>, max_bytes: Option<u64>) -> Result<Pruned, JournalError> {
        // Alone on the writer, outside a batch: the checkpoint cannot run inside a transaction,
        // and each bounded delete commits on its own, as before group commit.
        self.writer.submit(move |conn| prune_on(conn, max_age, max_bytes), true)
    }

    /// One scan of the three text columns, only after a retention round deleted something.
    fn texts_with(&self, needle: &str) -> Result<Vec<String>, JournalError> {
        let conn = self.read();
        let pattern = format!("%{}%", needle.replace('\\', "\\\\").replace('%', "\\%").replace('_', "\\_"));
        let mut stmt = conn.prepare(
            "SELECT text FROM messages WHERE text LIKE ?1 ESCAPE '\\'
             UNION ALL SELECT reply FROM messages WHERE reply LIKE ?1 ESCAPE '\\'
             UNION ALL SELECT text FROM outbox WHERE text LIKE ?1 ESCAPE '\\'",
        )?;
        let rows = stmt.query_map(params![pattern], |r| r.get::<_, String>(0))?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    /// The queue, its busiest chat, and the pages in use (what the size bound measures).
    fn depth(&self) -> Result<Depth, JournalError> {
        let conn = self.read();
        let (queued, busiest): (i64, Option<i64>) = conn.query_row(
            "SELECT COALESCE(SUM(n), 0), MAX(n) FROM
               (SELECT COUNT(*) AS n FROM messages WHERE state = 'queued' GROUP BY platform, chat_id)",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        Ok(Depth {
            queued: u64::try_from(queued).unwrap_or(0),
            busiest_chat: Some(busiest.and_then(|b| u64::try_from(b).ok()).unwrap_or(0)),
            bytes: Some(data_bytes(&conn)?),
        })
    }

    /// Queued messages `(of this chat, in all)`; a chat is its platform (`None`: the HTTP API)
    /// and its id.
    fn queued(&self, platform: Option<&str>, chat_id: &str) -> Result<(u64, u64), JournalError> {
        let (chat, all): (i64, i64) = self.read().query_row(
            "SELECT COUNT(*) FILTER (WHERE chat_id = ?2 AND platform IS ?1), COUNT(*)
               FROM messages WHERE state = 'queued'",
            params![platform, chat_id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        Ok((u64::try_from(chat).unwrap_or(0), u64::try_from(all).unwrap_or(0)))
    }
}

/// Finished rows deleted per statement while enforcing the size bound: about the excess over
/// the average row size, within these bounds.
const PRUNE_BATCH: (u64, u64) = (1, 4096);

/// [`Journal`]'s `prune` on the writer's connection.
fn prune_on(conn: &Connection, max_age: Option<Duration>, max_bytes: Option<u64>) -> Result<Pruned, JournalError> {
    let mut pruned = Pruned::default();
    if let Some(age) = max_age {
        let cutoff = std::time::SystemTime::now().checked_sub(age).unwrap_or(std::time::UNIX_EPOCH);
        let cutoff = gatewarden_lifecycle::timefmt::format(cutoff);
        let n = conn
            .execute("DELETE FROM messages WHERE state IN ('done', 'failed') AND updated_at < ?1", params![cutoff])?;
        pruned.by_age = n as u64;
        let n =
            conn.execute("DELETE FROM outbox WHERE state IN ('sent', 'failed') AND updated_at < ?1", params![cutoff])?;
        let m = conn.execute("DELETE FROM sessions WHERE started_at < ?1", params![cutoff])?;
        pruned.outbox += (n + m) as u64;
    }
    if let Some(max) = max_bytes {
        loop {
            let used = data_bytes(conn)?;
            if used <= max {
                break;
            }
            let rows: i64 =
                conn.query_row("SELECT (SELECT COUNT(*) FROM messages) + (SELECT COUNT(*) FROM outbox)", [], |r| {
                    r.get(0)
                })?;
            let avg = used / u64::try_from(rows.max(1)).unwrap_or(1);
            let batch = ((used - max).div_ceil(avg.max(1))).clamp(PRUNE_BATCH.0, PRUNE_BATCH.1);
            let batch = i64::try_from(batch).unwrap_or(PRUNE_BATCH.0 as i64);
            let n = conn.execute(
                "DELETE FROM messages WHERE rowid IN (
                     SELECT rowid FROM messages WHERE state IN ('done', 'failed')
                     ORDER BY rowid LIMIT ?1)",
                params![batch],
            )?;
            let m = conn.execute(
                "DELETE FROM outbox WHERE seq IN (
                     SELECT seq FROM outbox WHERE state IN ('sent', 'failed') ORDER BY seq LIMIT ?1)",
                params![batch],
            )?;
            if n + m == 0 {
                break; // only unfinished work left: it stays
            }
            pruned.by_size += n as u64;
            pruned.outbox += m as u64;
        }
    }
    if pruned != Pruned::default() {
        // Fold the deletions into the main file so the WAL does not keep their size.
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
    }
    Ok(pruned)
}

/// Most requests one group commit takes: bounds the time any one of them waits for its answer
/// behind the others' statements.
const MAX_BATCH: usize = 1024;

/// The writer thread of a [`Journal`] (group commit) and the channel to it. Dropping it lets
/// the thread finish what is queued, then joins it: the file is closed when the journal is.
struct Writer {
    jobs: Option<std::sync::mpsc::Sender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Batches committed (tests: writes share commits).
    commits: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer").field("commits", &self.commits).finish_non_exhaustive()
    }
}

/// One write request: its statements, then its answer once the batch's fate is known.
trait Request: Send {
    /// Runs the request's statements; false when they failed (they are rolled back alone).
    fn run(&mut self, conn: &Connection) -> bool;
    /// Answers the caller: its own result, or why its batch is not durable (`lost`).
    fn answer(self: Box<Self>, lost: Option<&str>);
}

struct Job {
    request: Box<dyn Request>,
    /// Runs outside any batch, in autocommit (it commits, or checkpoints, on its own).
    alone: bool,
}

struct Pending<R, F> {
    f: Option<F>,
    result: Option<Result<R, JournalError>>,
    reply: std::sync::mpsc::SyncSender<Result<R, JournalError>>,
}

impl<R, F> Request for Pending<R, F>
where
    R: Send,
    F: FnOnce(&Connection) -> Result<R, JournalError> + Send,
{
    fn run(&mut self, conn: &Connection) -> bool {
        let r = match self.f.take() {
            Some(f) => f(conn),
            None => Err(JournalError::Writer("a request ran twice".into())),
        };
        let ok = r.is_ok();
        self.result = Some(r);
        ok
    }

    fn answer(self: Box<Self>, lost: Option<&str>) {
        let r = match (self.result, lost) {
            // Its own error first: the caller learns what was wrong with its request.
            (Some(Err(e)), _) => Err(e),
            (Some(Ok(v)), None) => Ok(v),
            (_, Some(why)) => Err(JournalError::Writer(format!("not committed: {why}"))),
            (None, None) => Err(JournalError::Writer("the request was not run".into())),
        };
        // The caller may be gone (a cancelled task): the result is durable either way.
        let _ = self.reply.send(r);
    }
}

impl Writer {
    fn start(conn: Connection) -> std::io::Result<Writer> {
        let (jobs, rx) = std::sync::mpsc::channel::<Job>();
        let commits = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counter = std::sync::Arc::clone(&commits);
        let thread = std::thread::Builder::new().name("journal-writer".into()).spawn(move || {
            while let Ok(first) = rx.recv() {
                // Everything queued while the last commit was fsyncing goes into this one.
                let (mut batch, mut alone, mut next) = (Vec::new(), None, Some(first));
                while let Some(job) = next.take() {
                    if job.alone {
                        alone = Some(job.request);
                        break;
                    }
                    batch.push(job.request);
                    if batch.len() < MAX_BATCH {
                        next = rx.try_recv().ok();
                    }
                }
                if !batch.is_empty() {
                    // Counted before the batch's writers are answered, so whoever an answer
                    // wakes sees its commit counted (the tests compare counts across writes).
                    counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    commit_batch(&conn, batch);
                }
                if let Some(mut request) = alone {
                    request.run(&conn);
                    request.answer(None);
                }
            }
        })?;
        Ok(Writer { jobs: Some(jobs), thread: Some(thread), commits })
    }

    /// Queues `f` and waits for its answer (see [`Journal::write`]); `alone`: see [`Job`].
    fn submit<R: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<R, JournalError> + Send + 'static,
        alone: bool,
    ) -> Result<R, JournalError> {
        let gone = || JournalError::Writer("its writer thread is gone".into());
        let (reply, answer) = std::sync::mpsc::sync_channel(1);
        let request = Box::new(Pending { f: Some(f), result: None, reply });
        self.jobs.as_ref().ok_or_else(gone)?.send(Job { request, alone }).map_err(|_| gone())?;
        answer.recv().map_err(|_| gone())?
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        drop(self.jobs.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Runs `batch` in one transaction, each request under its own savepoint, commits once (one
/// fsync), then answers every request. A request that fails is rolled back alone and the
/// others commit. If SQLite rolls the whole transaction back under us (disk full, I/O error),
/// or the commit fails, every request run in it is told it was not committed, and the rest
/// of the batch goes on in a new transaction.
fn commit_batch(conn: &Connection, batch: Vec<Box<dyn Request>>) {
    let mut queue = batch.into_iter().peekable();
    while queue.peek().is_some() {
        if let Err(e) = conn.execute_batch("BEGIN IMMEDIATE") {
            let why = e.to_string();
            queue.for_each(|r| r.answer(Some(&why)));
            return;
        }
        let (mut ran, mut lost) = (Vec::new(), None);
        for mut request in queue.by_ref() {
            if let Err(e) = conn.execute_batch("SAVEPOINT request") {
                lost = Some(e.to_string());
                ran.push(request);
                break;
            }
            let ok = request.run(conn);
            ran.push(request);
            let end = if ok { "RELEASE request" } else { "ROLLBACK TO request; RELEASE request" };
            let ended = conn.execute_batch(end);
            if let Err(e) = ended {
                lost = Some(e.to_string());
                break;
            }
            if conn.is_autocommit() {
                lost = Some("SQLite rolled the transaction back".into());
                break;
            }
        }
        if lost.is_none()
            && let Err(e) = conn.execute_batch("COMMIT")
        {
            lost = Some(e.to_string());
        }
        if lost.is_some() && !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        ran.into_iter().for_each(|r| r.answer(lost.as_deref()));
    }
}

/// SQLite's default flags, plus: never through a symlink (a race past [`make_private`]).
fn open_flags() -> rusqlite::OpenFlags {
    use rusqlite::OpenFlags as F;
    F::SQLITE_OPEN_READ_WRITE
        | F::SQLITE_OPEN_CREATE
        | F::SQLITE_OPEN_URI
        | F::SQLITE_OPEN_NO_MUTEX
        | F::SQLITE_OPEN_NOFOLLOW
}

/// The journal's sidecars in WAL mode; SQLite creates them with the main file's mode.
const SIDECARS: [&str; 2] = ["-wal", "-shm"];

/// Before SQLite opens `path`: creates it 0600 whatever the umask (SQLite would create it
/// 0644 minus the umask, and its `-wal`/`-shm` copy the main file's mode), narrows an existing
/// journal and its sidecars to 0600 (journals from before this rule), and refuses anything that
/// is not a regular file: a FIFO would hang SQLite's open, a symlink would move the messages
/// elsewhere. Opens go through lifecycle fsio (no link following, non-blocking).
fn make_private(path: &Path) -> Result<(), JournalError> {
    use gatewarden_lifecycle::{fsio, platform};
    let fix = |p: &Path, create: bool| -> Result<(), JournalError> {
        let unsafe_ = |why: String| JournalError::Unsafe { path: p.to_path_buf(), why };
        let rw = || std::fs::OpenOptions::new().read(true).write(true).clone();
        let open_existing = || match fsio::open_no_follow(p, &rw()) {
            Ok(f) => Ok(Some(f)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(unsafe_(e.to_string())),
        };
        let (f, created) = if create {
            match fsio::open_no_follow(p, rw().create_new(true)) {
                Ok(f) => (Some(f), true),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => (open_existing()?, false),
                Err(e) => return Err(unsafe_(e.to_string())),
            }
        } else {
            (open_existing()?, false)
        };
        let Some(f) = f else { return Ok(()) };
        let meta = f.metadata().map_err(|e| unsafe_(e.to_string()))?;
        if !meta.is_file() {
            return Err(unsafe_(
                "not a regular file (a FIFO, socket, device or directory); refusing to open it".into(),
            ));
        }
        match platform::set_private_file(&f) {
            // Ours, just made: it must be private before SQLite copies its mode to the sidecars.
            Err(e) if created => Err(unsafe_(format!("cannot make it private (0600): {e}"))),
            // Someone else's journal opened by a reader allowed to write it: best effort, the
            // owner's next start narrows it.
            _ => Ok(()),
        }
    };
    // The same refusals as `check` (a FIFO `-wal` beside a missing main file included), before
    // anything is created.
    refuse_unsafe(path)?;
    fix(path, true)?;
    for suffix in SIDECARS {
        fix(&sidecar(path, suffix), false)?;
    }
    Ok(())
}

/// The one check of the journal's files that `run` (through [`make_private`]) and `check`
/// ([`check_schema`]) share, so `check` refuses whatever `run` refuses: the main file and each
/// sidecar, present or not, must be a regular file. Creates and changes nothing; `Ok(false)`
/// when the main file is missing.
fn refuse_unsafe(path: &Path) -> Result<bool, JournalError> {
    let main = check_regular(path)?;
    for suffix in SIDECARS {
        check_regular(&sidecar(path, suffix))?;
    }
    Ok(main)
}

fn sidecar(path: &Path, suffix: &str) -> PathBuf {
    let mut side = path.as_os_str().to_owned();
    side.push(suffix);
    PathBuf::from(side)
}

/// Refuses a journal path that is not a regular file, without creating or changing anything
/// (`check` on a live home): `Ok(false)` when it is missing.
fn check_regular(path: &Path) -> Result<bool, JournalError> {
    use gatewarden_lifecycle::fsio::{ReadOutcome, open_regular};
    match open_regular(path) {
        ReadOutcome::Missing => Ok(false),
        ReadOutcome::Ok(_) => Ok(true),
        ReadOutcome::Unreadable(why) | ReadOutcome::Transient(why) => {
            Err(JournalError::Unsafe { path: path.to_path_buf(), why })
        }
    }
}

/// Bytes of the database in use (pages minus free pages).
fn data_bytes(conn: &Connection) -> Result<u64, JournalError> {
    let pages: i64 = conn.pragma_query_value(None, "page_count", |r| r.get(0))?;
    let free: i64 = conn.pragma_query_value(None, "freelist_count", |r| r.get(0))?;
    let size: i64 = conn.pragma_query_value(None, "page_size", |r| r.get(0))?;
    Ok(u64::try_from((pages - free).max(0) * size).unwrap_or(0))
}

/// The tokens a run used, when its upstream reported them (issue 17): two nullable columns,
/// added without a schema version bump, so that a gatewarden from before them (an update's
/// rollback) still opens the journal; its statements name their columns. Same locking as
/// [`migrate_to_2`].
fn add_usage_columns(conn: &Connection) -> rusqlite::Result<()> {
    let has = |conn: &Connection| -> rusqlite::Result<bool> {
        conn.query_row("SELECT count(*) FROM pragma_table_info('messages') WHERE name = 'prompt_tokens'", [], |r| {
            r.get::<_, i64>(0)
        })
        .map(|n| n > 0)
    };
    if has(conn)? {
        return Ok(());
    }
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let migrate = || -> rusqlite::Result<()> {
        if has(conn)? {
            return Ok(());
        }
        conn.execute_batch(
            "ALTER TABLE messages ADD COLUMN prompt_tokens INTEGER;
             ALTER TABLE messages ADD COLUMN completion_tokens INTEGER;",
        )
    };
    match migrate() {
        Ok(()) => conn.execute_batch("COMMIT"),
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

/// Schema 2 (chat platforms): where an inbound message came from and its platform event id
/// (deduplication), the durable outbox, and per-chat sessions. The journal is opened before the
/// instance lock is taken, so two starting gateways may race here: the write lock is taken first
/// (`BEGIN IMMEDIATE`, waiting out the busy timeout) and the version read again under it.
fn migrate_to_2(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let migrate = || -> rusqlite::Result<()> {
        let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
        if version >= 2 {
            return Ok(());
        }
        conn.execute_batch(
            "ALTER TABLE messages ADD COLUMN platform TEXT;
             ALTER TABLE messages ADD COLUMN event_id TEXT;
             CREATE UNIQUE INDEX messages_event ON messages (platform, event_id)
                 WHERE event_id IS NOT NULL;
             CREATE INDEX messages_chat ON messages (platform, chat_id, created_at);
             CREATE TABLE outbox (
                 seq        INTEGER PRIMARY KEY AUTOINCREMENT,
                 platform   TEXT NOT NULL,
                 chat_id    TEXT NOT NULL,
                 text       TEXT NOT NULL,
                 message_id TEXT,
                 state      TEXT NOT NULL DEFAULT 'pending'
                            CHECK (state IN ('pending', 'sent', 'failed')),
                 reason     TEXT,
                 created_at TEXT NOT NULL,
                 updated_at TEXT NOT NULL
             );
             CREATE INDEX outbox_pending ON outbox (platform, state, seq);
             CREATE TABLE sessions (
                 platform   TEXT NOT NULL,
                 chat_id    TEXT NOT NULL,
                 started_at TEXT NOT NULL,
                 PRIMARY KEY (platform, chat_id)
             );
             PRAGMA user_version = 2;",
        )
    };
    match migrate() {
        Ok(()) => conn.execute_batch("COMMIT"),
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

/// The trace (crates/journal/src/trace.rs), additive like [`add_usage_columns`]: no version
/// bump, so that a gatewarden from before it (an update's rollback) still opens the journal and
/// simply writes no steps. The trigger bounds the table by the messages: a message pruned (or
/// deleted by any build) takes its steps with it.
fn add_trace_table(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS trace (
             seq        INTEGER PRIMARY KEY,
             message_id TEXT NOT NULL,
             step       TEXT NOT NULL,
             at         TEXT NOT NULL,
             subject    TEXT,
             outcome    TEXT,
             elapsed_ms INTEGER
         );
         CREATE INDEX IF NOT EXISTS trace_message ON trace (message_id, seq);
         CREATE TRIGGER IF NOT EXISTS trace_pruned AFTER DELETE ON messages BEGIN
             DELETE FROM trace WHERE message_id = old.id;
         END;",
    )
}

/// A run's steps past [`crate::trace::MAX_RUN_STEPS`] are not written.
fn bounded(steps: &[TraceEvent]) -> Vec<TraceEvent> {
    steps.iter().take(crate::trace::MAX_RUN_STEPS).cloned().collect()
}

/// Writes one step of message `id`.
fn trace_step(conn: &Connection, id: &str, e: &TraceEvent) -> Result<(), JournalError> {
    let elapsed = e.elapsed_ms.map(|v| i64::try_from(v).unwrap_or(i64::MAX));
    conn.prepare_cached(
        "INSERT INTO trace (message_id, step, at, subject, outcome, elapsed_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?
    .execute(params![id, e.step.as_str(), e.at, e.subject, e.outcome, elapsed])?;
    Ok(())
}

/// `received` (when the journal was asked) and `journaled` (now, inside the commit).
fn trace_accepted(conn: &Connection, id: &str, received: &str, platform: Option<&str>) -> Result<(), JournalError> {
    let mut r = TraceEvent::at(Step::Received, std::time::SystemTime::now());
    r.at = received.to_owned();
    r.subject = Some(platform.unwrap_or("http").to_owned());
    trace_step(conn, id, &r)?;
    trace_step(conn, id, &TraceEvent::at(Step::Journaled, std::time::SystemTime::now()))
}

/// A finished run's noted steps, then its final step.
fn trace_run(conn: &Connection, id: &str, steps: &[TraceEvent], last: TraceEvent) -> Result<(), JournalError> {
    for e in steps {
        trace_step(conn, id, e)?;
    }
    trace_step(conn, id, &last)
}

/// Queues `text` for the chat of message `id` if that message came from a platform.
fn queue_reply(conn: &Connection, id: &str, text: &str, now: &str) -> Result<(), JournalError> {
    conn.prepare_cached(
        "INSERT INTO outbox (platform, chat_id, text, message_id, created_at, updated_at)
         SELECT platform, chat_id, ?2, id, ?3, ?3 FROM messages WHERE id = ?1 AND platform IS NOT NULL",
    )?
    .execute(params![id, text, now])?;
    Ok(())
}

/// Now as RFC 3339 UTC with microseconds (`2026-11-29T15:04:05.123456+00:00`), the protocol's
/// one timestamp format (`gatewarden_lifecycle::timefmt`).
fn now_rfc3339() -> String {
    gatewarden_lifecycle::timefmt::now()
}

/// The migration dry run for `gatewarden check` (a staged release against the live home):
/// opens the journal read-only — never creating, migrating or locking it for long — and says
/// which schema version it has; an error when this build could not open it. A missing journal
/// is version 0 (created at first start).
pub fn check_schema(home: &Path) -> Result<i64, JournalError> {
    let path = home.join(JOURNAL_FILE);
    // A FIFO here would hang SQLite's open (and the update preflight behind it).
    if !refuse_unsafe(&path)? {
        return Ok(0);
    }
    let wrap = |source| JournalError::Open { path: path.clone(), source };
    let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NOFOLLOW;
    let conn = Connection::open_with_flags(&path, flags).map_err(wrap)?;
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
    use crate::{Kind, State};
    use std::collections::{BTreeMap, HashMap};

    fn msg(text: &str) -> NewMessage {
        NewMessage { chat_id: "c1".into(), user_id: "u1".into(), text: text.into(), kind: Kind::Async }
    }

    fn journal() -> (tempfile::TempDir, Journal) {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open_in(dir.path()).unwrap();
        (dir, j)
    }

    /// A raw write through the writer (tests set up states no method produces).
    fn sql(j: &Journal, sql: &str, args: &[&str]) {
        let (sql, args): (String, Vec<String>) = (sql.into(), args.iter().map(|a| (*a).to_owned()).collect());
        j.write(move |c| Ok(c.execute(&sql, rusqlite::params_from_iter(args))?)).unwrap();
    }

    fn steps(j: &Journal, id: &str) -> Vec<&'static str> {
        j.trace(id).unwrap().into_iter().map(|e| e.step.as_str()).collect()
    }

    /// Every step of a platform message lands in the commit that already happens: accept
    /// (received, journaled), claim, finish (the run's steps, then done) and the outbox; the
    /// trace costs no commit of its own.
    #[test]
    fn texts_naming_attachments_are_found_in_messages_replies_and_the_outbox() {
        let (_d, j) = journal();
        let id =
            j.accept_inbound("tg", "ev1", &msg("look\n[attachment: a, image/png, 1 B, sha256:aa]")).unwrap().unwrap();
        j.accept_inbound("tg", "ev2", &msg("plain 100%_")).unwrap();
        assert!(j.claim(&id, "inc-1").unwrap());
        assert!(j.complete(&id, "inc-1", "back\n[attachment: b, text/plain, 1 B, sha256:bb]").unwrap());
        j.enqueue("tg", "c", "[attachment: c, text/plain, 1 B, sha256:cc]").unwrap();
        let mut got = j.texts_with("[attachment: ").unwrap();
        got.sort();
        assert_eq!(got.len(), 4, "the message, its reply, the reply in the outbox, the notice: {got:?}");
        assert!(got.iter().all(|t| t.contains("[attachment: ")), "{got:?}");
        assert_eq!(j.texts_with("100%_").unwrap().len(), 1, "LIKE wildcards are matched literally");
        assert!(j.texts_with("0%x").unwrap().is_empty());
    }

    #[test]
    fn a_message_trace_is_written_with_the_commits_that_happen_anyway() {
        let (_d, j) = journal();
        let id = j.accept_inbound("irc", "ev1", &msg("hi")).unwrap().unwrap();
        assert!(j.claim(&id, "inc-1").unwrap());
        let commits = j.writer.commits.load(std::sync::atomic::Ordering::Relaxed);
        let now = std::time::SystemTime::now();
        let run = [
            TraceEvent::at(Step::BackendCalled, now).subject("openai"),
            TraceEvent::at(Step::ProviderTried, now)
                .subject("primary")
                .outcome("HTTP 500")
                .elapsed(Duration::from_millis(7)),
            TraceEvent::at(Step::ProviderTried, now).subject("backup").outcome("ok"),
            TraceEvent::at(Step::FirstToken, now),
        ];
        assert!(j.complete_traced(&id, "inc-1", "hello", None, &run).unwrap());
        assert_eq!(
            j.writer.commits.load(std::sync::atomic::Ordering::Relaxed),
            commits + 1,
            "the run's steps share the finish's commit"
        );
        let out = j.outbox_pending("irc", 10).unwrap();
        assert!(j.outbox_done(out[0].seq, None).unwrap());
        assert_eq!(
            steps(&j, &id),
            [
                "received",
                "journaled",
                "claimed",
                "backend_called",
                "provider_tried",
                "provider_tried",
                "first_token",
                "done",
                "outbox_sent"
            ]
        );
        let t = j.trace(&id).unwrap();
        assert_eq!(t[0].subject.as_deref(), Some("irc"));
        assert_eq!(t[2].subject.as_deref(), Some("inc-1"));
        assert_eq!(
            (t[4].subject.as_deref(), t[4].outcome.as_deref(), t[4].elapsed_ms),
            (Some("primary"), Some("HTTP 500"), Some(7))
        );
        assert_eq!(t[8].subject.as_deref(), Some("irc"));
        assert!(t.iter().all(|e| e.time().is_some()), "every step has a protocol timestamp: {t:?}");
    }

    /// A failed run ends in `failed` with its reason; an interrupted one is requeued once and
    /// then given up; pruning a message takes its trace with it (the table is bounded).
    #[test]
    fn failed_requeued_and_given_up_are_traced_and_pruned_with_the_message() {
        let (_d, j) = journal();
        let a = j.accept(&msg("a")).unwrap();
        assert!(j.claim(&a, "inc-1").unwrap());
        assert!(j.fail_traced(&a, "inc-1", "upstream said no", "sorry (ref a)", &[]).unwrap());
        assert_eq!(steps(&j, &a), ["received", "journaled", "claimed", "failed"]);
        assert_eq!(j.trace(&a).unwrap()[3].outcome.as_deref(), Some("upstream said no"));

        let b = j.accept(&msg("b")).unwrap();
        assert!(j.claim(&b, "inc-1").unwrap());
        j.recover("inc-2").unwrap();
        assert!(j.claim(&b, "inc-2").unwrap());
        j.recover("inc-3").unwrap();
        assert_eq!(steps(&j, &b), ["received", "journaled", "claimed", "requeued", "claimed", "given_up"]);

        // A run that asked for a restart is finished as a command before the drain.
        let c = j.accept(&msg("/restart please")).unwrap();
        assert!(j.claim(&c, "inc-3").unwrap());
        assert!(j.mark_command(&c).unwrap());
        assert_eq!(steps(&j, &c), ["received", "journaled", "claimed", "done"]);
        assert_eq!(j.trace(&c).unwrap()[3].outcome.as_deref(), Some("command"));

        let traced: i64 = j.read().query_row("SELECT COUNT(*) FROM trace", [], |r| r.get(0)).unwrap();
        assert!(traced > 0);
        j.prune(Some(Duration::ZERO), None).unwrap();
        assert!(j.get(&a).unwrap().is_none());
        let traced: i64 = j.read().query_row("SELECT COUNT(*) FROM trace", [], |r| r.get(0)).unwrap();
        assert_eq!(traced, 0, "no step outlives its message");
    }

    #[test]
    fn pragmas_and_schema() {
        let (_d, j) = journal();
        // The writer's connection: every commit goes through it.
        let (mode, sync) = j
            .write(|conn| {
                let mode: String = conn.pragma_query_value(None, "journal_mode", |r| r.get(0))?;
                let sync: i64 = conn.pragma_query_value(None, "synchronous", |r| r.get(0))?;
                Ok((mode, sync))
            })
            .unwrap();
        assert_eq!(mode, "wal");
        assert_eq!(sync, 2, "synchronous=FULL");
    }

    /// A request for [`commit_batch`] and the receiver of its answer.
    fn request<R: Send + 'static>(
        f: impl FnOnce(&Connection) -> Result<R, JournalError> + Send + 'static,
    ) -> (Box<dyn Request>, std::sync::mpsc::Receiver<Result<R, JournalError>>) {
        let (reply, answer) = std::sync::mpsc::sync_channel(1);
        (Box::new(Pending { f: Some(f), result: None, reply }), answer)
    }

    fn insert(text: &'static str) -> impl FnOnce(&Connection) -> Result<String, JournalError> + Send + 'static {
        move |c| {
            c.execute(
                "INSERT INTO messages (id, chat_id, user_id, text, kind, state, created_at, updated_at)
                 VALUES (?1, 'c', 'u', ?1, 'async', 'queued', 't', 't')",
                params![text],
            )?;
            Ok(text.to_owned())
        }
    }

    /// The batch's one transaction holds every request, and a request that fails (here after
    /// writing a row of its own) is rolled back alone: the others are committed and answered
    /// with their own results, and the failing one gets its own error.
    #[test]
    fn a_failing_request_in_a_batch_fails_alone() {
        let (dir, j) = journal();
        drop(j);
        let conn = Connection::open(dir.path().join(JOURNAL_FILE)).unwrap();
        let (a, ra) = request(insert("a"));
        let (bad, rbad) = request(|c: &Connection| -> Result<(), JournalError> {
            insert("half")(c)?;
            // Violates the CHECK on state: the statement fails.
            c.execute("UPDATE messages SET state = 'bogus' WHERE id = 'a'", [])?;
            Ok(())
        });
        let (dup, rdup) = request(insert("a")); // the primary key is taken by `a`
        let (b, rb) = request(insert("b"));
        commit_batch(&conn, vec![a, bad, dup, b]);
        assert_eq!(ra.recv().unwrap().unwrap(), "a");
        assert!(matches!(rbad.recv().unwrap(), Err(JournalError::Sqlite(_))));
        assert!(matches!(rdup.recv().unwrap(), Err(JournalError::Sqlite(_))));
        assert_eq!(rb.recv().unwrap().unwrap(), "b");
        assert!(conn.is_autocommit(), "the batch is committed, no transaction left open");
        drop(conn);
        let j = Journal::open_in(dir.path()).unwrap();
        let ids: Vec<String> = j.pending().unwrap().into_iter().map(|m| m.id).collect();
        assert_eq!(ids, vec!["a".to_owned(), "b".to_owned()], "the failed request's own row is rolled back");
        assert_eq!(j.get("a").unwrap().unwrap().state, State::Queued);
    }

    /// When the commit itself fails, no request of the batch is told it succeeded.
    #[test]
    fn a_failed_commit_answers_every_request_with_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let conn = Connection::open(dir.path().join("x.sqlite3")).unwrap();
        // A deferred foreign key is only checked at COMMIT: the way to make a commit fail.
        conn.execute_batch(
            "PRAGMA foreign_keys = ON;
             CREATE TABLE parent (id INTEGER PRIMARY KEY);
             CREATE TABLE child (id INTEGER PRIMARY KEY,
                 parent INTEGER REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED);",
        )
        .unwrap();
        let (ok, rok) = request(|c: &Connection| Ok(c.execute("INSERT INTO parent (id) VALUES (1)", [])?));
        let (orphan, rorphan) = request(|c: &Connection| Ok(c.execute("INSERT INTO child VALUES (1, 99)", [])?));
        commit_batch(&conn, vec![ok, orphan]);
        assert!(matches!(rok.recv().unwrap(), Err(JournalError::Writer(w)) if w.contains("not committed")));
        assert!(matches!(rorphan.recv().unwrap(), Err(JournalError::Writer(_))));
        assert!(conn.is_autocommit());
        let n: i64 = conn.query_row("SELECT COUNT(*) FROM parent", [], |r| r.get(0)).unwrap();
        assert_eq!(n, 0, "nothing of the failed batch is in the file");
    }

    /// Concurrent writers share commits (group commit), each gets its own answer, and every
    /// row that was answered is in the file when it is reopened.
    #[test]
    fn concurrent_writes_share_commits() {
        let (dir, j) = journal();
        let j = std::sync::Arc::new(j);
        let handles: Vec<_> = (0..16)
            .map(|t| {
                let j = std::sync::Arc::clone(&j);
                std::thread::spawn(move || {
                    (0..25)
                        .map(|i| {
                            if i == 7 {
                                // One failing request per thread, in the middle of the others.
                                let r = j.write(|c| Ok(c.execute("INSERT INTO messages (id) VALUES ('x')", [])?));
                                assert!(r.is_err(), "{r:?}");
                            }
                            j.accept(&msg(&format!("{t}-{i}"))).unwrap()
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let ids: Vec<String> = handles.into_iter().flat_map(|h| h.join().unwrap()).collect();
        let commits = j.writer.commits.load(std::sync::atomic::Ordering::Relaxed);
        assert!(commits < ids.len() as u64, "{commits} commits for {} writes: no batching", ids.len());
        drop(j);
        let j = Journal::open_in(dir.path()).unwrap();
        assert_eq!(j.counts().unwrap().queued, ids.len() as u64);
        for id in &ids {
            assert!(j.get(id).unwrap().is_some(), "{id} answered but not in the file");
        }
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
    fn a_platform_message_given_up_is_told_to_its_chat_once() {
        let (_d, j) = journal();
        let id = j.accept_inbound("tg", "7", &msg("x")).unwrap().unwrap();
        for (inc, next) in [("a", "b"), ("b", "c")] {
            assert!(j.claim(&id, inc).unwrap());
            j.recover(next).unwrap();
        }
        assert_eq!(j.get(&id).unwrap().unwrap().state, State::Failed);
        let out = j.outbox_pending("tg", 10).unwrap();
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(out[0].text, failure_notice(REASON_INTERRUPTED_TWICE));
        assert_eq!(out[0].message_id.as_deref(), Some(id.as_str()));
        j.recover("d").unwrap();
        assert_eq!(j.outbox_pending("tg", 10).unwrap().len(), 1, "told once");
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
        sql(&j, "UPDATE messages SET state='running', is_command=1, incarnation='c', attempts=1 WHERE id=?1", &[&cmd2]);
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
    fn recent_lists_by_state_newest_first() {
        let (_d, j) = journal();
        let a = j.accept(&msg("a")).unwrap();
        let b = j.accept(&msg("b")).unwrap();
        assert!(j.claim(&b, "i").unwrap());
        assert!(j.fail(&b, "i", "boom").unwrap());
        let ids =
            |states: &[State]| -> Vec<String> { j.recent(states, 10).unwrap().into_iter().map(|m| m.id).collect() };
        assert_eq!(ids(&[State::Failed]), vec![b.clone()]);
        assert_eq!(ids(&[State::Queued, State::Failed]), vec![b.clone(), a.clone()]);
        assert!(ids(&[]).is_empty());
        assert_eq!(j.recent(&[State::Queued, State::Failed], 1).unwrap().len(), 1);
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
    fn depth_counts_the_queue_its_busiest_chat_and_the_bytes() {
        let (_d, j) = journal();
        let empty = j.depth().unwrap();
        assert_eq!((empty.queued, empty.busiest_chat), (0, Some(0)));
        assert!(empty.bytes.is_some_and(|b| b > 0));
        for chat in ["c1", "c1", "c1", "c2"] {
            j.accept(&NewMessage { chat_id: chat.into(), ..msg(&"x".repeat(100_000)) }).unwrap();
        }
        let id = j.accept(&msg("running")).unwrap();
        assert!(j.claim(&id, "i").unwrap());
        let d = j.depth().unwrap();
        assert_eq!((d.queued, d.busiest_chat), (4, Some(3)));
        assert!(d.bytes.is_some_and(|b| b >= 400_000 && b > empty.bytes.unwrap_or(0)), "{d:?}");
    }

    /// Backdates a row's timestamps by `days`.
    fn age(j: &Journal, id: &str, days: u64) {
        let t = std::time::SystemTime::now() - Duration::from_secs(days * 24 * 3600);
        let t = gatewarden_lifecycle::timefmt::format(t);
        sql(j, "UPDATE messages SET created_at = ?2, updated_at = ?2 WHERE id = ?1", &[id, &t]);
    }

    #[test]
    fn prune_by_age_keeps_unfinished_and_recent_rows() {
        let (_d, j) = journal();
        let old_done = j.accept(&msg("old done")).unwrap();
        let old_failed = j.accept(&msg("old failed")).unwrap();
        let old_queued = j.accept(&msg("old queued")).unwrap();
        let old_running = j.accept(&msg("old running")).unwrap();
        let new_done = j.accept(&msg("new done")).unwrap();
        for id in [&old_done, &old_failed, &old_running, &new_done] {
            assert!(j.claim(id, "i").unwrap());
        }
        assert!(j.complete(&old_done, "i", "r").unwrap());
        assert!(j.fail(&old_failed, "i", "boom").unwrap());
        assert!(j.complete(&new_done, "i", "r").unwrap());
        for id in [&old_done, &old_failed, &old_queued, &old_running] {
            age(&j, id, 40);
        }
        let p = j.prune(Some(Duration::from_secs(30 * 24 * 3600)), None).unwrap();
        assert_eq!(p, Pruned { by_age: 2, by_size: 0, outbox: 0 });
        assert_eq!(j.get(&old_done).unwrap(), None);
        assert_eq!(j.get(&old_failed).unwrap(), None);
        assert_eq!(j.get(&old_queued).unwrap().unwrap().state, State::Queued);
        assert_eq!(j.get(&old_running).unwrap().unwrap().state, State::Running);
        assert_eq!(j.get(&new_done).unwrap().unwrap().state, State::Done);
        assert_eq!(j.prune(Some(Duration::from_secs(30 * 24 * 3600)), None).unwrap(), Pruned::default());
    }

    #[test]
    fn prune_by_size_deletes_oldest_finished_rows_only() {
        let (_d, j) = journal();
        let big = "x".repeat(64 * 1024);
        let mut finished = Vec::new();
        for _ in 0..40 {
            let id = j.accept(&msg(&big)).unwrap();
            assert!(j.claim(&id, "i").unwrap());
            assert!(j.complete(&id, "i", &big).unwrap());
            finished.push(id);
        }
        let pending: Vec<_> = (0..10).map(|_| j.accept(&msg(&big)).unwrap()).collect();
        assert!(data_bytes(&j.read()).unwrap() > 5 * 1024 * 1024);
        // Smaller than the unfinished rows alone: every finished row goes, no unfinished one.
        let p = j.prune(None, Some(256 * 1024)).unwrap();
        assert_eq!(p.by_size, 40, "{p:?}");
        for id in &pending {
            assert_eq!(j.get(id).unwrap().unwrap().state, State::Queued);
        }
        // A bound that fits: only the oldest finished rows go.
        let (_d2, j) = journal();
        let mut ids = Vec::new();
        for _ in 0..40 {
            let id = j.accept(&msg(&big)).unwrap();
            assert!(j.claim(&id, "i").unwrap());
            assert!(j.complete(&id, "i", "ok").unwrap());
            ids.push(id);
        }
        let p = j.prune(None, Some(1024 * 1024)).unwrap();
        assert!(p.by_size > 0 && p.by_size < 40, "{p:?}");
        assert!(data_bytes(&j.read()).unwrap() <= 1024 * 1024);
        let kept: Vec<_> = ids.iter().filter(|id| j.get(id).unwrap().is_some()).collect();
        assert_eq!(kept.len() as u64, 40 - p.by_size);
        assert_eq!(kept.first().copied(), ids.get(p.by_size as usize), "the oldest went first");
    }

    #[test]
    fn prune_reaches_the_outbox_and_sessions_but_never_pending_entries() {
        let (_d, j) = journal();
        let big = "x".repeat(64 * 1024);
        for i in 0..40 {
            let seq = j.enqueue("tg", "c1", &big).unwrap();
            if i % 10 != 0 {
                assert!(j.outbox_done(seq, None).unwrap());
            }
        }
        j.new_session("tg", "c1").unwrap();
        let p = j.prune(None, Some(256 * 1024)).unwrap();
        assert_eq!(p.outbox, 36, "every sent entry, no pending one: {p:?}");
        assert_eq!(j.outbox_counts("tg").unwrap(), (4, 0, 0));
        // By age: entries left for good and old sessions.
        for _ in 0..3 {
            let seq = j.enqueue("tg", "c1", "hi").unwrap();
            assert!(j.outbox_done(seq, Some("chat gone")).unwrap());
        }
        sql(&j, "UPDATE outbox SET updated_at = '2000-01-01T00:00:00.000000+00:00'", &[]);
        sql(&j, "UPDATE sessions SET started_at = '2000-01-01T00:00:00.000000+00:00'", &[]);
        let p = j.prune(Some(Duration::from_secs(24 * 3600)), None).unwrap();
        assert_eq!(p.outbox, 3 + 1, "{p:?}");
        assert_eq!(j.outbox_counts("tg").unwrap(), (4, 0, 0));
    }

    #[test]
    fn queued_counts_per_chat_and_in_all() {
        let (_d, j) = journal();
        j.accept(&msg("a")).unwrap();
        let running = j.accept(&msg("b")).unwrap();
        assert!(j.claim(&running, "i").unwrap());
        j.accept_inbound("tg", "1", &msg("c")).unwrap();
        let other = NewMessage { chat_id: "c2".into(), ..msg("d") };
        j.accept(&other).unwrap();
        assert_eq!(j.queued(None, "c1").unwrap(), (1, 3), "running rows are not queued");
        assert_eq!(j.queued(Some("tg"), "c1").unwrap(), (1, 3), "a chat is its platform and id");
        assert_eq!(j.queued(None, "nobody").unwrap(), (0, 3));
    }

    #[test]
    fn platform_messages_dedupe_and_replies_leave_through_the_outbox() {
        let (_d, j) = journal();
        let id = j.accept_inbound("tg", "1001", &msg("hi")).unwrap().expect("new event");
        assert_eq!(j.accept_inbound("tg", "1001", &msg("hi")).unwrap(), None, "redelivery is deduplicated");
        let other = j.accept_inbound("other", "1001", &msg("hi")).unwrap().expect("ids are per platform");
        // A push platform answers its sender with the id, the same for a redelivery.
        assert_eq!(j.event_message("tg", "1001").unwrap().as_deref(), Some(id.as_str()));
        assert_eq!(j.event_message("other", "1001").unwrap().as_deref(), Some(other.as_str()));
        assert_eq!(j.event_message("tg", "1002").unwrap(), None);
        assert_eq!(j.get(&id).unwrap().unwrap().platform.as_deref(), Some("tg"));
        assert!(j.outbox_pending("tg", 10).unwrap().is_empty());
        assert!(j.claim(&id, "a").unwrap());
        assert!(j.complete(&id, "a", "hello").unwrap());
        let out = j.outbox_pending("tg", 10).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!((out[0].chat_id.as_str(), out[0].text.as_str()), ("c1", "hello"));
        assert_eq!(out[0].message_id.as_deref(), Some(id.as_str()));
        assert!(j.outbox_done(out[0].seq, None).unwrap());
        assert!(!j.outbox_done(out[0].seq, None).unwrap(), "sent once");
        assert_eq!(j.outbox_counts("tg").unwrap(), (0, 1, 0));
        // An HTTP message's completion queues nothing.
        let http = j.accept(&msg("x")).unwrap();
        assert!(j.claim(&http, "a").unwrap());
        assert!(j.complete(&http, "a", "y").unwrap());
        assert!(j.outbox_pending("tg", 10).unwrap().is_empty());
        // A command is final at once, its reply queued once, never again on redelivery.
        assert!(j.accept_inbound_command("tg", "1002", &msg("/status"), "fine").unwrap().is_some());
        assert!(j.accept_inbound_command("tg", "1002", &msg("/status"), "fine").unwrap().is_none());
        assert_eq!(j.outbox_pending("tg", 10).unwrap().len(), 1);
        assert_eq!(j.recover("b").unwrap(), vec![other], "only the unanswered message is work");
    }

    #[test]
    fn history_is_per_chat_and_session() {
        let (_d, j) = journal();
        let turn = |ev: &str, text: &str, reply: &str| {
            let id = j.accept_inbound("tg", ev, &msg(text)).unwrap().unwrap();
            assert!(j.claim(&id, "a").unwrap());
            assert!(j.complete(&id, "a", reply).unwrap());
            id
        };
        turn("1", "one", "r1");
        turn("2", "two", "r2");
        let other = NewMessage { chat_id: "c2".into(), ..msg("elsewhere") };
        j.accept_inbound("tg", "3", &other).unwrap();
        let now = j.accept_inbound("tg", "4", &msg("three")).unwrap().unwrap();
        assert_eq!(
            j.history(&now, 10).unwrap(),
            vec![("one".to_owned(), "r1".to_owned()), ("two".to_owned(), "r2".to_owned())]
        );
        assert_eq!(j.history(&now, 1).unwrap(), vec![("two".to_owned(), "r2".to_owned())]);
        j.new_session("tg", "c1").unwrap();
        std::thread::sleep(Duration::from_millis(2));
        let fresh = j.accept_inbound("tg", "5", &msg("four")).unwrap().unwrap();
        assert!(j.history(&fresh, 10).unwrap().is_empty(), "/new forgets the earlier turns");
    }

    /// A row accepted claimed is running at once: the worker's recovery (same incarnation)
    /// never lists it, another incarnation's recovery requeues it like any interrupted run.
    #[test]
    fn accept_claimed_is_running_under_its_incarnation() {
        let (_d, j) = journal();
        let id = j.accept_claimed(&NewMessage { kind: Kind::Sync, ..msg("now") }, "a").unwrap();
        let m = j.get(&id).unwrap().unwrap();
        assert_eq!((m.state, m.attempts, m.incarnation.as_deref()), (State::Running, 1, Some("a")));
        assert!(!j.claim(&id, "a").unwrap(), "not queued");
        assert!(j.recover("a").unwrap().is_empty(), "its own incarnation's recovery leaves it alone");
        let steps: Vec<String> = j.trace(&id).unwrap().iter().map(|e| e.step.as_str().to_owned()).collect();
        assert_eq!(steps, ["received", "journaled", "claimed"]);
        assert!(j.complete(&id, "a", "done").unwrap());
        let id2 = j.accept_claimed(&msg("cut short"), "a").unwrap();
        assert_eq!(j.recover("b").unwrap(), vec![id2], "a crash leaves it to the next incarnation");
    }

    /// An HTTP API conversation: the HTTP messages of its `chat_id` (never a platform chat's of
    /// the same id), and `/new` under [`crate::HTTP_SESSIONS`].
    #[test]
    fn http_history_is_per_chat_id_and_session() {
        let (_d, j) = journal();
        let turn = |chat: &str, text: &str, reply: &str| {
            let id = j.accept(&NewMessage { chat_id: chat.into(), kind: Kind::Sync, ..msg(text) }).unwrap();
            assert!(j.claim(&id, "a").unwrap());
            assert!(j.complete(&id, "a", reply).unwrap());
            id
        };
        turn("c1", "one", "r1");
        turn("c2", "elsewhere", "r");
        let tg = j.accept_inbound("tg", "1", &msg("platform")).unwrap().unwrap();
        assert!(j.claim(&tg, "a").unwrap() && j.complete(&tg, "a", "tg reply").unwrap());
        turn("c1", "two", "r2");
        let now = j.accept(&NewMessage { kind: Kind::Sync, ..msg("three") }).unwrap();
        assert_eq!(
            j.history(&now, 10).unwrap(),
            vec![("one".to_owned(), "r1".to_owned()), ("two".to_owned(), "r2".to_owned())]
        );
        assert_eq!(j.history(&tg, 10).unwrap(), vec![], "a platform chat never sees the HTTP chat of its id");
        j.new_session(crate::HTTP_SESSIONS, "c1").unwrap();
        std::thread::sleep(Duration::from_millis(2));
        let fresh = j.accept(&msg("four")).unwrap();
        assert!(j.history(&fresh, 10).unwrap().is_empty(), "/new forgets the earlier turns");
    }

    /// The hermes backend names its session after this: none before `/new`, then a start that
    /// each `/new` moves.
    #[test]
    fn session_start_is_read_from_the_sessions_row() {
        let (_d, j) = journal();
        assert_eq!(j.session_started("tg", "c1").unwrap(), None);
        j.new_session("tg", "c1").unwrap();
        let first = j.session_started("tg", "c1").unwrap().expect("a start");
        assert_eq!(j.session_started("tg", "c2").unwrap(), None, "per chat");
        std::thread::sleep(Duration::from_millis(2));
        j.new_session("tg", "c1").unwrap();
        assert_ne!(j.session_started("tg", "c1").unwrap(), Some(first), "/new moves it");
    }

    #[test]
    fn concurrent_first_opens_migrate_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(JOURNAL_FILE);
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(4));
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let (path, barrier) = (path.clone(), std::sync::Arc::clone(&barrier));
                std::thread::spawn(move || {
                    barrier.wait();
                    Journal::open(&path).map(|_| ())
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap().unwrap();
        }
        assert!(Journal::open(&path).unwrap().accept_inbound("tg", "1", &msg("x")).unwrap().is_some());
    }

    #[test]
    fn schema_1_journals_are_migrated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(JOURNAL_FILE);
        {
            let c = Connection::open(&path).unwrap();
            c.execute_batch(
                "CREATE TABLE messages (id TEXT PRIMARY KEY, chat_id TEXT NOT NULL, user_id TEXT NOT NULL,
                 text TEXT NOT NULL, kind TEXT NOT NULL, state TEXT NOT NULL, reply TEXT, reason TEXT,
                 attempts INTEGER NOT NULL DEFAULT 0, incarnation TEXT, is_command INTEGER NOT NULL DEFAULT 0,
                 created_at TEXT NOT NULL, updated_at TEXT NOT NULL);
                 INSERT INTO messages VALUES ('old', 'c', 'u', 't', 'async', 'queued', NULL, NULL, 0, NULL, 0,
                 '2026-01-01T00:00:00.000000+00:00', '2026-01-01T00:00:00.000000+00:00');
                 PRAGMA user_version = 1;",
            )
            .unwrap();
        }
        let j = Journal::open(&path).unwrap();
        assert_eq!(j.recover("x").unwrap(), vec!["old".to_owned()]);
        assert_eq!(j.get("old").unwrap().unwrap().platform, None);
        assert!(j.accept_inbound("tg", "1", &msg("new")).unwrap().is_some());
        // The usage columns: the run's tokens go in with its reply.
        assert!(j.claim("old", "x").unwrap());
        assert!(j.complete_traced("old", "x", "r", Some((12, 5)), &[]).unwrap());
        assert_eq!(j.usage("old").unwrap(), Some((12, 5)));
        drop(j);
        let j = Journal::open(&path).unwrap();
        assert_eq!(j.usage("old").unwrap(), Some((12, 5)));
        let v: i64 = j.read().pragma_query_value(None, "user_version", |r| r.get(0)).unwrap();
        assert_eq!(v, SCHEMA_VERSION);
    }

    #[test]
    fn a_run_without_usage_records_none() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open_in(dir.path()).unwrap();
        let id = j.accept(&msg("m")).unwrap();
        assert!(j.claim(&id, "i").unwrap());
        assert!(j.complete(&id, "i", "r").unwrap());
        assert_eq!(j.usage(&id).unwrap(), None);
        assert_eq!(j.usage("nope").unwrap(), None);
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
