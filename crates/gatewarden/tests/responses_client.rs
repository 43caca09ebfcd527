//! Issue 29 §3: the official `openai` Python package as a real client of `/v1/responses`
//! (installed by `scripts/setup-python`), against the fake provider (testkit llmfake.rs), which
//! records what the gateway asked it. Under `CI` a missing python3 or package FAILS the test;
//! elsewhere it is skipped with the reason printed.
#![cfg(target_os = "linux")]

mod common;
mod work_common;
use common::*;
use gatewarden_testkit::llmfake::{FakeLlm, Reply};
use std::process::{Command, Stdio};
use std::time::Duration;
use work_common::*;

/// `Some(reason)` when the client cannot run here (and we are not under CI).
fn unavailable() -> Option<String> {
    let py = python();
    let probe = Command::new(&py).args(["-c", "import openai"]).stdin(Stdio::null()).output();
    let reason = match probe {
        Err(e) => format!("{py} not runnable: {e}"),
        Ok(o) if !o.status.success() => format!(
            "the `openai` package is missing for {py} (run scripts/setup-python): {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Ok(_) => return None,
    };
    gatewarden_testkit::unavailable::<()>("the openai SDK", &reason);
    Some(reason)
}

/// Runs a Python snippet with `ADDR` and `ARG` in its environment; its stdout as JSON.
#[track_caller]
fn py(script: &str, addr: std::net::SocketAddr, arg: &str) -> Value {
    let mut c = Command::new(python());
    c.args(["-c", &format!("{PRELUDE}{script}")])
        .env("ADDR", addr.to_string())
        .env("ARG", arg)
        .env("NO_PROXY", "*")
        .env_remove("OPENAI_BASE_URL")
        .env_remove("OPENAI_API_KEY")
        .stdin(Stdio::null());
    let child = c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn python");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(out) => out.expect("python output"),
        Err(_) => {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
            panic!("python client did not finish within 60 s");
        }
    };
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "python client failed:\n{stdout}\n{stderr}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"))
}

const PRELUDE: &str = r#"
import json, os, sys
import openai
from openai import OpenAI
c = OpenAI(base_url="http://%s/v1" % os.environ["ADDR"], api_key="x", timeout=20, max_retries=0)
arg = os.environ["ARG"]
out = {}
"#;

fn config(llm: &FakeLlm) -> String {
    format!(
        "[agent]\nbackend = \"openai\"\nretries = 0\ntimeout_s = 30\n\n[[agent.provider]]\nname = \"p\"\nbase_url = \"{}\"\nmodel = \"m\"\n",
        llm.base_url()
    )
}

/// The (role, content) of the request whose last user message contains `text`.
#[track_caller]
fn asked(llm: &FakeLlm, text: &str) -> Vec<(String, String)> {
    let asked = llm.asked(text);
    assert_eq!(asked.len(), 1, "one request for {text:?}: {asked:?}");
    asked[0].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["role"].as_str().unwrap().to_owned(), m["content"].as_str().unwrap_or("").to_owned()))
        .collect()
}

fn turn(role: &str, text: &str) -> (String, String) {
    (role.to_owned(), text.to_owned())
}

/// `responses.create` plain and streamed, `previous_response_id` carrying the earlier turns
/// to the provider, `instructions` as the system message, and `responses.retrieve`.
#[test]
fn openai_python_responses_plain_streamed_chained_and_retrieved() {
    if unavailable().is_some() {
        return;
    }
    let llm = FakeLlm::start(Reply::text("default answer")).unwrap();
    llm.on("user", "first", [Reply::text("the first answer")]);
    llm.on("user", "second", [Reply::text("the second answer, streamed in pieces")]);
    let (home, sw) = (TempHome::new(), Sweeper::new());
    let g = gateway(&home, &sw, &config(&llm));
    let v = py(
        r#"
r = c.responses.create(model="m", input="first question", instructions="be brief")
out["id"], out["object"], out["status"], out["text"] = r.id, r.object, r.status, r.output_text
out["output_type"] = r.output[0].type
out["part_type"] = r.output[0].content[0].type
types, deltas, final = [], [], None
seqs = []
for ev in c.responses.create(model="m", input=[{"role": "user", "content": [{"type": "input_text", "text": "second question"}]}],
                             previous_response_id=r.id, stream=True):
    types.append(ev.type)
    seqs.append(ev.sequence_number)
    if ev.type == "response.output_text.delta":
        deltas.append(ev.delta)
    if ev.type == "response.completed":
        final = ev.response
out["types"], out["deltas"], out["seqs"] = types, deltas, seqs
out["final_id"], out["final_text"], out["final_prev"] = final.id, final.output_text, final.previous_response_id
third = c.responses.create(model="m", input="third question", previous_response_id=final.id)
out["third_id"] = third.id
got = c.responses.retrieve(final.id)
out["retrieved"] = [got.id, got.status, got.output_text, got.previous_response_id]
try:
    c.responses.retrieve("resp_doesnotexist")
    out["missing"] = "no error"
except openai.NotFoundError as e:
    out["missing"] = e.status_code
try:
    c.responses.create(model="m", input="x", previous_response_id="resp_0000")
    out["bad_prev"] = "no error"
except openai.BadRequestError as e:
    out["bad_prev"] = e.status_code
try:
    c.responses.create(model="m", input=[{"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,AA=="}]}])
    out["image"] = "no error"
