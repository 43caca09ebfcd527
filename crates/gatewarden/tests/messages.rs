//! Issue 3, the gateway's job: `/v1/messages` (sync and async), chat commands, auth, config
//! errors, `start` / `logs`. Real processes, real HTTP on loopback.
#![cfg(target_os = "linux")]

mod common;
mod work_common;
use common::*;
use std::time::{Duration, Instant};
use work_common::*;

const ECHO: &str = "[agent]\nbackend = \"echo\"\n";

/// Sync echo: 200 with `reply` == text, a `run_id` and the `chat_id`; async: 202 + id, then the
/// record goes `done` with the reply after exactly one attempt; an unknown id is 404.
#[test]
fn echo_sync_and_async_round_trip() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    let g = gateway(&home, &sw, ECHO);
    let api = Api::new(g.listen());

    let r = api.send("c1", "u1", "hello, gateway ✓").unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json().unwrap();
    assert_eq!(v["reply"], json!("hello, gateway ✓"), "{v}");
    assert_eq!(v["chat_id"], json!("c1"), "{v}");
    assert!(v["run_id"].as_str().is_some_and(|s| !s.is_empty()), "{v}");
    assert!(v.get("command").is_none_or(|c| c != true), "an ordinary message is not a command: {v}");

    let id = api.submit("c2", "queued text");
    let m = wait_final(&api, &id, Duration::from_secs(10));
    assert_eq!((m["state"].as_str(), m["reply"].as_str()), (Some("done"), Some("queued text")), "{m}");
    assert_eq!(m["attempts"], json!(1), "{m}");
    assert_eq!(m["command"], json!(false), "{m}");
    assert_eq!(m["message_id"], json!(id), "{m}");

    let r = api.get("/v1/messages/does-not-exist").unwrap();
    assert_eq!(r.status, 404, "{}", r.text());

    // Text that merely mentions a command is an ordinary message; an unknown /word too.
    for t in ["please /restart", "/unknown thing"] {
        let v = api.send("c1", "u1", t).unwrap().json().unwrap();
        assert_eq!(v["reply"], json!(t), "{v}");
    }
    assert!(!g.stderr().contains("panicked"), "{}", g.stderr_tail(20));
}

/// `POST /v1/messages` and friends on `/metrics`: runs by outcome and async accepted show up.
#[test]
fn metrics_count_runs_and_async_accepted() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    let g = gateway(&home, &sw, ECHO);
    let api = Api::new(g.listen());
    for i in 0..3 {
        assert_eq!(api.send("m", "u", &format!("x{i}")).unwrap().status, 200);
    }
    let id = api.submit("m", "y");
    wait_final(&api, &id, Duration::from_secs(10));
    let text = api.get("/metrics").unwrap().text();
    let has_value = |needle: &str, min: f64| {
        text.lines()
            .filter(|l| !l.starts_with('#') && l.contains(needle))
            .any(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()).is_some_and(|v| v >= min))
    };
    assert!(has_value("ok", 4.0), "metrics should count ≥4 ok runs:\n{text}");
    assert!(has_value("async", 1.0), "metrics should count ≥1 accepted async message:\n{text}");
}

/// Non-loopback listen without `api_token` → `run` exits 78 with a clear message.
#[test]
fn auth_exposed_listener_without_token_exits_78() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    write_config(home.path(), ECHO);
    let mut g = builder(&home).listen("0.0.0.0:0").env(TAG_VAR, sw.tag()).spawn();
    let st = g.wait_exit(EXIT);
    assert_exit_code(&g, st, 78, "0.0.0.0 without api_token");
    let err = g.stderr().to_lowercase();
    assert!(
        err.contains("api_token") && err.contains("0.0.0.0"),
        "message should name api_token and the address:\n{err}"
    );
    assert!(!home.lock_held());
}

