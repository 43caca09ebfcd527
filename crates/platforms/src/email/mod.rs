//! Email adapter: mail to one IMAP account is read (IMAP IDLE, polling only where the server
//! lacks it) and answered by SMTP submission, one conversation per thread.
//!
//! - **Configuration.** `imap = "imaps://host:993"` (implicit TLS) or `"imap://host:143"`
//!   (STARTTLS, required); `smtp = "smtps://host:465"` or `"smtp://host:587"` (STARTTLS,
//!   required); `account`, the login of both and the `From` address; `token_env`, the variable
//!   holding the password; `allowed_senders` (addresses, or `@domain`; below);
//!   `poll_timeout_s`, how long one IDLE (or one poll's pause) lasts. Certificates are always
//!   verified with crates/net's settings (`ca_file` pins a private CA), for IMAP (rustls through
//!   tokio-rustls) and SMTP (lettre, [`gatewarden_net::ClientTls::smtp_params`]) alike.
//! - **One consumer per account.** The credential lock is keyed by `account@imap-host`.
//! - **Nothing lost, nothing answered twice.** The position is INBOX's `UIDVALIDITY` and the
//!   last UID, saved in `<home>/platforms/email-<name>.json` only in [`Receiver::confirm`],
//!   after the batch is journaled; the event id is `UIDVALIDITY:UID`, so a batch fetched again
//!   after a crash is deduplicated by the journal. A restart or a kill -9 fetches from the
//!   saved UID on. Messages are read with `BODY.PEEK[]`: nothing is marked seen or moved.
//!   The first start (no saved position) answers only mail that arrives after it, and saves
//!   that starting point at once.
//! - **A changed UIDVALIDITY** (the mailbox was recreated or restored: its UIDs mean other
//!   messages now) is never re-answered: the adapter moves to the mailbox's current end and
//!   reports it (`degraded` naming both values, a ledger line, `last_error`).
//! - **Threads.** The chat id is the thread's root Message-ID (the first of `References`,
//!   else `In-Reply-To`, else the message's own id), so one thread is one conversation. A reply
//!   goes to the sender of the thread's last message with `In-Reply-To` (that message) and
//!   `References`, `Re: <subject>`, `Auto-Submitted: auto-replied` (RFC 3834) and a Message-ID
//!   derived from the outbox entry (a resend after a crash carries the same id). What a reply
//!   needs is kept in `<home>/platforms/email-<name>-threads.json` (the newest
//!   [`MAX_THREADS`] threads), written when a message is read.
//! - **No bounce loops.** Automatic mail is never answered (RFC 3834 `Auto-Submitted` other
//!   than `no`, `Precedence: bulk/list/junk`, `List-Id`, a null sender, mailer-daemon and
//!   friends), nor our own, nor a sender the access policy cannot serve; those still move the
//!   position. A `From` can be forged, so email never pairs (`access` defaults to `allowlist`):
//!   under `allowlist` only `allowed_senders`, `admins` and `allowed_users` are read at all
//!   (nobody when all three are empty), so a stranger's mail leaves nothing in the home, not
//!   even its thread; under `open`, `allowed_senders` (empty: anyone). A sender that
//!   `allowed_senders` names is `listed`; the policy (crates/runtime/src/access/) decides.
//! - **Bounded.** A message is read up to [`read_limit`] (`[attachments]`' `max_message_mb` in
//!   base64, within [`MAX_MESSAGE_BYTES`]; the server cuts it); a larger one is answered as "too
//!   large", its files unread. One receive keeps at most 32 messages and 16 MiB. Bodies are
//!   decoded by mail-parser (MIME, quoted-printable, base64, charsets) and cut at 32,000
//!   characters. Every IMAP call is bounded (30 s).
//! - **Attachments in.** Every MIME part mail-parser does not take as the body text (an
//!   attachment, an inline image, an attached mail, any non-text part) is a file
//!   ([`message::parts`]: its name without a path, its declared type, its decoded size, so an
//!   oversized one is refused unread), at most [`message::MAX_PARTS`] a message. The skeleton's
//!   download decodes it from the bytes already read ([`skeleton::Receiver::fetch`]): nothing
//!   more is asked of the server; the store's bounds and type check (attachments.rs) refuse a
//!   zip named `.png` or a broken base64 image with a notice.
//! - **Attachments out.** Each file of a reply is one more mail in the thread after its text:
//!   `multipart/mixed`, a line naming the file, then the file (its type, `filename`). Its
//!   Message-ID is fixed by the outbox entry and piece like a text reply's, so a resend after a
//!   crash is the same message: a client that deduplicates by Message-ID shows it once; the
//!   worst case is one duplicate.
//! - **At least once outbound.** A crash between the SMTP send and the outbox commit sends the
//!   reply again, with the same Message-ID.
//!
//! - **No typing, no previews.** Email has no typing notice and a sent mail cannot be edited: the
//!   skeleton's progress hooks keep their defaults (nothing is sent until the reply).
//!
//! The loops, states, backoff and drain are the skeleton's (crates/platforms/src/skeleton).

