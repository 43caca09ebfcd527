//! The ledger (`lifecycle.jsonl`, docs/protocol.md §2.4) reduced to incarnations: when each
//! run of the gateway started, became ready and ended, how it ended (its exit code through the
//! one table in crates/lifecycle/src/exit.rs), and who asked for each stop, restart or update.
//!
//! [`incarnations`] is pure: the lines in file order, plus which incarnation (if any) holds the
//! home right now. Lines are not strictly ordered by `ts` (two processes append), so grouping
//! is by the `incarnation` field, never by time.

use std::collections::HashMap;

use gatewarden_lifecycle::ledger::Line;
use gatewarden_lifecycle::timefmt;
use serde_json::{Map, Value};

/// How an incarnation ended, as the timeline colours it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// The incarnation that holds the home now.
    Running,
    /// Recorded its own `exited` (or `start_refused`) line: the exit code and why.
    Exited { code: i32, intent: Option<String>, reason: Option<String> },
    /// No exit line of its own: why it ended is not known. `superseded` when a later
    /// incarnation started, which bounds when it ended.
    NoExitRecorded { superseded: bool },
}

impl Ending {
    /// The CSS class of the bar: `end-0`, `end-75`, `end-1`, `end-78`, `end-run`, `end-lost`.
    pub fn class(&self) -> &'static str {
        match self {
            Ending::Running => "end-run",
            Ending::Exited { code: 0, .. } => "end-0",
            Ending::Exited { code: 75, .. } => "end-75",
            Ending::Exited { code: 78, .. } => "end-78",
            Ending::Exited { .. } => "end-1",
            Ending::NoExitRecorded { .. } => "end-lost",
        }
    }

    /// One short phrase: `running`, `exit 75 (planned_restart)`, `no exit recorded`.
    pub fn label(&self) -> String {
        match self {
            Ending::Running => "running".into(),
            Ending::Exited { code, intent: Some(i), .. } => format!("exit {code} ({i})"),
            Ending::Exited { code, intent: None, .. } => format!("exit {code}"),
            Ending::NoExitRecorded { .. } => "no exit recorded (why is not known)".into(),
        }
    }
}

/// Who asked an incarnation to stop, restart or update, from the ledger's `requester`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// `stop`, `restart` or `update`.
    pub verb: String,
    /// µs since the epoch, when the line has a readable `ts`.
    pub at_us: Option<i128>,
    /// `cli`, `control`, `chat`, `http`, `signal`, `dashboard`, … (docs/protocol.md §2.4).
    pub channel: String,
    pub pid: Option<u32>,
    /// Who asked, a noun phrase whatever the ledger line holds: "pid 5151 (gatewarden stop)
    /// via cli", "an unnamed sender via SIGTERM", or the chat and user of an `/update`.
    pub who: String,
}

impl Request {
    /// The request in words, as the timeline and `top` show it: "stop by pid 5151 (gatewarden
    /// stop) via cli".
    pub fn phrase(&self) -> String {
        format!("{} by {}", self.verb, self.who)
    }
}

/// One run of the gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Incarnation {
    /// The incarnation id; `pid N` for a start-up refusal that never had one.
    pub id: String,
    pub pid: Option<u32>,
    pub version: Option<String>,
    pub supervisor: Option<String>,
    pub started_us: Option<i128>,
    pub ready_us: Option<i128>,
    /// When it ended: its exit line, or for [`Ending::NoExitRecorded`] the next start (an
    /// upper bound) when there is one.
    pub ended_us: Option<i128>,
    pub ending: Ending,
    pub requests: Vec<Request>,
    /// Announced by a `started` line (a start-up refusal is not, and supersedes nothing).
    pub announced: bool,
}

