//! `status` for a hermes home: truthful and fast (< 50 ms; hermes's own takes ~2 s and exits
//! 0 whatever it finds). Strictly read-only: it deletes nothing, not even a stale
//! `gateway.pid` (a starting hermes may have just written a fresh one).

use std::time::{Instant, SystemTime};

use gatewarden_lifecycle::ProcessIdentity;
use gatewarden_lifecycle::fsio::ReadOutcome;
use serde::Serialize;
use serde_json::{Map, Value};

use crate::files::{self, HermesState};
use crate::holder::{self, Finding, Source};
use crate::home::HermesHome;
use crate::supervisor::{self, SupervisedBy};
use crate::unit::{self, HermesUnit};

/// A heartbeat older than this while the lock is held suggests a wedged event loop (hermes
/// beats every 30 s).
pub const HEARTBEAT_STALE_S: f64 = 90.0;

/// Where the gateway is, as `status` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// Lock held and hermes's state says `running`/`degraded` for that process.
    Running,
    /// Lock held, but hermes has not (yet) reported this process running.
    Starting,
    /// Lock held and hermes reports `draining`/`stopping`/`stopped` for it.
    Stopping,
    NotRunning,
    /// The holder cannot be identified.
    Unknown,
}

#[derive(Debug, Clone, Serialize)]
pub struct HermesStatus {
    pub kind: &'static str,
    pub home: String,
    pub running: bool,
    pub phase: Phase,
    pub pid: Option<u32>,
    pub start_time: Option<u64>,
    pub holder_source: Option<Source>,
    /// hermes's `gateway_state`, only when its record names the holder.
    pub gateway_state: Option<String>,
    /// The state a previous (or no longer running) process left, reported as last known.
    pub last_state: Option<String>,
    pub exit_reason: Option<String>,
    pub restart_requested: Option<bool>,
    pub active_agents: Option<u64>,
    pub platforms: Map<String, Value>,
    pub served_profiles: Option<Vec<String>>,
    pub state_updated_at: Option<String>,
    pub heartbeat_age_s: Option<f64>,
    pub starts_last_120s: usize,
    /// More than 5 starts in 120 s: a starting hermes sleeps 10–300 s before taking the lock.
    pub storm_backoff: bool,
    pub supervisor: Option<String>,
    pub hermes_units: Vec<HermesUnit>,
    pub notes: Vec<String>,
    pub elapsed_ms: f64,
}

impl HermesStatus {
    /// 0 running (or starting/stopping: a process holds the home), 3 not running, 4 unknown.
    pub fn exit_code(&self) -> i32 {
        match self.phase {
            Phase::Running | Phase::Starting | Phase::Stopping => 0,
            Phase::NotRunning => 3,
            Phase::Unknown => 4,
        }
    }

    pub fn identity(&self) -> Option<ProcessIdentity> {
        Some(ProcessIdentity { pid: self.pid?, start_time: self.start_time? })
    }
}

/// Whether `id` holds the lock and hermes reports it `running`/`degraded`: hermes's own
/// notion of ready. Used by `start`, `restart` and the supervisor.
pub fn is_ready(home: &HermesHome, id: ProcessIdentity) -> bool {
    holder::find(home).identity() == Some(id)
        && files::read_state(home).ok().is_some_and(|s| s.names(id) && s.is_ready_state())
}

