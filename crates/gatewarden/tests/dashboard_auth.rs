//! Issue 31 items 3, 4 and 6: who may read the dashboards, and logins. Real gateways and a
//! real `gatewarden dashboard`, run as root; the reader is another local user (made here with
//! `useradd`, removed after) with curl, as anyone on the machine could. The pages' rules are
//! crates/dashboard/src/web.rs, one layer for both servers.
#![cfg(target_os = "linux")]

mod common;
mod work_common;
use common::*;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use work_common::*;

use gatewarden_testkit::users::TempUser;

const TOKEN: &str = "dashboard-auth-token-0123456789";
/// What a message says, and what a page must not show to whoever may not read it.
const SECRET: &str = "the-plan-is-4217";

/// An HTTP answer as curl saw it.
#[derive(Debug)]
struct Seen {
    status: u16,
    head: String,
    body: String,
}

impl Seen {
    fn all(&self) -> String {
        format!("{}\n{}", self.head, self.body)
    }
}

/// curl as `user` (or as root), bounded: a stream is read for `max_s` seconds.
fn curl(user: Option<&TempUser>, url: &str, extra: &[&str], max_s: u32) -> Seen {
    let mut c = match user {
        Some(u) => {
            let mut c = Command::new("setpriv");
            c.arg(format!("--reuid={}", u.uid)).arg(format!("--regid={}", u.gid)).args([
                "--clear-groups",
                "--",
                "curl",
            ]);
            c
        }
        None => Command::new("curl"),
    };
    c.args(["-s", "-i", "--noproxy", "*", "--max-time", &max_s.to_string()]).args(extra).arg(url);
    c.stdin(Stdio::null());
    let out = c.output().expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).replace("\r\n", "\n");
    let (head, body) = text.split_once("\n\n").unwrap_or((&text, ""));
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    Seen { status, head: head.to_owned(), body: body.to_owned() }
}

/// A login POST as a browser on the page sends it (its `Origin`), from `user`.
fn login(user: Option<&TempUser>, base: &str, origin: &str, token: &str) -> Seen {
    let form = format!("token={token}");
    curl(user, &format!("{origin}{base}/login"), &["-H", &format!("Origin: {origin}"), "--data", &form], 5)
}

/// The session cookie a successful login set.
fn cookie_of(s: &Seen) -> String {
    s.head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase().starts_with("set-cookie:").then(|| l["set-cookie:".len()..].trim().to_owned())
        })
        .and_then(|c| c.split(';').next().map(str::to_owned))
        .unwrap_or_else(|| panic!("no session cookie: {s:?}"))
}

