//! The update transaction's decisions: a pure state machine, observation in, action out.
//!
//! The driver (`update/mod.rs`) carries out each [`Action`] with the edges — `fetch.rs`,
//! `verify.rs`, `swap.rs`, `run.rs`, `candidates.rs` and the restart ladder — and hands what
//! came of it back to [`Transaction::step`] as an [`Observation`], until an action
//! [`is_final`](Action::is_final). The probation's loop is [`Probe`], fed looks at the control
//! endpoint with the elapsed time. So the tests below run every branch of the transaction
//! against scripted worlds, with no file, process or clock.
//!
//! Invariants (docs/architecture.md "Updates"):
//! 1. **Never swap before verify.** The swap comes only after the release was fetched, its
//!    sha256 and signature checked, staged, its version accepted (not the running one, not older
//!    unless the operator allowed it) and its preflight passed; every failure before the swap
//!    is a refusal with nothing changed.
//! 2. **The old binary is kept until the new one proves ready.** It is copied to its release
//!    directory and the transaction recorded before the swap; only [`Action::Commit`] (after the
//!    new incarnation reported the new version and passed probation) blesses the new file.
//! 3. **A failed start rolls back.** A failed swap puts the old file back; a failed restart, a
//!    wrong version or a failed probation swaps the old binary back, restarts it and verifies
//!    it runs; a rollback that fails ends `failed` with what to run.
//! 4. **A stop wins.** A stop recorded during the restart or probation is the operator's: the
//!    rollback puts the old file back and starts nothing.
//! 5. **A killed updater is finished by the next start** ([`Transaction::resume`],
//!    [`at_gateway_start`], [`runs_unblessed`]): the new version running goes through probation,
//!    the old one running gets its file back, anything else is rolled back.
//! 6. **Only its own gateway is ended.** Candidates are cleared only on the way back
//!    ([`Action::ClearCandidates`]) and at commit, keeping the incarnation the transaction ends
//!    with; which processes are its own is `candidates.rs`'s rule.

use std::path::PathBuf;
use std::time::Duration;

use super::Phase;
use super::version::downgrade_refusal;

/// A new incarnation silent on its control endpoint this long during probation has failed.
pub const SILENT_LIMIT: Duration = Duration::from_secs(3);

/// What a gateway's control endpoint said.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Gateway {
    pub incarnation: Option<String>,
    pub version: Option<String>,
    pub state: Option<String>,
    pub pid: Option<u32>,
}

impl Gateway {
    fn runs(&self, version: &str) -> bool {
        self.running() && self.version.as_deref() == Some(version)
    }

    fn running(&self) -> bool {
        self.state.as_deref() == Some("running")
    }
}

/// Which file a restart brings up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Onto {
    /// The release just swapped in (phase `restarting`).
    New,
    /// The old binary, swapped back (a rollback).
    Old,
}

/// How the old version is back after a rollback.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Back {
    /// Its file is in place, but a stop is in force (described): nothing was started.
    Stopped(String),
    /// The old incarnation never stopped running it (its restart's drain was cancelled).
    NeverStopped(Gateway),
    /// Restarted onto it, verified.
    Restarted(Gateway),
}

/// What the driver does next. The last few are final: the transaction is over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// The operator's stop, a package manager's file, where the running gateway executes, the
    /// configuration: [`Observation::Checked`] or `Failed`.
    Check,
    /// Read or download the release.
    Fetch,
    /// Its sha256 and signature, over the bytes as fetched.
    Verify,
    /// Open an archive, write the release under `releases/`, ask it its version:
    /// [`Observation::Staged`].
    Stage,
    /// The staged binary's `check` against the live home.
    Preflight { version: String },
    /// Copy the running binary to its own release directory (last known good).
    KeepPrevious,
    /// `update.json` (`swapping`) and `update_started`.
    Record,
    /// Let a restart or start already under way finish (bounded).
    AwaitRestartUnderWay,
    /// The staged release over the executable (then `swapped`).
    SwapIn,
    /// The swap failed: the old file back if the executable changed.
    PutBackIfChanged,
    /// Restart through the ladder, verified: [`Observation::Running`].
    Restart { onto: Onto },
    /// Probation of this incarnation ([`Probe`]).
    Probation { gateway: Gateway },
    /// Is an operator's stop in force? [`Observation::Refused`] with it, or `Done`.
    CheckStop,
    /// Record `rolling_back` with the reason.
    BeginRollBack { why: String },
    /// End what candidates of this update left (they may hold the port or the lock), except the
    /// gateway that answers.
    ClearCandidates,
    /// The old binary over the executable.
    SwapBack,
    /// May the rollback start the old version? `Refused` with the stop in force, or `Done`.
    MayStart,
    /// What answers now (bounded by `patience`): [`Observation::Running`] or `NoAnswer`.
    LookAtGateway { patience: Duration },
    /// Wait (bounded) for a gateway in state `running`; the last answer seen, or `NoAnswer`.
    AwaitRunning,
    /// `update --rollback` failed: was its restart's drain cancelled? `Refused` with it, or
    /// `Done`.
    CheckCancelled,
    /// Final: refused before anything changed (exit 1).
    Refuse { why: String },
    /// Final: nothing changed, and the record is left as it was (exit 1).
    Unchanged { why: String },
    /// Final: the new version passed; bless it. `resumed`: a later updater finished it.
    Commit { gateway: Gateway, resumed: bool },
    /// Final: the old version is back.
    RolledBack { why: String, back: Back },
    /// Final: the rollback failed too; the kept binary is what to run by hand.
    RollbackFailed { why: String, error: String },
    /// Final: the transaction ends in `phase`; `notify`: tell the chat that asked it failed.
    End { phase: Phase, why: String, incarnation: Option<String>, notify: bool },
}

