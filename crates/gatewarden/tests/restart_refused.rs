//! Issue 27 §1: a restart never stops what it cannot start again. Whatever asks for it (the CLI,
//! SIGUSR1, a chat `/restart` over HTTP, the dashboard's action endpoint), a next incarnation
//! that cannot start is found out before the running gateway stops serving: the restart is
//! refused naming the file, line and key, `restart` exits 78, the ledger says
//! `restart_refused` with the requester, and a client calling the gateway throughout sees every
//! call answered by the same incarnation. Belt and braces: a successor that dies after it said
//! `prepared`, while its predecessor drains, leaves the predecessor serving. The chat route
//! through the Telegram fake is in tests/platform_telegram.rs, systemd in tests/systemd.rs,
//! `update` in tests/update.rs. Real processes, loopback only.
#![cfg(target_os = "linux")]

mod common;
mod work_common;
use common::*;
use std::time::Duration;
use work_common::*;

use gatewarden_testkit::api::Caller;

const TOKEN: &str = "refused-test-token-0123456789";
/// The line `config.toml` gets that no gateway can load.
const BAD: &str = "bogus_key = 1\n";
const RESTART: Duration = Duration::from_secs(60);

fn good_config() -> String {
    format!("api_token = \"{TOKEN}\"\nadmins = [\"root\"]\n[agent]\nbackend = \"echo\"\n")
}

/// The ledger's events from index `from` on.
fn events_since(home: &TempHome, from: usize) -> Vec<Value> {
    home.ledger_events().into_iter().skip(from).collect()
}

