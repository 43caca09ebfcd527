//! Issue 37: closed by default. Real gateways against the Telegram fake (crates/telegram-fake)
//! and the fake provider (testkit::llmfake): an unknown sender's direct message gets a pairing
//! code and reaches nothing; approvals take effect at once and survive a restart and kill -9;
//! a revoke stops messages; repeats and a fourth stranger are rate-limited; a group message
//! without a mention starts no run; `access = "open"` answers everyone and `check` warns.
#![cfg(target_os = "linux")]

mod common;
mod work_common;
use common::*;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use work_common::*;

use gatewarden_telegram_fake::{FakeTelegram, Options, SentMessage};
use gatewarden_testkit::llmfake::{FakeLlm, Reply};

const TOKEN_ENV: &str = "GW_TEST_PAIRING_TOKEN";
const OWNER: i64 = 101;
const REPLY: Duration = Duration::from_secs(15);
/// How long "nothing more happens" is watched for.
const QUIET: Duration = Duration::from_millis(1500);

/// A token no other test uses (the credential lock is keyed by it).
fn token() -> String {
    static N: AtomicU32 = AtomicU32::new(1);
    format!("{}{:04}:pair-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed), std::process::id())
}

fn fake() -> FakeTelegram {
    FakeTelegram::start(Options { linger: Duration::from_millis(500), ..Options::default() }).expect("fake Bot API")
}

/// A Telegram gateway on the openai backend (the fake provider records every request), with
/// `extra` in its `[[platform]]` table.
fn config(fake: &FakeTelegram, llm: &FakeLlm, extra: &str) -> String {
    format!(
        "listen = \"127.0.0.1:0\"\ndrain_timeout_s = 5\n[agent]\nbackend = \"openai\"\nbase_url = \"{}\"\nmodel = \"m\"\ntimeout_s = 30\n\
         [[platform]]\nkind = \"telegram\"\ntoken_env = \"{TOKEN_ENV}\"\napi_base = \"{}\"\nadmins = [\"{OWNER}\"]\n\
         poll_timeout_s = 2\n{extra}",
        llm.base_url(),
        fake.base_url()
    )
}

fn spawn(home: &TempHome, sw: &Sweeper, tok: &str, config: &str) -> Gateway {
    write_config(home.path(), config);
    let mut g =
        builder(home).env(TAG_VAR, sw.tag()).env(TOKEN_ENV, tok).env("GATEWARDEN_CREDS_DIR", creds_dir()).spawn();
    g.wait_ready(READY);
    g
}

fn in_chat(sent: &[SentMessage], chat: i64) -> Vec<String> {
    sent.iter().filter(|m| m.chat_id == json!(chat)).map(|m| m.text.clone()).collect()
}

#[track_caller]
fn wait_reply(fake: &FakeTelegram, tok: &str, chat: i64, pred: impl Fn(&str) -> bool) -> String {
    let got = fake.wait_sent(tok, REPLY, |s| in_chat(s, chat).iter().any(|t| pred(t)));
    let sent = got.unwrap_or_else(|s| panic!("no matching reply in chat {chat} within {REPLY:?}; sent: {s:#?}"));
    in_chat(&sent, chat).into_iter().rev().find(|t| pred(t)).unwrap_or_default()
}

/// The code in a pairing reply.
fn code_in(text: &str) -> String {
    let after = text.split("pairing code is ").nth(1).unwrap_or_default();
    after.chars().take(8).collect()
}

/// What the provider was asked, each request's last user message.
fn asked(llm: &FakeLlm) -> Vec<String> {
    llm.seen()
        .iter()
        .filter_map(|s| {
            s.body["messages"].as_array()?.iter().rev().find(|m| m["role"] == "user")?["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect()
}

/// `pairing list --json`'s platforms.
fn pairing_list(home: &TempHome) -> Value {
    let out = run_cli(home, &["pairing", "list", "--json"]);
    assert_cli(&out, 0, "pairing list");
    serde_json::from_str::<Value>(&out.stdout).expect("pairing list --json")["result"]["platforms"].clone()
}

/// An unknown DM gets one reply with a code and the provider sees nothing (nor the journal,
/// the log or any file of the home); approved from the CLI, the next message reaches the agent
/// in the same incarnation, and the sender was told; the approval survives `restart` and kill
/// -9; revoked, messages stop.
#[test]
fn a_stranger_pairs_is_approved_at_once_survives_restarts_and_is_revoked() {
    let (home, sw, fake, tok) = (TempHome::new(), Sweeper::new(), fake(), token());
    let llm = FakeLlm::start(Reply::Echo).expect("fake provider");
    let cfg = config(&fake, &llm, "");
    let g = spawn(&home, &sw, &tok, &cfg);
    wait_adapter(&home, "connected", READY);

    fake.inject(&tok, 102, 102, "top secret plans");
    let reply = wait_reply(&fake, &tok, 102, |t| t.contains("pairing code"));
    let code = code_in(&reply);
    assert_eq!(code.len(), 8, "{reply}");
    assert!(reply.contains(&format!("gatewarden pairing approve telegram {code}")), "{reply}");
    assert!(holds_for(QUIET, || in_chat(&fake.sent(&tok), 102).len() == 1).is_ok(), "one reply");
    assert_eq!(llm.requests(), 0, "the provider saw nothing");
    assert_eq!(
        home.files_holding("top secret plans"),
        Vec::<std::path::PathBuf>::new(),
        "a stranger's text is kept nowhere"
    );
    let ev = wait_events(&home, "pairing_requested", 1, READY);
    assert_eq!((ev[0]["platform"].as_str(), ev[0]["sender"].as_str()), (Some("telegram"), Some("102")), "{ev:?}");
    let p = platforms(&home);
    assert_eq!((p[0]["access"].as_str(), p[0]["pending"].as_u64()), (Some("pairing"), Some(1)), "{p}");

    let out = run_cli(&home, &["pairing", "approve", "telegram", &code.to_lowercase()]);
    assert_cli(&out, 0, "pairing approve");
    wait_reply(&fake, &tok, 102, |t| t.contains("approved"));
    fake.inject(&tok, 102, 102, "hello agent");
    wait_reply(&fake, &tok, 102, |t| t == "echo: hello agent");
    assert_eq!(asked(&llm), ["hello agent"], "only the approved message reached the provider");
    assert_eq!(current_gateway(home.path()).map(|c| c.0), Some(g.pid()), "the same incarnation, no restart");
    let ev = wait_events(&home, "pairing_approved", 1, READY);
    assert_eq!((ev[0]["sender"].as_str(), ev[0]["channel"].as_str()), (Some("102"), Some("cli")), "{ev:?}");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(home.file("pairing.json")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "pairing.json is private");
    }

    // A planned restart, then a kill -9 and a fresh start: the approval holds.
    assert_cli(&cli_tagged(&home, &sw, &["restart", "--timeout", "30"], Duration::from_secs(40)), 0, "restart");
    wait_adapter(&home, "connected", READY);
    fake.inject(&tok, 102, 102, "after the restart");
    wait_reply(&fake, &tok, 102, |t| t == "echo: after the restart");
    let (pid, ..) = current_gateway(home.path()).expect("the restarted gateway");
    send_signal(pid, sig::SIGKILL).expect("kill -9");
    must_wait_until(EXIT, "the killed gateway's lock freed", || !home.lock_held());
    let _g3 = spawn(&home, &sw, &tok, &cfg);
    wait_adapter(&home, "connected", READY);
    fake.inject(&tok, 102, 102, "after kill -9");
    wait_reply(&fake, &tok, 102, |t| t == "echo: after kill -9");

    // Revoked: the next message reaches nothing (the sender is a stranger again).
    assert_cli(&run_cli(&home, &["pairing", "revoke", "telegram", "102"]), 0, "pairing revoke");
    let before = llm.requests();
    fake.inject(&tok, 102, 102, "still there?");
    wait_reply(&fake, &tok, 102, |t| t.contains("pairing code"));
    assert!(holds_for(QUIET, || llm.requests() == before).is_ok(), "a revoked sender reaches nothing");
    assert_eq!(wait_events(&home, "pairing_revoked", 1, READY)[0]["sender"], json!("102"));
    assert_cli(&run_cli(&home, &["stop"]), 0, "stop");
}

/// Ten messages from one stranger draw one reply and leave one pending code; three more
/// strangers fill the three slots' last two and the fourth gets no code, which `pairing list`
/// counts; the provider sees nothing of it all.
#[test]
fn repeats_and_a_fourth_stranger_are_rate_limited() {
    let (home, sw, fake, tok) = (TempHome::new(), Sweeper::new(), fake(), token());
    let llm = FakeLlm::start(Reply::Echo).expect("fake provider");
    let g = spawn(&home, &sw, &tok, &config(&fake, &llm, ""));
    wait_adapter(&home, "connected", READY);
    for i in 0..10 {
        fake.inject(&tok, 102, 102, &format!("let me in {i}"));
    }
    wait_reply(&fake, &tok, 102, |t| t.contains("pairing code"));
    let quiet = holds_for(QUIET, || fake.stats(&tok).pending == 0 && in_chat(&fake.sent(&tok), 102).len() == 1);
    assert!(quiet.is_ok(), "at most 2 replies (here: one): {:#?}", fake.sent(&tok));
    let list = pairing_list(&home);
    assert_eq!(list[0]["pending"].as_array().map(Vec::len), Some(1), "one pending code: {list}");

    for stranger in [103, 104] {
        fake.inject(&tok, stranger, stranger, "hi");
        wait_reply(&fake, &tok, stranger, |t| t.contains("pairing code"));
    }
    fake.inject(&tok, 105, 105, "me too");
    must_wait_until(REPLY, "the 4th stranger's message taken", || fake.stats(&tok).pending == 0);
    assert!(holds_for(QUIET, || in_chat(&fake.sent(&tok), 105).is_empty()).is_ok(), "no 4th code");
    let list = pairing_list(&home);
    assert_eq!(list[0]["pending"].as_array().map(Vec::len), Some(3), "{list}");
    assert_eq!(list[0]["refused"]["pairing_full"], json!(1), "{list}");
    let human = run_cli(&home, &["pairing", "list"]).stdout;
    assert!(human.contains("1 message(s) from new senders got no code"), "{human}");
    let metrics = http_get(g.listen(), "/metrics", Duration::from_secs(5)).unwrap().text();
    assert!(
        metrics.contains("gatewarden_platform_refused_total{platform=\"telegram\",reason=\"pairing_full\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("gatewarden_platform_pairing_pending{platform=\"telegram\"} 3"), "{metrics}");
    assert_eq!(llm.requests(), 0);
    assert_cli(&run_cli(&home, &["stop"]), 0, "stop");
}

/// In a group `allowed_chats` names: a message without a mention starts no run, even an
/// admin's; a mention or a reply to the bot does; a stranger's never does, and a group gets no
/// code. An admin approves a code in chat with `/approve CODE`, and a bare `/approve` is still
/// the agent's approval (nothing waits here); `/revoke USER` takes it back.
#[test]
fn groups_need_a_mention_and_admins_decide_in_chat() {
    let (home, sw, fake, tok) = (TempHome::new(), Sweeper::new(), fake(), token());
    let llm = FakeLlm::start(Reply::Echo).expect("fake provider");
    let group = -1001;
    let _g = spawn(&home, &sw, &tok, &config(&fake, &llm, &format!("allowed_chats = [\"{group}\"]\n")));
    wait_adapter(&home, "connected", READY);
    let bot = format!("@{}", FakeTelegram::username(&tok));

    fake.inject_group(&tok, group, OWNER, "no mention here", None);
    fake.inject_group(&tok, group, 102, &format!("{bot} a stranger asks"), None);
    fake.inject_group(&tok, group, OWNER, &format!("{bot} what time is it"), None);
    let answer = wait_reply(&fake, &tok, group, |t| t.starts_with("echo:"));
    assert_eq!(answer, format!("echo: {bot} what time is it"));
    let id = fake.sent(&tok).iter().find(|m| m.text == answer).map(|m| m.message_id).unwrap();
    fake.inject_group(&tok, group, OWNER, "and in London?", Some(id));
    wait_reply(&fake, &tok, group, |t| t == "echo: and in London?");
    fake.inject_group(&tok, -2002, OWNER, &format!("{bot} an unlisted group"), None);
    must_wait_until(REPLY, "all taken", || fake.stats(&tok).pending == 0);
    let quiet = holds_for(QUIET, || asked(&llm).len() == 2);
    assert!(quiet.is_ok(), "only the mention and the reply ran: {:?}", asked(&llm));
    assert_eq!(in_chat(&fake.sent(&tok), group).len(), 2, "no code in a group: {:#?}", fake.sent(&tok));
    assert!(in_chat(&fake.sent(&tok), -2002).is_empty());
    let p = platforms(&home);
    assert_eq!(p[0]["refused"]["not_mentioned"], json!(1), "{p}");
    assert_eq!(p[0]["refused"]["group_not_allowed"], json!(1), "{p}");

    // The owner decides in chat.
    fake.inject(&tok, 103, 103, "hello?");
    let code = code_in(&wait_reply(&fake, &tok, 103, |t| t.contains("pairing code")));
    fake.inject(&tok, OWNER, OWNER, "/approve");
    wait_reply(&fake, &tok, OWNER, |t| t.contains("nothing waits for an approval"));
    fake.inject(&tok, OWNER, OWNER, &format!("/approve {code}"));
    assert!(wait_reply(&fake, &tok, OWNER, |t| t.starts_with("approved")).contains("103"));
    fake.inject(&tok, 103, 103, "now?");
    wait_reply(&fake, &tok, 103, |t| t == "echo: now?");
    let ev = wait_events(&home, "pairing_approved", 1, READY);
    assert_eq!((ev[0]["channel"].as_str(), ev[0]["by"].as_str()), (Some("chat"), Some("telegram 101")), "{ev:?}");
    fake.inject(&tok, OWNER, OWNER, "/revoke 103");
    wait_reply(&fake, &tok, OWNER, |t| t.starts_with("revoked 103"));
    let before = llm.requests();
    fake.inject(&tok, 103, 103, "and now?");
    must_wait_until(REPLY, "taken", || fake.stats(&tok).pending == 0);
    assert!(holds_for(QUIET, || llm.requests() == before).is_ok(), "revoked in chat: nothing reaches the agent");
    // An approved sender cannot approve anyone: /approve is an admin's.
    fake.inject(&tok, 104, 104, "hi");
    let code = code_in(&wait_reply(&fake, &tok, 104, |t| t.contains("pairing code")));
    run_cli(&home, &["pairing", "approve", "telegram", &code]);
    fake.inject(&tok, 104, 104, "/approve ABCDEFGH");
    assert!(wait_reply(&fake, &tok, 104, |t| t.contains("admins")).contains("/approve"));
    assert_cli(&run_cli(&home, &["stop"]), 0, "stop");
}

/// `access = "open"` must be written out: then everyone is answered, groups too, and `check`,
/// `status` and `doctor` say plainly that anyone can reach the agent. A home with no `access`
/// key (an existing one after the update) starts and passes `check`, which names the change.
#[test]
fn open_answers_everyone_and_check_warns_and_an_old_home_still_starts() {
    let (home, sw, fake, tok) = (TempHome::new(), Sweeper::new(), fake(), token());
    let llm = FakeLlm::start(Reply::Echo).expect("fake provider");
    write_config(home.path(), &config(&fake, &llm, ""));
    let check = || cli_with(bin(), home.path(), &["check"], &[(TOKEN_ENV, tok.as_str())], Duration::from_secs(30));
    let out = check();
    assert_cli(&out, 0, "check of a home without an access key");
    assert!(out.stdout.contains("access") && out.stdout.contains("pairing (the default"), "{}", out.stdout);
    // `doctor` names the new default too, with what to write to choose.
    let doc =
        cli_with(bin(), home.path(), &["doctor", "--json"], &[(TOKEN_ENV, tok.as_str())], Duration::from_secs(30));
    assert!(doc.stdout.contains("\"access-default\"") && doc.stdout.contains("write `access = ...`"), "{doc:#?}");

    let _g = spawn(&home, &sw, &tok, &config(&fake, &llm, "access = \"open\"\nrequire_mention = false\n"));
    wait_adapter(&home, "connected", READY);
    fake.inject(&tok, 102, 102, "hi from 102");
    fake.inject(&tok, 103, 103, "hi from 103");
    fake.inject_group(&tok, -3003, 104, "hi from 104", None);
    for (chat, user) in [(102, 102), (103, 103), (-3003, 104)] {
        wait_reply(&fake, &tok, chat, |t| t == format!("echo: hi from {user}"));
    }
    let out = check();
    assert_cli(&out, 0, "check");
    assert!(out.stdout.contains("warn") && out.stdout.contains("anyone"), "{}", out.stdout);
    let status = run_cli(&home, &["status"]).stdout;
    assert!(status.contains("anyone can reach the agent"), "{status}");
    let p = platforms(&home);
    assert_eq!((p[0]["access"].as_str(), p[0]["open"].as_bool()), (Some("open"), Some(true)), "{p}");
    let doctor = run_cli(&home, &["doctor", "--json"]).stdout;
    assert!(doctor.contains("anyone who finds the bot can reach the agent"), "{doctor}");
    assert_cli(&run_cli(&home, &["stop"]), 0, "stop");
}

/// The gateway's page lists the pending code and, behind its login (and the form's CSRF
/// token), approves it and revokes the sender, each at once and recorded as the dashboard's;
/// a forged approve POST without a session is refused and approves nothing.
#[test]
fn the_dashboard_approves_and_revokes_behind_its_login() {
    use gatewarden_testkit::browser::Browser;
    const TOKEN: &str = "pairing-dashboard-token-0123456789";
    let Some(b) = Browser::start(Duration::from_secs(30)) else { return };
    let (home, sw, fake, tok) = (TempHome::new(), Sweeper::new(), fake(), token());
    let llm = FakeLlm::start(Reply::Echo).expect("fake provider");
    let cfg = format!("api_token = \"{TOKEN}\"\n{}", config(&fake, &llm, ""));
    let g = spawn(&home, &sw, &tok, &cfg);
    wait_adapter(&home, "connected", READY);
    fake.inject(&tok, 102, 102, "hi");
    let code = code_in(&wait_reply(&fake, &tok, 102, |t| t.contains("pairing code")));

    b.navigate(&format!("http://{}/ui", g.listen())).expect("navigate");
    assert!(b.find_all("form[action='/ui/action/approve']").expect("find").is_empty(), "no button without a session");
    let forged = b
        .execute(&format!("return fetch('/ui/action/approve', {{method: 'POST', headers: {{'Content-Type': 'application/x-www-form-urlencoded'}}, body: 'csrf=guess&platform=telegram&code={code}'}}).then(r => r.status)"))
        .expect("fetch");
    assert_eq!(forged, json!(403), "a forged approve is refused");
    assert!(home.events("pairing_approved").is_empty(), "and approves nothing");

    b.send_keys(&b.find("form#login input[name=token]").expect("token input"), TOKEN).expect("type");
    b.click(&b.find("form#login button").expect("button")).expect("click");
    let row = b.wait_text("#access table.pending", &code, READY).expect("the pending code on the page");
    assert!(row.contains("102"), "{row}");
    b.click(&b.wait_find("form[action='/ui/action/approve'] button", READY)).expect("approve");
    assert!(wait_until(Duration::from_secs(5), || b.alert_text().is_some()), "a confirmation");
    b.accept_alert().expect("accept");
    b.wait_text("#action", "approve: done", READY).expect("the approval's outcome");
    fake.inject(&tok, 102, 102, "approved from the page");
    wait_reply(&fake, &tok, 102, |t| t == "echo: approved from the page");
    let ev = wait_events(&home, "pairing_approved", 1, READY);
    assert_eq!(ev[0]["channel"], json!("dashboard"), "{ev:?}");

    b.click(&b.wait_find("form[action='/ui/action/revoke'] button", READY)).expect("revoke");
    assert!(wait_until(Duration::from_secs(5), || b.alert_text().is_some()), "a confirmation");
    b.accept_alert().expect("accept");
    b.wait_text("#action", "revoke: done", READY).expect("the revoke's outcome");
    let before = llm.requests();
    fake.inject(&tok, 102, 102, "after the revoke");
    must_wait_until(REPLY, "taken", || fake.stats(&tok).pending == 0);
    assert!(holds_for(QUIET, || llm.requests() == before).is_ok(), "revoked from the page: nothing reaches the agent");
    assert_eq!(wait_events(&home, "pairing_revoked", 1, READY)[0]["channel"], json!("dashboard"));
    b.quit();
    assert_cli(&run_cli(&home, &["stop"]), 0, "stop");
}

/// The access policy follows a reload at once (issue 27's `gatewarden reload`): a stranger
/// listed in `allowed_users` by a reload reaches the agent with no restart and no adapter
/// restarted; `access = "open"` by a reload answers everyone.
#[test]
fn a_reload_changes_who_reaches_the_agent_at_once() {
    let (home, sw, fake, tok) = (TempHome::new(), Sweeper::new(), fake(), token());
    let llm = FakeLlm::start(Reply::Echo).expect("fake provider");
    let g = spawn(&home, &sw, &tok, &config(&fake, &llm, ""));
    wait_adapter(&home, "connected", READY);
    fake.inject(&tok, 102, 102, "before");
    wait_reply(&fake, &tok, 102, |t| t.contains("pairing code"));
    assert_eq!(llm.requests(), 0);

    write_config(home.path(), &config(&fake, &llm, "allowed_users = [\"102\"]\n"));
    let out = run_cli(&home, &["reload"]);
    assert_cli(&out, 0, "reload");
    let ev = wait_events(&home, "reload", 1, READY);
    assert_eq!(ev[0]["adapters_restarted"], json!([]), "no adapter restarts for the access policy: {ev:?}");
    fake.inject(&tok, 102, 102, "listed now");
    wait_reply(&fake, &tok, 102, |t| t == "echo: listed now");

    write_config(home.path(), &config(&fake, &llm, "access = \"open\"\n"));
    assert_cli(&run_cli(&home, &["reload"]), 0, "reload");
    fake.inject(&tok, 103, 103, "anyone now");
    wait_reply(&fake, &tok, 103, |t| t == "echo: anyone now");
    assert_eq!(current_gateway(home.path()).map(|c| c.0), Some(g.pid()), "the same process throughout");
    assert_cli(&run_cli(&home, &["stop"]), 0, "stop");
}
