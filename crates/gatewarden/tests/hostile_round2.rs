//! Issue 18 ("Hostile inputs, round two"), the medium and low items: real gateway processes,
//! loopback only (docs/security.md).
#![cfg(target_os = "linux")]

mod common;
mod work_common;
use common::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use work_common::*;

const ECHO: &str = "[agent]\nbackend = \"echo\"\n";

fn mkfifo(p: &Path) {
    rustix::fs::mknodat(rustix::fs::CWD, p, rustix::fs::FileType::Fifo, rustix::fs::Mode::from(0o600), 0)
        .unwrap_or_else(|e| panic!("mkfifo {}: {e}", p.display()));
}

fn set_mode(p: &Path, m: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
}

/// A wrapper script that runs the gateway binary under `umask 022`.
fn umask_022_wrapper(home: &TempHome) -> PathBuf {
    let wrapper = home.root().join("gatewarden-umask-022");
    std::fs::write(&wrapper, format!("#!/bin/sh\numask 022\nexec {} \"$@\"\n", bin())).unwrap();
    set_mode(&wrapper, 0o755);
    wrapper
}

/// Every entry under `dir` (not `dir` itself) that group or others can read, write or enter,
/// with its mode.
fn exposed(dir: &Path) -> Vec<(PathBuf, u32)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let Ok(m) = std::fs::symlink_metadata(e.path()) else { continue };
            if m.file_type().is_symlink() {
                continue;
            }
            if m.mode() & 0o077 != 0 {
                out.push((e.path(), m.mode() & 0o7777));
            }
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    out
}

/// Item 8: in a 0755 home under umask 022, the journal (with its `-wal`/`-shm` while the
/// gateway runs), the logs and every other file are 0600 and folders 0700; a journal left
/// 0644 by an older build is narrowed at the next start.
#[test]
fn journal_and_every_file_in_a_0755_home_are_private_under_umask_022() {
    let home = TempHome::new();
    set_mode(home.path(), 0o755);
    let sw = Sweeper::new();
    let wrapper = umask_022_wrapper(&home);
    let port = api::free_port();
    write_config(home.path(), &format!("listen = \"127.0.0.1:{port}\"\n{ECHO}"));
    // The operator's own file (written here by the test): theirs to keep private.
    set_mode(&home.file("config.toml"), 0o600);
    let start = |what: &str| {
        let out = cli_with(&wrapper, home.path(), &["start"], &[(TAG_VAR, sw.tag())], Duration::from_secs(30));
        assert_cli(&out, 0, what);
        let (_, _, addr) = wait_new_ready(home.path(), &[], READY).expect("gateway ready");
        let r = Api::new(addr).send("c1", "u1", "the secret plan").expect("send");
        assert_eq!(r.status, 200, "{r:?}");
    };
    start("first start");
    let journal = home.file("journal.sqlite3");
    for f in ["journal.sqlite3", "journal.sqlite3-wal", "journal.sqlite3-shm"] {
        assert!(home.exists(f), "{f} exists while the gateway runs");
    }
    let bad = exposed(home.path());
    assert!(bad.is_empty(), "files or folders open to others in the home: {bad:?}");

    assert_cli(&run_cli(&home, &["stop"]), 0, "stop");
    // What an older build left: a world-readable journal.
    set_mode(&journal, 0o644);
    start("second start");
    let bad = exposed(home.path());
    assert!(bad.is_empty(), "an old 0644 journal is narrowed at start: {bad:?}");
    assert_cli(&run_cli(&home, &["stop"]), 0, "stop");
    assert!(sw.sweep().is_empty(), "nothing left running");
}

/// Item 14: a FIFO in place of `journal.sqlite3` (or its `-wal`) makes `check` fail at once,
/// naming the journal, instead of hanging in SQLite's open; `run` refuses it too.
#[test]
fn check_and_run_refuse_a_fifo_journal_at_once() {
    for name in ["journal.sqlite3", "journal.sqlite3-wal"] {
        let home = TempHome::new();
        write_config(home.path(), ECHO);
        if name != "journal.sqlite3" {
            // A real journal first, then the FIFO beside it.
            let mut g = start(&home);
            g.signal(15);
            g.wait_exit(EXIT);
            let _ = std::fs::remove_file(home.file(name));
        }
        mkfifo(&home.file(name));
        let t0 = Instant::now();
        let out = cli_with(bin(), home.path(), &["check"], &[], Duration::from_secs(20));
        assert!(t0.elapsed() < Duration::from_secs(5), "{name}: check took {:?}", t0.elapsed());
        assert_cli(&out, 1, &format!("check with a FIFO at {name}"));
        let line = out.stdout.lines().find(|l| l.contains("journal")).unwrap_or_default().to_string();
        assert!(line.contains("FAIL") && line.contains("not a regular file"), "{name}: {out:?}");

        let mut g = builder(&home).spawn();
        let status = g.try_wait_exit(Duration::from_secs(10));
        assert!(status.is_some_and(|s| !s.success()), "{name}: run must refuse the FIFO journal: {}", g.diag());
        assert!(g.stderr().contains("not a regular file"), "{name}: {}", g.stderr_tail(10));
    }
}

