//! `lifecycle.jsonl` (docs/protocol.md §2.4) read back by `ledger::read_tail`, through a real
//! file so that the tail reader itself is fuzzed: any bytes are readable, every line is an event
//! or shown as garbage, and the last `n` lines are the tail of all lines.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use gatewarden_lifecycle::ledger::{Line, read_tail};
use libfuzzer_sys::fuzz_target;

/// One file per fuzzing process, under `$TMPDIR` (scripts/fuzz points it at a scratch folder).
fn ledger_path() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("gatewarden-fuzz-ledger-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch folder");
        dir.join("lifecycle.jsonl")
    })
}

fuzz_target!(|data: &[u8]| {
    let path = ledger_path();
    std::fs::write(path, data).expect("scratch write");
    let all = read_tail(path, None).ok().expect("a small regular file is readable");
    for line in &all {
        if let Line::Garbage(text) = line {
            assert!(!text.trim_ascii().is_empty(), "blank lines are skipped, not garbage");
        }
    }
    let n = usize::from(data.first().copied().unwrap_or(0) % 8);
    let tail = read_tail(path, Some(n)).ok().expect("a small regular file is readable");
    assert_eq!(tail[..], all[all.len().saturating_sub(n)..], "tail of {n}");
});
