//! Issue 20: the email adapter in real gateway processes against real mail servers
//! (testkit::mail: Dovecot for IMAP, LMTP and submission, OpenSMTPD as the MTA, TLS from a
//! test CA; `scripts/setup-mail`). Under `CI` missing servers fail these tests; elsewhere they
//! print SKIPPED and pass. Loopback only; every wait is bounded.
#![cfg(target_os = "linux")]

mod common;
mod work_common;
use common::*;
use std::sync::Arc;
use std::time::{Duration, Instant};
use work_common::*;

use gatewarden_testkit::mail::{MailServer, address, files_of, password};

const PW_ENV: &str = "GW_TEST_MAIL_PASSWORD";
const REPLY: Duration = Duration::from_secs(20);

fn config(s: &MailServer, agent: &str) -> String {
    let platform = format!(
        "kind = \"email\"\nname = \"mail\"\nimap = \"{}\"\nsmtp = \"{}\"\naccount = \"{}\"\n\
         token_env = \"{PW_ENV}\"\nca_file = \"{}\"\nallowed_senders = [\"{}\", \"{}\"]\nadmins = [\"{}\"]\n\
         poll_timeout_s = 5\nconflict_standby_s = 3\n",
        s.imaps_url(),
        s.submission_url(),
        address("bot"),
        s.ca_file().display(),
        address("alice"),
        address("bob"),
        address("alice"),
    );
    platform_config(agent, &platform)
}

fn spawn(home: &TempHome, sw: &Sweeper, config: &str) -> Gateway {
    write_config(home.path(), config);
    builder(home).env(TAG_VAR, sw.tag()).env("GATEWARDEN_CREDS_DIR", creds_dir()).env(PW_ENV, password("bot")).spawn()
}

fn start_gw(home: &TempHome, sw: &Sweeper, config: &str) -> Gateway {
    let mut g = spawn(home, sw, config);
    g.wait_ready(READY);
    g
}

/// Sends `text` from `who` to the bot in a thread of its own (`id` is its Message-ID).
fn mail(s: &MailServer, who: &str, id: &str, text: &str) {
    s.send(&address(who), &address("bot"), &format!("{id}@example.test"), "gw test", text, &[]);
}

/// Waits until `who` has a reply matching `pred`; returns it.
#[track_caller]
fn wait_reply(s: &MailServer, who: &str, pred: impl Fn(&str) -> bool) -> String {
    let mut found = None;
    let ok = wait_until(REPLY, || {
        found = s.texts(who).into_iter().find(|t| pred(t));
        found.is_some()
    });
    assert!(ok, "no matching reply for {who} within {REPLY:?}: {:#?}", s.texts(who));
    found.unwrap_or_default()
}

fn count(s: &MailServer, who: &str, text: &str) -> usize {
    s.texts(who).iter().filter(|t| *t == text).count()
}

/// A round trip; /status and /help; a non-admin's /restart refused; an admin's /restart
/// answered, and the successor's "back online" in the thread that asked, once.
#[test]
fn round_trip_commands_and_restart_notice() {
    let Some(s) = MailServer::start() else { return };
    let (home, sw) = (TempHome::new(), Sweeper::new());
    let mut g = start_gw(&home, &sw, &config(&s, ""));
    wait_adapter(&home, "connected", READY);
    mail(&s, "alice", "hello", "hello there");
    let r = wait_reply(&s, "alice", |t| t == "hello there");
    assert_eq!(r, "hello there");
    assert_eq!(s.replies("alice")[0].in_reply_to, "hello@example.test");
    mail(&s, "alice", "status", "/status");
    assert!(wait_reply(&s, "alice", |t| t.contains("incarnation")).contains("running"));

    let p = platforms(&home);
    assert_eq!((p[0]["name"].as_str(), p[0]["kind"].as_str()), (Some("mail"), Some("email")), "{p}");
    assert!(p[0]["received"].as_u64() >= Some(2), "{p}");
    let metrics = http_get(g.listen(), "/metrics", Duration::from_secs(5)).unwrap().text();
    assert!(
        metrics.contains("gatewarden_platform_state{platform=\"mail\",kind=\"email\",state=\"connected\"} 1"),
        "{metrics}"
    );

    mail(&s, "bob", "bobrestart", "/restart");
    assert!(wait_reply(&s, "bob", |t| t.contains("admins")).contains("/restart"));
    assert!(g.alive(), "a non-admin's /restart must not restart");

    let old = g.pid();
    mail(&s, "alice", "restart", "/restart");
    wait_reply(&s, "alice", |t| t == "restarting…");
    let st = g.wait_exit(EXIT);
    assert_exit_code(&g, st, 75, "chat /restart (unsupervised: successor started)");
    let (_, inc2, _) = wait_new_ready(home.path(), &[old], READY).expect("successor ready");
    let notice = wait_reply(&s, "alice", |t| t.contains("back online"));
    assert!(notice.contains(&inc2), "the notice names the new incarnation {inc2}: {notice}");
    mail(&s, "alice", "after", "after the restart");
    wait_reply(&s, "alice", |t| t == "after the restart");
    assert!(holds_for(Duration::from_secs(1), || s.texts("alice").len() == 5).is_ok(), "{:#?}", s.texts("alice"));
    for text in ["hello there", "restarting…", "after the restart", notice.as_str()] {
        assert_eq!(count(&s, "alice", text), 1, "{text:?} sent once: {:#?}", s.texts("alice"));
    }
    assert_cli(&run_cli(&home, &["stop"]), 0, "stop");
}

