//! What a person wants to know first about a running gateway, read from its status report
//! (docs/protocol.md §4): is the agent answering, are the chats connected, what failed last.
//! One reading, for `status`'s summary lines, `top`, and the thresholds `doctor` reports
//! against. Pure.

use gatewarden_control::StatusReport;
use serde_json::Value;

/// Runs failed in a row from which the agent counts as failing (`doctor`'s `runs-failing`).
pub const RUNS_FAILING: u64 = 3;

/// How full a journal cap may get before `doctor` says so (`journal-near-cap`,
/// `queue-near-cap`), in percent.
pub const NEAR_CAP_PERCENT: u64 = 80;

/// A health verdict, worst last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Health {
    Healthy,
    Degraded,
    Failing,
}

impl Health {
    pub fn word(self) -> &'static str {
        match self {
            Health::Healthy => "healthy",
            Health::Degraded => "degraded",
            Health::Failing => "failing",
        }
    }

    pub fn tone(self) -> crate::ui::Tone {
        match self {
            Health::Healthy => crate::ui::Tone::Good,
            Health::Degraded => crate::ui::Tone::Warn,
            Health::Failing => crate::ui::Tone::Bad,
        }
    }
}

fn text<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(Value::as_str).unwrap_or_default()
}

fn num(v: &Value, k: &str) -> u64 {
    v.get(k).and_then(Value::as_u64).unwrap_or(0)
}

/// The agent's runs failed in a row, from `agent.runs` (0 when not reported).
pub fn failures_in_a_row(r: &StatusReport) -> u64 {
    r.extra.get("agent").and_then(|a| a.get("runs")).map_or(0, |runs| num(runs, "failures_in_a_row"))
}

/// The agent's health: failing when [`RUNS_FAILING`] runs failed in a row or no provider is
/// healthy; degraded when a run failed last or a provider is failing or cooling down.
pub fn agent(r: &StatusReport) -> Health {
    let in_a_row = failures_in_a_row(r);
    let providers = r.providers.as_deref().unwrap_or_default();
    let unhealthy = providers.iter().filter(|p| p.state != "healthy").count();
    if in_a_row >= RUNS_FAILING || (!providers.is_empty() && unhealthy == providers.len()) {
        Health::Failing
    } else if in_a_row > 0 || unhealthy > 0 {
        Health::Degraded
    } else {
        Health::Healthy
    }
}

/// `status`'s agent line: the verdict, the backend, the runs, each provider not healthy.
pub fn agent_line(r: &StatusReport, paint: &dyn Fn(crate::ui::Tone, &str) -> String) -> Option<String> {
    let a = r.extra.get("agent")?;
    let h = agent(r);
    let mut parts = vec![paint(h.tone(), h.word()), format!("backend {}", text(a, "backend"))];
    if let Some(runs) = a.get("runs") {
        let in_a_row = num(runs, "failures_in_a_row");
        let mut s = format!("{} ok, {} failed", num(runs, "ok"), num(runs, "failed") + num(runs, "timeout"));
        if in_a_row > 0 {
            s.push_str(&format!(" ({in_a_row} in a row)"));
        }
        parts.push(s);
    }
    for p in r.providers.as_deref().unwrap_or_default() {
        let until = p.until.map(|u| format!(" until {}", clock(u))).unwrap_or_default();
        let why = p.reason.as_deref().map(|w| format!(": {w}")).unwrap_or_default();
        parts.push(format!("provider {} {}{until}{why}", p.name, paint(crate::ui::state_tone(&p.state), &p.state)));
    }
    Some(parts.join(" · "))
}

/// The platforms' health: failing when one is parked, degraded when one is degraded (or not
/// connected yet), healthy when every adapter is connected (or a cluster standby).
pub fn platforms(r: &StatusReport) -> Option<Health> {
    let list = r.extra.get("platforms")?.as_array()?;
    Some(list.iter().map(|p| state_health(text(p, "state"))).max().unwrap_or(Health::Healthy))
}

fn state_health(state: &str) -> Health {
    match state {
        "connected" | "standby" => Health::Healthy,
        "parked" | "closed" => Health::Failing,
        _ => Health::Degraded,
    }
}

/// `status`'s platforms line: the verdict, then each adapter with its state (and why).
pub fn platforms_line(r: &StatusReport, paint: &dyn Fn(crate::ui::Tone, &str) -> String) -> Option<String> {
    let h = platforms(r)?;
    let list = r.extra.get("platforms")?.as_array()?;
    let each: Vec<String> = list
        .iter()
        .map(|p| {
            let state = text(p, "state");
            let why = p.get("reason").and_then(Value::as_str).map(|w| format!(": {w}")).unwrap_or_default();
            format!("{} ({}) {}{why}", text(p, "name"), text(p, "kind"), paint(crate::ui::state_tone(state), state))
        })
        .collect();
    Some(format!("{} · {}", paint(h.tone(), h.word()), each.join(", ")))
}

