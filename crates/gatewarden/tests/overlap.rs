//! Issue 22, item 7: a seeded soak that overlaps every ordered pair of verbs — `start`, `stop`,
//! `restart`, chat `/restart` (the HTTP chat API, as an admin), `update` (to a real patched
//! release), `update --rollback`, `doctor --fix` and `cancel-drain` (issue 21) — the second one a seeded 0–300 ms after the
//! first, both as child processes of the installed binary (tests/work_common/rig.rs).
//!
//! Before each pair the home is put back to one baseline: a committed update 0.1.0 → 7.7.7,
//! one gateway running 7.7.7, the operator's intent `run`. After both verbs ended and every
//! tagged process settled (deadline waits, no sleeps), the promises are checked:
//! - the operator's last intent wins: a gateway runs iff `desired_state.json` says `run`;
//! - at most one gateway: never two holders of `gateway.lock` at any sample, and once settled
//!   no `run` process but the holder;
//! - exit codes tell the truth: `update` 0 ⇒ its new incarnation ran 9.9.9, 1 ⇒ refused or
//!   rolled back (the old version back, or left stopped); `restart` 0 ⇒ a new incarnation ran;
//!   `doctor --fix` never restarts a healthy gateway mid-handover; `cancel-drain` 0 ⇒ the
//!   ledger's `drain_cancelled` names it and the restart it cancelled says so (exit 1); what runs is the installed
//!   file, and the installed file is what the last transaction says;
//! - a run in flight when the pair began (half the pairs, seeded) is drained, never cut;
//! - every outcome is in the ledger, naming the verb's process (`stop_requested`,
//!   `restart_result`, `update_result` / `update_refused`, `start_prevented`, …).
//!
//! The seed is printed first; `GW_OVERLAP_SEED` replays, `GW_OVERLAP_ROUNDS` sets the number of
//! pairs (default: every ordered pair once, in seeded order; `scripts/soak-overlap` runs more),
//! `GW_OVERLAP_PAIR=update,restart` runs only that pair. Every broken promise of the run is
//! reported at the end, with the pair, the gap, the seed and the ledger of that pair.
#![cfg(target_os = "linux")]

mod common;
mod work_common;
use common::*;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use work_common::rig::*;
use work_common::*;

/// Chat `/restart` needs an admin who came with the API token (docs/security.md).
const TOKEN: &str = "t0k-0123456789abcdef";
const ADMIN: &str = "api_token = \"t0k-0123456789abcdef\"\nadmins = [\"u\"]\n";
/// `listen` on port 0: `update`'s preflight (`check`) binds the configured address, and a
/// fixed port may be taken by anything else on the machine.
const CONFIG: &str = "listen = \"127.0.0.1:0\"\napi_token = \"t0k-0123456789abcdef\"\nadmins = [\"u\"]\n\
                      [agent]\nbackend = \"echo\"\ndelay_ms = 1500\n[update]\nprobation_s = 1\n";
/// What the baseline runs (installed by a real update from the pristine build), and what
/// `update` installs.
const BASE: &str = "7.7.7";
const NEXT: &str = "9.9.9";
/// Every verb and every process it left has ended by then.
const VERB_LIMIT: Duration = Duration::from_secs(120);
const SETTLE: Duration = Duration::from_secs(60);
const MAX_GAP_MS: u64 = 300;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verb {
    Start,
    Stop,
    Restart,
    ChatRestart,
    Update,
    Rollback,
    DoctorFix,
    CancelDrain,
}

const VERBS: [Verb; 8] = [
    Verb::Start,
    Verb::Stop,
    Verb::Restart,
    Verb::ChatRestart,
    Verb::Update,
    Verb::Rollback,
    Verb::DoctorFix,
    Verb::CancelDrain,
];

impl Verb {
    fn name(self) -> &'static str {
        match self {
            Verb::Start => "start",
            Verb::Stop => "stop",
            Verb::Restart => "restart",
            Verb::ChatRestart => "chat-restart",
            Verb::Update => "update",
            Verb::Rollback => "rollback",
            Verb::DoctorFix => "doctor-fix",
            Verb::CancelDrain => "cancel-drain",
        }
    }

    fn parse(s: &str) -> Option<Verb> {
        VERBS.into_iter().find(|v| v.name() == s.trim())
    }
}

