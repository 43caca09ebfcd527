//! Active/standby gateways: one active per cluster name, decided by a fenced lease.
//!
//! - [`LeaseBackend`] is what a store must offer: acquire (a new, larger epoch for a new
//!   holder), renew (only the current holder at its epoch), release, read the current holder,
//!   and a write that the store refuses unless the writer's epoch is the live one (the fence).
//! - [`postgres::PgLease`] implements it on PostgreSQL, with versioned migrations
//!   (`gw_schema_version`) and a `gw_lease_history` table recording every epoch grant.
//! - [`machine::Machine`] is the renewal/demotion state machine as plain data: it never reads a
//!   clock or a socket, so its rules (demote before the lease can expire) are unit-tested.
//! - [`credlease::PgCredLeases`] holds `(platform, sha256(credential))` leases for a cluster's
//!   active, so two clusters (or two gateways) never poll one bot token, whatever host they run on.
//! - [`driver`] runs the machine against a backend in a tokio task and publishes a [`Snapshot`]
//!   that the gateway reads on every request.
//! - [`journal::PgJournal`] is the gateway's journal on PostgreSQL, every write fenced by the
//!   epoch; [`store::PgStore`] puts it behind the runtime's synchronous `Store` trait.
//!
//! The expiry is computed by the database's clock (`now + ttl` in SQL); the holder keeps its
//! own, earlier, monotonic deadline (see `machine.rs`), so no two clocks are compared.

pub mod credlease;
pub mod driver;
pub mod journal;
pub mod machine;
mod migrations;

/// The schema versions this build migrates a cluster database to, in order.
pub fn schema_versions() -> impl Iterator<Item = i32> {
    migrations::MIGRATIONS.iter().map(|(v, _)| *v)
}
pub mod postgres;
pub mod store;
pub mod tls;

use std::future::Future;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use driver::{Change, Handle, Snapshot, spawn};
pub use machine::{DemoteReason, Timing};
pub use postgres::PgLease;
pub use store::PgStore;

/// Who holds (or wants) the lease: enough to find the process on its host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    pub host: String,
    pub home: String,
    pub pid: u32,
    #[serde(default)]
    pub start_time: Option<u64>,
    pub incarnation: String,
    /// The HTTP API address a standby sends clients to.
    #[serde(default)]
    pub listen: Option<String>,
}

impl Holder {
    /// The key the store compares: one process incarnation in one home on one host.
    pub fn id(&self) -> String {
        format!("{}|{}|{}", self.host, self.home, self.incarnation)
    }
}

/// The current grant as the store sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ActiveInfo {
    pub epoch: i64,
    pub holder: Holder,
    /// When this epoch was granted (RFC 3339, UTC, database clock).
    pub since: String,
    /// Still unexpired by the database clock.
    pub live: bool,
}

/// A successful acquisition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub epoch: i64,
    pub since: String,
}

/// What an acquisition attempt found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquired {
    Granted(Grant),
    /// Someone else holds a live lease; `expires_in` is by the database clock.
    Held {
        current: Option<ActiveInfo>,
        expires_in: Duration,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("cannot connect to the cluster store: {0}")]
    Connect(String),
    #[error("cluster store error: {0}")]
    Store(String),
    #[error("cluster store migration failed: {0}")]
    Migration(String),
    /// The fence refused a write: `epoch` is not the live lease.
    #[error("fenced: epoch {epoch} is no longer the live lease ({detail})")]
    Fenced { epoch: i64, detail: String },
    #[error("the cluster store did not answer within {0:?}")]
    Timeout(Duration),
}

/// A store that can hold a fenced lease. Methods take `&mut self`: one dedicated connection
/// per process (crates.md §17.1), never shared.
pub trait LeaseBackend: Send + 'static {
    /// Takes the lease if it expired (or is already ours), with `epoch + 1`, recording the
    /// grant in the history.
    fn acquire(&mut self, me: &Holder, ttl: Duration) -> impl Future<Output = Result<Acquired, ClusterError>> + Send;
    /// Extends our lease at `epoch`; `Ok(false)` means it is lost (expired or taken).
    fn renew(
        &mut self,
        me: &Holder,
        epoch: i64,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, ClusterError>> + Send;
    /// Gives the lease up now, so a standby takes it at its next attempt.
    fn release(&mut self, me: &Holder, epoch: i64) -> impl Future<Output = Result<(), ClusterError>> + Send;
    /// A fenced write: stored only while `epoch` is the live lease, else [`ClusterError::Fenced`].
    fn record(
        &mut self,
        me: &Holder,
        epoch: i64,
        event: &str,
        detail: &serde_json::Value,
    ) -> impl Future<Output = Result<(), ClusterError>> + Send;
    /// Forgets the connection (after a timeout its state is unknown); the next call reconnects.
    fn reset(&mut self);
}
