//! The `POST /v1/chat/completions` body (docs/protocol.md §5), decoded exactly as the handler's
//! axum `Json` extractor does; the last user message's text is taken as the handler does.
#![no_main]

use axum::Json;
use gatewarden_runtime::http::fuzzing::{CompletionIn, text_of};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match Json::<CompletionIn>::from_bytes(data) {
        Ok(Json(body)) => {
            if let Some(last) = body.messages.iter().rev().find(|m| m.role == "user") {
                let _ = text_of(&last.content);
            }
        }
        Err(rejection) => {
            let _ = rejection.body_text();
        }
    }
});
