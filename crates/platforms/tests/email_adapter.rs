//! The email adapter against real servers (testkit::mail: Dovecot for IMAP, LMTP and
//! submission, OpenSMTPD as the MTA, TLS from a test CA), with an in-memory echoing host:
//! threads and reply headers, allowed senders and automatic mail, MIME decoding, the position
//! saved only after the commit, a restart that resumes, a changed UIDVALIDITY reported and not
//! re-answered, the server killed and revived, a wrong CA and a wrong password.
#![cfg(unix)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gatewarden_config::{Access, PlatformConfig, platform};
use gatewarden_platforms::email::{Email, imap};
use gatewarden_platforms::{Adapter, Host, State};
use gatewarden_testkit::mail::{MailServer, address, password};

const WAIT: Duration = Duration::from_secs(20);

mod support;
use support::MemHost;

fn mem_host(dir: Option<&Path>) -> Arc<MemHost> {
    let h = MemHost::echoing();
    *h.state_dir.lock().unwrap() = dir.map(Path::to_owned);
    Arc::new(h)
}

fn texts(h: &MemHost) -> Vec<String> {
    h.inbox.lock().unwrap().iter().map(|m| m.text.clone()).collect()
}

fn config(imap: String, smtp: String, ca: &Path, allowed: &[&str]) -> PlatformConfig {
    PlatformConfig {
        name: Some("mail".into()),
        token_env: Some("UNUSED".into()),
        conflict_standby_s: 30,
        ca_file: Some(ca.to_owned()),
        // The adapter alone: read what allowed_senders admits (none listed: anyone), as
        // before the access policy (crates/runtime/src/access/; platform_email.rs tests it).
        access: Some(Access::Open),
        ..PlatformConfig::with(platform::Email {
            poll_timeout_s: 5,
            imap: Some(imap),
            smtp: Some(smtp),
            account: Some(address("bot")),
            allowed_senders: allowed.iter().map(|a| a.to_string()).collect(),
        })
    }
}

#[track_caller]
fn wait(what: &str, mut f: impl FnMut() -> bool) {
    assert!(gatewarden_testkit::wait_until(WAIT, &mut f), "timed out waiting for {what}");
}

fn start(cfg: &PlatformConfig, pw: &str, host: &Arc<MemHost>) -> Arc<Email> {
    let a = Arc::new(Email::new(cfg, pw.into()).unwrap());
    a.start(Arc::clone(host) as Arc<dyn Host>).unwrap();
    a
}

#[track_caller]
fn wait_connected(a: &Email) {
    let ok = gatewarden_testkit::wait_until(WAIT, || a.status().state() == State::Connected);
    assert!(ok, "not connected: {:?}", a.status().snapshot());
}

fn header<'a>(mail: &'a str, name: &str) -> Option<&'a str> {
    mail.lines().find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(':'))).map(str::trim)
}

fn saved_uid(dir: &Path) -> Option<u64> {
    let raw = std::fs::read(dir.join("email-mail.json")).ok()?;
    serde_json::from_slice::<serde_json::Value>(&raw).ok()?["last_uid"].as_u64()
}

