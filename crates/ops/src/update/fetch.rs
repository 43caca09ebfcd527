//! The release's bytes: a path, or an http(s) URL within [`DownloadLimits`]. Nothing here
//! decides whether they are the release asked for (`verify.rs`) or may be installed
//! (`machine.rs`).

use std::path::Path;
use std::time::Duration;

/// Bigger than any release binary; a cap on what a URL may make us download.
pub(super) const MAX_RELEASE_BYTES: u64 = 512 << 20;

/// Whether `src` is downloaded rather than read.
pub(super) fn is_url(src: &str) -> bool {
    src.starts_with("http://") || src.starts_with("https://")
}

/// The bounds on a download (a stalled server must not hold `update.lock` forever, nor keep a
/// chat `/update` from its outcome notice): connecting, the response headers (first byte), the
/// gap between two reads of the body, and the whole download.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct DownloadLimits {
    connect: Duration,
    first_byte: Duration,
    idle: Duration,
    total: Duration,
}

/// Internal (tests): `connect,first_byte,idle,total` in milliseconds instead of the defaults.
const DOWNLOAD_LIMITS_ENV: &str = "GATEWARDEN_TEST_DOWNLOAD_LIMITS_MS";

impl DownloadLimits {
    const DEFAULT: DownloadLimits = DownloadLimits {
        connect: Duration::from_secs(10),
        first_byte: Duration::from_secs(30),
        idle: Duration::from_secs(30),
        total: Duration::from_secs(600),
    };

    pub(super) fn current() -> DownloadLimits {
        std::env::var(DOWNLOAD_LIMITS_ENV).ok().and_then(|v| DownloadLimits::parse(&v)).unwrap_or(Self::DEFAULT)
    }

    pub(super) fn parse(v: &str) -> Option<DownloadLimits> {
        let ms: Vec<u64> = v.split(',').map(|p| p.trim().parse().ok()).collect::<Option<_>>()?;
        let &[connect, first_byte, idle, total] = ms.as_slice() else { return None };
        let d = Duration::from_millis;
        Some(DownloadLimits { connect: d(connect), first_byte: d(first_byte), idle: d(idle), total: d(total) })
    }

    /// Which bound a ureq timeout is, for the refusal.
    pub(super) fn describe(&self, t: ureq::Timeout) -> String {
        use ureq::Timeout as T;
        match t {
            T::Resolve | T::Connect => format!("connect timeout: no connection within {:?}", self.connect),
            T::SendRequest | T::Await100 | T::SendBody | T::RecvResponse => {
                format!("first-byte timeout: no response within {:?}", self.first_byte)
            }
            T::PerRead | T::PerWrite => format!("idle timeout: no data for {:?}", self.idle),
            // Global, PerCall, RecvBody (and any later addition: the enum is non-exhaustive).
            _ => {
                format!("total timeout: the download took longer than {:?}", self.total)
            }
        }
    }
}

/// A path, or an http(s) URL fetched with crates/net's TLS (the system roots or `[update]
/// ca_file) and the environment's proxy, within [`DownloadLimits`].
pub(super) fn fetch(src: &str, ca_file: Option<&Path>) -> Result<Vec<u8>, String> {
    if is_url(src) {
        let limits = DownloadLimits::current();
        let out = gatewarden_net::Outbound::new(ca_file, None).map_err(|e| format!("[update] {e}"))?;
        let agent = gatewarden_net::http_config(&out)
            .timeout_connect(Some(limits.connect))
            .timeout_recv_response(Some(limits.first_byte))
            .timeout_per_read(Some(limits.idle))
            .timeout_global(Some(limits.total))
            .build()
            .new_agent();
        let why = |e: ureq::Error| match e {
            ureq::Error::Timeout(t) => format!("cannot download {src}: {}", limits.describe(t)),
            e => format!("cannot download {src}: {}", gatewarden_net::describe(&e, src)),
        };
        let resp = agent.get(src).call().map_err(why)?;
        let mut body = resp.into_body();
        return body.with_config().limit(MAX_RELEASE_BYTES).read_to_vec().map_err(why);
    }
    let meta = std::fs::metadata(src).map_err(|e| format!("cannot read {src}: {e}"))?;
    if !meta.is_file() {
        return Err(format!("{src} is not a file"));
    }
    std::fs::read(src).map_err(|e| format!("cannot read {src}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn download_limits_parse_and_name_each_bound() {
        let l = DownloadLimits::parse("1,2,3,4").unwrap();
        assert_eq!(l.idle, Duration::from_millis(3));
        assert_eq!(DownloadLimits::parse("1,2,3"), None);
        assert!(l.describe(ureq::Timeout::Connect).starts_with("connect timeout"));
        assert!(l.describe(ureq::Timeout::RecvResponse).starts_with("first-byte timeout"));
        assert!(l.describe(ureq::Timeout::PerRead).starts_with("idle timeout"));
        assert!(l.describe(ureq::Timeout::Global).starts_with("total timeout"));
    }
}
