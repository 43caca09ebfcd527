//! Issue 16: TLS in real gateway processes, against real TLS endpoints whose certificates come
//! from a CA made for the test (crates/testkit/src/tls.rs): the Telegram fake behind a TLS
//! front, reached with `ca_file` and with the OS trust store (`SSL_CERT_FILE`); a certificate
//! failure at start-up is a degraded adapter (status, doctor, log, ledger), not exit 78; proxies from
//! the environment and per platform (HTTP CONNECT and SOCKS5, counting tunnels), `NO_PROXY`;
//! `update --from https://…`.
#![cfg(target_os = "linux")]

mod common;
mod work_common;
use common::*;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use work_common::*;

use gatewarden_telegram_fake::{FakeTelegram, Options};
use gatewarden_testkit::netfakes::{Proxy, StaticHttp};
use gatewarden_testkit::tls::{TestCa, TlsFront, Validity};

const TOKEN_ENV: &str = "GW_TEST_TELEGRAM_TOKEN";
const REPLY: Duration = Duration::from_secs(15);
/// Proxy variables a test must not inherit from the machine.
const PROXY_VARS: &[&str] =
    &["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy"];

fn token() -> String {
    static N: AtomicU32 = AtomicU32::new(1);
    format!("{}{:04}:tls-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed), std::process::id())
}

fn creds_dir() -> String {
    std::env::temp_dir().join(format!("gw-creds-tls-{}", std::process::id())).to_string_lossy().into_owned()
}

fn fake() -> FakeTelegram {
    FakeTelegram::start(Options { linger: Duration::from_millis(500), ..Options::default() }).expect("fake Bot API")
}

/// A Telegram adapter at `api_base` with `extra` keys in its table.
fn config(api_base: &str, extra: &str) -> String {
    format!(
        "drain_timeout_s = 5\n[agent]\nbackend = \"echo\"\n\
         [[platform]]\nkind = \"telegram\"\naccess = \"open\"\nrequire_mention = false\ntoken_env = \"{TOKEN_ENV}\"\napi_base = \"{api_base}\"\n\
         poll_timeout_s = 2\n{extra}"
    )
}

/// A gateway with `config`, the token and `env`; no proxy variables from the machine.
fn gateway(home: &TempHome, sw: &Sweeper, tok: &str, config: &str, env: &[(&str, &str)]) -> Gateway {
    write_config(home.path(), config);
    let mut b = builder(home).env(TAG_VAR, sw.tag()).env(TOKEN_ENV, tok).env("GATEWARDEN_CREDS_DIR", creds_dir());
    for v in PROXY_VARS {
        b = b.env_remove(*v);
    }
    for (k, v) in env {
        b = b.env(*k, *v);
    }
    let mut g = b.spawn();
    g.wait_ready(READY);
    g
}

#[track_caller]
fn echo_round_trip(fake: &FakeTelegram, tok: &str, text: &str) {
    fake.inject(tok, 7, 42, text);
    fake.wait_sent(tok, REPLY, |s| s.iter().any(|m| m.text == text))
        .unwrap_or_else(|s| panic!("no echo of {text:?} within {REPLY:?}; sent: {s:#?}"));
}

fn toml_path(p: &Path) -> String {
    p.to_string_lossy().replace('\\', "\\\\")
}

/// A CA file in the home, and the fake behind a front presenting a `localhost` certificate
/// from that CA.
struct Tls {
    _dir: tempfile::TempDir,
    ca_file: PathBuf,
    fake: FakeTelegram,
    front: TlsFront,
}

impl Tls {
    fn new() -> Tls {
        Tls::with(&["localhost", "127.0.0.1"], Validity::Now)
    }

    /// The front presents a certificate for `names`, `validity`.
    fn with(names: &[&str], validity: Validity) -> Tls {
        let dir = tempfile::tempdir().unwrap();
        let ca = TestCa::new("gatewarden test CA");
        let ca_file = ca.write_pem(dir.path(), "ca.pem");
        let fake = fake();
        let front = TlsFront::start(fake.addr(), &ca.leaf(names, validity)).unwrap();
        Tls { _dir: dir, ca_file, fake, front }
    }

    fn base(&self) -> String {
        format!("https://localhost:{}", self.front.addr().port())
    }
}

/// A private CA by `ca_file`, then the same CA as the machine's trust store (`SSL_CERT_FILE`,
/// read by rustls-native-certs) with no `ca_file`.
#[test]
fn telegram_over_tls_by_ca_file_and_by_the_os_trust_store() {
    let t = Tls::new();
    let (home, sw, tok) = (TempHome::new(), Sweeper::new(), token());
    let cfg = config(&t.base(), &format!("ca_file = \"{}\"\n", toml_path(&t.ca_file)));
    let mut g = gateway(&home, &sw, &tok, &cfg, &[]);
    wait_adapter(&home, "connected", READY);
    echo_round_trip(&t.fake, &tok, "hello over TLS");
    stop_cleanly(&home, &mut g);

    let (home, tok) = (TempHome::new(), token());
    let ca = t.ca_file.to_string_lossy().into_owned();
    let mut g =
        gateway(&home, &sw, &tok, &config(&t.base(), ""), &[("SSL_CERT_FILE", &ca), ("SSL_CERT_DIR", "/nonexistent")]);
    wait_adapter(&home, "connected", READY);
    echo_round_trip(&t.fake, &tok, "hello through the OS store");
    stop_cleanly(&home, &mut g);
    assert!(t.front.handshakes() >= 2);
}

/// An untrusted certificate at start-up: the gateway starts and serves, the adapter is
/// `degraded` naming the host and the reason in status, the log and the ledger, and retries;
/// nothing reaches the Bot API.
#[test]
fn certificate_failure_at_start_is_degraded_not_a_config_error() {
    let t = Tls::new();
    let (home, sw, tok) = (TempHome::new(), Sweeper::new(), token());
    // No ca_file and a trust store without the test CA: unknown issuer.
    let mut g = gateway(&home, &sw, &tok, &config(&t.base(), ""), &[]);
    let p = wait_adapter(&home, "degraded", READY);
    let host = format!("localhost:{}", t.front.addr().port());
    let reason = p[0]["reason"].as_str().unwrap_or_default().to_owned();
    assert!(reason.contains(&host) && reason.contains("unknown issuer"), "{p}");
    assert!(!reason.contains(&tok), "the token leaked into status: {reason}");
    let ledger = home.events("platform_state");
    assert!(
        ledger.iter().any(|e| e["state"] == "degraded" && e["reason"].as_str().is_some_and(|r| r.contains(&host))),
        "{}",
        home.ledger_text()
    );
    // The rest of the gateway serves.
    let r = Api::new(g.listen()).send("c", "u", "still serving").unwrap().json().unwrap();
    assert_eq!(r["reply"], json!("still serving"), "{r}");
    assert!(wait_until(READY, || t.front.accepted() >= 2), "the adapter retries");
    assert_eq!(t.front.handshakes(), 0);
    assert!(t.fake.polls(&tok).is_empty());
    assert!(g.alive());
    stop_cleanly(&home, &mut g);
    assert!(g.stderr().contains(&host) || home.ledger_text().contains(&host));
}

/// The `tls-refused` finding of `doctor --json` about `subject`, with the human form's line.
#[track_caller]
fn doctor_tls_finding(home: &TempHome, subject: &str) -> (Value, String) {
    let out = run_cli(home, &["doctor", "--json"]);
    assert!(!out.panicked(), "{out:#?}");
    let v: Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:#?}"));
    let f = v["findings"].as_array().and_then(|fs| {
        fs.iter().find(|f| f["id"] == "tls-refused" && f["subject"].as_str().is_some_and(|s| s.contains(subject)))
    });
    let f = f.unwrap_or_else(|| panic!("no tls-refused finding about {subject}: {v:#}")).clone();
    (f, run_cli(home, &["doctor"]).stdout)
}

/// `doctor` names each certificate the running gateway's adapter was refused (an unknown
/// issuer, a wrong host name, an expired certificate): the host, the reason and the fix, as an
/// error; nothing was sent.
#[test]
fn doctor_names_the_host_and_reason_of_each_refused_certificate() {
    let sw = Sweeper::new();
    for (names, validity, with_ca, reason, fix) in [
        (&["localhost"][..], Validity::Now, false, "unknown issuer", "ca_file"),
        (&["other.example"][..], Validity::Now, true, "not valid for this host name", "host name"),
        (&["localhost"][..], Validity::Expired, true, "certificate has expired", "clock"),
    ] {
        let t = Tls::with(names, validity);
        let ca = if with_ca { format!("ca_file = \"{}\"\n", toml_path(&t.ca_file)) } else { String::new() };
        let (home, tok) = (TempHome::new(), token());
        let mut g = gateway(&home, &sw, &tok, &config(&t.base(), &ca), &[]);
        wait_adapter(&home, "degraded", READY);
        let (f, human) = doctor_tls_finding(&home, "telegram");
        let host = format!("localhost:{}", t.front.addr().port());
        let message = f["message"].as_str().unwrap_or_default();
        assert!(message.contains(&host) && message.contains(reason), "{reason}: {f:#}");
        assert_eq!(f["severity"], json!("error"), "{f:#}");
        assert!(f["fix"]["hint"].as_str().is_some_and(|h| h.contains(fix)), "{reason}: {f:#}");
        assert!(human.contains("error[tls-refused]") && human.contains(&host), "{reason}: {human}");
        assert!(!human.contains(&tok), "the token leaked into doctor");
        assert_eq!(t.front.handshakes(), 0, "{reason}: nothing was sent");
        assert!(t.fake.polls(&tok).is_empty());
        stop_cleanly(&home, &mut g);
    }
}

/// `HTTPS_PROXY` (an HTTP CONNECT proxy) and a per-platform `socks5h://` proxy each carry the
/// traffic (the proxy counts the tunnels); `NO_PROXY` bypasses the environment's proxy.
#[test]
fn proxies_from_the_environment_and_per_platform_and_no_proxy() {
    let t = Tls::new();
    let ca = format!("ca_file = \"{}\"\n", toml_path(&t.ca_file));
    let sw = Sweeper::new();

    let connect = Proxy::http_connect().unwrap();
    let (home, tok) = (TempHome::new(), token());
    let mut g = gateway(&home, &sw, &tok, &config(&t.base(), &ca), &[("HTTPS_PROXY", connect.url())]);
    wait_adapter(&home, "connected", READY);
    echo_round_trip(&t.fake, &tok, "through CONNECT");
    let want = format!("localhost:{}", t.front.addr().port());
    assert!(!connect.targets().is_empty() && connect.targets().iter().all(|x| *x == want), "{:?}", connect.targets());
    stop_cleanly(&home, &mut g);

    let socks = Proxy::socks5().unwrap();
    let (home, tok) = (TempHome::new(), token());
    let before = connect.targets().len();
    let cfg = config(&t.base(), &format!("{ca}proxy = \"{}\"\n", socks.url()));
    // The platform's own proxy wins over the environment's.
    let mut g = gateway(&home, &sw, &tok, &cfg, &[("HTTPS_PROXY", connect.url())]);
    wait_adapter(&home, "connected", READY);
    echo_round_trip(&t.fake, &tok, "through SOCKS5");
    assert!(socks.targets().contains(&want), "{:?}", socks.targets());
    assert_eq!(connect.targets().len(), before, "the environment's proxy was not used");
    stop_cleanly(&home, &mut g);

    let (home, tok) = (TempHome::new(), token());
    let before = connect.targets().len();
    let mut g = gateway(
        &home,
        &sw,
        &tok,
        &config(&t.base(), &ca),
        &[("https_proxy", connect.url()), ("no_proxy", "localhost")],
    );
    wait_adapter(&home, "connected", READY);
    echo_round_trip(&t.fake, &tok, "bypassing the proxy");
    assert_eq!(connect.targets().len(), before, "NO_PROXY bypasses the proxy");
    stop_cleanly(&home, &mut g);
}

/// Proxy credentials come from the environment, reach the proxy, and never appear in status,
/// the ledger or the log; a per-platform proxy with credentials is a configuration error that
/// does not echo them.
#[test]
fn proxy_credentials_stay_secret() {
    let t = Tls::new();
    let ca = format!("ca_file = \"{}\"\n", toml_path(&t.ca_file));
    let sw = Sweeper::new();
    let connect = Proxy::http_connect().unwrap();
    let (home, tok) = (TempHome::new(), token());
    let url = format!("http://gwuser:s3cr3t-pw@{}", connect.addr());
    let mut g = gateway(&home, &sw, &tok, &config(&t.base(), &ca), &[("HTTPS_PROXY", &url)]);
    wait_adapter(&home, "connected", READY);
    echo_round_trip(&t.fake, &tok, "with proxy credentials");
    assert!(connect.credentials().iter().any(|c| c.as_deref().is_some_and(|c| c.starts_with("Basic "))));
    let status = run_cli(&home, &["status", "--json"]).stdout;
    stop_cleanly(&home, &mut g);
    for (what, text) in [("status", status), ("ledger", home.ledger_text()), ("log", g.stderr())] {
        assert!(!text.contains("s3cr3t-pw"), "the proxy password is in the {what}");
    }

    let home = TempHome::new();
    write_config(home.path(), &config(&t.base(), "proxy = \"http://u:hunter2@127.0.0.1:3128\"\n"));
    let out = run_cli(&home, &["check"]);
    assert_cli(&out, 1, "a proxy with credentials in the config");
    let text = format!("{}{}", out.stdout, out.stderr);
    assert!(text.contains("must not contain credentials") && !text.contains("hunter2"), "{out:#?}");
}

/// `update --from https://…`: refused with the host and the reason when the certificate does
/// not verify (nothing downloaded); with `[update] ca_file` the download succeeds (and the
/// deliberately wrong checksum is what refuses it).
#[test]
fn update_downloads_over_https() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("gatewarden test CA");
    let ca_file = ca.write_pem(dir.path(), "ca.pem");
    let origin = StaticHttp::start(b"not a release".to_vec()).unwrap();
    let front = TlsFront::start(origin.addr(), &ca.leaf(&["localhost"], Validity::Now)).unwrap();
    let url = format!("https://localhost:{}/gatewarden", front.addr().port());
    let host = format!("localhost:{}", front.addr().port());
    let zero = "0".repeat(64);
    let sw = Sweeper::new();
    // A copy of the binary: `update` would replace the executable it runs from.
    let exe = dir.path().join("gatewarden");
    std::fs::copy(bin(), &exe).unwrap();

    let home = TempHome::new();
    write_config(home.path(), "[agent]\nbackend = \"echo\"\n");
    let mut g = GatewayBuilder::new(&exe, &home).env(TAG_VAR, sw.tag()).spawn();
    g.wait_ready(READY);
    let out =
        cli_with(&exe, home.path(), &["update", "--from", &url, "--sha256", &zero], &[(TAG_VAR, sw.tag())], READY * 3);
    assert_cli(&out, 1, "an untrusted update source");
    assert!(out.stderr.contains(&host) && out.stderr.contains("unknown issuer"), "{out:#?}");
    assert_eq!((front.handshakes(), origin.requests()), (0, 0));

    write_config(
        home.path(),
        &format!("[agent]\nbackend = \"echo\"\n[update]\nca_file = \"{}\"\n", toml_path(&ca_file)),
    );
    let out =
        cli_with(&exe, home.path(), &["update", "--from", &url, "--sha256", &zero], &[(TAG_VAR, sw.tag())], READY * 3);
    assert_cli(&out, 1, "a wrong checksum");
    assert!(out.stderr.contains("checksum mismatch"), "{out:#?}");
    assert_eq!(origin.requests(), 1, "downloaded once, over TLS");
    assert!(front.handshakes() >= 1);
    stop_cleanly(&home, &mut g);
}