pub mod imap;
pub mod message;

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use gatewarden_config::PlatformConfig;
use gatewarden_config::platform::Email as Settings;
use gatewarden_lifecycle::fsio;
use lettre::message::header::{self, ContentType, HeaderName, HeaderValue};
use lettre::message::{Mailbox, MultiPart, SinglePart};
use lettre::transport::smtp::authentication::{Credentials, Mechanism};
use lettre::transport::smtp::client::Tls;
use lettre::{SmtpTransport, Transport};
use serde::{Deserialize, Serialize};

use crate::attachments::{Attachment, Outcome};
use crate::skeleton::{self, Batch, Ctx, Failure, Limits, OutFile, PieceId, PieceLimit, Protocol, SendError, Skeleton};
use crate::{AdapterError, ChatKind, Host, Inbound};

use imap::{ImapError, Security};

/// The largest message read; the server cuts larger ones (`BODY.PEEK[]<0.n>`). Below it,
/// [`read_limit`] follows `[attachments]` `max_message_mb`.
pub const MAX_MESSAGE_BYTES: u32 = 8 << 20;
/// What a message is read up to without an attachment store.
const TEXT_MESSAGE_BYTES: u32 = 1 << 20;
/// Threads remembered for replies (the oldest are forgotten first).
pub const MAX_THREADS: usize = 500;
/// Characters per reply (one email).
const MAX_REPLY_CHARS: usize = 100_000;
/// Mail that a fresh start in a cluster (no saved position, [`Host::fresh_start_window`]) looks
/// back through at most.
const FRESH_LOOKBACK: u32 = 200;

/// A server: host, port, and whether TLS starts at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
    pub implicit_tls: bool,
}

/// Parses `imaps://host[:993]`, `imap://host[:143]` (STARTTLS) or the SMTP forms
/// (`smtps://host[:465]`, `smtp://host[:587]`, STARTTLS).
pub fn endpoint(url: &str, smtp: bool) -> Result<Endpoint, String> {
    let (tls_scheme, starttls_scheme, tls_port, starttls_port) =
        if smtp { ("smtps", "smtp", 465, 587) } else { ("imaps", "imap", 993, 143) };
    let (scheme, rest) = url
        .trim()
        .split_once("://")
        .ok_or_else(|| format!("{url:?}: use {tls_scheme}://host:port or {starttls_scheme}://host:port"))?;
    let implicit_tls = match scheme.to_ascii_lowercase() {
        s if s == tls_scheme => true,
        s if s == starttls_scheme => false,
        _ => return Err(format!("{url:?}: the scheme must be {tls_scheme} (TLS) or {starttls_scheme} (STARTTLS)")),
    };
    let rest = rest.trim_end_matches('/');
    let (host, port) = match rest.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') || h.ends_with(']') => {
            (h, p.parse::<u16>().map_err(|_| format!("{url:?}: bad port {p:?}"))?)
        }
        _ => (rest, if implicit_tls { tls_port } else { starttls_port }),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() || host.contains(['/', '@', '?', '#', ' ']) || port == 0 {
        return Err(format!("{url:?}: expected {tls_scheme}://host:port"));
    }
    Ok(Endpoint { host: host.to_owned(), port, implicit_tls })
}

/// The saved position: INBOX's UIDVALIDITY and the last UID journaled.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position {
    pub uid_validity: u32,
    pub last_uid: u32,
}

/// What a reply in one thread needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Thread {
    /// The sender of the thread's last message.
    to: String,
    subject: String,
    /// The last message's id (`In-Reply-To`).
    last: Option<String>,
    references: Vec<String>,
    /// When the thread last had mail (for forgetting the oldest).
    tick: u64,
}

/// The threads a reply can go to, by chat id (the root Message-ID), persisted.
#[derive(Default)]
struct Threads {
    map: BTreeMap<String, Thread>,
    tick: u64,
    path: Option<PathBuf>,
}