/// Ledger lines (oldest first, as `ledger::read_tail` returns them) to incarnations, oldest
/// first. `live` is the incarnation that holds the home now (the status report's), so the
/// last one is `Running` only when the lock agrees, and a gateway killed without an exit line
/// is shown as such rather than as running. Garbage lines are skipped.
pub fn incarnations(lines: &[Line], live: Option<&str>) -> Vec<Incarnation> {
    let mut out: Vec<Incarnation> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    for line in lines {
        let Line::Event(m) = line else { continue };
        let event = str_of(m, "event").unwrap_or_default();
        let at = str_of(m, "ts").and_then(|t| timefmt::parse(&t)).map(timefmt::to_micros);
        let inc = str_of(m, "incarnation");
        let pid = m.get("pid").and_then(Value::as_u64).and_then(|p| u32::try_from(p).ok());
        match event.as_str() {
            "started" => {
                let Some(id) = inc else { continue };
                if index.contains_key(&id) {
                    continue;
                }
                index.insert(id.clone(), out.len());
                out.push(Incarnation {
                    id,
                    pid,
                    version: str_of(m, "version"),
                    supervisor: str_of(m, "supervisor"),
                    started_us: at,
                    ready_us: None,
                    ended_us: None,
                    ending: Ending::NoExitRecorded { superseded: false },
                    requests: Vec::new(),
                    announced: true,
                });
            }
            "ready" => {
                if let Some(i) = inc.and_then(|id| index.get(&id).copied()) {
                    out[i].ready_us = out[i].ready_us.or(at);
                }
            }
            // Added later on its behalf (crates/lifecycle/src/heal.rs): still no exit recorded.
            "exited" if m.contains_key("recorded_by") => {}
            "exited" | "start_refused" => {
                let code = m.get("code").and_then(Value::as_i64).and_then(|c| i32::try_from(c).ok()).unwrap_or(1);
                let ending = Ending::Exited { code, intent: str_of(m, "intent"), reason: str_of(m, "reason") };
                match inc.as_ref().and_then(|id| index.get(id).copied()) {
                    Some(i) => {
                        out[i].ending = ending;
                        out[i].ended_us = at;
                    }
                    // A refusal before the incarnation was announced: a bar of no length.
                    None if event == "start_refused" => out.push(Incarnation {
                        id: inc.unwrap_or_else(|| format!("pid {}", pid.unwrap_or(0))),
                        pid,
                        version: None,
                        supervisor: None,
                        started_us: at,
                        ready_us: None,
                        ended_us: at,
                        ending,
                        requests: Vec::new(),
                        announced: false,
                    }),
                    None => {}
                }
            }
            "stop_requested" | "restart_requested" | "update_requested" | "drain_cancelled" => {
                // A cancelled drain is listed with the requests: the restart it undid is there too.
                let verb = match event.as_str() {
                    "drain_cancelled" => "cancel-drain".to_owned(),
                    e => e.trim_end_matches("_requested").to_owned(),
                };
                let req = request_of(m, &verb, at);
                // The gateway's own copy names its incarnation; the CLI's copy (no
                // incarnation) goes to the newest incarnation still open.
                let target = match inc.as_ref() {
                    Some(id) => index.get(id).copied(),
                    None => out.iter().rposition(|i| i.ended_us.is_none() && i.started_us.is_some()),
                };
                if let Some(i) = target {
                    let dup = out[i].requests.iter().any(|r| r.verb == req.verb && r.pid == req.pid && r.pid.is_some());
                    if !dup {
                        out[i].requests.push(req);
                    }
                }
            }
            _ => {}
        }
    }
    // Close what never recorded an exit: superseded by the next start, running, or lost.
    let starts: Vec<Option<i128>> = out.iter().map(|i| i.started_us.filter(|_| i.announced)).collect();
    for (n, inc) in out.iter_mut().enumerate() {
        if !matches!(inc.ending, Ending::NoExitRecorded { .. }) {
            continue;
        }
        let next = starts.get(n + 1..).and_then(|s| s.iter().flatten().next().copied());
        if live == Some(inc.id.as_str()) && next.is_none() {
            inc.ending = Ending::Running;
        } else {
            inc.ending = Ending::NoExitRecorded { superseded: next.is_some() };
            inc.ended_us = next;
        }
    }
    out
}

