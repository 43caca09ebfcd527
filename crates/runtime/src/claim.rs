//! Taking the home before anything is served: the lock (or the home from its holder with
//! `--replace`, or a successor's wait for its predecessor's lock), the desired state checked
//! with the lock held, and what a dead incarnation left (its runs' processes, their scratch
//! folders). Start-up refusals are recorded here too.

use std::time::Duration;

use gatewarden_lifecycle::heal::heal_stale;
use gatewarden_lifecycle::records::read_pid_record;
use gatewarden_lifecycle::{ExitIntent, Home, InstanceLock, LockError, Supervisor};
use serde_json::json;

use crate::cause::Outcome;
use crate::gateway::{self, Gateway, Incarnation};
use crate::options::{RUN_TAG, ResolvedOptions, run_tag};
use crate::signals::Signals;
use crate::{info, takeover, warn};

/// How long a starting gateway waits out lock probes by `status`/`stop` before deciding that
/// another instance runs.
const LOCK_PATIENCE: Duration = Duration::from_millis(300);
/// How much longer than the drain budget a successor waits for its predecessor's lock.
const SUCCESSOR_GRACE: Duration = Duration::from_secs(30);
/// How often a waiting successor looks whether its restart was cancelled.
const SUCCESSOR_LOOK: Duration = Duration::from_millis(200);

/// A start-up refusal, recorded before it is returned (`gateway::record_refusal`).
pub(crate) fn refused(home: &Home, me: &Incarnation, supervisor: Supervisor, o: Outcome) -> Outcome {
    gateway::record_refusal(home, me, supervisor, i32::from(o.intent.code()), &o.reason);
    o
}

/// Kills what agent runs of a dead incarnation of this home left behind (a kill -9 of the
/// gateway does not reach its runs' process groups). Called with the lock held, so every other
/// incarnation of this home is dead; before the journal is recovered, so a re-run never races
/// its predecessor.
pub(crate) fn sweep_orphan_runs(gw: &Gateway) {
    let mine = run_tag(&gw.home, &gw.me.id);
    let prefix = mine.split(':').next().unwrap_or_default().to_owned() + ":";
    let killed = gatewarden_lifecycle::platform::kill_tagged(RUN_TAG, &|v| v.starts_with(&prefix) && v != mine);
    if !killed.is_empty() {
        warn!("killed {} process(es) left by agent runs of a previous incarnation: {killed:?}", killed.len());
        gw.record("orphan_runs_killed", json!({"pids": killed}));
    }
}

/// Removes the runs' scratch folders (`<home>/runs/<incarnation>/`, the exec backend's history
/// files): of `only` that incarnation (this one, at its end), else of every incarnation but a
/// live one (at start, with the lock held: what a killed predecessor left). Never through a
/// link (`remove_dir_all` does not follow them).
pub(crate) fn sweep_run_scratch(home: &Home, only: Option<&str>) {
    let runs = home.runs_dir();
    let Ok(entries) = std::fs::read_dir(&runs) else { return };
    for e in entries.flatten() {
        if only.is_some_and(|id| e.file_name() != id) {
            continue;
        }
        if let Err(err) = std::fs::remove_dir_all(e.path()) {
            warn!("cannot remove {}: {err}", e.path().display());
        }
    }
}

/// The desired state (`gatewarden_lifecycle::desired`), with the lock held. A foreground `run`
/// without a sequence is the operator's own start and records `run` (on the `first` check);
/// everything else — `start`'s child, a successor, a systemd or launchd launch — carries out an
/// earlier request and exits before it is ready (planned stop, exit 0: no manager retries it)
/// when the operator stopped the gateway since.
pub(crate) fn obey_desired(gw: &Gateway, opts: &ResolvedOptions, first: bool) -> Result<(), Outcome> {
    use gatewarden_lifecycle::desired::{self, Starter, Want};
    // `external` (s6, runit, PM2) is started by the operator's own tooling, which `gatewarden
    // start` cannot drive; `supervise` passes a sequence. systemd and launchd obey.
    let operator = opts.desired_seq.is_none()
        && !opts.successor
        && matches!(gw.supervisor, Supervisor::None | Supervisor::Container | Supervisor::External);
    if operator && first {
        if let Err(e) = desired::record(gw.home.dir(), Want::Run, "cli run", false) {
            warn!("cannot record the desired state: {e}");
        }
        return Ok(());
    }
    let starter = opts.desired_seq.map_or(Starter::Resume, |basis| Starter::Carry { basis });
    desired::check(gw.home.dir(), starter).map(|_| ()).map_err(|r| not_starting(gw, opts, &r))
}

