//! The `POST /v1/messages` body (docs/protocol.md §5), decoded exactly as the handler's axum
//! `Json` extractor does, then checked for a chat command as the handler does.
#![no_main]

use axum::Json;
use gatewarden_runtime::http::fuzzing::MessageIn;
use gatewarden_runtime::commands::parse_command;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match Json::<MessageIn>::from_bytes(data) {
        Ok(Json(m)) => {
            let _ = parse_command(&m.text);
        }
        // The 4xx answer's text.
        Err(rejection) => {
            let _ = rejection.body_text();
        }
    }
});