/// The last failure a user would have seen: the agent's last failed run, else the last error
/// of an adapter that is not connected. `(when, what)`.
pub fn last_failure(r: &StatusReport) -> Option<(String, String)> {
    let agent = r.extra.get("agent").and_then(|a| a.get("last_failure")).filter(|f| !f.is_null());
    if let Some(f) = agent {
        return Some((text(f, "at").to_owned(), format!("agent run: {}", text(f, "reason"))));
    }
    let list = r.extra.get("platforms").and_then(Value::as_array)?;
    list.iter().filter(|p| text(p, "state") != "connected").find_map(|p| {
        let e = p.get("last_error").and_then(Value::as_str).or_else(|| p.get("reason").and_then(Value::as_str))?;
        Some((text(p, "since").to_owned(), format!("platform {}: {e}", text(p, "name"))))
    })
}

/// Unix seconds as a time of day, UTC (`HH:MM:SS UTC`): a cool-down lasts seconds to minutes.
fn clock(unix: u64) -> String {
    let s = unix % 86_400;
    format!("{:02}:{:02}:{:02} UTC", s / 3600, (s % 3600) / 60, s % 60)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn report(v: Value) -> StatusReport {
        serde_json::from_value(v).unwrap()
    }

    fn plain(_: crate::ui::Tone, s: &str) -> String {
        s.to_owned()
    }

    #[test]
    fn the_agent_fails_after_runs_fail_in_a_row_or_with_no_healthy_provider() {
        let base = json!({"running": true, "home": "/h", "agent": {"backend": "openai",
            "runs": {"ok": 5, "failed": 0, "timeout": 0, "failures_in_a_row": 0}, "last_failure": null}});
        let r = report(base.clone());
        assert_eq!(agent(&r), Health::Healthy);
        assert_eq!(agent_line(&r, &plain).unwrap(), "healthy · backend openai · 5 ok, 0 failed");
        let mut v = base.clone();
        v["agent"]["runs"]["failures_in_a_row"] = json!(RUNS_FAILING);
        v["agent"]["runs"]["failed"] = json!(3);
        assert_eq!(agent(&report(v.clone())), Health::Failing);
        assert!(agent_line(&report(v), &plain).unwrap().contains("3 failed (3 in a row)"));
        let mut v = base.clone();
        v["providers"] = json!([
            {"name": "a", "state": "cooling_down", "until": 3600 * 10, "reason": "HTTP 502", "attempts": 3, "failures": 3},
            {"name": "b", "state": "healthy", "attempts": 1, "failures": 0}]);
        assert_eq!(agent(&report(v.clone())), Health::Degraded);
        assert!(
            agent_line(&report(v.clone()), &plain)
                .unwrap()
                .contains("provider a cooling_down until 10:00:00 UTC: HTTP 502"),
        );
        v["providers"][1]["state"] = json!("failing");
        assert_eq!(agent(&report(v)), Health::Failing);
    }

    #[test]
    fn platforms_are_as_healthy_as_the_worst_adapter() {
        let r = report(json!({"running": true, "home": "/h", "platforms": [
            {"name": "tg", "kind": "telegram", "state": "connected"},
            {"name": "mx", "kind": "matrix", "state": "degraded", "reason": "hs: refused", "last_error": "hs: refused",
             "since": "2026-12-01T00:00:00+00:00"}]}));
        assert_eq!(platforms(&r), Some(Health::Degraded));
        assert_eq!(
            platforms_line(&r, &plain).unwrap(),
            "degraded · tg (telegram) connected, mx (matrix) degraded: hs: refused"
        );
        assert_eq!(last_failure(&r), Some(("2026-12-01T00:00:00+00:00".into(), "platform mx: hs: refused".into())));
        let parked = report(json!({"running": true, "home": "/h", "platforms": [
            {"name": "tg", "kind": "telegram", "state": "parked", "reason": "credentials rejected"}]}));
        assert_eq!(platforms(&parked), Some(Health::Failing));
        assert_eq!(platforms(&report(json!({"running": true, "home": "/h"}))), None);
    }

    #[test]
    fn the_agent_s_last_failure_comes_first() {
        let r = report(json!({"running": true, "home": "/h",
            "agent": {"backend": "exec", "last_failure": {"at": "2026-12-01T00:00:01+00:00", "reason": "exit 1"}},
            "platforms": [{"name": "tg", "kind": "telegram", "state": "degraded", "last_error": "x"}]}));
        assert_eq!(last_failure(&r), Some(("2026-12-01T00:00:01+00:00".into(), "agent run: exit 1".into())));
    }
}