/// After a refused restart asked for through `channel`: `restart_refused` names the key and
/// the requester, the successor (if one was started) is gone, and nothing else happened since
/// index `from`: no drain, no state change, no exit, no backstop; the same incarnation runs.
#[track_caller]
fn assert_refused_untouched(home: &TempHome, from: usize, inc: &str, channel: &str) {
    let before = home.ledger_events().into_iter().take(from).filter(|e| e["event"] == "restart_refused").count();
    let refused = wait_events(home, "restart_refused", before + 1, READY);
    let r = refused.last().unwrap();
    let reason = r["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("config.toml:") && reason.contains("unknown key 'bogus_key'"), "{r}");
    assert_eq!(r["requester"]["channel"], json!(channel), "{r}");
    assert_eq!(r["incarnation"], json!(inc), "{r}");
    let since = events_since(home, from);
    for e in &since {
        let name = e["event"].as_str().unwrap_or_default();
        assert!(
            !matches!(name, "state" | "drained" | "exited" | "restart_backstop" | "started" | "ready"),
            "{channel}: the refused restart touched the gateway ({name}):\n{}",
            home.ledger_text()
        );
    }
    for s in since.iter().filter(|e| e["event"] == "successor_started") {
        let pid = s["successor_pid"].as_u64().unwrap() as u32;
        assert!(wait_until(READY, || !pid_alive(pid)), "{channel}: the refused successor {pid} still runs");
    }
    let st = run_cli(home, &["status", "--json"]);
    assert_cli(&st, 0, "status");
    assert_eq!((st.json()["incarnation"].as_str(), st.json()["state"].as_str()), (Some(inc), Some("running")));
}

/// CLI `restart`, `send /restart` (the control socket), SIGUSR1 and a chat `/restart` over
/// HTTP, each against the same running gateway with a config that does not load: each refused
/// and told why, the gateway untouched, and a client calling it throughout answered every time
/// by the same incarnation. Once the config is fixed, the CLI's printed recovery works.
#[test]
fn every_route_refuses_a_restart_whose_config_does_not_load_and_the_gateway_serves_on() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    let mut g = gateway(&home, &sw, &good_config());
    // `/readyz` answers before the start's last ledger lines are written.
    wait_events(&home, "ready", 1, READY);
    let inc = incarnation_of(&home, g.pid()).expect("incarnation");
    let api = Api::new(g.listen()).with_token(TOKEN);
    let caller = Caller::start(api.clone());
    write_config(home.path(), &format!("{}{BAD}", good_config()));

    // The CLI: exit 78, the file, line and key, and the recovery.
    let from = home.ledger_events().len();
    let out = cli_tagged(&home, &sw, &["restart", "--timeout", "30"], RESTART);
    assert_cli(&out, 78, "restart with a config that does not load");
    assert!(out.stderr.contains("restart refused") && out.stderr.contains("unknown key 'bogus_key'"), "{out:#?}");
    assert!(out.stderr.contains("keeps serving") && out.stderr.contains(&inc), "{out:#?}");
    assert!(!out.stderr.contains("no gateway holds the lock"), "{out:#?}");
    assert_refused_untouched(&home, from, &inc, "cli");
    let result = home.events("restart_result");
    assert_eq!(
        (result.last().unwrap()["ok"].clone(), result.last().unwrap()["refused"].clone()),
        (json!(false), json!(true))
    );

    // `send /restart` through the control socket.
    let from = home.ledger_events().len();
    let out = cli_tagged(&home, &sw, &["send", "/restart"], RESTART);
    assert_cli(&out, 1, "send /restart");
    assert!(out.stderr.contains("restart refused") && out.stderr.contains("bogus_key"), "{out:#?}");
    assert_refused_untouched(&home, from, &inc, "cli-send");

    // SIGUSR1: nobody to answer; the ledger and the log say it.
    let from = home.ledger_events().len();
    g.signal(sig::SIGUSR1);
    assert_refused_untouched(&home, from, &inc, "signal");

    // A chat `/restart` over HTTP: the reply says why.
    let from = home.ledger_events().len();
    let r = api.send("ops", "root", "/restart").expect("POST /restart");
    assert_eq!(r.status, 200, "{}", r.text());
    let reply = r.json().unwrap()["reply"].as_str().unwrap_or_default().to_owned();
    assert!(reply.starts_with("restart refused") && reply.contains("bogus_key"), "{reply}");
    assert_refused_untouched(&home, from, &inc, "chat");
    assert!(!home.exists(".restart_notify.json"), "no \"back online\" is owed for a refused restart");

    caller.finish().assert_only(&inc, "while four restarts were refused");
    assert!(g.alive(), "{}", g.diag());

    // The printed recovery: fix the config, `check`, `restart`.
    write_config(home.path(), &good_config());
    assert_cli(&run_cli(&home, &["check"]), 0, "check after the fix");
    let out = cli_tagged(&home, &sw, &["restart", "--timeout", "30"], RESTART);
    assert_cli(&out, 0, "restart after the fix");
    let st = g.wait_exit(EXIT);
    assert_exit_code(&g, st, 75, "the old gateway after the restart");
    assert_cli(&cli_tagged(&home, &sw, &["stop"], RESTART), 0, "stop");
}

