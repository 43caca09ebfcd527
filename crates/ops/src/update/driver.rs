//! The update transaction's driver: carries out each [`Action`] the machine (`machine.rs`)
//! decides, with the edges (`fetch.rs`, `verify.rs`, `swap.rs`, `run.rs`, `candidates.rs`,
//! the restart ladder), and reports what came of it as an [`Observation`]. It decides nothing
//! itself beyond the wording of what it says.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use gatewarden_control::{Endpoint, StatusReport};
use gatewarden_lifecycle::desired::{self, Refusal, Starter};
use gatewarden_lifecycle::ledger::{Ledger, Writer};
use gatewarden_lifecycle::{Home, VERSION, fsio, overlap, timefmt};
use serde_json::json;

use super::machine::{Action, Back, Gateway, Install, Last, Look, Observation, Onto, Probe, Transaction, Verdict};
use super::{PAUSE_ENV, POLL, Phase, Txn, UPDATE_FILE, archive, candidates, fetch, notify_chat, requester, run, swap};
use super::{stopped, verify};
use crate::ladder::restart_verified;
use crate::options::UpdateArgs;
use crate::ready::status_of;
use crate::release::{copy_executable, refresh_good_copy, release_path, sha256_file};

/// Which command the transaction serves (the wording of its outcome).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Install,
    Resume,
    ByHand,
}

/// What one transaction has learned and made so far.
struct Work<'a> {
    route: Route,
    t: Txn,
    args: Option<&'a UpdateArgs>,
    public_key: Option<String>,
    ca_file: Option<PathBuf>,
    fetched: Vec<u8>,
    /// The gateway log since the transaction started, read when a rollback begins.
    tail: Option<String>,
    /// When the rollback began.
    detected: Instant,
    /// `update --rollback`: the desired state's sequence before its restart.
    basis: u64,
}

pub(super) struct Updater<'h> {
    pub(super) home: &'h Home,
    pub(super) ledger: Ledger,
    timeout_s: u64,
    json: bool,
    t0: Instant,
    /// The chat that asked (`/update`) and its adapter, told about refusals too.
    pub(super) chat: Option<(String, Option<String>)>,
    /// Progress goes to stderr though this updater prints no JSON (a leftover transaction
    /// finished before an `update --json`, whose stdout is the one JSON outcome).
    pub(super) text_to_stderr: bool,
    /// When the executable was last swapped (either way), for [`Updater::restart_onto_swap`].
    swapped: std::cell::Cell<Option<Instant>>,
}

fn gateway(s: &StatusReport) -> Gateway {
    Gateway { incarnation: s.incarnation.clone(), version: s.version.clone(), state: s.state.clone(), pid: s.pid }
}

