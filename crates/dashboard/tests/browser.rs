//! The rendered pages in a real headless Chromium (testkit::browser): the header's state, the
//! timeline's SVG bars, live fragments swapped in over SSE by the page's own script (a drain,
//! then, after the stream ends and the page reconnects, a restart's new incarnation), the
//! fleet page, and the auth rules behind the actions. A tiny loopback HTTP server inside the test serves what this crate renders; the
//! runtime's `/ui` routes do not exist yet (crates/dashboard/README.md).
//!
//!   cargo nextest run -p gatewarden-dashboard --test browser
//!
//! Screenshots go to `target/screenshots/` (the paths are printed).

#![cfg(unix)]

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use gatewarden_control::proto::StatusReport;
use gatewarden_dashboard::auth::{CSRF_FIELD, Policy, Post, Sessions, form_value, host_allowed, set_cookie};
use gatewarden_dashboard::render::{outcome, security_headers};
use gatewarden_dashboard::snapshot::{DrainView, LockView, LogLine};
use gatewarden_dashboard::{HomeSummary, Snapshot, Viewer, fleet, live, page, sse};
use gatewarden_lifecycle::ledger::parse_line;
use gatewarden_lifecycle::timefmt;
use gatewarden_testkit::browser::Browser;

/// Two runs a real gateway recorded (start, stop, start, stop), then a third that is running.
fn snapshot() -> Snapshot {
    let mut text = include_str!("fixtures/start_stop_twice.jsonl").to_owned();
    text.push_str(r#"{"ts":"2026-12-01T15:57:00.000000+00:00","event":"started","pid":4001,"start_time":9,"incarnation":"c0ffee0000000003","version":"0.1.0","supervisor":"none"}"#);
    text.push('\n');
    text.push_str(r#"{"ts":"2026-12-01T15:57:00.100000+00:00","event":"ready","pid":4001,"start_time":9,"incarnation":"c0ffee0000000003","listen":"127.0.0.1:8080"}"#);
    let ledger = text.lines().map(|l| parse_line(l.as_bytes())).collect();
    let status = StatusReport {
        running: true,
        pid: Some(4001),
        incarnation: Some("c0ffee0000000003".into()),
        version: Some("0.1.0".into()),
        state: Some("running".into()),
        home: "/srv/gw-browser-test".into(),
        listen: Some("127.0.0.1:8080".into()),
        uptime_s: Some(3600.0),
        supervisor: Some("none".into()),
        active_runs: Some(0),
        ..StatusReport::default()
    };
    Snapshot {
        status,
        ledger,
        lock: LockView::Held { pid: Some(4001) },
        state_file: serde_json::from_str(r#"{"pid":4001,"incarnation":"c0ffee0000000003","gateway_state":"running"}"#)
            .ok(),
        now_us: timefmt::to_micros(timefmt::parse("2026-12-01T16:57:00+00:00").expect("ts")),
        log_tail: vec![LogLine { level: "info".into(), text: "gateway ready".into() }],
        ..Snapshot::default()
    }
}

fn homes() -> Vec<HomeSummary> {
    let home = |path: &str, state: &str, code: Option<i32>, reason: Option<&str>| HomeSummary {
        path: path.into(),
        state: state.into(),
        pid: (state == "running").then_some(4001),
        version: Some("0.1.0".into()),
        listen: (state == "running").then(|| "127.0.0.1:8080".into()),
        last_exit_code: code,
        last_exit_reason: reason.map(str::to_owned),
        kind: "gatewarden".into(),
    };
    vec![
        home("/srv/a", "running", None, None),
        home("/srv/b", "running", None, None),
        home("/srv/c", "stopped", Some(78), Some("listen address 127.0.0.1:8080 is taken by pid 99")),
    ]
}

/// One request as the test servers see it.
struct Req {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: String,
}

impl Req {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

enum Reply {
    /// A whole response (status line, headers and body are added).
    Page { status: &'static str, extra_headers: String, html: String },
    /// Another site's page: 200, no security headers.
    Foreign(String),
    /// `text/event-stream`: these events, then keepalives until the flag is set (the stream
    /// then ends, as a restarting gateway's does) or the test ends.
    Stream(String, Option<Arc<AtomicBool>>),
}

fn page_reply(status: &'static str, html: String) -> Reply {
    Reply::Page { status, extra_headers: String::new(), html }
}

type Handler = dyn Fn(&Req) -> Reply + Send + Sync;

/// A loopback HTTP/1.1 server (one request per connection) answering with `handler`. Its
/// threads end with the test process.
fn serve(handler: Arc<Handler>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    std::thread::spawn(move || {
        for conn in l.incoming().flatten() {
            let handler = Arc::clone(&handler);
            std::thread::spawn(move || {
                let _ = answer(conn, &*handler);
            });
        }
    });
    addr
}

fn answer(mut conn: TcpStream, handler: &Handler) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut first = String::new();
    reader.read_line(&mut first)?;
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h == "\r\n" {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_owned(), v.trim().to_owned()));
        }
    }
    let mut parts = first.split_whitespace();
    let (method, path) = (parts.next().unwrap_or("").to_owned(), parts.next().unwrap_or("/").to_owned());
    let len = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse::<usize>().ok())
        .unwrap_or(0)
        .min(1 << 20);
    let mut body = vec![0u8; len];
    std::io::Read::read_exact(&mut reader, &mut body)?;
    let req = Req { method, path, headers, body: String::from_utf8_lossy(&body).into_owned() };
    match handler(&req) {
        Reply::Page { status, extra_headers, html } => {
            // The headers the gateway will send with every page (its CSP allows only the
            // compiled-in script and stylesheet: the live updates below prove their hashes).
            let security: String = security_headers().iter().map(|(k, v)| format!("{k}: {v}\r\n")).collect();
            conn.write_all(
                format!(
                    "HTTP/1.1 {status}\r\n{security}Content-Length: {}\r\nConnection: close\r\n{extra_headers}\r\n{html}",
                    html.len()
                )
                .as_bytes(),
            )
        }
        Reply::Foreign(html) => conn.write_all(
            format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{html}",
                html.len()
            )
            .as_bytes(),
        ),
        Reply::Stream(events, close_when) => {
            conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-store\r\n\r\n")?;
            conn.write_all(events.as_bytes())?;
            for _ in 0..600 {
                if close_when.as_ref().is_some_and(|f| f.load(Ordering::SeqCst)) {
                    return Ok(());
                }
                std::thread::sleep(Duration::from_millis(50));
                conn.write_all(sse::keepalive().as_bytes())?;
            }
            Ok(())
        }
    }
}

