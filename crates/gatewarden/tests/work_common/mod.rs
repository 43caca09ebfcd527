//! Helpers shared by the message / drain / restart / durability / platform tests.
//! Each of those files does `mod common; mod work_common;`.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::common::*;

/// The platform restart soaks' shared parts.
pub mod soak;

/// The update rig (private binary copy, patched releases): tests/update.rs, tests/overlap.rs.
#[cfg(target_os = "linux")]
pub mod rig;
#[allow(unused_imports)]
pub use gatewarden_testkit::api::{self, Api, current_gateway, header, wait_new_ready, write_config};
#[allow(unused_imports)]
pub use gatewarden_testkit::sweep::{self, Sweeper, TAG_VAR};

/// Spawns `run --listen 127.0.0.1:0` with `config` in the home, tagged for the sweeper, and
/// waits until ready.
pub fn gateway(home: &TempHome, sw: &Sweeper, config: &str) -> Gateway {
    write_config(home.path(), config);
    let mut g = builder(home).env(TAG_VAR, sw.tag()).spawn();
    g.wait_ready(READY);
    g
}

/// A platform test's config: `drain_timeout_s = 10`, the echo agent unless `agent` names a
/// backend of its own (then `agent` alone), and one `[[platform]]` table of `platform`'s lines.
pub fn platform_config(agent: &str, platform: &str) -> String {
    let backend = if agent.contains("backend") { "" } else { "backend = \"echo\"" };
    format!("drain_timeout_s = 10\n[agent]\n{backend}\n{agent}\n[[platform]]\n{platform}")
}

/// Spawns a platform test's gateway (not yet ready): `config` written, tagged for the sweeper,
/// with the test binary's credential-lock directory and `env` (the platform's secrets), on
/// `listen` when given (else `127.0.0.1:0`).
pub fn spawn_platform(
    home: &TempHome,
    sw: &Sweeper,
    config: &str,
    env: &[(&str, &str)],
    listen: Option<&str>,
) -> Gateway {
    write_config(home.path(), config);
    let mut b = builder(home).env(TAG_VAR, sw.tag()).env("GATEWARDEN_CREDS_DIR", creds_dir());
    for &(k, v) in env {
        b = b.env(k, v);
    }
    match listen {
        Some(addr) => b.listen(addr),
        None => b,
    }
    .spawn()
}

/// `g` once ready (within [`READY`]).
pub fn ready(mut g: Gateway) -> Gateway {
    g.wait_ready(READY);
    g
}

/// A CLI verb, tagged for the sweeper (the verb may detach processes: start, restart).
pub fn cli_tagged(home: &TempHome, sw: &Sweeper, args: &[&str], timeout: Duration) -> CliOutput {
    cli_with(bin(), home.path(), args, &[(TAG_VAR, sw.tag())], timeout)
}

/// Runs a CLI verb on a thread (for verbs that block while the test acts: stop, restart).
pub fn cli_bg(home: &TempHome, sw: &Sweeper, args: &[&str], timeout: Duration) -> JoinHandle<CliOutput> {
    let (p, tag) = (home.path().to_path_buf(), sw.tag().to_string());
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    std::thread::spawn(move || cli_with(bin(), &p, &args, &[(TAG_VAR, tag.as_str())], timeout))
}

/// Sends a sync message on a thread; the handle yields `(response, elapsed)`.
pub fn send_bg(addr: SocketAddr, chat: &str, text: &str) -> JoinHandle<(std::io::Result<HttpResponse>, Duration)> {
    let (chat, text) = (chat.to_string(), text.to_string());
    std::thread::spawn(move || {
        let t0 = Instant::now();
        let r = Api::new(addr).with_timeout(Duration::from_secs(60)).send(&chat, &chat, &text);
        (r, t0.elapsed())
    })
}

