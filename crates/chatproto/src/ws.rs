//! The WebSocket client the Discord, Slack and Mattermost adapters share: tungstenite over a
//! TCP stream, with TLS only from crates/net's rustls configuration (a `ca_file` pins a private
//! CA), every connect and read bounded. What a protocol's frames mean stays in its adapter; what
//! a failure is called too: [`WsError`] names the stage and the cause, the adapter words it.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use gatewarden_net::{ClientTls, rustls};
use tungstenite::protocol::frame::coding::CloseCode;
use tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tungstenite::{Message, WebSocket};

/// A `ws://` or `wss://` URL split up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WsUrl {
    /// `wss://`.
    pub tls: bool,
    /// The host, an IPv6 address without its brackets.
    pub host: String,
    /// The port, 443 or 80 when the URL names none.
    pub port: u16,
    /// The path (`""` or starting with `/`), without the query.
    pub path: String,
}

impl WsUrl {
    /// `host:port` for messages, an IPv6 address in brackets.
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// Splits a `ws://` or `wss://` URL. `None`: another scheme, no host, user info, a bad port.
pub fn parse_url(url: &str) -> Option<WsUrl> {
    let (tls, rest) =
        if let Some(r) = url.strip_prefix("wss://") { (true, r) } else { (false, url.strip_prefix("ws://")?) };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    if authority.is_empty() || authority.contains('@') {
        return None;
    }
    let default = if tls { 443 } else { 80 };
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (h, after) = v6.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None if after.is_empty() => default,
            None => return None,
        };
        (h.to_owned(), port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_owned(), p.parse().ok()?),
            None => (authority.to_owned(), default),
        }
    };
    let path = tail.split('?').next().unwrap_or_default().to_owned();
    (!host.is_empty()).then_some(WsUrl { tls, host, port, path })
}

/// Where opening a connection failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// The name lookup.
    Resolve,
    /// TCP connect (every address tried).
    Connect,
    /// Socket options.
    Socket,
    /// The TLS client set-up (a bad name, a bad CA file).
    Tls,
    /// The WebSocket handshake, TLS's included.
    Handshake,
}

/// Why opening a connection failed: where, and the cause (a TLS failure in crates/net's words).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WsError {
    /// Where.
    pub stage: Stage,
    /// The cause.
    pub detail: String,
}

impl std::fmt::Display for WsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.detail)
    }
}

/// A plain or TLS TCP stream.
pub enum Stream {
    /// `ws://` (a loopback fake).
    Plain(TcpStream),
    /// `wss://`, rustls from crates/net.
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Stream {
    fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => s.get_ref(),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

/// How to open a connection.
#[derive(Debug, Clone)]
pub struct Options<'a> {
    /// The request URI of the handshake (query included).
    pub request: &'a str,
    /// Bound on connect, and the reads until [`Client::set_read_timeout`].
    pub timeout: Duration,
    /// Bound on each write.
    pub write_timeout: Duration,
    /// The largest message or frame accepted.
    pub max_message: usize,
}

/// One read's outcome.
#[derive(Debug)]
pub enum Incoming {
    /// A text message.
    Text(String),
    /// A ping, pong or binary message: the connection is alive.
    Other,
    /// The server's close frame, with its code and reason when it sent them.
    Close(Option<(u16, String)>),
    /// Nothing in the read timeout.
    Idle,
    /// The connection is closed (no close frame): tungstenite's words.
    Closed(String),
    /// Any other read failure: tungstenite's words.
    Failed(String),
}

/// One WebSocket connection.
pub struct Client {
    ws: WebSocket<Stream>,
}

impl Client {
    /// Connects to `url` (trying each address within `timeout`), with TLS verified by `tls`,
    /// and completes the WebSocket handshake.
    pub fn open(url: &WsUrl, tls: &ClientTls, opts: &Options<'_>) -> Result<Client, WsError> {
        let err = |stage, e: &dyn std::fmt::Display| WsError { stage, detail: e.to_string() };
        let addrs: Vec<_> =
            (url.host.as_str(), url.port).to_socket_addrs().map_err(|e| err(Stage::Resolve, &e))?.collect();
        let mut tcp = Err(err(Stage::Connect, &"no address"));
        for a in &addrs {
            match TcpStream::connect_timeout(a, opts.timeout) {
                Ok(s) => {
                    tcp = Ok(s);
                    break;
                }
                Err(e) => tcp = Err(err(Stage::Connect, &e)),
            }
        }
        let tcp = tcp?;
        tcp.set_read_timeout(Some(opts.timeout)).map_err(|e| err(Stage::Socket, &e))?;
        tcp.set_write_timeout(Some(opts.write_timeout)).map_err(|e| err(Stage::Socket, &e))?;
        let _ = tcp.set_nodelay(true);
        let stream = if url.tls {
            let name = rustls::pki_types::ServerName::try_from(url.host.clone())
                .map_err(|_| err(Stage::Tls, &format_args!("{:?} is not a host name", url.host)))?;
            let config = tls.rustls_config().map_err(|e| err(Stage::Tls, &e))?;
            let conn = rustls::ClientConnection::new(config, name).map_err(|e| err(Stage::Tls, &e))?;
            Stream::Tls(Box::new(rustls::StreamOwned::new(conn, tcp)))
        } else {
            Stream::Plain(tcp)
        };
        // A chat gateway reads a few events a second: tungstenite's 128 KiB read buffer (sized for
        // high read load) is allocated up front for each connection; 16 KiB holds a typical event
        // whole and grows for a bigger frame, up to `max_message`.
        let config = WebSocketConfig::default()
            .max_message_size(Some(opts.max_message))
            .max_frame_size(Some(opts.max_message))
            .read_buffer_size(16 * 1024);
        let (ws, _) = tungstenite::client::client_with_config(opts.request, stream, Some(config)).map_err(|e| {
            let why = match &e {
                tungstenite::HandshakeError::Failure(tungstenite::Error::Io(io)) => {
                    gatewarden_net::io_tls_reason(io).map_or_else(|| io.to_string(), |r| format!("TLS failed: {r}"))
                }
                tungstenite::HandshakeError::Failure(other) => other.to_string(),
                tungstenite::HandshakeError::Interrupted(_) => "timed out: no answer".to_owned(),
            };
            WsError { stage: Stage::Handshake, detail: why }
        })?;
        Ok(Client { ws })
    }

