//! Issue 31 ("Hostile inputs, round three"): real gateway processes and real CLI verbs against
//! what another local user, a chat user or a web page can plant (docs/security.md). The
//! dashboard items are in tests/dashboard_auth.rs, the hermes home items in
//! tests/hermes_hostile.rs. Item 2 (the exec backend's history files: private from their
//! creation, in a folder of their own inside the home, gone however the run ends) and item 5 (a
//! reply streamed forever ends at `[agent] max_reply_bytes`) are at the end.
#![cfg(target_os = "linux")]

mod common;
mod work_common;
use common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use work_common::*;

use gatewarden_testkit::otlp::OtlpReceiver;

fn set_mode(p: &Path, m: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
}

/// What a hostile chat message carries: a window title (OSC 0), a screen clear (CSI 2J) and a
/// line break that would forge a log line.
const HOSTILE: &str = "plan B \u{1b}]0;pwned\u{7}\u{1b}[2J\ninfo: forged line";

/// An exec agent that fails, echoing the message into its stderr (which becomes the failure
/// reason) with an escape sequence of its own.
fn failing_agent(home: &TempHome) -> PathBuf {
    let agent = home.root().join("failing-agent.sh");
    std::fs::write(&agent, "#!/bin/sh\ntext=$(cat)\nprintf 'agent saw: %s \\033[31mred\\n' \"$text\" >&2\nexit 3\n")
        .unwrap();
    set_mode(&agent, 0o755);
    agent
}

/// A raw escape character, as a terminal would obey it.
fn has_raw_escape(s: &str) -> bool {
    s.chars().any(|c| c == '\u{1b}' || c == '\u{7}')
}

/// Item 8: `trace` (the failure reason: the message text and the agent's stderr) and `logs`
/// printed control characters raw to the operator's terminal. On a terminal they are shown
/// escaped; piped, they are written as they are (README, "CLI"); and the gateway's own log
/// never gets a line break or an escape from a message.
#[test]
fn trace_and_logs_escape_control_characters_on_a_terminal() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    let agent = failing_agent(&home);
    let port = api::free_port();
    write_config(
        home.path(),
        &format!("listen = \"127.0.0.1:{port}\"\n[agent]\nbackend = \"exec\"\ncommand = [\"{}\"]\n", agent.display()),
    );
    assert_cli(&cli_tagged(&home, &sw, &["start"], Duration::from_secs(30)), 0, "start");
    let (_, _, addr) = wait_new_ready(home.path(), &[], READY).expect("gateway ready");
    let api = Api::new(addr);
    let id = api.submit("c1", HOSTILE);
    let m = wait_final(&api, &id, Duration::from_secs(30));
    assert_eq!(m["state"], "failed", "{m}");

    let tty = cli_on_terminal(bin(), home.path(), &["trace", &id], &[], Duration::from_secs(30));
    assert_eq!(tty.code, Some(0), "{tty:?}");
    assert!(tty.stdout.contains("agent saw: plan B"), "the reason is shown: {tty:?}");
    assert!(!has_raw_escape(&tty.stdout), "escape sequences reached the terminal: {:?}", tty.stdout);
    assert!(tty.stdout.contains("\\x1b]0;pwned\\x07"), "shown escaped: {:?}", tty.stdout);
    // Piped: the text as it is (`--json` escapes it as JSON).
    let piped = run_cli(&home, &["trace", &id]);
    assert!(piped.stdout.contains("\u{1b}]0;pwned\u{7}"), "{piped:?}");

    // The gateway logged the failure with the reason: one line, nothing raw in the file.
    let log = std::fs::read_to_string(home.path().join("logs/gateway.log")).unwrap();
    assert!(log.contains("agent saw: plan B"), "{log}");
    assert!(!has_raw_escape(&log), "a raw escape in the gateway's log: {log:?}");
    assert!(!log.lines().any(|l| l.starts_with("info: forged line")), "a forged log line: {log}");

    // A log written by an older build (or anyone appending to it) is escaped by `logs`.
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().append(true).open(home.path().join("logs/gateway.log")).unwrap();
    writeln!(f, "warn: old line \u{1b}]0;pwned\u{7}\u{1b}[2J\u{9b}31m").unwrap();
    drop(f);
    let tty = cli_on_terminal(bin(), home.path(), &["logs", "-n", "5"], &[], Duration::from_secs(30));
    assert_eq!(tty.code, Some(0), "{tty:?}");
    assert!(tty.stdout.contains("warn: old line \\x1b]0;pwned\\x07\\x1b[2J\\u{9b}31m"), "{:?}", tty.stdout);
    assert!(!has_raw_escape(&tty.stdout), "{:?}", tty.stdout);
    assert_cli(&run_cli(&home, &["stop"]), 0, "stop");
    assert!(sw.sweep().is_empty(), "nothing left running");
}

