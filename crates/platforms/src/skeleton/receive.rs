//! The receive loop, and the contract a protocol's receive side keeps.

use std::time::{Duration, Instant, SystemTime};

use std::io::Read;

use super::{BACKOFF_MIN, Ctx, Limits, MAX_RETRY_AFTER, next_backoff};
use crate::attachments::{Attachment, Outcome};
use crate::{Inbound, State};

/// How long the loop waits before looking at a too-small receive budget, or at a drain with no
/// connection, again.
const IDLE: Duration = Duration::from_millis(200);
/// Tries to journal one message the platform cannot redeliver before it is given up.
const DELIVER_TRIES: u32 = 5;

/// Why a connect or a receive failed, typed by what the skeleton does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// Another consumer holds the credential on the platform (Telegram's 409, IRC's 433):
    /// retried with backoff; past `conflict_standby_s`, `standby` with one try per bound. The
    /// text says who or what ("nick gw in use on host:6667").
    Conflict(String),
    /// Wait the platform's retry-after (else the backoff), then try again.
    RateLimited(Option<Duration>),
    /// The credentials are refused: `parked` until the drain; retrying cannot help.
    Rejected(String),
    /// Unreachable or failing: `degraded`, retried with backoff on the same connection.
    Down(String),
    /// The connection is gone and the protocol has dropped it: `degraded`, then a new
    /// [`Receiver::connect`] with backoff.
    Lost(String),
}

/// What one receive returned, in the platform's order. Nothing in it is confirmed yet.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Batch {
    /// The messages to journal (already filtered: allowed chats, not our own, not history).
    pub messages: Vec<Inbound>,
    /// Messages the platform skipped that could not be read back: the state is `degraded`
    /// naming them until the next batch, never silent.
    pub gap: Option<String>,
}

/// A protocol's receive side, run on the adapter's receive thread.
///
/// The contract: [`Receiver::receive`] never blocks past the budget it is given, nor consumes
/// anything the platform would otherwise keep for another consumer: the position moves only
/// in [`Receiver::confirm`], which the skeleton calls after every message of the batch is
/// journaled. A protocol that cannot keep this (IRC) says so with
/// [`Limits::redelivers`]` = false`.
pub trait Receiver: Send + 'static {
    /// Connects and says hello (log in, join). Called at start, after [`Failure::Lost`] and
    /// after the watchdog's reconnect.
    fn connect(&mut self, ctx: &Ctx) -> Result<(), Failure>;
    /// Receives once, blocking at most `budget` when there is one (a cluster active's lease
    /// left), else the platform's own wait (`poll_timeout_s`).
    fn receive(&mut self, ctx: &Ctx, budget: Option<Duration>) -> Result<Batch, Failure>;
    /// Every message of the last batch is journaled: move the position past it. An error is
    /// reported as `degraded`; the next start re-receives from the older position (the journal
    /// drops what it has).
    fn confirm(&mut self, _ctx: &Ctx) -> Result<(), String> {
        Ok(())
    }
    /// The watchdog found no progress for too long: drop the connection (a new
    /// [`Receiver::connect`] follows).
    fn disconnect(&mut self) {}
    /// Opens the download of attachment `a` (its [`Attachment::fetch`] handle), bounded by
    /// `timeout` in all; the skeleton reads it under the store's bounds (attachments.rs).
    /// Protocols that declare no attachments keep the default.
    fn fetch(&mut self, _ctx: &Ctx, a: &Attachment, _timeout: Duration) -> Result<Box<dyn Read + Send>, String> {
        Err(format!("this platform cannot download {}", a.name))
    }
    /// The end of the receive side: leave the platform, returning what it relayed before it
    /// let us go (IRC reads on after its `QUIT`); those are journaled too.
    fn hang_up(&mut self) -> Vec<Inbound> {
        Vec::new()
    }
}

/// Parked: retrying cannot help, so wait for the drain.
fn park(ctx: &Ctx) {
    while !ctx.ending() {
        ctx.shared.flags.sleep(Duration::from_secs(1), |b| ctx.ends(b));
    }
}

/// The seconds between a message's platform timestamp and now.
fn lag(msg: &Inbound) -> Option<f64> {
    msg.sent_at.and_then(|t| SystemTime::now().duration_since(t).ok()).map(|d| d.as_secs_f64())
}

struct Loop<'a> {
    ctx: &'a Ctx,
    limits: Limits,
    conflict_bound: Duration,
    backoff: Duration,
    conflict_since: Option<Instant>,
}

