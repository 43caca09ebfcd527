//! The openai backend's SSE decoder (crates/agent/src/backend/sse.rs), fed by an upstream:
//! never panics, any split of the input decodes as the whole does, and no event exceeds the cap.
#![no_main]

use gatewarden_agent::backend::sse::{SseDecoder, decode_all};
use libfuzzer_sys::fuzz_target;

const LINE: usize = 256;
const EVENT: usize = 512;

fuzz_target!(|data: &[u8]| {
    let Some((&cut, rest)) = data.split_first() else { return };
    let whole = decode_all(rest, LINE, EVENT);
    let cut = usize::from(cut).min(rest.len());
    let mut d = SseDecoder::new(LINE, EVENT);
    let pieces = d.push(&rest[..cut]).and_then(|mut a| {
        a.extend(d.push(&rest[cut..])?);
        a.extend(d.finish()?);
        Ok(a)
    });
    assert_eq!(whole, pieces);
    if let Ok(events) = whole {
        assert!(events.iter().all(|e| e.len() <= EVENT));
    }
});