#[test]
fn replies_in_thread_skip_automatic_mail_and_decode_mime() {
    let Some(s) = MailServer::start() else { return };
    let cfg = config(s.imap_starttls_url(), s.submission_url(), s.ca_file(), &[&address("alice"), &address("bob")]);
    let host = mem_host(None);
    let a = start(&cfg, &password("bot"), &host);
    wait_connected(&a);
    let (alice, bot) = (address("alice"), address("bot"));

    s.send(&alice, &bot, "r1@example.test", "hi", "hello bot", &[]);
    wait("the first reply", || s.maildir("alice").len() == 1);
    let reply = &s.maildir("alice")[0];
    assert!(reply.contains("echo: hello bot"), "{reply}");
    assert_eq!(header(reply, "In-Reply-To"), Some("<r1@example.test>"), "{reply}");
    assert_eq!(header(reply, "References"), Some("<r1@example.test>"), "{reply}");
    assert_eq!(header(reply, "Subject"), Some("Re: hi"), "{reply}");
    assert_eq!(header(reply, "Auto-Submitted"), Some("auto-replied"), "{reply}");
    assert_eq!(header(reply, "From"), Some(bot.as_str()), "{reply}");

    // The answer to the reply stays in the thread: same chat, headers follow the last message.
    s.send(
        &alice,
        &bot,
        "r2@example.test",
        "Re: hi",
        "and again",
        &["In-Reply-To: <r1@example.test>", "References: <r1@example.test>"],
    );
    wait("the second reply", || s.maildir("alice").len() == 2);
    let reply = &s.maildir("alice")[1];
    assert_eq!(header(reply, "In-Reply-To"), Some("<r2@example.test>"), "{reply}");
    assert_eq!(header(reply, "References"), Some("<r1@example.test> <r2@example.test>"), "{reply}");
    {
        let inbox = host.inbox.lock().unwrap();
        assert_eq!(inbox.len(), 2);
        assert_eq!((inbox[0].chat_id.as_str(), inbox[1].chat_id.as_str()), ("r1@example.test", "r1@example.test"));
        assert_eq!(inbox[0].user_id, alice);
    }

    // Never answered: an auto-reply, a bulk mail, a bounce, a sender not allowed.
    s.send(&alice, &bot, "auto@example.test", "Out of office", "away", &["Auto-Submitted: auto-replied"]);
    s.send(&alice, &bot, "bulk@example.test", "news", "bulk", &["Precedence: bulk"]);
    s.send(
        &format!("MAILER-DAEMON@{}", gatewarden_testkit::mail::DOMAIN),
        &bot,
        "b@example.test",
        "failure",
        "bounce",
        &[],
    );
    s.send(&address("carol"), &bot, "c@example.test", "hi", "not allowed", &[]);
    // Then a quoted-printable Latin-1 message from bob: it is read, decoded, after them.
    let raw = format!(
        "From: {b}\r\nTo: {bot}\r\nSubject: =?ISO-8859-1?Q?Gr=FC=DFe?=\r\nMessage-ID: <q@example.test>\r\nMIME-Version: 1.0\r\nContent-Type: text/plain; charset=iso-8859-1\r\nContent-Transfer-Encoding: quoted-printable\r\n\r\nGr=FC=DFe aus K=F6ln\r\n",
        b = address("bob")
    );
    s.send_raw(&address("bob"), &bot, &raw);
    wait("bob's message", || host.inbox.lock().unwrap().len() >= 3);
    wait("bob's reply", || s.maildir("bob").len() == 1);
    assert_eq!(texts(&host), vec!["hello bot", "and again", "Grüße aus Köln"], "automatic and unknown mail is skipped");
    assert!(s.maildir("carol").is_empty(), "carol is not served");
    assert!(
        s.maildir("bob")[0].contains("Re: =?utf-8?") || s.maildir("bob")[0].contains("Subject: Re:"),
        "{}",
        s.maildir("bob")[0]
    );
    a.close(Instant::now() + Duration::from_secs(5));
}

#[test]
fn position_saved_after_commit_only_and_a_restart_resumes_once() {
    let Some(s) = MailServer::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(s.imaps_url(), s.submissions_url(), s.ca_file(), &[]);
    let (alice, bot) = (address("alice"), address("bot"));
    let host = mem_host(Some(dir.path()));
    let a = start(&cfg, &password("bot"), &host);
    wait_connected(&a);
    // A first start takes the mailbox's end as its position, saved with the first receive.
    wait("the first position saved", || saved_uid(dir.path()) == Some(0));

    // The journal refuses: the message is fetched again and again, the position stays.
    *host.refuse.lock().unwrap() = true;
    s.send(&alice, &bot, "p1@example.test", "one", "one", &[]);
    wait("degraded", || matches!(a.status().state(), State::Degraded(ref r) if r.contains("cannot journal")));
    assert_eq!(saved_uid(dir.path()), Some(0), "nothing is saved before the commit");
    assert!(a.close(Instant::now() + Duration::from_secs(5)));
    drop(a);

    // While no adapter runs, more mail arrives; the successor resumes and answers each once.
    s.send(&alice, &bot, "p2@example.test", "two", "two", &[]);
    s.send(&alice, &bot, "p3@example.test", "three", "three", &[]);
    wait("delivered to the bot's mailbox", || s.maildir("bot").len() == 3);
    *host.refuse.lock().unwrap() = false;
    let a = start(&cfg, &password("bot"), &host);
    wait("three answered", || s.maildir("alice").len() == 3);
    assert_eq!(texts(&host), vec!["one", "two", "three"]);
    wait("position saved", || saved_uid(dir.path()) == Some(3));
    a.close(Instant::now() + Duration::from_secs(5));

    // A fresh host (an empty journal) on the same state: nothing is fetched again.
    let fresh = mem_host(Some(dir.path()));
    let a = start(&cfg, &password("bot"), &fresh);
    wait_connected(&a);
    s.send(&alice, &bot, "p4@example.test", "four", "four", &[]);
    wait("four", || fresh.inbox.lock().unwrap().len() == 1);
    assert_eq!(texts(&fresh), vec!["four"], "only mail past the saved UID");
    a.close(Instant::now() + Duration::from_secs(5));
}

