//! Showing the agent at work: which typing notices, previews and preview removals are due in
//! which chat, decided as data. The sender thread (send.rs) posts the worker's [`Activity`]
//! here, asks [`Progress::due`] what to do now, does it through the protocol's
//! [`Sender`](super::Sender) and reports each outcome back; nothing here does I/O or blocks.
//!
//! - **Typing** is on from a run's start until no run of that chat is in progress: refreshed
//!   every [`TYPING_EVERY`] (Telegram's chat action lasts 5 s), turned off once (Matrix).
//! - **Preview**: a reply still being written [`PREVIEW_AFTER`] after its start is shown as it
//!   grows: one message, then edits of it, at most one per [`EDIT_EVERY`] per chat, only when
//!   its text changed. A rate limit holds the chat's typing and previews until it has passed:
//!   the skipped edit is not retried, the next one carries the newer text.
//! - **The preview is temporary.** The reply itself leaves through the outbox as before (a new
//!   message, durable, notified); once that entry is sent ([`Progress::sent`]), the preview is
//!   removed. A run that ends without a reply in this incarnation (cancelled by the drain, to be
//!   re-run by the next one) has its preview removed at once. The previews on screen are listed
//!   by [`Progress::shown`] so the sender can keep them in the home: a successor removes what a
//!   crash left ([`Progress::leftover`]), so the chat ends with the final text once.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::{PieceLimit, SendError};
use crate::Activity;

/// How often "typing…" is refreshed while a run is in progress.
pub const TYPING_EVERY: Duration = Duration::from_secs(4);
/// How long a reply is written before it is previewed.
pub const PREVIEW_AFTER: Duration = Duration::from_secs(2);
/// The least time between two preview messages or edits in one chat.
pub const EDIT_EVERY: Duration = Duration::from_secs(1);
/// Runs tracked at once; past it the oldest ended ones are forgotten (their previews stay
/// listed by [`Progress::shown`] until removed).
const MAX_RUNS: usize = 256;
/// Marks a preview as unfinished.
const MORE: &str = " …";

/// One thing to do through the protocol's sender.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Turn "typing…" on (a refresh) or off in `chat`.
    Typing { chat: String, on: bool },
    /// Show `text` as `run`'s preview: a new message, or an edit of `shown`.
    Preview { chat: String, run: String, text: String, shown: Option<String> },
    /// Remove preview message `shown` of `run`.
    Unpreview { chat: String, run: String, shown: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Running,
    /// Ended with a reply in the outbox: the preview stays until it is sent.
    Replied,
    /// The preview is to be removed.
    Remove,
}

#[derive(Debug)]
struct Run {
    chat: String,
    started: Instant,
    /// What the run wrote so far, at most a piece's worth (the rest is not previewed).
    text: String,
    full: bool,
    /// The preview message, once sent.
    shown: Option<String>,
    /// The text it shows.
    shown_text: String,
    /// Previews are off for this run (the platform has none, or refused one).
    no_preview: bool,
    phase: Phase,
}

#[derive(Debug, Default)]
struct Chat {
    typing_at: Option<Instant>,
    typing_on: bool,
    edit_at: Option<Instant>,
    /// A rate limit: nothing for this chat before then.
    hold: Option<Instant>,
}

/// The per-chat state of runs in progress (module notes).
#[derive(Debug)]
pub struct Progress {
    limit: PieceLimit,
    runs: BTreeMap<String, Run>,
    chats: BTreeMap<String, Chat>,
    /// Insertion order of runs, to forget the oldest.
    order: Vec<String>,
}

impl Progress {
    /// Previews fit in one piece of `limit`.
    pub fn new(limit: PieceLimit) -> Progress {
        Progress { limit, runs: BTreeMap::new(), chats: BTreeMap::new(), order: Vec::new() }
    }