impl Action {
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            Action::Refuse { .. }
                | Action::Unchanged { .. }
                | Action::Commit { .. }
                | Action::RolledBack { .. }
                | Action::RollbackFailed { .. }
                | Action::End { .. }
        )
    }
}

/// What came of the last action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observation {
    /// It was carried out.
    Done,
    /// It failed, with why.
    Failed(String),
    /// [`Action::Check`] passed; whether `[update] public_key` is set.
    Checked { signing_key: bool },
    /// [`Action::Stage`]: the version the staged binary prints.
    Staged { version: String },
    /// A gateway answered.
    Running(Gateway),
    /// No gateway answered.
    NoAnswer,
    /// A stop (or a cancellation) is in force, described.
    Refused(String),
}

/// `update --from`: what is known before anything is fetched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Install {
    /// The version this binary is (the running one).
    pub running: String,
    /// The release is a URL, not a path.
    pub url: bool,
    /// `--sha256` was given.
    pub sha256: bool,
    /// `--allow-downgrade` on the command line (never from a chat).
    pub may_downgrade: bool,
}

/// `update --rollback`: the last transaction, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Last {
    pub phase: Phase,
    pub from: String,
    pub to: String,
    pub previous: PathBuf,
    /// The last known good binary is still there.
    pub previous_kept: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Install,
    Resume,
    ByHand,
}

/// Where the transaction is: the action it waits on the outcome of, by stage.
#[derive(Debug, Clone, PartialEq, Eq)]
enum At {
    Vet(Vet),
    Start(Start),
    Return(Return),
    Resumed(Resumed),
    Over,
}

/// Before the swap: nothing has changed yet.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Vet {
    Check,
    Fetch,
    Verify,
    Stage,
    Preflight,
    KeepPrevious,
}

/// The swap, the restart onto it and its probation.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Start {
    Record,
    AwaitRestartUnderWay,
    SwapIn,
    PutBack { why: String },
    Restart,
    Probation,
    CheckStop { why: String },
}

/// The way back to the old version.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Return {
    Begin,
    ClearCandidates,
    SwapBack,
    MayStart,
    LookAtOld,
    RestartOld,
    CheckStopOld { error: String },
    CheckCancelled { error: String },
    LookAfterCancel { cancel: String },
    SwapStagedBack { cancel: String },
}

/// A transaction found unfinished.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Resumed {
    AwaitRunning,
    SwapBack { why: String, incarnation: Option<String> },
}

impl From<Vet> for At {
    fn from(v: Vet) -> At {
        At::Vet(v)
    }
}

impl From<Start> for At {
    fn from(v: Start) -> At {
        At::Start(v)
    }
}

impl From<Return> for At {
    fn from(v: Return) -> At {
        At::Return(v)
    }
}

impl From<Resumed> for At {
    fn from(v: Resumed) -> At {
        At::Resumed(v)
    }
}

/// One update transaction: `update --from`, a resumed one, or `update --rollback`.
#[derive(Debug, Clone)]
pub struct Transaction {
    mode: Mode,
    at: At,
    from: String,
    to: String,
    install: Option<Install>,
    /// Why the transaction rolls back, once it does.
    why: String,
    /// The incarnation on probation.
    gateway: Gateway,
    /// Where a resumed transaction was left.
    phase: Phase,
    last: Option<Action>,
}

impl Transaction {
    fn new(mode: Mode, from: &str, to: &str) -> Transaction {
        Transaction {
            mode,
            at: At::Over,
            from: from.to_owned(),
            to: to.to_owned(),
            install: None,
            why: String::new(),
            gateway: Gateway::default(),
            phase: Phase::Swapping,
            last: None,
        }
    }

    /// `update --from`: the first action.
    pub fn install(i: Install) -> (Transaction, Action) {
        let mut m = Transaction::new(Mode::Install, &i.running, "");
        m.install = Some(i);
        let first = m.go(Vet::Check, Action::Check);
        (m, first)
    }

    /// A transaction whose updater died, found unfinished with `update.lock` free:
    /// `new_on_disk`, the executable is its new release; `reason`, the one recorded.
    pub fn resume(
        phase: Phase,
        from: &str,
        to: &str,
        new_on_disk: bool,
        reason: Option<&str>,
    ) -> (Transaction, Action) {
        let mut m = Transaction::new(Mode::Resume, from, to);
        m.phase = phase;
        let first = if !new_on_disk {
            // Never swapped, or already swapped back: the old binary is in place.
            let why = format!("the updater died in phase {phase:?}");
            m.over(Action::End { phase: Phase::Failed, why, incarnation: None, notify: false })
        } else if phase == Phase::RollingBack {
            // The rollback was decided: carry it out, whatever runs now.
            m.roll_back(reason.unwrap_or("the updater died while rolling back"))
        } else {
            m.go(Resumed::AwaitRunning, Action::AwaitRunning)
        };
        (m, first)
    }

    /// `update --rollback` in `home`: the last update's previous binary back, verified.
    pub fn rollback_by_hand(home: &str, last: Option<&Last>) -> (Transaction, Action) {
        let Some(l) = last else {
            let why = format!("no update recorded in {home}: nothing to roll back to");
            return (Transaction::new(Mode::ByHand, "", ""), Action::Unchanged { why });
        };
        let mut m = Transaction::new(Mode::ByHand, &l.from, &l.to);
        m.why = "rolled back by hand (`update --rollback`)".into();
        // A failed transaction may have left the new file in place (its rollback failed).
        let first = if !matches!(l.phase, Phase::Committed | Phase::Failed) {
            let why =
                format!("the last update ({} → {}) is {:?}: the binary is already {}", l.from, l.to, l.phase, l.from);
            m.over(Action::Unchanged { why })
        } else if !l.previous_kept {
            m.over(Action::Unchanged { why: format!("the last known good binary {} is gone", l.previous.display()) })
        } else {
            m.go(Start::AwaitRestartUnderWay, Action::AwaitRestartUnderWay)
        };
        (m, first)
    }

