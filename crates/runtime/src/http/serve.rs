//! The HTTP accept loop: hyper HTTP/1 connections over our own listener, so that the phase
//! decides when accepting stops and how every open connection ends (`axum::serve`'s graceful
//! shutdown closes idle keep-alive connections at once, racing the client's next request).
//!
//! By phase:
//! - `starting`: nothing is accepted; early connections wait in the backlog instead of meeting
//!   a gateway that is not `running` yet (a successor finds the backlog full of clients).
//! - `running`: accept and serve.
//! - `draining`, no successor (plain stop, supervised restart): accept and serve as before;
//!   the handlers answer new sync work 503 + `Retry-After` (protocol.md §5).
//! - `draining` while handing over (a successor inherited our listening socket): stop accepting
//!   and drop our listener — the successor's inherited fd (and [`Gateway::kept_listener`]) keep
//!   the socket and its backlog, so new connections wait there for the successor. Open
//!   connections keep being served: their requests are runs the drain waits for
//!   ([`Gateway::accepts_work`]), and every response carries `Connection: close`, so each client
//!   moves to a new connection — the successor's — after at most one more request. An idle
//!   keep-alive connection is never closed here: the client may be sending on it right now.
//! - `stopping`: without a hand-over, graceful shutdown (idle connections close, in-flight
//!   responses finish) bounded by [`STOP_GRACE`], as before. While handing over, the connections
//!   still open first get [`IDLE_GRACE`] (ending early once none remain), so a client that just
//!   picked an idle connection still gets its response; then graceful shutdown, with in-flight
//!   requests bounded by what is left of the drain budget (at least [`STOP_GRACE`]). Runs still
//!   active then are cancelled, as the drain does, and get [`crate::drain::CANCEL_GRACE`].
//!
//! Floods (docs/security.md): open connections are capped ([`super::resources::connection_cap`],
//! below the descriptor limit so the lifecycle always has descriptors). At the cap a new
//! connection closes the oldest idle one (no request in flight: a slowloris head, an idle
//! keep-alive) and is served; when every connection is busy it gets a 503 with
//! `Connection: close` (a connection idle for less than [`EVICTABLE_AFTER`], or
//! [`UNSERVED_EVICTABLE_AFTER`] before its first request, counts as busy: it gets a moment to
//! send its request). A connection must deliver each request head within
//! `[http] header_timeout_s` of connecting or of its previous response (hyper's header timer,
//! which also bounds idle keep-alive); bodies are bounded in `super::body_deadline`.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, Request, header};
use gatewarden_lifecycle::records::GatewayState;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::{Service, service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::app::App;
use crate::gateway::Gateway;

/// While handing over: how long connections still open at `stopping` stay served before the
/// graceful shutdown closes the idle ones.
pub const IDLE_GRACE: Duration = Duration::from_secs(1);
/// How long in-flight responses get after the graceful shutdown starts (at least).
pub const STOP_GRACE: Duration = Duration::from_secs(2);

/// Serves `app` on `listener` until the phase says stop, then winds the connections down (see
/// the module docs). Returns once every connection has ended or its bound ran out; every wait
/// is bounded (at most the rest of `drain_timeout`, plus [`IDLE_GRACE`], [`STOP_GRACE`] and
/// [`crate::drain::CANCEL_GRACE`]).
pub async fn serve(listener: TcpListener, app: Router, gw: Arc<App>, drain_timeout: Duration) {
    // Again for a server started without `run` (tests); `run` tuned it before any thread.
    super::resources::tune_allocator();
    let nofile = super::resources::raise_nofile();
    let cap = super::resources::connection_cap(gw.work.http.max_connections, nofile);
    crate::info!(
        "HTTP: at most {cap} connection(s) (max_connections {}, descriptor limit {})",
        gw.work.http.max_connections,
        nofile.map_or("none".to_string(), |n| n.to_string())
    );
    let open = Arc::new(Open::new(cap));
    let lingering = Arc::new(AtomicUsize::new(0));
    let _trimmer = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(release_after_bursts(Arc::clone(&open))));
    let header_timeout = gw.work.http.header_timeout();
    let mut phase = gw.phase.subscribe();
    let router = TowerToHyperService::new(app);
    let shutdown = CancellationToken::new();
    let mut conns = JoinSet::new();
    // The latest drain's start (a cancelled drain returns to `running`; the next one counts anew).
    let mut draining_at = None;
    let mut p = phase.wait_for(|p| *p != GatewayState::Starting).await.map(|p| *p).unwrap_or(GatewayState::Stopping);
    // A drain handing over pauses accepting (the successor takes the backlog) but keeps the
    // listener: a cancelled drain accepts again.
    while !past_draining(p) {
        match p {
            GatewayState::Draining => {
                draining_at.get_or_insert_with(Instant::now);
            }
            _ => draining_at = None,
        }
        let accept = accepting(p, &gw);
        tokio::select! {
            biased;
            changed = phase.changed() => {
                p = if changed.is_ok() { *phase.borrow_and_update() } else { GatewayState::Stopping };
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            accepted = listener.accept(), if accept => match accepted {
                Ok((stream, _)) => match open.admit() {
                    Some(slot) => {
                        conns.spawn(connection(stream, router.clone(), Arc::clone(&gw), shutdown.clone(), slot, header_timeout));
                    }
                    None => refuse(stream, &lingering),
                },
                Err(e) => accept_failed(e).await,
            },
        }
    }
    drop(listener);

    // Handing over: the open connections are served until `stopping`, each ending after its
    // next response.
    let _ = phase.wait_for(|p| past_draining(*p)).await;
    let stopping_at = Instant::now();
    let handing_over = gw.handing_over();
    if handing_over && !conns.is_empty() {
        let _ = tokio::time::timeout(IDLE_GRACE, join_all(&mut conns)).await;
    }
    shutdown.cancel();
    let floor = Instant::now() + STOP_GRACE;
    let deadline = if handing_over { floor.max(draining_at.unwrap_or(stopping_at) + drain_timeout) } else { floor };
    if tokio::time::timeout_at(deadline, join_all(&mut conns)).await.is_ok() {
        return;
    }
    // Runs that came in on an open connection after the drain (handing over): cancelled like
    // the drain's own leftovers, so their clients get an answer instead of a cut connection.
    if gw.runs.active() > 0 && !gw.work.cancel.is_cancelled() {
        gw.work.cancel_all();
        let _ = tokio::time::timeout(crate::drain::CANCEL_GRACE, join_all(&mut conns)).await;
    }
    if !conns.is_empty() {
        crate::warn!("closing {} HTTP connection(s) that did not finish in time", conns.len());
    }
    conns.shutdown().await;
}

/// Whether the accept loop accepts in phase `p` (it starts once `starting` is over).
fn accepting(p: GatewayState, gw: &Gateway) -> bool {
    match p {
        GatewayState::Running => true,
        GatewayState::Draining => !gw.handing_over(),
        _ => false,
    }
}

fn past_draining(p: GatewayState) -> bool {
    !matches!(p, GatewayState::Starting | GatewayState::Running | GatewayState::Draining)
}

/// Whether responses tell clients to reconnect: while handing over, a new connection lands in
/// the backlog the successor serves.
fn moving_clients(gw: &Gateway) -> bool {
    gw.handing_over() && !matches!(gw.phase.get(), GatewayState::Starting | GatewayState::Running)
}

async fn join_all(conns: &mut JoinSet<()>) {
    while conns.join_next().await.is_some() {}
}

/// Past the cap with every connection busy: a 503 the client can read at once, then close.
/// Written without waiting (a fresh socket's send buffer is empty), so the accept loop never
/// blocks. Closing a socket with the request unread would reset it and could destroy the 503
/// before the client reads it, so a few refused connections linger briefly, reading; past
/// [`MAX_LINGERING`] they are closed at once.
fn refuse(stream: TcpStream, lingering: &Arc<AtomicUsize>) {
    const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nRetry-After: 1\r\n\
Content-Type: application/json\r\nContent-Length: 69\r\n\r\n\
{\"error\":{\"type\":\"overloaded\",\"message\":\"too many open connections\"}}";
    if stream.try_write(BUSY).is_err() || lingering.fetch_add(1, Ordering::AcqRel) >= MAX_LINGERING {
        lingering.fetch_sub(1, Ordering::AcqRel);
        return;
    }
    let lingering = Arc::clone(lingering);
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = stream;
        let _ = stream.shutdown().await;
        let _ = tokio::time::timeout(LINGER, async {
            let mut sink = [0u8; 1024];
            while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
        })
        .await;
        lingering.fetch_sub(1, Ordering::AcqRel);
    });
}

