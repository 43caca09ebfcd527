//! Real TLS for tests: a throwaway CA made at test time (rcgen; nothing is checked in) and a
//! TLS-terminating front that puts any loopback plain-TCP server (the Telegram fake, an
//! OpenAI-compatible fake, an update source) behind a certificate of the test's choosing.
//!
//! The front counts what reached it: `accepted` TCP connections, `handshakes` completed and
//! `forwarded` bytes to the plain server, so a test can prove that a refused certificate sent
//! nothing (zero handshakes, zero bytes) rather than only that the client reported an error.

use std::io;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// A certificate authority that exists for one test.
pub struct TestCa {
    params: CertificateParams,
    key: KeyPair,
    pem: String,
    der: CertificateDer<'static>,
}

/// A server certificate (with its chain: leaf, then the CA) and its private key.
#[derive(Clone)]
pub struct Leaf {
    pub chain: Vec<CertificateDer<'static>>,
    pub key_pkcs8: Vec<u8>,
    pub cert_pem: String,
    pub key_pem: String,
}

/// How a leaf certificate should be (in)valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Validity {
    /// Valid now (the default rcgen period, 1975 to 4096).
    Now,
    /// Expired in 2001.
    Expired,
}

impl TestCa {
    /// A new CA named `name` (its common name).
    pub fn new(name: &str) -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("CA key");
        let cert = params.self_signed(&key).expect("self-signed CA");
        TestCa { pem: cert.pem(), der: cert.der().clone(), params, key }
    }

    /// The CA certificate, PEM.
    pub fn pem(&self) -> &str {
        &self.pem
    }

    /// Writes the CA certificate to `dir/<file>` and returns the path (for `ca_file`).
    pub fn write_pem(&self, dir: &Path, file: &str) -> PathBuf {
        let path = dir.join(file);
        std::fs::write(&path, &self.pem).expect("write CA PEM");
        path
    }

    /// A server certificate for `names` (DNS names or IP addresses) signed by this CA.
    pub fn leaf(&self, names: &[&str], validity: Validity) -> Leaf {
        let mut params =
            CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>()).expect("leaf params");
        params.distinguished_name.push(DnType::CommonName, names.first().copied().unwrap_or("leaf"));
        params.is_ca = IsCa::NoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        if validity == Validity::Expired {
            params.not_before = rcgen::date_time_ymd(2000, 1, 1);
            params.not_after = rcgen::date_time_ymd(2001, 1, 1);
        }
        let key = KeyPair::generate().expect("leaf key");
        let issuer = Issuer::from_params(&self.params, &self.key);
        let cert = params.signed_by(&key, &issuer).expect("signed leaf");
        Leaf {
            chain: vec![cert.der().clone(), self.der.clone()],
            key_pkcs8: key.serialize_der(),
            cert_pem: format!("{}{}", cert.pem(), self.pem),
            key_pem: key.serialize_pem(),
        }
    }
}

/// A rustls server configuration presenting `leaf`.
pub fn server_config(leaf: &Leaf) -> Arc<rustls::ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_no_client_auth()
        .with_single_cert(leaf.chain.clone(), PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf.key_pkcs8.clone())))
        .expect("server certificate");
    Arc::new(config)
}

/// What a [`TlsFront`] has seen.
#[derive(Debug, Default)]
pub struct FrontCounts {
    accepted: AtomicU64,
    handshakes: AtomicU64,
    forwarded: AtomicU64,
}

/// A TLS-terminating front on 127.0.0.1: every connection is decrypted and relayed to the
/// plain-TCP `backend`. Stops (and drops every relayed connection) when dropped.
pub struct TlsFront {
    addr: SocketAddr,
    counts: Arc<FrontCounts>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TlsFront {
    /// Listens on an ephemeral loopback port.
    pub fn start(backend: SocketAddr, leaf: &Leaf) -> io::Result<TlsFront> {
        TlsFront::start_on(StdListener::bind("127.0.0.1:0")?, backend, leaf)
    }

    /// Listens on `listener` (a test that restarts the front keeps its port).
    pub fn start_on(listener: StdListener, backend: SocketAddr, leaf: &Leaf) -> io::Result<TlsFront> {
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let acceptor = tokio_rustls::TlsAcceptor::from(server_config(leaf));
        let counts = Arc::new(FrontCounts::default());
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let c = Arc::clone(&counts);
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let thread = std::thread::Builder::new().name("testkit-tls-front".into()).spawn(move || {
            rt.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::from_std(listener) else { return };
                loop {
                    let (tcp, _) = tokio::select! {
                        _ = &mut stopped => return,
                        r = listener.accept() => match r { Ok(x) => x, Err(_) => continue },
                    };
                    c.accepted.fetch_add(1, Ordering::SeqCst);
                    let (acceptor, c) = (acceptor.clone(), Arc::clone(&c));
                    tokio::spawn(async move {
                        let Ok(mut tls) = acceptor.accept(tcp).await else { return };
                        c.handshakes.fetch_add(1, Ordering::SeqCst);
                        let Ok(mut plain) = tokio::net::TcpStream::connect(backend).await else { return };
                        if let Ok((up, _)) = tokio::io::copy_bidirectional(&mut tls, &mut plain).await {
                            c.forwarded.fetch_add(up, Ordering::SeqCst);
                        }
                    });
                }
            });
        })?;
        Ok(TlsFront { addr, counts, stop: Some(stop), thread: Some(thread) })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// TCP connections accepted.
    pub fn accepted(&self) -> u64 {
        self.counts.accepted.load(Ordering::SeqCst)
    }

    /// TLS handshakes that completed (a client that refused the certificate completes none).
    pub fn handshakes(&self) -> u64 {
        self.counts.handshakes.load(Ordering::SeqCst)
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