    /// The version the transaction installs (known once staged).
    pub fn to(&self) -> &str {
        &self.to
    }

    fn go(&mut self, at: impl Into<At>, action: Action) -> Action {
        self.at = at.into();
        action
    }

    fn over(&mut self, action: Action) -> Action {
        self.at = At::Over;
        self.last = Some(action.clone());
        action
    }

    fn refuse(&mut self, why: String) -> Action {
        self.over(Action::Refuse { why })
    }

    fn roll_back(&mut self, why: &str) -> Action {
        self.why = why.to_owned();
        self.go(Return::Begin, Action::BeginRollBack { why: why.to_owned() })
    }

    fn rolled_back(&mut self, back: Back) -> Action {
        let why = self.why.clone();
        self.over(Action::RolledBack { why, back })
    }

    fn rollback_failed(&mut self, error: String) -> Action {
        if self.mode == Mode::ByHand {
            return self.go(Return::CheckCancelled { error }, Action::CheckCancelled);
        }
        let why = self.why.clone();
        self.over(Action::RollbackFailed { why, error })
    }

    /// A failed restart or probation: a stop in force is the operator's, not the new version's.
    fn after_failed_start(&mut self, why: String) -> Action {
        match self.mode {
            Mode::Install => self.go(Start::CheckStop { why }, Action::CheckStop),
            _ => self.roll_back(&why),
        }
    }

    pub fn step(&mut self, obs: Observation) -> Action {
        match std::mem::replace(&mut self.at, At::Over) {
            At::Vet(v) => self.vet(v, obs),
            At::Start(s) => self.start(s, obs),
            At::Return(r) => self.go_back(r, obs),
            At::Resumed(r) => self.resumed(r, obs),
            At::Over => self.last.clone().unwrap_or(Action::Unchanged { why: "the transaction is over".into() }),
        }
    }

    /// Before the swap: every failure is a refusal (invariant 1).
    fn vet(&mut self, at: Vet, obs: Observation) -> Action {
        use Observation as O;
        let failed = failure(&obs);
        match at {
            Vet::Check => match obs {
                O::Checked { signing_key } => {
                    let i = self.install.clone().unwrap_or_else(|| Install {
                        running: self.from.clone(),
                        url: false,
                        sha256: false,
                        may_downgrade: false,
                    });
                    // A configured signing key authenticates a URL by itself (chat `/update` has
                    // no per-release hash to give); without one, the hash is required.
                    if i.url && !i.sha256 && !signing_key {
                        return self.refuse("--sha256 is required for a URL (or set [update] public_key)".into());
                    }
                    self.go(Vet::Fetch, Action::Fetch)
                }
                obs => self.refuse(why_of(obs, "the checks did not pass")),
            },
            Vet::Fetch => match failed {
                Some(why) => self.refuse(why),
                None => self.go(Vet::Verify, Action::Verify),
            },
            Vet::Verify => match failed {
                Some(why) => self.refuse(why),
                None => self.go(Vet::Stage, Action::Stage),
            },
            Vet::Stage => match obs {
                O::Staged { version } => self.accept(version),
                obs => self.refuse(why_of(obs, "the release was not staged")),
            },
            Vet::Preflight => match failed {
                Some(why) => self.refuse(format!("preflight of {} failed: {why}", self.to)),
                None => self.go(Vet::KeepPrevious, Action::KeepPrevious),
            },
            Vet::KeepPrevious => match failed {
                Some(why) => self.refuse(why),
                None => self.go(Start::Record, Action::Record),
            },
        }
    }

    /// The swap, the restart onto the new file and its probation (invariants 2 and 3).
    fn start(&mut self, at: Start, obs: Observation) -> Action {
        use Observation as O;
        let failed = failure(&obs);
        match at {
            Start::Record => self.go(Start::AwaitRestartUnderWay, Action::AwaitRestartUnderWay),
            Start::AwaitRestartUnderWay => match self.mode {
                Mode::ByHand => self.go(Return::ClearCandidates, Action::ClearCandidates),
                _ => self.go(Start::SwapIn, Action::SwapIn),
            },
            Start::SwapIn => match failed {
                Some(e) => {
                    let why = format!("cannot swap the executable: {e}");
                    self.go(Start::PutBack { why }, Action::PutBackIfChanged)
                }
                None => self.go(Start::Restart, Action::Restart { onto: Onto::New }),
            },
            Start::PutBack { why } => {
                self.over(Action::End { phase: Phase::Failed, why, incarnation: None, notify: false })
            }
            Start::Restart => match obs {
                O::Running(g) if g.version.as_deref() == Some(self.to.as_str()) => {
                    self.gateway = g.clone();
                    self.go(Start::Probation, Action::Probation { gateway: g })
                }
                O::Running(g) => {
                    let v = g.version.unwrap_or_else(|| "?".into());
                    let why = format!("the new incarnation reports version {v}, expected {}", self.to);
                    self.after_failed_start(why)
                }
                obs => self.after_failed_start(why_of(obs, "the restart did not verify")),
            },
            Start::Probation => match failed {
                Some(why) => self.after_failed_start(why),
                None => {
                    let gateway = self.gateway.clone();
                    self.over(Action::Commit { gateway, resumed: self.mode == Mode::Resume })
                }
            },
            Start::CheckStop { why } => match obs {
                // The operator's stop, not a failure of the new version: said so, and the
                // rollback starts nothing.
                O::Refused(stop) => self.roll_back(&format!("interrupted before probation ended: {stop}")),
                _ => self.roll_back(&why),
            },
        }
    }