except openai.BadRequestError as e:
    out["image"] = str(e)
print(json.dumps(out))
"#,
        g.listen(),
        "",
    );
    assert!(v["id"].as_str().is_some_and(|i| i.starts_with("resp_")), "{v}");
    assert_eq!((v["object"].as_str(), v["status"].as_str()), (Some("response"), Some("completed")), "{v}");
    assert_eq!(v["text"], "the first answer", "{v}");
    assert_eq!((v["output_type"].as_str(), v["part_type"].as_str()), (Some("message"), Some("output_text")), "{v}");
    assert_eq!(asked(&llm, "first question")[0], turn("system", "be brief"), "instructions are the system message");

    let types: Vec<&str> = v["types"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(types.first(), Some(&"response.created"), "{v}");
    assert_eq!(types.last(), Some(&"response.completed"), "{v}");
    for t in [
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ] {
        assert!(types.contains(&t), "{t} missing: {v}");
    }
    let seqs: Vec<u64> = v["seqs"].as_array().unwrap().iter().map(|s| s.as_u64().unwrap()).collect();
    assert_eq!(seqs, (0..seqs.len() as u64).collect::<Vec<_>>(), "sequence numbers count from 0: {v}");
    let deltas: String = v["deltas"].as_array().unwrap().iter().map(|d| d.as_str().unwrap()).collect();
    assert_eq!(deltas, "the second answer, streamed in pieces", "{v}");
    assert_eq!(v["final_text"], deltas.as_str(), "{v}");
    assert_eq!(v["final_prev"], v["id"], "{v}");
    assert_eq!(
        asked(&llm, "second question"),
        [turn("user", "first question"), turn("assistant", "the first answer"), turn("user", "second question")],
        "previous_response_id carries the stored turn (not the first call's instructions)"
    );
    assert_eq!(
        asked(&llm, "third question"),
        [
            turn("user", "first question"),
            turn("assistant", "the first answer"),
            turn("user", "second question"),
            turn("assistant", "the second answer, streamed in pieces"),
            turn("user", "third question"),
        ],
        "the whole chain"
    );
    assert_eq!(
        v["retrieved"],
        json!([v["final_id"], "completed", "the second answer, streamed in pieces", v["id"]]),
        "{v}"
    );
    assert_eq!(v["missing"], 404, "{v}");
    assert_eq!(v["bad_prev"], 400, "{v}");
    // One byte is no PNG: the content decides the type, so the call is refused.
    assert!(v["image"].as_str().is_some_and(|e| e.contains("declared image/png but the content is not")), "{v}");
    assert!(!g.stderr().contains("panicked"), "{}", g.stderr_tail(20));
}

/// A response made before a restart is retrieved and continued after it: the chain lives in
/// the journal.
#[test]
fn openai_python_responses_survive_a_restart() {
    if unavailable().is_some() {
        return;
    }
    let llm = FakeLlm::start(Reply::text("later answer")).unwrap();
    llm.on("user", "before the restart", [Reply::text("answered before")]);
    let (home, sw) = (TempHome::new(), Sweeper::new());
    let mut g = gateway(&home, &sw, &config(&llm));
    let v = py(
        r#"
r = c.responses.create(model="m", input="asked before the restart")
out["id"] = r.id
print(json.dumps(out))
"#,
        g.listen(),
        "",
    );
    let id = v["id"].as_str().unwrap().to_owned();
    g.signal(15);
    g.wait_exit(Duration::from_secs(30));
    let g = gateway(&home, &sw, &config(&llm));
    let v = py(
        r#"
got = c.responses.retrieve(arg)
out["retrieved"] = [got.status, got.output_text]
r = c.responses.create(model="m", input="asked after it", previous_response_id=arg)
out["after"] = r.output_text
print(json.dumps(out))
"#,
        g.listen(),
        &id,
    );
    assert_eq!(v["retrieved"], json!(["completed", "answered before"]), "{v}");
    assert_eq!(v["after"], "later answer", "{v}");
    assert_eq!(
        asked(&llm, "asked after it"),
        [
            turn("user", "asked before the restart"),
            turn("assistant", "answered before"),
            turn("user", "asked after it")
        ]
    );
}

