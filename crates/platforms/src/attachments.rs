//! Attachments in (issue 29 §1): what a platform says a message carries, the bounded download
//! the skeleton runs before [`crate::Host::deliver`], and the content-addressed store in the
//! home.
//!
//! - **Bounded.** Size per file and per message, a total time and a stall bound ([`Bounds`]).
//!   The body is streamed to a temporary file through a small bounded channel: never the whole
//!   file in memory, and a reader that stops sending is abandoned after the stall bound.
//! - **Typed by content.** The first bytes are sniffed ([`sniff`]); a declared type the content
//!   contradicts (an `image/png` that is a zip) is refused, and so is a type outside
//!   [`Bounds::allowed`].
//! - **Content-addressed.** `<home>/attachments/ab/cdef…` (sha256), created 0600 without
//!   following links (crates/lifecycle/src/fsio.rs), written to a temporary name then renamed.
//!   A per-event record (`<home>/attachments/events/<key>`) names the hash of what an event's
//!   attachment was, so a redelivery after a kill -9 downloads nothing twice.
//! - **Transcripts.** `<home>/attachments/transcripts/<sha256>` caches the transcript of a
//!   stored audio file ([`Store::transcript`]; crates/agent/src/backend/transcribe.rs), 0600,
//!   written temp+rename, pruned with its file: a re-run does not transcribe twice.
//! - **Never silent.** A refusal keeps the message: the attachment carries its
//!   [`Outcome::Refused`] reason, rendered into the journaled text ([`Inbound::journal_text`])
//!   for the agent and the chat.
//!
//! [`Inbound::journal_text`]: crate::Inbound::journal_text

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use gatewarden_lifecycle::fsio;
use sha2::Digest;

/// One file a message carries, as the platform declares it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Attachment {
    /// The file name (the platform's, or one made from the kind: `photo.jpg`).
    pub name: String,
    /// The declared MIME type (`image/jpeg`); checked against the content.
    pub declared: String,
    /// The declared size, when the platform says it: an oversized file is refused unfetched.
    pub size: Option<u64>,
    /// What the protocol resolves to a download (Telegram: a `file_id`).
    pub fetch: String,
    /// Set by the skeleton's download; `None` until then.
    pub outcome: Option<Outcome>,
}

/// How an attachment's download ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// In the store under its hash.
    Stored(Stored),
    /// Not stored; the reason is for people (the chat is told).
    Refused(String),
}

/// A file in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// Lowercase hex sha256: the file's name in the store.
    pub sha256: String,
    pub size: u64,
    /// The type its content shows ([`sniff`]), else the declared one.
    pub kind: String,
}

/// The download bounds (`[attachments]`; defaults: 20 MB a file, 50 MB a message, 120 s in
/// all, 30 s without a byte).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bounds {
    pub per_file: u64,
    pub per_message: u64,
    pub total: Duration,
    pub stall: Duration,
    /// Type prefixes accepted (`image/`, `text/plain`); empty: every type [`sniff`] knows or
    /// that is text.
    pub allowed: Vec<String>,
    /// Content of no known type is taken as `application/octet-stream` rather than refused
    /// (the files a reply carries: the operator's own command made them).
    pub unknown_as_binary: bool,
}

impl Default for Bounds {
    fn default() -> Bounds {
        Bounds {
            per_file: 20 << 20,
            per_message: 50 << 20,
            total: Duration::from_secs(120),
            stall: Duration::from_secs(30),
            allowed: Vec::new(),
            unknown_as_binary: false,
        }
    }
}

impl From<&gatewarden_config::AttachmentsConfig> for Bounds {
    /// `[attachments]` (validated: every bound at least 1).
    fn from(c: &gatewarden_config::AttachmentsConfig) -> Bounds {
        Bounds {
            per_file: c.max_file_mb.saturating_mul(1 << 20),
            per_message: c.max_message_mb.saturating_mul(1 << 20),
            total: Duration::from_secs(c.timeout_s),
            stall: Duration::from_secs(c.stall_s),
            allowed: c.allowed_types.clone(),
            unknown_as_binary: false,
        }
    }
}

