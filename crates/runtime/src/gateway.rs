//! The running gateway's shared state, and the only code that writes its records: the pid
//! record, the state file, the ledger, the desired state on an operator's stop, and the exit.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Instant, SystemTime};

use gatewarden_control::{Requester, StatusReport};
use gatewarden_lifecycle::ledger::Ledger;
use gatewarden_lifecycle::marker::SelfIdentity;
use gatewarden_lifecycle::records::{GatewayState, PidRecord, StateRecord, read_pid_record};
use gatewarden_lifecycle::{Home, InstanceLock, Supervisor, fsio, timefmt};
use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedSender;

use crate::cause::{Asker, Cause, ControlKind, Outcome, RestartAnswer};
use crate::drain::{Phase, Runs};

/// Who this incarnation is.
#[derive(Debug, Clone)]
pub struct Incarnation {
    pub pid: u32,
    pub start_time: Option<u64>,
    pub id: String,
    pub argv: Vec<String>,
    pub started_at: SystemTime,
    pub started: Instant,
}

impl Incarnation {
    pub fn current(started_at: SystemTime, started: Instant) -> Incarnation {
        let pid = std::process::id();
        Incarnation {
            pid,
            start_time: gatewarden_lifecycle::platform::start_time(pid),
            id: new_incarnation_id(pid, started_at),
            argv: std::env::args_os().map(|a| a.to_string_lossy().into_owned()).collect(),
            started_at,
            started,
        }
    }
}

impl Incarnation {
    /// This process as `(pid, start time)`; `None` where the start time cannot be read.
    pub fn identity(&self) -> Option<gatewarden_lifecycle::ProcessIdentity> {
        self.start_time.map(|start_time| gatewarden_lifecycle::ProcessIdentity { pid: self.pid, start_time })
    }

    pub fn pid_record(&self, home: &str) -> PidRecord {
        PidRecord {
            pid: self.pid,
            kind: Some("gatewarden".into()),
            argv: self.argv.clone(),
            start_time: self.start_time,
            home: Some(home.to_owned()),
            incarnation: Some(self.id.clone()),
            version: Some(gatewarden_lifecycle::VERSION.into()),
            started_at: Some(timefmt::format(self.started_at)),
        }
    }

    fn ledger(&self, home: &Home) -> Ledger {
        Ledger::new(
            home.ledger(),
            gatewarden_lifecycle::ledger::Writer {
                pid: self.pid,
                start_time: self.start_time,
                incarnation: Some(self.id.clone()),
            },
        )
    }
}

/// Records a start-up refusal (exit `code`, `reason`) so `status` and `history` show the
/// latest truth: always in the ledger; in the state file only when the lock is free, i.e. no
/// gateway whose state file it is runs (the lock is taken for the write, then released).
pub fn record_refusal(home: &Home, me: &Incarnation, supervisor: Supervisor, code: i32, reason: &str) {
    let _ = me.ledger(home).append("start_refused", json!({"code": code, "reason": reason}));
    let Ok(_lock) = gatewarden_lifecycle::InstanceLock::try_acquire(&home.lock()) else { return };
    let s = StateRecord {
        record: me.pid_record(&home.dir().to_string_lossy()),
        gateway_state: GatewayState::Stopped,
        exit_reason: Some(reason.to_owned()),
        exit_code: Some(code),
        active_runs: 0,
        listen: None,
        control: None,
        supervisor: Some(supervisor.as_str().into()),
        updated_at: Some(timefmt::now()),
    };
    let _ = fsio::write_json(&home.state_file(), &s);
}

/// 16 hex digits from the OS-seeded keys of std's `RandomState`, mixed with pid and time.
fn new_incarnation_id(pid: u32, at: SystemTime) -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(pid);
    h.write_i128(timefmt::to_micros(at));
    format!("{:016x}", h.finish())
}

