//! The gateway's chat platform adapters (crates/platforms): built from `[[platform]]` tables,
//! each behind its credential guard; inbound messages handed to the worker's [`Intake`]
//! through [`GatewayHost`]; woken through the worker's wake channel (app.rs); drained
//! intake-first.
//!
//! - Without `[cluster]`: started after the home lock is held and before `running`, each
//!   behind the host-local credential lock ([`CredGuard::Local`]).
//! - With `[cluster]`: they follow the role ([`Platforms::follow_role`]). A standby runs none
//!   (each shows `standby`, [`STANDBY_REASON`]). On promotion each adapter's credential lease
//!   is taken in the store ([`CredGuard::Lease`]) and the adapter started; the leases are
//!   renewed with the cluster lease; on demotion intake stops at once (the receive budget is
//!   zero), then the adapters close (a bounded outbox flush) and the leases are released.
//!   A later promotion starts them again.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};
use std::time::{Duration, Instant};

use gatewarden_cluster::ClusterError;
use gatewarden_cluster::credlease::{CredAcquired, CredHolder, CredKey, PgCredLeases};
use gatewarden_hermes::scoped;
use gatewarden_journal::Store;
use gatewarden_lifecycle::records::GatewayState;
use gatewarden_platforms::credlock::{self, CredLock, CredLockError, Holder};
use gatewarden_platforms::{Adapter, Host, Inbound, Outgoing, Sent, State};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

use crate::cause::Cause;
use crate::gateway::Gateway;
use crate::intake::Intake;
use crate::options::{ClusterSettings, host_name};

/// How often the watchdog looks at the adapters.
const WATCHDOG_EVERY: Duration = Duration::from_secs(5);
/// The least time a drain gives the outboxes, whatever is left of its budget.
const MIN_FLUSH: Duration = Duration::from_secs(2);
/// The most time a drain gives the outboxes.
const MAX_FLUSH: Duration = Duration::from_secs(10);
/// Taken off the lease left for a receive: the request's transit and the platform's own
/// timer (crates/cluster/README.md).
const RECEIVE_MARGIN: Duration = Duration::from_millis(500);
/// How long a demoted active lets its outboxes flush before it releases the credentials.
const DEMOTION_FLUSH: Duration = Duration::from_secs(2);
/// The state reason of every adapter of a cluster standby (`status --json`).
/// With a cluster: how far back a promoted gateway's adapter without a saved receive position
/// takes messages as new (`Host::fresh_start_window`). It covers a failover (the lease TTL plus
/// a renewal or two) with room to spare; the shared journal drops what an earlier active
/// already took, so the cost of a wider window is only a first-ever start answering the last
/// minutes of a room.
const FRESH_START_WINDOW: Duration = Duration::from_secs(300);
/// How long an adapter restarted in place (a cancelled drain, a reload) gets to send what its
/// outbox holds first; what is left is sent by the adapter that replaces it.
pub const RESTART_FLUSH: Duration = Duration::from_secs(2);
pub const STANDBY_REASON: &str = "waiting for promotion: this gateway is a cluster standby";

/// What keeps an adapter's credential ours while it runs.
enum CredGuard {
    /// The host-local OS lock (crates/platforms/src/credlock.rs), released on drop.
    Local { _lock: CredLock },
    /// A lease row in the cluster store, renewed and released by the role task.
    Lease,
}

/// Where hermes-agent keeps its scoped credential locks on this host (crates/hermes/src/
/// scoped.rs; its own resolution from our environment): a credential a hermes gateway uses is
/// refused like one another gateway holds.
#[derive(Default)]
struct HermesLocks(Option<PathBuf>);

impl HermesLocks {
    /// The refusal while a hermes gateway uses `a`'s credential.
    fn refusal(&self, a: &dyn Adapter) -> Option<String> {
        let (pid, path) = scoped::holder(self.0.as_deref()?, a.kind(), a.credential())?;
        Some(scoped::describe_holder(pid, &path))
    }
}

/// Why an adapter's credential is not ours.
enum Refused {
    /// Our own lock: another gateway holds it, or its folder is not usable.
    Ours(CredLockError),
    /// A hermes gateway uses it (the refusal, in words).
    Hermes(String),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Ours(e) => e.fmt(f),
            Refused::Hermes(r) => f.write_str(r),
        }
    }
}

