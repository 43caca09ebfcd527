//! The pairing book: per platform (adapter name), the pending codes and the approved senders
//! (docs/protocol.md §1, `pairing.json`). Pure data and its rules ([`Book`]), and where it is
//! kept ([`Keeper`]): the home's `pairing.json` (0600, written atomically, read-modify-write
//! under the `pairing.lock` OS lock, so the gateway and an offline `gatewarden pairing` never
//! lose each other's decisions), or, with `[cluster]`, the cluster's shared store, which a
//! promoted standby reads (its home has no file of the active's).
//!
//! Only the sender's id and chat are kept, never what a stranger wrote.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use gatewarden_journal::Store;
use gatewarden_lifecycle::fsio::{self, ReadOutcome};
use gatewarden_lifecycle::timefmt;
use serde::{Deserialize, Serialize};

/// The book's file in the home.
pub const FILE: &str = "pairing.json";
/// Serialises read-modify-write of [`FILE`]; never deleted (see lifecycle's `lock.rs`).
pub const LOCK_FILE: &str = "pairing.lock";
/// A code's length and its alphabet: capital letters and digits without look-alikes (no
/// 0/O, 1/I/L).
pub const CODE_LEN: usize = 8;
pub const ALPHABET: &[u8] = b"ABCDEFGHJKMNPQRSTUVWXYZ23456789";
/// How long a code is valid.
pub const CODE_TTL: Duration = Duration::from_secs(3600);
/// A sender with a pending code is answered again at most this often.
pub const REPLY_EVERY: Duration = Duration::from_secs(600);
/// Pending codes per platform at most; past it nothing new is issued.
pub const MAX_PENDING: usize = 3;
/// Approved senders per platform at most (the file stays small; more belong in
/// `allowed_users`).
pub const MAX_APPROVED: usize = 10_000;
/// The file's size cap (well above [`MAX_APPROVED`] entries of every platform of a home).
const MAX_FILE_BYTES: u64 = 16 << 20;
/// How long a writer waits for [`LOCK_FILE`].
const LOCK_PATIENCE: Duration = Duration::from_secs(5);

/// The whole book.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Book {
    #[serde(default = "version")]
    pub v: u32,
    #[serde(default)]
    pub platforms: BTreeMap<String, Entries>,
}

fn version() -> u32 {
    1
}

/// One platform's decisions.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entries {
    #[serde(default)]
    pub approved: Vec<Approved>,
    #[serde(default)]
    pub pending: Vec<Pending>,
}

/// A sender the owner approved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Approved {
    pub user: String,
    /// RFC 3339.
    pub approved_at: String,
    /// Who decided (`cli`, `dashboard`, `chat telegram 101`, …).
    pub by: String,
}

/// A code handed to an unknown sender, waiting for the owner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pending {
    pub code: String,
    pub user: String,
    /// The direct chat it was sent to (told when the sender is approved).
    pub chat: String,
    /// RFC 3339, as every time here.
    pub issued_at: String,
    pub expires_at: String,
    /// When the sender was last answered (the code, or a reminder of it).
    pub replied_at: String,
}

impl Pending {
    pub fn expires(&self) -> Option<SystemTime> {
        timefmt::parse(&self.expires_at)
    }

    /// Unreadable times count as expired: a damaged entry frees its slot.
    pub fn live(&self, now: SystemTime) -> bool {
        self.expires().is_some_and(|t| t > now)
    }

    fn replied(&self) -> Option<SystemTime> {
        timefmt::parse(&self.replied_at)
    }

    /// Whether the sender may be answered again (a reminder).
    pub fn may_remind(&self, now: SystemTime) -> bool {
        self.replied().is_none_or(|t| now.duration_since(t).unwrap_or_default() >= REPLY_EVERY)
    }
}