    /// Previews a predecessor left on screen (`(chat, shown)` from [`Progress::shown`]): they
    /// are removed first.
    pub fn leftover(&mut self, shown: Vec<(String, String)>, now: Instant) {
        for (i, (chat, id)) in shown.into_iter().enumerate() {
            let run = format!("\0leftover-{i}");
            self.insert(
                run,
                Run {
                    chat,
                    started: now,
                    text: String::new(),
                    full: true,
                    shown: Some(id),
                    shown_text: String::new(),
                    no_preview: true,
                    phase: Phase::Remove,
                },
            );
        }
    }

    fn insert(&mut self, run: String, r: Run) {
        if self.runs.len() >= MAX_RUNS {
            // Forget the oldest run that is not running; a running one only when all are.
            let victim = self
                .order
                .iter()
                .position(|k| self.runs.get(k).is_none_or(|r| r.phase != Phase::Running && r.shown.is_none()))
                .unwrap_or(0);
            let k = self.order.remove(victim);
            self.runs.remove(&k);
        }
        self.order.push(run.clone());
        self.runs.insert(run, r);
    }

    fn forget(&mut self, run: &str) {
        self.runs.remove(run);
        self.order.retain(|k| k != run);
    }

    /// Takes what the worker said about `run` in `chat`.
    pub fn post(&mut self, chat: &str, run: &str, activity: Activity, now: Instant) {
        match activity {
            Activity::Started => {
                if !self.runs.contains_key(run) {
                    self.insert(
                        run.to_owned(),
                        Run {
                            chat: chat.to_owned(),
                            started: now,
                            text: String::new(),
                            full: false,
                            shown: None,
                            shown_text: String::new(),
                            no_preview: false,
                            phase: Phase::Running,
                        },
                    );
                }
            }
            Activity::Text(delta) => {
                let limit = self.limit;
                if let Some(r) = self.runs.get_mut(run).filter(|r| r.phase == Phase::Running && !r.full) {
                    for c in delta.chars() {
                        let mut next = r.text.clone();
                        next.push(c);
                        next.push_str(MORE);
                        if !fits(limit, &next) {
                            r.full = true;
                            break;
                        }
                        r.text.push(c);
                    }
                }
            }
            Activity::Ended { replied } => {
                if let Some(r) = self.runs.get_mut(run).filter(|r| r.phase == Phase::Running) {
                    r.phase = if replied { Phase::Replied } else { Phase::Remove };
                }
            }
        }
    }

    /// The outbox entry answering `run` was sent (or rejected): its preview goes.
    pub fn sent(&mut self, run: &str) {
        if let Some(r) = self.runs.get_mut(run) {
            r.phase = Phase::Remove;
        }
    }

    fn held(&self, chat: &str, now: Instant) -> bool {
        self.chats.get(chat).and_then(|c| c.hold).is_some_and(|h| now < h)
    }

