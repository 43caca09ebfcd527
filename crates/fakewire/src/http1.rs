//! One plain HTTP/1.1 request at a time, read and answered by hand: what crates/testkit's
//! fakes (Slack, Mattermost, WhatsApp, signal-cli, the OTLP collector, the static origin and
//! the CONNECT proxy) speak. Bounded: a head of at most [`MAX_HEAD`] bytes (lines of at most
//! [`MAX_LINE`]) and a body of at most the reader's own bound, so a hostile or stuck client
//! never makes a fake allocate without limit.

use std::io::{self, BufRead, Read, Write};

/// The most bytes of one head line.
pub const MAX_LINE: u64 = 8 << 10;
/// The most bytes of a whole head (request line and headers).
pub const MAX_HEAD: usize = 16 << 10;

/// A request's head: its request line's method and target, and its headers in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Head {
    pub method: String,
    /// As sent: the path with its query, or `host:port` for `CONNECT`.
    pub target: String,
    /// `(name, value)`, both trimmed, names as sent.
    pub headers: Vec<(String, String)>,
}

impl Head {
    /// The first header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// The target without its query.
    pub fn path(&self) -> &str {
        self.target.split_once('?').map_or(self.target.as_str(), |(p, _)| p)
    }

    /// The query (after `?`; empty without one).
    pub fn query(&self) -> &str {
        self.target.split_once('?').map_or("", |(_, q)| q)
    }

    /// The bearer token of `Authorization`, if any.
    pub fn bearer(&self) -> Option<&str> {
        self.header("authorization")?.strip_prefix("Bearer ")
    }
}

/// A whole request: its head and its `Content-Length` body.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Request {
    pub head: Head,
    pub body: Vec<u8>,
}

impl std::ops::Deref for Request {
    type Target = Head;
    fn deref(&self) -> &Head {
        &self.head
    }
}

fn bad(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.to_owned())
}

/// Reads a head's lines up to its blank line (line endings trimmed, the blank line not
/// included). An error when the connection ends first or the head is over its bounds; nothing
/// is read past the blank line.
pub fn read_head_lines(r: &mut impl BufRead) -> io::Result<Vec<String>> {
    let mut lines = Vec::new();
    let mut total = 0;
    loop {
        let mut line = String::new();
        let n = r.by_ref().take(MAX_LINE).read_line(&mut line)?;
        total += n;
        if n == 0 || total > MAX_HEAD {
            return Err(bad("bad head"));
        }
        let line = line.trim_end();
        if line.is_empty() {
            return Ok(lines);
        }
        lines.push(line.to_owned());
    }
}

/// Reads a request head, as [`read_head_lines`], and takes it apart.
pub fn read_head(r: &mut impl BufRead) -> io::Result<Head> {
    let lines = read_head_lines(r)?;
    let mut words = lines.first().map(|l| l.split(' ')).into_iter().flatten();
    let (method, target) = (words.next().unwrap_or_default().to_owned(), words.next().unwrap_or_default().to_owned());
    let headers = lines
        .iter()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    Ok(Head { method, target, headers })
}

/// Reads a whole request: its head, then as much of the `Content-Length` body as `max_body`
/// allows (a longer body is cut there, and its rest is left unread; none without the header).
pub fn read_request(r: &mut impl BufRead, max_body: usize) -> io::Result<Request> {
    let head = read_head(r)?;
    let len = head.header("content-length").and_then(|v| v.parse::<usize>().ok()).unwrap_or(0).min(max_body);
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    Ok(Request { head, body })
}

/// The reason phrase of the statuses the fakes answer with ("Status" for any other).
pub fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        413 => "Payload Too Large",
        415 => "Unsupported Media Type",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

/// Writes a response head: the status line and `headers` as given, then the blank line. For a
/// body of no known length (an event stream, a tunnel); [`write_response`] otherwise.
pub fn write_head(w: &mut impl Write, status: u16, headers: &[(&str, &str)]) -> io::Result<()> {
    let mut head = format!("HTTP/1.1 {status} {}\r\n", reason(status));
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    w.write_all(head.as_bytes())
}

/// Writes a whole response: the status line, `headers`, `Content-Length` and `body`, then
/// flushes. Pass `("Connection", "close")` for a one-request connection.
pub fn write_response(w: &mut impl Write, status: u16, headers: &[(&str, &str)], body: &[u8]) -> io::Result<()> {
    let len = body.len().to_string();
    let mut all = headers.to_vec();
    all.push(("Content-Length", &len));
    let mut out = Vec::with_capacity(body.len() + 256);
    write_head(&mut out, status, &all)?;
    out.extend_from_slice(body);
    w.write_all(&out)?;
    w.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufReader;

    #[test]
    fn reads_head_headers_and_a_bounded_body() {
        let raw = b"POST /api/v4/posts?x=1 HTTP/1.1\r\nHost: h\r\ncontent-length: 5\r\nAuthorization:  Bearer tok \r\n\r\nhelloGET / HTTP/1.1\r\n\r\n";
        let mut r = BufReader::new(&raw[..]);
        let req = read_request(&mut r, 1 << 20).unwrap();
        assert_eq!((req.method.as_str(), req.path(), req.query()), ("POST", "/api/v4/posts", "x=1"));
        assert_eq!(req.header("CONTENT-LENGTH"), Some("5"));
        assert_eq!(req.bearer(), Some("tok"));
        assert_eq!(req.body, b"hello");
        // Keep-alive: the next request follows on the same reader.
        let next = read_request(&mut r, 1 << 20).unwrap();
        assert_eq!((next.method.as_str(), next.target.as_str(), next.body.len()), ("GET", "/", 0));
        assert!(read_request(&mut r, 1 << 20).is_err(), "the connection ended");
        // A body over the bound is cut there.
        let cut = read_request(&mut BufReader::new(&raw[..]), 3).unwrap();
        assert_eq!(cut.body, b"hel");
    }

    #[test]
    fn oversized_or_short_requests_are_errors() {
        let long = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(MAX_HEAD));
        assert!(read_head(&mut BufReader::new(long.as_bytes())).is_err());
        let many = format!("GET / HTTP/1.1\r\n{}\r\n", "X: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n".repeat(MAX_HEAD / 32));
        assert!(read_head(&mut BufReader::new(many.as_bytes())).is_err());
        let short = b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc";
        assert!(read_request(&mut BufReader::new(&short[..]), 1 << 20).is_err());
        assert!(read_head(&mut BufReader::new(&b"GET / HTTP/1.1\r\nHost: h\r\n"[..])).is_err());
        // A head without a request line's words still parses (the fake answers it 404).
        let odd = read_head(&mut BufReader::new(&b"\xff\r\nnocolon\r\n\r\n"[..]));
        assert!(odd.is_err(), "not UTF-8: {odd:?}");
        let empty = read_head(&mut BufReader::new(&b"X\r\nnocolon\r\n\r\n"[..])).unwrap();
        assert_eq!((empty.method.as_str(), empty.target.as_str(), empty.headers.len()), ("X", "", 0));
    }

    #[test]
    fn writes_status_headers_length_and_body() {
        let mut out = Vec::new();
        write_response(&mut out, 429, &[("Retry-After", "3"), ("Connection", "close")], b"{}").unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 429 Too Many Requests\r\nRetry-After: 3\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"
        );
        let mut out = Vec::new();
        write_head(&mut out, 200, &[("Content-Type", "text/event-stream")]).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n");
    }
}
