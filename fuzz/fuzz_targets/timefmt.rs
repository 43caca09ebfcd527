//! RFC 3339 timestamps (crates/lifecycle/src/timefmt.rs), read from every record and marker:
//! `parse` is total, and a parsed time in the four-digit-year range formats and reads back.
#![no_main]

use gatewarden_lifecycle::timefmt::{format, from_micros, parse, to_micros};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data)
        && let Some(t) = parse(s)
    {
        let formatted = format(t);
        // `format` writes years 0000..=9999 in the fixed 32-byte form; outside it (an offset can
        // push year 0000 or 9999 over the edge) it writes what `parse` rightly refuses.
        if formatted.len() == 32 && formatted.as_bytes()[0].is_ascii_digit() {
            assert_eq!(parse(&formatted), Some(t), "{s:?} -> {formatted}");
        }
        assert_eq!(from_micros(to_micros(t)), t);
    }
    // Formatting is total over the whole microsecond range.
    if let Some(raw) = data.get(..16) {
        let us = i128::from_le_bytes(raw.try_into().expect("16 bytes"));
        let _ = format(from_micros(us));
    }
});
