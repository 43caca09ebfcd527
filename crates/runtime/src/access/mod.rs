//! Who reaches the agent through a chat platform (README "Access").
//!
//! One pure rule, [`decide`]: a message's [`Facts`] (its sender, a direct chat or a group,
//! whether `allowed_chats` names the chat, whether it addresses the bot), the platform's
//! [`Policy`] and its pairing entries in, a [`Decision`] out: deliver it, pair its sender (a
//! new code, or a reminder of the one it has), or drop it (a [`Refusal`]). The worker asks
//! [`Gate::admit`] at the one place inbound chat messages enter the gateway (worker/intake.rs,
//! `Intake::deliver`), before anything is journaled: a stranger's text is neither journaled
//! nor logged, and only its id and chat go into the pairing book (pairing.rs).
//!
//! The policies are the live settings of every `[[platform]]` ([`Policies`], replaced whole by
//! [`Policies::apply`]: the reload hook), so a decision always uses the configuration in force.

pub mod pairing;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::SystemTime;

use gatewarden_config::{Access, Config, PlatformConfig, PlatformKind};
use gatewarden_lifecycle::timefmt;
use gatewarden_platforms::{ChatKind, Inbound};
use serde_json::{Value, json};

use pairing::{Entries, Keeper, MAX_PENDING, PairingError, Pending, same};

/// One platform's access settings, from its `[[platform]]` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub kind: PlatformKind,
    pub access: Access,
    /// `access` was written in the file (else it is the kind's default: `check` names it).
    pub explicit: bool,
    pub admins: Vec<String>,
    pub allowed_users: Vec<String>,
    pub require_mention: bool,
    /// Every group is served: `access = "open"` with no `allowed_chats`.
    pub any_group: bool,
    /// Sender ids compare case-insensitively (IRC nicks, XMPP JIDs, email addresses).
    pub fold: bool,
}

impl Policy {
    pub fn of(p: &PlatformConfig) -> Policy {
        let access = p.access();
        Policy {
            kind: p.kind(),
            access,
            explicit: p.access.is_some(),
            admins: p.admins.clone(),
            allowed_users: p.allowed_users.clone(),
            require_mention: p.require_mention,
            any_group: access == Access::Open && p.allowed_chats.is_empty(),
            fold: matches!(p.kind(), PlatformKind::Irc | PlatformKind::Xmpp | PlatformKind::Email),
        }
    }

    /// Whether the platform pairs at all (not where a sender can be forged).
    pub fn pairs(&self) -> bool {
        self.access == Access::Pairing && !self.kind.forgeable()
    }

    /// An admin or an `allowed_users` entry (the book's approvals are the other way in).
    pub fn lists(&self, user: &str) -> bool {
        self.admins.iter().chain(&self.allowed_users).any(|a| same(self.fold, a, user))
    }
}

/// What [`decide`] needs of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facts<'a> {
    pub sender: &'a str,
    pub chat: ChatKind,
    /// `allowed_chats` names the chat (the adapter's reading, by the platform's rules).
    pub listed: bool,
    /// It mentions the bot or replies to it.
    pub addressed: bool,
}

impl<'a> Facts<'a> {
    pub fn of(m: &'a Inbound) -> Facts<'a> {
        Facts { sender: &m.user_id, chat: m.chat, listed: m.listed, addressed: m.addressed }
    }
}

/// What becomes of one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// To the agent (or the command rule), as before.
    Deliver,
    /// An unknown sender's direct message on a pairing platform.
    Pair(PairStep),
    /// Nothing reaches the agent, nothing is journaled, nothing is answered.
    Drop(Refusal),
}

/// How an unknown sender is answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PairStep {
    /// A new code (there is room: fewer than [`MAX_PENDING`] pending).
    Issue,
    /// The code it has, once more (its last answer is 10 minutes old).
    Remind { code: String },
}