/// An exec agent that fails, its stderr quoting the message (the failure reason carries it).
fn failing_agent(root: &Path) -> String {
    let agent = root.join("agent.sh");
    std::fs::write(&agent, "#!/bin/sh\nprintf 'cannot answer: %s' \"$(cat)\" >&2\nexit 2\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755)).unwrap();
    format!("[agent]\nbackend = \"exec\"\ncommand = [\"{}\"]\n", agent.display())
}

/// A gateway with a failed message quoting [`SECRET`]; its id.
fn gateway_with_a_failed_message(home: &TempHome, sw: &Sweeper, config: &str) -> (Gateway, String) {
    let g = gateway(home, sw, &format!("{config}{}", failing_agent(home.root())));
    let mut api = Api::new(g.listen());
    if config.contains("api_token") {
        api = api.with_token(TOKEN);
    }
    let id = api.submit("chat-1", SECRET);
    assert_eq!(wait_final(&api, &id, Duration::from_secs(30))["state"], "failed");
    (g, id)
}

/// Item 3: with `api_token` set, another local user got 401 from `/v1/status` but read every
/// conversation, failed message and log line on `/ui`. Now `/ui` needs the token's session:
/// without one, a login form and nothing else; `/ui/events` is refused.
#[test]
fn with_an_api_token_reading_the_gateways_page_needs_a_session() {
    let Some(other) = TempUser::create() else { return };
    let (home, sw) = (TempHome::new(), Sweeper::new());
    let (g, id) = gateway_with_a_failed_message(&home, &sw, &format!("api_token = \"{TOKEN}\"\n"));
    let origin = format!("http://{}", g.listen());
    let incarnation = home.state_record().and_then(|s| s["incarnation"].as_str().map(str::to_owned)).unwrap();

    assert_eq!(curl(Some(&other), &format!("{origin}/v1/status"), &[], 5).status, 401);
    let page = curl(Some(&other), &format!("{origin}/ui"), &[], 5);
    assert_eq!(page.status, 200, "{page:?}");
    assert!(page.body.contains("id=\"login\""), "the login form: {page:?}");
    for hidden in [SECRET, id.as_str(), incarnation.as_str(), &g.pid().to_string()] {
        assert!(!page.all().contains(hidden), "{hidden} shown without a session: {}", page.body);
    }
    let events = curl(Some(&other), &format!("{origin}/ui/events"), &[], 3);
    assert_eq!(events.status, 403, "{events:?}");
    assert!(!events.all().contains(SECRET));
    // A guessed cookie is no session.
    let forged = curl(Some(&other), &format!("{origin}/ui"), &["-H", "Cookie: gw_session=0.0.0"], 5);
    assert!(!forged.all().contains(SECRET) && forged.body.contains("id=\"login\""));

    // The token holder logs in and reads everything.
    let ok = login(None, "/ui", &origin, TOKEN);
    assert_eq!(ok.status, 303, "{ok:?}");
    let cookie = cookie_of(&ok);
    let page = curl(None, &format!("{origin}/ui"), &["-H", &format!("Cookie: {cookie}")], 5);
    assert!(page.body.contains(SECRET) && page.body.contains(&id), "{}", page.body);
    drop(g);
    let _ = sw.sweep();
}

/// Item 3, without a token: the page stays open on loopback (the operator's own view) but
/// shows no message text, no message id and no log, and says so; `[http] ui_show_text = true`
/// shows them.
#[test]
fn without_a_token_the_gateways_page_shows_no_message_text_unless_asked_to() {
    let Some(other) = TempUser::create() else { return };
    let (home, sw) = (TempHome::new(), Sweeper::new());
    let (g, id) = gateway_with_a_failed_message(&home, &sw, "");
    let origin = format!("http://{}", g.listen());
    let page = curl(Some(&other), &format!("{origin}/ui"), &[], 5);
    assert_eq!(page.status, 200, "{page:?}");
    assert!(page.body.contains("id=\"state\""), "the state is shown: {}", page.body);
    assert!(page.body.contains("id=\"text-hidden\"") && page.body.contains("ui_show_text"), "it says why");
    assert!(!page.all().contains(SECRET) && !page.all().contains(&id), "{}", page.body);
    let events = curl(Some(&other), &format!("{origin}/ui/events"), &[], 3);
    assert_eq!(events.status, 200, "{events:?}");
    assert!(events.body.contains("event:") && !events.all().contains(SECRET), "{events:?}");
    drop(g);

    let g = gateway(&home, &sw, &format!("[http]\nui_show_text = true\n{}", failing_agent(home.root())));
    let page = curl(Some(&other), &format!("http://{}/ui", g.listen()), &[], 5);
    assert!(page.body.contains(SECRET) && !page.body.contains("id=\"text-hidden\""), "{}", page.body);
    drop(g);
    let _ = sw.sweep();
}

/// Item 6: failed logins are throttled per client and recorded in the ledger. A burst of
/// wrong tokens gets a handful looked at, then 429 with `Retry-After`; the right token waits
/// out the same wait, then works.
#[test]
fn failed_logins_to_the_gateways_page_are_throttled_and_recorded() {
    let (home, sw) = (TempHome::new(), Sweeper::new());
    let g = gateway(&home, &sw, &format!("api_token = \"{TOKEN}\"\n"));
    let origin = format!("http://{}", g.listen());
    let (looked_at, throttled) = burst(&origin, "/ui");
    assert!((5..=7).contains(&looked_at), "{looked_at} wrong tokens were compared in the burst");
    assert!(throttled.is_some(), "the burst was never throttled");
    let recorded = wait_events(&home, "dashboard_login_failed", looked_at, READY);
    assert_eq!(recorded.len(), looked_at, "{}", home.ledger_text());
    assert!(recorded.iter().all(|e| e["client"] == "127.0.0.1"), "{recorded:?}");
    assert_eq!(recorded.last().unwrap()["failures"], looked_at as u64);
    right_token_after_the_wait(&origin, "/ui", throttled.unwrap());
    drop(g);
    let _ = sw.sweep();
}

/// Wrong tokens for 3 s as fast as one client can: (how many were compared, the first 429).
fn burst(origin: &str, base: &str) -> (usize, Option<Seen>) {
    let (mut looked_at, mut throttled) = (0, None);
    let t0 = Instant::now();
    let mut n = 0;
    while t0.elapsed() < Duration::from_secs(3) {
        let r = login(None, base, origin, &format!("wrong-token-{n:012}-guess"));
        n += 1;
        match r.status {
            403 => looked_at += 1,
            429 => {
                assert!(r.head.to_ascii_lowercase().contains("retry-after:"), "{r:?}");
                throttled.get_or_insert(r);
            }
            other => panic!("unexpected {other}: {r:?}"),
        }
    }
    assert!(n >= 20, "only {n} tries in the burst");
    (looked_at, throttled)
}

/// The right token during the wait is refused like any other; after it, accepted.
fn right_token_after_the_wait(origin: &str, base: &str, throttled: Seen) {
    let wait: u64 = throttled
        .head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("retry-after:").map(|v| v.trim().to_owned()))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{throttled:?}"));
    assert!((1..=60).contains(&wait), "{wait}");
    let during = login(None, base, origin, TOKEN);
    if during.status == 429 {
        let deadline = Instant::now() + Duration::from_secs(wait + 5);
        let ok = loop {
            let r = login(None, base, origin, TOKEN);
            if r.status != 429 || Instant::now() > deadline {
                break r;
            }
            std::thread::sleep(Duration::from_millis(250));
        };
        assert_eq!(ok.status, 303, "the right token once the wait is over: {ok:?}");
    } else {
        assert_eq!(during.status, 303, "{during:?}");
    }
}

