//! Issue 17 section 2: `backend = "hermes"`, the real hermes-agent 0.19 agent behind the
//! gateway through its API server, with `[agent] hermes_home` (gatewarden runs hermes itself).
//!
//! Real processes: the gatewarden binary, the real `hermes gateway run` from
//! `scripts/hermes-venv` (with the `[messaging]` extra its API server needs), the Telegram
//! fake (crates/telegram-fake) for the chat, and the scripted OpenAI-compatible fake
//! (testkit::llmfake) as hermes's LLM provider, so hermes's real agent loop (tool calls,
//! approvals, sessions) runs offline and deterministically. Every hermes runs hermetically
//! (`HOME` and `XDG_STATE_HOME` in a temp dir, its own home); the sweeper kills what is left.
//! Under `CI` a missing venv fails.
#![cfg(target_os = "linux")]

mod common;
mod work_common;
use common::*;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use work_common::*;

use gatewarden_telegram_fake::{FakeTelegram, Media, Options};
use gatewarden_testkit::hermes::{SCRUB, venv_with_api_server, write_api_server_home};
use gatewarden_testkit::llmfake::{FakeLlm, Reply};

const TOKEN_ENV: &str = "GW_TEST_TELEGRAM_TOKEN";
const ADMIN: i64 = 42;
const USER: i64 = 5;
const OTHER: i64 = 6;
/// hermes starts in seconds, but a second run after a restart or a kill waits for it.
const REPLY: Duration = Duration::from_secs(60);
const APPROVAL_S: u64 = 6;

