//! The one adapter skeleton: everything a chat adapter does that is not its protocol.
//!
//! A platform module supplies a [`Protocol`]: its kind, its [`Limits`], the key of its
//! credential lock, and, for each start, a [`Receiver`] (how to receive) and a [`Sender`] (how
//! to send one piece). [`Skeleton`] turns it into an [`Adapter`] and owns the rest:
//!
//! - **The receive loop** (`receive.rs`): connect, receive within the host's budget, journal
//!   each message through [`Host::deliver`] in order, and only then let the protocol confirm its
//!   position ([`Receiver::confirm`]: an offset, a sync token). It keeps the [`State`]
//!   (connecting, connected, degraded, parked, standby), backs off, stands by when a conflict
//!   outlasts `conflict_standby_s`, waits out rate limits and reconnects when the watchdog asks.
//! - **The sender loop** (`send.rs`): reads the outbox in batches, splits each reply at the
//!   platform's limit ([`pieces`]), paces the pieces ([`Bucket`]), waits out rate limits,
//!   retries with backoff, and records each entry sent or rejected ([`Host::sent`]); during the
//!   drain it flushes until the close deadline and never waits past it.
//! - **The role and lease hooks**: [`Adapter::credential`] is the protocol's key, which the
//!   gateway locks (or leases, with `[cluster]`) before [`Adapter::start`]; the gateway starts
//!   adapters on the active only and closes them on demotion (runtime/src/platforms.rs). No
//!   receive starts while [`Host::receive_budget`] is zero or below [`Limits::min_receive`], and
//!   the budget bounds the protocol's wait; the drain's hand-over ([`Protocol::hand_over`]) is
//!   skipped with a zero budget, when a successor may already be receiving.
//! - **The status accessors**: name, kind, credential, [`Status`] (state, progress, lag,
//!   counters) and the watchdog bound, once for every platform.
//!
//! A protocol never sets the state: it returns typed outcomes ([`Failure`], [`SendError`]) and
//! the skeleton decides. docs/adding-a-platform.md walks through a new adapter.

pub mod progress;
pub mod push;
mod receive;
mod send;
mod wait;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gatewarden_config::platform::Kind;
use gatewarden_config::{KindSettings, PlatformConfig};

use crate::{Activity, Adapter, AdapterError, HookAnswer, HookRequest, Host, State, Status};
use wait::{Flags, Running, Slot};

pub use receive::{Batch, Failure, Receiver};
pub use send::{Bucket, OutFile, PieceId, SendError, Sender, pieces};

/// Where a reply is cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PieceLimit {
    /// At most this many characters per piece (cut on character boundaries).
    Chars(usize),
    /// At most this many bytes per piece, cut at a space where one is near
    /// (`chatproto::irc::split_text`).
    Bytes(usize),
}

/// Line pacing: `burst` pieces back to back, then one per `every`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pace {
    pub burst: u32,
    pub every: Duration,
}

/// What a platform allows and promises; the skeleton's loops follow it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The longest piece the platform takes.
    pub piece: PieceLimit,
    /// Each line of a reply is its own piece, stripped of CR and NUL (IRC: a message is a line).
    pub line_per_piece: bool,
    /// Outbox entries read per batch.
    pub batch: usize,
    /// `None`: the platform's own rate limits (429 and its retry-after) pace the sends.
    pub pace: Option<Pace>,
    /// The shortest receive worth starting under a receive budget.
    pub min_receive: Duration,
    /// The platform keeps what is not confirmed (an offset, a token): a message whose journal
    /// commit failed is received again, so the batch is not confirmed and the receive repeats.
    /// `false` (IRC): nothing is redelivered; a delivery is retried a few times, then reported
    /// lost (`degraded`).
    pub redelivers: bool,
    /// The receive side keeps listening through the drain and leaves only once the sender is
    /// done ([`Receiver::hang_up`]): the platform keeps nothing for a successor (IRC).
    pub listens_through_drain: bool,
    /// `connected` (and progress) only once the first receive returned, not at connect: what
    /// arrives before a first receive that fixes the position would be taken for history
    /// (Matrix).
    pub connected_after_receive: bool,
    /// How long past the close deadline [`Adapter::close`] waits for the receive side.
    pub close_grace: Duration,
}

