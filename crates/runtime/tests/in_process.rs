//! Whole gateways driven inside the test process through `serve` (issue 19): the main loop's
//! classification, the drain, a chat `/restart` and the intake seal, without spawning the
//! binary. Signals come from a channel, the HTTP API is real (a loopback listener), the control
//! channel is the home's real socket. What only processes show — real signals, the home lock,
//! exit codes of the binary — stays in crates/gatewarden/tests.
#![cfg(unix)]

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use gatewarden_control::{Client, Endpoint, Op, Requester, StopReason};
use gatewarden_lifecycle::records::GatewayState;
use gatewarden_lifecycle::supervisor::Detection;
use gatewarden_lifecycle::{ExitIntent, Home, Supervisor};
use gatewarden_platforms::Inbound;
use gatewarden_runtime::gateway::Incarnation;
use gatewarden_runtime::signals::{Signal, SignalKind, SignalSender};
use gatewarden_runtime::{App, Outcome, RunOptions, intake, prepare, serve};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

/// The bound of every wait on the gateway.
const DEADLINE: Duration = Duration::from_secs(15);
const TOKEN: &str = "t0k-0123456789abcdef";
/// Chat `/restart` and `/stop` need an admin who came with the API token.
const ADMIN: &str = "api_token = \"t0k-0123456789abcdef\"\nadmins = [\"u-s\"]\n";

/// One gateway served in this process.
struct Gw {
    app: Arc<App>,
    addr: String,
    signals: mpsc::UnboundedSender<Signal>,
    task: tokio::task::JoinHandle<Outcome>,
}

impl Gw {
    /// Serves `home` (its config.toml) as if launched under `supervisor`; returns once running.
    async fn start(home: &Home, supervisor: Supervisor) -> Gw {
        let gw = Gw::launch(home, supervisor, None).await;
        wait_phase(&gw.app, |p| p == GatewayState::Running).await;
        gw
    }

    /// Serves `home`; `early` is a signal that is already pending when `serve` starts.
    async fn launch(home: &Home, supervisor: Supervisor, early: Option<SignalKind>) -> Gw {
        let me = Incarnation::current(SystemTime::now(), Instant::now());
        let detection = Detection { supervisor, evidence: "in-process test".into() };
        let (app, mut opts) = prepare(home, RunOptions::for_home(home.clone()), me, detection)
            .unwrap_or_else(|o| panic!("prepare: {}", o.reason));
        // Successors and restart backstops are processes: a harmless one here, which says it
        // is prepared (crates/runtime/src/restart.rs) and lives on a while, as a successor
        // waiting for the lock would.
        opts.exe = Some(fake_successor(home, PREPARED));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (signals, rx) = mpsc::unbounded_channel();
        if let Some(s) = early {
            signals.send(s.into()).unwrap();
        }
        let served = Arc::clone(&app);
        let task = tokio::spawn(async move { serve(served, listener, rx, &opts).await });
        Gw { app, addr, signals, task }
    }

    /// The outcome `serve` reported, within the deadline.
    async fn outcome(self) -> Outcome {
        tokio::time::timeout(DEADLINE, self.task).await.expect("serve did not return in time").expect("serve panicked")
    }

    fn incarnation(&self) -> String {
        self.app.me.id.clone()
    }
}

/// The stand-in's answer: a preflight says it and exits, a successor lives on.
const PREPARED: &str = "echo prepared $$; case \"$*\" in *--preflight*) exit 0;; *--successor*) exec sleep 20;; esac";

/// An executable script in `home` standing in for the gatewarden binary a restart runs.
fn fake_successor(home: &Home, body: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = home.dir().join("fake-gatewarden.sh");
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// A home with `config` as its config.toml.
fn home_with(config: &str) -> (tempfile::TempDir, Home) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.toml"), config).unwrap();
    let home = Home::at(dir.path()).ensure().unwrap();
    (dir, home)
}

async fn wait_phase(app: &App, want: impl Fn(GatewayState) -> bool) {
    let mut rx = app.phase.subscribe();
    let reached = tokio::time::timeout(DEADLINE, rx.wait_for(|p| want(*p))).await;
    assert!(matches!(reached, Ok(Ok(_))), "phase stuck at {:?}", app.phase.get());
}