struct Entry {
    /// Replaced in place by a reload that changed its `[[platform]]` table (same name, kind
    /// and credential: [`Platforms::replace`]).
    adapter: RwLock<Arc<dyn Adapter>>,
    guard: Mutex<Option<CredGuard>>,
}

impl Entry {
    fn adapter(&self) -> Arc<dyn Adapter> {
        Arc::clone(&self.adapter.read().unwrap_or_else(|p| p.into_inner()))
    }

    fn holds_credential(&self) -> bool {
        self.guard.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }

    fn set_guard(&self, g: Option<CredGuard>) {
        *self.guard.lock().unwrap_or_else(|p| p.into_inner()) = g;
    }

    fn key(&self) -> CredKey {
        let a = self.adapter();
        CredKey {
            platform: a.kind().to_owned(),
            credential: gatewarden_platforms::sha256_hex(a.credential().as_bytes()),
        }
    }
}

/// A role change, for [`Platforms::follow_role`]'s task.
#[derive(Debug)]
pub enum RoleEvent {
    Promoted {
        epoch: i64,
    },
    Demoted,
    /// Graceful stop, after the drain: release every credential lease, then end.
    Release(oneshot::Sender<()>),
}

/// Every configured adapter.
#[derive(Default)]
pub struct Platforms {
    entries: Vec<Entry>,
    started: Mutex<Option<Instant>>,
    /// The role task's inbox, with `[cluster]`.
    role: OnceLock<mpsc::UnboundedSender<RoleEvent>>,
    /// Where inbound messages go (the worker; app.rs).
    intake: OnceLock<Arc<dyn Intake>>,
    /// The host the running adapters were started with, for an adapter restarted in place.
    host: Mutex<Option<Arc<dyn Host>>>,
    hermes: HermesLocks,
}

impl Platforms {
    /// Builds the adapters with their resolved `secrets`; a missing credential is a
    /// configuration error (exit 78).
    pub fn build(
        config: &gatewarden_config::Config,
        secrets: &gatewarden_config::Secrets,
    ) -> Result<Platforms, String> {
        let mut entries = Vec::new();
        for p in &config.platform {
            let adapter = gatewarden_platforms::build(p, secrets).map_err(|e| e.to_string())?;
            entries.push(Entry { adapter: RwLock::new(adapter), guard: Mutex::new(None) });
        }
        let hermes = HermesLocks(scoped::lock_dir(|k| std::env::var_os(k)));
        Ok(Platforms {
            entries,
            started: Mutex::new(None),
            role: OnceLock::new(),
            intake: OnceLock::new(),
            host: Mutex::new(None),
            hermes,
        })
    }

    /// Connects the adapters' deliveries to the worker (once, before they start).
    pub fn set_intake(&self, intake: Arc<dyn Intake>) {
        let _ = self.intake.set(intake);
    }

    /// The adapter built from `[[platform]]` table `name` (a reload's new settings, not started).
    pub fn take(&self, name: &str) -> Option<Arc<dyn Adapter>> {
        self.get(name).map(Entry::adapter)
    }

    /// Whether `next` may replace the running adapter `name` in place: the same kind and the
    /// same credential, so the credential lock (or lease) it holds stays right.
    pub fn same_credential(&self, name: &str, next: &dyn Adapter) -> bool {
        self.get(name).is_some_and(|e| {
            let a = e.adapter();
            a.kind() == next.kind() && a.credential() == next.credential()
        })
    }

    fn host(&self, gw: &Arc<Gateway>) -> GatewayHost {
        GatewayHost::new(gw, self.intake.get().cloned())
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn get(&self, name: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.adapter().name() == name)
    }

