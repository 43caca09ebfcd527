//! Issue 33 §1, the first hour, through the real binary: `gatewarden init` driven on a
//! pseudo-terminal as a person would (answers typed once each question shows, the token and
//! the key typed without echo, a refused token asked again) against the Telegram and provider
//! fakes, then `start`ed and talked to; the same with flags only (no terminal); never an
//! overwrite without `--force`; `--config` / `GATEWARDEN_CONFIG` naming the file for every
//! process the CLI starts.
#![cfg(target_os = "linux")]

mod common;
mod work_common;
use common::*;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use work_common::*;

use gatewarden_telegram_fake::{FakeTelegram, Options};
use gatewarden_testkit::llmfake::{FakeLlm, Reply};

const OWNER: i64 = 42;
const KEY: &str = "sk-good-key-0123456789";
const ANSWER: &str = "hello from the model";
const QUESTION: Duration = Duration::from_secs(30);

/// A token no other test uses (the credential lock is keyed by it).
fn token() -> String {
    static N: AtomicU32 = AtomicU32::new(1);
    format!("{}{:04}:first-hour-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed), std::process::id())
}

fn fakes() -> (FakeTelegram, FakeLlm) {
    let tg = FakeTelegram::start(Options { linger: Duration::from_millis(800), ..Options::default() })
        .expect("fake Bot API");
    let llm = FakeLlm::start(Reply::text(ANSWER)).expect("fake provider");
    llm.require_key(KEY);
    (tg, llm)
}

/// The environment every command of these tests runs with: the sweeper's tag, this binary's
/// credential-lock folder, and no token or key of the developer's (empty is unset for init).
fn env(sw: &Sweeper) -> Vec<(&'static str, String)> {
    vec![
        (TAG_VAR, sw.tag().to_owned()),
        ("GATEWARDEN_CREDS_DIR", creds_dir()),
        ("TELEGRAM_BOT_TOKEN", String::new()),
        ("OPENAI_API_KEY", String::new()),
    ]
}

fn run(home: &TempHome, sw: &Sweeper, args: &[&str], extra: &[(&str, &str)]) -> CliOutput {
    let mut e = env(sw);
    e.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
    let e: Vec<(&str, &str)> = e.iter().map(|(k, v)| (*k, v.as_str())).collect();
    cli_with(bin(), home.path(), args, &e, Duration::from_secs(90))
}

/// The bot answers the owner in Telegram with the provider's words.
#[track_caller]
fn talk(tg: &FakeTelegram, token: &str) {
    tg.inject(token, OWNER, OWNER, "hi bot");
    let sent = tg.wait_sent(token, Duration::from_secs(20), |s| s.iter().any(|m| m.text == ANSWER));
    assert!(sent.is_ok(), "no answer from the model in the chat: {sent:?}");
}

#[track_caller]
fn no_secret_in(text: &str, secrets: &[&str], what: &str) {
    for s in secrets {
        assert!(!text.contains(s), "{what} shows a secret:\n{text}");
    }
}

/// The person's way: every answer typed on a terminal. A refused token is said and asked
/// again; neither the token nor the key shows; the config names the secrets and holds none;
/// `check` passes; the next step is `start`, which answers in Telegram.
#[test]
fn init_on_a_terminal_then_start_answers_in_telegram() {
    let (home, sw) = (TempHome::uncreated(), Sweeper::new());
    let (tg, llm) = fakes();
    let (good, bad) = (token(), format!("{}:revoked", std::process::id()));
    tg.revoke(&bad);
    let e = env(&sw);
    let e: Vec<(&str, &str)> = e.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let api_base = tg.base_url();
    let mut t = Terminal::spawn(bin(), home.path(), &["init", "--api-base", &api_base, "--listen", "127.0.0.1:0"], &e);
    t.expect("Chat platform (telegram, none) [telegram]: ", QUESTION);
    t.type_line("");
    t.expect("Telegram bot token (from @BotFather) (not shown): ", QUESTION);
    t.type_line(&bad);
    t.expect("refused: Telegram does not know this token", QUESTION);
    t.expect("Telegram bot token (from @BotFather) (not shown): ", QUESTION);
    t.type_line(&good);
    t.expect("the bot's owner", QUESTION);
    t.expect(": ", QUESTION);
    t.type_line(&OWNER.to_string());
    t.expect("Agent backend (openai, echo) [openai]: ", QUESTION);
    t.type_line("");
    t.expect("Provider base URL (any OpenAI-compatible API) [https://api.openai.com/v1]: ", QUESTION);
    t.type_line(&llm.base_url());
    t.expect("Provider API key (not shown): ", QUESTION);
    t.type_line(KEY);
    // The fake lists one model: it is the suggestion.
    t.expect("Model [fake-model]: ", QUESTION);
    t.type_line("");
    let (code, shown) = t.finish(Duration::from_secs(60));
    assert_eq!(code, Some(0), "init on a terminal:\n{shown}");
    assert!(shown.contains("\u{1b}[32maccepted"), "a terminal gets colour:\n{shown:?}");
    let shown = gatewarden_testkit::terminal::plain(&shown);
    no_secret_in(&shown, &[&good, &bad, KEY], "the terminal");
    for want in
        ["accepted telegram bot token: bot @fake", "accepted provider API key", "ok   config", "next:", " start "]
    {
        assert!(shown.contains(want), "{want:?} not shown:\n{shown}");
    }
    assert!(shown.contains(&format!("https://t.me/fake{}_bot", good.split(':').next().unwrap())), "{shown}");

    let config = std::fs::read_to_string(home.file("config.toml")).unwrap();
    no_secret_in(&config, &[&good, KEY], "config.toml");
    for want in [
        "token_env = \"TELEGRAM_BOT_TOKEN\"",
        "api_key_env = \"OPENAI_API_KEY\"",
        "admins = [\"42\"]",
        "model = \"fake-model\"",
        "\n# ",
    ] {
        assert!(config.contains(want), "{want:?} not in config.toml:\n{config}");
    }
    let secrets = std::fs::read_to_string(home.file("secrets.env")).unwrap();
    assert_eq!(secrets, format!("TELEGRAM_BOT_TOKEN={good}\nOPENAI_API_KEY={KEY}\n"));
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(home.file("secrets.env")).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "secrets.env mode");

    // The next step, as printed: start. The gateway takes the secrets from secrets.env alone.
    let started = run(&home, &sw, &["start"], &[]);
    assert_cli(&started, 0, "start after init");
    talk(&tg, &good);
    assert_cli(&run(&home, &sw, &["stop"], &[]), 0, "stop");
}