type SharedThreads = Arc<Mutex<Threads>>;

fn lock(t: &SharedThreads) -> std::sync::MutexGuard<'_, Threads> {
    t.lock().unwrap_or_else(|p| p.into_inner())
}

impl Threads {
    fn load(path: Option<PathBuf>) -> Threads {
        let map: BTreeMap<String, Thread> = path
            .as_ref()
            .and_then(|p| fsio::read_capped(p, fsio::MAX_RECORD_BYTES).ok())
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        let tick = map.values().map(|t| t.tick).max().unwrap_or(0);
        Threads { map, tick, path }
    }

    fn note(&mut self, chat: &str, m: &message::Mail) -> Result<(), String> {
        self.tick += 1;
        let t = Thread {
            to: m.from.clone(),
            subject: m.subject.clone(),
            last: m.message_id.clone(),
            references: m.references.clone(),
            tick: self.tick,
        };
        self.map.insert(chat.to_owned(), t);
        while self.map.len() > MAX_THREADS {
            let Some(oldest) = self.map.iter().min_by_key(|(_, t)| t.tick).map(|(k, _)| k.clone()) else { break };
            self.map.remove(&oldest);
        }
        match &self.path {
            Some(p) => save_json(p, &self.map),
            None => Ok(()),
        }
    }
}

fn save_json<T: Serialize>(path: &Path, value: &T) -> Result<(), String> {
    if let Some(dir) = path.parent() {
        gatewarden_lifecycle::platform::create_private_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    fsio::write_json(path, value).map_err(|e| format!("{}: {e}", path.display()))
}

/// How much of a message is read: room for `[attachments]`'s `max_message_mb` of files in
/// base64 (4/3 of their size) and the text around them, within [`MAX_MESSAGE_BYTES`]; 1 MiB
/// when no files are stored.
pub fn read_limit(bounds: Option<&crate::attachments::Bounds>) -> u32 {
    let Some(b) = bounds else { return TEXT_MESSAGE_BYTES };
    let want = b.per_message.saturating_mul(4) / 3 + (64 << 10);
    u32::try_from(want).unwrap_or(u32::MAX).clamp(TEXT_MESSAGE_BYTES, MAX_MESSAGE_BYTES)
}

fn load_position(path: Option<&PathBuf>) -> Option<Position> {
    path.and_then(|p| fsio::read_capped(p, fsio::MAX_RECORD_BYTES).ok())
        .and_then(|b| serde_json::from_slice::<Position>(&b).ok())
        .filter(|p| p.uid_validity != 0)
}

/// The email adapter.
pub type Email = Skeleton<Proto>;

/// The email protocol: IMAP in, SMTP out.
pub struct Proto {
    name: String,
    imap: Endpoint,
    smtp: Endpoint,
    account: String,
    /// `account`, lower-cased: our own address.
    own: String,
    password: String,
    tls: gatewarden_net::ClientTls,
    admit: Admit,
    poll: Duration,
    /// `account@imap-host`: what two consumers must not share.
    credential: String,
}

/// Whose mail is read at all (module notes).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Admit {
    /// Addresses or `@domain`s read (empty, with `nobody` false: anyone's).
    senders: Vec<String>,
    /// Nobody's: `allowlist` with no sender listed anywhere.
    nobody: bool,
    /// `allowed_senders`: a sender it names is `listed`.
    listed: Vec<String>,
}

impl Admit {
    fn of(cfg: &PlatformConfig, s: &Settings) -> Admit {
        let listed = s.allowed_senders.clone();
        if cfg.access() == gatewarden_config::Access::Open {
            return Admit { senders: listed.clone(), nobody: false, listed };
        }
        let senders: Vec<String> = listed.iter().chain(&cfg.admins).chain(&cfg.allowed_users).cloned().collect();
        Admit { nobody: senders.is_empty(), senders, listed }
    }
}

