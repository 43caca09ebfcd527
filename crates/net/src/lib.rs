//! Outbound connections: the one place that decides whom gatewarden trusts and how it gets there.
//!
//! Every client (the Telegram and Matrix adapters, the `openai` backend, `update`'s download,
//! IRC, email and the PostgreSQL cluster store) takes its TLS settings from a [`ClientTls`] and its
//! HTTP agent from [`http_config`], so that the rules below hold for all of them at once:
//!
//! - **Roots.** The OS trust store (rustls-native-certs: on Unix the distribution bundle, with
//!   `SSL_CERT_FILE` / `SSL_CERT_DIR` honoured; the keychain on macOS; the certificate store on
//!   Windows), loaded once per process. Only when the OS has no roots at all (a scratch
//!   container) the bundled Mozilla roots (webpki-roots) are used instead.
//! - **Private CA.** A connection with `ca_file` trusts the certificates in that PEM file and
//!   nothing else (like `curl --cacert`): a private CA is pinned, not added to the public ones.
//!   The file is read with lifecycle's no-follow, size-capped reader.
//! - **Always verified.** There is no switch that turns verification off; name, chain and
//!   validity period are checked by rustls (webpki) on every handshake.
//! - **Crypto provider:** ring (crates/net/README.md says why).
//! - **Proxies.** `HTTPS_PROXY` / `HTTP_PROXY` / `ALL_PROXY` / `NO_PROXY` (either case) are
//!   honoured by every HTTP agent (ureq reads them); a per-connection `proxy` replaces them for
//!   that connection. Proxy credentials are never part of an error text ([`describe`]).
//! - **Failures are named.** [`describe`] turns a failed request into "host: reason", with
//!   certificate problems in words (unknown issuer, wrong host name, expired).

pub mod multipart;

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use gatewarden_lifecycle::fsio::{self, ReadOutcome};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use ureq::config::ConfigBuilder;
use ureq::tls::{Certificate, TlsConfig};
#[cfg(feature = "tls")]
use ureq::tls::{RootCerts, TlsProvider};
use ureq::typestate::AgentScope;

/// The rustls these settings are for (IRC and PostgreSQL drive it directly).
pub use rustls;

/// Largest accepted `ca_file` (a bundle of a few hundred certificates fits).
pub const MAX_CA_FILE_BYTES: u64 = 1 << 20;

/// Why a TLS or proxy setting cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetError {
    #[error("ca_file {}: {why}", path.display())]
    CaFile { path: PathBuf, why: String },
    #[error("proxy: {0}")]
    Proxy(String),
    #[error("TLS: {0}")]
    Tls(String),
}

/// Whether this build speaks TLS (the `tls` feature, on by default). Without it an `https://`
/// URL is refused when the configuration is loaded.
pub const TLS: bool = cfg!(feature = "tls");

/// The crypto provider every client uses (module notes).
#[cfg(feature = "tls")]
fn provider() -> Result<Arc<rustls::crypto::CryptoProvider>, NetError> {
    static P: OnceLock<Arc<rustls::crypto::CryptoProvider>> = OnceLock::new();
    Ok(P.get_or_init(|| Arc::new(rustls::crypto::ring::default_provider())).clone())
}

/// A build without the `tls` feature has no crypto provider.
#[cfg(not(feature = "tls"))]
fn provider() -> Result<Arc<rustls::crypto::CryptoProvider>, NetError> {
    Err(NetError::Tls("this build has no TLS (built without the `tls` feature)".into()))
}

/// Where a [`ClientTls`]'s roots come from, as status and errors name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootSource {
    /// The OS trust store (`n` certificates).
    System(usize),
    /// The OS had none: the bundled Mozilla roots.
    Bundled,
    /// A private CA file.
    CaFile(PathBuf),
}

impl std::fmt::Display for RootSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RootSource::System(n) => write!(f, "the system trust store ({n} roots)"),
            RootSource::Bundled => f.write_str("the bundled Mozilla roots (the system has none)"),
            RootSource::CaFile(p) => write!(f, "ca_file {}", p.display()),
        }
    }
}