    /// The way back: swap back, then restart unless a stop is in force (invariants 3 and 4).
    fn go_back(&mut self, at: Return, obs: Observation) -> Action {
        use Observation as O;
        let failed = failure(&obs);
        match at {
            Return::Begin => self.go(Return::ClearCandidates, Action::ClearCandidates),
            Return::ClearCandidates => self.go(Return::SwapBack, Action::SwapBack),
            Return::SwapBack => match failed {
                Some(e) => self.rollback_failed(format!("cannot swap the old binary back: {e}")),
                None => self.go(Return::MayStart, Action::MayStart),
            },
            Return::MayStart => match obs {
                O::Refused(stop) => self.rolled_back(Back::Stopped(stop)),
                _ => self.go(Return::LookAtOld, Action::LookAtGateway { patience: Duration::from_millis(500) }),
            },
            // The old version never stopped: it is what the rollback restarts onto, so a second
            // drain would only wait on the same runs again.
            Return::LookAtOld => match obs {
                O::Running(g) if g.runs(&self.from) => self.rolled_back(Back::NeverStopped(g)),
                _ => self.go(Return::RestartOld, Action::Restart { onto: Onto::Old }),
            },
            Return::RestartOld => match obs {
                O::Running(g) if g.version.as_deref() == Some(self.from.as_str()) => {
                    self.rolled_back(Back::Restarted(g))
                }
                O::Running(g) => {
                    let v = g.version.unwrap_or_else(|| "?".into());
                    self.rollback_failed(format!("after the swap back the gateway reports version {v}"))
                }
                obs => {
                    let error = why_of(obs, "the restart did not verify");
                    self.go(Return::CheckStopOld { error }, Action::CheckStop)
                }
            },
            // A stop recorded during the rollback's restart: the old file is in place, and the
            // gateway stays down as the operator asked; not a failed rollback.
            Return::CheckStopOld { error } => match obs {
                O::Refused(stop) => self.rolled_back(Back::Stopped(stop)),
                _ => self.rollback_failed(error),
            },
            // `--rollback`'s restart had its drain cancelled: the operator kept the running
            // gateway, so the installed file goes back to the version it runs.
            Return::CheckCancelled { error } => match obs {
                O::Refused(cancel) => self
                    .go(Return::LookAfterCancel { cancel }, Action::LookAtGateway { patience: Duration::from_secs(2) }),
                _ => {
                    let why = self.why.clone();
                    self.over(Action::RollbackFailed { why, error })
                }
            },
            Return::LookAfterCancel { cancel } => match obs {
                O::Running(g) if g.version.as_deref() == Some(self.to.as_str()) => {
                    self.go(Return::SwapStagedBack { cancel }, Action::SwapIn)
                }
                _ => self.cancelled(&cancel, &self.from.clone()),
            },
            Return::SwapStagedBack { cancel } => match failed {
                Some(e) => {
                    let why = format!("the rollback was cancelled ({cancel}), and {} cannot be put back: {e}", self.to);
                    self.over(Action::End { phase: Phase::Failed, why, incarnation: None, notify: false })
                }
                None => self.cancelled(&cancel, &self.to.clone()),
            },
        }
    }

    /// A transaction whose updater died, the new file in place (invariant 5).
    fn resumed(&mut self, at: Resumed, obs: Observation) -> Action {
        use Observation as O;
        let failed = failure(&obs);
        match at {
            Resumed::AwaitRunning => match obs {
                O::Running(g) if g.runs(&self.to) => {
                    self.gateway = g.clone();
                    self.go(Start::Probation, Action::Probation { gateway: g })
                }
                // The old version still runs (the restart never happened): revert the file.
                O::Running(g) if g.running() => {
                    let why = format!("the updater died in phase {:?} before the new version ran", self.phase);
                    self.go(Resumed::SwapBack { why, incarnation: g.incarnation }, Action::SwapBack)
                }
                _ => self.roll_back("no gateway became ready after the updater died"),
            },
            Resumed::SwapBack { why, incarnation } => match failed {
                Some(e) => {
                    let why = format!("{why}; cannot swap the old binary back: {e}");
                    self.over(Action::End { phase: Phase::Failed, why, incarnation, notify: false })
                }
                None => self.over(Action::End { phase: Phase::RolledBack, why, incarnation, notify: true }),
            },
        }
    }

    /// The staged release's version: not the running one, and newer unless the operator said
    /// otherwise.
    fn accept(&mut self, version: String) -> Action {
        let (running, may_downgrade) =
            self.install.as_ref().map_or((self.from.clone(), false), |i| (i.running.clone(), i.may_downgrade));
        if version == running {
            return self.refuse(format!("the release is version {running}, the version this binary already is"));
        }
        // Going back is never silent, signed or not: an old release brings back what a later
        // one fixed (a signed one is still a valid signature, so replaying it is an attack).
        // Only an operator on the command line may go back (issue 27 §7).
        if !may_downgrade && let Some(why) = downgrade_refusal(&running, &version) {
            return self.refuse(why);
        }
        self.to = version.clone();
        self.go(Vet::Preflight, Action::Preflight { version })
    }

    fn cancelled(&mut self, cancel: &str, kept: &str) -> Action {
        let why = format!("the rollback's restart was cancelled: {cancel}; {kept} stays installed");
        self.over(Action::Unchanged { why })
    }
}

fn failure(obs: &Observation) -> Option<String> {
    match obs {
        Observation::Failed(why) | Observation::Refused(why) => Some(why.clone()),
        _ => None,
    }
}

fn why_of(obs: Observation, otherwise: &str) -> String {
    match obs {
        Observation::Failed(why) | Observation::Refused(why) => why,
        _ => otherwise.to_owned(),
    }
}

/// One look at the control endpoint during probation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Look {
    /// An operator's stop is in force (described); looked at before the endpoint.
    Stopped(String),
    /// It answered.
    Answer { incarnation: Option<String>, state: Option<String> },
    /// It did not (`error`); whether something holds the gateway lock.
    Silent { lock_held: bool, error: String },
}

/// The probation's verdict after one look.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Look again shortly.
    Wait,
    Passed,
    Failed(String),
}