/// Bytes sniffed before the type is decided.
const SNIFF_BYTES: usize = 512;
/// One chunk of the download channel; the channel holds at most [`CHANNEL_CHUNKS`].
const CHUNK: usize = 64 << 10;
const CHANNEL_CHUNKS: usize = 4;

/// The MIME type `head` (a file's first bytes) shows, from its magic bytes; `text/plain` for
/// UTF-8 without NUL; `None` when unknown. Total over any input (fuzzed: fuzz/).
pub fn sniff(head: &[u8]) -> Option<&'static str> {
    const MAGIC: &[(&[u8], usize, &str)] = &[
        (b"\x89PNG\r\n\x1a\n", 0, "image/png"),
        (b"\xff\xd8\xff", 0, "image/jpeg"),
        (b"GIF87a", 0, "image/gif"),
        (b"GIF89a", 0, "image/gif"),
        (b"%PDF-", 0, "application/pdf"),
        (b"PK\x03\x04", 0, "application/zip"),
        (b"PK\x05\x06", 0, "application/zip"),
        (b"\x1f\x8b", 0, "application/gzip"),
        (b"OggS", 0, "audio/ogg"),
        (b"ID3", 0, "audio/mpeg"),
        (b"fLaC", 0, "audio/flac"),
        (b"ftyp", 4, "video/mp4"),
        (b"\x1a\x45\xdf\xa3", 0, "video/webm"),
    ];
    for &(magic, at, kind) in MAGIC {
        if head.get(at..at + magic.len()) == Some(magic) {
            return Some(kind);
        }
    }
    if head.starts_with(b"RIFF") {
        return match head.get(8..12) {
            Some(b"WEBP") => Some("image/webp"),
            Some(b"WAVE") => Some("audio/wav"),
            _ => None,
        };
    }
    // An MPEG audio frame sync with a valid layer.
    if let [0xff, b, ..] = head
        && b & 0xe0 == 0xe0
        && b & 0x06 != 0
    {
        return Some("audio/mpeg");
    }
    if !head.is_empty() && !head.contains(&0) && text_prefix(head) {
        return Some("text/plain");
    }
    None
}

/// Whether `head` is UTF-8, allowing a character cut at its end.
fn text_prefix(head: &[u8]) -> bool {
    match std::str::from_utf8(head) {
        Ok(_) => true,
        Err(e) => e.error_len().is_none() && head.len() - e.valid_up_to() < 4,
    }
}

/// The family of a MIME type: `image/png` → `image`.
fn family(t: &str) -> &str {
    t.split('/').next().unwrap_or(t)
}

/// Whether text-like declared types (`application/json`, `text/csv`) may hold sniffed text.
fn text_like(declared: &str) -> bool {
    declared.starts_with("text/")
        || matches!(declared, "application/json" | "application/xml" | "application/x-yaml" | "application/toml")
}

/// The type to store the file as, or why it is refused: the content decides; a declared type it
/// contradicts is refused (`image/png` that is a zip), and so is a type `allowed` does not list.
pub fn decide_type(declared: &str, sniffed: Option<&'static str>, allowed: &[String]) -> Result<String, String> {
    let declared = declared.trim().to_ascii_lowercase();
    let kind = match sniffed {
        Some(s) if s == declared => s.to_owned(),
        Some("text/plain") if text_like(&declared) => declared.clone(),
        // Within the family the content says which (a PNG Telegram calls `image/jpeg`).
        Some(s) if family(s) == family(&declared) => s.to_owned(),
        // An MP4 container holding audio (`audio/mp4`, an m4a) keeps its declared type.
        Some("video/mp4") if family(&declared) == "audio" => declared.clone(),
        Some(s) if declared.is_empty() || declared == "application/octet-stream" => s.to_owned(),
        Some(s) => return Err(format!("declared {declared} but the content is {s}")),
        None if declared.starts_with("image/") || text_like(&declared) => {
            return Err(format!("declared {declared} but the content is not"));
        }
        None => return Err(format!("unknown content type (declared {})", or_none(&declared))),
    };
    if !allowed.is_empty() && !allowed.iter().any(|a| kind.starts_with(a.as_str())) {
        return Err(format!("type {kind} is not allowed"));
    }
    Ok(kind)
}

