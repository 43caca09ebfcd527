//! The pages, rendered on the server with maud (escaping by default), and the fragments a
//! live page swaps over SSE (their ids are in crate::sse). The stylesheet and the script are
//! compiled in (assets/) and inlined: one request per page, nothing to build.

use gatewarden_lifecycle::timefmt;
use maud::{DOCTYPE, Markup, PreEscaped, html};

use crate::snapshot::{HomeSummary, MessageState, Snapshot};
use crate::sse;
use crate::timeline::{self, Ending, Incarnation};

const CSS: &str = include_str!("../assets/dash.css");
const JS: &str = include_str!("../assets/dash.js");

/// The timeline's two views: the last day on a time axis, the last incarnations side by side.
pub const WINDOW_US: i128 = 24 * 3600 * 1_000_000;
pub const MAX_INCARNATIONS: usize = 50;
/// Log lines shown at most.
pub const MAX_LOG_LINES: usize = 200;

/// The response headers every dashboard page is served with. The policy allows exactly the
/// inline script and stylesheet compiled into this crate (by hash), the page's own event
/// stream and forms, and nothing else: an injected `<script>` or `<img onerror>` would not
/// run even if escaping failed, and no other site may frame the page (clickjacking).
pub fn security_headers() -> [(&'static str, &'static str); 5] {
    static CSP: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "default-src 'none'; script-src '{}'; style-src '{}'; connect-src 'self'; form-action 'self'; \
             frame-ancestors 'none'; base-uri 'none'",
            csp_hash(JS),
            csp_hash(CSS)
        )
    });
    [
        ("content-security-policy", CSP.as_str()),
        ("x-content-type-options", "nosniff"),
        // Not `no-referrer`: under it Chromium sends `Origin: null` on the page's own form
        // POSTs, which the Origin check must refuse (found by tests/browser.rs).
        ("referrer-policy", "same-origin"),
        ("cache-control", "no-store"),
        ("content-type", "text/html; charset=utf-8"),
    ]
}

/// `sha256-<base64>` of an inline element's text, as CSP matches it.
fn csp_hash(text: &str) -> String {
    use sha2::Digest;
    let d = sha2::Sha256::digest(text.as_bytes());
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::from("sha256-");
    for chunk in d.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, &b)| n | (u32::from(b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Who is looking: what the page may offer.
#[derive(Debug, Clone, Default)]
pub struct Viewer {
    /// An `api_token` is configured: actions exist (after a login).
    pub actions_configured: bool,
    /// The viewer's session CSRF token, when logged in (the only secret a page carries, and
    /// only to its own session).
    pub csrf: Option<String>,
    /// Where the page's event stream is (`/ui/events`).
    pub events_path: String,
    /// Where the page's forms post (`<base>/login`, `<base>/action/<verb>`); empty: `/ui`.
    pub base: String,
}

impl Viewer {
    fn base(&self) -> &str {
        if self.base.is_empty() { "/ui" } else { &self.base }
    }
}

/// The main page of one home.
pub fn page(s: &Snapshot, v: &Viewer) -> String {
    let incs = incarnations(s);
    let title = format!("gatewarden · {}", state_badge(s));
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) }
                style { (PreEscaped(CSS)) }
            }
            body data-events=(v.events_path) data-fragments=(sse::FRAGMENTS.join(" ")) {
                (stamped(header(s, &incs)))
                (stamped(actions(s, v)))
                (stamped(outcome_section(s)))
                (stamped(timeline_section(s, &incs)))
                (stamped(runs(s)))
                (stamped(queue(s, v)))
                (stamped(conversations(s, v)))
                (stamped(platforms(s)))
                (stamped(access(s, v)))
                (stamped(providers(s)))
                (stamped(update(s, v)))
                (stamped(doctor(s)))
                div #logwrap data-min="debug" {
                    label { "level " select #level {
                        @for l in ["debug", "info", "warn", "error"] { option value=(l) { (l) } }
                    } }
                    (stamped(log(s)))
                }
                script { (PreEscaped(JS)) }
            }
        }
    }
    .into_string()
}

/// One fragment by id (see [`sse::FRAGMENTS`]), for an SSE update; `None` for an unknown id.
/// As a read-only viewer sees it.
pub fn fragment(id: &str, s: &Snapshot) -> Option<String> {
    fragment_for(id, s, &Viewer::default())
}

/// [`fragment`] as `v` sees it (with its session's forms).
pub fn fragment_for(id: &str, s: &Snapshot, v: &Viewer) -> Option<String> {
    let incs = || incarnations(s);
    let m = match id {
        sse::HEADER => header(s, &incs()),
        sse::ACTIONS => actions(s, v),
        sse::OUTCOME => outcome_section(s),
        sse::TIMELINE => timeline_section(s, &incs()),
        sse::RUNS => runs(s),
        sse::QUEUE => queue(s, v),
        sse::CONVERSATIONS => conversations(s, v),
        sse::PLATFORMS => platforms(s),
        sse::ACCESS => access(s, v),
        sse::PROVIDERS => providers(s),
        sse::DOCTOR => doctor(s),
        sse::UPDATE => update(s, v),
        sse::LOG => log(s),
        _ => return None,
    };
    Some(stamped(m).0)
}

/// A fragment with its version (`data-v`, a hash of its HTML) in its first tag: the page's
/// script skips an update whose version it already shows, so a new stream's first round
/// (every fragment) leaves an unchanged section, and whatever is being typed into it, alone.
fn stamped(m: Markup) -> PreEscaped<String> {
    let html = m.into_string();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in html.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    match html.find('>') {
        Some(end) if html.starts_with('<') => {
            PreEscaped(format!("{} data-v=\"{h:016x}\"{}", &html[..end], &html[end..]))
        }
        _ => PreEscaped(html),
    }
}

fn incarnations(s: &Snapshot) -> Vec<Incarnation> {
    let live = s.status.incarnation.as_deref().filter(|_| s.status.running);
    timeline::incarnations(&s.ledger, live)
}

/// `running`, `draining 2/5`, `parked: <reason>`, `stopped`.
pub fn state_badge(s: &Snapshot) -> String {
    if let Some(reason) = s.status.extra.get("parked").and_then(|p| p.get("reason")).and_then(|r| r.as_str()) {
        return format!("parked: {reason}");
    }
    let state = s.status.state.clone().unwrap_or_else(|| if s.status.running { "running" } else { "stopped" }.into());
    match (state.as_str(), s.drain) {
        ("draining", Some(d)) => {
            format!("draining {}/{}", d.runs_at_start.saturating_sub(d.remaining), d.runs_at_start)
        }
        _ => state,
    }
}