    /// Takes each credential lock, then starts the adapter. A credential that cannot be locked
    /// (held by another gateway, or its lock folder is not ours: another user may pre-create
    /// `/tmp/gatewarden-<uid>`) parks that adapter, or fails the start (exit 78, naming why)
    /// when it is the only one: a gateway with nothing to serve must not report success.
    pub fn start(&self, gw: &Arc<Gateway>) -> Result<(), String> {
        *self.started.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        let host: Arc<dyn Host> = Arc::new(self.host(gw));
        *self.host.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::clone(&host));
        for e in &self.entries {
            self.start_entry(e, gw, &host)?;
        }
        Ok(())
    }

    /// [`Platforms::start`] for one adapter: its credential lock, then the adapter.
    fn start_entry(&self, e: &Entry, gw: &Arc<Gateway>, host: &Arc<dyn Host>) -> Result<(), String> {
        let a = e.adapter();
        let me = Holder {
            home: gw.home_str.clone(),
            pid: gw.me.pid,
            incarnation: Some(gw.me.id.clone()),
            adapter: Some(a.name().to_owned()),
        };
        let acquired = match self.hermes.refusal(&*a) {
            Some(reason) => Err(Refused::Hermes(reason)),
            None => credlock::acquire(a.kind(), a.credential(), &me).map_err(Refused::Ours),
        };
        let only = self.entries.len() == 1;
        match acquired {
            Ok(lock) => e.set_guard(Some(CredGuard::Local { _lock: lock })),
            Err(Refused::Ours(err @ CredLockError::Held { .. })) if only => {
                return Err(format!(
                    "[[platform]] {}: {err}; one bot credential serves one gateway (stop the other one, or remove this [[platform]] table)",
                    a.name()
                ));
            }
            Err(Refused::Hermes(reason)) if only => {
                return Err(format!("[[platform]] {}: {reason}; one bot credential serves one gateway", a.name()));
            }
            Err(Refused::Ours(err)) if only => {
                return Err(format!(
                    "[[platform]] {}: cannot take its credential lock: {err}; it is the only chat platform, so this gateway would serve nothing{}",
                    a.name(),
                    match err {
                        CredLockError::Dir { .. } => format!(
                            " (set XDG_RUNTIME_DIR to a private folder of this user, or {} to another lock folder)",
                            credlock::DIR_ENV
                        ),
                        _ => String::new(),
                    }
                ));
            }
            Err(refused) => {
                let reason = refused.to_string();
                crate::warn!("[[platform]] {}: parked: {reason}", a.name());
                a.park(reason);
                host.state_changed(a.name(), &a.status().state());
                return Ok(());
            }
        }
        a.start(Arc::clone(host)).map_err(|e| e.to_string())?;
        crate::info!("[[platform]] {} ({}) started", a.name(), a.kind());
        Ok(())
    }

    /// A reload changed adapter `name`'s settings (not its kind or credential: the caller
    /// checked [`Platforms::same_credential`]): the running adapter stops taking messages,
    /// sends what its outbox holds until `deadline`, and `next` starts on the same credential
    /// lock. Without `[cluster]` only (a cluster's adapters follow the role task). Blocking.
    pub fn replace(
        &self,
        gw: &Arc<Gateway>,
        name: &str,
        next: Arc<dyn Adapter>,
        deadline: Instant,
    ) -> Result<(), String> {
        let Some(e) = self.get(name) else { return Err(format!("[[platform]] {name}: no such adapter runs")) };
        let old = e.adapter();
        old.stop_intake();
        if !old.close(deadline) {
            crate::warn!(
                "[[platform]] {name}: replies still queued when it was restarted (the new settings send them)"
            );
        }
        *e.adapter.write().unwrap_or_else(|p| p.into_inner()) = next;
        let host = self.host.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let host = host.unwrap_or_else(|| Arc::new(self.host(gw)));
        let a = e.adapter();
        if e.holds_credential() {
            a.start(host).map_err(|err| format!("[[platform]] {name}: {err}"))?;
            crate::info!("[[platform]] {name} ({}) restarted with its new settings", a.kind());
            Ok(())
        } else {
            // It was parked (its credential held elsewhere): it tries again, as at start.
            self.start_entry(e, gw, &host)
        }
    }

    /// The outbox has something for `adapter`.
    pub fn wake(&self, adapter: &str) {
        if let Some(e) = self.get(adapter) {
            e.adapter().wake();
        }
    }

    /// A run's activity in one of `adapter`'s chats (never blocks).
    pub fn show(&self, adapter: &str, chat: &str, run: &str, activity: gatewarden_platforms::Activity) {
        if let Some(e) = self.get(adapter) {
            e.adapter().show(chat, run, activity);
        }
    }

    /// A request pushed to adapter `name` of `kind` on the listener (`/hooks/<kind>/<name>`);
    /// `None` when there is no such adapter. Blocking, bounded by the adapter.
    pub fn hook(
        &self,
        kind: &str,
        name: &str,
        req: &gatewarden_platforms::HookRequest,
    ) -> Option<gatewarden_platforms::HookAnswer> {
        let a = self.get(name)?.adapter();
        (a.kind() == kind).then(|| a.hook(req))
    }

    /// Drain, step 1 (blocking, bounded by one short call per adapter).
    pub fn stop_intake(&self) {
        for e in &self.entries {
            e.adapter().stop_intake();
        }
    }

    /// Drain, step 2 (blocking until `deadline`): flush the outboxes, close, release the
    /// credentials.
    pub fn close(&self, deadline: Instant) {
        for e in &self.entries {
            if !e.adapter().close(deadline) {
                crate::warn!(
                    "[[platform]] {}: replies still queued at the end of the drain (the next incarnation sends them)",
                    e.adapter().name()
                );
            }
            // A local lock is released here; a lease by the role task, after this.
            e.set_guard(None);
        }
    }

    /// A cluster standby at boot: no adapter runs; each says why.
    pub fn standby_all(&self, gw: &Arc<Gateway>) {
        let host = self.host(gw);
        for e in &self.entries {
            let state = State::Standby(STANDBY_REASON.to_owned());
            if e.adapter().status().set(state.clone()) {
                host.state_changed(e.adapter().name(), &state);
            }
        }
    }

    /// With `[cluster]`: starts the task that runs the adapters on the active only (module
    /// notes). Role changes arrive through [`Platforms::role_changed`].
    pub fn follow_role(self: &Arc<Self>, gw: &Arc<Gateway>, s: &ClusterSettings) -> Result<(), String> {
        if self.is_empty() {
            return Ok(());
        }
        let c = &s.config;
        let leases = PgCredLeases::new(&c.store_url(), s.password.as_ref().map(|p| p.expose()), &c.name)
            .map_err(|e| format!("[cluster] store: {e}"))?
            .with_application_name(&format!("gatewarden pid {} credentials", gw.me.pid));
        let (tx, rx) = mpsc::unbounded_channel();
        if self.role.set(tx).is_err() {
            return Err("the platforms already follow the cluster role".into());
        }
        let task = RoleTask {
            platforms: Arc::clone(self),
            gw: Arc::clone(gw),
            host: Arc::new(self.host(gw)),
            leases,
            cluster: c.name.clone(),
            ttl: c.lease_ttl(),
            every: c.renew_interval(),
            epoch: None,
            held: HashSet::new(),
        };
        tokio::spawn(task.run(rx));
        Ok(())
    }

    /// Tells the role task (if any) about a role change.
    pub fn role_changed(&self, ev: RoleEvent) {
        if let Some(tx) = self.role.get() {
            let _ = tx.send(ev);
        }
    }

    /// After the drain: releases every credential lease (with `[cluster]`), waiting at most
    /// `budget`.
    pub async fn release_leases(&self, budget: Duration) {
        let Some(tx) = self.role.get() else { return };
        let (ack, done) = oneshot::channel();
        if tx.send(RoleEvent::Release(ack)).is_ok() {
            let _ = tokio::time::timeout(budget, done).await;
        }
    }

    /// How long the drain lets the outboxes flush, from what is left of its budget.
    pub fn flush_budget(left: Duration) -> Duration {
        left.clamp(MIN_FLUSH, MAX_FLUSH)
    }

    /// `status --json`'s `platforms` array.
    pub fn report(&self) -> Vec<Value> {
        self.entries
            .iter()
            .map(|e| {
                let s = e.adapter().status().snapshot();
                json!({
                    "name": e.adapter().name(),
                    "kind": e.adapter().kind(),
                    "state": s.state.name(),
                    "reason": s.state.reason(),
                    "since": s.since,
                    "last_progress": s.last_progress,
                    "progress_age_s": s.progress_age_s,
                    "lag_s": s.lag_s,
                    "received": s.received,
                    "sent": s.sent,
                    "conflicts": s.conflicts,
                    "last_error": s.last_error,
                })
            })
            .collect()
    }

    /// `(name, kind, snapshot)` per adapter, for /metrics.
    pub fn snapshots(&self) -> Vec<(String, &'static str, gatewarden_platforms::Snapshot)> {
        self.entries
            .iter()
            .map(|e| (e.adapter().name().to_owned(), e.adapter().kind(), e.adapter().status().snapshot()))
            .collect()
    }

    /// Reconnects every connected adapter that made no progress for too long (a deaf
    /// connection looks alive to the adapter itself).
    pub fn watchdog(self: &Arc<Self>, gw: Arc<Gateway>) {
        if self.is_empty() {
            return;
        }
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(WATCHDOG_EVERY);
            loop {
                tick.tick().await;
                // A drain pauses it; a cancelled drain returns to `running`.
                match gw.phase.get() {
                    GatewayState::Running => {}
                    GatewayState::Starting | GatewayState::Draining => continue,
                    _ => return,
                }
                let Some(started) = *me.started.lock().unwrap_or_else(|p| p.into_inner()) else { continue };
                for e in &me.entries {
                    let a = e.adapter();
                    let age = a.status().progress_age(started);
                    if a.status().state() == State::Connected && age > a.watchdog_after() {
                        crate::warn!("[[platform]] {}: no progress for {age:?}; reconnecting", a.name());
                        gw.record("platform_watchdog", json!({"platform": a.name(), "idle_s": age.as_secs()}));
                        a.reconnect();
                    }
                }
            }
        });
    }
}

