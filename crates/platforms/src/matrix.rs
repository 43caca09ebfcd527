//! Matrix adapter: the client-server API's `/sync` long-poll and idempotent sends, on the
//! blocking client of crates/chatproto/src/matrix.rs.
//!
//! - **Credentials.** `token_env` names the variable holding an access token (a bot account's
//!   token, e.g. from a login or the homeserver's admin API). The adapter checks it with
//!   `whoami` at start: `M_UNKNOWN_TOKEN` and friends park it "credentials rejected". No
//!   password login: a token does not rotate the device, so transaction ids stay idempotent.
//! - **Rooms.** `allowed_chats` are room ids (or aliases) joined at start; our own messages are
//!   ignored, and every other text message goes to the host, marked `listed` when its room is
//!   an allowed one (aliases resolved), a direct chat when the room has two members (the bot
//!   and one person; `joined_members`, cached a minute), and addressed when it mentions the
//!   bot (`m.mentions`, or its user id in the body). Invites are accepted to allowed rooms, to
//!   direct chats (an invite that says `is_direct`) unless `access = "allowlist"`, and to any
//!   room with `access = "open"` and no `allowed_chats`. End-to-end encryption is out of
//!   scope: messages in encrypted rooms are not seen.
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
//! - **Showing work** (skeleton/progress.rs decides when): typing notices with a 30 s
//!   timeout, turned off when no run is left; previews are a message, then `m.replace` edits
//!   of it, redacted once the reply is sent (a client shows "message deleted").
//! - **Attachments** (issue 29): `m.image`, `m.file`, `m.audio` and `m.video` messages carry
//!   their file (name, `info.mimetype`, `info.size`, the `mxc://` URL), downloaded with the
//!   access token through the authenticated media API, else the older one
//!   (crates/chatproto/src/matrix.rs). Encrypted media (`file` instead of `url`) is refused with
//!   a notice: there are no keys. A reply's files go out as `POST /_matrix/media/v3/upload`,
//!   then an `m.image`/`m.audio`/`m.video`/`m.file` event with the piece's transaction id: a
//!   resend after a crash sends no second event, but may upload the bytes again (an orphan
//!   copy in the media repository, never shown in the room).
//! - **Drain.** [`Adapter::stop_intake`] stops syncing: a batch that arrives after it is dropped
//!   unsaved, so the successor reads it again from the saved token. The homeserver keeps what
//!   arrives meanwhile.
//!
//! The loops, states, backoff and drain are the skeleton's (crates/platforms/src/skeleton):
//! this module is the client-server protocol ([`Proto`]).
//!
//! [`Adapter::stop_intake`]: crate::Adapter::stop_intake
//! [`Host`]: crate::Host

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use gatewarden_chatproto::matrix::{Client, Error as MxError, ErrorKind, Media, TextMessage};
use gatewarden_config::platform::Matrix as Settings;
use gatewarden_config::{Access, PlatformConfig};
use gatewarden_lifecycle::fsio;
use serde::{Deserialize, Serialize};

use crate::attachments::{Attachment, Outcome};
use crate::skeleton::{self, Batch, Ctx, Failure, Limits, OutFile, PieceId, PieceLimit, Protocol, SendError, Skeleton};
use crate::{AdapterError, ChatKind, Host, Inbound};

/// Bound on every call besides the sync's own long-poll timeout.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound on one upload of a reply's file.
const UPLOAD_TIMEOUT: Duration = Duration::from_secs(120);
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
#[cfg(test)]
fn pieces(text: &str) -> Vec<String> {
    skeleton::pieces(text, &Proto::LIMITS)
}

/// One text message as the host gets it: `chat` and `listed` as the room is (the policy,
/// crates/runtime/src/access/, decides what they mean).
fn inbound(m: TextMessage, chat: ChatKind, listed: bool) -> Inbound {
    let sent_at = (m.origin_server_ts > 0).then(|| SystemTime::UNIX_EPOCH + Duration::from_millis(m.origin_server_ts));
    Inbound {
        event_id: m.event_id,
        chat_id: m.room_id,
        user_id: m.sender,
        text: m.body,
        sent_at,
        chat,
        listed,
        addressed: m.mentions_me,
        attachments: m.media.map(attachment).into_iter().collect(),
    }
}