/// A verb under way: a CLI child (its output collected on a thread), or the chat request.
enum Running {
    Cli { pid: u32, done: JoinHandle<std::io::Result<std::process::Output>> },
    Chat(JoinHandle<Result<(u16, String), String>>),
}

/// How a verb ended: the CLI's pid, exit code and output; for chat `/restart`, the HTTP status
/// as the code (`None`: no gateway to ask, or no answer) and the reply.
#[derive(Debug)]
struct Ended {
    verb: Verb,
    pid: u32,
    code: Option<i32>,
    out: String,
}

struct Soak {
    r: Rig,
    seed: u64,
    /// The releases: 7.7.7 (the baseline) and 9.9.9 (what `update` installs).
    base: PathBuf,
    next: PathBuf,
    /// `update.json` of the baseline's committed transaction.
    base_txn: Vec<u8>,
    /// The baseline gateway's HTTP address.
    addr: Option<std::net::SocketAddr>,
    failures: Vec<String>,
}

/// The ledger's events after the last `overlap_pair` marker (this pair's), across a rotation.
fn pair_events(home: &TempHome) -> Vec<Value> {
    let mut all = Vec::new();
    for f in [home.path().join("lifecycle.jsonl.1"), home.ledger()] {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        all.extend(text.lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()));
    }
    let from = all.iter().rposition(|e| e["event"] == json!("overlap_pair")).map_or(0, |i| i + 1);
    all.split_off(from)
}

fn named<'a>(events: &'a [Value], name: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["event"] == json!(name)).collect()
}

/// The version the gateway incarnation `inc` started with (its `started` line).
fn started_version(events: &[Value], inc: &str) -> Option<String> {
    named(events, "started").into_iter().find(|e| e["incarnation"] == json!(inc))?["version"].as_str().map(Into::into)
}

impl Soak {
    fn cli(&self, args: &[&str]) -> CliOutput {
        cli_with(&self.r.exe, self.r.home.path(), args, &[(TAG_VAR, self.r.sw.tag())], VERB_LIMIT)
    }

    /// Everything tagged has ended (a stop was recorded before): nothing can start a gateway.
    fn all_gone(&self) -> bool {
        wait_until(SETTLE, || self.r.sw.tagged().is_empty())
    }

    /// Puts the home back to the baseline: stopped, 7.7.7 installed with its committed
    /// transaction, then started by the operator.
    fn reset(&mut self) {
        let stop = self.cli(&["stop", "--timeout", "30"]);
        if stop.code != Some(0) || !self.all_gone() {
            let left: Vec<_> = self.r.sw.tagged().into_iter().map(|p| (p, sweep::cmdline_of(p))).collect();
            self.failures.push(format!("reset: stop {stop:?}; still running: {left:?}"));
            self.r.sw.sweep();
            assert!(wait_until(SETTLE, || self.r.sw.tagged().is_empty()), "cannot clear the home for the next pair");
        }
        let tmp = self.r.dir.path().join("bin/.restore");
        std::fs::copy(&self.base, &tmp).unwrap();
        std::fs::rename(&tmp, &self.r.exe).unwrap();
        self.r.home.write("update.json", &self.base_txn);
        let start = self.cli(&["start", "--listen", "127.0.0.1:0", "--timeout", "30"]);
        assert_cli(&start, 0, "start the baseline");
        self.r.assert_one_gateway(BASE);
        self.addr = current_gateway(self.r.home.path()).and_then(|g| g.3);
    }