/// The incarnation's own state, shared by the HTTP server, the control server, the worker, the
/// platform host and the main loop (the parts that serve messages are in app.rs).
pub struct Gateway {
    pub home: Home,
    pub home_str: String,
    pub me: Incarnation,
    pub supervisor: Supervisor,
    /// Why detection chose `supervisor` (shown by `status` and `doctor`).
    pub supervisor_evidence: String,
    pub phase: Phase,
    pub runs: Arc<Runs>,
    pub ledger: Ledger,
    pub control: String,
    pub notifier: crate::sdnotify::Notifier,
    /// The lease driver's handle when `[cluster]` is configured (cluster.rs).
    pub cluster: OnceLock<gatewarden_cluster::Handle>,
    listen: OnceLock<String>,
    drain_budget: OnceLock<std::time::Duration>,
    listener: OnceLock<std::net::TcpListener>,
    handing_over: std::sync::atomic::AtomicBool,
    exit: Mutex<Option<(i32, String)>>,
    /// Open until the home lock is about to be released: a platform delivery commits under the
    /// read side, so every message this incarnation journaled is committed before its successor
    /// holds the lock and recovers the journal (a late commit would sit queued, unrun).
    intake: std::sync::RwLock<bool>,
    /// The main loop's inbox, once it runs (`serve`).
    causes: Mutex<Option<UnboundedSender<Cause>>>,
    /// The drain under way: runs when it began, and its deadline (the dashboard's progress).
    drain: Mutex<Option<(u64, SystemTime)>>,
    /// The prepared successor of a restart under way (restart.rs), watched by the drain.
    successor: Mutex<Option<crate::restart::Successor>>,
    /// The restart or stop this incarnation has taken on ([`Gateway::request_restart`]).
    leaving: Mutex<Option<Leaving>>,
}

/// The restart or stop an incarnation has taken on: the first restart or stop request it
/// accepted, or what the main loop decided on a signal or a marker. Later restart requests are
/// answered from it, so each gets the truth (issue 30, item 2).
#[derive(Debug, Clone)]
struct Leaving {
    restart: bool,
    /// A restart the main loop has carried out (its next incarnation proven, restart.rs): a
    /// request now joins it. Until then one is queued behind it and hears its own verdict.
    proven: bool,
    /// Who asked, as the ledger writes a requester (null for a signal).
    requester: Value,
    /// In words: "planned stop requested by pid 77 (gatewarden stop) via cli".
    reason: String,
}

impl Gateway {
    pub fn new(
        home: Home,
        me: Incarnation,
        detection: gatewarden_lifecycle::supervisor::Detection,
        control: String,
    ) -> Gateway {
        let home_str = home.dir().to_string_lossy().into_owned();
        let ledger = me.ledger(&home);
        Gateway {
            home,
            home_str,
            me,
            supervisor: detection.supervisor,
            supervisor_evidence: detection.evidence,
            phase: Phase::new(),
            runs: Arc::new(Runs::default()),
            ledger,
            control,
            notifier: crate::sdnotify::Notifier::for_supervisor(detection.supervisor),
            cluster: OnceLock::new(),
            listen: OnceLock::new(),
            drain_budget: OnceLock::new(),
            listener: OnceLock::new(),
            handing_over: std::sync::atomic::AtomicBool::new(false),
            exit: Mutex::new(None),
            intake: std::sync::RwLock::new(true),
            causes: Mutex::new(None),
            drain: Mutex::new(None),
            successor: Mutex::new(None),
            leaving: Mutex::new(None),
        }
    }

