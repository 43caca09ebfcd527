//! The async message journal on PostgreSQL, fenced by the lease epoch.
//!
//! The same life cycle as the home's SQLite journal (crates/journal/src/sqlite.rs: accept →
//! queued, claim → running under an incarnation, complete/fail only by that incarnation,
//! recover requeues runs of other incarnations once), shared by every gateway of a cluster,
//! and every write carries the writer's epoch: each statement joins `gw_fence(name, epoch)`,
//! so a write of a deposed active fails with [`ClusterError::Fenced`] instead of committing.
//!
//! The runtime reaches it through `store::PgStore` (the synchronous `gatewarden_journal::Store`
//! bridge); reads are not fenced. Statements that change two tables (a completion and its
//! outbox reply) are one statement with data-modifying CTEs, so the fence's row lock covers
//! both until they commit.

use std::sync::LazyLock;
use std::time::Duration;

use gatewarden_journal::row::{self, Cells, MESSAGE_COLUMNS, OUTGOING_COLUMNS};
use gatewarden_journal::trace::{MAX_RUN_STEPS, TRACE_COLUMNS};
use gatewarden_journal::{
    Counts, JournalError, Kind, MAX_ATTEMPTS, Message, NewMessage, Outgoing, Pruned, REASON_INTERRUPTED_TWICE, Step,
    TraceEvent, failure_notice,
};
use tokio_postgres::Row;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

use crate::migrations::FENCED_SQLSTATE;
use crate::{ClusterError, PgLease};

/// The protocol's timestamp format (RFC 3339 UTC with microseconds, as
/// crates/lifecycle/src/timefmt.rs writes it), formatted by the database.
const TS: &str = r#"'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'"#;

/// A fresh message id: 96 random bits as hex, like the SQLite journal's.
const NEW_ID: &str = "substr(replace(gen_random_uuid()::text, '-', ''), 1, 24)";

/// The fenced journal of one cluster, on the lease's connection.
pub struct PgJournal {
    lease: PgLease,
}

type Params<'a> = Vec<&'a (dyn ToSql + Sync)>;

fn fenced(epoch: i64, e: tokio_postgres::Error) -> ClusterError {
    if e.code() == Some(&SqlState::from_code(FENCED_SQLSTATE)) {
        ClusterError::Fenced { epoch, detail: e.to_string() }
    } else {
        read(e)
    }
}

impl PgJournal {
    pub fn new(lease: PgLease) -> PgJournal {
        PgJournal { lease }
    }

    /// The cluster name the rows are kept under.
    pub fn name(&self) -> &str {
        self.lease.name()
    }

    /// Forgets the connection (after a timeout its state is unknown); the next call reconnects.
    pub fn reset(&mut self) {
        crate::LeaseBackend::reset(&mut self.lease);
    }

    /// Journals a new async message as queued, under `epoch`; returns its id.
    pub async fn accept(
        &mut self,
        epoch: i64,
        chat_id: &str,
        user_id: &str,
        text: &str,
    ) -> Result<String, ClusterError> {
        let msg = NewMessage { chat_id: chat_id.into(), user_id: user_id.into(), text: text.into(), kind: Kind::Async };
        self.accept_message(epoch, &msg).await
    }

    /// Journals `msg` as queued, under `epoch`; returns its id.
    pub async fn accept_message(&mut self, epoch: i64, msg: &NewMessage) -> Result<String, ClusterError> {
        let (kind, received) = (msg.kind.as_str(), received_now());
        let row = self
            .query_one(
                epoch,
                &accepted(
                    "chat_id, user_id, text, kind, state",
                    "$3, $4, $5, $6, 'queued'",
                    "",
                    "",
                    accepted_trace("$7", "NULL", false),
                ),
                &[&msg.chat_id, &msg.user_id, &msg.text, &kind, &received],
            )
            .await?;
        Ok(row.get(0))
    }

    /// Journals `msg` as already running under `incarnation` (its first attempt), under
    /// `epoch`; returns its id. One statement: never `queued`, so no worker takes it.
    pub async fn accept_claimed(
        &mut self,
        epoch: i64,
        msg: &NewMessage,
        incarnation: &str,
    ) -> Result<String, ClusterError> {
        let (kind, received) = (msg.kind.as_str(), received_now());
        let trace = accepted_trace("$7", "NULL", false).replace(
            "(2, 'journaled', clock_timestamp(), NULL::text, NULL::text)",
            "(2, 'journaled', clock_timestamp(), NULL::text, NULL::text),
                           (3, 'claimed', clock_timestamp(), $8::text, NULL::text)",
        );
        let row = self
            .query_one(
                epoch,
                &accepted(
                    "chat_id, user_id, text, kind, state, attempts, incarnation",
                    "$3, $4, $5, $6, 'running', 1, $8",
                    "",
                    "",
                    trace,
                ),
                &[&msg.chat_id, &msg.user_id, &msg.text, &kind, &received, &incarnation],
            )
            .await?;
        Ok(row.get(0))
    }