mod tg {
    use super::*;
    pub use gatewarden_telegram_fake::{FakeTelegram, Options};
    use std::sync::atomic::{AtomicU32, Ordering};

    pub const TOKEN_ENV: &str = "GW_TEST_TELEGRAM_TOKEN";

    /// A token no other test uses (the credential lock is keyed by it).
    pub fn token() -> String {
        static N: AtomicU32 = AtomicU32::new(1);
        format!("{}{:04}:tok-r2-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed), std::process::id())
    }

    pub fn fake() -> FakeTelegram {
        FakeTelegram::start(Options { linger: Duration::from_millis(800), ..Options::default() }).expect("fake Bot API")
    }

    pub fn config(fake: &FakeTelegram, agent: &str, extra: &str) -> String {
        format!(
            "drain_timeout_s = 2\n[agent]\nbackend = \"echo\"\n{agent}\n{extra}\n\
             [[platform]]\nkind = \"telegram\"\naccess = \"open\"\nrequire_mention = false\ntoken_env = \"{TOKEN_ENV}\"\napi_base = \"{}\"\n\
             poll_timeout_s = 2\nconflict_standby_s = 2\n",
            fake.base_url()
        )
    }

    pub fn spawn(home: &TempHome, sw: &Sweeper, token: &str, config: &str) -> Gateway {
        write_config(home.path(), config);
        let creds = home.root().join("creds");
        let mut g = builder(home)
            .env(TAG_VAR, sw.tag())
            .env(TOKEN_ENV, token)
            .env("GATEWARDEN_CREDS_DIR", creds.as_os_str())
            .spawn();
        g.wait_ready(READY);
        g
    }

    /// `gatewarden_platform_outbox{platform="telegram",state=...}` from `/metrics`.
    pub fn outbox(api: &Api, state: &str) -> Option<u64> {
        let m = api.get("/metrics").ok()?.text();
        let key = format!("gatewarden_platform_outbox{{platform=\"telegram\",state=\"{state}\"}} ");
        m.lines().find_map(|l| l.strip_prefix(&key)).and_then(|v| v.trim().parse().ok())
    }
}

/// Item 9: outbox entries already sent are pruned like finished messages. Twelve 150 KiB
/// messages are answered (1.8 MB of replies in the outbox) with `max_size_mb = 1`; after the
/// restart's retention pass at most the bound's worth of sent entries is left.
#[test]
fn sent_outbox_entries_are_pruned_by_the_size_bound() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    let fake = tg::fake();
    let tok = tg::token();
    let config = tg::config(&fake, "", "[journal]\nmax_size_mb = 1\n");
    let mut g = tg::spawn(&home, &sw, &tok, &config);
    let big = "z".repeat(150 * 1024);
    for i in 0..12 {
        fake.inject(&tok, 500 + i, 1, &format!("{i} {big}"));
    }
    let api = Api::new(g.listen());
    must_wait_until(Duration::from_secs(60), "all 12 replies sent", || tg::outbox(&api, "sent") == Some(12));
    assert_cli(&run_cli(&home, &["stop"]), 0, "stop");
    g.wait_exit(EXIT);

    let g = tg::spawn(&home, &sw, &tok, &config);
    let api = Api::new(g.listen());
    // Retention runs at start: 1 MiB holds at most 6 of these replies (and no message beside).
    must_wait_until(READY, "sent outbox entries pruned to the size bound", || {
        tg::outbox(&api, "sent").is_some_and(|n| n <= 6)
    });
    drop(g);
    let _ = sw.sweep();
}

