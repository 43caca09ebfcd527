//! `gatewarden update`: replace this home's gateway binary as a verified transaction.
//!
//! 1. **Stage** the release into `<home>/releases/<version>-<sha12>/gatewarden` after checking
//!    its sha256 (`--sha256`, required for URLs) and, when `[update] public_key` is set, its
//!    minisign signature, both over the bytes as fetched; a `.tar.gz` is then opened in memory
//!    for its one `gatewarden` executable (`update/archive.rs`). The version is what the
//!    staged binary itself prints.
//! 2. **Preflight**: the staged binary runs `check` against the live home (no lock taken).
//! 3. **Record** the transaction in `<home>/update.json` and the ledger; `<home>/update.lock`
//!    (an OS lock, released by death) is held for the whole transaction, so a second update
//!    is refused and a dead updater is told apart from a busy one.
//! 4. **Swap**: copy the current binary to its own release directory (last known good), then
//!    rename the staged copy over the executable (on Windows the running image is renamed
//!    aside first).
//! 5. **Restart** through the one restart ladder (`ladder/`).
//! 6. **Probation**: the new incarnation reports the expected version and stays up for
//!    `[update] probation_s`.
//! 7. Success: `committed` with a receipt. Failure: swap back, restart, verify the old version
//!    runs, exit 1 with the reason and the log tail.
//!
//! A transaction left unfinished (the updater was killed) is finished by whoever finds it
//! with `update.lock` free: the next `run` of either binary (see [`on_gateway_start`]), the
//! next `update`, `supervise` when the candidate crashes, or `update --resume`.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use crate::Context;
use crate::bail;
use gatewarden_control::{Endpoint, StatusReport};
use gatewarden_lifecycle::desired::{self, Refusal, Starter};
use gatewarden_lifecycle::ledger::{Ledger, Writer};
use gatewarden_lifecycle::{ExitIntent, Home, InstanceLock, VERSION, fsio, overlap, timefmt};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::Digest;

mod archive;

use crate::release::{RELEASES, copy_executable, hex, refresh_good_copy, release_path, sha256_file, write_executable};

use crate::ladder::restart_verified;
use crate::options::UpdateArgs;
use crate::owner;
use crate::ready::status_of;

/// The transaction record's file name in the home.
pub const UPDATE_FILE: &str = "update.json";
const LOCK_FILE: &str = "update.lock";
/// Bigger than any release binary; a cap on what a URL may make us download.
const MAX_RELEASE_BYTES: u64 = 512 << 20;
/// Internal (tests): the phase in which the updater pauses, to be killed there.
const PAUSE_ENV: &str = "GATEWARDEN_TEST_UPDATE_PAUSE";
const POLL: Duration = Duration::from_millis(50);
/// A new incarnation silent on its control endpoint this long during probation has failed.
const SILENT_LIMIT: Duration = Duration::from_secs(3);

/// Where a transaction is. `committed`, `rolled_back` and `failed` are final.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Swapping,
    Swapped,
    Restarting,
    Probation,
    RollingBack,
    Committed,
    RolledBack,
    Failed,
}

impl Phase {
    pub fn is_final(self) -> bool {
        matches!(self, Phase::Committed | Phase::RolledBack | Phase::Failed)
    }
}

/// `<home>/update.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Txn {
    pub from: String,
    pub to: String,
    pub phase: Phase,
    pub started: String,
    /// The executable that is swapped.
    pub target: PathBuf,
    /// The staged release.
    pub staged: PathBuf,
    /// The last known good copy of the replaced binary.
    pub previous: PathBuf,
    pub from_sha256: String,
    pub to_sha256: String,
    pub updater_pid: u32,
    #[serde(default)]
    pub chat: Option<String>,
    /// The adapter `chat` belongs to (`None`: an HTTP chat).
    #[serde(default)]
    pub platform: Option<String>,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub incarnation: Option<String>,
    #[serde(default)]
    pub finished: Option<String>,
    #[serde(default)]
    pub elapsed_ms: Option<u64>,
}

pub fn update(home: &Home, args: UpdateArgs) -> crate::Result<ExitCode> {
    // `--json`: stdout holds exactly one JSON document on every path, errors included.
    let json_outcome = args.json && !args.status;
    let result = transact(home, args);
    if json_outcome && let Err(e) = &result {
        outln!("{}", json!({"ok": false, "changed": false, "reason": e.chain()}));
    }
    result
}

fn transact(home: &Home, args: UpdateArgs) -> crate::Result<ExitCode> {
    let home = home.ensure()?;
    if args.status {
        return status(&home, args.json);
    }
    if args.after_exit {
        return Ok(after_exit(&home));
    }
    if args.from.is_none() && !args.rollback && !args.resume {
        bail!("say what to install: `gatewarden update --from PATH|URL` (or --status, --rollback)");
    }
    // The updater outlives the gateway it restarts (chat `/update` runs it from inside).
    crate::orchestrator::escape_unit(&home);
    if let Some(code) = crate::orchestrator::detach() {
        return Ok(code);
    }
    let Some(lock) = take_update_lock(&home, args.resume)? else {
        if args.resume {
            return Ok(ExitCode::SUCCESS); // a live updater carries on
        }
        let who = read_txn(&home).map(|t| format!(" (pid {}, {} → {}, {:?})", t.updater_pid, t.from, t.to, t.phase));
        let why = format!("another update is in progress{}", who.unwrap_or_default());
        let ledger = Ledger::new(home.ledger(), Writer::current());
        let _ = ledger.append("update_refused", json!({"reason": why, "requester": requester(args.chat.is_some())}));
        if args.json {
            outln!("{}", json!({"ok": false, "changed": false, "reason": why}));
        }
        errln!("{why}; nothing changed");
        if let Some(chat) = &args.chat {
            notify_chat(&home, chat, args.chat_platform.as_deref(), &format!("update refused: {why}; nothing changed"));
        }
        return Ok(ExitCode::from(1));
    };
    let mut u = Updater::new(&home, args.timeout, args.json);
    u.chat = args.chat.clone().map(|c| (c, args.chat_platform.clone()));
    // A transaction a killed updater left behind is finished first (reported as text: the
    // JSON outcome is this command's own).
    if let Some(t) = read_txn(&home).filter(|t| !t.phase.is_final()) {
        let code = if args.resume {
            u.resume(t)
        } else {
            let mut first = Updater::new(&home, args.timeout, false);
            first.text_to_stderr = args.json;
            first.resume(t)
        };
        if args.resume {
            return Ok(code);
        }
    } else if args.resume {
        return Ok(ExitCode::SUCCESS);
    }
    let code = if args.rollback { u.rollback_by_hand() } else { u.install(&args) };
    drop(lock);
    code
}

