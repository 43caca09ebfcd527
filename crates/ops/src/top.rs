//! `gatewarden top`: the gateway at a glance, redrawn every second (like `pm2 monit`): its
//! process (CPU, memory, threads), the agent and each provider, the chat platforms with their
//! lag, the queue and the runs in flight, messages per minute, then the dashboard's text view
//! (crates/dashboard/src/text.rs: the incarnations, the runs, the log's last lines).
//! `--once` prints one frame; `--json` one snapshot as a document (docs/protocol.md §6.3).

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime};

use gatewarden_control::StatusReport;
use gatewarden_dashboard::{actions, gather};
use gatewarden_lifecycle::Home;
use gatewarden_lifecycle::platform::{ProcessUsage, process_usage};
use serde_json::{Value, json};

use crate::ui::{Tone, paint, state_tone};

/// Redraw interval.
const TICK: Duration = Duration::from_secs(1);
/// What one frame (`--once`, `--json`) measures the CPU over.
const SAMPLE: Duration = Duration::from_millis(500);

/// The gateway's process between two looks: CPU in percent of one core over the interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Process {
    pub pid: u32,
    pub cpu_percent: Option<f64>,
    pub rss_bytes: u64,
    pub threads: u64,
}

/// Pure: the process as seen by `now` after `before` (`None`: first look, no CPU yet).
pub fn process(pid: u32, before: Option<(Instant, ProcessUsage)>, now: (Instant, ProcessUsage)) -> Process {
    let cpu_percent = before.and_then(|(t0, u0)| {
        let wall = now.0.checked_duration_since(t0)?.as_secs_f64();
        (wall > 0.0).then(|| ((now.1.cpu_s - u0.cpu_s).max(0.0) / wall) * 100.0)
    });
    Process { pid, cpu_percent, rss_bytes: now.1.rss_bytes, threads: now.1.threads }
}

pub fn top(home: &Home, once: bool, log_lines: usize, json: bool) -> crate::Result<ExitCode> {
    let home = home.canonicalized();
    let mut last: Option<(u32, Instant, ProcessUsage)> = None;
    if once || json {
        // A first look, so the one frame has a CPU figure.
        let (_, r) = crate::status::report(&home);
        if let Some(pid) = r.pid.filter(|_| r.running)
            && let Some(u) = process_usage(pid)
        {
            last = Some((pid, Instant::now(), u));
            std::thread::sleep(SAMPLE);
        }
    }
    loop {
        let (_, report) = crate::status::report(&home);
        let proc_now = report.pid.filter(|_| report.running).and_then(|pid| Some((pid, process_usage(pid)?)));
        let proc_view = proc_now.map(|(pid, u)| {
            let before = last.filter(|(p, _, _)| *p == pid).map(|(_, t, u)| (t, u));
            process(pid, before, (Instant::now(), u))
        });
        last = proc_now.map(|(pid, u)| (pid, Instant::now(), u));
        if json {
            crate::ui::print_json(&snapshot_json(&report, proc_view.as_ref()));
            return Ok(ExitCode::SUCCESS);
        }
        let ours = header(&report, proc_view.as_ref());
        let mut s = gather::from_home(&home, report, SystemTime::now());
        s.outcome = actions::read(&home);
        let text = gatewarden_dashboard::text::text(&s, log_lines);
        // The view's two header lines (state, home; the incarnation) first, then ours.
        let split = text.match_indices('\n').nth(1).map_or(text.len(), |(i, _)| i + 1);
        let frame = format!("{}{ours}{}", &text[..split], &text[split..]);
        let mut out = std::io::stdout().lock();
        if once {
            let _ = out.write_all(frame.as_bytes());
            return Ok(ExitCode::SUCCESS);
        }
        // Clear the screen and home the cursor, then the frame. A reader gone is the end.
        if out.write_all(format!("\u{1b}[2J\u{1b}[H{frame}").as_bytes()).and_then(|()| out.flush()).is_err() {
            return Ok(ExitCode::SUCCESS);
        }
        drop(out);
        std::thread::sleep(TICK);
    }
}