fn state_class(badge: &str) -> &'static str {
    match badge.split([' ', ':']).next().unwrap_or("") {
        "running" => "st-run",
        "draining" | "stopping" | "starting" => "st-busy",
        "stopped" => "st-stop",
        _ => "st-bad",
    }
}

fn header(s: &Snapshot, incs: &[Incarnation]) -> Markup {
    let badge = state_badge(s);
    let st = &s.status;
    let since = timeline::state_since(&s.ledger, st.incarnation.as_deref().filter(|_| st.running))
        .or_else(|| incs.last().and_then(|i| i.ended_us));
    let cluster = s.cluster();
    html! {
        header #(sse::HEADER) {
            h1 {
                span #state .badge .(state_class(&badge)) { (badge) }
                @if let Some(t) = since { " " span .since { "since " (fmt_ts(t)) " (" (fmt_ago(s.now_us, t)) ")" } }
            }
            dl .facts {
                dt { "home" } dd { code { (st.home) } }
                dt { "incarnation" } dd { (opt(st.incarnation.as_deref())) }
                dt { "pid" } dd { (opt(st.pid.map(|p| p.to_string()).as_deref())) }
                dt { "uptime" } dd { (opt(st.uptime_s.map(fmt_secs).as_deref())) }
                dt { "version" } dd { (opt(st.version.as_deref())) }
                dt { "listen" } dd { (opt(st.listen.as_deref())) }
                dt { "supervisor" } dd {
                    (opt(st.supervisor.as_deref()))
                    @if let Some(e) = s.supervisor_evidence() { " " small .ev { "(" (e) ")" } }
                }
                @if let Some(d) = &s.desired {
                    dt { "desired" } dd { (d.want.as_str()) " " small { "by " (d.describe()) } }
                }
                @if let Some(c) = &cluster {
                    dt { "cluster" } dd {
                        (c.name) " · " span #role { (c.role) }
                        " · epoch " (opt(c.epoch.map(|e| e.to_string()).as_deref()))
                        " · active " (opt(c.active.as_deref()))
                    }
                }
            }
            @let notes = s.notes();
            @if !notes.is_empty() {
                ul .notes { @for (label, text) in &notes { li { strong { (label) } ": " (text) } } }
            }
            @if let Some((lock, file)) = s.disagreement() {
                div #disagree .disagree {
                    p { strong { "The OS lock and the state file disagree:" } }
                    div .sides { div .side { (lock) } div .side { (file) } }
                }
            }
        }
    }
}

fn actions(s: &Snapshot, v: &Viewer) -> Markup {
    let runs = s.status.active_runs.unwrap_or(s.runs.len() as u64);
    let interrupt = if s.runs.is_empty() {
        format!("Restart now? {runs} active run(s) will be drained first.")
    } else {
        let list: Vec<String> = s.runs.iter().map(|r| format!("{} ({}, {})", r.id, r.chat, r.backend)).collect();
        format!("Restart now? It will drain and may interrupt: {}", list.join("; "))
    };
    html! {
        section #(sse::ACTIONS) {
            @if s.text_hidden {
                p #text-hidden .note {
                    "Message text is hidden: without an api_token every local user can read this page. "
                    "Set api_token (reading then needs it), or [http] ui_show_text = true to show the text anyway."
                }
            }
            @if !v.actions_configured {
                p .empty { "Read-only: no api_token is configured, so this page offers no actions." }
            } @else if v.csrf.is_some() {
                @for &verb in actions_for(&state_badge(s)) {
                    @let (label, confirm) = match verb {
                        "restart" => ("Restart (drain)", Some(interrupt.as_str())),
                        "stop" => ("Stop", Some("Stop the gateway? It stays down until started (`gatewarden start`, or Start on `gatewarden dashboard`).")),
                        "cancel-drain" => ("Cancel drain", Some("Cancel the restart? The gateway runs on as it is (a stop's drain cannot be cancelled).")),
                        _ => ("Start", None),
                    };
                    (post_form(v, verb, &[], label, confirm))
                }
                form method="post" action={ (v.base()) "/logout" } { (csrf_field(v)) button type="submit" .quiet { "Log out" } }
            } @else {
                form #login method="post" action={ (v.base()) "/login" } {
                    label { "api_token " input type="password" name="token" autocomplete="off"; }
                    button type="submit" { "Unlock actions" }
                }
            }
        }
    }
}

/// A POST form for one action, carrying the viewer's CSRF token; nothing without a session.
fn post_form(v: &Viewer, verb: &str, fields: &[(&str, &str)], label: &str, confirm: Option<&str>) -> Markup {
    html! {
        @if v.csrf.is_some() {
            form method="post" action={ (v.base()) "/action/" (verb) } data-confirm=[confirm] {
                (csrf_field(v))
                @for (k, val) in fields { input type="hidden" name=(k) value=(val); }
                button type="submit" { (label) }
            }
        }
    }
}

fn csrf_field(v: &Viewer) -> Markup {
    html! { @if let Some(c) = &v.csrf { input type="hidden" name="csrf" value=(c); } }
}

/// The last dashboard action and what came of it: the verdict, the incarnation it was asked
/// of next to the one running now, and the command's last lines.
fn outcome_section(s: &Snapshot) -> Markup {
    html! {
        section #(sse::OUTCOME) {
            @if let Some(o) = &s.outcome {
                div .outcome data-verdict=(o.verdict()) {
                    strong { (o.verb) ": " (o.verdict()) } " "
                    small { "asked at " (o.requested_at)
                        @if let Some(f) = &o.from_incarnation { " of incarnation " code { (f) } }
                        @if let Some(t) = &o.finished_at { " · finished " (t) }
                    }
                    @if let (Some(f), Some(now)) = (&o.from_incarnation, s.status.incarnation.as_deref()) {
                        @if f != now && s.status.running { " · now incarnation " code .new-inc { (now) } }
                    }
                    @if let Some(said) = &o.said { p { (said) } }
                    @if !o.output.is_empty() { pre .out { @for l in &o.output { (l) "\n" } } }
                }
            }
        }
    }
}