/// [`send_bg`] through `api` (its token and timeout).
pub fn send_bg_as(api: &Api, chat: &str, text: &str) -> JoinHandle<(std::io::Result<HttpResponse>, Duration)> {
    let (api, chat, text) = (api.clone().with_timeout(Duration::from_secs(60)), chat.to_string(), text.to_string());
    std::thread::spawn(move || {
        let t0 = Instant::now();
        let r = api.send(&chat, &chat, &text);
        (r, t0.elapsed())
    })
}

/// [`wait_active`] through `api` (its token).
#[track_caller]
pub fn wait_active_as(api: &Api, n: u64) {
    must_wait_until(Duration::from_secs(10), &format!("{n} active run(s) at {}", api.addr), || {
        api.status().and_then(|s| s.get("active_runs")?.as_u64()).is_some_and(|a| a >= n)
    });
}

/// `active_runs` from `GET /v1/status` (`None` if it does not answer).
pub fn active_runs(addr: SocketAddr) -> Option<u64> {
    Api::new(addr).with_timeout(Duration::from_secs(2)).status()?.get("active_runs")?.as_u64()
}

/// Waits until the gateway at `addr` reports at least `n` active runs.
#[track_caller]
pub fn wait_active(addr: SocketAddr, n: u64) {
    must_wait_until(Duration::from_secs(10), &format!("{n} active run(s) at {addr}"), || {
        active_runs(addr).is_some_and(|a| a >= n)
    });
}

/// Waits until `gateway_state.json` shows `state`.
#[track_caller]
pub fn wait_state(home: &TempHome, state: &str, timeout: Duration) {
    must_wait_until(timeout, &format!("gateway_state {state}"), || home.state().as_deref() == Some(state));
}

/// Waits until message `id` is final (`done` / `failed`) and returns its record.
#[track_caller]
pub fn wait_final(api: &Api, id: &str, timeout: Duration) -> Value {
    let mut last = None;
    let ok = wait_until(timeout, || {
        last = api.message(id);
        last.as_ref().is_some_and(|m| m["state"] == "done" || m["state"] == "failed")
    });
    assert!(ok, "message {id} not final within {timeout:?}; last seen: {last:?}");
    last.unwrap()
}

/// Waits until the ledger has at least `n` events named `name`.
#[track_caller]
pub fn wait_events(home: &TempHome, name: &str, n: usize, timeout: Duration) -> Vec<Value> {
    let mut evs = Vec::new();
    let ok = wait_until(timeout, || {
        evs = home.events(name);
        evs.len() >= n
    });
    assert!(ok, "ledger: wanted {n} `{name}` event(s) within {timeout:?}:\n{}", home.ledger_text());
    evs
}

/// Waits until no live process is in process group `pgid`.
pub fn group_gone(pgid: u32, timeout: Duration) -> bool {
    wait_until(timeout, || sweep::group_members(pgid).is_empty())
}

/// The incarnation of the gateway `g` (from the ledger's `started` event with its pid).
pub fn incarnation_of(home: &TempHome, pid: u32) -> Option<String> {
    home.events("started")
        .into_iter()
        .find(|e| e["pid"] == json!(pid))
        .and_then(|e| e["incarnation"].as_str().map(str::to_string))
}

/// The python interpreter name used by the Python client tests.
pub fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".into())
}

/// The `platforms` array of `status --json` (null when status gave no JSON).
pub fn platforms(home: &TempHome) -> Value {
    let out = run_cli(home, &["status", "--json"]);
    serde_json::from_str::<Value>(&out.stdout).map(|v| v["platforms"].clone()).unwrap_or(Value::Null)
}

/// Waits until the first adapter is in `state`; returns the `platforms` array seen then.
#[track_caller]
pub fn wait_adapter(home: &TempHome, state: &str, timeout: Duration) -> Value {
    let mut last = Value::Null;
    let ok = wait_until(timeout, || {
        last = platforms(home);
        last[0]["state"] == state
    });
    assert!(ok, "adapter not {state} within {timeout:?}: {last}");
    last
}