/// Item 9: queued messages are capped per chat and in all, and a message past a cap is refused
/// with 429 (HTTP) — never by deleting queued work. Each run takes a minute, so after the 64
/// concurrent runs the rest wait queued.
#[test]
fn queued_messages_past_the_caps_are_refused_with_429_and_none_is_deleted() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    let config = "[agent]\nbackend = \"echo\"\ndelay_ms = 60000\n[journal]\nmax_queued_per_chat = 3\nmax_queued = 5\n";
    let g = gateway(&home, &sw, config);
    let api = Api::new(g.listen());
    let mut ids = Vec::new();
    let mut refused = None;
    for i in 0..200 {
        let r = api.send_async("flood", "u1", &format!("m{i}")).expect("post");
        match r.status {
            202 => ids.push(r.json().unwrap()["message_id"].as_str().unwrap().to_string()),
            429 => {
                refused = Some(r);
                break;
            }
            s => panic!("unexpected {s}: {r:?}"),
        }
    }
    let r = refused.expect("a 429 once the chat's queue is full");
    assert!(header(&r, "retry-after").is_some(), "{r:?}");
    assert!(r.text().contains("max_queued_per_chat"), "{r:?}");
    // 64 running plus 3 queued, give or take a run not yet claimed.
    assert!(ids.len() <= 64 + 3 + 2, "{} accepted before the cap", ids.len());
    // Other chats still get in, up to the total cap.
    let mut more = 0;
    let total = loop {
        let r = api.send_async(&format!("other{more}"), "u1", "hello").expect("post");
        if r.status == 429 {
            break r;
        }
        assert_eq!(r.status, 202, "{r:?}");
        ids.push(r.json().unwrap()["message_id"].as_str().unwrap().to_string());
        more += 1;
        assert!(more < 10, "the total cap never refused");
    };
    assert!(total.text().contains("max_queued ="), "{total:?}");
    // Nothing accepted was deleted to make room.
    for id in &ids {
        let m = api.message(id).unwrap_or_else(|| panic!("message {id} deleted"));
        assert!(matches!(m["state"].as_str(), Some("queued" | "running")), "{m}");
    }
    drop(g);
    let _ = sw.sweep();
}

/// Item 9: a platform chat past its cap is told once (while it stays full), with a notice that
/// names the cap, and the messages it sent meanwhile are not journaled.
#[test]
fn a_platform_chat_past_its_queue_cap_is_told_once() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    let fake = tg::fake();
    let tok = tg::token();
    let config = tg::config(&fake, "delay_ms = 60000", "[journal]\nmax_queued_per_chat = 2\n");
    let g = tg::spawn(&home, &sw, &tok, &config);
    let metric = |state: &str| -> Option<u64> {
        let m = Api::new(g.listen()).get("/metrics").ok()?.text();
        let key = format!("gatewarden_journal_messages{{state=\"{state}\"}} ");
        m.lines().find_map(|l| l.strip_prefix(&key)).and_then(|v| v.trim().parse().ok())
    };
    // Every run slot busy (64 chats, one minute-long run each), so chat 77's messages stay queued.
    for chat in 0..64 {
        fake.inject(&tok, 1000 + chat, 1, "busy");
    }
    must_wait_until(Duration::from_secs(20), "64 runs", || metric("running") == Some(64));
    for i in 0..10 {
        fake.inject(&tok, 77, 1, &format!("m{i}"));
    }
    let told = fake
        .wait_sent(&tok, Duration::from_secs(30), |s| s.iter().any(|m| m.text.contains("max_queued_per_chat")))
        .unwrap_or_else(|s| panic!("no queue-full notice: {s:#?}"));
    assert!(told.iter().all(|m| m.chat_id == json!(77)), "{told:#?}");
    let quiet = holds_for(Duration::from_secs(2), || {
        fake.sent(&tok).iter().filter(|m| m.text.contains("max_queued_per_chat")).count() == 1
    });
    assert!(quiet.is_ok(), "told more than once: {:#?}", fake.sent(&tok));
    assert_eq!(metric("queued"), Some(2), "the chat's queue stays at its cap, the rest were not taken");
    drop(g);
    let _ = sw.sweep();
}