impl Skeleton<Proto> {
    pub fn new(cfg: &PlatformConfig, password: String) -> Result<Email, AdapterError> {
        let s = skeleton::settings::<Proto>(cfg)?;
        let name = cfg.adapter_name();
        let err = |message: String| AdapterError::Start { name: name.clone(), message };
        let imap = endpoint(s.imap.as_deref().unwrap_or_default(), false).map_err(|e| err(format!("imap: {e}")))?;
        let smtp = endpoint(s.smtp.as_deref().unwrap_or_default(), true).map_err(|e| err(format!("smtp: {e}")))?;
        let account = s.account.clone().unwrap_or_default();
        if !account.contains('@') {
            return Err(err("email needs account = \"user@domain\"".into()));
        }
        let tls = gatewarden_net::ClientTls::new(cfg.ca_file.as_deref()).map_err(|e| err(e.to_string()))?;
        let proto = Proto {
            credential: format!("{}@{}", account.to_ascii_lowercase(), imap.host.to_ascii_lowercase()),
            own: account.to_ascii_lowercase(),
            name,
            imap,
            smtp,
            account,
            password,
            tls,
            admit: Admit::of(cfg, s),
            poll: Duration::from_secs(s.poll_timeout_s.max(1)),
        };
        Ok(Skeleton::from_protocol(cfg, proto))
    }
}

impl skeleton::FromConfig for Proto {
    fn from_config(cfg: &PlatformConfig, creds: &crate::Credentials<'_>) -> Result<Email, AdapterError> {
        Email::new(cfg, creds.token()?)
    }
}

impl Protocol for Proto {
    type Settings = Settings;
    const LIMITS: Limits = Limits {
        piece: PieceLimit::Chars(MAX_REPLY_CHARS),
        line_per_piece: false,
        batch: 8,
        pace: None,
        min_receive: Duration::ZERO,
        redelivers: true,
        listens_through_drain: false,
        connected_after_receive: false,
        // An IDLE notices the drain within 100 ms, then sends DONE.
        close_grace: Duration::from_millis(1500),
    };
    type Receiver = Fetcher;
    type Sender = Mailer;

    fn credential(&self) -> &str {
        &self.credential
    }

    fn watchdog_after(&self) -> Duration {
        self.poll + imap::OP_TIMEOUT * 2 + Duration::from_secs(30)
    }

    fn open(&self, host: &Arc<dyn Host>) -> Result<(Fetcher, Mailer), String> {
        let dir = host.state_dir();
        let pos_path = dir.as_ref().map(|d| d.join(format!("email-{}.json", self.name)));
        let threads_path = dir.as_ref().map(|d| d.join(format!("email-{}-threads.json", self.name)));
        let threads: SharedThreads = Arc::new(Mutex::new(Threads::load(threads_path)));
        let rustls = self.tls.rustls_config().map_err(|e| e.to_string())?;
        let smtp_tls = self.tls.smtp_params(&self.smtp.host).map_err(|e| e.to_string())?;
        let smtp_tls = if self.smtp.implicit_tls { Tls::Wrapper(smtp_tls) } else { Tls::Required(smtp_tls) };
        let transport = SmtpTransport::builder_dangerous(&self.smtp.host)
            .port(self.smtp.port)
            .tls(smtp_tls)
            .credentials(Credentials::new(self.account.clone(), self.password.clone()))
            .authentication(vec![Mechanism::Plain, Mechanism::Login])
            .timeout(Some(imap::OP_TIMEOUT))
            .build();
        let from: Mailbox = self.account.parse().map_err(|e| format!("account {:?}: {e}", self.account))?;
        let domain = self.own.rsplit('@').next().unwrap_or("localhost").to_owned();
        let tx = Mailer { transport, from, domain, threads: Arc::clone(&threads) };
        let rx = Fetcher {
            imap: self.imap.clone(),
            rustls,
            user: self.account.clone(),
            password: self.password.clone(),
            own: self.own.clone(),
            admit: self.admit.clone(),
            poll: self.poll,
            session: None,
            confirmed: load_position(pos_path.as_ref()),
            pos_path,
            pending: None,
            gap: None,
            not_before: None,
            threads,
            limit: MAX_MESSAGE_BYTES,
            files: HashMap::new(),
        };
        Ok((rx, tx))
    }
}

