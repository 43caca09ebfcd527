//! The same snapshot as plain text, for a terminal (`gatewarden top`-style, not wired yet):
//! the truth header, the last incarnations as one character each, runs, queue, and the log's
//! last lines. Pure; the caller redraws it.

use std::fmt::Write;

use crate::render::{MAX_INCARNATIONS, fmt_secs, fmt_ts, state_badge};
use crate::snapshot::Snapshot;
use crate::timeline::{self, Ending};

/// One character per incarnation: `0` stopped, `R` restarted (75), `!` unexpected (1),
/// `F` fatal configuration (78), `?` no exit recorded, `*` running.
pub fn glyph(e: &Ending) -> char {
    match e {
        Ending::Running => '*',
        Ending::Exited { code: 0, .. } => '0',
        Ending::Exited { code: 75, .. } => 'R',
        Ending::Exited { code: 78, .. } => 'F',
        Ending::Exited { .. } => '!',
        Ending::NoExitRecorded { .. } => '?',
    }
}

/// The snapshot in at most `log_lines` + ~12 lines of text.
pub fn text(s: &Snapshot, log_lines: usize) -> String {
    let st = &s.status;
    let mut out = String::new();
    let dash = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    let _ = writeln!(out, "{}  {}", state_badge(s), st.home);
    let _ = writeln!(
        out,
        "incarnation {}  pid {}  up {}  version {}  listen {}  supervisor {}",
        dash(st.incarnation.clone()),
        dash(st.pid.map(|p| p.to_string())),
        dash(st.uptime_s.map(fmt_secs)),
        dash(st.version.clone()),
        dash(st.listen.clone()),
        dash(st.supervisor.clone()),
    );
    if let Some(c) = s.cluster() {
        let _ = writeln!(
            out,
            "cluster {} {} epoch {} active {}",
            c.name,
            c.role,
            dash(c.epoch.map(|e| e.to_string())),
            dash(c.active)
        );
    }
    if let Some((lock, file)) = s.disagreement() {
        let _ = writeln!(out, "DISAGREE  {lock}  |  {file}");
    }
    let live = st.incarnation.as_deref().filter(|_| st.running);
    let incs = timeline::incarnations(&s.ledger, live);
    let recent = &incs[incs.len().saturating_sub(MAX_INCARNATIONS)..];
    let strip: String = recent.iter().map(|i| glyph(&i.ending)).collect();
    let _ =
        writeln!(out, "last {}: [{strip}]  (0 stop, R restart, ! crash, F fatal, ? killed, * running)", recent.len());
    if let Some(i) = recent.iter().rev().find(|i| !matches!(i.ending, Ending::Running)) {
        let by = i.requests.last().map(|r| format!(", {}", r.phrase())).unwrap_or_default();
        let when = i.ended_us.map(fmt_ts).unwrap_or_else(|| "?".into());
        let _ = writeln!(out, "last end: {} {} at {when}{by}", i.id, i.ending.label());
    }
    if let Some(d) = s.drain {
        let _ = writeln!(
            out,
            "draining: {} of {} runs finished",
            d.runs_at_start.saturating_sub(d.remaining),
            d.runs_at_start
        );
    }
    let _ = writeln!(out, "runs: {}", s.runs.len());
    for r in &s.runs {
        let _ = writeln!(
            out,
            "  {} {} {} {}{}",
            r.id,
            r.chat,
            r.backend,
            fmt_secs(r.elapsed_s),
            if r.streaming { " streaming" } else { "" }
        );
    }
    if let Some(q) = s.queue {
        let _ = writeln!(
            out,
            "messages: {} queued, {} running, {} failed, {} given up",
            q.queued, q.running, q.failed, q.given_up
        );
    }
    for l in &s.log_tail[s.log_tail.len().saturating_sub(log_lines)..] {
        // One line each: a log line with a newline or a terminal escape cannot redraw the screen.
        let clean: String = l.text.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
        let _ = writeln!(out, "{clean}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::LogLine;
    use gatewarden_lifecycle::ledger::parse_line;

    #[test]
    fn a_strip_per_incarnation_and_a_safe_log() {
        let ledger = include_str!("../tests/fixtures/start_stop_twice.jsonl");
        let mut s =
            Snapshot { ledger: ledger.lines().map(|l| parse_line(l.as_bytes())).collect(), ..Snapshot::default() };
        s.status.home = "/h".into();
        s.log_tail = vec![LogLine { level: "info".into(), text: "evil\u{1b}[2J\nline".into() }];
        let t = text(&s, 5);
        assert!(t.starts_with("stopped  /h\n"), "{t}");
        assert!(t.contains("last 2: [00]"), "{t}");
        assert!(t.contains("last end: 71de461c9da18f75 exit 0 (planned_stop)"), "{t}");
        assert!(t.contains(", stop by pid 3861 (gatewarden --home /tmp/sd2 stop) via cli"), "{t}");
        assert!(t.contains("evil [2J line") && !t.contains('\u{1b}'), "{t}");
    }
}