/// Item 12: an `api_token` shorter than 16 bytes stops the gateway at start (exit 78, the key
/// named), and `doctor` says how to make a good one.
#[test]
fn short_api_tokens_are_refused_and_doctor_says_how_to_make_one() {
    for token in ["x", "0123456789abcde"] {
        let home = TempHome::new();
        write_config(home.path(), &format!("api_token = \"{token}\"\n{ECHO}"));
        let mut g = builder(&home).spawn();
        let st = g.wait_exit(EXIT);
        assert_exit_code(&g, st, 78, &format!("api_token {token:?}"));
        assert!(
            g.stderr().contains("'api_token'") && g.stderr().contains("16 bytes"),
            "{token:?}: {}",
            g.stderr_tail(10)
        );
        let out = run_cli(&home, &["doctor"]);
        assert_cli(&out, 1, "doctor");
        assert!(out.stdout.contains("api_token") && out.stdout.contains("openssl rand -hex 32"), "{out:?}");
    }
    // Sixteen bytes are enough.
    let home = TempHome::new();
    write_config(home.path(), &format!("api_token = \"0123456789abcdef\"\n{ECHO}"));
    let mut g = builder(&home).spawn();
    g.wait_ready(READY);
}

/// How a loopback "release server" misbehaves.
#[derive(Clone, Copy, Debug)]
enum Stall {
    /// Reads the request and never answers.
    Silent,
    /// Sends the response headers, then nothing.
    AfterHeaders,
    /// Sends the headers, then one byte every 300 ms.
    Trickle,
}

/// A loopback HTTP server that misbehaves as `how` on every connection (each held for a minute
/// at most, on its own thread).
fn stalling_server(how: Stall) -> std::net::SocketAddr {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                let _ = s.read(&mut buf);
                let until = Instant::now() + Duration::from_secs(60);
                if !matches!(how, Stall::Silent) {
                    let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 10000000\r\n\r\n");
                }
                while Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(300));
                    if matches!(how, Stall::Trickle) && s.write_all(b"x").is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// A loopback address whose accept queue is full (backlog 0, already filled and never
