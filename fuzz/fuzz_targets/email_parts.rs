//! The email adapter's file extraction (crates/platforms/src/email/message.rs) on top of
//! mail-parser, fed a message a sender chose: `judge` and `parts` are total, at most
//! `MAX_PARTS` files come out, each with a one-line name without a path and a plain
//! `type/subtype`, and `contents` decodes every part `parts` named, at the size it declared.
#![no_main]

use gatewarden_platforms::email::message::{MAX_PARTS, contents, judge, parts_of};
use libfuzzer_sys::fuzz_target;

/// mail-parser 0.11.9's one known debug assertion ("Invalid part ID", compiled out of release
/// builds; the adapter catches it in builds with debug assertions, message.rs `parse`) unwinds
/// to that catch instead of aborting through libFuzzer's hook; any other panic still aborts.
fn let_the_known_assertion_unwind() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let abort = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let payload = info.payload();
            let text = payload.downcast_ref::<&str>().copied().or(payload.downcast_ref::<String>().map(String::as_str));
            let known = info.location().is_some_and(|l| l.file().contains("mail-parser"))
                && text.is_some_and(|t| t.contains("Invalid part ID"));
            if !known {
                abort(info);
            }
        }));
    });
}

fuzz_target!(|data: &[u8]| {
    let_the_known_assertion_unwind();
    let _ = judge(data, "bot@example.test", &[]);
    let Some((found, _more)) = parts_of(data) else { return };
    assert!(found.len() <= MAX_PARTS);
    let decoded = contents(data);
    assert_eq!(decoded.len(), found.len(), "decoded what was named");
    for p in &found {
        assert!(!p.name.is_empty() && !p.name.contains(['/', '\\']) && !p.name.contains(char::is_control), "{p:?}");
        let (a, b) = p.declared.split_once('/').unwrap_or_default();
        assert!(!a.is_empty() && !b.is_empty() && !p.declared.contains([' ', ';', '\r', '\n']), "{p:?}");
        let bytes = decoded.get(&p.pos).unwrap_or_else(|| panic!("part {p:?} not found again"));
        assert_eq!(bytes.len() as u64, p.size, "{p:?}");
    }
});
