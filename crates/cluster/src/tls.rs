//! TLS to the store: `sslmode` in the store URL, with libpq's names, on crates/net's trust.
//!
//! | `sslmode` | here |
//! |---|---|
//! | `disable` | plain TCP |
//! | `prefer` (the default, as in libpq) | TLS when the server offers it, verified in full; plain when the server has no TLS |
//! | `require` | TLS or no connection, verified in full (libpq would not verify: gatewarden never talks to an unverified TLS peer) |
//! | `verify-ca` | TLS, the chain verified, the host name not checked (a store reached by an address its certificate does not name) |
//! | `verify-full` | TLS, chain and host name verified: what the docs recommend |
//!
//! The roots are the OS store or `sslrootcert=<file>` in the URL (`[cluster] ca_file` becomes
//! that parameter; `ClusterConfig::store_url`). tokio-postgres only knows `disable`, `prefer`
//! and `require`, so the URL's `sslmode` and `sslrootcert` are taken off before it is parsed.

use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use gatewarden_net::{ClientTls, rustls};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::config::SslMode as PgSslMode;
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};

/// libpq's `sslmode` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(v: &str) -> Result<SslMode, String> {
        Ok(match v {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            // `allow` would prefer plain text to TLS: not offered.
            other => {
                return Err(format!(
                    "sslmode={other:?} is not one of disable, prefer, require, verify-ca, verify-full"
                ));
            }
        })
    }

    /// What tokio-postgres is told: whether TLS may be skipped.
    pub(crate) fn for_postgres(self) -> PgSslMode {
        match self {
            SslMode::Disable => PgSslMode::Disable,
            SslMode::Prefer => PgSslMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => PgSslMode::Require,
        }
    }
}

/// A store URL with `sslmode` and `sslrootcert` taken off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreUrl {
    /// The URL tokio-postgres parses.
    pub url: String,
    pub mode: SslMode,
    /// `sslrootcert`: a private CA (PEM), else the OS trust store.
    pub root_cert: Option<PathBuf>,
}

impl StoreUrl {
    pub fn parse(url: &str) -> Result<StoreUrl, String> {
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let (mut mode, mut root_cert, mut rest) = (SslMode::Prefer, None, Vec::new());
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("sslmode", v)) => mode = SslMode::parse(v)?,
                Some(("sslrootcert", v)) => root_cert = Some(PathBuf::from(percent_decode(v)?)),
                _ => rest.push(pair),
            }
        }
        let url = if rest.is_empty() { base.to_owned() } else { format!("{base}?{}", rest.join("&")) };
        Ok(StoreUrl { url, mode, root_cert })
    }

    /// The connector for this URL's mode and roots.
    pub fn connector(&self) -> Result<MakeRustls, String> {
        let tls = ClientTls::new(self.root_cert.as_deref()).map_err(|e| format!("store sslrootcert: {e}"))?;
        let config = match self.mode {
            SslMode::VerifyCa => tls.rustls_config_chain_only(),
            _ => tls.rustls_config(),
        };
        // Without TLS support (`--no-default-features`) only `disable` can connect.
        let config = match (config, self.mode) {
            (Ok(c), _) => Some(c),
            (Err(_), SslMode::Disable | SslMode::Prefer) => None,
            (Err(e), _) => return Err(format!("store: {e}")),
        };
        Ok(MakeRustls { config })
    }
}

fn percent_decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(h, 16).ok());
            out.push(hex.ok_or_else(|| format!("bad percent-encoding in {s:?}"))?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("{s:?} is not UTF-8"))
}

/// tokio-postgres's TLS hook on a rustls configuration from crates/net. `None`: this build has
/// no TLS, and the connection is plain (`disable`, or `prefer` against any server).
#[derive(Clone)]
pub struct MakeRustls {
    config: Option<Arc<rustls::ClientConfig>>,
}

impl<S> MakeTlsConnect<S> for MakeRustls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type TlsConnect = RustlsConnect;
    type Error = io::Error;

    fn make_tls_connect(&mut self, domain: &str) -> io::Result<RustlsConnect> {
        let name = rustls::pki_types::ServerName::try_from(domain.to_owned())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, format!("{domain:?} is not a host name")))?;
        Ok(RustlsConnect { config: self.config.clone(), name })
    }
}

pub struct RustlsConnect {
    config: Option<Arc<rustls::ClientConfig>>,
    name: rustls::pki_types::ServerName<'static>,
}

impl<S> TlsConnect<S> for RustlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<RustlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        let host = self.name.to_str().into_owned();
        Box::pin(async move {
            let Some(config) = self.config else {
                return Err(io::Error::other("this build has no TLS"));
            };
            let s = tokio_rustls::TlsConnector::from(config).connect(self.name, stream).await.map_err(|e| {
                // The certificate problem in words, with the host (crates/net).
                match gatewarden_net::io_tls_reason(&e) {
                    Some(why) => io::Error::new(e.kind(), format!("TLS with {host} failed: {why}")),
                    None => e,
                }
            })?;
            Ok(RustlsStream(Box::new(s)))
        })
    }
}

/// A TLS connection to the store.
pub struct RustlsStream<S>(Box<tokio_rustls::client::TlsStream<S>>);

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for RustlsStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        // SCRAM without channel binding (SCRAM-SHA-256, not -PLUS): the server is already
        // authenticated by its certificate.
        ChannelBinding::none()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for RustlsStream<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RustlsStream<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sslmode_and_sslrootcert_are_taken_off_the_url() {
        let s = StoreUrl::parse("postgres://gw@db:5432/gw?sslmode=verify-full&application_name=x").unwrap();
        assert_eq!(
            (s.url.as_str(), s.mode, s.root_cert),
            ("postgres://gw@db:5432/gw?application_name=x", SslMode::VerifyFull, None)
        );
        let s = StoreUrl::parse("postgres://gw@db/gw?sslrootcert=%2Fetc%2Fca.pem&sslmode=verify-ca").unwrap();
        assert_eq!((s.url.as_str(), s.mode), ("postgres://gw@db/gw", SslMode::VerifyCa));
        assert_eq!(s.root_cert, Some(PathBuf::from("/etc/ca.pem")));
        assert_eq!(StoreUrl::parse("postgres://gw@db/gw").unwrap().mode, SslMode::Prefer);
        assert!(StoreUrl::parse("postgres://gw@db/gw?sslmode=allow").unwrap_err().contains("allow"));
        assert_eq!(SslMode::VerifyCa.for_postgres(), PgSslMode::Require);
        assert_eq!(SslMode::Disable.for_postgres(), PgSslMode::Disable);
    }
}