/// accepted): a connect to it hangs, as to a host that drops SYNs. The sockets are leaked for
/// the test's life.
fn unconnectable() -> std::net::SocketAddr {
    use rustix::net::{AddressFamily, SocketType, bind, connect, listen, socket};
    let l = socket(AddressFamily::INET, SocketType::STREAM, None).unwrap();
    bind(&l, &std::net::SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
    listen(&l, 0).unwrap();
    let addr: std::net::SocketAddr = match rustix::net::getsockname(&l).unwrap().try_into() {
        Ok(a) => a,
        Err(_) => panic!("not an inet address"),
    };
    // Fill the queue: these handshakes complete, later SYNs are dropped.
    for _ in 0..4 {
        let c = socket(AddressFamily::INET, SocketType::STREAM, None).unwrap();
        rustix::io::ioctl_fionbio(&c, true).unwrap();
        let _ = connect(&c, &addr);
        std::mem::forget(c);
    }
    std::mem::forget(l);
    addr
}

/// Internal bounds for downloads in these tests: connect, first byte, idle gap, total (ms).
const DOWNLOAD_LIMITS: (&str, &str) = ("GATEWARDEN_TEST_DOWNLOAD_LIMITS_MS", "3000,1000,2000,4000");

/// A private copy of the binary (an update swaps the file it runs from: never the build's).
fn private_exe(home: &TempHome) -> PathBuf {
    let exe = home.root().join("bin-gatewarden");
    std::fs::copy(bin(), &exe).unwrap();
    set_mode(&exe, 0o755);
    exe
}

/// Item 6: a release server that stalls (silent, after the headers, trickling) ends the update
/// within its bounds, naming the bound that fired; `update.lock` is free again and the refusal
/// is in the ledger.
#[test]
fn update_downloads_are_bounded_and_name_the_bound_that_fired() {
    let cases = [
        (None, "connect timeout"),
        (Some(Stall::Silent), "first-byte timeout"),
        (Some(Stall::AfterHeaders), "idle timeout"),
        (Some(Stall::Trickle), "total timeout"),
    ];
    for (how, bound) in cases {
        let home = TempHome::new();
        let sw = Sweeper::new();
        let exe = private_exe(&home);
        write_config(home.path(), ECHO);
        let server = match how {
            Some(how) => stalling_server(how),
            None => unconnectable(),
        };
        let url = format!("http://{server}/gatewarden");
        let t0 = Instant::now();
        let out = cli_with(
            &exe,
            home.path(),
            &["update", "--from", &url, "--sha256", &"0".repeat(64)],
            &[(TAG_VAR, sw.tag()), DOWNLOAD_LIMITS],
            Duration::from_secs(30),
        );
        assert!(t0.elapsed() < Duration::from_secs(15), "{how:?}: took {:?}", t0.elapsed());
        assert_cli(&out, 1, &format!("{how:?}"));
        assert!(out.stderr.contains(bound), "{how:?}: expected {bound}: {out:?}");
        assert!(lock_holders(&home.file("update.lock")).is_empty(), "{how:?}: update.lock still held");
        assert!(home.ledger_text().contains(bound), "{how:?}: {}", home.ledger_text());
        assert!(sw.sweep().is_empty(), "{how:?}: the updater is gone");
    }
}

/// Item 6: a chat `/update` whose release server stalls after the headers gets its outcome
/// notice (naming the bound), and the next update is not refused for a stale updater.
#[test]
fn chat_update_from_a_stalling_server_still_gets_its_outcome_notice() {
    const TOKEN: &str = "t0k-0123456789abcdef";
    let home = TempHome::new();
    let sw = Sweeper::new();
    let exe = private_exe(&home);
    let url = format!("http://{}/gatewarden", stalling_server(Stall::AfterHeaders));
    write_config(
        home.path(),
        &format!(
            "api_token = \"{TOKEN}\"\nadmins = [\"u1\"]\n{ECHO}[update]\nsource = \"{url}\"\n\
             public_key = \"RWQf6LRCGA9i53mlYecO4IzT51TGPpvWucNSCh1CBM0QTaLn73Y7GFO3\"\n"
        ),
    );
    let mut g =
        GatewayBuilder::new(&exe, &home).env(TAG_VAR, sw.tag()).env(DOWNLOAD_LIMITS.0, DOWNLOAD_LIMITS.1).spawn();
    let addr = g.wait_ready(READY);
    let api = Api::new(addr).with_token(TOKEN);
    let r = api.send("C1", "u1", "/update").expect("/update");
    assert_eq!(r.status, 200, "{r:?}");
    let mut got = Vec::new();
    must_wait_until(Duration::from_secs(20), "the outcome notice", || {
        got.extend(api.notices("C1").unwrap_or_default());
        !got.is_empty()
    });
    assert!(got[0].contains("update refused") && got[0].contains("idle timeout"), "{got:?}");
    must_wait_until(READY, "update.lock released", || lock_holders(&home.file("update.lock")).is_empty());
    drop(g);
    let _ = sw.sweep();
}

/// Item 7: with `[update] public_key` set, a validly signed release older than the running
/// version is refused, before its preflight; `--allow-downgrade` on the command line lets it
/// through to the next step (the fixture then fails its preflight, by design); a chat
/// `/update` never downgrades. Fixture: `fixtures/downgrade/` (0.0.1, signed).
#[test]
fn signed_older_releases_are_refused_unless_the_cli_allows_a_downgrade() {
    const TOKEN: &str = "t0k-0123456789abcdef";
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/downgrade");
    let key = std::fs::read_to_string(fixtures.join("key.pub")).unwrap();
    let home = TempHome::new();
    let sw = Sweeper::new();
    let exe = private_exe(&home);
    let rel = home.root().join("old-release.sh");
    std::fs::copy(fixtures.join("release.sh"), &rel).unwrap();
    std::fs::copy(fixtures.join("release.sh.minisig"), home.root().join("old-release.sh.minisig")).unwrap();
    set_mode(&rel, 0o755);
    let rel = rel.to_str().unwrap();
    write_config(
        home.path(),
        &format!(
            "api_token = \"{TOKEN}\"\nadmins = [\"u1\"]\n{ECHO}[update]\npublic_key = \"{}\"\nsource = \"{rel}\"\n",
            key.trim()
        ),
    );
    downgrade_needs_the_flag(&exe, &home, &sw, rel, "a signed downgrade");

    // Chat: the gateway runs `update` for the chat, never with the flag.
    let mut g = GatewayBuilder::new(&exe, &home).env(TAG_VAR, sw.tag()).spawn();
    let api = Api::new(g.wait_ready(READY)).with_token(TOKEN);
    assert_eq!(api.send("C1", "u1", "/update").expect("/update").status, 200);
    let mut got = Vec::new();
    must_wait_until(Duration::from_secs(30), "the outcome notice", || {
        got.extend(api.notices("C1").unwrap_or_default());
        !got.is_empty()
    });
    assert!(got[0].contains("update refused") && got[0].contains("not newer"), "{got:?}");
    drop(g);
    let _ = sw.sweep();
}

/// Issue 27 §7: without `[update] public_key` too, an older release (the same 0.0.1 fixture,
/// unsigned here) is refused before its preflight, and `--allow-downgrade` lets it through to
/// the next step (0.1.0 → 0.0.1 was installed silently, exit 0).
#[test]
fn unsigned_older_releases_are_refused_unless_the_cli_allows_a_downgrade() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/downgrade");
    let home = TempHome::new();
    let sw = Sweeper::new();
    let exe = private_exe(&home);
    let rel = home.root().join("old-release.sh");
    std::fs::copy(fixtures.join("release.sh"), &rel).unwrap();
    set_mode(&rel, 0o755);
    let rel = rel.to_str().unwrap();
    write_config(home.path(), ECHO);
    downgrade_needs_the_flag(&exe, &home, &sw, rel, "an unsigned downgrade");
    let _ = sw.sweep();
}