/// `top --json`: the status report, the process, and the rates, in one document.
fn snapshot_json(r: &StatusReport, p: Option<&Process>) -> Value {
    let runs = r.extra.get("agent").and_then(|a| a.get("runs"));
    json!({
        "status": r,
        "process": p.map(|p| json!({"pid": p.pid, "cpu_percent": p.cpu_percent, "rss_bytes": p.rss_bytes,
                                    "threads": p.threads})),
        "messages_per_minute": runs.and_then(|r| r.get("last_minute")),
        "runs_in_flight": r.active_runs,
        "queue": r.extra.get("journal"),
        "agent": crate::health::agent(r).word(),
        "platforms": crate::health::platforms(r).map(|h| h.word()),
    })
}

/// The lines above the dashboard's text: the process, the agent and providers, the platforms
/// with their lag, the queue and rates.
fn header(r: &StatusReport, p: Option<&Process>) -> String {
    let tone = |t: Tone, s: &str| paint(t, s).into_owned();
    let mut out = String::new();
    if let Some(p) = p {
        let cpu = p.cpu_percent.map_or("-".into(), |c| format!("{c:.1}%"));
        out.push_str(&format!(
            "process    pid {}  cpu {cpu}  memory {}  threads {}\n",
            p.pid,
            mib(p.rss_bytes),
            p.threads
        ));
    }
    if let Some(line) = crate::health::agent_line(r, &tone) {
        out.push_str(&format!("agent      {line}\n"));
    }
    let runs = r.extra.get("agent").and_then(|a| a.get("runs"));
    let per_minute = runs.and_then(|r| r.get("last_minute")).and_then(Value::as_u64);
    let j = r.extra.get("journal");
    let n = |k: &str| j.and_then(|j| j.get(k)).and_then(Value::as_u64);
    if r.running {
        let mut work = format!(
            "work       {} in flight  {} queued",
            r.active_runs.unwrap_or(0),
            n("queued").map_or("-".into(), |q| q.to_string())
        );
        if let Some(b) = n("busiest_chat_queued").filter(|b| *b > 0) {
            work.push_str(&format!(" (busiest chat {b})"));
        }
        if let Some(bytes) = n("bytes") {
            let cap = n("max_bytes").map(|m| format!(" of {}", mib(m))).unwrap_or_default();
            work.push_str(&format!("  journal {}{cap}", mib(bytes)));
        }
        work.push_str(&format!("  {} msg/min\n", per_minute.map_or("-".into(), |m| m.to_string())));
        out.push_str(&work);
    }
    for pl in r.extra.get("platforms").and_then(Value::as_array).into_iter().flatten() {
        let t = |k: &str| pl.get(k).and_then(Value::as_str).unwrap_or("?");
        let secs = |k: &str| pl.get(k).and_then(Value::as_f64).map_or("-".into(), |s| format!("{s:.1}s"));
        out.push_str(&format!(
            "platform   {} ({}) {}  lag {}  last progress {} ago\n",
            t("name"),
            t("kind"),
            tone(state_tone(t("state")), t("state")),
            secs("lag_s"),
            secs("progress_age_s")
        ));
    }
    if let Some((at, what)) = crate::health::last_failure(r) {
        out.push_str(&format!("failure    {} ({at})\n", tone(Tone::Bad, &what)));
    }
    out
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / (1024.0 * 1024.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_is_the_share_of_one_core_between_two_looks() {
        let t0 = Instant::now();
        let u = |cpu_s| ProcessUsage { cpu_s, rss_bytes: 8 << 20, threads: 9 };
        let first = process(7, None, (t0, u(1.0)));
        assert_eq!(first.cpu_percent, None);
        let p = process(7, Some((t0, u(1.0))), (t0 + Duration::from_secs(2), u(1.5)));
        assert!(p.cpu_percent.is_some_and(|c| (c - 25.0).abs() < 1e-9), "{p:?}");
        assert_eq!((p.rss_bytes, p.threads), (8 << 20, 9));
    }
}