/// The gateway as the adapters see it. Weak: the adapters' threads must not keep the gateway
/// alive.
struct GatewayHost {
    gw: Weak<Gateway>,
    /// The worker, which journals what arrives (`None` only if never connected).
    intake: Option<Arc<dyn Intake>>,
    /// Outbox entries this process sent but could not record (`seq` → the platform's refusal):
    /// never sent again by it, only recorded once the journal takes writes again. Without this
    /// an adapter's flush re-reads the same pending entry and sends it in a loop for as long as
    /// the write fails (a fenced, just-deposed active sent one reply hundreds of times).
    unrecorded: Mutex<BTreeMap<i64, Option<String>>>,
    /// Outbox entries handed to an adapter that answer a message (`seq` → its id), so that a
    /// send can be traced (`Intake::answered`); at most [`ANSWERS`], oldest dropped first.
    answers: Mutex<BTreeMap<i64, String>>,
}

/// Entries [`GatewayHost::answers`] keeps at most.
const ANSWERS: usize = 1024;

impl GatewayHost {
    fn new(gw: &Arc<Gateway>, intake: Option<Arc<dyn Intake>>) -> GatewayHost {
        GatewayHost {
            gw: Arc::downgrade(gw),
            intake,
            unrecorded: Mutex::new(BTreeMap::new()),
            answers: Mutex::new(BTreeMap::new()),
        }
    }