/// The receive side: an IMAP session, the position, and the thread table it fills.
pub struct Fetcher {
    imap: Endpoint,
    rustls: Arc<gatewarden_net::rustls::ClientConfig>,
    user: String,
    password: String,
    own: String,
    admit: Admit,
    poll: Duration,
    session: Option<imap::Session>,
    /// Where fetching starts: the last saved position, or the one fixed at connect.
    confirmed: Option<Position>,
    pos_path: Option<PathBuf>,
    /// The position past the last batch (or fixed at connect), saved by `confirm`.
    pending: Option<Position>,
    /// A changed UIDVALIDITY, reported with the next batch.
    gap: Option<String>,
    /// A fresh start in a cluster: mail at or below this UID older than the time is history.
    not_before: Option<(u32, SystemTime)>,
    threads: SharedThreads,
    /// What the last receive read each message up to ([`read_limit`]).
    limit: u32,
    /// The files of the last batch's messages, by UID then [`message::Part::pos`], each
    /// message parsed once ([`message::contents`]): what [`skeleton::Receiver::fetch`] hands
    /// out (the skeleton downloads before the next receive).
    files: HashMap<u32, HashMap<u32, Arc<[u8]>>>,
}

/// The files a message carries, as the skeleton downloads them: the handle is `uid:part`; the
/// parts past [`message::MAX_PARTS`] are one refusal.
fn files(uid: u32, mail: &message::Mail) -> Vec<Attachment> {
    let mut out: Vec<Attachment> = mail
        .parts
        .iter()
        .map(|p| Attachment {
            name: p.name.clone(),
            declared: p.declared.clone(),
            size: Some(p.size),
            fetch: format!("{uid}:{}", p.pos),
            outcome: None,
        })
        .collect();
    if mail.more_parts > 0 {
        out.push(Attachment {
            name: format!("{} more parts", mail.more_parts),
            outcome: Some(Outcome::Refused(format!("not read: at most {} files a message", message::MAX_PARTS))),
            ..Attachment::default()
        });
    }
    out
}

fn failure(e: ImapError) -> Failure {
    match e {
        ImapError::Rejected(why) => Failure::Rejected(why),
        ImapError::Lost(why) => Failure::Lost(why),
    }
}

impl Fetcher {
    fn lost(&mut self, e: ImapError) -> Failure {
        self.session = None;
        failure(e)
    }

    /// One fetched message as an inbound message, when it may be answered.
    fn inbound(&self, validity: u32, f: &imap::Fetched) -> Option<Inbound> {
        let mut mail = match message::judge(&f.raw, &self.own, &self.admit.senders) {
            Ok(m) if !self.admit.nobody => m,
            _ => return None,
        };
        if let Some((below, since)) = self.not_before
            && f.uid <= below
            && mail.sent_at.is_none_or(|t| t < since)
        {
            return None;
        }
        let mut attachments = Vec::new();
        if f.size > self.limit {
            mail.text = format!(
                "[this message is {} bytes, over the {}-byte limit: it was not read, nor its attachments]",
                f.size, self.limit
            );
        } else {
            attachments = files(f.uid, &mail);
            if mail.text.is_empty() && attachments.is_empty() {
                mail.text = "(empty message)".into();
            }
        }
        let chat = if mail.root.is_empty() || mail.root.len() > 250 {
            format!("uid-{validity}-{}", f.uid)
        } else {
            mail.root.clone()
        };
        // What a reply needs is kept before the delivery: the reply may be sent before the
        // batch is confirmed. A failed write only costs that thread's reply after a restart.
        let _ = lock(&self.threads).note(&chat, &mail);
        let listed = !self.admit.listed.is_empty() && message::sender_allowed(&self.admit.listed, &mail.from);
        Some(Inbound {
            event_id: format!("{validity}:{}", f.uid),
            chat_id: chat,
            user_id: mail.from,
            text: mail.text,
            sent_at: mail.sent_at,
            // A thread is one sender's conversation with the bot.
            chat: ChatKind::Direct,
            listed,
            addressed: true,
            attachments,
        })
    }
}

impl skeleton::Receiver for Fetcher {
    fn connect(&mut self, ctx: &Ctx) -> Result<(), Failure> {
        let security = if self.imap.implicit_tls { Security::Implicit } else { Security::StartTls };
        let (session, sel) = imap::connect(
            &self.imap.host,
            self.imap.port,
            security,
            Arc::clone(&self.rustls),
            &self.user,
            &self.password,
        )
        .map_err(failure)?;
        let end = Position { uid_validity: sel.uid_validity, last_uid: sel.uid_next.saturating_sub(1) };
        match self.confirmed {
            Some(p) if p.uid_validity == sel.uid_validity => {}
            Some(p) => {
                self.gap = Some(format!(
                    "INBOX UIDVALIDITY changed from {} to {} (the mailbox was recreated or restored): the {} messages in it \
                     now are not answered, new mail is",
                    p.uid_validity, sel.uid_validity, end.last_uid
                ));
                self.confirmed = Some(end);
                self.pending = Some(end);
            }
            None => {
                let mut start = end;
                if let Some(window) = ctx.host().fresh_start_window() {
                    start.last_uid = end.last_uid.saturating_sub(FRESH_LOOKBACK);
                    self.not_before = Some((end.last_uid, SystemTime::now() - window));
                }
                // The starting point is saved at once: a restart before the first batch must
                // not take the mail that arrived meanwhile for history. (Nothing journaled
                // depends on it; a changed UIDVALIDITY, above, is saved only once reported.)
                if let Some(path) = &self.pos_path {
                    save_json(path, &start)
                        .map_err(|e| Failure::Down(format!("cannot save the IMAP position: {e}")))?;
                }
                self.confirmed = Some(start);
                self.pending = None;
            }
        }
        self.session = Some(session);
        Ok(())
    }