/// `gatewarden dashboard` as root, with `env`; its URL from its first line, and what it printed.
struct Fleet {
    child: std::process::Child,
    url: String,
    said: String,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the dashboard prints at start: its URL, the token unless given, the note when root.
fn fleet(registry: &Path, listen: &str, env: &[(&str, &str)]) -> Fleet {
    let given = env.iter().any(|(k, v)| k.starts_with("GATEWARDEN_DASHBOARD_TOKEN") && !v.is_empty());
    let lines = 1 + usize::from(!given) + usize::from(rustix::process::geteuid().is_root());
    use std::io::BufRead;
    let mut cmd = Command::new(bin());
    gatewarden_testkit::test_env(&mut cmd);
    cmd.args(["dashboard", "--listen", listen])
        .env("GATEWARDEN_REGISTRY", registry)
        .env_remove("GATEWARDEN_DASHBOARD_TOKEN")
        .env_remove("GATEWARDEN_DASHBOARD_TOKEN_FILE");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.stdout(Stdio::piped()).stderr(Stdio::inherit());
    let mut child = cmd.spawn().expect("spawn dashboard");
    let stdout = child.stdout.take().expect("stdout");
    // Killed on drop from here on, a failed wait included.
    let mut f = Fleet { child, url: String::new(), said: String::new() };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines_in = std::io::BufReader::new(stdout).lines();
        let mut said = String::new();
        for _ in 0..lines {
            match lines_in.next() {
                Some(Ok(l)) => said.push_str(&format!("{l}\n")),
                _ => break,
            }
        }
        let _ = tx.send(said);
    });
    f.said = rx.recv_timeout(READY).expect("the dashboard prints its URL");
    let url =
        f.said.lines().next().and_then(|l| l.strip_prefix("dashboard: ")).unwrap_or_else(|| panic!("{:?}", f.said));
    f.url = url.trim_end_matches("/ui/fleet").to_owned();
    f
}

