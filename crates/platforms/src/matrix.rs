//! Matrix adapter: the client-server API's `/sync` long-poll and idempotent sends, on the
//! blocking client of crates/chatproto/src/matrix.rs.
//!
//! - **Credentials.** `token_env` names the variable holding an access token (a bot account's
//!   token, e.g. from a login or the homeserver's admin API). The adapter checks it with
//!   `whoami` at start: `M_UNKNOWN_TOKEN` and friends park it "credentials rejected". No
//!   password login: a token does not rotate the device, so transaction ids stay idempotent.
//! - **Rooms.** `allowed_chats` are room ids (or aliases) joined at start; messages from other
//!   rooms and our own messages are ignored; invites are accepted only to allowed rooms (to any
//!   room when `allowed_chats` is empty). End-to-end encryption is out of scope: messages in
//!   encrypted rooms are not seen.
//! - **Nothing lost.** Each `m.room.message` text is handed to the [`Host`] (journaled, event id
//!   as the dedup key) before the `since` token moves past it. The token is kept in
//!   `<home>/platforms/matrix-<name>.json` (written atomically), so the successor resumes where
//!   the last committed batch ended; a batch seen twice is deduplicated by event id. The very
//!   first start (no saved token) skips the room history.
//! - **Idempotent replies.** Each outbox entry is sent with the transaction id
//!   `<prefix>-<seq>[-<piece>]`, where the prefix is random per home and saved with the token:
//!   a resend after a crash between the send and the outbox commit returns the first event and
//!   delivers nothing new (the homeserver remembers transaction ids per device).
//! - **Errors.** 429 waits `retry_after_ms`; rejected credentials park the adapter; an
//!   unreachable homeserver is `degraded` and retried with backoff; a room the bot cannot join
//!   keeps it `degraded`, naming the room.
//! - **Drain.** [`Adapter::stop_intake`] stops syncing: a batch that arrives after it is dropped
//!   unsaved, so the successor reads it again from the saved token. The homeserver keeps what
//!   arrives meanwhile.
//!
//! Two OS threads per adapter (a receiver in the long poll, a sender draining the outbox), as
//! for Telegram (crates/platforms/src/telegram.rs).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use gatewarden_chatproto::matrix::{Client, Error as MxError, ErrorKind, TextMessage};
use gatewarden_config::PlatformConfig;
use gatewarden_lifecycle::fsio;
use serde::{Deserialize, Serialize};

use crate::wait::{self, Flags, Running, Slot, spawn};
use crate::{Adapter, AdapterError, Host, Inbound, Sent, State, Status};

const BACKOFF_MIN: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(15);
/// Longest `retry_after_ms` honoured as given.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);
/// Bound on every call besides the sync's own long-poll timeout.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Characters per message event (events are capped at 64 KiB of JSON).
const MAX_TEXT_CHARS: usize = 8000;
/// Events per page, and pages at most, when reading back what a limited sync skipped (50,000
/// events: far beyond any outage the adapter should silently absorb).
const BACKFILL_PAGE: u32 = 500;
const MAX_BACKFILL_PAGES: usize = 100;
/// An idle sync saves its token at most this often (a batch with messages saves at once).
const SAVE_IDLE_EVERY: Duration = Duration::from_secs(60);

/// What the home keeps for one Matrix adapter.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Cursor {
    /// The `next_batch` of the last batch whose messages are all journaled.
    since: Option<String>,
    /// This home's transaction-id prefix.
    txn_prefix: String,
}

/// The transaction id of piece `piece` of outbox entry `seq`.
fn txn_id(prefix: &str, seq: i64, piece: usize) -> String {
    if piece == 0 { format!("{prefix}-{seq}") } else { format!("{prefix}-{seq}-{piece}") }
}

/// A random hex prefix (std's per-process random hash keys, plus the pid and the time).
fn random_prefix() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    format!("gw{:016x}", h.finish())
}

/// Splits `text` into message bodies (never empty).
fn pieces(text: &str) -> Vec<String> {
    if text.is_empty() {
        return vec!["(empty reply)".to_owned()];
    }
    let chars: Vec<char> = text.chars().collect();
    chars.chunks(MAX_TEXT_CHARS).map(|c| c.iter().collect()).collect()
}

fn inbound(m: TextMessage) -> Inbound {
    let sent_at = (m.origin_server_ts > 0).then(|| SystemTime::UNIX_EPOCH + Duration::from_millis(m.origin_server_ts));
    Inbound { event_id: m.event_id, chat_id: m.room_id, user_id: m.sender, text: m.body, sent_at }
}