/// A start the desired state refused: recorded, told to systemd, and a clean exit.
pub(crate) fn not_starting(
    gw: &Gateway,
    opts: &ResolvedOptions,
    r: &gatewarden_lifecycle::desired::Refusal,
) -> Outcome {
    let by = match (opts.successor, opts.desired_seq) {
        (true, _) => "successor",
        (false, Some(_)) => "start",
        (false, None) => gw.supervisor.as_str(),
    };
    let mut v = r.json();
    v["by"] = json!(by);
    v["basis"] = json!(opts.desired_seq);
    gw.record("start_prevented", v);
    info!("not starting: {}", r.describe());
    // Under systemd a main process that exits before READY=1 is a failed start ("protocol"),
    // which Restart=on-failure repeats: this start ends cleanly instead, and says why.
    gw.notifier.send(&format!("READY=1\nSTATUS=not starting: {}", r.describe()));
    Outcome::new(ExitIntent::PlannedStop, format!("start prevented: {}", r.describe()))
}

/// Takes the lock, or the home from its current holder with `--replace`.
pub(crate) fn claim(
    gw: &Gateway,
    opts: &ResolvedOptions,
    signals: Option<&mut Signals>,
) -> Result<InstanceLock, Outcome> {
    let home = &gw.home;
    let acquired = match opts.successor {
        true => await_predecessor(gw, opts, opts.drain_timeout + SUCCESSOR_GRACE, signals)?,
        false => InstanceLock::acquire(&home.lock(), LOCK_PATIENCE),
    };
    match acquired {
        Ok(l) => Ok(l),
        Err(LockError::Held { .. }) if opts.replace => takeover::take_over(home, opts.takeover_timeout, &gw.ledger)
            .map_err(|e| Outcome::new(ExitIntent::FatalConfig, e)),
        Err(LockError::Held { .. }) => Err(Outcome::new(ExitIntent::FatalConfig, describe_holder(home))),
        Err(e) => Err(Outcome::new(ExitIntent::FatalConfig, e.to_string())),
    }
}

/// A successor waits for its predecessor's lock through the drain, looking at the desired state
/// between tries: a drain cancelled since the restart's sequence (`--desired-seq`;
/// `desired::Refusal::Cancelled`) keeps the predecessor, and this process stands down at once
/// instead of waiting out its patience. A stop or restart signal sent to it meanwhile ends the
/// wait (unexpected, as during any start-up).
fn await_predecessor(
    gw: &Gateway,
    opts: &ResolvedOptions,
    patience: Duration,
    mut signals: Option<&mut Signals>,
) -> Result<Result<InstanceLock, LockError>, Outcome> {
    use gatewarden_lifecycle::desired::{self, Refusal, Starter};
    let deadline = std::time::Instant::now() + patience;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match InstanceLock::acquire(&gw.home.lock(), left.min(SUCCESSOR_LOOK)) {
            Err(LockError::Held { .. }) if !left.is_zero() => {}
            other => return Ok(other),
        }
        if let Some(basis) = opts.desired_seq
            && let Err(r @ Refusal::Cancelled(_)) = desired::check(gw.home.dir(), Starter::Carry { basis })
        {
            return Err(not_starting(gw, opts, &r));
        }
        if let Some(sig) = signals.as_deref_mut().and_then(Signals::take_ending) {
            let why = format!("{} while waiting for the predecessor's lock", sig.describe());
            return Err(Outcome::new(ExitIntent::Unexpected, why));
        }
    }
}

fn describe_holder(home: &Home) -> String {
    let who = match read_pid_record(&home.pid_file()).ok() {
        Some(r) => format!(
            "pid {}{}{}",
            r.pid,
            r.start_time.map(|t| format!(", start {t}")).unwrap_or_default(),
            r.started_at.map(|t| format!(", started {t}")).unwrap_or_default()
        ),
        None => "a process whose gateway.pid is not readable yet".into(),
    };
    format!(
        "another gateway already runs in {} ({who}); use `gatewarden stop` first or `gatewarden run --replace`",
        home.dir().display()
    )
}

/// With the lock held: stale state healed, what a dead incarnation's runs left swept,
/// `gateway.pid` and the state file published, and `started` recorded.
pub(crate) fn publish_start(gw: &Gateway, lock: &mut InstanceLock) -> Result<(), Outcome> {
    let healed = heal_stale(&gw.home, lock, "run", Some(&gw.self_identity()), &[]);
    if !healed.is_empty() {
        info!("cleaned stale state: {}", healed.join(", "));
    }
    sweep_orphan_runs(gw);
    sweep_run_scratch(&gw.home, None);
    if let Err(e) = gw.publish_pid_record(lock) {
        return Err(Outcome::new(ExitIntent::FatalConfig, e));
    }
    gw.write_state();
    gw.record(
        "started",
        json!({"argv": gw.me.argv, "home": gw.home_str, "supervisor": gw.supervisor.as_str(), "version": gatewarden_lifecycle::VERSION}),
    );
    info!(
        "gateway {} starting in {} (pid {}, supervisor {}: {})",
        gw.me.id,
        gw.home_str,
        gw.me.pid,
        gw.supervisor.as_str(),
        gw.supervisor_evidence
    );
    Ok(())
}
