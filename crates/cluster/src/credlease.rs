//! Credential leases on PostgreSQL: a chat platform credential (`platform`, `sha256(secret)`)
//! is used by one gateway at a time across every host sharing the store. They replace the
//! host-local credential lock (crates/platforms/src/credlock.rs) when `[cluster]` is set.
//!
//! - Taken by a cluster's active after its promotion, fenced by its cluster epoch (`gw_fence`):
//!   a demoted active cannot take or renew one.
//! - Granted when the row is free, expired (a dead holder never blocks), ours, or held by an
//!   older epoch of the *same* cluster (the cluster lease already proved that holder is no
//!   longer active: a failover does not wait for the credential's own expiry).
//! - Refused while another cluster's (or another gateway's) lease is live: the answer names
//!   the holder.
//! - Renewed with the cluster lease (same TTL, same interval); released after the adapter closed.
//!
//! One dedicated connection ([`PgLease`]'s, with its migrations), separate from the cluster
//! lease's so that a slow adapter step never delays a renewal of the cluster lease.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio_postgres::error::SqlState;

use crate::migrations::FENCED_SQLSTATE;
use crate::postgres::{describe, ms, store};
use crate::{ClusterError, PgLease};

/// What a credential lease is keyed by.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CredKey {
    /// `telegram`, …
    pub platform: String,
    /// Hex SHA-256 of the secret: the secret itself never reaches the store.
    pub credential: String,
}

/// Who holds a credential lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CredHolder {
    pub cluster: String,
    pub host: String,
    pub home: String,
    pub pid: u32,
    pub incarnation: String,
    /// The cluster epoch it was taken (or last renewed) under.
    pub epoch: i64,
    /// The `[[platform]]` name that uses it.
    #[serde(default)]
    pub adapter: Option<String>,
}

impl CredHolder {
    /// The key the store compares: one process incarnation in one home of one cluster.
    pub fn id(&self) -> String {
        format!("{}|{}|{}|{}", self.cluster, self.host, self.home, self.incarnation)
    }
}

impl std::fmt::Display for CredHolder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cluster {} (host {}, home {}, pid {}, epoch {})",
            self.cluster, self.host, self.home, self.pid, self.epoch
        )
    }
}

/// What an acquisition found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CredAcquired {
    Granted,
    /// A live lease of someone else; `expires_in` by the database clock.
    Held {
        holder: Option<CredHolder>,
        expires_in: Duration,
    },
}

/// Credential leases on one PostgreSQL store.
pub struct PgCredLeases {
    pg: PgLease,
}

impl PgCredLeases {
    /// `cluster` is this gateway's cluster name (its lease fences every call).
    pub fn new(url: &str, password: Option<&str>, cluster: &str) -> Result<PgCredLeases, ClusterError> {
        Ok(PgCredLeases { pg: PgLease::new(url, password, cluster)? })
    }

    pub fn with_application_name(self, name: &str) -> PgCredLeases {
        PgCredLeases { pg: self.pg.with_application_name(name) }
    }