fn or_none(s: &str) -> &str {
    if s.is_empty() { "none" } else { s }
}

/// A human size: `12.3 MB`, `512 B`.
pub fn human_size(n: u64) -> String {
    #[allow(clippy::cast_precision_loss)] // display only
    let f = n as f64;
    match n {
        0..1024 => format!("{n} B"),
        1024..1_048_576 => format!("{:.1} KB", f / 1024.0),
        _ => format!("{:.1} MB", f / 1_048_576.0),
    }
}

/// The content-addressed store, `<home>/attachments`.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
}

impl Store {
    pub fn new(dir: PathBuf) -> Store {
        Store { dir }
    }

    /// The store of the gateway home `home`: `<home>/attachments`.
    pub fn in_home(home: &Path) -> Store {
        Store::new(home.join("attachments"))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the file with hash `sha256` lives: `ab/cdef…`; `None` for a malformed hash.
    pub fn path(&self, sha256: &str) -> Option<PathBuf> {
        if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()) {
            return None;
        }
        Some(self.dir.join(&sha256[..2]).join(&sha256[2..]))
    }

    /// The per-event record of `key` (an adapter, event and index), hashed into a file name.
    fn record(&self, key: &str) -> PathBuf {
        self.dir.join("events").join(crate::sha256_hex(key.as_bytes()))
    }

    /// What an earlier download of `key` stored, when its record and file are both there.
    pub fn recall(&self, key: &str) -> Option<Stored> {
        let bytes = fsio::read_capped(&self.record(key), 4096).ok()?;
        let v: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
        let stored = Stored {
            sha256: v["sha256"].as_str()?.to_owned(),
            size: v["size"].as_u64()?,
            kind: v["kind"].as_str()?.to_owned(),
        };
        let (_, len) = fsio::open_regular(&self.path(&stored.sha256)?).ok()?;
        (len == stored.size).then_some(stored)
    }

