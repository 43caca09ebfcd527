//! Crash loops, read from the ledger: how many incarnations in a row ended without a planned
//! exit, and how the last one ended.
//!
//! One reading for every place that must name a crash loop (`status`, `doctor`, the systemd
//! unit's `crash-backoff` helper): an incarnation is its `started` event and, if it got that
//! far, its `exited` event. One that never wrote `exited` ended without its exit path, and why is
//! not known (a SIGKILL, the OOM killer, a crash before the exit path: they look alike here); a
//! later reader's `exited` on its behalf (`recorded_by`, crates/lifecycle/src/heal.rs) says no
//! more, and its time is when it was noticed, not when it ended. One that exited 0 or 75 ended
//! as asked; 78 is not revived by any manager. A run that lasted [`HEALTHY`] or longer breaks
//! the loop.
//!
//! A process that died before writing `started` (a broken release, a missing library) leaves
//! only the `crash_backoff` line the unit's `ExecStopPost=` writes after every crash
//! (crates/ops/src/crash_backoff.rs). Those lines after the newest `started` are crashes too,
//! except the first when the newest incarnation crashed: that line is its own.

use std::time::{Duration, SystemTime};

use serde_json::{Map, Value};

use crate::exit::ExitIntent;
use crate::timefmt;

/// An incarnation that ran this long was healthy: a later crash starts a new count.
pub const HEALTHY: Duration = Duration::from_secs(60);

/// How the newest crashed incarnation ended.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "how", rename_all = "snake_case")]
pub enum LastExit {
    /// It exited with this code (an unplanned exit: 1, or another nonzero code).
    Code { code: i64, reason: Option<String> },
    /// It wrote no exit: why is not known.
    Unrecorded,
    /// It died before writing `started`; `exit` is how, as systemd told `crash-backoff`.
    BeforeStart { exit: String },
}

impl LastExit {
    pub fn describe(&self) -> String {
        match self {
            LastExit::Code { code, reason: Some(r) } => format!("exit {code} ({r})"),
            LastExit::Code { code, reason: None } => format!("exit {code}"),
            LastExit::Unrecorded => "no exit recorded: why is not known".into(),
            LastExit::BeforeStart { exit } => format!("{exit}, before it started"),
        }
    }
}

/// The crashes at the end of the ledger.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CrashRun {
    /// Incarnations in a row, newest backwards, that crashed before running [`HEALTHY`].
    pub crashes: u32,
    /// How the newest of them ended.
    pub last: Option<LastExit>,
    /// When the first of them started (RFC 3339), for "N crashes since T".
    pub since: Option<String>,
    /// The newest incarnation crashed and no `crash_backoff` line followed it yet: the
    /// `ExecStopPost=` running now is for that crash (else for one before `started`).
    #[serde(skip)]
    pub newest_unlogged: bool,
}

struct Incarnation<'a> {
    started: SystemTime,
    started_ts: &'a str,
    exited: Option<(SystemTime, Option<i64>, Option<String>)>,
}

