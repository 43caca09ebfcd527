//! Shared helpers for the real-process tests. Each test file does `mod common;`.
#![allow(dead_code)]

use std::path::Path;
use std::time::Duration;

pub use gatewarden_testkit::serde_json::{self, Value, json};
pub use gatewarden_testkit::*;

/// Generous bound for "becomes ready" where the scenario gives no number (CI boxes are slow;
/// nextest runs tests in parallel).
pub const READY: Duration = Duration::from_secs(10);
/// Generous bound for "exits" where the scenario gives no number.
pub const EXIT: Duration = Duration::from_secs(10);

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_gatewarden")
}

pub fn start(home: &TempHome) -> Gateway {
    Gateway::start_ready(bin(), home)
}

pub fn builder(home: &TempHome) -> GatewayBuilder {
    GatewayBuilder::new(bin(), home)
}

pub fn run_cli(home: &TempHome, args: &[&str]) -> CliOutput {
    cli(bin(), home.path(), args)
}

/// `status` / `stop` / ... against an arbitrary path (e.g. a home that is a file).
pub fn run_cli_at(home: &Path, args: &[&str]) -> CliOutput {
    cli(bin(), home, args)
}

/// Asserts a CLI exit code and that nothing panicked, printing the whole output on failure.
#[track_caller]
pub fn assert_cli(out: &CliOutput, code: i32, what: &str) {
    assert!(!out.panicked(), "{what}: CLI panicked: {out:#?}");
    assert_eq!(out.code, Some(code), "{what}: expected exit {code}, got {:?}\n{out:#?}", out.code);
}

/// Asserts a gateway exit status is `code` (not a signal death).
#[track_caller]
pub fn assert_exit_code(g: &Gateway, status: std::process::ExitStatus, code: i32, what: &str) {
    assert_eq!(
        exit_code(status),
        Some(code),
        "{what}: gateway pid {} expected exit code {code}, got {status}\n{}",
        g.pid(),
        g.diag()
    );
}

/// A pid that certainly names no process right now (a reaped child).
pub fn dead_pid() -> u32 {
    let mut c = std::process::Command::new("true").spawn().expect("spawn true");
    let pid = c.id();
    c.wait().unwrap();
    assert!(!pid_alive(pid));
    pid
}

/// Seeds `gateway.pid` + a `running` `gateway_state.json` claiming `pid` owns the home, and a
/// `gateway.lock` file that nobody holds: the leftovers of a crashed gateway whose pid was
/// recycled. `start_time` may be `Value::Null`.
pub fn seed_stale_records(home: &TempHome, pid: u32, start_time: Value) {
    let rec = json!({
        "pid": pid,
        "kind": "gatewarden",
        "argv": [bin(), "run"],
        "start_time": start_time,
        "home": home.path(),
        "incarnation": "0123456789abcdef",
        "version": "0.1.0",
        "started_at": rfc3339_offset(-300),
    });
    let mut state = rec.clone();
    state["gateway_state"] = json!("running");
    state["exit_reason"] = Value::Null;
    state["exit_code"] = Value::Null;
    state["active_runs"] = json!(0);
    state["listen"] = json!("127.0.0.1:9");
    state["control"] = json!(home.control_sock());
    state["supervisor"] = json!("none");
    state["updated_at"] = json!(rfc3339_offset(-200));
    home.write("gateway.pid", rec.to_string());
    home.write("gateway_state.json", state.to_string());
    if !home.lock_file().exists() {
        home.write("gateway.lock", rec.to_string());
    }
    assert!(!home.lock_held(), "seeded lock must be free");
}

/// `gateway.pid` names `g` (pid and start time) and is valid JSON.
#[track_caller]
pub fn assert_pid_record_names(home: &TempHome, g: &Gateway) {
    let raw = std::fs::read(home.pid_file()).expect("gateway.pid exists");
    let v: Value = serde_json::from_slice(&raw)
        .unwrap_or_else(|e| panic!("gateway.pid is not JSON ({e}): {:?}", String::from_utf8_lossy(&raw)));
    assert_eq!(v["pid"], json!(g.pid()), "gateway.pid names the wrong process: {v}");
    assert_eq!(v["start_time"], json!(g.start_time()), "gateway.pid start_time: {v}");
}

