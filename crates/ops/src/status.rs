//! `gatewarden status`: exit 0 running, 3 not running, 4 unknown.

use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime};

use gatewarden_control::{Client, Endpoint, StatusReport};
use gatewarden_lifecycle::identity::IdentityCheck;
use gatewarden_lifecycle::records::{read_pid_record, read_state};
use gatewarden_lifecycle::{Home, timefmt};
use gatewarden_service::supervise::{ParkedStateRead, read_parked_state};
use serde_json::json;

use crate::owner;
use crate::presence::{Presence, presence};

/// The whole answer stays under 300 ms even for a wedged holder (a SIGSTOPped gateway accepts
/// the connection in the kernel and then never answers).
const CONTROL_TIMEOUT: Duration = Duration::from_millis(200);
/// A lock holder this young that has not bound its endpoint yet is starting, not wedged.
const STARTING_GRACE: Duration = Duration::from_secs(10);

pub fn status(home: &Home, as_json: bool) -> crate::Result<ExitCode> {
    let (code, report) = report(home);
    if as_json {
        outln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_human(&report, code);
    }
    Ok(ExitCode::from(code))
}

/// The status report and its exit code (0 running, 3 not running, 4 unknown): what `status`
/// prints, and what the fleet page (dashboard.rs) shows for each home.
pub fn report(home: &Home) -> (u8, StatusReport) {
    let home = home.canonicalized();
    // A lock held only for a moment (another `status` or a `stop` healing stale files, a gateway
    // publishing its records) is looked at again, within this bound (issue 30, item 4).
    let until = Instant::now() + SETTLE;
    let (code, mut report, note) = loop {
        match observe(&home) {
            Observed::Done(code, report, note) => break (code, report, note),
            Observed::Again(code, report, note) if Instant::now() >= until => break (code, report, note),
            Observed::Again(..) => std::thread::sleep(Duration::from_millis(10)),
        }
    };
    if let Some(n) = &note {
        report.extra.insert("note".into(), json!(n));
    }
    // A state file still saying `running` with nobody holding the lock (one this status could
    // not close: a home it may not heal): the process ended without its exit path, and why is
    // not known. Say that, with what the record tells, never a guess at the signal.
    if code == 3
        && report.extra.get("last_exit_code").is_some_and(serde_json::Value::is_null)
        && let Some(last) = report.extra.get("last_state").and_then(|v| v.as_str()).filter(|s| *s != "stopped")
    {
        let seen = read_state(&home.state_file())
            .ok()
            .and_then(|s| s.updated_at)
            .map(|t| format!(" at {t}"))
            .unwrap_or_default();
        let reason = format!("{} (last seen {last}{seen})", gatewarden_lifecycle::heal::UNRECORDED_EXIT);
        report.extra.insert("last_exit_reason".into(), json!(reason));
    }
    // A full disk: the records, the ledger and the journal are not written there (issue 30, item 3).
    if let Some(f) = gatewarden_lifecycle::disk::full(home.dir()) {
        report.extra.insert("disk_full".into(), json!(f));
    }
    if let Some(c) = crate::crash_loop::crash_loop(&home, code == 0) {
        report.extra.insert("crash_loop".into(), json!({"sentence": c.sentence(), "detail": c}));
    }
    // The service manager's view next to the gateway's own.
    if let Some(m) = owner::installed(&home) {
        report.extra.insert("service".into(), m.managed().status_json());
    }
    match read_parked_state(home.dir()) {
        ParkedStateRead::Missing => {}
        ParkedStateRead::Parked(p) => {
            report.extra.insert(
                "parked".into(),
                json!({"kind": p.kind, "reason": p.reason, "parked_at": p.parked_at, "last_exit": p.last_exit}),
            );
        }
        ParkedStateRead::Unreadable(why) => {
            report.extra.insert("parked".into(), json!({"unreadable": why}));
        }
    }
    (code, report)
}

/// One look at the home: presence, the control endpoint, the records.
enum Observed {
    Done(u8, StatusReport, Option<String>),
    /// What a look found while the lock changed hands or its holder was not yet verified; the
    /// caller looks again while it may (a healer's lock lasts milliseconds).
    Again(u8, StatusReport, Option<String>),
}