/// The Matrix adapter.
pub struct Matrix {
    name: String,
    token: String,
    homeserver: String,
    /// `ca_file` and `proxy` (crates/net).
    out: gatewarden_net::Outbound,
    allowed: Vec<String>,
    poll_timeout: Duration,
    status: Arc<Status>,
    run: Slot<Shared>,
}

struct Shared {
    flags: Flags,
    close_deadline: Mutex<Option<Instant>>,
}

impl AsRef<Flags> for Shared {
    fn as_ref(&self) -> &Flags {
        &self.flags
    }
}

impl Matrix {
    pub fn new(cfg: &PlatformConfig, token: String) -> Result<Matrix, AdapterError> {
        let name = cfg.adapter_name();
        let homeserver = cfg.api_base.clone().unwrap_or_default();
        let start_error = |message: String| AdapterError::Start { name: name.clone(), message };
        let out = gatewarden_net::Outbound::new(cfg.ca_file.as_deref(), cfg.proxy.as_deref())
            .map_err(|e| start_error(e.to_string()))?;
        // The URL is checked once here: a bad one is a start error, not a retry loop.
        Client::with_outbound(&homeserver, REQUEST_TIMEOUT, &out).map_err(|e| start_error(e.to_string()))?;
        Ok(Matrix {
            name,
            token,
            homeserver,
            out,
            allowed: cfg.allowed_chats.clone(),
            poll_timeout: Duration::from_secs(cfg.poll_timeout_s),
            status: Arc::new(Status::default()),
            run: Slot::default(),
        })
    }

    fn client(&self) -> Result<Client, AdapterError> {
        let mut c = Client::with_outbound(&self.homeserver, REQUEST_TIMEOUT, &self.out)
            .map_err(|e| AdapterError::Start { name: self.name.clone(), message: e.to_string() })?;
        c.set_access_token(self.token.clone());
        Ok(c)
    }
}

/// Reads the saved cursor (a missing or unreadable file is a fresh start) and makes sure the
/// transaction prefix is durable before the first send uses it.
fn load_cursor(path: Option<&PathBuf>) -> Result<Cursor, String> {
    let saved = path
        .and_then(|p| fsio::read_capped(p, fsio::MAX_RECORD_BYTES).ok())
        .and_then(|b| serde_json::from_slice::<Cursor>(&b).ok());
    if let Some(c) = saved.filter(|c| !c.txn_prefix.is_empty()) {
        return Ok(c);
    }
    let c = Cursor { since: None, txn_prefix: random_prefix() };
    if let Some(p) = path {
        save_cursor(p, &c)?;
    }
    Ok(c)
}