    fn receive(&mut self, ctx: &Ctx, budget: Option<Duration>) -> Result<Batch, Failure> {
        let Some(pos) = self.confirmed else { return Err(Failure::Lost("not connected".into())) };
        let Some(session) = self.session.as_mut() else { return Err(Failure::Lost("not connected".into())) };
        self.limit = read_limit(ctx.host().attachments().as_ref().map(|(_, b)| b));
        let limit = self.limit;
        let mut fetched = match session.fetch_after(pos.last_uid, limit) {
            Ok(f) => f,
            Err(e) => return Err(self.lost(e)),
        };
        if fetched.is_empty() {
            let wait = budget.unwrap_or(self.poll).min(self.poll);
            if let Err(e) = session.wait_for_mail(wait, &|| ctx.ending()) {
                return Err(self.lost(e));
            }
            if ctx.ending() {
                return Ok(Batch::default());
            }
            fetched = match session.fetch_after(pos.last_uid, limit) {
                Ok(f) => f,
                Err(e) => return Err(self.lost(e)),
            };
        }
        let mut batch = Batch { messages: Vec::new(), gap: self.gap.take() };
        if let Some(last) = fetched.last() {
            self.pending = Some(Position { uid_validity: pos.uid_validity, last_uid: last.uid });
        }
        batch.messages = fetched.iter().filter_map(|f| self.inbound(pos.uid_validity, f)).collect();
        let with_files: std::collections::HashSet<&str> = batch
            .messages
            .iter()
            .filter(|m| !m.attachments.is_empty())
            .filter_map(|m| m.event_id.split_once(':').map(|(_, uid)| uid))
            .collect();
        self.files = fetched
            .iter()
            .filter(|f| with_files.contains(f.uid.to_string().as_str()))
            .map(|f| (f.uid, message::contents(&f.raw)))
            .collect();
        Ok(batch)
    }

    /// The batch is journaled: the position moves past it, on disk first.
    fn confirm(&mut self, _ctx: &Ctx) -> Result<(), String> {
        let Some(p) = self.pending else { return Ok(()) };
        if let Some(path) = &self.pos_path {
            save_json(path, &p).map_err(|e| format!("cannot save the IMAP position: {e}"))?;
        }
        self.pending = None;
        self.confirmed = Some(p);
        if self.not_before.is_some_and(|(below, _)| p.last_uid >= below) {
            self.not_before = None;
        }
        Ok(())
    }

    fn disconnect(&mut self) {
        if let Some(mut s) = self.session.take() {
            s.logout();
        }
    }

    /// A part of a message of the last batch, decoded from the bytes already read (under
    /// [`read_limit`]): nothing more is asked of the server.
    fn fetch(&mut self, _ctx: &Ctx, a: &Attachment, _timeout: Duration) -> Result<Box<dyn Read + Send>, String> {
        let (uid, pos) = a
            .fetch
            .split_once(':')
            .and_then(|(u, p)| Some((u.parse::<u32>().ok()?, p.parse::<u32>().ok()?)))
            .ok_or_else(|| format!("no such part {:?}", a.fetch))?;
        let parts = self.files.get(&uid).ok_or_else(|| "the message is no longer at hand".to_owned())?;
        let bytes = parts.get(&pos).ok_or_else(|| format!("the message has no part {pos}"))?;
        Ok(Box::new(std::io::Cursor::new(Arc::clone(bytes))))
    }

    fn hang_up(&mut self) -> Vec<Inbound> {
        self.disconnect();
        Vec::new()
    }
}

