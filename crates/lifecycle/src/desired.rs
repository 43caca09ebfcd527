//! `desired_state.json`: the operator's intent for this home — `run` or `stopped` — durable
//! and binding on every actor that starts a gateway (issue 22, item 6).
//!
//! Only the operator's verbs change it: `stop` (CLI, chat `/stop`, HTTP) writes `stopped`
//! *before* it signals anything; `start`, `restart` and a foreground `run` write `run`. A
//! rollback, a `doctor --fix`, a backstop, a successor or a service manager never change it;
//! they read it right before they start anything and obey it ([`decide`]). Each write takes the
//! next sequence number under `desired_state.lock`, so sequences are unique and ordered: an
//! actor that formed its plan under sequence `b` can tell whether an operator spoke since.
//!
//! A cancelled restart drain is recorded too: `run`, with [`Desired::keep`] naming the incarnation
//! that keeps running. Every actor carrying out the restart planned under an earlier sequence (the
//! successor waiting for the lock, the backstop, the CLI's ladder: [`Starter::Carry`]) stands down
//! while that incarnation lives; the next operator verb writes a record without `keep`.
//!
//! The record is gatewarden's own (hermes homes do not have it); a missing or unreadable one
//! means `run` at sequence 0, which is what every home meant before the record existed.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::fsio::{self, ReadOutcome};
use crate::identity::{IdentityCheck, ProcessIdentity};
use crate::lock::InstanceLock;
use crate::timefmt;

pub const FILE: &str = "desired_state.json";
/// Serialises read-increment-write; never deleted (see `lock.rs` on unlinking lock files).
pub const LOCK_FILE: &str = "desired_state.lock";
/// Writers hold the lock for one small atomic write.
const LOCK_PATIENCE: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Want {
    Run,
    Stopped,
}

impl Want {
    pub fn as_str(self) -> &'static str {
        match self {
            Want::Run => "run",
            Want::Stopped => "stopped",
        }
    }
}

/// The record. Unknown fields are ignored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Desired {
    pub want: Want,
    pub seq: u64,
    /// Who decided: `cli stop`, `cli start`, `cli restart`, `cli run`, `chat`, `http`.
    #[serde(default)]
    pub requester: String,
    #[serde(default)]
    pub pid: Option<u32>,
    #[serde(default)]
    pub at: Option<String>,
    /// The process carrying the request out (`start`, `restart`, `stop`, or the gateway for a
    /// chat `/stop`): while it lives, the request is in flight. A repair must not act across a
    /// start or restart in flight (a handover looks like a silent gateway for a moment), and a
    /// `start` that replaces a stop in flight waits for it (ops launch.rs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_flight: Option<ProcessIdentity>,
    /// When the requester was invoked (µs since the epoch), see [`overrides`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issued_us: Option<i128>,
    /// When this record was written (µs since the epoch), see [`overrides`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recorded_us: Option<i128>,
    /// A cancelled drain: the incarnation that keeps running instead of being restarted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep: Option<Kept>,
}

/// The incarnation a cancelled drain keeps: its id and its process identity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Kept {
    pub incarnation: String,
    pub process: ProcessIdentity,
}

impl Desired {
    /// What a home without a record means.
    pub fn initial() -> Desired {
        Desired {
            want: Want::Run,
            seq: 0,
            requester: String::new(),
            pid: None,
            at: None,
            in_flight: None,
            issued_us: None,
            recorded_us: None,
            keep: None,
        }
    }

    /// "`cli stop` (pid 5151, seq 7)", for messages and the ledger.
    pub fn describe(&self) -> String {
        let who = if self.requester.is_empty() { "an unknown requester" } else { self.requester.as_str() };
        match self.pid {
            Some(pid) => format!("`{who}` (pid {pid}, seq {})", self.seq),
            None => format!("`{who}` (seq {})", self.seq),
        }
    }
}

pub fn path(home_dir: &Path) -> PathBuf {
    home_dir.join(FILE)
}

/// The record as stored; `Missing` in a home that never had one.
pub fn read(home_dir: &Path) -> ReadOutcome<Desired> {
    fsio::read_json(&path(home_dir))
}