/// With `api_token`: /healthz and /readyz stay open; /v1/* and /metrics need the bearer token
/// (401 without / with a wrong one, 200 with the right one). An exposed listener with a token
/// starts.
#[test]
fn auth_bearer_token_required_when_configured() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    let g = gateway(&home, &sw, "api_token = \"s3cret-token-0123\"\n[agent]\nbackend = \"echo\"\n");
    let addr = g.listen();
    assert_eq!(http_get(addr, "/healthz", Duration::from_secs(2)).unwrap().status, 200);
    assert_eq!(http_get(addr, "/readyz", Duration::from_secs(2)).unwrap().status, 200);
    for (path, body) in [
        ("/v1/status", None),
        ("/metrics", None),
        ("/v1/messages", Some(json!({"chat_id":"a","text":"hi"}))),
        ("/v1/responses", Some(json!({"input":"hi"}))),
    ] {
        for token in [None, Some("wrong"), Some("s3cret-tokeN"), Some("s3cret-token-0123-longer")] {
            let api = match token {
                Some(t) => Api::new(addr).with_token(t),
                None => Api::new(addr),
            };
            let r = match &body {
                Some(b) => api.post_json(path, b).unwrap(),
                None => api.get(path).unwrap(),
            };
            assert_eq!(r.status, 401, "{path} with token {token:?}: {} {}", r.status, r.text());
        }
        let api = Api::new(addr).with_token("s3cret-token-0123");
        let r = match &body {
            Some(b) => api.post_json(path, b).unwrap(),
            None => api.get(path).unwrap(),
        };
        assert_eq!(r.status, 200, "{path} with the right token: {}", r.text());
    }
    // `send` takes the token from config.toml.
    let out = cli_tagged(&home, &sw, &["send", "via cli"], Duration::from_secs(10));
    assert_cli(&out, 0, "send with token from config");
    assert_eq!(out.stdout.trim(), "via cli");

    // A token makes a non-loopback listener acceptable.
    let home2 = TempHome::new();
    write_config(home2.path(), "api_token = \"t0k-0123456789abcdef\"\n");
    let mut g2 = builder(&home2).listen("0.0.0.0:0").env(TAG_VAR, sw.tag()).spawn();
    // (Gateway::wait_ready would probe 0.0.0.0; probe the same port on loopback instead.)
    let mut port = None;
    let ready = wait_until(READY, || {
        if let Some((pid, _, state, Some(listen))) = current_gateway(home2.path())
            && pid == g2.pid()
            && state == "running"
        {
            assert!(listen.ip().is_unspecified(), "bound {listen}, wanted 0.0.0.0");
            port = Some(listen.port());
            return true;
        }
        !g2.alive()
    });
    assert!(ready && g2.alive(), "0.0.0.0 with a token should start:\n{}", g2.diag());
    let lo: std::net::SocketAddr = format!("127.0.0.1:{}", port.unwrap()).parse().unwrap();
    assert_eq!(Api::new(lo).get("/v1/status").unwrap().status, 401);
    assert_eq!(Api::new(lo).with_token("t0k-0123456789abcdef").get("/v1/status").unwrap().status, 200);
}

/// An unknown key → exit 78 naming `config.toml`, the line and the key; a bad value too.
#[test]
fn config_errors_exit_78_naming_file_line_and_key() {
    for (toml, line, key) in [
        ("drain_timeout_s = 5\n\nbogus_key = 1\n", 3, "bogus_key"),
        ("[agent]\nbackend = \"echo\"\ndelay_ms = 1\nturbo = true\n", 4, "turbo"),
        ("drain_timeout_s = \"soon\"\n", 1, "drain_timeout_s"),
        ("[agent]\nbackend = \"telepathy\"\n", 2, "backend"),
    ] {
        let home = TempHome::new();
        write_config(home.path(), toml);
        let mut g = builder(&home).spawn();
        let st = g.wait_exit(EXIT);
        assert_exit_code(&g, st, 78, &format!("config {toml:?}"));
        let err = g.stderr();
        assert!(
            err.contains("config.toml") && err.contains(&format!(":{line}")) && err.contains(key),
            "error should name config.toml:{line} and `{key}`:\n{err}"
        );
        assert!(!home.lock_held());
    }
}

