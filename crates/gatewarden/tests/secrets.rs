//! Issue 27 §3: secrets on every start path. A secret given in `<home>/secrets.env` (or a
//! `*_file`) reaches the provider whoever starts the gateway — `run`, `start`, `restart` after
//! the shell's environment changed, a successor, the backstop, an update's candidate (the
//! dashboard's Start: tests/dashboard.rs; systemd's credentials: tests/systemd.rs); unsafe
//! secret files are refused; `check` and `doctor` name what is missing; and no secret reaches
//! any output or file of the home.
#![cfg(target_os = "linux")]

mod common;
mod work_common;
use common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use work_common::*;

use gatewarden_testkit::llmfake::{FakeLlm, Reply};

/// The variable `api_key_env` names; the test process never sets it.
const KEY_VAR: &str = "GW_TEST_SECRETS_KEY";
const TOKEN: &str = "t0k-0123456789abcdef";
const ADMIN: &str = "api_token = \"t0k-0123456789abcdef\"\nadmins = [\"u1\"]\n";
const RESTART: Duration = Duration::from_secs(60);

/// A value recognisable anywhere it might leak, unique to this test run.
fn secret(what: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(1);
    format!("sk-gwtest-{what}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

/// The openai backend at `llm`, its key named by `api_key_env`; `top` goes before any table.
fn provider_config(top: &str, llm: &FakeLlm) -> String {
    format!(
        "{top}drain_timeout_s = 10\n[agent]\nbackend = \"openai\"\nbase_url = \"{}\"\nmodel = \"m\"\napi_key_env = \"{KEY_VAR}\"\nretries = 0\n",
        llm.base_url()
    )
}

/// A file only its owner reads, as secrets must be.
fn write_private(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

fn secrets_env(home: &TempHome, key: &str) {
    write_private(&home.file("secrets.env"), &format!("# the provider's key\n{KEY_VAR}={key}\n"));
}

/// Sends `text` to the gateway at `addr` and returns the key the provider was given for it.
#[track_caller]
fn key_seen(addr: std::net::SocketAddr, llm: &FakeLlm, text: &str) -> String {
    // The token of the homes that set one; the others ignore it.
    let r = api(addr).send("c1", "u1", text).expect("send");
    assert_eq!(r.status, 200, "the run must succeed: {}", r.text());
    let seen = llm.asked(text);
    assert_eq!(seen.len(), 1, "one provider call for {text:?}");
    seen[0].header("authorization").unwrap_or_default().strip_prefix("Bearer ").unwrap_or_default().to_owned()
}

fn api(addr: std::net::SocketAddr) -> Api {
    Api::new(addr).with_token(TOKEN).with_timeout(Duration::from_secs(30))
}

/// The running gateway's address, once one other than `not` is ready.
#[track_caller]
fn new_ready(home: &TempHome, not: &[u32]) -> (u32, std::net::SocketAddr) {
    let (pid, _, addr) = wait_new_ready(home.path(), not, RESTART).unwrap_or_else(|| {
        panic!("no new gateway became ready\n{}", home.ledger_text());
    });
    (pid, addr)
}

/// `run` (its environment without the key), `start`, and `restart` from a shell whose
/// environment now holds another value: each incarnation reads `secrets.env` afresh, and the
/// file beats the environment (the shell's stale export and the one a successor inherits).
#[test]
fn run_start_and_restart_read_secrets_env_afresh() {
    let (home, sw, llm) = (TempHome::new(), Sweeper::new(), FakeLlm::start(Reply::text("ok")).unwrap());
    let (first, second) = (secret("first"), secret("second"));
    write_config(home.path(), &provider_config("", &llm));
    secrets_env(&home, &first);

    let mut g = builder(&home).env(TAG_VAR, sw.tag()).spawn();
    let addr = g.wait_ready(READY);
    assert_eq!(key_seen(addr, &llm, "via run"), first);
    stop_cleanly(&home, &mut g);

    let out = cli_tagged(&home, &sw, &["start", "--listen", "127.0.0.1:0"], RESTART);
    assert_cli(&out, 0, "start");
    let (pid, addr) = new_ready(&home, &[g.pid()]);
    assert_eq!(key_seen(addr, &llm, "via start"), first);

    secrets_env(&home, &second);
    let stale = [(TAG_VAR, sw.tag()), (KEY_VAR, "stale-shell-export")];
    let out = cli_with(bin(), home.path(), &["restart", "--timeout", "30"], &stale, RESTART);
    assert_cli(&out, 0, "restart");
    let (_, addr) = new_ready(&home, &[pid]);
    assert_eq!(key_seen(addr, &llm, "via restart"), second, "read afresh, and the file beats any environment");
    let st = run_cli(&home, &["status", "--json"]).json();
    assert_eq!(st["secrets"][0]["source"], json!("secrets.env"), "{st:#}");
    assert_cli(&cli_tagged(&home, &sw, &["stop"], RESTART), 0, "stop");
}

/// Chat `/restart` over HTTP: the successor the old gateway starts (with the old gateway's
/// environment) reads the changed `secrets.env`. Then with a declared manager that never
/// revives the exit 75, the backstop starts the next gateway, and it reads the file too.
#[test]
fn a_successor_and_the_backstop_read_secrets_env() {
    let (home, sw, llm) = (TempHome::new(), Sweeper::new(), FakeLlm::start(Reply::text("ok")).unwrap());
    let keys = [secret("before"), secret("successor"), secret("backstop")];
    write_config(home.path(), &provider_config(ADMIN, &llm));
    secrets_env(&home, &keys[0]);
    // The old gateway's own environment holds a value too: the successor inherits it, and the
    // file must still win.
    let mut g = builder(&home).env(TAG_VAR, sw.tag()).env(KEY_VAR, "inherited-environment").spawn();
    let addr = g.wait_ready(READY);
    assert_eq!(key_seen(addr, &llm, "before"), keys[0]);

    secrets_env(&home, &keys[1]);
    let r = api(addr).send("c1", "u1", "/restart").unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    g.wait_exit(EXIT);
    assert!(!home.events("successor_started").is_empty(), "{}", home.ledger_text());
    let (pid, addr) = new_ready(&home, &[g.pid()]);
    assert_eq!(key_seen(addr, &llm, "from the successor"), keys[1]);

    // The same home under a declared manager that revives nothing: the backstop starts it.
    assert_cli(&cli_tagged(&home, &sw, &["stop"], RESTART), 0, "stop");
    wait_until(EXIT, || current_gateway(home.path()).is_none());
    let mut g = builder(&home).supervisor("external").env(TAG_VAR, sw.tag()).spawn();
    let addr = g.wait_ready(READY);
    secrets_env(&home, &keys[2]);
    let r = api(addr).send("c1", "u1", "/restart").unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let st = g.wait_exit(EXIT);
    assert_exit_code(&g, st, 75, "planned restart for a manager");
    let (_, addr) = new_ready(&home, &[pid, g.pid()]);
    // The first restart's backstop found its successor; this one had to start a gateway.
    let kicked =
        || home.events("restart_backstop").into_iter().any(|e| e["ok"] == json!(true) && e["kicked"] == json!(true));
    must_wait_until(RESTART, "the backstop started the gateway", kicked);
    assert_eq!(key_seen(addr, &llm, "from the backstop's gateway"), keys[2]);
    assert_cli(&cli_tagged(&home, &sw, &["stop"], RESTART), 0, "stop");
}

/// `update`: the candidate (a real build reporting another version) reads `secrets.env`,
/// which the updater's environment and the old gateway's both lack.
#[test]
fn an_update_candidate_reads_secrets_env() {
    let llm = FakeLlm::start(Reply::text("ok")).unwrap();
    let r = rig::Rig::installed();
    let key = secret("update");
    write_config(r.home.path(), &format!("{}[update]\nprobation_s = 1\n", provider_config("", &llm)));
    secrets_env(&r.home, &key);
    let mut g = GatewayBuilder::new(&r.exe, &r.home).env(TAG_VAR, r.sw.tag()).spawn();
    let addr = g.wait_ready(READY);
    assert_eq!(key_seen(addr, &llm, "before the update"), key);
    let release = r.release("9.9.9");
    let out = r.update(&["--from", release.to_str().unwrap(), "--timeout", "30"]);
    assert_cli(&out, 0, "update");
    r.assert_one_gateway("9.9.9");
    let (_, addr) = new_ready(&r.home, &[g.pid()]);
    assert_eq!(key_seen(addr, &llm, "from the candidate"), key);
    assert_cli(&cli(&r.exe, r.home.path(), &["stop"]), 0, "stop");
}

/// A `*_file` behind a link others could have planted, a FIFO, readable by others or by a
/// group not ours, or another user's is refused:
/// `run` exits 78 naming the file and why (without hanging on the FIFO), `check` fails naming
/// it, and `start` does not report success.
#[test]
fn unsafe_secret_files_are_refused_with_the_reason() {
    let (home, sw, llm) = (TempHome::new(), Sweeper::new(), FakeLlm::start(Reply::text("ok")).unwrap());
    let key_file = home.file("openai.key");
    let cfg =
        provider_config("", &llm).replace(&format!("api_key_env = \"{KEY_VAR}\""), "api_key_file = \"openai.key\"");
    write_config(home.path(), &cfg);
    let elsewhere = home.scratch("real", "key");
    write_private(&elsewhere, "sk-behind-a-link\n");
    let root = rustix_is_root();

    type Setup = fn(&Path, &Path);
    let cases: Vec<(&str, Setup, &str)> = vec![
        (
            "a symbolic link out of a folder anyone may write",
            |f, real| {
                let open = f.with_extension("open");
                std::fs::create_dir_all(&open).unwrap();
                std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
                let planted = open.join("key");
                let _ = std::fs::remove_file(&planted);
                std::os::unix::fs::symlink(real, &planted).unwrap();
                std::os::unix::fs::symlink(&planted, f).unwrap();
            },
            "not sticky",
        ),
        ("a FIFO", |f, _| assert!(std::process::Command::new("mkfifo").arg(f).status().unwrap().success()), "FIFO"),
        (
            "a file others can read",
            |f, _| {
                std::fs::write(f, "sk-others\n").unwrap();
                std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o644)).unwrap();
            },
            "mode 644",
        ),
        (
            "a file another group can read",
            |f, _| {
                write_private(f, "sk-group\n");
                std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o640)).unwrap();
                std::os::unix::fs::chown(f, None, Some(65534)).unwrap();
            },
            "readable by group 65534",
        ),
        (
            "another user's file",
            |f, _| {
                write_private(f, "sk-other\n");
                std::os::unix::fs::chown(f, Some(65534), Some(65534)).unwrap();
            },
            "owned by uid 65534",
        ),
    ];
    for (what, setup, why) in cases {
        if (why.starts_with("owned") || why.contains("group 65534")) && !root {
            gatewarden_testkit::unavailable::<()>("chown to another user", "needs root");
            continue;
        }
        let _ = std::fs::remove_file(&key_file);
        setup(&key_file, &elsewhere);
        let mut g = builder(&home).env(TAG_VAR, sw.tag()).spawn();
        let st = g.wait_exit(EXIT);
        assert_exit_code(&g, st, 78, what);
        let err = g.stderr();
        assert!(
            err.contains("api_key_file") && err.contains(&key_file.display().to_string()) && err.contains(why),
            "{what}: {err}"
        );
        let out = run_cli(&home, &["check"]);
        assert_cli(&out, 1, what);
        assert!(out.stdout.lines().any(|l| l.contains("FAIL secrets") && l.contains(why)), "{what}: {out:#?}");
        let out = cli_tagged(&home, &sw, &["start", "--listen", "127.0.0.1:0", "--timeout", "10"], RESTART);
        assert!(!out.panicked() && out.code != Some(0), "{what}: start must not report success: {out:#?}");
        assert!(out.stderr.contains(why) || out.stdout.contains(why), "{what}: start says why: {out:#?}");
    }
}

