//! `gateway.pid` (docs/protocol.md §2.1): any bytes give a typed outcome, and a record that
//! parses serializes the way `run` writes it and reads back unchanged.
#![no_main]

use gatewarden_lifecycle::fsio::ReadOutcome;
use gatewarden_lifecycle::records::parse_pid_record;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let ReadOutcome::Ok(record) = parse_pid_record(data) else { return };
    assert!(record.pid > 0, "a pid record names a real pid");
    let _ = record.identity();
    let written = serde_json::to_vec(&record).expect("a parsed record serializes");
    assert_eq!(parse_pid_record(&written).ok().as_ref(), Some(&record), "write/read round trip");
});
