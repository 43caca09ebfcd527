//! [`LeaseBackend`] on PostgreSQL: one dedicated `tokio-postgres` connection (no pool;
//! crates.md §17.1; TLS per the URL's `sslmode`, crate::tls), reconnected on demand. The expiry is always `clock_timestamp() + ttl`
//! in SQL: the database's clock is the only one that decides expiry.

use std::time::Duration;

use tokio_postgres::Client;
use tokio_postgres::error::SqlState;

use crate::migrations::{FENCED_SQLSTATE, MIGRATIONS};
use crate::{Acquired, ActiveInfo, ClusterError, Grant, Holder, LeaseBackend};

/// How long a connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// RFC 3339 in UTC, formatted by the database (no date crate needed here).
const TS: &str = r#"'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'"#;

pub struct PgLease {
    config: tokio_postgres::Config,
    tls: crate::tls::MakeRustls,
    name: String,
    client: Option<Client>,
    /// The lease row exists (checked once per connection, not on every attempt).
    row_exists: bool,
}

impl PgLease {
    /// `url` is a `postgres://user@host:port/db` URL without a password; `password` comes
    /// from the environment or a file, never from config.toml.
    pub fn new(url: &str, password: Option<&str>, name: &str) -> Result<PgLease, ClusterError> {
        let url =
            crate::tls::StoreUrl::parse(url).map_err(|e| ClusterError::Connect(format!("invalid store URL: {e}")))?;
        let tls = url.connector().map_err(ClusterError::Connect)?;
        let mut config: tokio_postgres::Config =
            url.url.parse().map_err(|e| ClusterError::Connect(format!("invalid store URL: {e}")))?;
        config.ssl_mode(url.mode.for_postgres());
        if let Some(p) = password {
            config.password(p);
        }
        config
            .connect_timeout(CONNECT_TIMEOUT)
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(5))
            .application_name("gatewarden");
        Ok(PgLease { config, tls, name: name.to_owned(), client: None, row_exists: false })
    }

    /// Names the connection in `pg_stat_activity` (default `gatewarden`), so an operator (or a
    /// test) can tell the gateways' sessions apart.
    pub fn with_application_name(mut self, name: &str) -> PgLease {
        self.config.application_name(name);
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The connection, (re)connecting and migrating when there is none or it closed.
    pub async fn client(&mut self) -> Result<&Client, ClusterError> {
        if self.client.as_ref().is_none_or(Client::is_closed) {
            self.client = None;
            let (client, conn) =
                self.config.connect(self.tls.clone()).await.map_err(|e| ClusterError::Connect(describe(&e)))?;
            // The connection future ends when the backend goes away (pg_terminate_backend, a
            // restart); `is_closed` then reports it and the next call reconnects.
            tokio::spawn(async move {
                let _ = conn.await;
            });
            migrate(&client).await?;
            self.client = Some(client);
        }
        self.client.as_ref().ok_or_else(|| ClusterError::Connect("no connection".into()))
    }

    /// The current grant, if any (for status and tests).
    pub async fn current(&mut self) -> Result<Option<ActiveInfo>, ClusterError> {
        let name = self.name.clone();
        let c = self.client().await?;
        let row = c
            .query_opt(
                &format!(
                    "SELECT epoch, holder::text, to_char(acquired_at AT TIME ZONE 'UTC', {TS}),
                            expires_at > clock_timestamp()
                       FROM gw_lease WHERE name = $1 AND holder IS NOT NULL"
                ),
                &[&name],
            )
            .await
            .map_err(store)?;
        Ok(row.and_then(|r| active_info(r.get(0), r.get(1), r.get(2), r.get(3))))
    }
}

fn active_info(epoch: i64, holder: Option<String>, since: Option<String>, live: bool) -> Option<ActiveInfo> {
    let holder = serde_json::from_str(&holder?).ok()?;
    Some(ActiveInfo { epoch, holder, since: since.unwrap_or_default(), live })
}

pub(crate) fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        // tokio-postgres's own text ("error performing TLS handshake") hides the cause: the
        // certificate problem, named by crate::tls, is in the source chain.
        None => match std::error::Error::source(e) {
            Some(cause) => format!("{e}: {cause}"),
            None => e.to_string(),
        },
    }
}

pub(crate) fn store(e: tokio_postgres::Error) -> ClusterError {
    ClusterError::Store(describe(&e))
}

pub(crate) fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

async fn migrate(c: &Client) -> Result<(), ClusterError> {
    let err = |e: tokio_postgres::Error| ClusterError::Migration(describe(&e));
    // Fast path: nothing to do (a reconnect after a backend was terminated).
    let done: Option<i32> =
        c.query_opt("SELECT max(version) FROM gw_schema_version", &[]).await.ok().flatten().and_then(|r| r.get(0));
    if done.is_some_and(|v| MIGRATIONS.iter().all(|(m, _)| *m <= v)) {
        return Ok(());
    }
    c.batch_execute(
        "BEGIN;
         SELECT pg_advisory_xact_lock(hashtext('gatewarden:migrate'));
         CREATE TABLE IF NOT EXISTS gw_schema_version (
             version integer PRIMARY KEY,
             applied_at timestamptz NOT NULL DEFAULT now());",
    )
    .await
    .map_err(err)?;
    let result = async {
        let applied: Option<i32> =
            c.query_one("SELECT max(version) FROM gw_schema_version", &[]).await.map_err(err)?.get(0);
        for (version, sql) in MIGRATIONS {
            if applied.is_some_and(|a| a >= *version) {
                continue;
            }
            c.batch_execute(sql).await.map_err(err)?;
            c.execute("INSERT INTO gw_schema_version (version) VALUES ($1)", &[version]).await.map_err(err)?;
        }
        c.batch_execute("COMMIT").await.map_err(err)
    }
    .await;
    if result.is_err() {
        let _ = c.batch_execute("ROLLBACK").await;
    }
    result
}

