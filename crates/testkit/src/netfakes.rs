//! Small loopback network fakes that count what they see: a static HTTP origin (an update
//! source), an HTTP CONNECT proxy and a SOCKS5 proxy. Plain std threads; each stops accepting
//! when dropped (its accept loop is woken by a connection to itself).

use std::io::{self, BufReader, Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gatewarden_fakewire::http1;

/// Bound on every read of a fake's client (a stuck test client never wedges a fake thread).
const IO_TIMEOUT: Duration = Duration::from_secs(30);

/// An accept loop on 127.0.0.1:0 running `serve` for every connection on its own thread.
pub(crate) struct Listener {
    pub(crate) addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl Listener {
    pub(crate) fn start(serve: impl Fn(TcpStream) + Send + Sync + 'static) -> io::Result<Listener> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let (s, serve) = (Arc::clone(&stop), Arc::new(serve));
        std::thread::Builder::new().name("testkit-netfake".into()).spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let _ = conn.set_read_timeout(Some(IO_TIMEOUT));
                let serve = Arc::clone(&serve);
                let _ = std::thread::Builder::new().name("testkit-netfake-conn".into()).spawn(move || serve(conn));
            }
        })?;
        Ok(Listener { addr, stop })
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
    }
}

/// Copies both ways until either side closes.
fn pump(a: TcpStream, b: TcpStream) {
    let (Ok(a2), Ok(b2)) = (a.try_clone(), b.try_clone()) else { return };
    let _ = a.set_read_timeout(None);
    let _ = b.set_read_timeout(None);
    let up = std::thread::spawn(move || {
        let (mut from, mut to) = (a2, b2);
        let _ = io::copy(&mut from, &mut to);
        let _ = to.shutdown(Shutdown::Write);
    });
    let (mut from, mut to) = (b, a);
    let _ = io::copy(&mut from, &mut to);
    let _ = to.shutdown(Shutdown::Write);
    let _ = up.join();
}

/// Answers `GET`s with fixed bytes (one body for every path, or a file per path) and counts
/// requests.
pub struct StaticHttp {
    listener: Listener,
    requests: Arc<AtomicU64>,
}

impl StaticHttp {
    pub fn start(body: Vec<u8>) -> io::Result<StaticHttp> {
        let body = Arc::new(body);
        StaticHttp::serve(move |_| Some(Arc::clone(&body)))
    }

    /// Answers `GET /<name>` with that file's bytes (a release directory: tarballs, SHA256SUMS,
    /// signatures), 404 for any other path.
    pub fn files(files: Vec<(String, Vec<u8>)>) -> io::Result<StaticHttp> {
        let files: Vec<(String, Arc<Vec<u8>>)> = files.into_iter().map(|(n, b)| (format!("/{n}"), Arc::new(b))).collect();
        StaticHttp::serve(move |path| files.iter().find(|(n, _)| n == path).map(|(_, b)| Arc::clone(b)))
    }

    fn serve(find: impl Fn(&str) -> Option<Arc<Vec<u8>>> + Send + Sync + 'static) -> io::Result<StaticHttp> {
        let requests = Arc::new(AtomicU64::new(0));
        let n = Arc::clone(&requests);
        let listener = Listener::start(move |conn| {
            let Ok(mut w) = conn.try_clone() else { return };
            let Ok(head) = http1::read_head(&mut BufReader::new(conn)) else { return };
            n.fetch_add(1, Ordering::SeqCst);
            let found = find(&head.target);
            let (status, body): (u16, &[u8]) = match (head.method.as_str(), &found) {
                ("GET", Some(b)) => (200, b),
                ("GET", None) => (404, b""),
                _ => (405, b""),
            };
            let headers = [("Content-Type", "application/octet-stream"), ("Connection", "close")];
            let _ = http1::write_response(&mut w, status, &headers, body);
        })?;
        Ok(StaticHttp { listener, requests })
    }

    pub fn addr(&self) -> SocketAddr {
        self.listener.addr
    }

    /// Requests answered so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::SeqCst)
    }
}

/// What a proxy saw.
#[derive(Debug, Default)]
struct ProxyLog {
    /// `host:port` of every tunnel opened.
    targets: Mutex<Vec<String>>,
    /// The `Proxy-Authorization` value or SOCKS5 `user:password` of each request, if any.
    credentials: Mutex<Vec<Option<String>>>,
}

/// A proxy on loopback that relays to the requested target and counts tunnels.
pub struct Proxy {
    listener: Listener,
    log: Arc<ProxyLog>,
    /// The URL clients use (`http://127.0.0.1:port` or `socks5h://127.0.0.1:port`).
    url: String,
}