    /// How long each [`read`](Client::read) waits (at least 1 ms).
    pub fn set_read_timeout(&self, wait: Duration) {
        let _ = self.ws.get_ref().tcp().set_read_timeout(Some(wait.max(Duration::from_millis(1))));
    }

    /// Reads one message, waiting at most the read timeout.
    pub fn read(&mut self) -> Incoming {
        match self.ws.read() {
            Ok(Message::Text(t)) => Incoming::Text(t.as_str().to_owned()),
            Ok(Message::Close(frame)) => Incoming::Close(frame.map(|f| (u16::from(f.code), f.reason.to_string()))),
            Ok(_) => Incoming::Other,
            Err(tungstenite::Error::Io(e))
                if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) =>
            {
                Incoming::Idle
            }
            Err(e @ (tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed)) => {
                Incoming::Closed(e.to_string())
            }
            Err(e) => Incoming::Failed(e.to_string()),
        }
    }

    /// Sends a text message (tungstenite's words on failure).
    pub fn send_text(&mut self, text: String) -> Result<(), String> {
        self.ws.send(Message::text(text)).map_err(|e| e.to_string())
    }

    /// Sends a ping.
    pub fn ping(&mut self) -> Result<(), String> {
        self.ws.send(Message::Ping(Vec::new().into())).map_err(|e| e.to_string())
    }

    /// Writes a close frame (with `code`, else none) without waiting for the answer, and shuts
    /// the socket.
    pub fn close(&mut self, code: Option<u16>) {
        let _ = self.ws.close(code.map(|c| CloseFrame { code: CloseCode::from(c), reason: "".into() }));
        let _ = self.ws.flush();
        let _ = self.ws.get_ref().tcp().shutdown(std::net::Shutdown::Both);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_into_their_parts() {
        let u = parse_url("wss://wss-primary.slack.com/link/?ticket=t&app_id=A").unwrap();
        assert_eq!((u.tls, u.host.as_str(), u.port, u.path.as_str()), (true, "wss-primary.slack.com", 443, "/link/"));
        let p = parse_url("ws://127.0.0.1:9/api/v4/websocket").unwrap();
        assert_eq!(
            (p.tls, p.port, p.path.as_str(), p.authority().as_str()),
            (false, 9, "/api/v4/websocket", "127.0.0.1:9")
        );
        let v6 = parse_url("ws://[::1]:9/").unwrap();
        assert_eq!((v6.host.as_str(), v6.authority().as_str()), ("::1", "[::1]:9"));
        assert_eq!(parse_url("wss://h?x=1").unwrap().path, "");
        for bad in ["https://x/", "wss://u@x/", "wss://x:notaport/", "wss://", "wss://[::1", "wss://[::1]x"] {
            assert_eq!(parse_url(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_refused_connection_names_its_stage() {
        // A port nothing listens on (bound, then closed).
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let url = parse_url(&format!("ws://127.0.0.1:{port}/")).unwrap();
        let tls = ClientTls::new(None).unwrap();
        let opts = Options {
            request: "ws://127.0.0.1/",
            timeout: Duration::from_secs(2),
            write_timeout: Duration::from_secs(2),
            max_message: 1 << 20,
        };
        let e = Client::open(&url, &tls, &opts).err().unwrap();
        assert_eq!(e.stage, Stage::Connect, "{e}");
    }
}