/// Probation: the incarnation on probation stays `running`, and answering, for its length.
#[derive(Debug, Clone)]
pub struct Probe {
    incarnation: Option<String>,
    length: Duration,
    silent_since: Option<Duration>,
}

impl Probe {
    pub fn new(incarnation: Option<String>, length: Duration) -> Probe {
        Probe { incarnation, length, silent_since: None }
    }

    /// Probation is over at `at` (since it began): passed, no look needed.
    pub fn over(&self, at: Duration) -> bool {
        at >= self.length
    }

    pub fn step(&mut self, at: Duration, look: Look) -> Verdict {
        if self.over(at) {
            return Verdict::Passed;
        }
        match look {
            Look::Stopped(stop) => Verdict::Failed(format!("probation interrupted: {stop}")),
            Look::Answer { incarnation, state }
                if incarnation == self.incarnation && state.as_deref() == Some("running") =>
            {
                self.silent_since = None;
                Verdict::Wait
            }
            Look::Answer { incarnation, state } => Verdict::Failed(format!(
                "during probation the gateway became incarnation {} in state {}",
                incarnation.unwrap_or_default(),
                state.unwrap_or_default()
            )),
            Look::Silent { lock_held: false, error } => {
                Verdict::Failed(format!("the new incarnation exited during probation ({error})"))
            }
            Look::Silent { lock_held: true, error } => {
                let since = *self.silent_since.get_or_insert(at);
                if at.saturating_sub(since) > SILENT_LIMIT {
                    return Verdict::Failed(format!(
                        "the new incarnation stopped answering during probation ({error})"
                    ));
                }
                Verdict::Wait
            }
        }
    }
}

/// What a gateway starting (`run`) does with an unfinished transaction it could lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AtStart {
    /// This binary is the old version and the new file is on disk: the restart never
    /// happened, so the swap is reverted at once (file operations only), and this start goes on.
    RevertNow { why: String },
    /// A detached `update --resume` finishes it beside this gateway.
    Resume,
}

/// `running`: this binary's version; `phase`, `from`: the transaction's; `new_on_disk`: the
/// executable is its new release.
pub fn at_gateway_start(running: &str, phase: Phase, from: &str, new_on_disk: bool) -> AtStart {
    if running == from && new_on_disk {
        let why = format!("the updater died in phase {phase:?} before the new version ran; reverted at start");
        return AtStart::RevertNow { why };
    }
    AtStart::Resume
}

/// The rule every route without the updater applies to a gateway that ended unplanned
/// (`supervise`, and through it launchd, whose LaunchAgent runs `supervise`; systemd's
/// `ExecStopPost=`): it ran an unblessed release when a transaction is unfinished and the file
/// on disk (`on_disk`, its sha256) is that transaction's new release. Otherwise it was the
/// old or the blessed binary crashing, which is the service manager's business.
pub fn runs_unblessed(phase: Phase, to_sha256: &str, on_disk: Option<&str>) -> bool {
    !phase.is_final() && on_disk == Some(to_sha256)
}

/// Whether systemd's `$SERVICE_RESULT`/`$EXIT_STATUS` (as `ExecStopPost=` sees them) describe
/// a planned end: a planned restart (75) or a clean stop. Anything else is a crash.
pub fn systemd_end_is_planned(result: &str, status: &str) -> bool {
    use gatewarden_lifecycle::ExitIntent;
    // The codes come from the one exit table (crates/lifecycle/src/exit.rs).
    let is = |i: ExitIntent| status == i.code().to_string();
    is(ExitIntent::PlannedRestart) || (result == "success" && is(ExitIntent::PlannedStop))
}

#[cfg(test)]
mod tests {
    use super::*;
    use Observation as O;

    const OLD: &str = "1.0.0";
    const NEW: &str = "1.1.0";

    fn gw(version: &str, state: &str) -> Gateway {
        Gateway {
            incarnation: Some(format!("inc-{version}")),
            version: Some(version.into()),
            state: Some(state.into()),
            pid: Some(7),
        }
    }

    fn request() -> Install {
        Install { running: OLD.into(), url: false, sha256: false, may_downgrade: false }
    }

    /// Feeds `world` to the machine in order; every action it took, the first included. The
    /// world must be consumed exactly: a scripted observation left over is a wrong script.
    fn play(start: (Transaction, Action), world: Vec<Observation>) -> Vec<Action> {
        let (mut m, first) = start;
        let mut actions = vec![first];
        let mut world = world.into_iter();
        while !actions.last().is_some_and(Action::is_final) {
            let Some(obs) = world.next() else { panic!("the world ran out after {actions:#?}") };
            actions.push(m.step(obs));
        }
        assert_eq!(world.next(), None, "the transaction ended early: {actions:#?}");
        actions
    }

    fn position(actions: &[Action], f: impl Fn(&Action) -> bool) -> Option<usize> {
        actions.iter().position(f)
    }

    /// The observations of an install up to (not including) the swap's outcome.
    fn to_the_swap() -> Vec<Observation> {
        vec![
            O::Checked { signing_key: false },
            O::Done,
            O::Done,
            O::Staged { version: NEW.into() },
            O::Done,
            O::Done,
            O::Done,
            O::Done,
        ]
    }

    fn with(mut a: Vec<Observation>, b: Vec<Observation>) -> Vec<Observation> {
        a.extend(b);
        a
    }

    #[test]
    fn the_happy_path_verifies_keeps_and_records_before_it_swaps_and_blesses_last() {
        let world = with(to_the_swap(), vec![O::Done, O::Running(gw(NEW, "running")), O::Done]);
        let a = play(Transaction::install(request()), world);
        assert_eq!(
            a,
            vec![
                Action::Check,
                Action::Fetch,
                Action::Verify,
                Action::Stage,
                Action::Preflight { version: NEW.into() },
                Action::KeepPrevious,
                Action::Record,
                Action::AwaitRestartUnderWay,
                Action::SwapIn,
                Action::Restart { onto: Onto::New },
                Action::Probation { gateway: gw(NEW, "running") },
                Action::Commit { gateway: gw(NEW, "running"), resumed: false },
            ]
        );
    }