/// Issue 29: an `input_image` data URL is stored as a platform's photo is and reaches the
/// vision provider as an `image_url` part (stored or not), with the caption as text; an image
/// URL the gateway would have to fetch, a zip called a PNG and an image over `[attachments]
/// max_file_mb` are refused with a clear 4xx before anything is journaled or asked.
#[test]
fn openai_python_responses_take_an_inline_image_and_refuse_bad_ones() {
    use base64::Engine as _;
    if unavailable().is_some() {
        return;
    }
    let llm = FakeLlm::start(Reply::text("a tiny picture")).unwrap();
    let (home, sw) = (TempHome::new(), Sweeper::new());
    let mut g = gateway(&home, &sw, &format!("{}\n[attachments]\nmax_file_mb = 1\n", config(&llm)));
    let v = py(
        r#"
import base64
png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR a tiny png"
url = "data:image/png;base64," + base64.b64encode(png).decode()
def image(text, url):
    return [{"role": "user", "content": [{"type": "input_text", "text": text}, {"type": "input_image", "image_url": url}]}]
r = c.responses.create(model="m", input=image("what is in the stored picture", url))
out["stored"] = [r.status, r.output_text]
r = c.responses.create(model="m", input=image("what is in the unstored picture", url), store=False)
out["unstored"] = [r.status, r.output_text]
def refused(name, url):
    try:
        c.responses.create(model="m", input=image("refuse " + name, url))
        out[name] = "no error"
    except openai.APIStatusError as e:
        out[name] = [e.status_code, e.body.get("message") if isinstance(e.body, dict) else str(e.body)]
refused("http", "http://169.254.169.254/latest/meta-data/a.png")
refused("zip", "data:image/png;base64," + base64.b64encode(b"PK\x03\x04 a zip, not a png").decode())
refused("big", "data:image/png;base64," + base64.b64encode(png + b"\x00" * (1100 * 1024)).decode())
print(json.dumps(out))
"#,
        g.listen(),
        "",
    );
    assert_eq!(v["stored"], json!(["completed", "a tiny picture"]), "{v}");
    assert_eq!(v["unstored"], json!(["completed", "a tiny picture"]), "{v}");
    let png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR a tiny png";
    let url = format!("data:image/png;base64,{}", base64::engine::general_purpose::STANDARD.encode(png));
    for text in ["what is in the stored picture", "what is in the unstored picture"] {
        let asked = llm.asked(text);
        assert_eq!(asked.len(), 1, "{text}: {asked:?}");
        let content = asked[0].body["messages"].as_array().and_then(|m| m.last()).map(|m| m["content"].clone());
        let content = content.unwrap_or_default();
        assert_eq!(content[0], json!({"type": "text", "text": text}), "{content}");
        assert_eq!(content[1], json!({"type": "image_url", "image_url": {"url": url}}), "{content}");
    }
    let says = |name: &str, code: u64, what: &str| {
        assert_eq!(v[name][0], code, "{name}: {v}");
        assert!(v[name][1].as_str().is_some_and(|m| m.contains(what)), "{name} should say {what:?}: {v}");
    };
    says("http", 400, "not fetched");
    says("zip", 400, "application/zip");
    says("big", 413, "too large");
    assert_eq!(llm.requests(), 2, "a refused call asks nobody");
    let sha: String = {
        use sha2::Digest;
        sha2::Sha256::digest(png).iter().map(|b| format!("{b:02x}")).collect()
    };
    let stored = home.path().join("attachments").join(&sha[..2]).join(&sha[2..]);
    assert_eq!(std::fs::read(&stored).unwrap(), png, "stored content-addressed");
    g.signal(15);
    g.wait_exit(Duration::from_secs(30));
    // Only the stored call is journaled, naming its file; no refused call left a row.
    use gatewarden_journal::Store as _;
    let j = gatewarden_journal::Journal::open_in(home.path()).unwrap();
    let texts = j.texts_with("[attachment: ").unwrap();
    assert_eq!(texts.len(), 1, "{texts:?}");
    assert!(texts[0].starts_with("what is in the stored picture\n[attachment: image.png, image/png, "), "{texts:?}");
    assert_eq!(j.counts().unwrap().done, 1);
    assert!(j.texts_with("refuse ").unwrap().is_empty(), "nothing journaled for a refused call");
}