/// Item 9: a failed message's spans carried the whole failure reason (here the message text,
/// through the agent's stderr) in `status.message`. Now a code and a fixed sentence.
#[test]
fn otlp_spans_carry_a_reason_code_not_the_reason_text() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    let otlp = OtlpReceiver::start().unwrap();
    let agent = failing_agent(&home);
    let g = gateway(
        &home,
        &sw,
        &format!(
            "[agent]\nbackend = \"exec\"\ncommand = [\"{}\"]\n[telemetry]\notlp_endpoint = \"{}\"\nmetrics_interval_s = 3600\n",
            agent.display(),
            otlp.endpoint()
        ),
    );
    let api = Api::new(g.listen());
    let id = api.submit("c1", "the secret plan is 4217");
    assert_eq!(wait_final(&api, &id, Duration::from_secs(30))["state"], "failed");
    let mine = || -> Vec<gatewarden_testkit::otlp::Span> {
        otlp.spans().into_iter().filter(|s| s.attributes.get("gatewarden.message_id") == Some(&id)).collect()
    };
    must_wait_until(Duration::from_secs(20), "the failed message's spans", || {
        mine().iter().any(|s| s.name == "gatewarden.message")
    });
    let spans = mine();
    let failed: Vec<_> = spans.iter().filter(|s| s.status == 2).collect();
    assert!(!failed.is_empty(), "the failure is exported as an error status: {spans:?}");
    for s in &spans {
        let all = format!("{:?} {:?}", s.status_message, s.attributes);
        assert!(!all.contains("4217") && !all.contains("secret plan"), "message text exported: {s:?}");
    }
    for s in failed {
        assert_eq!(s.attributes.get("gatewarden.reason_code").map(String::as_str), Some("agent_failed"), "{s:?}");
        assert_eq!(s.status_message.as_deref(), Some("the agent command failed"), "{s:?}");
    }
    drop(g);
    let _ = sw.sweep();
}

/// Item 10: with the journal missing and a FIFO at its `-wal`, `check` said "ok, none yet"
/// while `run` exited 78. Both refuse it now, and neither creates the journal.
#[test]
fn check_refuses_a_fifo_wal_beside_a_missing_journal_as_run_does() {
    let home = TempHome::new();
    write_config(home.path(), &format!("listen = \"127.0.0.1:{}\"\n[agent]\nbackend = \"echo\"\n", api::free_port()));
    let wal = home.file("journal.sqlite3-wal");
    rustix::fs::mknodat(rustix::fs::CWD, &wal, rustix::fs::FileType::Fifo, rustix::fs::Mode::from(0o600), 0).unwrap();
    let t0 = Instant::now();
    let out = cli_with(bin(), home.path(), &["check"], &[], Duration::from_secs(20));
    assert!(t0.elapsed() < Duration::from_secs(5), "check took {:?}", t0.elapsed());
    assert_cli(&out, 1, "check with a FIFO -wal");
    let line = out.stdout.lines().find(|l| l.contains("journal")).unwrap_or_default().to_string();
    assert!(line.contains("FAIL") && line.contains("not a regular file"), "{out:?}");
    let mut g = builder(&home).spawn();
    let st = g.wait_exit(EXIT);
    assert_exit_code(&g, st, 78, "run with a FIFO -wal");
    assert!(g.stderr().contains("not a regular file"), "{}", g.stderr_tail(10));
    assert!(!home.exists("journal.sqlite3"), "nothing is created beside a refused sidecar");
}

/// Item 11: another user made `/tmp/gatewarden-<uid>` first, open to everyone (here under the
/// test's TMPDIR). The gateway refused it, but only after creating `creds/` inside it.
#[test]
fn a_squatted_runtime_folder_gets_nothing_created_in_it() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    let fake = gatewarden_telegram_fake::FakeTelegram::start(gatewarden_telegram_fake::Options::default()).unwrap();
    let tmp = home.root().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let uid = rustix::process::getuid().as_raw();
    let squatted = tmp.join(format!("gatewarden-{uid}"));
    std::fs::create_dir(&squatted).unwrap();
    set_mode(&squatted, 0o777);
    if uid == 0 {
        // Another user's folder (nobody), open to everyone.
        std::os::unix::fs::chown(&squatted, Some(65534), Some(65534)).unwrap();
    }
    write_config(
        home.path(),
        &format!(
            "listen = \"127.0.0.1:{}\"\n[[platform]]\nkind = \"telegram\"\ntoken_env = \"GW_R3_TOKEN\"\napi_base = \"{}\"\n",
            api::free_port(),
            fake.base_url()
        ),
    );
    let env = [
        (TAG_VAR, sw.tag()),
        ("GW_R3_TOKEN", "31313131:round-three"),
        ("TMPDIR", tmp.to_str().unwrap()),
        ("XDG_RUNTIME_DIR", ""),
        ("GATEWARDEN_CREDS_DIR", ""),
    ];
    let out = cli_with(bin(), home.path(), &["start"], &env, Duration::from_secs(30));
    assert_eq!(out.code, Some(78), "{out:?}");
    let why = if uid == 0 { "owned by uid 65534" } else { "writable by other users" };
    assert!(out.text_lc().contains(why) && out.text_lc().contains(&format!("gatewarden-{uid}")), "{out:?}");
    let inside: Vec<_> = std::fs::read_dir(&squatted).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(inside.is_empty(), "created in another user's folder: {inside:?}");
    assert!(sw.sweep().is_empty(), "no gateway left running");
}