/// Polls an in-process condition until it holds, within the deadline.
async fn wait_until(what: &str, f: impl Fn() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < DEADLINE, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The ledger's events named `name`, oldest first.
fn events(home: &Home, name: &str) -> Vec<Value> {
    let lines = gatewarden_lifecycle::ledger::read_tail(&home.ledger(), None).ok().unwrap_or_default();
    lines
        .into_iter()
        .filter_map(|l| match l {
            gatewarden_lifecycle::ledger::Line::Event(e) if e.get("event") == Some(&json!(name)) => {
                Some(Value::Object(e))
            }
            _ => None,
        })
        .collect()
}

struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    body: Value,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

/// One HTTP/1.1 request on its own connection.
async fn http(addr: &str, method: &str, path: &str, body: Option<&Value>, token: Option<&str>) -> Resp {
    let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
    let body = body.map(Value::to_string).unwrap_or_default();
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    c.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(DEADLINE, c.read_to_end(&mut raw)).await.expect("response in time").unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines.next().and_then(|l| l.split_whitespace().nth(1)).and_then(|s| s.parse().ok()).unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let body = serde_json::from_str(body).unwrap_or_else(|_| Value::String(body.to_owned()));
    Resp { status, headers, body }
}

async fn send(addr: &str, chat: &str, user: &str, text: &str) -> Resp {
    http(addr, "POST", "/v1/messages", Some(&json!({"chat_id": chat, "user_id": user, "text": text})), Some(TOKEN))
        .await
}

async fn send_async(addr: &str, chat: &str, text: &str) -> Resp {
    let m = json!({"chat_id": chat, "user_id": "u", "text": text, "async": true});
    http(addr, "POST", "/v1/messages", Some(&m), Some(TOKEN)).await
}

/// The message's final row (done or failed), within the deadline.
async fn wait_final(addr: &str, id: &str) -> Value {
    let t0 = Instant::now();
    loop {
        let m = http(addr, "GET", &format!("/v1/messages/{id}"), None, Some(TOKEN)).await.body;
        if matches!(m["state"].as_str(), Some("done" | "failed")) {
            return m;
        }
        assert!(t0.elapsed() < DEADLINE, "message {id} not final: {m}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A control request through the home's real control socket.
async fn control(home: &Home, op: Op) -> Value {
    let ep = Endpoint::for_home(home.dir());
    tokio::task::spawn_blocking(move || Client::connect(&ep, DEADLINE).and_then(|mut c| c.call(op, DEADLINE)))
        .await
        .unwrap()
        .expect("control request")
}

fn inbound(event: &str, text: &str) -> Inbound {
    Inbound {
        event_id: event.into(),
        chat_id: "c7".into(),
        user_id: "u7".into(),
        text: text.into(),
        sent_at: None,
        chat: gatewarden_platforms::ChatKind::Direct,
        listed: false,
        addressed: true,
        attachments: Vec::new(),
    }
}

/// The platform "chat-x" the deliveries name, open to anyone (the access policy is tested in
/// crates/runtime/src/access/ and crates/gatewarden/tests/pairing.rs).
fn open_chat_x(app: &App) {
    use gatewarden_config::{Access, Config, PlatformConfig, PlatformKind};
    let mut c = Config::default();
    c.platform.push(PlatformConfig {
        name: Some("chat-x".into()),
        access: Some(Access::Open),
        ..PlatformConfig::new(PlatformKind::Telegram)
    });
    app.work.gate.policies.apply(&c);
}

/// A platform delivery through the intake, as the platform host makes it (blocking).
async fn deliver(app: &Arc<App>, m: Inbound) -> Result<(), String> {
    let app = Arc::clone(app);
    tokio::task::spawn_blocking(move || intake::deliver(&app.gw, &*app.work, "chat-x", m)).await.unwrap()
}

/// Every cause the main loop classifies, and the exit it decides (was lifecycle.rs's D1
/// signal table, b2's marker-only stop and the control channel's verbs, each a process).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classify_maps_each_cause_to_its_exit() {
    const ECHO: &str = "[agent]\nbackend = \"echo\"\n";
    let cli = |channel: &str| Requester { pid: 4242, argv: vec!["gatewarden".into()], channel: channel.into() };
    type Inject = Box<dyn Fn(&Gw, &Home) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>>;
    let signal = |s: SignalKind| -> Inject {
        Box::new(move |g: &Gw, _: &Home| {
            g.signals.send(s.into()).unwrap();
            Box::pin(async {})
        })
    };
    let from_parent = || -> Inject {
        Box::new(move |g: &Gw, _: &Home| {
            g.signals.send(sigterm_from(parent())).unwrap();
            Box::pin(async {})
        })
    };
    let op = |op: Op| -> Inject {
        Box::new(move |_: &Gw, h: &Home| {
            let (h, op) = (h.clone(), op.clone());
            Box::pin(async move {
                assert_eq!(control(&h, op).await["accepted"], json!(true));
            })
        })
    };
    let marker = |then_sigterm: bool| -> Inject {
        Box::new(move |g: &Gw, h: &Home| {
            let me = gatewarden_lifecycle::identity::ProcessIdentity {
                pid: g.app.me.pid,
                start_time: g.app.me.start_time.expect("a start time on Linux"),
            };
            gatewarden_lifecycle::marker::write(
                h.dir(),
                gatewarden_lifecycle::marker::MarkerKind::PlannedStop,
                me,
                &g.app.home_str,
            )
            .unwrap();
            if then_sigterm {
                g.signals.send(SignalKind::Terminate.into()).unwrap();
            }
            Box::pin(async {})
        })
    };
    let cases: Vec<(&str, Inject, ExitIntent, Option<&str>)> = vec![
        // Under the declared supervisor of these gateways (`external`), a bare SIGTERM from it
        // (our parent) is its stop; from anyone else, or with none proven, nobody's (below).
        ("bare SIGTERM from the parent", from_parent(), ExitIntent::PlannedStop, Some("stop_requested")),
        ("SIGQUIT", signal(SignalKind::Quit), ExitIntent::Unexpected, Some("stop_requested")),
        ("SIGINT", signal(SignalKind::Interrupt), ExitIntent::PlannedStop, Some("stop_requested")),
        ("SIGUSR1", signal(SignalKind::Restart), ExitIntent::PlannedRestart, Some("restart_backstop")),
        ("marker, then SIGTERM", marker(true), ExitIntent::PlannedStop, Some("stop_requested")),
        ("marker only", marker(false), ExitIntent::PlannedStop, Some("stop_requested")),
        (
            "control stop",
            op(Op::Stop { requester: cli("cli"), reason: StopReason::Stop }),
            ExitIntent::PlannedStop,
            Some("stop_requested"),
        ),
        (
            "control takeover",
            op(Op::Stop { requester: cli("control"), reason: StopReason::Takeover }),
            ExitIntent::Takeover,
            Some("stop_requested"),
        ),
        // The restart CLI verifies by itself: no backstop.
        ("control restart", op(Op::Restart { requester: cli("cli") }), ExitIntent::PlannedRestart, None),
    ];
    for (what, inject, intent, event) in cases {
        let (_dir, home) = home_with(ECHO);
        // A manager that restarts on exit: the restart route starts no successor.
        let g = Gw::start(&home, Supervisor::External).await;
        let inc = g.incarnation();
        inject(&g, &home).await;
        let o = g.outcome().await;
        assert_eq!(o.intent, intent, "{what}: {}", o.reason);
        let exited = events(&home, "exited");
        assert_eq!(exited.len(), 1, "{what}: {exited:?}");
        assert_eq!(exited[0]["code"], json!(intent.code()), "{what}: {}", exited[0]);
        assert_eq!(exited[0]["incarnation"], json!(inc), "{what}: {}", exited[0]);
        if let Some(e) = event {
            assert_eq!(events(&home, e).len(), 1, "{what}: no {e} in the ledger");
        }
        assert!(events(&home, "restart_backstop").len() <= 1, "{what}");
        if what == "control restart" {
            assert!(events(&home, "restart_backstop").is_empty(), "{what}: the CLI verifies by itself");
        }
    }
}

/// This process's parent: what a gateway served here takes for its supervisor.
fn parent() -> Option<u32> {
    gatewarden_lifecycle::platform::parent_pid(std::process::id())
}

/// A SIGTERM as the handler hands it over: from `pid`, or with `si_pid` 0 (`None`: from
/// outside the PID namespace).
fn sigterm_from(pid: Option<u32>) -> Signal {
    let sender = pid.map(|pid| SignalSender { pid, uid: 0, argv: vec!["kill".into()] });
    Signal { kind: SignalKind::Terminate, sender }
}

/// Issue 28 and its follow-up: a bare SIGTERM is the owner's stop only when the owner sent it.
/// As a container's PID 1 that is the runtime, from outside the PID namespace (`podman stop`,
/// a pod deletion: `si_pid` 0); under a declared supervisor, our parent. Then it is planned,
/// drained within the owner's budget, recorded as the owner's, and not the operator's durable
/// `stopped`. A stray `kill` (inside the container, of a supervised child) and any SIGTERM
/// with no supervisor proven or under systemd stay unexpected (exit 1): the owner revives it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bare_sigterm_is_the_owners_stop_only_where_an_owner_sends_it() {
    let stray = Some(std::process::id());
    let cases = [
        (Supervisor::Container, None, ExitIntent::PlannedStop, Some("container runtime")),
        (Supervisor::Container, stray, ExitIntent::Unexpected, None),
        (Supervisor::External, parent(), ExitIntent::PlannedStop, Some("declared supervisor")),
        (Supervisor::External, stray, ExitIntent::Unexpected, None),
        (Supervisor::External, None, ExitIntent::Unexpected, None),
        (Supervisor::None, None, ExitIntent::Unexpected, None),
        (Supervisor::Systemd, parent(), ExitIntent::Unexpected, None),
    ];
    for (sup, from, intent, by) in cases {
        // A run that outlives the owner's budget: the drain does not wait for it.
        let (_dir, home) =
            home_with(&format!("{ADMIN}drain_timeout_s = 60\n[agent]\nbackend = \"echo\"\ndelay_ms = 30000\n"));
        let g = Gw::start(&home, sup).await;
        let addr = g.addr.clone();
        // (Without an owner the configured 60 s drain would wait for it: no run there.)
        let slow = tokio::spawn(async move {
            if by.is_some() {
                send(&addr, "A", "a", "in flight").await;
            }
        });
        if by.is_some() {
            wait_until("the run to be active", || g.app.runs.active() == 1).await;
        }
        let t0 = Instant::now();
        g.signals.send(sigterm_from(from)).unwrap();
        let o = g.outcome().await;
        let took = t0.elapsed();
        assert_eq!(o.intent, intent, "{sup:?} from {from:?}: {}", o.reason);
        let stops = events(&home, "stop_requested");
        match by {
            Some(by) => {
                assert!(o.reason.contains(by), "{sup:?}: {}", o.reason);
                assert_eq!(stops.len(), 1, "{sup:?}: {stops:?}");
                assert_eq!((&stops[0]["reason"], &stops[0]["by"]), (&json!("owner_stop"), &json!(by)), "{sup:?}");
                assert_eq!(stops[0]["requester"]["channel"], json!("signal"));
                // Drained within the owner's budget, though drain_timeout_s is 60.
                assert!(took <= gatewarden_runtime::drain::OWNER_STOP_BUDGET, "{sup:?}: {took:?}");
                let drained = events(&home, "drained");
                assert_eq!(drained[0]["interrupted"], json!(1), "{sup:?}: {drained:?}");
            }
            // Nobody's stop: recorded with its sender as unexpected (exit 1).
            None => {
                assert_eq!(stops.len(), 1, "{sup:?}: {stops:?}");
                assert_eq!(
                    (&stops[0]["reason"], &stops[0]["unexpected"]),
                    (&json!("SIGTERM"), &json!(true)),
                    "{sup:?} from {from:?}"
                );
                assert_eq!(stops[0]["requester"]["pid"], json!(from), "{sup:?}: the sender is recorded");
            }
        }
        // Never the operator's `stopped`: the owner's next start runs.
        let desired = gatewarden_lifecycle::desired::current(home.dir());
        assert_ne!(desired.want, gatewarden_lifecycle::desired::Want::Stopped, "{sup:?}: {desired:?}");
        slow.abort();
    }
}

/// A signal that is pending when the gateway starts is unexpected, whatever it is (D1): an
/// operator's SIGINT during start-up is not a planned stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_during_start_up_is_unexpected() {
    let (_dir, home) = home_with("[agent]\nbackend = \"echo\"\n");
    let g = Gw::launch(&home, Supervisor::External, Some(SignalKind::Interrupt)).await;
    let o = g.outcome().await;
    assert_eq!(o.intent, ExitIntent::Unexpected, "{}", o.reason);
    assert!(o.reason.contains("during start-up"), "{}", o.reason);
    assert_eq!(events(&home, "start_refused").len(), 1);
    assert!(events(&home, "ready").is_empty(), "it never became ready");
}

/// A SIGHUP pending at start-up ends nothing: the gateway becomes ready and then reloads (the
/// file may have changed after it was read); a SIGUSR2 is recorded and ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sighup_during_start_up_is_a_reload_once_running() {
    let (_dir, home) = home_with("[agent]\nbackend = \"echo\"\n");
    let g = Gw::launch(&home, Supervisor::External, Some(SignalKind::Reload)).await;
    g.signals.send(SignalKind::User2.into()).unwrap();
    wait_phase(&g.app, |p| p == GatewayState::Running).await;
    wait_until("the reload", || events(&home, "reload").len() == 1).await;
    wait_until("the ignored signal", || events(&home, "signal_ignored").len() == 1).await;
    assert!(events(&home, "start_refused").is_empty());
    g.signals.send(SignalKind::Interrupt.into()).unwrap();
    assert_eq!(g.outcome().await.intent, ExitIntent::PlannedStop);
}