fn token() -> String {
    static N: AtomicU32 = AtomicU32::new(1);
    format!("{}{:04}:hermes-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed), std::process::id())
}

struct Rig {
    home: TempHome,
    sw: Sweeper,
    tg: FakeTelegram,
    llm: FakeLlm,
    tok: String,
    /// The hermes home, and a scratch folder beside it (`HOME`, `XDG_STATE_HOME`, victims).
    hermes_home: PathBuf,
    scratch: tempfile::TempDir,
    g: Option<Gateway>,
    /// For the progress lines (`--no-capture` shows where a slow run spends its time).
    t0: std::time::Instant,
}

impl Rig {
    fn new() -> Option<Rig> {
        let venv = venv_with_api_server()?;
        let scratch = tempfile::tempdir().expect("tempdir");
        let hermes_home = scratch.path().join("hermes");
        let llm = FakeLlm::start(Reply::Echo).expect("fake LLM");
        write_api_server_home(&hermes_home, gatewarden_testkit::api::free_port(), &llm.base_url());
        for d in ["user", "xdg"] {
            std::fs::create_dir_all(scratch.path().join(d)).expect("scratch dir");
        }
        let tg = FakeTelegram::start(Options { linger: Duration::from_millis(800), ..Options::default() })
            .expect("fake Bot API");
        let home = TempHome::new();
        let config = format!(
            "drain_timeout_s = 3\n[agent]\nbackend = \"hermes\"\nhermes_home = \"{}\"\nhermes_program = \"{}\"\n\
             timeout_s = 90\napproval_timeout_s = {APPROVAL_S}\n\
             [[platform]]\nkind = \"telegram\"\naccess = \"open\"\nrequire_mention = false\ntoken_env = \"{TOKEN_ENV}\"\napi_base = \"{}\"\nadmins = [\"{ADMIN}\"]\n\
             poll_timeout_s = 2\nconflict_standby_s = 2\n",
            hermes_home.display(),
            venv.join("bin/hermes").display(),
            tg.base_url()
        );
        write_config(home.path(), &config);
        let t0 = std::time::Instant::now();
        Some(Rig { home, sw: Sweeper::new(), tg, llm, tok: token(), hermes_home, scratch, g: None, t0 })
    }

    fn start(&mut self) {
        let mut b = builder(&self.home)
            .env(TAG_VAR, self.sw.tag())
            .env(TOKEN_ENV, &self.tok)
            .env("GATEWARDEN_CREDS_DIR", self.scratch.path().join("creds"))
            .env("HOME", self.scratch.path().join("user"))
            .env("XDG_STATE_HOME", self.scratch.path().join("xdg"));
        for k in SCRUB {
            b = b.env_remove(*k);
        }
        let mut g = b.spawn();
        g.wait_ready(READY);
        self.step("gatewarden ready");
        self.g = Some(g);
    }

    fn say(&self, chat: i64, user: i64, text: &str) {
        eprintln!("[{:6.2}s] say {text:?}", self.t0.elapsed().as_secs_f64());
        self.tg.inject(&self.tok, chat, user, text);
    }

    fn t0_instant(&self) -> std::time::Instant {
        self.t0
    }

    fn step(&self, what: &str) {
        eprintln!("[{:6.2}s] {what}", self.t0.elapsed().as_secs_f64());
    }

    /// The newest message the bot sent in `chat` matching `pred`, waiting for it.
    #[track_caller]
    fn reply(&self, chat: i64, pred: impl Fn(&str) -> bool) -> String {
        let got = self.tg.wait_sent(&self.tok, REPLY, |s| s.iter().any(|m| m.chat_id == json!(chat) && pred(&m.text)));
        let sent = got.unwrap_or_else(|s| {
            panic!("no matching reply in chat {chat} within {REPLY:?}; sent: {s:#?}\n{}", self.diag())
        });
        let text = sent
            .into_iter()
            .rev()
            .find(|m| m.chat_id == json!(chat) && pred(&m.text))
            .map(|m| m.text)
            .unwrap_or_default();
        self.step(&format!("got {text:?}"));
        text
    }

    fn count(&self, chat: i64, text: &str) -> usize {
        self.tg.sent(&self.tok).iter().filter(|m| m.chat_id == json!(chat) && m.text == text).count()
    }

    /// The pid hermes recorded (`gateway.pid`), once it holds its lock.
    fn hermes_pid(&self) -> Option<u32> {
        let text = std::fs::read_to_string(self.hermes_home.join("gateway.pid")).ok()?;
        let pid = serde_json::from_str::<Value>(&text).ok()?["pid"].as_u64()? as u32;
        pid_alive(pid).then_some(pid)
    }

    fn diag(&self) -> String {
        let log = std::fs::read_to_string(self.hermes_home.join("gatewarden/gateway-stdio.log")).unwrap_or_default();
        let tail: String =
            log.lines().rev().take(40).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n");
        let seen: Vec<String> = self
            .llm
            .seen()
            .iter()
            .map(|s| {
                let last = s.body["messages"].as_array().and_then(|m| m.last()).cloned().unwrap_or(Value::Null);
                let text: String = last["content"].to_string().chars().take(60).collect();
                format!(
                    "{:?} {} stream={} {} {text}",
                    s.at.duration_since(self.t0_instant()),
                    s.path,
                    s.body["stream"],
                    last["role"]
                )
            })
            .collect();
        format!(
            "gateway: {}\nhermes stdio (tail):\n{tail}\nLLM saw {} request(s):\n{}",
            self.g.as_ref().map(|g| g.diag()).unwrap_or_default(),
            self.llm.requests(),
            seen.join("\n")
        )
    }

    fn victim(&self, name: &str) -> PathBuf {
        let p = self.scratch.path().join(name);
        std::fs::create_dir_all(&p).expect("victim dir");
        p
    }
}

/// Whether any request for the message `asked` carried `earlier` in its conversation.
fn remembered(llm: &FakeLlm, asked: &str, earlier: &str) -> bool {
    llm.asked(asked).iter().any(|s| {
        s.body["messages"].as_array().into_iter().flatten().any(|m| {
            m["role"] != "system" && m["content"].as_str().is_some_and(|c| c.contains(earlier) && !c.contains(asked))
        })
    })
}

fn rm(path: &Path) -> Value {
    json!({"command": format!("rm -rf {}", path.display())})
}

/// One gatewarden with its own hermes: a round trip from a Telegram chat; the conversation
/// remembered by hermes's session across messages and forgotten after `/new`; an approval
/// asked in the chat, refused to another user, answered `/approve` by the asker, and the tool
/// run; another left unanswered, answered "deny" at its expiry, and the tool not run; a run
/// stopped by `/cancel`; `stop` stops hermes too.
#[test]
fn chat_sessions_and_approvals_through_real_hermes() {
    let Some(mut r) = Rig::new() else { return };
    let (cleaned, kept) = (r.victim("victim-approved"), r.victim("victim-expired"));
    // The tool's result decides the last answer: hermes says BLOCKED when denied.
    r.llm
        .on("user", "please clean up", [Reply::tool("terminal", rm(&cleaned))])
        .on("user", "please wipe", [Reply::tool("terminal", rm(&kept))])
        .on("tool", "BLOCKED", [Reply::text("the command was not allowed")])
        .on("tool", "", [Reply::text("cleaned up")]);
    r.start();

    r.say(7, USER, "hello hermes");
    r.reply(7, |t| t == "echo: hello hermes");
    let hermes = r.hermes_pid().expect("gatewarden started hermes, and hermes holds its lock");

    r.say(7, USER, "second message");
    r.reply(7, |t| t == "echo: second message");
    assert!(remembered(&r.llm, "second message", "hello hermes"), "the session carries the first turn\n{}", r.diag());

    r.say(7, USER, "/new");
    r.reply(7, |t| t.starts_with("new conversation"));
    r.say(7, USER, "third message");
    r.reply(7, |t| t == "echo: third message");
    for earlier in ["hello hermes", "second message"] {
        assert!(!remembered(&r.llm, "third message", earlier), "/new starts a fresh session\n{}", r.diag());
    }

    // Approved by the asker (another user of the chat cannot).
    r.say(7, USER, "please clean up");
    let q = r.reply(7, |t| t.contains("asks for approval"));
    assert!(q.contains(&cleaned.display().to_string()) && q.contains("/approve"), "{q}");
    r.say(7, OTHER, "/approve");
    r.reply(7, |t| t.contains("only the user who asked"));
    assert!(cleaned.exists(), "not approved yet");
    r.say(7, USER, "/approve");
    r.reply(7, |t| t.starts_with("approved:"));
    r.reply(7, |t| t == "cleaned up");
    assert!(!cleaned.exists(), "the approved tool ran\n{}", r.diag());

    // Left to expire: denied, the tool not run.
    r.say(7, USER, "please wipe");
    r.reply(7, |t| t.contains("asks for approval") && t.contains("victim-expired"));
    r.reply(7, |t| t.starts_with(&format!("no answer within {APPROVAL_S} s: denied")));
    r.reply(7, |t| t == "the command was not allowed");
    assert!(kept.exists(), "a denied tool never runs");
    r.say(7, USER, "/approve");
    r.reply(7, |t| t == "nothing waits for an approval here");

    // `/cancel` stops hermes's run (`/v1/runs/{id}/stop`) and fails the message.
    let log = r.hermes_home.join("gatewarden/gateway-stdio.log");
    let interruptions =
        || std::fs::read_to_string(&log).map_or(0, |l| l.matches("Interrupted during API call").count());
    let before = interruptions();
    r.llm.on("user", "endless", [Reply::held(Reply::text("never sent"))]);
    r.say(7, USER, "endless");
    assert!(wait_until(REPLY, || r.llm.holding() == 1), "hermes called its LLM\n{}", r.diag());
    r.say(7, USER, "/cancel");
    r.reply(7, |t| t == "cancelling 1 run(s)");
    r.reply(7, |t| t.contains("cancelled (/cancel)"));
    // hermes abandons the LLM call (it stays open at the fake) and says so on its console.
    assert!(wait_until(REPLY, || interruptions() > before), "hermes stopped the run\n{}", r.diag());
    assert_eq!(r.count(7, "never sent"), 0);

    // hermes's run events drive the chat (issue 17 section 3): its `message.delta`s, streamed
    // from the LLM a word every 300 ms, grow a preview after 2 s; then the final text once and
    // the preview gone, typing all along.
    let long = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen";
    r.llm.on("user", "tell me slowly", [Reply::text(long)]);
    r.llm.set_latency(Duration::ZERO, Duration::from_millis(300));
    r.say(8, USER, "tell me slowly");
    r.reply(8, |t| t == long);
    r.llm.set_latency(Duration::ZERO, Duration::ZERO);
    let in_8 = |v: &Value| *v == json!(8);
    let previews: Vec<_> = r.tg.sent(&r.tok).into_iter().filter(|m| in_8(&m.chat_id) && m.text != long).collect();
    assert_eq!(previews.len(), 1, "one preview, of the reply as hermes streamed it: {previews:#?}\n{}", r.diag());
    let edits: Vec<_> = r.tg.edits(&r.tok).into_iter().filter(|e| e.message_id == previews[0].message_id).collect();
    assert!(!edits.is_empty(), "the preview grows with hermes's deltas: {previews:#?}");
    for shown in previews.iter().map(|p| &p.text).chain(edits.iter().map(|e| &e.text)) {
        let shown = shown.strip_suffix(" …").unwrap_or_else(|| panic!("a preview ends with ' …': {shown:?}"));
        assert!(long.starts_with(shown), "a preview is a prefix of the reply: {shown:?}");
    }
    let gone = || !r.tg.visible(&r.tok).iter().any(|m| m.message_id == previews[0].message_id);
    assert!(wait_until(REPLY, gone), "the preview is removed once the final text is sent");
    assert_eq!(r.count(8, long), 1);
    assert!(r.tg.actions(&r.tok).iter().any(|a| in_8(&a.chat_id) && a.action == "typing"), "typing while hermes works");

    let out = run_cli(&r.home, &["stop"]);
    assert_cli(&out, 0, "stop");
    assert!(wait_until(EXIT, || !pid_alive(hermes)), "stop stops hermes too");
}

/// One gatewarden and its hermes, two interruptions mid-run (an LLM call held by the fake):
/// - hermes killed with SIGKILL: gatewarden revives it, the message waits (it is not failed)
///   and is answered once by the new hermes;
/// - gatewarden restarted: the run is stopped at the drain budget, re-run once by the next
///   incarnation on the same hermes (a restart leaves it running, warm) and answered once;
///   `stop` then stops that hermes too.
#[test]
fn runs_survive_hermes_killed_and_gatewarden_restarted() {
    let Some(mut r) = Rig::new() else { return };
    r.llm.on("user", "long job", [Reply::held(Reply::text("long done")), Reply::text("long done")]).on(
        "user",
        "slow task",
        [Reply::held(Reply::text("slow done")), Reply::text("slow done")],
    );
    r.start();

    r.say(7, USER, "long job");
    assert!(wait_until(REPLY, || r.llm.holding() == 1), "hermes called its LLM\n{}", r.diag());
    let first = r.hermes_pid().expect("hermes runs");
    send_signal(first, sig::SIGKILL).expect("SIGKILL hermes");
    r.step("hermes killed");
    assert!(wait_until(REPLY, || r.hermes_pid().is_some_and(|p| p != first)), "hermes revived\n{}", r.diag());
    r.step("hermes revived");
    r.reply(7, |t| t == "long done");
    assert_eq!(r.count(7, "long done"), 1);
    assert!(r.tg.sent(&r.tok).iter().all(|m| !m.text.starts_with("sorry")), "never failed");

    r.say(7, USER, "slow task");
    assert!(wait_until(REPLY, || r.llm.holding() == 1), "hermes called its LLM\n{}", r.diag());
    r.step("hermes holds the LLM call");
    let old = r.g.as_ref().map(Gateway::pid).unwrap_or_default();
    let warm = r.hermes_pid().expect("hermes runs");
    // The successor inherits the gateway's environment; the CLI gets the same, in case.
    let (creds, user, xdg) =
        (r.scratch.path().join("creds"), r.scratch.path().join("user"), r.scratch.path().join("xdg"));
    let env = [
        (TAG_VAR, r.sw.tag()),
        (TOKEN_ENV, r.tok.as_str()),
        ("GATEWARDEN_CREDS_DIR", creds.to_str().unwrap_or_default()),
        ("HOME", user.to_str().unwrap_or_default()),
        ("XDG_STATE_HOME", xdg.to_str().unwrap_or_default()),
    ];
    let out = cli_with(bin(), r.home.path(), &["restart", "--timeout", "40"], &env, Duration::from_secs(60));
    assert_cli(&out, 0, "restart");
    r.step("restart returned");
    wait_new_ready(r.home.path(), &[old], READY).expect("successor ready");
    r.reply(7, |t| t == "slow done");
    // A later message is answered after it: the interrupted one was not queued twice.
    r.say(7, USER, "after the restart");
    r.reply(7, |t| t == "echo: after the restart");
    assert_eq!(r.count(7, "slow done"), 1, "answered once\n{}", r.diag());
    assert_eq!(r.count(7, "long done"), 1);
    assert_eq!(r.hermes_pid(), Some(warm), "the successor adopted the running hermes\n{}", r.diag());
    r.llm.release();
    if std::env::var_os("GW_TEST_DIAG").is_some() {
        eprintln!("{}", r.diag());
    }
    assert_cli(&run_cli(&r.home, &["stop"]), 0, "stop");
    assert!(wait_until(EXIT, || !pid_alive(warm)), "stop stops the adopted hermes");
}

/// Issue 29: a photo from the chat reaches hermes's model as an `image_url` part (hermes-agent
/// 0.19.0's `/v1/runs` hands the one-message list's content to its agent as the user message,
/// crates/agent/src/backend/files.rs `runs_input`), with the caption as text, and the reply
/// comes back. hermes passes image parts on only to a model it knows sees images (run_agent.py
/// `_prepare_messages_for_non_vision_model`; else it asks the provider to describe the image
/// first, README "Attachments"): this home declares it (`model.supports_vision`). A reply's
/// `MEDIA:<path>` tag of a file under the hermes home is uploaded to the chat.
#[test]
fn photos_reach_real_hermes_as_image_parts_and_its_media_tags_come_back_as_files() {
    use base64::Engine as _;
    const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x06\0\0\0\x1f\x15\xc4\x89 a tiny png";
    let Some(mut r) = Rig::new() else { return };
    let config = r.hermes_home.join("config.yaml");
    let yaml = std::fs::read_to_string(&config).expect("hermes config.yaml");
    let vision = yaml.replacen("model:\n", "model:\n  supports_vision: true\n", 1);
    assert_ne!(vision, yaml, "the home has a model section");
    std::fs::write(&config, vision).expect("hermes config.yaml");
    r.llm.on("user", "what is in this photo", [Reply::text("a tiny picture")]);
    r.start();
    let photo = Media {
        kind: "photo".into(),
        bytes: PNG.to_vec(),
        caption: Some("what is in this photo".into()),
        ..Media::default()
    };
    r.tg.inject_media(&r.tok, 9, USER, photo);
    r.reply(9, |t| t == "a tiny picture");
    let url = format!("data:image/png;base64,{}", base64::engine::general_purpose::STANDARD.encode(PNG));
    let asked = r.llm.asked("what is in this photo");
    let parts: Vec<Value> = asked
        .iter()
        .flat_map(|s| s.body["messages"].as_array().cloned().unwrap_or_default())
        .filter(|m| m["role"] == "user")
        .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
        .collect();
    assert!(
        parts.iter().any(|p| p["type"] == "image_url" && p["image_url"]["url"] == url.as_str()),
        "hermes's model got no image_url part of the photo: {parts:?}\n{}",
        r.diag()
    );
    assert!(
        parts
            .iter()
            .any(|p| p["type"] == "text" && p["text"].as_str().is_some_and(|t| t.contains("what is in this photo"))),
        "{parts:?}"
    );

    // Back: a `MEDIA:<path>` tag of a file under the hermes home is sent as a photo (once),
    // its tag gone from the text; one outside the home stays text and nothing is sent for it.
    let made = r.hermes_home.join("cache/made.png");
    std::fs::create_dir_all(made.parent().unwrap()).unwrap();
    std::fs::write(&made, PNG).unwrap();
    let outside = r.scratch.path().join("outside.png");
    std::fs::write(&outside, PNG).unwrap();
    r.llm.on("user", "draw me one", [Reply::text(&format!("drawn: MEDIA:{}", made.display()))]);
    r.llm.on("user", "draw elsewhere", [Reply::text(&format!("not mine: MEDIA:{}", outside.display()))]);
    r.say(10, USER, "draw me one");
    r.reply(10, |t| t == "drawn:");
    must_wait_until(REPLY, "the photo was uploaded", || !r.tg.files(&r.tok).is_empty());
    r.say(11, USER, "draw elsewhere");
    r.reply(11, |t| t.starts_with("not mine: MEDIA:"));
    let files = r.tg.files(&r.tok);
    assert_eq!(files.len(), 1, "{files:#?}");
    assert_eq!((files[0].method.as_str(), files[0].bytes.as_slice()), ("sendPhoto", PNG));
    assert_eq!(files[0].chat_id, json!(10));
}
