//! The sender loop: the outbox, piece by piece, paced and retried, until the drain's deadline.

use std::time::{Duration, Instant};

use gatewarden_lifecycle::fsio;

use super::progress::{Progress, Step};
use super::{BACKOFF_MIN, Ctx, Limits, MAX_RETRY_AFTER, Pace, PieceLimit, next_backoff};
use crate::{Sent, State};

/// A rate limit that names no wait.
const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);
/// How often a sender with nothing to do (parked, no connection) looks again.
const IDLE: Duration = Duration::from_millis(200);
/// How long an idle sender sleeps when no wake comes.
const IDLE_POLL: Duration = Duration::from_secs(1);

/// Which piece of which outbox entry is being sent: an idempotency key where the platform has
/// one (Matrix's transaction id).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PieceId {
    /// The outbox entry.
    pub seq: i64,
    /// The piece's index within the entry's reply, from 0.
    pub index: usize,
}

/// A stored file a reply carries (attachments.rs), for [`Sender::send_file`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutFile {
    pub name: String,
    /// The MIME type its content shows.
    pub kind: String,
    pub path: std::path::PathBuf,
    pub size: u64,
}

/// One step of sending an outbox entry.
enum Part {
    Text(String),
    File(OutFile),
}

/// Why sending one piece failed, typed by what the skeleton does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendError {
    /// This entry can never be sent (unknown chat, bot blocked, bad target): recorded as
    /// rejected, never retried.
    Rejected(String),
    /// Wait the platform's retry-after (else one second), then send the same piece again.
    RateLimited(Option<Duration>),
    /// The credentials are refused: the adapter is `parked`.
    Unauthorized(String),
    /// A failure worth a `degraded`: the batch is retried with backoff (at least once out: a
    /// piece may go again).
    Failed(String),
    /// The connection is gone: the receive side reports it and reconnects; the batch is
    /// retried once [`Sender::ready`].
    Lost(String),
}

/// A protocol's send side, run on the adapter's sender thread.
pub trait Sender: Send + 'static {
    /// Whether a piece can be sent now (IRC: a connection is up).
    fn ready(&self) -> bool {
        true
    }
    /// Sends one piece of a reply to `chat`, blocking at most the platform's request bound.
    fn send(&mut self, chat: &str, piece: &str, id: PieceId) -> Result<(), SendError>;

    /// Uploads one stored file of a reply to `chat` (after the reply's text), with the
    /// platform's native upload. Default: the file is named in a text piece (platforms whose
    /// upload is not built yet).
    fn send_file(&mut self, chat: &str, file: &OutFile, id: PieceId) -> Result<(), SendError> {
        self.send(chat, &format!("[file: {}, {}, {} bytes]", file.name, file.kind, file.size), id)
    }

    /// Shows (`on`), or stops showing, "typing…" in `chat` while a run is in progress. Called
    /// every 4 s while on (Telegram's `sendChatAction` lasts 5 s; Matrix's typing notice takes
    /// a timeout), once with `false` when no run of the chat is left. Default: nothing (IRC).
    fn typing(&mut self, _chat: &str, _on: bool) -> Result<(), SendError> {
        Ok(())
    }

    /// Shows `text`, the reply being written, as a preview in `chat`: a new message when
    /// `shown` is `None`, else an edit of message `shown` (an edit that changes nothing counts
    /// as done). Returns the preview message's id; `Ok(None)`: this platform shows no
    /// previews (the default; IRC).
    fn preview(&mut self, _chat: &str, _text: &str, _shown: Option<&str>) -> Result<Option<String>, SendError> {
        Ok(None)
    }

    /// Removes preview message `shown` from `chat`: the final reply was sent as its own
    /// message, or the run was abandoned (a message already gone counts as done).
    fn unpreview(&mut self, _chat: &str, _shown: &str) -> Result<(), SendError> {
        Ok(())
    }
}

