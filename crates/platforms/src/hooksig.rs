//! HMAC-SHA256 request signatures written `sha256=<hex>`: Meta's and GitHub's
//! `X-Hub-Signature-256` (the MAC of the body) and the webhook kind's own (the MAC of
//! `timestamp.body`), one implementation for the pushed platforms (whatsapp.rs, webhook.rs).

use hmac::{Hmac, KeyInit, Mac};

/// Why a signature header was not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Not `sha256=` followed by an even number of hex digits.
    Malformed,
    /// Well formed, but not the MAC of what was signed.
    Wrong,
}

/// The HMAC-SHA256 of `parts`, concatenated, keyed by `secret`, as `sha256=<hex>`.
pub fn sign(secret: &[u8], parts: &[&[u8]]) -> String {
    match <Hmac<sha2::Sha256> as KeyInit>::new_from_slice(secret) {
        Ok(mut mac) => {
            for p in parts {
                mac.update(p);
            }
            format!("sha256={}", hex(&mac.finalize().into_bytes()))
        }
        // HMAC takes keys of any length.
        Err(_) => String::new(),
    }
}

/// Whether `header` (`sha256=<hex>`, surrounding blanks ignored, hex in either case) is the
/// MAC of `parts`; compared by the MAC's own constant-time check.
pub fn verify(secret: &[u8], parts: &[&[u8]], header: &str) -> Result<(), Refusal> {
    let digits = header.trim().strip_prefix("sha256=").ok_or(Refusal::Malformed)?;
    let given = unhex(digits).ok_or(Refusal::Malformed)?;
    let mut mac = <Hmac<sha2::Sha256> as KeyInit>::new_from_slice(secret).map_err(|_| Refusal::Wrong)?;
    for p in parts {
        mac.update(p);
    }
    mac.verify_slice(&given).map_err(|_| Refusal::Wrong)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

/// Strict hex: `from_str_radix` alone takes a sign (`"+8"` is 8), which would let one MAC be
/// written two ways and an exact replay pass as a new request (found by the
/// `webhook_signature` fuzz target).
fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| s.get(i..i + 2).and_then(|b| u8::from_str_radix(b, 16).ok())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GitHub's published example ("Validating webhook deliveries"), also checked with
    /// `openssl dgst -sha256 -hmac`.
    #[test]
    fn githubs_vector() {
        let sig = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
        assert_eq!(sign(b"It's a Secret to Everybody", &[b"Hello, World!"]), sig);
        assert_eq!(verify(b"It's a Secret to Everybody", &[b"Hello, ", b"World!"], sig), Ok(()));
        assert_eq!(
            verify(
                b"It's a Secret to Everybody",
                &[b"Hello, World!"],
                &sig.to_uppercase().replace("SHA256=", "sha256=")
            ),
            Ok(())
        );
        assert_eq!(verify(b"another", &[b"Hello, World!"], sig), Err(Refusal::Wrong));
        assert_eq!(verify(b"It's a Secret to Everybody", &[b"Hello, World?"], sig), Err(Refusal::Wrong));
        assert_eq!(verify(b"k", &[b"x"], &sig[7..]), Err(Refusal::Malformed), "the prefix is required");
        assert_eq!(verify(b"k", &[b"x"], "sha256=zz"), Err(Refusal::Malformed));
        assert_eq!(verify(b"k", &[b"x"], "sha256=7"), Err(Refusal::Malformed));
        assert_eq!(verify(b"k", &[b"x"], "sha256=é1"), Err(Refusal::Malformed));
        assert_eq!(verify(b"k", &[b"x"], "sha256=75"), Err(Refusal::Wrong), "a truncated MAC");
        // One MAC, one spelling: a signed digit is no hex digit.
        let signed = sig.replacen("sha256=757107", "sha256=7571+7", 1);
        assert_eq!(verify(b"It's a Secret to Everybody", &[b"Hello, World!"], &signed), Err(Refusal::Malformed));
    }
}