/// Why a message was dropped: the label of `/metrics`' refused counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Refusal {
    /// A group `allowed_chats` does not name.
    GroupNotAllowed,
    /// A group message that neither mentions nor replies to the bot (`require_mention`).
    NotMentioned,
    /// A sender nobody allowed, where no pairing is offered (allowlist, a group, a platform
    /// whose senders can be forged).
    UnknownSender,
    /// A sender with a code, answered less than 10 minutes ago.
    PairingPending,
    /// A new sender while [`MAX_PENDING`] codes wait: nothing is issued.
    PairingFull,
    /// The pairing book could not be written: nothing was issued.
    PairingUnavailable,
}

impl Refusal {
    pub const ALL: [Refusal; 6] = [
        Refusal::GroupNotAllowed,
        Refusal::NotMentioned,
        Refusal::UnknownSender,
        Refusal::PairingPending,
        Refusal::PairingFull,
        Refusal::PairingUnavailable,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Refusal::GroupNotAllowed => "group_not_allowed",
            Refusal::NotMentioned => "not_mentioned",
            Refusal::UnknownSender => "unknown_sender",
            Refusal::PairingPending => "pairing_pending",
            Refusal::PairingFull => "pairing_full",
            Refusal::PairingUnavailable => "pairing_unavailable",
        }
    }
}

/// The rule (module notes). `entries` are the platform's pairing entries, `now` the clock.
pub fn decide(m: &Facts<'_>, p: &Policy, entries: &Entries, now: SystemTime) -> Decision {
    let known = !m.sender.is_empty() && (p.lists(m.sender) || entries.is_approved(p.fold, m.sender));
    match m.chat {
        ChatKind::Group => {
            if !(m.listed || p.any_group) {
                Decision::Drop(Refusal::GroupNotAllowed)
            } else if p.require_mention && !m.addressed {
                Decision::Drop(Refusal::NotMentioned)
            } else if known || p.access == Access::Open {
                Decision::Deliver
            } else {
                // A group never gets pairing codes.
                Decision::Drop(Refusal::UnknownSender)
            }
        }
        ChatKind::Direct => {
            if known || m.listed || p.access == Access::Open {
                return Decision::Deliver;
            }
            if !p.pairs() || m.sender.is_empty() {
                return Decision::Drop(Refusal::UnknownSender);
            }
            match entries.pending_of(p.fold, m.sender, now) {
                Some(q) if q.may_remind(now) => Decision::Pair(PairStep::Remind { code: q.code.clone() }),
                Some(_) => Decision::Drop(Refusal::PairingPending),
                None if entries.live_pending(now) >= MAX_PENDING => Decision::Drop(Refusal::PairingFull),
                None => Decision::Pair(PairStep::Issue),
            }
        }
    }
}

/// The live access settings of every `[[platform]]`, by adapter name.
#[derive(Debug, Default)]
pub struct Policies(RwLock<Arc<BTreeMap<String, Policy>>>);

impl Policies {
    pub fn new(config: &Config) -> Policies {
        let p = Policies::default();
        p.apply(config);
        p
    }

    /// Replaces every platform's policy with `config`'s: what a reload of the configuration
    /// calls, so the next message is decided by the new `access`, `admins`, `allowed_users`,
    /// `allowed_chats` and `require_mention`.
    pub fn apply(&self, config: &Config) {
        let map: BTreeMap<String, Policy> = config.platform.iter().map(|p| (p.adapter_name(), Policy::of(p))).collect();
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(map);
    }