/// `start` returns only once ready (readyz 200 right after it returns), a second `start` says
/// "already running" (0), `logs` shows the gateway's log, `stop` ends it.
#[test]
fn start_returns_ready_already_running_and_logs() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    write_config(home.path(), ECHO);
    let out = cli_tagged(&home, &sw, &["start", "--listen", "127.0.0.1:0"], Duration::from_secs(30));
    assert_cli(&out, 0, "start");
    // No waiting here: `start` must only return once the gateway is ready.
    let (pid, _inc, state, listen) = current_gateway(home.path()).expect("a gateway holds the lock after start");
    assert_eq!(state, "running", "state right after start");
    let addr = listen.expect("listen published");
    assert_eq!(http_get(addr, "/readyz", Duration::from_secs(2)).unwrap().status, 200, "readyz right after start");
    assert!(out.stdout.contains(&addr.to_string()) && out.stdout.contains(&pid.to_string()), "start output: {out:?}");
    // Its own session (not the CLI's, not ours).
    assert_eq!(sweep::sid_of(pid), Some(pid), "a background gateway leads its own session");

    let again = cli_tagged(&home, &sw, &["start", "--listen", "127.0.0.1:0"], Duration::from_secs(30));
    assert_cli(&again, 0, "second start");
    assert!(again.text_lc().contains("already running"), "{again:?}");
    assert_eq!(current_gateway(home.path()).map(|g| g.0), Some(pid), "second start must not replace the gateway");

    let api = Api::new(addr);
    assert_eq!(api.send("c", "u", "logged").unwrap().status, 200);
    let logs = run_cli(&home, &["logs", "-n", "200"]);
    assert_cli(&logs, 0, "logs");
    assert!(
        logs.stdout.contains("ready") && logs.stdout.contains(&addr.to_string()),
        "logs should show the ready line:\n{}",
        logs.stdout
    );
    let st = run_cli(&home, &["status", "--json"]);
    assert_cli(&st, 0, "status");
    assert_eq!(st.json()["pid"], json!(pid));

    let stop = run_cli(&home, &["stop"]);
    assert_cli(&stop, 0, "stop");
    // `stop` returns once the lock is free; the process exits right after releasing it.
    assert!(wait_until(Duration::from_secs(5), || !pid_alive(pid)), "pid {pid} still alive after stop");
    let logs = run_cli(&home, &["logs", "-n", "5"]);
    assert!(
        logs.stdout.to_lowercase().contains("stop") || logs.stdout.contains("exit"),
        "log tail after stop:\n{}",
        logs.stdout
    );
}

/// A `start` whose gateway cannot start (bad config) prints the error and exits 78, fast.
#[test]
fn start_with_bad_config_prints_the_error_and_exits_78() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    write_config(home.path(), "listen = \"127.0.0.1:0\"\nnot_a_key = 1\n");
    let t0 = Instant::now();
    let out = cli_tagged(&home, &sw, &["start"], Duration::from_secs(30));
    assert_cli(&out, 78, "start with bad config");
    assert!(t0.elapsed() < Duration::from_secs(10), "start took {:?}", t0.elapsed());
    assert!(
        out.stderr.contains("not_a_key") && out.stderr.contains("config.toml:2"),
        "start should print the error:\n{out:?}"
    );
    assert!(!home.lock_held());
    assert!(sw.tagged().is_empty(), "nothing may be left running: {:?}", sw.tagged());
}

/// `start` when another process holds the listen address: exit 78 with the reason, never
/// "ready" without the port (G4).
#[test]
fn start_on_a_taken_port_fails_instead_of_running_without_it() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    // A holder that stays past `start`'s timeout (issue 22 item 3: a port on its way out is
    // waited for within it; host_env.rs covers the wait).
    let out = cli_tagged(&home, &sw, &["start", "--listen", &addr, "--timeout", "2"], Duration::from_secs(30));
    assert_cli(&out, 78, "start on a taken port");
    assert!(out.text_lc().contains("in use") || out.text_lc().contains(&addr), "{out:?}");
    assert!(!home.lock_held());
}

