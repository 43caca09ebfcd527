//! One gateway with a Telegram (fake Bot API), a Matrix (real Synapse) and an IRC
//! (real ngIRCd) adapter, restarted over and over under a steady inbound stream on all three.
//! Under `CI` a missing Synapse or ngIRCd fails the test. Prints and replays its seed
//! (GW_PLATFORM_SEED); the restart count is GW_PLATFORM_RESTARTS (default 50).
#![cfg(target_os = "linux")]

mod common;
mod work_common;
use common::*;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use work_common::*;

use gatewarden_chatproto::irc::{self, Connection, Event};
use gatewarden_chatproto::matrix::Client;
use gatewarden_telegram_fake::{FakeTelegram, Options};
use gatewarden_testkit::servers::{Ngircd, Synapse};

const TG_ENV: &str = "GW_TEST_MIXED_TG";
const MX_ENV: &str = "GW_TEST_MIXED_MX";
const BOT: &str = "gwbot";
/// An IRC message may be lost only when sent this close before the bot's QUIT reached the
/// sender (the server handled it after our QUIT: IRC keeps nothing for the successor).
const IRC_LOSS_WINDOW: Duration = Duration::from_secs(2);

/// xorshift pacing: 10..50 ms.
fn pace(x: &mut u64) -> Duration {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    Duration::from_millis(10 + *x % 40)
}

/// Counts of each text in `said`.
fn tally<'a>(said: impl Iterator<Item = &'a str>) -> HashMap<&'a str, usize> {
    let mut m = HashMap::new();
    for t in said {
        *m.entry(t).or_default() += 1;
    }
    m
}