    pub fn get(&self) -> Arc<BTreeMap<String, Policy>> {
        Arc::clone(&self.0.read().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Which `[[platform]]` a `PLATFORM` argument names: its `name`, else its `kind` when the home
/// has exactly one of that kind. `platforms` are `(name, kind)`.
pub fn resolve<'a>(platforms: impl IntoIterator<Item = (&'a str, &'a str)>, given: &str) -> Result<String, String> {
    let all: Vec<(&str, &str)> = platforms.into_iter().collect();
    if let Some((name, _)) = all.iter().find(|(n, _)| *n == given) {
        return Ok((*name).to_owned());
    }
    let of_kind: Vec<&str> = all.iter().filter(|(_, k)| *k == given).map(|(n, _)| *n).collect();
    match of_kind.as_slice() {
        [one] => Ok((*one).to_owned()),
        [] if all.is_empty() => Err("this home has no [[platform]] table".into()),
        [] => Err(format!(
            "no [[platform]] named {given:?}; this home has {}",
            all.iter().map(|(n, k)| format!("{n} ({k})")).collect::<Vec<_>>().join(", ")
        )),
        many => Err(format!("this home has {} {given} platforms: name one of {}", many.len(), many.join(", "))),
    }
}

/// What the worker does with one inbound message ([`Gate::admit`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Admit {
    Deliver,
    /// Answer the sender with `text` through the outbox; `requested` is the ledger's
    /// `pairing_requested` line when a new code was issued.
    Reply {
        text: String,
        requested: Option<Value>,
    },
    Drop,
}

/// The access policy in the gateway: the live policies, the pairing book and what was refused.
#[derive(Debug)]
pub struct Gate {
    pub policies: Policies,
    pub book: Keeper,
    refused: Mutex<BTreeMap<(String, Refusal), u64>>,
}

impl Gate {
    pub fn new(policies: Policies, book: Keeper) -> Gate {
        Gate { policies, book, refused: Mutex::new(BTreeMap::new()) }
    }

    fn refuse(&self, adapter: &str, why: Refusal) -> Admit {
        *self.refused.lock().unwrap_or_else(|p| p.into_inner()).entry((adapter.to_owned(), why)).or_default() += 1;
        Admit::Drop
    }

    /// Refused messages of `adapter` by reason, this incarnation (`/metrics`, `status`).
    pub fn refused(&self, adapter: &str) -> Vec<(Refusal, u64)> {
        let r = self.refused.lock().unwrap_or_else(|p| p.into_inner());
        Refusal::ALL.iter().map(|w| (*w, r.get(&(adapter.to_owned(), *w)).copied().unwrap_or(0))).collect()
    }

    /// [`Gate::refused`] as `{"<reason>": n, …}` (`status`, `pairing list`).
    pub fn refused_json(&self, adapter: &str) -> Value {
        Value::Object(self.refused(adapter).into_iter().map(|(why, n)| (why.label().to_owned(), json!(n))).collect())
    }

    /// Decides `m` from `adapter`; a new code is written to the book before it is handed out.
    /// Whether `m` would be delivered now, deciding nothing (no code issued, nothing counted):
    /// the skeleton downloads a message's files only for a message that is (issue 29: a
    /// stranger cannot make the gateway fetch and store files).
    pub fn would_deliver(&self, adapter: &str, m: &Inbound, now: SystemTime) -> bool {
        let policies = self.policies.get();
        let Some(p) = policies.get(adapter) else { return false };
        let facts = Facts::of(m);
        matches!(self.book.read(|b| decide(&facts, p, b.of(adapter), now)), Decision::Deliver)
    }

    pub fn admit(&self, adapter: &str, m: &Inbound, now: SystemTime) -> Admit {
        let policies = self.policies.get();
        let Some(p) = policies.get(adapter) else { return self.refuse(adapter, Refusal::UnknownSender) };
        let facts = Facts::of(m);
        match self.book.read(|b| decide(&facts, p, b.of(adapter), now)) {
            Decision::Deliver => Admit::Deliver,
            Decision::Drop(why) => self.refuse(adapter, why),
            Decision::Pair(_) => self.pair(adapter, p, &facts, &m.chat_id, now),
        }
    }