/// Reads the crash run from ledger events (oldest first, as `ledger::read_tail` returns them)
/// at `now`. An incarnation still running (the newest, with no `exited`, when `running_now`)
/// is not counted.
pub fn crash_run<'a>(
    events: impl IntoIterator<Item = &'a Map<String, Value>>,
    now: SystemTime,
    running_now: bool,
) -> CrashRun {
    let mut incs: Vec<(String, Incarnation<'a>)> = Vec::new();
    // The `crash_backoff` lines after the newest `started`: (ts, exit) each.
    let mut backoffs: Vec<(&'a str, Option<&'a str>)> = Vec::new();
    for e in events {
        let (Some(inc), Some(ev), Some(ts)) = (
            e.get("incarnation").and_then(Value::as_str),
            e.get("event").and_then(Value::as_str),
            e.get("ts").and_then(Value::as_str),
        ) else {
            continue;
        };
        let Some(at) = timefmt::parse(ts) else { continue };
        match ev {
            "started" => {
                backoffs.clear();
                incs.push((inc.to_owned(), Incarnation { started: at, started_ts: ts, exited: None }));
            }
            "crash_backoff" => backoffs.push((ts, e.get("exit").and_then(Value::as_str))),
            // Noticed later on its behalf: still an unrecorded end, at an unknown time.
            "exited" if e.contains_key("recorded_by") => {}
            "exited" => {
                if let Some((_, i)) = incs.iter_mut().rev().find(|(id, _)| id == inc) {
                    let code = e.get("code").and_then(Value::as_i64);
                    let reason = e.get("reason").and_then(Value::as_str).map(str::to_owned);
                    i.exited = Some((at, code, reason));
                }
            }
            _ => {}
        }
    }
    let mut run = CrashRun { crashes: 0, last: None, since: None, newest_unlogged: false };
    let mut end_of_next = now;
    let mut newest_crashed = false;
    for (n, (_, i)) in incs.iter().rev().enumerate() {
        let end = match &i.exited {
            Some((at, _, _)) => *at,
            None if n == 0 && running_now => {
                end_of_next = i.started;
                continue;
            }
            None => end_of_next,
        };
        let planned = match &i.exited {
            Some((_, Some(code), _)) => {
                let intent = i32::try_from(*code).map_or(ExitIntent::Unexpected, ExitIntent::from_code);
                intent != ExitIntent::Unexpected
            }
            Some((_, None, _)) => false,
            None => false,
        };
        if planned {
            break;
        }
        if run.last.is_none() {
            run.last = Some(match &i.exited {
                Some((_, code, reason)) => LastExit::Code { code: code.unwrap_or(-1), reason: reason.clone() },
                None => LastExit::Unrecorded,
            });
        }
        newest_crashed |= n == 0;
        run.crashes += 1;
        run.since = Some(i.started_ts.to_owned());
        if end.duration_since(i.started).is_ok_and(|up| up >= HEALTHY) {
            break;
        }
        end_of_next = i.started;
    }
    run.newest_unlogged = newest_crashed && backoffs.is_empty();
    let before_start = &backoffs[usize::from(newest_crashed).min(backoffs.len())..];
    if let (Some((first_ts, _)), Some((_, exit))) = (before_start.first(), before_start.last()) {
        run.crashes = run.crashes.saturating_add(u32::try_from(before_start.len()).unwrap_or(u32::MAX));
        run.last = Some(LastExit::BeforeStart { exit: exit.unwrap_or("a crash").to_owned() });
        run.since.get_or_insert_with(|| (*first_ts).to_owned());
    }
    run
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ev(event: &str, inc: &str, secs: u64, extra: Value) -> Map<String, Value> {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs);
        let mut m = json!({"event": event, "incarnation": inc, "ts": timefmt::format(t)});
        if let (Some(o), Value::Object(x)) = (m.as_object_mut(), extra) {
            o.extend(x);
        }
        m.as_object().cloned().unwrap_or_default()
    }

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
    }

    #[test]
    fn kills_and_crashes_in_a_row_are_counted_back_to_the_last_planned_exit() {
        let log = [
            ev("started", "a", 0, json!({})),
            ev("exited", "a", 5, json!({"code": 0})),
            ev("started", "b", 6, json!({})),
            ev("started", "c", 8, json!({})), // b was SIGKILLed: no `exited`
            ev("exited", "c", 9, json!({"code": 1, "reason": "panic"})),
            ev("started", "d", 10, json!({})), // killed too
        ];
        let r = crash_run(&log, at(12), false);
        assert_eq!(r.crashes, 3);
        assert_eq!(r.last, Some(LastExit::Unrecorded));
        assert_eq!(r.since.as_deref(), log[2]["ts"].as_str());
        // The newest incarnation still running is not a crash.
        let r = crash_run(&log, at(12), true);
        assert_eq!((r.crashes, r.last), (2, Some(LastExit::Code { code: 1, reason: Some("panic".into()) })));
    }

    /// An `exited` a later reader added on a killed incarnation's behalf (heal.rs) is still an
    /// unrecorded end, and its time (when it was noticed) does not make the run look healthy.
    #[test]
    fn an_exit_recorded_by_a_later_reader_is_still_unrecorded() {
        let log = [
            ev("started", "a", 0, json!({})),
            ev("exited", "a", 500, json!({"code": null, "intent": "unknown", "recorded_by": {"by": "status"}})),
            ev("started", "b", 5, json!({})),
        ];
        let r = crash_run(&log, at(600), true);
        assert_eq!((r.crashes, r.last), (1, Some(LastExit::Unrecorded)));
        assert_eq!(LastExit::Unrecorded.describe(), "no exit recorded: why is not known");
    }

    #[test]
    fn a_healthy_run_ends_the_count_and_restarts_count_as_planned() {
        let log = [
            ev("started", "a", 0, json!({})),
            ev("started", "b", 100, json!({})), // a ran 100 s, then died unrecorded
            ev("exited", "b", 101, json!({"code": 75})),
            ev("started", "c", 102, json!({})),
            ev("started", "d", 300, json!({})), // c ran 198 s: healthy, then killed
            ev("started", "e", 301, json!({})),
        ];
        assert_eq!(crash_run(&log, at(302), false).crashes, 3, "e and d quick, c healthy then killed");
        assert_eq!(crash_run(&log[..3], at(200), false).crashes, 0, "the newest exited 75");
        assert_eq!(crash_run(&log[..1], at(200), false).crashes, 1, "one long run that ended unrecorded");
        assert_eq!(
            crash_run(&[], at(0), false),
            CrashRun { crashes: 0, last: None, since: None, newest_unlogged: false }
        );
    }

    #[test]
    fn processes_that_died_before_started_count_from_their_backoff_lines() {
        let line = |secs, exit: &str| ev("crash_backoff", "x", secs, json!({"exit": exit}));
        let a = [ev("started", "a", 0, json!({})), ev("exited", "a", 1, json!({"code": 1}))];
        // The newest incarnation crashed; its own line not written yet, then written.
        let r = crash_run(&a, at(2), false);
        assert_eq!((r.crashes, r.newest_unlogged), (1, true));
        let mut log = a.to_vec();
        log.push(line(2, "exit 1"));
        let r = crash_run(&log, at(3), false);
        assert_eq!((r.crashes, r.newest_unlogged), (1, false));
        // Two more processes that never wrote `started`: three in a row, the last one's exit.
        log.extend([line(3, "exit 127"), line(4, "killed by SIGSEGV")]);
        let r = crash_run(&log, at(5), false);
        assert_eq!(r.crashes, 3);
        assert_eq!(r.last, Some(LastExit::BeforeStart { exit: "killed by SIGSEGV".into() }));
        assert_eq!(r.since.as_deref(), log[0]["ts"].as_str());
        // After a planned exit every line is a crash before `started`, counted from the first.
        let log = [
            ev("started", "a", 0, json!({})),
            ev("exited", "a", 1, json!({"code": 0})),
            line(2, "exit 127"),
            line(3, "exit 127"),
        ];
        let r = crash_run(&log, at(4), false);
        assert_eq!((r.crashes, r.newest_unlogged), (2, false));
        assert_eq!(r.since.as_deref(), log[2]["ts"].as_str());
        // A `started` after them ends that count: it is a new incarnation.
        let mut log = log.to_vec();
        log.push(ev("started", "b", 5, json!({})));
        assert_eq!(crash_run(&log, at(6), true).crashes, 0);
    }

    #[test]
    fn garbage_lines_are_ignored() {
        let log = [json!({"event": "started"}).as_object().cloned().unwrap(), ev("exited", "zz", 1, json!({}))];
        assert_eq!(crash_run(&log, at(2), false).crashes, 0);
    }
}