/// The record in force: a missing or damaged record means `run` at sequence 0 (the meaning
/// before this record existed), so a planted file can only ever be overwritten, not obeyed
/// wrongly by a start that the operator asked for.
pub fn current(home_dir: &Path) -> Desired {
    // No free descriptor or memory says nothing about the record: look again briefly rather
    // than read a stop as `run` (as `marker::consume` does for markers).
    for _ in 0..5 {
        match read(home_dir) {
            ReadOutcome::Transient(_) => std::thread::sleep(Duration::from_millis(20)),
            other => return other.ok().unwrap_or_else(Desired::initial),
        }
    }
    read(home_dir).ok().unwrap_or_else(Desired::initial)
}

/// Whether a request for `want`, whose command was invoked at `issued_us`, may replace
/// `current`. Pure. A stop always may. A `run` replaces a stop only when its command began
/// after that stop was recorded: `restart`, then `stop` 2 ms later reach the file in either
/// order (a loaded machine schedules the two processes as it likes), and requests that
/// overlap like that resolve to the stop — a stop stays down. `stop; start` in a script is
/// sequential and starts.
pub fn overrides(want: Want, issued_us: Option<i128>, current: &Desired) -> bool {
    match (want, current.want, issued_us, current.recorded_us) {
        (Want::Run, Want::Stopped, Some(mine), Some(stopped_at)) => mine > stopped_at,
        _ => true,
    }
}

/// Records the operator's `want`, with the next sequence number. `in_flight` is set for verbs
/// whose process lives exactly as long as the request (`start`, `restart`).
pub fn record(home_dir: &Path, want: Want, requester: &str, in_flight: bool) -> std::io::Result<Desired> {
    record_if(home_dir, want, requester, in_flight, None, |_| true).map(|(d, _)| d)
}

/// [`record`], stamped with when the requester was `issued` (see [`overrides`]), and only when
/// `cond` holds for the record in force (checked under the lock); otherwise the record in
/// force. The flag says whether it was written.
pub fn record_if(
    home_dir: &Path,
    want: Want,
    requester: &str,
    in_flight: bool,
    issued: Option<SystemTime>,
    cond: impl FnOnce(&Desired) -> bool,
) -> std::io::Result<(Desired, bool)> {
    write_if(home_dir, want, requester, in_flight, issued, None, cond)
}

/// Records that the drain of `kept` was cancelled: `run`, keeping it. A stop in force is not
/// replaced (it is on its way, and a stop stays down): `Err` with that record.
pub fn record_cancel(home_dir: &Path, kept: Kept, requester: &str) -> std::io::Result<Result<Desired, Desired>> {
    let (d, wrote) = write_if(home_dir, Want::Run, requester, false, None, Some(kept), |d| d.want == Want::Run)?;
    Ok(if wrote { Ok(d) } else { Err(d) })
}

fn write_if(
    home_dir: &Path,
    want: Want,
    requester: &str,
    in_flight: bool,
    issued: Option<SystemTime>,
    keep: Option<Kept>,
    cond: impl FnOnce(&Desired) -> bool,
) -> std::io::Result<(Desired, bool)> {
    let _lock = InstanceLock::acquire(&home_dir.join(LOCK_FILE), LOCK_PATIENCE).map_err(std::io::Error::other)?;
    let now = current(home_dir);
    let issued_us = issued.map(timefmt::to_micros);
    if !cond(&now) || !overrides(want, issued_us, &now) {
        return Ok((now, false));
    }
    let pid = std::process::id();
    let d = Desired {
        want,
        seq: now.seq.saturating_add(1),
        requester: requester.to_owned(),
        pid: Some(pid),
        at: Some(timefmt::now()),
        in_flight: if in_flight { ProcessIdentity::current() } else { None },
        issued_us,
        recorded_us: Some(timefmt::to_micros(SystemTime::now())),
        keep,
    };
    // A stop must land even on a full disk (issue 30, item 3): the record has space reserved.
    fsio::write_json_reserved(&path(home_dir), &d)?;
    Ok((d, true))
}

/// Who is about to start a gateway, and on what basis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Starter {
    /// Carries out a start or restart (a successor, a backstop, a restart's kick, `start`
    /// itself, a service manager's launch). Refused only by a stop.
    Resume,
    /// Carries out a restart (or the start that completes one) planned under sequence `basis`:
    /// the successor, the backstop, the restart ladder and what they start. Refused by a stop,
    /// and by a drain cancelled since `basis` while the incarnation it kept lives.
    Carry { basis: u64 },
    /// Restarts a running gateway on its own initiative (`doctor --fix`, an update's
    /// rollback), having looked at the home under sequence `basis`. Refused by a stop, by any
    /// operator request since `basis`, and while an operator's start or restart is in flight.
    Repair { basis: u64 },
}