    /// Issues or repeats a code, deciding again on the freshest book under its lock (two
    /// messages of one stranger at once get one code).
    fn pair(&self, adapter: &str, p: &Policy, facts: &Facts<'_>, chat: &str, now: SystemTime) -> Admit {
        enum Paired {
            Issued(Pending),
            Reminded(Pending),
            Not(Decision),
        }
        let code = pairing::new_code();
        let step = self.book.update(|b| {
            let e = b.of_mut(adapter);
            match decide(facts, p, e, now) {
                // Another sender's code is never handed out again.
                Decision::Pair(PairStep::Issue) => match code {
                    Some(code) if !e.pending.iter().any(|q| q.code == code) => {
                        (Paired::Issued(e.issue(code, facts.sender, chat, now)), true)
                    }
                    _ => (Paired::Not(Decision::Drop(Refusal::PairingUnavailable)), false),
                },
                Decision::Pair(PairStep::Remind { .. }) => {
                    e.reminded(p.fold, facts.sender, now);
                    match e.pending_of(p.fold, facts.sender, now).cloned() {
                        Some(q) => (Paired::Reminded(q), true),
                        None => (Paired::Not(Decision::Drop(Refusal::PairingUnavailable)), false),
                    }
                }
                other => (Paired::Not(other), false),
            }
        });
        match step {
            Ok(Paired::Issued(q)) => Admit::Reply {
                text: pairing_reply(adapter, &q.code, q.expires()),
                requested: Some(
                    json!({"platform": adapter, "sender": q.user, "chat": q.chat, "code": q.code, "expires_at": q.expires_at}),
                ),
            },
            Ok(Paired::Reminded(q)) => {
                Admit::Reply { text: pairing_reply(adapter, &q.code, q.expires()), requested: None }
            }
            Ok(Paired::Not(Decision::Drop(why))) => self.refuse(adapter, why),
            // Approved meanwhile.
            Ok(Paired::Not(Decision::Deliver)) => Admit::Deliver,
            Ok(Paired::Not(Decision::Pair(_))) => Admit::Drop,
            Err(e) => {
                crate::error!("[[platform]] {adapter}: cannot write the pairing book: {e}; no code issued");
                self.refuse(adapter, Refusal::PairingUnavailable)
            }
        }
    }

    /// Approves the sender holding `code` on `adapter`. The caller records the ledger line and
    /// tells the sender.
    pub fn approve(&self, adapter: &str, code: &str, by: &str, now: SystemTime) -> Result<Pending, PairingError> {
        self.book
            .update(|b| {
                let r = b.of_mut(adapter).approve(adapter, code, by, now);
                let changed = r.is_ok();
                (r, changed)
            })
            .map_err(PairingError::Keep)?
    }

    /// Takes `user`'s approval on `adapter` back.
    pub fn revoke(&self, adapter: &str, user: &str) -> Result<(), PairingError> {
        let policies = self.policies.get();
        let p = policies.get(adapter);
        let fold = p.is_some_and(|p| p.fold);
        let r = self
            .book
            .update(|b| {
                let r = b.of_mut(adapter).revoke(fold, adapter, user);
                let changed = r.is_ok();
                (r, changed)
            })
            .map_err(PairingError::Keep)?;
        match (r, p) {
            (Err(PairingError::NotApproved { platform, user, .. }), Some(p)) if p.lists(&user) => {
                let hint = " (it is listed in admins or allowed_users in config.toml: remove it there)".to_owned();
                Err(PairingError::NotApproved { platform, user, hint })
            }
            (r, _) => r.map(drop),
        }
    }

    /// Each platform's access and book, for `pairing list` and the dashboard (docs/protocol.md
    /// §3, `pairing`), read fresh (blocking).
    pub fn report(&self, now: SystemTime) -> Vec<Value> {
        let policies = self.policies.get();
        self.book.read(|b| policies.iter().map(|(name, p)| platform_json(name, p, b.of(name), now)).collect())
    }

