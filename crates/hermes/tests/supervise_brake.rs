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