    fn remember(&self, key: &str, s: &Stored) -> io::Result<()> {
        let path = self.record(key);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)?;
        }
        let v = serde_json::json!({"sha256": s.sha256, "size": s.size, "kind": s.kind});
        fsio::atomic_write(&path, v.to_string().as_bytes())
    }

    /// Where the transcript of the file `sha256` is cached: `transcripts/<sha256>`.
    fn transcript_path(&self, sha256: &str) -> Option<PathBuf> {
        self.path(sha256)?;
        Some(self.dir.join(TRANSCRIPTS).join(sha256))
    }

    /// The cached transcript of the stored file `sha256` (crates/agent/src/backend/
    /// transcribe.rs), when an earlier run made one: a re-run, a restart or a retry does not
    /// ask the provider again.
    pub fn transcript(&self, sha256: &str) -> Option<String> {
        let bytes = fsio::read_capped(&self.transcript_path(sha256)?, MAX_TRANSCRIPT_BYTES).ok()?;
        String::from_utf8(bytes).ok()
    }

    /// Caches the transcript of the stored file `sha256`: 0600, written to a temporary name
    /// then renamed; pruned with the file ([`Store::prune`]).
    pub fn keep_transcript(&self, sha256: &str, text: &str) -> io::Result<()> {
        let path = self.transcript_path(sha256).ok_or_else(|| io::Error::other("bad hash"))?;
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)?;
        }
        let bytes = text.as_bytes();
        let cut = bytes.len().min(usize::try_from(MAX_TRANSCRIPT_BYTES).unwrap_or(usize::MAX));
        // At a character boundary: the cache reads back as UTF-8.
        let cut = (0..=cut).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
        fsio::atomic_write(&path, &bytes[..cut])
    }

    /// Opens a stored file for reading (a regular file, never through a link), with its size.
    pub fn open(&self, sha256: &str) -> Option<(File, u64)> {
        fsio::open_regular(&self.path(sha256)?).ok()
    }

    /// Streams `body` into the store under the bounds: at most `cap` bytes, done before
    /// `deadline`, never `stall` without a byte. `Err(Refused)` says why for people.
    pub fn put(
        &self,
        body: Box<dyn Read + Send>,
        declared: &str,
        cap: u64,
        deadline: Instant,
        bounds: &Bounds,
    ) -> Result<Stored, Outcome> {
        let refused = |why: String| Outcome::Refused(why);
        let io_err = |e: io::Error| Outcome::Refused(format!("cannot store it: {e}"));
        fs::create_dir_all(&self.dir).map_err(io_err)?;
        let tmp = self.dir.join(format!(".tmp-{}-{}", std::process::id(), unique()));
        let mut file = fsio::create_private(&tmp).map_err(io_err)?;
        let result = copy_bounded(body, &mut file, cap, deadline, bounds.stall);
        let finish = || -> Result<Stored, Outcome> {
            let (sha256, size, head) = result?;
            let sniffed = sniff(&head);
            let kind = match decide_type(declared, sniffed, &bounds.allowed) {
                Err(_) if sniffed.is_none() && bounds.unknown_as_binary => "application/octet-stream".to_owned(),
                other => other.map_err(refused)?,
            };
            file.sync_all().map_err(io_err)?;
            let Some(path) = self.path(&sha256) else { return Err(refused("bad hash".into())) };
            if let Some(parent) = path.parent() {
                fs::create_dir_all(parent).map_err(io_err)?;
            }
            match fs::symlink_metadata(&path) {
                // Already there (another message, or an earlier try): same content by its name.
                Ok(m) if m.is_file() && m.len() == size => {}
                // A link, a FIFO or a damaged file at the name: replaced by the rename.
                _ => fs::rename(&tmp, &path).map_err(io_err)?,
            }
            Ok(Stored { sha256, size, kind })
        };
        let out = finish();
        let _ = fsio::remove_if_exists(&tmp);
        out
    }

    /// Downloads `a` with `open` unless the record of `key` (when there is one) says it is stored already; returns
    /// the outcome, having counted its bytes against `used` (the message's bound).
    pub fn fetch(
        &self,
        key: Option<&str>,
        a: &Attachment,
        bounds: &Bounds,
        started: Instant,
        used: &mut u64,
        open: impl FnOnce(Duration) -> Result<Box<dyn Read + Send>, String>,
    ) -> Outcome {
        if let Some(s) = key.and_then(|k| self.recall(k)) {
            *used += s.size;
            return Outcome::Stored(s);
        }
        let left = bounds.per_message.saturating_sub(*used);
        let cap = bounds.per_file.min(left);
        if let Some(size) = a.size
            && size > cap
        {
            return Outcome::Refused(too_large(size, bounds, *used));
        }
        let deadline = started + bounds.total;
        let Some(remaining) = deadline.checked_duration_since(Instant::now()) else {
            return Outcome::Refused(format!("the download took longer than {} s", bounds.total.as_secs()));
        };
        let body = match open(remaining) {
            Ok(b) => b,
            Err(e) => return Outcome::Refused(format!("cannot download it: {e}")),
        };
        match self.put(body, &a.declared, cap, deadline, bounds) {
            Ok(s) => {
                *used += s.size;
                // Best-effort: without the record a redelivery downloads again, and finds the
                // same content address.
                if let Some(k) = key {
                    let _ = self.remember(k, &s);
                }
                Outcome::Stored(s)
            }
            Err(Outcome::Refused(why)) if why == OVER_CAP => Outcome::Refused(too_large(cap + 1, bounds, *used)),
            Err(o) => o,
        }
    }

    /// Removes stored files `keep` (hashes) does not name, and event records, once older than
    /// `min_age` (a younger one may belong to a message not journaled yet): the retention
    /// sweep, refcounted by hash (a file two messages share stays while one of them does).
    /// Returns how many files went.
    pub fn prune(&self, keep: &std::collections::HashSet<String>, min_age: Duration) -> u64 {
        let old = |e: &fs::DirEntry| {
            e.metadata()
                .ok()
                .and_then(|m| m.modified().ok())
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|a| a >= min_age)
        };
        let mut removed = 0;
        let Ok(top) = fs::read_dir(&self.dir) else { return 0 };
        for d in top.flatten() {
            let name = d.file_name().to_string_lossy().into_owned();
            if !d.file_type().is_ok_and(|t| t.is_dir()) {
                // A temporary file a killed download left.
                if name.starts_with(".tmp-") && old(&d) && fsio::remove_if_exists(&d.path()).unwrap_or(false) {
                    removed += 1;
                }
                continue;
            }
            let Ok(files) = fs::read_dir(d.path()) else { continue };
            for f in files.flatten() {
                let file = f.file_name().to_string_lossy().into_owned();
                let named = match name.as_str() {
                    "events" => false,
                    // A transcript stays while its file does.
                    TRANSCRIPTS => keep.contains(&file),
                    _ => keep.contains(&format!("{name}{file}")),
                };
                if !named && old(&f) && fsio::remove_if_exists(&f.path()).unwrap_or(false) {
                    removed += 1;
                }
            }
        }
        removed
    }
}

