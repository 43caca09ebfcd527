//! SASL SCRAM-SHA-1 without channel binding (RFC 5802), the client side: the mechanism every
//! XMPP server offers for hashed password storage (prosody's `internal_hashed`). The server's
//! signature is verified, so a server that does not know the password cannot pass as ours.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use hmac::{Hmac, KeyInit, Mac};
use sha1::{Digest, Sha1};

/// The most PBKDF2 rounds accepted from a server (a hostile one could ask for billions).
pub const MAX_ITERATIONS: u32 = 1_000_000;

type HmacSha1 = Hmac<Sha1>;

fn hmac(key: &[u8], data: &[u8]) -> [u8; 20] {
    // HMAC takes keys of any length.
    let mut m = <HmacSha1 as KeyInit>::new_from_slice(key).unwrap_or_else(|_| unreachable_hmac());
    m.update(data);
    m.finalize().into_bytes().into()
}

#[cold]
fn unreachable_hmac() -> HmacSha1 {
    // new_from_slice never fails for HMAC; a fixed key keeps this total without a panic.
    <HmacSha1 as KeyInit>::new(&Default::default())
}

/// PBKDF2-HMAC-SHA-1 for one 20-byte block: SCRAM's `Hi`.
fn hi(password: &[u8], salt: &[u8], iterations: u32) -> [u8; 20] {
    let mut first = salt.to_vec();
    first.extend_from_slice(&1u32.to_be_bytes());
    let mut u = hmac(password, &first);
    let mut out = u;
    for _ in 1..iterations {
        u = hmac(password, &u);
        for (o, x) in out.iter_mut().zip(u.iter()) {
            *o ^= x;
        }
    }
    out
}

/// `=` and `,` escaped in a SCRAM user name (RFC 5802 §5.1).
fn sasl_name(user: &str) -> String {
    user.replace('=', "=3D").replace(',', "=2C")
}

/// Why the exchange failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("SCRAM-SHA-1: {0}")]
pub struct ScramError(pub String);

/// One exchange, from the client's first message to the check of the server's signature.
#[derive(Debug)]
pub struct Scram {
    password: String,
    client_first_bare: String,
    nonce: String,
    expected_server_signature: Option<[u8; 20]>,
}

impl Scram {
    /// Starts an exchange for `user` with a fresh client `nonce` (printable, no comma).
    pub fn new(user: &str, password: &str, nonce: &str) -> Scram {
        Scram {
            password: password.to_owned(),
            client_first_bare: format!("n={},r={nonce}", sasl_name(user)),
            nonce: nonce.to_owned(),
            expected_server_signature: None,
        }
    }

    /// The client's first message (GS2 header `n,,`: no channel binding, no authzid).
    pub fn client_first(&self) -> String {
        format!("n,,{}", self.client_first_bare)
    }

    /// The client's final message for the server's first one.
    pub fn client_final(&mut self, server_first: &str) -> Result<String, ScramError> {
        let bad = |why: &str| ScramError(why.to_owned());
        let mut nonce = None;
        let mut salt = None;
        let mut iterations = None;
        for part in server_first.split(',') {
            match part.split_once('=') {
                Some(("r", v)) => nonce = Some(v),
                Some(("s", v)) => salt = Some(v),
                Some(("i", v)) => iterations = Some(v),
                Some(("m", _)) => return Err(bad("the server requires an extension (m=)")),
                _ => {}
            }
        }
        let nonce = nonce.ok_or_else(|| bad("no nonce in the server's first message"))?;
        if !nonce.starts_with(&self.nonce) || nonce.len() <= self.nonce.len() {
            return Err(bad("the server's nonce does not extend ours"));
        }
        let salt = B64.decode(salt.ok_or_else(|| bad("no salt"))?).map_err(|_| bad("the salt is not base64"))?;
        let iterations: u32 =
            iterations.and_then(|i| i.parse().ok()).ok_or_else(|| bad("no or a malformed iteration count"))?;
        if !(1..=MAX_ITERATIONS).contains(&iterations) {
            return Err(bad("an iteration count out of range"));
        }
        let salted = hi(self.password.as_bytes(), &salt, iterations);
        let client_key = hmac(&salted, b"Client Key");
        let stored_key: [u8; 20] = Sha1::digest(client_key).into();
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{},{server_first},{without_proof}", self.client_first_bare);
        let signature = hmac(&stored_key, auth_message.as_bytes());
        let proof: Vec<u8> = client_key.iter().zip(signature.iter()).map(|(k, s)| k ^ s).collect();
        let server_key = hmac(&salted, b"Server Key");
        self.expected_server_signature = Some(hmac(&server_key, auth_message.as_bytes()));
        Ok(format!("{without_proof},p={}", B64.encode(proof)))
    }