/// `update --from rel` (the 0.0.1 fixture) is refused as not newer than the running version,
/// before its preflight and in the ledger; `--allow-downgrade` gets it past that rule to the
/// fixture's failing preflight.
#[track_caller]
fn downgrade_needs_the_flag(exe: &Path, home: &TempHome, sw: &Sweeper, rel: &str, what: &str) {
    let update = |args: &[&str]| {
        let mut all = vec!["update", "--from", rel];
        all.extend_from_slice(args);
        cli_with(exe, home.path(), &all, &[(TAG_VAR, sw.tag())], Duration::from_secs(60))
    };
    let out = update(&[]);
    assert_cli(&out, 1, what);
    assert!(out.stderr.contains("not newer than the running") && out.stderr.contains("--allow-downgrade"), "{out:?}");
    assert!(!out.stderr.contains("preflight"), "refused before its preflight: {out:?}");
    let refused = home.events("update_refused");
    assert!(
        refused.last().is_some_and(|e| e["reason"].as_str().is_some_and(|r| r.contains("not newer"))),
        "{refused:?}"
    );
    let out = update(&["--allow-downgrade"]);
    assert_cli(&out, 1, "an allowed downgrade (whose preflight fails)");
    assert!(out.stderr.contains("signed old release: preflight refuses"), "got past the version rule: {out:?}");
}

/// A candidate release: a script whose `--version` says `version`, whose `check` is the real
/// check of `pristine`, and whose `run` does `run_body`.
fn candidate(home: &TempHome, pristine: &Path, name: &str, version: &str, run_body: &str) -> PathBuf {
    let path = home.root().join(name);
    let text = format!(
        "#!/bin/sh\ncase \"$*\" in\n  *--version*) echo \"gatewarden {version}\";;\n  *\" check\"*) exec {} \"$@\";;\n  *) {run_body};;\nesac\n",
        pristine.display()
    );
    std::fs::write(&path, text).unwrap();
    set_mode(&path, 0o755);
    path
}

/// A gateway running from a private copy of the binary (what an update swaps), with a
/// pristine copy beside it for candidates to delegate to.
fn update_rig(home: &TempHome, sw: &Sweeper, config: &str) -> (PathBuf, PathBuf, Gateway) {
    let exe = private_exe(home);
    let pristine = home.root().join("pristine-gatewarden");
    std::fs::copy(bin(), &pristine).unwrap();
    set_mode(&pristine, 0o755);
    write_config(home.path(), &format!("{ECHO}{config}"));
    let mut g = GatewayBuilder::new(&exe, home).env(TAG_VAR, sw.tag()).spawn();
    g.wait_ready(READY);
    (exe, pristine, g)
}