const OVER_CAP: &str = "over the cap";

/// The folder of cached transcripts in the store.
const TRANSCRIPTS: &str = "transcripts";
/// The largest transcript cached (a long recording's; the agent gets less).
const MAX_TRANSCRIPT_BYTES: u64 = 1 << 20;

fn too_large(size: u64, bounds: &Bounds, used: u64) -> String {
    if size > bounds.per_file {
        format!("too large ({} > {} a file)", human_size(size), human_size(bounds.per_file))
    } else {
        format!(
            "too large ({} with {} before it > {} a message)",
            human_size(size),
            human_size(used),
            human_size(bounds.per_message)
        )
    }
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// Copies `body` to `out` through a bounded channel fed by a reader thread, hashing as it goes:
/// `(sha256, size, first bytes)`. The reader thread ends at the body's end or error, or at its
/// next chunk once the receiver is gone (the protocol's own request timeout bounds a reader
/// that never returns).
fn copy_bounded(
    mut body: Box<dyn Read + Send>,
    out: &mut File,
    cap: u64,
    deadline: Instant,
    stall: Duration,
) -> Result<(String, u64, Vec<u8>), Outcome> {
    let (tx, rx) = mpsc::sync_channel::<io::Result<Vec<u8>>>(CHANNEL_CHUNKS);
    let spawned = std::thread::Builder::new().name("attachment-read".into()).spawn(move || {
        loop {
            let mut buf = vec![0; CHUNK];
            let r = body.read(&mut buf).map(|n| {
                buf.truncate(n);
                buf
            });
            let end = r.as_ref().map_or(true, Vec::is_empty);
            if tx.send(r).is_err() || end {
                return;
            }
        }
    });
    if let Err(e) = spawned {
        return Err(Outcome::Refused(format!("cannot download it: {e}")));
    }
    let mut hash = sha2::Sha256::new();
    let (mut size, mut head) = (0u64, Vec::new());
    loop {
        let Some(left) = deadline.checked_duration_since(Instant::now()) else {
            return Err(Outcome::Refused("the download took too long".into()));
        };
        let chunk = match rx.recv_timeout(left.min(stall)) {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(Outcome::Refused(format!("the download failed: {e}"))),
            Err(mpsc::RecvTimeoutError::Timeout) if left <= stall => {
                return Err(Outcome::Refused("the download took too long".into()));
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                return Err(Outcome::Refused(format!("the download stalled ({} s without data)", stall.as_secs())));
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(Outcome::Refused("the download failed".into()));
            }
        };
        if chunk.is_empty() {
            break;
        }
        size += chunk.len() as u64;
        if size > cap {
            return Err(Outcome::Refused(OVER_CAP.into()));
        }
        if head.len() < SNIFF_BYTES {
            let take = (SNIFF_BYTES - head.len()).min(chunk.len());
            head.extend_from_slice(&chunk[..take]);
        }
        hash.update(&chunk);
        out.write_all(&chunk).map_err(|e| Outcome::Refused(format!("cannot store it: {e}")))?;
    }
    let sha256 = hash.finalize().iter().map(|b| format!("{b:02x}")).collect();
    Ok((sha256, size, head))
}

/// One line naming an attachment in the journaled text, for the agent and for people:
/// `[attachment: photo.jpg, image/jpeg, 12.0 KB, sha256:ab…]` or
/// `[attachment refused: x.png: declared image/png but the content is application/zip]`.
/// The agent side reads the stored ones back with [`parse_line`].
pub fn line(a: &Attachment) -> String {
    // Every part is the platform's or the sender's words: kept to one line, so no part can
    // start a line of its own that would pass for a stored file.
    match &a.outcome {
        Some(Outcome::Stored(s)) => {
            format!("[attachment: {}, {}, {}, sha256:{}]", clean(&a.name), clean(&s.kind), human_size(s.size), s.sha256)
        }
        Some(Outcome::Refused(why)) => format!("[attachment refused: {}: {}]", clean(&a.name), one_line(why)),
        None => format!("[attachment not downloaded: {}]", clean(&a.name)),
    }
}

/// `s` on one line: line breaks become spaces.
fn one_line(s: &str) -> String {
    s.chars().map(|c| if c.is_control() { ' ' } else { c }).collect()
}

/// A name or type safe inside [`line`]: one line, no brackets or commas.
fn clean(name: &str) -> String {
    let s: String = one_line(name).chars().map(|c| if matches!(c, '[' | ']' | ',') { '_' } else { c }).collect();
    if s.trim().is_empty() { "file".into() } else { s }
}

/// A stored attachment named in a journaled text: `(name, type, sha256)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named {
    pub name: String,
    pub kind: String,
    pub sha256: String,
}

