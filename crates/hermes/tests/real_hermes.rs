//! gatewarden-hermes against the real hermes-agent 0.19.0 (scripts/hermes-venv).
//!
//! Each test runs real `hermes gateway run` processes in a hermetic temp home (see
//! `common`). hermes needs ~2.5 s to become ready here, so the tests keep starts few.
#![cfg(target_os = "linux")]

mod common;

use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{Lab, must, send, snapshot, wait_exit};
use gatewarden_hermes::doctor::{self, Context};
use gatewarden_hermes::files;
use gatewarden_hermes::history;
use gatewarden_hermes::policy::ParkKind;
use gatewarden_hermes::restart::{self, RestartOptions, RestartPath};
use gatewarden_hermes::start::Mode;
use gatewarden_hermes::status::{Phase, status};
use gatewarden_hermes::stop::{self, StopOptions, StopOutcome, StopPath};
use gatewarden_hermes::supervise::{End, Event, Supervise};
use gatewarden_lifecycle::platform;
use gatewarden_service::supervise::SupervisePolicy;

const READY: Duration = Duration::from_secs(40);

/// Starts hermes and polls `status` every 10 ms until it reports the new process running.
/// Returns the child and the status timings (ms).
fn start_polled(lab: &Lab) -> (std::process::Child, Vec<f64>) {
    let mut child = lab.spawn();
    let pid = child.id();
    let mut timings = Vec::new();
    must(READY, Duration::from_millis(10), "status to report the new hermes running", || {
        if let Some(st) = child.try_wait().expect("try_wait") {
            panic!("hermes start failed while status polled: {st}; see {}", lab.home.stdio_log().display());
        }
        let s = status(&lab.home);
        timings.push(s.elapsed_ms);
        assert_ne!(s.phase, Phase::Unknown, "{:?}", s.notes);
        s.phase == Phase::Running && s.pid == Some(pid)
    });
    (child, timings)
}

fn lock_inode(lab: &Lab) -> u64 {
    std::fs::metadata(lab.home.lock()).expect("gateway.lock exists").ino()
}

fn cycles(n: usize) {
    let Some(lab) = Lab::new() else { return };
    let mut timings = Vec::new();
    for i in 0..n {
        let t0 = Instant::now();
        let (mut child, t) = start_polled(&lab);
        timings.extend(t);
        let ready_s = t0.elapsed().as_secs_f64();
        // The lock file is never replaced by a stop (a new inode would let two gateways lock
        // two files). hermes itself unlinks a free lock file when it starts, so compare
        // around the stop only.
        let ino = lock_inode(&lab);
        let out = stop::stop(&lab.home, &StopOptions::default()).expect("stop");
        let StopOutcome::Stopped(r) = out else { panic!("cycle {i}: stop found nothing running") };
        let exit = wait_exit(&mut child, Duration::from_secs(10));
        eprintln!("cycle {i}: ready {ready_s:.2} s, stop {:?} in {} ms, {exit}", r.path, r.elapsed_ms);
        assert_eq!(r.pid, child.id());
        assert_eq!(exit.code(), Some(0), "cycle {i}: a planned stop must exit 0 ({:?})", r.path);
        assert_eq!(r.gateway_state_after.as_deref(), Some("stopped"), "cycle {i}");
        assert!(r.planned());
        // hermes was serving, so its watcher took the marker: no signal raced it.
        assert_eq!(r.path, StopPath::Marker, "cycle {i}");
        assert_eq!(lock_inode(&lab), ino, "cycle {i}: gateway.lock was replaced");
        assert!(lab.home.state_file().exists());
        let after = status(&lab.home);
        assert_eq!((after.phase, after.exit_code()), (Phase::NotRunning, 3));
        assert_eq!(after.last_state.as_deref(), Some("stopped"));
    }
    timings.sort_by(f64::total_cmp);
    let median = timings[timings.len() / 2];
    let p95 = timings[timings.len() * 95 / 100];
    eprintln!(
        "{} status calls: median {median:.2} ms, p95 {p95:.2} ms, max {:.2} ms",
        timings.len(),
        timings[timings.len() - 1]
    );
    assert!(median < 50.0 && p95 < 50.0, "status must answer in < 50 ms (median {median:.2}, p95 {p95:.2})");
}

/// Status polled every 10 ms never makes a starting hermes fail (a lock probe would: hermes
/// tries its lock once), and the marker-first stop exits 0 every time (regression guard for
/// the watcher/SIGTERM race). 20 starts and 20 stops, in four tests of five so that each
/// stays within the per-test timeout on a loaded machine and they run side by side.
#[test]
fn starts_polled_every_10ms_and_planned_stops_1_of_4() {
    cycles(5);
}