/// Cuts `text` into the pieces a platform with `limits` takes; never empty. Each piece is cut
/// at the last paragraph break (a blank line) within the limit, else the last line break, else
/// the last sentence end (`.`, `!`, `?`, `…` before whitespace), else the last whitespace,
/// else mid-word; the whitespace at a cut is dropped, as is a piece of only whitespace. In
/// order, nothing but that whitespace lost (property-tested below).
pub fn pieces(text: &str, limits: &Limits) -> Vec<String> {
    let lines: Vec<String> = if limits.line_per_piece {
        text.split('\n')
            .map(|l| l.chars().filter(|c| !matches!(c, '\r' | '\0')).collect::<String>().trim_end().to_owned())
            .collect()
    } else {
        vec![text.to_owned()]
    };
    let mut out = Vec::new();
    for line in &lines {
        out.extend(split_at_boundaries(line, limits.piece).into_iter().map(str::to_owned));
    }
    if out.is_empty() {
        out.push("(empty reply)".to_owned());
    }
    out
}

/// The byte index where the longest prefix of `s` that fits `limit` ends (at least one char).
fn longest_fit(s: &str, limit: PieceLimit) -> usize {
    let end = match limit {
        PieceLimit::Chars(n) => s.char_indices().nth(n.max(1)).map_or(s.len(), |(i, _)| i),
        PieceLimit::Bytes(n) => {
            let mut end = n.min(s.len());
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            end
        }
    };
    if end == 0 { s.chars().next().map_or(0, char::len_utf8) } else { end }
}

/// [`pieces`] of one text: the cuts of the module notes.
fn split_at_boundaries(text: &str, limit: PieceLimit) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let max = longest_fit(rest, limit);
        if max >= rest.len() {
            if !rest.trim().is_empty() {
                out.push(rest.trim_end());
            }
            break;
        }
        // The window includes the char at `max`: a boundary right after the piece counts.
        let window = &rest[..max + rest[max..].chars().next().map_or(0, char::len_utf8)];
        let after = |i: usize| i > 0 && i <= max && !rest[..i].trim().is_empty();
        let cut = window
            .rfind("\n\n")
            .filter(|&i| after(i))
            .or_else(|| window.rfind('\n').filter(|&i| after(i)))
            .or_else(|| {
                let sentence_end = |&(i, c): &(usize, char)| {
                    matches!(c, '.' | '!' | '?' | '…')
                        && window[i + c.len_utf8()..].starts_with(char::is_whitespace)
                        && after(i + c.len_utf8())
                };
                window.char_indices().rev().find(sentence_end).map(|(i, c)| i + c.len_utf8())
            })
            .or_else(|| window.char_indices().rev().find(|&(i, c)| c.is_whitespace() && after(i)).map(|(i, _)| i))
            .unwrap_or(max);
        let piece = rest[..cut].trim_end();
        if !piece.trim().is_empty() {
            out.push(piece);
        }
        rest = rest[cut..].trim_start();
    }
    out
}

/// A token bucket for outgoing pieces.
#[derive(Debug, Clone)]
pub struct Bucket {
    pace: Pace,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    pub fn new(now: Instant, pace: Pace) -> Bucket {
        Bucket { pace, tokens: f64::from(pace.burst), at: now }
    }

    /// Takes one token: how long to wait before sending (zero when one is available).
    pub fn take(&mut self, now: Instant) -> Duration {
        let every = self.pace.every.as_secs_f64().max(f64::MIN_POSITIVE);
        let refill = now.saturating_duration_since(self.at).as_secs_f64() / every;
        self.tokens = (self.tokens + refill).min(f64::from(self.pace.burst));
        self.at = now;
        self.tokens -= 1.0;
        if self.tokens >= 0.0 { Duration::ZERO } else { self.pace.every.mul_f64(-self.tokens) }
    }
}

/// Why a flush stopped early.
enum Stop {
    /// The drain's deadline comes before the next piece may go: the successor sends the rest.
    Deadline,
    Failed(String),
    Lost,
}

struct Loop<'a, S> {
    tx: S,
    ctx: &'a Ctx,
    limits: Limits,
    bucket: Option<Bucket>,
    progress: Progress,
    /// Where the previews on screen are listed (`<home>/platforms/previews-<name>.json`).
    previews_file: Option<std::path::PathBuf>,
}