/// Issue 30 §6: a stop recorded after this start was asked for, whose SIGTERM arrives during
/// start-up (a `stop` 12 ms after a `start`), prevents the start: `start_prevented` with the
/// stop's requester and a planned exit, never `start_refused` code 1 and an exit as a crash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_during_start_up_prevents_the_start_with_its_requester() {
    use gatewarden_lifecycle::desired::{self, Want};
    let (_dir, home) = home_with("[agent]\nbackend = \"echo\"\n");
    desired::record(home.dir(), Want::Stopped, "cli stop", false).unwrap();
    let g = Gw::launch(&home, Supervisor::External, Some(SignalKind::Terminate)).await;
    let o = g.outcome().await;
    assert_eq!(o.intent, ExitIntent::PlannedStop, "{}", o.reason);
    let prevented = events(&home, "start_prevented");
    assert_eq!(prevented.len(), 1, "{prevented:?}");
    assert_eq!(prevented[0]["requester"], json!("cli stop"), "{}", prevented[0]);
    assert!(events(&home, "start_refused").is_empty(), "{:?}", events(&home, "start_refused"));
    let exited = events(&home, "exited");
    assert_eq!(exited.last().map(|e| e["code"].clone()), Some(json!(0)), "{exited:?}");
}

/// While draining (was drain.rs's process test): sync messages get 503 + `Retry-After`; the
/// first 503 per chat per drain carries a notice, later ones do not; an async message gets 202
/// and stays queued, and the NEXT incarnation runs it once. The in-flight run is delivered,
/// and a new drain notices every chat again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draining_503_with_one_notice_per_chat_and_async_for_the_next_incarnation() {
    let (_dir, home) =
        home_with(&format!("{ADMIN}drain_timeout_s = 60\n[agent]\nbackend = \"echo\"\ndelay_ms = 3000\n"));
    let g = Gw::start(&home, Supervisor::External).await;
    let addr = g.addr.clone();
    let slow = tokio::spawn({
        let addr = addr.clone();
        async move { send(&addr, "A", "a", "in flight").await }
    });
    wait_until("the run to be active", || g.app.runs.active() == 1).await;
    g.signals.send(SignalKind::Interrupt.into()).unwrap();
    wait_phase(&g.app, |p| p == GatewayState::Draining).await;

    assert_eq!(http(&addr, "GET", "/readyz", None, None).await.status, 503, "readyz while draining");
    let b1 = send(&addr, "B", "b", "one").await;
    let b2 = send(&addr, "B", "b", "two").await;
    let c1 = send(&addr, "C", "c", "three").await;
    let completions = json!({"model": "x", "user": "D", "messages": [{"role": "user", "content": "hi"}]});
    let oa = http(&addr, "POST", "/v1/chat/completions", Some(&completions), Some(TOKEN)).await;
    let queued = send_async(&addr, "B", "for the next one").await;
    assert_eq!(g.app.phase.get(), GatewayState::Draining, "the drain ended before the checks ran");
    for (what, r) in [("B#1", &b1), ("B#2", &b2), ("C#1", &c1), ("completions", &oa)] {
        assert_eq!(r.status, 503, "{what}: {}", r.body);
        assert_eq!(r.header("retry-after"), Some("2"), "{what}: {:?}", r.headers);
    }
    let notice = |r: &Resp| r.body["notice"].as_str().map(str::to_owned);
    assert!(notice(&b1).is_some_and(|n| n.contains("stopping")), "first 503 for B carries a notice: {}", b1.body);
    assert_eq!(notice(&b2), None, "second 503 for B must not: {}", b2.body);
    assert!(notice(&c1).is_some(), "first 503 for C carries its own notice: {}", c1.body);
    assert_eq!(queued.status, 202, "async while draining is journaled: {}", queued.body);
    let id = queued.body["message_id"].as_str().unwrap().to_owned();
    let row = http(&addr, "GET", &format!("/v1/messages/{id}"), None, Some(TOKEN)).await.body;
    assert_eq!(row["state"], json!("queued"), "accepted while draining stays queued: {row}");

    let a = slow.await.unwrap();
    assert_eq!((a.status, &a.body["reply"]), (200, &json!("in flight")), "the in-flight run is delivered");
    let o = g.outcome().await;
    assert_eq!(o.intent, ExitIntent::PlannedStop, "{}", o.reason);
    let d = events(&home, "drained");
    assert_eq!((&d[0]["runs_at_start"], &d[0]["interrupted"]), (&json!(1), &json!(0)), "{}", d[0]);

    // The next incarnation runs the queued message once.
    let g2 = Gw::start(&home, Supervisor::External).await;
    let m = wait_final(&g2.addr, &id).await;
    assert_eq!(
        (m["state"].as_str(), m["reply"].as_str(), m["attempts"].as_i64()),
        (Some("done"), Some("for the next one"), Some(1)),
        "{m}"
    );
    // A new drain: B is told again.
    let slow = tokio::spawn({
        let addr = g2.addr.clone();
        async move { send(&addr, "A", "a", "again").await }
    });
    wait_until("the run to be active", || g2.app.runs.active() == 1).await;
    g2.signals.send(SignalKind::Interrupt.into()).unwrap();
    wait_phase(&g2.app, |p| p == GatewayState::Draining).await;
    let b3 = send(&g2.addr, "B", "b", "new drain").await;
    assert_eq!(b3.status, 503);
    assert!(notice(&b3).is_some(), "a new drain gives B a notice again: {}", b3.body);
    let _ = slow.await;
    assert_eq!(g2.outcome().await.intent, ExitIntent::PlannedStop);
}

