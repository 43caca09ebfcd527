//! Notices: what a chat is told besides its replies.
//!
//! - During a drain, the first refused message of each chat gets one notice saying whether
//!   the gateway restarts or stops ([`Notices::restarting_notice`]).
//! - After a chat `/restart`, the next incarnation tells the requester's chat it is back
//!   ([`RESTART_NOTIFY_FILE`], [`back_online`]).
//! - `/update`'s outcome: `gatewarden update --chat` leaves `<prefix><pid>.json`
//!   (`{chat_id, platform?, text}`) in the home ([`UPDATE_NOTIFY_PREFIX`]); whichever
//!   incarnation is asked for that HTTP chat's notices, or relays platform notices to the
//!   outbox, claims it with one rename, so it is delivered exactly once.
//!
//! HTTP chats collect their notices with their next reply or `/v1/notices`; platform chats get
//! theirs through the journal's outbox, which survives a restart.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gatewarden_journal::Store;
use gatewarden_lifecycle::{fsio, timefmt};
use serde_json::{Value, json};

use crate::intake::Wake;

/// The prefix of `/update`'s outcome notice files (module notes), which `update` writes.
pub use gatewarden_lifecycle::home::UPDATE_NOTIFY_PREFIX;
/// How often an incarnation with chat platforms looks for `/update` notices to relay.
const NOTICE_POLL: Duration = Duration::from_millis(500);
/// The file a `/restart` leaves for the next incarnation's "back online" notice.
pub const RESTART_NOTIFY_FILE: &str = ".restart_notify.json";

/// The HTTP chats' pending notices and the drain's notice bookkeeping.
#[derive(Debug)]
pub struct Notices {
    /// Chats told about this drain already.
    noticed: Mutex<HashSet<String>>,
    pending: Mutex<HashMap<String, Vec<String>>>,
    /// Set when the main loop decides how this incarnation ends: a restart comes back, a stop
    /// does not, and the notice says which.
    restarting: AtomicBool,
}

impl Default for Notices {
    fn default() -> Self {
        Notices {
            noticed: Mutex::new(HashSet::new()),
            pending: Mutex::new(HashMap::new()),
            restarting: AtomicBool::new(true),
        }
    }
}

impl Notices {
    /// Records whether this drain ends in a restart (the default) or a stop.
    pub fn set_restarting(&self, restarting: bool) {
        self.restarting.store(restarting, Ordering::Relaxed);
    }

    /// Whether this drain ends in a restart (set when the main loop decides).
    pub fn restarting(&self) -> bool {
        self.restarting.load(Ordering::Relaxed)
    }

    /// A new drain: every chat is told again.
    pub fn reset_for_drain(&self) {
        self.noticed.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    /// The first drain notice for `chat` in this drain, `None` afterwards.
    pub fn restarting_notice(&self, chat: &str) -> Option<String> {
        let first = self.noticed.lock().unwrap_or_else(|p| p.into_inner()).insert(chat.to_owned());
        first.then(|| {
            if self.restarting.load(Ordering::Relaxed) {
                "the gateway is restarting; send your message again in a moment".to_string()
            } else {
                "the gateway is stopping; your message was not processed".to_string()
            }
        })
    }

    pub fn push(&self, chat: &str, text: String) {
        self.pending.lock().unwrap_or_else(|p| p.into_inner()).entry(chat.to_owned()).or_default().push(text);
    }

    /// An HTTP chat's notices, its `/update` outcome among them; each is handed out once.
    pub fn take(&self, home: &Path, chat: &str) -> Vec<String> {
        let mut out = self.pending.lock().unwrap_or_else(|p| p.into_inner()).remove(chat).unwrap_or_default();
        for n in claim_update_notices(home, |n| n.platform.is_none() && n.chat == chat) {
            n.done();
            out.push(n.text);
        }
        out
    }
}

/// A chat `/restart`: remembers who asked, for the next incarnation's [`back_online`].
pub fn record_restart_requester(home: &Path, chat_id: &str, user_id: &str, platform: Option<&str>, incarnation: &str) {
    let note = json!({"chat_id": chat_id, "user_id": user_id, "platform": platform, "requested_at": timefmt::now(), "incarnation": incarnation});
    if let Err(e) = fsio::write_json(&home.join(RESTART_NOTIFY_FILE), &note) {
        crate::warn!("cannot record the restart requester: {e}");
    }
}

/// A refused restart: the next incarnation owes the chat no "back online".
pub fn forget_restart_requester(home: &Path, incarnation: &str) {
    let path = home.join(RESTART_NOTIFY_FILE);
    let ours = fsio::read_json::<Value>(&path)
        .ok()
        .is_some_and(|v| v.get("incarnation").and_then(Value::as_str) == Some(incarnation));
    if ours {
        let _ = fsio::remove_if_exists(&path);
    }
}

/// At boot: turns a predecessor's `/restart` record into one "back online" notice, for an HTTP
/// chat in `notices`, for a platform chat in the outbox.
pub fn back_online(home: &Path, incarnation: &str, notices: &Notices, journal: &dyn Store, wake: &Wake) {
    let path = home.join(RESTART_NOTIFY_FILE);
    let Some(v) = fsio::read_json::<Value>(&path).ok() else {
        let _ = fsio::remove_if_exists(&path);
        return;
    };
    if v.get("incarnation").and_then(Value::as_str) == Some(incarnation) {
        return; // our own, written just now
    }
    let _ = fsio::remove_if_exists(&path);
    if let Some(chat) = v.get("chat_id").and_then(Value::as_str) {
        let text = format!("back online: gatewarden {}, incarnation {incarnation}", gatewarden_lifecycle::VERSION);
        match v.get("platform").and_then(Value::as_str) {
            // Asked from a chat platform: the notice goes to that chat, through the outbox.
            Some(p) => match journal.enqueue(p, chat, &text) {
                Ok(_) => wake.wake(p),
                Err(e) => crate::warn!("cannot queue the back-online notice for {p}: {e}"),
            },
            None => notices.push(chat, text),
        }
    }
}

/// `/update`'s outcome notices for platform chats: the updater leaves them in the home while
/// some incarnation (the new one, or the old one after a rollback) runs, so every incarnation
/// with platforms looks for them every [`NOTICE_POLL`] and queues each one, claimed by one
/// rename, in the outbox (which survives a restart).
pub fn relay_update_notices(home: std::path::PathBuf, journal: Arc<dyn Store>, wake: Wake) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(NOTICE_POLL);
        loop {
            tick.tick().await;
            let (home, journal, wake) = (home.clone(), Arc::clone(&journal), wake.clone());
            let _ = tokio::task::spawn_blocking(move || {
                for n in claim_update_notices(&home, |n| n.platform.is_some()) {
                    let p = n.platform.clone().unwrap_or_default();
                    // Durable in the outbox before the file goes; a journal error puts it back
                    // for the next look.
                    match journal.enqueue(&p, &n.chat, &n.text) {
                        Ok(_) => {
                            n.done();
                            wake.wake(&p);
                        }
                        Err(e) => {
                            crate::warn!("cannot queue the /update notice for {p}: {e}");
                            n.unclaim();
                        }
                    }
                }
            })
            .await;
        }
    });
}