/// A registered home of root's, its gateway stopped, with a private log line and a ledger.
fn registered_home(reg: &Path) -> TempHome {
    let home = TempHome::new();
    write_config(home.path(), "listen = \"127.0.0.1:0\"\n");
    let mut g = builder(&home).env("GATEWARDEN_REGISTRY", reg).spawn();
    g.wait_ready(READY);
    assert_cli(&run_cli(&home, &["stop"]), 0, "stop");
    g.wait_exit(EXIT);
    std::fs::create_dir_all(home.path().join("logs")).unwrap();
    std::fs::write(home.path().join("logs/gateway.log"), format!("info: a chat said {SECRET}\n")).unwrap();
    home
}

/// Item 4: root's fleet dashboard served every page, root's 0600 log tail and ledger included,
/// to any local user with no login. Now every page and stream needs a session, and the server
/// says it serves root's homes.
#[test]
fn the_fleet_dashboard_run_as_root_serves_nothing_without_a_session() {
    let Some(other) = TempUser::create() else { return };
    let reg = tempfile::tempdir().unwrap();
    let dir = reg.path().join("homes");
    let home = registered_home(&dir);
    let canon = std::fs::canonicalize(home.path()).unwrap().to_string_lossy().into_owned();
    let key = gatewarden_dashboard::render::home_key(&canon);
    let f = fleet(&dir, "127.0.0.1:0", &[]);
    assert!(f.said.contains("runs as root") && f.said.contains("root's homes"), "{}", f.said);
    let token = f
        .said
        .lines()
        .find_map(|l| l.rsplit_once(": ").filter(|(k, _)| k.starts_with("token")).map(|(_, t)| t.to_owned()));
    let token = token.unwrap_or_else(|| panic!("the printed token: {}", f.said));

    for path in ["/ui/fleet".to_owned(), format!("/ui/home/{key}")] {
        let page = curl(Some(&other), &format!("{}{path}", f.url), &[], 5);
        assert_eq!(page.status, 200, "{page:?}");
        assert!(page.body.contains("id=\"login\"") && page.body.contains("root's homes"), "{path}: {}", page.body);
        assert!(!page.all().contains(SECRET) && !page.all().contains(&canon), "{path} leaked: {}", page.body);
    }
    let events = curl(Some(&other), &format!("{}/ui/home/{key}/events", f.url), &[], 3);
    assert_eq!(events.status, 403, "{events:?}");
    // A forged action is refused too.
    let forged = curl(
        Some(&other),
        &format!("{}/ui/home/{key}/action/start", f.url),
        &["-H", &format!("Origin: {}", f.url), "--data", "csrf=guess"],
        5,
    );
    assert_eq!(forged.status, 403, "{forged:?}");

    // With the token: the list, then the home's page with its log.
    let ok = login(None, "/ui/fleet", &f.url, &token);
    assert_eq!(ok.status, 303, "{ok:?}");
    let cookie = format!("Cookie: {}", cookie_of(&ok));
    let list = curl(None, &format!("{}/ui/fleet", f.url), &["-H", &cookie], 5);
    assert!(list.body.contains(&canon) && list.body.contains("root's homes"), "{}", list.body);
    let page = curl(None, &format!("{}/ui/home/{key}", f.url), &["-H", &cookie], 5);
    assert!(page.body.contains(SECRET), "{}", page.body);
}