fn save_cursor(path: &Path, c: &Cursor) -> Result<(), String> {
    if let Some(dir) = path.parent() {
        // `<home>/platforms`: 0700 whatever the umask, like every folder in the home.
        gatewarden_lifecycle::platform::create_private_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    fsio::write_json(path, c).map_err(|e| format!("{}: {e}", path.display()))
}

struct Receiver {
    name: String,
    client: Client,
    /// Logged in and joined.
    ready: bool,
    allowed: Vec<String>,
    /// The room ids the allowed rooms resolved to.
    rooms: Vec<String>,
    poll_timeout: Duration,
    cursor: Cursor,
    cursor_path: Option<PathBuf>,
    status: Arc<Status>,
    shared: Arc<Shared>,
    host: Arc<dyn Host>,
}

impl Receiver {
    fn set(&self, s: State) {
        if self.status.set(s.clone()) {
            self.host.state_changed(&self.name, &s);
        }
    }

    fn stopping(&self) -> bool {
        self.shared.flags.get().stop
    }

    fn pause(&self, d: Duration) {
        self.shared.flags.sleep(d, |b| b.stop || b.kick);
    }

    fn allowed_room(&self, room: &str) -> bool {
        self.allowed.is_empty() || self.rooms.iter().any(|r| r == room)
    }

    /// Handles an error; returns false when the adapter is parked for good.
    fn failed(&self, what: &str, e: &MxError, backoff: &mut Duration) -> bool {
        match e.kind() {
            ErrorKind::Rejected => {
                self.set(State::Parked(format!("credentials rejected: {e}")));
                return false;
            }
            ErrorKind::RateLimited => self.pause(e.retry_after().unwrap_or(*backoff).min(MAX_RETRY_AFTER)),
            ErrorKind::Transient | ErrorKind::Permanent => {
                self.set(State::Degraded(format!("{what}: {e}")));
                self.pause(*backoff);
            }
        }
        *backoff = (*backoff * 2).min(BACKOFF_MAX);
        true
    }

    /// `whoami`, then joins the allowed rooms.
    fn hello(&mut self) -> Result<(), (String, MxError)> {
        self.client.whoami().map_err(|e| ("cannot log in".to_owned(), e))?;
        let mut rooms = Vec::new();
        for room in &self.allowed {
            let id = self.client.join(room).map_err(|e| (format!("cannot join {room}"), e))?;
            rooms.push(id);
        }
        self.rooms = rooms;
        Ok(())
    }

    /// The messages of `room` a limited sync skipped, oldest first: pages back from `prev` (the
    /// sync's `prev_batch`) to `since`. `false` with them when the page bound ran out first.
    fn backfill(&self, room: &str, prev: &str, since: &str) -> Result<(Vec<TextMessage>, bool), MxError> {
        let mut out = Vec::new();
        let mut from = prev.to_owned();
        let mut whole = false;
        for _ in 0..MAX_BACKFILL_PAGES {
            let page = self.client.messages_before(room, &from, since, BACKFILL_PAGE)?;
            out.extend(page.messages);
            match page.next {
                Some(next) => from = next,
                None => {
                    whole = true;
                    break;
                }
            }
        }
        out.reverse();
        Ok((out, whole))
    }

    fn save(&mut self, since: String) {
        self.cursor.since = Some(since);
        if let Some(p) = &self.cursor_path
            && let Err(e) = save_cursor(p, &self.cursor)
        {
            // Not fatal: the next start re-reads from an older token and deduplicates.
            self.set(State::Degraded(format!("cannot save the sync token: {e}")));
        }
    }

    fn run(mut self) {
        let mut backoff = BACKOFF_MIN;
        let mut saved_at = Instant::now();
        // A token the server no longer accepts: the fresh sync's messages are delivered (and
        // deduplicated) rather than skipped as history.
        let mut resync = false;
        'sync: while !self.stopping() {
            if self.shared.flags.take_kick() {
                self.ready = false;
                self.set(State::Connecting);
            }
            if !self.ready {
                match self.hello() {
                    // `connected` once the first sync returns: from then on, nothing sent to the
                    // rooms is taken for history.
                    Ok(()) => self.ready = true,
                    Err((what, e)) => {
                        if !self.failed(&what, &e, &mut backoff) {
                            return;
                        }
                    }
                }
                continue;
            }
            let timeout = match self.host.receive_budget() {
                // The first sync only fetches a token: no reason to wait.
                _ if self.cursor.since.is_none() => Duration::ZERO,
                Some(b) => self.poll_timeout.min(b),
                None => self.poll_timeout,
            };
            let result = self.client.sync(self.cursor.since.as_deref(), timeout);
            if self.stopping() {
                // Unsaved: the successor reads this batch again from the saved token.
                break;
            }
            let batch = match result {
                Ok(b) => b,
                Err(e) => {
                    if e.kind() == ErrorKind::Permanent && self.cursor.since.is_some() {
                        // e.g. a token from a homeserver whose database was replaced.
                        self.cursor.since = None;
                        resync = true;
                    }
                    if !self.failed("sync failed", &e, &mut backoff) {
                        return;
                    }
                    continue;
                }
            };
            backoff = BACKOFF_MIN;
            self.status.progress();
            // A limited timeline skipped events between our token and this batch (more than the
            // filter's limit arrived, e.g. during a long outage or a slow restart): read them back
            // from each room's `prev_batch` to our token, oldest first, before the batch's own.
            // A gap that cannot be read whole is not silent: the state (and the ledger's
            // `platform_state`) names the rooms until the next batch.
            let mut messages = Vec::new();
            let mut skipped: Vec<&String> = Vec::new();
            if let Some(since) = self.cursor.since.clone() {
                for room in batch.gaps.iter().filter(|r| self.allowed_room(r)) {
                    let prev = batch.prev_batches.iter().find(|(r, _)| r == room).map(|(_, p)| p.as_str());
                    match prev.map(|p| self.backfill(room, p, &since)) {
                        Some(Ok((mut older, whole))) => {
                            messages.append(&mut older);
                            if !whole {
                                skipped.push(room);
                            }
                        }
                        Some(Err(e)) => {
                            // The same sync again from the unchanged token, once the server answers.
                            if !self.failed("cannot read the messages a sync skipped", &e, &mut backoff) {
                                return;
                            }
                            continue 'sync;
                        }
                        None => skipped.push(room),
                    }
                }
            }
            if skipped.is_empty() {
                self.set(State::Connected);
            } else {
                self.set(State::Degraded(format!(
                    "the homeserver skipped messages in {skipped:?} that could not be read back; they are not answered"
                )));
            }
            messages.extend(batch.messages);
            for room in &batch.invites {
                if self.allowed.is_empty() || self.allowed.iter().any(|a| a == room) {
                    // A failure is retried at the next sync, which reports the invite again.
                    let _ = self.client.join(room);
                }
            }
            let first = self.cursor.since.is_none() && !resync;
            // A first sync is history, except within the host's fresh-start window.
            let since_ok = if first { self.host.fresh_start_window().map(|w| SystemTime::now() - w) } else { None };
            if !first || since_ok.is_some() {
                let mut committed = true;
                let mut delivered = 0usize;
                for m in messages {
                    if !self.allowed_room(&m.room_id) {
                        continue;
                    }
                    if let Some(t0) = since_ok
                        && m.origin_server_ts
                            < t0.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
                    {
                        continue;
                    }
                    let msg = inbound(m);
                    let lag =
                        msg.sent_at.and_then(|t| SystemTime::now().duration_since(t).ok()).map(|d| d.as_secs_f64());
                    if let Err(e) = self.host.deliver(&self.name, msg) {
                        self.set(State::Degraded(format!("cannot journal an inbound message: {e}")));
                        committed = false;
                        break;
                    }
                    self.status.received(lag);
                    delivered += 1;
                }
                if !committed {
                    // The same batch again from the unchanged token; journaled ones deduplicate.
                    self.pause(backoff);
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                    continue;
                }
                if delivered == 0 && saved_at.elapsed() < SAVE_IDLE_EVERY && !resync {
                    // An idle batch need not cost an fsync: restarting from the older saved
                    // token only reads the same nothing again.
                    self.cursor.since = Some(batch.next_batch);
                    continue;
                }
            }
            resync = false;
            saved_at = Instant::now();
            self.save(batch.next_batch);
        }
    }
}