/// Drains the outbox through `tx` until the drain's close: then until it is empty or the
/// deadline has come. Returns whether the outbox was empty at the end.
pub(crate) fn run<S: Sender>(tx: S, ctx: &Ctx, limits: Limits) -> bool {
    // Whether what is left is nothing (the gateway warns otherwise).
    let left_empty = || ctx.host().outbox(ctx.name(), 1).is_ok_and(|b| b.is_empty());
    let bucket = limits.pace.map(|p| Bucket::new(Instant::now(), p));
    let previews_file = ctx.host().state_dir().map(|d| d.join(format!("previews-{}.json", ctx.name())));
    let mut progress = Progress::new(limits.piece);
    if let Some(left) = previews_file.as_deref().and_then(|p| fsio::read_capped(p, fsio::MAX_RECORD_BYTES).ok()) {
        progress.leftover(serde_json::from_slice(&left).unwrap_or_default(), Instant::now());
    }
    let mut l = Loop { tx, ctx, limits, bucket, progress, previews_file };
    let empty = l.run(&left_empty);
    // The drain: what is left to tidy (previews of cancelled runs, typing) before the deadline.
    if l.tx.ready() {
        l.show();
    }
    empty
}

impl<S: Sender> Loop<'_, S> {
    fn run(&mut self, left_empty: &dyn Fn() -> bool) -> bool {
        let (ctx, l) = (self.ctx, self);
        let mut backoff = BACKOFF_MIN;
        loop {
            let closing = ctx.shared.flags.get().close;
            let deadline = ctx.close_deadline();
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return left_empty();
            }
            let parked = matches!(ctx.status.state(), State::Parked(_));
            if parked || !l.tx.ready() {
                // Neither heals before the drain ends (no connection is made then): the outbox
                // waits for the next start or the successor.
                if closing {
                    return left_empty();
                }
                ctx.shared.flags.sleep(IDLE, |b| b.close);
                continue;
            }
            match l.flush() {
                Ok(true) => {
                    backoff = BACKOFF_MIN;
                    if closing {
                        return true;
                    }
                    l.idle();
                }
                Ok(false) => backoff = BACKOFF_MIN,
                Err(Stop::Deadline) => return left_empty(),
                Err(stop) => {
                    // A parked adapter stays parked: its reason is the one that matters.
                    if let Stop::Failed(e) = stop
                        && !matches!(ctx.status.state(), State::Parked(_))
                    {
                        ctx.set(State::Degraded(format!("cannot send: {e}")));
                    }
                    let d = deadline.map_or(backoff, |d| backoff.min(d.saturating_duration_since(Instant::now())));
                    ctx.shared.flags.sleep(d, |b| b.close && !closing);
                    backoff = next_backoff(backoff);
                }
            }
        }
    }

    /// Nothing to send: shows the runs' activity as it comes and falls due, until the outbox
    /// wakes us or [`IDLE_POLL`] has passed.
    fn idle(&mut self) {
        let flags = &self.ctx.shared.flags;
        let until = Instant::now() + IDLE_POLL;
        loop {
            self.show();
            let now = Instant::now();
            let next = self.progress.next_due(now).map_or(until, |t| t.min(until));
            let b = flags.sleep(next.saturating_duration_since(now), |b| b.wake || b.close || b.show);
            if b.wake || b.close || Instant::now() >= until {
                break;
            }
        }
        flags.take_wake();
    }

    /// Takes the runs' activity and does what is due (progress.rs): typing, previews, their
    /// removal. Each call is bounded by the protocol's request bound; a closing sender stops at
    /// its deadline.
    fn show(&mut self) {
        let ctx = self.ctx;
        ctx.shared.flags.take_show();
        let posted: Vec<_> = ctx.shared.shown.lock().unwrap_or_else(|p| p.into_inner()).drain(..).collect();
        let now = Instant::now();
        for (chat, run, activity) in posted {
            self.progress.post(&chat, &run, activity, now);
        }
        let mut changed = false;
        for step in self.progress.due(now) {
            if ctx.close_deadline().is_some_and(|d| Instant::now() >= d) {
                break;
            }
            match step {
                Step::Typing { chat, on } => {
                    let r = self.tx.typing(&chat, on);
                    self.progress.typed(&chat, r, Instant::now());
                }
                Step::Preview { chat, run, text, shown } => {
                    let r = self.tx.preview(&chat, &text, shown.as_deref());
                    changed |= self.progress.previewed(&chat, &run, text, r, Instant::now());
                }
                Step::Unpreview { chat, run, shown } => {
                    let r = self.tx.unpreview(&chat, &shown);
                    changed |= self.progress.unpreviewed(&chat, &run, r, Instant::now());
                }
            }
        }
        if changed && let Some(path) = &self.previews_file {
            let shown = self.progress.shown();
            let r = match path.parent() {
                Some(dir) => gatewarden_lifecycle::platform::create_private_dir(dir)
                    .and_then(|()| fsio::write_json(path, &shown)),
                None => fsio::write_json(path, &shown),
            };
            // Best-effort like the previews themselves: unrecorded, a crash leaves one on screen.
            drop(r);
        }
    }

    /// Sends one batch of the outbox. `Ok(true)` when it was empty.
    fn flush(&mut self) -> Result<bool, Stop> {
        let ctx = self.ctx;
        let batch = ctx
            .host()
            .outbox(ctx.name(), self.limits.batch)
            .map_err(|e| Stop::Failed(format!("cannot read the outbox: {e}")))?;
        if batch.is_empty() {
            return Ok(true);
        }
        let store = ctx.host().attachments().map(|(s, _)| s);
        'items: for item in batch {
            // The files the entry names (stored before it was queued) go after its text; the
            // entry is marked sent only once all are out.
            let (text, files) = match &store {
                Some(store) if item.text.contains("[attachment: ") => crate::attachments::resolve(store, &item.text),
                _ => (item.text.clone(), Vec::new()),
            };
            let mut parts: Vec<Part> = if text.trim().is_empty() && !files.is_empty() {
                Vec::new()
            } else {
                pieces(&text, &self.limits).into_iter().map(Part::Text).collect()
            };
            parts.extend(
                files
                    .into_iter()
                    .map(|f| Part::File(OutFile { name: f.name, kind: f.kind, path: f.path, size: f.size })),
            );
            for (index, part) in parts.iter().enumerate() {
                let id = PieceId { seq: item.seq, index };
                loop {
                    let wait = self.bucket.as_mut().map_or(Duration::ZERO, |b| b.take(Instant::now()));
                    self.hold(wait)?;
                    let r = match part {
                        Part::Text(piece) => self.tx.send(&item.chat_id, piece, id),
                        Part::File(f) => self.tx.send_file(&item.chat_id, f, id),
                    };
                    match r {
                        Ok(()) => {
                            ctx.status.sent();
                            ctx.status.progress();
                            break;
                        }
                        Err(SendError::RateLimited(after)) => {
                            self.hold(after.unwrap_or(DEFAULT_RETRY_AFTER).min(MAX_RETRY_AFTER))?;
                        }
                        Err(SendError::Rejected(why)) => {
                            ctx.host().sent(item.seq, Sent::Rejected(why));
                            if let Some(run) = &item.message_id {
                                self.progress.sent(run);
                            }
                            continue 'items;
                        }
                        Err(SendError::Unauthorized(why)) => {
                            ctx.set(State::Parked(format!("credentials rejected: {why}")));
                            return Err(Stop::Failed(why));
                        }
                        Err(SendError::Failed(why)) => return Err(Stop::Failed(why)),
                        Err(SendError::Lost(_)) => return Err(Stop::Lost),
                    }
                }
            }
            ctx.host().sent(item.seq, Sent::Ok);
            // The reply is out: its preview goes (progress.rs).
            if let Some(run) = &item.message_id {
                self.progress.sent(run);
            }
        }
        Ok(false)
    }

    /// Waits `d` before the next piece; [`Stop::Deadline`] when the drain's deadline comes
    /// first (also when the drain begins during the wait).
    fn hold(&self, d: Duration) -> Result<(), Stop> {
        let until = Instant::now() + d;
        loop {
            if self.ctx.close_deadline().is_some_and(|dl| until >= dl) {
                return Err(Stop::Deadline);
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(());
            }
            let closing = self.ctx.shared.flags.get().close;
            self.ctx.shared.flags.sleep(left, |b| b.close && !closing);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        piece: PieceLimit::Chars(3),
        line_per_piece: false,
        batch: 1,
        pace: None,
        min_receive: Duration::ZERO,
        redelivers: true,
        listens_through_drain: false,
        connected_after_receive: false,
        close_grace: Duration::ZERO,
    };

    #[test]
    fn flood_control_allows_a_burst_then_paces() {
        let pace = Pace { burst: 5, every: Duration::from_millis(500) };
        let t0 = Instant::now();
        let mut b = Bucket::new(t0, pace);
        for _ in 0..pace.burst {
            assert_eq!(b.take(t0), Duration::ZERO);
        }
        assert_eq!(b.take(t0), pace.every);
        assert_eq!(b.take(t0), pace.every * 2);
        // Idle time refills up to the burst, never beyond.
        let later = t0 + pace.every * 100;
        let mut b = Bucket::new(later, pace);
        for _ in 0..pace.burst {
            assert_eq!(b.take(later), Duration::ZERO);
        }
        assert!(b.take(later) > Duration::ZERO);
    }

    #[test]
    fn pieces_prefer_paragraphs_then_sentences_then_words() {
        let l = |n| Limits { piece: PieceLimit::Chars(n), ..LIMITS };
        let text = "One two. Three four five.\n\nSix seven eight nine ten. Eleven.";
        assert_eq!(pieces(text, &l(40)), vec!["One two. Three four five.", "Six seven eight nine ten. Eleven."]);
        assert_eq!(pieces(text, &l(20)), vec!["One two.", "Three four five.", "Six seven eight nine", "ten. Eleven."]);
        assert_eq!(pieces("aaaa bbbb cccc", &l(9)), vec!["aaaa bbbb", "cccc"], "a space right after the piece");
        let irc = Limits { piece: PieceLimit::Bytes(10), line_per_piece: true, ..LIMITS };
        assert_eq!(pieces("héllo wörld again\nx", &irc), vec!["héllo", "wörld", "again", "x"]);
    }

    fn fits(p: &str, limit: PieceLimit) -> bool {
        match limit {
            PieceLimit::Chars(n) => p.chars().count() <= n,
            PieceLimit::Bytes(n) => p.len() <= n,
        }
    }

    proptest::proptest! {
        /// In order, nothing but whitespace at the cuts lost, every piece within the limit (a
        /// char wider than a byte limit alone excepted) and never empty.
        #[test]
        fn splitting_keeps_order_and_content_within_the_limit(
            text in "([a-zé€😀]{1,12}|[ .!?\n]|\n\n|\r){0,80}",
            n in 1usize..60,
            bytes: bool,
            lines: bool,
        ) {
            let piece = if bytes { PieceLimit::Bytes(n) } else { PieceLimit::Chars(n) };
            let l = Limits { piece, line_per_piece: lines, ..LIMITS };
            let out = pieces(&text, &l);
            let text: String = if lines { text.chars().filter(|c| !matches!(c, '\r' | '\0')).collect() } else { text };
            proptest::prop_assert!(!out.is_empty());
            let visible = |s: &str| s.chars().filter(|c| !c.is_whitespace() && *c != '\0').collect::<String>();
            if visible(&text).is_empty() {
                proptest::prop_assert_eq!(out, vec!["(empty reply)".to_string()]);
            } else {
                proptest::prop_assert_eq!(visible(&out.concat()), visible(&text));
                let mut at = 0;
                for p in &out {
                    proptest::prop_assert!(!p.trim().is_empty(), "empty piece in {:?}", out);
                    proptest::prop_assert!(fits(p, piece) || p.chars().count() == 1, "{:?} over {:?}", p, piece);
                    let found = text[at..].find(p.as_str());
                    proptest::prop_assert!(found.is_some(), "{:?} not in order in {:?}", p, text);
                    at += found.unwrap_or(0) + p.len();
                }
            }
        }
    }

    #[test]
    fn pieces_follow_the_limit_and_are_never_empty() {
        assert_eq!(pieces("abcdefg", &LIMITS), vec!["abc", "def", "g"]);
        assert_eq!(pieces("éééé", &LIMITS), vec!["ééé", "é"], "characters, not bytes");
        assert_eq!(pieces("", &LIMITS), vec!["(empty reply)"]);
        assert_eq!(pieces("a\nb", &LIMITS), vec!["a\nb"], "a newline stays inside a piece");
        let lines = Limits { piece: PieceLimit::Bytes(5), line_per_piece: true, ..LIMITS };
        assert_eq!(
            pieces("abc defg\r\n\n\0", &lines),
            vec!["abc", "defg"],
            "lines, split at a space, empty ones dropped"
        );
        assert_eq!(pieces("\n", &lines), vec!["(empty reply)"]);
        assert!(pieces("éééé", &lines).iter().all(|p| p.len() <= 5));
    }
}