/// The trust settings of one connection (module notes). Cheap to clone: the system roots are
/// shared by every clone and every connection of the process.
#[derive(Debug, Clone)]
pub struct ClientTls {
    roots: Arc<Vec<Certificate<'static>>>,
    source: RootSource,
}

/// The system roots, loaded once. Unparsable entries in the OS store are skipped (the rest
/// still count); an OS with no usable root at all falls back to the bundled ones.
fn system() -> &'static ClientTls {
    static SYSTEM: OnceLock<ClientTls> = OnceLock::new();
    SYSTEM.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        let certs: Vec<Certificate<'static>> =
            found.certs.iter().map(|c| Certificate::from_der(c.as_ref()).to_owned()).collect();
        if certs.is_empty() {
            ClientTls { roots: Arc::new(Vec::new()), source: RootSource::Bundled }
        } else {
            let n = certs.len();
            ClientTls { roots: Arc::new(certs), source: RootSource::System(n) }
        }
    })
}

impl ClientTls {
    /// The default trust: the OS store, or the bundled roots where it is empty.
    pub fn system() -> ClientTls {
        system().clone()
    }

    /// `ca_file` when set (only that CA is trusted), else [`ClientTls::system`].
    pub fn new(ca_file: Option<&Path>) -> Result<ClientTls, NetError> {
        match ca_file {
            None => Ok(ClientTls::system()),
            Some(path) => ClientTls::from_ca_file(path),
        }
    }

    /// Trusts exactly the certificates in the PEM file at `path`.
    pub fn from_ca_file(path: &Path) -> Result<ClientTls, NetError> {
        let bad = |why: String| NetError::CaFile { path: path.to_owned(), why };
        let bytes = match fsio::read_capped(path, MAX_CA_FILE_BYTES) {
            ReadOutcome::Ok(b) => b,
            ReadOutcome::Missing => return Err(bad("no such file".into())),
            other => return Err(bad(other.describe())),
        };
        let roots = parse_pem_certs(&bytes).map_err(bad)?;
        Ok(ClientTls { roots: Arc::new(roots), source: RootSource::CaFile(path.to_owned()) })
    }

    /// Where the roots come from.
    pub fn source(&self) -> &RootSource {
        &self.source
    }