    fn launch(&self, verb: Verb) -> Running {
        let next = self.next.to_str().unwrap();
        let args: &[&str] = match verb {
            Verb::Start => &["start", "--listen", "127.0.0.1:0", "--timeout", "30"],
            Verb::Stop => &["stop", "--timeout", "30"],
            Verb::Restart => &["restart", "--timeout", "30"],
            Verb::Update => &["update", "--from", next, "--timeout", "30"],
            Verb::Rollback => &["update", "--rollback", "--timeout", "30"],
            Verb::DoctorFix => &["doctor", "--fix"],
            Verb::CancelDrain => &["cancel-drain"],
            Verb::ChatRestart => {
                // Where the operator's chat client points: the gateway's address (a restart keeps it).
                let addr = current_gateway(self.r.home.path()).and_then(|g| g.3).or(self.addr);
                return Running::Chat(std::thread::spawn(move || {
                    let addr = addr.ok_or("no gateway to ask")?;
                    let api = Api::new(addr).with_token(TOKEN).with_timeout(Duration::from_secs(30));
                    let resp = api.send("ops", "u", "/restart").map_err(|e| e.to_string())?;
                    Ok((resp.status, resp.text()))
                }));
            }
        };
        let mut cmd = Command::new(&self.r.exe);
        test_env(&mut cmd);
        cmd.arg("--home").arg(self.r.home.path()).args(args).env(TAG_VAR, self.r.sw.tag());
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let child: Child = cmd.spawn().expect("spawn gatewarden");
        let pid = child.id();
        Running::Cli { pid, done: std::thread::spawn(move || child.wait_with_output()) }
    }

    fn wait(verb: Verb, running: Running) -> Ended {
        match running {
            Running::Cli { pid, done } => {
                let t0 = Instant::now();
                // Bounded: the verbs' own timeouts are far below VERB_LIMIT.
                while !done.is_finished() && t0.elapsed() < VERB_LIMIT {
                    std::thread::sleep(Duration::from_millis(20));
                }
                if !done.is_finished() {
                    let _ = send_signal(pid, sig::SIGKILL);
                }
                let o = done.join().unwrap().expect("wait for the verb");
                let out = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
                Ended { verb, pid, code: o.status.code(), out }
            }
            Running::Chat(h) => match h.join().unwrap() {
                Ok((status, text)) => Ended { verb, pid: 0, code: Some(i32::from(status)), out: text },
                Err(e) => Ended { verb, pid: 0, code: None, out: e },
            },
        }
    }

