//! The push intake: for platforms that deliver by calling us (WhatsApp's webhook; a later
//! generic `kind = "webhook"`), on the gateway's own listener (`/hooks/<kind>/<name>`,
//! crates/runtime/src/http/hooks.rs, through [`crate::Adapter::hook`]).
//!
//! The HTTP handler parses and checks a request, then [`PushIntake::push`]es its messages and
//! waits; the protocol's receive side takes them with [`PushReceiver::receive`] (within the
//! receive budget, like any receive), the skeleton journals them, and
//! [`PushReceiver::confirm`] answers the waiting handlers: the sender gets 200 only once its
//! messages are committed (the skeleton's deliver-then-confirm). A failed commit, a receive side
//! that is not running (starting, standby, draining, parked) or a wait past the bound answers
//! an error, and a sender that redelivers on any error (Meta) delivers again, which the journal
//! deduplicates by event id.
//!
//! Bounded: at most [`PushLimits::items`] requests and [`PushLimits::bytes`] of their messages
//! wait at once (more is refused at once, [`Refused::Full`]), and a handler waits at most
//! [`PushLimits::wait`].

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::{Batch, Ctx};
use crate::{HookAnswer, Inbound};

/// How long one wait inside a receive lasts before it looks at the drain again.
const SLICE: Duration = Duration::from_millis(100);

/// The intake's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PushLimits {
    /// Requests waiting for their commit, at most.
    pub items: usize,
    /// Bytes of waiting requests (their bodies), at most.
    pub bytes: usize,
    /// How long a request waits for its commit before it is answered with an error.
    pub wait: Duration,
}

impl Default for PushLimits {
    fn default() -> PushLimits {
        PushLimits { items: 256, bytes: 16 << 20, wait: Duration::from_secs(10) }
    }
}

/// Why a push was not committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// The receive side is not running (starting, standby, draining, parked, closed).
    NotRunning(String),
    /// The queue is at its bound.
    Full,
    /// The journal refused the messages, or the receive side ended before their commit.
    NotCommitted(String),
    /// No commit within [`PushLimits::wait`].
    TimedOut,
}

impl Refused {
    /// The HTTP answer: every refusal is an error status, so the sender delivers again.
    pub fn answer(&self) -> HookAnswer {
        match self {
            Refused::NotRunning(why) => HookAnswer::unavailable(format!("not receiving: {why}")),
            Refused::Full => HookAnswer::unavailable("too many deliveries are waiting for their commit".into()),
            Refused::NotCommitted(why) => HookAnswer::text(500, format!("not journaled: {why}")),
            Refused::TimedOut => HookAnswer::unavailable("the journal commit did not happen in time".into()),
        }
    }
}

/// One request's answer, filled once.
#[derive(Default)]
struct Answer {
    slot: Mutex<Option<Result<(), String>>>,
    cv: Condvar,
}

impl Answer {
    fn set(&self, r: Result<(), String>) {
        let mut g = self.slot.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_none() {
            *g = Some(r);
            self.cv.notify_all();
        }
    }
}

struct Pushed {
    messages: Vec<Inbound>,
    bytes: usize,
    answer: Arc<Answer>,
}

#[derive(Default)]
struct Queue {
    /// A receive side is attached.
    open: bool,
    items: VecDeque<Pushed>,
    bytes: usize,
}

/// The queue between the HTTP handlers and one adapter's receive side; it lives as long as
/// the adapter (across its starts).
pub struct PushIntake {
    limits: PushLimits,
    queue: Mutex<Queue>,
    cv: Condvar,
}