    /// The roots as rustls takes them.
    fn root_store(&self) -> rustls::RootCertStore {
        if self.source == RootSource::Bundled {
            return rustls::RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() };
        }
        let mut store = rustls::RootCertStore::empty();
        store.add_parsable_certificates(self.roots.iter().map(|c| CertificateDer::from(c.der())));
        store
    }

    /// A rustls client configuration (IRC, PostgreSQL): TLS 1.2 and 1.3, SNI on, no client
    /// certificate.
    pub fn rustls_config(&self) -> Result<Arc<rustls::ClientConfig>, NetError> {
        let config = rustls::ClientConfig::builder_with_provider(provider()?)
            .with_safe_default_protocol_versions()
            .map_err(|e| NetError::Tls(e.to_string()))?
            .with_root_certificates(self.root_store())
            .with_no_client_auth();
        Ok(Arc::new(config))
    }

    /// [`ClientTls::rustls_config`] that verifies the chain (issuer, validity, signatures) but
    /// not the host name: PostgreSQL's `sslmode=verify-ca`, for a store reached by an address
    /// its certificate does not name. Never weaker than that.
    pub fn rustls_config_chain_only(&self) -> Result<Arc<rustls::ClientConfig>, NetError> {
        let provider = provider()?;
        let inner = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(self.root_store()),
            Arc::clone(&provider),
        )
        .build()
        .map_err(|e| NetError::Tls(e.to_string()))?;
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| NetError::Tls(e.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(ChainOnly(inner)))
            .with_no_client_auth();
        Ok(Arc::new(config))
    }

    /// The same trust for a ureq agent (the HTTP clients).
    #[cfg(feature = "tls")]
    pub fn ureq_config(&self) -> TlsConfig {
        let roots = match self.source {
            RootSource::Bundled => RootCerts::WebPki,
            _ => RootCerts::Specific(self.roots.clone()),
        };
        let builder = TlsConfig::builder().provider(TlsProvider::Rustls).root_certs(roots);
        match provider() {
            Ok(p) => builder.unversioned_rustls_crypto_provider(p).build(),
            Err(_) => builder.build(),
        }
    }

    /// The same trust for SMTP (lettre, the email adapter's replies) to `domain`: the same
    /// roots in lettre's rustls verifier (name, chain and validity checked on every handshake).
    #[cfg(feature = "tls")]
    pub fn smtp_params(&self, domain: &str) -> Result<lettre::transport::smtp::client::TlsParameters, NetError> {
        use lettre::transport::smtp::client::{Certificate as SmtpCert, CertificateStore, TlsParametersBuilder};
        let tls_error = |e: lettre::transport::smtp::Error| NetError::Tls(e.to_string());
        let mut b = TlsParametersBuilder::new(domain.to_owned());
        b = match self.source {
            RootSource::Bundled => b.certificate_store(CertificateStore::WebpkiRoots),
            _ => b.certificate_store(CertificateStore::None),
        };
        for c in self.roots.iter() {
            b = b.add_root_certificate(SmtpCert::from_der(c.der().to_vec()).map_err(tls_error)?);
        }
        b.build_rustls().map_err(tls_error)
    }

    /// Without a crypto provider there is no SMTP over TLS (and no plain SMTP either).
    #[cfg(not(feature = "tls"))]
    pub fn smtp_params(&self, _domain: &str) -> Result<lettre::transport::smtp::client::TlsParameters, NetError> {
        Err(NetError::Tls("this build has no TLS (built without the `tls` feature)".into()))
    }

    /// Without a crypto provider: a provider that is not compiled in, which ureq refuses
    /// cleanly for `https://` (rustls without a provider would panic at the first handshake).
    #[cfg(not(feature = "tls"))]
    pub fn ureq_config(&self) -> TlsConfig {
        TlsConfig::builder().provider(ureq::tls::TlsProvider::NativeTls).build()
    }
}

/// webpki's verification with one outcome accepted: a chain that verifies for a certificate
/// that names another host. webpki checks the chain first and the name last, so a
/// `NotValidForName` means everything else passed.
#[derive(Debug)]
struct ChainOnly(Arc<rustls::client::WebPkiServerVerifier>);

impl rustls::client::danger::ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &rustls::pki_types::ServerName<'_>,
        ocsp_response: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        use rustls::CertificateError as C;
        match self.0.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(C::NotValidForName | C::NotValidForNameContext { .. })) => {
                Ok(rustls::client::danger::ServerCertVerified::assertion())
            }
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// The certificates in a PEM text; an error when there is none or one is damaged.
pub fn parse_pem_certs(bytes: &[u8]) -> Result<Vec<Certificate<'static>>, String> {
    let mut out = Vec::new();
    for item in CertificateDer::pem_slice_iter(bytes) {
        let der = item.map_err(|e| format!("not a PEM certificate file ({e})"))?;
        out.push(Certificate::from_der(der.as_ref()).to_owned());
    }
    if out.is_empty() {
        return Err("holds no PEM certificate (-----BEGIN CERTIFICATE-----)".into());
    }
    Ok(out)
}

/// A per-connection `proxy` setting: `http://host:port`, `https://host:port`,
/// `socks5://host:port` or `socks5h://host:port` (the proxy resolves names). Credentials are
/// refused here: they belong in the environment (`HTTPS_PROXY=http://user:pass@…`), never in
/// the configuration text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyUrl(String);