/// One claimed `/update` outcome notice (`.update_notify.<pid>.json`, written by
/// `gatewarden update --chat`).
struct UpdateNotice {
    /// The adapter whose chat asked; `None` for an HTTP chat.
    platform: Option<String>,
    chat: String,
    text: String,
    /// Where it was, and where it is while claimed (no other claimer looks there).
    path: std::path::PathBuf,
    claimed: std::path::PathBuf,
}

impl UpdateNotice {
    /// Delivered (or durably queued): the file goes.
    fn done(&self) {
        let _ = std::fs::remove_file(&self.claimed);
    }

    /// Not delivered: back where the next look finds it.
    fn unclaim(&self) {
        let _ = std::fs::rename(&self.claimed, &self.path);
    }
}

/// Claims (renames away) the `/update` outcome notices that `want` picks; the caller removes
/// each once it is delivered ([`UpdateNotice::done`]).
fn claim_update_notices(home: &Path, want: impl Fn(&UpdateNotice) -> bool) -> Vec<UpdateNotice> {
    let Ok(dir) = std::fs::read_dir(home) else { return Vec::new() };
    let mut out = Vec::new();
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with(UPDATE_NOTIFY_PREFIX) || !name.ends_with(".json") {
            continue;
        }
        let Some(v) = fsio::read_json::<Value>(&entry.path()).ok() else { continue };
        let field = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
        let n = UpdateNotice {
            platform: field("platform"),
            chat: field("chat_id").unwrap_or_default(),
            text: field("text").unwrap_or_default(),
            path: entry.path(),
            claimed: home.join(format!(".claimed{name}")),
        };
        if want(&n) && std::fs::rename(&n.path, &n.claimed).is_ok() {
            out.push(n);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// HTTP chats collect only their own notices, the platform relay only platform ones; a
    /// claimed notice is seen by nobody else, and an undelivered one comes back.
    #[test]
    fn update_notices_are_claimed_by_their_transport_once() {
        let home = tempfile::tempdir().unwrap();
        let write = |pid: u32, v: Value| {
            fsio::write_json(&home.path().join(format!("{UPDATE_NOTIFY_PREFIX}{pid}.json")), &v).unwrap();
        };
        write(1, json!({"chat_id": "A", "text": "http A"}));
        write(2, json!({"chat_id": "7", "platform": "telegram", "text": "tg 7"}));
        write(3, json!({"chat_id": "B", "platform": null, "text": "http B"}));
        let http_a = claim_update_notices(home.path(), |n| n.platform.is_none() && n.chat == "A");
        assert_eq!(http_a.iter().map(|n| n.text.as_str()).collect::<Vec<_>>(), ["http A"]);
        http_a[0].done();
        let relay = claim_update_notices(home.path(), |n| n.platform.is_some());
        assert_eq!(relay.len(), 1);
        assert_eq!((relay[0].platform.as_deref(), relay[0].chat.as_str()), (Some("telegram"), "7"));
        assert!(claim_update_notices(home.path(), |n| n.platform.is_some()).is_empty(), "claimed once");
        relay[0].unclaim();
        let again = claim_update_notices(home.path(), |n| n.platform.is_some());
        assert_eq!(again.len(), 1, "an undelivered notice comes back");
        again[0].done();
        assert!(claim_update_notices(home.path(), |n| n.platform.is_some()).is_empty());
        let left: Vec<String> =
            std::fs::read_dir(home.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        assert_eq!(left, [format!("{UPDATE_NOTIFY_PREFIX}3.json")], "only chat B's notice is left");
    }

    /// One drain notice per chat per drain, saying restart or stop.
    #[test]
    fn one_drain_notice_per_chat_per_drain() {
        let n = Notices::default();
        assert!(n.restarting_notice("A").is_some_and(|t| t.contains("restarting")));
        assert_eq!(n.restarting_notice("A"), None);
        n.set_restarting(false);
        assert!(n.restarting_notice("B").is_some_and(|t| t.contains("stopping")));
        n.reset_for_drain();
        assert!(n.restarting_notice("A").is_some());
    }
}