/// Item 11: `update --json` whose candidate dies at start rolls back, and the restart inside
/// it prints nothing on stdout: stdout is the one JSON outcome.
#[test]
fn update_json_prints_only_the_json_document_on_the_rollback_path() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    let (exe, pristine, _g) = update_rig(&home, &sw, "[update]\nprobation_s = 1\n");
    let c = candidate(&home, &pristine, "dies.sh", "9.9.9", "echo dying >&2; exit 3");
    let out = cli_with(
        &exe,
        home.path(),
        &["update", "--from", c.to_str().unwrap(), "--json", "--timeout", "20"],
        &[(TAG_VAR, sw.tag())],
        Duration::from_secs(90),
    );
    assert_cli(&out, 1, "update to a dying candidate");
    let v: Value = serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}): {:?}", out.stdout));
    assert_eq!(v["ok"], json!(false), "{v}");
    assert_eq!(v["update"]["phase"], json!("rolled_back"), "{v}");
    // Its restart is refused (the candidate never says it is prepared); those lines are stderr's.
    assert!(out.stderr.contains("restart refused"), "the restart's lines go to stderr: {out:?}");
    // The releases the update kept live in private folders (item 8), whatever the umask.
    let open_dirs: Vec<_> = exposed(home.path()).into_iter().filter(|(p, _)| p.is_dir()).collect();
    assert!(open_dirs.is_empty(), "folders open to others in the home: {open_dirs:?}");
    // An error before any transaction is JSON too.
    let out = cli_with(&exe, home.path(), &["update", "--json"], &[(TAG_VAR, sw.tag())], Duration::from_secs(30));
    assert_cli(&out, 1, "update --json without --from");
    let v: Value = serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    assert_eq!(v["ok"], json!(false), "{v}");
    assert_cli(&run_cli_at(home.path(), &["stop"]), 0, "stop");
    let _ = sw.sweep();
}

/// Item 13: 500 connections each send all but the last byte of a 2 MiB body and hold it. The
/// gateway's memory stays within the documented 64 MiB for bodies in flight (issue 31 item 7:
/// it grew 170-224 MB, 91 MiB on a debug build here; docs/security.md: 48 MiB of bodies and at
/// most 16 KiB of read buffer per connection), health stays answered, a head over that buffer
/// gets 431, and once they are gone a normal message gets through.
#[test]
fn unfinished_bodies_on_many_connections_cannot_take_the_memory() {
    use std::io::Write;
    const CONNS: usize = 500;
    const BODY: usize = 2 * 1024 * 1024;
    let home = TempHome::new();
    let sw = Sweeper::new();
    // Room for every connection, and time: only the budget protects the memory here.
    let g = gateway(&home, &sw, &format!("{ECHO}[http]\nmax_connections = 1000\nbody_timeout_s = 120\n"));
    let addr = g.listen();
    let base = rss_bytes(g.pid());
    let head = format!(
        "POST /v1/messages HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {BODY}\r\n\r\n"
    );
    let chunk = vec![b' '; BODY - 1];
    let t0 = Instant::now();
    let mut conns = Vec::new();
    let mut peak = base;
    for _ in 0..CONNS {
        let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5)) else { continue };
        s.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
        let _ = s.write_all(head.as_bytes()).and_then(|_| s.write_all(&chunk));
        conns.push(s);
        peak = peak.max(rss_bytes(g.pid()));
        assert!(t0.elapsed() < Duration::from_secs(120), "the flood is bounded in time");
    }
    for _ in 0..20 {
        peak = peak.max(rss_bytes(g.pid()));
        std::thread::sleep(Duration::from_millis(100));
    }
    let grew = peak.saturating_sub(base);
    eprintln!(
        "RSS {} MiB -> peak {} MiB (+{} MiB) under {CONNS} unfinished 2 MiB bodies",
        base >> 20,
        peak >> 20,
        grew >> 20
    );
    assert!(grew <= 64 << 20, "RSS grew by {} MiB, over the documented 64 MiB", grew >> 20);
    assert_eq!(http_get(addr, "/healthz", Duration::from_secs(5)).map(|r| r.status).ok(), Some(200));
    // A head must fit in a connection's read buffer.
    let big = "x".repeat(20 << 10);
    let r = gatewarden_testkit::http_request(addr, "GET", "/healthz", &[("X-Big", &big)], None, Duration::from_secs(5));
    assert_eq!(r.map(|r| r.status).ok(), Some(431), "a 20 KiB head");
    drop(conns);
    let api = Api::new(addr);
    must_wait_until(Duration::from_secs(20), "a message gets through after the flood", || {
        api.send("c1", "u1", "after").is_ok_and(|r| r.status == 200)
    });
    drop(g);
    let _ = sw.sweep();
}

