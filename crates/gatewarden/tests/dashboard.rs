//! The dashboard against real gateways. The pure parts (crates/dashboard) fed from a home's
//! files; then, in a real headless Chromium (testkit::browser, `scripts/setup-chromium`), the
//! page a gateway serves on its own listener (`/ui`: state, the timeline over SSE across a CLI
//! restart, the token, the Restart button, a foreign `Host`) and the fleet page `gatewarden
//! dashboard` serves (three registered homes, one stopped with its reason, and Start from it).
//! Screenshots go to `target/screenshots/`.
//!
//!   cargo nextest run -p gatewarden --test dashboard
#![cfg(target_os = "linux")]

mod common;
use common::*;
use std::time::{Duration, SystemTime};

use gatewarden_control::proto::StatusReport;
use gatewarden_dashboard::gather;
use gatewarden_dashboard::snapshot::LockView;
use gatewarden_dashboard::timeline::{self, Ending};
use gatewarden_dashboard::{HomeSummary, Viewer, fleet, page, registry};
use gatewarden_lifecycle::Home;

fn status_json(home: &std::path::Path) -> StatusReport {
    let out = run_cli_at(home, &["status", "--json"]);
    serde_json::from_value(out.json()).unwrap_or_else(|e| panic!("status --json is a StatusReport ({e}): {out:?}"))
}

/// Stopped from the CLI, killed, running: three incarnations, each ended as it really did,
/// the stop's requester named, and the header agreeing with the lock.
#[test]
fn a_homes_page_tells_how_each_incarnation_ended() {
    let home = TempHome::new();
    let mut first = start(&home);
    let stop = run_cli(&home, &["stop"]);
    assert_cli(&stop, 0, "stop");
    first.wait_exit(Duration::from_secs(5));
    let mut second = start(&home);
    second.kill();
    // The third logs to the file `gatewarden start` gives a detached gateway.
    let log = home.path().join("logs").join(gather::LOG_FILE);
    let mut third = builder(&home).arg("--log-file").arg(&log).spawn();
    third.wait_ready(Duration::from_secs(10));

    let status = status_json(home.path());
    assert!(status.running, "{status:?}");
    let snap = gather::from_home(&Home::at(home.path()), status, SystemTime::now());
    assert_eq!(snap.lock, LockView::Held { pid: Some(third.pid()) });
    assert_eq!(snap.disagreement(), None, "lock and state file agree on a running gateway");

    let live = snap.status.incarnation.clone();
    let incs = timeline::incarnations(&snap.ledger, live.as_deref());
    let seen: Vec<(Option<u32>, &str)> = incs.iter().map(|i| (i.pid, i.ending.class())).collect();
    assert_eq!(
        seen,
        [(Some(first.pid()), "end-0"), (Some(second.pid()), "end-lost"), (Some(third.pid()), "end-run")],
        "{}",
        home.ledger_text()
    );
    assert_eq!(incs[1].ending, Ending::NoExitRecorded { superseded: true });
    let req = &incs[0].requests;
    assert_eq!(req.len(), 1, "one stop, written by the CLI and the gateway: {req:?}");
    assert_eq!((req[0].verb.as_str(), req[0].pid, req[0].channel.as_str()), ("stop", Some(stop.pid), "cli"));

    assert!(!snap.log_tail.is_empty(), "the log file's tail is in the snapshot");
    let levels = ["error", "warn", "info", "debug", "trace"];
    assert!(snap.log_tail.iter().all(|l| levels.contains(&l.level.as_str())), "levels parsed: {:?}", snap.log_tail);

    let html = page(&snap, &Viewer::default());
    assert!(html.contains(&format!("<span class=\"l-{}\">", snap.log_tail[0].level)), "the log section");
    assert!(html.contains(">running</span>"), "header state");
    assert!(html.contains(&format!("stop by pid {} (gatewarden ", stop.pid)), "requester in the table");
    // Its end was noticed by the third's start (`recorded_by`), which tells no more (issue 27 §2).
    assert!(html.contains("no exit recorded (why is not known)"));
    assert!(!html.contains("SIGKILL") && !html.contains("OOM"), "a guess at how it ended");
    assert_eq!(html.matches("class=\"bar ").count(), 6, "three bars in each view");
}

