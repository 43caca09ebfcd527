//! Discord Gateway payloads (crates/platforms/src/discord/gateway.rs), read from a WebSocket
//! the bot does not control: `decode` is total, and what it returns re-encodes to a payload
//! that decodes the same.
#![no_main]

use gatewarden_platforms::discord::decode;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data)
        && let Some(p) = decode(s)
    {
        let again = serde_json::json!({"op": p.op, "d": p.d, "s": p.s, "t": p.t}).to_string();
        assert_eq!(decode(&again), Some(p), "{s:?}");
    }
});
