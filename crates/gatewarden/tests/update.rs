//! Issue 9, `gatewarden update`: a verified transaction with rollback (bug class G). Real
//! processes, unsupervised (the successor route) and under `supervise`; loopback only.
//!
//! Each test copies the built binary into its own directory (the update swaps that file) and
//! makes the candidates there: a real gatewarden build reporting another version (the same
//! binary with its version string patched, which is what `GATEWARDEN_BUILD_VERSION` stamps at
//! build time, without a second build), and shell-script candidates for the broken cases.
//! After every test exactly one gateway runs, with the version the outcome claims.
#![cfg(target_os = "linux")]

mod common;
mod work_common;
use common::*;
use gatewarden_testkit::archive::tar_gz;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use work_common::rig::*;
use work_common::*;

#[track_caller]
fn assert_failed_and_back(r: &Rig, out: &CliOutput, what: &str, reason: &str) {
    assert_cli(out, 1, what);
    assert!(out.text_lc().contains(reason), "{what}: expected {reason:?} in the output: {out:#?}");
    let t = r.txn();
    assert_eq!(t["phase"], json!("rolled_back"), "{what}: {t}");
    assert!(out.stderr.contains(&format!("still on {}", r.version)), "{what}: {out:#?}");
    let res = r.home.events("update_result");
    assert_eq!(res.last().map(|e| e["ok"].clone()), Some(json!(false)), "{}", r.home.ledger_text());
    r.assert_one_gateway(&r.version);
}

/// A refusal before anything changed: exit 1, the same gateway still runs, no transaction.
#[track_caller]
fn assert_refused_unchanged(r: &Rig, g: &mut Gateway, out: &CliOutput, reason: &str) {
    assert_cli(out, 1, reason);
    assert!(out.text_lc().contains(reason), "expected {reason:?}: {out:#?}");
    assert!(out.text_lc().contains("nothing changed"), "{out:#?}");
    assert!(g.alive(), "the gateway must not be restarted");
    assert_eq!(r.txn(), Value::Null, "no transaction is recorded");
    assert!(r.home.events("update_started").is_empty(), "{}", r.home.ledger_text());
    r.assert_one_gateway(&r.version);
}

/// The happy path: stage, preflight, swap, restart, probation, receipt; then `--rollback`.
#[test]
fn update_to_a_real_build_then_roll_back_by_hand() {
    let (r, g) = rig("[update]\nprobation_s = 1\n");
    let b = r.release("9.9.9");
    let t0 = Instant::now();
    let out = r.update(&["--from", b.to_str().unwrap(), "--timeout", "20"]);
    assert_cli(&out, 0, "update");
    let took = t0.elapsed();
    assert!(out.stdout.contains(&format!("updated {} → 9.9.9", r.version)), "{out:#?}");
    let t = r.txn();
    assert_eq!(t["phase"], json!("committed"), "{t}");
    assert_eq!(t["from"], json!(r.version));
    assert_eq!(t["to"], json!("9.9.9"));
    assert!(Path::new(t["previous"].as_str().unwrap()).is_file(), "last known good kept: {t}");
    assert!(
        Path::new(t["staged"].as_str().unwrap()).starts_with(r.home.path().join("releases")),
        "staged under <home>/releases: {t}"
    );
    r.assert_one_gateway("9.9.9");
    assert_ne!(current_gateway(r.home.path()).unwrap().0, g.pid(), "a new incarnation runs");
    let ok = r.home.events("update_result");
    assert_eq!(ok.len(), 1, "{}", r.home.ledger_text());
    assert_eq!(ok[0]["ok"], json!(true));
    // Probation (1 s) is part of it: the update was not declared before it.
    assert!(took >= Duration::from_secs(1), "{took:?}");

    let st = r.update(&["--status", "--json"]);
    assert_cli(&st, 0, "update --status");
    assert_eq!(st.json()["update"]["running_version"], json!("9.9.9"), "{st:#?}");

    let back = r.update(&["--rollback"]);
    assert_cli(&back, 0, "update --rollback");
    assert!(back.stdout.contains(&format!("rolled back 9.9.9 → {}", r.version)), "{back:#?}");
    r.assert_one_gateway(&r.version);
    // The ledger says what the exit code says (issue 30 §6): the rollback did what was asked.
    let res = r.home.events("update_result");
    assert_eq!(
        (res.last().map(|e| e["ok"].clone()), res.last().map(|e| e["phase"].clone())),
        (Some(json!(true)), Some(json!("rolled_back"))),
        "{}",
        r.home.ledger_text()
    );
}

/// Issue 27 §1, the `update` route: the release passes its `check` in the updater's
/// environment, but the next incarnation, in the running gateway's own environment, cannot
/// start (a platform token only the updater's shell has). The restart is refused before the
/// old version stops serving: the update rolls back with the reason, the same incarnation runs
/// throughout, and a client calling it saw no failure.
#[test]
fn a_release_whose_successor_cannot_start_here_is_refused_and_the_old_gateway_serves_on() {
    const VAR: &str = "GW_TEST_UPDATE_ONLY_TOKEN";
    let (r, mut g) = rig("[update]\nprobation_s = 1\n");
    let inc = incarnation_of(&r.home, g.pid()).expect("incarnation");
    let b = r.release("9.9.9");
    let caller = gatewarden_testkit::api::Caller::start(Api::new(g.listen()));
    let platform =
        format!("[[platform]]\nkind = \"telegram\"\ntoken_env = \"{VAR}\"\napi_base = \"http://127.0.0.1:9\"\n");
    write_config(r.home.path(), &format!("[agent]\nbackend = \"echo\"\n[update]\nprobation_s = 1\n{platform}"));
    let args = ["update", "--from", b.to_str().unwrap(), "--timeout", "30"];
    let out = cli_with(&r.exe, r.home.path(), &args, &[(TAG_VAR, r.sw.tag()), (VAR, "1:x")], UPDATE_LIMIT);
    assert_failed_and_back(&r, &out, "a successor that cannot start here", "restart refused");
    assert!(out.stderr.contains(VAR), "the refusal names the missing secret: {out:#?}");
    let refused = r.home.events("restart_refused");
    assert_eq!(refused.len(), 1, "{}", r.home.ledger_text());
    assert!(refused[0]["reason"].as_str().unwrap_or_default().contains(VAR), "{}", refused[0]);
    caller.finish().assert_only(&inc, "an update whose restart was refused");
    assert!(g.alive(), "the old gateway never stopped: {}", g.diag());
    for e in ["drained", "exited"] {
        assert!(r.home.events(e).is_empty(), "{e}:\n{}", r.home.ledger_text());
    }
}

#[test]
fn candidate_that_exits_1_at_start_is_rolled_back() {
    let (r, _g) = rig("[update]\nprobation_s = 1\n");
    let c = r.script("exit1", "9.9.9", "exit 1");
    // The default --timeout (60 s): a release that cannot start fails fast, not at the deadline.
    let t0 = Instant::now();
    let out = r.update(&["--from", c.to_str().unwrap()]);
    // Its successor never says it is prepared: the restart is refused, the old one never stops.
    assert_failed_and_back(&r, &out, "exits 1", "restart refused");
    assert!(t0.elapsed() < Duration::from_secs(15), "the failure took {:?} to be handled", t0.elapsed());
}

