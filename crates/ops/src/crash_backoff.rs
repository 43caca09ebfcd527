//! `gatewarden crash-backoff`: the growing delay between restarts of a crashing gateway, for
//! systemd without `RestartSteps=` (< 254; crates/service/src/systemd/render.rs).
//!
//! The unit runs it as `ExecStopPost=`, where systemd says how the main process ended
//! (systemd.exec(5): `$EXIT_CODE` exited/killed/dumped, `$EXIT_STATUS` the code or signal
//! name). A planned exit (0, 75) or 78 returns at once. After a crash, the ledger's crash run
//! (gatewarden-lifecycle `crashes`) gives the count, and the supervise policy's ladder the
//! delay: the first crash is restarted at once, then 100 ms, 200 ms, … up to 30 s. The delay
//! and its cause go to the ledger (`crash_backoff`), where `status` and `doctor` read them.

use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use gatewarden_lifecycle::crashes::{CrashRun, crash_run};
use gatewarden_lifecycle::ledger::{Ledger, Writer};
use gatewarden_lifecycle::{ExitIntent, Home};
use gatewarden_service::supervise::SupervisePolicy;
use serde_json::json;

use crate::crash_loop::events;

pub fn crash_backoff(home: &Home) -> crate::Result<ExitCode> {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let (Some(how), Some(status)) = (var("EXIT_CODE"), var("EXIT_STATUS")) else {
        errln!(
            "crash-backoff: no $EXIT_CODE/$EXIT_STATUS (it runs as the systemd unit's ExecStopPost=); nothing to do"
        );
        return Ok(ExitCode::SUCCESS);
    };
    let Some(exit) = describe(&how, &status) else { return Ok(ExitCode::SUCCESS) };
    let home = home.canonicalized();
    let events = events(&home);
    let run = crash_run(&events, SystemTime::now(), false);
    let crashes = crashes_in_a_row(&run);
    let delay = delay_after(crashes);
    let _ = Ledger::new(home.ledger(), Writer::current()).append(
        "crash_backoff",
        json!({"crashes": crashes, "since": run.since, "exit": exit, "delay_ms": delay.as_millis() as u64}),
    );
    if !delay.is_zero() {
        errln!("crash-backoff: {crashes} crashes in a row (last: {exit}); restarting in {:.1} s", delay.as_secs_f64());
        std::thread::sleep(delay);
    }
    Ok(ExitCode::SUCCESS)
}

/// The crashes in a row, this one included: the ledger's crash run (which counts processes
/// that died before `started` by their lines), plus this crash unless it is the newest
/// incarnation's, already counted. Without the ones before `started`, `RestartSec=0` would
/// restart such a loop at once, forever.
fn crashes_in_a_row(run: &CrashRun) -> u32 {
    if run.newest_unlogged { run.crashes } else { run.crashes.saturating_add(1) }
}

/// How the main process ended, in words; `None` for an exit that is not a crash.
fn describe(how: &str, status: &str) -> Option<String> {
    match how {
        "exited" => {
            let code: i32 = status.parse().ok()?;
            (ExitIntent::from_code(code) == ExitIntent::Unexpected).then(|| format!("exit {code}"))
        }
        "killed" | "dumped" => {
            Some(format!("killed by SIG{status}{}", if how == "dumped" { " (core dumped)" } else { "" }))
        }
        _ => None,
    }
}

/// No extra wait after the first crash (systemd's `RestartSec=` alone: a one-off kill -9 is
/// back at once), then the supervise ladder one step behind.
fn delay_after(crashes: u32) -> Duration {
    if crashes <= 1 { Duration::ZERO } else { SupervisePolicy::default().backoff(crashes - 1) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Map, Value};

    #[test]
    fn only_crashes_wait() {
        assert_eq!(describe("exited", "0"), None);
        assert_eq!(describe("exited", "75"), None);
        assert_eq!(describe("exited", "78"), None);
        assert_eq!(describe("exited", "1").as_deref(), Some("exit 1"));
        assert_eq!(describe("killed", "KILL").as_deref(), Some("killed by SIGKILL"));
        assert_eq!(describe("dumped", "SEGV").as_deref(), Some("killed by SIGSEGV (core dumped)"));
        assert_eq!(describe("weird", "x"), None);
    }

    fn ev(event: &str, code: Option<i64>) -> Map<String, Value> {
        let mut m = json!({"event": event, "incarnation": "i", "ts": "2026-12-01T20:00:00.000000+00:00"});
        if let Some(c) = code {
            m["code"] = json!(c);
        }
        m.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn crashes_before_started_count_from_their_backoff_lines() {
        let in_a_row = |log: &[Map<String, Value>]| crashes_in_a_row(&crash_run(log, SystemTime::now(), false));
        // The newest incarnation crashed and nothing came after it: this crash is it.
        let log = [ev("started", None)];
        assert_eq!(in_a_row(&log), 1);
        // Its line, then two processes that died before `started`: this is the third of those.
        let log = [ev("started", None), ev("crash_backoff", None), ev("crash_backoff", None)];
        assert_eq!(in_a_row(&log), 3);
        // After a planned exit, every line is a crash before `started`, and so is this one.
        let log = [ev("started", None), ev("exited", Some(0)), ev("crash_backoff", None)];
        assert_eq!(in_a_row(&log), 2);
        assert_eq!(in_a_row(&[]), 1);
    }

    #[test]
    fn the_ladder_grows_to_its_cap() {
        let ms: Vec<u128> = (1..=12).map(|c| delay_after(c).as_millis()).collect();
        assert_eq!(&ms[..6], &[0, 100, 200, 400, 800, 1600]);
        assert_eq!(ms[11], 30_000);
    }
}