/// Three registered homes, one stopped: the fleet lists all three from the registry, the
/// stopped one with its state and the reason it ended.
#[test]
fn the_fleet_lists_registered_homes_and_why_a_stopped_one_ended() {
    let homes = [TempHome::new(), TempHome::new(), TempHome::new()];
    let gws: Vec<Gateway> = homes.iter().map(start).collect();
    let stop = run_cli(&homes[2], &["stop"]);
    assert_cli(&stop, 0, "stop");

    let reg = tempfile::tempdir().unwrap();
    let dir = reg.path().join("gatewarden/homes");
    for h in &homes {
        let canonical = std::fs::canonicalize(h.path()).unwrap();
        registry::register(&dir, &canonical.to_string_lossy(), None).unwrap();
    }
    let listing = registry::list(&dir).unwrap();
    assert!(listing.skipped.is_empty(), "{:?}", listing.skipped);
    let summaries: Vec<HomeSummary> =
        listing.entries.iter().map(|e| HomeSummary::from_status(&status_json(std::path::Path::new(&e.home)))).collect();
    assert_eq!(summaries.len(), 3);
    let stopped: Vec<&HomeSummary> = summaries.iter().filter(|s| s.state == "stopped").collect();
    assert_eq!(stopped.len(), 1, "{summaries:#?}");
    assert_eq!(stopped[0].last_exit_code, Some(0), "{summaries:#?}");
    let reason = stopped[0].last_exit_reason.clone().unwrap_or_default();
    assert!(reason.contains(&format!("pid {}", stop.pid)), "the reason names the stopper: {reason:?}");

    let html = fleet(&summaries, &listing.skipped, None);
    assert_eq!(html.matches("<tr data-state=\"running\"").count(), 2);
    assert_eq!(html.matches("<tr data-state=\"stopped\"").count(), 1);
    assert!(html.contains(&format!("exit 0: {}", maud_escape(&reason))), "{html}");
    for g in gws.iter().take(2) {
        assert!(html.contains(&format!("href=\"http://{}/ui\"", g.listen())), "a running home links to its page");
    }
}

/// The escaping maud applies to text (`&`, `<`, `>`, `"`).
fn maud_escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

// ---- In a real browser -------------------------------------------------------------------

use gatewarden_testkit::browser::Browser;

const TOKEN: &str = "dashboard-test-token-0123456789";
/// The bound for a CLI restart to reach an open page over SSE.
const SSE_DEADLINE: Duration = Duration::from_secs(1);
const PAGE: Duration = Duration::from_secs(10);

/// A detached gateway (`gatewarden start`), stopped when the test ends however it ends: its
/// restarts hand over to successors the test does not hold.
struct Started<'a>(&'a TempHome);

impl Drop for Started<'_> {
    fn drop(&mut self) {
        let _ = run_cli(self.0, &["stop", "--timeout", "10"]);
    }
}

fn start_detached(home: &TempHome) -> (Started<'_>, String) {
    home.write("config.toml", format!("api_token = \"{TOKEN}\"\n"));
    let out = run_cli(home, &["start", "--listen", "127.0.0.1:0"]);
    assert_cli(&out, 0, "start");
    let s = status_json(home.path());
    (Started(home), s.listen.clone().unwrap_or_else(|| panic!("no listen address: {s:?}")))
}

/// The text of the first element matching `css`, read in one script call: the live page swaps
/// sections under an element reference (the header changes every tick: uptime).
fn text_of(b: &Browser, css: &str) -> String {
    let q = serde_json::Value::String(css.to_owned());
    let v = b
        .execute(&format!("const e = document.querySelector({q}); return e ? e.innerText : null"))
        .unwrap_or_else(|e| panic!("{css}: {e}"));
    v.as_str().map(str::to_owned).unwrap_or_else(|| panic!("no {css:?} on the page"))
}

