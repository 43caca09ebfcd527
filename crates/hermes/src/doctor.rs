//! Findings for a hermes home. Read-only; each finding says what to do. None of them is
//! fixed by deleting hermes's `gateway.lock` or `gateway_state.json`.

use std::time::SystemTime;

use gatewarden_lifecycle::fsio::{self, ReadOutcome};
use gatewarden_lifecycle::probe::probe_u32;
use serde::Serialize;
use serde_json::Value;

use crate::files;
use crate::holder::{self, Finding as Holder};
use crate::home::HermesHome;
use crate::marker::is_naive_timestamp;
use crate::unit::find_hermes_units;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Code {
    /// hermes's own unit is enabled and gatewarden's supervisor also manages the home.
    TwoManagers,
    /// More than 5 starts in 120 s: hermes sleeps before each further start.
    HotStormLedger,
    /// `gateway_state.json` says `running`, but nobody holds the lock.
    StaleRunningState,
    /// A scoped token lock names a dead process.
    StaleScopedLock,
    /// A marker whose `written_at` has no UTC offset: hermes treats it as stale.
    NaiveMarkerTimestamp,
    /// A hermes process for this home runs, but `gateway.lock` is gone (someone unlinked it).
    MissingLockFile,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub code: Code,
    pub message: String,
    pub fix: String,
}

/// What doctor needs beyond the home: where scoped locks live and the hermes processes seen.
#[derive(Debug, Clone, Default)]
pub struct Context {
    /// `$HERMES_GATEWAY_LOCK_DIR`, else `$XDG_STATE_HOME/hermes/gateway-locks`, else
    /// `~/.local/state/hermes/gateway-locks` (as the hermes process resolves it).
    pub scoped_lock_dir: Option<std::path::PathBuf>,
    /// Whether our supervisor manages the home (a gatewarden unit installed, or running).
    pub gatewarden_manages: bool,
    /// pids of `hermes gateway run` processes whose `HERMES_HOME` is this home.
    pub hermes_pids: Vec<u32>,
}

impl Context {
    /// The context from this machine: scoped locks where hermes (with our environment) puts
    /// them, whether our unit is installed or our supervisor runs hermes, and the
    /// `hermes gateway run` processes whose `HERMES_HOME` is this home.
    pub fn discover(home: &HermesHome) -> Context {
        let holder_supervised = holder::find(home).identity().is_some_and(|id| {
            matches!(crate::supervisor::detect(id), crate::supervisor::SupervisedBy::Gatewarden { .. })
        });
        Context {
            scoped_lock_dir: crate::scoped::lock_dir(|k| std::env::var_os(k)),
            gatewarden_manages: holder_supervised || crate::unit::find_our_unit(home).is_some(),
            hermes_pids: gatewarden_lifecycle::platform::processes_with_env(
                "HERMES_HOME",
                home.env_value(),
                &["gateway", "run"],
            ),
        }
    }
}