#[test]
fn starts_polled_every_10ms_and_planned_stops_2_of_4() {
    cycles(5);
}

#[test]
fn starts_polled_every_10ms_and_planned_stops_3_of_4() {
    cycles(5);
}

#[test]
fn starts_polled_every_10ms_and_planned_stops_4_of_4() {
    cycles(5);
}

/// A SIGSTOPped hermes neither sees the marker nor handles SIGTERM: stop escalates to a
/// verified SIGKILL after the timeout and hits nothing else.
#[test]
fn stop_of_a_sigstopped_hermes_escalates_to_a_verified_kill() {
    let Some(lab) = Lab::new() else { return };
    let (mut child, _) = start_polled(&lab);
    let mut bystander = std::process::Command::new("sleep").arg("60").spawn().expect("sleep");
    send(child.id(), libc::SIGSTOP);
    let opts = StopOptions {
        timeout: Duration::from_secs(3),
        watcher_grace: Duration::from_millis(700),
        ..StopOptions::default()
    };
    let t0 = Instant::now();
    let StopOutcome::Stopped(r) = stop::stop(&lab.home, &opts).expect("stop") else { panic!("nothing running") };
    assert_eq!(r.path, StopPath::Killed);
    assert!(t0.elapsed() >= Duration::from_secs(3), "killed before the timeout");
    let st = wait_exit(&mut child, Duration::from_secs(5));
    assert_eq!(common_signal(st), Some(libc::SIGKILL));
    assert!(bystander.try_wait().expect("try_wait").is_none(), "a bystander was signalled");
    let _ = bystander.kill();
    let _ = bystander.wait();
    // hermes had no chance to record the stop; we leave its state file alone.
    assert_eq!(files::read_state(&lab.home).ok().and_then(|s| s.gateway_state).as_deref(), Some("running"));
    let ledger = std::fs::read_to_string(lab.home.actions_ledger()).expect("ledger");
    assert!(ledger.contains("\"stop.kill\""), "{ledger}");
}

fn common_signal(st: std::process::ExitStatus) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt;
    st.signal()
}

/// Stop while hermes holds the lock but has not reported `running`: marker + SIGTERM at once,
/// and hermes exits 0 with `stopped` (a bare SIGTERM there leaves a stale `running`).
#[test]
fn stop_during_startup_is_a_planned_stop() {
    let Some(lab) = Lab::new() else { return };
    let mut child = lab.spawn();
    let pid = child.id();
    must(READY, Duration::from_millis(2), "hermes to take its lock", || {
        assert!(child.try_wait().expect("try_wait").is_none(), "hermes exited during start-up");
        status(&lab.home).pid == Some(pid)
    });
    let phase = status(&lab.home).phase;
    let StopOutcome::Stopped(r) = stop::stop(&lab.home, &StopOptions::default()).expect("stop") else {
        panic!("nothing running")
    };
    let st = wait_exit(&mut child, Duration::from_secs(10));
    eprintln!("stopped in phase {phase:?} by {:?}: {st}", r.path);
    assert_eq!(st.code(), Some(0));
    assert_eq!(r.gateway_state_after.as_deref(), Some("stopped"));
    if phase == Phase::Starting {
        assert_eq!(r.path, StopPath::MarkerAndSigterm);
    }
}

/// status on a live hermes matches /proc, reports hermes's fields; after SIGKILL it reports
/// the last known state, and status/doctor/history change nothing in hermes's home.
#[test]
fn status_is_truthful_and_read_only_verbs_change_nothing() {
    let Some(lab) = Lab::new() else { return };
    let (mut child, _) = start_polled(&lab);
    let pid = child.id();
    let s = status(&lab.home);
    assert_eq!((s.running, s.exit_code(), s.pid), (true, 0, Some(pid)));
    assert_eq!(s.start_time, platform::start_time(pid));
    assert_eq!((s.kind, s.gateway_state.as_deref(), s.active_agents), ("hermes-gateway", Some("running"), Some(0)));
    assert_eq!(s.supervisor.as_deref(), Some("none"));
    assert!(s.hermes_units.is_empty());
    assert!(s.elapsed_ms < 50.0, "{} ms", s.elapsed_ms);
    let text = gatewarden_hermes::status::render_text(&s);
    assert!(text.contains(&format!("running, pid {pid}")), "{text}");

    send(pid, libc::SIGKILL);
    wait_exit(&mut child, Duration::from_secs(5));
    let before = snapshot(lab.home.dir());
    let lock_bytes = std::fs::read(lab.home.lock()).expect("lock");
    let state_bytes = std::fs::read(lab.home.state_file()).expect("state");
    let ctx = Context { scoped_lock_dir: Some(lab.scoped_lock_dir()), ..Context::default() };
    for _ in 0..20 {
        let s = status(&lab.home);
        assert_eq!((s.phase, s.exit_code()), (Phase::NotRunning, 3));
        assert_eq!(s.last_state.as_deref(), Some("running"));
        let found = doctor::doctor(&lab.home, &ctx);
        assert!(found.iter().any(|f| f.code == doctor::Code::StaleRunningState), "{found:?}");
        assert!(!history::history(&lab.home, 50).is_empty());
    }
    assert_eq!(snapshot(lab.home.dir()), before, "a read-only verb changed hermes's home");
    assert_eq!(std::fs::read(lab.home.lock()).expect("lock"), lock_bytes);
    assert_eq!(std::fs::read(lab.home.state_file()).expect("state"), state_bytes);
    assert!(lab.home.pid_file().exists(), "the stale gateway.pid is hermes's to replace, not ours to delete");
}