impl LeaseBackend for PgLease {
    async fn acquire(&mut self, me: &Holder, ttl: Duration) -> Result<Acquired, ClusterError> {
        let (name, id, ttl_ms) = (self.name.clone(), me.id(), ms(ttl));
        let holder = serde_json::to_string(me).map_err(|e| ClusterError::Store(e.to_string()))?;
        if !self.row_exists {
            self.client()
                .await?
                .execute("INSERT INTO gw_lease (name) VALUES ($1) ON CONFLICT (name) DO NOTHING", &[&name])
                .await
                .map_err(store)?;
            self.row_exists = true;
        }
        let c = self.client().await?;
        // One statement: the grant and its history row commit together. Concurrent standbys
        // serialise on the row lock; the loser re-checks the WHERE against the winner's expiry.
        let granted = c
            .query_opt(
                &format!(
                    "WITH g AS (
                        UPDATE gw_lease SET epoch = epoch + 1, holder_id = $2, holder = ($3::text)::jsonb,
                               acquired_at = clock_timestamp(), renewed_at = clock_timestamp(),
                               expires_at = clock_timestamp() + $4::bigint * interval '1 millisecond'
                         WHERE name = $1 AND (expires_at <= clock_timestamp() OR holder_id = $2)
                        RETURNING epoch, holder_id, holder, acquired_at),
                     h AS (
                        INSERT INTO gw_lease_history (name, epoch, holder_id, holder, granted_at)
                        SELECT $1, epoch, holder_id, holder, acquired_at FROM g)
                     SELECT epoch, to_char(acquired_at AT TIME ZONE 'UTC', {TS}) FROM g"
                ),
                &[&name, &id, &holder, &ttl_ms],
            )
            .await
            .map_err(store)?;
        if let Some(r) = granted {
            return Ok(Acquired::Granted(Grant {
                epoch: r.get(0),
                since: r.get::<_, Option<String>>(1).unwrap_or_default(),
            }));
        }
        let row = c
            .query_one(
                &format!(
                    "SELECT epoch, holder::text, to_char(acquired_at AT TIME ZONE 'UTC', {TS}),
                            expires_at > clock_timestamp(),
                            greatest(0, (extract(epoch FROM expires_at - clock_timestamp()) * 1000))::bigint
                       FROM gw_lease WHERE name = $1"
                ),
                &[&name],
            )
            .await
            .map_err(store)?;
        let left: Option<i64> = row.get(4);
        Ok(Acquired::Held {
            current: active_info(row.get(0), row.get(1), row.get(2), row.get(3)),
            expires_in: Duration::from_millis(left.unwrap_or(0).max(0) as u64),
        })
    }

    async fn renew(&mut self, me: &Holder, epoch: i64, ttl: Duration) -> Result<bool, ClusterError> {
        let (name, id, ttl_ms) = (self.name.clone(), me.id(), ms(ttl));
        let c = self.client().await?;
        let n = c
            .execute(
                "UPDATE gw_lease SET renewed_at = clock_timestamp(),
                        expires_at = clock_timestamp() + $4::bigint * interval '1 millisecond'
                  WHERE name = $1 AND holder_id = $2 AND epoch = $3 AND expires_at > clock_timestamp()",
                &[&name, &id, &epoch, &ttl_ms],
            )
            .await
            .map_err(store)?;
        Ok(n == 1)
    }

    async fn release(&mut self, me: &Holder, epoch: i64) -> Result<(), ClusterError> {
        let (name, id) = (self.name.clone(), me.id());
        let c = self.client().await?;
        c.execute(
            "UPDATE gw_lease SET expires_at = '-infinity' WHERE name = $1 AND holder_id = $2 AND epoch = $3",
            &[&name, &id, &epoch],
        )
        .await
        .map_err(store)?;
        Ok(())
    }

    async fn record(
        &mut self,
        me: &Holder,
        epoch: i64,
        event: &str,
        detail: &serde_json::Value,
    ) -> Result<(), ClusterError> {
        let (name, id, detail) = (self.name.clone(), me.id(), detail.to_string());
        let c = self.client().await?;
        // One statement, so the fence's row lock is held until the insert commits.
        let r = c
            .execute(
                "INSERT INTO gw_events (name, epoch, holder_id, event, detail, at)
                 SELECT $1, $2, $3, $4, ($5::text)::jsonb, clock_timestamp() FROM (SELECT gw_fence($1, $2)) AS f",
                &[&name, &epoch, &id, &event, &detail],
            )
            .await;
        match r {
            Ok(_) => Ok(()),
            Err(e) if e.code() == Some(&SqlState::from_code(FENCED_SQLSTATE)) => {
                Err(ClusterError::Fenced { epoch, detail: describe(&e) })
            }
            Err(e) => Err(store(e)),
        }
    }

    fn reset(&mut self) {
        self.client = None;
    }
}