    /// The one way a restart is requested (control `restart`, chat and HTTP `/restart`): the
    /// answer is decided here, under the lock that orders requests, and every request leaves
    /// a ledger line. The first one is taken on (the main loop gets its cause, and writes its
    /// `restart_requested`); one that finds a restart under way joined it; one that finds a
    /// stop under way, or a stop the operator recorded that is on its way here, is refused
    /// naming that stop. Only a request taken on hands `asker` on: it hears the verdict once the
    /// next incarnation is proven (restart.rs); the others are answered here. `taken` runs
    /// before the main loop can see a request taken on.
    pub fn request_restart(&self, requester: &Requester, asker: Asker, taken: impl FnOnce()) -> RestartAnswer {
        let mut leaving = self.leaving.lock().unwrap_or_else(|p| p.into_inner());
        let who = json!(requester);
        match leaving.as_ref() {
            Some(l) if l.restart && l.proven => {
                self.record("restart_requested", json!({"requester": who, "reason": "restart", "joined": "restart"}));
                return RestartAnswer::Joined;
            }
            // Being proven: this one waits behind it; the main loop answers it (the drain, as
            // joined; after a refusal, with a verdict of its own) and writes its ledger line.
            Some(l) if l.restart => {}
            Some(l) => {
                self.record_refused_restart(&who, &l.reason, &l.requester);
                return RestartAnswer::Refused(l.reason.clone());
            }
            None => {
                let d = gatewarden_lifecycle::desired::current(self.home.dir());
                if d.want == gatewarden_lifecycle::desired::Want::Stopped {
                    let by = format!("stopped by {}", d.describe());
                    self.record_refused_restart(&who, &by, &json!({"pid": d.pid, "channel": d.requester}));
                    return RestartAnswer::Refused(by);
                }
                *leaving = Some(Leaving {
                    restart: true,
                    proven: false,
                    requester: who,
                    reason: format!("restart requested by {}", requester.describe()),
                });
                taken();
            }
        }
        self.send_cause(Cause::Control { kind: ControlKind::Restart, requester: requester.clone(), asker });
        RestartAnswer::Accepted
    }

    fn record_refused_restart(&self, who: &Value, why: &str, stop_requester: &Value) {
        let fields = json!({"requester": who, "reason": "restart", "joined": "stop", "stop": why,
                            "stop_requester": stop_requester});
        self.record("restart_requested", fields);
    }

    /// The one way a stop or takeover is requested (control `stop`, chat and HTTP `/stop`): an
    /// operator's stop is recorded as `stopped` first ([`Gateway::record_operator_stop`]), then
    /// the stop is what this incarnation does, and restart requests from now on are refused.
    /// `Err`: the stop goes on, but could not be recorded (said to the requester).
    pub fn request_stop(&self, kind: ControlKind, requester: &Requester) -> Result<(), String> {
        let mut leaving = self.leaving.lock().unwrap_or_else(|p| p.into_inner());
        let recorded = match kind {
            ControlKind::Stop => self.record_operator_stop(&requester.channel).map(|_| ()),
            _ => Ok(()),
        };
        // The first stop stays the one named; a stop during a restart's drain replaces it.
        if leaving.as_ref().is_none_or(|l| l.restart) {
            let what = if kind == ControlKind::Takeover { "takeover" } else { "planned stop" };
            *leaving = Some(Leaving {
                restart: false,
                proven: false,
                requester: json!(requester),
                reason: format!("{what} requested by {}", requester.describe()),
            });
        }
        self.send_cause(Cause::Control { kind, requester: requester.clone(), asker: Asker::Nobody });
        recorded
    }

    /// The main loop decided how this incarnation ends (`o`): restart requests from now on are
    /// answered from it. A request taken on already says the same (with its requester), and a
    /// stop requested meanwhile stays: it is recorded as the operator's, so nothing restarts.
    pub fn commit(&self, o: &Outcome) {
        let restart = o.intent == gatewarden_lifecycle::ExitIntent::PlannedRestart;
        let mut leaving = self.leaving.lock().unwrap_or_else(|p| p.into_inner());
        match leaving.as_mut() {
            Some(l) if l.restart && restart => l.proven = true,
            Some(l) if !l.restart => {}
            _ => *leaving = Some(Leaving { restart, proven: true, requester: Value::Null, reason: o.reason.clone() }),
        }
    }

    /// The restart taken on did not start (refused, or no successor) or its drain was
    /// cancelled: the incarnation runs on, and the next restart request is taken on afresh.
    pub fn stand_down(&self) {
        let mut leaving = self.leaving.lock().unwrap_or_else(|p| p.into_inner());
        if leaving.as_ref().is_some_and(|l| l.restart) {
            *leaving = None;
        }
    }