/// Unsupervised, restart never sends SIGUSR1 (hermes would exit 75 and stay down): it stops
/// (exit 0) and starts a new, verified process.
#[test]
fn restart_of_an_unsupervised_hermes_is_stop_then_start() {
    let Some(lab) = Lab::new() else { return };
    let (mut old_child, _) = start_polled(&lab);
    let old = status(&lab.home).identity().expect("identity");
    let r = restart::restart(&lab.home, &RestartOptions::default(), Some(lab.hermes.clone()), |l| {
        lab.command_for(l, Mode::Detached)
    })
    .expect("restart");
    let mut new_child = r.child.expect("we started the new one");
    lab.track(new_child.id());
    assert_eq!(r.path, RestartPath::StopStart);
    assert_eq!(r.old, Some(old));
    assert_ne!(r.new, old);
    assert_eq!(wait_exit(&mut old_child, Duration::from_secs(5)).code(), Some(0), "the old one got a planned stop");
    let s = status(&lab.home);
    assert_eq!((s.phase, s.identity()), (Phase::Running, Some(r.new)));
    stop::stop(&lab.home, &StopOptions::default()).expect("stop");
    assert_eq!(wait_exit(&mut new_child, Duration::from_secs(10)).code(), Some(0));
}

fn supervisor(lab: &Lab) -> Supervise {
    let root = lab.dir.path().to_path_buf();
    let (home, hermes) = (lab.home.clone(), lab.hermes.clone());
    Supervise {
        home: lab.home.clone(),
        command: Box::new(move || {
            let mut cmd = gatewarden_hermes::start::command(&home, &hermes, Mode::Supervised);
            common::hermetic(&mut cmd, &root);
            cmd
        }),
        policy: SupervisePolicy::default(),
        stop: StopOptions::default(),
    }
}

/// Under our supervisor, restart is SIGUSR1 → exit 75 → immediate respawn, verified as a new
/// ready process; a stop request then ends in a planned exit 0 and supervise stays down.
#[test]
fn restart_under_supervise_uses_sigusr1_and_is_revived_at_once() {
    let Some(lab) = Lab::new() else { return };
    let sup = supervisor(&lab);
    let stop_flag = AtomicBool::new(false);
    let events = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        let run = s.spawn(|| {
            sup.run(&stop_flag, |e| {
                if let Event::Spawned { pid } = e {
                    lab.track(*pid);
                }
                events.lock().unwrap_or_else(|e| e.into_inner()).push(e.clone());
            })
        });
        let _end_on_panic = common::SetOnDrop(&stop_flag);
        must(READY, Duration::from_millis(10), "the supervised hermes to be ready", || {
            status(&lab.home).phase == Phase::Running
        });
        let s0 = status(&lab.home);
        assert!(s0.supervisor.as_deref().is_some_and(|l| l.starts_with("gatewarden")), "{:?}", s0.supervisor);
        let t0 = Instant::now();
        let r = restart::restart(&lab.home, &RestartOptions::default(), None, |_| {
            panic!("must not start a detached hermes")
        })
        .expect("restart");
        eprintln!("supervised restart in {:.2} s", t0.elapsed().as_secs_f64());
        assert_eq!(r.path, RestartPath::Sigusr1);
        assert_ne!(Some(r.new), s0.identity());
        stop_flag.store(true, Ordering::SeqCst);
        let end = run.join().expect("supervise thread").expect("supervise");
        assert_eq!(end, End::StayedDown);
    });
    let events = events.into_inner().unwrap_or_else(|e| e.into_inner());
    let exits: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::Exited { facts, .. } => Some(facts.exit),
            _ => None,
        })
        .collect();
    use gatewarden_service::supervise::ChildExit;
    assert_eq!(exits, [ChildExit::Code(75), ChildExit::Code(0)], "{events:?}");
    assert!(!lab.home.restart_pending().exists(), "the new hermes consumes .restart_pending.json");
}