/// A platform's protocol: what [`Skeleton`] cannot know.
pub trait Protocol: Send + Sync + 'static {
    /// The platform's own `[[platform]]` keys (crates/config/src/platform/<kind>.rs), which
    /// its constructor reads through [`settings`].
    type Settings: KindSettings;
    /// The platform (`telegram`, …): `[[platform]] kind`, the credential lock's namespace.
    const KIND: &'static str = <Self::Settings as Kind>::KIND.as_str();
    const LIMITS: Limits;
    type Receiver: Receiver;
    type Sender: Sender;
    /// What the credential lock is keyed by: what only one consumer may use.
    fn credential(&self) -> &str;
    /// How long without progress before the watchdog reconnects.
    fn watchdog_after(&self) -> Duration;
    /// One start's two halves, with what they share (a connection's writer, a saved position
    /// loaded from [`Host::state_dir`]). An error fails the start.
    fn open(&self, host: &Arc<dyn Host>) -> Result<(Self::Receiver, Self::Sender), String>;
    /// Drain, step 1, once intake has stopped: hand the platform over to a successor (Telegram:
    /// end our own long poll and confirm the offset). Not called while parked or demoted.
    fn hand_over(&self) {}
    /// A request pushed on the gateway's listener ([`Adapter::hook`]); `receiving` says
    /// whether the adapter takes messages now (started, not draining, parked or standing by).
    /// A platform that pushes answers it, usually through a [`push::PushIntake`]. Default: 404.
    fn hook(&self, _req: &HookRequest, _receiving: Result<(), String>) -> HookAnswer {
        HookAnswer::not_found()
    }
}

/// How the gateway makes protocol `Self`'s adapter from one `[[platform]]` table: what its
/// line in [`crate::build`]'s list calls. The protocol takes the credentials it needs from
/// `creds` (optional ones included) and calls its constructor.
pub trait FromConfig: Protocol + Sized {
    fn from_config(cfg: &PlatformConfig, creds: &crate::Credentials<'_>) -> Result<Skeleton<Self>, AdapterError>;
}

/// `cfg`'s own settings for protocol `P`: an error when the table is of another kind (the
/// gateway's `build` picks the protocol by kind, so only a caller's mistake gets here).
pub fn settings<P: Protocol>(cfg: &PlatformConfig) -> Result<&P::Settings, AdapterError> {
    cfg.own::<P::Settings>().ok_or_else(|| AdapterError::Start {
        name: cfg.adapter_name(),
        message: format!("a kind = {:?} table is not a {} adapter's", cfg.kind().as_str(), P::KIND),
    })
}

/// What one start's threads share.
pub(crate) struct Shared {
    flags: Flags,
    close_deadline: Mutex<Option<Instant>>,
    host: Arc<dyn Host>,
    /// Set by the sender as it ends: whether the outbox was empty then.
    emptied: AtomicBool,
    /// Runs' activity for the sender (progress.rs), oldest first, bounded by [`MAX_SHOWN`].
    shown: Mutex<std::collections::VecDeque<(String, String, Activity)>>,
}

/// Activity entries waiting for the sender; past it, text deltas that cannot be merged into the
/// previous entry are dropped (a preview is best-effort), starts and ends never.
const MAX_SHOWN: usize = 4096;

impl AsRef<Flags> for Shared {
    fn as_ref(&self) -> &Flags {
        &self.flags
    }
}

/// What a protocol's halves may use while they run.
pub struct Ctx {
    name: String,
    status: Arc<Status>,
    shared: Arc<Shared>,
    listens_through_drain: bool,
}

impl Ctx {
    /// The adapter's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn host(&self) -> &dyn Host {
        &*self.shared.host
    }

    /// Whether the receive side must end: intake stopped (or, for one that listens through the
    /// drain, the sender is done).
    pub fn ending(&self) -> bool {
        self.ends(&self.shared.flags.get())
    }

    fn ends(&self, b: &wait::Bits) -> bool {
        if self.listens_through_drain { b.hangup } else { b.stop }
    }

    /// Sleeps up to `d`; returns early when the receive side must end or reconnect.
    pub fn pause(&self, d: Duration) {
        self.shared.flags.sleep(d, |b| self.ends(b) || b.kick);
    }

    /// Sleeps `d` whatever happens (a short wait inside one operation).
    fn sleep(&self, d: Duration) {
        self.shared.flags.sleep(d, |_| false);
    }

    /// Moves to `s`, with a ledger line when it changed; never out of `parked` (either half may
    /// park the adapter, and only the next start leaves it).
    fn set(&self, s: State) {
        if self.status.set_unless_parked(s.clone()) {
            self.shared.host.state_changed(&self.name, &s);
        }
    }

