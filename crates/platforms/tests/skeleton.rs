//! The adapter skeleton with a toy protocol over an in-memory platform: what every adapter gets
//! without writing it (journal before confirm, pieces, rejected entries, rate limits, standby,
//! park, the receive budget, the drain deadline). The toy protocol is the worked example of
//! docs/adding-a-platform.md, which quotes the region between the `example` markers verbatim
//! (checked by `the_docs_quote_this_example`).

mod support;
use support::{MemHost, wait};

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gatewarden_config::{PlatformConfig, platform};
use gatewarden_platforms::skeleton::{Skeleton, pieces};
use gatewarden_platforms::{Activity, Adapter, ChatKind, Host, Inbound, Sent, State};

// -- example begins --
use gatewarden_platforms::skeleton::{
    Batch, Ctx, Failure, Limits, PieceId, PieceLimit, Protocol, Receiver, SendError, Sender,
};

/// The toy platform's server: updates with increasing ids, kept until confirmed (like
/// Telegram's `getUpdates` offset), and the pieces it was sent.
#[derive(Default)]
pub struct Server {
    pub updates: Vec<(i64, String, String)>, // (id, chat, text)
    pub confirmed: i64,                      // every id below it is confirmed
    pub sent: Vec<(String, String)>,         // (chat, piece)
    pub fail_next_send: Option<SendError>,   // the next send's error, once
    pub conflict: bool,                      // another consumer polls this token
    pub refuse_token: bool,
    pub polls: usize,
    pub typing: Vec<(String, bool)>,             // (chat, on): every typing notice
    pub previews: Vec<Option<(String, String)>>, // by message id: (chat, text), None once removed
}

pub type Board = Arc<Mutex<Server>>;

/// The protocol: everything the skeleton cannot know.
pub struct Toy {
    pub token: String,
    pub board: Board,
}

impl Protocol for Toy {
    // Its `[[platform]]` keys: a real platform names its own (crates/config/src/platform/).
    type Settings = gatewarden_config::platform::Telegram;
    const KIND: &'static str = "toy";
    const LIMITS: Limits = Limits {
        piece: PieceLimit::Chars(10),
        line_per_piece: false,
        batch: 8,
        pace: None,
        min_receive: Duration::ZERO,
        redelivers: true,
        listens_through_drain: false,
        connected_after_receive: false,
        close_grace: Duration::from_millis(200),
    };
    type Receiver = ToyReceiver;
    type Sender = ToySender;

    fn credential(&self) -> &str {
        &self.token
    }

    fn watchdog_after(&self) -> Duration {
        Duration::from_secs(60)
    }

    fn open(&self, _host: &Arc<dyn Host>) -> Result<(ToyReceiver, ToySender), String> {
        let rx = ToyReceiver { board: Arc::clone(&self.board), pending: None };
        Ok((rx, ToySender { board: Arc::clone(&self.board) }))
    }
}

pub struct ToyReceiver {
    board: Board,
    /// The position past the last batch, confirmed once the skeleton has journaled it.
    pending: Option<i64>,
}

impl Receiver for ToyReceiver {
    fn connect(&mut self, _ctx: &Ctx) -> Result<(), Failure> {
        let server = self.board.lock().unwrap();
        if server.refuse_token { Err(Failure::Rejected("401 Unauthorized".into())) } else { Ok(()) }
    }

    fn receive(&mut self, ctx: &Ctx, budget: Option<Duration>) -> Result<Batch, Failure> {
        let batch = {
            let mut server = self.board.lock().unwrap();
            server.polls += 1;
            if server.conflict {
                return Err(Failure::Conflict("another poller on this token".into()));
            }
            let fresh: Vec<_> = server.updates.iter().filter(|u| u.0 >= server.confirmed).cloned().collect();
            self.pending = fresh.last().map(|u| u.0 + 1);
            let messages = fresh
                .into_iter()
                .map(|(id, chat, text)| Inbound {
                    event_id: id.to_string(),
                    chat_id: chat.clone(),
                    user_id: chat,
                    text,
                    sent_at: None,
                    // A direct chat, not named by allowed_chats, needing no mention: the
                    // access policy decides the rest (crates/runtime/src/access/).
                    chat: ChatKind::Direct,
                    listed: false,
                    addressed: true,
                    attachments: Vec::new(),
                })
                .collect();
            Batch { messages, gap: None }
        };
        if batch.messages.is_empty() {
            // A long poll that found nothing, never longer than the budget.
            ctx.pause(budget.unwrap_or(Duration::from_millis(50)).min(Duration::from_millis(50)));
        }
        Ok(batch)
    }

    fn confirm(&mut self, _ctx: &Ctx) -> Result<(), String> {
        if let Some(next) = self.pending.take() {
            self.board.lock().unwrap().confirmed = next;
        }
        Ok(())
    }
}