/// Why a start is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The operator stopped the gateway.
    Stopped(Box<Desired>),
    /// The operator asked for something since the repair looked.
    Superseded(Box<Desired>),
    /// An operator's start or restart is still being carried out.
    InFlight(Box<Desired>),
    /// The restart's drain was cancelled; the incarnation it kept still runs.
    Cancelled(Box<Desired>),
    /// The home is gone (deleted, or its volume unmounted) since the request was made: a start
    /// on the request's behalf would make an empty home and a gateway on the defaults there.
    HomeGone,
}

impl Refusal {
    /// The record in force that refused (none when the home is gone).
    pub fn record(&self) -> Option<&Desired> {
        match self {
            Refusal::Stopped(d) | Refusal::Superseded(d) | Refusal::InFlight(d) | Refusal::Cancelled(d) => Some(d),
            Refusal::HomeGone => None,
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Refusal::Stopped(d) => {
                format!("the gateway was stopped by {}; it stays down until `gatewarden start`", d.describe())
            }
            Refusal::Superseded(d) => format!("a newer request by {} supersedes it", d.describe()),
            Refusal::InFlight(d) => {
                format!("{} is still carrying out its request (a handover in progress)", d.describe())
            }
            Refusal::Cancelled(d) => {
                let kept = d.keep.as_ref().map_or_else(
                    || "the draining gateway".to_owned(),
                    |k| format!("incarnation {} (pid {})", k.incarnation, k.process.pid),
                );
                format!("the restart was cancelled by {}; {kept} keeps running", d.describe())
            }
            Refusal::HomeGone => {
                "the home no longer exists; a restart or repair planned in it starts nothing (`gatewarden start` makes a new one)".to_owned()
            }
        }
    }

    /// For the ledger's `start_prevented`.
    pub fn json(&self) -> serde_json::Value {
        let kind = match self {
            Refusal::Stopped(_) => "stopped",
            Refusal::Superseded(_) => "superseded",
            Refusal::InFlight(_) => "in_flight",
            Refusal::Cancelled(_) => "cancelled",
            Refusal::HomeGone => "home_gone",
        };
        match self.record() {
            Some(d) => serde_json::json!({"why": kind, "seq": d.seq, "want": d.want.as_str(),
                                          "requester": d.requester, "requester_pid": d.pid}),
            None => serde_json::json!({"why": kind}),
        }
    }
}

/// Which processes a record names are still those processes (see [`in_flight_alive`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Alive {
    /// The record's `in_flight` requester.
    pub in_flight: bool,
    /// The incarnation a cancelled drain kept.
    pub kept: bool,
}

/// The one decision. Pure: `alive` says which processes the record names still live.
pub fn decide(current: &Desired, starter: Starter, alive: Alive) -> Result<(), Refusal> {
    match (current.want, starter) {
        (Want::Stopped, _) => Err(Refusal::Stopped(Box::new(current.clone()))),
        (Want::Run, Starter::Resume) => Ok(()),
        (Want::Run, Starter::Carry { basis }) if current.seq > basis && current.keep.is_some() && alive.kept => {
            Err(Refusal::Cancelled(Box::new(current.clone())))
        }
        (Want::Run, Starter::Carry { .. }) => Ok(()),
        (Want::Run, Starter::Repair { basis }) if current.seq > basis => {
            Err(Refusal::Superseded(Box::new(current.clone())))
        }
        (Want::Run, Starter::Repair { .. }) if alive.in_flight => Err(Refusal::InFlight(Box::new(current.clone()))),
        (Want::Run, Starter::Repair { .. }) => Ok(()),
    }
}

/// Whether the record's in-flight process is alive and is the same process (never the
/// caller itself). An unverifiable identity counts as alive: a repair waits rather than acts.
pub fn in_flight_alive(d: &Desired) -> bool {
    d.in_flight.is_some_and(|id| {
        id.pid != std::process::id() && matches!(id.check(), IdentityCheck::Same | IdentityCheck::Unverifiable(_))
    })
}