/// The status of `home`, read from the kernel's lock table and hermes's files.
pub fn status(home: &HermesHome) -> HermesStatus {
    let started = Instant::now();
    let now = SystemTime::now();
    let mut notes = Vec::new();
    let finding = holder::find(home);
    let state = match files::read_state(home) {
        ReadOutcome::Ok(s) => Some(s),
        ReadOutcome::Missing => None,
        ReadOutcome::Unreadable(why) => {
            notes.push(format!("gateway_state.json is unreadable: {why}"));
            None
        }
        ReadOutcome::Transient(why) => {
            notes.push(format!("gateway_state.json cannot be read right now: {why}"));
            None
        }
    };
    let (phase, identity, source) = match &finding {
        Finding::Held { identity, source, note } => {
            notes.extend(note.clone());
            (phase_of(state.as_ref(), *identity), Some(*identity), Some(*source))
        }
        Finding::Free => (Phase::NotRunning, None, None),
        Finding::Unproven { holds_lock, why, .. } => {
            notes.push(format!("not this home's gateway: {why}"));
            (if *holds_lock { Phase::Unknown } else { Phase::NotRunning }, None, None)
        }
        Finding::Unknown(why) => {
            notes.push(format!("cannot identify the lock holder: {why}"));
            (Phase::Unknown, None, None)
        }
    };
    let own = identity.and_then(|id| state.as_ref().filter(|s| s.names(id)));
    let last_state = match (&own, &state) {
        (None, Some(s)) => {
            if identity.is_some() {
                notes.push(format!(
                    "gateway_state.json describes pid {} (a previous process), not the holder",
                    s.pid.map_or("?".into(), |p| p.to_string())
                ));
            } else if s.gateway_state.as_deref() == Some("running") {
                notes.push("hermes last reported running, but no process holds the lock (killed or crashed)".into());
            }
            s.gateway_state.clone()
        }
        _ => None,
    };
    let heartbeat_age_s = identity.and_then(|id| {
        let hb = files::read_heartbeat(home)?;
        (hb.pid == Some(id.pid)).then(|| hb.age_s(now)).flatten()
    });
    if heartbeat_age_s.is_some_and(|a| a > HEARTBEAT_STALE_S) {
        notes.push(format!("heartbeat older than {HEARTBEAT_STALE_S:.0} s while the lock is held: wedged?"));
    }
    let starts = files::read_starts(&home.starts_log());
    let starts_last_120s = files::starts_within(&starts, files::epoch_s(now), files::STORM_WINDOW_S);
    let storm_backoff = starts_last_120s > files::STORM_MAX_STARTS;
    if storm_backoff && identity.is_none() {
        notes.push("hermes's respawn-storm brake is hot: a starting hermes sleeps before taking the lock".into());
    }
    let supervisor = identity.map(supervisor::detect).map(|s: SupervisedBy| s.label());
    let hermes_units = unit::find_hermes_units(home);
    let src = own.cloned().unwrap_or_default();
    let running = matches!(phase, Phase::Running | Phase::Starting | Phase::Stopping);
    HermesStatus {
        kind: crate::HERMES_KIND,
        home: home.display(),
        running,
        phase,
        pid: identity.map(|i| i.pid),
        start_time: identity.map(|i| i.start_time),
        holder_source: source,
        gateway_state: own.and_then(|s| s.gateway_state.clone()),
        last_state,
        exit_reason: own
            .and_then(|s| s.exit_reason.clone())
            .or_else(|| state.as_ref().and_then(|s| s.exit_reason.clone())),
        restart_requested: src.restart_requested,
        active_agents: src.active_agents,
        platforms: src.platforms,
        served_profiles: src.served_profiles,
        state_updated_at: state.as_ref().and_then(|s| s.updated_at.clone()),
        heartbeat_age_s,
        starts_last_120s,
        storm_backoff,
        supervisor,
        hermes_units,
        notes,
        elapsed_ms: started.elapsed().as_secs_f64() * 1000.0,
    }
}

fn phase_of(state: Option<&HermesState>, id: ProcessIdentity) -> Phase {
    match state.filter(|s| s.names(id)).and_then(|s| s.gateway_state.as_deref()) {
        Some("running" | "degraded") => Phase::Running,
        Some("draining" | "stopping" | "stopped") => Phase::Stopping,
        _ => Phase::Starting,
    }
}

/// The human rendering of [`HermesStatus`].
pub fn render_text(s: &HermesStatus) -> String {
    let mut out = String::new();
    let mut line = |k: &str, v: String| out.push_str(&format!("{k:<18}{v}\n"));
    line("hermes home", s.home.clone());
    let head = match (s.phase, s.identity()) {
        (Phase::Running, Some(id)) => format!("running, {id}"),
        (Phase::Starting, Some(id)) => format!("starting, {id}"),
        (Phase::Stopping, Some(id)) => format!("stopping, {id}"),
        (Phase::NotRunning, _) => "not running".into(),
        _ => "unknown".into(),
    };
    line("status", head);
    if let Some(st) = &s.gateway_state {
        line("hermes state", st.clone());
    }
    if let Some(st) = &s.last_state {
        line("last known state", st.clone());
    }
    if let Some(r) = &s.exit_reason {
        line("exit reason", r.clone());
    }
    if let Some(a) = s.active_agents {
        line("active agents", a.to_string());
    }
    if !s.platforms.is_empty() {
        let p: Vec<String> = s
            .platforms
            .iter()
            .map(|(name, v)| {
                let state = v.get("state").and_then(Value::as_str).unwrap_or("?");
                match v.get("error_code").and_then(Value::as_str) {
                    Some(code) => format!("{name}={state} ({code})"),
                    None => format!("{name}={state}"),
                }
            })
            .collect();
        line("platforms", p.join(", "));
    } else if s.running {
        line("platforms", "none configured".into());
    }
    if let Some(age) = s.heartbeat_age_s {
        line("heartbeat", format!("{age:.0} s ago"));
    }
    line(
        "starts (120 s)",
        format!("{}{}", s.starts_last_120s, if s.storm_backoff { " (storm brake hot)" } else { "" }),
    );
    if let Some(sup) = &s.supervisor {
        line("supervisor", sup.clone());
    }
    let units = if s.hermes_units.is_empty() {
        "none".to_string()
    } else {
        s.hermes_units
            .iter()
            .map(|u| format!("{} ({})", u.name, if u.enabled { "enabled" } else { "installed, not enabled" }))
            .collect::<Vec<_>>()
            .join(", ")
    };
    line("hermes unit", units);
    for n in &s.notes {
        line("note", n.clone());
    }
    out
}