/// The actions that make sense in a state (its badge): a running gateway can be restarted or
/// stopped, a draining one's restart cancelled (the gateway refuses a stop's) or stopped, a
/// starting one stopped, a stopped or parked one started (from the fleet page: a stopped
/// gateway serves no page).
pub fn actions_for(badge: &str) -> &'static [&'static str] {
    match badge.split([' ', ':']).next().unwrap_or("") {
        "running" => &["restart", "stop"],
        "stopped" | "parked" => &["start"],
        "draining" => &["cancel-drain", "stop"],
        _ => &["stop"],
    }
}

fn timeline_section(s: &Snapshot, incs: &[Incarnation]) -> Markup {
    let recent = &incs[incs.len().saturating_sub(MAX_INCARNATIONS)..];
    html! {
        section #(sse::TIMELINE) {
            h2 { "Incarnations" }
            @if recent.is_empty() {
                p .empty { "No incarnations in the ledger yet." }
            } @else {
                h3 { "Last 24 hours" }
                (svg_day(incs, s.now_us))
                h3 { "Last " (recent.len()) " incarnations" }
                (svg_last(recent, s.now_us))
                p .legend {
                    span .key.end-run { "running" } span .key.end-0 { "exit 0 stop" } span .key.end-75 { "75 restart" }
                    span .key.end-1 { "1 unexpected" } span .key.end-78 { "78 fatal config" } span .key.end-lost { "no exit recorded" }
                }
                table .incs {
                    thead { tr { th { "incarnation" } th { "pid" } th { "started" } th { "ran" } th { "ended" } th { "reason" } th { "requested by" } } }
                    tbody {
                        @for i in recent.iter().rev() {
                            tr .(i.ending.class()) {
                                td { code { (i.id) } } td { (opt(i.pid.map(|p| p.to_string()).as_deref())) }
                                td { (opt(i.started_us.map(fmt_ts).as_deref())) }
                                td { (opt(ran(i, s.now_us).as_deref())) }
                                td { (i.ending.label()) }
                                td { (opt(reason(i).map(timeline::redact_text).as_deref())) }
                                td { @for r in &i.requests { div { (r.phrase()) } } }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn reason(i: &Incarnation) -> Option<&str> {
    match &i.ending {
        Ending::Exited { reason, .. } => reason.as_deref(),
        _ => None,
    }
}

fn ran(i: &Incarnation, now: i128) -> Option<String> {
    let end = match i.ending {
        Ending::Running => Some(now),
        _ => i.ended_us,
    };
    Some(fmt_secs((end? - i.started_us?).max(0) as f64 / 1e6))
}

/// What a bar's hover says.
fn bar_title(i: &Incarnation, now: i128) -> String {
    let mut t = format!("{} · pid {} · {}", i.id, i.pid.map_or("?".into(), |p| p.to_string()), i.ending.label());
    if let Some(s) = i.started_us {
        t.push_str(&format!(" · started {}", fmt_ts(s)));
    }
    if let Some(d) = ran(i, now) {
        t.push_str(&format!(" · ran {d}"));
    }
    // Short: the table below has the reason and the requesters' command lines.
    for r in &i.requests {
        match r.pid {
            Some(p) => t.push_str(&format!(" · {} by pid {p} via {}", r.verb, r.channel)),
            None => t.push_str(&format!(" · {} via {}", r.verb, r.channel)),
        }
    }
    t
}

const W: f64 = 1000.0;

/// The last day on a time axis: bars where the gateway ran, gaps where it was down, a tick
/// where someone asked for a stop, restart or update.
fn svg_day(incs: &[Incarnation], now: i128) -> Markup {
    let t0 = now - WINDOW_US;
    let x = |t: i128| (t.clamp(t0, now) - t0) as f64 / WINDOW_US as f64 * W;
    // The newest that overlap the window, drawn oldest first (document order is time order).
    let mut shown: Vec<&Incarnation> = incs
        .iter()
        .rev()
        .filter(|i| i.started_us.is_some_and(|s| s <= now) && i.ended_us.is_none_or(|e| e >= t0))
        .take(MAX_INCARNATIONS)
        .collect();
    shown.reverse();
    html! {
        svg #day .tl viewBox="0 0 1000 44" preserveAspectRatio="none" role="img" aria-label="incarnations in the last 24 hours" {
            line .axis x1="0" y1="38" x2="1000" y2="38" {}
            @for h in [0, 6, 12, 18, 24] {
                text x=(format!("{:.0}", f64::from(h) / 24.0 * W)) y="44" .hour { "-" (24 - h) "h" }
            }
            @for i in &shown {
                @let start = i.started_us.unwrap_or(now);
                @let end = match i.ending { Ending::Running => now, _ => i.ended_us.unwrap_or(start) };
                @let (x0, x1) = (x(start), x(end));
                rect .bar .(i.ending.class()) data-inc=(i.id) x=(format!("{x0:.1}")) y="6" width=(format!("{:.1}", (x1 - x0).max(2.0))) height="26" {
                    title { (bar_title(i, now)) }
                }
                @for r in &i.requests {
                    @if let Some(at) = r.at_us {
                        line .req x1=(format!("{:.1}", x(at))) x2=(format!("{:.1}", x(at))) y1="0" y2="6" {}
                    }
                }
            }
        }
    }
}

/// The last incarnations side by side: a bar's width grows with how long it ran, the gap
/// before it with how long the gateway was down (both on a log scale, so a 2 s crash loop and
/// a month-long run fit one strip).
fn svg_last(incs: &[Incarnation], now: i128) -> Markup {
    let secs = |a: Option<i128>, b: Option<i128>| match (a, b) {
        (Some(a), Some(b)) if b > a => (b - a) as f64 / 1e6,
        _ => 0.0,
    };
    let weight = |s: f64| 1.0 + (1.0 + s).ln();
    let mut parts: Vec<(f64, f64)> = Vec::with_capacity(incs.len()); // (gap before, bar)
    for (n, i) in incs.iter().enumerate() {
        let end = match i.ending {
            Ending::Running => Some(now),
            _ => i.ended_us,
        };
        let down = if n == 0 { 0.0 } else { secs(incs[n - 1].ended_us, i.started_us) };
        let gap = if down > 0.0 { 0.5 * weight(down) } else { 0.3 };
        parts.push((gap, weight(secs(i.started_us, end))));
    }
    let total: f64 = parts.iter().map(|(g, b)| g + b).sum::<f64>().max(1.0);
    let scale = W / total;
    let mut x = 0.0;
    let placed: Vec<(f64, f64)> = parts
        .iter()
        .map(|(gap, bar)| {
            let x0 = x + gap * scale;
            x = x0 + bar * scale;
            (x0, bar * scale)
        })
        .collect();
    html! {
        svg #last .tl viewBox="0 0 1000 36" preserveAspectRatio="none" role="img" aria-label="the last incarnations" {
            @for (i, &(x0, w)) in incs.iter().zip(&placed) {
                rect .bar .(i.ending.class()) data-inc=(i.id) x=(format!("{x0:.1}")) y="8" width=(format!("{:.1}", w.max(1.0))) height="26" {
                    title { (bar_title(i, now)) }
                }
                @if !i.requests.is_empty() {
                    circle .req cx=(format!("{:.1}", x0 + w)) cy="4" r="3" {}
                }
            }
        }
    }
}

fn runs(s: &Snapshot) -> Markup {
    html! {
        section #(sse::RUNS) {
            h2 { "Runs" }
            @if let Some(d) = s.drain {
                @let done = d.runs_at_start.saturating_sub(d.remaining);
                div .drain {
                    "Draining: " (done) " of " (d.runs_at_start) " runs finished "
                    progress max=(d.runs_at_start.max(1)) value=(done) {}
                    @if let Some(dl) = d.deadline_us { " deadline " (fmt_ts(dl)) " (" (fmt_in(s.now_us, dl)) ")" }
                }
            }
            @if s.runs.is_empty() {
                p .empty { "No active runs." }
            } @else {
                table { thead { tr { th { "run" } th { "chat" } th { "backend" } th { "elapsed" } th { "streaming" } } }
                    tbody { @for r in &s.runs { tr { td { code { (r.id) } } td { (r.chat) } td { (r.backend) } td { (fmt_secs(r.elapsed_s)) } td { @if r.streaming { "yes" } @else { "no" } } } } } }
            }
        }
    }
}

fn queue(s: &Snapshot, v: &Viewer) -> Markup {
    html! {
        section #(sse::QUEUE) {
            h2 { "Messages" }
            @match s.queue {
                None => p .empty { "No journal counts in this snapshot." },
                Some(q) => dl .counts {
                    dt { "queued" } dd { (q.queued) } dt { "running" } dd { (q.running) }
                    dt { "failed" } dd { (q.failed) } dt { "given up" } dd { (q.given_up) }
                },
            }
            @if !s.messages.is_empty() {
                table #messages {
                    thead { tr { th { "message" } th { "chat" } th { "state" } th { "text" } th { "why" } th { "updated" } th {} } }
                    tbody {
                        @for m in &s.messages {
                            tr data-state=(m.state.as_str()) {
                                td { code { (m.id) } } td { (m.chat) } td { (m.state.as_str()) }
                                td { (m.text) } td { (opt(m.reason.as_deref())) } td { (m.updated_at) }
                                td {
                                    @if matches!(m.state, MessageState::Failed | MessageState::GivenUp) {
                                        (post_form(v, "retry", &[("id", &m.id)], "Retry", None))
                                    }
                                }
                            }
                            @if !m.trace.is_empty() {
                                tr .trace { td colspan="7" { ol .trace { @for t in &m.trace {
                                    li { small { (t.at) } " " (t.step) @if let Some(d) = &t.detail { " · " (d) } }
                                } } } }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn conversations(s: &Snapshot, v: &Viewer) -> Markup {
    html! {
        section #(sse::CONVERSATIONS) {
            h2 { "Conversations" }
            @if s.conversations.is_empty() {
                p .empty { "No platform conversations in the journal." }
            } @else {
                @for c in &s.conversations {
                    div .conv {
                        h3 { (c.platform.as_deref().unwrap_or("http")) ":" (c.chat) " " small { (c.last_at) } }
                        dl .turns { @for (q, a) in &c.turns { dt { (q) } dd { (opt(a.as_deref())) } } }
                        @if let Some(p) = &c.platform {
                            (post_form(v, "new", &[("platform", p), ("chat", &c.chat)], "/new", Some("Start a new conversation in this chat?")))
                        }
                    }
                }
            }
        }
    }
}

fn providers(s: &Snapshot) -> Markup {
    html! {
        section #(sse::PROVIDERS) {
            h2 { "Providers" }
            @match &s.status.providers {
                None => p .empty { "The agent backend has no upstream providers." },
                Some(ps) => table {
                    thead { tr { th { "provider" } th { "health" } th { "reason" } th { "cool-down until" } th { "attempts" } th { "failures" } } }
                    tbody { @for p in ps { tr { td { (p.name) } td { (p.state) } td { (opt(p.reason.as_deref())) }
                        td { (opt(p.until.map(|u| fmt_ts(i128::from(u) * 1_000_000)).as_deref())) } td { (p.attempts) } td { (p.failures) } } } }
                },
            }
        }
    }
}

fn platforms(s: &Snapshot) -> Markup {
    let ps = s.platforms();
    html! {
        section #(sse::PLATFORMS) {
            h2 { "Platforms" }
            @if let Some(l) = s.credential_lease() { p { "credential lease: " (l) } }
            @if ps.is_empty() {
                p .empty { "No chat platforms configured." }
            } @else {
                table { thead { tr { th { "name" } th { "kind" } th { "state" } th { "since" } th { "lag" } th { "last error" } th { "received" } th { "sent" } th { "conflicts" } } }
                    tbody { @for p in &ps { tr { td { (p.name) } td { (p.kind) } td { (p.state) @if let Some(r) = &p.reason { " " small { "(" (r) ")" } } }
                        td { (opt(p.since.as_deref())) } td { (opt(p.lag_s.map(fmt_secs).as_deref())) } td { (opt(p.last_error.as_deref())) }
                        td { (p.received) } td { (p.sent) } td { (p.conflicts) } } } } }
            }
        }
    }
}

/// Who may reach the agent through each platform: its access, the pairing codes waiting for
/// the owner (Approve) and the approved senders (Revoke), behind the page's login and CSRF.
fn access(s: &Snapshot, v: &Viewer) -> Markup {
    html! {
        section #(sse::ACCESS) {
            h2 { "Access" }
            @if s.access.is_empty() { p .empty { "No chat platforms configured." } }
            @for a in &s.access {
                h3 { (a.platform) " (" (a.kind) "): " (a.access)
                    @if a.access == "open" { " — anyone who finds the bot reaches the agent" } }
                @if a.pending.is_empty() {
                    p .empty { "No pairing code waits." }
                } @else {
                    table .pending { thead { tr { th { "code" } th { "sender" } th { "chat" } th { "valid until" } th {} } }
                        tbody { @for (code, user, chat, until) in &a.pending { tr data-code=(code) {
                            td { code { (code) } } td { (user) } td { (chat) } td { (until) }
                            td { (post_form(v, "approve", &[("platform", &a.platform), ("code", code)], "Approve",
                                Some(&format!("Let {user} reach the agent?")))) } } } } }
                }
                @if !a.approved.is_empty() {
                    table .approved { thead { tr { th { "approved sender" } th { "since" } th { "by" } th {} } }
                        tbody { @for (user, at, by) in &a.approved { tr data-user=(user) {
                            td { (user) } td { (at) } td { (by) }
                            td { (post_form(v, "revoke", &[("platform", &a.platform), ("user", user)], "Revoke",
                                Some(&format!("Stop {user} reaching the agent?")))) } } } } }
                }
            }
        }
    }
}

fn update(s: &Snapshot, v: &Viewer) -> Markup {
    html! {
        section #(sse::UPDATE) {
            h2 { "Update" }
            @match &s.update {
                None => p .empty { "No update information in this snapshot." },
                Some(u) => p {
                    "version " (u.version)
                    @if let Some(ph) = &u.last_phase {
                        " · last transaction " (ph) " " (opt(u.last_from.as_deref())) " → " (opt(u.last_to.as_deref()))
                    }
                    @match u.blessed { Some(true) => " · blessed", Some(false) => " · not blessed yet", None => "" }
                },
            }
            @if s.status.running {
                @if let Some(src) = &s.update_source {
                    (post_form(v, "update", &[], "Update", Some(&format!("Install the release at {src}? The gateway restarts into it."))))
                }
                @if s.update.as_ref().is_some_and(|u| u.last_phase.is_some()) {
                    (post_form(v, "rollback", &[], "Roll back", Some("Go back to the last known good binary?")))
                }
            }
        }
    }
}

fn doctor(s: &Snapshot) -> Markup {
    html! {
        section #(sse::DOCTOR) {
            h2 { "Doctor" }
            @if s.doctor.is_empty() {
                p .empty { "No doctor findings in this snapshot." }
            } @else {
                ul { @for f in &s.doctor { li .(format!("sev-{}", f.severity)) { strong { (f.severity) } " " code { (f.code) } " " (f.message) } } }
            }
        }
    }
}

fn log(s: &Snapshot) -> Markup {
    let tail = &s.log_tail[s.log_tail.len().saturating_sub(MAX_LOG_LINES)..];
    html! {
        section #(sse::LOG) {
            h2 { "Log" }
            @if tail.is_empty() {
                p .empty { "No log lines in this snapshot." }
            } @else {
                pre { @for l in tail { span .(format!("l-{}", level_class(&l.level))) { (l.text) "\n" } } }
            }
        }
    }
}

fn level_class(l: &str) -> &'static str {
    match l.to_ascii_lowercase().as_str() {
        "error" | "fatal" => "error",
        "warn" | "warning" => "warn",
        "info" => "info",
        _ => "debug",
    }
}

/// A page that needs a session, to a viewer without one: the token form, posting to
/// `<base>/login`, and why it is asked for.
pub fn login(base: &str, why: &str) -> String {
    html! {
        (DOCTYPE)
        html lang="en" {
            head { meta charset="utf-8"; title { "gatewarden: log in" } style { (PreEscaped(CSS)) } }
            body {
                h1 { "gatewarden" }
                p #why { (why) }
                form #login method="post" action={ (base) "/login" } {
                    label { "token " input type="password" name="token" autocomplete="off"; }
                    button type="submit" { "Log in" }
                }
            }
        }
    }
    .into_string()
}

/// The fleet page: every registered home, running or not, each linking to its own page, and
/// the registry files that were skipped with why (`registry::Listing::skipped`), so a planted
/// or damaged entry is seen rather than silently ignored. `note`: said above the list (whose
/// homes these are, when that is not obvious).
pub fn fleet(homes: &[HomeSummary], skipped: &[(String, String)], note: Option<&str>) -> String {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                // No script on this page: it refreshes itself.
                meta http-equiv="refresh" content="5";
                title { "gatewarden fleet" } style { (PreEscaped(CSS)) }
            }
            body {
                h1 { "Gateway homes on this machine" }
                @if let Some(n) = note { p #whose .note { (n) } }
                @if homes.is_empty() {
                    p .empty { "No homes registered yet: each gateway registers its home when it starts." }
                } @else {
                    table #fleet {
                        thead { tr { th { "home" } th { "state" } th { "pid" } th { "version" } th { "last exit" } } }
                        tbody {
                            @for h in homes {
                                @let badge = h.state.clone();
                                tr data-state=(h.state) {
                                    td { @match &h.listen {
                                        Some(l) => a .own href={ "http://" (l) "/ui" } { code { (h.path) } },
                                        None => code { (h.path) },
                                    } @if h.kind != "gatewarden" { " " small { "(" (h.kind) ")" } }
                                    " " a .files href={ "/ui/home/" (home_key(&h.path)) } { small { "(from its files)" } } }
                                    td { span .badge .(state_class(&badge)) { (badge) } }
                                    td { (opt(h.pid.map(|p| p.to_string()).as_deref())) }
                                    td { (opt(h.version.as_deref())) }
                                    td .reason {
                                        @if let Some(c) = h.last_exit_code { "exit " (c) ": " }
                                        (opt(h.last_exit_reason.as_deref()))
                                    }
                                }
                            }
                        }
                    }
                }
                @if !skipped.is_empty() {
                    h2 { "Registry entries skipped" }
                    ul #skipped { @for (file, why) in skipped { li { code { (file) } ": " (why) } } }
                }
            }
        }
    }
    .into_string()
}