#[test]
fn candidate_that_exits_78_on_this_config_is_rolled_back() {
    let (r, _g) = rig("[update]\nprobation_s = 1\n");
    let c = r.script("exit78", "9.9.9", "echo 'config.toml: unknown key' >&2; exit 78");
    let out = r.update(&["--from", c.to_str().unwrap(), "--timeout", "4"]);
    assert_failed_and_back(&r, &out, "exits 78", "restart was not verified");
}

#[test]
fn candidate_that_hangs_before_ready_is_rolled_back() {
    let (r, _g) = rig("[update]\nprobation_s = 1\n");
    let c = r.script("hang", "9.9.9", "exec sleep 600");
    let out = r.update(&["--from", c.to_str().unwrap(), "--timeout", "4"]);
    assert_failed_and_back(&r, &out, "hangs", "restart was not verified");
}

#[test]
fn candidate_reporting_the_wrong_version_is_rolled_back() {
    let (r, _g) = rig("[update]\nprobation_s = 1\n");
    // Says 9.9.9 but runs the old build.
    let run = format!("exec {} \"$@\"", r.pristine.display());
    let c = r.script("liar", "9.9.9", &run);
    let out = r.update(&["--from", c.to_str().unwrap(), "--timeout", "10"]);
    assert_failed_and_back(&r, &out, "wrong version", &format!("reports version {}, expected 9.9.9", r.version));
}

#[test]
fn candidate_that_crashes_during_probation_is_rolled_back() {
    let (r, _g) = rig("[update]\nprobation_s = 3\n");
    let b = r.release("9.9.9");
    // The real build, killed 1 s after it starts: ready, then gone within the probation.
    let run = format!("{} \"$@\" & pid=$!; sleep 1.5; kill -9 $pid; exit 1", b.display());
    let c = r.script("crashy", "9.9.9", &run);
    let out = r.update(&["--from", c.to_str().unwrap(), "--timeout", "10"]);
    assert_failed_and_back(&r, &out, "crash in probation", "during probation");
}

#[test]
fn checksum_mismatch_changes_nothing() {
    let (r, mut g) = rig("");
    let b = r.release("9.9.9");
    let out = r.update(&["--from", b.to_str().unwrap(), "--sha256", &"0".repeat(64)]);
    assert_refused_unchanged(&r, &mut g, &out, "checksum mismatch");
}

#[test]
fn not_an_executable_changes_nothing() {
    let (r, mut g) = rig("");
    let junk = r.dir.path().join("rel/junk");
    std::fs::write(&junk, b"this is not a program\n").unwrap();
    let out = r.update(&["--from", junk.to_str().unwrap()]);
    assert_refused_unchanged(&r, &mut g, &out, "not an executable");
}

#[test]
fn failed_preflight_changes_nothing() {
    let (r, mut g) = rig("");
    let path = r.dir.path().join("rel/nocheck");
    std::fs::write(&path, "#!/bin/sh\ncase \"$*\" in *--version*) echo gatewarden 9.9.9;; *) echo 'journal schema 7 is too new' >&2; exit 1;; esac\n").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = r.update(&["--from", path.to_str().unwrap()]);
    assert_refused_unchanged(&r, &mut g, &out, "preflight");
    assert!(out.stderr.contains("journal schema 7 is too new"), "{out:#?}");
}

/// Two updates at once: one runs, the other is refused; never two swaps.
#[test]
fn two_updates_at_once_never_swap_twice() {
    let (r, _g) = rig("[update]\nprobation_s = 2\n");
    let b = r.release("9.9.9");
    let c = r.release("8.8.8");
    let (exe, home, tag) = (r.exe.clone(), r.home.path().to_path_buf(), r.sw.tag().to_owned());
    let spawn = |from: PathBuf| {
        let (exe, home, tag) = (exe.clone(), home.clone(), tag.clone());
        std::thread::spawn(move || {
            cli_with(
                &exe,
                &home,
                &["update", "--from", from.to_str().unwrap()],
                &[(TAG_VAR, tag.as_str())],
                UPDATE_LIMIT,
            )
        })
    };
    let h1 = spawn(b);
    let h2 = spawn(c);
    let (o1, o2) = (h1.join().unwrap(), h2.join().unwrap());
    let (won, lost) = if o1.code == Some(0) { (o1, o2) } else { (o2, o1) };
    assert_cli(&won, 0, "the update that ran");
    assert_cli(&lost, 1, "the concurrent update");
    assert!(lost.text_lc().contains("another update is in progress"), "{lost:#?}");
    assert_eq!(r.home.events("update_started").len(), 1, "{}", r.home.ledger_text());
    // Issue 22, item 7: the refusal is in the ledger, with its reason and who asked.
    let refused = r.home.events("update_refused");
    assert_eq!(refused.len(), 1, "{}", r.home.ledger_text());
    assert!(
        refused[0]["reason"].as_str().is_some_and(|w| w.contains("another update is in progress")),
        "{}",
        refused[0]
    );
    assert_eq!(refused[0]["requester"]["pid"], json!(lost.pid), "{}", refused[0]);
    assert_eq!(refused[0]["requester"]["channel"], json!("cli"), "{}", refused[0]);
    let to = r.txn()["to"].as_str().unwrap().to_owned();
    r.assert_one_gateway(&to);
}

/// Issue 22, item 7: an `update` while a `restart` drains a run joins nothing stale: it waits
/// for that restart (whose successor is the old build, spawned before the swap), then restarts
/// onto the new version. Both exit 0 and the new version runs. (Before: the update saw the old
/// version come back and rolled back with exit 1, "new incarnation reports version 0.1.0".)
#[test]
fn update_during_a_restart_waits_for_it_then_updates() {
    let (r, g) = rig("");
    let config = "drain_timeout_s = 30\n[agent]\nbackend = \"echo\"\ndelay_ms = 2500\n[update]\nprobation_s = 1\n";
    write_config(r.home.path(), config);
    // The config is read at start: restart once so the gateway has the run delay.
    let re = cli_with(&r.exe, r.home.path(), &["restart"], &[(TAG_VAR, r.sw.tag())], UPDATE_LIMIT);
    assert_cli(&re, 0, "restart to load the config");
    let b = r.release("9.9.9");
    let run = send_bg(g.listen(), "B", "in flight");
    wait_active(g.listen(), 1);
    let (exe, home, tag) = (r.exe.clone(), r.home.path().to_path_buf(), r.sw.tag().to_owned());
    let restart = std::thread::spawn(move || {
        cli_with(&exe, &home, &["restart", "--timeout", "30"], &[(TAG_VAR, tag.as_str())], UPDATE_LIMIT)
    });
    // The restart's successor (the old build) is spawned and waits for the drain.
    must_wait_until(Duration::from_secs(10), "the restart's successor", || {
        !r.home.events("successor_started").is_empty() && r.home.state().as_deref() == Some("draining")
    });
    let out = r.update(&["--from", b.to_str().unwrap(), "--timeout", "30"]);
    let re = restart.join().unwrap();
    let (resp, _) = run.join().unwrap();
    assert_eq!(resp.expect("the run's connection").status, 200, "the run is drained, not cut");
    assert_cli(&re, 0, "the restart");
    assert_cli(&out, 0, "the update during the restart");
    assert!(out.stdout.contains(&format!("updated {} → 9.9.9", r.version)), "{out:#?}");
    assert_eq!(r.txn()["phase"], json!("committed"), "{}", r.txn());
    r.assert_one_gateway("9.9.9");
}

