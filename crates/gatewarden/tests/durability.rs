//! Issue 3's headline durability test: N async messages are submitted by a client thread while
//! the gateway is restarted (`gatewarden restart`), SIGKILLed (then `gatewarden start`ed
//! again), and SIGKILLed in the middle of a restart, at seeded random points. Afterwards every
//! accepted message (202) ends exactly once: `done` with reply == text, or `failed` with a
//! reason; none is lost (every id resolvable), none ran more than twice, nothing stays queued
//! or running, and the journal holds one row per accepted message.
//!
//! `GW_DURABILITY_SEED=<u64>` replays a run; the seed is printed either way.
#![cfg(target_os = "linux")]

mod common;
mod work_common;
use common::*;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use work_common::*;

const N: usize = 150;
const DISRUPTIONS: usize = 6;

/// splitmix64: small, seedable, good enough to pick disruption points.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[derive(Debug, Clone, Copy)]
enum Disruption {
    /// `gatewarden restart` (drain, successor, verified).
    Restart,
    /// SIGKILL of the gateway, then `gatewarden start`.
    Kill,
    /// `gatewarden restart` in the background, SIGKILL of the old gateway once its successor
    /// is started (mid-drain); the successor takes over and the restart still verifies.
    KillMidRestart,
}

#[derive(Debug)]
enum Submitted {
    Accepted(String),
    Rejected(String),
}

/// SIGKILLs the gateway holding the lock, after checking it is ours (sweeper tag).
fn kill_holder(home: &TempHome, sw: &Sweeper) -> u32 {
    let (pid, ..) = current_gateway(home.path()).expect("a gateway to kill");
    assert!(sw.tagged().contains(&pid), "lock holder {pid} is not one of this test's processes");
    let st = std::process::Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap();
    assert!(st.success());
    // Not just `!pid_alive`: a multi-threaded process is a zombie (leader) while its other
    // threads still tear down and hold the lock for a few ms.
    must_wait_until(Duration::from_secs(5), "killed gateway gone and lock free", || {
        !pid_alive(pid) && !home.lock_held()
    });
    pid
}

