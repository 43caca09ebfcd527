//! Signed webhook requests (crates/platforms/src/webhook.rs): the headers come from anyone who
//! can reach the listener. `verify` is total for any headers and body under either scheme, and
//! a request it accepts is one signed with the secret: re-signing its own timestamp and body
//! gives the signature it accepted.
#![no_main]

use gatewarden_config::platform::WebhookSignature;
use gatewarden_platforms::HookRequest;
use gatewarden_platforms::webhook::{self, sign, sign_gatewarden, verify};
use libfuzzer_sys::fuzz_target;

const SECRET: &[u8] = b"fuzz secret";
const NOW: u64 = 1_700_000_000;

fuzz_target!(|data: &[u8]| {
    // Up to four header values separated by NUL, then the body.
    let mut parts = data.splitn(5, |b| *b == 0);
    let mut next = || parts.next().map(|p| String::from_utf8_lossy(p).into_owned()).unwrap_or_default();
    let (ts, sig, delivery, gh) = (next(), next(), next(), next());
    let body = next().into_bytes();
    let req = HookRequest {
        post: true,
        query: String::new(),
        headers: vec![
            (webhook::TIMESTAMP_HEADER.into(), ts.clone()),
            (webhook::SIGNATURE_HEADER.into(), sig),
            (webhook::DELIVERY_HEADER.into(), delivery.clone()),
            (webhook::GITHUB_SIGNATURE_HEADER.into(), gh),
            (webhook::GITHUB_DELIVERY_HEADER.into(), delivery),
        ],
        body: body.clone(),
    };
    if let Ok(v) = verify(WebhookSignature::Gatewarden, SECRET, 300, &req, NOW) {
        let at: u64 = ts.trim().parse().expect("an accepted timestamp is a number");
        assert_eq!(v.signature, sign(SECRET, &[ts.trim().as_bytes(), b".", &body]));
        if ts.trim() == at.to_string() {
            assert_eq!(v.signature, sign_gatewarden(SECRET, at, &body));
        }
        assert!(at.abs_diff(NOW) <= 300);
    }
    if let Ok(v) = verify(WebhookSignature::Github, SECRET, 300, &req, NOW) {
        assert_eq!(v.signature, sign(SECRET, &[&body]));
    }
});