/// Issue 22, item 6: `update --rollback` on a stopped gateway swaps the binary back and starts
/// nothing; the next `start` runs the old version.
#[test]
fn rollback_by_hand_of_a_stopped_gateway_does_not_start_it() {
    let (r, _g) = rig("[update]\nprobation_s = 1\n");
    let b = r.release("9.9.9");
    assert_cli(&r.update(&["--from", b.to_str().unwrap(), "--timeout", "20"]), 0, "update");
    r.assert_one_gateway("9.9.9");
    let stop = cli_with(&r.exe, r.home.path(), &["stop"], &[(TAG_VAR, r.sw.tag())], UPDATE_LIMIT);
    assert_cli(&stop, 0, "stop");
    let back = r.update(&["--rollback"]);
    assert!(!r.home.lock_held(), "the rollback started the stopped gateway\n{}", r.home.ledger_text());
    assert_cli(&back, 0, "update --rollback");
    assert!(back.text_lc().contains("stays stopped"), "{back:#?}");
    assert!(wait_until(READY, || r.sw.tagged().is_empty()), "something is still running: {:?}", r.sw.tagged());
    assert!(!r.home.lock_held(), "{}", r.home.ledger_text());
    assert_eq!(version_of(&r.exe), r.version, "the old binary is back in place");
    assert_eq!(r.txn()["phase"], json!("rolled_back"), "{}", r.txn());
    let start =
        cli_with(&r.exe, r.home.path(), &["start", "--listen", "127.0.0.1:0"], &[(TAG_VAR, r.sw.tag())], UPDATE_LIMIT);
    assert_cli(&start, 0, "start after the rollback");
    r.assert_one_gateway(&r.version);
}

/// Issue 22, item 7 (found by tests/overlap.rs): a `stop` while `update --rollback` restarts
/// onto the old binary is the operator's: the old binary stays in place, nothing is started,
/// and the rollback says so with exit 0. (Before: exit 1, "the rollback to 0.1.0 failed", and
/// the transaction recorded `failed` with the old binary installed.)
#[test]
fn stop_during_a_rollbacks_restart_keeps_it_down() {
    let (r, g) = rig("");
    let config = "drain_timeout_s = 30\n[agent]\nbackend = \"echo\"\ndelay_ms = 2500\n[update]\nprobation_s = 1\n";
    write_config(r.home.path(), config);
    let b = r.release("9.9.9");
    assert_cli(&r.update(&["--from", b.to_str().unwrap(), "--timeout", "30"]), 0, "update");
    r.assert_one_gateway("9.9.9");
    let run = send_bg(g.listen(), "B", "in flight");
    wait_active(g.listen(), 1);
    let (exe, home, tag) = (r.exe.clone(), r.home.path().to_path_buf(), r.sw.tag().to_owned());
    let rollback = std::thread::spawn(move || {
        cli_with(&exe, &home, &["update", "--rollback", "--timeout", "30"], &[(TAG_VAR, tag.as_str())], UPDATE_LIMIT)
    });
    // The rollback swapped the old binary back and its restart drains the run.
    wait_state(&r.home, "draining", Duration::from_secs(20));
    let stop = cli_with(&r.exe, r.home.path(), &["stop", "--timeout", "30"], &[(TAG_VAR, r.sw.tag())], UPDATE_LIMIT);
    assert_cli(&stop, 0, "stop during the rollback's restart");
    let back = rollback.join().unwrap();
    let (resp, _) = run.join().unwrap();
    assert_eq!(resp.expect("the run's connection").status, 200, "the run is drained, not cut");
    assert!(wait_until(READY, || r.sw.tagged().is_empty()), "something is still running: {:?}", r.sw.tagged());
    assert!(!r.home.lock_held(), "the gateway runs again after the stop\n{}", r.home.ledger_text());
    assert_cli(&back, 0, "the rollback whose restart a stop overtook");
    assert!(back.text_lc().contains("stays stopped"), "{back:#?}");
    assert_eq!(r.txn()["phase"], json!("rolled_back"), "{}", r.txn());
    assert_eq!(version_of(&r.exe), r.version, "the old binary is back in place");
}

/// Issue 22, item 6: a `stop` during an update's probation is not a failed probation: nothing
/// is started again (the old binary is put back in place, unstarted), and the update says why.
#[test]
fn stop_during_probation_keeps_the_gateway_down() {
    let (r, _g) = rig("[update]\nprobation_s = 8\n");
    let b = r.release("9.9.9");
    let (exe, home, tag) = (r.exe.clone(), r.home.path().to_path_buf(), r.sw.tag().to_owned());
    let from = b.to_str().unwrap().to_owned();
    let update = std::thread::spawn(move || {
        cli_with(&exe, &home, &["update", "--from", &from, "--timeout", "20"], &[(TAG_VAR, tag.as_str())], UPDATE_LIMIT)
    });
    must_wait_until(Duration::from_secs(30), "the update's probation", || r.txn()["phase"] == json!("probation"));
    let stop = cli_with(&r.exe, r.home.path(), &["stop"], &[(TAG_VAR, r.sw.tag())], UPDATE_LIMIT);
    assert_cli(&stop, 0, "stop during probation");
    let out = update.join().unwrap();
    assert!(!r.home.lock_held(), "the gateway was started again after the stop\n{}", r.home.ledger_text());
    assert_cli(&out, 1, "the interrupted update");
    assert!(out.text_lc().contains("interrupted"), "{out:#?}");
    assert!(out.text_lc().contains("stays stopped"), "{out:#?}");
    assert!(wait_until(READY, || r.sw.tagged().is_empty()), "something is still running: {:?}", r.sw.tagged());
    assert!(!r.home.lock_held(), "{}", r.home.ledger_text());
    assert_eq!(r.txn()["phase"], json!("rolled_back"), "{}", r.txn());
    assert_eq!(version_of(&r.exe), r.version, "the unproven release is not left installed");
    assert!(!r.home.events("start_prevented").is_empty(), "{}", r.home.ledger_text());
}

/// SIGKILL of the updater at each phase: the next start finishes the transaction (completes
/// or reverts), and exactly one gateway runs the version update.json ends with. One test per
/// phase: each makes its own rig and release (15 to 20 s on a loaded 2-core machine), and the
/// four in one test took up to 87 s there, against nextest's 120 s (180 s in CI) per test.
#[test]
fn updater_killed_at_each_phase_is_finished_by_the_next_start_swapping() {
    updater_killed_in("swapping");
}

#[test]
fn updater_killed_at_each_phase_is_finished_by_the_next_start_swapped() {
    updater_killed_in("swapped");
}

#[test]
fn updater_killed_at_each_phase_is_finished_by_the_next_start_restarting() {
    updater_killed_in("restarting");
}

#[test]
fn updater_killed_at_each_phase_is_finished_by_the_next_start_probation() {
    updater_killed_in("probation");
}