/// The key of a home in the fleet server's paths (`/ui/home/<key>`): its registry file name.
pub fn home_key(path: &str) -> String {
    crate::registry::file_name(path).trim_end_matches(".json").to_owned()
}

/// The answer to an action or a login: what happened, in words (the new incarnation, or what
/// was seen, or why it was refused), and the way back to the page.
pub fn outcome(what: &str, result: Result<&str, &str>) -> String {
    let (class, word, text) = match result {
        Ok(t) => ("ok", "done", t),
        Err(t) => ("refused", "refused", t),
    };
    html! {
        (DOCTYPE)
        html lang="en" {
            head { meta charset="utf-8"; title { (what) ": " (word) } style { (PreEscaped(CSS)) } }
            body {
                p #outcome .(class) { strong { (what) ": " (word) } " " (text) }
                p { a href="/ui" { "back to the dashboard" } }
            }
        }
    }
    .into_string()
}

fn opt(v: Option<&str>) -> &str {
    v.unwrap_or("—")
}

/// `2026-12-01 14:51:34Z` (UTC, to the second).
pub fn fmt_ts(us: i128) -> String {
    let s = timefmt::format(timefmt::from_micros(us));
    format!("{} {}Z", &s[..10], &s[11..19])
}

/// `450 ms`, `12.3 s`, `4m 05s`, `3h 02m`, `2d 04h`.
pub fn fmt_secs(s: f64) -> String {
    if !s.is_finite() || s < 0.0 {
        return "—".into();
    }
    let whole = s as u64;
    match whole {
        _ if s < 1.0 => format!("{:.0} ms", s * 1000.0),
        0..60 => format!("{s:.1} s"),
        60..3600 => format!("{}m {:02}s", whole / 60, whole % 60),
        3600..86_400 => format!("{}h {:02}m", whole / 3600, (whole / 60) % 60),
        _ => format!("{}d {:02}h", whole / 86_400, (whole / 3600) % 24),
    }
}