fn request_of(m: &Map<String, Value>, verb: &str, at_us: Option<i128>) -> Request {
    match m.get("requester") {
        Some(Value::Object(r)) => {
            let pid = r.get("pid").and_then(Value::as_u64).and_then(|p| u32::try_from(p).ok());
            let channel = str_of(r, "channel").filter(|c| !c.is_empty()).unwrap_or_else(|| "unknown".into());
            let argv: Vec<&str> = r
                .get("argv")
                .and_then(Value::as_array)
                .map_or(Vec::new(), |a| a.iter().filter_map(Value::as_str).filter(|a| !a.is_empty()).collect());
            let argv = redact_argv(&argv).join(" ");
            // A signal's requester names the signal: "via SIGTERM" says more than "via signal".
            let via = match str_of(r, "signal").filter(|s| !s.is_empty() && channel == "signal") {
                Some(sig) => sig,
                None => channel.clone(),
            };
            let who = match (pid, argv.is_empty()) {
                (Some(p), false) => format!("pid {p} ({argv}) via {via}"),
                (Some(p), true) => format!("pid {p} via {via}"),
                (None, _) => format!("an unnamed sender via {via}"),
            };
            Request { verb: verb.into(), at_us, channel, pid, who }
        }
        // chat `/update`: the platform (null: HTTP) and the user.
        _ => {
            let channel =
                str_of(m, "platform").unwrap_or_else(|| if verb == "update" { "http" } else { "unknown" }.into());
            let user = str_of(m, "user_id").unwrap_or_default();
            let chat = str_of(m, "chat_id").unwrap_or_default();
            let who = match (user.is_empty(), chat.is_empty()) {
                (false, false) => format!("user {user} in chat {chat} via {channel}"),
                (false, true) => format!("user {user} via {channel}"),
                (true, false) => format!("an unnamed user in chat {chat} via {channel}"),
                (true, true) => format!("an unnamed user via {channel}"),
            };
            Request { verb: verb.into(), at_us, channel, pid: None, who }
        }
    }
}

/// A requester's argv as the page may show it: the program's file name rather than its path,
/// and the value of any option that names a secret (`--token X`, `--api-token=X`, `--password`)
/// replaced by `…`, so a page never shows a secret someone typed on a command line.
pub fn redact_argv(argv: &[&str]) -> Vec<String> {
    let secretish = |a: &str| {
        let a = a.to_ascii_lowercase();
        a.starts_with('-') && ["token", "secret", "password", "passwd", "key"].iter().any(|w| a.contains(w))
    };
    let mut out = Vec::with_capacity(argv.len());
    let mut hide_next = false;
    for (k, a) in argv.iter().enumerate() {
        if k == 0 {
            out.push(a.rsplit(['/', '\\']).next().unwrap_or(a).to_owned());
        } else if hide_next {
            out.push("…".to_owned());
            hide_next = false;
        } else if secretish(a) {
            match a.split_once('=') {
                Some((flag, _)) => out.push(format!("{flag}=…")),
                None => {
                    out.push((*a).to_owned());
                    hide_next = true;
                }
            }
        } else {
            out.push((*a).to_owned());
        }
    }
    out
}

/// Free text that may quote a command line (an exit reason names its requester's argv): the
/// values of secret-named options hidden as [`redact_argv`] does.
pub fn redact_text(s: &str) -> String {
    let words: Vec<&str> = std::iter::once("").chain(s.split(' ')).collect();
    redact_argv(&words)[1..].join(" ")
}