/// The stored attachments a journaled text names ([`line`]), in order.
pub fn parse_lines(text: &str) -> Vec<Named> {
    // Split as `resolve` and `escape_text` split: on `\n` only (a `\r` before it stays, and
    // such a line is no attachment line).
    text.split('\n').filter_map(parse_line).collect()
}

/// One line of [`line`]'s form, exactly (a user's own text never starts a line so:
/// [`escape_text`]).
pub fn parse_line(l: &str) -> Option<Named> {
    let inner = l.strip_prefix("[attachment: ")?.strip_suffix(']')?;
    let mut parts = inner.split(", ");
    let name = parts.next()?.to_owned();
    let kind = parts.next()?.to_owned();
    let _size = parts.next()?;
    let sha256 = parts.next()?.strip_prefix("sha256:")?.to_owned();
    let hex = sha256.len() == 64 && sha256.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    (parts.next().is_none() && hex).then_some(Named { name, kind, sha256 })
}

/// The message's own text with every line that could pass for one of [`line`]'s escaped (a
/// leading `\\`), so a sender cannot name a stored file they did not send.
pub fn escape_text(text: &str) -> String {
    if !text.contains("[attachment: ") {
        return text.to_owned();
    }
    text.split('\n')
        .map(|l| if parse_line(l).is_some() { format!("\\{l}") } else { l.to_owned() })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A stored file a journaled text names, found in `store`: its line's name and type, the
/// content hash the store keys it by, and where and how big it is there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub name: String,
    pub kind: String,
    /// Its identity in the store ([`Store::path`], [`Store::transcript`]).
    pub sha256: String,
    pub path: PathBuf,
    pub size: u64,
}