    /// A lifecycle command answered at once: a row that is already done, flagged as a command.
    pub async fn accept_command(&mut self, epoch: i64, msg: &NewMessage, reply: &str) -> Result<String, ClusterError> {
        let (kind, received) = (msg.kind.as_str(), received_now());
        let row = self
            .query_one(
                epoch,
                &accepted(
                    "chat_id, user_id, text, kind, state, reply, is_command",
                    "$3, $4, $5, $6, 'done', $7, true",
                    "",
                    "",
                    accepted_trace("$8", "NULL", true),
                ),
                &[&msg.chat_id, &msg.user_id, &msg.text, &kind, &reply, &received],
            )
            .await?;
        Ok(row.get(0))
    }

    /// A platform message keyed by its event id: `None` when that event is journaled already.
    pub async fn accept_inbound(
        &mut self,
        epoch: i64,
        platform: &str,
        event_id: &str,
        msg: &NewMessage,
    ) -> Result<Option<String>, ClusterError> {
        let received = received_now();
        let row = self
            .query_opt(
                epoch,
                &accepted(
                    "chat_id, user_id, text, kind, state, platform, event_id",
                    "$3, $4, $5, 'async', 'queued', $6, $7",
                    ONCE_PER_EVENT,
                    "",
                    accepted_trace("$8", "$6", false),
                ),
                &[&msg.chat_id, &msg.user_id, &msg.text, &platform, &event_id, &received],
            )
            .await?;
        Ok(row.map(|r| r.get(0)))
    }