    fn answers(&self) -> std::sync::MutexGuard<'_, BTreeMap<i64, String>> {
        self.answers.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn intake(&self) -> Result<&Arc<dyn Intake>, String> {
        self.intake.as_ref().ok_or_else(|| "the gateway takes no messages yet".to_owned())
    }

    fn journal(&self) -> Result<&Arc<dyn Store>, String> {
        self.intake().map(|i| i.journal())
    }

    fn unrecorded(&self) -> std::sync::MutexGuard<'_, BTreeMap<i64, Option<String>>> {
        self.unrecorded.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Up to `limit` pending entries of `adapter`, less those sent but not yet recorded (first
    /// recorded, when the journal takes writes again).
    fn pending(&self, adapter: &str, limit: usize) -> Result<Vec<Outgoing>, String> {
        let journal = self.journal()?;
        let mut unrecorded = self.unrecorded();
        unrecorded.retain(|seq, failed| journal.outbox_done(*seq, failed.as_deref()).is_err());
        let batch = journal.outbox_pending(adapter, limit + unrecorded.len()).map_err(|e| e.to_string())?;
        let out: Vec<Outgoing> = batch.into_iter().filter(|o| !unrecorded.contains_key(&o.seq)).take(limit).collect();
        let mut answers = self.answers();
        for o in &out {
            if let Some(id) = &o.message_id {
                answers.insert(o.seq, id.clone());
            }
        }
        while answers.len() > ANSWERS {
            answers.pop_first();
        }
        Ok(out)
    }

    fn gw(&self) -> Result<Arc<Gateway>, String> {
        self.gw.upgrade().ok_or_else(|| "the gateway is shutting down".to_owned())
    }
}

impl Host for GatewayHost {
    fn deliver(&self, adapter: &str, m: Inbound) -> Result<(), String> {
        let gw = self.gw()?;
        crate::intake::deliver(&gw, &**self.intake()?, adapter, m)
    }