/// A Kubernetes Secret volume as the kubelet lays it out in `dir`: `<key> -> ..data/<key>`,
/// `..data -> ..<stamp>`, the files 0440 (here in our own group); a second call is a rotation
/// (a new stamp, `..data` swapped).
fn secret_volume(dir: &Path, key: &str, value: &str) -> std::path::PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    std::fs::create_dir_all(dir).unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let stamp = format!("..2026_12_04_10_00_00.{}", N.fetch_add(1, Ordering::Relaxed));
    std::fs::create_dir(dir.join(&stamp)).unwrap();
    std::fs::write(dir.join(&stamp).join(key), value).unwrap();
    std::fs::set_permissions(dir.join(&stamp).join(key), std::fs::Permissions::from_mode(0o440)).unwrap();
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(&stamp, &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
    let link = dir.join(key);
    if std::fs::symlink_metadata(&link).is_err() {
        std::os::unix::fs::symlink(format!("..data/{key}"), &link).unwrap();
    }
    link
}

/// The HTTP API's token goes through the resolver like every other secret: `api_token_file`
/// (here a Kubernetes Secret volume's link), `api_token_env` (from `secrets.env`), and
/// `GATEWARDEN_API_TOKEN_FILE` in the environment (a container's, no shell reading a file).
/// A request without it is 401, with it 200, `send` finds it; a rotated file is a restart key
/// for `reload`; a token too short in its file stops the start (78) naming the key and the
/// file, never the value.
#[test]
fn the_api_token_comes_from_a_file_secrets_env_or_the_environment() {
    let home = TempHome::new();
    let token = secret("api-token");
    let vol = home.scratch("secret-volume", "");
    let link = secret_volume(&vol, "api-token", &format!("{token}\n"));
    write_config(home.path(), &format!("api_token_file = \"{}\"\n", link.display()));
    let check = |how: &str, addr: std::net::SocketAddr, token: &str| {
        let open = Api::new(addr).send("c1", "u1", "without a token").expect("send");
        assert_eq!(open.status, 401, "{how}: {}", open.text());
        let r = Api::new(addr).with_token(token).send("c1", "u1", "with the token").expect("send");
        assert_eq!(r.status, 200, "{how}: {}", r.text());
    };
    let mut g = builder(&home).spawn();
    let addr = g.wait_ready(READY);
    check("api_token_file", addr, &token);
    let out = run_cli(&home, &["send", "hello"]);
    assert_cli(&out, 0, "send with the resolved token");
    let st = run_cli(&home, &["status", "--json"]).json();
    assert_eq!(st["secrets"][0]["secret"], json!("api_token"), "{st:#}");
    assert_eq!(st["secrets"][0]["source"], json!("file"), "{st:#}");
    // Rotated in the volume: the running token stays, and the reload says it needs a restart.
    secret_volume(&vol, "api-token", &secret("rotated"));
    let out = run_cli(&home, &["reload", "--json"]);
    assert_cli(&out, 0, "reload");
    assert!(
        out.json()["reload"]["restart_needed"].as_array().is_some_and(|k| k.contains(&json!("api_token"))),
        "{out:#?}"
    );
    check("after the reload", addr, &token);
    stop_cleanly(&home, &mut g);

    // api_token_env, from secrets.env.
    let from_env_file = secret("from-secrets-env");
    write_config(home.path(), "api_token_env = \"GW_TEST_API_TOKEN\"\n");
    write_private(&home.file("secrets.env"), &format!("GW_TEST_API_TOKEN={from_env_file}\n"));
    let mut g = builder(&home).spawn();
    check("api_token_env", g.wait_ready(READY), &from_env_file);
    stop_cleanly(&home, &mut g);

    // A container's variable naming the file: nothing in config.toml.
    write_config(home.path(), "");
    let file = home.scratch("token", "");
    write_private(&file, &format!("{token}\n"));
    let mut g = builder(&home).env("GATEWARDEN_API_TOKEN_FILE", &file).spawn();
    check("GATEWARDEN_API_TOKEN_FILE", g.wait_ready(READY), &token);
    stop_cleanly(&home, &mut g);

    // Too short: refused at start, named, the value never shown.
    write_private(&file, "short-value\n");
    let mut g = builder(&home).env("GATEWARDEN_API_TOKEN_FILE", &file).spawn();
    let st = g.wait_exit(EXIT);
    assert_exit_code(&g, st, 78, "a short token");
    let err = g.stderr();
    assert!(err.contains("api_token") && err.contains(&file.display().to_string()), "{err}");
    assert!(err.contains("at least 16 bytes") && !err.contains("short-value"), "{err}");
}