/// Refused connections that may linger at once, and for how long.
const MAX_LINGERING: usize = 64;
const LINGER: Duration = Duration::from_millis(500);

/// How long a connection must have been idle before the cap may evict it: one that has been
/// answered and waits for its next request, and one that has not completed a request yet (a
/// loaded gateway may not have read a request that is already in the socket buffer).
const EVICTABLE_AFTER: Duration = Duration::from_millis(250);
const UNSERVED_EVICTABLE_AFTER: Duration = Duration::from_secs(1);

/// The open connections, oldest first, for the cap and for evicting idle ones.
struct Open {
    cap: usize,
    epoch: std::time::Instant,
    next: AtomicU64,
    slots: Mutex<BTreeMap<u64, Arc<Slot>>>,
    /// The most connections open at once since the last memory release.
    peak: AtomicUsize,
}

/// One open connection: how many of its requests are in flight, and how to close it now.
struct Slot {
    id: u64,
    busy: AtomicUsize,
    /// Whether a request has been handled on it.
    served: std::sync::atomic::AtomicBool,
    /// Milliseconds after [`Open::epoch`] when the connection last became idle.
    idle_since: AtomicU64,
    evict: CancellationToken,
    epoch: std::time::Instant,
}

impl Slot {
    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// A connection's registration; dropped when its task ends, which frees its place.
struct Registered {
    slot: Arc<Slot>,
    open: Arc<Open>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.open.slots.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.slot.id);
    }
}