impl ProxyUrl {
    pub fn parse(url: &str) -> Result<ProxyUrl, NetError> {
        let url = url.trim();
        let bad = |why: &str| NetError::Proxy(format!("{why} (expected http://host:port or socks5h://host:port)"));
        let Some((scheme, rest)) = url.split_once("://") else {
            return Err(bad("no scheme"));
        };
        if !matches!(scheme, "http" | "https" | "socks5" | "socks5h") {
            return Err(bad(&format!("unsupported scheme {scheme:?}")));
        }
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        if authority.contains('@') {
            // Do not echo the text: it may hold a password.
            return Err(NetError::Proxy(
                "must not contain credentials; put them in HTTPS_PROXY / ALL_PROXY instead".into(),
            ));
        }
        let Some((host, port)) = authority.rsplit_once(':') else {
            return Err(bad(&format!("{authority:?} has no port")));
        };
        if host.is_empty() || authority.contains(['/', '?', '#', ' ']) || port.parse::<u16>().map_or(true, |p| p == 0) {
            return Err(bad(&format!("{authority:?} is not host:port")));
        }
        Ok(ProxyUrl(format!("{scheme}://{authority}")))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// One outbound HTTP connection's settings: its trust and, when configured, its own proxy
/// (otherwise the environment's).
#[derive(Debug, Clone)]
pub struct Outbound {
    pub tls: ClientTls,
    pub proxy: Option<ProxyUrl>,
}

impl Outbound {
    /// `ca_file` and `proxy` as configured.
    pub fn new(ca_file: Option<&Path>, proxy: Option<&str>) -> Result<Outbound, NetError> {
        Ok(Outbound { tls: ClientTls::new(ca_file)?, proxy: proxy.map(ProxyUrl::parse).transpose()? })
    }

    /// The defaults: the system roots and the environment's proxy.
    pub fn system() -> Outbound {
        Outbound { tls: ClientTls::system(), proxy: None }
    }
}

/// A ureq agent configuration with `out`'s TLS and proxy and gatewarden's user agent; callers
/// add their timeouts and `build().new_agent()`. `HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY` and
/// `NO_PROXY` (either case) are read here, once per agent.
pub fn http_config(out: &Outbound) -> ConfigBuilder<AgentScope> {
    let proxy = match &out.proxy {
        // Parsed by ProxyUrl already; ureq's own parser agrees on these four schemes.
        Some(p) => ureq::Proxy::new(p.as_str()).ok(),
        None => ureq::Proxy::try_from_env(),
    };
    ureq::Agent::config_builder()
        .tls_config(out.tls.ureq_config())
        .proxy(proxy)
        .user_agent(concat!("gatewarden/", env!("CARGO_PKG_VERSION")))
        // ureq gives every connection a 128 KiB input and a 128 KiB output buffer (twice over
        // TLS, below and above it): 256-512 KiB resident per pooled connection, the largest
        // share of the adapters' memory (README, "Benchmarks"). Bodies stream through them, so
        // only the response head must fit the input buffer: capped to match.
        .input_buffer_size(HTTP_INPUT_BUFFER)
        .max_response_header_size(HTTP_INPUT_BUFFER)
        .output_buffer_size(HTTP_OUTPUT_BUFFER)
}

/// A ureq connection's input buffer, and so the largest response head accepted.
pub const HTTP_INPUT_BUFFER: usize = 32 * 1024;
/// A ureq connection's output buffer (request heads; bodies are written through it in parts).
pub const HTTP_OUTPUT_BUFFER: usize = 16 * 1024;

/// The host (and port) of `url`, without credentials, for messages.
pub fn url_host(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    authority.rsplit_once('@').map_or(authority, |(_, h)| h)
}

/// Why a request to `url` failed, naming the host: "api.telegram.org: certificate not
/// trusted (unknown issuer)". TLS failures are put in words; every other error keeps ureq's
/// text. Proxy credentials from the environment never appear in it.
pub fn describe(err: &ureq::Error, url: &str) -> String {
    let host = url_host(url);
    let text = match tls_reason(err) {
        Some(why) => format!("TLS with {host} failed: {why}"),
        None => format!("{host}: {err}"),
    };
    redact_proxy_credentials(text)
}

/// The certificate or handshake problem behind `err`, in words; `None` when it is no TLS
/// failure.
pub fn tls_reason(err: &ureq::Error) -> Option<String> {
    match err {
        ureq::Error::Io(e) => io_tls_reason(e),
        ureq::Error::Rustls(e) => Some(rustls_reason(e)),
        ureq::Error::Tls(m) => Some((*m).to_owned()),
        _ => None,
    }
}

/// The same for an `io::Error` from a rustls stream (IRC, PostgreSQL).
pub fn io_tls_reason(e: &std::io::Error) -> Option<String> {
    e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()).map(rustls_reason)
}

/// A certificate problem as [`rustls_reason`] words it: the words, and what fixes it. The
/// words are the contract between the error texts (status, ledger) and `doctor`, which finds
/// them again with [`CertProblem::find`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CertProblem {
    UnknownIssuer,
    WrongHost,
    Expired,
    NotValidYet,
}