/// The dashboard's action endpoint (`POST /ui/action/restart`, logged in with the token and
/// the page's CSRF token): the page's outcome is the CLI's refusal (exit 78, the reason in its
/// output), and the gateway served a client throughout.
#[test]
fn the_dashboards_restart_action_is_refused_and_the_page_says_why() {
    use gatewarden_testkit::api::request;
    let home = TempHome::new();
    let sw = Sweeper::new();
    let g = gateway(&home, &sw, &good_config());
    wait_events(&home, "ready", 1, READY);
    let inc = incarnation_of(&home, g.pid()).expect("incarnation");
    let addr = g.listen();
    let caller = Caller::start(Api::new(addr).with_token(TOKEN));
    write_config(home.path(), &format!("{}{BAD}", good_config()));

    let origin = format!("http://{addr}");
    let t = Duration::from_secs(10);
    let form = [("Origin", origin.as_str()), ("Content-Type", "application/x-www-form-urlencoded")];
    let login = request(addr, "POST", "/ui/login", &form, Some(format!("token={TOKEN}").as_bytes()), t).unwrap();
    let cookie = gatewarden_testkit::api::header(&login, "set-cookie")
        .and_then(|c| c.split(';').next())
        .unwrap_or_else(|| panic!("no session cookie: {login:?}"))
        .to_owned();
    let page = request(addr, "GET", "/ui", &[("Cookie", cookie.as_str())], None, t).unwrap().text();
    let csrf = page
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .unwrap_or_else(|| panic!("no CSRF token on the page"))
        .to_owned();
    let from = home.ledger_events().len();
    let mut headers = form.to_vec();
    headers.push(("Cookie", cookie.as_str()));
    let r = request(addr, "POST", "/ui/action/restart", &headers, Some(format!("csrf={csrf}").as_bytes()), t).unwrap();
    assert!(r.status == 303 || r.status == 200, "the action was not taken: {} {}", r.status, r.text());

    must_wait_until(RESTART, "the action's outcome", || {
        home.read_json("dashboard_action.json").is_some_and(|o| o["code"].is_number())
    });
    let o = home.read_json("dashboard_action.json").unwrap();
    assert_eq!(o["code"], json!(78), "{o}");
    assert_refused_untouched(&home, from, &inc, "dashboard");
    let page = request(addr, "GET", "/ui", &[("Cookie", cookie.as_str())], None, t).unwrap().text();
    assert!(page.contains("refused (exit 78)") && page.contains("bogus_key"), "the page does not say why:\n{page}");
    caller.finish().assert_only(&inc, "while the dashboard's restart was refused");
}

/// Belt and braces on the spawn route: the successor said `prepared`, the old gateway began to
/// drain (a run holds it), and then the successor died. Nothing would replace the old gateway,
/// so its drain is cancelled and it serves on as the same incarnation: the waiting `restart`
/// says why, and the run it waited on finishes.
#[test]
fn a_successor_that_dies_during_the_drain_leaves_the_old_gateway_serving() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    let gate = home.scratch("gate", "");
    let g = gateway(&home, &sw, &gated_exec(&gate));
    let inc = incarnation_of(&home, g.pid()).expect("incarnation");
    let api = Api::new(g.listen());
    let held = api.submit("c1", "held through the restart");
    wait_active(g.listen(), 1);

    let restart = cli_bg(&home, &sw, &["restart", "--timeout", "60"], RESTART);
    let successor = wait_events(&home, "successor_started", 1, READY)[0]["successor_pid"].as_u64().unwrap() as u32;
    wait_state(&home, "draining", READY);
    // Proven ours before it is signalled: a `run --successor` of this very home.
    let argv = sweep::cmdline_of(successor);
    assert!(
        argv.iter().any(|a| a == "--successor") && argv.iter().any(|a| a.as_str() == home.path().to_str().unwrap()),
        "{argv:?}"
    );
    send_signal(successor, sig::SIGKILL).unwrap();

    let failed = wait_events(&home, "restart_failed", 1, READY);
    assert!(failed[0]["reason"].as_str().unwrap_or_default().contains("successor exited"), "{}", failed[0]);
    wait_events(&home, "drain_cancelled", 1, READY);
    wait_state(&home, "running", READY);
    let out = restart.join().unwrap();
    assert_cli(&out, 1, "restart whose successor died");
    assert!(out.stderr.contains("successor exited") && out.stderr.contains(&inc), "{out:#?}");

    std::fs::write(&gate, b"").unwrap();
    let m = wait_final(&api, &held, READY);
    assert_eq!(m["state"], json!("done"), "{m}");
    let st = run_cli(&home, &["status", "--json"]).json();
    assert_eq!((st["incarnation"].as_str(), st["state"].as_str()), (Some(inc.as_str()), Some("running")), "{st:#}");
    assert_eq!(home.events("started").len(), 1, "nothing else started:\n{}", home.ledger_text());
}