/// Whether the incarnation a cancelled drain kept is still that process (unverifiable counts
/// as alive: a restart's helpers stand down rather than start a second gateway).
pub fn kept_alive(d: &Desired) -> bool {
    d.keep.as_ref().is_some_and(|k| matches!(k.process.check(), IdentityCheck::Same | IdentityCheck::Unverifiable(_)))
}

/// [`decide`] against the record in force: the I/O edge.
pub fn check(home_dir: &Path, starter: Starter) -> Result<Desired, Refusal> {
    // Only an operator's own start may make a home; what acts on an earlier request needs the
    // home that request was made in (a backstop outliving a deleted home once made a new one).
    if !matches!(starter, Starter::Resume) && !home_dir.is_dir() {
        return Err(Refusal::HomeGone);
    }
    let d = current(home_dir);
    let alive = Alive {
        in_flight: matches!(starter, Starter::Repair { .. }) && in_flight_alive(&d),
        kept: matches!(starter, Starter::Carry { .. }) && kept_alive(&d),
    };
    decide(&d, starter, alive).map(|()| d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(want: Want, seq: u64) -> Desired {
        Desired { want, seq, requester: "cli stop".into(), ..Desired::initial() }
    }

    #[test]
    fn only_an_operators_start_may_act_on_a_home_that_is_gone() {
        let gone = std::env::temp_dir().join(format!("gw-desired-gone-{}", std::process::id()));
        for s in [Starter::Carry { basis: 0 }, Starter::Repair { basis: 0 }] {
            assert_eq!(check(&gone, s), Err(Refusal::HomeGone), "{s:?}");
        }
        assert!(check(&gone, Starter::Resume).is_ok());
        assert_eq!(Refusal::HomeGone.json()["why"], "home_gone");
    }

    #[test]
    fn a_stop_refuses_every_starter_whatever_its_basis() {
        let stopped = rec(Want::Stopped, 4);
        for s in
            [Starter::Resume, Starter::Repair { basis: 3 }, Starter::Repair { basis: 4 }, Starter::Repair { basis: 9 }]
        {
            for (in_flight, kept) in [(false, false), (true, true)] {
                let alive = Alive { in_flight, kept };
                assert!(matches!(decide(&stopped, s, alive), Err(Refusal::Stopped(d)) if d.seq == 4), "{s:?}");
            }
        }
    }

    #[test]
    fn run_lets_resumers_start_and_holds_repairs_to_their_basis() {
        let run = rec(Want::Run, 5);
        let (none, busy) = (Alive::default(), Alive { in_flight: true, kept: true });
        assert_eq!(decide(&run, Starter::Resume, busy), Ok(()));
        assert_eq!(decide(&run, Starter::Repair { basis: 5 }, none), Ok(()));
        assert!(matches!(decide(&run, Starter::Repair { basis: 4 }, none), Err(Refusal::Superseded(_))));
        assert!(matches!(decide(&run, Starter::Repair { basis: 5 }, busy), Err(Refusal::InFlight(_))));
        assert_eq!(decide(&Desired::initial(), Starter::Repair { basis: 0 }, none), Ok(()));
        // Without a cancel, a carrier goes on whatever was recorded since its basis.
        assert_eq!(decide(&run, Starter::Carry { basis: 2 }, busy), Ok(()));
    }

    #[test]
    fn a_cancel_stands_down_only_the_restart_planned_before_it_while_its_gateway_lives() {
        let kept = Kept { incarnation: "abc".into(), process: ProcessIdentity { pid: 7, start_time: 1 } };
        let cancel = Desired { keep: Some(kept), ..rec(Want::Run, 6) };
        let alive = Alive { in_flight: false, kept: true };
        let r = decide(&cancel, Starter::Carry { basis: 5 }, alive).unwrap_err();
        assert!(matches!(r, Refusal::Cancelled(_)));
        assert!(r.describe().contains("incarnation abc (pid 7) keeps running"), "{}", r.describe());
        assert_eq!(r.json()["why"], "cancelled");
        // A restart requested after the cancel carries its own basis.
        assert_eq!(decide(&cancel, Starter::Carry { basis: 6 }, alive), Ok(()));
        // The kept gateway died since: the restart's helpers start the next one after all.
        assert_eq!(decide(&cancel, Starter::Carry { basis: 5 }, Alive::default()), Ok(()));
        // Starters that carry out no restart are not bound by it.
        assert_eq!(decide(&cancel, Starter::Resume, alive), Ok(()));

        let dir = tempfile::tempdir().unwrap();
        let me = ProcessIdentity::current().unwrap();
        let restart = record(dir.path(), Want::Run, "cli restart", true).unwrap();
        let k = Kept { incarnation: "me".into(), process: me };
        let c = record_cancel(dir.path(), k.clone(), "cli cancel-drain").unwrap().unwrap();
        assert_eq!((c.seq, c.keep.as_ref()), (restart.seq + 1, Some(&k)));
        assert!(matches!(check(dir.path(), Starter::Carry { basis: restart.seq }), Err(Refusal::Cancelled(_))));
        assert!(check(dir.path(), Starter::Carry { basis: c.seq }).is_ok());
        // A stop in force is never turned into a cancel; a later verb drops `keep`.
        let stop = record(dir.path(), Want::Stopped, "cli stop", false).unwrap();
        assert_eq!(stop.keep, None);
        assert_eq!(record_cancel(dir.path(), k, "cli cancel-drain").unwrap(), Err(stop));
    }

    #[test]
    fn records_take_increasing_sequences_and_damage_reads_as_run() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(current(dir.path()), Desired::initial());
        let a = record(dir.path(), Want::Run, "cli start", true).unwrap();
        let b = record(dir.path(), Want::Stopped, "cli stop", false).unwrap();
        assert_eq!((a.seq, b.seq), (1, 2));
        assert_eq!(a.in_flight, ProcessIdentity::current());
        assert_eq!(current(dir.path()), b);
        // Conditional: a gateway's own stop does not bump a stop already recorded.
        let (c, wrote) =
            record_if(dir.path(), Want::Stopped, "chat", false, None, |d| d.want != Want::Stopped).unwrap();
        assert!(!wrote);
        assert_eq!(c, b);
        // The caller's own in-flight record is never "in flight" for itself.
        assert!(!in_flight_alive(&a));
        std::fs::write(path(dir.path()), b"\x00garbage").unwrap();
        assert_eq!(current(dir.path()), Desired::initial());
        assert_eq!(record(dir.path(), Want::Stopped, "cli stop", false).unwrap().seq, 1);
    }

    #[test]
    fn a_run_replaces_only_a_stop_recorded_before_it_began() {
        let stop =
            Desired { want: Want::Stopped, issued_us: Some(1_000), recorded_us: Some(1_500), ..Desired::initial() };
        assert!(!overrides(Want::Run, Some(999), &stop), "restart issued before the stop");
        assert!(!overrides(Want::Run, Some(1_200), &stop), "overlapping requests resolve to the stop");
        assert!(overrides(Want::Run, Some(2_000), &stop), "a start after the stop ends it");
        assert!(overrides(Want::Run, None, &stop), "unstamped writers (a foreground run) start");
        let run = Desired { want: Want::Run, issued_us: Some(5_000), ..Desired::initial() };
        assert!(overrides(Want::Stopped, Some(1), &run), "a stop always lands");

        let dir = tempfile::tempdir().unwrap();
        let invoked = SystemTime::now();
        let (s, _) = record_if(dir.path(), Want::Stopped, "cli stop", false, Some(invoked), |_| true).unwrap();
        let earlier = invoked - Duration::from_millis(2);
        let (d, wrote) = record_if(dir.path(), Want::Run, "cli restart", true, Some(earlier), |_| true).unwrap();
        assert!(!wrote);
        assert_eq!(d, s);
        let later = SystemTime::now() + Duration::from_millis(1);
        let (d, wrote) = record_if(dir.path(), Want::Run, "cli start", true, Some(later), |_| true).unwrap();
        assert!(wrote);
        assert_eq!((d.want, d.seq), (Want::Run, 2));
    }

    #[cfg(unix)]
    #[test]
    fn never_follows_a_link_and_writes_0600() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, br#"{"want":"stopped","seq":99}"#).unwrap();
        std::os::unix::fs::symlink(&target, path(dir.path())).unwrap();
        assert_eq!(current(dir.path()), Desired::initial(), "a symlinked record is not obeyed");
        record(dir.path(), Want::Run, "cli start", false).unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), br#"{"want":"stopped","seq":99}"#, "the link was followed");
        let mode = std::fs::symlink_metadata(path(dir.path())).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    proptest::proptest! {
        #[test]
        fn parsing_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..200)) {
            let _ = fsio::parse_json_value(&bytes).ok().map(serde_json::from_value::<Desired>);
        }
    }
}