impl CertProblem {
    pub const ALL: [CertProblem; 4] =
        [CertProblem::UnknownIssuer, CertProblem::WrongHost, CertProblem::Expired, CertProblem::NotValidYet];

    /// How error texts say it.
    pub fn words(self) -> &'static str {
        match self {
            CertProblem::UnknownIssuer => {
                "certificate not trusted: unknown issuer (not signed by a trusted CA; see ca_file)"
            }
            CertProblem::WrongHost => "certificate is not valid for this host name",
            CertProblem::Expired => "certificate has expired",
            CertProblem::NotValidYet => "certificate is not valid yet",
        }
    }

    /// What an operator can do about it.
    pub fn fix(self) -> &'static str {
        match self {
            CertProblem::UnknownIssuer => {
                "a private CA: set ca_file on that [[platform]] / [agent] / [update] / [cluster] table \
                 (or add the CA to the system store, or point SSL_CERT_FILE at it); a public service: \
                 something between you and it presents its own certificate (a TLS-inspecting proxy)"
            }
            CertProblem::WrongHost => {
                "use the host name the certificate names in the URL, or have the server's certificate \
                 name the host you connect to"
            }
            CertProblem::Expired | CertProblem::NotValidYet => {
                "check this machine's clock (date -u), then have the server's certificate renewed"
            }
        }
    }

    /// The problem named in `text` (a status or ledger reason), if any.
    pub fn find(text: &str) -> Option<CertProblem> {
        CertProblem::ALL.into_iter().find(|p| text.contains(p.words()))
    }
}

/// A rustls error in words.
pub fn rustls_reason(e: &rustls::Error) -> String {
    use rustls::CertificateError as C;
    match e {
        rustls::Error::InvalidCertificate(c) => match c {
            C::UnknownIssuer => CertProblem::UnknownIssuer.words().into(),
            C::NotValidForName | C::NotValidForNameContext { .. } => CertProblem::WrongHost.words().into(),
            C::Expired | C::ExpiredContext { .. } => CertProblem::Expired.words().into(),
            C::NotValidYet | C::NotValidYetContext { .. } => CertProblem::NotValidYet.words().into(),
            C::Revoked => "certificate has been revoked".into(),
            C::BadSignature => "certificate has a bad signature".into(),
            other => format!("invalid certificate: {other:?}"),
        },
        other => other.to_string(),
    }
}

