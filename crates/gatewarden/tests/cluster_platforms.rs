//! Issue 11, part 2: chat adapters in a cluster, with real gateways in separate homes (standing
//! in for hosts), a real throwaway PostgreSQL (testkit::postgres) and the in-repo Telegram fake,
//! which logs every `getUpdates` per consumer (each gateway polls through its own
//! `<fake>/c/<name>` address), so a test knows which gateway polled, and when.
//!
//! TTL 3 s, renewal every 1 s; `poll_timeout_s = 20`, which the lease budget cuts to 1 s.
#![cfg(target_os = "linux")]

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime};

use common::*;
use gatewarden_telegram_fake::{FakeTelegram, Options, PollRecord};
use gatewarden_testkit::api::Api;
use gatewarden_testkit::postgres::{Cluster, PASSWORD};

const TTL: Duration = Duration::from_secs(3);
const RENEW: Duration = Duration::from_secs(1);
const PW_ENV: &str = "GW_TEST_STORE_PASSWORD";
const TOKEN_ENV: &str = "GW_TEST_TELEGRAM_TOKEN";
const TOKEN2_ENV: &str = "GW_TEST_TELEGRAM_TOKEN2";
const REPLY: Duration = Duration::from_secs(15);
const STANDBY_REASON: &str = "waiting for promotion: this gateway is a cluster standby";

/// A token no other test uses.
fn token() -> String {
    static N: AtomicU32 = AtomicU32::new(1);
    format!("{}{:04}:tok-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed), std::process::id())
}

fn fake() -> FakeTelegram {
    FakeTelegram::start(Options { linger: Duration::from_millis(800), ..Options::default() }).expect("fake Bot API")
}

fn secs(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

struct Node {
    home: TempHome,
    g: Gateway,
}

impl Node {
    /// A gateway of cluster `cluster` polling `platforms` (`(name, token)`) through the fake as
    /// consumer `consumer`, open to anyone.
    fn spawn(cluster: &str, url: &str, fake: &FakeTelegram, consumer: &str, platforms: &[(&str, &str)]) -> Node {
        Node::spawn_with(cluster, url, fake, consumer, platforms, "access = \"open\"\nrequire_mention = false\n")
    }

    /// [`Node::spawn`] with `access` (lines of each `[[platform]]` table) instead of `open`.
    fn spawn_with(
        cluster: &str,
        url: &str,
        fake: &FakeTelegram,
        consumer: &str,
        platforms: &[(&str, &str)],
        access: &str,
    ) -> Node {
        let home = TempHome::new();
        let envs = [TOKEN_ENV, TOKEN2_ENV];
        let mut cfg = format!(
            "drain_timeout_s = 5\n[agent]\nbackend = \"echo\"\n\
             [cluster]\nname = \"{cluster}\"\nstore = \"{url}\"\npassword_env = \"{PW_ENV}\"\nlease_ttl_s = {}\nrenew_interval_s = {}\n",
            TTL.as_secs(),
            RENEW.as_secs()
        );
        for (i, (name, _)) in platforms.iter().enumerate() {
            cfg += &format!(
                "[[platform]]\nkind = \"telegram\"\n{access}name = \"{name}\"\ntoken_env = \"{}\"\napi_base = \"{}/c/{consumer}\"\n\
                 admins = [\"1\"]\npoll_timeout_s = 20\nconflict_standby_s = 2\n",
                envs[i],
                fake.base_url()
            );
        }
        gatewarden_testkit::api::write_config(home.path(), &cfg);
        let mut b = builder(&home).env(PW_ENV, PASSWORD);
        for (i, (_, tok)) in platforms.iter().enumerate() {
            b = b.env(envs[i], *tok);
        }
        let g = b.spawn();
        Node { home, g }
    }

    fn api(&self) -> Option<Api> {
        let v = self.home.state_record()?;
        if v["pid"].as_u64()? != u64::from(self.g.pid()) || v["gateway_state"] != "running" {
            return None;
        }
        Some(Api::new(v["listen"].as_str()?.parse().ok()?).with_timeout(Duration::from_secs(2)))
    }

    fn status(&self) -> Option<Value> {
        self.api()?.status()
    }

    fn role(&self) -> Option<String> {
        self.status().and_then(|s| s["cluster"]["role"].as_str().map(str::to_owned))
    }

    fn epoch(&self) -> Option<i64> {
        self.status().and_then(|s| s["cluster"]["epoch"].as_i64())
    }

    /// The state object of adapter `name` in `status --json`.
    fn adapter(&self, name: &str) -> Value {
        let out = run_cli(&self.home, &["status", "--json"]);
        let v: Value = serde_json::from_str(&out.stdout).unwrap_or(Value::Null);
        v["platforms"].as_array().and_then(|a| a.iter().find(|p| p["name"] == name).cloned()).unwrap_or(Value::Null)
    }

    #[track_caller]
    fn wait_role(&mut self, role: &str, within: Duration) {
        let ok = wait_until(within, || self.role().as_deref() == Some(role));
        assert!(ok, "pid {} not {role} within {within:?} (now {:?})\n{}", self.g.pid(), self.role(), self.g.diag());
    }

    #[track_caller]
    fn wait_adapter(&mut self, name: &str, pred: impl Fn(&Value) -> bool, within: Duration) -> Value {
        let mut last = Value::Null;
        let ok = wait_until(within, || {
            last = self.adapter(name);
            pred(&last)
        });
        assert!(
            ok,
            "adapter {name} of pid {}: not as expected within {within:?}: {last}\n{}",
            self.g.pid(),
            self.g.diag()
        );
        last
    }
}

fn polls_of<'a>(polls: &'a [PollRecord], consumer: &str) -> Vec<&'a PollRecord> {
    polls.iter().filter(|p| p.consumer == consumer).collect()
}