/// Why a decision could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PairingError {
    #[error("no pending code {code} on {platform} (codes are valid for 1 hour; `gatewarden pairing list` shows them)")]
    UnknownCode { platform: String, code: String },
    #[error("{user} is not an approved sender of {platform}{hint}")]
    NotApproved { platform: String, user: String, hint: String },
    #[error("{platform} has {MAX_APPROVED} approved senders already; list the rest in allowed_users")]
    Full { platform: String },
    #[error("the pairing book: {0}")]
    Keep(String),
}

/// Ids compared as the platform compares them: case-insensitively where it folds case (IRC
/// nicks, XMPP JIDs, email addresses).
pub fn same(fold: bool, a: &str, b: &str) -> bool {
    if fold { a.eq_ignore_ascii_case(b) } else { a == b }
}

/// Whether `code` has a code's shape (any case): 8 characters of [`ALPHABET`]. Chat `/approve`
/// tells a pairing code from a hermes approval's words by it.
pub fn is_code(code: &str) -> bool {
    code.len() == CODE_LEN && code.bytes().all(|b| ALPHABET.contains(&b.to_ascii_uppercase()))
}

/// A fresh code from the OS's random source (rejection sampling: every character equally
/// likely). `None` when the OS gives no randomness (no code is issued then).
pub fn new_code() -> Option<String> {
    let limit = (256 / ALPHABET.len() * ALPHABET.len()) as u8;
    let mut out = String::with_capacity(CODE_LEN);
    let mut buf = [0u8; 32];
    while out.len() < CODE_LEN {
        getrandom::fill(&mut buf).ok()?;
        for b in buf {
            if b < limit && out.len() < CODE_LEN {
                out.push(char::from(ALPHABET[usize::from(b) % ALPHABET.len()]));
            }
        }
    }
    Some(out)
}

impl Entries {
    pub fn is_approved(&self, fold: bool, user: &str) -> bool {
        self.approved.iter().any(|a| same(fold, &a.user, user))
    }

    /// The sender's code, if it is still valid.
    pub fn pending_of(&self, fold: bool, user: &str, now: SystemTime) -> Option<&Pending> {
        self.pending.iter().find(|p| same(fold, &p.user, user) && p.live(now))
    }

    /// Codes still valid.
    pub fn live_pending(&self, now: SystemTime) -> usize {
        self.pending.iter().filter(|p| p.live(now)).count()
    }

    /// Forgets expired codes; whether any went.
    pub fn prune(&mut self, now: SystemTime) -> bool {
        let before = self.pending.len();
        self.pending.retain(|p| p.live(now));
        self.pending.len() != before
    }

    /// Issues `code` to `user` in `chat` (the caller decided there is room).
    pub fn issue(&mut self, code: String, user: &str, chat: &str, now: SystemTime) -> Pending {
        self.prune(now);
        let p = Pending {
            code,
            user: user.to_owned(),
            chat: chat.to_owned(),
            issued_at: timefmt::format(now),
            expires_at: timefmt::format(now + CODE_TTL),
            replied_at: timefmt::format(now),
        };
        self.pending.push(p.clone());
        p
    }

    /// The sender was answered again (a reminder of its code).
    pub fn reminded(&mut self, fold: bool, user: &str, now: SystemTime) {
        if let Some(p) = self.pending.iter_mut().find(|p| same(fold, &p.user, user) && p.live(now)) {
            p.replied_at = timefmt::format(now);
        }
    }

    /// Approves the sender holding `code` (any case): its pending entry becomes an approval.
    pub fn approve(&mut self, platform: &str, code: &str, by: &str, now: SystemTime) -> Result<Pending, PairingError> {
        let code = code.trim().to_ascii_uppercase();
        let at = self.pending.iter().position(|p| p.code == code && p.live(now));
        let Some(at) = at else {
            return Err(PairingError::UnknownCode { platform: platform.to_owned(), code });
        };
        let p = self.pending[at].clone();
        if !self.approved.iter().any(|a| a.user == p.user) {
            if self.approved.len() >= MAX_APPROVED {
                return Err(PairingError::Full { platform: platform.to_owned() });
            }
            self.approved.push(Approved { user: p.user.clone(), approved_at: timefmt::format(now), by: by.to_owned() });
        }
        self.pending.retain(|q| q.user != p.user);
        self.prune(now);
        Ok(p)
    }