/// Replaces the user and password of every proxy URL in the environment with `<redacted>`.
fn redact_proxy_credentials(mut text: String) -> String {
    for var in ["ALL_PROXY", "all_proxy", "HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"] {
        let Ok(url) = std::env::var(var) else { continue };
        let rest = url.split_once("://").map_or(url.as_str(), |(_, r)| r);
        let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
        if let Some((userinfo, _)) = authority.rsplit_once('@') {
            for secret in userinfo.split(':').filter(|s| !s.is_empty()) {
                text = text.replace(secret, "<redacted>");
            }
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_urls_are_checked_and_never_carry_credentials() {
        assert_eq!(ProxyUrl::parse("socks5h://127.0.0.1:1080").unwrap().as_str(), "socks5h://127.0.0.1:1080");
        assert_eq!(ProxyUrl::parse(" http://proxy.lan:3128/ ").unwrap().as_str(), "http://proxy.lan:3128");
        let e = ProxyUrl::parse("http://bob:hunter2@proxy:3128").unwrap_err().to_string();
        assert!(e.contains("must not contain credentials") && !e.contains("hunter2"), "{e}");
        for bad in ["proxy:3128", "ftp://p:21", "http://p", "http://p:0", "http://:80", "http://p:80/x"] {
            assert!(ProxyUrl::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn hosts_are_named_without_credentials() {
        assert_eq!(url_host("https://api.telegram.org/bot123:abc/getMe"), "api.telegram.org");
        assert_eq!(url_host("https://u:p@h.example:8443/x"), "h.example:8443");
        assert_eq!(url_host("http://[::1]:80"), "[::1]:80");
    }

    #[test]
    fn certificate_errors_are_put_in_words() {
        use rustls::CertificateError as C;
        for (c, want) in [
            (C::UnknownIssuer, "unknown issuer"),
            (C::NotValidForName, "not valid for this host name"),
            (C::Expired, "expired"),
        ] {
            let io = std::io::Error::new(std::io::ErrorKind::InvalidData, rustls::Error::InvalidCertificate(c));
            let why = io_tls_reason(&io).unwrap();
            assert!(why.contains(want), "{why}");
            let d = describe(&ureq::Error::Io(io), "https://api.example:8443/bot1:2/getMe");
            assert!(d.starts_with("TLS with api.example:8443 failed: "), "{d}");
            assert!(CertProblem::find(&d).is_some(), "doctor finds it again: {d}");
        }
        for p in CertProblem::ALL {
            assert_eq!(CertProblem::find(&format!("telegram: TLS with h:1 failed: {}", p.words())), Some(p));
        }
        assert_eq!(CertProblem::find("h:1: connection refused"), None);
        let plain = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert_eq!(io_tls_reason(&plain), None);
    }

    /// An OS with no roots (SSL_CERT_FILE and SSL_CERT_DIR name empty places): the bundled
    /// Mozilla roots are used, not an empty store. The only test here that loads the system
    /// roots, which happens once per process.
    #[test]
    fn no_system_roots_means_the_bundled_ones() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        // SAFETY: set before anything in this test process reads the environment.
        unsafe {
            std::env::set_var("SSL_CERT_FILE", &empty);
            std::env::set_var("SSL_CERT_DIR", dir.path().join("no-such-dir"));
        }
        let tls = ClientTls::system();
        assert_eq!(tls.source(), &RootSource::Bundled);
        assert!(tls.root_store().roots.len() > 100, "Mozilla's roots");
        assert!(tls.rustls_config().is_ok());
    }

    #[test]
    fn ca_files_are_read_carefully() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.pem");
        assert!(ClientTls::from_ca_file(&missing).unwrap_err().to_string().contains("no such file"));
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "hello").unwrap();
        assert!(ClientTls::from_ca_file(&junk).unwrap_err().to_string().contains("holds no PEM certificate"));
        let big = dir.path().join("big.pem");
        std::fs::write(&big, vec![b'a'; (MAX_CA_FILE_BYTES + 1) as usize]).unwrap();
        assert!(ClientTls::from_ca_file(&big).unwrap_err().to_string().contains("larger than"));
        #[cfg(unix)]
        {
            let link = dir.path().join("link.pem");
            std::os::unix::fs::symlink(&junk, &link).unwrap();
            assert!(ClientTls::from_ca_file(&link).is_err());
        }
    }
}