/// The seeded soaks' generator (tests/soak.rs, tests/overlap.rs): xorshift64*, enough to pick
/// operations and gaps, and replayable from the seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A soak's seed: `var` when set (a replay), else from the clock; never 0 (xorshift's fixed point).
pub fn soak_seed(var: &str) -> u64 {
    std::env::var(var).ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1) | 1
    })
}

/// A Matrix room on `synapse` for a gateway test: alice made it and invited `gwbot`. The bot,
/// alice, alice's logged-in client and the room id (platform_matrix.rs, platform_mixed.rs).
pub fn matrix_room(
    synapse: &gatewarden_testkit::servers::Synapse,
) -> (
    gatewarden_testkit::servers::MatrixUser,
    gatewarden_testkit::servers::MatrixUser,
    gatewarden_chatproto::matrix::Client,
    String,
) {
    let bot = synapse.register("gwbot", "pw-gwbot");
    let alice = synapse.register("alice", "pw-alice");
    let mut client = gatewarden_chatproto::matrix::Client::new(&synapse.base_url(), Duration::from_secs(30)).unwrap();
    client.set_access_token(alice.access_token.clone());
    client.whoami().unwrap();
    let room = client.create_room(&[&bot.user_id]).unwrap();
    (bot, alice, client, room)
}

/// One credential-lock directory per test binary run (`GATEWARDEN_CREDS_DIR`), so parallel test
/// binaries never share one, while the gateways of one test binary do (two homes, one token).
pub fn creds_dir() -> String {
    std::env::temp_dir().join(format!("gw-creds-test-{}", std::process::id())).to_string_lossy().into_owned()
}

/// The `cluster.role` of the gateway in `home` (status --json).
pub fn cluster_role(home: &TempHome) -> Option<String> {
    let v: Value = serde_json::from_str(&run_cli(home, &["status", "--json"]).stdout).ok()?;
    v["cluster"]["role"].as_str().map(str::to_owned)
}

#[track_caller]
pub fn wait_role(home: &TempHome, want: &str, within: Duration) {
    assert!(
        wait_until(within, || cluster_role(home).as_deref() == Some(want)),
        "not {want} within {within:?}: {:?}",
        cluster_role(home)
    );
}

/// Two homes on one credential: `second`, spawned while the gateway `holder` of `holder_home`
/// holds it, exits 78 before it connects, naming the holder's home and pid (`what`: which
/// credential, for the failure message).
#[track_caller]
pub fn refused_naming_the_holder(second: &mut Gateway, holder_home: &TempHome, holder: &Gateway, what: &str) {
    let st = second.wait_exit(EXIT);
    assert_exit_code(second, st, 78, what);
    let err = second.stderr();
    assert!(
        err.contains(&holder_home.path().to_string_lossy().to_string()) && err.contains(&holder.pid().to_string()),
        "{err}"
    );
}

/// An exec agent's `[agent]` lines (the script written in `dir`): it writes what it got in
/// `GATEWARDEN_ATTACHMENTS` to `dir/env.json`, answers "here is the report" and attaches
/// `dir/report.txt` (the `{"attach": path}` stdout convention). `hang_first`: its first run
/// only marks `dir/first` and hangs (for a kill -9 while the run is in progress).
#[cfg(unix)]
pub fn attaching_agent(dir: &std::path::Path, hang_first: bool, timeout_s: u64) -> String {
    use std::os::unix::fs::PermissionsExt;
    let d = dir.display();
    let hang = if hang_first {
        format!("if [ ! -e {d}/first ]; then : > {d}/first; exec sleep 60; fi\n")
    } else {
        String::new()
    };
    let script = dir.join("agent.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\ncat >/dev/null\nprintf '%s' \"$GATEWARDEN_ATTACHMENTS\" > {d}/env.json\n{hang}\
             printf 'report body\\n' > {d}/report.txt\necho 'here is the report'\necho '{{\"attach\": \"{d}/report.txt\"}}'\n"
        ),
    )
    .expect("write the agent script");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod the agent script");
    format!("backend = \"exec\"\ncommand = [\"{}\"]\ntimeout_s = {timeout_s}", script.display())
}