    /// Invariant 1: every failure before the swap is a refusal, and nothing is swapped.
    #[test]
    fn every_failure_before_the_swap_refuses_with_nothing_changed() {
        let fail = |i: usize| {
            let mut w = to_the_swap();
            w.truncate(i);
            w.push(O::Failed(format!("step {i} failed")));
            w
        };
        // Check, fetch, verify, stage, preflight, keeping the previous binary.
        for i in 0..6 {
            let a = play(Transaction::install(request()), fail(i));
            assert_eq!(position(&a, |x| *x == Action::SwapIn), None, "step {i}: {a:#?}");
            let Some(Action::Refuse { why }) = a.last() else { panic!("step {i}: {a:#?}") };
            assert!(why.contains(&format!("step {i} failed")), "{why}");
        }
        let a = play(Transaction::install(request()), fail(4));
        assert_eq!(a.last(), Some(&Action::Refuse { why: format!("preflight of {NEW} failed: step 4 failed") }));
    }

    #[test]
    fn a_url_needs_a_hash_or_a_signing_key() {
        let url = Install { url: true, ..request() };
        let a = play(Transaction::install(url.clone()), vec![O::Checked { signing_key: false }]);
        assert!(matches!(a.last(), Some(Action::Refuse { why }) if why.contains("--sha256 is required")));
        let a = play(Transaction::install(url.clone()), vec![O::Checked { signing_key: true }, O::Failed("x".into())]);
        assert_eq!(a[1], Action::Fetch, "a signing key authenticates a URL by itself");
        let hashed = Install { sha256: true, ..url };
        let a = play(Transaction::install(hashed), vec![O::Checked { signing_key: false }, O::Failed("x".into())]);
        assert_eq!(a[1], Action::Fetch);
    }

    #[test]
    fn the_same_version_and_a_downgrade_are_refused_unless_allowed() {
        let staged =
            |v: &str| vec![O::Checked { signing_key: false }, O::Done, O::Done, O::Staged { version: v.into() }];
        let a = play(Transaction::install(request()), staged(OLD));
        assert!(matches!(a.last(), Some(Action::Refuse { why }) if why.contains("already is")));
        let a = play(Transaction::install(request()), staged("0.9.0"));
        assert!(matches!(a.last(), Some(Action::Refuse { why }) if why.contains("--allow-downgrade")));
        let a = play(Transaction::install(request()), staged("nightly"));
        assert!(matches!(a.last(), Some(Action::Refuse { why }) if why.contains("cannot tell")));
        let allowed = Install { may_downgrade: true, ..request() };
        let mut w = staged("0.9.0");
        w.push(O::Failed("stop here".into()));
        let a = play(Transaction::install(allowed), w);
        assert_eq!(a[4], Action::Preflight { version: "0.9.0".into() });
    }

    #[test]
    fn a_failed_swap_puts_the_old_file_back_and_fails() {
        let world = with(to_the_swap(), vec![O::Failed("denied".into()), O::Done]);
        let a = play(Transaction::install(request()), world);
        assert_eq!(a[a.len() - 2], Action::PutBackIfChanged);
        assert_eq!(
            a.last(),
            Some(&Action::End {
                phase: Phase::Failed,
                why: "cannot swap the executable: denied".into(),
                incarnation: None,
                notify: false
            })
        );
    }

    /// The way back after a failed start, from `BeginRollBack` on: the old version restarted.
    fn back_restarted() -> Vec<Observation> {
        vec![O::Done, O::Done, O::Done, O::Done, O::NoAnswer, O::Running(gw(OLD, "running"))]
    }

    fn rollback_tail(why: &str) -> Vec<Action> {
        vec![
            Action::BeginRollBack { why: why.into() },
            Action::ClearCandidates,
            Action::SwapBack,
            Action::MayStart,
            Action::LookAtGateway { patience: Duration::from_millis(500) },
            Action::Restart { onto: Onto::Old },
            Action::RolledBack { why: why.into(), back: Back::Restarted(gw(OLD, "running")) },
        ]
    }

    /// Invariant 3: a failed restart, a wrong version or a failed probation roll back.
    #[test]
    fn a_failed_start_rolls_back_and_verifies_the_old_version() {
        for (after_swap, why) in [
            (vec![O::Failed("no gateway took the lock".into())], "no gateway took the lock".to_owned()),
            (
                vec![O::Running(gw("6.6.6", "running"))],
                format!("the new incarnation reports version 6.6.6, expected {NEW}"),
            ),
            (vec![O::Running(gw(NEW, "running")), O::Failed("it crashed".into())], "it crashed".to_owned()),
        ] {
            let world =
                with(with(to_the_swap(), with(vec![O::Done], after_swap)), with(vec![O::Done], back_restarted()));
            let a = play(Transaction::install(request()), world);
            let stop = position(&a, |x| *x == Action::CheckStop).unwrap_or_else(|| panic!("{a:#?}"));
            assert_eq!(a[stop + 1..], rollback_tail(&why)[..], "{why}");
            assert_eq!(position(&a, |x| matches!(x, Action::Commit { .. })), None, "never blessed");
        }
    }

    /// Invariant 4: a stop during the restart or probation is the operator's.
    #[test]
    fn a_stop_during_probation_rolls_back_and_starts_nothing() {
        let world = with(
            to_the_swap(),
            vec![
                O::Done,
                O::Running(gw(NEW, "running")),
                O::Failed("probation interrupted: stopped".into()),
                O::Refused("stopped by the operator".into()),
                O::Done,
                O::Done,
                O::Done,
                O::Refused("stopped by the operator".into()),
            ],
        );
        let a = play(Transaction::install(request()), world);
        let why = "interrupted before probation ended: stopped by the operator";
        assert_eq!(a[a.len() - 5], Action::BeginRollBack { why: why.into() });
        assert_eq!(
            a.last(),
            Some(&Action::RolledBack { why: why.into(), back: Back::Stopped("stopped by the operator".into()) })
        );
        assert_eq!(position(&a, |x| *x == Action::Restart { onto: Onto::Old }), None);
    }