impl Proxy {
    /// An HTTP proxy that supports `CONNECT` only (what an https client uses).
    pub fn http_connect() -> io::Result<Proxy> {
        let log = Arc::new(ProxyLog::default());
        let l = Arc::clone(&log);
        let listener = Listener::start(move |conn| {
            let Ok(mut w) = conn.try_clone() else { return };
            let mut r = BufReader::new(conn);
            let Ok(head) = http1::read_head(&mut r) else { return };
            let target = head.target.clone();
            l.credentials.lock().unwrap_or_else(|p| p.into_inner()).push(head.header("proxy-authorization").map(str::to_owned));
            if head.method != "CONNECT" {
                let _ = http1::write_response(&mut w, 405, &[], b"");
                return;
            }
            let Ok(up) = TcpStream::connect(&target) else {
                let _ = http1::write_response(&mut w, 502, &[], b"");
                return;
            };
            l.targets.lock().unwrap_or_else(|p| p.into_inner()).push(target);
            // A tunnel: no Content-Length, the target's bytes follow.
            if http1::write_head(&mut w, 200, &[]).is_err() {
                return;
            }
            // Nothing is buffered beyond the head: the client waits for our 200 first.
            pump(r.into_inner(), up);
        })?;
        let url = format!("http://{}", listener.addr);
        Ok(Proxy { listener, log, url })
    }

    /// A SOCKS5 proxy (RFC 1928; no authentication, or user/password per RFC 1929 when the
    /// client offers it) that resolves names itself, as `socks5h://` asks.
    pub fn socks5() -> io::Result<Proxy> {
        let log = Arc::new(ProxyLog::default());
        let l = Arc::clone(&log);
        let listener = Listener::start(move |mut conn| {
            let _ = socks5_session(&mut conn, &l);
        })?;
        let url = format!("socks5h://{}", listener.addr);
        Ok(Proxy { listener, log, url })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn addr(&self) -> SocketAddr {
        self.listener.addr
    }

    /// `host:port` of every tunnel opened so far.
    pub fn targets(&self) -> Vec<String> {
        self.log.targets.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The credentials each request carried.
    pub fn credentials(&self) -> Vec<Option<String>> {
        self.log.credentials.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

fn socks5_session(conn: &mut TcpStream, log: &ProxyLog) -> io::Result<()> {
    let mut b = [0u8; 2];
    conn.read_exact(&mut b)?;
    if b[0] != 5 {
        return Ok(());
    }
    let mut methods = vec![0u8; usize::from(b[1])];
    conn.read_exact(&mut methods)?;
    let mut creds = None;
    if methods.contains(&2) {
        conn.write_all(&[5, 2])?;
        let mut v = [0u8; 2];
        conn.read_exact(&mut v)?;
        let mut user = vec![0u8; usize::from(v[1])];
        conn.read_exact(&mut user)?;
        let mut plen = [0u8; 1];
        conn.read_exact(&mut plen)?;
        let mut pass = vec![0u8; usize::from(plen[0])];
        conn.read_exact(&mut pass)?;
        creds = Some(format!("{}:{}", String::from_utf8_lossy(&user), String::from_utf8_lossy(&pass)));
        conn.write_all(&[1, 0])?;
    } else if methods.contains(&0) {
        conn.write_all(&[5, 0])?;
    } else {
        conn.write_all(&[5, 0xff])?;
        return Ok(());
    }
    log.credentials.lock().unwrap_or_else(|p| p.into_inner()).push(creds);
    let mut h = [0u8; 4];
    conn.read_exact(&mut h)?;
    let host = match h[3] {
        1 => {
            let mut a = [0u8; 4];
            conn.read_exact(&mut a)?;
            Ipv4Addr::from(a).to_string()
        }
        3 => {
            let mut n = [0u8; 1];
            conn.read_exact(&mut n)?;
            let mut name = vec![0u8; usize::from(n[0])];
            conn.read_exact(&mut name)?;
            String::from_utf8_lossy(&name).into_owned()
        }
        4 => {
            let mut a = [0u8; 16];
            conn.read_exact(&mut a)?;
            format!("[{}]", Ipv6Addr::from(a))
        }
        _ => return Ok(()),
    };
    let mut p = [0u8; 2];
    conn.read_exact(&mut p)?;
    let target = format!("{host}:{}", u16::from_be_bytes(p));
    if h[1] != 1 {
        conn.write_all(&[5, 7, 0, 1, 0, 0, 0, 0, 0, 0])?;
        return Ok(());
    }
    let Ok(up) = TcpStream::connect(&target) else {
        conn.write_all(&[5, 5, 0, 1, 0, 0, 0, 0, 0, 0])?;
        return Ok(());
    };
    log.targets.lock().unwrap_or_else(|p| p.into_inner()).push(target);
    conn.write_all(&[5, 0, 0, 1, 0, 0, 0, 0, 0, 0])?;
    pump(conn.try_clone()?, up);
    Ok(())
}
