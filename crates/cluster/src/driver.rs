//! Runs the [`Machine`] against a [`LeaseBackend`] in one tokio task.
//!
//! The task publishes a [`Snapshot`] on a watch channel. The snapshot carries the active's
//! local deadline, so a reader ([`Snapshot::is_active_at`]) stops treating the process as
//! active at that instant even if this task is late (a pause, a busy runtime): intake stops
//! first, whatever the task is doing. Role changes are also sent as [`Change`]s so the
//! gateway can start and stop its work and write its ledger.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::timeout;

use crate::machine::{Action, DemoteReason, Input, Machine, Role, Timing};
use crate::{Acquired, ActiveInfo, ClusterError, Holder, LeaseBackend};

/// How long the last fenced writes (the demotion or release record) may take.
const LAST_WORDS: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoleView {
    Active,
    Standby,
    /// Released the lease after a graceful stop; no longer competing.
    Stopped,
}

impl RoleView {
    pub fn as_str(self) -> &'static str {
        match self {
            RoleView::Active => "active",
            RoleView::Standby => "standby",
            RoleView::Stopped => "stopped",
        }
    }
}

/// What the gateway reads on every request.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub name: String,
    pub role: RoleView,
    /// Ours while active; else the active's, when known.
    pub epoch: Option<i64>,
    /// While active: the local deadline (demote at or before it).
    pub deadline: Option<Instant>,
    /// The current holder as last seen (ourselves while active).
    pub active: Option<ActiveInfo>,
    /// The last store error, cleared by the next success.
    pub error: Option<String>,
}

impl Snapshot {
    /// Active, and the local deadline not reached at `now`.
    pub fn is_active_at(&self, now: Instant) -> bool {
        self.role == RoleView::Active && self.deadline.is_some_and(|d| now < d)
    }

    /// How much of the lease is left for work that cannot be fenced (a platform long poll must
    /// not outlast it).
    pub fn lease_left(&self, now: Instant) -> Option<Duration> {
        self.deadline.filter(|_| self.is_active_at(now)).map(|d| d.saturating_duration_since(now))
    }

    /// The `cluster` object of `status --json` (docs/protocol.md).
    pub fn to_json(&self, now: Instant) -> Value {
        let role = match self.role {
            RoleView::Active if !self.is_active_at(now) => RoleView::Standby,
            r => r,
        };
        json!({
            "name": self.name,
            "role": role.as_str(),
            "epoch": self.epoch,
            "active": self.active.as_ref().filter(|a| a.live || role == RoleView::Active).map(|a| json!({
                "host": a.holder.host,
                "home": a.holder.home,
                "pid": a.holder.pid,
                "incarnation": a.holder.incarnation,
                "listen": a.holder.listen,
                "since": a.since,
                "epoch": a.epoch,
            })),
            "lease_left_ms": self.lease_left(now).map(|d| d.as_millis() as u64),
            "error": self.error,
        })
    }
}

/// A role change, for the gateway's reactions and ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Promoted {
        epoch: i64,
        since: String,
    },
    /// `at`: when intake stopped (the event itself follows the last fenced write attempt).
    /// `fence_refused`: whether the store refused that write under `epoch` (`None` when it
    /// could not be asked).
    Demoted {
        epoch: i64,
        reason: DemoteReason,
        at: std::time::SystemTime,
        fence_refused: Option<bool>,
    },
}

enum Cmd {
    Record {
        event: String,
        detail: Value,
    },
    /// A journal write under this epoch was refused by the store's fence.
    Fenced(i64),
    Release(oneshot::Sender<()>),
}

/// The gateway's side of the driver.
#[derive(Clone)]
pub struct Handle {
    snapshot: watch::Receiver<Snapshot>,
    cmds: mpsc::UnboundedSender<Cmd>,
}

impl Handle {
    pub fn snapshot(&self) -> Snapshot {
        self.snapshot.borrow().clone()
    }

    pub fn is_active(&self) -> bool {
        self.snapshot.borrow().is_active_at(Instant::now())
    }

    /// Copies a lifecycle event to the store, fenced by our epoch (dropped while standby).
    pub fn record(&self, event: &str, detail: Value) {
        let _ = self.cmds.send(Cmd::Record { event: event.to_owned(), detail });
    }

