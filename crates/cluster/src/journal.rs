//! The async message journal on PostgreSQL, fenced by the lease epoch.
//!
//! The same life cycle as the home's SQLite journal (crates/agent/src/journal.rs: accept →
//! queued, claim → running under an incarnation, complete/fail only by that incarnation,
//! recover requeues runs of other incarnations once), shared by every gateway of a cluster,
//! and every write carries the writer's epoch: each statement joins `gw_fence(name, epoch)`,
//! so a write of a deposed active fails with [`ClusterError::Fenced`] instead of committing.
//!
//! Not wired into the gateway yet: the runtime still uses the SQLite journal. This is the
//! store side, tested against a real server (crates/cluster/tests/journal.rs).

use tokio_postgres::error::SqlState;

use crate::migrations::FENCED_SQLSTATE;
use crate::{ClusterError, PgLease};

/// Attempts before a run interrupted again is failed (as in crates/agent/src/journal.rs).
pub const MAX_ATTEMPTS: i32 = 2;
/// The reason of a message failed after [`MAX_ATTEMPTS`] interrupted runs.
pub const REASON_INTERRUPTED_TWICE: &str = "interrupted twice";

/// One journal row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub id: String,
    pub chat_id: String,
    pub user_id: String,
    pub text: String,
    pub state: String,
    pub reply: Option<String>,
    pub reason: Option<String>,
    pub attempts: i32,
    pub epoch: i64,
}

/// The fenced journal of one cluster, on the lease's connection.
pub struct PgJournal {
    lease: PgLease,
}

fn fenced(epoch: i64, e: tokio_postgres::Error) -> ClusterError {
    if e.code() == Some(&SqlState::from_code(FENCED_SQLSTATE)) {
        ClusterError::Fenced { epoch, detail: e.to_string() }
    } else {
        ClusterError::Store(e.as_db_error().map_or_else(|| e.to_string(), |d| d.message().to_owned()))
    }
}

impl PgJournal {
    pub fn new(lease: PgLease) -> PgJournal {
        PgJournal { lease }
    }

    /// Journals a new message as queued, under `epoch`; returns its id.
    pub async fn accept(
        &mut self,
        epoch: i64,
        chat_id: &str,
        user_id: &str,
        text: &str,
    ) -> Result<String, ClusterError> {
        let name = self.lease.name().to_owned();
        let c = self.lease.client().await?;
        let row = c
            .query_one(
                "INSERT INTO gw_messages (name, id, chat_id, user_id, text, state, epoch)
                 SELECT $1, 'msg-' || $2::text || '-' || md5(random()::text || clock_timestamp()::text),
                        $3, $4, $5, 'queued', $2
                   FROM (SELECT gw_fence($1, $2)) AS f
                 RETURNING id",
                &[&name, &epoch, &chat_id, &user_id, &text],
            )
            .await
            .map_err(|e| fenced(epoch, e))?;
        Ok(row.get(0))
    }

    /// `queued → running` under `incarnation`; false if it was not queued.
    pub async fn claim(&mut self, epoch: i64, id: &str, incarnation: &str) -> Result<bool, ClusterError> {
        self.update(
            epoch,
            "UPDATE gw_messages m SET state = 'running', attempts = attempts + 1, incarnation = $4,
                    epoch = $2, updated_at = clock_timestamp()
               FROM (SELECT gw_fence($1, $2)) AS f
              WHERE m.name = $1 AND m.id = $3 AND m.state = 'queued'",
            &[&id, &incarnation],
        )
        .await
    }

    /// `running → done` with the reply, only by the incarnation that runs it.
    pub async fn complete(
        &mut self,
        epoch: i64,
        id: &str,
        incarnation: &str,
        reply: &str,
    ) -> Result<bool, ClusterError> {
        self.update(
            epoch,
            "UPDATE gw_messages m SET state = 'done', reply = $5, reason = NULL, epoch = $2,
                    updated_at = clock_timestamp()
               FROM (SELECT gw_fence($1, $2)) AS f
              WHERE m.name = $1 AND m.id = $3 AND m.state = 'running' AND m.incarnation = $4",
            &[&id, &incarnation, &reply],
        )
        .await
    }

    /// `running → failed` with a reason, only by the incarnation that runs it.
    pub async fn fail(&mut self, epoch: i64, id: &str, incarnation: &str, reason: &str) -> Result<bool, ClusterError> {
        self.update(
            epoch,
            "UPDATE gw_messages m SET state = 'failed', reason = $5, epoch = $2, updated_at = clock_timestamp()
               FROM (SELECT gw_fence($1, $2)) AS f
              WHERE m.name = $1 AND m.id = $3 AND m.state = 'running' AND m.incarnation = $4",
            &[&id, &incarnation, &reason],
        )
        .await
    }

    async fn update(
        &mut self,
        epoch: i64,
        sql: &str,
        rest: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<bool, ClusterError> {
        let name = self.lease.name().to_owned();
        let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![&name, &epoch];
        params.extend_from_slice(rest);
        let c = self.lease.client().await?;
        let n = c.execute(sql, &params).await.map_err(|e| fenced(epoch, e))?;
        Ok(n == 1)
    }

    /// Called by a newly promoted active under its epoch: runs of other incarnations were
    /// interrupted (a crash, a failover) and are requeued once, or failed after
    /// [`MAX_ATTEMPTS`]. Returns the queued ids, oldest first.
    pub async fn recover(&mut self, epoch: i64, incarnation: &str) -> Result<Vec<String>, ClusterError> {
        let name = self.lease.name().to_owned();
        let c = self.lease.client().await?;
        let rows = c
            .query(
                "WITH f AS MATERIALIZED (SELECT gw_fence($1, $2)),
                 failed AS (
                    UPDATE gw_messages m SET state = 'failed', reason = $5, epoch = $2, updated_at = clock_timestamp()
                      FROM f
                     WHERE m.name = $1 AND m.state = 'running' AND m.incarnation IS DISTINCT FROM $3
                       AND m.attempts >= $4
                    RETURNING m.id),
                 requeued AS (
                    UPDATE gw_messages m SET state = 'queued', epoch = $2, updated_at = clock_timestamp()
                      FROM f
                     WHERE m.name = $1 AND m.state = 'running' AND m.incarnation IS DISTINCT FROM $3
                       AND m.attempts < $4
                    RETURNING m.id, m.created_at)
                 SELECT id FROM (
                    SELECT id, created_at FROM requeued
                    UNION ALL
                    SELECT id, created_at FROM gw_messages, f WHERE name = $1 AND state = 'queued'
                 ) q ORDER BY created_at, id",
                &[&name, &epoch, &incarnation, &MAX_ATTEMPTS, &REASON_INTERRUPTED_TWICE],
            )
            .await
            .map_err(|e| fenced(epoch, e))?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    /// One message (a read: not fenced).
    pub async fn get(&mut self, id: &str) -> Result<Option<Message>, ClusterError> {
        let name = self.lease.name().to_owned();
        let c = self.lease.client().await?;
        let row = c
            .query_opt(
                "SELECT id, chat_id, user_id, text, state, reply, reason, attempts, epoch
                   FROM gw_messages WHERE name = $1 AND id = $2",
                &[&name, &id],
            )
            .await
            .map_err(|e| ClusterError::Store(e.to_string()))?;
        Ok(row.map(|r| Message {
            id: r.get(0),
            chat_id: r.get(1),
            user_id: r.get(2),
            text: r.get(3),
            state: r.get(4),
            reply: r.get(5),
            reason: r.get(6),
            attempts: r.get(7),
            epoch: r.get(8),
        }))
    }
}
