//! Linux `/proc/<pid>/stat` and `/proc/<pid>/environ` parsing (crates/lifecycle/src/probe.rs):
//! another user's process chooses its own `comm`, so any bytes must be handled.
#![no_main]

use gatewarden_lifecycle::procfs::{environ_value, parse_proc_stat, parse_proc_stat_ppid};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = parse_proc_stat(data);
    let _ = parse_proc_stat_ppid(data);
    let _ = environ_value(data, "GATEWARDEN_RUN_TAG");
});