// ---------------------------------------------------------------------------------------------
// Item 2: the exec backend's history files.

/// Every file under `<home>/runs` (the runs' scratch folders), and the history files the old
/// layout left in the temp folder for gateway `pid`.
fn history_leftovers(home: &TempHome, pid: u32) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![home.path().join("runs")];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(e.path());
            } else {
                out.push(e.path());
            }
        }
    }
    let old = format!("gatewarden-history-{pid}-");
    if let Ok(rd) = std::fs::read_dir(std::env::temp_dir()) {
        out.extend(rd.flatten().filter(|e| e.file_name().to_string_lossy().starts_with(&old)).map(|e| e.path()));
    }
    out
}

/// `[agent]` for an exec command run by `sh -c script`.
fn exec_agent(script: &str) -> String {
    format!("[agent]\nbackend = \"exec\"\ncommand = [\"/bin/sh\", \"-c\", {}]\n", json!(script))
}

/// Item 2: a run's history file is in the home, in a 0700 folder of its own with a name nobody can
/// guess, and 0600; another local user can neither list that folder nor read the file while
/// the run holds it. (Before: `/tmp/gatewarden-history-<pid>-<n>-<run>.json`, a name anyone
/// could list, predict and pre-create.)
#[test]
fn exec_history_files_are_private_and_out_of_another_users_sight() {
    // Kept to the end of the test: dropping it removes the user.
    let Some(user) = gatewarden_testkit::users::TempUser::create() else { return };
    let other = user.ids();
    let home = TempHome::new();
    let sw = Sweeper::new();
    let script = format!(
        "f=\"$GATEWARDEN_HISTORY_FILE\"; d=$(dirname \"$f\"); echo \"file $f\"; stat -c 'mode %a %u' \"$d\" \"$f\"; \
         setpriv --reuid={} --regid={} --clear-groups -- /bin/sh -c \
         'ls \"$1\" >/dev/null 2>&1 && echo list-ok || echo list-denied; cat \"$2\" >/dev/null 2>&1 && echo read-ok || echo read-denied' \
         _ \"$d\" \"$f\"",
        other.0, other.1
    );
    let mut names = Vec::new();
    let g = gateway(&home, &sw, &exec_agent(&script));
    let api = Api::new(g.listen());
    for i in 0..3 {
        let r = api.send("c", "u", &format!("turn {i}")).expect("send");
        assert_eq!(r.status, 200, "{r:?}");
        let reply = r.json().expect("a JSON reply")["reply"].as_str().unwrap_or_default().to_owned();
        let file = reply.lines().find_map(|l| l.strip_prefix("file ")).unwrap_or_default().to_owned();
        assert!(file.starts_with(&home.path().join("runs").display().to_string()), "not in the home: {reply}");
        let modes: Vec<&str> = reply.lines().filter(|l| l.starts_with("mode ")).collect();
        assert_eq!(modes, [format!("mode 700 {}", me()), format!("mode 600 {}", me())], "{reply}");
        assert!(reply.contains("list-denied") && reply.contains("read-denied"), "another user got at it: {reply}");
        let name = Path::new(&file).parent().and_then(|d| d.file_name()).unwrap().to_string_lossy().into_owned();
        let random = name.trim_start_matches("gatewarden-history-");
        assert!(random.len() == 32 && random.bytes().all(|b| b.is_ascii_hexdigit()), "a guessable name: {name}");
        assert!(!Path::new(&file).exists(), "{file} outlived its run");
        names.push(name);
    }
    names.dedup();
    assert_eq!(names.len(), 3, "{names:?}");
    drop(g);
    let _ = sw.sweep();
}

fn me() -> u32 {
    std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").unwrap())
}