pub struct ToySender {
    board: Board,
}

impl Sender for ToySender {
    fn send(&mut self, chat: &str, piece: &str, _id: PieceId) -> Result<(), SendError> {
        let mut server = self.board.lock().unwrap();
        match server.fail_next_send.take() {
            Some(e) => Err(e),
            None => {
                server.sent.push((chat.to_owned(), piece.to_owned()));
                Ok(())
            }
        }
    }

    // Optional: "typing…" and previews of a reply being written (IRC has neither).
    fn typing(&mut self, chat: &str, on: bool) -> Result<(), SendError> {
        self.board.lock().unwrap().typing.push((chat.to_owned(), on));
        Ok(())
    }

    fn preview(&mut self, chat: &str, text: &str, shown: Option<&str>) -> Result<Option<String>, SendError> {
        let mut server = self.board.lock().unwrap();
        let id = match shown.and_then(|s| s.parse::<usize>().ok()) {
            Some(id) => id,
            None => {
                server.previews.push(None);
                server.previews.len() - 1
            }
        };
        match server.previews.get_mut(id) {
            Some(p) => *p = Some((chat.to_owned(), text.to_owned())),
            None => return Err(SendError::Rejected(format!("no message {id}"))),
        }
        Ok(Some(id.to_string()))
    }

    fn unpreview(&mut self, _chat: &str, shown: &str) -> Result<(), SendError> {
        let mut server = self.board.lock().unwrap();
        if let Some(p) = shown.parse::<usize>().ok().and_then(|id| server.previews.get_mut(id)) {
            *p = None;
        }
        Ok(())
    }
}
// -- example ends --

fn config(conflict_s: u64) -> PlatformConfig {
    PlatformConfig {
        name: Some("toy".into()),
        conflict_standby_s: conflict_s,
        ..PlatformConfig::with(platform::Telegram { poll_timeout_s: 1, ..platform::Telegram::default() })
    }
}

fn start(board: &Board, conflict_s: u64) -> (Skeleton<Toy>, Arc<MemHost>) {
    let host = Arc::new(MemHost::echoing());
    let toy = Toy { token: "t0k3n".into(), board: Arc::clone(board) };
    let a = Skeleton::from_protocol(&config(conflict_s), toy);
    a.start(Arc::clone(&host) as Arc<dyn Host>).unwrap();
    (a, host)
}

fn update(board: &Board, id: i64, text: &str) {
    board.lock().unwrap().updates.push((id, "c1".into(), text.into()));
}

#[test]
fn the_accessors_come_from_the_skeleton_and_the_protocol() {
    let board = Board::default();
    let a = Skeleton::from_protocol(&config(1), Toy { token: "t0k3n".into(), board });
    assert_eq!((a.name(), a.kind(), a.credential()), ("toy", "toy", "t0k3n"));
    assert_eq!(a.watchdog_after(), Duration::from_secs(60));
    assert_eq!(a.status().state(), State::Connecting);
    a.wake(); // before start: nothing to wake, and no panic
    assert!(a.close(Instant::now()), "a close before any start has nothing to flush");
    assert_eq!(a.status().state(), State::Closed);
}

#[test]
fn journal_first_then_confirm_and_replies_leave_in_pieces() {
    let board = Board::default();
    let (a, host) = start(&board, 30);
    wait("connected", || a.status().state() == State::Connected);
    update(&board, 5, "hello there, toy");
    wait("the echo", || board.lock().unwrap().sent.len() == 3);
    let sent: Vec<String> = board.lock().unwrap().sent.iter().map(|s| s.1.clone()).collect();
    assert_eq!(sent, pieces("echo: hello there, toy", &Toy::LIMITS));
    assert_eq!(sent, ["echo:", "hello", "there, toy"], "split at words within 10 characters");
    assert_eq!(sent.join(" "), "echo: hello there, toy", "nothing lost but the spaces at the cuts");
    assert_eq!(board.lock().unwrap().confirmed, 6);
    assert_eq!(a.status().snapshot().sent, 3, "pieces are counted");

    // A commit that fails: degraded, and the position does not move past the message.
    *host.refuse.lock().unwrap() = true;
    update(&board, 6, "second");
    // (The state flips back to connected at each good receive: last_error keeps the reason.)
    let last_error = || a.status().snapshot().last_error.unwrap_or_default();
    wait("degraded", || last_error() == "cannot journal an inbound message: disk full");
    assert_eq!(board.lock().unwrap().confirmed, 6, "an uncommitted message must not be confirmed");
    *host.refuse.lock().unwrap() = false;
    wait("delivered once the journal works", || host.inbox.lock().unwrap().len() == 2);
    wait("confirmed", || board.lock().unwrap().confirmed == 7);
    wait("connected again", || a.status().state() == State::Connected);
    assert_eq!(a.status().snapshot().received, 2);
    assert!(a.close(Instant::now() + Duration::from_secs(2)));
    assert_eq!(a.status().state(), State::Closed);
}