/// The gateway's own page: with `api_token` set, nothing but the login form without the token
/// (a forged POST is refused); once logged in its state, and a CLI restart reaches the open
/// page over SSE (the stream ends with the old incarnation and the page reconnects to the new
/// one, which knows the session); Restart produces a new incarnation shown on the page and
/// recorded as `channel: dashboard`; a foreign `Host` is refused.
#[test]
fn the_gateways_page_follows_restarts_and_restarts_with_the_token() {
    let Some(b) = Browser::start_with(Duration::from_secs(30), &["--host-resolver-rules=MAP evil.test 127.0.0.1"])
    else {
        return;
    };
    let home = TempHome::new();
    let (_gw, listen) = start_detached(&home);
    let first = status_json(home.path()).incarnation.expect("incarnation");
    let url = format!("http://{listen}/ui");

    b.navigate(&url).expect("navigate");
    // Nothing until the token is given: a login form, no state, no buttons, a forged POST refused.
    b.assert_read_only_page();
    assert!(b.find("#state").is_err() && !text_of(&b, "body").contains(&first), "{}", text_of(&b, "body"));
    assert_eq!(status_json(home.path()).incarnation.as_deref(), Some(first.as_str()), "nothing restarted");

    // The token, once: a session cookie scripts cannot read, then the page.
    b.send_keys(&b.find("form#login input[name=token]").expect("token input"), TOKEN).expect("type");
    b.click(&b.find("form#login button").expect("button")).expect("click");
    b.wait_text("#state", "running", PAGE).expect("the page, logged in");
    assert!(text_of(&b, "#truth").contains(&first));
    assert!(text_of(&b, "table.incs").contains(&first), "the timeline lists the running incarnation");
    assert_eq!(b.execute("return document.cookie").expect("cookie"), serde_json::json!(""));

    // A restart from the CLI: the open page shows it over SSE, without being reloaded.
    b.execute("window.__same_page = true; return 1").expect("mark the page");
    let out = run_cli(&home, &["restart", "--timeout", "30"]);
    assert_cli(&out, 0, "restart");
    let second = status_json(home.path()).incarnation.expect("incarnation");
    assert_ne!(second, first);
    let table = b
        .wait_text("table.incs", &second, SSE_DEADLINE)
        .unwrap_or_else(|e| panic!("the CLI restart did not reach the page within {SSE_DEADLINE:?}: {e}"));
    assert!(table.contains("exit 75 (planned_restart)") && table.contains("via cli"), "{table}");
    b.wait_text("#truth", &second, PAGE).expect("the header follows");
    assert_eq!(b.execute("return window.__same_page === true").expect("js"), serde_json::json!(true), "no reload");
    assert_eq!(b.execute("return document.body.classList.contains('stale')").expect("js"), serde_json::json!(false));

    // The session outlived the restart: the buttons are there.
    let restart = b.wait_find("form[action='/ui/action/restart'] button", PAGE);
    assert!(!b.find("body").and_then(|e| b.text(&e)).unwrap_or_default().contains(TOKEN), "no secret on the page");
    let png = gatewarden_testkit::browser::screenshot_dir(env!("CARGO_TARGET_TMPDIR")).join("gateway-main.png");
    b.screenshot(&png).expect("screenshot");
    eprintln!("screenshot: {}", png.display());

    // Restart from the page: it asks first, then the CLI's verified restart runs.
    b.click(&restart).expect("click restart");
    assert!(gatewarden_testkit::wait_until(Duration::from_secs(5), || b.alert_text().is_some()), "a confirmation");
    assert!(b.alert_text().unwrap_or_default().starts_with("Restart now?"));
    b.accept_alert().expect("accept");
    let outcome = b.wait_text("#action", "restart: done", Duration::from_secs(30)).expect("the restart's outcome");
    assert!(outcome.contains(&format!("of incarnation {second}")), "{outcome}");
    let third = status_json(home.path()).incarnation.expect("incarnation");
    assert_ne!(third, second, "a new incarnation");
    b.wait_text("#truth", &third, PAGE).expect("the new incarnation in the header");
    b.wait_text("#action", &third, PAGE).expect("the outcome names the new incarnation");
    let ledger = home.ledger_text();
    assert!(
        ledger.lines().any(|l| l.contains("\"restart_requested\"")
            && l.contains(&format!("\"incarnation\":\"{second}\""))
            && l.contains("\"channel\":\"dashboard\"")),
        "the ledger records requester dashboard:\n{ledger}"
    );

    // The page under a foreign name (DNS rebinding) is refused outright.
    b.navigate(&format!("http://evil.test:{}/ui", listen.rsplit(':').next().unwrap_or("0"))).expect("navigate");
    let body = text_of(&b, "body");
    assert!(body.contains("does not answer to Host") && body.contains("evil.test"), "{body}");
    b.quit();
}