/// A chat `/restart` (was restart.rs's F1/F2/F3 process tests): the requester is answered at
/// once, the bystander's run in flight is drained (delivered, not interrupted), the drain does
/// not wait on the requester, the exit is a planned restart, and the next incarnation's first
/// reply to the requester's chat carries one "back online" notice naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_restart_drains_the_bystander_and_the_next_incarnation_says_back_online() {
    let (_dir, home) =
        home_with(&format!("{ADMIN}drain_timeout_s = 180\n[agent]\nbackend = \"echo\"\ndelay_ms = 1500\n"));
    let g = Gw::start(&home, Supervisor::External).await;
    let addr = g.addr.clone();
    // Not an admin: refused, and nothing happens.
    let r = send(&addr, "S", "somebody", "/restart").await;
    assert_eq!(r.status, 403, "{}", r.body);
    let r =
        http(&addr, "POST", "/v1/messages", Some(&json!({"chat_id": "S", "user_id": "u-s", "text": "/restart"})), None)
            .await;
    assert_eq!(r.status, 401, "no token, no identity: {}", r.body);
    assert_eq!(g.app.phase.get(), GatewayState::Running);

    let b = tokio::spawn({
        let addr = addr.clone();
        async move {
            let t0 = Instant::now();
            (send(&addr, "B", "b", "bystander text").await, t0.elapsed())
        }
    });
    wait_until("the bystander's run to be active", || g.app.runs.active() == 1).await;
    let t_s = Instant::now();
    let r = send(&addr, "S", "u-s", "/restart").await;
    assert_eq!(
        (r.status, &r.body["reply"], &r.body["command"]),
        (200, &json!("restarting…"), &json!(true)),
        "{}",
        r.body
    );
    assert!(t_s.elapsed() < Duration::from_secs(1), "S answered after {:?}: S waited on B", t_s.elapsed());

    let (rb, took) = b.await.unwrap();
    assert_eq!((rb.status, &rb.body["reply"]), (200, &json!("bystander text")), "B gets its reply: {}", rb.body);
    assert!(took >= Duration::from_millis(1400), "B's run was cut short ({took:?})");
    let o = g.outcome().await;
    assert_eq!(o.intent, ExitIntent::PlannedRestart, "{}", o.reason);
    let req = events(&home, "restart_requested");
    assert_eq!(req.len(), 1);
    assert_eq!(req[0]["requester"]["channel"], json!("chat"), "{}", req[0]);
    let drained = events(&home, "drained");
    assert_eq!((&drained[0]["runs_at_start"], &drained[0]["interrupted"]), (&json!(1), &json!(0)), "{}", drained[0]);
    assert_eq!(events(&home, "restart_backstop").len(), 1, "a chat restart gets a backstop");

    let g2 = Gw::start(&home, Supervisor::External).await;
    let inc2 = g2.incarnation();
    let v = send(&g2.addr, "S", "u-s", "first").await.body;
    assert_eq!(v["reply"], json!("first"), "{v}");
    let notices = v["notices"].as_array().cloned().unwrap_or_default();
    assert_eq!(notices.len(), 1, "the first reply after the restart carries one notice: {v}");
    assert!(notices[0].as_str().is_some_and(|n| n.contains("back online") && n.contains(&inc2)), "{v}");
    let v = send(&g2.addr, "S", "u-s", "second").await.body;
    assert!(v.get("notices").is_none(), "told once: {v}");
    let none = http(&g2.addr, "GET", "/v1/notices?chat_id=S", None, Some(TOKEN)).await.body;
    assert_eq!(none["notices"], json!([]), "{none}");
    g2.signals.send(SignalKind::Interrupt.into()).unwrap();
    assert_eq!(g2.outcome().await.intent, ExitIntent::PlannedStop);
}