fn fmt_ago(now: i128, t: i128) -> String {
    format!("{} ago", fmt_secs((now - t).max(0) as f64 / 1e6))
}

fn fmt_in(now: i128, t: i128) -> String {
    if t >= now {
        format!("in {}", fmt_secs((t - now) as f64 / 1e6))
    } else {
        format!("{} ago", fmt_secs((now - t) as f64 / 1e6))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{
        AccessView, Conversation, DrainView, Finding, LockView, LogLine, MessageView, QueueCounts, RunView, UpdateView,
    };
    use gatewarden_control::proto::StatusReport;
    use gatewarden_lifecycle::ledger::parse_line;
    use serde_json::json;

    const HOUR: i128 = 3600 * 1_000_000;

    /// A ledger of `n` incarnations over the last day, ending in every way, each with a
    /// requester whose argv is as long as a real one; the last one running.
    fn ledger(n: usize, now: i128) -> Vec<gatewarden_lifecycle::ledger::Line> {
        let mut out = Vec::new();
        let ts = |us: i128| timefmt::format(timefmt::from_micros(us));
        let step = 23 * HOUR / n as i128;
        for k in 0..n {
            let (inc, pid) = (format!("{:016x}", 0xabc0_0000_u64 + k as u64), 1000 + k as u32);
            let t = now - 23 * HOUR + step * k as i128;
            let argv = json!([
                "/usr/local/bin/gatewarden",
                "--home",
                "/home/someone/.gatewarden",
                "run",
                "--listen",
                "127.0.0.1:8080"
            ]);
            out.push(json!({"ts": ts(t), "event": "started", "pid": pid, "start_time": 5, "incarnation": inc, "version": "0.1.0", "argv": argv, "home": "/home/someone/.gatewarden", "supervisor": "systemd"}));
            out.push(json!({"ts": ts(t + 50_000), "event": "ready", "pid": pid, "incarnation": inc, "listen": "127.0.0.1:8080", "control": "/home/someone/.gatewarden/control.sock"}));
            if k + 1 == n {
                break;
            }
            let req = json!({"pid": 77, "argv": ["/usr/local/bin/gatewarden", "--home", "/home/someone/.gatewarden", "restart", "--timeout", "20"], "channel": "cli"});
            out.push(json!({"ts": ts(t + step / 2), "event": "restart_requested", "pid": pid, "incarnation": inc, "requester": req, "reason": "restart"}));
            let (code, intent) =
                [(75, "planned_restart"), (0, "planned_stop"), (1, "unexpected"), (78, "fatal_config")][k % 4];
            out.push(json!({"ts": ts(t + step / 2 + 1000), "event": "exited", "pid": pid, "incarnation": inc, "code": code, "intent": intent, "reason": "planned restart requested by pid 77 (/usr/local/bin/gatewarden --home /home/someone/.gatewarden restart --timeout 20) via cli"}));
        }
        out.iter().map(|v| parse_line(v.to_string().as_bytes())).collect()
    }

    fn big(now: i128) -> Snapshot {
        let mut status = StatusReport {
            running: true,
            pid: Some(1049),
            incarnation: Some(format!("{:016x}", 0xabc0_0000_u64 + 49)),
            version: Some("0.1.0".into()),
            state: Some("draining".into()),
            home: "/home/someone/.gatewarden".into(),
            listen: Some("127.0.0.1:8080".into()),
            uptime_s: Some(1234.5),
            supervisor: Some("systemd".into()),
            active_runs: Some(10),
            ..StatusReport::default()
        };
        status.extra.insert("supervisor_evidence".into(), json!("INVOCATION_ID set, unit gatewarden.service"));
        status.extra.insert("cluster".into(), json!({"name": "prod", "role": "active", "epoch": 12, "active": {"host": "box1", "listen": "127.0.0.1:8080"}}));
        status.extra.insert(
            "platforms".into(),
            json!([{"name": "tg", "kind": "telegram", "state": "connected", "lag_s": 0.2, "received": 10, "sent": 9}]),
        );
        Snapshot {
            status,
            ledger: ledger(50, now),
            desired: None,
            lock: LockView::Held { pid: Some(1049) },
            state_file: None,
            now_us: now,
            runs: (0..10).map(|k| RunView { id: format!("run-abc-{k}"), chat: format!("telegram:{k}"), backend: "openai".into(), elapsed_s: 3.5, streaming: k % 2 == 0 }).collect(),
            drain: Some(DrainView { runs_at_start: 12, remaining: 10, deadline_us: Some(now + 20_000_000) }),
            queue: Some(QueueCounts { queued: 3, running: 10, failed: 1, given_up: 0 }),
            doctor: vec![Finding { severity: "warn".into(), code: "service-drift".into(), message: "the unit file differs".into() }],
            update: Some(UpdateView { version: "0.1.0".into(), last_phase: Some("committed".into()), last_from: Some("0.0.9".into()), last_to: Some("0.1.0".into()), blessed: Some(true) }),
            log_tail: (0..200).map(|k| LogLine { level: ["info", "warn", "error", "debug"][k % 4].into(), text: format!("{{\"ts\":\"2026-12-01T10:00:{:02}.123456+00:00\",\"level\":\"info\",\"msg\":\"run finished\",\"run\":\"run-abc-{k}\",\"chat\":\"telegram:12345\",\"ms\":{k}}}", k % 60) }).collect(),
            messages: (0..10).map(|k| MessageView { id: format!("m{k:015}"), chat: format!("telegram:{k}"), state: [MessageState::Queued, MessageState::Failed][k % 2], text: "what is the weather like in a city far away".into(), reason: (k % 2 == 1).then(|| "agent failed: timeout".into()), attempts: 1, updated_at: "2026-12-01T11:59:00+00:00".into(), trace: Vec::new() }).collect(),
            conversations: (0..5).map(|k| Conversation { platform: Some("tg".into()), chat: format!("{k}"), turns: vec![("hello there".into(), Some("hi! how can I help you today?".into())); 3], last_at: "2026-12-01T11:59:00+00:00".into() }).collect(),
            outcome: None,
            update_source: None,
            text_hidden: false,
            access: Vec::new(),
        }
    }

    fn now() -> i128 {
        timefmt::to_micros(timefmt::parse("2026-12-01T12:00:00+00:00").unwrap())
    }

    /// A page any local user may read shows no conversation text, no message ids and no log,
    /// and says so.
    #[test]
    fn hidden_text_is_left_out_and_said() {
        let mut s = big(now());
        s.hide_text();
        let html = page(&s, &Viewer::default());
        for secret in [
            "what is the weather",
            "hello there",
            "how can I help",
            "m000000000000001",
            "run-abc-3",
            "run finished",
            "agent failed",
        ] {
            assert!(!html.contains(secret), "{secret} shown");
        }
        assert!(html.contains("id=\"text-hidden\"") && html.contains("ui_show_text"), "the page says why");
        assert!(html.contains("telegram:3"), "chats and counts stay");
    }

    #[test]
    fn the_main_page_stays_within_its_budget() {
        let s = big(now());
        let v = Viewer {
            actions_configured: true,
            csrf: Some("c".repeat(64)),
            events_path: "/ui/events".into(),
            ..Viewer::default()
        };
        let started = std::time::Instant::now();
        let html = page(&s, &v);
        eprintln!(
            "main page: {} bytes for 50 incarnations and 200 log lines, rendered in {:?}",
            html.len(),
            started.elapsed()
        );
        assert!(html.len() <= 150 * 1024, "main page is {} bytes", html.len());
        // It did render what it was given (a budget met by dropping content is no budget).
        assert_eq!(html.matches("class=\"bar ").count(), 100, "50 bars in each view");
        assert_eq!(html.matches("<span class=\"l-").count(), 200);
        assert!(html.contains("draining 2/12"));
        assert!(
            html.contains(
                "restart by pid 77 (gatewarden --home /home/someone/.gatewarden restart --timeout 20) via cli"
            )
        );
    }

    #[test]
    fn header_timeline_and_empty_states() {
        let mut s = big(now());
        s.status.extra.insert("crash_loop".into(), json!({"sentence": "3 crashes in the last 60 s"}));
        let html = page(&s, &Viewer::default());
        for needle in [
            "id=\"truth\"",
            "systemd",
            "INVOCATION_ID set",
            "prod",
            "epoch 12",
            "box1 (127.0.0.1:8080)",
            "0.1.0",
            "<strong>crash loop</strong>: 3 crashes in the last 60 s",
        ] {
            assert!(html.contains(needle), "{needle}");
        }
        for class in ["end-75", "end-0", "end-1", "end-78", "end-run"] {
            assert!(html.contains(&format!("class=\"bar {class}\"")), "{class}");
        }
        assert!(html.contains("no api_token is configured"));
        // Nothing given: every section says so by name.
        let empty = page(&Snapshot::default(), &Viewer { actions_configured: true, ..Viewer::default() });
        for e in [
            "No incarnations in the ledger yet.",
            "No active runs.",
            "No journal counts",
            "No chat platforms",
            "No doctor findings",
            "No update information",
            "No log lines",
        ] {
            assert!(empty.contains(e), "{e}");
        }
        assert!(empty.contains("id=\"login\"") && empty.contains("type=\"password\""));
        assert!(!empty.contains("name=\"csrf\""));
    }

    #[test]
    fn disagreement_is_shown_side_by_side() {
        let mut s = big(now());
        s.lock = LockView::Free;
        s.state_file = serde_json::from_value(json!({"pid": 1049, "gateway_state": "running"})).ok();
        let html = page(&s, &Viewer::default());
        assert!(html.contains("id=\"disagree\""));
        assert!(html.contains("OS lock: free") && html.contains("state file: running (pid 1049)"));
    }

    #[test]
    fn everything_from_the_ledger_is_escaped() {
        let mut s = Snapshot { now_us: now(), ..Snapshot::default() };
        let evil = json!({"ts": "2026-12-01T11:00:00+00:00", "event": "started", "pid": 1, "incarnation": "<script>alert(1)</script>"});
        s.ledger = vec![parse_line(evil.to_string().as_bytes())];
        s.log_tail = vec![LogLine { level: "info".into(), text: "</pre><img src=x onerror=alert(1)>".into() }];
        let html = page(&s, &Viewer::default());
        assert!(!html.contains("<script>alert") && !html.contains("<img"));
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    }

    /// The pending codes and approved senders, each with its button only behind a session (its
    /// CSRF token in the form); an open platform says so plainly; a sender's id is escaped.
    #[test]
    fn access_lists_codes_and_senders_with_buttons_only_for_a_session() {
        let mut s = Snapshot { now_us: now(), ..Snapshot::default() };
        s.access = vec![
            AccessView {
                platform: "telegram".into(),
                kind: "telegram".into(),
                access: "pairing".into(),
                pending: vec![(
                    "XKGH5N7P".into(),
                    "<b>102</b>".into(),
                    "102".into(),
                    "2026-12-01T12:00:00+00:00".into(),
                )],
                approved: vec![("103".into(), "2026-12-01T11:00:00+00:00".into(), "cli (pid 7)".into())],
            },
            AccessView { platform: "irc".into(), kind: "irc".into(), access: "open".into(), ..AccessView::default() },
        ];
        let read_only = page(&s, &Viewer::default());
        assert!(read_only.contains("XKGH5N7P") && read_only.contains("&lt;b&gt;102&lt;/b&gt;"));
        assert!(!read_only.contains("/ui/action/approve") && !read_only.contains("/ui/action/revoke"));
        assert!(read_only.contains("anyone who finds the bot reaches the agent"));
        let v = Viewer { actions_configured: true, csrf: Some("c".repeat(64)), ..Viewer::default() };
        let html = page(&s, &v);
        assert!(html.contains("action=\"/ui/action/approve\"") && html.contains("value=\"XKGH5N7P\""), "{html}");
        assert!(html.contains("action=\"/ui/action/revoke\"") && html.contains("value=\"103\""));
    }

    #[test]
    fn every_fragment_renders_with_its_id() {
        let s = big(now());
        for id in sse::FRAGMENTS {
            let f = fragment(id, &s).unwrap();
            assert!(f.starts_with('<') && f.contains(&format!("id=\"{id}\"")), "{id}: {}", &f[..f.len().min(80)]);
        }
        assert!(fragment("nope", &s).is_none());
    }

    #[test]
    fn fleet_lists_homes_with_their_last_exit() {
        let homes = vec![
            HomeSummary {
                path: "/a".into(),
                state: "running".into(),
                pid: Some(5),
                version: Some("0.1.0".into()),
                listen: Some("127.0.0.1:1".into()),
                last_exit_code: None,
                last_exit_reason: None,
                kind: "gatewarden".into(),
            },
            HomeSummary {
                path: "/b".into(),
                state: "stopped".into(),
                pid: None,
                version: None,
                listen: None,
                last_exit_code: Some(78),
                last_exit_reason: Some("port 8080 taken".into()),
                kind: "gatewarden".into(),
            },
        ];
        let html = fleet(&homes, &[("0000000000000000.json".into(), "its file name is not its home's".into())], None);
        assert!(html.contains("<code>0000000000000000.json</code>: its file name"));
        assert!(html.contains("href=\"http://127.0.0.1:1/ui\""));
        assert!(html.contains("exit 78: port 8080 taken"));
        assert_eq!(html.matches("<tr data-state=").count(), 2);
        let empty = fleet(&[], &[], Some("served as root"));
        assert!(empty.contains("No homes registered yet") && !empty.contains("skipped"));
    }

    /// Any ledger (events in any order, missing or bad fields, skewed clocks) renders, with
    /// one bar per incarnation (up to 50) in the side-by-side view, inside the SVG's width.
    fn arb_line() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let event = prop::sample::select(vec![
            "started",
            "ready",
            "exited",
            "start_refused",
            "stop_requested",
            "restart_requested",
            "update_requested",
            "state",
            "x",
        ]);
        let inc = prop::option::of(prop::sample::select(vec!["a", "b", "c", "d", "<e>"]));
        let ts = prop::option::of(prop_oneof![
            (0i64..200_000)
                .prop_map(|s| timefmt::format(timefmt::from_micros(i128::from(s) * 1_000_000 + 1_796_000_000_000_000))),
            Just("not a time".to_owned()),
        ]);
        let code = prop::option::of(prop_oneof![Just(0i64), Just(1), Just(75), Just(78), any::<i64>()]);
        let requester = prop::option::of(prop_oneof![
            Just(json!({"pid": 5, "argv": ["/bin/gw", "--token", "s3cret", "stop"], "channel": "cli"})),
            Just(json!("a string")),
            Just(json!({"pid": -1})),
        ]);
        (event, inc, ts, code, requester, any::<bool>()).prop_map(|(event, inc, ts, code, requester, garbage)| {
            if garbage {
                return "\u{0}garbage{".to_owned();
            }
            let mut m = serde_json::Map::new();
            m.insert("event".into(), json!(event));
            m.insert("pid".into(), json!(7));
            if let Some(i) = inc {
                m.insert("incarnation".into(), json!(i));
            }
            if let Some(t) = ts {
                m.insert("ts".into(), json!(t));
            }
            if let Some(c) = code {
                m.insert("code".into(), json!(c));
            }
            if let Some(r) = requester {
                m.insert("requester".into(), r);
            }
            serde_json::Value::Object(m).to_string()
        })
    }

    proptest::proptest! {
        #[test]
        fn any_ledger_renders(lines in proptest::collection::vec(arb_line(), 0..120), live in proptest::option::of("[a-e]")) {
            let s = Snapshot {
                ledger: lines.iter().map(|l| parse_line(l.as_bytes())).collect(),
                status: StatusReport { running: live.is_some(), incarnation: live, ..StatusReport::default() },
                now_us: 1_796_100_000_000_000,
                ..Snapshot::default()
            };
            let incs = incarnations(&s);
            let html = page(&s, &Viewer::default());
            let last = svg_last(&incs[incs.len().saturating_sub(MAX_INCARNATIONS)..], s.now_us).into_string();
            proptest::prop_assert_eq!(last.matches("<rect").count(), incs.len().min(MAX_INCARNATIONS));
            for x in last.split(" x=\"").skip(1).filter_map(|r| r.split('"').next()?.parse::<f64>().ok()) {
                proptest::prop_assert!((0.0..=W).contains(&x), "bar at x={}", x);
            }
            proptest::prop_assert!(!html.contains("s3cret"), "a secret reached the page");
            proptest::prop_assert!(!html.contains("<e>"), "unescaped ledger text");
        }
    }

    #[test]
    fn csp_hashes_are_base64_sha256() {
        // echo -n abc | openssl dgst -sha256 -binary | base64
        assert_eq!(csp_hash("abc"), "sha256-ungWv48Bz+pBQUDeXa4iI7ADYaOWF3qctBD/YfIAFa0=");
        let csp = security_headers()[0].1;
        assert!(
            csp.contains(&csp_hash(JS)) && csp.contains(&csp_hash(CSS)) && csp.contains("default-src 'none'"),
            "{csp}"
        );
    }

    #[test]
    fn actions_follow_the_state() {
        assert_eq!(actions_for("running"), ["restart", "stop"]);
        assert_eq!(actions_for("draining 1/2"), ["cancel-drain", "stop"]);
        assert_eq!(actions_for("parked: crash loop"), ["start"]);
        assert_eq!(actions_for("stopped"), ["start"]);
        assert_eq!(actions_for("starting"), ["stop"]);
    }

    #[test]
    fn durations() {
        assert_eq!(fmt_secs(0.45), "450 ms");
        assert_eq!(fmt_secs(12.34), "12.3 s");
        assert_eq!(fmt_secs(245.0), "4m 05s");
        assert_eq!(fmt_secs(3.0 * 3600.0 + 120.0), "3h 02m");
        assert_eq!(fmt_secs(2.0 * 86_400.0 + 4.0 * 3600.0), "2d 04h");
        assert_eq!(fmt_secs(f64::NAN), "—");
        assert_eq!(fmt_ts(0), "1970-01-01 00:00:00Z");
    }
}