fn take_update_lock(home: &Home, patient: bool) -> crate::Result<Option<InstanceLock>> {
    let path = home.dir().join(LOCK_FILE);
    // Only updaters take this lock, and they hold it for a whole transaction: there is no
    // brief probe to wait out, except a resuming updater racing the one that launched it.
    let taken =
        if patient { InstanceLock::acquire(&path, Duration::from_secs(2)) } else { InstanceLock::try_acquire(&path) };
    match taken {
        Ok(l) => Ok(Some(l)),
        Err(gatewarden_lifecycle::LockError::Held { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

pub fn read_txn(home: &Home) -> Option<Txn> {
    fsio::read_json::<Txn>(&home.dir().join(UPDATE_FILE)).ok()
}

fn status(home: &Home, json_out: bool) -> crate::Result<ExitCode> {
    let Some(t) = read_txn(home) else {
        if json_out {
            outln!("{}", json!({"update": null}));
        } else {
            outln!("no update recorded in {}", home.dir().display());
        }
        return Ok(ExitCode::SUCCESS);
    };
    let running = status_of(&Endpoint::for_home(home.dir()), Duration::from_secs(1)).ok();
    if json_out {
        let mut v = serde_json::to_value(&t)?;
        v["running_version"] = json!(running.as_ref().and_then(|s| s.version.clone()));
        outln!("{}", json!({"update": v}));
    } else {
        outln!("update {} → {}: {:?} (started {})", t.from, t.to, t.phase, t.started);
        if let Some(r) = &t.reason {
            outln!("  reason: {r}");
        }
        outln!("  executable: {}", t.target.display());
        outln!("  last known good: {}", t.previous.display());
        match running.and_then(|s| s.version) {
            Some(v) => outln!("  running now: {v}"),
            None => outln!("  running now: no gateway answers"),
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A staged release, verified and ready to swap in.
struct Staged {
    path: PathBuf,
    version: String,
    sha256: String,
}

struct Updater<'h> {
    home: &'h Home,
    ledger: Ledger,
    timeout_s: u64,
    json: bool,
    t0: Instant,
    /// The chat that asked (`/update`) and its adapter, told about refusals too.
    chat: Option<(String, Option<String>)>,
    /// Progress goes to stderr though this updater prints no JSON (a leftover transaction
    /// finished before an `update --json`, whose stdout is the one JSON outcome).
    text_to_stderr: bool,
    /// When the executable was last swapped (either way), for [`Updater::restart_onto_swap`].
    swapped: std::cell::Cell<Option<Instant>>,
}

impl<'h> Updater<'h> {
    fn new(home: &'h Home, timeout_s: u64, json: bool) -> Updater<'h> {
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

    fn save(&self, t: &Txn) {
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
    fn refuse(&self, why: &str) -> crate::Result<ExitCode> {
        let _ =
            self.ledger.append("update_refused", json!({"reason": why, "requester": requester(self.chat.is_some())}));
        if self.json {
            outln!("{}", json!({"ok": false, "changed": false, "reason": why}));
        }
        errln!("update refused: {why}; nothing changed");
        if let Some((chat, platform)) = &self.chat {
            notify_chat(self.home, chat, platform.as_deref(), &format!("update refused: {why}; still on {VERSION}"));
        }
        Ok(ExitCode::from(1))
    }

    fn install(&self, args: &UpdateArgs) -> crate::Result<ExitCode> {
        let Some(from) = args.from.as_deref() else { bail!("--from is required") };
        let target = owner::current_exe().context("cannot locate this executable")?;
        // An update restarts the gateway; a stopped one stays stopped (issue 22, item 6).
        if let Err(r) = desired::check(self.home.dir(), Starter::Resume) {
            return self.refuse(&format!("{}; start it first", r.describe()));
        }
        if let Some(why) = package_manager_owner(&target) {
            return self.refuse(&why);
        }
        if let Some(why) = self.runs_elsewhere(&target) {
            return self.refuse(&why);
        }
        let config = match gatewarden_config::Config::load(self.home.dir()) {
            Ok(c) => c,
            Err(e) => return self.refuse(&format!("cannot read the configuration: {e}")),
        };
        let staged = match self.stage(from, args, config.update.public_key.as_deref(), config.update.ca_file.as_deref())
        {
            Ok(s) => s,
            Err(why) => return self.refuse(&why),
        };
        if staged.version == VERSION {
            return self.refuse(&format!("the release is version {VERSION}, the version this binary already is"));
        }
        // Going back is never silent, signed or not: an old release brings back what a later
        // one fixed (a signed one is still a valid signature, so replaying it is an attack).
        // Only an operator on the command line may go back (issue 27 §7).
        let may_downgrade = args.allow_downgrade && args.chat.is_none();
        if !may_downgrade && let Some(why) = downgrade_refusal(VERSION, &staged.version) {
            return self.refuse(&why);
        }
        self.say(&format!("staged gatewarden {} ({})", staged.version, staged.path.display()));
        let notes = match preflight(self.home, &staged.path, &target) {
            Ok(notes) => notes,
            Err(why) => return self.refuse(&format!("preflight of {} failed: {why}", staged.version)),
        };
        self.say("preflight passed");
        // What the new version changes for this home (its `check` names it: a new default).
        for n in notes {
            self.say(&format!("  {n}"));
        }
        let from_sha = match sha256_file(&target) {
            Ok(h) => h,
            Err(e) => return self.refuse(&format!("cannot read {}: {e}", target.display())),
        };
        let previous = release_path(self.home, VERSION, &from_sha);
        if let Err(e) = copy_executable(&target, &previous) {
            return self.refuse(&format!("cannot keep the current binary as last known good: {e}"));
        }
        let mut t = Txn {
            from: VERSION.into(),
            to: staged.version.clone(),
            phase: Phase::Swapping,
            started: timefmt::now(),
            target: target.clone(),
            staged: staged.path.clone(),
            previous,
            from_sha256: from_sha,
            to_sha256: staged.sha256.clone(),
            updater_pid: std::process::id(),
            chat: args.chat.clone(),
            platform: args.chat.as_ref().and(args.chat_platform.clone()),
            reason: None,
            incarnation: None,
            finished: None,
            elapsed_ms: None,
        };
        self.save(&t);
        let _ = self.ledger.append(
            "update_started",
            json!({"from": t.from, "to": t.to, "target": t.target, "sha256": t.to_sha256, "chat": t.chat}),
        );
        self.await_restart_under_way();
        if let Err(e) = swap_in(&staged.path, &target) {
            return Ok(self.fail_before_restart(&mut t, &format!("cannot swap the executable: {e}")));
        }
        self.swapped.set(Some(Instant::now()));
        t.phase = Phase::Swapped;
        self.save(&t);
        self.say(&format!("swapped {} → {}", t.from, t.to));
        Ok(self.restart_and_probe(t))
    }

    /// The swap failed: nothing ran the new binary; put the old one back if needed.
    fn fail_before_restart(&self, t: &mut Txn, why: &str) -> ExitCode {
        if sha256_file(&t.target).ok().as_deref() != Some(t.from_sha256.as_str()) {
            let _ = swap_in(&t.previous, &t.target);
        }
        self.finish(t, Phase::Failed, Some(why.to_owned()), None)
    }

    /// Phases 5–8: restart, probation, then commit or roll back.
    fn restart_and_probe(&self, mut t: Txn) -> ExitCode {
        t.phase = Phase::Restarting;
        self.save(&t);
        let new = self.restart_onto_swap(&t.to, self.timeout_s);
        let verdict = new.and_then(|s| self.probation(&t, s));
        match verdict {
            Ok(s) => {
                let msg = format!(
                    "updated {} → {} (incarnation {}, pid {}) in {:.2}s",
                    t.from,
                    t.to,
                    s.incarnation.clone().unwrap_or_default(),
                    s.pid.map_or("?".into(), |p| p.to_string()),
                    self.t0.elapsed().as_secs_f64()
                );
                self.say(&msg);
                self.notify(&t, &msg);
                self.bless(&t);
                self.end_candidates(&t, s.pid);
                self.finish(&mut t, Phase::Committed, None, s.incarnation)
            }
            // A stop during the restart or the probation is the operator's, not a failure of
            // the new version: said so, and the rollback below starts nothing.
            Err(why) => match stopped(self.home) {
                Some(r) => self.roll_back(t, &format!("interrupted before probation ended: {}", r.describe())),
                None => self.roll_back(t, &why),
            },
        }
    }

    /// The running binary is now the good one; `ExecStopPost=` reverts to it from here on.
    fn bless(&self, t: &Txn) {
        if let Err(e) = refresh_good_copy(self.home, &t.target) {
            errln!("warning: cannot refresh the last known good copy: {e}");
        }
    }

    /// The new incarnation must be the expected version and stay up for `probation_s`.
    fn probation(&self, t: &Txn, s: StatusReport) -> Result<StatusReport, String> {
        if s.version.as_deref() != Some(t.to.as_str()) {
            return Err(format!(
                "the new incarnation reports version {}, expected {}",
                s.version.unwrap_or_else(|| "?".into()),
                t.to
            ));
        }
        let mut t2 = t.clone();
        t2.phase = Phase::Probation;
        t2.incarnation = s.incarnation.clone();
        self.save(&t2);
        let probation = gatewarden_config::Config::load(self.home.dir()).map(|c| c.update.probation_s).unwrap_or(10);
        self.say(&format!("{} is ready; probation {probation}s", t.to));
        let until = Instant::now() + Duration::from_secs(probation);
        let ep = Endpoint::for_home(self.home.dir());
        let mut silent_since: Option<Instant> = None;
        while Instant::now() < until {
            if let Some(r) = stopped(self.home) {
                return Err(format!("probation interrupted: {}", r.describe()));
            }
            match status_of(&ep, Duration::from_millis(500)) {
                Ok(now) if now.incarnation == s.incarnation && now.state.as_deref() == Some("running") => {
                    silent_since = None
                }
                Ok(now) => {
                    return Err(format!(
                        "during probation the gateway became incarnation {} in state {}",
                        now.incarnation.unwrap_or_default(),
                        now.state.unwrap_or_default()
                    ));
                }
                Err(e) if !crate::ready::lock_held(self.home) => {
                    return Err(format!("the new incarnation exited during probation ({e})"));
                }
                Err(e) => {
                    let since = *silent_since.get_or_insert_with(Instant::now);
                    if since.elapsed() > SILENT_LIMIT {
                        return Err(format!("the new incarnation stopped answering during probation ({e})"));
                    }
                }
            }
            std::thread::sleep(POLL);
        }
        Ok(s)
    }

    /// Puts the last known good binary back, restarts, and verifies the old version runs.
    /// A stopped gateway (`gatewarden_lifecycle::desired`) gets the swap only: `Ok(None)`.
    fn revert(&self, t: &Txn) -> Result<Option<StatusReport>, String> {
        self.kill_unready_candidates(t);
        // A gateway that answers is restarted by the ladder (drained, not killed).
        let answering = status_of(&Endpoint::for_home(self.home.dir()), Duration::from_millis(500)).ok();
        self.end_candidates(t, answering.and_then(|s| s.pid));
        swap_in(&t.previous, &t.target).map_err(|e| format!("cannot swap the old binary back: {e}"))?;
        self.swapped.set(Some(Instant::now()));
        if let Err(r) = crate::intent::may_start(self.home, "rollback", Starter::Resume) {
            self.say(&format!("{} is back in place; not starting it: {}", t.from, r.describe()));
            return Ok(None);
        }
        // The old version never stopped (its restart's drain was cancelled, or the restart
        // joined one that began before the swap): it is what a rollback restarts onto, so a
        // second drain would only wait on the same runs again.
        let now = status_of(&Endpoint::for_home(self.home.dir()), Duration::from_millis(500)).ok();
        if let Some(s) = now.filter(|s| s.state.as_deref() == Some("running") && s.version.as_deref() == Some(&t.from))
        {
            self.say(&format!(
                "{} is back in place, and incarnation {} never stopped running it",
                t.from,
                s.incarnation.clone().unwrap_or_default()
            ));
            return Ok(Some(s));
        }
        let s = match self.restart_onto_swap(&t.from, self.timeout_s.max(30)) {
            Ok(s) => s,
            // A stop recorded during the restart: the old file is in place, and the gateway
            // stays down as the operator asked; not a failed rollback (issue 22, item 7).
            Err(_) if let Some(r) = stopped(self.home) => {
                self.say(&format!("{} is back in place; not starting it: {}", t.from, r.describe()));
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        match s.version.as_deref() {
            Some(v) if v == t.from => Ok(Some(s)),
            v => Err(format!("after the swap back the gateway reports version {}", v.unwrap_or("?"))),
        }
    }

    /// A candidate that hangs before it takes the lock may still hold the listening socket it
    /// inherited, and the old version could not bind it: kill what listens on the gateway's
    /// port without holding a gateway lock, if this update started it ([`Updater::ours`]: a
    /// member of the process group of a process it started, so never a bystander, nor the
    /// successor a concurrent `restart` is starting), pinned by its identity.
    fn kill_unready_candidates(&self, t: &Txn) {
        let Some(me) = gatewarden_lifecycle::ProcessIdentity::current() else { return };
        let listen = gatewarden_lifecycle::records::read_state(&self.home.state_file()).ok().and_then(|s| s.listen);
        let Some(port) = listen.and_then(|l| l.parse::<std::net::SocketAddr>().ok()).map(|a| a.port()) else { return };
        use gatewarden_lifecycle::platform;
        let ours = self.ours(t);
        let groups = platform::spawn::process_groups();
        let pgid_of = |pid: u32| groups.iter().find(|(p, _)| *p == pid).map(|(_, g)| *g);
        for l in platform::port_listeners(port) {
            let Some(start_time) = platform::start_time(l.pid) else { continue };
            if l.home.is_some() || l.pid == me.pid || start_time < me.start_time {
                continue;
            }
            if !pgid_of(l.pid).is_some_and(|g| ours.contains(&g)) {
                continue;
            }
            let id = gatewarden_lifecycle::ProcessIdentity { pid: l.pid, start_time };
            let sent = platform::signal_verified(&id, platform::Signal::Kill);
            errln!("killing {l}, a new-version process that never became ready: {sent:?}");
            let _ = self.ledger.append("update_killed_candidate", json!({"pid": l.pid, "program": l.program}));
        }
    }

    /// The processes this update started itself since transaction `t` began, read from the
    /// ledger ([`started_by`]): never one a concurrent verb started (issue 30, item 5: a
    /// rollback killed the successor a concurrent `restart` had just spawned).
    fn ours(&self, t: &Txn) -> Vec<u32> {
        let me = [std::process::id(), crate::orchestrator::requester_pid()];
        let mut events = Vec::new();
        if let fsio::ReadOutcome::Ok(lines) = gatewarden_lifecycle::ledger::read_tail(&self.home.ledger(), Some(2000)) {
            for line in lines {
                let gatewarden_lifecycle::ledger::Line::Event(e) = line else { continue };
                if e.get("ts").and_then(|v| v.as_str()).is_some_and(|ts| ts >= t.started.as_str()) {
                    events.push(e);
                }
            }
        }
        started_by(&me, &events)
    }

    /// Ends every process group a candidate of this transaction started, except the one of
    /// `keep` (the gateway the transaction ends with) and this updater's own. The leaders are
    /// the processes this update started itself ([`Updater::ours`]); a group is ended only
    /// when every member started after this updater (so never a group that was there before,
    /// like the one a test harness or shell started the old gateway in), each member pinned by
    /// (pid, start time) and killed through `signal_verified`. Without this a candidate that
    /// hangs without taking the lock outlives the rollback, and a forked child that holds the
    /// lock after its candidate exited keeps the old version from starting (issue 18, item 10).
    fn end_candidates(&self, t: &Txn, keep: Option<u32>) {
        use gatewarden_lifecycle::{ProcessIdentity, platform};
        let Some(me) = ProcessIdentity::current() else { return };
        let started_after_me = |pid: u32| platform::start_time(pid).is_some_and(|st| st >= me.start_time);
        let groups = gatewarden_lifecycle::platform::spawn::process_groups();
        let pgid_of = |pid: u32| groups.iter().find(|(p, _)| *p == pid).map(|(_, g)| *g);
        let (mine, kept) = (pgid_of(me.pid), keep.and_then(pgid_of));
        let mut ended = Vec::new();
        for leader in self.ours(t) {
            if Some(leader) == mine || Some(leader) == kept || leader == me.pid {
                continue;
            }
            let members: Vec<u32> = groups.iter().filter(|(_, g)| *g == leader).map(|(p, _)| *p).collect();
            if members.is_empty() || !members.iter().all(|&p| started_after_me(p)) {
                continue;
            }
            for pid in members {
                let Some(start_time) = platform::start_time(pid) else { continue };
                let id = ProcessIdentity { pid, start_time };
                if matches!(platform::signal_verified(&id, platform::Signal::Kill), platform::SignalOutcome::Sent) {
                    ended.push(id);
                }
            }
        }
        if ended.is_empty() {
            return;
        }
        let pids: Vec<u32> = ended.iter().map(|i| i.pid).collect();
        errln!("ended {} process(es) that candidates of this update left: {pids:?}", pids.len());
        let _ = self.ledger.append("update_ended_candidates", json!({"pids": pids}));
        // Their locks and sockets are released at exit: wait for it (bounded).
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until && ended.iter().any(|i| platform::start_time(i.pid) == Some(i.start_time)) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Swap back, restart, verify the old version runs, exit 1 with the reason.
    fn roll_back(&self, mut t: Txn, why: &str) -> ExitCode {
        errln!("update to {} failed: {why}; rolling back to {}", t.to, t.from);
        let tail = log_tail(self.home, &t.started, 20);
        t.phase = Phase::RollingBack;
        t.reason = Some(why.to_owned());
        self.save(&t);
        let detected = Instant::now();
        let outcome = match self.revert(&t) {
            Ok(None) => {
                let msg = format!(
                    "update to {} ended: {why}; {} is back in place and the gateway stays stopped",
                    t.to, t.from
                );
                errln!("{msg}");
                self.notify(&t, &msg);
                self.finish(&mut t, Phase::RolledBack, Some(why.to_owned()), None)
            }
            Ok(Some(s)) => {
                let msg = format!("update to {} failed: {why}; still on {}", t.to, t.from);
                errln!(
                    "{msg} (incarnation {}, back in {:.2}s)",
                    s.incarnation.clone().unwrap_or_default(),
                    detected.elapsed().as_secs_f64()
                );
                self.notify(&t, &msg);
                self.end_candidates(&t, s.pid);
                self.finish(&mut t, Phase::RolledBack, Some(why.to_owned()), s.incarnation)
            }
            Err(e) => {
                let msg = format!("update to {} failed: {why}; the rollback to {} failed too: {e}", t.to, t.from);
                errln!("{msg}");
                // The installed binary may be the broken release: recover with the kept one.
                errln!("recover with: {} --home {} update --rollback", t.previous.display(), self.home.dir().display());
                self.notify(&t, &msg);
                let answering = status_of(&Endpoint::for_home(self.home.dir()), Duration::from_millis(500)).ok();
                self.end_candidates(&t, answering.and_then(|s| s.pid));
                self.finish(&mut t, Phase::Failed, Some(msg.clone()), None)
            }
        };
        if !tail.is_empty() {
            errln!("--- the gateway log since the update started ---\n{tail}");
        }
        outcome
    }

    fn finish(&self, t: &mut Txn, phase: Phase, reason: Option<String>, inc: Option<String>) -> ExitCode {
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
    fn notify(&self, t: &Txn, text: &str) {
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

    /// Fetches, verifies and stages the release.
    fn stage(
        &self,
        from: &str,
        args: &UpdateArgs,
        public_key: Option<&str>,
        ca_file: Option<&Path>,
    ) -> Result<Staged, String> {
        let is_url = from.starts_with("http://") || from.starts_with("https://");
        // A configured signing key authenticates a URL by itself (chat `/update` has no
        // per-release hash to give); without one, the hash is required.
        if is_url && args.sha256.is_none() && public_key.is_none() {
            return Err("--sha256 is required for a URL (or set [update] public_key)".into());
        }
        let fetched = fetch(from, ca_file)?;
        let fetched_sha = hex(&sha2::Sha256::digest(&fetched));
        if let Some(want) = &args.sha256
            && !want.trim().eq_ignore_ascii_case(&fetched_sha)
        {
            return Err(format!("checksum mismatch: {from} has sha256 {fetched_sha}, expected {}", want.trim()));
        }
        if let Some(key) = public_key {
            let sig_src = args.signature.clone().unwrap_or_else(|| format!("{from}.minisig"));
            verify_signature(key, &fetched, &sig_src, ca_file)?;
        }
        // The hash and signature cover what was downloaded; an archive is opened only after.
        let bytes = match archive::Format::detect(&fetched) {
            archive::Format::Binary => fetched,
            archive::Format::TarGz => {
                archive::tar_gz_executable(&fetched, MAX_RELEASE_BYTES).map_err(|e| format!("{from}: {e}"))?
            }
            archive::Format::Zip => {
                return Err(format!("{from} is a zip archive: use the .tar.gz release or the bare binary"));
            }
        };
        // The executable's own hash: what tells the new file from the old one on disk.
        let sha = hex(&sha2::Sha256::digest(&bytes));
        let dir = self.home.dir().join(RELEASES);
        gatewarden_lifecycle::platform::create_private_dir(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let tmp = dir.join(format!(".incoming-{}", std::process::id()));
        write_executable(&tmp, &bytes).map_err(|e| format!("cannot stage {}: {e}", tmp.display()))?;
        let version = match release_version(&tmp) {
            Ok(v) => v,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
        };
        let path = release_path(self.home, &version, &sha);
        if let Some(parent) = path.parent() {
            gatewarden_lifecycle::platform::create_private_dir(parent)
                .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
        }
        std::fs::rename(&tmp, &path).map_err(|e| format!("cannot stage {}: {e}", path.display()))?;
        Ok(Staged { path, version, sha256: sha })
    }

    /// `update --rollback`: the last update's previous binary back in place, verified running.
    fn rollback_by_hand(&self) -> crate::Result<ExitCode> {
        let nothing = |why: String| {
            // Every outcome is in the ledger, a refusal too (issue 22, item 7).
            let _ = self.ledger.append("update_refused", json!({"reason": why, "requester": requester(false)}));
            if self.json {
                outln!("{}", json!({"ok": false, "changed": false, "reason": why}));
            }
            errln!("{why}");
            Ok(ExitCode::from(1))
        };
        let Some(mut t) = read_txn(self.home) else {
            return nothing(format!("no update recorded in {}: nothing to roll back to", self.home.dir().display()));
        };
        // A failed transaction may have left the new file in place (its rollback failed).
        if !matches!(t.phase, Phase::Committed | Phase::Failed) {
            return nothing(format!(
                "the last update ({} → {}) is {:?}: the binary is already {}",
                t.from, t.to, t.phase, t.from
            ));
        }
        if !t.previous.is_file() {
            return nothing(format!("the last known good binary {} is gone", t.previous.display()));
        }
        self.say(&format!("rolling back {} → {}", t.to, t.from));
        self.await_restart_under_way();
        t.chat = None;
        let why = "rolled back by hand (`update --rollback`)".to_owned();
        let basis = desired::current(self.home.dir()).seq;
        match self.revert(&t) {
            Ok(None) => {
                self.say(&format!(
                    "rolled back {} → {}; the gateway stays stopped (`gatewarden start` runs {})",
                    t.to, t.from, t.from
                ));
                self.bless(&t);
                let _ = self.finish_as(&mut t, Phase::RolledBack, Some(why), None, true);
                Ok(ExitCode::SUCCESS)
            }
            Ok(Some(s)) => {
                self.say(&format!(
                    "rolled back {} → {} (incarnation {}) in {:.2}s",
                    t.to,
                    t.from,
                    s.incarnation.clone().unwrap_or_default(),
                    self.t0.elapsed().as_secs_f64()
                ));
                self.bless(&t);
                let _ = self.finish_as(&mut t, Phase::RolledBack, Some(why), s.incarnation, true);
                Ok(ExitCode::SUCCESS)
            }
            Err(e) => match desired::check(self.home.dir(), Starter::Carry { basis }) {
                Err(r @ Refusal::Cancelled(_)) => Ok(self.rollback_cancelled(&t, &r)),
                _ => {
                    errln!("the rollback to {} failed: {e}", t.from);
                    Ok(self.finish(&mut t, Phase::Failed, Some(format!("{why}: {e}")), None))
                }
            },
        }
    }

    /// The rollback's restart had its drain cancelled (issue 21): the operator kept the running
    /// gateway, so the installed file goes back to the version it runs, and the transaction
    /// stays as it was. Recorded as `update_refused` (nothing changed).
    fn rollback_cancelled(&self, t: &Txn, r: &Refusal) -> ExitCode {
        let running = status_of(&Endpoint::for_home(self.home.dir()), Duration::from_secs(2)).ok();
        let runs_to = running.as_ref().and_then(|s| s.version.as_deref()) == Some(t.to.as_str());
        if runs_to && let Err(e) = swap_in(&t.staged, &t.target) {
            let mut t = t.clone();
            let msg = format!("the rollback was cancelled ({}), and {} cannot be put back: {e}", r.describe(), t.to);
            errln!("{msg}");
            return self.finish(&mut t, Phase::Failed, Some(msg), None);
        }
        let kept = if runs_to { &t.to } else { &t.from };
        let why = format!("the rollback's restart was cancelled: {}; {kept} stays installed", r.describe());
        let _ = self.ledger.append("update_refused", json!({"reason": why, "requester": requester(false)}));
        if self.json {
            outln!("{}", json!({"ok": false, "changed": false, "reason": why}));
        }
        errln!("{why}");
        ExitCode::from(1)
    }

    /// Finishes a transaction whose updater died (module doc): a new incarnation of the new
    /// version that is running now goes through probation; anything else is reverted.
    fn resume(&self, mut t: Txn) -> ExitCode {
        let _ = self.ledger.append("update_resumed", json!({"phase": t.phase, "from": t.from, "to": t.to}));
        errln!("finishing the update {} → {} left {:?} by pid {}", t.from, t.to, t.phase, t.updater_pid);
        let on_disk = sha256_file(&t.target).ok();
        if on_disk.as_deref() != Some(t.to_sha256.as_str()) {
            // Never swapped, or already swapped back: the old binary is in place.
            let why = format!("the updater died in phase {:?}", t.phase);
            return self.finish(&mut t, Phase::Failed, Some(why), None);
        }
        if t.phase == Phase::RollingBack {
            // The rollback was decided: carry it out, whatever runs now.
            let why = t.reason.clone().unwrap_or_else(|| "the updater died while rolling back".into());
            return self.roll_back(t, &why);
        }
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
        match last {
            Some(s) if s.state.as_deref() == Some("running") && s.version.as_deref() == Some(t.to.as_str()) => {
                match self.probation(&t, s) {
                    Ok(s) => {
                        let msg = format!(
                            "updated {} → {} (incarnation {})",
                            t.from,
                            t.to,
                            s.incarnation.clone().unwrap_or_default()
                        );
                        self.say(&msg);
                        self.notify(&t, &msg);
                        self.bless(&t);
                        self.finish(&mut t, Phase::Committed, None, s.incarnation)
                    }
                    Err(why) => self.roll_back(t, &why),
                }
            }
            Some(s) if s.state.as_deref() == Some("running") => {
                // The old version still runs (the restart never happened): revert the file.
                let why = format!("the updater died in phase {:?} before the new version ran", t.phase);
                if let Err(e) = swap_in(&t.previous, &t.target) {
                    let msg = format!("{why}; cannot swap the old binary back: {e}");
                    return self.finish(&mut t, Phase::Failed, Some(msg), s.incarnation);
                }
                self.notify(&t, &format!("update to {} failed: {why}; still on {}", t.to, t.from));
                self.finish(&mut t, Phase::RolledBack, Some(why), s.incarnation)
            }
            _ => self.roll_back(t, "no gateway became ready after the updater died"),
        }
    }
}

/// Pure: the processes `me` (this updater, and the command the operator ran) started, from the
/// ledger's `events` in order: what it spawned (`gateway_spawned` it wrote), the successor of a
/// gateway that took on a restart it asked for (`restart_requested` naming it, then
/// `successor_started`), and what those spawned in turn. A process a concurrent verb started
/// (the successor of a restart someone else asked for) is not among them.
pub(crate) fn started_by(me: &[u32], events: &[serde_json::Map<String, serde_json::Value>]) -> Vec<u32> {
    let pid_at = |e: &serde_json::Map<String, serde_json::Value>, k: &str| {
        e.get(k).and_then(serde_json::Value::as_u64).and_then(|p| u32::try_from(p).ok())
    };
    let mut ours: Vec<u32> = me.to_vec();
    // Per gateway, who the restart it carries out was taken on for (a joined or refused
    // request started nothing).
    let mut restarting_for: std::collections::HashMap<u32, Option<u32>> = std::collections::HashMap::new();
    for e in events {
        let Some(writer) = pid_at(e, "pid") else { continue };
        match e.get("event").and_then(|v| v.as_str()) {
            Some("restart_requested") if !e.contains_key("joined") => {
                let by = e.get("requester").and_then(|r| r.as_object()).and_then(|r| pid_at(r, "pid"));
                restarting_for.insert(writer, by);
            }
            Some("successor_started")
                if restarting_for.get(&writer).copied().flatten().is_some_and(|p| ours.contains(&p)) =>
            {
                ours.extend(pid_at(e, "successor_pid"));
            }
            Some("gateway_spawned") if ours.contains(&writer) => ours.extend(pid_at(e, "spawned_pid")),
            _ => {}
        }
    }
    ours.retain(|p| !me.contains(p));
    ours.sort_unstable();
    ours.dedup();
    ours
}

/// Who asked, for `update_refused`: the command the operator ran (or the gateway's, for chat
/// `/update`), on its channel.
fn requester(chat: bool) -> serde_json::Value {
    let r = if chat { gatewarden_control::Requester::current("chat") } else { gatewarden_control::Requester::cli() };
    json!({"pid": crate::orchestrator::requester_pid(), "argv": r.argv, "channel": r.channel})
}

/// The operator's stop in force, if any: an update starts nothing after it.
fn stopped(home: &Home) -> Option<Refusal> {
    desired::check(home.dir(), Starter::Resume).err()
}

/// Leaves one outcome notice for `chat` (of the adapter `platform`, or an HTTP chat); the
/// gateway delivers it once (`runtime/src/notices.rs`).
fn notify_chat(home: &Home, chat: &str, platform: Option<&str>, text: &str) {
    let v = json!({"chat_id": chat, "platform": platform, "text": text, "at": timefmt::now()});
    let name = format!("{}{}.json", gatewarden_runtime::notices::UPDATE_NOTIFY_PREFIX, std::process::id());
    if let Err(e) = fsio::write_json(&home.dir().join(name), &v) {
        errln!("warning: cannot leave the chat notice: {e}");
    }
}

/// At the start of `run`, before the gateway claims the home: an unfinished transaction
/// whose updater is dead (its lock is free) is finished here or handed to `update --resume`.
/// - This binary is the old version and the file on disk is the new one: the restart never
///   happened, so the swap is reverted at once (file operations only) and this start goes on.
/// - This binary is the new version: a detached `update --resume` runs the probation beside
///   this gateway and commits or rolls back.
pub fn on_gateway_start(home: &Home) {
    let Some(t) = read_txn(home).filter(|t| !t.phase.is_final()) else { return };
    let Ok(Some(lock)) = take_update_lock(home, false) else { return };
    if VERSION == t.from && sha256_file(&t.target).ok().as_deref() == Some(t.to_sha256.as_str()) {
        let why = format!("the updater died in phase {:?} before the new version ran; reverted at start", t.phase);
        let mut t = t;
        if swap_in(&t.previous, &t.target).is_ok() {
            let u = Updater::new(home, 0, false);
            u.notify(&t, &format!("update to {} failed: {why}; still on {}", t.to, t.from));
            let _ = u.finish(&mut t, Phase::RolledBack, Some(why), None);
        }
        return;
    }
    drop(lock);
    let Ok(exe) = owner::current_exe() else { return };
    let mut cmd = Command::new(exe);
    cmd.arg("--home").arg(home.dir()).args(["update", "--resume"]);
    cmd.env_remove(gatewarden_runtime::RUN_TAG);
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    gatewarden_lifecycle::platform::spawn::detach(&mut cmd, None);
    let _ = cmd.spawn();
}

/// For `supervise`: its child (running the swapped binary) ended before the update was
/// blessed: put the old binary back so the next child is the old version. With no updater
/// alive this finishes the transaction; a live updater sees the old version come back and
/// finishes its roll back. True when it reverted.
pub fn revert_after_crash(home: &Home, exit: &str, by: &str) -> bool {
    let Some(mut t) = read_txn(home) else { return false };
    if !runs_unblessed(&t, sha256_file(&t.target).ok().as_deref()) || swap_in(&t.previous, &t.target).is_err() {
        return false;
    }
    let why = format!("the new version exited ({exit}) before probation ended; reverted by {by}");
    let u = Updater::new(home, 0, false);
    match take_update_lock(home, false) {
        Ok(Some(_lock)) => {
            u.notify(&t, &format!("update to {} failed: {why}; still on {}", t.to, t.from));
            let _ = u.finish(&mut t, Phase::RolledBack, Some(why), None);
        }
        _ => {
            let _ = u.ledger.append("update_reverted", json!({"by": by, "reason": why}));
        }
    }
    true
}

/// The rule every route without the updater applies to a gateway that ended unplanned
/// (`supervise`, and through it launchd, whose LaunchAgent runs `supervise`; systemd's
/// `ExecStopPost=`): it ran an unblessed release when a transaction is unfinished and the file
/// on disk (`on_disk`, its sha256) is that transaction's new release. Otherwise it was the
/// old or the blessed binary crashing, which is the service manager's business.
pub fn runs_unblessed(t: &Txn, on_disk: Option<&str>) -> bool {
    !t.phase.is_final() && on_disk == Some(t.to_sha256.as_str())
}

/// Whether systemd's `$SERVICE_RESULT`/`$EXIT_STATUS` (as `ExecStopPost=` sees them) describe
/// a planned end: a planned restart (75) or a clean stop. Anything else is a crash.
fn systemd_end_is_planned(result: &str, status: &str) -> bool {
    // The codes come from the one exit table (crates/lifecycle/src/exit.rs).
    let is = |i: ExitIntent| status == i.code().to_string();
    is(ExitIntent::PlannedRestart) || (result == "success" && is(ExitIntent::PlannedStop))
}

/// `update --after-exit` under systemd's `ExecStopPost=`: the unit's main process ended; a
/// planned restart (75) or a clean stop changes nothing, anything else during an unfinished
/// update reverts it ([`revert_after_crash`]) so the relaunch runs the old binary.
fn after_exit(home: &Home) -> ExitCode {
    let result = std::env::var("SERVICE_RESULT").unwrap_or_default();
    let status = std::env::var("EXIT_STATUS").unwrap_or_default();
    if systemd_end_is_planned(&result, &status) {
        return ExitCode::SUCCESS;
    }
    let exit = format!("{result}, exit status {}", if status.is_empty() { "?" } else { &status });
    if revert_after_crash(home, &exit, "the unit's ExecStopPost") {
        errln!("reverted an unfinished update after the gateway ended ({exit})");
    }
    ExitCode::SUCCESS
}

/// The staged binary's `check` against the live home; `Ok` with its `warn` lines (what the new
/// version changes for this home, e.g. a new default).
fn preflight(home: &Home, staged: &Path, target: &Path) -> Result<Vec<String>, String> {
    let mut cmd = Command::new(staged);
    cmd.arg("--home").arg(home.dir()).arg("check").arg("--target").arg(target);
    let out = run_bounded(cmd, Duration::from_secs(30))?;
    if out.0 == Some(0) {
        let notes = out.1.lines().map(str::trim).filter(|l| l.starts_with("warn "));
        return Ok(notes.map(str::to_owned).collect());
    }
    let text = format!("{}{}", out.1, out.2);
    Err(format!("exit {}: {}", out.0.map_or("?".into(), |c| c.to_string()), text.trim()))
}

/// Why installing `candidate` over `running` is a downgrade that needs `--allow-downgrade`:
/// older, or not comparable (a downgrade cannot be ruled out). `None`: it is newer.
fn downgrade_refusal(running: &str, candidate: &str) -> Option<String> {
    let how = match compare_versions(candidate, running) {
        Some(std::cmp::Ordering::Greater) => return None,
        Some(_) => format!("release {candidate} is not newer than the running {running}"),
        None => format!("cannot tell whether release {candidate} is newer than the running {running}"),
    };
    Some(format!(
        "{how}: a downgrade needs `update --allow-downgrade` on the command line (chat /update never downgrades; \
         `update --rollback` returns to the last known good binary)"
    ))
}

/// Orders two versions `MAJOR.MINOR.PATCH[-PRE][+BUILD]` as semver does (build metadata
/// ignored, a pre-release before its release); `None` when either is not such a version.
fn compare_versions(a: &str, b: &str) -> Option<std::cmp::Ordering> {
    use std::cmp::Ordering;
    fn parse(v: &str) -> Option<(Vec<u64>, Option<&str>)> {
        let v = v.split('+').next()?;
        let (core, pre) = match v.split_once('-') {
            Some((c, p)) => (c, Some(p)),
            None => (v, None),
        };
        let nums: Vec<u64> = core.split('.').map(|n| n.parse().ok()).collect::<Option<_>>()?;
        (!nums.is_empty() && nums.len() <= 4).then_some((nums, pre))
    }
    fn pre_cmp(a: &str, b: &str) -> Ordering {
        let mut x = a.split('.');
        let mut y = b.split('.');
        loop {
            match (x.next(), y.next()) {
                (None, None) => return Ordering::Equal,
                (None, Some(_)) => return Ordering::Less,
                (Some(_), None) => return Ordering::Greater,
                (Some(p), Some(q)) => {
                    let o = match (p.parse::<u64>(), q.parse::<u64>()) {
                        (Ok(m), Ok(n)) => m.cmp(&n),
                        (Ok(_), Err(_)) => Ordering::Less,
                        (Err(_), Ok(_)) => Ordering::Greater,
                        (Err(_), Err(_)) => p.cmp(q),
                    };
                    if o != Ordering::Equal {
                        return o;
                    }
                }
            }
        }
    }
    let (an, ap) = parse(a)?;
    let (bn, bp) = parse(b)?;
    let width = an.len().max(bn.len());
    let pad = |v: &[u64]| (0..width).map(|i| v.get(i).copied().unwrap_or(0)).collect::<Vec<_>>();
    Some(pad(&an).cmp(&pad(&bn)).then_with(|| match (ap, bp) {
        (None, None) => Ordering::Equal,
        (None, Some(_)) => Ordering::Greater,
        (Some(_), None) => Ordering::Less,
        (Some(p), Some(q)) => pre_cmp(p, q),
    }))
}

/// What the staged binary says its version is (`gatewarden X` from `--version`).
fn release_version(path: &Path) -> Result<String, String> {
    let mut cmd = Command::new(path);
    cmd.arg("--version");
    let (code, out, err) = run_bounded(cmd, Duration::from_secs(10))
        .map_err(|e| format!("{} is not an executable gatewarden release: {e}", path.display()))?;
    parse_version(&out).filter(|_| code == Some(0)).ok_or_else(|| {
        format!("{} is not a gatewarden release: `--version` printed {:?} {:?}", path.display(), out.trim(), err.trim())
    })
}

fn parse_version(out: &str) -> Option<String> {
    let v = out.trim().strip_prefix("gatewarden ")?.trim();
    let ok = !v.is_empty() && v.len() <= 64 && v.chars().all(|c| c.is_ascii_alphanumeric() || ".-+_".contains(c));
    ok.then(|| v.to_owned())
}

/// Runs `cmd`, killing it after `limit`: (exit code, stdout, stderr).
fn run_bounded(mut cmd: Command, limit: Duration) -> Result<(Option<i32>, String, String), String> {
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| e.to_string())?;
    let mut out = child.stdout.take();
    let mut err = child.stderr.take();
    let reader = std::thread::spawn(move || {
        let mut o = String::new();
        let mut e = String::new();
        if let Some(s) = out.as_mut() {
            let _ = s.take(1 << 20).read_to_string(&mut o);
        }
        if let Some(s) = err.as_mut() {
            let _ = s.take(1 << 20).read_to_string(&mut e);
        }
        (o, e)
    });
    let until = Instant::now() + limit;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("did not finish within {}s", limit.as_secs()));
            }
            Err(e) => return Err(e.to_string()),
        }
    };
    let (o, e) = reader.join().unwrap_or_default();
    Ok((status.code(), o, e))
}

/// The bounds on a download (a stalled server must not hold `update.lock` forever, nor keep a
/// chat `/update` from its outcome notice): connecting, the response headers (first byte), the
/// gap between two reads of the body, and the whole download.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DownloadLimits {
    connect: Duration,
    first_byte: Duration,
    idle: Duration,
    total: Duration,
}

/// Internal (tests): `connect,first_byte,idle,total` in milliseconds instead of the defaults.
const DOWNLOAD_LIMITS_ENV: &str = "GATEWARDEN_TEST_DOWNLOAD_LIMITS_MS";

impl DownloadLimits {
    const DEFAULT: DownloadLimits = DownloadLimits {
        connect: Duration::from_secs(10),
        first_byte: Duration::from_secs(30),
        idle: Duration::from_secs(30),
        total: Duration::from_secs(600),
    };

    fn current() -> DownloadLimits {
        std::env::var(DOWNLOAD_LIMITS_ENV).ok().and_then(|v| DownloadLimits::parse(&v)).unwrap_or(Self::DEFAULT)
    }

    fn parse(v: &str) -> Option<DownloadLimits> {
        let ms: Vec<u64> = v.split(',').map(|p| p.trim().parse().ok()).collect::<Option<_>>()?;
        let &[connect, first_byte, idle, total] = ms.as_slice() else { return None };
        let d = Duration::from_millis;
        Some(DownloadLimits { connect: d(connect), first_byte: d(first_byte), idle: d(idle), total: d(total) })
    }

    /// Which bound a ureq timeout is, for the refusal.
    fn describe(&self, t: ureq::Timeout) -> String {
        use ureq::Timeout as T;
        match t {
            T::Resolve | T::Connect => format!("connect timeout: no connection within {:?}", self.connect),
            T::SendRequest | T::Await100 | T::SendBody | T::RecvResponse => {
                format!("first-byte timeout: no response within {:?}", self.first_byte)
            }
            T::PerRead | T::PerWrite => format!("idle timeout: no data for {:?}", self.idle),
            // Global, PerCall, RecvBody (and any later addition: the enum is non-exhaustive).
            _ => {
                format!("total timeout: the download took longer than {:?}", self.total)
            }
        }
    }
}

/// A path, or an http(s) URL fetched with crates/net's TLS (the system roots or `[update]
/// ca_file) and the environment's proxy, within [`DownloadLimits`].
fn fetch(src: &str, ca_file: Option<&Path>) -> Result<Vec<u8>, String> {
    if src.starts_with("http://") || src.starts_with("https://") {
        let limits = DownloadLimits::current();
        let out = gatewarden_net::Outbound::new(ca_file, None).map_err(|e| format!("[update] {e}"))?;
        let agent = gatewarden_net::http_config(&out)
            .timeout_connect(Some(limits.connect))
            .timeout_recv_response(Some(limits.first_byte))
            .timeout_per_read(Some(limits.idle))
            .timeout_global(Some(limits.total))
            .build()
            .new_agent();
        let why = |e: ureq::Error| match e {
            ureq::Error::Timeout(t) => format!("cannot download {src}: {}", limits.describe(t)),
            e => format!("cannot download {src}: {}", gatewarden_net::describe(&e, src)),
        };
        let resp = agent.get(src).call().map_err(why)?;
        let mut body = resp.into_body();
        return body.with_config().limit(MAX_RELEASE_BYTES).read_to_vec().map_err(why);
    }
    let meta = std::fs::metadata(src).map_err(|e| format!("cannot read {src}: {e}"))?;
    if !meta.is_file() {
        return Err(format!("{src} is not a file"));
    }
    std::fs::read(src).map_err(|e| format!("cannot read {src}: {e}"))
}

fn verify_signature(public_key: &str, bytes: &[u8], sig_src: &str, ca_file: Option<&Path>) -> Result<(), String> {
    let pk = minisign_verify::PublicKey::from_base64(public_key.trim())
        .map_err(|e| format!("[update] public_key is not a minisign public key: {e}"))?;
    let sig_bytes =
        fetch(sig_src, ca_file).map_err(|e| format!("a signature is required ([update] public_key is set): {e}"))?;
    let text = String::from_utf8(sig_bytes).map_err(|_| format!("{sig_src} is not a minisign signature"))?;
    let sig = minisign_verify::Signature::decode(&text).map_err(|e| format!("{sig_src}: {e}"))?;
    pk.verify(bytes, &sig, false).map_err(|e| format!("signature check failed ({sig_src}): {e}"))
}

/// Puts a copy of `release` at `target` with one rename in the target's directory. Windows
/// refuses to replace a running executable but lets it be renamed: it is moved aside first.
fn swap_in(release: &Path, target: &Path) -> std::io::Result<()> {
    let dir = target.parent().ok_or_else(|| std::io::Error::other("the executable has no directory"))?;
    let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.update-{}", std::process::id()));
    std::fs::copy(release, &tmp)?;
    std::fs::File::open(&tmp)?.sync_all()?;
    crate::os::proc::make_executable(&tmp)?;
    match std::fs::rename(&tmp, target) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            let aside = dir.join(format!(".{name}.old-{}", std::process::id()));
            std::fs::rename(target, &aside)?;
            std::fs::rename(&tmp, target)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// Refuses binaries a package manager owns (axoupdater's rule): its next upgrade would undo
/// ours, or fail on the changed file. Returns what to run instead.
pub fn package_manager_owner(exe: &Path) -> Option<String> {
    let p = exe.to_string_lossy();
    let (who, instead) = if p.starts_with("/nix/store/") {
        ("Nix", "update it through your Nix configuration (nix profile upgrade / nixos-rebuild)")
    } else if p.starts_with("/opt/homebrew/") || p.contains("/Cellar/") || p.starts_with("/home/linuxbrew/") {
        ("Homebrew", "brew upgrade gatewarden")
    } else if p.starts_with("/snap/") {
        ("snap", "snap refresh gatewarden")
    } else if ["/usr/bin/", "/usr/sbin/", "/bin/", "/sbin/"].iter().any(|d| p.starts_with(d)) {
        ("the system package manager", "apt upgrade gatewarden (or dnf/pacman upgrade)")
    } else {
        return None;
    };
    Some(format!("{} is installed by {who}; update it with: {instead}", exe.display()))
}

/// The last `n` lines of the gateway's log (background starts write it) written since `since`
/// (lines start with an RFC 3339 timestamp in the same format, so they compare as text).
fn log_tail(home: &Home, since: &str, n: usize) -> String {
    let text = std::fs::read(home.logs_dir().join("gateway.log")).unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let lines: Vec<&str> = text.lines().filter(|l| l.get(..since.len()).is_some_and(|t| t >= since)).collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_order_as_semver_and_downgrades_are_named() {
        use std::cmp::Ordering::*;
        for (a, b, o) in [
            ("0.1.0", "0.0.9", Greater),
            ("0.10.0", "0.9.0", Greater),
            ("1.0", "1.0.0", Equal),
            ("1.0.0-rc.1", "1.0.0", Less),
            ("1.0.0-rc.2", "1.0.0-rc.10", Less),
            ("1.0.0-alpha", "1.0.0-1", Greater),
            ("1.0.0+abc", "1.0.0+def", Equal),
        ] {
            assert_eq!(compare_versions(a, b), Some(o), "{a} vs {b}");
            assert_eq!(compare_versions(b, a), Some(o.reverse()), "{b} vs {a}");
        }
        assert_eq!(compare_versions("dev", "0.1.0"), None);
        assert_eq!(downgrade_refusal("0.1.0", "0.2.0"), None);
        assert!(downgrade_refusal("0.1.0", "0.0.1").is_some_and(|w| w.contains("--allow-downgrade")));
        assert!(downgrade_refusal("0.1.0", "nightly").is_some_and(|w| w.contains("cannot tell")));
    }

    #[test]
    fn download_limits_parse_and_name_each_bound() {
        let l = DownloadLimits::parse("1,2,3,4").unwrap();
        assert_eq!(l.idle, Duration::from_millis(3));
        assert_eq!(DownloadLimits::parse("1,2,3"), None);
        assert!(l.describe(ureq::Timeout::Connect).starts_with("connect timeout"));
        assert!(l.describe(ureq::Timeout::RecvResponse).starts_with("first-byte timeout"));
        assert!(l.describe(ureq::Timeout::PerRead).starts_with("idle timeout"));
        assert!(l.describe(ureq::Timeout::Global).starts_with("total timeout"));
    }

    #[test]
    fn package_managers_are_named() {
        assert!(package_manager_owner(Path::new("/usr/bin/gatewarden")).unwrap().contains("apt upgrade"));
        assert!(package_manager_owner(Path::new("/nix/store/abc-gatewarden/bin/gatewarden")).unwrap().contains("Nix"));
        assert!(package_manager_owner(Path::new("/opt/homebrew/bin/gatewarden")).unwrap().contains("brew upgrade"));
        assert!(package_manager_owner(Path::new("/home/a/.local/bin/gatewarden")).is_none());
        assert!(package_manager_owner(Path::new("/usr/local/bin/gatewarden")).is_none());
    }

    #[test]
    fn versions_parse_strictly() {
        assert_eq!(parse_version("gatewarden 0.2.0-rc1\n").as_deref(), Some("0.2.0-rc1"));
        assert_eq!(parse_version("gatewarden \n"), None);
        assert_eq!(parse_version("other 1.0"), None);
        assert_eq!(parse_version("gatewarden 1.0; rm -rf /"), None);
    }

    fn txn(phase: Phase) -> Txn {
        Txn {
            from: "1.0.0".into(),
            to: "1.1.0".into(),
            phase,
            started: "2026-01-01T00:00:00Z".into(),
            target: "/opt/gw/gatewarden".into(),
            staged: "/h/releases/1.1.0-bbbb/gatewarden".into(),
            previous: "/h/releases/1.0.0-aaaa/gatewarden".into(),
            from_sha256: "aaaa".into(),
            to_sha256: "bbbb".into(),
            updater_pid: 1,
            chat: None,
            platform: None,
            reason: None,
            incarnation: None,
            finished: None,
            elapsed_ms: None,
        }
    }

    /// supervise (and launchd through it) and ExecStopPost revert exactly when the new file
    /// of an unfinished transaction is what ran.
    #[test]
    fn only_an_unblessed_release_on_disk_is_reverted() {
        for phase in [Phase::Swapped, Phase::Restarting, Phase::Probation, Phase::RollingBack] {
            assert!(runs_unblessed(&txn(phase), Some("bbbb")), "{phase:?}");
            assert!(!runs_unblessed(&txn(phase), Some("aaaa")), "the old binary is in place: {phase:?}");
            assert!(!runs_unblessed(&txn(phase), None), "unreadable: leave it: {phase:?}");
        }
        for phase in [Phase::Committed, Phase::RolledBack, Phase::Failed] {
            assert!(!runs_unblessed(&txn(phase), Some("bbbb")), "a finished transaction: {phase:?}");
        }
    }

    #[test]
    fn systemd_planned_ends_are_told_from_crashes() {
        assert!(systemd_end_is_planned("success", "75"));
        assert!(systemd_end_is_planned("exit-code", "75"));
        assert!(systemd_end_is_planned("success", "0"));
        assert!(!systemd_end_is_planned("exit-code", "1"));
        assert!(!systemd_end_is_planned("signal", "KILL"));
        assert!(!systemd_end_is_planned("exit-code", "78"));
        assert!(!systemd_end_is_planned("", ""));
    }

    #[test]
    fn an_update_ends_only_what_it_started() {
        let ev = |v: serde_json::Value| v.as_object().unwrap().clone();
        let events = vec![
            // The update's own restart of gateway 10: its successor 11 is ours.
            ev(json!({"event": "restart_requested", "pid": 10, "requester": {"pid": 5}})),
            ev(json!({"event": "successor_started", "pid": 10, "successor_pid": 11})),
            // A concurrent `restart` (pid 7) asks 11: its successor 12 is not ours.
            ev(json!({"event": "restart_requested", "pid": 11, "requester": {"pid": 7}})),
            ev(json!({"event": "successor_started", "pid": 11, "successor_pid": 12})),
            // The ladder's kick: a `gatewarden start` 20, whose gateway 21 is ours too.
            ev(json!({"event": "gateway_spawned", "pid": 5, "spawned_pid": 20})),
            ev(json!({"event": "gateway_spawned", "pid": 20, "spawned_pid": 21})),
            // What the concurrent `restart` spawned itself is not.
            ev(json!({"event": "gateway_spawned", "pid": 7, "spawned_pid": 30})),
        ];
        assert_eq!(started_by(&[5, 4], &events), vec![11, 20, 21]);
        assert!(started_by(&[99], &events).is_empty());
    }

    #[test]
    fn unfinished_phases() {
        assert!(!Phase::Swapped.is_final());
        assert!(Phase::RolledBack.is_final());
        let t: Phase = serde_json::from_value(json!("rolling_back")).unwrap();
        assert_eq!(t, Phase::RollingBack);
    }
}
