//! The rendered pages in a real headless Chromium (testkit::browser): the header's state, the
//! timeline's SVG bars, a live fragment swapped in over SSE by the page's own script, and the
//! fleet page. A tiny loopback HTTP server inside the test serves what this crate renders; the
//! runtime's `/ui` routes do not exist yet (docs/architecture.md, "Dashboard").
//!
//!   cargo nextest run -p gatewarden-dashboard --test browser
//!
//! Screenshots go to `target/screenshots/` (the paths are printed).

#![cfg(unix)]

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use gatewarden_control::proto::StatusReport;
use gatewarden_dashboard::snapshot::{DrainView, LockView, LogLine};
use gatewarden_dashboard::{HomeSummary, Snapshot, Viewer, fleet, fragment, page, sse};
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

/// Serves `/ui`, `/ui/fleet` and `/ui/events` (one fragment update, then an open stream) on a
/// loopback port. Threads end with the test process.
fn serve(main: String, fleet: String, update: String) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    let pages = Arc::new((main, fleet, update));
    std::thread::spawn(move || {
        for conn in l.incoming().flatten() {
            let pages = Arc::clone(&pages);
            std::thread::spawn(move || {
                let _ = answer(conn, &pages);
            });
        }
    });
    addr
}

fn answer(mut conn: TcpStream, pages: &(String, String, String)) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut first = String::new();
    reader.read_line(&mut first)?;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h == "\r\n" {
            break;
        }
    }
    let path = first.split_whitespace().nth(1).unwrap_or("/");
    let html = |body: &str| {
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    };
    match path {
        "/ui" => conn.write_all(html(&pages.0).as_bytes()),
        "/ui/fleet" => conn.write_all(html(&pages.1).as_bytes()),
        "/ui/events" => {
            conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-store\r\n\r\n")?;
            conn.write_all(pages.2.as_bytes())?;
            // Hold the stream open (a closed one makes the browser reconnect and replay).
            for _ in 0..600 {
                std::thread::sleep(Duration::from_millis(100));
                conn.write_all(sse::keepalive().as_bytes())?;
            }
            Ok(())
        }
        _ => conn.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"),
    }
}

fn screenshot_dir() -> PathBuf {
    // target/tmp -> target/screenshots (follows CARGO_TARGET_DIR).
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .map_or_else(|| PathBuf::from("target"), PathBuf::from)
        .join("screenshots")
}

#[test]
fn pages_render_in_headless_chromium_and_take_live_updates() {
    let Some(b) = Browser::start(Duration::from_secs(30)) else { return };
    let s = snapshot();
    let viewer = Viewer { actions_configured: false, csrf: None, events_path: "/ui/events".into() };
    let main = page(&s, &viewer);
    // The update the stream pushes: the same home, now draining one of two runs.
    let mut later = s.clone();
    later.status.state = Some("draining".into());
    later.drain = Some(DrainView { runs_at_start: 2, remaining: 1, deadline_us: Some(later.now_us + 30_000_000) });
    let update = sse::fragment(sse::HEADER, 1, &fragment(sse::HEADER, &later).expect("header fragment"));
    let addr = serve(main, fleet(&homes()), update);

    b.navigate(&format!("http://{addr}/ui")).expect("navigate");
    // The header's state, then the SSE update swapped in by the page's script.
    // The lock and the state file agree here: no disagreement box.
    assert!(b.find_all("#disagree").expect("find").is_empty());
    let first = b.find("#state").and_then(|e| b.text(&e)).expect("state");
    assert!(first == "running" || first == "draining 1/2", "{first:?}");
    let swapped = b.wait_text("#state", "draining 1/2", Duration::from_secs(10)).expect("SSE fragment swap");
    assert_eq!(swapped, "draining 1/2");

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

    let dir = screenshot_dir();
    let main_png = dir.join("dashboard-main.png");
    b.screenshot(&main_png).expect("screenshot");
    assert!(std::fs::metadata(&main_png).is_ok_and(|m| m.len() > 1000));
    eprintln!("screenshot: {}", main_png.display());

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
