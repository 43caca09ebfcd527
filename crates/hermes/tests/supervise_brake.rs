//! The supervise loop's crash-loop brake with real (non-hermes) children that exit 1 at once:
//! it restarts with growing backoff, then parks instead of spinning.
#![cfg(unix)]

use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use gatewarden_hermes::HermesHome;
use gatewarden_hermes::policy::{HermesAction, ParkKind};
use gatewarden_hermes::stop::StopOptions;
use gatewarden_hermes::supervise::{End, Event, Supervise};
use gatewarden_service::supervise::{ChildExit, SupervisePolicy};

#[test]
fn six_fast_crashes_trip_the_brake_and_park() {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = HermesHome::at(dir.path());
    let sup = Supervise {
        home: home.clone(),
        command: Box::new(|| Command::new("false")),
        policy: SupervisePolicy::default(),
        stop: StopOptions::default(),
    };
    let mut exits = Vec::new();
    let t0 = Instant::now();
    let end = sup
        .run(&AtomicBool::new(false), |e| {
            if let Event::Exited { facts, action, .. } = e {
                exits.push((facts.exit, action.clone()));
            }
        })
        .expect("supervise");
    let End::Parked { kind, reason } = end else { panic!("expected a park, got {end:?}") };
    assert_eq!(kind, ParkKind::CrashLoop, "{reason}");
    assert_eq!(exits.len(), 6, "{exits:?}");
    assert!(exits.iter().all(|(e, _)| *e == ChildExit::Code(1)));
    let backoffs: Vec<u64> = exits
        .iter()
        .filter_map(|(_, a)| match a {
            HermesAction::Restart { backoff_ms } => Some(*backoff_ms),
            _ => None,
        })
        .collect();
    assert_eq!(backoffs, [100, 200, 400, 800, 1600]);
    assert!(t0.elapsed() >= Duration::from_millis(3100), "backoff was not applied");
    let parked = std::fs::read_to_string(home.parked_state()).expect("parked state");
    assert!(parked.contains("crash-loop"), "{parked}");
    // Nothing of hermes's was created by us: only our folder.
    let names: Vec<_> = std::fs::read_dir(dir.path()).expect("ls").flatten().map(|e| e.file_name()).collect();
    assert_eq!(names, ["gatewarden"]);
}

/// What a child leaves in its process group (hermes's shutdown-diag helper, tool
/// subprocesses) is killed when the child exits, before it is reaped.
#[test]
fn leftovers_in_the_childs_group_die_with_it() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let home = HermesHome::at(dir.path().join("home"));
    std::fs::create_dir_all(home.dir()).expect("mkdir");
    let pidfile = dir.path().join("leftover.pid");
    let script = format!("sleep 300 & echo $! > '{}'; exit 78", pidfile.display());
    let sup = Supervise {
        home: home.clone(),
        command: Box::new(move || {
            let mut c = Command::new("sh");
            c.arg("-c").arg(&script).process_group(0);
            c
        }),
        policy: SupervisePolicy::default(),
        stop: StopOptions::default(),
    };
    let end = sup.run(&AtomicBool::new(false), |_| {}).expect("supervise");
    assert!(matches!(end, End::Parked { kind: ParkKind::FatalConfig, .. }), "{end:?}");
    let pid: u32 = std::fs::read_to_string(&pidfile).expect("pid file").trim().parse().expect("pid");
    let deadline = Instant::now() + Duration::from_secs(5);
    while gatewarden_lifecycle::probe::probe_u32(pid).is_alive() {
        assert!(Instant::now() < deadline, "the leftover sleep {pid} survived its group");
        std::thread::sleep(Duration::from_millis(10));
    }
}