/// How long `status` keeps looking at a lock held by something it cannot yet call a gateway.
const SETTLE: Duration = Duration::from_millis(250);

fn observe(home: &Home) -> Observed {
    // Read the records before a possible heal, so the report says what was found.
    let pid = read_pid_record(&home.pid_file());
    let state = read_state(&home.state_file());
    let mut report = StatusReport { home: home.dir().to_string_lossy().into_owned(), ..Default::default() };
    report.files.insert("pid".into(), pid.describe());
    report.files.insert("state".into(), state.describe());
    let (code, note) = match presence(home, "status") {
        Presence::Running => {
            let ep = Endpoint::for_home(home.dir());
            match Client::connect(&ep, CONTROL_TIMEOUT).and_then(|mut c| c.status(CONTROL_TIMEOUT)) {
                Ok(live) => {
                    let files = std::mem::take(&mut report.files);
                    report = live;
                    report.files = files;
                    (0, None)
                }
                Err(e) => {
                    // The lock says something runs; "running" needs its holder verified as a
                    // gateway of this home that its pid record names, incarnation included.
                    let holder = match gatewarden_lifecycle::holder::lock_holder(home) {
                        Ok(h) => h.identity,
                        // Gone since the probe, or held by a healer (`status`, `stop`), `flock`
                        // or anything else that is not a gateway: never "running".
                        Err(why) => {
                            report.extra.insert("lock_holder".into(), json!(why));
                            return Observed::Again(4, report, Some(why));
                        }
                    };
                    let verified = pid.clone().ok().filter(|r| {
                        r.identity() == Some(holder)
                            && holder.check() == IdentityCheck::Same
                            && (r.incarnation.is_some() || r.kind.as_deref() == Some("hermes-gateway"))
                    });
                    let Some(r) = verified else {
                        report.pid = Some(holder.pid);
                        report.state = Some("starting".into());
                        let why = format!(
                            "the lock holder pid {} has not published its identity yet (gateway.pid: {})",
                            holder.pid,
                            pid.describe()
                        );
                        report.extra.insert("records".into(), json!(why));
                        return Observed::Again(4, report, Some(why));
                    };
                    report.running = true;
                    report.pid = Some(r.pid);
                    report.start_time = r.start_time;
                    report.incarnation = r.incarnation;
                    report.version = r.version;
                    report.uptime_s =
                        r.started_at.as_deref().and_then(timefmt::parse).and_then(|t| {
                            SystemTime::now().duration_since(t).ok().map(|d| d.as_millis() as f64 / 1000.0)
                        });
                    // The state file describes the lock holder only if it names the same
                    // incarnation as its pid record; otherwise it is a predecessor's (the
                    // holder is still starting, or crashed before writing its records).
                    // (hermes records carry no incarnation: there the pid must match.)
                    let current = state.clone().ok().filter(|s| match &report.incarnation {
                        Some(_) => s.record.incarnation == report.incarnation,
                        None => report.pid == Some(s.record.pid),
                    });
                    let recorded_state = current.as_ref().map(|s| s.gateway_state.as_str().to_owned());
                    if let Some(s) = current {
                        report.listen = s.listen;
                        report.supervisor = s.supervisor;
                        report.control = s.control;
                    }
                    match unresponsive(home, &report, recorded_state.as_deref(), &e.to_string()) {
                        Some(why) => {
                            report.state = Some("unresponsive".into());
                            report.extra.insert("unresponsive".into(), json!(why));
                            (4, None)
                        }
                        None => {
                            report.state = Some(recorded_state.unwrap_or_else(|| "starting".into()));
                            (0, Some(format!("control endpoint not answering yet: {e}")))
                        }
                    }
                }
            }
        }
        Presence::NotRunning { healed } => {
            // Re-read: healing removes a state file that names another home; where there was no
            // lock to heal under (a foreign or hermes home), such a file is still not shown.
            let ours =
                |s: &gatewarden_lifecycle::records::StateRecord| s.record.home.as_deref().is_none_or(|h| home.is(h));
            if let Some(s) = read_state(&home.state_file()).ok().filter(ours) {
                report.extra.insert("last_state".into(), json!(s.gateway_state.as_str()));
                report.extra.insert("last_exit_code".into(), json!(s.exit_code));
                report.extra.insert("last_exit_reason".into(), json!(s.exit_reason));
            }
            if !healed.is_empty() {
                report.extra.insert("cleaned".into(), json!(healed));
            }
            (3, None)
        }
        Presence::Unknown(why) => (4, Some(why)),
    };
    Observed::Done(code, report, note)
}

