//! The `POST /v1/responses` body (README "HTTP API"), parsed exactly as the handler does: any
//! JSON value is accepted or refused with the field named, and an accepted one's user message
//! has text or an inline image or file, and its list input stays within the bounds.
#![no_main]

use gatewarden_runtime::http::fuzzing::{MAX_INPUT_ITEMS, parse_response};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) else { return };
    match parse_response(&v) {
        Ok(r) => {
            assert!(!r.text.trim().is_empty() || !r.files.is_empty(), "accepted without text: {v}");
            for f in &r.files {
                assert!(!f.image || f.declared.starts_with("image/"), "an image that is not one: {v}");
            }
            assert!(r.inline.len() < MAX_INPUT_ITEMS, "more history items than the bound: {v}");
        }
        Err(refused) => assert!(!refused.message.is_empty() && !refused.param.is_empty()),
    }
});