/// `Auto-Submitted: auto-replied` (RFC 3834 section 5): other robots must not answer us.
#[derive(Debug, Clone)]
struct AutoSubmitted;

impl header::Header for AutoSubmitted {
    fn name() -> HeaderName {
        HeaderName::new_from_ascii_str("Auto-Submitted")
    }

    fn parse(_: &str) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        Ok(AutoSubmitted)
    }

    fn display(&self) -> HeaderValue {
        HeaderValue::new(Self::name(), "auto-replied".to_owned())
    }
}

/// The send side: one SMTP submission per reply.
pub struct Mailer {
    transport: SmtpTransport,
    from: Mailbox,
    domain: String,
    threads: SharedThreads,
}

fn angle(id: &str) -> String {
    format!("<{id}>")
}

impl Mailer {
    /// A reply in `chat`'s thread: its headers, with the Message-ID fixed by the outbox entry
    /// and piece (`id`), so a resend after a crash is the same message.
    fn reply(&self, chat: &str, id: PieceId) -> Result<lettre::message::MessageBuilder, SendError> {
        let Some(t) = lock(&self.threads).map.get(chat).cloned() else {
            return Err(SendError::Rejected(format!("no email thread {chat:?} is known to reply to")));
        };
        let to: Mailbox = t.to.parse().map_err(|e| SendError::Rejected(format!("recipient {:?}: {e}", t.to)))?;
        let mut b = lettre::Message::builder()
            .from(self.from.clone())
            .to(to)
            .subject(message::reply_subject(&t.subject))
            .message_id(Some(format!(
                "<gw.{}.{}.{}@{}>",
                id.seq,
                id.index,
                crate::sha256_hex(chat.as_bytes()).get(..12).unwrap_or(""),
                self.domain
            )))
            .header(AutoSubmitted);
        if let Some(last) = &t.last {
            b = b.in_reply_to(angle(last));
        }
        if !t.references.is_empty() {
            b = b.references(t.references.iter().map(|r| angle(r)).collect::<Vec<_>>().join(" "));
        }
        Ok(b)
    }

    fn submit(&self, msg: &lettre::Message) -> Result<(), SendError> {
        match self.transport.send(msg) {
            Ok(_) => Ok(()),
            Err(e) => Err(smtp_error(&e)),
        }
    }
}