    /// A restart request taken on whose cause reached the main loop only after it had decided
    /// (a restart being proven, or a signal or a marker came first): the ledger says what
    /// became of it, and the answer is what its requester is told.
    pub fn record_superseded_restart(&self, requester: &Requester) -> RestartAnswer {
        let leaving = self.leaving.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut fields = json!({"requester": requester, "reason": "restart", "joined": "restart", "superseded": true});
        let answer = match leaving.filter(|l| !l.restart) {
            Some(l) => {
                fields["joined"] = json!("stop");
                fields["stop"] = json!(l.reason);
                fields["stop_requester"] = l.requester;
                RestartAnswer::Refused(l.reason)
            }
            None => RestartAnswer::Joined,
        };
        self.record("restart_requested", fields);
        answer
    }

    /// Keeps the prepared successor of this restart, for [`Gateway::successor_gone`].
    pub fn watch_successor(&self, s: crate::restart::Successor) {
        *self.successor.lock().unwrap_or_else(|p| p.into_inner()) = Some(s);
    }

    /// The prepared successor ended before it took over (reaped here, it is our child): how,
    /// once. `None` while it lives, or when there is none.
    pub fn successor_gone(&self) -> Option<String> {
        let mut g = self.successor.lock().unwrap_or_else(|p| p.into_inner());
        let status = g.as_mut()?.child.try_wait().ok()??;
        *g = None;
        Some(format!("the prepared successor exited ({status}) before it took over"))
    }

    /// Remembers a drain's start: `runs` active then, ending by `deadline`.
    pub fn set_drain(&self, runs: u64, deadline: SystemTime) {
        *self.drain.lock().unwrap_or_else(|p| p.into_inner()) = Some((runs, deadline));
    }

    /// A cancelled drain is over.
    pub fn end_drain(&self) {
        *self.drain.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// The drain under way, if any: runs at its start and its deadline.
    pub fn drain_info(&self) -> Option<(u64, SystemTime)> {
        *self.drain.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Connects chat commands and the adapters' role task to the main loop.
    pub fn set_causes(&self, tx: UnboundedSender<Cause>) {
        *self.causes.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx);
    }

    /// Hands a cause to the main loop (a command's follow-up, after its reply is on its way).
    pub fn send_cause(&self, cause: Cause) {
        if let Some(tx) = self.causes.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            let _ = tx.send(cause);
        }
    }

    /// Runs `f` unless the intake is sealed ([`Gateway::seal_intake`]); `None` when sealed.
    pub fn with_intake<R>(&self, f: impl FnOnce() -> R) -> Option<R> {
        let open = self.intake.read().unwrap_or_else(|p| p.into_inner());
        open.then(f)
    }

    /// Closes the intake for good, waiting for deliveries in progress to commit. Called just
    /// before the home lock is released.
    pub fn seal_intake(&self) {
        *self.intake.write().unwrap_or_else(|p| p.into_inner()) = false;
    }

    pub fn self_identity(&self) -> SelfIdentity {
        SelfIdentity {
            pid: self.me.pid,
            start_time: self.me.start_time,
            home: self.home_str.clone(),
            started_at: self.me.started_at,
        }
    }

    pub fn set_listen(&self, addr: String) {
        let _ = self.listen.set(addr);
    }

    /// The drain budget, published in status so a restarting CLI can tell a slow drain from a
    /// wedged one.
    pub fn set_drain_budget(&self, d: std::time::Duration) {
        let _ = self.drain_budget.set(d);
    }

    /// Keeps a duplicate of the HTTP listener for handing over to a successor.
    pub fn keep_listener(&self, l: std::net::TcpListener) {
        let _ = self.listener.set(l);
    }

    pub fn kept_listener(&self) -> Option<&std::net::TcpListener> {
        self.listener.get()
    }

    /// Marks that a successor holds our listener: stop accepting as soon as the drain starts.
    pub fn set_handing_over(&self) {
        self.handing_over.store(true, std::sync::atomic::Ordering::Release);
    }

    /// A cancelled drain: the listener stays ours.
    pub fn stop_handing_over(&self) {
        self.handing_over.store(false, std::sync::atomic::Ordering::Release);
    }