    /// The rollback's own branches, entered through a resumed `rolling_back` transaction.
    #[test]
    fn every_rollback_branch_ends_rolled_back_or_failed_with_the_error() {
        let rolling = || Transaction::resume(Phase::RollingBack, OLD, NEW, true, Some("it crashed"));
        let end = |world: Vec<Observation>| play(rolling(), world).last().cloned();
        let failed = |error: &str| Some(Action::RollbackFailed { why: "it crashed".into(), error: error.into() });
        let back = |b: Back| Some(Action::RolledBack { why: "it crashed".into(), back: b });
        // Begin, clear, then the swap back fails.
        assert_eq!(
            end(vec![O::Done, O::Done, O::Failed("busy".into())]),
            failed("cannot swap the old binary back: busy")
        );
        // A stop in force: the file only.
        assert_eq!(end(vec![O::Done, O::Done, O::Done, O::Refused("stop".into())]), back(Back::Stopped("stop".into())));
        // The old incarnation never stopped: nothing to restart.
        let old = O::Running(gw(OLD, "running"));
        assert_eq!(end(vec![O::Done, O::Done, O::Done, O::Done, old]), back(Back::NeverStopped(gw(OLD, "running"))));
        // What answers is not the old version running: restart onto the old file.
        let look = |g: Gateway| vec![O::Done, O::Done, O::Done, O::Done, O::Running(g)];
        let restarted = with(look(gw(NEW, "running")), vec![O::Running(gw(OLD, "running"))]);
        assert_eq!(end(restarted), back(Back::Restarted(gw(OLD, "running"))));
        let draining_old = with(look(gw(OLD, "draining")), vec![O::Running(gw(OLD, "running"))]);
        assert_eq!(end(draining_old), back(Back::Restarted(gw(OLD, "running"))));
        let wrong = with(look(gw(NEW, "running")), vec![O::Running(gw(NEW, "running"))]);
        assert_eq!(end(wrong), failed(&format!("after the swap back the gateway reports version {NEW}")));
        // The restart fails: a stop recorded meanwhile is obeyed, otherwise the rollback failed.
        let no_start = with(look(gw(NEW, "running")), vec![O::Failed("timed out".into())]);
        assert_eq!(end(with(no_start.clone(), vec![O::Refused("stop".into())])), back(Back::Stopped("stop".into())));
        assert_eq!(end(with(no_start, vec![O::Done])), failed("timed out"));
    }

    /// Invariant 5: a killed updater's transaction is finished by whoever finds it.
    #[test]
    fn a_resumed_transaction_probes_the_new_version_or_gives_the_old_one_its_file() {
        let a = play(Transaction::resume(Phase::Restarting, OLD, NEW, false, None), vec![]);
        assert_eq!(
            a,
            vec![Action::End {
                phase: Phase::Failed,
                why: "the updater died in phase Restarting".into(),
                incarnation: None,
                notify: false
            }]
        );
        let resume = || Transaction::resume(Phase::Probation, OLD, NEW, true, None);
        let a = play(resume(), vec![O::Running(gw(NEW, "running")), O::Done]);
        assert_eq!(a.last(), Some(&Action::Commit { gateway: gw(NEW, "running"), resumed: true }));
        // A failed probation rolls back at once (the resumer is not the operator's updater).
        let a =
            play(resume(), with(vec![O::Running(gw(NEW, "running")), O::Failed("it exited".into())], back_restarted()));
        assert_eq!(a[2], Action::BeginRollBack { why: "it exited".into() });
        assert_eq!(position(&a, |x| *x == Action::CheckStop), None);
        // The old version runs: the restart never happened.
        let why = "the updater died in phase Probation before the new version ran";
        let a = play(resume(), vec![O::Running(gw(OLD, "running")), O::Done]);
        assert_eq!(a[1], Action::SwapBack);
        let inc = Some(format!("inc-{OLD}"));
        assert_eq!(
            a.last(),
            Some(&Action::End { phase: Phase::RolledBack, why: why.into(), incarnation: inc.clone(), notify: true })
        );
        let a = play(resume(), vec![O::Running(gw(OLD, "running")), O::Failed("busy".into())]);
        let why = format!("{why}; cannot swap the old binary back: busy");
        assert_eq!(a.last(), Some(&Action::End { phase: Phase::Failed, why, incarnation: inc, notify: false }));
        // Nothing runs.
        let a = play(resume(), with(vec![O::NoAnswer], back_restarted()));
        assert_eq!(a[1], Action::BeginRollBack { why: "no gateway became ready after the updater died".into() });
    }

    fn last(phase: Phase, previous_kept: bool) -> Last {
        Last { phase, from: OLD.into(), to: NEW.into(), previous: "/h/releases/prev".into(), previous_kept }
    }

    #[test]
    fn a_rollback_by_hand_needs_a_finished_transaction_and_its_kept_binary() {
        let unchanged = |l: Option<&Last>| match play(Transaction::rollback_by_hand("/h", l), vec![]).pop() {
            Some(Action::Unchanged { why }) => why,
            other => panic!("{other:?}"),
        };
        assert!(unchanged(None).contains("no update recorded in /h"));
        assert!(unchanged(Some(&last(Phase::Probation, true))).contains("is Probation: the binary is already"));
        assert!(unchanged(Some(&last(Phase::Committed, false))).contains("/h/releases/prev is gone"));
        let why = "rolled back by hand (`update --rollback`)";
        for phase in [Phase::Committed, Phase::Failed] {
            let l = last(phase, true);
            let world = vec![O::Done, O::Done, O::Done, O::Done, O::NoAnswer, O::Running(gw(OLD, "running"))];
            let a = play(Transaction::rollback_by_hand("/h", Some(&l)), world);
            assert_eq!(a[..2], [Action::AwaitRestartUnderWay, Action::ClearCandidates]);
            assert_eq!(
                a.last(),
                Some(&Action::RolledBack { why: why.into(), back: Back::Restarted(gw(OLD, "running")) })
            );
        }
    }