/// `send` CLI: prints the reply (exit 0), also with the environment's proxy variables naming a
/// dead port (its loopback request never goes through a proxy); `--async` prints the id; no
/// gateway → exit 1 with "no gateway running".
#[test]
fn send_cli_sync_async_and_no_gateway() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    let g = gateway(&home, &sw, ECHO);
    let out = run_cli(&home, &["send", "ping pong", "--chat", "x"]);
    assert_cli(&out, 0, "send");
    assert_eq!(out.stdout.trim(), "ping pong");
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let proxies: Vec<(&str, &str)> =
        ["HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"].into_iter().map(|v| (v, dead.as_str())).collect();
    let out = cli_with(bin(), home.path(), &["send", "not via a proxy"], &proxies, Duration::from_secs(10));
    assert_cli(&out, 0, "send with HTTP_PROXY at a dead port");
    assert_eq!(out.stdout.trim(), "not via a proxy");
    let out = run_cli(&home, &["send", "later", "--async"]);
    assert_cli(&out, 0, "send --async");
    let id = out.stdout.trim().rsplit(' ').next().unwrap().to_string();
    let m = wait_final(&Api::new(g.listen()), &id, Duration::from_secs(10));
    assert_eq!(m["reply"], json!("later"));
    drop(g);
    must_wait_until(EXIT, "lock free after kill", || !home.lock_held());
    let out = run_cli(&home, &["send", "nobody home"]);
    assert_cli(&out, 1, "send without a gateway");
    assert!(out.text_lc().contains("no gateway running"), "{out:?}");
}

/// Issue 27 §5 over HTTP: a failed run tells a `/v1/messages` caller the configured failure
/// text and a reference, sync (502, the run id) and async (`GET /v1/messages/{id}`'s `reason`,
/// the message id), never the reason (here the agent's stderr naming a secret path); the
/// operator has it under the reference: `trace` for the message, `status` and the log for
/// both. An API admin (with the token) who opted in gets the reason.
#[test]
fn a_failed_run_tells_an_api_caller_a_short_text_and_a_reference() {
    const TOKEN: &str = "t0k-0123456789abcdef";
    const SECRET: &str = "/etc/gw-secret-path";
    let home = TempHome::new();
    let sw = Sweeper::new();
    let agent = format!(
        "api_token = \"{TOKEN}\"\nadmins = [\"boss\"]\n[agent]\nbackend = \"exec\"\n\
         command = [\"/bin/sh\", \"-c\", \"echo 'cannot open {SECRET}' >&2; exit 3\"]\nfailure_text = \"no luck\"\n"
    );
    let mut g = gateway(&home, &sw, &agent);
    let api = Api::new(g.listen()).with_token(TOKEN);
    let r = api.send("c1", "u1", "hi").unwrap();
    assert_eq!(r.status, 502, "{}", r.text());
    let v = r.json().unwrap();
    let reference = v["error"]["reference"].as_str().unwrap_or_default().to_owned();
    assert_eq!(v["error"]["message"], json!(format!("no luck (ref {reference})")), "{v}");
    assert!(!r.text().contains(SECRET), "{}", r.text());
    let st = run_cli(&home, &["status", "--json"]).json();
    assert_eq!(st["agent"]["last_failure"]["reference"], json!(reference), "{st:#}");
    assert!(st["agent"]["last_failure"]["reason"].as_str().is_some_and(|r| r.contains(SECRET)), "{st:#}");

    let id = api.send_async("c1", "u1", "hi").unwrap().json().unwrap()["message_id"].as_str().unwrap().to_owned();
    let m = wait_final(&api, &id, Duration::from_secs(10));
    assert_eq!(
        (m["state"].as_str(), m["reason"].as_str()),
        (Some("failed"), Some(format!("no luck (ref {id})").as_str())),
        "{m}"
    );
    let trace = run_cli(&home, &["trace", &id]);
    assert!(trace.stdout.contains(SECRET), "{}", trace.stdout);
    stop_cleanly(&home, &mut g);
    assert!(g.stderr().contains(SECRET), "the log has the reason");

    // Opted in: the admin who came with the token reads the reason; anyone else does not.
    let g = gateway(&home, &sw, &format!("{agent}failure_reasons_for_admins = true\n"));
    let api = Api::new(g.listen()).with_token(TOKEN);
    let boss = api.send("c1", "boss", "hi").unwrap().text();
    assert!(boss.contains(SECRET) && boss.contains("no luck: "), "{boss}");
    assert!(!api.send("c1", "u1", "hi").unwrap().text().contains(SECRET));
    drop(g);
    let _ = sw.sweep();
}

