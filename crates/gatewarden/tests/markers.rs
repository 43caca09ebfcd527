//! Class B: stale, foreign and misaddressed markers and state files; class J: lenient readers.
//! Scenario ids refer to /work/shared/reference/bug-classes.md §3.
#![cfg(target_os = "linux")]

mod common;
use common::*;
use std::time::{Duration, SystemTime};

const PLANNED: &str = ".gateway-planned-stop.json";
const TAKEOVER: &str = ".gateway-takeover.json";

/// How long a gateway must keep serving after a bad marker was handled. The positive anchor
/// is the marker's removal (the gateway demonstrably looked at it); this hold only catches a
/// delayed wrong reaction (hermes' watcher polled every 0.5 s).
const HOLD: Duration = Duration::from_millis(1500);

fn ledger_mentions_removal(home: &TempHome, file: &str) -> bool {
    home.ledger_events().iter().any(|e| {
        (e["event"] == "marker_removed" && e["file"].as_str().is_some_and(|f| f.contains(file)))
            || (e["event"] == "stale_cleaned" && e["files"].to_string().contains(file))
    })
}

#[track_caller]
fn assert_keeps_serving(g: &mut Gateway, what: &str) {
    if let Err(after) = holds_for(HOLD, || serving(g)) {
        panic!("{what}: gateway stopped serving {after:?} into the hold\n{}", g.diag());
    }
}

/// B1 (regression #34597): markers left for a dead predecessor are removed at boot and never
/// obeyed; malformed bytes too. The new gateway keeps running.
#[test]
fn b1_predecessor_and_malformed_markers_at_boot_are_removed_not_obeyed() {
    let home = TempHome::new();
    let dead = dead_pid();
    home.write(PLANNED, marker_json(dead, Some(3_921_877), Some(home.path()), &rfc3339_offset(-5)));
    home.write(TAKEOVER, marker_json(dead, Some(3_921_877), Some(home.path()), &rfc3339_offset(-5)));

    let mut g = builder(&home).spawn();
    g.wait_ready(READY);
    must_wait_until(Duration::from_secs(1), "predecessor markers removed within 1 s of ready", || {
        !home.exists(PLANNED) && !home.exists(TAKEOVER)
    });
    assert_keeps_serving(&mut g, "B1 predecessor marker");
    assert!(
        ledger_mentions_removal(&home, PLANNED),
        "ledger has no marker_removed/stale_cleaned for {PLANNED}:\n{}",
        home.ledger_text()
    );
    stop_cleanly(&home, &mut g);

    // malformed marker at boot
    home.write(PLANNED, b"\xff\xfe{\"target_pid\": not json\x17\x03\x03\xc7");
    let mut g = builder(&home).spawn();
    g.wait_ready(READY);
    must_wait_until(Duration::from_secs(1), "malformed marker removed", || !home.exists(PLANNED));
    assert_keeps_serving(&mut g, "B1 malformed marker at boot");
    stop_cleanly(&home, &mut g);
}

/// B1/B2 while running: each misaddressed marker is removed by the watcher and not obeyed:
/// wrong start time for our pid, 2 min old, 10 min in the future, malformed bytes, a dead pid,
/// no integer target_pid. Then an addressed marker IS obeyed (exit 0), proving the watcher was
/// live the whole time.
#[test]
fn b1_b2_misaddressed_markers_while_running_are_removed_not_obeyed() {
    let home = TempHome::new();
    let mut g = start(&home);
    let (pid, st) = (g.pid(), g.start_time());
    let h = Some(home.path());
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("own pid, other start time", marker_json(pid, Some(st + 1), h, &rfc3339_now()).into_bytes()),
        ("own identity, written 2 min ago", marker_json(pid, Some(st), h, &rfc3339_offset(-120)).into_bytes()),
        ("own identity, future-dated 10 min", marker_json(pid, Some(st), h, &rfc3339_offset(600)).into_bytes()),
        ("malformed bytes", b"\x17\x03\x03\xc7{{{".to_vec()),
        ("dead pid", marker_json(dead_pid(), Some(st), h, &rfc3339_now()).into_bytes()),
        (
            "target_pid not an integer",
            json!({"target_pid": "self", "target_start_time": st, "written_at": rfc3339_now()})
                .to_string()
                .into_bytes(),
        ),
        (
            "written_at unparseable",
            json!({"target_pid": pid, "target_start_time": st, "written_at": "yesterday"}).to_string().into_bytes(),
        ),
    ];
    for (what, bytes) in cases {
        home.write(PLANNED, &bytes);
        must_wait_until(Duration::from_secs(2), &format!("marker ({what}) removed by the running gateway"), || {
            !home.exists(PLANNED) || !g.alive()
        });
        assert!(g.alive(), "gateway obeyed a misaddressed marker ({what})\n{}", g.diag());
        assert_keeps_serving(&mut g, what);
    }
    assert!(
        home.events("stop_requested").is_empty(),
        "stop_requested logged for a bad marker:\n{}",
        home.ledger_text()
    );

    // The addressed marker is obeyed: proves the watcher was active for the cases above.
    home.write(PLANNED, marker_json(pid, Some(st), h, &rfc3339_now()));
    let s = g.wait_exit(Duration::from_secs(3));
    assert_exit_code(&g, s, 0, "addressed marker after the bad ones");
}