/// The `openai` backend against an https upstream whose certificate is not trusted: the run
/// fails, nothing reaches the upstream (zero handshakes, so the key was never sent), and
/// `status --json` names the host and the reason; the gateway keeps serving.
#[test]
fn openai_certificate_failure_is_in_status() {
    let ca = TestCa::new("gatewarden test CA");
    let upstream = StaticHttp::start(b"{}".to_vec()).unwrap();
    let front = TlsFront::start(upstream.addr(), &ca.leaf(&["localhost"], Validity::Now)).unwrap();
    let (home, sw) = (TempHome::new(), Sweeper::new());
    let cfg = format!(
        "[agent]\nbackend = \"openai\"\nbase_url = \"https://localhost:{}/v1\"\nmodel = \"m\"\napi_key_env = \"GW_TEST_OPENAI_KEY\"\n",
        front.addr().port()
    );
    write_config(home.path(), &cfg);
    let mut g = builder(&home).env(TAG_VAR, sw.tag()).env("GW_TEST_OPENAI_KEY", "sk-never-sent").spawn();
    g.wait_ready(READY);
    let r = Api::new(g.listen()).send("c", "u", "hello").unwrap();
    assert_ne!(r.status, 200, "the run must fail: {}", r.text());
    let status: Value = serde_json::from_str(&run_cli(&home, &["status", "--json"]).stdout).unwrap();
    let why = status["agent"]["last_failure"]["reason"].as_str().unwrap_or_default().to_owned();
    let host = format!("localhost:{}", front.addr().port());
    assert!(why.contains(&host) && why.contains("unknown issuer"), "{status}");
    assert_eq!(status["agent"]["backend"], json!("openai"), "{status}");
    assert!(!status.to_string().contains("sk-never-sent"));
    assert_eq!((front.handshakes(), upstream.requests()), (0, 0), "nothing was sent");
    assert!(front.accepted() >= 1);
    let (f, _) = doctor_tls_finding(&home, "agent (openai)");
    let message = f["message"].as_str().unwrap_or_default();
    assert!(message.contains(&host) && message.contains("unknown issuer"), "{f:#}");
    assert!(f["fix"]["hint"].as_str().is_some_and(|h| h.contains("ca_file")), "{f:#}");
    stop_cleanly(&home, &mut g);
}