impl PushIntake {
    pub fn new(limits: PushLimits) -> Arc<PushIntake> {
        Arc::new(PushIntake { limits, queue: Mutex::new(Queue::default()), cv: Condvar::new() })
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hands `messages` (from a request of `bytes` bytes) to the receive side and waits until
    /// they are journaled (`Ok`) or refused. Blocks at most [`PushLimits::wait`].
    pub fn push(&self, messages: Vec<Inbound>, bytes: usize) -> Result<(), Refused> {
        let answer = Arc::new(Answer::default());
        {
            let mut q = self.lock();
            if !q.open {
                return Err(Refused::NotRunning("the adapter is not started".into()));
            }
            if q.items.len() >= self.limits.items || q.bytes + bytes > self.limits.bytes {
                return Err(Refused::Full);
            }
            q.bytes += bytes;
            q.items.push_back(Pushed { messages, bytes, answer: Arc::clone(&answer) });
        }
        self.cv.notify_all();
        let deadline = Instant::now() + self.limits.wait;
        let mut g = answer.slot.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(r) = g.take() {
                return r.map_err(Refused::NotCommitted);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                drop(g);
                // Not taken yet: it leaves the queue (a taken one may still be journaled; the
                // redelivery is then deduplicated).
                let mut q = self.lock();
                if let Some(at) = q.items.iter().position(|p| Arc::ptr_eq(&p.answer, &answer))
                    && let Some(p) = q.items.remove(at)
                {
                    q.bytes -= p.bytes;
                }
                return Err(Refused::TimedOut);
            }
            g = answer.cv.wait_timeout(g, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    /// The receive side of one start: the intake accepts pushes until it is dropped.
    pub fn attach(self: &Arc<Self>) -> PushReceiver {
        self.lock().open = true;
        PushReceiver { intake: Arc::clone(self), taken: Vec::new() }
    }

    /// Requests waiting for their commit (tests, status).
    pub fn waiting(&self) -> usize {
        self.lock().items.len()
    }
}

/// The receive side's end of a [`PushIntake`]: what was pushed, then the answers.
pub struct PushReceiver {
    intake: Arc<PushIntake>,
    /// The answers of the last batch, given at [`PushReceiver::confirm`].
    taken: Vec<Arc<Answer>>,
}

impl PushReceiver {
    /// Everything pushed so far, waiting at most `wait` for a first request (less when the
    /// receive side must end). A previous batch that was not confirmed (its commit failed) is
    /// answered with an error first: its sender delivers it again.
    pub fn receive(&mut self, ctx: &Ctx, wait: Duration) -> Batch {
        self.fail_taken("the journal commit failed");
        let deadline = Instant::now() + wait;
        let mut q = self.intake.lock();
        while q.items.is_empty() && !ctx.ending() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            q = self.intake.cv.wait_timeout(q, left.min(SLICE)).unwrap_or_else(|p| p.into_inner()).0;
        }
        let mut messages = Vec::new();
        for p in q.items.drain(..) {
            messages.extend(p.messages);
            self.taken.push(p.answer);
        }
        q.bytes = 0;
        Batch { messages, gap: None }
    }

    /// The last batch is journaled: its senders get their 200.
    pub fn confirm(&mut self) {
        for a in self.taken.drain(..) {
            a.set(Ok(()));
        }
    }

    fn fail_taken(&mut self, why: &str) {
        for a in self.taken.drain(..) {
            a.set(Err(why.to_owned()));
        }
    }
}

impl Drop for PushReceiver {
    /// The receive side ended (drain, demotion, parked): whatever waits is answered with an
    /// error, and new pushes are refused until the next start attaches.
    fn drop(&mut self) {
        self.fail_taken("the adapter stopped before the journal commit");
        let mut q = self.intake.lock();
        q.open = false;
        q.bytes = 0;
        for p in q.items.drain(..) {
            p.answer.set(Err("the adapter stopped before the journal commit".into()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ChatKind;

    fn msg(id: &str) -> Vec<Inbound> {
        vec![Inbound {
            event_id: id.into(),
            chat_id: "c".into(),
            user_id: "u".into(),
            text: "t".into(),
            sent_at: None,
            chat: ChatKind::Direct,
            listed: false,
            addressed: true,
            attachments: Vec::new(),
        }]
    }

    fn wait_until_waiting(intake: &PushIntake, n: usize) {
        let end = Instant::now() + Duration::from_secs(5);
        while intake.waiting() < n {
            assert!(Instant::now() < end, "never queued");
            std::thread::yield_now();
        }
    }

    /// Not attached: refused at once. At the count or byte bound: refused at once (503), the
    /// waiting one untouched; when the receive side ends, what waits is answered with an error.
    #[test]
    fn bounded_and_answered_when_the_receive_side_ends() {
        let limits = PushLimits { items: 1, bytes: 100, wait: Duration::from_secs(30) };
        let intake = PushIntake::new(limits);
        assert!(matches!(intake.push(msg("a"), 10), Err(Refused::NotRunning(_))));
        let rx = intake.attach();
        assert_eq!(intake.push(msg("big"), 101), Err(Refused::Full), "over the byte bound");
        let first = {
            let intake = Arc::clone(&intake);
            std::thread::spawn(move || intake.push(msg("a"), 10))
        };
        wait_until_waiting(&intake, 1);
        assert_eq!(intake.push(msg("b"), 10), Err(Refused::Full), "over the count bound");
        assert_eq!(Refused::Full.answer().status, 503);
        drop(rx);
        assert!(matches!(first.join().unwrap(), Err(Refused::NotCommitted(_))));
        assert!(matches!(intake.push(msg("c"), 10), Err(Refused::NotRunning(_))), "closed until the next start");
        assert_eq!(intake.waiting(), 0);
    }

    /// A push nobody takes is answered after the bound and leaves the queue.
    #[test]
    fn a_wait_past_the_bound_times_out_and_leaves_the_queue() {
        let intake = PushIntake::new(PushLimits { wait: Duration::from_millis(50), ..PushLimits::default() });
        let _rx = intake.attach();
        assert_eq!(intake.push(msg("a"), 10), Err(Refused::TimedOut));
        assert_eq!(intake.waiting(), 0);
        assert_eq!(Refused::TimedOut.answer().status, 503);
        assert_eq!(Refused::NotCommitted("x".into()).answer().status, 500);
    }
}