/// A reply's file, read whole from the store (it was stored under `[attachments]`' per-file
/// bound): a file gone or changed since is refused.
fn read_out_file(file: &OutFile) -> Result<Vec<u8>, SendError> {
    let gone = |e: String| SendError::Rejected(format!("file {}: {e}", file.name));
    let (f, len) = fsio::open_regular(&file.path).ok().ok_or_else(|| gone("the stored file is gone".into()))?;
    if len != file.size {
        return Err(gone(format!("{len} bytes in the store, {} expected", file.size)));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    f.take(len).read_to_end(&mut bytes).map_err(|e| gone(e.to_string()))?;
    Ok(bytes)
}

/// A file name fit for a MIME parameter: one line, no quotes or path (lettre encodes the rest,
/// RFC 2231).
fn out_name(name: &str) -> String {
    let base = name.rsplit(['/', '\\']).next().unwrap_or(name);
    let n: String = base.chars().filter(|c| !c.is_control() && *c != '"').take(120).collect();
    if n.trim().is_empty() { "file".into() } else { n.trim().to_owned() }
}

impl skeleton::Sender for Mailer {
    fn send(&mut self, chat: &str, piece: &str, id: PieceId) -> Result<(), SendError> {
        let msg = self
            .reply(chat, id)?
            .header(ContentType::TEXT_PLAIN)
            .body(piece.to_owned())
            .map_err(|e| SendError::Rejected(format!("cannot build the reply: {e}")))?;
        self.submit(&msg)
    }

    /// One mail per file, in the thread: `multipart/mixed`, a line of text naming the file,
    /// then the file as an attachment part with its type and name. Its Message-ID is the
    /// piece's, like a text reply's.
    fn send_file(&mut self, chat: &str, file: &OutFile, id: PieceId) -> Result<(), SendError> {
        let bytes = read_out_file(file)?;
        let name = out_name(&file.name);
        let kind = ContentType::parse(&file.kind)
            .or_else(|_| ContentType::parse("application/octet-stream"))
            .map_err(|e| SendError::Rejected(format!("file {name}: type {:?}: {e}", file.kind)))?;
        let note = format!("Attached: {name} ({}, {}).", file.kind, crate::attachments::human_size(file.size));
        // Base64 whatever the type: a text file's line ends arrive as they were (lettre would
        // send text as 7bit with CRLF, the canonical form a client converts back).
        let file = lettre::message::Body::new_with_encoding(bytes, header::ContentTransferEncoding::Base64)
            .map_err(|_| SendError::Rejected(format!("file {name}: cannot encode it")))?;
        let body = MultiPart::mixed()
            .singlepart(SinglePart::plain(note))
            .singlepart(lettre::message::Attachment::new(name).body(file, kind));
        let msg = self
            .reply(chat, id)?
            .multipart(body)
            .map_err(|e| SendError::Rejected(format!("cannot build the reply: {e}")))?;
        self.submit(&msg)
    }
}

/// An SMTP failure as the skeleton's outcome: refused credentials park, a permanent refusal
/// (5xx) rejects the entry, the rest is retried.
fn smtp_error(e: &lettre::transport::smtp::Error) -> SendError {
    let code = e.status().map(|c| c.to_string());
    let text = format!("SMTP: {e}");
    match code.as_deref() {
        Some("535" | "534" | "530") => SendError::Unauthorized(text),
        _ if e.is_permanent() => SendError::Rejected(text),
        _ => SendError::Failed(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_name_the_tls_mode_and_default_ports() {
        let e = endpoint("imaps://mail.example.org", false).unwrap();
        assert_eq!((e.host.as_str(), e.port, e.implicit_tls), ("mail.example.org", 993, true));
        assert_eq!(
            endpoint("imap://h:1143", false).unwrap(),
            Endpoint { host: "h".into(), port: 1143, implicit_tls: false }
        );
        assert_eq!(endpoint("smtp://h", true).unwrap().port, 587);
        assert_eq!(endpoint("smtps://[::1]:4650", true).unwrap().host, "::1");
        assert!(endpoint("http://h", false).is_err());
        assert!(endpoint("imaps://", false).is_err());
        assert!(endpoint("imaps://u@h", false).is_err());
        assert!(endpoint("smtp://h:x", true).is_err());
    }

    #[test]
    fn email_read_limit_follows_max_message_mb_within_its_bounds() {
        let b = |mb: u64| crate::attachments::Bounds { per_message: mb << 20, ..Default::default() };
        assert_eq!(read_limit(None), 1 << 20);
        assert_eq!(read_limit(Some(&b(3))), (4 << 20) + (64 << 10), "3 MB of files in base64, and the text");
        assert_eq!(read_limit(Some(&b(50))), MAX_MESSAGE_BYTES);
        assert_eq!(read_limit(Some(&b(u64::MAX >> 20))), MAX_MESSAGE_BYTES);
    }

    #[test]
    fn email_files_are_handled_by_uid_and_part_and_the_rest_refused() {
        let part = |pos| message::Part { pos, name: format!("f{pos}.png"), declared: "image/png".into(), size: 9 };
        let mail = message::Mail {
            from: "a@x".into(),
            root: "r".into(),
            message_id: None,
            references: Vec::new(),
            subject: String::new(),
            text: String::new(),
            sent_at: None,
            parts: vec![part(0), part(3)],
            more_parts: 4,
        };
        let f = files(17, &mail);
        assert_eq!(f.len(), 3);
        assert_eq!((f[1].fetch.as_str(), f[1].size, f[1].name.as_str()), ("17:3", Some(9), "f3.png"));
        assert!(f[0].outcome.is_none());
        assert!(matches!(&f[2].outcome, Some(Outcome::Refused(why)) if why.contains("at most 32")), "{:?}", f[2]);
    }

    #[test]
    fn the_thread_table_forgets_the_oldest() {
        let mut t = Threads::default();
        let mail = |n: usize| message::Mail {
            from: format!("u{n}@x"),
            root: format!("r{n}"),
            message_id: Some(format!("m{n}")),
            references: vec![format!("m{n}")],
            subject: "s".into(),
            text: "t".into(),
            sent_at: None,
            parts: Vec::new(),
            more_parts: 0,
        };
        for n in 0..MAX_THREADS + 3 {
            t.note(&format!("r{n}"), &mail(n)).unwrap();
        }
        t.note("r5", &mail(5)).unwrap(); // touched again: kept
        assert_eq!(t.map.len(), MAX_THREADS);
        assert!(!t.map.contains_key("r0") && t.map.contains_key("r5") && t.map.contains_key("r3"));
    }
}