#[track_caller]
fn wait_reply(fake: &FakeTelegram, token: &str, chat: i64, text: &str) {
    let got = fake.wait_sent(token, REPLY, |s| s.iter().any(|m| m.chat_id == json!(chat) && m.text == text));
    if let Err(sent) = got {
        panic!("no reply {text:?} in chat {chat} within {REPLY:?}; sent: {sent:#?}");
    }
}

/// Two gateways `a` (active) and `b` (standby) of one cluster on one token; `a` polls.
fn pair(pg: &Cluster, fake: &FakeTelegram, cluster: &str, tok: &str) -> (Node, Node) {
    let mut a = Node::spawn(cluster, &pg.url(), fake, "a", &[("bot", tok)]);
    a.wait_role("active", READY);
    a.wait_adapter("bot", |p| p["state"] == "connected", READY);
    let mut b = Node::spawn(cluster, &pg.url(), fake, "b", &[("bot", tok)]);
    b.wait_role("standby", READY);
    // A standby shows its adapter, and why it does not run.
    let p = b.wait_adapter("bot", |p| p["state"] == "standby", READY);
    assert_eq!(p["reason"], STANDBY_REASON, "{p}");
    (a, b)
}

/// Only the active polls, every poll within its lease; kill -9 of the active: the standby
/// polls within TTL + 1 s, without a 409, and answers what is sent after the failover.
#[test]
fn only_the_active_polls_and_after_kill9_the_standby_polls_within_ttl() {
    let Some(pg) = Cluster::start_or_skip() else { return };
    let (fake, tok) = (fake(), token());
    let (mut a, mut b) = pair(&pg, &fake, "tgk9", &tok);
    fake.inject(&tok, 7, 1, "before");
    wait_reply(&fake, &tok, 7, "before");
    // Three renewals' worth of polling: the standby never polls.
    let ok = wait_until(Duration::from_secs(10), || polls_of(&fake.polls(&tok), "a").len() >= 4);
    assert!(ok, "the active does not poll: {:#?}", fake.polls(&tok));
    let polls = fake.polls(&tok);
    assert!(polls_of(&polls, "b").is_empty(), "the standby polled: {polls:#?}");
    // poll_timeout_s = 20, cut to what the lease leaves (at most TTL*3/4 - 0.5 s = 1.75 s).
    assert!(polls.iter().all(|p| p.timeout_s == 1), "{polls:#?}");

    let killed = SystemTime::now();
    a.g.kill();
    let ok = wait_until(TTL + Duration::from_secs(4), || !polls_of(&fake.polls(&tok), "b").is_empty());
    assert!(ok, "the promoted standby does not poll\n{}", b.g.diag());
    let polls = fake.polls(&tok);
    let first = polls_of(&polls, "b")[0].start;
    let took = first.duration_since(killed).unwrap_or_default();
    eprintln!("kill -9 to the standby's first poll: {took:?}");
    assert!(took <= TTL + Duration::from_secs(1), "the standby polled {took:?} after the kill");
    b.wait_role("active", READY);
    fake.inject(&tok, 7, 1, "after");
    wait_reply(&fake, &tok, 7, "after");
    let polls = fake.polls(&tok);
    assert!(polls_of(&polls, "b").iter().all(|p| !p.conflict), "the new active got 409s: {polls:#?}");
    assert_eq!(b.adapter("bot")["state"], "connected");
}

