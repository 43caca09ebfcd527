//! The control channel (docs/protocol.md §3): a byte stream split into capped lines by
//! `framing::read_line`, each decoded as what either side reads: a request (the server), a
//! hello, a response and a status (the client). Requests that decode re-encode identically.
#![no_main]

use std::io::Cursor;

use gatewarden_control::framing::{decode, encode, read_line};
use gatewarden_control::{Hello, MAX_LINE, Op, PROTOCOL_NAME, Request, Response, StatusReport};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let mut stream = Cursor::new(data);
    while let Ok(Some(line)) = read_line(&mut stream) {
        assert!(line.len() <= MAX_LINE, "a frame is never longer than the cap");
        // The server side (crates/runtime/src/control/mod.rs).
        if let Ok(req) = serde_json::from_slice::<Request>(&line) {
            if let Op::Stop { requester, .. }
            | Op::Restart { requester }
            | Op::CancelDrain { requester }
            | Op::Reload { requester } = &req.op
            {
                let _ = requester.describe();
            }
            let again: Request = decode(&encode(&req).expect("encodes")).expect("re-decodes");
            assert_eq!(again, req, "request round trip");
        }
        // The client side (crates/control/src/client.rs): the hello is checked as a value first.
        if let Ok(v) = decode::<Value>(&line)
            && v.get("proto").and_then(Value::as_str) == Some(PROTOCOL_NAME)
        {
            let _ = serde_json::from_value::<Hello>(v);
        }
        if let Ok(resp) = decode::<Response>(&line) {
            let _ = encode(&resp);
            if let Some(result) = resp.result {
                let _ = serde_json::from_value::<StatusReport>(result);
            }
        }
        let _ = decode::<StatusReport>(&line);
    }
});