    /// What to do now, at most one preview step per chat.
    pub fn due(&mut self, now: Instant) -> Vec<Step> {
        let mut steps = Vec::new();
        // Runs whose preview is gone or never came are forgotten once they no longer run.
        let done: Vec<String> = self
            .runs
            .iter()
            .filter(|(_, r)| r.phase == Phase::Remove && r.shown.is_none())
            .map(|(k, _)| k.clone())
            .collect();
        for k in done {
            self.forget(&k);
        }
        let running: std::collections::BTreeSet<&str> =
            self.runs.values().filter(|r| r.phase == Phase::Running).map(|r| r.chat.as_str()).collect();
        let mut typing = Vec::new();
        for chat in &running {
            let c = self.chats.get(*chat);
            let fresh = c.and_then(|c| c.typing_at).is_some_and(|t| now.saturating_duration_since(t) < TYPING_EVERY);
            if !fresh && !self.held(chat, now) {
                typing.push(Step::Typing { chat: (*chat).to_owned(), on: true });
            }
        }
        for (chat, c) in &self.chats {
            if c.typing_on && !running.contains(chat.as_str()) && !self.held(chat, now) {
                typing.push(Step::Typing { chat: chat.clone(), on: false });
            }
        }
        for s in &typing {
            if let Step::Typing { chat, on } = s {
                let c = self.chats.entry(chat.clone()).or_default();
                c.typing_on = *on;
                c.typing_at = on.then_some(now);
            }
        }
        steps.extend(typing);
        let mut edited = std::collections::BTreeSet::new();
        for (run, r) in &mut self.runs {
            let c = self.chats.entry(r.chat.clone()).or_default();
            if c.hold.is_some_and(|h| now < h) {
                continue;
            }
            match r.phase {
                Phase::Remove => {
                    if let Some(shown) = &r.shown {
                        steps.push(Step::Unpreview { chat: r.chat.clone(), run: run.clone(), shown: shown.clone() });
                    }
                }
                Phase::Running => {
                    let paced = c.edit_at.is_none_or(|t| now.saturating_duration_since(t) >= EDIT_EVERY);
                    let text = format!("{}{MORE}", r.text.trim_end());
                    let wanted = !r.no_preview
                        && !r.text.trim().is_empty()
                        && now.saturating_duration_since(r.started) >= PREVIEW_AFTER
                        && text != r.shown_text;
                    if wanted && paced && !edited.contains(&r.chat) {
                        edited.insert(r.chat.clone());
                        c.edit_at = Some(now);
                        steps.push(Step::Preview {
                            chat: r.chat.clone(),
                            run: run.clone(),
                            text,
                            shown: r.shown.clone(),
                        });
                    }
                }
                Phase::Replied => {}
            }
        }
        steps
    }

    /// When [`Progress::due`] may have something next (`None`: nothing until new activity).
    pub fn next_due(&self, now: Instant) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        let mut at = |t: Instant| next = Some(next.map_or(t, |n| n.min(t)));
        for r in self.runs.values() {
            let c = self.chats.get(&r.chat);
            let hold = c.and_then(|c| c.hold).filter(|h| now < *h);
            match r.phase {
                Phase::Remove => at(hold.unwrap_or(now)),
                Phase::Running => {
                    at(hold.unwrap_or(now).max(c.and_then(|c| c.typing_at).map_or(now, |t| t + TYPING_EVERY)));
                    if !r.no_preview
                        && !r.text.trim().is_empty()
                        && format!("{}{MORE}", r.text.trim_end()) != r.shown_text
                    {
                        let edit = c.and_then(|c| c.edit_at).map_or(now, |t| t + EDIT_EVERY);
                        at(hold.unwrap_or(now).max(edit).max(r.started + PREVIEW_AFTER));
                    }
                }
                Phase::Replied => {}
            }
        }
        for (chat, c) in &self.chats {
            if c.typing_on && !self.runs.values().any(|r| r.phase == Phase::Running && &r.chat == chat) {
                at(c.hold.filter(|h| now < *h).unwrap_or(now));
            }
        }
        next
    }

    fn limited(&mut self, chat: &str, e: &SendError, now: Instant) {
        if let SendError::RateLimited(after) = e {
            let d = after.unwrap_or(Duration::from_secs(1)).min(Duration::from_secs(300));
            self.chats.entry(chat.to_owned()).or_default().hold = Some(now + d);
        }
    }

    /// How a [`Step::Typing`] went.
    pub fn typed(&mut self, chat: &str, r: Result<(), SendError>, now: Instant) {
        if let Err(e) = r {
            self.limited(chat, &e, now);
        }
    }

    /// How a [`Step::Preview`] went: `Ok(Some(id))` is the preview message, `Ok(None)` a
    /// platform without previews. Returns whether the previews on screen changed.
    pub fn previewed(
        &mut self,
        chat: &str,
        run: &str,
        text: String,
        r: Result<Option<String>, SendError>,
        now: Instant,
    ) -> bool {
        let Some(run) = self.runs.get_mut(run) else { return false };
        match r {
            Ok(Some(id)) => {
                let new = run.shown.as_ref() != Some(&id);
                run.shown = Some(id);
                run.shown_text = text;
                new
            }
            Ok(None) | Err(SendError::Rejected(_) | SendError::Unauthorized(_)) => {
                run.no_preview = true;
                false
            }
            Err(e) => {
                self.limited(chat, &e, now);
                false
            }
        }
    }

    /// How a [`Step::Unpreview`] went; a rate limit keeps it for later, anything else forgets
    /// it (best-effort). Returns whether the previews on screen changed.
    pub fn unpreviewed(&mut self, chat: &str, run: &str, r: Result<(), SendError>, now: Instant) -> bool {
        if let Err(e @ SendError::RateLimited(_)) = &r {
            self.limited(chat, e, now);
            return false;
        }
        let had = self.runs.get(run).is_some_and(|r| r.shown.is_some());
        self.forget(run);
        had
    }

    /// The previews on screen, `(chat, message)`.
    pub fn shown(&self) -> Vec<(String, String)> {
        self.runs.values().filter_map(|r| r.shown.clone().map(|s| (r.chat.clone(), s))).collect()
    }

    /// Whether nothing is tracked.
    pub fn is_idle(&self) -> bool {
        self.runs.is_empty() && self.chats.values().all(|c| !c.typing_on)
    }
}

