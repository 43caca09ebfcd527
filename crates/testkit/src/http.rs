use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl HttpResponse {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub fn json(&self) -> Result<serde_json::Value, String> {
        serde_json::from_slice(&self.body).map_err(|e| format!("{e}: {:?}", self.text()))
    }
}

/// Blocking `GET path` over HTTP/1.1 with `Connection: close`. Loopback addresses only (panics
/// otherwise: tests never talk to the network). Handles `Content-Length`, chunked, and
/// read-to-EOF bodies. `timeout` bounds connect and each read/write.
pub fn http_get(addr: SocketAddr, path: &str, timeout: Duration) -> std::io::Result<HttpResponse> {
    request(addr, "GET", path, &[], None, timeout)
}

/// Blocking `POST path` with a JSON body, otherwise like [`http_get`] (loopback only, one
/// request per connection, `timeout` bounds connect and each read/write).
pub fn http_post_json(
    addr: SocketAddr,
    path: &str,
    body: &serde_json::Value,
    timeout: Duration,
) -> std::io::Result<HttpResponse> {
    request(addr, "POST", path, &[], Some(body.to_string().as_bytes()), timeout)
}

/// One HTTP/1.1 request. `headers` are sent as given; a body gets `Content-Type:
/// application/json` unless a content type is among `headers`.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
    timeout: Duration,
) -> std::io::Result<HttpResponse> {
    // Loopback, or a private 10/8 address: where podman's networks put a pod
    // (10.88.0.0/16 and up; crates/gatewarden/tests/deploy.rs reaches each pod there).
    let local = match addr.ip() {
        std::net::IpAddr::V4(v4) => v4.is_loopback() || v4.octets()[0] == 10,
        std::net::IpAddr::V6(v6) => v6.is_loopback(),
    };
    assert!(local, "testkit api is loopback-only (or a podman network's), got {addr}");
    let s = TcpStream::connect_timeout(&addr, timeout)?;
    request_on(s, method, path, headers, body, timeout)
}

/// [`request`] on a connection opened earlier (one the server accepted before it stopped
/// accepting new ones, e.g. during a restart's hand-over).
pub fn request_on(
    mut s: TcpStream,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
    timeout: Duration,
) -> std::io::Result<HttpResponse> {
    let addr = s.peer_addr()?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nAccept: */*\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some(b) = body {
        if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("content-type")) {
            head.push_str("Content-Type: application/json\r\n");
        }
        head.push_str(&format!("Content-Length: {}\r\n", b.len()));
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    if let Some(b) = body {
        out.extend_from_slice(b);
    }
    s.write_all(&out)?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    parse(&raw).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("bad HTTP response: {:?}", String::from_utf8_lossy(&raw)),
        )
    })
}

/// Parses a whole HTTP/1.1 response (content-length, chunked, or read-to-close).
pub(crate) fn parse(raw: &[u8]) -> Option<HttpResponse> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&raw[..end]);
    let mut lines = head.split("\r\n");
    let status_line = lines.next()?;
    let status: u16 = status_line.split_whitespace().nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            Some((k.trim().to_ascii_lowercase(), v.trim().to_string()))
        })
        .collect();
    let rest = &raw[end + 4..];
    let chunked = headers.iter().any(|(k, v)| k == "transfer-encoding" && v.to_ascii_lowercase().contains("chunked"));
    let body = if chunked {
        dechunk(rest)?
    } else if let Some(len) =
        headers.iter().find(|(k, _)| k == "content-length").and_then(|(_, v)| v.parse::<usize>().ok())
    {
        rest.get(..len)?.to_vec()
    } else {
        rest.to_vec()
    };
    Some(HttpResponse { status, headers, body })
}

fn dechunk(mut b: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let nl = b.windows(2).position(|w| w == b"\r\n")?;
        let size_s = String::from_utf8_lossy(&b[..nl]);
        let size = usize::from_str_radix(size_s.split(';').next()?.trim(), 16).ok()?;
        b = &b[nl + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(b.get(..size)?);
        b = b.get(size + 2..)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_and_chunked() {
        let r = parse(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokXX").unwrap();
        assert_eq!((r.status, r.text().as_str()), (200, "ok"));
        let r = parse(b"HTTP/1.1 503 x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n").unwrap();
        assert_eq!((r.status, r.text().as_str()), (503, "abcde"));
    }

    #[test]
    fn talks_to_a_loopback_server() {
        use std::io::{Read, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            // Read the whole request head before answering, so closing never resets unread data.
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut buf).unwrap();
                assert!(n > 0, "client closed before finishing its request");
                head.extend_from_slice(&buf[..n]);
            }
            assert!(String::from_utf8_lossy(&head).starts_with("GET /readyz HTTP/1.1\r\n"));
            s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nready").unwrap();
        });
        let r = http_get(addr, "/readyz", Duration::from_secs(2)).unwrap();
        assert_eq!((r.status, r.text().as_str()), (200, "ready"));
        t.join().unwrap();
    }
}