/// A media message's file as an attachment, fetched by its `mxc://` URL; encrypted media is
/// refused before any download (module notes).
fn attachment(m: Media) -> Attachment {
    let declared = m.mimetype.unwrap_or_else(|| match m.msgtype.as_str() {
        // No type given: the content decides within what the message says it is.
        "m.file" => "application/octet-stream".to_owned(),
        _ => String::new(),
    });
    let outcome = m.url.is_none().then(|| Outcome::Refused("encrypted media is not supported".into()));
    Attachment { name: m.name, declared, size: m.size, fetch: m.url.unwrap_or_default(), outcome }
}

/// The msgtype a reply's file goes out as, by the type its content shows.
fn msgtype(kind: &str) -> &'static str {
    match kind.split('/').next() {
        Some("image") => "m.image",
        Some("audio") => "m.audio",
        Some("video") => "m.video",
        _ => "m.file",
    }
}

/// How long a room's member count is trusted (a direct chat someone else joins becomes a
/// group within this).
const MEMBERS_TTL: Duration = Duration::from_secs(60);
/// Rooms whose member count is cached at most.
const MEMBERS_CACHE: usize = 1024;

/// Which invites the bot accepts (module notes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Invites {
    /// Direct chats: anyone may ask to pair (not under `allowlist`).
    direct: bool,
    /// Any room (`access = "open"` without `allowed_chats`).
    any: bool,
}

impl Invites {
    fn of(cfg: &PlatformConfig) -> Invites {
        let access = cfg.access();
        Invites { direct: access != Access::Allowlist, any: access == Access::Open && cfg.allowed_chats.is_empty() }
    }
}

/// The Matrix adapter.
pub type Matrix = Skeleton<Proto>;

/// The client-server protocol.
pub struct Proto {
    token: String,
    homeserver: String,
    /// `ca_file` and `proxy` (crates/net).
    out: gatewarden_net::Outbound,
    name: String,
    allowed: Vec<String>,
    invites: Invites,
    poll_timeout: Duration,
}

impl Skeleton<Proto> {
    pub fn new(cfg: &PlatformConfig, token: String) -> Result<Matrix, AdapterError> {
        let s = skeleton::settings::<Proto>(cfg)?;
        let name = cfg.adapter_name();
        let homeserver = s.api_base.clone().unwrap_or_default();
        let start_error = |message: String| AdapterError::Start { name: name.clone(), message };
        let out = gatewarden_net::Outbound::new(cfg.ca_file.as_deref(), s.proxy.as_deref())
            .map_err(|e| start_error(e.to_string()))?;
        // The URL is checked once here: a bad one is a start error, not a retry loop.
        Client::with_outbound(&homeserver, REQUEST_TIMEOUT, &out).map_err(|e| start_error(e.to_string()))?;
        let proto = Proto {
            token,
            homeserver,
            out,
            name,
            allowed: cfg.allowed_chats.clone(),
            invites: Invites::of(cfg),
            poll_timeout: Duration::from_secs(s.poll_timeout_s),
        };
        Ok(Skeleton::from_protocol(cfg, proto))
    }
}

impl Proto {
    fn client(&self) -> Result<Client, String> {
        let mut c = Client::with_outbound(&self.homeserver, REQUEST_TIMEOUT, &self.out).map_err(|e| e.to_string())?;
        c.set_access_token(self.token.clone());
        Ok(c)
    }
}

impl skeleton::FromConfig for Proto {
    fn from_config(cfg: &PlatformConfig, creds: &crate::Credentials<'_>) -> Result<Matrix, AdapterError> {
        Matrix::new(cfg, creds.token()?)
    }
}

impl Protocol for Proto {
    type Settings = Settings;
    const LIMITS: Limits = Limits {
        piece: PieceLimit::Chars(MAX_TEXT_CHARS),
        line_per_piece: false,
        batch: 32,
        pace: None,
        min_receive: Duration::ZERO,
        redelivers: true,
        listens_through_drain: false,
        // Nothing sent to the rooms before the first sync's token is taken for history.
        connected_after_receive: true,
        // The receiver may sit in a long poll whose answer it will drop: not worth waiting
        // past the deadline for.
        close_grace: Duration::ZERO,
    };
    type Receiver = Syncer;
    type Sender = Poster;

    fn credential(&self) -> &str {
        &self.token
    }

    fn watchdog_after(&self) -> Duration {
        self.poll_timeout + REQUEST_TIMEOUT + Duration::from_secs(30)
    }