/// One phase of the test above: the updater paused in `phase` is killed there.
fn updater_killed_in(phase: &'static str) {
    let (r, _g) = rig("[update]\nprobation_s = 2\n");
    let b = r.release("9.9.9");
    let (exe, home, tag) = (r.exe.clone(), r.home.path().to_path_buf(), r.sw.tag().to_owned());
    let from = b.to_str().unwrap().to_owned();
    let h = std::thread::spawn(move || {
        let env = [(TAG_VAR, tag.as_str()), ("GATEWARDEN_TEST_UPDATE_PAUSE", phase)];
        cli_with(&exe, &home, &["update", "--from", &from, "--timeout", "20"], &env, UPDATE_LIMIT)
    });
    // The phase comes after staging, the preflight and (for the later ones) a restart onto
    // the release: many seconds on a loaded machine. So no bound of its own: the wait
    // lasts while the updater runs (itself bounded by UPDATE_LIMIT), and an updater that
    // ended before the phase fails the test with its output.
    let t0 = Instant::now();
    let mut killed = None;
    wait_until(UPDATE_LIMIT, || {
        let t = r.txn();
        if t["phase"] == json!(phase) {
            let pid = t["updater_pid"].as_u64().unwrap() as u32;
            send_signal(pid, sig::SIGKILL).unwrap();
            killed = Some(pid);
            return true;
        }
        h.is_finished()
    });
    let out = h.join().unwrap();
    let Some(pid) = killed else {
        panic!("{phase}: the updater ended before that phase: {}\n{out:#?}\n{}", r.txn(), r.home.ledger_text())
    };
    eprintln!("{phase} reached and killed after {:.1} s", t0.elapsed().as_secs_f64());
    assert_ne!(out.code, Some(0), "{phase}: the killed updater cannot report success: {out:#?}");
    must_wait_until(EXIT, "the updater is gone", || !pid_alive(pid));
    // The next start: a plain restart.
    let re = cli_with(&r.exe, r.home.path(), &["restart", "--timeout", "30"], &[(TAG_VAR, r.sw.tag())], UPDATE_LIMIT);
    assert_cli(&re, 0, &format!("{phase}: restart after the killed updater"));
    let mut t = Value::Null;
    must_wait_until(Duration::from_secs(30), &format!("{phase}: the transaction is finished"), || {
        t = r.txn();
        matches!(t["phase"].as_str(), Some("committed" | "rolled_back" | "failed"))
    });
    let want = if t["phase"] == json!("committed") { "9.9.9".to_owned() } else { r.version.clone() };
    // Killed before the swap: nothing changed, the transaction is closed as failed.
    if phase == "swapping" && t["phase"] == json!("failed") {
        assert!(t["reason"].as_str().unwrap().contains("updater died"), "{t}");
    } else {
        assert_ne!(t["phase"], json!("failed"), "{phase}: {t}\n{}", r.home.ledger_text());
    }
    eprintln!("killed in {phase}: finished as {} ({})", t["phase"], t["reason"]);
    r.assert_one_gateway(&want);
}

/// Under `supervise`, a candidate that dies at once is reverted by supervise itself (no
/// updater alive), so the next child is the old binary. (A restart onto it is refused
/// outright: its preflight fails.)
#[test]
fn supervise_reverts_a_candidate_that_dies_at_once() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("gatewarden");
    std::fs::copy(bin(), &exe).unwrap();
    let version = version_of(&exe);
    write_config(home.path(), "[agent]\nbackend = \"echo\"\n");
    let mut sup = std::process::Command::new(&exe);
    sup.arg("--home").arg(home.path()).args(["supervise", "--listen", "127.0.0.1:0"]);
    sup.env(TAG_VAR, sw.tag()).env_remove("GATEWARDEN_SUPERVISOR");
    sup.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
    let mut child = sup.spawn().unwrap();
    must_wait_until(READY, "supervised gateway running", || {
        current_gateway(home.path()).is_some_and(|(_, _, s, _)| s == "running")
    });
    // An updater that died right after the swap left this behind.
    let prev = dir.path().join("previous");
    std::fs::copy(&exe, &prev).unwrap();
    let bad = "#!/bin/sh\nexit 1\n";
    let sha = |p: &Path| {
        let out = std::process::Command::new("sha256sum").arg(p).output().unwrap();
        String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap().to_owned()
    };
    let from_sha = sha(&exe);
    let tmp = dir.path().join(".swap");
    std::fs::write(&tmp, bad).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::rename(&tmp, &exe).unwrap();
    let txn = json!({"from": version, "to": "9.9.9", "phase": "restarting", "started": rfc3339_offset(0),
        "target": exe, "staged": exe, "previous": prev, "from_sha256": from_sha, "to_sha256": sha(&exe),
        "updater_pid": dead_pid()});
    home.write("update.json", serde_json::to_vec(&txn).unwrap());
    // The restart the updater asked for is refused: the preflight runs the broken binary,
    // and the gateway keeps serving (issue 27 §1).
    let re = cli_with(&prev, home.path(), &["restart", "--timeout", "30"], &[(TAG_VAR, sw.tag())], UPDATE_LIMIT);
    assert_cli(&re, 78, "restart under supervise onto a binary that cannot run");
    let (old, ..) = current_gateway(home.path()).expect("the old gateway still runs");
    // Any other end of it (here a kill): supervise relaunches the broken binary, which dies.
    send_signal(old, sig::SIGKILL).unwrap();
    must_wait_until(UPDATE_LIMIT, "a gateway of the old version", || {
        current_gateway(home.path()).is_some_and(|(p, _, s, _)| p != old && s == "running")
    });
    let t = home.read_json("update.json").unwrap();
    assert_eq!(t["phase"], json!("rolled_back"), "{t}\n{}", home.ledger_text());
    assert!(t["reason"].as_str().unwrap().contains("reverted by supervise"), "{t}");
    assert_eq!(version_of(&exe), version);
    let st = cli(&exe, home.path(), &["status", "--json"]);
    assert_eq!(st.json()["version"], json!(version), "{st:#?}");
    let _ = send_signal(child.id(), sig::SIGTERM);
    let _ = child.wait();
}

/// The notices `chat` has collected so far, polled until `n` arrived (or the deadline).
/// Chat `/update` needs an admin who came with the API token (docs/security.md).
const TOKEN: &str = "t0k-0123456789abcdef";
const ADMINS: &str = "api_token = \"t0k-0123456789abcdef\"\nadmins = [\"u-s\", \"u1\", \"u2\"]\n";

fn notices_until(addr: std::net::SocketAddr, chat: &str, n: usize, timeout: Duration) -> Vec<String> {
    let mut all = Vec::new();
    wait_until(timeout, || {
        if let Ok(mut got) = Api::new(addr).with_token(TOKEN).notices(chat) {
            all.append(&mut got);
        }
        all.len() >= n
    });
    all
}