/// The pairing book is the cluster's (in its store): a code issued and approved on the active
/// holds on the standby promoted after a kill -9 of the active, which reads it before its
/// adapter starts; a standby decides nothing and names the active.
#[test]
fn an_approval_survives_failover_to_a_standby() {
    let Some(pg) = Cluster::start_or_skip() else { return };
    let (fake, tok) = (fake(), token());
    let mut a = Node::spawn_with("pair", &pg.url(), &fake, "a", &[("bot", &tok)], "");
    a.wait_role("active", READY);
    a.wait_adapter("bot", |p| p["state"] == "connected", READY);
    let mut b = Node::spawn_with("pair", &pg.url(), &fake, "b", &[("bot", &tok)], "");
    b.wait_role("standby", READY);

    fake.inject(&tok, 102, 102, "let me in");
    let got =
        fake.wait_sent(&tok, REPLY, |s| s.iter().any(|m| m.chat_id == json!(102) && m.text.contains("pairing code")));
    let reply = got.unwrap_or_else(|s| panic!("no pairing code: {s:#?}")).into_iter().find(|m| m.chat_id == json!(102));
    let text = reply.map(|m| m.text).unwrap_or_default();
    let code: String = text.split("pairing code is ").nth(1).unwrap_or_default().chars().take(8).collect();
    // Refused on the standby, which names the active once it has seen it (its next renewal).
    let mut refused = run_cli(&b.home, &["pairing", "approve", "bot", &code]);
    let named = wait_until(READY, || {
        refused = run_cli(&b.home, &["pairing", "approve", "bot", &code]);
        refused.code == Some(1) && refused.stderr.contains("standby") && refused.stderr.contains("the active serves")
    });
    assert!(named, "the standby refuses and names the active: {refused:?}");
    assert_cli(&run_cli(&a.home, &["pairing", "approve", "bot", &code]), 0, "pairing approve on the active");
    fake.inject(&tok, 102, 102, "approved on a");
    wait_reply(&fake, &tok, 102, "approved on a");

    a.g.kill();
    b.wait_role("active", TTL + Duration::from_secs(5));
    b.wait_adapter("bot", |p| p["state"] == "connected", READY);
    fake.inject(&tok, 102, 102, "still approved on b");
    wait_reply(&fake, &tok, 102, "still approved on b");
    let list = run_cli(&b.home, &["pairing", "list", "--json"]);
    assert_cli(&list, 0, "pairing list on the new active");
    assert!(list.stdout.contains("\"user\":\"102\""), "{}", list.stdout);
    fake.inject(&tok, 103, 103, "a new stranger");
    let got =
        fake.wait_sent(&tok, REPLY, |s| s.iter().any(|m| m.chat_id == json!(103) && m.text.contains("pairing code")));
    assert!(got.is_ok(), "the new active pairs strangers too");
}

/// `gatewarden stop` of the active: its adapter stops (confirming the offset), its credential
/// lease is released, the standby takes over and polls, with no 409 on the new active's side
/// and nothing answered twice.
#[test]
fn a_graceful_stop_hands_the_bot_over_without_a_409_storm() {
    let Some(pg) = Cluster::start_or_skip() else { return };
    let (fake, tok) = (fake(), token());
    let (mut a, mut b) = pair(&pg, &fake, "tggrace", &tok);
    fake.inject(&tok, 9, 1, "before the stop");
    wait_reply(&fake, &tok, 9, "before the stop");
    let out = run_cli(&a.home, &["stop"]);
    assert_cli(&out, 0, "stop");
    a.g.wait_exit(EXIT);
    b.wait_role("active", TTL);
    b.wait_adapter("bot", |p| p["state"] == "connected", READY);
    fake.inject(&tok, 9, 1, "handed over");
    wait_reply(&fake, &tok, 9, "handed over");
    let polls = fake.polls(&tok);
    let conflicts = polls.iter().filter(|p| p.conflict).count();
    // At most our own in-flight poll, ended by the stopping active's terminating poll.
    assert!(conflicts <= 1, "{conflicts} conflicts: {polls:#?}");
    assert!(polls_of(&polls, "b").iter().all(|p| !p.conflict), "{polls:#?}");
    // The stop confirmed the offset: the successor does not fetch (and answer) it again.
    let again = fake.sent(&tok).iter().filter(|m| m.text == "before the stop").count();
    assert_eq!(again, 1, "answered twice across the hand-over");
    // The stopped active's last poll ended before the standby's first started.
    let a_end = polls_of(&polls, "a").iter().filter_map(|p| p.end).max().unwrap();
    assert!(a_end <= polls_of(&polls, "b")[0].start, "{polls:#?}");
    let left = pg.sql(&format!(
        "SELECT count(*) FROM gw_credential_lease WHERE cluster = 'tggrace' AND holder->>'pid' = '{}'",
        a.g.pid()
    ));
    assert_eq!(left, "0", "the stopped active's credential lease was released");
}