    #[test]
    fn a_rollback_by_hand_whose_restart_was_cancelled_keeps_what_runs() {
        let l = last(Phase::Committed, true);
        let by_hand = || Transaction::rollback_by_hand("/h", Some(&l));
        let failing = vec![O::Done, O::Done, O::Done, O::Done, O::NoAnswer, O::Failed("drain cancelled".into())];
        let cancelled = O::Refused("the drain was cancelled".into());
        // Not cancelled: a failed rollback.
        let a = play(by_hand(), with(failing.clone(), vec![O::Done, O::Done]));
        assert_eq!(a[a.len() - 2], Action::CheckCancelled);
        assert!(matches!(a.last(), Some(Action::RollbackFailed { error, .. }) if error == "drain cancelled"));
        // Cancelled while the new version runs: its file goes back.
        let runs_new = vec![O::Done, cancelled.clone(), O::Running(gw(NEW, "running"))];
        let a = play(by_hand(), with(failing.clone(), with(runs_new.clone(), vec![O::Done])));
        assert_eq!(a[a.len() - 2], Action::SwapIn);
        assert!(
            matches!(a.last(), Some(Action::Unchanged { why }) if why.ends_with(&format!("{NEW} stays installed")))
        );
        let a = play(by_hand(), with(failing.clone(), with(runs_new, vec![O::Failed("busy".into())])));
        assert!(
            matches!(a.last(), Some(Action::End { phase: Phase::Failed, why, .. }) if why.contains("cannot be put back"))
        );
        // Cancelled and the old version runs: the old file stays.
        let a = play(by_hand(), with(failing, vec![O::Done, cancelled, O::Running(gw(OLD, "running"))]));
        assert!(
            matches!(a.last(), Some(Action::Unchanged { why }) if why.ends_with(&format!("{OLD} stays installed")))
        );
    }

    #[test]
    fn a_finished_transaction_repeats_its_end() {
        let (mut m, first) = Transaction::resume(Phase::Swapped, OLD, NEW, false, None);
        assert!(first.is_final());
        assert_eq!(m.step(O::Done), first);
    }

    #[test]
    fn probation_passes_only_a_steady_running_incarnation() {
        let ms = Duration::from_millis;
        let answer = |inc: &str, state: &str| Look::Answer { incarnation: Some(inc.into()), state: Some(state.into()) };
        let silent = |lock_held| Look::Silent { lock_held, error: "refused".into() };
        let probe = || Probe::new(Some("new".into()), Duration::from_secs(10));
        let mut p = probe();
        assert_eq!(p.step(ms(0), answer("new", "running")), Verdict::Wait);
        assert!(!p.over(ms(9999)) && p.over(ms(10_000)));
        assert_eq!(p.step(ms(10_000), answer("other", "running")), Verdict::Passed, "over: no look counts");
        let fails = |look: Look| match probe().step(ms(5), look) {
            Verdict::Failed(why) => why,
            v => panic!("{v:?}"),
        };
        assert!(fails(Look::Stopped("stopped".into())).starts_with("probation interrupted: stopped"));
        assert!(fails(answer("other", "running")).contains("became incarnation other in state running"));
        assert!(fails(answer("new", "draining")).contains("in state draining"));
        assert!(fails(silent(false)).contains("exited during probation (refused)"));
        // Silent while holding the lock: failed only past SILENT_LIMIT, and an answer resets it.
        let mut p = probe();
        assert_eq!(p.step(ms(100), silent(true)), Verdict::Wait);
        assert_eq!(p.step(ms(100) + SILENT_LIMIT, silent(true)), Verdict::Wait);
        assert_eq!(p.step(ms(200) + SILENT_LIMIT, answer("new", "running")), Verdict::Wait);
        assert_eq!(p.step(ms(300) + SILENT_LIMIT, silent(true)), Verdict::Wait);
        let late = ms(301) + SILENT_LIMIT * 2;
        assert!(matches!(p.step(late, silent(true)), Verdict::Failed(w) if w.contains("stopped answering")));
    }

    #[test]
    fn a_starting_old_binary_reverts_the_swap_and_anything_else_resumes() {
        let revert = at_gateway_start(OLD, Phase::Restarting, OLD, true);
        assert!(matches!(revert, AtStart::RevertNow { why } if why.contains("phase Restarting")));
        assert_eq!(at_gateway_start(NEW, Phase::Restarting, OLD, true), AtStart::Resume);
        assert_eq!(at_gateway_start(OLD, Phase::Restarting, OLD, false), AtStart::Resume);
    }

    /// supervise (and launchd through it) and ExecStopPost revert exactly when the new file
    /// of an unfinished transaction is what ran.
    #[test]
    fn only_an_unblessed_release_on_disk_is_reverted() {
        for phase in [Phase::Swapped, Phase::Restarting, Phase::Probation, Phase::RollingBack] {
            assert!(runs_unblessed(phase, "bbbb", Some("bbbb")), "{phase:?}");
            assert!(!runs_unblessed(phase, "bbbb", Some("aaaa")), "the old binary is in place: {phase:?}");
            assert!(!runs_unblessed(phase, "bbbb", None), "unreadable: leave it: {phase:?}");
        }
        for phase in [Phase::Committed, Phase::RolledBack, Phase::Failed] {
            assert!(!runs_unblessed(phase, "bbbb", Some("bbbb")), "a finished transaction: {phase:?}");
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
}