#[test]
fn durability_async_messages_survive_restarts_and_sigkills_exactly_once() {
    let seed: u64 = std::env::var("GW_DURABILITY_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    println!("durability seed: {seed} (replay with GW_DURABILITY_SEED={seed})");
    let mut rng = Rng(seed);

    let home = TempHome::new();
    let sw = Sweeper::new();
    let port = api::free_port();
    let listen = format!("127.0.0.1:{port}");
    write_config(
        home.path(),
        &format!("listen = \"{listen}\"\ndrain_timeout_s = 5\n[agent]\nbackend = \"echo\"\ndelay_ms = 20\n"),
    );
    let start = |what: &str| {
        let out = cli_tagged(&home, &sw, &["start"], Duration::from_secs(40));
        assert_cli(&out, 0, what);
        println!("{what}: {}", out.stdout.trim());
        if out.stdout.contains("already running") {
            let h = lock_holders(&home.lock_file());
            let who: Vec<_> = h.iter().map(|p| (*p, sweep::cmdline_of(*p), sweep::ppid_of(*p))).collect();
            println!("lock holders: {who:?}; tagged: {:?}", sw.tagged());
        }
    };
    start("initial start");
    let addr: std::net::SocketAddr = listen.parse().unwrap();

    // Disruption points: after the client submitted k messages (sorted, distinct-ish).
    let mut points: Vec<usize> = (0..DISRUPTIONS).map(|_| 5 + rng.below((N - 20) as u64) as usize).collect();
    points.sort_unstable();
    let plan: Vec<(usize, Disruption)> = points
        .into_iter()
        .map(|p| {
            let d = match rng.below(3) {
                0 => Disruption::Restart,
                1 => Disruption::Kill,
                _ => Disruption::KillMidRestart,
            };
            (p, d)
        })
        .collect();
    println!("plan: {plan:?}");

    // The client: one connection per message, 15 ms apart, no retries.
    let progress = Arc::new(AtomicUsize::new(0));
    let client = {
        let progress = Arc::clone(&progress);
        std::thread::spawn(move || {
            let api = Api::new(addr).with_timeout(Duration::from_secs(10));
            let mut out = Vec::with_capacity(N);
            for i in 0..N {
                let text = format!("msg-{i}");
                let r = match api.send_async(&format!("chat-{}", i % 7), "dur", &text) {
                    Ok(r) if r.status == 202 => {
                        match r.json().ok().and_then(|v| v["message_id"].as_str().map(str::to_string)) {
                            Some(id) => Submitted::Accepted(id),
                            None => Submitted::Rejected(format!("202 without id: {}", r.text())),
                        }
                    }
                    Ok(r) => Submitted::Rejected(format!("HTTP {}", r.status)),
                    Err(e) => Submitted::Rejected(format!("{:?}", e.kind())),
                };
                out.push((text, r));
                progress.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(15)); // load shaping, not synchronisation
            }
            out
        })
    };

    let mut log = Vec::new();
    for (point, d) in &plan {
        must_wait_until(Duration::from_secs(60), "client progress", || progress.load(Ordering::SeqCst) >= *point);
        let t0 = Instant::now();
        match d {
            Disruption::Restart => {
                let out = cli_tagged(&home, &sw, &["restart", "--timeout", "40"], Duration::from_secs(60));
                assert_cli(&out, 0, "restart");
            }
            Disruption::Kill => {
                kill_holder(&home, &sw);
                start("start after kill -9");
            }
            Disruption::KillMidRestart => {
                let before = home.events("successor_started").len();
                let r = cli_bg(&home, &sw, &["restart", "--timeout", "40"], Duration::from_secs(60));
                wait_events(&home, "successor_started", before + 1, Duration::from_secs(20));
                // The old gateway (still holding the lock while it drains), if it has not
                // finished its drain already.
                let mut landed = false;
                if let Some((pid, ..)) = current_gateway(home.path()) {
                    let succ =
                        home.events("successor_started").last().unwrap()["successor_pid"].as_u64().unwrap() as u32;
                    if pid != succ && sw.tagged().contains(&pid) {
                        landed = std::process::Command::new("kill")
                            .args(["-KILL", &pid.to_string()])
                            .status()
                            .unwrap()
                            .success();
                    }
                }
                let out = r.join().unwrap();
                assert_cli(&out, 0, "restart whose old gateway was SIGKILLed mid-drain");
                log.push(format!("  (kill {} the drain)", if landed { "landed in" } else { "came after" }));
            }
        }
        log.push(format!("{d:?} at {point}: {:?}", t0.elapsed()));
        // Whatever happened, a gateway must be serving before the next disruption.
        assert!(
            wait_new_ready(home.path(), &[], Duration::from_secs(20)).is_some(),
            "no gateway after {d:?}:\n{}",
            home.ledger_text()
        );
    }
    let submitted = client.join().unwrap();
    println!("disruptions: {log:#?}");

    // Let the last incarnation finish everything.
    let (_, _, addr) = wait_new_ready(home.path(), &[], Duration::from_secs(20)).expect("final gateway");
    let api = Api::new(addr);
    let accepted: Vec<(&str, &str)> = submitted
        .iter()
        .filter_map(|(t, s)| match s {
            Submitted::Accepted(id) => Some((t.as_str(), id.as_str())),
            Submitted::Rejected(_) => None,
        })
        .collect();
    let mut rejected: BTreeMap<String, usize> = BTreeMap::new();
    for (_, s) in &submitted {
        if let Submitted::Rejected(why) = s {
            *rejected.entry(why.clone()).or_default() += 1;
        }
    }

    let mut lost = Vec::new();
    let mut problems = Vec::new();
    let mut attempts: BTreeMap<i64, usize> = BTreeMap::new();
    let mut failed: BTreeMap<String, usize> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    for (text, id) in &accepted {
        let mut last = None;
        let fin = wait_until(deadline.saturating_duration_since(Instant::now()), || {
            last = api.message(id);
            last.as_ref().is_some_and(|m| m["state"] == "done" || m["state"] == "failed")
        });
        let Some(m) = last else {
            lost.push(format!("{id} ({text}): not resolvable"));
            continue;
        };
        if !fin {
            problems.push(format!("{id} ({text}) not final: {m}"));
            continue;
        }
        let a = m["attempts"].as_i64().unwrap_or(-1);
        *attempts.entry(a).or_default() += 1;
        if !(1..=2).contains(&a) {
            problems.push(format!("{id} ({text}) ran {a} times: {m}"));
        }
        match m["state"].as_str() {
            Some("done") if m["reply"] == json!(text) => {}
            Some("done") => problems.push(format!("{id} ({text}) done with the wrong reply: {m}")),
            _ => {
                let reason = m["reason"].as_str().unwrap_or("").to_string();
                if reason.is_empty() {
                    problems.push(format!("{id} ({text}) failed without a reason: {m}"));
                }
                *failed.entry(reason).or_default() += 1;
            }
        }
    }

    // The journal itself (read-only), when the sqlite3 CLI is here.
    let mut journal_note = String::from("sqlite3 CLI not found; checked through the API only");
    let db = home.file("journal.sqlite3");
    if let Ok(o) = std::process::Command::new("sqlite3")
        .arg("-readonly")
        .arg(&db)
        .arg("SELECT id, text, state, attempts, is_command FROM messages;")
        .output()
        && o.status.success()
    {
        let rows: Vec<Vec<String>> =
            String::from_utf8_lossy(&o.stdout).lines().map(|l| l.split('|').map(str::to_string).collect()).collect();
        let mut by_text: HashMap<&str, Vec<&Vec<String>>> = HashMap::new();
        for r in &rows {
            by_text.entry(r[1].as_str()).or_default().push(r);
        }
        for (text, id) in &accepted {
            match by_text.get(text).map(|v| v.as_slice()) {
                Some([row]) if row[0] == *id => {}
                other => problems.push(format!("journal rows for accepted {text} ({id}): {other:?}")),
            }
        }
        let open: Vec<&Vec<String>> = rows.iter().filter(|r| r[2] == "queued" || r[2] == "running").collect();
        // Rows the client never saw a 202 for (the 202 was lost with a killed gateway) must be
        // handled like the others, never left behind.
        let unacked = rows.iter().filter(|r| !accepted.iter().any(|(_, id)| *id == r[0])).count();
        if !open.is_empty() {
            problems.push(format!("journal rows still open: {open:?}"));
        }
        journal_note =
            format!("journal: {} rows, {} without a 202 seen by the client, {} open", rows.len(), unacked, open.len());
    }

    println!(
        "submitted {N}: accepted {}, rejected {} {rejected:?}; attempts {attempts:?}; failed {failed:?}; {journal_note}",
        accepted.len(),
        N - accepted.len()
    );
    println!("ledger restarts: {}, started: {}", home.events("restart_requested").len(), home.events("started").len());
    assert!(lost.is_empty(), "LOST accepted messages: {lost:#?}");
    assert!(problems.is_empty(), "exactly-once violations: {problems:#?}");
    assert!(accepted.len() >= N / 2, "most submissions should be accepted: {rejected:?}");
    let _ = run_cli(&home, &["stop"]);
}

