//! Whether fetched bytes are the release that was asked for: the sha256 given on the command
//! line and, when `[update] public_key` is set, its minisign signature, both over the bytes as
//! fetched (an archive is opened only after, `archive.rs`).

use std::path::Path;

use sha2::Digest;

use super::fetch::fetch;
use crate::release::hex;

/// The sha256 of `bytes`, in lower-case hex.
pub(super) fn sha256_hex(bytes: &[u8]) -> String {
    hex(&sha2::Sha256::digest(bytes))
}

/// `fetched` (read from `from`) against the hash the operator gave, if any.
pub(super) fn checksum(from: &str, fetched: &[u8], want: Option<&str>) -> Result<(), String> {
    let fetched_sha = sha256_hex(fetched);
    match want {
        Some(want) if !want.trim().eq_ignore_ascii_case(&fetched_sha) => {
            Err(format!("checksum mismatch: {from} has sha256 {fetched_sha}, expected {}", want.trim()))
        }
        _ => Ok(()),
    }
}

pub(super) fn signature(public_key: &str, bytes: &[u8], sig_src: &str, ca_file: Option<&Path>) -> Result<(), String> {
    let pk = minisign_verify::PublicKey::from_base64(public_key.trim())
        .map_err(|e| format!("[update] public_key is not a minisign public key: {e}"))?;
    let sig_bytes =
        fetch(sig_src, ca_file).map_err(|e| format!("a signature is required ([update] public_key is set): {e}"))?;
    let text = String::from_utf8(sig_bytes).map_err(|_| format!("{sig_src} is not a minisign signature"))?;
    let sig = minisign_verify::Signature::decode(&text).map_err(|e| format!("{sig_src}: {e}"))?;
    pk.verify(bytes, &sig, false).map_err(|e| format!("signature check failed ({sig_src}): {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checksum_matches_in_any_case_and_names_both_hashes_when_not() {
        let sha = sha256_hex(b"release");
        assert_eq!(checksum("r", b"release", None), Ok(()));
        assert_eq!(checksum("r", b"release", Some(&format!(" {} ", sha.to_uppercase()))), Ok(()));
        let e = checksum("r", b"other", Some(&sha)).unwrap_err();
        assert!(e.contains("checksum mismatch") && e.contains(&sha), "{e}");
    }

    #[test]
    fn a_key_that_is_not_minisign_is_named_before_any_fetch() {
        let e = signature("not a key", b"x", "/nonexistent.minisig", None).unwrap_err();
        assert!(e.contains("not a minisign public key"), "{e}");
    }
}
