//! Planned-stop and takeover markers (docs/protocol.md §2.3): `marker::parse` is total, and
//! every parsed marker can be classified by its target, a bystander and a stranger.
#![no_main]

use std::time::{Duration, UNIX_EPOCH};

use gatewarden_lifecycle::marker::{self, MarkerKind, SelfIdentity};
use gatewarden_lifecycle::probe::Liveness;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for kind in [MarkerKind::PlannedStop, MarkerKind::Takeover] {
        let Ok(m) = marker::parse(kind, data) else { continue };
        assert!(m.target_pid > 0);
        let _ = m.writer();
        let target = SelfIdentity {
            pid: m.target_pid,
            start_time: Some(5000),
            home: "/h".into(),
            started_at: UNIX_EPOCH + Duration::from_secs(1_764_000_000),
        };
        // "Now" as a real reader sees it: around the marker's own time, and a fixed wall clock.
        for now in
            [m.written_at, m.written_at + Duration::from_secs(30), UNIX_EPOCH + Duration::from_secs(1_764_428_645)]
        {
            let _ = marker::classify(&m, Some(&target), now, |_| Liveness::Dead);
            let _ = marker::classify(&m, None, now, |_| Liveness::Alive { start_time: Some(42) });
            let _ = marker::classify(&m, None, now, |_| Liveness::Unknown { reason: "fuzz".into() });
        }
    }
});