/// Issue 29 §3: `/v1/messages` with a `chat_id` is a conversation kept in the journal. The
/// second message reaches the provider with the first turn as history, another chat and a
/// one-shot message (no `chat_id`, or `"history": false`) have none, `/new` clears it, and
/// the history survives a restart.
#[test]
fn a_chat_id_is_a_conversation_with_history_new_and_restarts() {
    use gatewarden_testkit::llmfake::{FakeLlm, Reply};
    let llm = FakeLlm::start(Reply::text("noted")).unwrap();
    llm.on("user", "first", [Reply::text("reply to first")]);
    let config = format!(
        "[agent]\nbackend = \"openai\"\nretries = 0\ntimeout_s = 30\n\n[[agent.provider]]\nname = \"p\"\nbase_url = \"{}\"\nmodel = \"m\"\n",
        llm.base_url()
    );
    let (home, sw) = (TempHome::new(), Sweeper::new());
    let mut g = gateway(&home, &sw, &config);
    let api = Api::new(g.listen());
    // What the provider got for the request whose last user message is `text`: its messages'
    // (role, content), the system prompt left out.
    let seen = |text: &str| -> Vec<(String, String)> {
        let asked = llm.asked(text);
        assert_eq!(asked.len(), 1, "one request for {text:?}");
        asked[0].body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] != "system")
            .map(|m| (m["role"].as_str().unwrap().to_owned(), m["content"].as_str().unwrap_or("").to_owned()))
            .collect()
    };
    let turn = |role: &str, text: &str| (role.to_owned(), text.to_owned());
    let post = |body: Value| {
        let r = api.post_json("/v1/messages", &body).unwrap();
        assert_eq!(r.status, 200, "{body}: {}", r.text());
        r.json().unwrap()
    };

    let v = post(json!({"chat_id": "conv", "user_id": "u", "text": "first"}));
    assert_eq!(v["reply"], "reply to first", "{v}");
    let id = v["message_id"].as_str().expect("a conversation's message is journaled").to_owned();
    assert_eq!(api.message(&id).unwrap()["state"], "done");
    post(json!({"chat_id": "conv", "user_id": "u", "text": "second"}));
    assert_eq!(
        seen("second"),
        [turn("user", "first"), turn("assistant", "reply to first"), turn("user", "second")],
        "the second message carries the first turn"
    );
    post(json!({"chat_id": "other", "text": "elsewhere"}));
    assert_eq!(seen("elsewhere"), [turn("user", "elsewhere")], "another chat has its own history");
    let v = post(json!({"text": "one-shot"}));
    assert!(v.get("message_id").is_none(), "a one-shot message is not journaled: {v}");
    assert_eq!(seen("one-shot"), [turn("user", "one-shot")]);
    post(json!({"chat_id": "conv", "text": "no memory please", "history": false}));
    assert_eq!(seen("no memory please"), [turn("user", "no memory please")]);

    // The history survives a restart (stop, start on the same home).
    g.signal(15);
    g.wait_exit(Duration::from_secs(30));
    let g = gateway(&home, &sw, &config);
    let api = Api::new(g.listen());
    let r = api.post_json("/v1/messages", &json!({"chat_id": "conv", "text": "third"})).unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        seen("third"),
        [
            turn("user", "first"),
            turn("assistant", "reply to first"),
            turn("user", "second"),
            turn("assistant", "noted"),
            turn("user", "third"),
        ],
        "after the restart"
    );
    // `/new` starts afresh; the one-shot `history: false` message never became history.
    let v = api.post_json("/v1/messages", &json!({"chat_id": "conv", "text": "/new"})).unwrap().json().unwrap();
    assert_eq!(v["command"], true, "{v}");
    api.post_json("/v1/messages", &json!({"chat_id": "conv", "text": "fourth"})).unwrap();
    assert_eq!(seen("fourth"), [turn("user", "fourth")], "/new forgets the earlier turns");

    // Refused: the prefix /v1/responses keeps, and `history: false` on an async message with a chat.
    for body in [
        json!({"chat_id": "responses:x", "text": "t"}),
        json!({"chat_id": "c", "text": "t", "async": true, "history": false}),
    ] {
        let r = api.post_json("/v1/messages", &body).unwrap();
        assert_eq!(r.status, 400, "{body}: {}", r.text());
    }
    assert!(!g.stderr().contains("panicked"), "{}", g.stderr_tail(20));
}