    /// Checks the server's final message (`v=…`, the `<success/>` payload).
    pub fn verify(&self, server_final: &str) -> Result<(), ScramError> {
        let expected = self.expected_server_signature.ok_or_else(|| ScramError("no final message sent".into()))?;
        let v = server_final
            .split(',')
            .find_map(|p| p.strip_prefix("v="))
            .ok_or_else(|| ScramError(format!("the server's final message has no signature: {server_final:.80}")))?;
        match B64.decode(v) {
            Ok(sig) if sig == expected => Ok(()),
            _ => Err(ScramError("the server's signature is wrong: it does not know the password".into())),
        }
    }
}

/// A base64 payload of a SASL element (`=` is the empty payload, RFC 6120 §6.4.2).
pub fn decode_payload(text: &str) -> Result<String, ScramError> {
    let t = text.trim();
    if t.is_empty() || t == "=" {
        return Ok(String::new());
    }
    let bytes = B64.decode(t).map_err(|_| ScramError("a SASL payload that is not base64".into()))?;
    String::from_utf8(bytes).map_err(|_| ScramError("a SASL payload that is not UTF-8".into()))
}

/// Base64 as SASL elements carry it.
pub fn encode_payload(bytes: &[u8]) -> String {
    B64.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 5802 §5's example exchange.
    #[test]
    fn rfc5802_example() {
        let mut s = Scram::new("user", "pencil", "fyko+d2lbbFgONRv9qkxdawL");
        assert_eq!(s.client_first(), "n,,n=user,r=fyko+d2lbbFgONRv9qkxdawL");
        let server_first = "r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,s=QSXCR+Q6sek8bf92,i=4096";
        assert_eq!(
            s.client_final(server_first).unwrap(),
            "c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,p=v0X8v3Bz2T0CJGbJQyF0X+HI4Ts="
        );
        s.verify("v=rmF9pqV8S7suAoZWja4dJRkFsKQ=").unwrap();
        assert!(s.verify("v=rmF9pqV8S7suAoZWja4dJRkFsKR=").is_err());
        assert!(s.verify("e=other-error").is_err());
    }

    #[test]
    fn a_hostile_server_first_message_is_refused() {
        for bad in [
            "r=other,s=QSXCR+Q6sek8bf92,i=4096",
            "r=abc,s=QSXCR+Q6sek8bf92,i=4096",
            "r=abcdef,s=!!,i=4096",
            "r=abcdef,s=QSXCR+Q6sek8bf92,i=0",
            "r=abcdef,s=QSXCR+Q6sek8bf92,i=4294967295",
            "r=abcdef,s=QSXCR+Q6sek8bf92",
            "m=ext,r=abcdef,s=QSXCR+Q6sek8bf92,i=1",
            "",
        ] {
            assert!(Scram::new("u", "p", "abc").client_final(bad).is_err(), "{bad}");
        }
        assert_eq!(sasl_name("a=b,c"), "a=3Db=2Cc");
        assert_eq!(decode_payload("=").unwrap(), "");
        assert!(decode_payload("%%").is_err());
    }
}