/// Runs `rx` until the receive side ends (intake stopped, or hung up) or the credentials are
/// rejected.
pub(crate) fn run<R: Receiver>(mut rx: R, ctx: &Ctx, limits: Limits, conflict_bound: Duration) {
    let mut l = Loop { ctx, limits, conflict_bound, backoff: BACKOFF_MIN, conflict_since: None };
    let mut ready = false;
    loop {
        if ctx.ending() {
            if ready {
                l.deliver(rx.hang_up());
            }
            return;
        }
        if ctx.status.parked() {
            // The sender parked the adapter (its credential was refused): take nothing in that
            // could not be answered, and wait for the drain like a rejected connect.
            park(ctx);
            return;
        }
        if ctx.shared.flags.take_kick() && ready {
            rx.disconnect();
            ready = false;
            ctx.set(State::Connecting);
        }
        if !ready {
            if ctx.shared.flags.get().stop {
                // Draining without a connection (only a receive side that listens through the
                // drain gets here): no new one; the successor connects.
                ctx.shared.flags.sleep(IDLE, |b| b.hangup);
                continue;
            }
            match rx.connect(ctx) {
                Ok(()) => {
                    ready = true;
                    l.backoff = BACKOFF_MIN;
                    l.conflict_since = None;
                    if !limits.connected_after_receive {
                        ctx.status.progress();
                        ctx.set(State::Connected);
                    }
                    // Whatever waits in the outbox (a predecessor's replies) goes out now.
                    ctx.shared.flags.update(|b| b.wake = true);
                }
                Err(f) => {
                    if !l.failed(f) {
                        return;
                    }
                }
            }
            continue;
        }
        // The role and lease gate: a receive cannot be fenced, so it must end before the lease
        // can; a standby (zero budget) consumes nothing.
        let budget = ctx.host().receive_budget();
        if budget.is_some_and(|b| b.is_zero() || b < limits.min_receive) {
            ctx.pause(IDLE);
            continue;
        }
        let result = rx.receive(ctx, budget);
        if ctx.ending() && limits.redelivers {
            // Unconfirmed: the platform keeps it for the successor.
            continue;
        }
        match result {
            Ok(batch) => {
                l.backoff = BACKOFF_MIN;
                l.conflict_since = None;
                ctx.status.progress();
                ctx.set(batch.gap.map_or(State::Connected, State::Degraded));
                let messages = download(&mut rx, ctx, batch.messages);
                if l.deliver(messages) {
                    if let Err(e) = rx.confirm(ctx) {
                        ctx.set(State::Degraded(e));
                    }
                } else {
                    // The same batch again from the unconfirmed position; journaled ones
                    // deduplicate.
                    ctx.pause(l.backoff);
                    l.backoff = next_backoff(l.backoff);
                }
            }
            Err(f) => {
                if matches!(f, Failure::Lost(_)) {
                    ready = false;
                }
                if !l.failed(f) {
                    return;
                }
            }
        }
    }
}

/// Downloads every attachment of `messages` into the host's store, before they are journaled:
/// each ends stored or refused with a reason (never dropped). A redelivered event finds its
/// files by the store's per-event record and downloads nothing twice.
fn download<R: Receiver>(rx: &mut R, ctx: &Ctx, mut messages: Vec<Inbound>) -> Vec<Inbound> {
    if messages.iter().all(|m| m.attachments.is_empty()) {
        return messages;
    }
    let host = ctx.host();
    let store = host.attachments();
    for m in &mut messages {
        // A message the access policy drops (or answers with a pairing code) is not
        // journaled: its files are not fetched.
        if m.attachments.is_empty() || !host.admits(ctx.name(), m) {
            continue;
        }
        let started = Instant::now();
        let mut used = 0;
        for (i, a) in m.attachments.iter_mut().enumerate() {
            if a.outcome.is_some() {
                continue;
            }
            let outcome = match &store {
                None => Outcome::Refused("attachments are not stored by this gateway".into()),
                Some((store, bounds)) => {
                    let key = format!("{}/{}/{i}", ctx.name(), m.event_id);
                    let probe = a.clone();
                    store.fetch(Some(&key), &probe, bounds, started, &mut used, |t| rx.fetch(ctx, &probe, t))
                }
            };
            a.outcome = Some(outcome);
        }
    }
    messages
}

impl Loop<'_> {
    /// Journals `messages` in order. `false` when one could not be and the platform will
    /// deliver it again (nothing after it was delivered).
    fn deliver(&self, messages: Vec<Inbound>) -> bool {
        let ctx = self.ctx;
        for msg in messages {
            let lag = lag(&msg);
            if self.limits.redelivers {
                if let Err(e) = ctx.host().deliver(ctx.name(), msg) {
                    ctx.set(State::Degraded(format!("cannot journal an inbound message: {e}")));
                    return false;
                }
            } else if !self.deliver_once(msg) {
                continue;
            }
            ctx.status.received(lag);
        }
        true
    }

    /// A message the platform cannot redeliver: a few tries, then lost, and said so.
    fn deliver_once(&self, msg: Inbound) -> bool {
        let ctx = self.ctx;
        for i in 0..DELIVER_TRIES {
            match ctx.host().deliver(ctx.name(), msg.clone()) {
                Ok(()) => return true,
                Err(e) if i + 1 == DELIVER_TRIES => {
                    ctx.set(State::Degraded(format!("cannot journal an inbound message (lost): {e}")));
                }
                Err(_) => ctx.sleep(Duration::from_millis(100 << i)),
            }
        }
        false
    }

    /// Handles a failure; `false` when the adapter is parked (the receive side has ended).
    fn failed(&mut self, f: Failure) -> bool {
        let ctx = self.ctx;
        if !matches!(f, Failure::Conflict(_)) {
            self.conflict_since = None;
        }
        match f {
            Failure::Conflict(who) => {
                ctx.status.conflict();
                let since = *self.conflict_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= self.conflict_bound {
                    ctx.set(State::Standby(format!("another consumer is active: {who}")));
                    // One try per bound: slow enough never to fight the other consumer.
                    ctx.pause(self.conflict_bound.max(BACKOFF_MIN));
                    return true;
                }
                ctx.pause(self.backoff);
                self.backoff = next_backoff(self.backoff).min(self.conflict_bound.max(BACKOFF_MIN));
                return true;
            }
            Failure::RateLimited(after) => ctx.pause(after.unwrap_or(self.backoff).min(MAX_RETRY_AFTER)),
            Failure::Rejected(why) => {
                ctx.set(State::Parked(format!("credentials rejected: {why}")));
                park(ctx);
                return false;
            }
            Failure::Down(why) | Failure::Lost(why) => {
                ctx.set(State::Degraded(why));
                ctx.pause(self.backoff);
            }
        }
        self.backoff = next_backoff(self.backoff);
        true
    }
}