#[test]
fn rejected_entries_are_not_retried_and_rate_limits_are_waited_out() {
    let board = Board::default();
    let (a, host) = start(&board, 30);
    board.lock().unwrap().fail_next_send = Some(SendError::Rejected("chat not found".into()));
    let bad = host.queue("gone", "never");
    let good = host.queue("c1", "fine");
    a.wake();
    wait("the second entry", || board.lock().unwrap().sent.len() == 1);
    let outcomes = host.outcomes.lock().unwrap().clone();
    assert_eq!(outcomes, vec![(bad, Sent::Rejected("chat not found".into())), (good, Sent::Ok)]);

    board.lock().unwrap().fail_next_send = Some(SendError::RateLimited(Some(Duration::from_millis(300))));
    let t0 = Instant::now();
    host.queue("c1", "later");
    a.wake();
    wait("sent after the wait", || board.lock().unwrap().sent.len() == 2);
    assert!(t0.elapsed() >= Duration::from_millis(300), "retry-after not honoured: {:?}", t0.elapsed());
    assert_eq!(board.lock().unwrap().sent[1].1, "later", "sent once");

    board.lock().unwrap().fail_next_send = Some(SendError::Failed("HTTP 502".into()));
    host.queue("c1", "retried");
    a.wake();
    wait("degraded by the send", || a.status().snapshot().last_error.as_deref() == Some("cannot send: HTTP 502"));
    wait("sent after the backoff", || board.lock().unwrap().sent.len() == 3);
    assert!(a.close(Instant::now() + Duration::from_secs(2)));
}

#[test]
fn a_persistent_conflict_stands_by_and_rejected_credentials_park() {
    let board = Board::default();
    board.lock().unwrap().conflict = true;
    let (a, _host) = start(&board, 1);
    wait("standby", || matches!(a.status().state(), State::Standby(_)));
    assert_eq!(a.status().state().reason(), Some("another consumer is active: another poller on this token"));
    assert!(a.status().snapshot().conflicts >= 2);
    board.lock().unwrap().conflict = false;
    wait("recovered", || a.status().state() == State::Connected);
    a.close(Instant::now() + Duration::from_secs(2));

    let board = Board::default();
    board.lock().unwrap().refuse_token = true;
    let (a, host) = start(&board, 1);
    wait("parked", || matches!(a.status().state(), State::Parked(_)));
    assert_eq!(a.status().state().reason(), Some("credentials rejected: 401 Unauthorized"));
    // A parked adapter sends nothing, and its close does not wait for the deadline.
    host.queue("c1", "stuck");
    a.wake();
    let t0 = Instant::now();
    assert!(!a.close(Instant::now() + Duration::from_secs(5)), "close says the outbox is not empty");
    assert!(t0.elapsed() < Duration::from_secs(2), "close took {:?}", t0.elapsed());
    assert!(board.lock().unwrap().sent.is_empty());
    assert_eq!(host.outbox.lock().unwrap().len(), 1, "the entry waits for the next start");
}