    fn message_id(&self, adapter: &str, event_id: &str) -> Option<String> {
        self.journal().ok()?.event_message(adapter, event_id).ok().flatten()
    }

    fn outbox(&self, adapter: &str, limit: usize) -> Result<Vec<Outgoing>, String> {
        let gw = self.gw()?;
        // A cluster gateway that is not the live active (no lease left) cannot record a send,
        // and its successor sends the same shared outbox: whatever it sent would go twice.
        let Some(left) = gw.poll_budget() else {
            return self.pending(adapter, limit);
        };
        if left.is_zero() {
            return Ok(Vec::new());
        }
        // One entry per read: an adapter sends a whole batch before reading again, so an active
        // paused mid-batch would wake up deposed and still send the rest, each one also sent by
        // its successor. Read one at a time, a pause costs at most the one entry in hand.
        self.pending(adapter, 1)
    }

    fn sent(&self, seq: i64, outcome: Sent) {
        let (Ok(_gw), Ok(journal)) = (self.gw(), self.journal()) else { return };
        let failed = match &outcome {
            Sent::Ok => None,
            Sent::Rejected(why) => Some(why.as_str()),
        };
        if let Some(why) = failed {
            crate::warn!("outbox entry {seq} refused by the platform for good: {why}");
        }
        let answered = self.answers().remove(&seq);
        match journal.outbox_done(seq, failed) {
            Err(e) => {
                crate::error!("cannot record outbox entry {seq} as sent: {e}");
                self.unrecorded().insert(seq, failed.map(str::to_owned));
            }
            Ok(recorded) => {
                if let (true, Some(id), Ok(intake)) = (recorded, answered, self.intake()) {
                    intake.answered(&id);
                }
            }
        }
    }

    fn receive_budget(&self) -> Option<Duration> {
        // A gateway that is gone receives nothing more.
        self.gw.upgrade().map_or(Some(Duration::ZERO), |gw| receive_budget(gw.poll_budget()))
    }

    fn fresh_start_window(&self) -> Option<Duration> {
        self.gw.upgrade().and_then(|gw| gw.cluster.get().map(|_| FRESH_START_WINDOW))
    }

    fn state_dir(&self) -> Option<std::path::PathBuf> {
        self.gw.upgrade().map(|gw| gw.home.dir().join("platforms"))
    }

    fn menu(&self) -> Vec<gatewarden_platforms::MenuCommand> {
        crate::commands::menu()
    }

    fn admits(&self, adapter: &str, m: &Inbound) -> bool {
        self.intake().is_ok_and(|i| i.admits(adapter, m))
    }

    /// `<home>/attachments`, under `[attachments]` as it is now (crates/platforms/src/attachments.rs).
    fn attachments(
        &self,
    ) -> Option<(gatewarden_platforms::attachments::Store, gatewarden_platforms::attachments::Bounds)> {
        use gatewarden_platforms::attachments::{Bounds, Store};
        let gw = self.gw.upgrade()?;
        let bounds = Bounds::from(&self.intake().ok()?.attachments());
        Some((Store::in_home(gw.home.dir()), bounds))
    }

