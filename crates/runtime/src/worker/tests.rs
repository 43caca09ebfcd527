//! The run path in-process, as mini-redis tests its server: a [`Work`] over a scripted agent and
//! the SQLite journal of a temporary home, driven through the calls the HTTP API and the
//! platform host make. No child process, no listener: each test waits on what the run path
//! itself signals (the agent starting, the wake for the outbox, the drain's idle runs).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use gatewarden_agent::{Agent, AgentError, AgentFuture, AgentReply, AgentRequest};
use gatewarden_journal::{Journal, Kind, Message, NewMessage, State, Step, Store};
use gatewarden_lifecycle::records::GatewayState;
use gatewarden_lifecycle::supervisor::Detection;
use gatewarden_lifecycle::{Home, Supervisor};
use gatewarden_platforms::Activity;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{REASON_CANCELLED, Work};
use crate::commands::Command;
use crate::gateway::{Gateway, Incarnation};
use crate::intake::{Nudge, Wake, WakeRx};

/// The bound of every wait.
const DEADLINE: Duration = Duration::from_secs(15);
/// The platform the tests' chat messages name.
const PLATFORM: &str = "chat-x";
/// What the scripted agent answers a failing run with.
const UPSTREAM_DOWN: &str = "upstream down (test)";

/// An agent whose answer the message text picks: `fail` fails, `hang` runs until cancelled
/// (when `hangs`), anything else is echoed. It says when a run has started, so a test can act
/// on a run in flight without guessing how long to wait.
struct Scripted {
    started: mpsc::UnboundedSender<String>,
    hangs: bool,
}

impl Agent for Scripted {
    fn name(&self) -> &str {
        "scripted"
    }

    fn start(
        &self,
        req: AgentRequest,
        cancel: CancellationToken,
        _chunks: Option<mpsc::Sender<String>>,
    ) -> AgentFuture<'_> {
        let _ = self.started.send(req.run_id.clone());
        let hangs = self.hangs;
        Box::pin(async move {
            match req.text.as_str() {
                "fail" => Err(AgentError::Failed(UPSTREAM_DOWN.into())),
                "hang" if hangs => {
                    cancel.cancelled().await;
                    Err(AgentError::Cancelled)
                }
                _ => Ok(AgentReply { text: format!("echo: {}", req.text), ..AgentReply::default() }),
            }
        })
    }
}

/// One incarnation's run path over the journal of `home`.
struct Fixture {
    work: Arc<Work>,
    gw: Arc<Gateway>,
    wakes: WakeRx,
    started: mpsc::UnboundedReceiver<String>,
}

impl Fixture {
    /// A running incarnation of `home` whose worker has started.
    fn start(home: &Home) -> Fixture {
        Fixture::start_with(home, true)
    }

    /// [`Fixture::start`] with an agent that answers `hang` at once unless it `hangs`.
    fn start_with(home: &Home, hangs: bool) -> Fixture {
        let (tx, started) = mpsc::unbounded_channel();
        let (wake, wakes) = Wake::channel();
        let config = gatewarden_config::Config::default();
        let journal: Arc<dyn Store> = Arc::new(Journal::open_in(home.dir()).expect("journal"));
        let agent: Box<dyn Agent> = Box::new(Scripted { started: tx, hangs });
        let work = Arc::new(Work::new(agent, journal, &config, None, true, Default::default(), wake));
        let me = Incarnation::current(SystemTime::now(), Instant::now());
        let detection = Detection { supervisor: Supervisor::None, evidence: "unit test".into() };
        let gw = Arc::new(Gateway::new(home.clone(), me, detection, "test".into()));
        assert!(gw.advance(GatewayState::Running), "the gateway did not become running");
        work.start_worker(Arc::clone(&gw));
        Fixture { work, gw, wakes, started }
    }