/// Chat `/update` while another chat's run is active: answered at once, never a run (the
/// bystander's run is drained, not cut), and exactly one outcome notice for the asking chat.
#[test]
fn chat_update_while_another_chat_runs() {
    let (r, g) = rig("");
    let b = r.release("9.9.9");
    write_config(
        r.home.path(),
        &format!(
            // The bystander's run outlasts staging and preflight even on a loaded machine, so the
            // update's drain meets it.
            "{ADMINS}[agent]\nbackend = \"echo\"\ndelay_ms = 5000\n[update]\nprobation_s = 1\nsource = \"{}\"\n",
            b.display()
        ),
    );
    // The config is read at start: restart once so the gateway knows the source.
    let re = cli_with(&r.exe, r.home.path(), &["restart"], &[(TAG_VAR, r.sw.tag())], UPDATE_LIMIT);
    assert_cli(&re, 0, "restart to load the config");
    let addr = g.listen();
    let api = Api::new(addr).with_token(TOKEN);
    let bystander = send_bg_as(&api, "B", "bystander text");
    wait_active_as(&api, 1);
    let t0 = Instant::now();
    let resp = api.send("S", "u-s", "/update").unwrap();
    assert!(t0.elapsed() < Duration::from_secs(1), "/update answered after {:?}", t0.elapsed());
    assert_eq!(resp.status, 200, "{}", resp.text());
    let v = resp.json().unwrap();
    assert!(v["reply"].as_str().unwrap().starts_with("updating from"), "{v}");
    assert_eq!(v["command"], json!(true), "{v}");
    let (br, _) = bystander.join().unwrap();
    let br = br.unwrap();
    assert_eq!(br.status, 200, "the bystander's run is drained, not cut: {}", br.text());
    assert_eq!(br.json().unwrap()["reply"], json!("bystander text"));
    must_wait_until(Duration::from_secs(60), "update committed", || r.txn()["phase"] == json!("committed"));
    let got = notices_until(addr, "S", 1, Duration::from_secs(10));
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(got[0].starts_with(&format!("updated {} → 9.9.9 (incarnation ", r.version)), "{got:?}");
    // Exactly one: nothing more arrives, for this chat or the bystander's.
    assert!(notices_until(addr, "S", 1, Duration::from_secs(1)).is_empty());
    assert!(api.notices("B").unwrap().iter().all(|n| !n.contains("updated")));
    assert!(r.home.events("drained").iter().any(|d| d["runs_at_start"] == json!(1)), "{}", r.home.ledger_text());
    r.assert_one_gateway("9.9.9");
}

/// `/update` twice at once: never two swaps, and each chat gets exactly one outcome notice.
#[test]
fn chat_update_twice_at_once() {
    let (r, g) = rig("");
    let b = r.release("9.9.9");
    write_config(
        r.home.path(),
        &format!("{ADMINS}[agent]\nbackend = \"echo\"\n[update]\nprobation_s = 1\nsource = \"{}\"\n", b.display()),
    );
    let re = cli_with(&r.exe, r.home.path(), &["restart"], &[(TAG_VAR, r.sw.tag())], UPDATE_LIMIT);
    assert_cli(&re, 0, "restart to load the config");
    let addr = g.listen();
    let h1 = std::thread::spawn(move || Api::new(addr).with_token(TOKEN).send("C1", "u1", "/update"));
    let h2 = std::thread::spawn(move || Api::new(addr).with_token(TOKEN).send("C2", "u2", "/update"));
    for h in [h1, h2] {
        let resp = h.join().unwrap().unwrap();
        assert_eq!(resp.status, 200, "{}", resp.text());
    }
    let n1 = notices_until(addr, "C1", 1, Duration::from_secs(60));
    let n2 = notices_until(addr, "C2", 1, Duration::from_secs(60));
    assert_eq!((n1.len(), n2.len()), (1, 1), "{n1:?} {n2:?}\n{}", r.home.ledger_text());
    let updated = n1.iter().chain(&n2).filter(|n| n.starts_with("updated")).count();
    let refused = n1.iter().chain(&n2).filter(|n| n.starts_with("update refused")).count();
    assert_eq!((updated, refused), (1, 1), "{n1:?} {n2:?}");
    assert_eq!(r.home.events("update_started").len(), 1, "{}", r.home.ledger_text());
    r.assert_one_gateway("9.9.9");
}

/// Removes the unit installed for a home (through the binary that installed it) on drop.
struct InstalledUnit {
    exe: PathBuf,
    home: PathBuf,
}

impl Drop for InstalledUnit {
    fn drop(&mut self) {
        let _ = cli_with(&self.exe, &self.home, &["service", "uninstall"], &[], Duration::from_secs(120));
    }
}

/// A home with a systemd user unit installed by a private copy of the binary (so `ExecStart=`
/// is the path an update swaps), running the old version.
fn systemd_rig() -> (Rig, InstalledUnit) {
    let r = Rig::installed();
    let (exe, version) = (r.exe.clone(), r.version.clone());
    write_config(r.home.path(), "listen = \"127.0.0.1:0\"\n[update]\nprobation_s = 1\n");
    let install = cli_with(&exe, r.home.path(), &["service", "install", "--restart-sec-ms", "100"], &[], UPDATE_LIMIT);
    let unit = InstalledUnit { exe: exe.clone(), home: r.home.path().to_path_buf() };
    assert_cli(&install, 0, "service install");
    let svc = cli(&exe, r.home.path(), &["service", "status", "--json"]).json();
    let unit_file = std::fs::read_to_string(svc["path"].as_str().unwrap()).unwrap();
    assert!(unit_file.contains(&format!("ExecStart={} run", exe.display())), "{unit_file}");
    assert!(unit_file.contains("ExecStopPost=-"), "{unit_file}");
    systemd_gateway(&r, &version);
    (r, unit)
}

/// One gateway runs `version` as the unit's `MainPID`, and the installed file is that version.
#[track_caller]
fn systemd_gateway(r: &Rig, version: &str) {
    let mut last = Value::Null;
    let ok = wait_until(READY, || {
        let st = cli(&r.pristine, r.home.path(), &["status", "--json"]);
        last = if st.code == Some(0) { st.json() } else { Value::Null };
        let main = svc_main_pid(&r.pristine, r.home.path());
        last["state"] == json!("running")
            && last["version"] == json!(version)
            && last["supervisor"] == json!("systemd")
            && main.is_some_and(|m| last["pid"] == json!(m))
    });
    assert!(ok, "no {version} gateway running as the unit's MainPID: {last}\n{}", r.home.ledger_text());
    assert_eq!(version_of(&r.exe), version, "the installed executable");
}

/// Under a systemd unit whose `ExecStart` is the swapped path: an update reaches the new
/// version through systemd's own relaunch, and a candidate that dies at start is rolled back
/// with the old version running under the unit again.
#[test]
fn update_under_a_systemd_unit() {
    if !have_user_manager() {
        return;
    }
    let (r, _unit) = systemd_rig();
    let b = r.release("9.9.9");
    let out = r.update(&["--from", b.to_str().unwrap(), "--timeout", "20"]);
    assert_cli(&out, 0, "update under systemd");
    assert_eq!(r.txn()["phase"], json!("committed"));
    systemd_gateway(&r, "9.9.9");

    let back = r.update(&["--rollback"]);
    assert_cli(&back, 0, "rollback under systemd");
    systemd_gateway(&r, &r.version);

    let c = r.script("exit1", "8.8.8", "exit 1");
    let out = r.update(&["--from", c.to_str().unwrap()]);
    assert_cli(&out, 1, "a candidate that dies at start, under systemd");
    assert_eq!(r.txn()["phase"], json!("rolled_back"), "{out:#?}");
    systemd_gateway(&r, &r.version);
}