    /// Takes `key` for `me` (see the module notes for when it is granted).
    pub async fn acquire(
        &mut self,
        key: &CredKey,
        me: &CredHolder,
        ttl: Duration,
    ) -> Result<CredAcquired, ClusterError> {
        let holder = serde_json::to_string(me).map_err(|e| ClusterError::Store(e.to_string()))?;
        let (id, ttl_ms) = (me.id(), ms(ttl));
        let c = self.pg.client().await?;
        // One statement: the fence's row lock on the cluster lease is held until the grant
        // commits, so no grant of a stale epoch commits after a newer cluster epoch exists.
        let granted = c
            .query_opt(
                "INSERT INTO gw_credential_lease AS l
                        (platform, credential, cluster, holder_id, holder, epoch, acquired_at, renewed_at, expires_at)
                 SELECT $1, $2, $3, $4, ($5::text)::jsonb, $6, clock_timestamp(), clock_timestamp(),
                        clock_timestamp() + $7::bigint * interval '1 millisecond'
                   FROM (SELECT gw_fence($3, $6)) AS f
                 ON CONFLICT (platform, credential) DO UPDATE
                    SET cluster = EXCLUDED.cluster, holder_id = EXCLUDED.holder_id, holder = EXCLUDED.holder,
                        epoch = EXCLUDED.epoch, renewed_at = EXCLUDED.renewed_at, expires_at = EXCLUDED.expires_at,
                        acquired_at = CASE WHEN l.holder_id = EXCLUDED.holder_id THEN l.acquired_at
                                           ELSE EXCLUDED.acquired_at END
                  WHERE l.expires_at <= clock_timestamp() OR l.holder_id = EXCLUDED.holder_id
                     OR (l.cluster = EXCLUDED.cluster AND l.epoch < EXCLUDED.epoch)
                 RETURNING l.epoch",
                &[&key.platform, &key.credential, &me.cluster, &id, &holder, &me.epoch, &ttl_ms],
            )
            .await
            .map_err(|e| fenced(e, me.epoch))?;
        if granted.is_some() {
            return Ok(CredAcquired::Granted);
        }
        let row = c
            .query_opt(
                "SELECT holder::text,
                        greatest(0, (extract(epoch FROM expires_at - clock_timestamp()) * 1000))::bigint
                   FROM gw_credential_lease WHERE platform = $1 AND credential = $2",
                &[&key.platform, &key.credential],
            )
            .await
            .map_err(store)?;
        let holder = row.as_ref().and_then(|r| serde_json::from_str(&r.get::<_, String>(0)).ok());
        let left: i64 = row.as_ref().and_then(|r| r.get::<_, Option<i64>>(1)).unwrap_or(0);
        Ok(CredAcquired::Held { holder, expires_in: Duration::from_millis(left.max(0) as u64) })
    }

    /// Extends our lease of `key` under our current cluster epoch; `Ok(false)`: it is not ours
    /// any more (it expired and someone else took it). A stale epoch gets `Ok(false)` or
    /// [`ClusterError::Fenced`] (the fence runs only when the row is still ours).
    pub async fn renew(&mut self, key: &CredKey, me: &CredHolder, ttl: Duration) -> Result<bool, ClusterError> {
        let (id, ttl_ms) = (me.id(), ms(ttl));
        let c = self.pg.client().await?;
        let n = c
            .execute(
                "UPDATE gw_credential_lease SET renewed_at = clock_timestamp(), epoch = $5,
                        expires_at = clock_timestamp() + $6::bigint * interval '1 millisecond'
                   FROM (SELECT gw_fence($4, $5)) AS f
                  WHERE platform = $1 AND credential = $2 AND holder_id = $3",
                &[&key.platform, &key.credential, &id, &me.cluster, &me.epoch, &ttl_ms],
            )
            .await
            .map_err(|e| fenced(e, me.epoch))?;
        Ok(n == 1)
    }

    /// Gives `key` up (only if ours): the next taker does not wait for the expiry.
    pub async fn release(&mut self, key: &CredKey, me: &CredHolder) -> Result<(), ClusterError> {
        let id = me.id();
        let c = self.pg.client().await?;
        c.execute(
            "DELETE FROM gw_credential_lease WHERE platform = $1 AND credential = $2 AND holder_id = $3",
            &[&key.platform, &key.credential, &id],
        )
        .await
        .map_err(store)?;
        Ok(())
    }

    /// Forgets the connection (after a timeout its state is unknown).
    pub fn reset(&mut self) {
        crate::LeaseBackend::reset(&mut self.pg);
    }
}

fn fenced(e: tokio_postgres::Error, epoch: i64) -> ClusterError {
    if e.code() == Some(&SqlState::from_code(FENCED_SQLSTATE)) {
        ClusterError::Fenced { epoch, detail: describe(&e) }
    } else {
        store(e)
    }
}