/// Rule 4 and rule 3 of §2.3: a marker for our exact (pid, start_time) but written before we
/// started, or naming another home, is not obeyed.
#[test]
fn b2_marker_predating_start_or_for_other_home_not_obeyed() {
    let home = TempHome::new();
    let before_spawn = SystemTime::now() - Duration::from_secs(3);
    let mut g = start(&home);
    let (pid, st) = (g.pid(), g.start_time());

    home.write(PLANNED, marker_json(pid, Some(st), Some(home.path()), &rfc3339(before_spawn)));
    assert_keeps_serving(&mut g, "marker written before the gateway started");

    let other = TempHome::new();
    home.write(PLANNED, marker_json(pid, Some(st), Some(other.path()), &rfc3339_now()));
    assert_keeps_serving(&mut g, "marker naming another home");
    assert!(home.events("stop_requested").is_empty(), "{}", home.ledger_text());
    let _ = std::fs::remove_file(home.planned_stop_marker());
    stop_cleanly(&home, &mut g);
}

/// §2.3 "naming another live process → left alone": a marker addressed to a live decoy (with
/// its exact identity) is never obeyed and never acted on against the decoy. While the gateway
/// runs (lock held) it is left in place. At boot the lock was free, and §1 lets any reader
/// remove runtime files of a free-lock home, so removal at boot is tolerated (not asserted).
#[test]
fn b_marker_for_another_live_process_is_left_in_place() {
    let home = TempHome::new();
    let mut decoy = Decoy::spawn(home.root());
    let marker = marker_json(decoy.pid(), Some(decoy.start_time()), Some(home.path()), &rfc3339_now());
    home.write(PLANNED, &marker);

    let mut g = start(&home);
    assert_keeps_serving(&mut g, "foreign live marker at boot");
    let at_boot = std::fs::read_to_string(home.planned_stop_marker()).ok();
    assert!(
        at_boot.is_none() || at_boot.as_deref() == Some(marker.as_str()),
        "marker for another live process was rewritten at boot: {at_boot:?}"
    );
    eprintln!(
        "foreign live marker at boot: {}",
        if at_boot.is_some() { "left in place" } else { "removed (allowed by §1)" }
    );

    // written while running (lock held): must be left alone
    let marker2 = marker_json(decoy.pid(), Some(decoy.start_time()), Some(home.path()), &rfc3339_now());
    home.write(PLANNED, &marker2);
    assert_keeps_serving(&mut g, "foreign live marker while running");
    assert_eq!(
        std::fs::read_to_string(home.planned_stop_marker()).ok().as_deref(),
        Some(marker2.as_str()),
        "marker for another live process removed/changed while the gateway runs"
    );
    assert!(home.events("stop_requested").is_empty(), "{}", home.ledger_text());

    std::fs::remove_file(home.planned_stop_marker()).unwrap();
    stop_cleanly(&home, &mut g);
    decoy.assert_untouched("foreign marker");
}

