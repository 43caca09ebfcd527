//! Discord Gateway payloads (crates/platforms/src/discord/gateway.rs), read from a WebSocket
//! the bot does not control: `decode` is total, and what it returns re-encodes to a payload
//! that decodes to the same op, sequence and event name. (`d` is not compared: serde_json's
//! float parsing is fast rather than correctly rounded, so a huge number in `d` may come back
//! as a neighbouring float; the adapter reads no float from it.)
#![no_main]

use gatewarden_platforms::discord::decode;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data)
        && let Some(p) = decode(s)
    {
        let again = serde_json::json!({"op": p.op, "d": p.d, "s": p.s, "t": p.t}).to_string();
        let q = decode(&again).unwrap_or_else(|| panic!("re-encoded payload does not decode: {again:?}"));
        assert_eq!((q.op, q.s, &q.t), (p.op, p.s, &p.t), "{s:?}");
    }
});