/// The intake seal: a platform message is journaled and run while running, journaled but left
/// queued (for the next incarnation) while draining, and refused once the gateway has written
/// its exit — the platform keeps it — so nothing is journaled behind the successor's recovery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn platform_intake_runs_while_running_queues_while_draining_and_is_sealed_at_exit() {
    let (_dir, home) = home_with("drain_timeout_s = 60\n[agent]\nbackend = \"echo\"\ndelay_ms = 300\n");
    let g = Gw::start(&home, Supervisor::External).await;
    let journal = Arc::clone(&g.app.work.journal);
    open_chat_x(&g.app);

    deliver(&g.app, inbound("1", "hello")).await.expect("taken while running");
    wait_until("the reply in the outbox", || {
        journal.outbox_pending("chat-x", 10).is_ok_and(|o| o.iter().any(|e| e.text == "hello"))
    })
    .await;
    // A redelivery is taken once.
    deliver(&g.app, inbound("1", "hello")).await.unwrap();
    // Commands are answered through the outbox; this platform lists no admins, so `/restart`
    // is refused (once: a redelivery is not answered again) and nothing restarts.
    deliver(&g.app, inbound("s", "/status")).await.unwrap();
    deliver(&g.app, inbound("r", "/restart")).await.unwrap();
    deliver(&g.app, inbound("r", "/restart")).await.unwrap();
    let texts: Vec<String> = journal.outbox_pending("chat-x", 10).unwrap().into_iter().map(|o| o.text).collect();
    assert_eq!(texts.iter().filter(|t| *t == "hello").count(), 1, "{texts:?}");
    assert!(texts.iter().any(|t| t.starts_with("gatewarden ") && t.contains("running")), "{texts:?}");
    let refused: Vec<&String> = texts.iter().filter(|t| t.contains("is for this platform's admins")).collect();
    assert_eq!(refused.len(), 1, "{texts:?}");
    assert!(events(&home, "restart_requested").is_empty());

    let slow = tokio::spawn({
        let addr = g.addr.clone();
        async move { send(&addr, "A", "a", "keeps the drain open").await }
    });
    wait_until("the run to be active", || g.app.runs.active() == 1).await;
    g.signals.send(SignalKind::Interrupt.into()).unwrap();
    wait_phase(&g.app, |p| p == GatewayState::Draining).await;
    deliver(&g.app, inbound("2", "while draining")).await.expect("journaled while draining");
    assert!(journal.has_event("chat-x", "2").unwrap());

    let _ = slow.await;
    let app = Arc::clone(&g.app);
    let o = g.outcome().await;
    assert_eq!(o.intent, ExitIntent::PlannedStop);
    assert_eq!(journal.queued(Some("chat-x"), "c7").unwrap().0, 1, "the draining delivery waits, queued");
    let sealed = deliver(&app, inbound("3", "after the exit")).await;
    assert!(sealed.as_ref().is_err_and(|e| e.contains("next incarnation")), "{sealed:?}");
    assert!(!journal.has_event("chat-x", "3").unwrap(), "nothing is journaled once sealed");
}