impl<'h> Updater<'h> {
    pub(super) fn new(home: &'h Home, timeout_s: u64, json: bool) -> Updater<'h> {
        Updater {
            home,
            ledger: Ledger::new(home.ledger(), Writer::current()),
            timeout_s,
            json,
            t0: Instant::now(),
            chat: None,
            text_to_stderr: false,
            swapped: std::cell::Cell::new(None),
        }
    }

    fn work<'a>(&self, route: Route, t: Txn, args: Option<&'a UpdateArgs>) -> Work<'a> {
        Work {
            route,
            t,
            args,
            public_key: None,
            ca_file: None,
            fetched: Vec::new(),
            tail: None,
            detected: Instant::now(),
            basis: 0,
        }
    }

    /// `update --from`.
    pub(super) fn install(&self, args: &UpdateArgs) -> crate::Result<ExitCode> {
        use crate::Context;
        let Some(from) = args.from.as_deref() else { crate::bail!("--from is required") };
        let target = crate::owner::current_exe().context("cannot locate this executable")?;
        let t = Txn {
            from: VERSION.into(),
            to: String::new(),
            phase: Phase::Swapping,
            started: String::new(),
            target,
            staged: PathBuf::new(),
            previous: PathBuf::new(),
            from_sha256: String::new(),
            to_sha256: String::new(),
            updater_pid: std::process::id(),
            chat: args.chat.clone(),
            platform: args.chat.as_ref().and(args.chat_platform.clone()),
            reason: None,
            incarnation: None,
            finished: None,
            elapsed_ms: None,
        };
        let request = Install {
            running: VERSION.into(),
            url: fetch::is_url(from),
            sha256: args.sha256.is_some(),
            may_downgrade: args.allow_downgrade && args.chat.is_none(),
        };
        let mut w = self.work(Route::Install, t, Some(args));
        Ok(self.drive(Transaction::install(request), &mut w))
    }

    /// Finishes a transaction whose updater died (module doc).
    pub(super) fn resume(&self, t: Txn) -> ExitCode {
        let _ = self.ledger.append("update_resumed", json!({"phase": t.phase, "from": t.from, "to": t.to}));
        errln!("finishing the update {} → {} left {:?} by pid {}", t.from, t.to, t.phase, t.updater_pid);
        let new_on_disk = sha256_file(&t.target).ok().as_deref() == Some(t.to_sha256.as_str());
        let m = Transaction::resume(t.phase, &t.from, &t.to, new_on_disk, t.reason.as_deref());
        let mut w = self.work(Route::Resume, t, None);
        self.drive(m, &mut w)
    }

    /// `update --rollback`: the last update's previous binary back in place, verified running.
    pub(super) fn rollback_by_hand(&self) -> ExitCode {
        let t = super::read_txn(self.home);
        let last = t.as_ref().map(|t| Last {
            phase: t.phase,
            from: t.from.clone(),
            to: t.to.clone(),
            previous: t.previous.clone(),
            previous_kept: t.previous.is_file(),
        });
        let m = Transaction::rollback_by_hand(&self.home.dir().display().to_string(), last.as_ref());
        let Some(mut t) = t else { return self.conclude(&m.1, &mut self.work(Route::ByHand, empty_txn(), None)) };
        t.chat = None;
        if !m.1.is_final() {
            self.say(&format!("rolling back {} → {}", t.to, t.from));
        }
        let mut w = self.work(Route::ByHand, t, None);
        self.drive(m, &mut w)
    }

    fn drive(&self, (mut m, mut action): (Transaction, Action), w: &mut Work) -> ExitCode {
        while !action.is_final() {
            let obs = self.perform(&action, w);
            action = m.step(obs);
            if w.route == Route::Install && w.t.to.is_empty() {
                w.t.to = m.to().to_owned();
            }
        }
        self.conclude(&action, w)
    }

    fn perform(&self, action: &Action, w: &mut Work) -> Observation {
        let done = |r: Result<(), String>| r.map_or_else(Observation::Failed, |()| Observation::Done);
        match action {
            Action::Check => self.check(w),
            Action::Fetch => match fetch::fetch(self.source(w), w.ca_file.as_deref()) {
                Ok(bytes) => {
                    w.fetched = bytes;
                    Observation::Done
                }
                Err(why) => Observation::Failed(why),
            },
            Action::Verify => done(self.verify(w)),
            Action::Stage => match self.stage(w) {
                Ok(version) => Observation::Staged { version },
                Err(why) => Observation::Failed(why),
            },
            Action::Preflight { version } => self.preflight(version, w),
            Action::KeepPrevious => done(self.keep_previous(&mut w.t)),
            Action::Record => self.record(&mut w.t),
            Action::AwaitRestartUnderWay => {
                self.await_restart_under_way();
                if w.route == Route::ByHand {
                    // What a cancelled drain is told from: operator requests after this one.
                    w.basis = desired::current(self.home.dir()).seq;
                }
                Observation::Done
            }
            Action::SwapIn => self.swap_in(w),
            Action::PutBackIfChanged => {
                let t = &w.t;
                if sha256_file(&t.target).ok().as_deref() != Some(t.from_sha256.as_str()) {
                    let _ = swap::swap_in(&t.previous, &t.target);
                }
                Observation::Done
            }
            Action::Restart { onto } => self.restart(*onto, &mut w.t),
            Action::Probation { gateway } => done(self.probation(&w.t, gateway)),
            Action::CheckStop | Action::MayStart => {
                let refused = match action {
                    Action::CheckStop => stopped(self.home),
                    _ => crate::intent::may_start(self.home, "rollback", Starter::Resume).err(),
                };
                refused.map_or(Observation::Done, |r| Observation::Refused(r.describe()))
            }
            Action::BeginRollBack { .. }
            | Action::ClearCandidates
            | Action::SwapBack
            | Action::LookAtGateway { .. }
            | Action::AwaitRunning
            | Action::CheckCancelled => self.perform_way_back(action, w),
            // Final actions are concluded, not performed.
            Action::Refuse { .. }
            | Action::Unchanged { .. }
            | Action::Commit { .. }
            | Action::RolledBack { .. }
            | Action::RollbackFailed { .. }
            | Action::End { .. } => Observation::Done,
        }
    }

    /// The way back's actions.
    fn perform_way_back(&self, action: &Action, w: &mut Work) -> Observation {
        let ep = || Endpoint::for_home(self.home.dir());
        match action {
            Action::BeginRollBack { why } => {
                errln!("update to {} failed: {why}; rolling back to {}", w.t.to, w.t.from);
                w.tail = Some(log_tail(self.home, &w.t.started, 20));
                w.t.phase = Phase::RollingBack;
                w.t.reason = Some(why.clone());
                self.save(&w.t);
                w.detected = Instant::now();
                Observation::Done
            }
            Action::ClearCandidates => {
                candidates::kill_unready(self.home, &self.ledger, &w.t);
                // A gateway that answers is restarted by the ladder (drained, not killed).
                let answering = status_of(&ep(), Duration::from_millis(500)).ok();
                candidates::end(self.home, &self.ledger, &w.t, answering.and_then(|s| s.pid));
                Observation::Done
            }
            Action::SwapBack => match swap::swap_in(&w.t.previous, &w.t.target) {
                Ok(()) => {
                    self.swapped.set(Some(Instant::now()));
                    Observation::Done
                }
                Err(e) => Observation::Failed(e.to_string()),
            },
            Action::LookAtGateway { patience } => match status_of(&ep(), *patience) {
                Ok(s) => Observation::Running(gateway(&s)),
                Err(_) => Observation::NoAnswer,
            },
            Action::AwaitRunning => self.await_running(),
            Action::CheckCancelled => match desired::check(self.home.dir(), Starter::Carry { basis: w.basis }) {
                Err(r @ Refusal::Cancelled(_)) => Observation::Refused(r.describe()),
                _ => Observation::Done,
            },
            _ => Observation::Done,
        }
    }

    fn preflight(&self, version: &str, w: &Work) -> Observation {
        self.say(&format!("staged gatewarden {version} ({})", w.t.staged.display()));
        let notes = match run::preflight(self.home, &w.t.staged, &w.t.target) {
            Ok(notes) => notes,
            Err(why) => return Observation::Failed(why),
        };
        self.say("preflight passed");
        // What the new version changes for this home (its `check` names it: a new default).
        for n in notes {
            self.say(&format!("  {n}"));
        }
        Observation::Done
    }

    fn record(&self, t: &mut Txn) -> Observation {
        t.started = timefmt::now();
        self.save(t);
        let _ = self.ledger.append(
            "update_started",
            json!({"from": t.from, "to": t.to, "target": t.target, "sha256": t.to_sha256, "chat": t.chat}),
        );
        Observation::Done
    }

    fn swap_in(&self, w: &mut Work) -> Observation {
        if let Err(e) = swap::swap_in(&w.t.staged, &w.t.target) {
            return Observation::Failed(e.to_string());
        }
        if w.route == Route::Install {
            self.swapped.set(Some(Instant::now()));
            w.t.phase = Phase::Swapped;
            self.save(&w.t);
            self.say(&format!("swapped {} → {}", w.t.from, w.t.to));
        }
        Observation::Done
    }

    fn restart(&self, onto: Onto, t: &mut Txn) -> Observation {
        let (want, timeout_s) = match onto {
            Onto::New => {
                t.phase = Phase::Restarting;
                self.save(t);
                (t.to.clone(), self.timeout_s)
            }
            Onto::Old => (t.from.clone(), self.timeout_s.max(30)),
        };
        match self.restart_onto_swap(&want, timeout_s) {
            Ok(s) => Observation::Running(gateway(&s)),
            Err(why) => Observation::Failed(why),
        }
    }

    fn source<'a>(&self, w: &Work<'a>) -> &'a str {
        w.args.and_then(|a| a.from.as_deref()).unwrap_or_default()
    }

    /// The operator's stop, a package manager's file, where the running gateway executes, the
    /// configuration.
    fn check(&self, w: &mut Work) -> Observation {
        // An update restarts the gateway; a stopped one stays stopped (issue 22, item 6).
        if let Err(r) = desired::check(self.home.dir(), Starter::Resume) {
            return Observation::Failed(format!("{}; start it first", r.describe()));
        }
        if let Some(why) = swap::package_manager_owner(&w.t.target) {
            return Observation::Failed(why);
        }
        if let Some(why) = self.runs_elsewhere(&w.t.target) {
            return Observation::Failed(why);
        }
        match gatewarden_config::Config::load(self.home.dir()) {
            Ok(c) => {
                w.public_key = c.update.public_key.clone();
                w.ca_file = c.update.ca_file.clone();
                Observation::Checked { signing_key: w.public_key.is_some() }
            }
            Err(e) => Observation::Failed(format!("cannot read the configuration: {e}")),
        }
    }

    fn verify(&self, w: &Work) -> Result<(), String> {
        let from = self.source(w);
        verify::checksum(from, &w.fetched, w.args.and_then(|a| a.sha256.as_deref()))?;
        if let Some(key) = &w.public_key {
            let sig_src = w.args.and_then(|a| a.signature.clone()).unwrap_or_else(|| format!("{from}.minisig"));
            verify::signature(key, &w.fetched, &sig_src, w.ca_file.as_deref())?;
        }
        Ok(())
    }

    /// Opens an archive (the hash and signature covered what was downloaded) and stages the
    /// executable; its version.
    fn stage(&self, w: &mut Work) -> Result<String, String> {
        let from = self.source(w);
        let fetched = std::mem::take(&mut w.fetched);
        let bytes = match archive::Format::detect(&fetched) {
            archive::Format::Binary => fetched,
            archive::Format::TarGz => {
                archive::tar_gz_executable(&fetched, fetch::MAX_RELEASE_BYTES).map_err(|e| format!("{from}: {e}"))?
            }
            archive::Format::Zip => {
                return Err(format!("{from} is a zip archive: use the .tar.gz release or the bare binary"));
            }
        };
        // The executable's own hash: what tells the new file from the old one on disk.
        let sha = verify::sha256_hex(&bytes);
        let (path, version) = swap::stage(self.home, &bytes, &sha)?;
        w.t.staged = path;
        w.t.to_sha256 = sha;
        Ok(version)
    }

    fn keep_previous(&self, t: &mut Txn) -> Result<(), String> {
        let from_sha = sha256_file(&t.target).map_err(|e| format!("cannot read {}: {e}", t.target.display()))?;
        let previous = release_path(self.home, VERSION, &from_sha);
        copy_executable(&t.target, &previous)
            .map_err(|e| format!("cannot keep the current binary as last known good: {e}"))?;
        t.from_sha256 = from_sha;
        t.previous = previous;
        Ok(())
    }

    /// A restart or start already under way may bring up an incarnation of the file in place
    /// now: the swap waits for it to end (bounded by `--timeout`; past that the check in
    /// [`Self::restart_onto_swap`] still holds). Issue 22, item 7.
    fn await_restart_under_way(&self) {
        let ep = Endpoint::for_home(self.home.dir());
        let until = Instant::now() + Duration::from_secs(self.timeout_s);
        let mut said = false;
        while Instant::now() < until {
            let in_flight = desired::in_flight_alive(&desired::current(self.home.dir()));
            let state = status_of(&ep, Duration::from_millis(500)).ok().and_then(|s| s.state);
            if !overlap::restart_under_way(state.as_deref(), in_flight) {
                return;
            }
            if !std::mem::replace(&mut said, true) {
                self.say("waiting for the restart under way to finish");
            }
            std::thread::sleep(POLL);
        }
    }

    /// The restart after a swap: when the ladder joined a restart that was under way before
    /// the swap, the incarnation it ends with runs the replaced file; that one is restarted
    /// once more, onto the file that is there now (`overlap::predates_swap`).
    fn restart_onto_swap(&self, want: &str, timeout_s: u64) -> Result<StatusReport, String> {
        let s = restart_verified(self.home, timeout_s)?;
        let since = self.swapped.get().map(|at| at.elapsed());
        if !since.is_some_and(|d| overlap::predates_swap(s.uptime_s, d, s.version.as_deref(), want)) {
            return Ok(s);
        }
        self.say(&format!(
            "incarnation {} ({}) began before the swap (a restart under way); restarting it onto {want}",
            s.incarnation.unwrap_or_default(),
            s.version.unwrap_or_default()
        ));
        let _ = self.ledger.append("update_restart_again", json!({"want": want}));
        restart_verified(self.home, timeout_s)
    }

    /// The new incarnation stays up for `[update] probation_s` ([`Probe`]).
    fn probation(&self, t: &Txn, g: &Gateway) -> Result<(), String> {
        let mut t2 = t.clone();
        t2.phase = Phase::Probation;
        t2.incarnation = g.incarnation.clone();
        self.save(&t2);
        let probation = gatewarden_config::Config::load(self.home.dir()).map(|c| c.update.probation_s).unwrap_or(10);
        self.say(&format!("{} is ready; probation {probation}s", t.to));
        let mut probe = Probe::new(g.incarnation.clone(), Duration::from_secs(probation));
        let began = Instant::now();
        let ep = Endpoint::for_home(self.home.dir());
        loop {
            let at = began.elapsed();
            if probe.over(at) {
                return Ok(());
            }
            let look = match stopped(self.home) {
                Some(r) => Look::Stopped(r.describe()),
                None => match status_of(&ep, Duration::from_millis(500)) {
                    Ok(now) => Look::Answer { incarnation: now.incarnation, state: now.state },
                    Err(e) => Look::Silent { lock_held: crate::ready::lock_held(self.home), error: e.to_string() },
                },
            };
            match probe.step(at, look) {
                Verdict::Wait => std::thread::sleep(POLL),
                Verdict::Passed => return Ok(()),
                Verdict::Failed(why) => return Err(why),
            }
        }
    }

    /// A resumed transaction: the first gateway seen `running` within `--timeout`, or the last
    /// answer.
    fn await_running(&self) -> Observation {
        let ep = Endpoint::for_home(self.home.dir());
        let until = Instant::now() + Duration::from_secs(self.timeout_s);
        let mut last = None;
        while Instant::now() < until {
            match status_of(&ep, Duration::from_millis(500)) {
                Ok(s) if s.state.as_deref() == Some("running") => {
                    last = Some(s);
                    break;
                }
                Ok(s) => last = Some(s),
                Err(_) => {}
            }
            std::thread::sleep(POLL);
        }
        last.map_or(Observation::NoAnswer, |s| Observation::Running(gateway(&s)))
    }

    /// Carries out a final action: the outcome, as the route words it.
    fn conclude(&self, action: &Action, w: &mut Work) -> ExitCode {
        let code = match action {
            Action::Refuse { why } => self.refuse(why),
            Action::Unchanged { why } => {
                // Every outcome is in the ledger, a refusal too (issue 22, item 7).
                let _ = self.ledger.append("update_refused", json!({"reason": why, "requester": requester(false)}));
                if self.json {
                    outln!("{}", json!({"ok": false, "changed": false, "reason": why}));
                }
                errln!("{why}");
                ExitCode::from(1)
            }
            Action::Commit { gateway: g, resumed } => {
                let t = &mut w.t;
                let inc = g.incarnation.clone().unwrap_or_default();
                let msg = if *resumed {
                    format!("updated {} → {} (incarnation {inc})", t.from, t.to)
                } else {
                    let pid = g.pid.map_or("?".into(), |p| p.to_string());
                    let took = self.t0.elapsed().as_secs_f64();
                    format!("updated {} → {} (incarnation {inc}, pid {pid}) in {took:.2}s", t.from, t.to)
                };
                self.say(&msg);
                self.notify(t, &msg);
                self.bless(t);
                if !resumed {
                    candidates::end(self.home, &self.ledger, t, g.pid);
                }
                self.finish(t, Phase::Committed, None, g.incarnation.clone())
            }
            Action::RolledBack { why, back } => self.rolled_back(w, why, back),
            Action::RollbackFailed { why, error } => self.rollback_failed(w, why, error),
            Action::End { phase, why, incarnation, notify } => {
                let t = &mut w.t;
                if w.route == Route::ByHand {
                    errln!("{why}");
                }
                if *notify {
                    self.notify(t, &format!("update to {} failed: {why}; still on {}", t.to, t.from));
                }
                self.finish(t, *phase, Some(why.clone()), incarnation.clone())
            }
            // Not final: nothing to conclude (the machine never ends on one).
            _ => ExitCode::from(1),
        };
        if let Some(tail) = w.tail.take().filter(|t| !t.is_empty()) {
            errln!("--- the gateway log since the update started ---\n{tail}");
        }
        code
    }

    fn rolled_back(&self, w: &mut Work, why: &str, back: &Back) -> ExitCode {
        let t = &mut w.t;
        match back {
            Back::Stopped(stop) => self.say(&format!("{} is back in place; not starting it: {stop}", t.from)),
            Back::NeverStopped(g) => self.say(&format!(
                "{} is back in place, and incarnation {} never stopped running it",
                t.from,
                g.incarnation.clone().unwrap_or_default()
            )),
            Back::Restarted(_) => {}
        }
        let running = match back {
            Back::Stopped(_) => None,
            Back::NeverStopped(g) | Back::Restarted(g) => Some(g),
        };
        if w.route == Route::ByHand {
            match running {
                None => self.say(&format!(
                    "rolled back {} → {}; the gateway stays stopped (`gatewarden start` runs {})",
                    t.to, t.from, t.from
                )),
                Some(g) => self.say(&format!(
                    "rolled back {} → {} (incarnation {}) in {:.2}s",
                    t.to,
                    t.from,
                    g.incarnation.clone().unwrap_or_default(),
                    self.t0.elapsed().as_secs_f64()
                )),
            }
            self.bless(t);
            let inc = running.and_then(|g| g.incarnation.clone());
            let _ = self.finish_as(t, Phase::RolledBack, Some(why.to_owned()), inc, true);
            return ExitCode::SUCCESS;
        }
        match running {
            None => {
                let msg = format!(
                    "update to {} ended: {why}; {} is back in place and the gateway stays stopped",
                    t.to, t.from
                );
                errln!("{msg}");
                self.notify(t, &msg);
                self.finish(t, Phase::RolledBack, Some(why.to_owned()), None)
            }
            Some(g) => {
                let msg = format!("update to {} failed: {why}; still on {}", t.to, t.from);
                errln!(
                    "{msg} (incarnation {}, back in {:.2}s)",
                    g.incarnation.clone().unwrap_or_default(),
                    w.detected.elapsed().as_secs_f64()
                );
                self.notify(t, &msg);
                candidates::end(self.home, &self.ledger, t, g.pid);
                self.finish(t, Phase::RolledBack, Some(why.to_owned()), g.incarnation.clone())
            }
        }
    }

    fn rollback_failed(&self, w: &mut Work, why: &str, e: &str) -> ExitCode {
        let t = &mut w.t;
        if w.route == Route::ByHand {
            errln!("the rollback to {} failed: {e}", t.from);
            return self.finish(t, Phase::Failed, Some(format!("{why}: {e}")), None);
        }
        let msg = format!("update to {} failed: {why}; the rollback to {} failed too: {e}", t.to, t.from);
        errln!("{msg}");
        // The installed binary may be the broken release: recover with the kept one.
        errln!("recover with: {} --home {} update --rollback", t.previous.display(), self.home.dir().display());
        self.notify(t, &msg);
        let answering = status_of(&Endpoint::for_home(self.home.dir()), Duration::from_millis(500)).ok();
        candidates::end(self.home, &self.ledger, t, answering.and_then(|s| s.pid));
        self.finish(t, Phase::Failed, Some(msg.clone()), None)
    }

    pub(super) fn save(&self, t: &Txn) {
        // The transaction must stay true on a full disk too: its record has space reserved.
        if let Err(e) = fsio::write_json_reserved(&self.home.dir().join(UPDATE_FILE), t) {
            errln!("warning: cannot write {UPDATE_FILE}: {e}");
        }
        // Tests kill the updater in a chosen phase: it waits there (bounded) to be killed.
        if std::env::var(PAUSE_ENV).ok().is_some_and(|p| json!(p) == json!(t.phase)) {
            std::thread::sleep(Duration::from_secs(30));
        }
    }

    /// Progress for people: stdout, or stderr under `--json` (whose stdout is the one JSON
    /// outcome).
    fn say(&self, line: &str) {
        if self.json || self.text_to_stderr {
            errln!("{line}");
        } else {
            outln!("{line}");
        }
    }

    /// A refusal before anything changed: exit 1 with the reason.
    fn refuse(&self, why: &str) -> ExitCode {
        let _ =
            self.ledger.append("update_refused", json!({"reason": why, "requester": requester(self.chat.is_some())}));
        if self.json {
            outln!("{}", json!({"ok": false, "changed": false, "reason": why}));
        }
        errln!("update refused: {why}; nothing changed");
        if let Some((chat, platform)) = &self.chat {
            notify_chat(self.home, chat, platform.as_deref(), &format!("update refused: {why}; still on {VERSION}"));
        }
        ExitCode::from(1)
    }

    /// The running binary is now the good one; `ExecStopPost=` reverts to it from here on.
    fn bless(&self, t: &Txn) {
        if let Err(e) = refresh_good_copy(self.home, &t.target) {
            errln!("warning: cannot refresh the last known good copy: {e}");
        }
    }

    pub(super) fn finish(&self, t: &mut Txn, phase: Phase, reason: Option<String>, inc: Option<String>) -> ExitCode {
        self.finish_as(t, phase, reason, inc, phase == Phase::Committed)
    }

    /// [`Updater::finish`]; `ok` is whether this command did what it was asked (a rollback
    /// by hand succeeds by ending `rolled_back`).
    fn finish_as(&self, t: &mut Txn, phase: Phase, reason: Option<String>, inc: Option<String>, ok: bool) -> ExitCode {
        t.phase = phase;
        t.reason = reason;
        if inc.is_some() {
            t.incarnation = inc;
        }
        t.finished = Some(timefmt::now());
        t.elapsed_ms = Some(self.t0.elapsed().as_millis() as u64);
        self.save(t);
        let _ = self.ledger.append(
            "update_result",
            // `ok` as the exit code says it (a rollback by hand that ends `rolled_back` is one).
            json!({"ok": ok, "phase": phase, "from": t.from, "to": t.to, "reason": t.reason,
                   "incarnation": t.incarnation, "elapsed_ms": t.elapsed_ms,
                   "requester_pid": crate::orchestrator::requester_pid()}),
        );
        if self.json {
            outln!("{}", json!({"ok": ok, "update": t}));
        }
        if ok { ExitCode::SUCCESS } else { ExitCode::from(1) }
    }

    /// The chat that asked gets exactly one outcome notice (delivered by the gateway).
    pub(super) fn notify(&self, t: &Txn, text: &str) {
        if let Some(chat) = &t.chat {
            notify_chat(self.home, chat, t.platform.as_deref(), text);
        }
    }

    /// Refuses when the running gateway executes another binary than this one (the swap would
    /// not reach it).
    fn runs_elsewhere(&self, target: &Path) -> Option<String> {
        let rec = gatewarden_lifecycle::records::read_pid_record(&self.home.pid_file()).ok()?;
        let running = status_of(&Endpoint::for_home(self.home.dir()), Duration::from_secs(1)).ok()?;
        if running.pid != Some(rec.pid) {
            return None;
        }
        let argv0 = PathBuf::from(rec.argv.first()?);
        if !argv0.is_absolute() {
            return None;
        }
        let theirs = gatewarden_lifecycle::platform::canonical(&argv0).ok()?;
        (theirs != target).then(|| {
            format!(
                "the running gateway executes {}, not this binary ({}); run `{} update` instead",
                theirs.display(),
                target.display(),
                theirs.display()
            )
        })
    }
}

/// A record for a rollback by hand that found none (only its refusal is worded from it).
fn empty_txn() -> Txn {
    Txn {
        from: String::new(),
        to: String::new(),
        phase: Phase::Failed,
        started: String::new(),
        target: PathBuf::new(),
        staged: PathBuf::new(),
        previous: PathBuf::new(),
        from_sha256: String::new(),
        to_sha256: String::new(),
        updater_pid: 0,
        chat: None,
        platform: None,
        reason: None,
        incarnation: None,
        finished: None,
        elapsed_ms: None,
    }
}

/// The last `n` lines of the gateway's log (background starts write it) written since `since`
/// (lines start with an RFC 3339 timestamp in the same format, so they compare as text).
fn log_tail(home: &Home, since: &str, n: usize) -> String {
    let text = std::fs::read(home.logs_dir().join("gateway.log")).unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let lines: Vec<&str> = text.lines().filter(|l| l.get(..since.len()).is_some_and(|t| t >= since)).collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