    /// Reports that the store's fence refused a write under `epoch` (crates/cluster/src/store.rs):
    /// a newer epoch exists, so the driver demotes now instead of at its next renewal.
    pub fn fenced(&self, epoch: i64) {
        let _ = self.cmds.send(Cmd::Fenced(epoch));
    }

    /// Releases the lease (after the drain) and stops competing; waits at most `budget`.
    pub async fn release(&self, budget: Duration) {
        let (tx, rx) = oneshot::channel();
        if self.cmds.send(Cmd::Release(tx)).is_ok() {
            let _ = tokio::time::timeout(budget, rx).await;
        }
    }
}

/// Starts the driver task on the current tokio runtime.
pub fn spawn<B: LeaseBackend>(
    backend: B,
    name: &str,
    me: Holder,
    timing: Timing,
) -> (Handle, mpsc::UnboundedReceiver<Change>) {
    let (snap_tx, snap_rx) = watch::channel(Snapshot {
        name: name.to_owned(),
        role: RoleView::Standby,
        epoch: None,
        deadline: None,
        active: None,
        error: None,
    });
    let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
    let (change_tx, change_rx) = mpsc::unbounded_channel();
    let driver =
        Driver { backend, me, machine: Machine::new(timing, Instant::now()), snap: snap_tx, changes: change_tx };
    tokio::spawn(driver.run(cmd_rx));
    (Handle { snapshot: snap_rx, cmds: cmd_tx }, change_rx)
}

struct Driver<B> {
    backend: B,
    me: Holder,
    machine: Machine,
    snap: watch::Sender<Snapshot>,
    changes: mpsc::UnboundedSender<Change>,
}

impl<B: LeaseBackend> Driver<B> {
    async fn run(mut self, mut cmds: mpsc::UnboundedReceiver<Cmd>) {
        loop {
            let wake = tokio::time::Instant::from_std(self.machine.next_wakeup());
            tokio::select! {
                biased;
                cmd = cmds.recv() => match cmd {
                    None => return,
                    Some(Cmd::Release(ack)) => {
                        self.release().await;
                        let _ = ack.send(());
                        return;
                    }
                    Some(Cmd::Record { event, detail }) => {
                        self.record(&event, &detail).await;
                        continue;
                    }
                    Some(Cmd::Fenced(epoch)) => {
                        // Only for the epoch we still hold: a late report must not demote a
                        // newer term of ours.
                        if self.machine.active_epoch(Instant::now()) == Some(epoch) {
                            let action = self.machine.step(Input::Fenced, Instant::now());
                            self.act(action, Some(true)).await;
                        }
                        continue;
                    }
                },
                () = tokio::time::sleep_until(wake) => {}
            }
            let action = self.machine.tick(Instant::now());
            if action != Action::Nothing {
                self.act(action, None).await;
                continue;
            }
            let input = self.attempt().await;
            let action = self.machine.step(input, Instant::now());
            self.act(action, None).await;
        }
    }

    /// One acquisition (standby) or renewal (active), bounded by the machine's budget.
    async fn attempt(&mut self) -> Input {
        let now = Instant::now();
        let budget = self.machine.call_budget(now);
        let ttl = self.machine.timing.ttl;
        match self.machine.role {
            Role::Standby { .. } => {
                let r = timeout(budget, self.backend.acquire(&self.me, ttl)).await;
                let r = self.settle(r, budget);
                self.acquired(r, now)
            }
            Role::Active { epoch, .. } => {
                let r = timeout(budget, self.backend.renew(&self.me, epoch, ttl)).await;
                match self.settle(r, budget) {
                    Ok(true) => Input::Renewed { sent: now },
                    Ok(false) => Input::RenewRefused,
                    Err(_) => Input::Failed,
                }
            }
        }
    }

    fn acquired(&mut self, r: Result<Acquired, ClusterError>, sent: Instant) -> Input {
        match r {
            Ok(Acquired::Granted(g)) => {
                let holder = self.me.clone();
                self.snap.send_modify(|s| {
                    s.active = Some(ActiveInfo { epoch: g.epoch, holder, since: g.since, live: true });
                });
                Input::Acquired { epoch: g.epoch, sent }
            }
            Ok(Acquired::Held { current, expires_in }) => {
                self.snap.send_modify(|s| {
                    s.epoch = current.as_ref().map(|a| a.epoch);
                    s.active = current;
                });
                Input::Held { expires_in }
            }
            Err(_) => Input::Failed,
        }
    }