    /// A chat message journaled as the platform host's intake does, and queued for the worker.
    fn send(&self, event: &str, text: &str) -> String {
        let msg = NewMessage { chat_id: "c1".into(), user_id: "u1".into(), text: text.into(), kind: Kind::Async };
        let id = self.work.journal.accept_inbound(PLATFORM, event, &msg).expect("accept").expect("a new event");
        self.work.enqueue(id.clone());
        id
    }

    /// The nudges up to and including the wake of the platform's outbox.
    async fn until_outbox_wake(&mut self) -> Vec<Nudge> {
        let mut seen = Vec::new();
        loop {
            let n = tokio::time::timeout(DEADLINE, self.wakes.recv()).await.expect("no outbox wake in time");
            let n = n.expect("the wake channel closed");
            let done = n == Nudge::Outbox(PLATFORM.into());
            seen.push(n);
            if done {
                return seen;
            }
        }
    }

    /// The id of the next run the agent started.
    async fn agent_started(&mut self) -> String {
        let id = tokio::time::timeout(DEADLINE, self.started.recv()).await.expect("the agent did not start in time");
        id.expect("the agent is gone")
    }

    fn message(&self, id: &str) -> Message {
        self.work.journal.get(id).expect("journal read").expect("the message is journaled")
    }

    /// The texts waiting in the platform's outbox.
    fn outbox(&self) -> Vec<String> {
        let pending = self.work.journal.outbox_pending(PLATFORM, 100).expect("outbox");
        pending.into_iter().map(|o| o.text).collect()
    }
}

fn home() -> (tempfile::TempDir, Home) {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = Home::at(dir.path()).ensure().expect("home");
    (dir, home)
}