    fn close_deadline(&self) -> Option<Instant> {
        *self.shared.close_deadline.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Retries after a failure wait this long, doubling up to [`BACKOFF_MAX`].
const BACKOFF_MIN: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(15);
/// Longest retry-after honoured as given; a larger one is capped (and retried then).
const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

fn next_backoff(backoff: Duration) -> Duration {
    (backoff * 2).min(BACKOFF_MAX)
}

/// How long past the close deadline [`Adapter::close`] waits for the sender.
const SEND_GRACE: Duration = Duration::from_millis(200);

/// A [`Protocol`] as an [`Adapter`].
pub struct Skeleton<P: Protocol> {
    name: String,
    conflict_bound: Duration,
    status: Arc<Status>,
    run: Slot<Shared>,
    proto: P,
}

impl<P: Protocol> Skeleton<P> {
    /// The adapter for `[[platform]]` table `cfg`, speaking `proto`.
    pub fn from_protocol(cfg: &PlatformConfig, proto: P) -> Skeleton<P> {
        Skeleton {
            name: cfg.adapter_name(),
            conflict_bound: Duration::from_secs(cfg.conflict_standby_s),
            status: Arc::new(Status::default()),
            run: Slot::default(),
            proto,
        }
    }

    pub fn protocol(&self) -> &P {
        &self.proto
    }

    fn ctx(&self, shared: &Arc<Shared>) -> Ctx {
        Ctx {
            name: self.name.clone(),
            status: Arc::clone(&self.status),
            shared: Arc::clone(shared),
            listens_through_drain: P::LIMITS.listens_through_drain,
        }
    }
}

impl<P: Protocol> Adapter for Skeleton<P> {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> &'static str {
        P::KIND
    }

    fn credential(&self) -> &str {
        self.proto.credential()
    }

    fn status(&self) -> &Arc<Status> {
        &self.status
    }

    /// New threads and flags on every start, so threads of an earlier start (stopped, maybe
    /// still finishing) never see this start's flags.
    fn start(&self, host: Arc<dyn Host>) -> Result<(), AdapterError> {
        self.status.set(State::Connecting);
        let (rx, tx) =
            self.proto.open(&host).map_err(|message| AdapterError::Start { name: self.name.clone(), message })?;
        let shared = Arc::new(Shared {
            flags: Flags::default(),
            close_deadline: Mutex::new(None),
            host,
            emptied: AtomicBool::new(false),
            shown: Mutex::new(std::collections::VecDeque::new()),
        });
        let (rctx, sctx) = (self.ctx(&shared), self.ctx(&shared));
        let bound = self.conflict_bound;
        let recv_done = wait::spawn(&self.name, "recv", move || receive::run(rx, &rctx, P::LIMITS, bound))?;
        let emptied = Arc::clone(&shared);
        let send = move || emptied.emptied.store(send::run(tx, &sctx, P::LIMITS), Ordering::Release);
        let send_done = match wait::spawn(&self.name, "send", send) {
            Ok(d) => d,
            Err(e) => {
                // No orphan: the receiver ends too.
                shared.flags.update(|b| (b.stop, b.close, b.hangup) = (true, true, true));
                return Err(e);
            }
        };
        self.run.set(Running { shared, recv_done, send_done });
        Ok(())
    }

    fn wake(&self) {
        self.run.signal(|b| b.wake = true);
    }

    fn reconnect(&self) {
        self.run.signal(|b| b.kick = true);
    }

    fn stop_intake(&self) {
        let Some(shared) = self.run.shared() else { return };
        let mut first = false;
        shared.flags.update(|b| {
            first = !b.stop;
            b.stop = true;
        });
        // A zero budget is a demoted cluster active: a successor may be receiving now, which a
        // hand-over would cut. (A graceful stop comes here while still active.)
        let demoted = shared.host.receive_budget().is_some_and(|b| b.is_zero());
        if first && !demoted && !matches!(self.status.state(), State::Parked(_)) {
            self.proto.hand_over();
        }
    }

    fn close(&self, deadline: Instant) -> bool {
        self.stop_intake();
        let mut flushed = true;
        if let Some(r) = self.run.take() {
            wait::begin_close(&r.shared.flags, &r.shared.close_deadline, deadline);
            flushed = wait::ended_by(&r.send_done, deadline, SEND_GRACE) && r.shared.emptied.load(Ordering::Acquire);
            // The replies are out (or the deadline passed): a receive side that listened through
            // the drain may leave now.
            r.shared.flags.update(|b| b.hangup = true);
            wait::ended_by(&r.recv_done, deadline, P::LIMITS.close_grace);
        }
        self.status.set(State::Closed);
        flushed
    }

    fn watchdog_after(&self) -> Duration {
        self.proto.watchdog_after()
    }

    fn hook(&self, req: &HookRequest) -> HookAnswer {
        let receiving = match (self.run.shared(), self.status.state()) {
            (None, _) | (_, State::Closed) => Err("the adapter is not running".to_owned()),
            (Some(s), _) if s.flags.get().stop => Err("the gateway is draining".to_owned()),
            (_, s @ (State::Parked(_) | State::Standby(_))) => {
                Err(format!("{}: {}", s.name(), s.reason().unwrap_or_default()))
            }
            _ => Ok(()),
        };
        self.proto.hook(req, receiving)
    }

    fn show(&self, chat: &str, run: &str, activity: Activity) {
        let Some(shared) = self.run.shared() else { return };
        {
            let mut q = shared.shown.lock().unwrap_or_else(|p| p.into_inner());
            // Deltas the sender has not taken yet are merged: a busy sender (a long flush, a
            // rate limit) finds one entry per run, not one per token.
            if let (Activity::Text(more), Some((c, r, Activity::Text(text)))) = (&activity, q.back_mut())
                && c == chat
                && r == run
            {
                text.push_str(more);
            } else if q.len() >= MAX_SHOWN && matches!(activity, Activity::Text(_)) {
                return;
            } else {
                q.push_back((chat.to_owned(), run.to_owned(), activity));
            }
        }
        shared.flags.update(|b| b.show = true);
    }
}