    /// [`Gate::report`] from the copy in hand (`status`, from async tasks: reads nothing).
    pub fn report_cached(&self, now: SystemTime) -> Vec<Value> {
        let policies = self.policies.get();
        self.book.peek(|b| policies.iter().map(|(name, p)| platform_json(name, p, b.of(name), now)).collect())
    }
}

/// How `check`, `doctor`, `status` and `update` name one platform's access: plainly when
/// anyone can reach the agent, and the change an update made where the file has no `access`
/// key (README, "Upgrading: closed by default").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Said {
    pub platform: String,
    /// `access = "open"`: anyone who finds the bot reaches the agent.
    pub open: bool,
    /// No `access` key: the kind's default decides (what an update changed).
    pub implicit: bool,
    pub text: String,
}

pub fn said(config: &Config) -> Vec<Said> {
    config
        .platform
        .iter()
        .map(|p| {
            let name = p.adapter_name();
            let access = p.access();
            let text = match (access, p.access.is_none()) {
                (Access::Open, _) => format!(
                    "{name}: access = \"open\": anyone who finds the bot can reach the agent (and use its backend)"
                ),
                (Access::Pairing, true) => format!(
                    "{name}: pairing (the default: no `access` key): a stranger's direct message gets a code and reaches nothing until `gatewarden pairing approve {name} CODE`; admins and allowed_users are served as before"
                ),
                (Access::Allowlist, true) => format!(
                    "{name}: allowlist (the default for {}, whose sender ids can be forged): only admins, allowed_users and what allowed_chats/allowed_senders name are served, and no pairing code is sent",
                    p.kind().as_str()
                ),
                (a, false) => format!("{name}: {}", a.as_str()),
            };
            Said { platform: name, open: access == Access::Open, implicit: p.access.is_none(), text }
        })
        .collect()
}

/// One platform's access and book as JSON (docs/protocol.md §3, `pairing`).
pub fn platform_json(name: &str, p: &Policy, e: &Entries, now: SystemTime) -> Value {
    let pending: Vec<Value> = e
        .pending
        .iter()
        .filter(|q| q.live(now))
        .map(|q| json!({"code": q.code, "user": q.user, "chat": q.chat, "issued_at": q.issued_at, "expires_at": q.expires_at}))
        .collect();
    let approved: Vec<Value> =
        e.approved.iter().map(|a| json!({"user": a.user, "approved_at": a.approved_at, "by": a.by})).collect();
    json!({"name": name, "kind": p.kind.as_str(), "access": p.access.as_str(), "explicit": p.explicit,
           "forgeable": p.kind.forgeable(), "pending": pending, "approved": approved})
}

/// The one answer an unknown sender gets: its code, how long it is valid, and what the owner
/// runs.
pub fn pairing_reply(adapter: &str, code: &str, expires: Option<SystemTime>) -> String {
    let until = expires.map(|t| format!(" (valid until {} UTC)", hhmm(t))).unwrap_or_default();
    format!(
        "I don't know you yet. Your pairing code is {code}{until}. Ask the owner of this bot to approve it: gatewarden pairing approve {adapter} {code}"
    )
}

/// What an approved sender is told.
pub const WELCOME: &str = "You are approved: I'm listening now.";