/// The activity the run showed in its chat, in order.
fn activities(nudges: &[Nudge]) -> Vec<&Activity> {
    nudges.iter().filter_map(|n| if let Nudge::Show { activity, .. } = n { Some(activity) } else { None }).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_message_becomes_one_run_and_its_reply_is_queued_once() {
    let (_dir, home) = home();
    let mut f = Fixture::start(&home);
    let id = f.send("e1", "hello");
    assert_eq!(f.agent_started().await, id);
    let nudges = f.until_outbox_wake().await;
    let shown = activities(&nudges);
    assert_eq!(shown.first(), Some(&&Activity::Started), "{nudges:?}");
    assert_eq!(shown.last(), Some(&&Activity::Ended { replied: true }), "{nudges:?}");

    let m = f.message(&id);
    assert_eq!(m.state, State::Done);
    assert_eq!(m.reply.as_deref(), Some("echo: hello"));
    assert_eq!(m.incarnation.as_deref(), Some(f.gw.me.id.as_str()));
    assert_eq!(f.outbox(), vec!["echo: hello".to_owned()]);
    let steps: Vec<Step> = f.work.journal.trace(&id).expect("trace").into_iter().map(|e| e.step).collect();
    assert!(steps.contains(&Step::BackendCalled), "{steps:?}");
    assert_eq!(f.work.metrics.runs_json()["ok"], 1);
    assert_eq!(f.gw.runs.active(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_run_records_its_reason_and_the_chat_gets_the_notice() {
    let (_dir, home) = home();
    let mut f = Fixture::start(&home);
    let id = f.send("e1", "fail");
    f.until_outbox_wake().await;

    let m = f.message(&id);
    assert_eq!(m.state, State::Failed);
    assert!(m.reason.as_deref().is_some_and(|r| r.contains(UPSTREAM_DOWN)), "{:?}", m.reason);
    // The chat is told the configured text and the reference, not the upstream's reason (it
    // is not an admin's chat).
    let outbox = f.outbox();
    assert_eq!(outbox.len(), 1, "{outbox:?}");
    assert!(outbox[0].contains(&id) && !outbox[0].contains(UPSTREAM_DOWN), "{outbox:?}");
    assert_eq!(f.work.metrics.runs_json()["failed"], 1);
    assert_eq!(f.work.metrics.last_failure_json()["reference"], id.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_cancel_fails_the_run_with_its_reason() {
    let (_dir, home) = home();
    let mut f = Fixture::start(&home);
    let id = f.send("e1", "hang");
    f.agent_started().await;
    let answer = f.work.command(&f.gw, Command::Cancel, "/cancel", Some(PLATFORM), "c1", "u1");
    assert_eq!(answer.reply, "cancelling 1 run(s)");
    f.until_outbox_wake().await;

    let m = f.message(&id);
    assert_eq!(m.state, State::Failed);
    assert_eq!(m.reason.as_deref(), Some(REASON_CANCELLED));
    // The gateway's own handling is no secret: the chat reads why.
    assert!(f.outbox().iter().any(|t| t.contains(REASON_CANCELLED)), "{:?}", f.outbox());
    let again = f.work.command(&f.gw, Command::Cancel, "/cancel", Some(PLATFORM), "c1", "u1");
    assert_eq!(again.reply, "nothing to cancel");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_the_drain_cancels_ends_and_is_rerun_once_by_the_next_incarnation() {
    let (_dir, home) = home();
    let mut f = Fixture::start(&home);
    let id = f.send("e1", "hang");
    f.agent_started().await;
    assert_eq!(f.gw.runs.active(), 1);
    f.gw.advance(GatewayState::Draining);
    f.work.cancel_all();
    assert!(f.gw.runs.wait_idle(DEADLINE).await, "the cancelled run did not end");

    // Ended without a reply: nothing for the chat, and the row stays `running` for the next
    // incarnation.
    let ended = loop {
        let n = tokio::time::timeout(DEADLINE, f.wakes.recv()).await.expect("no end in time");
        match n.expect("the wake channel closed") {
            Nudge::Show { activity: a @ Activity::Ended { .. }, .. } => break a,
            Nudge::Outbox(p) => panic!("a cancelled run woke the outbox of {p}"),
            Nudge::Show { .. } => {}
        }
    };
    assert_eq!(ended, Activity::Ended { replied: false });
    assert_eq!(f.message(&id).state, State::Running);
    assert!(f.outbox().is_empty(), "{:?}", f.outbox());
    assert_eq!(f.work.metrics.runs_json()["cancelled"], 1);

    // The next incarnation (whose agent answers at once) recovers it and runs it once more;
    // its chat gets that run's reply, once.
    f.gw.advance(GatewayState::Stopping);
    let mut next = Fixture::start_with(&home, false);
    assert_eq!(next.agent_started().await, id);
    next.until_outbox_wake().await;
    let m = next.message(&id);
    assert_eq!((m.state, m.attempts), (State::Done, 2));
    assert_eq!(m.incarnation.as_deref(), Some(next.gw.me.id.as_str()));
    assert_eq!(next.outbox(), vec!["echo: hang".to_owned()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_run_replies_to_its_caller_and_is_counted_while_it_runs() {
    let (_dir, home) = home();
    let f = Fixture::start(&home);
    let req = |text: &str| AgentRequest {
        run_id: f.work.next_run_id(&f.gw.me.id),
        chat_id: "c2".into(),
        user_id: "u2".into(),
        text: text.into(),
        history: Vec::new(),
        platform: None,
        session_started: None,
        http_conversation: false,
        attachments: Vec::new(),
    };
    assert_eq!(f.work.run_sync(&f.gw, req("hi"), None).await.expect("reply"), "echo: hi");
    let failed = f.work.run_sync(&f.gw, req("fail"), None).await;
    assert!(matches!(&failed, Err(AgentError::Failed(r)) if r == UPSTREAM_DOWN), "{failed:?}");
    assert_eq!(f.gw.runs.active(), 0);
    let runs = f.work.metrics.runs_json();
    assert_eq!(
        (runs["ok"].as_u64(), runs["failed"].as_u64(), runs["failures_in_a_row"].as_u64()),
        (Some(1), Some(1), Some(1))
    );
}