/// Kills the fleet server when the test ends.
struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `gatewarden dashboard` on a free loopback port; its URL from its first line.
fn fleet_server(registry: &std::path::Path) -> (Server, String) {
    use std::io::BufRead;
    let mut cmd = std::process::Command::new(bin());
    gatewarden_testkit::test_env(&mut cmd);
    cmd.args(["dashboard", "--listen", "127.0.0.1:0"])
        .env("GATEWARDEN_REGISTRY", registry)
        .env("GATEWARDEN_DASHBOARD_TOKEN", TOKEN)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit());
    let mut child = cmd.spawn().expect("spawn dashboard");
    let stdout = child.stdout.take().expect("stdout");
    let server = Server(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(PAGE).expect("the dashboard prints its URL");
    let url = line.trim().strip_prefix("dashboard: ").unwrap_or_else(|| panic!("{line:?}")).to_owned();
    (server, url)
}

/// The fleet's list needs its token first: the login form, then the list.
fn fleet_login(b: &Browser, url: &str) {
    b.navigate(url).expect("navigate fleet");
    assert!(b.find("#fleet").is_err(), "no list before the login: {}", text_of(b, "body"));
    b.send_keys(&b.find("form#login input[name=token]").expect("token input"), TOKEN).expect("type");
    b.click(&b.find("form#login button").expect("button")).expect("click");
    b.wait_find("#fleet", PAGE);
}

/// The fleet: three homes registered by their gateways at start, one stopped from the CLI. The
/// page lists all three, the stopped one with why it ended; its own page (from its files)
/// starts it again with the token, and the new incarnation shows there.
#[test]
fn the_fleet_page_lists_three_homes_and_starts_a_stopped_one() {
    let Some(b) = Browser::start(Duration::from_secs(30)) else { return };
    let reg = tempfile::tempdir().unwrap();
    let dir = reg.path().join("homes");
    let homes = [TempHome::new(), TempHome::new(), TempHome::new()];
    let mut gws: Vec<Gateway> = homes
        .iter()
        .map(|h| {
            // The page's Start runs `gatewarden start`, which reads the listen address from here
            // (never the default port, which anything on the machine may hold).
            h.write("config.toml", format!("api_token = \"{TOKEN}\"\nlisten = \"127.0.0.1:0\"\n"));
            let mut g = builder(h).env("GATEWARDEN_REGISTRY", &dir).spawn();
            g.wait_ready(READY);
            g
        })
        .collect();
    let stop = run_cli(&homes[2], &["stop"]);
    assert_cli(&stop, 0, "stop");
    gws[2].wait_exit(EXIT);
    let stopped_path = std::fs::canonicalize(homes[2].path()).unwrap().to_string_lossy().into_owned();
    let (_server, url) = fleet_server(&dir);

    fleet_login(&b, &url);
    assert_eq!(b.find_all("#fleet tbody tr").expect("rows").len(), 3, "{}", text_of(&b, "body"));
    assert_eq!(b.find_all("#fleet tr[data-state=running]").expect("rows").len(), 2);
    let row = text_of(&b, "#fleet tr[data-state=stopped]");
    assert!(row.contains(&stopped_path), "{row}");
    assert!(row.contains("exit 0:") && row.contains(&format!("pid {}", stop.pid)), "why it ended: {row}");
    for g in gws.iter().take(2) {
        assert_eq!(b.find_all(&format!("a.own[href='http://{}/ui']", g.listen())).expect("find").len(), 1);
    }
    let png = gatewarden_testkit::browser::screenshot_dir(env!("CARGO_TARGET_TMPDIR")).join("fleet.png");
    b.screenshot(&png).expect("screenshot");
    eprintln!("screenshot: {}", png.display());

    // The stopped home's page, from its files (the fleet's session covers it): Start.
    let link = b.find("#fleet tr[data-state=stopped] a.files").expect("its page");
    b.click(&link).expect("open");
    b.wait_text("#state", "stopped", PAGE).expect("the stopped home's page");
    b.click(&b.wait_find("#actions form[action$='/action/start'] button", PAGE)).expect("click start");
    b.wait_text("#action", "start: done", Duration::from_secs(30)).expect("the start's outcome");
    b.wait_text("#state", "running", PAGE).expect("running again");
    let s = status_json(homes[2].path());
    assert!(s.running, "{s:?}");
    b.wait_text("#truth", s.incarnation.as_deref().unwrap_or("?"), PAGE).expect("the new incarnation");
    let desired = std::fs::read_to_string(homes[2].file("desired_state.json")).unwrap_or_default();
    assert!(desired.contains("dashboard start"), "the start is recorded as the dashboard's: {desired}");
    let _ = run_cli(&homes[2], &["stop"]);
    b.quit();
}