/// Event-field check used by several tests: every ledger event carries its writer's identity.
#[track_caller]
pub fn assert_events_carry_identity(home: &TempHome) {
    for e in home.ledger_events() {
        for f in ["ts", "event", "pid", "start_time", "incarnation"] {
            assert!(e.get(f).is_some(), "ledger event lacks `{f}`: {e}");
        }
    }
}

/// Readiness right now: alive and `GET /readyz` = 200 at the known address.
pub fn serving(g: &mut Gateway) -> bool {
    if !g.alive() {
        return false;
    }
    let addr = g.listen();
    http_get(addr, "/readyz", Duration::from_secs(1)).map(|r| r.status == 200).unwrap_or(false)
}

/// Stops `g` with `gatewarden stop` and asserts the planned-stop outcome (CLI 0, gateway 0).
#[track_caller]
pub fn stop_cleanly(home: &TempHome, g: &mut Gateway) {
    let out = run_cli(home, &["stop"]);
    assert_cli(&out, 0, "stop");
    let st = g.wait_exit(EXIT);
    assert_exit_code(g, st, 0, "planned stop via `stop`");
}

/// A config whose exec agent holds every run until `gate` exists, then replies with the
/// message: a drain that waits on such a run lasts exactly until the test opens the gate.
pub fn gated_exec(gate: &Path) -> String {
    format!("drain_timeout_s = 120\n[agent]\n{}", gated_exec_agent(gate))
}

/// The `[agent]` lines of [`gated_exec`], for configs that write their own table header.
pub fn gated_exec_agent(gate: &Path) -> String {
    let script = format!("while [ ! -e '{}' ]; do sleep 0.05; done; cat", gate.display());
    format!("backend = \"exec\"\ncommand = [\"/bin/sh\", \"-c\", {}]\n", json!(script))
}

/// Once the gateway of `home` is draining: `cancel-drain` (run by `cli`) exits 0 naming
/// `incarnation`, which then answers `running` (`status`, also through `cli`).
#[track_caller]
pub fn cancel_keeps(home: &TempHome, incarnation: &str, cli: impl Fn(&[&str]) -> CliOutput) {
    let ok = wait_until(Duration::from_secs(20), || home.state().as_deref() == Some("draining"));
    assert!(ok, "never draining:\n{}", home.ledger_text());
    let out = cli(&["cancel-drain"]);
    assert_cli(&out, 0, "cancel-drain");
    assert!(out.stdout.contains(&format!("drain cancelled: incarnation {incarnation}")), "{}", out.stdout);
    let st = cli(&["status", "--json"]).json();
    assert_eq!((st["incarnation"].as_str(), st["state"].as_str()), (Some(incarnation), Some("running")), "{st:#}");
    let c = home.events("drain_cancelled");
    assert_eq!(c.len(), 1, "{}", home.ledger_text());
}

/// `desired_state.json` once `pred` holds for it (and its writer has let go of
/// `desired_state.lock`, which it holds until just after the file is in place).
#[track_caller]
pub fn wait_desired(home: &TempHome, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let mut last = Value::Null;
    let ok = wait_until(Duration::from_secs(20), || {
        last = home.read_json("desired_state.json").unwrap_or(Value::Null);
        pred(&last) && !lock_is_held(&home.file("desired_state.lock"))
    });
    assert!(ok, "desired_state.json never {what}: {last}");
    last
}

/// A `stop` running in the background that has recorded `stopped`, held right there
/// (SIGSTOP), as a loaded machine may hold it before it reaches the gateway: its pid. The
/// caller lets it go on with `SIGCONT`.
#[track_caller]
pub fn hold_recorded_stop(home: &TempHome) -> u32 {
    let d = wait_desired(home, "stopped by the stop", |d| d["want"] == json!("stopped"));
    let stopper = d["pid"].as_u64().expect("the stop's pid") as u32;
    send_signal(stopper, sig::SIGSTOP).unwrap();
    stopper
}
