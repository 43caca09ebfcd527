//! The exec backend against real processes (`/bin/sh -c` scripts).
//!
//! Process death is observed by pid, polling against a deadline; nothing waits a fixed time.
#![cfg(unix)]

use std::time::{Duration, Instant};

use gatewarden_agent::backend::ExecAgent;
use gatewarden_agent::{Agent, AgentError, AgentRequest, Turn, build_agent};
use gatewarden_config::{AgentConfig, BackendKind};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Generous: the deadline only matters when something is broken.
const DEADLINE: Duration = Duration::from_secs(20);

fn sh(script: &str, timeout: Duration, grace: Duration) -> ExecAgent {
    ExecAgent::new(vec!["/bin/sh".into(), "-c".into(), script.into()], timeout, grace)
}

fn req(text: &str) -> AgentRequest {
    AgentRequest {
        run_id: "run-1".into(),
        chat_id: "chat-1".into(),
        user_id: "user-1".into(),
        text: text.into(),
        history: Vec::new(),
        platform: None,
        session_started: None,
        http_conversation: false,
        attachments: Vec::new(),
    }
}

/// True once `pid` no longer names a live process (gone, or a zombie nobody has reaped yet:
/// in a container, PID 1 may never reap the orphaned grandchild).
fn is_dead(pid: i32) -> bool {
    let Some(p) = rustix::process::Pid::from_raw(pid) else {
        return true;
    };
    if rustix::process::test_kill_process(p).is_err() {
        return true;
    }
    if cfg!(target_os = "linux")
        && let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat"))
    {
        // Field 3, after the parenthesised command name.
        return stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
    }
    false
}

