//! One bot token, one gateway on this host: a token a hermes gateway uses, by hermes-agent
//! 0.19's scoped credential locks (crates/hermes/src/scoped.rs), is refused. The lock is taken
//! with hermes's own `gateway.status.acquire_scoped_lock` from the real package
//! (`scripts/hermes-venv`; under `CI` a missing venv fails). The Telegram side is the fake Bot
//! API; loopback only.
#![cfg(target_os = "linux")]

mod common;
mod work_common;
use common::*;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use work_common::*;

use gatewarden_telegram_fake::{FakeTelegram, Options};

const TOKEN_ENV: &str = "GW_TEST_TELEGRAM_TOKEN";

/// `acquire_scoped_lock('telegram-bot-token', token)` in a hermes python process that stays
/// alive (holding it, if granted) until killed; its answer, `[granted, existing record]`.
fn hermes_acquire(venv: &Path, locks: &Path, token: &str) -> (Child, Value) {
    let code = "import json, sys, time\n\
                from gateway import status\n\
                ok, existing = status.acquire_scoped_lock('telegram-bot-token', sys.argv[1], {'platform': 'telegram'})\n\
                print(json.dumps([ok, existing]), flush=True)\n\
                time.sleep(600)\n";
    let mut child = Command::new(venv.join("bin/python"))
        .args(["-c", code, token])
        .env("HERMES_GATEWAY_LOCK_DIR", locks)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("hermes's python");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("its answer");
    (child, serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}")))
}

fn lock_files(locks: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(locks).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default()
}

#[test]
fn a_token_a_hermes_gateway_uses_is_refused_and_a_dead_ones_file_is_left_alone() {
    let Some(venv) = gatewarden_testkit::hermes::venv() else { return };
    let fake = FakeTelegram::start(Options::default()).expect("fake Bot API");
    let token = format!("{}99:hermes-shared", std::process::id());
    let scratch = tempfile::tempdir().unwrap();
    let locks = scratch.path().join("gateway-locks");
    let (home, sw) = (TempHome::new(), Sweeper::new());
    write_config(
        home.path(),
        &format!(
            "[agent]\nbackend = \"echo\"\n[[platform]]\nkind = \"telegram\"\naccess = \"open\"\nrequire_mention = false\ntoken_env = \"{TOKEN_ENV}\"\napi_base = \"{}\"\npoll_timeout_s = 1\n",
            fake.base_url()
        ),
    );
    let gateway = || {
        builder(&home)
            .env(TAG_VAR, sw.tag())
            .env(TOKEN_ENV, &token)
            .env("GATEWARDEN_CREDS_DIR", scratch.path().join("creds"))
            .env("HERMES_GATEWAY_LOCK_DIR", &locks)
            .spawn()
    };

    // A hermes gateway holds the token: the gateway whose only platform it is refuses to start
    // (78), naming that process, and never polls.
    let (mut holder, answer) = hermes_acquire(&venv, &locks, &token);
    assert_eq!(answer[0], json!(true), "hermes takes a free token: {answer}");
    let mut g = gateway();
    let st = g.wait_exit(EXIT);
    assert_exit_code(&g, st, 78, "a token a hermes gateway uses");
    let err = g.stderr();
    assert!(err.contains("hermes gateway") && err.contains(&format!("pid {}", holder.id())), "{err}");
    assert_eq!(fake.stats(&token).get_updates, 0, "a refused gateway never polls");

    // Its holder killed (the file stays, as hermes leaves it): stale, so the gateway starts and
    // serves, and hermes's file is left as it was (hermes replaces it itself).
    holder.kill().unwrap();
    holder.wait().unwrap();
    let files = lock_files(&locks);
    assert_eq!(files.len(), 1, "a killed hermes leaves its lock file");
    let before = std::fs::read(&files[0]).unwrap();
    let mut g = gateway();
    g.wait_ready(READY);
    fake.inject(&token, 1, 1, "hello");
    assert!(fake.wait_sent(&token, READY, |s| s.iter().any(|m| m.text == "hello")).is_ok(), "{}", g.diag());
    assert_eq!(std::fs::read(&files[0]).unwrap(), before, "hermes's record is never written");
    assert_cli(&run_cli(&home, &["stop"]), 0, "stop");
    let st = g.wait_exit(EXIT);
    assert_exit_code(&g, st, 0, "stop");
}