    /// A platform chat command: a finished command row and its queued reply, together; `None`
    /// (and nothing queued) when the event is journaled already.
    pub async fn accept_inbound_command(
        &mut self,
        epoch: i64,
        platform: &str,
        event_id: &str,
        msg: &NewMessage,
        reply: &str,
    ) -> Result<Option<String>, ClusterError> {
        let received = received_now();
        let row = self
            .query_opt(
                epoch,
                &accepted(
                    "chat_id, user_id, text, kind, state, reply, is_command, platform, event_id",
                    "$3, $4, $5, 'async', 'done', $6, true, $7, $8",
                    ONCE_PER_EVENT,
                    // the command's reply, queued with it
                    "o AS (
                        INSERT INTO gw_outbox (name, platform, chat_id, text, message_id, epoch)
                        SELECT $1, platform, chat_id, $6, id, $2 FROM m),",
                    accepted_trace("$9", "$7", true),
                ),
                &[&msg.chat_id, &msg.user_id, &msg.text, &reply, &platform, &event_id, &received],
            )
            .await?;
        Ok(row.map(|r| r.get(0)))
    }

    /// Whether `(platform, event_id)` is journaled already (a read).
    pub async fn event_message(&mut self, platform: &str, event_id: &str) -> Result<Option<String>, ClusterError> {
        let name = self.name().to_owned();
        let c = self.lease.client().await?;
        let row = c
            .query_opt(
                "SELECT id FROM gw_messages WHERE name = $1 AND platform = $2 AND event_id = $3",
                &[&name, &platform, &event_id],
            )
            .await
            .map_err(read)?;
        Ok(row.map(|r| r.get(0)))
    }

    pub async fn has_event(&mut self, platform: &str, event_id: &str) -> Result<bool, ClusterError> {
        let name = self.name().to_owned();
        let c = self.lease.client().await?;
        let row = c
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM gw_messages WHERE name = $1 AND platform = $2 AND event_id = $3)",
                &[&name, &platform, &event_id],
            )
            .await
            .map_err(read)?;
        Ok(row.get(0))
    }

    /// `queued → running` under `incarnation`; false if it was not queued.
    pub async fn claim(&mut self, epoch: i64, id: &str, incarnation: &str) -> Result<bool, ClusterError> {
        let row = self
            .query_one(
                epoch,
                "WITH u AS (
                    UPDATE gw_messages m SET state = 'running', attempts = attempts + 1, incarnation = $4,
                           epoch = $2, updated_at = clock_timestamp()
                      FROM (SELECT gw_fence($1, $2)) AS f
                     WHERE m.name = $1 AND m.id = $3 AND m.state = 'queued'
                    RETURNING m.id),
                 t AS (INSERT INTO gw_trace (name, message_id, step, subject) SELECT $1, id, 'claimed', $4 FROM u)
                 SELECT count(*) FROM u",
                &[&id, &incarnation],
            )
            .await?;
        Ok(row.get::<_, i64>(0) == 1)
    }

    /// `running → done` with the reply, only by the incarnation that runs it; a platform
    /// message's reply is queued in the outbox by the same statement.
    pub async fn complete(
        &mut self,
        epoch: i64,
        id: &str,
        incarnation: &str,
        reply: &str,
    ) -> Result<bool, ClusterError> {
        self.complete_traced(epoch, id, incarnation, reply, None, &[]).await
    }

    /// [`PgJournal::complete`], writing the run's `steps` and its `done` step with it.
    pub async fn complete_traced(
        &mut self,
        epoch: i64,
        id: &str,
        incarnation: &str,
        reply: &str,
        usage: Option<(u64, u64)>,
        steps: &[TraceEvent],
    ) -> Result<bool, ClusterError> {
        let done = TraceEvent::at(Step::Done, std::time::SystemTime::now());
        self.finish(epoch, id, incarnation, "done", reply, reply, usage, run_steps(steps, done)).await
    }

    /// `running → failed` with a reason, only by the incarnation that runs it; a platform
    /// message's chat is told through the outbox.
    pub async fn fail(&mut self, epoch: i64, id: &str, incarnation: &str, reason: &str) -> Result<bool, ClusterError> {
        self.fail_traced(epoch, id, incarnation, reason, &failure_notice(reason), &[]).await
    }

    /// [`PgJournal::fail`], writing the run's `steps` and its `failed` step with it; the chat
    /// is told `notice`.
    pub async fn fail_traced(
        &mut self,
        epoch: i64,
        id: &str,
        incarnation: &str,
        reason: &str,
        notice: &str,
        steps: &[TraceEvent],
    ) -> Result<bool, ClusterError> {
        let failed = TraceEvent::at(Step::Failed, std::time::SystemTime::now()).outcome(reason);
        self.finish(epoch, id, incarnation, "failed", reason, notice, None, run_steps(steps, failed)).await
    }

    #[allow(clippy::too_many_arguments)]
    async fn finish(
        &mut self,
        epoch: i64,
        id: &str,
        incarnation: &str,
        state: &str,
        detail: &str,
        outgoing: &str,
        usage: Option<(u64, u64)>,
        steps: Columns,
    ) -> Result<bool, ClusterError> {
        let (prompt, completion) = gatewarden_journal::row::usage_columns(usage);
        let row = self
            .query_one(
                epoch,
                "WITH f AS MATERIALIZED (SELECT gw_fence($1, $2)),
                 u AS (
                    UPDATE gw_messages m
                       SET state = $5,
                           reply = CASE WHEN $5 = 'done' THEN $6 ELSE m.reply END,
                           reason = CASE WHEN $5 = 'done' THEN NULL ELSE $6 END,
                           prompt_tokens = $13, completion_tokens = $14,
                           finishes = finishes + 1, epoch = $2, updated_at = clock_timestamp()
                      FROM f
                     WHERE m.name = $1 AND m.id = $3 AND m.state = 'running' AND m.incarnation = $4
                    RETURNING m.id, m.platform, m.chat_id),
                 o AS (
                    INSERT INTO gw_outbox (name, platform, chat_id, text, message_id, epoch)
                    SELECT $1, platform, chat_id, $7, id, $2 FROM u WHERE platform IS NOT NULL),
                 t AS (
                    INSERT INTO gw_trace (name, message_id, step, at, subject, outcome, elapsed_ms)
                    SELECT $1, u.id, s.step, s.at::timestamptz, s.subject, s.outcome, s.elapsed
                      FROM u, unnest($8::text[], $9::text[], $10::text[], $11::text[], $12::bigint[])
                           WITH ORDINALITY AS s(step, at, subject, outcome, elapsed, n)
                     ORDER BY s.n)
                 SELECT count(*) FROM u",
                &[
                    &id,
                    &incarnation,
                    &state,
                    &detail,
                    &outgoing,
                    &steps.step,
                    &steps.at,
                    &steps.subject,
                    &steps.outcome,
                    &steps.elapsed,
                    &prompt,
                    &completion,
                ],
            )
            .await?;
        Ok(row.get::<_, i64>(0) == 1)
    }

    /// Marks a message as a lifecycle command and finishes it now; false if it was already
    /// final (it is still flagged) or unknown.
    pub async fn mark_command(&mut self, epoch: i64, id: &str) -> Result<bool, ClusterError> {
        let row = self
            .query_one(
                epoch,
                "WITH f AS MATERIALIZED (SELECT gw_fence($1, $2)),
                 u AS (
                    UPDATE gw_messages m
                       SET is_command = true,
                           state = CASE WHEN m.state IN ('queued', 'running') THEN 'done' ELSE m.state END,
                           reason = CASE WHEN m.state IN ('queued', 'running') THEN NULL ELSE m.reason END,
                           epoch = $2, updated_at = clock_timestamp()
                      FROM f
                     WHERE m.name = $1 AND m.id = $3
                    RETURNING (SELECT state FROM gw_messages o WHERE o.name = $1 AND o.id = $3) AS was),
                 t AS (
                    INSERT INTO gw_trace (name, message_id, step, outcome)
                    SELECT $1, $3, 'done', 'command' FROM u WHERE was IN ('queued', 'running'))
                 SELECT count(*) FILTER (WHERE was IN ('queued', 'running')) FROM u",
                &[&id],
            )
            .await?;
        Ok(row.get::<_, i64>(0) == 1)
    }

    /// Queues a notice for a platform chat (no journaled message behind it).
    pub async fn enqueue(
        &mut self,
        epoch: i64,
        platform: &str,
        chat_id: &str,
        text: &str,
    ) -> Result<i64, ClusterError> {
        let row = self
            .query_one(
                epoch,
                &format!("{} RETURNING seq", fenced_insert("gw_outbox", "platform, chat_id, text", "$3, $4, $5")),
                &[&platform, &chat_id, &text],
            )
            .await?;
        Ok(row.get(0))
    }

    /// Pending outbox entries for `platform`, oldest first (a read).
    pub async fn outbox_pending(&mut self, platform: &str, limit: usize) -> Result<Vec<Outgoing>, ClusterError> {
        let name = self.name().to_owned();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let c = self.lease.client().await?;
        let rows = c
            .query(
                &format!(
                    "SELECT {} FROM gw_outbox WHERE name = $1 AND platform = $2 AND state = 'pending'
                      ORDER BY seq LIMIT $3",
                    *OUTGOING
                ),
                &[&name, &platform, &limit],
            )
            .await
            .map_err(read)?;
        rows.iter().map(|r| row::read_outgoing(&PgRow(r)).map_err(from_row)).collect()
    }

    /// An outbox entry left for good: sent, or failed with the platform's reason.
    pub async fn outbox_done(&mut self, epoch: i64, seq: i64, failed: Option<&str>) -> Result<bool, ClusterError> {
        let state = if failed.is_some() { "failed" } else { "sent" };
        let step = if failed.is_some() { Step::OutboxFailed } else { Step::OutboxSent }.as_str();
        let outcome = failed.unwrap_or("ok");
        let row = self
            .query_one(
                epoch,
                "WITH u AS (
                    UPDATE gw_outbox o SET state = $4, reason = $5, epoch = $2, updated_at = clock_timestamp()
                      FROM (SELECT gw_fence($1, $2)) AS f
                     WHERE o.name = $1 AND o.seq = $3 AND o.state = 'pending'
                    RETURNING o.message_id, o.platform),
                 t AS (
                    INSERT INTO gw_trace (name, message_id, step, subject, outcome)
                    SELECT $1, message_id, $6, platform, $7 FROM u WHERE message_id IS NOT NULL)
                 SELECT count(*) FROM u",
                &[&seq, &state, &failed, &step, &outcome],
            )
            .await?;
        Ok(row.get::<_, i64>(0) == 1)
    }

    /// Outbox entries by state for `platform`: (pending, sent, failed) (a read).
    pub async fn outbox_counts(&mut self, platform: &str) -> Result<(u64, u64, u64), ClusterError> {
        let name = self.name().to_owned();
        let c = self.lease.client().await?;
        let row = c
            .query_one(
                "SELECT count(*) FILTER (WHERE state = 'pending'), count(*) FILTER (WHERE state = 'sent'),
                        count(*) FILTER (WHERE state = 'failed')
                   FROM gw_outbox WHERE name = $1 AND platform = $2",
                &[&name, &platform],
            )
            .await
            .map_err(read)?;
        let n = |i: usize| u64::try_from(row.get::<_, i64>(i)).unwrap_or(0);
        Ok((n(0), n(1), n(2)))
    }

    /// Starts a fresh conversation in `(platform, chat)`.
    pub async fn new_session(&mut self, epoch: i64, platform: &str, chat_id: &str) -> Result<(), ClusterError> {
        self.update(
            epoch,
            &format!(
                "{} ON CONFLICT (name, platform, chat_id)
                 DO UPDATE SET started_at = excluded.started_at, epoch = excluded.epoch",
                fenced_insert("gw_sessions", "platform, chat_id, started_at", "$3, $4, clock_timestamp()")
            ),
            &[&platform, &chat_id],
        )
        .await
        .map(|_| ())
    }

    /// When the current conversation of `(platform, chat)` started (a read).
    pub async fn session_started(&mut self, platform: &str, chat_id: &str) -> Result<Option<String>, ClusterError> {
        let name = self.name().to_owned();
        let c = self.lease.client().await?;
        let row = c
            .query_opt(
                "SELECT started_at::text FROM gw_sessions WHERE name = $1 AND platform = $2 AND chat_id = $3",
                &[&name, &platform, &chat_id],
            )
            .await
            .map_err(read)?;
        Ok(row.map(|r| r.get(0)))
    }

    /// The conversation before message `before`: the last `turns` answered, non-command
    /// messages of its chat's current session, oldest first (a read). An HTTP API message's
    /// chat is its `chat_id` among the HTTP messages (`/new` under platform `''`).
    pub async fn history(&mut self, before: &str, turns: usize) -> Result<Vec<(String, String)>, ClusterError> {
        if turns == 0 {
            return Ok(Vec::new());
        }
        let name = self.name().to_owned();
        let limit = i64::try_from(turns).unwrap_or(i64::MAX);
        let c = self.lease.client().await?;
        let rows = c
            .query(
                "SELECT h.text, h.reply FROM gw_messages m
                   JOIN gw_messages h ON h.name = m.name AND h.platform IS NOT DISTINCT FROM m.platform
                                       AND h.chat_id = m.chat_id
                   LEFT JOIN gw_sessions s ON s.name = m.name AND s.platform = COALESCE(m.platform, '')
                                          AND s.chat_id = m.chat_id
                  WHERE m.name = $1 AND m.id = $2 AND h.id <> m.id
                    AND h.state = 'done' AND NOT h.is_command AND h.reply IS NOT NULL
                    AND (h.created_at < m.created_at OR (h.created_at = m.created_at AND h.seq < m.seq))
                    AND (s.started_at IS NULL OR h.created_at > s.started_at)
                  ORDER BY h.created_at DESC, h.seq DESC LIMIT $3",
                &[&name, &before, &limit],
            )
            .await
            .map_err(read)?;
        let mut out: Vec<(String, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        out.reverse();
        Ok(out)
    }

    async fn update(&mut self, epoch: i64, sql: &str, rest: &[&(dyn ToSql + Sync)]) -> Result<bool, ClusterError> {
        let name = self.name().to_owned();
        let mut params: Params<'_> = vec![&name, &epoch];
        params.extend_from_slice(rest);
        let c = self.lease.client().await?;
        let n = c.execute(sql, &params).await.map_err(|e| fenced(epoch, e))?;
        Ok(n == 1)
    }

    async fn query_one(&mut self, epoch: i64, sql: &str, rest: &[&(dyn ToSql + Sync)]) -> Result<Row, ClusterError> {
        self.query_opt(epoch, sql, rest)
            .await?
            .ok_or_else(|| ClusterError::Store("the statement returned no row".into()))
    }

    async fn query_opt(
        &mut self,
        epoch: i64,
        sql: &str,
        rest: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, ClusterError> {
        Ok(self.query_all(epoch, sql, rest).await?.into_iter().next())
    }

    /// Called by a newly promoted active under its epoch: runs of other incarnations (of any
    /// gateway) were interrupted (a crash, a failover) and are requeued once, or failed after
    /// [`MAX_ATTEMPTS`]; a command row never runs again. Returns the queued ids, oldest first.
    pub async fn recover(&mut self, epoch: i64, incarnation: &str) -> Result<Vec<String>, ClusterError> {
        let rows = self
            .query_all(
                epoch,
                "WITH f AS MATERIALIZED (SELECT gw_fence($1, $2)),
                 commands AS (
                    UPDATE gw_messages m SET state = 'done', epoch = $2, updated_at = clock_timestamp()
                      FROM f
                     WHERE m.name = $1 AND m.is_command AND m.state IN ('queued', 'running')
                    RETURNING m.id),
                 failed AS (
                    UPDATE gw_messages m SET state = 'failed', reason = $5, epoch = $2, updated_at = clock_timestamp()
                      FROM f
                     WHERE m.name = $1 AND m.state = 'running' AND NOT m.is_command
                       AND m.incarnation IS DISTINCT FROM $3 AND m.attempts >= $4::bigint
                    RETURNING m.id, m.platform, m.chat_id),
                 notices AS (
                    INSERT INTO gw_outbox (name, platform, chat_id, text, message_id, epoch)
                    SELECT $1, platform, chat_id, $6, id, $2 FROM failed WHERE platform IS NOT NULL),
                 requeued AS (
                    UPDATE gw_messages m SET state = 'queued', epoch = $2, updated_at = clock_timestamp()
                      FROM f
                     WHERE m.name = $1 AND m.state = 'running' AND NOT m.is_command
                       AND m.incarnation IS DISTINCT FROM $3 AND m.attempts < $4::bigint
                    RETURNING m.id, m.created_at, m.seq),
                 traced AS (
                    INSERT INTO gw_trace (name, message_id, step, subject, outcome)
                    SELECT $1, id, 'given_up', $3, $5 FROM failed
                    UNION ALL
                    SELECT $1, id, 'requeued', $3, 'interrupted' FROM requeued)
                 SELECT id FROM (
                    SELECT id, created_at, seq FROM requeued
                    UNION ALL
                    SELECT id, created_at, seq FROM gw_messages, f
                     WHERE name = $1 AND state = 'queued' AND NOT is_command
                 ) q ORDER BY created_at, seq",
                &[&incarnation, &MAX_ATTEMPTS, &REASON_INTERRUPTED_TWICE, &failure_notice(REASON_INTERRUPTED_TWICE)],
            )
            .await?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    async fn query_all(
        &mut self,
        epoch: i64,
        sql: &str,
        rest: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, ClusterError> {
        let name = self.name().to_owned();
        let mut params: Params<'_> = vec![&name, &epoch];
        params.extend_from_slice(rest);
        let c = self.lease.client().await?;
        c.query(sql, &params).await.map_err(|e| fenced(epoch, e))
    }

    /// The steps of message `id`, oldest first (a read).
    pub async fn trace(&mut self, id: &str) -> Result<Vec<TraceEvent>, ClusterError> {
        let name = self.name().to_owned();
        let c = self.lease.client().await?;
        let rows = c
            .query(
                &format!(
                    "SELECT {} FROM gw_trace WHERE name = $1 AND message_id = $2 ORDER BY seq",
                    // `at` is a timestamp too, though not named `*_at`.
                    TRACE_COLUMNS.map(|c| if c == "at" { timestamp(c) } else { c.to_owned() }).join(", ")
                ),
                &[&name, &id],
            )
            .await
            .map_err(read)?;
        rows.iter().map(|r| gatewarden_journal::trace::read_event(id, &PgRow(r)).map_err(from_row)).collect()
    }

    /// One message as the runtime sees it (a read).
    pub async fn message(&mut self, id: &str) -> Result<Option<Message>, ClusterError> {
        let name = self.name().to_owned();
        let c = self.lease.client().await?;
        let row = c
            .query_opt(&format!("SELECT {} FROM gw_messages WHERE name = $1 AND id = $2", *COLUMNS), &[&name, &id])
            .await
            .map_err(read)?;
        row.map(|r| to_message(&r)).transpose()
    }

    /// The `(prompt, completion)` tokens recorded with a run, if any (a read).
    pub async fn usage(&mut self, id: &str) -> Result<Option<(u64, u64)>, ClusterError> {
        let name = self.name().to_owned();
        let c = self.lease.client().await?;
        let row = c
            .query_opt(
                "SELECT prompt_tokens, completion_tokens FROM gw_messages WHERE name = $1 AND id = $2",
                &[&name, &id],
            )
            .await
            .map_err(read)?;
        Ok(row.and_then(|r| gatewarden_journal::row::usage_from(r.get(0), r.get(1))))
    }

    /// Messages not yet final, oldest first (a read).
    pub async fn pending(&mut self) -> Result<Vec<Message>, ClusterError> {
        let name = self.name().to_owned();
        let c = self.lease.client().await?;
        let rows = c
            .query(
                &format!(
                    "SELECT {} FROM gw_messages WHERE name = $1 AND state IN ('queued', 'running')
                      ORDER BY created_at, seq",
                    *COLUMNS
                ),
                &[&name],
            )
            .await
            .map_err(read)?;
        rows.iter().map(to_message).collect()
    }

    /// Row counts by state (a read).
    pub async fn counts(&mut self) -> Result<Counts, ClusterError> {
        let name = self.name().to_owned();
        let c = self.lease.client().await?;
        let rows = c
            .query("SELECT state, count(*) FROM gw_messages WHERE name = $1 GROUP BY state", &[&name])
            .await
            .map_err(read)?;
        let mut counts = Counts::default();
        for r in rows {
            counts.record(r.get::<_, &str>(0), r.get::<_, i64>(1));
        }
        Ok(counts)
    }

    /// Queued messages `(of this chat, in all)`, for the queue caps (a read).
    /// The cluster's pairing book (`gw_access`), `None` before any (a read).
    pub async fn access_doc(&mut self) -> Result<Option<String>, ClusterError> {
        let name = self.name().to_owned();
        let c = self.lease.client().await?;
        let row = c.query_opt("SELECT doc FROM gw_access WHERE name = $1", &[&name]).await.map_err(read)?;
        Ok(row.map(|r| r.get(0)))
    }

    /// Replaces the cluster's pairing book, fenced by `epoch`.
    pub async fn put_access_doc(&mut self, epoch: i64, doc: &str) -> Result<(), ClusterError> {
        self.update(
            epoch,
            &format!(
                "{} ON CONFLICT (name)
                 DO UPDATE SET doc = excluded.doc, epoch = excluded.epoch, updated_at = excluded.updated_at",
                fenced_insert("gw_access", "doc, updated_at", "$3, clock_timestamp()")
            ),
            &[&doc],
        )
        .await
        .map(|_| ())
    }

    pub async fn queued(&mut self, platform: Option<&str>, chat_id: &str) -> Result<(u64, u64), ClusterError> {
        let name = self.name().to_owned();
        let c = self.lease.client().await?;
        let row = c
            .query_one(
                "SELECT count(*) FILTER (WHERE chat_id = $3 AND platform IS NOT DISTINCT FROM $2), count(*)
                   FROM gw_messages WHERE name = $1 AND state = 'queued'",
                &[&name, &platform, &chat_id],
            )
            .await
            .map_err(read)?;
        let n = |i: usize| u64::try_from(row.get::<_, i64>(i)).unwrap_or(0);
        Ok((n(0), n(1)))
    }

    /// Every message text, reply and outbox text of this cluster containing `needle` (a read):
    /// the lines naming stored attachments, which retention keeps (as
    /// crates/journal/src/sqlite.rs `texts_with`). `strpos` matches the needle literally.
    pub async fn texts_with(&mut self, needle: &str) -> Result<Vec<String>, ClusterError> {
        let name = self.name().to_owned();
        let c = self.lease.client().await?;
        let rows = c
            .query(
                "SELECT text FROM gw_messages WHERE name = $1 AND strpos(text, $2) > 0
                 UNION ALL SELECT reply FROM gw_messages WHERE name = $1 AND strpos(reply, $2) > 0
                 UNION ALL SELECT text FROM gw_outbox WHERE name = $1 AND strpos(text, $2) > 0",
                &[&name, &needle],
            )
            .await
            .map_err(read)?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    /// Deletes `table`'s oldest rows in a `finished` state (an SQL list) while this cluster's
    /// rows take more than `max` bytes, in one statement: a running total from the newest row
    /// down (`pg_column_size`).
    async fn prune_by_size(&mut self, epoch: i64, table: &str, finished: &str, max: i64) -> Result<u64, ClusterError> {
        let sql = format!(
            "WITH f AS MATERIALIZED (SELECT gw_fence($1, $2)),
             sized AS (
                SELECT seq, sum(pg_column_size(t.*)) OVER (ORDER BY seq DESC) AS upto
                  FROM {table} t WHERE name = $1),
             d AS (
                DELETE FROM {table} t USING f
                 WHERE t.name = $1 AND t.state IN ({finished})
                   AND t.seq IN (SELECT seq FROM sized WHERE upto > $3)
                RETURNING 1)
             SELECT count(*) FROM d"
        );
        let rows = self.query_all(epoch, &sql, &[&max]).await?;
        Ok(rows.first().map_or(0, |r| u64::try_from(r.get::<_, i64>(0)).unwrap_or(0)))
    }

    /// Retention (outbox entries left for good and sessions too): finished rows last updated more than `max_age` ago go, then the oldest
    /// finished rows while this cluster's rows take more than `max_bytes` (their stored size,
    /// `pg_column_size`; PostgreSQL reuses the space after autovacuum). Unfinished rows stay.
    pub async fn prune(
        &mut self,
        epoch: i64,
        max_age: Option<Duration>,
        max_bytes: Option<u64>,
    ) -> Result<Pruned, ClusterError> {
        let mut pruned = Pruned::default();
        if let Some(age) = max_age {
            let ms = i64::try_from(age.as_millis()).unwrap_or(i64::MAX);
            let rows = self
                .query_all(
                    epoch,
                    "WITH d AS (
                        DELETE FROM gw_messages m USING (SELECT gw_fence($1, $2)) AS f
                         WHERE m.name = $1 AND m.state IN ('done', 'failed')
                           AND m.updated_at < clock_timestamp() - $3::bigint * interval '1 millisecond'
                        RETURNING 1)
                     SELECT count(*) FROM d",
                    &[&ms],
                )
                .await?;
            pruned.by_age = rows.first().map_or(0, |r| u64::try_from(r.get::<_, i64>(0)).unwrap_or(0));
            // The other tables too (as crates/journal/src/sqlite.rs prunes them): outbox entries
            // left for good, and sessions started before the bound.
            let rows = self
                .query_all(
                    epoch,
                    "WITH f AS MATERIALIZED (SELECT gw_fence($1, $2)),
                     o AS (
                        DELETE FROM gw_outbox o USING f
                         WHERE o.name = $1 AND o.state IN ('sent', 'failed')
                           AND o.updated_at < clock_timestamp() - $3::bigint * interval '1 millisecond'
                        RETURNING 1),
                     s AS (
                        DELETE FROM gw_sessions s USING f
                         WHERE s.name = $1
                           AND s.started_at < clock_timestamp() - $3::bigint * interval '1 millisecond'
                        RETURNING 1)
                     SELECT (SELECT count(*) FROM o) + (SELECT count(*) FROM s)",
                    &[&ms],
                )
                .await?;
            pruned.outbox = rows.first().map_or(0, |r| u64::try_from(r.get::<_, i64>(0)).unwrap_or(0));
        }
        if let Some(max) = max_bytes {
            let max = i64::try_from(max).unwrap_or(i64::MAX);
            pruned.by_size = self.prune_by_size(epoch, "gw_messages", "'done', 'failed'", max).await?;
            // The outbox within the same bound, apart (its rows repeat the replies).
            pruned.outbox += self.prune_by_size(epoch, "gw_outbox", "'sent', 'failed'", max).await?;
        }
        Ok(pruned)
    }
}

/// The journal's row mapping (crates/journal/src/row.rs) over `gw_messages`: timestamps are
/// `timestamptz`, read as the protocol's text.
static COLUMNS: LazyLock<String> = LazyLock::new(|| row::select_list(&MESSAGE_COLUMNS, timestamp));

/// Likewise over `gw_outbox`.
static OUTGOING: LazyLock<String> = LazyLock::new(|| row::select_list(&OUTGOING_COLUMNS, timestamp));

fn timestamp(column: &str) -> String {
    format!("to_char({column} AT TIME ZONE 'UTC', {TS})")
}

/// The trace of the message `m` a statement just inserted: `received` (when the journal was
/// asked: the text parameter `received`, e.g. `$7`), `journaled` (the statement) and, for a
/// command answered at once, `done`; one INSERT, so the steps keep their order (`seq`).
/// `platform`: a text parameter or `NULL` (the HTTP API).
/// `INSERT INTO {table} (name, {columns}, epoch) SELECT $1, {values}, $2`, joined with the
/// fence: every fenced row carries the writer's name (`$1`) and epoch (`$2`), and is written
/// only while that epoch holds the lease (`gw_fence` raises otherwise, crates/cluster/src/migrations.rs).
fn fenced_insert(table: &str, columns: &str, values: &str) -> String {
    format!("INSERT INTO {table} (name, {columns}, epoch) SELECT $1, {values}, $2 FROM (SELECT gw_fence($1, $2)) AS f")
}

/// A platform event is journaled once: a second delivery of `(platform, event_id)` adds no row.
const ONCE_PER_EVENT: &str = "ON CONFLICT (name, platform, event_id) WHERE event_id IS NOT NULL DO NOTHING";

/// An accepted message: a fenced row of `gw_messages` with a new id and `columns` = `values`
/// (then `conflict`), the statements `also` that use that row `m` (each ending in a comma),
/// and its `trace` ([`accepted_trace`]), in one statement; answers the new id.
fn accepted(columns: &str, values: &str, conflict: &str, also: &str, trace: String) -> String {
    let insert = fenced_insert("gw_messages", &format!("id, {columns}"), &format!("{NEW_ID}, {values}"));
    format!(
        "WITH m AS ({insert} {conflict}
            RETURNING id, platform, chat_id),
         {also}
         t AS ({trace})
         SELECT id FROM m"
    )
}

fn accepted_trace(received: &str, platform: &str, command: bool) -> String {
    let done = if command { ", (3, 'done', clock_timestamp(), NULL::text, 'command')" } else { "" };
    format!(
        "INSERT INTO gw_trace (name, message_id, step, at, subject, outcome)
         SELECT $1, m.id, s.step, s.at, s.subject, s.outcome
           FROM m, (VALUES (1, 'received', {received}::text::timestamptz, COALESCE({platform}::text, 'http'), NULL::text),
                           (2, 'journaled', clock_timestamp(), NULL::text, NULL::text){done})
                   AS s(n, step, at, subject, outcome)
          ORDER BY s.n"
    )
}

/// Now in the protocol's timestamp text: when the journal was asked to take a message.
fn received_now() -> String {
    TraceEvent::at(Step::Received, std::time::SystemTime::now()).at
}

/// A run's steps as the columns `finish` unnests (at most [`MAX_RUN_STEPS`], then `last`).
struct Columns {
    step: Vec<String>,
    at: Vec<String>,
    subject: Vec<Option<String>>,
    outcome: Vec<Option<String>>,
    elapsed: Vec<Option<i64>>,
}

fn run_steps(steps: &[TraceEvent], last: TraceEvent) -> Columns {
    let mut c = Columns { step: vec![], at: vec![], subject: vec![], outcome: vec![], elapsed: vec![] };
    for e in steps.iter().take(MAX_RUN_STEPS).chain(std::iter::once(&last)) {
        c.step.push(e.step.as_str().to_owned());
        c.at.push(e.at.clone());
        c.subject.push(e.subject.clone());
        c.outcome.push(e.outcome.clone());
        c.elapsed.push(e.elapsed_ms.map(|v| i64::try_from(v).unwrap_or(i64::MAX)));
    }
    c
}

/// A PostgreSQL row as the journal's row mapping reads it.
struct PgRow<'a>(&'a Row);

impl Cells for PgRow<'_> {
    fn text(&self, i: usize) -> Result<String, JournalError> {
        self.0.try_get(i).map_err(cell)
    }
    fn text_opt(&self, i: usize) -> Result<Option<String>, JournalError> {
        self.0.try_get(i).map_err(cell)
    }
    fn int(&self, i: usize) -> Result<i64, JournalError> {
        // `attempts` is an integer, `seq` a bigint.
        match self.0.try_get::<_, i64>(i) {
            Ok(n) => Ok(n),
            Err(_) => self.0.try_get::<_, i32>(i).map(i64::from).map_err(cell),
        }
    }
    fn int_opt(&self, i: usize) -> Result<Option<i64>, JournalError> {
        self.0.try_get(i).map_err(cell)
    }
    fn flag(&self, i: usize) -> Result<bool, JournalError> {
        self.0.try_get(i).map_err(cell)
    }
}

fn cell(e: tokio_postgres::Error) -> JournalError {
    JournalError::Store(e.to_string())
}

/// A row the mapping refused, as this crate's error.
fn from_row(e: JournalError) -> ClusterError {
    match e {
        JournalError::Corrupt { id, column, value } => {
            ClusterError::Store(format!("row {id} has an unknown {column} {value:?}"))
        }
        JournalError::Store(why) => ClusterError::Store(why),
        other => ClusterError::Store(other.to_string()),
    }
}

fn read(e: tokio_postgres::Error) -> ClusterError {
    ClusterError::Store(e.as_db_error().map_or_else(|| e.to_string(), |d| d.message().to_owned()))
}

fn to_message(r: &Row) -> Result<Message, ClusterError> {
    row::read_message(&PgRow(r)).map_err(from_row)
}