/// Whether `s` fits in one piece of `limit`.
fn fits(limit: PieceLimit, s: &str) -> bool {
    match limit {
        PieceLimit::Chars(n) => s.chars().count() <= n,
        PieceLimit::Bytes(n) => s.len() <= n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    fn previews(steps: &[Step]) -> Vec<&Step> {
        steps.iter().filter(|s| matches!(s, Step::Preview { .. })).collect()
    }

    /// Typing from the start, every 4 s; a preview only after 2 s, then at most one edit per
    /// second per chat, each with newer text; typing off and the preview removed once the
    /// reply is sent.
    #[test]
    fn a_streaming_run_types_previews_and_cleans_up() {
        let t0 = Instant::now();
        let mut p = Progress::new(PieceLimit::Chars(4096));
        p.post("c", "r", Activity::Started, t0);
        p.post("c", "r", Activity::Text("Hel".into()), t0);
        assert_eq!(p.due(t0), vec![Step::Typing { chat: "c".into(), on: true }]);
        assert_eq!(p.due(t0 + s(1000)), vec![], "no preview before 2 s, typing still fresh");
        assert_eq!(p.next_due(t0 + s(1000)), Some(t0 + PREVIEW_AFTER));
        let steps = p.due(t0 + s(2000));
        assert_eq!(steps, vec![Step::Preview { chat: "c".into(), run: "r".into(), text: "Hel …".into(), shown: None }]);
        assert!(p.previewed("c", "r", "Hel …".into(), Ok(Some("m1".into())), t0 + s(2000)));
        p.post("c", "r", Activity::Text("lo".into()), t0 + s(2100));
        assert!(previews(&p.due(t0 + s(2500))).is_empty(), "one edit per second");
        assert_eq!(
            p.due(t0 + s(3000)),
            vec![Step::Preview {
                chat: "c".into(), run: "r".into(), text: "Hello …".into(), shown: Some("m1".into())
            }]
        );
        assert!(!p.previewed("c", "r", "Hello …".into(), Ok(Some("m1".into())), t0 + s(3000)));
        assert!(p.due(t0 + s(3900)).is_empty(), "unchanged text is not edited again");
        assert_eq!(p.due(t0 + s(4000)), vec![Step::Typing { chat: "c".into(), on: true }]);
        p.post("c", "r", Activity::Ended { replied: true }, t0 + s(4100));
        assert_eq!(p.due(t0 + s(4100)), vec![Step::Typing { chat: "c".into(), on: false }]);
        assert!(p.due(t0 + s(4200)).is_empty(), "the preview stays until the reply is sent");
        assert_eq!(p.shown(), vec![("c".to_string(), "m1".to_string())]);
        p.sent("r");
        let steps = p.due(t0 + s(4300));
        assert_eq!(steps, vec![Step::Unpreview { chat: "c".into(), run: "r".into(), shown: "m1".into() }]);
        assert!(p.unpreviewed("c", "r", Ok(()), t0 + s(4300)));
        assert!(p.is_idle() && p.shown().is_empty() && p.next_due(t0 + s(4300)).is_none());
    }

    /// A run cancelled by the drain has its preview removed at once; a rate limit holds the
    /// chat (nothing retried in a loop), and previews a predecessor left are removed first.
    #[test]
    fn cancelled_runs_rate_limits_and_leftovers() {
        let t0 = Instant::now();
        let mut p = Progress::new(PieceLimit::Chars(4096));
        p.leftover(vec![("c".into(), "old".into())], t0);
        assert!(matches!(&p.due(t0)[..], [Step::Unpreview { shown, .. }] if shown == "old"));
        let _ = p.unpreviewed("c", "\0leftover-0", Err(SendError::RateLimited(Some(s(5000)))), t0);
        assert!(p.due(t0 + s(4999)).is_empty(), "held by the rate limit");
        assert_eq!(p.next_due(t0 + s(1000)), Some(t0 + s(5000)));
        assert!(matches!(&p.due(t0 + s(5000))[..], [Step::Unpreview { .. }]), "then done once");
        assert!(p.unpreviewed("c", "\0leftover-0", Err(SendError::Failed("gone".into())), t0 + s(5000)));
        p.post("c", "r", Activity::Started, t0 + s(6000));
        p.post("c", "r", Activity::Text("x".into()), t0 + s(6000));
        let _ = p.due(t0 + s(6000));
        let steps = p.due(t0 + s(8000));
        assert_eq!(previews(&steps).len(), 1);
        assert!(!p.previewed("c", "r", "x …".into(), Err(SendError::RateLimited(Some(s(3000)))), t0 + s(8000)));
        p.post("c", "r", Activity::Text("y".into()), t0 + s(8500));
        assert!(p.due(t0 + s(10_999)).is_empty(), "nothing for the chat while held");
        assert_eq!(previews(&p.due(t0 + s(11_000))).len(), 1, "the newer text, once the limit passed");
        assert!(p.previewed("c", "r", "xy …".into(), Ok(Some("m2".into())), t0 + s(11_000)));
        p.post("c", "r", Activity::Ended { replied: false }, t0 + s(11_500));
        let steps = p.due(t0 + s(11_500));
        assert!(
            steps.contains(&Step::Unpreview { chat: "c".into(), run: "r".into(), shown: "m2".into() }),
            "{steps:?}"
        );
        assert!(steps.contains(&Step::Typing { chat: "c".into(), on: false }), "{steps:?}");
    }

    /// A platform without previews (`Ok(None)`) is never asked again; activity for unknown runs
    /// is ignored; previews never outgrow a piece.
    #[test]
    fn no_preview_platforms_unknown_runs_and_bounds() {
        let t0 = Instant::now();
        let mut p = Progress::new(PieceLimit::Chars(8));
        p.post("c", "ghost", Activity::Text("boo".into()), t0);
        p.post("c", "ghost", Activity::Ended { replied: true }, t0);
        assert!(p.due(t0).is_empty() && p.is_idle());
        p.post("c", "r", Activity::Started, t0);
        p.post("c", "r", Activity::Text("abcdefghijkl".into()), t0);
        let steps = p.due(t0 + s(2000));
        let Some(Step::Preview { text, .. }) = previews(&steps).first().copied().cloned() else { panic!("{steps:?}") };
        assert_eq!(text, "abcdef …");
        assert!(text.chars().count() <= 8);
        assert!(!p.previewed("c", "r", text, Ok(None), t0 + s(2000)));
        p.post("c", "r", Activity::Text("more".into()), t0 + s(2000));
        assert!(previews(&p.due(t0 + s(9000))).is_empty());
        for i in 0..(MAX_RUNS * 2) {
            p.post("d", &format!("r{i}"), Activity::Started, t0);
        }
        assert!(p.runs.len() <= MAX_RUNS);
    }
}