/// Mid-conversation restart: a run is in flight and more mail arrives during the drain and
/// the restart; the successor fetches from the saved UID. Every message is answered once.
#[test]
fn restart_mid_conversation_loses_and_repeats_nothing() {
    let Some(s) = MailServer::start() else { return };
    let (home, sw) = (TempHome::new(), Sweeper::new());
    let g = start_gw(&home, &sw, &config(&s, "delay_ms = 1500"));
    wait_adapter(&home, "connected", READY);
    mail(&s, "alice", "m1", "m1");
    wait_active(g.listen(), 1);
    let restart = cli_bg(&home, &sw, &["restart", "--timeout", "30"], Duration::from_secs(40));
    wait_until(Duration::from_secs(5), || home.state().as_deref() == Some("draining"));
    mail(&s, "alice", "m2", "m2");
    mail(&s, "alice", "m3", "m3");
    assert_cli(&restart.join().unwrap(), 0, "restart");
    mail(&s, "alice", "m4", "m4");
    for m in ["m1", "m2", "m3", "m4"] {
        wait_reply(&s, "alice", |t| t == m);
    }
    assert!(holds_for(Duration::from_millis(1500), || s.texts("alice").len() == 4).is_ok(), "{:#?}", s.texts("alice"));
    assert_eq!(platforms(&home)[0]["state"], json!("connected"));
    assert_cli(&run_cli(&home, &["stop"]), 0, "stop");
}

/// kill -9 while the agent runs: the next incarnation answers the message exactly once (the
/// journal re-runs it; the message fetched again from the unsaved position deduplicates).
#[test]
fn kill_9_mid_run_is_answered_once_by_the_next_incarnation() {
    let Some(s) = MailServer::start() else { return };
    let (home, sw) = (TempHome::new(), Sweeper::new());
    let cfg = config(&s, "delay_ms = 1000");
    let mut g = start_gw(&home, &sw, &cfg);
    wait_adapter(&home, "connected", READY);
    mail(&s, "alice", "k9", "survive me");
    wait_active(g.listen(), 1);
    g.kill();
    assert!(s.texts("alice").is_empty());
    let mut g2 = start_gw(&home, &sw, &cfg);
    wait_reply(&s, "alice", |t| t == "survive me");
    assert!(holds_for(Duration::from_millis(1500), || s.texts("alice").len() == 1).is_ok(), "{:#?}", s.texts("alice"));
    stop_cleanly(&home, &mut g2);
}