    /// Takes `user`'s approval back (and any code it holds). `Err` when it had none.
    pub fn revoke(&mut self, fold: bool, platform: &str, user: &str) -> Result<Vec<Approved>, PairingError> {
        let gone: Vec<Approved> = self.approved.iter().filter(|a| same(fold, &a.user, user)).cloned().collect();
        self.pending.retain(|p| !same(fold, &p.user, user));
        if gone.is_empty() {
            return Err(PairingError::NotApproved {
                platform: platform.to_owned(),
                user: user.to_owned(),
                hint: String::new(),
            });
        }
        self.approved.retain(|a| !same(fold, &a.user, user));
        Ok(gone)
    }
}

impl Book {
    /// A platform's entries (empty when it has none).
    pub fn of(&self, platform: &str) -> &Entries {
        static EMPTY: Entries = Entries { approved: Vec::new(), pending: Vec::new() };
        self.platforms.get(platform).unwrap_or(&EMPTY)
    }

    pub fn of_mut(&mut self, platform: &str) -> &mut Entries {
        self.platforms.entry(platform.to_owned()).or_default()
    }

    /// Parses the file's bytes (lenient about unknown fields; a damaged file is an error, never
    /// an empty book: decisions are not silently lost).
    pub fn parse(bytes: &[u8]) -> Result<Book, String> {
        let v = fsio::parse_json_value(bytes)?;
        serde_json::from_value(v).map_err(|e| format!("not a pairing book ({e})"))
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = serde_json::to_vec_pretty(self).unwrap_or_default();
        b.push(b'\n');
        b
    }
}

/// What the home's file looked like when it was last read or written: a change made by
/// someone else (an offline `gatewarden pairing`) is read again before the next decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    len: u64,
    modified: Option<SystemTime>,
}

fn seen(path: &Path) -> Option<Seen> {
    std::fs::symlink_metadata(path).ok().map(|m| Seen { len: m.len(), modified: m.modified().ok() })
}

/// Where the book is kept.
#[derive(Debug, Clone)]
pub enum Where {
    /// The home's `pairing.json`.
    Home(PathBuf),
    /// The cluster's shared store (`gw_access`, docs/protocol.md §8).
    Store(Arc<dyn Store>),
}

/// The book as a running gateway (or the CLI) holds it: a cached copy, read again when the
/// file changed, and every change written through before it counts.
#[derive(Debug)]
pub struct Keeper {
    at: Where,
    cache: Mutex<(Book, Option<Seen>)>,
    /// The last read error, logged once until it changes.
    failing: Mutex<Option<String>>,
}

impl Keeper {
    /// The home's book, read at the first decision (a file that cannot be read then is
    /// logged, and no decision is written over it).
    pub fn home(dir: &Path) -> Keeper {
        Keeper {
            at: Where::Home(dir.join(FILE)),
            cache: Mutex::new((Book::default(), None)),
            failing: Mutex::new(None),
        }
    }

    /// The home's book, read now: a file that cannot be read is an error (the CLI's way).
    pub fn load(dir: &Path) -> Result<Keeper, String> {
        let k = Keeper::home(dir);
        k.refresh()?;
        Ok(k)
    }

    /// The cluster store's book: read at each promotion ([`Keeper::refresh`]), and before
    /// every change.
    pub fn store(store: Arc<dyn Store>) -> Keeper {
        Keeper { at: Where::Store(store), cache: Mutex::new((Book::default(), None)), failing: Mutex::new(None) }
    }