/// The updater is SIGKILLed before the restart, and the release cannot run a line of our
/// code: a restart onto it is refused, and when the gateway ends anyway the unit's
/// `ExecStopPost=` (the last known good copy) reverts the file, so systemd's relaunch runs the
/// old version again.
#[test]
fn systemd_reverts_a_dead_release_when_the_updater_died() {
    if !have_user_manager() {
        return;
    }
    let (r, _unit) = systemd_rig();
    let c = r.script("exit1", "8.8.8", "exit 1");
    let (exe, home) = (r.exe.clone(), r.home.path().to_path_buf());
    let from = c.to_str().unwrap().to_owned();
    let h = std::thread::spawn(move || {
        cli_with(
            &exe,
            &home,
            &["update", "--from", &from],
            &[("GATEWARDEN_TEST_UPDATE_PAUSE", "restarting")],
            UPDATE_LIMIT,
        )
    });
    let mut pid = 0;
    must_wait_until(Duration::from_secs(30), "phase restarting", || {
        let t = r.txn();
        pid = t["updater_pid"].as_u64().unwrap_or(0) as u32;
        t["phase"] == json!("restarting")
    });
    send_signal(pid, sig::SIGKILL).unwrap();
    let _ = h.join();
    // The restart the updater never did (`restart` of the old binary: the installed file is
    // the broken release now) is refused: its preflight runs the release, which cannot start,
    // and the old gateway serves on (issue 27 §1).
    let re = cli_with(&r.pristine, r.home.path(), &["restart", "--timeout", "30"], &[], UPDATE_LIMIT);
    assert_cli(&re, 78, "restart after the updater died");
    // Any other end of it (here a kill): systemd's relaunch would run the release, and the
    // unit's `ExecStopPost=` puts the old version back first.
    let old = svc_main_pid(&r.pristine, r.home.path()).expect("a MainPID");
    send_signal(old, sig::SIGKILL).unwrap();
    must_wait_until(UPDATE_LIMIT, "a new MainPID", || {
        svc_main_pid(&r.pristine, r.home.path()).is_some_and(|p| p != old)
    });
    let t = r.txn();
    assert_eq!(t["phase"], json!("rolled_back"), "{t}\n{}", r.home.ledger_text());
    assert!(t["reason"].as_str().unwrap().contains("ExecStopPost"), "{t}");
    systemd_gateway(&r, &r.version);
}

/// The unit's `MainPID` as `service status --json` reports it.
fn svc_main_pid(exe: &Path, home: &Path) -> Option<u32> {
    let v = cli(exe, home, &["service", "status", "--json"]).json();
    v["main_pid"].as_u64().map(|p| p as u32).filter(|p| *p != 0)
}

/// With `[update] public_key` set, a release needs a valid minisign signature: a signed one
/// gets past the check (and here fails its preflight, by design of the fixture), a tampered or
/// unsigned one is refused; nothing changes in any case. Fixture: `fixtures/update/`.
#[test]
fn signatures_are_required_when_a_key_is_configured() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/update");
    let key = std::fs::read_to_string(fixtures.join("key.pub")).unwrap();
    let (r, mut g) = rig(&format!("[update]\npublic_key = \"{}\"\n", key.trim()));
    let rel = r.dir.path().join("rel");
    for f in ["release.sh", "release.sh.minisig"] {
        std::fs::copy(fixtures.join(f), rel.join(f)).unwrap();
    }
    let signed = rel.join("release.sh");
    let out = r.update(&["--from", signed.to_str().unwrap()]);
    assert_refused_unchanged(&r, &mut g, &out, "preflight");
    assert!(out.stderr.contains("signed test release"), "the signature was accepted: {out:#?}");

    let tampered = rel.join("tampered.sh");
    let mut bytes = std::fs::read(&signed).unwrap();
    bytes.extend_from_slice(b"# one more line\n");
    std::fs::write(&tampered, bytes).unwrap();
    let sig = rel.join("release.sh.minisig");
    let out = r.update(&["--from", tampered.to_str().unwrap(), "--signature", sig.to_str().unwrap()]);
    assert_refused_unchanged(&r, &mut g, &out, "signature check failed");

    let unsigned = r.release("9.9.9");
    let out = r.update(&["--from", unsigned.to_str().unwrap()]);
    assert_refused_unchanged(&r, &mut g, &out, "a signature is required");
}