/// Restarts under a steady stream of mail (3 in CI; `GW_PLATFORM_RESTARTS` in
/// scripts/soak-platforms): every message answered, none twice.
#[test]
fn restarts_under_a_steady_stream_lose_and_repeat_nothing() {
    let Some(s) = MailServer::start() else { return };
    let s = Arc::new(s);
    let (restarts, seed) = soak::soak_params(3);
    let (home, sw) = (TempHome::new(), Sweeper::new());
    let _g = start_gw(&home, &sw, &config(&s, ""));
    wait_adapter(&home, "connected", READY);
    // 50..250 ms between messages: each is an SMTP session.
    let stream = {
        soak::steady_stream(seed, 50, 200, Arc::clone(&s), |s, n| {
            mail(s, "alice", &format!("s{n}"), &format!("msg {n}"))
        })
    };
    let t0 = Instant::now();
    soak::restart_times(&home, &sw, restarts);
    // At least 12 messages, whatever the restarts' pace.
    wait_until(Duration::from_secs(10), || stream.sent() >= 12);
    let (total, _) = stream.stop();
    eprintln!("{restarts} restarts in {:?}, {total} messages", t0.elapsed());
    let total = total as usize;
    let all = wait_until(Duration::from_secs(60), || s.texts("alice").len() >= total);
    let texts = s.texts("alice");
    let (lost, dup) = soak::lost_and_duplicated(total as u32, texts.iter().map(String::as_str));
    assert!(all && lost.is_empty() && dup.is_empty(), "seed {seed}: lost {lost:?}, duplicated {dup:?}");
    assert!(holds_for(Duration::from_millis(500), || s.texts("alice").len() == total).is_ok());
    assert_cli(&run_cli(&home, &["stop"]), 0, "stop");
}

/// Dovecot dies and comes back: `degraded` in between (the gateway keeps serving), then
/// `connected` and answering.
#[test]
fn server_killed_and_revived() {
    let Some(mut s) = MailServer::start() else { return };
    let (home, sw) = (TempHome::new(), Sweeper::new());
    let mut g = start_gw(&home, &sw, &config(&s, ""));
    wait_adapter(&home, "connected", READY);
    s.stop_dovecot();
    let p = wait_adapter(&home, "degraded", Duration::from_secs(15));
    assert!(p[0]["reason"].as_str().is_some_and(|r| !r.is_empty()), "{p}");
    assert!(serving(&mut g), "a degraded adapter never stops the gateway");
    s.start_dovecot();
    wait_adapter(&home, "connected", Duration::from_secs(30));
    mail(&s, "alice", "outage", "after the outage");
    wait_reply(&s, "alice", |t| t == "after the outage");
    assert!(home.events("platform_state").iter().any(|e| e["state"] == "degraded"), "{}", home.ledger_text());
    stop_cleanly(&home, &mut g);
}

/// The credential lock is keyed by the account on its IMAP server: a second home configured
/// with the same account is refused (exit 78 naming the holder) before it connects.
#[test]
fn two_homes_same_account() {
    let Some(s) = MailServer::start() else { return };
    let (a, b, sw) = (TempHome::new(), TempHome::new(), Sweeper::new());
    let mut ga = start_gw(&a, &sw, &config(&s, ""));
    wait_adapter(&a, "connected", READY);
    let mut gb = spawn(&b, &sw, &config(&s, ""));
    refused_naming_the_holder(&mut gb, &a, &ga, "second gateway with the same email account");
    assert_eq!(platforms(&a)[0]["state"], json!("connected"), "the holder is undisturbed");
    mail(&s, "alice", "holder", "who answers");
    wait_reply(&s, "alice", |t| t == "who answers");
    stop_cleanly(&a, &mut ga);
}

/// Cluster failover (PostgreSQL store, TTL 3 s): two gateways of one cluster on one account;
/// only the active consumes (the standby's adapter stands by and receives nothing; every
/// message is answered once). kill -9 of the active: the promoted standby (no saved position of
/// its own) answers the mail sent during the failover and after, and nothing the old active
/// answered is answered again (the shared journal deduplicates `uidvalidity:uid`).
#[test]
fn cluster_failover_only_the_active_consumes() {
    let Some(pg) = gatewarden_testkit::postgres::Cluster::start_or_skip() else { return };
    let Some(s) = MailServer::start() else { return };
    const STORE_PW: &str = "GW_TEST_STORE_PASSWORD";
    let node = |home: &TempHome| {
        let cluster = format!(
            "[cluster]\nname = \"mail{}\"\nstore = \"{}\"\npassword_env = \"{STORE_PW}\"\nlease_ttl_s = 3\nrenew_interval_s = 1\n",
            std::process::id(),
            pg.url()
        );
        let cfg = config(&s, "").replacen("[[platform]]", &format!("{cluster}[[platform]]"), 1);
        write_config(home.path(), &cfg);
        builder(home).env(STORE_PW, gatewarden_testkit::postgres::PASSWORD).env(PW_ENV, password("bot")).spawn()
    };
    let (ha, hb) = (TempHome::new(), TempHome::new());
    let mut a = node(&ha);
    a.wait_ready(READY);
    wait_adapter(&ha, "connected", READY);
    // A standby is not `running`: its adapter says why it waits.
    let mut b = node(&hb);
    wait_adapter(&hb, "standby", READY);
    mail(&s, "alice", "c1", "before");
    wait_reply(&s, "alice", |t| t == "before");
    let p = platforms(&hb);
    assert_eq!((p[0]["state"].as_str(), p[0]["received"].as_u64()), (Some("standby"), Some(0)), "{p}");

    a.kill();
    mail(&s, "alice", "c2", "during");
    wait_adapter(&hb, "connected", Duration::from_secs(20));
    mail(&s, "alice", "c3", "after");
    for t in ["during", "after"] {
        wait_reply(&s, "alice", |x| x == t);
    }
    assert!(holds_for(Duration::from_millis(1500), || s.texts("alice").len() == 3).is_ok(), "{:#?}", s.texts("alice"));
    for t in ["before", "during", "after"] {
        assert_eq!(count(&s, "alice", t), 1, "{t:?} answered once: {:#?}", s.texts("alice"));
    }
    stop_cleanly(&hb, &mut b);
}