    pub fn describe(&self) -> String {
        match &self.at {
            Where::Home(p) => p.display().to_string(),
            Where::Store(s) => format!("the shared store ({})", s.describe()),
        }
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, (Book, Option<Seen>)> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads the book where it is kept (the store: now; the file: when it changed).
    pub fn refresh(&self) -> Result<(), String> {
        match &self.at {
            Where::Home(path) => {
                let now = seen(path);
                if now.is_some() && now == self.cache().1 {
                    return Ok(());
                }
                let book = read_file(path)?;
                *self.cache() = (book, now);
            }
            Where::Store(s) => {
                let book = read_store(&**s)?;
                // `Seen` marks the store's copy as read.
                *self.cache() = (book, Some(Seen { len: 0, modified: None }));
            }
        }
        Ok(())
    }

    /// `f` on the current book (the file read again first when it changed; a file that cannot
    /// be read keeps the last good copy, and says so once in the log).
    pub fn read<R>(&self, f: impl FnOnce(&Book) -> R) -> R {
        let r = self.refresh_home().err();
        let mut failing = self.failing.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = &r
            && failing.as_ref() != Some(e)
        {
            crate::warn!("cannot read {}: {e}; deciding with the last copy read", self.describe());
        }
        *failing = r;
        drop(failing);
        f(&self.cache().0)
    }

    /// `f` on the copy in hand, reading nothing (`status` from an async task).
    pub fn peek<R>(&self, f: impl FnOnce(&Book) -> R) -> R {
        f(&self.cache().0)
    }

    fn refresh_home(&self) -> Result<(), String> {
        match self.at {
            Where::Home(_) => self.refresh(),
            // The store is read at promotion (and until a read succeeded); its only writer is
            // the active: us.
            Where::Store(_) if self.cache().1.is_some() => Ok(()),
            Where::Store(_) => self.refresh(),
        }
    }

    /// Changes the book: `f` runs on the freshest copy (the file read under its lock) and says
    /// whether it changed anything; a change is written (atomically, 0600; or to the store,
    /// fenced) before this returns, and only then cached.
    pub fn update<R>(&self, f: impl FnOnce(&mut Book) -> (R, bool)) -> Result<R, String> {
        match &self.at {
            Where::Home(path) => {
                let lock_path = path.with_file_name(LOCK_FILE);
                let _lock = gatewarden_lifecycle::InstanceLock::acquire(&lock_path, LOCK_PATIENCE)
                    .map_err(|e| format!("{}: {e}", lock_path.display()))?;
                let mut book = read_file(path)?;
                let (r, changed) = f(&mut book);
                if changed {
                    fsio::atomic_write(path, &book.to_bytes()).map_err(|e| format!("{}: {e}", path.display()))?;
                }
                *self.cache() = (book, seen(path));
                Ok(r)
            }
            Where::Store(s) => {
                // Read first: a change is never made to a copy that missed the store's book (a
                // promotion whose read failed would otherwise write its empty one over it).
                let mut book = read_store(&**s)?;
                let (r, changed) = f(&mut book);
                if changed {
                    let text = String::from_utf8(book.to_bytes()).unwrap_or_default();
                    s.put_access_doc(&text).map_err(|e| e.to_string())?;
                }
                *self.cache() = (book, Some(Seen { len: 0, modified: None }));
                Ok(r)
            }
        }
    }
}

/// The store's book: none yet is an empty book.
fn read_store(s: &dyn Store) -> Result<Book, String> {
    match s.access_doc().map_err(|e| e.to_string())? {
        Some(text) => Book::parse(text.as_bytes()),
        None => Ok(Book::default()),
    }
}

/// The home's file: missing is an empty book; anything unreadable is an error.
fn read_file(path: &Path) -> Result<Book, String> {
    match fsio::read_capped(path, MAX_FILE_BYTES) {
        ReadOutcome::Missing => Ok(Book::default()),
        ReadOutcome::Ok(bytes) => Book::parse(&bytes).map_err(|e| format!("{}: {e}", path.display())),
        ReadOutcome::Unreadable(why) | ReadOutcome::Transient(why) => Err(format!("{}: {why}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + s)
    }

    #[test]
    fn codes_have_the_shape_and_no_look_alikes() {
        for _ in 0..200 {
            let c = new_code().unwrap();
            assert!(is_code(&c), "{c}");
            assert!(!c.contains(['0', 'O', '1', 'I', 'L']), "{c}");
        }
        assert!(is_code("xkgh5n7p"), "any case");
        for bad in ["XKGH5N7", "XKGH5N7PQ", "XKGH0N7P", "XKGH N7P", "yes", ""] {
            assert!(!is_code(bad), "{bad}");
        }
    }

    #[test]
    fn issue_remind_approve_revoke() {
        let mut e = Entries::default();
        let p = e.issue("ABCDEFGH".into(), "102", "102", t(0));
        assert_eq!(e.pending_of(false, "102", t(10)), Some(&p));
        assert!(!p.may_remind(t(599)) && p.may_remind(t(600)), "answered again at most every 10 minutes");
        e.reminded(false, "102", t(600));
        assert!(!e.pending_of(false, "102", t(601)).unwrap().may_remind(t(601)));
        assert_eq!(e.live_pending(t(3599)), 1);
        assert_eq!(e.live_pending(t(3600)), 0, "valid one hour");
        let err = e.approve("telegram", "ZZZZZZZZ", "cli", t(5)).unwrap_err();
        assert!(matches!(err, PairingError::UnknownCode { .. }), "{err}");
        let got = e.approve("telegram", "abcdefgh", "cli", t(5)).unwrap();
        assert_eq!((got.user.as_str(), got.chat.as_str()), ("102", "102"));
        assert!(e.is_approved(false, "102") && e.pending.is_empty());
        assert!(e.approve("telegram", "ABCDEFGH", "cli", t(6)).is_err(), "a code is used once");
        assert_eq!(e.revoke(false, "telegram", "102").unwrap().len(), 1);
        assert!(!e.is_approved(false, "102"));
        assert!(matches!(e.revoke(false, "telegram", "102"), Err(PairingError::NotApproved { .. })));
    }

    #[test]
    fn an_expired_code_cannot_be_approved_and_frees_its_slot() {
        let mut e = Entries::default();
        e.issue("ABCDEFGH".into(), "7", "7", t(0));
        assert!(e.approve("irc", "ABCDEFGH", "cli", t(3600)).is_err());
        assert!(e.prune(t(3600)) && e.pending.is_empty());
    }

    #[test]
    fn ids_fold_case_where_the_platform_does() {
        let mut e = Entries::default();
        e.approved.push(Approved { user: "Alice@Example.org".into(), approved_at: "x".into(), by: "cli".into() });
        assert!(e.is_approved(true, "alice@example.org"));
        assert!(!e.is_approved(false, "alice@example.org"));
    }

    /// The file is kept 0600, written atomically, and read again when someone else changed it.
    #[test]
    fn the_home_file_round_trips_and_changes_are_seen() {
        let dir = tempfile::tempdir().unwrap();
        let k = Keeper::load(dir.path()).unwrap();
        assert_eq!(k.read(|b| b.platforms.len()), 0, "no file: an empty book");
        k.update(|b| {
            b.of_mut("telegram").issue("ABCDEFGH".into(), "102", "102", t(0));
            ((), true)
        })
        .unwrap();
        let path = dir.path().join(FILE);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        }
        // Another writer (an offline CLI) approves it: the keeper reads the change.
        let other = Keeper::load(dir.path()).unwrap();
        other.update(|b| (b.of_mut("telegram").approve("telegram", "ABCDEFGH", "cli", t(1)), true)).unwrap().unwrap();
        assert!(k.read(|b| b.of("telegram").is_approved(false, "102")));
        // A damaged file is an error, never an empty book.
        std::fs::write(&path, b"{not json").unwrap();
        assert!(Keeper::load(dir.path()).is_err());
        assert!(k.update(|_| ((), true)).is_err());
        assert!(k.read(|b| b.of("telegram").is_approved(false, "102")), "the last good copy decides");
    }
}