    fn open(&self, host: &Arc<dyn Host>) -> Result<(Syncer, Poster), String> {
        let cursor_path = host.state_dir().map(|d| d.join(format!("matrix-{}.json", self.name)));
        let cursor = load_cursor(cursor_path.as_ref()).map_err(|e| format!("sync token file: {e}"))?;
        let tx = Poster {
            client: self.client()?,
            txn_prefix: cursor.txn_prefix.clone(),
            show_prefix: random_prefix(),
            shows: 0,
        };
        let rx = Syncer {
            client: self.client()?,
            allowed: self.allowed.clone(),
            invites: self.invites,
            rooms: Vec::new(),
            members: std::collections::HashMap::new(),
            poll_timeout: self.poll_timeout,
            cursor,
            cursor_path,
            saved_at: Instant::now(),
            resync: false,
            pending: None,
        };
        Ok((rx, tx))
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

/// A client error as the skeleton's failure, `what` naming the call.
fn failure(what: &str, e: &MxError) -> Failure {
    match e.kind() {
        ErrorKind::Rejected => Failure::Rejected(e.to_string()),
        ErrorKind::RateLimited => Failure::RateLimited(e.retry_after()),
        ErrorKind::Transient | ErrorKind::Permanent => Failure::Down(format!("{what}: {e}")),
    }
}

/// The `next_batch` of a received batch, saved once its messages are journaled.
struct Pending {
    next_batch: String,
    /// Whether the save may be skipped: nothing was delivered, not a (re)start.
    idle: bool,
}

/// The receive side: `whoami`, joins, then `/sync` long polls.
pub struct Syncer {
    client: Client,
    allowed: Vec<String>,
    invites: Invites,
    /// The room ids the allowed rooms resolved to.
    rooms: Vec<String>,
    /// Joined members per room, and when it was read (a room of two is a direct chat).
    members: std::collections::HashMap<String, (usize, Instant)>,
    poll_timeout: Duration,
    cursor: Cursor,
    cursor_path: Option<PathBuf>,
    saved_at: Instant,
    /// A token the server no longer accepts: the fresh sync's messages are delivered (and
    /// deduplicated) rather than skipped as history.
    resync: bool,
    pending: Option<Pending>,
}

impl Syncer {
    /// `allowed_chats` names the room (an alias counts once resolved at connect).
    fn listed(&self, room: &str) -> bool {
        self.rooms.iter().any(|r| r == room) || self.allowed.iter().any(|a| a == room)
    }

    /// A room of two (the bot and one person) is a direct chat. A count that cannot be read
    /// makes it a group: no pairing reply, and it needs a mention.
    fn chat_kind(&mut self, room: &str) -> ChatKind {
        let fresh = self.members.get(room).filter(|(_, at)| at.elapsed() < MEMBERS_TTL).map(|(n, _)| *n);
        let n = match fresh {
            Some(n) => n,
            None => match self.client.joined_member_count(room) {
                Ok(n) => {
                    if self.members.len() >= MEMBERS_CACHE {
                        self.members.retain(|_, (_, at)| at.elapsed() < MEMBERS_TTL);
                    }
                    if self.members.len() < MEMBERS_CACHE {
                        self.members.insert(room.to_owned(), (n, Instant::now()));
                    }
                    n
                }
                Err(_) => return ChatKind::Group,
            },
        };
        if n == 2 { ChatKind::Direct } else { ChatKind::Group }
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
}

impl skeleton::Receiver for Syncer {
    /// `whoami`, then joins the allowed rooms.
    fn connect(&mut self, _ctx: &Ctx) -> Result<(), Failure> {
        self.client.whoami().map_err(|e| failure("cannot log in", &e))?;
        let mut rooms = Vec::new();
        for room in &self.allowed {
            let id = self.client.join(room).map_err(|e| failure(&format!("cannot join {room}"), &e))?;
            rooms.push(id);
        }
        self.rooms = rooms;
        Ok(())
    }

    fn receive(&mut self, ctx: &Ctx, budget: Option<Duration>) -> Result<Batch, Failure> {
        self.pending = None;
        let timeout = match budget {
            // The first sync only fetches a token: no reason to wait.
            _ if self.cursor.since.is_none() => Duration::ZERO,
            Some(b) => self.poll_timeout.min(b),
            None => self.poll_timeout,
        };
        let batch = match self.client.sync(self.cursor.since.as_deref(), timeout) {
            Ok(b) => b,
            Err(e) => {
                if e.kind() == ErrorKind::Permanent && self.cursor.since.is_some() {
                    // e.g. a token from a homeserver whose database was replaced.
                    self.cursor.since = None;
                    self.resync = true;
                }
                return Err(failure("sync failed", &e));
            }
        };
        // A limited timeline skipped events between our token and this batch (more than the
        // filter's limit arrived, e.g. during a long outage or a slow restart): read them back
        // from each room's `prev_batch` to our token, oldest first, before the batch's own.
        // A gap that cannot be read whole is not silent: the state (and the ledger's
        // `platform_state`) names the rooms until the next batch.
        let mut messages = Vec::new();
        let mut skipped: Vec<&String> = Vec::new();
        if let Some(since) = &self.cursor.since {
            for room in &batch.gaps {
                let prev = batch.prev_batches.iter().find(|(r, _)| r == room).map(|(_, p)| p.as_str());
                match prev.map(|p| self.backfill(room, p, since)) {
                    Some(Ok((mut older, whole))) => {
                        messages.append(&mut older);
                        if !whole {
                            skipped.push(room);
                        }
                    }
                    // The same sync again from the unchanged token, once the server answers.
                    Some(Err(e)) => return Err(failure("cannot read the messages a sync skipped", &e)),
                    None => skipped.push(room),
                }
            }
        }
        let gap = (!skipped.is_empty()).then(|| {
            format!("the homeserver skipped messages in {skipped:?} that could not be read back; they are not answered")
        });
        messages.extend(batch.messages);
        for room in &batch.invites {
            let direct = batch.direct_invites.contains(room);
            if self.invites.any || self.allowed.iter().any(|a| a == room) || (direct && self.invites.direct) {
                // A failure is retried at the next sync, which reports the invite again.
                let _ = self.client.join(room);
            }
        }
        let first = self.cursor.since.is_none() && !self.resync;
        // A first sync is history, except within the host's fresh-start window.
        let since_ok = if first { ctx.host().fresh_start_window().map(|w| SystemTime::now() - w) } else { None };
        let t0 = since_ok.map(|t| t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64));
        let messages: Vec<Inbound> = if first && since_ok.is_none() {
            Vec::new()
        } else {
            let fresh: Vec<TextMessage> =
                messages.into_iter().filter(|m| t0.is_none_or(|t0| m.origin_server_ts >= t0)).collect();
            let mut out = Vec::with_capacity(fresh.len());
            for m in fresh {
                let (kind, listed) = (self.chat_kind(&m.room_id), self.listed(&m.room_id));
                out.push(inbound(m, kind, listed));
            }
            out
        };
        let idle = messages.is_empty() && !(first && since_ok.is_none()) && !self.resync;
        self.pending = Some(Pending { next_batch: batch.next_batch, idle });
        Ok(Batch { messages, gap })
    }

    /// The media repository, with the access token (crates/chatproto/src/matrix.rs).
    fn fetch(
        &mut self,
        _ctx: &Ctx,
        a: &Attachment,
        timeout: Duration,
    ) -> Result<Box<dyn std::io::Read + Send>, String> {
        self.client.download(&a.fetch, timeout).map_err(|e| e.to_string())
    }

    /// Saves the token past the journaled batch, so the successor resumes after it.
    fn confirm(&mut self, _ctx: &Ctx) -> Result<(), String> {
        let Some(p) = self.pending.take() else { return Ok(()) };
        self.cursor.since = Some(p.next_batch);
        if p.idle && self.saved_at.elapsed() < SAVE_IDLE_EVERY {
            // An idle batch need not cost an fsync: restarting from the older saved token only
            // reads the same nothing again.
            return Ok(());
        }
        self.resync = false;
        self.saved_at = Instant::now();
        match &self.cursor_path {
            // Not fatal: the next start re-reads from an older token and deduplicates.
            Some(path) => save_cursor(path, &self.cursor).map_err(|e| format!("cannot save the sync token: {e}")),
            None => Ok(()),
        }
    }
}

/// The send side: idempotent `PUT .../send/m.room.message/{txnId}`.
pub struct Poster {
    client: Client,
    txn_prefix: String,
    /// Transaction ids of previews, edits and redactions: random per start, so that none is
    /// taken by the homeserver for an earlier start's (which it would answer without sending).
    show_prefix: String,
    shows: u64,
}

/// How long one typing notice lasts: refreshed every 4 s (skeleton/progress.rs), so it
/// lapses on its own soon after a crash.
const TYPING_TIMEOUT: Duration = Duration::from_secs(30);

fn send_error(e: &MxError) -> SendError {
    match e.kind() {
        ErrorKind::RateLimited => SendError::RateLimited(e.retry_after()),
        // Unknown room, not joined, forbidden: never retried.
        ErrorKind::Permanent => SendError::Rejected(e.to_string()),
        ErrorKind::Rejected => SendError::Unauthorized(e.to_string()),
        ErrorKind::Transient => SendError::Failed(e.to_string()),
    }
}

impl Poster {
    fn next_txn(&mut self) -> String {
        self.shows += 1;
        format!("{}-show-{}", self.show_prefix, self.shows)
    }
}

impl skeleton::Sender for Poster {
    fn send(&mut self, chat: &str, piece: &str, id: PieceId) -> Result<(), SendError> {
        let txn = txn_id(&self.txn_prefix, id.seq, id.index);
        self.client.send_text(chat, &txn, piece).map(drop).map_err(|e| send_error(&e))
    }

    /// Upload, then the media event under the piece's transaction id (module notes).
    fn send_file(&mut self, chat: &str, file: &OutFile, id: PieceId) -> Result<(), SendError> {
        let Some((mut opened, size)) = fsio::open_regular(&file.path).ok() else {
            return Err(SendError::Rejected(format!("the stored file {} is gone", file.name)));
        };
        let url = self
            .client
            .upload(&file.name, &file.kind, size, &mut opened, UPLOAD_TIMEOUT)
            .map_err(|e| send_error(&e))?;
        let media = Media {
            msgtype: msgtype(&file.kind).to_owned(),
            name: file.name.clone(),
            mimetype: Some(file.kind.clone()),
            size: Some(size),
            url: Some(url),
        };
        let txn = txn_id(&self.txn_prefix, id.seq, id.index);
        self.client.send_media(chat, &txn, &media).map(drop).map_err(|e| send_error(&e))
    }

    fn typing(&mut self, chat: &str, on: bool) -> Result<(), SendError> {
        if self.client.user_id().is_none() {
            self.client.whoami().map_err(|e| send_error(&e))?;
        }
        self.client.typing(chat, on, TYPING_TIMEOUT).map_err(|e| send_error(&e))
    }

    fn preview(&mut self, chat: &str, text: &str, shown: Option<&str>) -> Result<Option<String>, SendError> {
        let txn = self.next_txn();
        match shown {
            None => self.client.send_text(chat, &txn, text).map(Some).map_err(|e| send_error(&e)),
            Some(id) => {
                self.client.edit_text(chat, &txn, id, text).map_err(|e| send_error(&e))?;
                Ok(Some(id.to_owned()))
            }
        }
    }

    fn unpreview(&mut self, chat: &str, shown: &str) -> Result<(), SendError> {
        let txn = self.next_txn();
        match self.client.redact(chat, shown, &txn) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == ErrorKind::Permanent => Ok(()),
            Err(e) => Err(send_error(&e)),
        }
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
            media: None,
            origin_server_ts: 0,
            mentions_me: true,
        };
        let i = inbound(m, ChatKind::Group, true);
        assert_eq!((i.event_id.as_str(), i.chat_id.as_str(), i.user_id.as_str()), ("$e", "!r:hs", "@a:hs"));
        assert_eq!(i.sent_at, None);
        assert_eq!((i.chat, i.listed, i.addressed), (ChatKind::Group, true, true));
        assert!(i.attachments.is_empty());
    }

    #[test]
    fn matrix_media_become_attachments_and_encrypted_ones_are_refused() {
        let media = |msgtype: &str, mimetype: Option<&str>, url: Option<&str>| Media {
            msgtype: msgtype.into(),
            name: "f".into(),
            mimetype: mimetype.map(Into::into),
            size: Some(3),
            url: url.map(Into::into),
        };
        let a = attachment(media("m.image", Some("image/png"), Some("mxc://hs/i")));
        assert_eq!(
            (a.declared.as_str(), a.size, a.fetch.as_str(), a.outcome),
            ("image/png", Some(3), "mxc://hs/i", None)
        );
        assert_eq!(attachment(media("m.file", None, Some("mxc://hs/f"))).declared, "application/octet-stream");
        assert_eq!(attachment(media("m.image", None, Some("mxc://hs/f"))).declared, "");
        let enc = attachment(media("m.file", None, None));
        assert!(matches!(enc.outcome, Some(Outcome::Refused(ref why)) if why.contains("encrypted")), "{enc:?}");
        assert_eq!(
            ["image/png", "audio/ogg", "video/mp4", "application/pdf", "text/plain"].map(msgtype),
            ["m.image", "m.audio", "m.video", "m.file", "m.file"]
        );
    }
}