pub fn doctor(home: &HermesHome, ctx: &Context) -> Vec<Finding> {
    let mut out = Vec::new();
    let mut add = |code, message: String, fix: &str| out.push(Finding { code, message, fix: fix.into() });
    let units = find_hermes_units(home);
    if ctx.gatewarden_manages
        && let Some(u) = units.iter().find(|u| u.enabled)
    {
        add(
            Code::TwoManagers,
            format!("hermes's own unit {} is enabled for this home, and gatewarden manages it too", u.name),
            "disable one (gatewarden service install --adopt disables hermes's unit)",
        );
    }
    let now = SystemTime::now();
    let n = files::starts_within(&files::read_starts(&home.starts_log()), files::epoch_s(now), files::STORM_WINDOW_S);
    if n > files::STORM_MAX_STARTS {
        add(
            Code::HotStormLedger,
            format!("{n} starts in the last 120 s: hermes sleeps 10-300 s before each further start"),
            "find why it restarts (gatewarden history); under gatewarden supervise hermes's brake is off",
        );
    }
    let holder = holder::find(home);
    if matches!(holder, Holder::Free)
        && let ReadOutcome::Ok(s) = files::read_state(home)
        && s.gateway_state.as_deref() == Some("running")
    {
        add(
            Code::StaleRunningState,
            format!("gateway_state.json says running (pid {}), but no process holds gateway.lock", fmt_pid(s.pid)),
            "nothing to delete: it is hermes's last known state (killed or crashed); start the gateway again",
        );
    }
    if let Some(dir) = &ctx.scoped_lock_dir
        && let Ok(entries) = std::fs::read_dir(dir)
    {
        for e in entries.flatten().filter(|e| e.file_name().to_string_lossy().ends_with(".lock")) {
            let Some(v) = fsio::read_json::<Value>(&e.path()).ok() else { continue };
            let Some(pid) = v.get("pid").and_then(Value::as_u64) else { continue };
            if crate::scoped::judge_value(&v, probe_u32) == crate::scoped::Record::Stale {
                add(
                    Code::StaleScopedLock,
                    format!("{} names pid {pid}, which no longer runs", e.path().display()),
                    "hermes replaces it at the next acquire; remove it only while no gateway starts",
                );
            }
        }
    }
    for path in [home.planned_stop_marker(), home.takeover_marker()] {
        if let ReadOutcome::Ok(v) = fsio::read_json::<Value>(&path)
            && let Some(w) = v.get("written_at").and_then(Value::as_str)
            && is_naive_timestamp(w)
        {
            add(
                Code::NaiveMarkerTimestamp,
                format!("{} has a timestamp without offset ({w}): hermes treats it as stale", path.display()),
                "the writer must use an aware UTC time (+00:00); gatewarden's stop does",
            );
        }
    }
    if !home.lock().exists() && !ctx.hermes_pids.is_empty() {
        add(
            Code::MissingLockFile,
            format!("gateway.lock is missing while hermes runs for this home (pid {:?})", ctx.hermes_pids),
            "someone unlinked it (hermes gateway stop/status do): a second gateway could start; stop and start it",
        );
    }
    out
}

fn fmt_pid(p: Option<u32>) -> String {
    p.map_or("?".into(), |p| p.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crafted_home_findings() {
        let dir = tempfile::tempdir().unwrap();
        let home = HermesHome::at(dir.path().join("h"));
        let locks = dir.path().join("locks");
        std::fs::create_dir_all(home.dir()).unwrap();
        std::fs::create_dir_all(&locks).unwrap();
        let now = files::epoch_s(SystemTime::now());
        let starts: String = (0..7).map(|i| format!("{}\n", now - f64::from(i))).collect();
        std::fs::write(home.starts_log(), starts).unwrap();
        std::fs::write(home.lock(), "").unwrap();
        std::fs::write(home.state_file(), r#"{"pid":999999999,"gateway_state":"running"}"#).unwrap();
        std::fs::write(
            locks.join("telegram-bot-token-2bb80d537b1da3e3.lock"),
            r#"{"pid": 2147483000, "start_time": 5}"#,
        )
        .unwrap();
        std::fs::write(
            home.planned_stop_marker(),
            r#"{"target_pid": 5, "target_start_time": 1, "stopper_pid": 6, "written_at": "2026-11-30T15:28:04.758116"}"#,
        )
        .unwrap();
        let ctx = Context { scoped_lock_dir: Some(locks), gatewarden_manages: false, hermes_pids: vec![] };
        let codes: Vec<Code> = doctor(&home, &ctx).into_iter().map(|f| f.code).collect();
        assert_eq!(
            codes,
            [Code::HotStormLedger, Code::StaleRunningState, Code::StaleScopedLock, Code::NaiveMarkerTimestamp]
        );
        std::fs::remove_file(home.lock()).unwrap();
        let ctx = Context { hermes_pids: vec![std::process::id()], ..ctx };
        assert!(doctor(&home, &ctx).iter().any(|f| f.code == Code::MissingLockFile));
        // Doctor deletes nothing.
        assert!(home.state_file().exists() && home.planned_stop_marker().exists());
    }
}