    /// One pair: A, then B `gap_ms` later; settle; check the promises. Failures are collected.
    fn pair(&mut self, n: usize, a: Verb, b: Verb, gap_ms: u64, busy: bool) {
        self.reset();
        let (_, base_inc, _, addr) = current_gateway(self.r.home.path()).expect("the baseline gateway");
        let marker = json!({"ts": rfc3339_offset(0), "event": "overlap_pair", "pair": [a.name(), b.name()],
                            "gap_ms": gap_ms, "busy": busy, "seed": self.seed, "n": n});
        let mut f = std::fs::OpenOptions::new().append(true).open(self.r.home.ledger()).unwrap();
        std::io::Write::write_all(&mut f, format!("{marker}\n").as_bytes()).unwrap();
        // Never two holders of the lock, sampled until everything settled.
        let watching = Arc::new(AtomicBool::new(true));
        let lock = self.r.home.lock_file();
        let sampler = {
            let watching = Arc::clone(&watching);
            std::thread::spawn(move || {
                let mut worst = Vec::new();
                while watching.load(Ordering::Relaxed) {
                    // Distinct pids: /proc/locks is generated page by page, and one read
                    // can list a line twice while locks change.
                    let mut h = lock_holders(&lock);
                    h.sort_unstable();
                    h.dedup();
                    if h.len() > worst.len() {
                        worst = h;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                worst
            })
        };
        // Half the pairs meet a run in flight: restarts and stops drain it (1.5 s, `delay_ms`), so the
        // second verb lands in the middle of the first one's handover.
        let run = busy.then(|| {
            let api = Api::new(addr.expect("the baseline's address")).with_token(TOKEN);
            let run = send_bg_as(&api, "B", "in flight");
            wait_active_as(&api, 1);
            run
        });
        let t0 = Instant::now();
        let ra = self.launch(a);
        // The gap is the scenario (how far apart an operator's two commands are), not a wait.
        std::thread::sleep(Duration::from_millis(gap_ms));
        let rb = self.launch(b);
        let ea = Self::wait(a, ra);
        let eb = Self::wait(b, rb);
        // A chat `/restart` is answered before it is carried out: its outcome line (the
        // backstop's result, or the start a stop prevented) ends it.
        let chats =
            [&ea, &eb].into_iter().filter(|e| e.verb == Verb::ChatRestart && e.out.contains("restarting")).count();
        if chats > 0 {
            wait_until(Duration::from_secs(20), || chat_outcomes(&pair_events(&self.r.home)).1 >= chats);
        }
        let settled = self.settle();
        watching.store(false, Ordering::Relaxed);
        let worst = sampler.join().unwrap();
        let took = t0.elapsed();
        let events = pair_events(&self.r.home);
        let mut broken = Vec::new();
        if let Err(left) = settled {
            broken.push(format!("not settled after {SETTLE:?}: {left:?}"));
        }
        if worst.len() > 1 {
            broken.push(format!("two lock holders at once: {worst:?}"));
        }
        self.check_state(&mut broken);
        one_at_a_time(&base_inc, &events, &mut broken);
        // The run in flight is drained, never cut, whatever the verbs did.
        if let Some(run) = run {
            match run.join().unwrap() {
                (Ok(r), _) if r.status == 200 && r.json().is_ok_and(|v| v["reply"] == json!("in flight")) => {}
                (r, took) => broken.push(format!("the run in flight was not drained ({took:?}): {r:?}")),
            }
        }
        let (asked, ended) = chat_outcomes(&events);
        if asked < chats || ended < chats {
            broken.push(format!(
                "{chats} chat /restart answered \"restarting…\", but the ledger has {asked} `restart_requested` \
                 from the chat and {ended} outcome(s) (`restart_backstop` result or `start_prevented`)"
            ));
        }
        for e in [&ea, &eb] {
            let other = if std::ptr::eq(e, &ea) { &eb } else { &ea };
            self.check_verb(e, other, &base_inc, &events, &mut broken);
        }
        let verdict = if broken.is_empty() { "ok" } else { "BROKEN" };
        // A chat request that got no answer says why.
        let why = |e: &Ended| if e.code.is_none() { format!(" [{}]", e.out.trim()) } else { String::new() };
        println!(
            "pair {n:2} {:>12} → {:<12} gap {gap_ms:3} ms{}: {verdict} in {:.1}s (exit {:?}{} / {:?}{})",
            a.name(),
            b.name(),
            if busy { ", run in flight" } else { "" },
            took.as_secs_f64(),
            ea.code,
            why(&ea),
            eb.code,
            why(&eb)
        );
        if !broken.is_empty() {
            let ledger: Vec<String> = events.iter().map(|e| e.to_string()).collect();
            let report = format!(
                "pair {n} ({} then {} {gap_ms} ms later{}), seed {}; replay: GW_OVERLAP_SEED={} GW_OVERLAP_PAIR={},{}\n  \
                 - {}\n  --- {} (exit {:?}):\n{}\n  --- {} (exit {:?}):\n{}\n  --- ledger of the pair:\n{}",
                a.name(),
                b.name(),
                if busy { ", a run in flight" } else { "" },
                self.seed,
                self.seed,
                a.name(),
                b.name(),
                broken.join("\n  - "),
                a.name(),
                ea.code,
                ea.out.trim_end(),
                b.name(),
                eb.code,
                eb.out.trim_end(),
                ledger.join("\n")
            );
            println!("{report}");
            self.failures.push(report);
        }
    }

    /// Every tagged process ended but the gateway holding the lock, and that one is `running`.
    fn settle(&self) -> Result<(), Vec<(u32, Vec<String>)>> {
        let home = self.r.home.path();
        let ok = wait_until(SETTLE, || {
            let holders = lock_holders(&self.r.home.lock_file());
            self.r.sw.tagged().iter().all(|p| holders.contains(p))
                && (holders.is_empty() || current_gateway(home).is_some_and(|g| g.2 == "running"))
        });
        if ok {
            return Ok(());
        }
        Err(self.r.sw.tagged().into_iter().map(|p| (p, sweep::cmdline_of(p))).collect())
    }

    /// The home once settled: the operator's last intent holds, one gateway at most, and it
    /// runs the installed file, which is what the last transaction says.
    fn check_state(&self, broken: &mut Vec<String>) {
        let home = self.r.home.path();
        let want = self.r.home.read_json("desired_state.json").map_or(json!("run"), |d| d["want"].clone());
        let mut holders = lock_holders(&self.r.home.lock_file());
        holders.sort_unstable();
        holders.dedup();
        let runs: Vec<u32> =
            self.r.sw.tagged().into_iter().filter(|&p| sweep::cmdline_of(p).iter().any(|a| a == "run")).collect();
        let runs_one = !holders.is_empty();
        if (want == json!("run")) != runs_one {
            broken.push(format!("desired_state says {want}, but lock holders are {holders:?}"));
        }
        if holders.len() > 1 || runs.iter().any(|p| !holders.contains(p)) {
            broken.push(format!("gateways {runs:?} beside the lock holders {holders:?}"));
        }
        let installed = version_of(&self.r.exe);
        let t = self.r.txn();
        let expected = match t["phase"].as_str() {
            Some("committed") => t["to"].as_str(),
            Some("rolled_back") => t["from"].as_str(),
            _ => None,
        };
        if expected.is_some_and(|v| v != installed) {
            broken.push(format!("update.json ends {} but the installed file is {installed}: {t}", t["phase"]));
        }
        if !matches!(t["phase"].as_str(), Some("committed" | "rolled_back" | "failed")) {
            broken.push(format!("the update transaction is unfinished: {t}"));
        }
        if !holders.is_empty() {
            let st = cli(&self.r.exe, home, &["status", "--json"]);
            let v = if st.code == Some(0) { st.json() } else { Value::Null };
            if v["version"] != json!(installed) || v["state"] != json!("running") {
                broken.push(format!("the installed file is {installed}, but status says {v}"));
            }
        }
    }

    /// What `e` claimed (its exit code) against what happened (the ledger of the pair).
    fn check_verb(&self, e: &Ended, other: &Ended, base_inc: &str, events: &[Value], broken: &mut Vec<String>) {
        let v = e.verb.name();
        let by_me = |name: &str, key: &str| -> Vec<&Value> {
            named(events, name).into_iter().filter(|x| x.pointer(key) == Some(&json!(e.pid))).collect()
        };
        let stop_in_pair = other.verb == Verb::Stop;
        let cancelled_by_other = other.verb == Verb::CancelDrain && other.code == Some(0);
        match (e.verb, e.code) {
            (Verb::Start, Some(0)) => {
                if let Some(pid) = e.out.split("started gateway pid ").nth(1).and_then(|s| s.split(' ').next()) {
                    let ready =
                        named(events, "ready").iter().any(|x| x["pid"].as_u64().is_some_and(|p| p.to_string() == pid));
                    if !ready {
                        broken.push(format!("{v} exit 0 says it started pid {pid}, which has no `ready` line"));
                    }
                } else if !e.out.contains("already running") {
                    broken.push(format!("{v} exit 0 says neither started nor already running"));
                }
            }
            (Verb::Start, Some(1)) if stop_in_pair && !named(events, "start_prevented").is_empty() => {}
            (Verb::Stop, Some(0)) => {
                let nothing = e.out.contains("no gateway running");
                if !nothing && by_me("stop_requested", "/requester/pid").is_empty() {
                    broken.push(format!("{v} exit 0 stopped a gateway, but no `stop_requested` names pid {}", e.pid));
                }
            }
            (Verb::Restart, Some(code @ (0 | 1))) => {
                let results = by_me("restart_result", "/requester_pid");
                let refused = e.out.contains("not restarting") && !named(events, "start_prevented").is_empty();
                match results.last() {
                    None if code == 1 && refused => {}
                    None => broken.push(format!("{v} exit {code}, but no `restart_result` names pid {}", e.pid)),
                    Some(r) if code == 0 => {
                        let new = r["new"].as_str().unwrap_or_default();
                        let ran = named(events, "ready").iter().any(|x| x["incarnation"] == json!(new));
                        if r["ok"] != json!(true) || new == base_inc || !ran {
                            broken.push(format!("{v} exit 0, but no new incarnation ran: {r}"));
                        }
                    }
                    Some(r) => {
                        if r["ok"] != json!(false) {
                            broken.push(format!("{v} exit 1, but its result says {r}"));
                        }
                        let cancel = cancelled_by_other && r["seen"].as_str().is_some_and(|s| s.contains("cancelled"));
                        if !stop_in_pair && !cancel {
                            broken.push(format!("{v} exit 1 with no stop or cancel in the pair: {r}"));
                        }
                    }
                }
            }
            // Checked for the pair as a whole (`chat_outcomes`).
            (Verb::ChatRestart, Some(200)) if e.out.contains("restarting") => {}
            // The gateway was already leaving: it said so, and the ledger has the request.
            (Verb::ChatRestart, Some(200)) if e.out.contains("already under way") || e.out.contains("is stopping") => {
                let joined = named(events, "restart_requested")
                    .iter()
                    .any(|x| x["requester"]["channel"] == json!("chat") && x.get("joined").is_some());
                if !joined {
                    broken.push(format!("{v} answered {:?}, but no `restart_requested` (joined) from the chat", e.out));
                }
                if e.out.contains("is stopping") && !stop_in_pair {
                    broken.push(format!("{v} was told the gateway is stopping, with no stop in the pair"));
                }
            }
            // No gateway to ask (stopped, or between incarnations): a refusal the client saw.
            (Verb::ChatRestart, None | Some(503)) => {}
            (Verb::Update | Verb::Rollback, Some(code @ (0 | 1))) => {
                // The release is good and the baseline has a transaction to roll back: only the
                // operator's stop, or another update or rollback, may keep either from happening.
                if code == 1 && !matches!(other.verb, Verb::Stop | Verb::Update | Verb::Rollback) && !cancelled_by_other
                {
                    broken.push(format!("{v} exit 1 though only `{}` overlapped it", other.verb.name()));
                }
                let refused = by_me("update_refused", "/requester/pid");
                let results = by_me("update_result", "/requester_pid");
                match (results.last(), refused.is_empty()) {
                    (None, false) if code == 1 => {}
                    (None, _) => broken.push(format!("{v} exit {code}, but no `update_result`/`update_refused`")),
                    (Some(r), _) => {
                        let phase = r["phase"].as_str().unwrap_or_default();
                        let want = match (e.verb, code, phase) {
                            (Verb::Update, 0, "committed") => r["to"].as_str(),
                            (Verb::Update, 1, "rolled_back") | (Verb::Rollback, 0, "rolled_back") => r["from"].as_str(),
                            _ => {
                                broken.push(format!("{v} exit {code}, but its result says {r}"));
                                None
                            }
                        };
                        if e.verb == Verb::Update && code == 0 && r["to"] != json!(NEXT) {
                            broken.push(format!("{v} exit 0 installed {}, not {NEXT}", r["to"]));
                        }
                        let inc = r["incarnation"].as_str();
                        if let (Some(want), Some(inc)) = (want, inc)
                            && started_version(events, inc).is_some_and(|ran| ran != want)
                        {
                            broken.push(format!("{v} exit {code} ended with incarnation {inc}, not {want}: {r}"));
                        }
                        // An update that says it installed 9.9.9 ended with a 9.9.9 gateway
                        // running, unless a stop came after it.
                        if e.verb == Verb::Update && code == 0 && inc.is_none() && !stop_in_pair {
                            broken.push(format!("{v} exit 0 with no incarnation: {r}"));
                        }
                    }
                }
            }
            (Verb::CancelDrain, Some(code @ (0 | 1))) => {
                let mine = by_me("drain_cancelled", "/requester/pid");
                match code {
                    0 if mine.len() != 1 => {
                        broken.push(format!("{v} exit 0, but {} `drain_cancelled` name pid {}", mine.len(), e.pid))
                    }
                    0 if !matches!(other.verb, Verb::Restart | Verb::ChatRestart | Verb::Update | Verb::Rollback) => {
                        broken.push(format!("{v} exit 0, but `{}` started no restart to cancel", other.verb.name()))
                    }
                    1 if !mine.is_empty() => broken.push(format!("{v} exit 1, but the ledger says it cancelled")),
                    _ => {}
                }
            }
            (Verb::DoctorFix, Some(0 | 1)) => {
                if e.out.contains("doctor: running") {
                    broken.push(format!("{v} restarted a gateway that was only handing over: {}", e.out.trim()));
                }
            }
            (_, code) => broken.push(format!("{v} exit {code:?}: {}", e.out.trim())),
        }
    }
}

/// Chat `/restart`s in the ledger: how many the gateway took (`restart_requested` from the
/// chat, not `joined` to a drain already under way), and how many ended (the backstop's result, or the restart a stop refused).
fn chat_outcomes(events: &[Value]) -> (usize, usize) {
    let asked = named(events, "restart_requested")
        .iter()
        .filter(|x| x["requester"]["channel"] == json!("chat") && x.get("joined").is_none())
        .count();
    let results = named(events, "restart_backstop").iter().filter(|x| x.get("ok").is_some()).count();
    let refused = named(events, "start_prevented").iter().filter(|x| x["by"] == json!("restart")).count();
    (asked, results + refused)
}

/// Never two gateways in the ledger: an incarnation writes `started` once it holds the lock
/// and `exited` before it lets go, so no `started` may come while another one has not exited.
fn one_at_a_time(base_inc: &str, events: &[Value], broken: &mut Vec<String>) {
    let mut live = vec![base_inc.to_owned()];
    for e in events {
        let Some(inc) = e["incarnation"].as_str() else { continue };
        match e["event"].as_str() {
            Some("started") => {
                if !live.is_empty() {
                    broken.push(format!("incarnation {inc} started while {live:?} had not exited"));
                }
                live.push(inc.to_owned());
            }
            Some("exited") => live.retain(|l| l != inc),
            _ => {}
        }
    }
}

/// The rounds' pairs: every ordered pair once per round, each round in its own seeded order.
/// One pair: A, B, the gap, and whether a run is in flight when A begins.
type Pair = (Verb, Verb, u64, bool);

fn schedule(rng: &mut Rng, rounds: usize, only: Option<(Verb, Verb)>) -> Vec<Pair> {
    let all: Vec<(Verb, Verb)> = VERBS.iter().flat_map(|&a| VERBS.iter().map(move |&b| (a, b))).collect();
    let mut out = Vec::new();
    while out.len() < rounds {
        let mut round = match only {
            Some(p) => vec![p],
            None => all.clone(),
        };
        for i in (1..round.len()).rev() {
            round.swap(i, rng.below(i as u64 + 1) as usize);
        }
        out.extend(round.into_iter().map(|(a, b)| (a, b, rng.below(MAX_GAP_MS + 1), rng.below(2) == 1)));
    }
    out.truncate(rounds);
    out
}

#[test]
fn seeded_overlap_of_every_pair_of_verbs() {
    let seed = soak_seed("GW_OVERLAP_SEED");
    let only = std::env::var("GW_OVERLAP_PAIR").ok().map(|p| {
        let (a, b) = p.split_once(',').expect("GW_OVERLAP_PAIR=A,B");
        (Verb::parse(a).expect("a verb"), Verb::parse(b).expect("a verb"))
    });
    let default_rounds = if only.is_some() { 10 } else { VERBS.len() * VERBS.len() };
    let rounds = std::env::var("GW_OVERLAP_ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(default_rounds);
    println!("overlap soak seed {seed} ({rounds} pairs); replay with GW_OVERLAP_SEED={seed}");
    let (r, _g) = rig("");
    // Read by the baseline update's restart.
    write_config(r.home.path(), CONFIG);
    let base = r.release(BASE);
    let next = r.release(NEXT);
    // The baseline: a real committed update 0.1.0 → 7.7.7 (so `--rollback` has a previous).
    let out = r.update(&["--from", base.to_str().unwrap(), "--timeout", "30"]);
    assert_cli(&out, 0, "the baseline update");
    r.assert_one_gateway(BASE);
    let base_txn = std::fs::read(r.home.path().join("update.json")).unwrap();
    let mut soak = Soak { r, seed, base, next, base_txn, addr: None, failures: Vec::new() };
    let mut rng = Rng(seed);
    let t0 = Instant::now();
    for (n, (a, b, gap, busy)) in schedule(&mut rng, rounds, only).into_iter().enumerate() {
        soak.pair(n, a, b, gap, busy);
    }
    let _ = soak.cli(&["stop"]);
    println!(
        "overlap soak seed {seed}: {rounds} pairs in {:.0}s, {} broken",
        t0.elapsed().as_secs_f64(),
        soak.failures.len()
    );
    assert!(
        soak.failures.is_empty(),
        "seed {seed}: {} pair(s) broke a promise:\n\n{}",
        soak.failures.len(),
        soak.failures.join("\n\n")
    );
}

/// Found by the soak (stop → start 90 ms later, a run in flight): `start` while a `stop` drains
/// a run waits for that gateway to go and starts a new one, so the operator's last word holds.
/// (Before: "already running: pid N" of the gateway being stopped, exit 0, and nothing ran.)
#[test]
fn start_during_a_stops_drain_starts_a_new_gateway() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    write_config(home.path(), "drain_timeout_s = 30\n[agent]\nbackend = \"echo\"\ndelay_ms = 2500\n");
    let start = ["start", "--listen", "127.0.0.1:0", "--timeout", "20"];
    assert_cli(&cli_tagged(&home, &sw, &start, Duration::from_secs(30)), 0, "start");
    let (old, _, _, addr) = current_gateway(home.path()).expect("the started gateway");
    let run = send_bg(addr.expect("its address"), "B", "in flight");
    wait_active(addr.unwrap(), 1);
    let stop = cli_bg(&home, &sw, &["stop", "--timeout", "30"], Duration::from_secs(40));
    wait_state(&home, "draining", Duration::from_secs(10));
    let again = cli_tagged(&home, &sw, &start, Duration::from_secs(40));
    assert_cli(&stop.join().unwrap(), 0, "stop");
    let (r, _) = run.join().unwrap();
    assert_eq!(r.expect("the run's connection").status, 200, "the run is drained, not cut");
    assert_cli(&again, 0, "start during the stop's drain");
    assert!(again.stdout.contains("started gateway pid"), "{again:#?}");
    let mut now = None;
    must_wait_until(READY, "a new gateway running", || {
        now = current_gateway(home.path()).filter(|g| g.2 == "running");
        now.as_ref().is_some_and(|g| g.0 != old)
    });
    assert_eq!(home.read_json("desired_state.json").unwrap()["want"], json!("run"));
    assert_cli(&cli_tagged(&home, &sw, &["stop"], Duration::from_secs(30)), 0, "stop at the end");
}

/// Found by the soak (stop → chat `/restart` 251 ms later, a run in flight): a chat `/restart`
/// that reaches a gateway draining for a stop is told so and is in the ledger; the gateway
/// stays down. (Before: "restarting…", no line in the ledger, and nothing restarted.)
#[test]
fn chat_restart_during_a_stops_drain_says_it_is_stopping() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    let config = format!("{ADMIN}drain_timeout_s = 30\n[agent]\nbackend = \"echo\"\ndelay_ms = 2500\n");
    write_config(home.path(), &config);
    let start = ["start", "--listen", "127.0.0.1:0", "--timeout", "20"];
    assert_cli(&cli_tagged(&home, &sw, &start, Duration::from_secs(30)), 0, "start");
    let api = Api::new(current_gateway(home.path()).and_then(|g| g.3).expect("its address")).with_token(TOKEN);
    let run = send_bg_as(&api, "B", "in flight");
    wait_active_as(&api, 1);
    let stop = cli_bg(&home, &sw, &["stop", "--timeout", "30"], Duration::from_secs(40));
    wait_state(&home, "draining", Duration::from_secs(10));
    let resp = api.send("ops", "u", "/restart").expect("the chat request");
    assert_eq!(resp.status, 200, "{}", resp.text());
    let reply = resp.json().unwrap()["reply"].as_str().unwrap_or_default().to_owned();
    assert!(reply.contains("is stopping"), "{reply}");
    assert_cli(&stop.join().unwrap(), 0, "stop");
    assert_eq!(run.join().unwrap().0.expect("the run's connection").status, 200, "the run is drained");
    assert!(wait_until(SETTLE, || sw.tagged().is_empty()), "still running: {:?}", sw.tagged());
    assert!(!home.lock_held(), "the gateway runs again after the stop\n{}", home.ledger_text());
    let joined: Vec<Value> =
        home.events("restart_requested").into_iter().filter(|e| e["requester"]["channel"] == json!("chat")).collect();
    assert_eq!(joined.len(), 1, "{}", home.ledger_text());
    assert_eq!(joined[0]["joined"], json!("stop"), "{}", joined[0]);
}
