use std::time::Duration;

use gatewarden_service::supervise::{Action, ChildExit, RestartHistory, SupervisePolicy};
use gatewarden_service::systemd;
use proptest::prelude::*;

fn exit() -> impl Strategy<Value = ChildExit> {
    prop_oneof![
        any::<i32>().prop_map(ChildExit::Code),
        prop_oneof![Just(0), Just(1), Just(75), Just(78)].prop_map(ChildExit::Code),
        any::<i32>().prop_map(ChildExit::Signal),
        Just(ChildExit::Unknown),
    ]
}

proptest! {
    /// decide never panics, backoff never exceeds the cap, a crash never parks, and the brake
    /// holds: past `brake_max_restarts` restarts inside one window, a crash waits the cap.
    #[test]
    fn supervise_policy_is_total_and_bounded(
        steps in proptest::collection::vec((exit(), 0u64..120_000), 1..60),
    ) {
        let p = SupervisePolicy::default();
        let mut now = Duration::ZERO;
        let mut h = RestartHistory::new(now);
        let mut restart_times: Vec<Duration> = Vec::new();
        for (e, gap_ms) in steps {
            now += Duration::from_millis(gap_ms);
            let braked = h.restarts_within(p.brake_window, now) >= p.brake_max_restarts;
            match p.decide(e, &h, now) {
                Action::Restart { backoff } => {
                    prop_assert!(backoff <= p.max_backoff);
                    prop_assert!(backoff >= p.initial_backoff);
                    prop_assert!(!braked || backoff == p.max_backoff);
                    now += backoff;
                    restart_times.push(now);
                    h.record_restart(&p, e, now);
                }
                Action::RestartNow => {
                    prop_assert_eq!(e, ChildExit::Code(75));
                    restart_times.push(now);
                    h.record_restart(&p, e, now);
                }
                Action::StayDown => prop_assert_eq!(e, ChildExit::Code(0)),
                Action::Park { reason, .. } => {
                    prop_assert_eq!(e, ChildExit::Code(78));
                    prop_assert!(!reason.is_empty());
                }
            }
        }
        prop_assert!(restart_times.windows(2).all(|w| w[0] <= w[1]));
    }

    /// Arbitrary histories and clocks (including time going backwards) never panic.
    #[test]
    fn decide_is_total(e in exit(), started in any::<u64>(), now in any::<u64>(), crashes in any::<u32>()) {
        let mut h = RestartHistory::new(Duration::from_millis(started));
        h.consecutive_crashes = crashes;
        if let Action::Restart { backoff } = gatewarden_service::supervise::decide(e, &h, Duration::from_millis(now)) {
            prop_assert!(backoff <= Duration::from_secs(30));
        }
    }

    /// Any argument list survives systemd quoting and splitting unchanged.
    #[test]
    fn systemd_quoting_round_trips(words in proptest::collection::vec("[^\\x00-\\x1f\\x7f]{0,12}", 1..6)) {
        let refs: Vec<&str> = words.iter().map(String::as_str).collect();
        // A leading ExecStart prefix character would be stripped; real exes start with '/'.
        let mut with_exe = vec!["/bin/x"];
        with_exe.extend(refs.iter().copied());
        let line = systemd::quote_command(&with_exe);
        prop_assert_eq!(systemd::split_words(&line), with_exe);
    }

    /// The tolerant parsers never panic on arbitrary text.
    #[test]
    fn parsers_never_panic(text in "\\PC{0,400}") {
        let _ = systemd::parse_unit(&text).keys();
        let _ = systemd::parse_show(&text);
        let _ = systemd::parse_timespan(&text);
        let _ = systemd::split_words(&text);
        let _ = systemd::drift(&text, &text);
        let _ = gatewarden_service::launchd::parse_print(&text);
        let _ = gatewarden_service::windows::xml_unescape(&text);
        let _ = gatewarden_service::windows::drift(&text, "<Task></Task>");
    }
}
