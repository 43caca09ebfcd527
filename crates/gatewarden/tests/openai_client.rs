//! Issue 3: the official `openai` Python package as a real client of `/v1/chat/completions`
//! (installed by `scripts/setup-python`). Under `CI` a missing python3 or package FAILS the
//! test; elsewhere it is skipped with the reason printed.
#![cfg(target_os = "linux")]

mod common;
mod work_common;
use common::*;
use std::process::{Command, Stdio};
use std::time::Duration;
use work_common::*;

/// `Some(reason)` when the client cannot run here (and we are not under CI).
fn unavailable() -> Option<String> {
    let py = python();
    let probe = Command::new(&py)
        .args(["-c", "import openai, sys; sys.stdout.write(openai.__version__)"])
        .stdin(Stdio::null())
        .output();
    let reason = match probe {
        Err(e) => format!("{py} not runnable: {e}"),
        Ok(o) if !o.status.success() => {
            format!(
                "the `openai` package is missing for {py} (run scripts/setup-python): {}",
                String::from_utf8_lossy(&o.stderr).trim()
            )
        }
        Ok(_) => return None,
    };
    gatewarden_testkit::unavailable::<()>("the openai SDK", &reason);
    Some(reason)
}

/// Runs a Python snippet with `ADDR`, `TOKEN` and `TEXT` in its environment; returns stdout.
fn py(script: &str, addr: std::net::SocketAddr, token: &str, text: &str) -> std::process::Output {
    let mut c = Command::new(python());
    c.args(["-c", script])
        .env("ADDR", addr.to_string())
        .env("TOKEN", token)
        .env("TEXT", text)
        .env("NO_PROXY", "*")
        .env_remove("OPENAI_BASE_URL")
        .env_remove("OPENAI_API_KEY")
        .stdin(Stdio::null());
    // Bounded: the script sets its own client timeout too.
    let child = c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn python");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(out) => out.expect("python output"),
        Err(_) => {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
            panic!("python client did not finish within 60 s");
        }
    }
}

const CLIENT: &str = r#"
import json, os, sys
from openai import OpenAI
c = OpenAI(base_url="http://%s/v1" % os.environ["ADDR"], api_key=os.environ["TOKEN"], timeout=20, max_retries=0)
text = os.environ["TEXT"]
out = {}
r = c.chat.completions.create(model="gatewarden-echo", messages=[{"role": "user", "content": text}])
out["plain"] = r.choices[0].message.content
out["plain_role"] = r.choices[0].message.role
out["finish"] = r.choices[0].finish_reason
out["object"] = r.object
deltas = []
finishes = []
for chunk in c.chat.completions.create(model="gatewarden-echo", messages=[{"role": "user", "content": text}], stream=True):
    for ch in chunk.choices:
        if ch.delta.content:
            deltas.append(ch.delta.content)
        if ch.finish_reason:
            finishes.append(ch.finish_reason)
out["deltas"] = deltas
out["stream_finishes"] = finishes
out["models"] = [m.id for m in c.models.list().data]
print(json.dumps(out))
"#;

/// Non-streaming create returns the echo; streaming deltas concatenate to the text and end
/// with one finish_reason; `models.list()` names the served model.
#[test]
fn openai_python_client_plain_and_streaming() {
    if unavailable().is_some() {
        return;
    }
    let home = TempHome::new();
    let sw = Sweeper::new();
    let g = gateway(&home, &sw, "[agent]\nbackend = \"echo\"\n");
    let text = "Hello from the openai SDK, über-streaming ✓ three words";
    let out = py(CLIENT, g.listen(), "x", text);
    assert!(
        out.status.success(),
        "python client failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(v["plain"], json!(text), "{v}");
    assert_eq!(v["plain_role"], json!("assistant"), "{v}");
    assert_eq!(v["finish"], json!("stop"), "{v}");
    assert_eq!(v["object"], json!("chat.completion"), "{v}");
    let deltas: Vec<String> = v["deltas"].as_array().unwrap().iter().map(|d| d.as_str().unwrap().to_string()).collect();
    assert!(deltas.len() > 1, "streaming should arrive in several deltas: {deltas:?}");
    assert_eq!(deltas.concat(), text, "{v}");
    assert_eq!(v["stream_finishes"], json!(["stop"]), "{v}");
    assert!(v["models"].as_array().is_some_and(|m| !m.is_empty()), "{v}");
}

/// With `api_token` the SDK's `api_key` is the bearer token: the right key works, a wrong one
/// raises `AuthenticationError` (401).
#[test]
fn openai_python_client_uses_api_key_as_bearer_token() {
    if unavailable().is_some() {
        return;
    }
    let home = TempHome::new();
    let sw = Sweeper::new();
    let g = gateway(&home, &sw, "api_token = \"sdk-token-0123456789\"\n[agent]\nbackend = \"echo\"\n");
    let ok = py(CLIENT, g.listen(), "sdk-token-0123456789", "with key");
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    let v: Value = serde_json::from_slice(&ok.stdout).unwrap();
    assert_eq!(v["plain"], json!("with key"));
    let bad = py(
        r#"
import os, openai
c = openai.OpenAI(base_url="http://%s/v1" % os.environ["ADDR"], api_key="wrong", max_retries=0, timeout=20)
try:
    c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    print("NO ERROR")
except openai.AuthenticationError as e:
    print("AUTH", e.status_code)
"#,
        g.listen(),
        "",
        "",
    );
    assert_eq!(String::from_utf8_lossy(&bad.stdout).trim(), "AUTH 401", "{}", String::from_utf8_lossy(&bad.stderr));
}