struct Sender {
    name: String,
    client: Client,
    txn_prefix: String,
    status: Arc<Status>,
    shared: Arc<Shared>,
    host: Arc<dyn Host>,
}

impl Sender {
    fn closing_done(&self, empty: bool) -> bool {
        let deadline = *self.shared.close_deadline.lock().unwrap_or_else(|p| p.into_inner());
        deadline.is_some_and(|d| empty || Instant::now() >= d)
    }

    fn set(&self, s: State) {
        if self.status.set(s.clone()) {
            self.host.state_changed(&self.name, &s);
        }
    }

    fn run(self) {
        let mut backoff = BACKOFF_MIN;
        loop {
            let empty = match self.flush() {
                Ok(empty) => {
                    backoff = BACKOFF_MIN;
                    empty
                }
                Err(e) => {
                    let parked = matches!(self.status.state(), State::Parked(_));
                    if !parked {
                        self.set(State::Degraded(format!("cannot send: {e}")));
                    }
                    // Parked cannot heal before the deadline: the outbox waits for the next start.
                    if self.closing_done(false) || (parked && self.shared.flags.get().close) {
                        return;
                    }
                    self.shared.flags.sleep(backoff, |b| b.close);
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                    continue;
                }
            };
            if self.closing_done(empty) {
                return;
            }
            if empty {
                self.shared.flags.sleep(Duration::from_secs(1), |b| b.wake || b.close);
                self.shared.flags.take_wake();
            }
        }
    }

    /// Sends what the outbox holds. `Ok(true)` when it is empty.
    fn flush(&self) -> Result<bool, String> {
        if matches!(self.status.state(), State::Parked(_)) {
            return Err("parked".into());
        }
        let batch = self.host.outbox(&self.name, 32)?;
        if batch.is_empty() {
            return Ok(true);
        }
        'items: for item in batch {
            for (i, piece) in pieces(&item.text).iter().enumerate() {
                let txn = txn_id(&self.txn_prefix, item.seq, i);
                loop {
                    match self.client.send_text(&item.chat_id, &txn, piece) {
                        Ok(_) => {
                            self.status.sent();
                            self.status.progress();
                            break;
                        }
                        Err(e) => match e.kind() {
                            ErrorKind::RateLimited => {
                                let d = e.retry_after().unwrap_or(Duration::from_secs(1)).min(MAX_RETRY_AFTER);
                                if self.closing_done(false) {
                                    return Err(format!("rate limited past the drain deadline: {e}"));
                                }
                                self.shared.flags.sleep(d, |_| false);
                            }
                            ErrorKind::Permanent => {
                                // Unknown room, not joined, forbidden: never retried.
                                self.host.sent(item.seq, Sent::Rejected(e.to_string()));
                                continue 'items;
                            }
                            ErrorKind::Rejected => {
                                self.set(State::Parked(format!("credentials rejected: {e}")));
                                return Err(e.to_string());
                            }
                            ErrorKind::Transient => return Err(e.to_string()),
                        },
                    }
                }
            }
            self.host.sent(item.seq, Sent::Ok);
        }
        Ok(false)
    }
}