#[test]
fn three_adapters_restarted_under_a_steady_stream_lose_and_repeat_nothing() {
    // CI runs the short form; scripts/soak-platforms the long one (50 restarts, issue 10).
    let restarts: u32 = std::env::var("GW_PLATFORM_RESTARTS").ok().and_then(|v| v.parse().ok()).unwrap_or(15);
    let seed: u64 = std::env::var("GW_PLATFORM_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    });
    eprintln!("seed {seed} (replay with GW_PLATFORM_SEED={seed}), {restarts} restarts");
    let Some(synapse) = Synapse::start() else { return };
    let Some(ngircd) = Ngircd::start() else { return };
    let fake = Arc::new(
        FakeTelegram::start(Options { linger: Duration::from_millis(800), ..Options::default() })
            .expect("fake Bot API"),
    );
    let tg_token = format!("{}77:mixed", std::process::id());

    let bot = synapse.register("gwbot", "pw-gwbot");
    let alice = synapse.register("alice", "pw-alice");
    let mut mx = Client::new(&synapse.base_url(), Duration::from_secs(30)).unwrap();
    mx.set_access_token(alice.access_token.clone());
    mx.whoami().unwrap();
    let room = mx.create_room(&[&bot.user_id]).unwrap();
    let mx_since = mx.sync(None, Duration::ZERO).unwrap().next_batch;

    let mut user = Connection::connect(&irc::Config::new(ngircd.addr().to_string(), "alice")).unwrap();
    user.join("#gw", Duration::from_secs(10)).unwrap();

    let config = format!(
        "drain_timeout_s = 10\n[agent]\nbackend = \"echo\"\n\
         [[platform]]\nkind = \"telegram\"\ntoken_env = \"{TG_ENV}\"\napi_base = \"{}\"\npoll_timeout_s = 2\n\
         [[platform]]\nkind = \"matrix\"\ntoken_env = \"{MX_ENV}\"\napi_base = \"{}\"\nallowed_chats = [\"{room}\"]\npoll_timeout_s = 2\n\
         [[platform]]\nkind = \"irc\"\nserver = \"{}\"\nnick = \"{BOT}\"\nallowed_chats = [\"#gw\"]\nconflict_standby_s = 10\n",
        fake.base_url(),
        synapse.base_url(),
        ngircd.addr()
    );
    let (home, sw) = (TempHome::new(), Sweeper::new());
    write_config(home.path(), &config);
    let creds = std::env::temp_dir().join(format!("gw-creds-test-{}", std::process::id()));
    let mut g0 = builder(&home)
        .env(TAG_VAR, sw.tag())
        .env(TG_ENV, &tg_token)
        .env(MX_ENV, &bot.access_token)
        .env("GATEWARDEN_CREDS_DIR", creds)
        .spawn();
    g0.wait_ready(READY);
    let connected = wait_until(READY, || {
        let out = run_cli(&home, &["status", "--json"]);
        let p = serde_json::from_str::<Value>(&out.stdout).map(|v| v["platforms"].clone()).unwrap_or(Value::Null);
        (0..3).all(|i| p[i]["state"] == "connected")
    });
    assert!(connected, "adapters not all connected");
    eprintln!("all three adapters connected");

    let stop = Arc::new(AtomicBool::new(false));
    // Telegram: the fake keeps what arrives during a restart.
    let tg_sent = Arc::new(AtomicU32::new(0));
    let tg = {
        let (fake, tok, stop, n) = (Arc::clone(&fake), tg_token.clone(), Arc::clone(&stop), Arc::clone(&tg_sent));
        std::thread::spawn(move || {
            let mut x = seed | 1;
            while !stop.load(Ordering::Relaxed) {
                fake.inject(&tok, 1, 1, &format!("tg {}", n.fetch_add(1, Ordering::Relaxed)));
                std::thread::sleep(pace(&mut x));
            }
        })
    };
    // Matrix: sends (retried with the same transaction id), and a reader collecting the bot's
    // messages with back-to-back syncs.
    let mx_sent = Arc::new(AtomicU32::new(0));
    let mx_said = Arc::new(Mutex::new(Vec::<String>::new()));
    let mx_tx = {
        let (c, room, stop, n) = (mx.clone(), room.clone(), Arc::clone(&stop), Arc::clone(&mx_sent));
        std::thread::spawn(move || {
            let mut x = (seed.rotate_left(17)) | 1;
            while !stop.load(Ordering::Relaxed) {
                let i = n.load(Ordering::Relaxed);
                let end = Instant::now() + Duration::from_secs(20);
                while let Err(e) = c.send_text(&room, &format!("s{i}"), &format!("mx {i}")) {
                    assert!(Instant::now() < end, "cannot send mx {i}: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                }
                n.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(pace(&mut x));
            }
        })
    };
    let mx_done = Arc::new(AtomicBool::new(false));
    let mx_rx = {
        let (c, room, done, said, bot) =
            (mx.clone(), room.clone(), Arc::clone(&mx_done), Arc::clone(&mx_said), bot.user_id.clone());
        std::thread::spawn(move || {
            let mut since = mx_since;
            while !done.load(Ordering::Relaxed) {
                let Ok(b) = c.sync(Some(&since), Duration::from_millis(500)) else { continue };
                assert!(!b.gaps.contains(&room), "the reader's sync skipped events (a gap): counts would be wrong");
                since = b.next_batch;
                let mut s = said.lock().unwrap();
                s.extend(b.messages.into_iter().filter(|m| m.room_id == room && m.sender == bot).map(|m| m.body));
            }
        })
    };
    // IRC: one thread sends (150..750 ms apart) while the bot is in the channel, and records what it says and when
    // it left.
    let irc_state = Arc::new(Mutex::new((Vec::<(u32, Instant)>::new(), Vec::<String>::new(), Vec::<Instant>::new())));
    let irc = {
        let (stop, st) = (Arc::clone(&stop), Arc::clone(&irc_state));
        std::thread::spawn(move || {
            let mut x = (seed.rotate_left(31)) | 1;
            let (mut present, mut next, mut n) = (true, Instant::now(), 0u32);
            let drain_until = |stop: &AtomicBool| stop.load(Ordering::Relaxed);
            let mut quiet_since: Option<Instant> = None;
            loop {
                if drain_until(&stop) {
                    // Collect replies until 3 s pass without one.
                    let q = *quiet_since.get_or_insert_with(Instant::now);
                    if q.elapsed() > Duration::from_secs(3) {
                        return;
                    }
                }
                match user.next_event(Duration::from_millis(5)).expect("the user's IRC connection") {
                    Some(Event::Privmsg { from, target, text, .. }) if from == BOT && target == "#gw" => {
                        st.lock().unwrap().1.push(text);
                        quiet_since = None;
                    }
                    Some(Event::Join { nick, .. }) if nick == BOT => present = true,
                    Some(Event::Other(m)) if m.command == "QUIT" && m.nick() == Some(BOT) => {
                        present = false;
                        st.lock().unwrap().2.push(Instant::now());
                    }
                    _ => {}
                }
                if present && !stop.load(Ordering::Relaxed) && Instant::now() >= next {
                    user.privmsg("#gw", &format!("irc {n}")).unwrap();
                    st.lock().unwrap().0.push((n, Instant::now()));
                    n += 1;
                    // Slower than the adapter's flood control (2 lines/s), as people type.
                    next = Instant::now() + pace(&mut x) * 15;
                }
            }
        })
    };

    let t0 = Instant::now();
    let mut old = vec![g0.pid()];
    for i in 0..restarts {
        let out = cli_tagged(&home, &sw, &["restart", "--timeout", "30"], Duration::from_secs(40));
        assert!(out.code == Some(0), "seed {seed}: restart {i} failed: {out:#?}");
        let (pid, _, _) = wait_new_ready(home.path(), &old, READY).expect("successor ready");
        old.push(pid);
        eprintln!("restart {i} done at {:?}", t0.elapsed());
    }
    stop.store(true, Ordering::Relaxed);
    tg.join().unwrap();
    mx_tx.join().unwrap();
    eprintln!("telegram and matrix senders stopped");
    irc.join().unwrap();
    eprintln!("{restarts} restarts in {:?}; streams stopped", t0.elapsed());
    eprintln!("status: {}", run_cli(&home, &["status", "--json"]).stdout);

    // Telegram and Matrix keep what arrives while no incarnation listens: every message is
    // answered exactly once.
    let tg_total = tg_sent.load(Ordering::Relaxed) as usize;
    let sent = fake.wait_sent(&tg_token, Duration::from_secs(30), |s| s.len() >= tg_total).unwrap_or_else(|s| s);
    let seen = tally(sent.iter().map(|m| m.text.as_str()));
    let lost: Vec<usize> = (0..tg_total).filter(|n| !seen.contains_key(format!("tg {n}").as_str())).collect();
    let dup: Vec<_> = seen.iter().filter(|(_, c)| **c > 1).collect();
    assert!(lost.is_empty() && dup.is_empty(), "seed {seed}: telegram lost {lost:?}, duplicated {dup:?}");

    let mx_total = mx_sent.load(Ordering::Relaxed) as usize;
    eprintln!("telegram checked");
    wait_until(Duration::from_secs(30), || mx_said.lock().unwrap().len() >= mx_total);
    std::thread::sleep(Duration::from_secs(1));
    mx_done.store(true, Ordering::Relaxed);
    mx_rx.join().unwrap();
    let said = mx_said.lock().unwrap().clone();
    let seen = tally(said.iter().map(String::as_str));
    let lost: Vec<usize> = (0..mx_total).filter(|n| !seen.contains_key(format!("mx {n}").as_str())).collect();
    let dup: Vec<_> = seen.iter().filter(|(_, c)| **c > 1).collect();
    assert!(lost.is_empty() && dup.is_empty(), "seed {seed}: matrix lost {lost:?}, duplicated {dup:?}");

    // IRC: never twice; lost only when sent in the instant the old connection was leaving.
    let (irc_sent, irc_said, quits) = irc_state.lock().unwrap().clone();
    let seen = tally(irc_said.iter().map(String::as_str));
    let dup: Vec<_> = seen.iter().filter(|(_, c)| **c > 1).collect();
    assert!(dup.is_empty(), "seed {seed}: irc duplicated {dup:?}");
    let lost: Vec<&(u32, Instant)> =
        irc_sent.iter().filter(|(n, _)| !seen.contains_key(format!("irc {n}").as_str())).collect();
    for (n, at) in &lost {
        let near_quit = quits.iter().any(|q| *q >= *at && *q - *at <= IRC_LOSS_WINDOW);
        assert!(near_quit, "seed {seed}: irc {n} lost although no QUIT followed within {IRC_LOSS_WINDOW:?}");
    }
    eprintln!(
        "telegram {tg_total} answered once each; matrix {mx_total} answered once each; irc {} sent, {} answered, {} lost at a QUIT ({} QUITs)",
        irc_sent.len(),
        irc_sent.len() - lost.len(),
        lost.len(),
        quits.len()
    );
    assert!(quits.len() as u32 >= restarts, "each restart quits the old IRC connection once");
    assert_cli(&run_cli(&home, &["stop"]), 0, "stop");
}