    pub fn handing_over(&self) -> bool {
        self.handing_over.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Whether a new sync run is taken: while `running`, and for the rest of a hand-over. A
    /// request that arrives on a connection we already hold cannot reach the successor, so it
    /// is served (the drain waits for it; the response sends the client to the successor)
    /// instead of getting 503. Without a successor, `draining` answers 503 (protocol.md §5).
    pub fn accepts_work(&self) -> bool {
        match self.phase.get() {
            GatewayState::Running => true,
            GatewayState::Draining | GatewayState::Stopping => self.handing_over(),
            _ => false,
        }
    }

    /// The cluster's active (always, without `[cluster]`): may take intake and run work.
    pub fn is_active(&self) -> bool {
        self.cluster.get().is_none_or(gatewarden_cluster::Handle::is_active)
    }

    /// The longest a platform long poll may last (it cannot be fenced; crates/cluster/README.md,
    /// cluster): `None` without `[cluster]`, the lease time left while active, zero on a standby.
    pub fn poll_budget(&self) -> Option<std::time::Duration> {
        let c = self.cluster.get()?;
        Some(c.snapshot().lease_left(std::time::Instant::now()).unwrap_or_default())
    }

    pub fn listen(&self) -> Option<&str> {
        self.listen.get().map(String::as_str)
    }

    pub fn pid_record(&self) -> PidRecord {
        self.me.pid_record(&self.home_str)
    }

    /// Appends to the ledger; a full disk must not stop the gateway, so failures are logged.
    pub fn record(&self, event: &str, fields: Value) {
        // A fenced copy for the cluster's store (dropped while standby).
        if let Some(c) = self.cluster.get() {
            c.record(event, fields.clone());
        }
        if let Err(e) = self.ledger.append(event, fields) {
            crate::warn!("cannot append to {}: {e}", self.ledger.path().display());
        }
    }

    /// Writes `gateway_state.json` from the current phase.
    pub fn write_state(&self) {
        let exit = self.exit.lock().map(|g| g.clone()).unwrap_or(None);
        let s = StateRecord {
            record: self.pid_record(),
            gateway_state: self.phase.get(),
            exit_reason: exit.as_ref().map(|e| e.1.clone()),
            exit_code: exit.map(|e| e.0),
            active_runs: self.runs.active(),
            listen: self.listen().map(str::to_owned),
            control: Some(self.control.clone()),
            supervisor: Some(self.supervisor.as_str().into()),
            updated_at: Some(timefmt::now()),
        };
        if let Err(e) = fsio::write_json(&self.home.state_file(), &s) {
            crate::warn!("cannot write {}: {e}", self.home.state_file().display());
        }
    }

    /// Publishes `gateway.pid` (and the same record as the lock file's content) once the lock
    /// is held.
    pub fn publish_pid_record(&self, lock: &mut InstanceLock) -> Result<(), String> {
        let record = self.pid_record();
        fsio::write_json(&self.home.pid_file(), &record)
            .map_err(|e| format!("cannot write {}: {e}", self.home.pid_file().display()))?;
        let _ = lock.write_content(&serde_json::to_vec(&record).unwrap_or_default());
        Ok(())
    }

    /// The exit's records, in order: the final state, our pid record gone, `unbind` (the
    /// control endpoint), the intake sealed (deliveries in progress committed), and last the
    /// ledger's `exited`: after it the process only releases the lock (the caller does) and
    /// ends, so the line is the incarnation's last word (issue 30, item 5).
    pub fn finish(&self, o: &Outcome, unbind: impl FnOnce()) {
        let code = i32::from(o.intent.code());
        self.set_exit(code, &o.reason);
        if !self.advance(GatewayState::Stopped) {
            self.write_state();
        }
        if read_pid_record(&self.home.pid_file()).ok().is_some_and(|r| r.pid == self.me.pid) {
            let _ = fsio::remove_if_exists(&self.home.pid_file());
        }
        unbind();
        // After this, a delivery is refused (the platform keeps it for the successor) instead of
        // being journaled behind the successor's recovery.
        self.seal_intake();
        self.record("exited", json!({"code": code, "intent": o.intent.as_str(), "reason": o.reason}));
    }

    /// An operator's stop that did not come through `gatewarden stop` (which records it itself
    /// before anything else): chat `/stop`, `gatewarden send /stop`, HTTP. Recorded as
    /// `stopped` on receipt (control/mod.rs, worker/commands.rs) — a gateway already draining for a
    /// restart never classifies it — so no backstop or successor starts the gateway again; in
    /// flight while this incarnation lives, so a `start` meanwhile waits for it to end
    /// (ops launch.rs). A stop from a restart's recovery, a supervisor or a signal is not the
    /// operator's intent: no change (`Ok(None)`). `Err`: it could not be recorded (a full disk
    /// past the space reserved for it), so a restart under way may start a gateway again.
    pub fn record_operator_stop(&self, channel: &str) -> Result<Option<u64>, String> {
        use gatewarden_lifecycle::desired::{self, Want};
        if !matches!(channel, "chat" | "cli-send" | "http") {
            return Ok(None);
        }
        match desired::record_if(self.home.dir(), Want::Stopped, channel, true, Some(SystemTime::now()), |d| {
            d.want != Want::Stopped
        }) {
            Ok((d, _)) => Ok(Some(d.seq)),
            Err(e) => {
                crate::warn!("cannot record the desired state: {e}");
                Err(format!("the stop is not recorded ({e}): a restart under way may start the gateway again"))
            }
        }
    }

    /// Moves to `to`, publishing it to the state file and the ledger.
    pub fn advance(&self, to: GatewayState) -> bool {
        if !self.phase.advance(to) {
            return false;
        }
        self.write_state();
        self.record("state", json!({"state": to.as_str(), "active_runs": self.runs.active()}));
        self.notify(to);
        true
    }

    /// Becomes `running` with the ledger told first: `state` and `ready` (with the bound
    /// address) are on record before `/readyz`, the state file or the service manager can say
    /// so, so a gateway killed the moment a client saw it ready still has its address on
    /// record, and a recovery start listens there (crates/ops/src/previous.rs). False when a
    /// stop got in first: its own lines follow.
    pub fn become_ready(&self, ready: Value) -> bool {
        let to = GatewayState::Running;
        if !crate::drain::allowed(self.phase.get(), to) {
            return false;
        }
        self.record("state", json!({"state": to.as_str(), "active_runs": self.runs.active()}));
        self.record("ready", ready);
        if !self.phase.advance(to) {
            return false;
        }
        self.write_state();
        self.notify(to);
        true
    }

    /// Tells the service manager (sd_notify) about a move to `to`.
    fn notify(&self, to: GatewayState) {
        if self.notifier.enabled() {
            let msg = match to {
                GatewayState::Running => format!("READY=1\nSTATUS=running, incarnation {}", self.me.id),
                GatewayState::Draining => format!("STOPPING=1\nSTATUS=draining {} active run(s)", self.runs.active()),
                other => format!("STATUS={other}"),
            };
            self.notifier.send(&msg);
        }
    }

    /// Remembers how this incarnation is ending, for the final state write.
    pub fn set_exit(&self, code: i32, reason: &str) {
        if let Ok(mut g) = self.exit.lock() {
            *g = Some((code, reason.to_owned()));
        }
    }

    /// The incarnation's part of `status`; app.rs adds the agent, platforms and cluster.
    pub fn status(&self) -> StatusReport {
        let mut files = std::collections::BTreeMap::new();
        files.insert("pid".into(), "ok".into());
        files.insert("state".into(), "ok".into());
        let mut extra = std::collections::BTreeMap::new();
        extra.insert("supervisor_evidence".to_owned(), json!(self.supervisor_evidence));
        extra.insert("drain_timeout_s".to_owned(), json!(self.drain_budget.get().map(|d| d.as_secs())));
        StatusReport {
            running: true,
            pid: Some(self.me.pid),
            start_time: self.me.start_time,
            incarnation: Some(self.me.id.clone()),
            version: Some(gatewarden_lifecycle::VERSION.into()),
            state: Some(self.phase.get().as_str().into()),
            home: self.home_str.clone(),
            listen: self.listen().map(str::to_owned),
            uptime_s: Some((self.me.started.elapsed().as_millis() as f64) / 1000.0),
            supervisor: Some(self.supervisor.as_str().into()),
            active_runs: Some(self.runs.active()),
            control: Some(self.control.clone()),
            providers: None,
            files,
            extra,
        }
    }
}