fn hhmm(t: SystemTime) -> String {
    let s = timefmt::format(t);
    s.get(11..16).map_or(s.clone(), str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn t(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + s)
    }

    fn policy(kind: PlatformKind, access: Option<Access>) -> Policy {
        let mut c = PlatformConfig::new(kind);
        c.access = access;
        c.admins = vec!["101".into()];
        c.allowed_users = vec!["105".into()];
        Policy::of(&c)
    }

    fn dm(sender: &str) -> Facts<'_> {
        Facts { sender, chat: ChatKind::Direct, listed: false, addressed: true }
    }

    fn group(sender: &str, listed: bool, addressed: bool) -> Facts<'_> {
        Facts { sender, chat: ChatKind::Group, listed, addressed }
    }

    use Decision::{Deliver, Drop, Pair};

    /// A gate for one Telegram platform whose admin is 101, its book in `dir`.
    fn telegram_gate(dir: &std::path::Path) -> Gate {
        let mut c = Config::default();
        let mut p = PlatformConfig::new(PlatformKind::Telegram);
        p.admins = vec!["101".into()];
        c.platform.push(p);
        Gate::new(Policies::new(&c), Keeper::home(dir))
    }

    /// A direct message from `user` in its own chat.
    fn inbound_from(user: &str) -> Inbound {
        Inbound {
            event_id: "1".into(),
            chat_id: user.into(),
            user_id: user.into(),
            text: "secret plans".into(),
            sent_at: None,
            chat: ChatKind::Direct,
            listed: false,
            addressed: true,
            attachments: Vec::new(),
        }
    }

    /// The rule as a table: every access mode, chat kind and sender.
    #[test]
    fn the_rule_as_data() {
        let none = Entries::default();
        let mut approved = Entries::default();
        approved.approved.push(pairing::Approved { user: "103".into(), approved_at: "x".into(), by: "cli".into() });
        let tg = policy(PlatformKind::Telegram, None);
        let open = policy(PlatformKind::Telegram, Some(Access::Open));
        let allow = policy(PlatformKind::Telegram, Some(Access::Allowlist));
        let irc = policy(PlatformKind::Irc, None);
        let cases: Vec<(&str, Facts<'_>, &Policy, &Entries, Decision)> = vec![
            ("an admin's direct message", dm("101"), &tg, &none, Deliver),
            ("an allowed user's", dm("105"), &tg, &none, Deliver),
            ("an approved sender's", dm("103"), &tg, &approved, Deliver),
            ("a stranger pairs", dm("102"), &tg, &none, Pair(PairStep::Issue)),
            ("a stranger under allowlist", dm("102"), &allow, &none, Drop(Refusal::UnknownSender)),
            ("a stranger under open", dm("102"), &open, &none, Deliver),
            ("a direct chat allowed_chats names", Facts { listed: true, ..dm("102") }, &allow, &none, Deliver),
            ("no sender id", dm(""), &tg, &none, Drop(Refusal::UnknownSender)),
            ("irc never pairs", dm("mallory"), &irc, &none, Drop(Refusal::UnknownSender)),
            ("an unlisted group", group("101", false, true), &tg, &none, Drop(Refusal::GroupNotAllowed)),
            ("a listed group, no mention", group("101", true, false), &tg, &none, Drop(Refusal::NotMentioned)),
            ("a listed group, mentioned by an admin", group("101", true, true), &tg, &none, Deliver),
            ("a listed group, a stranger", group("102", true, true), &tg, &none, Drop(Refusal::UnknownSender)),
            ("open: any group, anyone", group("102", false, true), &open, &none, Deliver),
            ("open: still needs the mention", group("102", false, false), &open, &none, Drop(Refusal::NotMentioned)),
        ];
        for (what, facts, p, e, want) in cases {
            assert_eq!(decide(&facts, p, e, t(0)), want, "{what}");
        }
        let mut quiet = tg.clone();
        quiet.require_mention = false;
        assert_eq!(decide(&group("101", true, false), &quiet, &none, t(0)), Deliver, "require_mention = false");
        let mut listed_open = open.clone();
        listed_open.any_group = false;
        assert_eq!(decide(&group("102", false, true), &listed_open, &none, t(0)), Drop(Refusal::GroupNotAllowed));
    }

    /// One code per sender, answered again at most every 10 minutes, at most 3 pending.
    #[test]
    fn pairing_is_rate_limited() {
        let tg = policy(PlatformKind::Telegram, None);
        let mut e = Entries::default();
        e.issue("AAAAAAAA".into(), "102", "102", t(0));
        assert_eq!(decide(&dm("102"), &tg, &e, t(60)), Drop(Refusal::PairingPending));
        assert_eq!(decide(&dm("102"), &tg, &e, t(600)), Pair(PairStep::Remind { code: "AAAAAAAA".into() }));
        e.issue("BBBBBBBB".into(), "103", "103", t(1));
        e.issue("CCCCCCCC".into(), "104", "104", t(2));
        assert_eq!(decide(&dm("106"), &tg, &e, t(3)), Drop(Refusal::PairingFull), "a 4th stranger");
        assert_eq!(decide(&dm("106"), &tg, &e, t(3600)), Pair(PairStep::Issue), "the first code expired");
    }

    /// What one decision costs on the delivery path (the policy, a stat of `pairing.json`, the
    /// book's lookup among 1,000 approved senders): printed for scripts/bench-platforms' notes.
    /// `cargo test --release -p gatewarden-runtime -- --ignored admit_costs --nocapture`
    #[test]
    #[ignore = "a measurement, not a check"]
    fn admit_costs() {
        let dir = tempfile::tempdir().unwrap();
        let gate = telegram_gate(dir.path());
        gate.book
            .update(|b| {
                let e = b.of_mut("telegram");
                for i in 0..1000 {
                    e.approved.push(pairing::Approved {
                        user: format!("u{i}"),
                        approved_at: "x".into(),
                        by: "cli".into(),
                    });
                }
                ((), true)
            })
            .unwrap();
        let (admin, approved) = (inbound_from("101"), inbound_from("u999"));
        let n = 100_000u32;
        for (what, msg) in [("an admin", &admin), ("the last of 1,000 approved senders", &approved)] {
            let t0 = std::time::Instant::now();
            for _ in 0..n {
                assert_eq!(gate.admit("telegram", msg, SystemTime::now()), Admit::Deliver);
            }
            eprintln!("admit, {what}: {:.2} µs per message", t0.elapsed().as_secs_f64() * 1e6 / f64::from(n));
        }
    }

    #[test]
    fn platforms_are_named_by_name_or_their_only_kind() {
        let one = [("tg", "telegram"), ("mx", "matrix")];
        assert_eq!(resolve(one, "tg").unwrap(), "tg");
        assert_eq!(resolve(one, "telegram").unwrap(), "tg");
        let two = [("a", "telegram"), ("b", "telegram")];
        assert!(resolve(two, "telegram").unwrap_err().contains("name one of a, b"));
        assert!(resolve(one, "irc").unwrap_err().contains("tg (telegram)"));
        assert!(resolve([], "irc").unwrap_err().contains("no [[platform]]"));
    }

    /// The gate in full against a home file: a code once, a reminder after 10 minutes, the
    /// approval letting the next message through, the revoke stopping it.
    #[test]
    fn the_gate_issues_approves_and_revokes() {
        let dir = tempfile::tempdir().unwrap();
        let gate = telegram_gate(dir.path());
        let m = inbound_from;
        let Admit::Reply { text, requested: Some(ev) } = gate.admit("telegram", &m("102"), t(0)) else {
            panic!("a code");
        };
        let code = ev["code"].as_str().unwrap().to_owned();
        assert!(text.contains(&code) && text.contains("gatewarden pairing approve telegram"), "{text}");
        assert_eq!(gate.admit("telegram", &m("102"), t(10)), Admit::Drop);
        let Admit::Reply { text, requested: None } = gate.admit("telegram", &m("102"), t(600)) else {
            panic!("a reminder, no new request");
        };
        assert!(text.contains(&code));
        let file = std::fs::read_to_string(dir.path().join(pairing::FILE)).unwrap();
        assert!(!file.contains("secret plans"), "a stranger's text is never kept");
        assert_eq!(gate.approve("telegram", &code.to_lowercase(), "cli", t(700)).unwrap().user, "102");
        assert_eq!(gate.admit("telegram", &m("102"), t(701)), Admit::Deliver);
        gate.revoke("telegram", "102").unwrap();
        assert!(matches!(gate.admit("telegram", &m("102"), t(702)), Admit::Reply { .. }), "a stranger again");
        let e = gate.revoke("telegram", "101").unwrap_err().to_string();
        assert!(e.contains("admins or allowed_users"), "{e}");
        let refused = gate.refused("telegram");
        assert!(refused.contains(&(Refusal::PairingPending, 1)), "{refused:?}");
    }
}