async fn wait_dead(pid: i32) -> bool {
    let end = Instant::now() + DEADLINE;
    while Instant::now() < end {
        if is_dead(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

/// Reads the "<shell pid> <grandchild pid>" line the group scripts print first.
async fn pids(rx: &mut mpsc::Receiver<String>) -> (i32, i32) {
    let line = tokio::time::timeout(DEADLINE, rx.recv()).await.expect("script printed its pids").expect("channel open");
    let mut it = line.split_whitespace().map(|s| s.parse::<i32>().unwrap());
    let (a, b) = (it.next().unwrap(), it.next().unwrap());
    assert!(!is_dead(a) && !is_dead(b), "both alive before cancel");
    (a, b)
}

const GROUP_SCRIPT: &str = r#"sleep 1000 & echo "$$ $!"; wait"#;

#[tokio::test]
async fn reply_round_trip_with_environment() {
    let a = sh(
        r#"printf 'got:'; cat; printf '\n%s %s %s\n\n' "$GATEWARDEN_CHAT_ID" "$GATEWARDEN_USER_ID" "$GATEWARDEN_RUN_ID""#,
        DEADLINE,
        Duration::from_secs(1),
    );
    let r = a.run(req("héllo"), CancellationToken::new()).await.unwrap();
    assert_eq!(r.text, "got:héllo\nchat-1 user-1 run-1");
}

#[tokio::test]
async fn factory_builds_exec_from_config() {
    let cfg = AgentConfig {
        backend: BackendKind::Exec,
        command: vec!["/bin/sh".into(), "-c".into(), "tr a-z A-Z".into()],
        ..AgentConfig::default()
    };
    let a = build_agent(&cfg);
    assert_eq!(a.name(), "exec");
    let r = a.run(req("shout"), CancellationToken::new()).await.unwrap();
    assert_eq!(r.text, "SHOUT");
}

#[tokio::test]
async fn streams_stdout_lines() {
    let a = sh(r"printf 'a\nb\nc'", DEADLINE, Duration::from_secs(1));
    let (tx, mut rx) = mpsc::channel(8);
    let r = a.run_streaming(req(""), CancellationToken::new(), tx).await.unwrap();
    let mut chunks = Vec::new();
    while let Some(c) = rx.recv().await {
        chunks.push(c);
    }
    assert_eq!(chunks, vec!["a\n", "b\n", "c"]);
    assert_eq!(r.text, "a\nb\nc");
}

#[tokio::test]
async fn non_zero_exit_fails_with_stderr_tail() {
    let a = sh("echo oops >&2; exit 3", DEADLINE, Duration::from_secs(1));
    let e = a.run(req("x"), CancellationToken::new()).await.unwrap_err();
    let AgentError::Failed(reason) = e else { panic!("expected Failed, got {e:?}") };
    assert!(reason.contains("exit status 3") && reason.contains("oops"), "{reason}");
}

#[tokio::test]
async fn missing_program_fails() {
    let a = ExecAgent::new(vec!["/nonexistent/gatewarden-agent-xyz".into()], DEADLINE, Duration::from_secs(1));
    let e = a.run(req("x"), CancellationToken::new()).await.unwrap_err();
    assert!(matches!(&e, AgentError::Failed(r) if r.contains("cannot start")), "{e:?}");
    let empty = ExecAgent::new(vec![], DEADLINE, Duration::from_secs(1));
    assert!(matches!(empty.run(req("x"), CancellationToken::new()).await, Err(AgentError::Failed(_))));
}

#[tokio::test]
async fn runaway_stdout_is_bounded() {
    let a = sh("yes", DEADLINE, Duration::from_millis(200));
    let r = tokio::time::timeout(DEADLINE, a.run(req("x"), CancellationToken::new()))
        .await
        .expect("overflow must end the run");
    assert!(matches!(&r, Err(AgentError::Failed(m)) if m.contains("more than")), "{r:?}");
}

#[tokio::test]
async fn command_that_ignores_stdin_still_replies() {
    let a = sh("echo hi", DEADLINE, Duration::from_secs(1));
    let big = "x".repeat(4 << 20);
    let r = a.run(req(&big), CancellationToken::new()).await.unwrap();
    assert_eq!(r.text, "hi");
}

#[tokio::test]
async fn cancel_kills_child_and_grandchild() {
    let a = sh(GROUP_SCRIPT, DEADLINE, Duration::from_secs(2));
    let cancel = CancellationToken::new();
    let (tx, mut rx) = mpsc::channel(8);
    let run = tokio::spawn({
        let cancel = cancel.clone();
        async move { a.run_streaming(req("x"), cancel, tx).await }
    });
    let (child, grandchild) = pids(&mut rx).await;
    cancel.cancel();
    let r = tokio::time::timeout(DEADLINE, run).await.expect("prompt").unwrap();
    assert_eq!(r, Err(AgentError::Cancelled));
    assert!(wait_dead(child).await, "child {child} survived");
    assert!(wait_dead(grandchild).await, "grandchild {grandchild} survived");
}

#[tokio::test]
async fn timeout_kills_child_and_grandchild() {
    let a = sh(GROUP_SCRIPT, Duration::from_millis(500), Duration::from_secs(2));
    let (tx, mut rx) = mpsc::channel(8);
    let run = tokio::spawn(async move { a.run_streaming(req("x"), CancellationToken::new(), tx).await });
    let (child, grandchild) = pids(&mut rx).await;
    let r = tokio::time::timeout(DEADLINE, run).await.expect("prompt").unwrap();
    assert_eq!(r, Err(AgentError::Timeout(Duration::from_millis(500))));
    assert!(wait_dead(child).await, "child {child} survived");
    assert!(wait_dead(grandchild).await, "grandchild {grandchild} survived");
}

#[tokio::test]
async fn group_ignoring_sigterm_is_killed_after_grace() {
    // The ignored disposition is inherited by `sleep`, so only SIGKILL ends either process.
    let a = sh(&format!("trap '' TERM; {GROUP_SCRIPT}"), DEADLINE, Duration::from_millis(200));
    let cancel = CancellationToken::new();
    let (tx, mut rx) = mpsc::channel(8);
    let run = tokio::spawn({
        let cancel = cancel.clone();
        async move { a.run_streaming(req("x"), cancel, tx).await }
    });
    let (child, grandchild) = pids(&mut rx).await;
    cancel.cancel();
    let r = tokio::time::timeout(DEADLINE, run).await.expect("prompt").unwrap();
    assert_eq!(r, Err(AgentError::Cancelled));
    assert!(wait_dead(child).await, "child {child} survived");
    assert!(wait_dead(grandchild).await, "grandchild {grandchild} survived");
}

#[tokio::test]
async fn background_leftover_is_swept_when_the_command_exits() {
    // The leftover holds stdout open; without the sweep the run would last until the timeout.
    let a = sh("sleep 1000 & echo $!", Duration::from_secs(600), Duration::from_secs(2));
    let r = tokio::time::timeout(DEADLINE, a.run(req("x"), CancellationToken::new()))
        .await
        .expect("run ends when the command exits")
        .unwrap();
    let leftover: i32 = r.text.trim().parse().unwrap();
    assert!(wait_dead(leftover).await, "leftover {leftover} survived");
}

#[tokio::test]
async fn dropping_the_run_future_kills_the_group() {
    let a = sh(GROUP_SCRIPT, DEADLINE, Duration::from_secs(2));
    let (tx, mut rx) = mpsc::channel(8);
    let run = tokio::spawn(async move { a.run_streaming(req("x"), CancellationToken::new(), tx).await });
    let (child, grandchild) = pids(&mut rx).await;
    run.abort();
    assert!(run.await.unwrap_err().is_cancelled());
    assert!(wait_dead(child).await, "child {child} survived");
    assert!(wait_dead(grandchild).await, "grandchild {grandchild} survived");
}

/// The conversation so far is a private JSON file named by GATEWARDEN_HISTORY_FILE, removed
/// after the run.
#[tokio::test]
async fn history_is_a_json_file_named_in_the_environment() {
    let a = sh(
        r#"cat "$GATEWARDEN_HISTORY_FILE"; printf '\n%s' "$GATEWARDEN_HISTORY_FILE""#,
        DEADLINE,
        Duration::from_secs(1),
    );
    let mut r = req("now");
    r.history = vec![Turn::new("user", "hi"), Turn::new("assistant", "hello")];
    let out = a.run(r, CancellationToken::new()).await.unwrap().text;
    let (json_text, path) = out.split_once('\n').unwrap();
    let v: serde_json::Value = serde_json::from_str(json_text).unwrap();
    assert_eq!(v, serde_json::json!([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]));
    assert!(!std::path::Path::new(path).exists(), "{path} left behind");
    let single = a.run(req("x"), CancellationToken::new()).await.unwrap().text;
    assert!(single.starts_with("[]"), "{single}");
}