/// The bench (scripts/bench-platforms, section 5; not in CI): inbound mail to reply, one at a
/// time (`GW_EMAIL_BENCH_N`, default 20): median, p99, max; then `GW_EMAIL_BENCH_RESTARTS`
/// (default 5) restarts, each with a message sent just before it: the time from sending it to
/// its reply. The path is SMTP → OpenSMTPD → LMTP → Dovecot → IDLE → gateway → submission →
/// Dovecot → OpenSMTPD → LMTP → maildir.
#[test]
#[ignore = "a measurement: scripts/bench-platforms runs it"]
fn bench_email_reply_latency_and_restart_gap() {
    let Some(s) = MailServer::start() else { return };
    let n: usize = std::env::var("GW_EMAIL_BENCH_N").ok().and_then(|v| v.parse().ok()).unwrap_or(20);
    let restarts: usize = std::env::var("GW_EMAIL_BENCH_RESTARTS").ok().and_then(|v| v.parse().ok()).unwrap_or(5);
    let (home, sw) = (TempHome::new(), Sweeper::new());
    let _g = start_gw(&home, &sw, &config(&s, ""));
    wait_adapter(&home, "connected", READY);
    let pct = |v: &mut Vec<f64>, p: f64| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[((v.len() as f64 - 1.0) * p).round() as usize]
    };
    let mut lat = Vec::new();
    for i in 0..n {
        let t = Instant::now();
        mail(&s, "alice", &format!("b{i}"), &format!("bench {i}"));
        let want = format!("bench {i}");
        wait_reply(&s, "alice", |x| x == want);
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let (med, p99, max) = (pct(&mut lat, 0.5), pct(&mut lat, 0.99), pct(&mut lat, 1.0));
    println!("email inbound to reply ({n} one at a time): median {med:.0} ms, p99 {p99:.0} ms, max {max:.0} ms");
    let mut gap = Vec::new();
    for i in 0..restarts {
        let t = Instant::now();
        mail(&s, "alice", &format!("g{i}"), &format!("gap {i}"));
        let out = cli_tagged(&home, &sw, &["restart", "--timeout", "30"], Duration::from_secs(40));
        assert!(out.code == Some(0), "restart {i} failed: {out:#?}");
        let want = format!("gap {i}");
        wait_reply(&s, "alice", |x| x == want);
        gap.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let (med, max) = (pct(&mut gap, 0.5), pct(&mut gap, 1.0));
    println!("email across a restart (sent just before it, answered after): median {med:.0} ms, max {max:.0} ms");
    assert_cli(&run_cli(&home, &["stop"]), 0, "stop");
}

/// Issue 31, "not covered yet": hostile mail through the real MTA. A 50 MB mail (only its
/// first 8 MiB are fetched: it is answered with its size, not read), MIME bombs within that
/// (multiparts nested 15,000 deep, 20,000 parts, messages nested in messages, a subject of
/// 5,000 encoded words), and CR LF smuggled into a subject through an encoded word: the real
/// reply, sent through Dovecot's submission and OpenSMTPD, carries no injected header and
/// reaches no one else. The gateway runs on as the same process within bounded memory, and a
/// plain mail afterwards is answered.
#[test]
fn hostile_mail_is_bounded_and_replies_carry_no_injected_headers() {
    let Some(s) = MailServer::start() else { return };
    let (home, sw) = (TempHome::new(), Sweeper::new());
    let g = start_gw(&home, &sw, &config(&s, ""));
    wait_adapter(&home, "connected", READY);
    let base = rss_bytes(g.pid()) >> 20;
    let (alice, bot) = (address("alice"), address("bot"));
    let head = |id: &str, extra: &str| {
        format!(
            "From: {alice}\r\nTo: {bot}\r\nSubject: probe {id}\r\nMessage-ID: <{id}@example.test>\r\nMIME-Version: 1.0\r\n{extra}"
        )
    };

    // 50 MB.
    let line = format!("{}\r\n", "b".repeat(998));
    let big =
        format!("{}Content-Type: text/plain\r\n\r\n{}", head("big", ""), line.repeat(50 * 1024 * 1024 / line.len()));
    s.send_raw(&alice, &bot, &big);
    let cut = wait_reply(&s, "alice", |t| t.contains("over the 8388608-byte limit"));
    assert!(cut.contains("it was not read"), "{cut}");

    // Multiparts nested 15,000 deep.
    let mut nested = head("nested", "Content-Type: multipart/mixed; boundary=b0\r\n\r\n");
    for i in 0..15_000 {
        nested.push_str(&format!("--b{i}\r\nContent-Type: multipart/mixed; boundary=b{}\r\n\r\n", i + 1));
    }
    nested.push_str("--b15000\r\nContent-Type: text/plain\r\n\r\nthe deepest part\r\n");
    s.send_raw(&alice, &bot, &nested);
    // 20,000 parts.
    let mut wide = head("wide", "Content-Type: multipart/mixed; boundary=w\r\n\r\n");
    wide.push_str("--w\r\nContent-Type: text/plain\r\n\r\nthe first of many parts\r\n");
    for _ in 0..20_000 {
        wide.push_str("--w\r\nContent-Type: text/plain\r\n\r\nx\r\n");
    }
    wide.push_str("--w--\r\n");
    s.send_raw(&alice, &bot, &wide);
    // Messages nested in messages, 1,000 deep.
    let mut inner =
        "From: x@example.test\r\nSubject: inner\r\nContent-Type: text/plain\r\n\r\ninnermost\r\n".to_owned();
    for _ in 0..1_000 {
        inner = format!("From: x@example.test\r\nContent-Type: message/rfc822\r\n\r\n{inner}");
    }
    s.send_raw(&alice, &bot, &format!("{}Content-Type: message/rfc822\r\n\r\n{inner}", head("rfc822", "")));
    // 5,000 encoded words in a subject.
    // Folded, one word a line (a mail line is at most 998 characters).
    let words = vec!["=?UTF-8?B?YWJj?="; 5_000].join("\r\n ");
    s.send(&alice, &bot, "words@example.test", &words, "many words", &[]);

    // CR LF in a subject, through an encoded word (base64 of "hi\r\nBcc: carol@…\r\nX-Injected: yes").
    let smuggled = "=?UTF-8?B?aGkNCkJjYzogY2Fyb2xAZXhhbXBsZS50ZXN0DQpYLUluamVjdGVkOiB5ZXM=?=";
    s.send(&alice, &bot, "crlf@example.test", smuggled, "crlf in the subject", &[]);
    wait_reply(&s, "alice", |t| t == "crlf in the subject");
    let raw = s.maildir("alice").into_iter().find(|m| m.contains("crlf in the subject")).expect("the reply");
    let headers = raw.split("\r\n\r\n").next().unwrap_or_default().replace("\r\n ", " ");
    assert!(!headers.lines().any(|l| l.starts_with("X-Injected") || l.starts_with("Bcc")), "{headers}");
    let r = s.replies("alice").into_iter().find(|r| r.text == "crlf in the subject").unwrap();
    assert!(
        !r.subject.contains('\r') && !r.subject.contains('\n') && r.subject.starts_with("Re: hi"),
        "{:?}",
        r.subject
    );

    mail(&s, "alice", "after", "after the bombs");
    wait_reply(&s, "alice", |t| t == "after the bombs");
    assert!(s.maildir("carol").is_empty(), "a reply reached carol: {:?}", s.maildir("carol"));
    // Each probe was taken and answered once (a part too deep to find reads as empty).
    for id in ["big", "nested", "wide", "rfc822", "words", "crlf"] {
        let want = format!("{id}@example.test");
        let n = s.replies("alice").iter().filter(|r| r.in_reply_to == want).count();
        assert_eq!(
            n,
            1,
            "{id}: {n} replies: {:#?}",
            s.replies("alice")
                .iter()
                .map(|r| (&r.in_reply_to, r.text.chars().take(60).collect::<String>()))
                .collect::<Vec<_>>()
        );
    }
    let peak = rss_bytes(g.pid()) >> 20;
    assert!(peak < base + 64, "RSS went from {base} MiB to {peak} MiB");
    assert!(api::current_gateway(home.path()).is_some_and(|(p, ..)| p == g.pid()), "the same gateway runs on");
    assert_cli(&run_cli(&home, &["stop"]), 0, "stop");
}

/// Closed by default for email (issue 37), whose `From` can be forged: `allowlist`, and no
/// pairing reply, so a stranger cannot make the gateway send mail. Without allowed_senders,
/// only admins and allowed_users are served: a stranger's mail gets no answer, reaches nothing
/// and leaves nothing in the home (not even its thread); an allowed user's is answered.
#[test]
fn a_strangers_mail_gets_nothing_and_leaves_nothing() {
    let Some(s) = MailServer::start() else { return };
    let llm = gatewarden_testkit::llmfake::FakeLlm::start(gatewarden_testkit::llmfake::Reply::Echo).unwrap();
    let (home, sw) = (TempHome::new(), Sweeper::new());
    let agent = format!("backend = \"openai\"\nbase_url = \"{}\"\nmodel = \"m\"", llm.base_url());
    let cfg = config(&s, &agent)
        .replace(&format!("allowed_senders = [\"{}\", \"{}\"]\n", address("alice"), address("bob")), "")
        .replace("poll_timeout_s = 5\n", &format!("allowed_users = [\"{}\"]\npoll_timeout_s = 5\n", address("bob")));
    let mut g = start_gw(&home, &sw, &cfg);
    wait_adapter(&home, "connected", READY);
    mail(&s, "carol", "stranger", "carol's secret");
    mail(&s, "bob", "allowed", "bob is allowed");
    wait_reply(&s, "bob", |t| t == "echo: bob is allowed");
    mail(&s, "alice", "admin", "alice is the admin");
    wait_reply(&s, "alice", |t| t == "echo: alice is the admin");
    assert!(holds_for(Duration::from_secs(1), || s.texts("carol").is_empty()).is_ok(), "{:#?}", s.texts("carol"));
    assert_eq!(llm.requests(), 2, "carol's mail reached nothing");
    for needle in ["carol's secret", "stranger@example.test", &address("carol")] {
        assert_eq!(home.files_holding(needle), Vec::<std::path::PathBuf>::new(), "{needle:?} kept in the home");
    }
    assert!(run_cli(&home, &["check"]).stdout.contains("allowlist (the default for email"));
    stop_cleanly(&home, &mut g);
}

// Issue 29 §1/§2: attachments by email, through the same real servers.

const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x06\0\0\0\x1f\x15\xc4\x89 a tiny png";

fn b64(bytes: &[u8]) -> String {
    use base64::Engine;
    let one = base64::engine::general_purpose::STANDARD.encode(bytes);
    // Mail lines are at most 998 characters; MIME writes 76.
    one.as_bytes().chunks(76).map(|c| format!("{}\r\n", String::from_utf8_lossy(c))).collect()
}

/// One MIME part: `Content-Type`, `Content-Disposition` (or empty) and its base64 body.
struct Part<'a> {
    kind: &'a str,
    disposition: &'a str,
    bytes: &'a [u8],
}

