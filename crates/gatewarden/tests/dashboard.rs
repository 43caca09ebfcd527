//! The dashboard's pure parts (crates/dashboard) fed from real gateways: a home's snapshot
//! gathered from its files after a stop from the CLI, a SIGKILL and a running gateway, and the
//! fleet page of three registered homes, one of them stopped. The dashboard is not served by
//! the gateway yet (docs/architecture.md, "Dashboard"): these check what the page would say.
#![cfg(target_os = "linux")]

mod common;
use common::*;
use std::time::{Duration, SystemTime};

use gatewarden_control::proto::StatusReport;
use gatewarden_dashboard::gather;
use gatewarden_dashboard::snapshot::LockView;
use gatewarden_dashboard::timeline::{self, Ending};
use gatewarden_dashboard::{HomeSummary, Viewer, fleet, page, registry};
use gatewarden_lifecycle::Home;

fn status_json(home: &std::path::Path) -> StatusReport {
    let out = run_cli_at(home, &["status", "--json"]);
    serde_json::from_value(out.json()).unwrap_or_else(|e| panic!("status --json is a StatusReport ({e}): {out:?}"))
}

/// Stopped from the CLI, killed, running: three incarnations, each ended as it really did,
/// the stop's requester named, and the header agreeing with the lock.
#[test]
fn a_homes_page_tells_how_each_incarnation_ended() {
    let home = TempHome::new();
    let mut first = start(&home);
    let stop = run_cli(&home, &["stop"]);
    assert_cli(&stop, 0, "stop");
    first.wait_exit(Duration::from_secs(5));
    let mut second = start(&home);
    second.kill();
    // The third logs to the file `gatewarden start` gives a detached gateway.
    let log = home.path().join("logs").join(gather::LOG_FILE);
    let mut third = builder(&home).arg("--log-file").arg(&log).spawn();
    third.wait_ready(Duration::from_secs(10));

    let status = status_json(home.path());
    assert!(status.running, "{status:?}");
    let snap = gather::from_home(&Home::at(home.path()), status, SystemTime::now());
    assert_eq!(snap.lock, LockView::Held { pid: Some(third.pid()) });
    assert_eq!(snap.disagreement(), None, "lock and state file agree on a running gateway");

    let live = snap.status.incarnation.clone();
    let incs = timeline::incarnations(&snap.ledger, live.as_deref());
    let seen: Vec<(Option<u32>, &str)> = incs.iter().map(|i| (i.pid, i.ending.class())).collect();
    assert_eq!(
        seen,
        [(Some(first.pid()), "end-0"), (Some(second.pid()), "end-lost"), (Some(third.pid()), "end-run")],
        "{}",
        home.ledger_text()
    );
    assert_eq!(incs[1].ending, Ending::NoExitRecorded { superseded: true });
    let req = &incs[0].requests;
    assert_eq!(req.len(), 1, "one stop, written by the CLI and the gateway: {req:?}");
    assert_eq!((req[0].verb.as_str(), req[0].pid, req[0].channel.as_str()), ("stop", Some(stop.pid), "cli"));

    assert!(!snap.log_tail.is_empty(), "the log file's tail is in the snapshot");
    let levels = ["error", "warn", "info", "debug", "trace"];
    assert!(snap.log_tail.iter().all(|l| levels.contains(&l.level.as_str())), "levels parsed: {:?}", snap.log_tail);

    let html = page(&snap, &Viewer::default());
    assert!(html.contains(&format!("<span class=\"l-{}\">", snap.log_tail[0].level)), "the log section");
    assert!(html.contains(">running</span>"), "header state");
    assert!(html.contains(&format!("stop by pid {} (gatewarden ", stop.pid)), "requester in the table");
    assert!(html.contains("no exit recorded (killed or crashed)"));
    assert_eq!(html.matches("class=\"bar ").count(), 6, "three bars in each view");
}

/// Three registered homes, one stopped: the fleet lists all three from the registry, the
/// stopped one with its state and the reason it ended.
#[test]
fn the_fleet_lists_registered_homes_and_why_a_stopped_one_ended() {
    let homes = [TempHome::new(), TempHome::new(), TempHome::new()];
    let gws: Vec<Gateway> = homes.iter().map(start).collect();
    let stop = run_cli(&homes[2], &["stop"]);
    assert_cli(&stop, 0, "stop");

    let reg = tempfile::tempdir().unwrap();
    let dir = reg.path().join("gatewarden/homes");
    for h in &homes {
        let canonical = std::fs::canonicalize(h.path()).unwrap();
        registry::register(&dir, &canonical.to_string_lossy(), None).unwrap();
    }
    let listing = registry::list(&dir).unwrap();
    assert!(listing.skipped.is_empty(), "{:?}", listing.skipped);
    let summaries: Vec<HomeSummary> =
        listing.entries.iter().map(|e| HomeSummary::from_status(&status_json(std::path::Path::new(&e.home)))).collect();
    assert_eq!(summaries.len(), 3);
    let stopped: Vec<&HomeSummary> = summaries.iter().filter(|s| s.state == "stopped").collect();
    assert_eq!(stopped.len(), 1, "{summaries:#?}");
    assert_eq!(stopped[0].last_exit_code, Some(0), "{summaries:#?}");
    let reason = stopped[0].last_exit_reason.clone().unwrap_or_default();
    assert!(reason.contains(&format!("pid {}", stop.pid)), "the reason names the stopper: {reason:?}");

    let html = fleet(&summaries, &listing.skipped);
    assert_eq!(html.matches("<tr data-state=\"running\"").count(), 2);
    assert_eq!(html.matches("<tr data-state=\"stopped\"").count(), 1);
    assert!(html.contains(&format!("exit 0: {}", maud_escape(&reason))), "{html}");
    for g in gws.iter().take(2) {
        assert!(html.contains(&format!("href=\"http://{}/ui\"", g.listen())), "a running home links to its page");
    }
}

/// The escaping maud applies to text (`&`, `<`, `>`, `"`).
fn maud_escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}