/// SIGKILL while rolling back (here from a release that reports the wrong version): the next
/// start carries the decided rollback out, and the old version runs from the old file.
#[test]
fn updater_killed_while_rolling_back_is_finished_by_the_next_start() {
    let (r, _g) = rig("[update]\nprobation_s = 1\n");
    let run = format!("exec {} \"$@\"", r.pristine.display());
    let c = r.script("liar", "9.9.9", &run);
    let (exe, home, tag) = (r.exe.clone(), r.home.path().to_path_buf(), r.sw.tag().to_owned());
    let from = c.to_str().unwrap().to_owned();
    let h = std::thread::spawn(move || {
        let env = [(TAG_VAR, tag.as_str()), ("GATEWARDEN_TEST_UPDATE_PAUSE", "rolling_back")];
        cli_with(&exe, &home, &["update", "--from", &from, "--timeout", "20"], &env, UPDATE_LIMIT)
    });
    let mut pid = 0;
    must_wait_until(Duration::from_secs(30), "phase rolling_back", || {
        let t = r.txn();
        pid = t["updater_pid"].as_u64().unwrap_or(0) as u32;
        t["phase"] == json!("rolling_back")
    });
    send_signal(pid, sig::SIGKILL).unwrap();
    let _ = h.join();
    let re =
        cli_with(&r.pristine, r.home.path(), &["restart", "--timeout", "30"], &[(TAG_VAR, r.sw.tag())], UPDATE_LIMIT);
    assert_cli(&re, 0, "restart after the updater died");
    let mut t = Value::Null;
    must_wait_until(Duration::from_secs(30), "the transaction is finished", || {
        t = r.txn();
        t["phase"] == json!("rolled_back")
    });
    r.assert_one_gateway(&r.version);
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// A release archive (`gatewarden-9.9.9/gatewarden` beside a README, a real build), checked
/// by the archive's sha256 as downloaded: staged, committed, then rolled back by hand.
#[test]
fn update_from_a_tar_gz_then_roll_back_by_hand() {
    let (r, g) = rig("[update]\nprobation_s = 1\n");
    let b = std::fs::read(r.release("9.9.9")).unwrap();
    let archive = tar_gz(&[("gatewarden-9.9.9/README.md", b"hello\n"), ("gatewarden-9.9.9/gatewarden", &b)]);
    // The name says nothing: the format is told by its bytes.
    let path = r.dir.path().join("rel/release.bin");
    std::fs::write(&path, &archive).unwrap();
    let sha = sha256_hex(&archive);
    let out = r.update(&["--from", path.to_str().unwrap(), "--sha256", &sha, "--timeout", "20", "--json"]);
    assert_cli(&out, 0, "update from a .tar.gz");
    // Under --json stdout is the one outcome document; progress goes to stderr.
    assert!(out.stderr.contains(&format!("updated {} → 9.9.9", r.version)), "{out:#?}");
    let v = out.json();
    assert_eq!((&v["ok"], &v["update"]["phase"]), (&json!(true), &json!("committed")), "{out:#?}");
    let t = r.txn();
    assert_eq!(t["phase"], json!("committed"), "{t}");
    // update.json keeps the executable's hash (what tells the new file on disk), not the archive's.
    assert_eq!(t["to_sha256"], json!(sha256_hex(&b)), "{t}");
    assert_eq!(std::fs::read(t["staged"].as_str().unwrap()).unwrap(), b, "the staged file is the member");
    r.assert_one_gateway("9.9.9");
    assert_ne!(current_gateway(r.home.path()).unwrap().0, g.pid(), "a new incarnation runs");

    let back = r.update(&["--rollback", "--json"]);
    assert_cli(&back, 0, "update --rollback");
    let v = back.json();
    assert_eq!((&v["ok"], &v["update"]["phase"]), (&json!(true), &json!("rolled_back")), "{back:#?}");
    r.assert_one_gateway(&r.version);
    // Nothing left to roll back: refused, still as one JSON document.
    let again = r.update(&["--rollback", "--json"]);
    assert_cli(&again, 1, "a second --rollback");
    assert_eq!((&again.json()["ok"], &again.json()["changed"]), (&json!(false), &json!(false)), "{again:#?}");
}

/// Hostile, ambiguous or broken archives are refused before anything changes.
#[test]
fn bad_archives_change_nothing() {
    let (r, mut g) = rig("");
    let b = std::fs::read(r.release("9.9.9")).unwrap();
    let good = tar_gz(&[("gatewarden", &b)]);
    let mut corrupt = good.clone();
    let mid = corrupt.len() / 2;
    corrupt[mid] ^= 0xff;
    let cases: [(&str, Vec<u8>, &str); 5] = [
        ("traversal", tar_gz(&[("../../bin/gatewarden", &b)]), "path traversal"),
        ("two", tar_gz(&[("a/gatewarden", &b), ("b/gatewarden", &b)]), "two executables"),
        ("none", tar_gz(&[("README.md", b"hello\n")]), "no executable named gatewarden"),
        ("corrupt", corrupt, "not a valid .tar.gz"),
        ("zip", b"PK\x03\x04 not really a zip".to_vec(), "is a zip archive"),
    ];
    for (name, bytes, why) in cases {
        let path = r.dir.path().join(format!("rel/{name}.tar.gz"));
        std::fs::write(&path, &bytes).unwrap();
        let out = r.update(&["--from", path.to_str().unwrap(), "--sha256", &sha256_hex(&bytes), "--json"]);
        assert_refused_unchanged(&r, &mut g, &out, why);
        let v = out.json();
        assert_eq!((&v["ok"], &v["changed"]), (&json!(false), &json!(false)), "{name}: {out:#?}");
        assert!(v["reason"].as_str().is_some_and(|r| r.contains(why)), "{name}: {v}");
    }
}

mod telegram {
    //! Chat `/update` from a chat platform (the in-repo fake Bot API, crates/telegram-fake):
    //! the per-platform admins decide, and the one outcome notice reaches the asking chat
    //! through the outbox.
    use super::*;
    use gatewarden_telegram_fake::{FakeTelegram, Options, SentMessage};

    const TOKEN_ENV: &str = "GW_TEST_TELEGRAM_TOKEN";
    const ADMIN: i64 = 42;
    const REPLY: Duration = Duration::from_secs(15);

    /// A gateway with a Telegram adapter whose admin is [`ADMIN`] (and no global `admins`),
    /// installing `source(rig)` on `/update`.
    fn tg_rig(source: impl FnOnce(&Rig) -> PathBuf) -> (Rig, Gateway, FakeTelegram, String) {
        let fake = FakeTelegram::start(Options { linger: Duration::from_millis(800), ..Options::default() })
            .expect("fake Bot API");
        // One credential per test (the credential lock is keyed by the token).
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tok = format!("{}{n:04}:tok-update-{}", std::process::id(), std::process::id());
        let creds = std::env::temp_dir().join(format!("gw-creds-update-{}", std::process::id()));
        let base = fake.base_url();
        let (r, g) = rig_then(
            |r| {
                format!(
                    "[[platform]]\nkind = \"telegram\"\naccess = \"open\"\nrequire_mention = false\ntoken_env = \"{TOKEN_ENV}\"\napi_base = \"{base}\"\n\
                     admins = [\"{ADMIN}\"]\npoll_timeout_s = 2\n[update]\nprobation_s = 1\nsource = \"{}\"\n",
                    source(r).display()
                )
            },
            &[(TOKEN_ENV, &tok), ("GATEWARDEN_CREDS_DIR", creds.to_str().unwrap())],
        );
        (r, g, fake, tok)
    }

    fn in_chat(sent: &[SentMessage], chat: i64, pred: impl Fn(&str) -> bool) -> Vec<String> {
        sent.iter().filter(|m| m.chat_id == json!(chat) && pred(&m.text)).map(|m| m.text.clone()).collect()
    }

    #[track_caller]
    fn wait_reply(fake: &FakeTelegram, tok: &str, chat: i64, pred: impl Fn(&str) -> bool) -> String {
        let got = fake.wait_sent(tok, REPLY, |s| !in_chat(s, chat, &pred).is_empty());
        let sent = got.unwrap_or_else(|s| panic!("no matching message in chat {chat} within {REPLY:?}: {s:#?}"));
        in_chat(&sent, chat, &pred).pop().unwrap_or_default()
    }

    /// The outcome notices (`updated …` / `update to … failed`) in `chat`: exactly one, and no
    /// second one follows within a few relay polls.
    #[track_caller]
    fn one_outcome_notice(fake: &FakeTelegram, tok: &str, chat: i64) -> String {
        let outcome = |t: &str| t.starts_with("updated ") || t.starts_with("update to ");
        let first = wait_reply(fake, tok, chat, outcome);
        let more = fake.wait_sent(tok, Duration::from_secs(2), |s| in_chat(s, chat, outcome).len() > 1);
        assert!(more.is_err(), "a second outcome notice in chat {chat}: {more:#?}");
        first
    }

    /// A non-admin's `/update` is refused and changes nothing; the platform admin's (not in
    /// the global `admins`) installs the new build, and that chat gets exactly one notice.
    #[test]
    fn telegram_admin_updates_and_others_are_refused() {
        let (r, mut g, fake, tok) = tg_rig(|r| r.release("9.9.9"));
        fake.inject(&tok, 8, 99, "/update");
        let no = wait_reply(&fake, &tok, 8, |t| t.contains("admins"));
        assert!(no.starts_with("/update is for this platform's admins"), "{no}");
        fake.inject(&tok, 8, 99, "/status");
        wait_reply(&fake, &tok, 8, |t| t.contains("incarnation"));
        assert!(g.alive(), "a refused /update must not restart");
        assert_eq!(r.txn(), Value::Null, "no transaction");
        assert!(r.home.events("update_requested").is_empty(), "{}", r.home.ledger_text());

        fake.inject(&tok, 7, ADMIN, "/update");
        let ack = wait_reply(&fake, &tok, 7, |t| t.starts_with("updating from"));
        assert!(ack.contains("gatewarden-9.9.9"), "{ack}");
        let notice = one_outcome_notice(&fake, &tok, 7);
        assert!(notice.starts_with(&format!("updated {} → 9.9.9 (incarnation ", r.version)), "{notice}");
        assert_eq!(r.txn()["phase"], json!("committed"), "{}", r.txn());
        assert_eq!(r.txn()["platform"], json!("telegram"), "{}", r.txn());
        r.assert_one_gateway("9.9.9");
        let inc = current_gateway(r.home.path()).unwrap().1;
        assert!(notice.contains(&inc), "the notice names the running incarnation {inc}: {notice}");
        assert!(in_chat(&fake.sent(&tok), 8, |t| t.contains("updated")).is_empty(), "only the asking chat");
        // The new incarnation answers in the same chat.
        fake.inject(&tok, 7, ADMIN, "/status");
        assert!(wait_reply(&fake, &tok, 7, |t| t.starts_with("gatewarden 9.9.9")).contains("running"));
    }

    /// A candidate that cannot start: exactly one failure notice in the asking chat, and the
    /// old version runs again.
    #[test]
    fn telegram_update_to_a_failing_candidate_says_so_once() {
        let (r, _g, fake, tok) = tg_rig(|r| r.script("exit1", "9.9.9", "exit 1"));
        fake.inject(&tok, 7, ADMIN, "/update");
        wait_reply(&fake, &tok, 7, |t| t.starts_with("updating from"));
        let notice = one_outcome_notice(&fake, &tok, 7);
        assert!(notice.starts_with("update to 9.9.9 failed: "), "{notice}");
        assert!(notice.ends_with(&format!("still on {}", r.version)), "{notice}");
        assert_eq!(r.txn()["phase"], json!("rolled_back"), "{}", r.txn());
        r.assert_one_gateway(&r.version);
    }
}

/// Issue 21, cancel drain: an update's restart whose drain is cancelled is not a new version
/// that failed; the update puts the old binary back, says the restart was cancelled, and does
/// not drain again (the old version never stopped running).
#[test]
fn a_cancelled_drain_rolls_the_update_back_without_a_second_restart() {
    let r = Rig::installed();
    let gate = r.home.scratch("gate", "");
    write_config(r.home.path(), &format!("{}[update]\nprobation_s = 1\n", gated_exec(&gate)));
    let mut g = GatewayBuilder::new(&r.exe, &r.home).env(TAG_VAR, r.sw.tag()).spawn();
    g.wait_ready(READY);
    let inc = incarnation_of(&r.home, g.pid()).expect("incarnation");
    let run = send_bg(g.listen(), "c", "waited on");
    wait_active(g.listen(), 1);
    let b = r.release("9.9.9");
    let (exe, home, tag, src) = (r.exe.clone(), r.home.path().to_path_buf(), r.sw.tag().to_owned(), b.clone());
    let update = std::thread::spawn(move || {
        let args = ["update", "--from", src.to_str().unwrap(), "--timeout", "60"];
        cli_with(&exe, &home, &args, &[(TAG_VAR, tag.as_str())], UPDATE_LIMIT)
    });
    cancel_keeps(&r.home, &inc, |a| cli_with(&r.exe, r.home.path(), a, &[(TAG_VAR, r.sw.tag())], UPDATE_LIMIT));
    let out = update.join().unwrap();
    assert_cli(&out, 1, "the update whose restart was cancelled");
    let said = out.text_lc();
    assert!(said.contains("the restart was cancelled") && said.contains("never stopped running"), "{out:#?}");
    assert_eq!(r.txn()["phase"], json!("rolled_back"), "{}", r.txn());
    assert_eq!(version_of(&r.exe), r.version, "the old binary is back in place");
    assert_eq!(r.home.events("restart_requested").len(), 1, "one restart, cancelled:\n{}", r.home.ledger_text());
    assert!(r.home.events("drained").is_empty(), "no drain ran to its end:\n{}", r.home.ledger_text());
    std::fs::write(&gate, b"").unwrap();
    assert_eq!(run.join().unwrap().0.expect("an answer").status, 200);
    r.assert_one_gateway(&r.version);
    assert_eq!(current_gateway(r.home.path()).unwrap().0, g.pid(), "the same process runs");
}

/// Issue 30, item 5: an update ends only processes it started itself. A `restart` asked during
/// the update's probation makes the candidate spawn a successor (it waits while the candidate
/// drains a held run); the probation fails and the update rolls back, ending what it started
/// — never that successor, which takes over once the run ends, and the restart succeeds.
/// (Before: the rollback killed it, as `update_killed_candidate` or `update_ended_candidates`.)
#[test]
fn an_update_never_ends_the_successor_of_a_concurrent_restart() {
    let (r, _g) = rig("");
    let gate = r.home.scratch("gate", "");
    write_config(r.home.path(), &format!("{}\n[update]\nprobation_s = 8\n", gated_exec(&gate)));
    let b = r.release("9.9.9");
    let (exe, home, tag) = (r.exe.clone(), r.home.path().to_path_buf(), r.sw.tag().to_owned());
    let from = b.to_str().unwrap().to_owned();
    let update = std::thread::spawn(move || {
        cli_with(&exe, &home, &["update", "--from", &from, "--timeout", "60"], &[(TAG_VAR, tag.as_str())], UPDATE_LIMIT)
    });
    must_wait_until(Duration::from_secs(30), "the update's probation", || r.txn()["phase"] == json!("probation"));
    let (candidate, _, _, addr) = current_gateway(r.home.path()).expect("the candidate");
    Api::new(addr.expect("its address")).submit("held", "held run");
    wait_active(addr.unwrap(), 1);
    let (exe, home, tag) = (r.exe.clone(), r.home.path().to_path_buf(), r.sw.tag().to_owned());
    let restart = std::thread::spawn(move || {
        cli_with(&exe, &home, &["restart", "--timeout", "60"], &[(TAG_VAR, tag.as_str())], UPDATE_LIMIT)
    });
    let successor = wait_events(&r.home, "successor_started", 2, Duration::from_secs(20))
        .iter()
        .find(|e| e["pid"] == json!(candidate))
        .and_then(|e| e["successor_pid"].as_u64())
        .expect("the candidate's successor") as u32;
    // The rollback has ended what it started once the old binary is back in place.
    must_wait_until(Duration::from_secs(30), "the old binary back", || version_of(&r.exe) == r.version);
    let alive = pid_alive(successor);
    std::fs::write(&gate, b"").unwrap();
    let (update, restart) = (update.join().unwrap(), restart.join().unwrap());
    let ledger = r.home.ledger_text();
    assert!(alive, "the rollback ended the successor {successor} of the concurrent restart:\n{ledger}");
    for e in r.home.events("update_ended_candidates").iter().chain(r.home.events("update_killed_candidate").iter()) {
        assert!(
            e["pid"] != json!(successor) && !e["pids"].as_array().is_some_and(|p| p.contains(&json!(successor))),
            "{e}"
        );
    }
    assert!(r.home.events("ready").iter().any(|e| e["pid"] == json!(successor)), "{ledger}");
    assert_cli(&restart, 0, "the concurrent restart");
    assert_cli(&update, 1, "the update whose probation a restart interrupted");
    assert_eq!(r.txn()["phase"], json!("rolled_back"), "{}", r.txn());
    assert_cli(&cli_with(&r.exe, r.home.path(), &["stop"], &[(TAG_VAR, r.sw.tag())], UPDATE_LIMIT), 0, "stop");
}