/// Item 15: another user pre-created `/tmp/gatewarden-<uid>` (here: `$TMPDIR/gatewarden-<uid>`,
/// owned by `nobody` when the test runs as root, else open to everyone). A `start` whose only
/// platform is a Telegram adapter that cannot take its credential lock there exits non-zero,
/// naming why, instead of reporting a gateway that serves nothing.
#[test]
fn start_fails_when_its_only_platform_cannot_run() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    let fake = tg::fake();
    let tok = tg::token();
    let tmp = home.root().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let uid = rustix::process::getuid().as_raw();
    let squatted = tmp.join(format!("gatewarden-{uid}"));
    std::fs::create_dir(&squatted).unwrap();
    if uid == 0 {
        std::os::unix::fs::chown(&squatted, Some(65534), Some(65534)).unwrap();
        set_mode(&squatted, 0o755);
    } else {
        set_mode(&squatted, 0o777);
    }
    let port = api::free_port();
    write_config(home.path(), &format!("listen = \"127.0.0.1:{port}\"\n{}", tg::config(&fake, "", "")));
    let env = [
        (TAG_VAR, sw.tag()),
        (tg::TOKEN_ENV, tok.as_str()),
        ("TMPDIR", tmp.to_str().unwrap()),
        ("XDG_RUNTIME_DIR", ""),
        ("GATEWARDEN_CREDS_DIR", ""),
    ];
    let out = cli_with(bin(), home.path(), &["start"], &env, Duration::from_secs(30));
    assert!(!out.panicked(), "{out:?}");
    assert_eq!(out.code, Some(78), "the only platform cannot run: {out:?}");
    let text = format!("{}{}", out.stderr, out.stdout);
    assert!(text.contains("credential lock") && text.contains(&squatted.display().to_string()), "{out:?}");
    assert!(sw.sweep().is_empty(), "no gateway left running");
}

/// The processes tagged for `sw` whose command line mentions `word`.
fn tagged_running(sw: &Sweeper, word: &str) -> Vec<(u32, Vec<String>)> {
    sw.tagged()
        .into_iter()
        .map(|p| (p, sweep::cmdline_of(p)))
        .filter(|(_, c)| c.iter().any(|a| a.contains(word)))
        .collect()
}

/// The shell that finds `--home` among a candidate's arguments.
const FIND_HOME: &str = "H=; prev=; for a in \"$@\"; do [ \"$prev\" = --home ] && H=\"$a\"; prev=\"$a\"; done";

/// Item 10: every process an update's candidate started is ended before the transaction ends:
/// a candidate that hangs without taking the lock (and without the listener), and a candidate
/// whose forked child takes the lock and keeps it after the candidate exited. Both roll back to
/// the old version, which runs alone.
#[test]
fn an_updates_candidates_and_their_children_are_ended_before_it_finishes() {
    let cases = [
        ("hangs", "exec 3>&-; sleep 300".to_owned()),
        (
            "forks",
            format!(
                "exec 3>&-; {FIND_HOME}; ( exec 9>>\"$H/gateway.lock\"; flock -x 9; exec sleep 301 ) & sleep 0.2; exit 3"
            ),
        ),
    ];
    for (name, body) in cases {
        let home = TempHome::new();
        let sw = Sweeper::new();
        let (exe, pristine, _g) = update_rig(&home, &sw, "[update]\nprobation_s = 1\n");
        let c = candidate(&home, &pristine, &format!("{name}.sh"), "9.9.9", &body);
        let out = cli_with(
            &exe,
            home.path(),
            &["update", "--from", c.to_str().unwrap(), "--timeout", "15"],
            &[(TAG_VAR, sw.tag())],
            Duration::from_secs(150),
        );
        assert_cli(&out, 1, &format!("{name}: update to a candidate that never serves"));
        let t = home.read_json("update.json").unwrap_or(Value::Null);
        assert_eq!(t["phase"], json!("rolled_back"), "{name}: {t}\n{out:?}\n{}", home.ledger_text());
        let left = tagged_running(&sw, "sleep");
        assert!(
            left.is_empty(),
            "{name}: the candidate's processes outlived the update: {left:?}\n{out:?}\n{}",
            home.ledger_text()
        );
        let st = cli(&exe, home.path(), &["status", "--json"]);
        assert_eq!(st.json()["state"], json!("running"), "{name}: {st:?}");
        assert_eq!(st.json()["version"], json!(version_of_bin()), "{name}: {st:?}");
        assert_cli(&run_cli_at(home.path(), &["stop"]), 0, &format!("{name}: stop"));
        let _ = sw.sweep();
    }
}

fn version_of_bin() -> String {
    let out = std::process::Command::new(bin()).arg("--version").output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().trim_start_matches("gatewarden ").to_owned()
}
