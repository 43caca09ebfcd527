//! The supervise loop's crash-loop brake with real (non-hermes) children that exit 1 at once:
//! it restarts with growing backoff, then every restart waits the cap; it never gives up.
#![cfg(unix)]

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use gatewarden_hermes::HermesHome;
use gatewarden_hermes::policy::{HermesAction, ParkKind};
use gatewarden_hermes::stop::StopOptions;
use gatewarden_hermes::supervise::{End, Event, Supervise};
use gatewarden_service::supervise::{ChildExit, SupervisePolicy};

#[test]
fn fast_crashes_are_braked_never_parked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = HermesHome::at(dir.path());
    // A 2 s cap keeps the test short; the default is 30 s.
    let policy = SupervisePolicy { max_backoff: Duration::from_secs(2), ..SupervisePolicy::default() };
    let sup = Supervise {
        home: home.clone(),
        command: Box::new(|| Command::new("false")),
        policy,
        stop: StopOptions::default(),
    };
    let stop = AtomicBool::new(false);
    let mut exits = Vec::new();
    let t0 = Instant::now();
    let end = sup
        .run(&stop, |e| {
            if let Event::Exited { facts, action, .. } = e {
                exits.push((facts.exit, action.clone()));
                // The operator's stop, during the eighth backoff.
                if exits.len() == 8 {
                    stop.store(true, Ordering::SeqCst);
                }
            }
        })
        .expect("supervise");
    assert!(matches!(end, End::StayedDown), "a crash loop ended the supervision: {end:?}");
    assert!(exits.iter().all(|(e, _)| *e == ChildExit::Code(1)));
    assert!(!exits.iter().any(|(_, a)| matches!(a, HermesAction::Park { .. })), "{exits:?}");
    let backoffs: Vec<u64> = exits
        .iter()
        .filter_map(|(_, a)| match a {
            HermesAction::Restart { backoff_ms } => Some(*backoff_ms),
            _ => None,
        })
        .collect();
    assert_eq!(backoffs, [100, 200, 400, 800, 1600, 2000, 2000, 2000]);
    assert!(t0.elapsed() >= Duration::from_millis(7100), "backoff was not applied");
    assert!(!home.parked_state().exists(), "parked");
    // Nothing of hermes's was created by us: only our folder.
    let names: Vec<_> = std::fs::read_dir(dir.path()).expect("ls").flatten().map(|e| e.file_name()).collect();
    assert!(names.iter().all(|n| n == "gatewarden"), "{names:?}");
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