/// A string field; numbers are shown as text (a chat id may be either).
fn str_of(m: &Map<String, Value>, k: &str) -> Option<String> {
    match m.get(k)? {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// Since when the gateway has been in its current state, from the ledger: the last `state`,
/// `ready`, `started` or `exited` line of `incarnation` (any incarnation when `None`).
pub fn state_since(lines: &[Line], incarnation: Option<&str>) -> Option<i128> {
    lines.iter().rev().find_map(|l| {
        let Line::Event(m) = l else { return None };
        let ev = m.get("event").and_then(Value::as_str)?;
        if !matches!(ev, "state" | "ready" | "started" | "exited") {
            return None;
        }
        if incarnation.is_some_and(|want| m.get("incarnation").and_then(Value::as_str) != Some(want)) {
            return None;
        }
        m.get("ts").and_then(Value::as_str).and_then(timefmt::parse).map(timefmt::to_micros)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gatewarden_lifecycle::ledger::parse_line;
    use serde_json::json;

    fn lines(text: &str) -> Vec<Line> {
        text.lines().filter(|l| !l.trim().is_empty()).map(|l| parse_line(l.as_bytes())).collect()
    }

    /// Real ledgers written by the gateway under crates/gatewarden/tests (see tests/fixtures).
    const OVERTAKEN: &str = include_str!("../tests/fixtures/restart_overtaken_by_stop.jsonl");
    const TWICE: &str = include_str!("../tests/fixtures/start_stop_twice.jsonl");
    const RESTART75: &str = include_str!("../tests/fixtures/restart_exit_75.jsonl");

    #[test]
    fn a_restart_overtaken_by_a_stop_is_one_planned_stop_with_both_requests() {
        let incs = incarnations(&lines(OVERTAKEN), None);
        assert_eq!(incs.len(), 1, "{incs:#?}");
        let i = &incs[0];
        assert_eq!(i.id, "dda009a33868fdc5");
        assert_eq!(i.pid, Some(11246));
        assert!(matches!(&i.ending, Ending::Exited { code: 0, intent: Some(x), reason: Some(r) }
            if x == "planned_stop" && r.contains("pid 11260")));
        assert_eq!(i.ending.class(), "end-0");
        assert!(i.started_us.is_some() && i.ready_us.is_some() && i.ended_us > i.ready_us);
        // The CLI's and the gateway's copies of the same stop are one request.
        let verbs: Vec<(&str, Option<u32>, &str)> =
            i.requests.iter().map(|r| (r.verb.as_str(), r.pid, r.channel.as_str())).collect();
        assert_eq!(verbs, vec![("restart", Some(11262), "cli"), ("stop", Some(11260), "cli")]);
        assert_eq!(i.requests[1].who, "pid 11260 (gatewarden --home /tmp/sd1 stop) via cli");
    }

    #[test]
    fn two_runs_with_downtime_between_them() {
        let incs = incarnations(&lines(TWICE), Some("someone-else"));
        let ids: Vec<&str> = incs.iter().map(|i| i.id.as_str()).collect();
        assert_eq!(ids, ["bafad58e735a174b", "71de461c9da18f75"]);
        assert!(incs.iter().all(|i| i.ending.class() == "end-0"));
        // Downtime: the second started after the first ended.
        assert!(incs[1].started_us > incs[0].ended_us);
    }

    #[test]
    fn a_planned_restart_ends_with_75_and_names_the_chat_command() {
        let incs = incarnations(&lines(RESTART75), None);
        assert_eq!(incs.len(), 1);
        assert_eq!(incs[0].ending.class(), "end-75");
        assert_eq!(incs[0].ending.label(), "exit 75 (planned_restart)");
        assert_eq!(incs[0].requests.len(), 1);
        assert_eq!(incs[0].requests[0].channel, "cli-send");
    }

    #[test]
    fn no_exit_line_is_running_only_when_the_lock_holder_says_so() {
        let text = r#"{"ts":"2026-12-01T10:00:00+00:00","event":"started","pid":10,"incarnation":"a"}
{"ts":"2026-12-01T10:05:00+00:00","event":"started","pid":11,"incarnation":"b","version":"0.2.0"}
{"ts":"2026-12-01T10:05:01+00:00","event":"ready","pid":11,"incarnation":"b"}
not json at all
{"ts":"2026-12-01T10:06:00+00:00","event":"start_refused","pid":12,"code":78,"reason":"port taken"}"#;
        let l = lines(text);
        let incs = incarnations(&l, Some("b"));
        assert_eq!(incs.len(), 3);
        // `a` was killed: the next start bounds its end.
        assert_eq!(incs[0].ending, Ending::NoExitRecorded { superseded: true });
        assert_eq!(incs[0].ended_us, incs[1].started_us);
        assert_eq!(incs[0].ending.class(), "end-lost");
        // `b` holds the home, even though a refused start came after it.
        assert_eq!(incs[1].ending, Ending::Running);
        assert_eq!(incs[1].version.as_deref(), Some("0.2.0"));
        assert_eq!(incs[2].id, "pid 12");
        assert_eq!(incs[2].ending.class(), "end-78");
        // Without a live holder `b` is lost, not running.
        let incs = incarnations(&l, None);
        assert_eq!(incs[1].ending, Ending::NoExitRecorded { superseded: false });
        assert_eq!(incs[1].ended_us, None);
    }

    #[test]
    fn crash_and_update_requests() {
        let text = r#"{"ts":"2026-12-01T10:00:00+00:00","event":"started","pid":10,"incarnation":"a"}
{"ts":"2026-12-01T10:01:00+00:00","event":"update_requested","pid":10,"incarnation":"a","chat_id":42,"platform":"telegram","user_id":"7","updater_pid":99}
{"ts":"2026-12-01T10:02:00+00:00","event":"exited","pid":10,"incarnation":"a","code":1,"intent":"unexpected","reason":"SIGTERM nobody announced"}"#;
        let incs = incarnations(&lines(text), None);
        assert_eq!(incs[0].ending.class(), "end-1");
        assert_eq!(incs[0].requests[0].verb, "update");
        assert_eq!(incs[0].requests[0].who, "user 7 in chat 42 via telegram");
    }

    #[test]
    fn a_cancelled_drain_is_listed_after_the_restart_it_undid() {
        let text = r#"{"ts":"2026-12-01T10:00:00+00:00","event":"started","pid":10,"incarnation":"a"}
{"ts":"2026-12-01T10:01:00+00:00","event":"restart_requested","pid":10,"incarnation":"a","requester":{"pid":20,"argv":[],"channel":"cli-send"}}
{"ts":"2026-12-01T10:01:05+00:00","event":"drain_cancelled","pid":10,"incarnation":"a","requester":{"pid":21,"argv":["gatewarden","cancel-drain"],"channel":"dashboard"},"seq":4}"#;
        let incs = incarnations(&lines(text), Some("a"));
        assert_eq!(incs.len(), 1);
        assert_eq!(incs[0].ending, Ending::Running);
        let verbs: Vec<(&str, &str)> = incs[0].requests.iter().map(|r| (r.verb.as_str(), r.channel.as_str())).collect();
        assert_eq!(verbs, [("restart", "cli-send"), ("cancel-drain", "dashboard")]);
    }

    /// Every way the ledger names who asked (docs/protocol.md §2.4: a control client, a signal
    /// with and without a sender the OS named, a chat's `/update`, missing or empty fields)
    /// reads as a sentence in the timeline and in `top`: no "stop by via signal".
    #[test]
    fn every_request_reads_as_a_sentence() {
        let requesters = [
            json!({"pid": 5151, "argv": ["gatewarden", "stop"], "channel": "cli"}),
            json!({"pid": 5151, "argv": [], "channel": "control"}),
            json!({"pid": null, "uid": null, "argv": [], "channel": "signal", "signal": "SIGTERM"}),
            json!({"pid": 77, "uid": 1000, "argv": ["kill", "-TERM", "10"], "channel": "signal", "signal": "SIGINT"}),
            json!({"pid": null, "argv": null, "channel": ""}),
            json!({"argv": [""], "channel": "dashboard"}),
            json!({}),
        ];
        let mut lines =
            vec![r#"{"ts":"2026-12-01T10:00:00+00:00","event":"started","pid":10,"incarnation":"a"}"#.to_owned()];
        for (n, r) in requesters.iter().enumerate() {
            for event in ["stop_requested", "restart_requested", "drain_cancelled"] {
                let line = json!({"ts": format!("2026-12-01T10:00:{:02}+00:00", n + 1), "event": event, "pid": 10,
                                  "incarnation": "a", "requester": r});
                lines.push(line.to_string());
            }
        }
        for chat in [
            json!({"chat_id": 42, "platform": "telegram", "user_id": "7"}),
            json!({"chat_id": null}),
            json!({"user_id": ""}),
        ] {
            let mut line =
                json!({"ts": "2026-12-01T10:01:00+00:00", "event": "update_requested", "pid": 10, "incarnation": "a"});
            line.as_object_mut().unwrap().extend(chat.as_object().unwrap().clone());
            lines.push(line.to_string());
        }
        lines.push(r#"{"ts":"2026-12-01T10:02:00+00:00","event":"exited","pid":10,"incarnation":"a","code":0,"intent":"planned_stop","reason":"planned stop"}"#.into());
        let incs = incarnations(&self::lines(&lines.join("\n")), None);
        let phrases: Vec<String> = incs[0].requests.iter().map(Request::phrase).collect();
        assert!(phrases.len() >= 3 * 2 + 3, "{phrases:#?}");
        let reads_well = |p: &str| {
            let words: Vec<&str> = p.split(' ').collect();
            !p.contains("by via")
                && !p.contains("  ")
                && !p.contains("()")
                && !p.contains("null")
                && !p.ends_with(" via")
                && !p.ends_with(' ')
                && words.windows(2).all(|w| !(w[0] == "by" && w[1] == "via"))
                && words.iter().all(|w| !w.is_empty())
        };
        for p in &phrases {
            assert!(reads_well(p), "{p:?} does not read as a sentence");
        }
        assert!(phrases.contains(&"stop by an unnamed sender via SIGTERM".to_owned()), "{phrases:#?}");
        assert!(phrases.contains(&"stop by pid 77 (kill -TERM 10) via SIGINT".to_owned()), "{phrases:#?}");
        assert!(phrases.contains(&"update by user 7 in chat 42 via telegram".to_owned()), "{phrases:#?}");
        // The text view's last line about an ending uses the same words.
        let mut snap = crate::snapshot::Snapshot { ledger: self::lines(&lines.join("\n")), ..Default::default() };
        snap.status.home = "/h".into();
        let text = crate::text::text(&snap, 0);
        let last = text.lines().find(|l| l.starts_with("last end:")).unwrap();
        assert!(reads_well(last.trim_start_matches("last end: ")), "{last}");
        for code in [0, 1, 75, 78, 3] {
            for intent in [None, Some("planned_stop".to_owned())] {
                assert!(reads_well(&Ending::Exited { code, intent: intent.clone(), reason: None }.label()));
            }
        }
    }

    #[test]
    fn secrets_on_a_command_line_are_not_shown() {
        let argv = ["/usr/bin/gatewarden", "send", "--api-token", "T0P", "--password=pw", "/restart"];
        assert_eq!(redact_argv(&argv), ["gatewarden", "send", "--api-token", "…", "--password=…", "/restart"]);
        assert_eq!(
            redact_text("planned stop requested by pid 5 (/bin/gw --token abc stop) via cli"),
            "planned stop requested by pid 5 (/bin/gw --token … stop) via cli"
        );
    }

    #[test]
    fn state_since_is_the_last_phase_change() {
        let l = lines(OVERTAKEN);
        let since = state_since(&l, Some("dda009a33868fdc5")).unwrap();
        assert_eq!(timefmt::format(timefmt::from_micros(since)), "2026-12-01T14:51:34.736932+00:00");
        assert_eq!(state_since(&l, Some("nope")), None);
    }
}