    /// The result of one store call run under `timeout`: a timeout forgets the connection
    /// (its state is unknown), and every error is shown in the snapshot.
    fn settle<T>(
        &mut self,
        r: Result<Result<T, ClusterError>, tokio::time::error::Elapsed>,
        budget: Duration,
    ) -> Result<T, ClusterError> {
        let r = r.unwrap_or_else(|_| {
            self.backend.reset();
            Err(ClusterError::Timeout(budget))
        });
        match &r {
            Err(e) => {
                let msg = e.to_string();
                self.snap.send_modify(|s| s.error = Some(msg));
            }
            Ok(_) => {
                if self.snap.borrow().error.is_some() {
                    self.snap.send_modify(|s| s.error = None);
                }
            }
        }
        r
    }

    async fn act(&mut self, action: Action, fence_refused: Option<bool>) {
        match action {
            Action::Nothing => {
                if let Role::Active { deadline, .. } = self.machine.role {
                    self.snap.send_modify(|s| s.deadline = Some(deadline));
                }
            }
            Action::Promote { epoch } => {
                let Role::Active { deadline, .. } = self.machine.role else { return };
                let since = self.snap.borrow().active.as_ref().map(|a| a.since.clone()).unwrap_or_default();
                self.snap.send_modify(|s| {
                    s.role = RoleView::Active;
                    s.epoch = Some(epoch);
                    s.deadline = Some(deadline);
                });
                let _ = self.changes.send(Change::Promoted { epoch, since });
            }
            Action::Demote { epoch, reason } => {
                // Intake stops first: readers see standby before anything else happens.
                let at = std::time::SystemTime::now();
                self.snap.send_modify(|s| {
                    s.role = RoleView::Standby;
                    s.deadline = None;
                    if let Some(a) = s.active.as_mut().filter(|a| a.epoch == epoch) {
                        a.live = false;
                    }
                });
                let fence_refused = match (fence_refused, reason) {
                    (Some(f), _) => Some(f),
                    (None, DemoteReason::Released) => None,
                    // Our last word under the old epoch: the store keeps it only if no newer
                    // epoch exists, which tells the ledger whether someone took over.
                    (None, _) => {
                        let detail = json!({"reason": reason.as_str()});
                        let r = timeout(LAST_WORDS, self.backend.record(&self.me, epoch, "demoted", &detail)).await;
                        match self.settle(r, LAST_WORDS) {
                            Ok(()) => Some(false),
                            Err(ClusterError::Fenced { .. }) => Some(true),
                            Err(_) => None,
                        }
                    }
                };
                let _ = self.changes.send(Change::Demoted { epoch, reason, at, fence_refused });
            }
        }
    }

    async fn record(&mut self, event: &str, detail: &Value) {
        let now = Instant::now();
        let Some(epoch) = self.machine.active_epoch(now) else { return };
        let budget = self.machine.call_budget(now);
        let r = timeout(budget, self.backend.record(&self.me, epoch, event, detail)).await;
        if let Err(ClusterError::Fenced { .. }) = self.settle(r, budget) {
            let action = self.machine.step(Input::Fenced, Instant::now());
            self.act(action, Some(true)).await;
        }
    }

    async fn release(&mut self) {
        let now = Instant::now();
        if let Some(epoch) = self.machine.active_epoch(now) {
            let detail = json!({"reason": "released"});
            let r = timeout(LAST_WORDS, self.backend.record(&self.me, epoch, "released", &detail)).await;
            let _ = self.settle(r, LAST_WORDS);
            let r = timeout(LAST_WORDS, self.backend.release(&self.me, epoch)).await;
            let _ = self.settle(r, LAST_WORDS);
            let action = self.machine.step(Input::Released, Instant::now());
            self.act(action, None).await;
        }
        self.snap.send_modify(|s| {
            s.role = RoleView::Stopped;
            s.deadline = None;
        });
    }
}