#[test]
fn a_changed_uidvalidity_is_reported_and_nothing_is_answered_again() {
    let Some(mut s) = MailServer::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(s.imaps_url(), s.submission_url(), s.ca_file(), &[]);
    let (alice, bot) = (address("alice"), address("bot"));
    let host = mem_host(Some(dir.path()));
    let a = start(&cfg, &password("bot"), &host);
    wait_connected(&a);
    s.send(&alice, &bot, "u1@example.test", "one", "one", &[]);
    wait("answered", || s.maildir("alice").len() == 1);
    a.close(Instant::now() + Duration::from_secs(5));
    drop(a);

    let old = s.uidvalidity("bot").expect("uidvalidity");
    let new = s.reset_uidvalidity("bot");
    assert_ne!(old, new);
    let a = start(&cfg, &password("bot"), &host);
    wait("the change reported", || {
        host.states
            .lock()
            .unwrap()
            .iter()
            .any(|st| matches!(st, State::Degraded(r) if r.contains("UIDVALIDITY changed")))
    });
    let last_error = a.status().snapshot().last_error.unwrap_or_default();
    assert!(last_error.contains(&format!("from {old} to {new}")), "{last_error}");
    s.send(&alice, &bot, "u2@example.test", "two", "two", &[]);
    wait("two answered", || s.maildir("alice").len() == 2);
    assert_eq!(texts(&host), vec!["one", "two"], "the old message under its new UID is not answered again");
    assert!(host.inbox.lock().unwrap()[1].event_id.starts_with(&format!("{new}:")));
    wait("connected again", || a.status().state() == State::Connected);
    a.close(Instant::now() + Duration::from_secs(5));
}

#[test]
fn the_server_killed_and_revived_degrades_then_recovers() {
    let Some(mut s) = MailServer::start() else { return };
    let cfg = config(s.imaps_url(), s.submission_url(), s.ca_file(), &[]);
    let host = mem_host(None);
    let a = start(&cfg, &password("bot"), &host);
    wait_connected(&a);
    s.stop_dovecot();
    wait("degraded", || matches!(a.status().state(), State::Degraded(_)));
    s.start_dovecot();
    wait_connected(&a);
    s.send(&address("alice"), &address("bot"), "k1@example.test", "back", "back", &[]);
    wait("answered after the outage", || s.maildir("alice").len() == 1);
    a.close(Instant::now() + Duration::from_secs(5));
}

#[test]
fn a_wrong_ca_or_password_never_logs_in() {
    let Some(s) = MailServer::start() else { return };
    let other = gatewarden_testkit::tls::TestCa::new("another CA");
    let dir = tempfile::tempdir().unwrap();
    let wrong_ca = other.write_pem(dir.path(), "other.pem");
    let host = mem_host(None);
    let a = start(&config(s.imaps_url(), s.submission_url(), &wrong_ca, &[]), &password("bot"), &host);
    wait(
        "a certificate failure",
        || matches!(a.status().state(), State::Degraded(ref r) if r.to_lowercase().contains("certificate") || r.contains("issuer")),
    );
    a.close(Instant::now() + Duration::from_secs(5));

    let b = start(&config(s.imaps_url(), s.submission_url(), s.ca_file(), &[]), "wrong", &host);
    wait("parked", || matches!(b.status().state(), State::Parked(ref r) if r.contains("refused")));
    b.close(Instant::now() + Duration::from_secs(5));
    assert!(host.inbox.lock().unwrap().is_empty());

    // The right CA and password, by STARTTLS: a session, and this server announces IDLE.
    let tls = gatewarden_net::ClientTls::from_ca_file(s.ca_file()).unwrap().rustls_config().unwrap();
    let ep = gatewarden_platforms::email::endpoint(&s.imap_starttls_url(), false).unwrap();
    let (mut session, sel) =
        imap::connect(&ep.host, ep.port, imap::Security::StartTls, tls, &address("bot"), &password("bot")).unwrap();
    assert!(session.has_idle() && sel.uid_validity != 0);
    session.logout();
}

#[test]
fn without_idle_the_adapter_polls() {
    let Some(s) = MailServer::start_without_idle() else { return };
    // The session sees no IDLE in the capabilities (so it polls with NOOP)...
    let tls = gatewarden_net::ClientTls::from_ca_file(s.ca_file()).unwrap().rustls_config().unwrap();
    let ep = gatewarden_platforms::email::endpoint(&s.imaps_url(), false).unwrap();
    let (mut session, _) =
        imap::connect(&ep.host, ep.port, imap::Security::Implicit, tls, &address("bot"), &password("bot")).unwrap();
    assert!(!session.has_idle(), "the server announces no IDLE");
    session.logout();
    // ... and the adapter still answers.
    let host = mem_host(None);
    let a = start(&config(s.imaps_url(), s.submission_url(), s.ca_file(), &[]), &password("bot"), &host);
    wait_connected(&a);
    s.send(&address("alice"), &address("bot"), "poll@example.test", "polled", "polled", &[]);
    wait("answered by polling", || s.maildir("alice").len() == 1);
    assert_eq!(texts(&host), vec!["polled"]);
    a.close(Instant::now() + Duration::from_secs(5));
}