/// Items 4 and 6: a fleet token shorter than 16 bytes is refused; without a token the fleet
/// dashboard stays on loopback, with one it may listen elsewhere; failed logins are throttled
/// and recorded in the ledger of the home whose page it was.
#[test]
fn fleet_tokens_listen_addresses_and_failed_logins() {
    let reg = tempfile::tempdir().unwrap();
    let dir = reg.path().join("homes");
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let mut all = vec!["dashboard"];
        all.extend_from_slice(args);
        let mut env = env.to_vec();
        env.push(("GATEWARDEN_REGISTRY", dir.to_str().unwrap()));
        cli_with(bin(), reg.path(), &all, &env, Duration::from_secs(10))
    };
    let short = run(&["--listen", "127.0.0.1:0"], &[("GATEWARDEN_DASHBOARD_TOKEN", "x")]);
    assert_eq!(short.code, Some(78), "{short:?}");
    assert!(short.stderr.contains("at least 16 bytes"), "{short:?}");
    let open = run(&["--listen", "0.0.0.0:0"], &[("GATEWARDEN_DASHBOARD_TOKEN", "")]);
    assert_eq!(open.code, Some(78), "{open:?}");
    assert!(open.stderr.contains("loopback only unless GATEWARDEN_DASHBOARD_TOKEN"), "{open:?}");
    // With a token it may listen on every address (and still asks for the token).
    let f = fleet(&dir, "0.0.0.0:0", &[("GATEWARDEN_DASHBOARD_TOKEN", TOKEN)]);
    let port = f.url.rsplit(':').next().unwrap().to_owned();
    let local = format!("http://127.0.0.1:{port}");
    assert!(curl(None, &format!("{local}/ui/fleet"), &[], 5).body.contains("id=\"login\""));
    drop(f);

    let home = registered_home(&dir);
    let canon = std::fs::canonicalize(home.path()).unwrap().to_string_lossy().into_owned();
    let key = gatewarden_dashboard::render::home_key(&canon);
    let f = fleet(&dir, "127.0.0.1:0", &[("GATEWARDEN_DASHBOARD_TOKEN", TOKEN)]);
    let (looked_at, throttled) = burst(&f.url, &format!("/ui/home/{key}"));
    assert!((5..=7).contains(&looked_at), "{looked_at} wrong tokens were compared in the burst");
    let recorded = wait_events(&home, "dashboard_login_failed", looked_at, READY);
    assert_eq!(recorded.len(), looked_at, "{}", home.ledger_text());
    assert_eq!(recorded[0]["server"], "fleet", "{recorded:?}");
    right_token_after_the_wait(&f.url, &format!("/ui/home/{key}"), throttled.expect("throttled"));
}

/// The fleet token as a file (`GATEWARDEN_DASHBOARD_TOKEN_FILE`: a systemd credential, a
/// Secret), read by the secret files' rule: one others can read is refused naming why, and
/// both variables at once are refused; a private one is the token every page asks for.
#[test]
fn the_fleet_token_can_come_from_a_file() {
    use std::os::unix::fs::PermissionsExt;
    let reg = tempfile::tempdir().unwrap();
    let dir = reg.path().join("homes");
    let file = reg.path().join("fleet.token");
    std::fs::write(&file, format!("{TOKEN}\n")).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let run = |env: &[(&str, &str)]| {
        let mut env = env.to_vec();
        env.push(("GATEWARDEN_REGISTRY", dir.to_str().unwrap()));
        cli_with(bin(), reg.path(), &["dashboard", "--listen", "127.0.0.1:0"], &env, Duration::from_secs(10))
    };
    let path = file.to_str().unwrap();
    let shared = run(&[("GATEWARDEN_DASHBOARD_TOKEN_FILE", path)]);
    assert_eq!(shared.code, Some(78), "{shared:?}");
    assert!(shared.stderr.contains("fleet.token") && shared.stderr.contains("readable by others"), "{shared:?}");
    assert!(!shared.stderr.contains(TOKEN), "{shared:?}");
    let both = run(&[("GATEWARDEN_DASHBOARD_TOKEN_FILE", path), ("GATEWARDEN_DASHBOARD_TOKEN", TOKEN)]);
    assert_eq!(both.code, Some(78), "{both:?}");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let f = fleet(&dir, "127.0.0.1:0", &[("GATEWARDEN_DASHBOARD_TOKEN_FILE", path)]);
    assert!(!f.said.contains(TOKEN), "the token is not printed: {}", f.said);
    let ok = login(None, "/ui/fleet", &f.url, TOKEN);
    assert_eq!(ok.status, 303, "{ok:?}");
}