/// Opens the fleet page at `url`, then the page of the home whose row is in `state`, and logs
/// in there with the token.
fn open_home_logged_in(b: &Browser, url: &str, state: &str) {
    fleet_login(b, url);
    b.click(&b.wait_find(&format!("#fleet tr[data-state={state}] a.files"), PAGE)).expect("open its page");
    b.wait_text("#state", state, PAGE).unwrap_or_else(|e| panic!("the {state} home's page: {e}"));
}

/// Issue 27 §3: the fleet page's Start of a stopped home whose bot token is only in the
/// home's `secrets.env` (neither the dashboard's environment nor the test's has it): the
/// gateway starts, and its Telegram adapter answers with that token. Before, it exited 78
/// ("… is not set").
#[test]
fn the_fleet_pages_start_reads_the_homes_secrets_env() {
    use gatewarden_telegram_fake::{FakeTelegram, Options};
    use std::os::unix::fs::PermissionsExt;
    let Some(b) = Browser::start(Duration::from_secs(30)) else { return };
    let fake = FakeTelegram::start(Options { linger: Duration::from_millis(500), ..Options::default() }).unwrap();
    let reg = tempfile::tempdir().unwrap();
    let dir = reg.path().join("homes");
    let home = TempHome::new();
    let token = format!("{}:tok-dashboard-{}", std::process::id(), std::process::id());
    home.write(
        "config.toml",
        format!(
            "api_token = \"{TOKEN}\"\nlisten = \"127.0.0.1:0\"\n[[platform]]\nkind = \"telegram\"\n\
             token_env = \"GW_TEST_DASHBOARD_TG\"\napi_base = \"{}\"\npoll_timeout_s = 1\n",
            fake.base_url()
        ),
    );
    let secrets = home.file("secrets.env");
    std::fs::write(&secrets, format!("GW_TEST_DASHBOARD_TG={token}\n")).unwrap();
    std::fs::set_permissions(&secrets, std::fs::Permissions::from_mode(0o600)).unwrap();
    // First run from a shell that exported the token (as the issue found it), then stopped.
    let mut g = builder(&home).env("GATEWARDEN_REGISTRY", &dir).env("GW_TEST_DASHBOARD_TG", &token).spawn();
    g.wait_ready(READY);
    stop_cleanly(&home, &mut g);
    let (_server, url) = fleet_server(&dir);

    open_home_logged_in(&b, &url, "stopped");
    b.click(&b.wait_find("#actions button", PAGE)).expect("click start");
    b.wait_text("#action", "start: done", Duration::from_secs(30)).expect("the start's outcome");
    assert!(status_json(home.path()).running);
    fake.inject(&token, 7, 42, "hello from the dashboard's gateway");
    fake.wait_sent(&token, Duration::from_secs(30), |s| !s.is_empty()).expect("the adapter answered with the token");
    let _ = run_cli(&home, &["stop"]);
    b.quit();
}

/// Cancel drain from the fleet's page of a home (the gateway's own listener is handed to the
/// successor during a restart's drain): the home shows `draining` and a Cancel drain button;
/// with the token it runs `gatewarden cancel-drain`, the same incarnation runs on, and the
/// ledger names the dashboard.
#[test]
fn a_restart_drain_is_cancelled_from_the_fleet_page() {
    let Some(b) = Browser::start(Duration::from_secs(30)) else { return };
    let reg = tempfile::tempdir().unwrap();
    let dir = reg.path().join("homes");
    let home = TempHome::new();
    let gate = home.scratch("gate", "");
    home.write("config.toml", format!("api_token = \"{TOKEN}\"\n{}", gated_exec(&gate)));
    let mut g = builder(&home).env("GATEWARDEN_REGISTRY", &dir).spawn();
    g.wait_ready(READY);
    let inc = status_json(home.path()).incarnation.expect("incarnation");
    let addr = g.listen();
    // Held by the gate until the end of the test: a minute's patience, whatever the load.
    let run = std::thread::spawn(move || {
        gatewarden_testkit::api::Api::new(addr)
            .with_token(TOKEN)
            .with_timeout(Duration::from_secs(60))
            .send("c", "u", "x")
    });
    assert!(wait_until(READY, || status_json(home.path()).active_runs == Some(1)), "the run never started");
    assert_cli(&run_cli(&home, &["send", "/restart"]), 0, "send /restart");
    assert!(wait_until(READY, || home.state().as_deref() == Some("draining")), "never draining");
    let (_server, url) = fleet_server(&dir);

    open_home_logged_in(&b, &url, "draining");
    b.click(&b.wait_find("#actions form[action$='/action/cancel-drain'] button", PAGE)).expect("click cancel");
    assert!(wait_until(Duration::from_secs(5), || b.alert_text().is_some()), "a confirmation");
    assert!(b.alert_text().unwrap_or_default().starts_with("Cancel the restart?"));
    b.accept_alert().expect("accept");
    b.wait_text("#action", "cancel-drain: done", Duration::from_secs(30)).expect("the cancel's outcome");
    b.wait_text("#state", "running", PAGE).expect("running again");
    let s = status_json(home.path());
    assert_eq!((s.incarnation.as_deref(), s.state.as_deref()), (Some(inc.as_str()), Some("running")), "{s:?}");
    let c = home.events("drain_cancelled");
    assert_eq!(c.len(), 1, "{}", home.ledger_text());
    assert_eq!(c[0]["requester"]["channel"], json!("dashboard"), "{}", c[0]);
    std::fs::write(&gate, b"").unwrap();
    assert_eq!(run.join().unwrap().expect("an answer").status, 200);
    assert_cli(&run_cli(&home, &["stop"]), 0, "stop");
    g.wait_exit(EXIT);
    b.quit();
}