/// Sends `text` and `parts` from `who` as one `multipart/mixed` mail (Message-ID `<id@…>`).
fn mail_with(s: &MailServer, who: &str, id: &str, text: &str, parts: &[Part<'_>]) {
    let (from, to) = (address(who), address("bot"));
    let mut raw = format!(
        "From: {from}\r\nTo: {to}\r\nSubject: files\r\nMessage-ID: <{id}@example.test>\r\nMIME-Version: 1.0\r\n\
         Content-Type: multipart/mixed; boundary=\"gw-b\"\r\n\r\n--gw-b\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n{text}\r\n"
    );
    for p in parts {
        let disposition = if p.disposition.is_empty() {
            String::new()
        } else {
            format!("Content-Disposition: {}\r\n", p.disposition)
        };
        raw.push_str(&format!(
            "--gw-b\r\nContent-Type: {}\r\n{disposition}Content-Transfer-Encoding: base64\r\n\r\n{}",
            p.kind,
            b64(p.bytes)
        ));
    }
    raw.push_str("--gw-b--\r\n");
    s.send_raw(&from, &to, &raw);
}

fn openai_config(s: &MailServer, llm: &gatewarden_testkit::llmfake::FakeLlm) -> String {
    let agent = format!("backend = \"openai\"\nbase_url = \"{}\"\nmodel = \"m\"\ntimeout_s = 60", llm.base_url());
    config(s, &agent)
}

/// The user message's content parts the provider got last.
fn last_user_content(llm: &gatewarden_testkit::llmfake::FakeLlm) -> serde_json::Value {
    let seen = llm.seen();
    let body = &seen.last().expect("the provider was asked").body;
    body["messages"].as_array().and_then(|m| m.last()).map(|m| m["content"].clone()).unwrap_or_default()
}

/// A photo mailed inline reaches the vision provider as an `image_url` part (a data URL of its
/// decoded bytes) beside the mail's text, and the reply comes back by mail; a text file
/// attached is inlined as text.
#[test]
fn email_photo_reaches_the_vision_provider_and_a_text_file_is_inlined() {
    use base64::Engine;
    let Some(s) = MailServer::start() else { return };
    let llm = gatewarden_testkit::llmfake::FakeLlm::start(gatewarden_testkit::llmfake::Reply::text("a tiny picture"))
        .unwrap();
    let (home, sw) = (TempHome::new(), Sweeper::new());
    let mut g = start_gw(&home, &sw, &openai_config(&s, &llm));
    wait_adapter(&home, "connected", READY);
    let photo = Part { kind: "image/png", disposition: "inline; filename=\"shot.png\"", bytes: PNG };
    mail_with(&s, "alice", "photo", "what is this", &[photo]);
    wait_reply(&s, "alice", |t| t == "a tiny picture");
    let content = last_user_content(&llm);
    assert_eq!(
        (content[0]["type"].as_str(), content[0]["text"].as_str()),
        (Some("text"), Some("what is this")),
        "{content}"
    );
    let url = format!("data:image/png;base64,{}", base64::engine::general_purpose::STANDARD.encode(PNG));
    assert_eq!(content[1], json!({"type": "image_url", "image_url": {"url": url}}));

    let doc = Part {
        kind: "text/plain; charset=utf-8",
        disposition: "attachment; filename=\"notes.txt\"",
        bytes: b"line one\nline two\n",
    };
    mail_with(&s, "alice", "doc", "summarise", &[doc]);
    must_wait_until(REPLY, "the provider asked about the document", || llm.seen().len() >= 2);
    let content = last_user_content(&llm);
    let text = content[0]["text"].as_str().unwrap_or_default();
    assert!(text.starts_with("summarise\n[file: notes.txt, text/plain]\nline one\nline two"), "{content}");
    wait_reply(&s, "alice", |t| t == "a tiny picture" && s.texts("alice").len() >= 2);
    stop_cleanly(&home, &mut g);
}

/// The exec convention by mail: the command finds the mailed file in `GATEWARDEN_ATTACHMENTS`
/// and attaches one with a `{"attach": path}` line; it arrives in the sender's mailbox (read
/// back by IMAP) as a MIME part with its type and name, in the thread, after the reply's text.
/// A kill -9 while that run is in progress loses nothing: the next incarnation re-runs it with
/// the stored file and the text and the file go out once each.
#[test]
fn email_exec_reads_the_files_and_sends_one_back_once_across_a_kill_9() {
    let Some(s) = MailServer::start() else { return };
    let (home, sw) = (TempHome::new(), Sweeper::new());
    let dir = tempfile::tempdir().unwrap();
    let agent = attaching_agent(dir.path(), true, 120);
    let cfg = config(&s, &agent);
    let mut g = start_gw(&home, &sw, &cfg);
    wait_adapter(&home, "connected", READY);
    let pdf = Part { kind: "application/pdf; name=\"in.pdf\"", disposition: "attachment", bytes: b"%PDF-1.4 fake" };
    mail_with(&s, "alice", "exec", "make a report", &[pdf]);
    must_wait_until(REPLY, "the first run started", || dir.path().join("first").exists());
    g.kill();
    assert!(s.maildir("alice").is_empty(), "nothing sent before the kill");

    let mut g2 = start_gw(&home, &sw, &cfg);
    wait_reply(&s, "alice", |t| t == "here is the report");
    let files = || {
        let all: Vec<_> = s.imap_messages("alice").iter().map(|m| files_of(m)).collect();
        all.into_iter().flat_map(|(re, f)| f.into_iter().map(move |f| (re.clone(), f))).collect::<Vec<_>>()
    };
    must_wait_until(REPLY, "the file arrived", || !files().is_empty());
    let quiet = holds_for(Duration::from_millis(1500), || files().len() == 1 && s.imap_messages("alice").len() == 2);
    assert!(quiet.is_ok(), "sent more than once: {:#?}", s.texts("alice"));
    let (re, f) = files().remove(0);
    assert_eq!(
        (f.name.as_str(), f.kind.as_str(), f.bytes.as_slice()),
        ("report.txt", "text/plain", &b"report body\n"[..])
    );
    assert_eq!(re, "exec@example.test", "in the thread");
    let env: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("env.json")).unwrap()).unwrap();
    assert_eq!(
        (env[0]["name"].as_str(), env[0]["type"].as_str(), env[0]["size"].as_u64()),
        (Some("in.pdf"), Some("application/pdf"), Some(13)),
        "{env}"
    );
    assert_eq!(std::fs::read(env[0]["path"].as_str().unwrap()).unwrap(), b"%PDF-1.4 fake");
    stop_cleanly(&home, &mut g2);
}