/// SIGSTOP of the active past its lease: it never had a poll outstanding past its lease (the
/// fake's poll log against the database's grant history); on SIGCONT it demotes and stops its
/// adapter without polling again; promoted once more, it runs the adapter again.
#[test]
fn a_paused_active_never_polls_past_its_lease() {
    let Some(pg) = Cluster::start_or_skip() else { return };
    let (fake, tok) = (fake(), token());
    let (mut a, mut b) = pair(&pg, &fake, "tgstop", &tok);
    let old = a.epoch().unwrap();
    a.g.signal(sig::SIGSTOP);
    b.wait_role("active", TTL + Duration::from_secs(3));
    let ok = wait_until(READY, || !polls_of(&fake.polls(&tok), "b").is_empty());
    assert!(ok, "the new active does not poll\n{}", b.g.diag());
    a.g.signal(sig::SIGCONT);
    a.wait_role("standby", READY);
    a.wait_adapter("bot", |p| p["state"] == "standby", READY);
    fake.inject(&tok, 5, 1, "after the pause");
    wait_reply(&fake, &tok, 5, "after the pause");
    let granted: f64 = pg
        .sql(&format!(
            "SELECT extract(epoch FROM granted_at) FROM gw_lease_history WHERE name = 'tgstop' AND epoch = {}",
            old + 1
        ))
        .parse()
        .unwrap_or(0.0);
    assert!(granted > 0.0);
    let polls = fake.polls(&tok);
    for p in polls_of(&polls, "a") {
        let end = p.end.map_or(f64::MAX, secs);
        assert!(end < granted, "a poll of the paused active ended {:.3} s after the next grant: {p:?}", end - granted);
    }
    let sent = fake.sent(&tok).iter().filter(|m| m.text == "after the pause").count();
    assert_eq!(sent, 1, "answered once");

    // Promoted again (the other one dies): the demoted gateway's adapter starts afresh.
    b.g.kill();
    a.wait_role("active", TTL + Duration::from_secs(3));
    a.wait_adapter("bot", |p| p["state"] == "connected", READY);
    fake.inject(&tok, 5, 1, "promoted again");
    wait_reply(&fake, &tok, 5, "promoted again");
}

/// Two clusters, one token, one store: the second cluster's adapter is parked naming the
/// holder (its other adapter runs); a third cluster whose only adapter it is exits 78; kill -9
/// of the holder: after the expiry the second cluster takes the credential and answers.
#[test]
fn another_cluster_with_the_same_token_is_parked_until_the_holder_dies() {
    let Some(pg) = Cluster::start_or_skip() else { return };
    let (fake, tok, own) = (fake(), token(), token());
    let mut x = Node::spawn("credx", &pg.url(), &fake, "x", &[("bot", &tok)]);
    x.wait_role("active", READY);
    x.wait_adapter("bot", |p| p["state"] == "connected", READY);
    let mut y = Node::spawn("credy", &pg.url(), &fake, "y", &[("shared", &tok), ("own", &own)]);
    y.wait_role("active", READY);
    y.wait_adapter("own", |p| p["state"] == "connected", READY);
    let p = y.wait_adapter("shared", |p| p["state"] == "parked", READY);
    let reason = p["reason"].as_str().unwrap_or_default();
    let x_home = x.home.path().to_string_lossy().into_owned();
    assert!(
        reason.contains("cluster credx") && reason.contains(&x_home) && reason.contains(&format!("pid {}", x.g.pid())),
        "{p}"
    );
    assert!(polls_of(&fake.polls(&tok), "y").is_empty(), "the parked adapter polled");

    // The only adapter of a third cluster: exit 78, naming the holder.
    let mut z = Node::spawn("credz", &pg.url(), &fake, "z", &[("bot", &tok)]);
    let status = z.g.wait_exit(READY + TTL);
    assert_exit_code(&z.g, status, 78, "the only adapter's credential is held by another cluster");
    assert!(z.g.stderr().contains("cluster credx"), "{}", z.g.stderr());
    assert!(polls_of(&fake.polls(&tok), "z").is_empty());

    let killed = Instant::now();
    x.g.kill();
    y.wait_adapter("shared", |p| p["state"] == "connected", TTL + Duration::from_secs(5));
    eprintln!("credential taken over {:?} after the kill", killed.elapsed());
    fake.inject(&tok, 3, 1, "new holder");
    wait_reply(&fake, &tok, 3, "new holder");
    assert_eq!(pg.sql("SELECT cluster FROM gw_credential_lease WHERE holder->>'adapter' = 'shared'"), "credy");
}