/// Item 2: a stop while many exec runs are in flight (their drain budget spent, so each is
/// cancelled) leaves no history file behind; nor does a kill -9 once the next incarnation has
/// started. (Before: 64 runs in flight left 128 files in /tmp.)
#[test]
fn no_history_file_outlives_a_stop_or_a_kill_with_runs_in_flight() {
    const RUNS: u64 = 24;
    let home = TempHome::new();
    let sw = Sweeper::new();
    let config =
        format!("drain_timeout_s = 1\n{}", exec_agent("cat \"$GATEWARDEN_HISTORY_FILE\" >/dev/null; exec sleep 60"));
    let mut g = gateway(&home, &sw, &config);
    let api = Api::new(g.listen());
    for i in 0..RUNS {
        assert_eq!(api.send_async(&format!("c{i}"), "u", "hold").expect("send").status, 202);
    }
    wait_active(g.listen(), RUNS);
    assert_eq!(history_leftovers(&home, g.pid()).len() as u64, RUNS, "one file per run in flight");
    stop_cleanly(&home, &mut g);
    let left = history_leftovers(&home, g.pid());
    assert!(left.is_empty(), "{} history file(s) outlived the stop: {left:?}", left.len());

    // kill -9 leaves them; the next incarnation removes them before it runs anything.
    let mut g = gateway(&home, &sw, &config);
    wait_active(g.listen(), RUNS);
    let dead = g.pid();
    g.kill();
    assert!(!history_leftovers(&home, dead).is_empty());
    let g2 = gateway(&home, &sw, &config);
    let left: Vec<PathBuf> = history_leftovers(&home, dead)
        .into_iter()
        .filter(|p| !p.to_string_lossy().contains(&current_inc(&home)))
        .collect();
    assert!(left.is_empty(), "left by the killed incarnation and not removed: {left:?}");
    drop(g2);
    let _ = sw.sweep();
}

/// The incarnation id the home's gateway runs as.
fn current_inc(home: &TempHome) -> String {
    home.pid_record().and_then(|r| r["incarnation"].as_str().map(str::to_owned)).unwrap_or_default()
}

/// Item 5: an upstream that streams forever (testkit llmfake's `Endless`) no longer grows a run's
/// reply until the timeout (508 MB at 15 s): past `[agent] max_reply_bytes` the run ends with
/// a failure naming the key, for a journaled message (its trace says so, its caller is told the
/// failure text) and for a streaming caller (what it received stays under the cap), and the
/// gateway's memory stays small. (Before: the key did not exist and the reply grew unbounded.)
#[test]
fn an_endless_streamed_reply_ends_at_max_reply_bytes() {
    use gatewarden_testkit::llmfake::{FakeLlm, Reply};
    const CAP: usize = 256 * 1024;
    let endless = FakeLlm::start(Reply::Endless).unwrap();
    let home = TempHome::new();
    let sw = Sweeper::new();
    let config = format!(
        "[agent]\nbackend = \"openai\"\nbase_url = \"{}\"\nmodel = \"m\"\nretries = 0\ntimeout_s = 120\nmax_reply_bytes = {CAP}\n",
        endless.base_url()
    );
    let g = gateway(&home, &sw, &config);
    let api = Api::new(g.listen()).with_timeout(Duration::from_secs(60));
    let t0 = std::time::Instant::now();
    let id = api.submit("c", "tell me everything");
    let m = wait_final(&api, &id, Duration::from_secs(30));
    assert_eq!(m["state"], json!("failed"), "{m}");
    assert!(t0.elapsed() < Duration::from_secs(30), "ended by the cap, not by timeout_s");
    let trace = run_cli(&home, &["trace", &id]);
    assert!(trace.stdout.contains("max_reply_bytes"), "{}", trace.stdout);

    let body = json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "more"}]});
    let r = api.post_json("/v1/chat/completions", &body).expect("chat completions");
    let mut content = 0usize;
    let mut error = None;
    for data in r.text().lines().filter_map(|l| l.strip_prefix("data: ")) {
        let Ok(v) = serde_json::from_str::<Value>(data) else { continue };
        content += v["choices"][0]["delta"]["content"].as_str().map_or(0, str::len);
        if let Some(e) = v["error"]["message"].as_str() {
            error = Some(e.to_owned());
        }
    }
    assert!(content <= CAP, "{content} bytes streamed past a cap of {CAP}");
    assert!(error.is_some_and(|e| e.starts_with("sorry, that failed (ref ")), "the stream ends with the failure text");
    let rss = rss_bytes(g.pid());
    assert!(rss < 200 << 20, "the gateway holds {rss} bytes");
    drop(g);
    let _ = sw.sweep();
}