/// A fatal configuration hermes exits 0 for (`startup_failed`) parks with hermes's reason
/// instead of restarting it forever.
#[test]
fn supervise_parks_a_startup_failed_hermes_with_its_reason() {
    let Some(lab) = Lab::new() else { return };
    let mut sup = supervisor(&lab);
    let (home, hermes, root) = (lab.home.clone(), lab.hermes.clone(), lab.dir.path().to_path_buf());
    sup.command = Box::new(move || {
        let mut cmd = gatewarden_hermes::start::command(&home, &hermes, Mode::Supervised);
        common::hermetic(&mut cmd, &root);
        cmd.env("WHATSAPP_ENABLED", "true").env("WHATSAPP_DM_POLICY", "open");
        cmd
    });
    let mut spawned = 0;
    let end = sup
        .run(&AtomicBool::new(false), |e| {
            if let Event::Spawned { pid } = e {
                spawned += 1;
                lab.track(*pid);
            }
        })
        .expect("supervise");
    let End::Parked { kind, reason } = end else { panic!("expected a park, got {end:?}") };
    assert_eq!(kind, ParkKind::StartupFailed);
    assert!(reason.contains("open policy"), "{reason}");
    assert_eq!(spawned, 1, "no respawn loop");
    let parked = std::fs::read_to_string(lab.home.parked_state()).expect("parked state");
    assert!(parked.contains("startup-failed"), "{parked}");
}

/// When another hermes owns the home, the supervised child exits 1 and supervise parks
/// "owned by pid N" instead of looping; the owner is left running.
#[test]
fn supervise_parks_when_another_hermes_owns_the_home() {
    let Some(lab) = Lab::new() else { return };
    let (mut owner, _) = start_polled(&lab);
    let sup = supervisor(&lab);
    let mut spawned = 0;
    let end = sup
        .run(&AtomicBool::new(false), |e| {
            if let Event::Spawned { pid } = e {
                spawned += 1;
                lab.track(*pid);
            }
        })
        .expect("supervise");
    let End::Parked { kind, reason } = end else { panic!("expected a park, got {end:?}") };
    assert_eq!(kind, ParkKind::OwnedByOther);
    assert!(reason.contains(&format!("pid {}", owner.id())), "{reason}");
    assert_eq!(spawned, 1);
    assert!(owner.try_wait().expect("try_wait").is_none(), "the owner must keep running");
    assert_eq!(status(&lab.home).pid, Some(owner.id()));
    stop::stop(&lab.home, &StopOptions::default()).expect("stop");
    assert_eq!(wait_exit(&mut owner, Duration::from_secs(10)).code(), Some(0));
}

/// `hermes gateway stop`/`status` unlink a free `gateway.lock`; if that races a start, a
/// gateway runs with its lock file gone. status still finds it (by its verified record),
/// doctor names the hazard, and stop still stops it cleanly.
#[test]
fn a_hermes_whose_lock_file_was_unlinked_is_still_seen_and_stopped() {
    let Some(lab) = Lab::new() else { return };
    let (mut child, _) = start_polled(&lab);
    std::fs::remove_file(lab.home.lock()).expect("simulate the foreign unlink");
    let s = status(&lab.home);
    assert_eq!((s.phase, s.pid), (Phase::Running, Some(child.id())));
    assert!(s.notes.iter().any(|n| n.contains("gateway.lock is missing")), "{:?}", s.notes);
    let ctx = Context::discover(&lab.home);
    assert_eq!(ctx.hermes_pids, vec![child.id()]);
    let found = doctor::doctor(&lab.home, &ctx);
    assert!(found.iter().any(|f| f.code == doctor::Code::MissingLockFile), "{found:?}");
    let StopOutcome::Stopped(r) = stop::stop(&lab.home, &StopOptions::default()).expect("stop") else {
        panic!("stop must still find it")
    };
    assert_eq!(wait_exit(&mut child, Duration::from_secs(10)).code(), Some(0));
    assert_eq!(r.gateway_state_after.as_deref(), Some("stopped"));
    assert!(!lab.home.lock().exists(), "we never recreate hermes's lock file either");
}