#[test]
fn a_sender_that_parks_keeps_the_adapter_parked_and_receiving_stops() {
    let board = Board::default();
    let (a, host) = start(&board, 30);
    wait("connected", || a.status().state() == State::Connected);
    board.lock().unwrap().fail_next_send = Some(SendError::Unauthorized("401 bad token".into()));
    host.queue("c1", "refused");
    a.wake();
    wait("parked by the sender", || matches!(a.status().state(), State::Parked(_)));
    let polls = board.lock().unwrap().polls;
    update(&board, 1, "after the park");
    // The receive loop polls every 50 ms: unfixed, it journals the update and sets `connected`
    // within this window (a bounded look for something that must not happen).
    let until = Instant::now() + Duration::from_millis(400);
    while Instant::now() < until {
        assert_eq!(a.status().state().reason(), Some("credentials rejected: 401 bad token"), "still parked");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(host.inbox.lock().unwrap().is_empty(), "nothing taken in while parked");
    assert!(board.lock().unwrap().polls <= polls + 1, "at most the receive in flight at the park");
    a.close(Instant::now() + Duration::from_secs(2));
    // The next start leaves `parked`.
    a.start(Arc::clone(&host) as Arc<dyn Host>).unwrap();
    wait("journaled after a restart", || host.inbox.lock().unwrap().len() == 1);
    assert!(a.close(Instant::now() + Duration::from_secs(2)));
}

#[test]
fn a_zero_budget_receives_nothing_and_start_after_close_starts_afresh() {
    let board = Board::default();
    let host = Arc::new(MemHost::echoing());
    *host.budget.lock().unwrap() = Some(Duration::ZERO);
    let a = Skeleton::from_protocol(&config(1), Toy { token: "t".into(), board: Arc::clone(&board) });
    a.start(Arc::clone(&host) as Arc<dyn Host>).unwrap();
    update(&board, 1, "held back");
    // An observation window for an absence: several would-be receives long.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(board.lock().unwrap().polls, 0, "a standby must not receive");
    assert!(host.inbox.lock().unwrap().is_empty());
    a.stop_intake();
    assert!(a.close(Instant::now() + Duration::from_secs(2)));

    *host.budget.lock().unwrap() = Some(Duration::from_secs(5));
    a.start(Arc::clone(&host) as Arc<dyn Host>).unwrap();
    wait("received after the promotion", || host.inbox.lock().unwrap().len() == 1);
    wait("answered", || host.outbox.lock().unwrap().is_empty());
    let sent: Vec<String> = board.lock().unwrap().sent.iter().map(|s| s.1.clone()).collect();
    assert_eq!(sent.join(" "), "echo: held back");
    assert!(a.close(Instant::now() + Duration::from_secs(2)));
}

#[test]
fn the_drain_flushes_until_the_deadline_and_never_past_it() {
    let board = Board::default();
    let (a, host) = start(&board, 30);
    wait("connected", || a.status().state() == State::Connected);
    a.stop_intake();
    // Flood control longer than the drain has: the sender leaves the entry for the successor.
    board.lock().unwrap().fail_next_send = Some(SendError::RateLimited(Some(Duration::from_secs(30))));
    host.queue("c1", "too late");
    a.wake();
    let t0 = Instant::now();
    assert!(!a.close(Instant::now() + Duration::from_millis(500)), "close says the outbox is not empty");
    assert!(t0.elapsed() < Duration::from_millis(600), "close took {:?}", t0.elapsed());
    assert!(board.lock().unwrap().sent.is_empty());
    assert_eq!(host.outbox.lock().unwrap().len(), 1, "left in the outbox, not marked sent");
    assert_eq!(a.status().state(), State::Closed);
}

/// A run's activity: typing from its start; a preview once it has written for 2 s, edited as
/// it grows; then the reply leaves through the outbox as its own message, the preview is
/// removed after it, and typing is turned off.
#[test]
fn a_run_in_progress_types_previews_and_the_reply_replaces_the_preview() {
    let board = Board::default();
    let (a, host) = start(&board, 30);
    wait("connected", || a.status().state() == State::Connected);
    a.show("c1", "run-1", Activity::Started);
    a.show("c1", "run-1", Activity::Text("Hi ".into()));
    wait("typing", || board.lock().unwrap().typing.contains(&("c1".into(), true)));
    let on_screen = |b: &Board| b.lock().unwrap().previews.iter().flatten().cloned().collect::<Vec<_>>();
    wait("a preview", || on_screen(&board) == [("c1".to_string(), "Hi …".to_string())]);
    a.show("c1", "run-1", Activity::Text("you".into()));
    wait("the preview edited", || on_screen(&board) == [("c1".to_string(), "Hi you …".to_string())]);
    assert_eq!(board.lock().unwrap().previews.len(), 1, "edits, not new messages");
    assert!(board.lock().unwrap().sent.is_empty(), "a preview is not the reply");

    a.show("c1", "run-1", Activity::Ended { replied: true });
    host.queue_reply("c1", "Hi you, and more.", Some("run-1"));
    a.wake();
    wait("the reply, then the preview removed", || {
        board.lock().unwrap().sent.len() == 2 && on_screen(&board).is_empty()
    });
    wait("typing off", || board.lock().unwrap().typing.last() == Some(&("c1".into(), false)));
    let sent: Vec<String> = board.lock().unwrap().sent.iter().map(|s| s.1.clone()).collect();
    assert_eq!(sent.join(" "), "Hi you, and more.", "the final text once, through the outbox");

    // A run the drain cancels (re-run by the next incarnation): its preview goes at once.
    a.show("c1", "run-2", Activity::Started);
    a.show("c1", "run-2", Activity::Text("half".into()));
    wait("a second preview", || on_screen(&board).len() == 1);
    a.show("c1", "run-2", Activity::Ended { replied: false });
    wait("removed", || on_screen(&board).is_empty());
    assert_eq!(board.lock().unwrap().sent.len(), 2, "nothing else sent");
    assert!(a.close(Instant::now() + Duration::from_secs(2)));
}

#[test]
fn the_docs_quote_this_example() {
    let me = include_str!("skeleton.rs");
    let begin = me.find("// -- example begins --\n").unwrap() + "// -- example begins --\n".len();
    let end = me.find("// -- example ends --").unwrap();
    let doc = include_str!("../../../docs/adding-a-platform.md");
    assert!(doc.contains(&me[begin..end]), "docs/adding-a-platform.md no longer quotes tests/skeleton.rs's example");
}