/// A file past `max_file_mb` (refused on its decoded size, never stored), a zip named and
/// declared as a PNG, and a PNG whose base64 is broken: each message is still journaled and
/// answered (its text names the refusal), and the sender is told why by mail.
#[test]
fn email_oversized_and_mistyped_files_are_refused_with_a_notice() {
    let Some(s) = MailServer::start() else { return };
    let (home, sw) = (TempHome::new(), Sweeper::new());
    let cfg = config(&s, "").replacen("[agent]", "[attachments]\nmax_file_mb = 1\n[agent]", 1);
    let mut g = start_gw(&home, &sw, &cfg);
    wait_adapter(&home, "connected", READY);

    let big = vec![b'a'; 3 << 19];
    mail_with(
        &s,
        "alice",
        "big",
        "too big",
        &[Part { kind: "text/plain", disposition: "attachment; filename=\"big.txt\"", bytes: &big }],
    );
    let notice = wait_reply(&s, "alice", |t| t.starts_with("attachment refused"));
    assert!(notice.contains("big.txt") && notice.contains("too large"), "{notice}");
    wait_reply(&s, "alice", |t| t.starts_with("too big\n[attachment refused: big.txt: too large"));

    let bomb =
        Part { kind: "image/png", disposition: "attachment; filename=\"bomb.png\"", bytes: b"PK\x03\x04zip inside" };
    mail_with(&s, "alice", "zip", "look", &[bomb]);
    let notice = wait_reply(&s, "alice", |t| t.starts_with("attachment refused: bomb.png"));
    assert!(notice.contains("application/zip"), "{notice}");
    wait_reply(&s, "alice", |t| t.starts_with("look\n[attachment refused: bomb.png"));

    let (from, to) = (address("alice"), address("bot"));
    let broken = format!(
        "From: {from}\r\nTo: {to}\r\nSubject: files\r\nMessage-ID: <broken@example.test>\r\nMIME-Version: 1.0\r\n\
         Content-Type: multipart/mixed; boundary=b\r\n\r\n--b\r\nContent-Type: text/plain\r\n\r\nbroken\r\n\
         --b\r\nContent-Type: image/png\r\nContent-Disposition: attachment; filename=\"bad.png\"\r\n\
         Content-Transfer-Encoding: base64\r\n\r\n!!!! not base64 at all ????\r\n--b--\r\n"
    );
    s.send_raw(&from, &to, &broken);
    let notice = wait_reply(&s, "alice", |t| t.starts_with("attachment refused: bad.png"));
    assert!(notice.contains("declared image/png"), "{notice}");
    wait_reply(&s, "alice", |t| t.starts_with("broken\n[attachment refused: bad.png"));
    assert!(g.alive());
    // Nothing of the refused files is in the store.
    let stored = home.files_holding("zip inside");
    assert!(stored.iter().all(|p| !p.starts_with(home.path().join("attachments"))), "{stored:?}");
    stop_cleanly(&home, &mut g);
}