fn rustix_is_root() -> bool {
    std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0).unwrap_or(false)
}

/// `check` and `doctor` name every missing secret per platform and provider, with how to give
/// it; a secret in this shell only is a warning; one only the running gateway's environment
/// holds is named as such.
#[test]
fn check_and_doctor_name_each_missing_secret_and_where_it_only_lives() {
    let home = TempHome::new();
    let llm = FakeLlm::start(Reply::text("ok")).unwrap();
    let cfg = format!(
        "[agent]\nbackend = \"openai\"\n\
         [[agent.provider]]\nname = \"primary\"\nbase_url = \"{url}\"\nmodel = \"m\"\napi_key_env = \"GW_TEST_SECRETS_P1\"\n\
         [[agent.provider]]\nname = \"fallback\"\nbase_url = \"{url}\"\nmodel = \"m\"\napi_key_file = \"fallback.key\"\n\
         [[platform]]\nkind = \"telegram\"\nname = \"tg\"\ntoken_env = \"GW_TEST_SECRETS_TG\"\napi_base = \"http://127.0.0.1:9\"\n",
        url = llm.base_url()
    );
    write_config(home.path(), &cfg);
    let out = run_cli(&home, &["check"]);
    assert_cli(&out, 1, "check with nothing given");
    let fails: Vec<&str> = out.stdout.lines().filter(|l| l.contains("FAIL secrets")).collect();
    assert_eq!(fails.len(), 3, "{out:#?}");
    let env_file = home.file("secrets.env").display().to_string();
    assert!(fails[0].contains("[[platform]] \"tg\" token: GW_TEST_SECRETS_TG (token_env) is set in neither"));
    assert!(fails[0].contains(&format!("add the line GW_TEST_SECRETS_TG=… to {env_file}")), "{}", fails[0]);
    assert!(fails[1].contains("[[agent.provider]] \"primary\" api_key: GW_TEST_SECRETS_P1"), "{}", fails[1]);
    assert!(
        fails[2].contains("[[agent.provider]] \"fallback\" api_key: api_key_file") && fails[2].contains("no such file")
    );
    let doc = run_cli(&home, &["doctor", "--json"]);
    assert_cli(&doc, 1, "doctor with nothing given");
    let found = doc.json()["findings"].as_array().cloned().unwrap_or_default();
    let missing: Vec<&Value> = found.iter().filter(|f| f["id"] == "secret-unavailable").collect();
    assert_eq!(missing.len(), 3, "{found:#?}");
    assert!(
        missing.iter().all(|f| f["severity"] == "error" && f["fix"]["hint"].as_str().unwrap_or("").contains(&env_file))
    );
    let out = run_cli(&home, &["start", "--listen", "127.0.0.1:0", "--timeout", "10"]);
    assert!(out.code != Some(0) && out.stderr.contains("GW_TEST_SECRETS_TG (token_env)"), "{out:#?}");

    // Given: the token in secrets.env, the fallback's file, the primary's key in this shell only.
    write_private(&home.file("secrets.env"), &format!("GW_TEST_SECRETS_TG=123:{}\n", secret("tg")));
    write_private(&home.file("fallback.key"), "sk-fallback\n");
    let env = [("GW_TEST_SECRETS_P1", "sk-primary")];
    let out = cli_env(bin(), home.path(), &["check"], &env);
    let secrets: Vec<&str> = out.stdout.lines().filter(|l| l.contains(" secrets ")).collect();
    assert_eq!(secrets.len(), 3, "{out:#?}");
    assert!(secrets[0].contains("ok   secrets") && secrets[0].contains("from") && secrets[0].contains(&env_file));
    assert!(secrets[1].contains("warn secrets") && secrets[1].contains("only from the environment of this shell"));
    assert!(secrets[2].contains("ok   secrets") && secrets[2].contains("fallback.key"), "{}", secrets[2]);
    let doc = cli_env(bin(), home.path(), &["doctor", "--json"], &env).json();
    let warned: Vec<Value> =
        doc["findings"].as_array().unwrap().iter().filter(|f| f["id"] == "secret-env-only").cloned().collect();
    assert!(warned.len() == 1 && warned[0]["severity"] == "warning", "{doc:#}");
    assert!(!out.stdout.contains("sk-primary") && !doc.to_string().contains("sk-primary"));

    // A running gateway that got the primary's key from its own environment: a shell without
    // it hears that only the running gateway's environment has it.
    let sw = Sweeper::new();
    let mut g = builder(&home).env(TAG_VAR, sw.tag()).env("GW_TEST_SECRETS_P1", "sk-primary").spawn();
    g.wait_ready(READY);
    let out = run_cli(&home, &["check", "--json"]).json();
    // (The `access` check warns too: this home has no `access` key, so it pairs by default.)
    let live: Vec<&Value> = out["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["check"] == json!("secrets") && c["warning"] == json!(true))
        .collect();
    assert_eq!(live.len(), 1, "{out:#}");
    assert!(live[0]["detail"].as_str().unwrap().contains("only from the running gateway's environment"), "{out:#}");
    stop_cleanly(&home, &mut g);
}

/// A recognisable secret on each path (`secrets.env`, a `*_file`, the process environment, a
/// Telegram token in a file): none appears in any output of any verb, in the HTTP answers and
/// the dashboard, nor in any file of the home, including when the provider refuses the key.
#[test]
fn no_secret_reaches_any_output_or_file_of_the_home() {
    use gatewarden_telegram_fake::{FakeTelegram, Options};
    let (home, sw) = (TempHome::new(), Sweeper::new());
    let llm = FakeLlm::start(Reply::text("ok")).unwrap();
    llm.on("user", "refused", [Reply::status(401)]);
    let fake = FakeTelegram::start(Options { linger: Duration::from_millis(500), ..Options::default() }).unwrap();
    let (key_env_file, key_file, key_env, tg) = (secret("envfile"), secret("file"), secret("environ"), secret("tg"));
    let tg = format!("4242:{tg}");
    let cfg = format!(
        "{ADMIN}drain_timeout_s = 10\n[agent]\nbackend = \"openai\"\nretries = 0\n\
         [[agent.provider]]\nname = \"a\"\nbase_url = \"{url}\"\nmodel = \"m\"\napi_key_env = \"{KEY_VAR}\"\n\
         [[agent.provider]]\nname = \"b\"\nbase_url = \"{url}\"\nmodel = \"m\"\napi_key_file = \"b.key\"\n\
         [[agent.provider]]\nname = \"c\"\nbase_url = \"{url}\"\nmodel = \"m\"\napi_key_env = \"GW_TEST_SECRETS_ENVONLY\"\n\
         [[platform]]\nkind = \"telegram\"\ntoken_file = \"tg.token\"\napi_base = \"{tg_base}\"\nadmins = [\"42\"]\npoll_timeout_s = 1\n",
        url = llm.base_url(),
        tg_base = fake.base_url()
    );
    write_config(home.path(), &cfg);
    secrets_env(&home, &key_env_file);
    write_private(&home.file("b.key"), &format!("{key_file}\n"));
    write_private(&home.file("tg.token"), &format!("{tg}\n"));
    let creds = creds_dir();
    let env = [(TAG_VAR, sw.tag()), ("GW_TEST_SECRETS_ENVONLY", key_env.as_str()), ("GATEWARDEN_CREDS_DIR", &creds)];
    let verb = |args: &[&str]| cli_with(bin(), home.path(), args, &env, RESTART);

    let mut outputs: Vec<String> = Vec::new();
    let said = |what: &str, out: &CliOutput| format!("== {what}\n{}\n{}", out.stdout, out.stderr);
    let out = verb(&["start", "--listen", "127.0.0.1:0"]);
    assert_cli(&out, 0, "start");
    outputs.push(said("start", &out));
    let (pid, addr) = new_ready(&home, &[]);
    assert_eq!(key_seen(addr, &llm, "hello"), key_env_file, "the primary answered with its key");
    // The provider refuses the key: the run fails over (b refused too, c too) and fails.
    let r = api(addr).send("c1", "u1", "refused please").unwrap();
    outputs.push(format!("== refused run\n{}", r.text()));
    let keys: Vec<String> =
        llm.asked("refused").iter().map(|s| s.header("authorization").unwrap_or_default().to_owned()).collect();
    assert_eq!(keys, [&key_env_file, &key_file, &key_env].map(|k| format!("Bearer {k}")), "each provider's own key");
    fake.inject(&tg, 7, 42, "via telegram");
    fake.wait_sent(&tg, Duration::from_secs(30), |s| !s.is_empty()).expect("the bot answered with its token");
    let id = api(addr).submit("c2", "async one");
    wait_final(&api(addr), &id, Duration::from_secs(30));
    for path in ["/v1/status", "/metrics", "/ui", "/healthz"] {
        let r = http_get(addr, path, Duration::from_secs(5)).expect(path);
        outputs.push(format!("== GET {path}\n{}", r.text()));
    }
    for args in [
        &["status"][..],
        &["status", "--json"],
        &["history", "-n", "200"],
        &["history", "--json"],
        &["logs", "-n", "500"],
        &["trace", &id],
        &["trace", &id, "--json"],
        &["check"],
        &["check", "--json"],
        &["doctor"],
        &["doctor", "--json"],
        &["service", "install", "--print"],
        &["restart", "--timeout", "30"],
    ] {
        let out = verb(args);
        outputs.push(said(&args.join(" "), &out));
    }
    let (_, addr) = new_ready(&home, &[pid]);
    assert_eq!(key_seen(addr, &llm, "after the restart"), key_env_file);
    // A secret gone missing: the refusal names it, never another's value.
    std::fs::remove_file(home.file("b.key")).unwrap();
    let out = verb(&["check"]);
    outputs.push(said("check without b.key", &out));
    let out = verb(&["stop"]);
    assert_cli(&out, 0, "stop");
    outputs.push(said("stop", &out));
    let out = verb(&["start", "--timeout", "10"]);
    assert!(out.code != Some(0), "{out:#?}");
    outputs.push(said("refused start", &out));

    let all = outputs.join("\n");
    let files = every_file(home.path());
    assert!(files.len() > 8, "the home was used: {files:?}");
    for s in [&key_env_file, &key_file, &key_env, &tg] {
        assert!(!all.contains(s.as_str()), "{s} in the outputs:\n{all}");
        for (path, bytes) in &files {
            let text = String::from_utf8_lossy(bytes);
            // Only the files that hold them on purpose.
            let holder = ["secrets.env", "b.key", "tg.token"].iter().any(|n| path.ends_with(n));
            assert!(holder || !text.contains(s.as_str()), "{s} in {}", path.display());
        }
    }
    assert!(all.contains("GW_TEST_SECRETS_ENVONLY") && all.contains("b.key"), "names, not values, are shown");
}

/// Every regular file under `dir`, with its bytes.
fn every_file(dir: &Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        match e.file_type() {
            Ok(t) if t.is_dir() => out.extend(every_file(&p)),
            Ok(t) if t.is_file() => out.push((p.clone(), std::fs::read(&p).unwrap_or_default())),
            _ => {}
        }
    }
    out
}
