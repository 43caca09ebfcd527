//! Attachment type sniffing and the journaled attachment lines (crates/platforms/src/
//! attachments.rs), fed bytes a chat user chose: `sniff` is total over any prefix, a type it
//! names is stable under more bytes after the sniffed window's magic, `decide_type` is total,
//! and a line that parses never names a malformed hash.
#![no_main]

use gatewarden_platforms::attachments::{decide_type, escape_text, parse_lines, sniff};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let kind = sniff(data);
    for declared in ["image/png", "image/jpeg", "text/plain", "", "application/octet-stream", "audio/ogg"] {
        if let Ok(t) = decide_type(declared, kind, &[]) {
            assert!(!t.is_empty(), "{declared:?} {kind:?}");
        }
    }
    if let Ok(s) = std::str::from_utf8(data) {
        for n in parse_lines(s) {
            assert!(n.sha256.len() == 64 && n.sha256.bytes().all(|b| b.is_ascii_hexdigit()), "{s:?}");
        }
        // A sender's own text never names a stored file once escaped.
        assert!(parse_lines(&escape_text(s)).is_empty(), "{s:?}");
    }
});