impl Open {
    fn new(cap: usize) -> Open {
        Open {
            cap,
            epoch: std::time::Instant::now(),
            next: AtomicU64::new(0),
            slots: Mutex::new(BTreeMap::new()),
            peak: AtomicUsize::new(0),
        }
    }

    /// A slot for a new connection: under the cap, or by evicting the oldest idle connection;
    /// `None` when every connection is busy.
    fn admit(self: &Arc<Self>) -> Option<Registered> {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let now = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        if slots.len() >= self.cap {
            let settled = |s: &Slot| {
                let grace = if s.served.load(Ordering::Acquire) { EVICTABLE_AFTER } else { UNSERVED_EVICTABLE_AFTER };
                u128::from(now.saturating_sub(s.idle_since.load(Ordering::Acquire))) >= grace.as_millis()
            };
            let idle = slots.values().find(|s| s.busy.load(Ordering::Acquire) == 0 && settled(s)).map(|s| s.id)?;
            if let Some(victim) = slots.remove(&idle) {
                victim.evict.cancel();
            }
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let slot = Arc::new(Slot {
            id,
            busy: AtomicUsize::new(0),
            served: std::sync::atomic::AtomicBool::new(false),
            idle_since: AtomicU64::new(now),
            evict: CancellationToken::new(),
            epoch: self.epoch,
        });
        slots.insert(id, Arc::clone(&slot));
        self.peak.fetch_max(slots.len(), Ordering::Relaxed);
        Some(Registered { slot, open: Arc::clone(self) })
    }

    fn len(&self) -> usize {
        self.slots.lock().map(|s| s.len()).unwrap_or(0)
    }
}

/// Marks its connection busy while a request is handled and its response body is sent.
struct Busy(Arc<Slot>);

impl Busy {
    fn new(slot: &Arc<Slot>) -> Busy {
        slot.busy.fetch_add(1, Ordering::AcqRel);
        slot.served.store(true, Ordering::Release);
        Busy(Arc::clone(slot))
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.idle_since.store(self.0.now(), Ordering::Release);
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that keeps its connection marked busy until it is sent or dropped.
struct BusyBody {
    inner: Body,
    _busy: Busy,
}

impl http_body::Body for BusyBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Hands memory freed after a burst of connections back to the OS: checked every few seconds,
/// acted on once the open connections fell well below their peak (the issue 8 measurement:
/// RSS stayed at 120-275 MB after 10k connections, idle is 7 MB).
async fn release_after_bursts(open: Arc<Open>) {
    const BURST: usize = 64;
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    loop {
        tick.tick().await;
        let (peak, now) = (open.peak.load(Ordering::Relaxed), open.len());
        if peak >= BURST && now <= peak / 4 {
            open.peak.store(now, Ordering::Relaxed);
            tokio::task::spawn_blocking(super::resources::release_memory);
        }
    }
}

/// hyper's read buffer per connection, at most (its default is ~400 KiB, which 500
/// connections streaming bodies grow to 200 MB). A request head must fit in it.
const READ_BUF_BYTES: usize = 16 * 1024;

/// One HTTP/1.1 connection (keep-alive), shut down gracefully once `shutdown` is cancelled,
/// closed at once when evicted by the cap.
async fn connection(
    stream: TcpStream,
    router: TowerToHyperService<Router>,
    gw: Arc<App>,
    shutdown: CancellationToken,
    registered: Registered,
    header_timeout: Duration,
) {
    // Streamed replies (SSE) are many small writes: Nagle would hold each behind the client's
    // delayed ACK of the previous one (up to 40 ms a token).
    let _ = stream.set_nodelay(true);
    // The client's address, for whoever needs to tell clients apart (the dashboard's login
    // throttle, crates/dashboard/src/web.rs).
    let peer = stream.peer_addr().ok();
    let evicted = registered.slot.evict.clone();
    let svc_slot = Arc::clone(&registered.slot);
    let svc = service_fn(move |mut req: Request<Incoming>| {
        if let Some(p) = peer {
            req.extensions_mut().insert(axum::extract::ConnectInfo(p));
        }
        let busy = Busy::new(&svc_slot);
        let response = router.call(req);
        let gw = Arc::clone(&gw);
        async move {
            let res = response.await?;
            let mut res = res.map(|inner| Body::new(BusyBody { inner, _busy: busy }));
            // Decided when the response is ready: a request that came in while running and
            // finishes during the hand-over moves its client too.
            if moving_clients(&gw) {
                res.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            Ok::<_, Infallible>(res)
        }
    });
    let mut conn = pin!(
        http1::Builder::new()
            .timer(TokioTimer::new())
            .max_buf_size(READ_BUF_BYTES)
            .header_read_timeout(header_timeout)
            .serve_connection(TokioIo::new(stream), svc)
    );
    tokio::select! {
        // Errors are the client's (reset, malformed request, header timeout); hyper already
        // answered what it could.
        _ = conn.as_mut() => return,
        () = evicted.cancelled() => return,
        () = shutdown.cancelled() => conn.as_mut().graceful_shutdown(),
    }
    tokio::select! {
        _ = conn.as_mut() => {}
        () = evicted.cancelled() => {}
    }
    drop(registered);
}

/// Per-connection failures are the client's business; anything else (out of descriptors) is
/// logged and retried after a pause, as `axum::serve` does.
async fn accept_failed(e: std::io::Error) {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(e.kind(), ConnectionRefused | ConnectionAborted | ConnectionReset) {
        return;
    }
    crate::warn!("cannot accept an HTTP connection: {e}; retrying in 1 s");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

#[cfg(test)]
mod tests {
    use std::time::{Instant as StdInstant, SystemTime};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::gateway::Incarnation;

    struct Fixture {
        gw: Arc<App>,
        addr: std::net::SocketAddr,
        server: tokio::task::JoinHandle<()>,
        _dir: tempfile::TempDir,
    }

    async fn fixture() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let home = gatewarden_lifecycle::Home::at(dir.path());
        let config = gatewarden_config::Config::default();
        let journal = Arc::new(gatewarden_journal::Journal::open_in(dir.path()).unwrap());
        let (wake, wakes) = crate::intake::Wake::channel();
        let work = Arc::new(crate::worker::Work::new(
            gatewarden_agent::build_agent(&config.agent),
            journal,
            &config,
            None,
            true,
            Default::default(),
            wake,
        ));
        let me = Incarnation::current(SystemTime::now(), StdInstant::now());
        let core = Arc::new(Gateway::new(
            home,
            me,
            gatewarden_lifecycle::supervisor::Detection {
                supervisor: gatewarden_lifecycle::Supervisor::None,
                evidence: "test".into(),
            },
            "test".into(),
        ));
        let gw = Arc::new(App::new(core, work, Default::default(), wakes));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(serve(
            listener,
            super::super::router(Arc::clone(&gw)),
            Arc::clone(&gw),
            Duration::from_secs(5),
        ));
        Fixture { gw, addr, server, _dir: dir }
    }

    /// One keep-alive `POST /v1/messages`: status and lower-cased head.
    async fn post(c: &mut TcpStream) -> std::io::Result<(u16, String)> {
        let body = r#"{"chat_id":"c","user_id":"u","text":"hi"}"#;
        let req = format!(
            "POST /v1/messages HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        c.write_all(req.as_bytes()).await?;
        let mut buf = Vec::new();
        loop {
            let mut chunk = [0u8; 4096];
            let n = c.read(&mut chunk).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            buf.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&buf).to_ascii_lowercase();
            let Some(end) = text.find("\r\n\r\n") else { continue };
            let len: usize = text[..end]
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                let status = text[9..12].parse().unwrap();
                return Ok((status, text[..end].to_string()));
            }
        }
    }

    /// Waits for the server to close `c`; returns how long that took.
    async fn closed_within(c: &mut TcpStream, bound: Duration) -> Option<Duration> {
        let t0 = StdInstant::now();
        let mut b = [0u8; 64];
        match tokio::time::timeout(bound, c.read(&mut b)).await {
            Ok(Ok(0)) | Ok(Err(_)) => Some(t0.elapsed()),
            _ => None,
        }
    }

    /// At the cap: a busy or fresh connection is never evicted; the oldest settled idle one is.
    #[test]
    fn the_cap_evicts_only_settled_idle_connections() {
        let open = Arc::new(Open::new(2));
        let a = open.admit().expect("under the cap");
        let b = open.admit().expect("under the cap");
        assert!(open.admit().is_none(), "both connections are fresh");
        // `a` served a request, then stays idle long enough; `b` is busy.
        drop(Busy::new(&a.slot));
        let _busy_b = Busy::new(&b.slot);
        std::thread::sleep(EVICTABLE_AFTER + Duration::from_millis(20));
        let c = open.admit().expect("evicts the settled idle connection");
        assert!(a.slot.evict.is_cancelled() && !b.slot.evict.is_cancelled());
        assert!(open.admit().is_none(), "b is busy and c is fresh");
        drop((a, c));
        assert_eq!(open.len(), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn nothing_is_accepted_before_running() {
        let f = fixture().await;
        let mut c = TcpStream::connect(f.addr).await.unwrap();
        let early = tokio::time::timeout(Duration::from_millis(300), post(&mut c)).await;
        assert!(early.is_err(), "answered while starting: {early:?}");
        // The request waited in the backlog; it is answered once running (its bytes are
        // already sent, so read on).
        f.gw.advance(GatewayState::Running);
        let mut b = vec![0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(5), c.read(&mut b)).await.unwrap().unwrap();
        assert!(String::from_utf8_lossy(&b[..n]).starts_with("HTTP/1.1 200"), "{:?}", String::from_utf8_lossy(&b[..n]));
    }

    /// A hand-over with a drain faster than the client: the request sent on a connection that
    /// was idle through the whole drain is served (200, a run) and tells the client to
    /// reconnect; the server ends as soon as no connection is left, well before IDLE_GRACE.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn handing_over_serves_open_connections_and_moves_their_clients() {
        let f = fixture().await;
        f.gw.advance(GatewayState::Running);
        let mut c = TcpStream::connect(f.addr).await.unwrap();
        let (status, head) = post(&mut c).await.unwrap();
        assert_eq!(status, 200, "{head}");
        assert!(!head.contains("connection: close"), "{head}");

        f.gw.set_handing_over();
        f.gw.advance(GatewayState::Draining);
        f.gw.advance(GatewayState::Stopping);
        tokio::time::sleep(Duration::from_millis(50)).await;
        let (status, head) = post(&mut c).await.unwrap();
        assert_eq!(status, 200, "a request on an open connection is served during the hand-over: {head}");
        assert!(head.contains("connection: close"), "{head}");
        assert!(closed_within(&mut c, Duration::from_secs(1)).await.is_some(), "closed after the response");
        let t0 = StdInstant::now();
        tokio::time::timeout(Duration::from_secs(5), f.server).await.unwrap().unwrap();
        assert!(t0.elapsed() < IDLE_GRACE / 2, "the server waited {:?} with no connection left", t0.elapsed());
    }

    /// A connection idle through the hand-over is closed only after IDLE_GRACE.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn handing_over_gives_idle_connections_a_grace() {
        let f = fixture().await;
        f.gw.advance(GatewayState::Running);
        let mut c = TcpStream::connect(f.addr).await.unwrap();
        assert_eq!(post(&mut c).await.unwrap().0, 200);
        f.gw.set_handing_over();
        f.gw.advance(GatewayState::Draining);
        f.gw.advance(GatewayState::Stopping);
        let took = closed_within(&mut c, Duration::from_secs(5)).await.expect("closed after the grace");
        // Given a grace, not closed at once: half of it is the bound, since the server's timer
        // starts before this clock does and Wine's timers are coarse (887 ms seen there).
        assert!(took >= IDLE_GRACE / 2, "idle connection closed after {took:?}");
        tokio::time::timeout(Duration::from_secs(5), f.server).await.unwrap().unwrap();
    }

    /// Without a successor: draining answers new sync work 503 + Retry-After on an open
    /// connection, and stopping closes an idle connection at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn without_a_successor_draining_answers_503_and_stopping_closes_idle_connections() {
        let f = fixture().await;
        f.gw.advance(GatewayState::Running);
        let mut c = TcpStream::connect(f.addr).await.unwrap();
        assert_eq!(post(&mut c).await.unwrap().0, 200);
        f.gw.advance(GatewayState::Draining);
        let (status, head) = post(&mut c).await.unwrap();
        assert_eq!(status, 503, "{head}");
        assert!(head.contains("retry-after: 2") && !head.contains("connection: close"), "{head}");
        // Still accepting while draining.
        let mut c2 = TcpStream::connect(f.addr).await.unwrap();
        assert_eq!(post(&mut c2).await.unwrap().0, 503);
        f.gw.advance(GatewayState::Stopping);
        let took = closed_within(&mut c, Duration::from_secs(1)).await.expect("idle connection closed at stopping");
        assert!(took < IDLE_GRACE / 2, "{took:?}");
        tokio::time::timeout(Duration::from_secs(5), f.server).await.unwrap().unwrap();
    }
}