/// Why a lock holder whose control endpoint did not answer is wedged, or `None` while it is
/// plausibly still starting (young, and no record says it got past `starting`).
fn unresponsive(home: &Home, r: &StatusReport, recorded_state: Option<&str>, err: &str) -> Option<String> {
    let holder = gatewarden_lifecycle::holder::lock_holder(home).ok().map(|h| h.identity.pid).or(r.pid);
    if let Some(pid) = holder
        && gatewarden_lifecycle::platform::is_stopped(pid) == Some(true)
    {
        return Some(format!("process {pid} is stopped (SIGSTOP or traced): it cannot answer"));
    }
    let young = r.uptime_s.is_none_or(|u| u < STARTING_GRACE.as_secs_f64());
    if young && matches!(recorded_state, None | Some("starting")) {
        return None;
    }
    Some(format!("control endpoint silent: {err}"))
}

fn print_human(r: &StatusReport, code: u8) {
    use crate::ui::{Tone, paint, state_tone};
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    let tone = |t: Tone, s: &str| paint(t, s).into_owned();
    match code {
        0 => outln!(
            "gatewarden: {} (pid {}, incarnation {}, up {})",
            tone(Tone::Good, "running"),
            r.pid.map_or("?".into(), |p| p.to_string()),
            opt(&r.incarnation),
            r.uptime_s.map_or("?".into(), human_duration)
        ),
        3 => outln!("gatewarden: {}", tone(Tone::Dim, "not running")),
        _ if r.state.as_deref() == Some("unresponsive") => outln!(
            "gatewarden: {} (pid {} holds the lock but does not answer)",
            tone(Tone::Bad, "unresponsive"),
            r.pid.map_or("?".into(), |p| p.to_string())
        ),
        _ => outln!("gatewarden: {}", tone(Tone::Warn, "unknown")),
    }
    if code == 0 || r.state.as_deref() == Some("unresponsive") {
        let state = opt(&r.state);
        outln!("  state:       {}", tone(state_tone(&state), &state));
        // What users see first: the agent, the chats, the last thing that failed (one line each).
        if let Some(line) = crate::health::agent_line(r, &tone) {
            outln!("  agent:       {line}");
        }
        if let Some(line) = crate::health::platforms_line(r, &tone) {
            outln!("  platforms:   {line}");
        }
        if let Some((at, what)) = crate::health::last_failure(r) {
            outln!("  last failure: {} ({at})", tone(Tone::Bad, &what));
        }
        outln!("  listen:      {}", r.listen.as_deref().map_or("-".into(), |l| format!("http://{l}")));
        outln!("  supervisor:  {}", opt(&r.supervisor));
        if let Some(ev) = r.extra.get("supervisor_evidence").and_then(|v| v.as_str()) {
            outln!("               ({ev})");
        }
        outln!("  active runs: {}", r.active_runs.map_or("-".into(), |n| n.to_string()));
        outln!("  version:     {}", opt(&r.version));
        outln!("  control:     {}", opt(&r.control));
    }
    if let Some(c) = r.extra.get("crash_loop").and_then(|c| c.get("sentence")).and_then(|v| v.as_str()) {
        outln!("  crash loop:  {c}");
    }
    if let Some(keys) = r.extra.get("restart_needed").and_then(|v| v.as_array()).filter(|a| !a.is_empty()) {
        let keys: Vec<&str> = keys.iter().filter_map(|k| k.as_str()).collect();
        outln!("  restart for: {} (changed in config.toml since start; `gatewarden restart`)", keys.join(", "));
    }
    if let Some(f) = r.extra.get("disk_full") {
        let free = f.get("free_bytes").and_then(serde_json::Value::as_u64).unwrap_or(0);
        outln!(
            "  disk full:   {} ({free} bytes free; disk-full)",
            f.get("path").and_then(|v| v.as_str()).unwrap_or("?")
        );
    }
    for key in ["last_state", "last_exit_code", "last_exit_reason", "cleaned", "unresponsive", "note"] {
        if let Some(v) = r.extra.get(key).filter(|v| !v.is_null()) {
            let text = v.as_str().map(str::to_owned).unwrap_or_else(|| v.to_string());
            outln!("  {:<12} {text}", format!("{}:", key.replace('_', " ")));
        }
    }
    if let Some(c) = r.extra.get("cluster") {
        let get =
            |v: Option<&serde_json::Value>| v.map(|v| v.as_str().map(str::to_owned).unwrap_or_else(|| v.to_string()));
        let active = c.get("active").filter(|a| !a.is_null()).map_or("none known".into(), |a| {
            format!(
                "{} {} pid {} since {}",
                get(a.get("host")).unwrap_or_default(),
                get(a.get("home")).unwrap_or_default(),
                get(a.get("pid")).unwrap_or_default(),
                get(a.get("since")).unwrap_or_default()
            )
        });
        outln!(
            "  cluster:     {} in {} (epoch {}); active: {active}",
            get(c.get("role")).unwrap_or_default(),
            get(c.get("name")).unwrap_or_default(),
            get(c.get("epoch")).unwrap_or_else(|| "-".into()),
        );
    }
    if let Some(svc) = r.extra.get("service") {
        let get = |k: &str| svc.get(k).and_then(|v| v.as_str()).unwrap_or("?").to_owned();
        let active = svc.get("active").and_then(serde_json::Value::as_bool).unwrap_or(false);
        let pid = svc.get("main_pid").and_then(serde_json::Value::as_u64).map_or("-".into(), |p| p.to_string());
        let sub = svc.get("sub_state").and_then(|v| v.as_str()).map(|s| format!(" ({s})")).unwrap_or_default();
        outln!(
            "  service:     {} {}: {}{sub}, main pid {pid}",
            get("manager"),
            get("unit"),
            if active { "active" } else { "inactive" }
        );
    }
    if let Some(list) = r.extra.get("platforms").and_then(serde_json::Value::as_array) {
        for p in list {
            let get = |k: &str| p.get(k).and_then(|v| v.as_str()).unwrap_or("?").to_owned();
            let reason = p.get("reason").and_then(|v| v.as_str()).map(|r| format!(": {r}")).unwrap_or_default();
            let age = p
                .get("progress_age_s")
                .and_then(serde_json::Value::as_f64)
                .map_or("never".into(), |s| format!("{} ago", human_duration(s)));
            outln!("  platform:    {} ({}) {}{reason}; last progress {age}", get("name"), get("kind"), get("state"));
            match (p.get("open").and_then(serde_json::Value::as_bool), p.get("access").and_then(|v| v.as_str())) {
                (Some(true), _) => outln!("               access open: anyone can reach the agent"),
                (_, Some(a)) => {
                    let pending = p.get("pending").and_then(serde_json::Value::as_u64).unwrap_or(0);
                    outln!("               access {a}, {pending} pairing code(s) pending");
                }
                _ => {}
            }
        }
    }
    if let Some(p) = r.extra.get("parked") {
        let text = p.get("reason").or_else(|| p.get("unreadable")).and_then(|v| v.as_str()).unwrap_or("?");
        outln!("  parked:      {text}");
        outln!("               (after fixing the cause: gatewarden --home {} start)", r.home);
    }
    outln!("  home:        {}", r.home);
    for (name, st) in &r.files {
        if st != "ok" && st != "missing" {
            outln!("  {name} file:    {st}");
        }
    }
}

fn human_duration(s: f64) -> String {
    let s = s as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{}s", s / 60, s % 60),
        _ => format!("{}h{}m", s / 3600, (s % 3600) / 60),
    }
}