/// B3: non-UTF-8 gateway_state.json and a truncated gateway.pid: `status` reports them
/// unreadable and exits normally (3: not running); `run` starts and rewrites valid UTF-8 JSON.
#[test]
fn b3_corrupt_state_files_status_reports_unreadable_run_rewrites() {
    let home = TempHome::new();
    let seed = |state: &[u8]| {
        home.write("gateway_state.json", state);
        home.write("gateway.pid", b"{\"pid\": 12");
    };

    seed(b"\x17\x03\x03\xc7");
    let out = run_cli(&home, &["status", "--json"]);
    assert_cli(&out, 3, "status --json on corrupt files");
    let v = out.json();
    assert_eq!(v["running"], json!(false), "{v}");
    let files = &v["files"];
    for (k, what) in [("state", "non-UTF-8 gateway_state.json"), ("pid", "truncated gateway.pid")] {
        assert!(
            files[k].as_str().is_some_and(|s| s.starts_with("unreadable")),
            "files.{k} should be `unreadable: …` for a {what}: {v}"
        );
    }

    seed(b"{\"pid\": 1, \"gateway_state\": \"running\"}\x17\x03\x03\xc7");
    let out = run_cli(&home, &["status"]);
    assert_cli(&out, 3, "status on JSON+garbage state file");
    assert!(out.text_lc().contains("unreadable"), "status should report the state as unreadable: {out:#?}");

    seed(b"\x17\x03\x03\xc7");
    let mut g = builder(&home).spawn();
    g.wait_ready(READY);
    for f in ["gateway_state.json", "gateway.pid"] {
        let raw = std::fs::read(home.file(f)).unwrap();
        let text = String::from_utf8(raw).unwrap_or_else(|e| panic!("{f} is not UTF-8 after run: {e}"));
        let v: Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{f} is not JSON after run ({e}): {text}"));
        assert_eq!(v["pid"], json!(g.pid()), "{f}: {v}");
    }
    assert_eq!(home.state().as_deref(), Some("running"));
    stop_cleanly(&home, &mut g);
}

/// B7: `gateway_state.json` says `draining` (persisted across a hard kill), lock free →
/// `status` says not running (3) and `run` starts normally.
#[test]
fn b7_persisted_draining_state_is_stale_not_desired_down() {
    let home = TempHome::new();
    let dead = dead_pid();
    seed_stale_records(&home, dead, json!(1));
    let mut s = home.state_record().unwrap();
    s["gateway_state"] = json!("draining");
    home.write("gateway_state.json", s.to_string());
    let out = run_cli(&home, &["status"]);
    assert_cli(&out, 3, "status with persisted draining state");
    let mut g = builder(&home).spawn();
    g.wait_ready(READY);
    assert_eq!(home.state().as_deref(), Some("running"));
    stop_cleanly(&home, &mut g);
}

/// B4: homes A and B each run a gateway. `run --replace` in B replaces only B's gateway (old B
/// exits 0: takeover), writes its takeover marker only in B, leaves A untouched; a later bare
/// SIGTERM to A is "unexpected" → exit 1.
#[test]
fn b4_cross_home_isolation_replace_in_b_leaves_a_untouched() {
    let home_a = TempHome::new();
    let home_b = TempHome::new();
    let mut ga = start(&home_a);
    let mut gb = start(&home_b);
    let a_events_before = home_a.ledger_events().len();

    let mut gb2 = builder(&home_b).replace().spawn();
    gb2.wait_ready(Duration::from_secs(15));
    let st = gb.wait_exit(EXIT);
    assert_exit_code(&gb, st, 0, "old B replaced (takeover)");
    assert_pid_record_names(&home_b, &gb2);
    let takeovers = home_b.events("takeover");
    assert!(
        takeovers.iter().any(|e| e["target"]["pid"] == json!(gb.pid())),
        "B's ledger has no takeover event targeting old B ({}):\n{}",
        gb.pid(),
        home_b.ledger_text()
    );

    // A untouched
    assert!(serving(&mut ga), "A stopped serving after a replace in B\n{}", ga.diag());
    assert_pid_record_names(&home_a, &ga);
    assert!(!home_a.exists(TAKEOVER), "takeover marker appeared in home A");
    let a_new: Vec<Value> = home_a.ledger_events().into_iter().skip(a_events_before).collect();
    assert!(
        a_new.iter().all(|e| e["event"] != "stop_requested" && e["event"] != "takeover"),
        "A's ledger saw lifecycle traffic from B's replace: {a_new:?}"
    );

    ga.signal(sig::SIGTERM);
    let st = ga.wait_exit(EXIT);
    assert_exit_code(&ga, st, 1, "bare SIGTERM to A after B's takeover");
    stop_cleanly(&home_b, &mut gb2);
}