/// The script's way: flags and the environment, no terminal, one JSON document. Then: never
/// an overwrite without `--force`; a refused key writes nothing; `--force` keeps a backup; an
/// upstream that cannot be reached is a warning, and the rest is written.
#[test]
fn init_with_flags_only_then_start_and_send() {
    let (home, sw) = (TempHome::uncreated(), Sweeper::new());
    let (tg, llm) = fakes();
    let tok = token();
    let (api_base, base_url) = (tg.base_url(), llm.base_url());
    let flags = |base_url: &str| {
        vec![
            "init".to_owned(),
            "--platform".into(),
            "telegram".into(),
            "--backend".into(),
            "openai".into(),
            "--base-url".into(),
            base_url.to_owned(),
            "--model".into(),
            "fake-model".into(),
            "--api-base".into(),
            api_base.clone(),
            "--admin".into(),
            OWNER.to_string(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--json".into(),
        ]
    };
    let args = flags(&base_url);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let secrets = [("TELEGRAM_BOT_TOKEN", tok.as_str()), ("OPENAI_API_KEY", KEY)];
    let out = run(&home, &sw, &args, &secrets);
    assert_cli(&out, 0, "init with flags");
    no_secret_in(&format!("{}{}", out.stdout, out.stderr), &[&tok, KEY], "init's output");
    let doc = out.json();
    assert_eq!(doc["ok"], true, "{doc:#}");
    assert_eq!(doc["bot"], format!("fake{}_bot", tok.split(':').next().unwrap()), "{doc:#}");
    let verdicts: Vec<&str> =
        doc["credentials"].as_array().unwrap().iter().map(|c| c["verdict"].as_str().unwrap()).collect();
    assert_eq!(verdicts, ["accepted", "accepted"], "{doc:#}");
    assert_eq!(doc["check"]["ok"], true, "{doc:#}");
    assert!(doc["next"][0].as_str().unwrap().contains(" start"), "{doc:#}");
    let written = std::fs::read(home.file("config.toml")).unwrap();
    assert!(!String::from_utf8_lossy(&written).contains(KEY));

    // Started as the document says, and a message through the CLI reaches the model.
    let started = run(&home, &sw, &["start", "--json"], &[]);
    assert_cli(&started, 0, "start --json");
    assert_eq!(started.json()["status"]["state"], "running", "{}", started.stdout);
    let sent = run(&home, &sw, &["send", "--json", "hello"], &[]);
    assert_cli(&sent, 0, "send --json");
    assert_eq!(sent.json()["reply"], ANSWER, "{}", sent.stdout);
    talk(&tg, &tok);
    assert_cli(&run(&home, &sw, &["stop"], &[]), 0, "stop");

    // Again, without --force: refused, the file as it was.
    let again = run(&home, &sw, &args, &secrets);
    assert_cli(&again, 1, "init over an existing config");
    assert!(again.json()["reason"].as_str().unwrap().contains("--force"), "{}", again.stdout);
    assert_eq!(std::fs::read(home.file("config.toml")).unwrap(), written);

    // A key the provider refuses: nothing is written, not even with --force.
    let mut forced: Vec<&str> = args.clone();
    forced.push("--force");
    let refused = run(&home, &sw, &forced, &[("TELEGRAM_BOT_TOKEN", tok.as_str()), ("OPENAI_API_KEY", "sk-wrong")]);
    assert_cli(&refused, 1, "init with a refused key");
    let why = refused.json()["reason"].as_str().unwrap().to_owned();
    assert!(why.contains("OPENAI_API_KEY from init's environment is refused") && why.contains("HTTP 401"), "{why}");
    assert!(why.contains("nothing was written"), "{why}");
    assert_eq!(std::fs::read(home.file("config.toml")).unwrap(), written);
    assert!(std::fs::read_to_string(home.file("secrets.env")).unwrap().contains(KEY), "secrets.env kept its key");

    // With --force: the old file is kept beside the new one.
    let replaced = run(&home, &sw, &forced, &secrets);
    assert_cli(&replaced, 0, "init --force");
    let backup = replaced.json()["written"]["backup"].as_str().unwrap().to_owned();
    assert!(backup.contains("config.toml.bak-"), "{backup}");
    assert_eq!(std::fs::read(&backup).unwrap(), written);

    // Offline: the provider cannot be reached; a warning, and the configuration is written.
    let closed = format!("http://127.0.0.1:{}/v1", gatewarden_testkit::api::free_port());
    let offline = flags(&closed);
    let mut offline: Vec<&str> = offline.iter().map(String::as_str).collect();
    offline.push("--force");
    let out = run(&home, &sw, &offline, &secrets);
    assert_cli(&out, 0, "init with the provider unreachable");
    let doc = out.json();
    assert_eq!(doc["credentials"][1]["verdict"], "not tried", "{doc:#}");
    assert!(out.stderr.contains("warning: provider API key could not be tried"), "{}", out.stderr);
    assert!(std::fs::read_to_string(home.file("config.toml")).unwrap().contains(&closed));
}

/// `--config` and `GATEWARDEN_CONFIG` are one mechanism: init writes the named file (and not
/// the home's), `check` reads it, and a started gateway and its restart's successor run it.
#[test]
fn config_flag_names_the_file_for_every_process() {
    let (home, sw) = (TempHome::new(), Sweeper::new());
    let elsewhere = tempfile::tempdir().unwrap();
    let file = elsewhere.path().join("gw.toml");
    let f = file.to_str().unwrap();
    let out = run(
        &home,
        &sw,
        &["--config", f, "init", "--platform", "none", "--backend", "echo", "--listen", "127.0.0.1:0"],
        &[],
    );
    assert_cli(&out, 0, "init --config");
    assert!(file.exists() && !home.exists("config.toml"), "{out:#?}");
    assert!(out.stdout.contains(&format!("--config {f} start")), "the next step names the file: {}", out.stdout);
    // A key only this file has, visible in status.
    std::fs::write(&file, format!("drain_timeout_s = 7\n{}", std::fs::read_to_string(&file).unwrap())).unwrap();
    let check = run(&home, &sw, &["check", "--json"], &[("GATEWARDEN_CONFIG", f)]);
    assert_cli(&check, 0, "check with GATEWARDEN_CONFIG");
    assert!(check.stdout.contains(&format!("{f} loads")), "{}", check.stdout);
    assert!(check.stdout.contains("none named in gw.toml"), "{}", check.stdout);
    assert_cli(&run(&home, &sw, &["--config", f, "start"], &[]), 0, "start --config");
    let drain = |home: &TempHome| run(home, &sw, &["status", "--json"], &[]).json()["drain_timeout_s"].clone();
    assert_eq!(drain(&home), 7, "the started gateway runs the named file");
    assert_cli(&run(&home, &sw, &["restart"], &[]), 0, "restart");
    assert_eq!(drain(&home), 7, "and so does its successor");
    assert_cli(&run(&home, &sw, &["stop"], &[]), 0, "stop");
    // A service reads the home's config.toml: installing one while --config names another
    // file is refused before anything is installed.
    let svc = run(&home, &sw, &["--config", f, "service", "install", "--no-start"], &[]);
    assert_cli(&svc, 1, "service install with --config");
    assert!(svc.stderr.contains("a service reads") && svc.stderr.contains(f), "{svc:#?}");
}