impl Adapter for Matrix {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> &'static str {
        "matrix"
    }

    fn credential(&self) -> &str {
        &self.token
    }

    fn status(&self) -> &Arc<Status> {
        &self.status
    }

    fn start(&self, host: Arc<dyn Host>) -> Result<(), AdapterError> {
        self.status.set(State::Connecting);
        let cursor_path = host.state_dir().map(|d| d.join(format!("matrix-{}.json", self.name)));
        let cursor = load_cursor(cursor_path.as_ref())
            .map_err(|e| AdapterError::Start { name: self.name.clone(), message: format!("sync token file: {e}") })?;
        let shared = Arc::new(Shared { flags: Flags::default(), close_deadline: Mutex::new(None) });
        let tx = Sender {
            name: self.name.clone(),
            client: self.client()?,
            txn_prefix: cursor.txn_prefix.clone(),
            status: Arc::clone(&self.status),
            shared: Arc::clone(&shared),
            host: Arc::clone(&host),
        };
        let rx = Receiver {
            name: self.name.clone(),
            client: self.client()?,
            ready: false,
            allowed: self.allowed.clone(),
            rooms: Vec::new(),
            poll_timeout: self.poll_timeout,
            cursor,
            cursor_path,
            status: Arc::clone(&self.status),
            shared: Arc::clone(&shared),
            host,
        };
        let recv_done = spawn(&self.name, "recv", move || rx.run())?;
        let send_done = spawn(&self.name, "send", move || tx.run())?;
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
        self.run.signal(|b| b.stop = true);
    }

    fn close(&self, deadline: Instant) -> bool {
        let run = self.run.take();
        let mut all = true;
        if let Some(r) = run {
            wait::begin_close(&r.shared.flags, &r.shared.close_deadline, deadline);
            all = wait::ended_by(&r.send_done, deadline, Duration::from_millis(200));
            // The receiver may sit in a long poll whose answer it will drop: not worth waiting
            // past the deadline for.
            wait::ended_by(&r.recv_done, deadline, Duration::ZERO);
        }
        self.status.set(State::Closed);
        all
    }

    fn watchdog_after(&self) -> Duration {
        self.poll_timeout + REQUEST_TIMEOUT + Duration::from_secs(30)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transaction_ids_are_stable_per_entry_and_piece() {
        assert_eq!(txn_id("gwab", 7, 0), "gwab-7");
        assert_eq!(txn_id("gwab", 7, 2), "gwab-7-2");
        assert_ne!(random_prefix(), random_prefix());
        assert!(random_prefix().starts_with("gw"));
    }

    #[test]
    fn cursor_is_created_once_and_survives_reloads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("platforms").join("matrix-m.json");
        let first = load_cursor(Some(&path)).unwrap();
        assert_eq!(first.since, None);
        let again = load_cursor(Some(&path)).unwrap();
        assert_eq!(again, first, "the prefix is durable before any send");
        save_cursor(&path, &Cursor { since: Some("s1".into()), ..first.clone() }).unwrap();
        assert_eq!(load_cursor(Some(&path)).unwrap().since.as_deref(), Some("s1"));
        std::fs::write(&path, b"garbage").unwrap();
        let fresh = load_cursor(Some(&path)).unwrap();
        assert!(fresh.since.is_none() && !fresh.txn_prefix.is_empty());
        assert!(load_cursor(None).is_ok());
    }

    #[test]
    fn long_replies_are_split_and_messages_map_to_inbound() {
        let text: String = std::iter::repeat_n('é', MAX_TEXT_CHARS + 1).collect();
        assert_eq!(pieces(&text).len(), 2);
        assert_eq!(pieces(""), vec!["(empty reply)".to_owned()]);
        let m = TextMessage {
            room_id: "!r:hs".into(),
            event_id: "$e".into(),
            sender: "@a:hs".into(),
            body: "hi".into(),
            origin_server_ts: 0,
        };
        let i = inbound(m);
        assert_eq!((i.event_id.as_str(), i.chat_id.as_str(), i.user_id.as_str()), ("$e", "!r:hs", "@a:hs"));
        assert_eq!(i.sent_at, None);
    }
}