    fn state_changed(&self, adapter: &str, state: &State) {
        let Ok(gw) = self.gw() else { return };
        match state {
            State::Degraded(r) | State::Parked(r) | State::Standby(r) => {
                crate::warn!("[[platform]] {adapter}: {} ({r})", state.name());
            }
            _ => crate::info!("[[platform]] {adapter}: {}", state.name()),
        }
        gw.record("platform_state", json!({"platform": adapter, "state": state.name(), "reason": state.reason()}));
    }
}

/// The longest one receive may block: without a cluster, unbounded (`None`); with one, the
/// lease left (zero on a standby) minus [`RECEIVE_MARGIN`], so a poll that cannot be fenced
/// ends before the lease can.
fn receive_budget(lease_left: Option<Duration>) -> Option<Duration> {
    lease_left.map(|l| l.saturating_sub(RECEIVE_MARGIN))
}

/// Why an adapter could not take its credential lease.
enum Refusal {
    /// Another live holder: parked until it goes.
    Held(String),
    /// The store did not answer: degraded, retried at the next renewal.
    Store(String),
}

/// Runs the adapters on the cluster's active only (module notes). Role events are handled one
/// at a time, in order; between them the credential leases are renewed every renewal interval.
struct RoleTask {
    platforms: Arc<Platforms>,
    gw: Arc<Gateway>,
    host: Arc<GatewayHost>,
    leases: PgCredLeases,
    cluster: String,
    ttl: Duration,
    every: Duration,
    /// Our epoch while active.
    epoch: Option<i64>,
    /// Entries whose lease we hold (their adapters run).
    held: HashSet<usize>,
}

impl RoleTask {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<RoleEvent>) {
        let mut tick = tokio::time::interval(self.every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                ev = rx.recv() => match ev {
                    None => return,
                    Some(RoleEvent::Promoted { epoch }) => self.promoted(epoch).await,
                    Some(RoleEvent::Demoted) => self.demoted().await,
                    Some(RoleEvent::Release(ack)) => {
                        self.epoch = None;
                        self.stop_all(Instant::now() + MIN_FLUSH).await;
                        let _ = ack.send(());
                        return;
                    }
                },
                _ = tick.tick() => self.renew().await,
            }
        }
    }

    fn me(&self, epoch: i64, adapter: &str) -> CredHolder {
        CredHolder {
            cluster: self.cluster.clone(),
            host: host_name(),
            home: self.gw.home_str.clone(),
            pid: self.gw.me.pid,
            incarnation: self.gw.me.id.clone(),
            epoch,
            adapter: Some(adapter.to_owned()),
        }
    }

    /// One store call, bounded by a renewal interval (a timeout forgets the connection).
    async fn bounded<T>(
        &mut self,
        f: impl AsyncFnOnce(&mut PgCredLeases) -> Result<T, ClusterError>,
    ) -> Result<T, ClusterError> {
        match tokio::time::timeout(self.every, f(&mut self.leases)).await {
            Ok(r) => r,
            Err(_) => {
                self.leases.reset();
                Err(ClusterError::Timeout(self.every))
            }
        }
    }

    async fn promoted(&mut self, epoch: i64) {
        if self.gw.phase.get() != GatewayState::Running {
            return; // draining: nothing starts any more
        }
        self.epoch = Some(epoch);
        *self.platforms.started.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        self.take_missing(epoch).await;
    }

    /// Takes the lease of, and starts, every adapter that does not run yet.
    async fn take_missing(&mut self, epoch: i64) {
        let only = self.platforms.entries.len() == 1;
        for i in 0..self.platforms.entries.len() {
            // Nothing starts once the drain began (the gateway is still active until it releases).
            if self.held.contains(&i) || !self.gw.is_active() || self.gw.phase.get() != GatewayState::Running {
                continue;
            }
            let (key, me) = {
                let e = &self.platforms.entries[i];
                (e.key(), self.me(epoch, e.adapter().name()))
            };
            // A credential a hermes gateway here uses is not leased.
            if let Some(reason) = self.platforms.hermes.refusal(&*self.platforms.entries[i].adapter()) {
                self.refuse(i, only, Refusal::Held(reason));
                continue;
            }
            let ttl = self.ttl;
            let r = self.bounded(async |l| l.acquire(&key, &me, ttl).await).await;
            let refusal = match r {
                Ok(CredAcquired::Granted) => None,
                // Stable wording (no countdown): it is re-checked every renewal interval.
                Ok(CredAcquired::Held { holder, .. }) => Some(Refusal::Held(format!(
                    "this {} credential is in use by {}; one bot credential serves one gateway (retried until that lease expires)",
                    key.platform,
                    holder.map_or_else(|| "another gateway".to_owned(), |h| h.to_string()),
                ))),
                Err(ClusterError::Fenced { .. }) => return, // demoted: the event follows
                Err(e) => Some(Refusal::Store(format!("cannot take the credential lease: {e}; retrying"))),
            };
            let e = &self.platforms.entries[i];
            let a = e.adapter();
            match refusal {
                None => {
                    e.set_guard(Some(CredGuard::Lease));
                    self.held.insert(i);
                    let host: Arc<dyn Host> = Arc::clone(&self.host) as Arc<dyn Host>;
                    let started = {
                        let a = Arc::clone(&a);
                        tokio::task::spawn_blocking(move || a.start(host)).await
                    };
                    match started {
                        Ok(Ok(())) => {
                            crate::info!("[[platform]] {} ({}) started (cluster epoch {epoch})", a.name(), a.kind());
                        }
                        Ok(Err(err)) => crate::error!("[[platform]] {}: {err}", a.name()),
                        Err(err) => crate::error!("[[platform]] {}: cannot start: {err}", a.name()),
                    }
                }
                Some(r) => self.refuse(i, only, r),
            }
        }
    }

    /// An adapter whose credential is not ours this round: parked (held elsewhere; the only
    /// adapter ends the gateway, exit 78, as with the local lock) or degraded (the store).
    fn refuse(&self, i: usize, only: bool, refusal: Refusal) {
        let a = self.platforms.entries[i].adapter();
        match refusal {
            Refusal::Held(reason) => {
                if only {
                    self.gw.send_cause(Cause::Fatal(format!("[[platform]] {}: {reason}", a.name())));
                }
                if !matches!(a.status().state(), State::Parked(ref r) if *r == reason) {
                    a.park(reason);
                    self.host.state_changed(a.name(), &a.status().state());
                }
            }
            Refusal::Store(reason) => {
                let state = State::Degraded(reason);
                if a.status().set(state.clone()) {
                    self.host.state_changed(a.name(), &state);
                }
            }
        }
    }

    /// Every renewal interval while active: renew what we hold (a lease lost stops its
    /// adapter), and retry what is parked.
    async fn renew(&mut self) {
        let Some(epoch) = self.epoch else { return };
        if !self.gw.is_active() {
            return; // the demotion event follows
        }
        let mut lost = Vec::new();
        let held: Vec<usize> = self.held.iter().copied().collect();
        for i in held {
            let (key, me) = {
                let e = &self.platforms.entries[i];
                (e.key(), self.me(epoch, e.adapter().name()))
            };
            let ttl = self.ttl;
            if let Ok(false) = self.bounded(async |l| l.renew(&key, &me, ttl).await).await {
                lost.push(i);
            }
        }
        for i in lost {
            let a = self.platforms.entries[i].adapter();
            crate::warn!("[[platform]] {}: credential lease lost (it expired and was taken); stopping", a.name());
            self.stop(i, Instant::now() + MIN_FLUSH).await;
            a.park("the credential lease was lost to another gateway; retried every renewal".into());
            self.host.state_changed(a.name(), &a.status().state());
        }
        self.take_missing(epoch).await;
    }

    async fn demoted(&mut self) {
        self.epoch = None;
        self.stop_all(Instant::now() + DEMOTION_FLUSH).await;
        if self.gw.phase.get() == GatewayState::Running {
            self.platforms.standby_all(&self.gw);
        }
    }

    /// Stops every adapter we hold a lease for, then releases the leases.
    async fn stop_all(&mut self, deadline: Instant) {
        let held: Vec<usize> = self.held.iter().copied().collect();
        for i in held {
            self.stop(i, deadline).await;
        }
    }

    /// Intake first, then close (bounded flush), then the lease.
    async fn stop(&mut self, i: usize, deadline: Instant) {
        self.held.remove(&i);
        let platforms = Arc::clone(&self.platforms);
        let e = &platforms.entries[i];
        let a = e.adapter();
        let key = e.key();
        // Release matches the holder id only, not the epoch.
        let me = self.me(0, a.name());
        let closed = tokio::task::spawn_blocking(move || {
            a.stop_intake();
            a.close(deadline)
        })
        .await;
        if !matches!(closed, Ok(true)) {
            crate::warn!(
                "[[platform]] {}: replies still queued after the flush (this home sends them when it runs the adapter again)",
                e.adapter().name()
            );
        }
        e.set_guard(None);
        if let Err(err) = self.bounded(async |l| l.release(&key, &me).await).await {
            crate::warn!(
                "[[platform]] {}: cannot release the credential lease ({err}); it expires",
                e.adapter().name()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receive_budget_is_the_lease_left_minus_the_margin() {
        assert_eq!(receive_budget(None), None, "no cluster: the adapter's own setting");
        assert_eq!(receive_budget(Some(Duration::ZERO)), Some(Duration::ZERO), "a standby: no receive");
        assert_eq!(receive_budget(Some(Duration::from_millis(300))), Some(Duration::ZERO));
        assert_eq!(receive_budget(Some(Duration::from_millis(2250))), Some(Duration::from_millis(1750)));
    }
}