/// Group commit (issue 22): eight clients POST async messages back to back, so the journal's
/// writer commits them in shared batches, and the gateway is SIGKILLed in the middle of the
/// burst. Every message that got its 202 was in a durable commit before it: after a restart
/// each one is in the journal, once, and ends `done` with its text as the reply.
#[test]
fn durability_burst_sigkilled_mid_batch_keeps_every_202() {
    const CLIENTS: usize = 8;
    const PER_CLIENT: usize = 400;
    let home = TempHome::new();
    let sw = Sweeper::new();
    let port = api::free_port();
    let listen = format!("127.0.0.1:{port}");
    write_config(
        home.path(),
        &format!(
            "listen = \"{listen}\"\ndrain_timeout_s = 5\n[agent]\nbackend = \"echo\"\n\
             [journal]\nmax_queued = 10000\nmax_queued_per_chat = 10000\n"
        ),
    );
    let out = cli_tagged(&home, &sw, &["start"], Duration::from_secs(40));
    assert_cli(&out, 0, "start");
    let addr: std::net::SocketAddr = listen.parse().unwrap();

    let accepted = Arc::new(std::sync::Mutex::new(Vec::<(String, String)>::new()));
    let count = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|k| {
            let (accepted, count) = (Arc::clone(&accepted), Arc::clone(&count));
            std::thread::spawn(move || {
                let api = Api::new(addr).with_timeout(Duration::from_secs(10));
                for i in 0..PER_CLIENT {
                    let text = format!("burst-{k}-{i}");
                    match api.send_async(&format!("chat-{k}"), "burst", &text) {
                        Ok(r) if r.status == 202 => {
                            let id = r.json().ok().and_then(|v| v["message_id"].as_str().map(str::to_string));
                            let id = id.unwrap_or_else(|| panic!("202 without an id: {}", r.text()));
                            accepted.lock().unwrap().push((text, id));
                            count.fetch_add(1, Ordering::SeqCst);
                        }
                        // The gateway is gone (or going): this client's burst is over.
                        _ => return,
                    }
                }
            })
        })
        .collect();
    // Mid-burst: writes are queued and in flight in the journal's writer when the kill lands.
    must_wait_until(Duration::from_secs(60), "a third of the burst accepted", || {
        count.load(Ordering::SeqCst) >= CLIENTS * PER_CLIENT / 3
    });
    kill_holder(&home, &sw);
    for c in clients {
        c.join().unwrap();
    }
    let accepted = std::mem::take(&mut *accepted.lock().unwrap());
    assert!(accepted.len() < CLIENTS * PER_CLIENT, "the kill came after the burst: nothing was in flight");

    let out = cli_tagged(&home, &sw, &["start"], Duration::from_secs(40));
    assert_cli(&out, 0, "start after kill -9");
    let (_, _, addr) = wait_new_ready(home.path(), &[], Duration::from_secs(20)).expect("restarted gateway");
    let api = Api::new(addr);
    let mut problems = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    for (text, id) in &accepted {
        let mut last = None;
        let fin = wait_until(deadline.saturating_duration_since(Instant::now()), || {
            last = api.message(id);
            last.as_ref().is_some_and(|m| m["state"] == "done" || m["state"] == "failed")
        });
        match last {
            None => problems.push(format!("LOST: {id} ({text}) got a 202 and is not in the journal")),
            Some(m) if !fin || m["state"] != "done" || m["reply"] != json!(text) => {
                problems.push(format!("{id} ({text}): {m}"))
            }
            Some(_) => {}
        }
    }
    println!("burst: {} accepted before the kill", accepted.len());
    assert!(problems.is_empty(), "{} of {} accepted: {problems:#?}", problems.len(), accepted.len());
    let _ = run_cli(&home, &["stop"]);
}