/// Messages: a failed message is listed with its reason and a Retry button; Retry (with the
/// token) queues a copy through the journal, which now succeeds; the outcome names the copy
/// and the ledger records the dashboard as the requester.
#[test]
fn a_failed_message_is_retried_from_the_page() {
    let Some(b) = Browser::start(Duration::from_secs(30)) else { return };
    let home = TempHome::new();
    let ok = home.path().join("ok");
    let (_gw, listen) = {
        let (g, l) = start_detached(&home);
        // The agent fails until `ok` exists (config read at start: restart to apply it).
        home.write(
            "config.toml",
            format!(
                "api_token = \"{TOKEN}\"\n[agent]\nbackend = \"exec\"\ncommand = [\"/bin/sh\", \"-c\", \"test -e {} && cat\"]\n",
                ok.display()
            ),
        );
        assert_cli(&run_cli(&home, &["restart"]), 0, "restart with the failing agent");
        (g, l)
    };
    let api = gatewarden_testkit::api::Api::new(listen.parse().expect("addr")).with_token(TOKEN);
    let id = api.submit("c1", "hello retry");
    let failed = gatewarden_testkit::wait_until(PAGE, || api.message(&id).is_some_and(|m| m["state"] == "failed"));
    assert!(failed, "the message fails first: {:?}", api.message(&id));

    b.navigate(&format!("http://{listen}/ui")).expect("navigate");
    assert!(b.find("#messages").is_err(), "no message before the login");
    b.send_keys(&b.find("form#login input[name=token]").expect("token input"), TOKEN).expect("type");
    b.click(&b.find("form#login button").expect("button")).expect("click");
    b.wait_find("#messages", PAGE);
    let row = text_of(&b, "#messages tr[data-state=failed]");
    assert!(row.contains(&id) && row.contains("hello retry"), "{row}");
    // Its trace (the journal's, as `gatewarden trace` prints it) is under it, ending in the failure.
    let trace = text_of(&b, "#messages ol.trace");
    let steps: Vec<&str> = ["received", "journaled", "claimed", "backend_called", "failed"]
        .into_iter()
        .filter(|s| !trace.contains(s))
        .collect();
    assert!(steps.is_empty(), "missing {steps:?} in the trace: {trace}");
    std::fs::write(&ok, "").expect("let the agent succeed");
    b.click(&b.wait_find("#messages form[action='/ui/action/retry'] button", PAGE)).expect("retry");
    let outcome = b.wait_text("#action", "retry: done", PAGE).expect("the retry's outcome");
    let copy = outcome
        .split("queued again as ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("the outcome names the copy: {outcome}"))
        .to_owned();
    let done = gatewarden_testkit::wait_until(PAGE, || api.message(&copy).is_some_and(|m| m["state"] == "done"));
    assert!(done, "the copy runs: {:?}", api.message(&copy));
    assert_eq!(api.message(&copy).map(|m| m["reply"].clone()), Some(serde_json::json!("hello retry")));
    let ledger = home.ledger_text();
    assert!(
        ledger
            .lines()
            .any(|l| l.contains("\"dashboard_action\"") && l.contains("\"channel\":\"dashboard\"") && l.contains(&id)),
        "{ledger}"
    );
    b.quit();
}