/// Serves `/ui`, `/ui/fleet` and `/ui/events`. The first event stream sends `first` and ends
/// when `go` is set (the gateway restarting); every later one (the browser reconnecting) sends
/// `after`.
fn serve_pages(main: String, fleet: String, first: String, after: String, go: Arc<AtomicBool>) -> SocketAddr {
    let streams = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    serve(Arc::new(move |req: &Req| match req.path.as_str() {
        "/ui" => page_reply("200 OK", main.clone()),
        "/ui/fleet" => page_reply("200 OK", fleet.clone()),
        "/ui/events" if streams.fetch_add(1, Ordering::SeqCst) == 0 => {
            Reply::Stream(first.clone(), Some(Arc::clone(&go)))
        }
        "/ui/events" => Reply::Stream(after.clone(), None),
        _ => page_reply("404 Not Found", String::new()),
    }))
}

/// `s` after a restart from the dashboard: the running incarnation ended 75, a new one runs.
fn restarted(s: &Snapshot) -> Snapshot {
    let mut r = s.clone();
    for line in [
        r#"{"ts":"2026-12-01T16:56:00.000000+00:00","event":"restart_requested","pid":4001,"incarnation":"c0ffee0000000003","reason":"restart","requester":{"pid":4001,"argv":[],"channel":"dashboard"}}"#,
        r#"{"ts":"2026-12-01T16:56:01.000000+00:00","event":"exited","pid":4001,"incarnation":"c0ffee0000000003","code":75,"intent":"planned_restart","reason":"planned restart requested via dashboard"}"#,
        r#"{"ts":"2026-12-01T16:56:02.000000+00:00","event":"started","pid":4002,"incarnation":"c0ffee0000000004","version":"0.1.0"}"#,
        r#"{"ts":"2026-12-01T16:56:02.100000+00:00","event":"ready","pid":4002,"incarnation":"c0ffee0000000004"}"#,
    ] {
        r.ledger.push(parse_line(line.as_bytes()));
    }
    r.status.pid = Some(4002);
    r.status.incarnation = Some("c0ffee0000000004".into());
    r.status.state = Some("running".into());
    r.drain = None;
    r.lock = LockView::Held { pid: Some(4002) };
    r.state_file =
        serde_json::from_str(r#"{"pid":4002,"incarnation":"c0ffee0000000004","gateway_state":"running"}"#).ok();
    r
}

#[test]
fn pages_render_in_headless_chromium_and_take_live_updates() {
    let Some(b) = Browser::start(Duration::from_secs(30)) else { return };
    let s = snapshot();
    let viewer =
        Viewer { actions_configured: false, csrf: None, events_path: "/ui/events".into(), ..Viewer::default() };
    let main = page(&s, &viewer);
    // What the stream pushes, as the runtime will (live::Live: only changed fragments): the
    // same home draining one of two runs, then restarted into a new incarnation.
    let mut live = live::Live::default();
    live.update(&s);
    let mut draining = s.clone();
    draining.status.state = Some("draining".into());
    draining.drain =
        Some(DrainView { runs_at_start: 2, remaining: 1, deadline_us: Some(draining.now_us + 30_000_000) });
    let first = live.update(&draining);
    assert!(!first.contains("event: timeline"), "only what changed is sent: {first}");
    // Reconnect quickly once the stream ends; a new connection gets every fragment.
    let first = format!("{}{first}", sse::retry(200));
    let after = live::Live::default().update(&restarted(&draining));
    let go = Arc::new(AtomicBool::new(false));
    let addr = serve_pages(main, fleet(&homes(), &[], None), first, after, Arc::clone(&go));

    b.navigate(&format!("http://{addr}/ui")).expect("navigate");
    // The header's state, then the SSE update swapped in by the page's script.
    let timing = b
        .execute("const n = performance.getEntriesByType('navigation')[0]; return [n.responseEnd - n.startTime, n.domContentLoadedEventEnd - n.startTime, n.transferSize];")
        .expect("navigation timing");
    eprintln!(
        "main page: response {} ms, DOMContentLoaded {} ms, {} bytes transferred",
        timing[0], timing[1], timing[2]
    );
    // The lock and the state file agree here: no disagreement box.
    assert!(b.find_all("#disagree").expect("find").is_empty());
    let first = b.find("#state").and_then(|e| b.text(&e)).expect("state");
    assert!(first == "running" || first == "draining 1/2", "{first:?}");
    let swapped = b.wait_text("#state", "draining 1/2", Duration::from_secs(10)).expect("SSE fragment swap");
    assert_eq!(swapped, "draining 1/2");
    assert!(b.find("#runs").and_then(|e| b.text(&e)).expect("runs").contains("1 of 2 runs finished"));

    // The timeline: one bar per incarnation in each view, coloured by how it ended.
    for view in ["svg#last", "svg#day"] {
        let bars = b.find_all(&format!("{view} rect.bar")).expect("bars");
        let classes: Vec<String> =
            bars.iter().map(|e| b.attribute(e, "class").expect("class").unwrap_or_default()).collect();
        assert_eq!(classes, ["bar end-0", "bar end-0", "bar end-run"], "{view}");
    }
    let width = b.execute("return document.querySelector('svg#last rect.bar.end-run').getBBox().width").expect("bbox");
    assert!(width.as_f64().is_some_and(|w| w > 0.0), "the running bar is drawn: {width}");
    let table = b.find("table.incs").and_then(|e| b.text(&e)).expect("table");
    assert!(table.contains("stop by pid 3845 (gatewarden --home /tmp/sd2 stop) via cli"), "{table}");
    assert!(table.contains("exit 0 (planned_stop)"), "{table}");

    let dir = gatewarden_testkit::browser::screenshot_dir(env!("CARGO_TARGET_TMPDIR"));
    let main_png = dir.join("dashboard-main.png");
    b.screenshot(&main_png).expect("screenshot");
    assert!(std::fs::metadata(&main_png).is_ok_and(|m| m.len() > 1000));
    eprintln!("screenshot: {}", main_png.display());

    // The gateway restarts: its stream ends, the page's EventSource reconnects, and the new
    // stream brings the restart: a fourth bar, the third ended 75 at the dashboard's request,
    // the header on the new incarnation.
    go.store(true, Ordering::SeqCst);
    let table = b.wait_text("table.incs", "c0ffee0000000004", Duration::from_secs(10)).expect("the new incarnation");
    assert!(
        table.contains("exit 75 (planned_restart)") && table.contains("restart by pid 4001 via dashboard"),
        "{table}"
    );
    let classes: Vec<String> = b
        .find_all("svg#last rect.bar")
        .expect("bars")
        .iter()
        .map(|e| b.attribute(e, "class").expect("class").unwrap_or_default())
        .collect();
    assert_eq!(classes, ["bar end-0", "bar end-0", "bar end-75", "bar end-run"]);
    assert_eq!(b.find("#state").and_then(|e| b.text(&e)).expect("state"), "running");
    assert!(b.find("#truth").and_then(|e| b.text(&e)).expect("header").contains("4002"));

    // The fleet: three homes, the stopped one with its reason.
    b.navigate(&format!("http://{addr}/ui/fleet")).expect("navigate fleet");
    assert_eq!(b.find_all("#fleet tbody tr").expect("rows").len(), 3);
    let stopped = b.find("#fleet tr[data-state=stopped]").and_then(|e| b.text(&e)).expect("stopped row");
    assert!(
        stopped.contains("/srv/c") && stopped.contains("exit 78: listen address 127.0.0.1:8080 is taken"),
        "{stopped}"
    );
    let fleet_png = dir.join("dashboard-fleet.png");
    b.screenshot(&fleet_png).expect("screenshot");
    eprintln!("screenshot: {}", fleet_png.display());
    b.quit();
}

/// The auth rules (crates/dashboard/src/auth.rs) behind a real browser: a test server that
/// answers the way the gateway's `/ui` routes are meant to. Checks that Chromium's own
/// requests pass them (its form POSTs carry the `Origin`, its cookie jar keeps the
/// `HttpOnly; SameSite=Strict` session) and that a forged POST, another origin's form and a
/// foreign `Host` (DNS rebinding, via Chromium's resolver rules) are refused.
#[test]
fn actions_need_the_token_and_come_from_the_page_itself() {
    let Some(b) = Browser::start_with(Duration::from_secs(30), &["--host-resolver-rules=MAP evil.test 127.0.0.1"])
    else {
        return;
    };
    const TOKEN: &str = "browser-test-token-0123456789";
    let sessions = Arc::new(Mutex::new(Sessions::new(Some(TOKEN))));
    let bound: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
    let snap = snapshot();
    let (sessions2, bound2) = (Arc::clone(&sessions), Arc::clone(&bound));
    let handler = move |req: &Req| -> Reply {
        let policy =
            Policy { api_token: Some(TOKEN.into()), bound: bound2.lock().unwrap().clone(), allowed_hosts: vec![] };
        let host = req.header("host").unwrap_or("");
        if !host_allowed(host, policy.bound.as_deref(), &policy.allowed_hosts) {
            let why = format!("this gateway does not answer to Host {host:?}");
            return page_reply("421 Misdirected Request", outcome("request", Err(&why)));
        }
        let now = timefmt::to_micros(SystemTime::now());
        let mut sessions = sessions2.lock().unwrap();
        let post =
            Post { host: req.header("host"), origin: req.header("origin"), cookie: req.header("cookie"), csrf: None };
        match (req.method.as_str(), req.path.as_str()) {
            ("GET", "/ui") => {
                let csrf = sessions.find(req.header("cookie"), now).map(|s| s.csrf.clone());
                let v = Viewer { actions_configured: true, csrf, events_path: String::new(), ..Viewer::default() };
                page_reply("200 OK", page(&snap, &v))
            }
            ("POST", "/ui/login") => {
                let given = form_value(&req.body, "token").unwrap_or_default();
                match policy.check_origin(&post).and_then(|()| sessions.login(&policy, &given, now)) {
                    Ok(s) => Reply::Page {
                        status: "303 See Other",
                        extra_headers: format!("Location: /ui\r\nSet-Cookie: {}\r\n", set_cookie(&s)),
                        html: String::new(),
                    },
                    Err(e) => page_reply("403 Forbidden", outcome("login", Err(&e.to_string()))),
                }
            }
            ("POST", path) if path.starts_with("/ui/action/") => {
                let verb = path.trim_start_matches("/ui/action/");
                let csrf = form_value(&req.body, CSRF_FIELD);
                let post = Post { csrf: csrf.as_deref(), ..post };
                match sessions.check_action(&policy, &post, now) {
                    Ok(_) => page_reply("200 OK", outcome(verb, Ok("accepted (the test server restarts nothing)"))),
                    Err(e) => page_reply("403 Forbidden", outcome(verb, Err(&e.to_string()))),
                }
            }
            _ => page_reply("404 Not Found", String::new()),
        }
    };
    let addr = serve(Arc::new(handler));
    *bound.lock().unwrap() = Some(addr.to_string());
    // Another origin (same machine, another port) whose page posts to the dashboard at once.
    let target = format!("http://{addr}/ui/action/stop");
    let attacker = serve(Arc::new(move |_req: &Req| {
        Reply::Foreign(format!(
            "<!DOCTYPE html><form id=f method=post action=\"{target}\"><input name=csrf value=guess></form><script>document.getElementById('f').submit()</script>"
        ))
    }));

    // Without a session: a login form, no action buttons, and a forged POST is refused.
    b.navigate(&format!("http://{addr}/ui")).expect("navigate");
    b.assert_read_only_page();

    // A wrong token is refused; the right one unlocks the actions.
    let login = |token: &str| {
        b.navigate(&format!("http://{addr}/ui")).expect("navigate");
        let input = b.find("form#login input[name=token]").expect("token input");
        b.send_keys(&input, token).expect("type");
        b.click(&b.find("form#login button").expect("button")).expect("click");
    };
    login("not-the-token");
    b.wait_text("#outcome", "wrong token", Duration::from_secs(10)).expect("a wrong token is refused");
    login(TOKEN);
    let restart = b.wait_find("form[action='/ui/action/restart'] button", Duration::from_secs(10));
    // The session cookie is out of the page's scripts' reach.
    assert_eq!(b.execute("return document.cookie").expect("cookie"), serde_json::json!(""));
    let png = gatewarden_testkit::browser::screenshot_dir(env!("CARGO_TARGET_TMPDIR")).join("dashboard-actions.png");
    b.screenshot(&png).expect("screenshot");
    eprintln!("screenshot: {}", png.display());

    // Restart asks first, then goes through with the session and its CSRF token.
    b.click(&restart).expect("click restart");
    let confirm = gatewarden_testkit::wait_until(Duration::from_secs(5), || b.alert_text().is_some());
    assert!(confirm, "the restart asks for confirmation");
    assert!(b.alert_text().unwrap_or_default().starts_with("Restart now?"));
    b.accept_alert().expect("accept");
    b.wait_text("#outcome", "restart: done", Duration::from_secs(10)).expect("the action is accepted");

    // Another origin's form, even with the session cookie sent along, is refused.
    b.navigate(&format!("http://{attacker}/")).expect("navigate attacker");
    let refused = b.wait_text("#outcome", "stop: refused", Duration::from_secs(10)).expect("cross-origin POST");
    assert!(refused.contains("another origin"), "{refused}");

    // The page under a foreign name (what DNS rebinding produces) is refused outright.
    b.navigate(&format!("http://evil.test:{}/ui", addr.port())).expect("navigate evil.test");
    let text = b.wait_text("#outcome", "does not answer to Host", Duration::from_secs(10)).expect("foreign Host");
    assert!(text.contains("evil.test"), "{text}");
    b.quit();
}