/// Chat commands over HTTP (was messages.rs's chat_commands_help_and_status and
/// commands_need_an_admin_when_a_token_is_set): `/help` and `/status` are for everyone,
/// answered at once and never runs; `/restart` and `/stop` from a non-admin are refused (403)
/// and change nothing; an admin's `/stop` is answered, then a planned stop that records the
/// operator's `stopped`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_commands_help_status_and_an_admins_stop() {
    let (_dir, home) = home_with(&format!("{ADMIN}[agent]\nbackend = \"echo\"\n"));
    let g = Gw::start(&home, Supervisor::External).await;
    let inc = g.incarnation();

    let v = send(&g.addr, "c", "anyone", "/help").await.body;
    assert_eq!(v["command"], json!(true), "{v}");
    let help = v["reply"].as_str().unwrap_or_default();
    for c in ["/status", "/restart", "/stop", "/help"] {
        assert!(help.contains(c), "/help should list {c}: {help:?}");
    }
    let v = send(&g.addr, "c", "anyone", "/status").await.body;
    let st = v["reply"].as_str().unwrap_or_default();
    assert!(st.contains(&inc) && st.contains("running"), "/status should name {inc} and `running`: {st:?}");
    let runs = g.app.work.metrics.ok.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(runs, 0, "commands are not runs");

    for cmd in ["/restart", "/stop", "/update"] {
        let r = send(&g.addr, "chat", "mallory", cmd).await;
        assert_eq!(r.status, 403, "{cmd} from a non-admin: {}", r.body);
    }
    assert!(events(&home, "restart_requested").is_empty() && events(&home, "stop_requested").is_empty());
    assert_eq!(g.app.phase.get(), GatewayState::Running);

    let r = send(&g.addr, "chat", "u-s", "/stop").await;
    assert_eq!((r.status, &r.body["reply"]), (200, &json!("stopping…")), "{}", r.body);
    let o = g.outcome().await;
    assert_eq!(o.intent, ExitIntent::PlannedStop, "{}", o.reason);
    let req = events(&home, "stop_requested");
    assert_eq!(req.len(), 1);
    assert_eq!((&req[0]["requester"]["channel"], &req[0]["want"]), (&json!("chat"), &json!("stopped")), "{}", req[0]);
}