/// Splits a journaled text into the text without its stored-attachment lines and the files
/// those lines name that are still in `store` (a file pruned since is named in the text
/// instead).
pub fn resolve(store: &Store, text: &str) -> (String, Vec<Resolved>) {
    let mut files = Vec::new();
    let mut kept = Vec::new();
    for l in text.split('\n') {
        match parse_line(l).and_then(|n| store.open(&n.sha256).map(|(_, size)| (n, size))) {
            Some((n, size)) => {
                if let Some(path) = store.path(&n.sha256) {
                    files.push(Resolved { name: n.name, kind: n.kind, sha256: n.sha256, path, size });
                }
            }
            None => kept.push(l),
        }
    }
    (kept.join("\n"), files)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(b: &[u8]) -> Box<dyn Read + Send> {
        Box::new(io::Cursor::new(b.to_vec()))
    }

    const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR rest of a png";

    #[test]
    fn sniffing_knows_the_common_types() {
        assert_eq!(sniff(PNG), Some("image/png"));
        assert_eq!(sniff(b"\xff\xd8\xff\xe0xx"), Some("image/jpeg"));
        assert_eq!(sniff(b"PK\x03\x04zip"), Some("application/zip"));
        assert_eq!(sniff(b"OggS\0"), Some("audio/ogg"));
        assert_eq!(sniff(b"\0\0\0\x18ftypmp42"), Some("video/mp4"));
        assert_eq!(sniff(b"RIFF\0\0\0\0WEBPVP8"), Some("image/webp"));
        assert_eq!(sniff("héllo".as_bytes()), Some("text/plain"));
        assert_eq!(sniff(&"é".as_bytes()[..1]), Some("text/plain"), "a character cut at the end");
        assert_eq!(sniff(b"\0\x01\x02"), None);
        assert_eq!(sniff(b""), None);
    }

    #[test]
    fn a_declared_type_the_content_contradicts_is_refused() {
        assert_eq!(decide_type("image/png", Some("image/png"), &[]).unwrap(), "image/png");
        let zip = decide_type("image/png", Some("application/zip"), &[]).unwrap_err();
        assert!(zip.contains("application/zip"), "{zip}");
        assert_eq!(decide_type("text/csv", Some("text/plain"), &[]).unwrap(), "text/csv");
        assert_eq!(decide_type("audio/mp4", Some("video/mp4"), &[]).unwrap(), "audio/mp4");
        assert_eq!(decide_type("", Some("image/jpeg"), &[]).unwrap(), "image/jpeg");
        assert_eq!(decide_type("image/jpeg", Some("image/png"), &[]).unwrap(), "image/png", "the content says which");
        assert!(decide_type("image/jpeg", None, &[]).is_err());
        assert!(decide_type("application/pdf", Some("application/pdf"), &["image/".into()]).is_err());
    }

    #[test]
    fn files_are_stored_by_content_privately_and_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path().join("attachments"));
        let b = Bounds::default();
        let a =
            Attachment { name: "p.png".into(), declared: "image/png".into(), fetch: "x".into(), ..Default::default() };
        let mut used = 0;
        let opened = std::cell::Cell::new(0);
        let get = |used: &mut u64| {
            store.fetch(Some("tg/1/0"), &a, &b, Instant::now(), used, |_| {
                opened.set(opened.get() + 1);
                Ok(body(PNG))
            })
        };
        let Outcome::Stored(s) = get(&mut used) else { panic!("not stored") };
        assert_eq!((s.size, s.kind.as_str(), used), (PNG.len() as u64, "image/png", PNG.len() as u64));
        assert_eq!(s.sha256, crate::sha256_hex(PNG));
        let path = store.path(&s.sha256).unwrap();
        assert_eq!(fs::read(&path).unwrap(), PNG);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        }
        assert_eq!(get(&mut used), Outcome::Stored(s.clone()), "recalled");
        assert_eq!(opened.get(), 1, "a redelivered event downloads nothing twice");
        assert!(
            parse_lines(&line(&Attachment { outcome: Some(Outcome::Stored(s.clone())), ..a.clone() }))
                .iter()
                .any(|n| n.sha256 == s.sha256 && n.kind == "image/png" && n.name == "p.png")
        );
        let journaled = format!(
            "look\n[attachment: x, image/png, 1 B, sha256:{}]\n{}",
            "0".repeat(64),
            line(&Attachment { outcome: Some(Outcome::Stored(s.clone())), ..a.clone() })
        );
        let (text, files) = resolve(&store, &journaled);
        assert_eq!(
            text,
            format!("look\n[attachment: x, image/png, 1 B, sha256:{}]", "0".repeat(64)),
            "a file not in the store stays named"
        );
        let want = Resolved {
            name: "p.png".into(),
            kind: "image/png".into(),
            sha256: s.sha256.clone(),
            path: path.clone(),
            size: PNG.len() as u64,
        };
        assert_eq!(files, vec![want]);
        // The sender's words cannot break a line of ours.
        let evil = Attachment {
            name: format!("x]\n[attachment: p.png, image/png, 1 B, sha256:{}", s.sha256),
            outcome: Some(Outcome::Refused(format!(
                "declared a\n[attachment: p.png, image/png, 1 B, sha256:{}]",
                s.sha256
            ))),
            ..a.clone()
        };
        assert!(parse_lines(&line(&evil)).is_empty(), "{}", line(&evil));
        let spoof = escape_text(&format!("hi\n[attachment: p.png, image/png, 1 B, sha256:{}]", s.sha256));
        assert!(resolve(&store, &spoof).1.is_empty(), "a sender's own line names nothing: {spoof}");
        // No temporary file is left behind.
        let names: Vec<_> = fs::read_dir(store.dir()).unwrap().flatten().map(|e| e.file_name()).collect();
        assert!(names.iter().all(|n| !n.to_string_lossy().starts_with(".tmp")), "{names:?}");
        // A transcript is cached beside it, privately, and read back.
        assert_eq!(store.transcript(&s.sha256), None);
        store.keep_transcript(&s.sha256, "call me back").unwrap();
        assert_eq!(store.transcript(&s.sha256).as_deref(), Some("call me back"));
        assert!(store.keep_transcript("../x", "no").is_err(), "only a hash names a transcript");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let t = store.dir().join(TRANSCRIPTS).join(&s.sha256);
            assert_eq!(fs::metadata(t).unwrap().permissions().mode() & 0o777, 0o600);
        }
        // Retention: kept while named, removed once not (the transcript with its file).
        let keep = std::iter::once(s.sha256.clone()).collect();
        assert_eq!(store.prune(&Default::default(), Duration::from_secs(3600)), 0, "too young");
        assert_eq!(store.prune(&keep, Duration::ZERO), 1, "the event record, not the file");
        assert!(path.exists());
        assert!(store.transcript(&s.sha256).is_some());
        assert_eq!(store.prune(&Default::default(), Duration::ZERO), 2);
        assert!(!path.exists());
        assert_eq!(store.transcript(&s.sha256), None);
    }

    #[test]
    fn oversized_wrong_and_stalled_downloads_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path().to_owned());
        let b = Bounds { per_file: 100, per_message: 150, stall: Duration::from_millis(200), ..Bounds::default() };
        let a = |declared: &str, size| Attachment {
            name: "f".into(),
            declared: declared.into(),
            size,
            fetch: "x".into(),
            outcome: None,
        };
        let mut used = 0;
        let why = |o: Outcome| match o {
            Outcome::Refused(w) => w,
            Outcome::Stored(s) => panic!("stored {s:?}"),
        };
        let declared_big = store.fetch(Some("k1"), &a("text/plain", Some(101)), &b, Instant::now(), &mut used, |_| {
            panic!("an oversized declared size is not downloaded")
        });
        assert!(why(declared_big).contains("too large"));
        let streamed_big =
            store.fetch(Some("k2"), &a("text/plain", None), &b, Instant::now(), &mut used, |_| Ok(body(&[b'a'; 101])));
        assert!(why(streamed_big).contains("too large"));
        let zip = store
            .fetch(Some("k3"), &a("image/png", None), &b, Instant::now(), &mut used, |_| Ok(body(b"PK\x03\x04zz")));
        assert!(why(zip).contains("application/zip"));
        // A body that never sends a byte.
        struct Stall;
        impl Read for Stall {
            fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
                std::thread::sleep(Duration::from_secs(2));
                Ok(0)
            }
        }
        let stalled =
            store.fetch(Some("k4"), &a("text/plain", None), &b, Instant::now(), &mut used, |_| Ok(Box::new(Stall)));
        assert!(why(stalled).contains("stalled"));
        assert_eq!(used, 0);
        // The message bound counts what came before.
        let ok =
            store.fetch(Some("k5"), &a("text/plain", None), &b, Instant::now(), &mut used, |_| Ok(body(&[b'a'; 90])));
        assert!(matches!(ok, Outcome::Stored(_)));
        let second = store
            .fetch(Some("k6"), &a("text/plain", Some(90)), &b, Instant::now(), &mut used, |_| panic!("not fetched"));
        assert!(why(second).contains("a message"));
    }
}
