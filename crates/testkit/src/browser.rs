//! A headless Chromium driven over W3C WebDriver (`chromedriver`), for the dashboard's browser
//! tests: start the driver on a free loopback port, open a session, navigate, read and click
//! elements, take screenshots, quit. Every call is bounded by [`Browser::timeout`]; waits poll
//! with deadlines ([`Browser::wait_text`]), never sleep.
//!
//! Where the browser comes from: Debian's `chromium` and `chromium-driver`, installed by
//! `scripts/setup-chromium` (run by `scripts/test`). [`Browser::start`] returns `None` when they
//! are missing, through [`crate::unavailable`]: under `CI` a missing browser fails the test.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use crate::HttpResponse;
use crate::servers::Proc;

/// Where screenshots go: `target/screenshots`, beside the test's `CARGO_TARGET_TMPDIR`
/// (`target/tmp`; it follows `CARGO_TARGET_DIR`), which only a test binary is compiled with.
pub fn screenshot_dir(target_tmpdir: &str) -> PathBuf {
    PathBuf::from(target_tmpdir).parent().map_or_else(|| PathBuf::from("target"), PathBuf::from).join("screenshots")
}

/// The W3C key under which an element reference comes back.
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";

/// `chromedriver` and the `chromium` it drives, from `PATH` (or `GATEWARDEN_CHROMIUM` /
/// `GATEWARDEN_CHROMEDRIVER`).
pub fn find() -> Option<(PathBuf, PathBuf)> {
    let which = |env: &str, names: &[&str]| -> Option<PathBuf> {
        if let Some(p) = std::env::var_os(env).map(PathBuf::from).filter(|p| p.is_file()) {
            return Some(p);
        }
        let path = std::env::var_os("PATH")?;
        std::env::split_paths(&path).flat_map(|d| names.iter().map(move |n| d.join(n))).find(|p| p.is_file())
    };
    Some((
        which("GATEWARDEN_CHROMIUM", &["chromium", "chromium-browser", "google-chrome"])?,
        which("GATEWARDEN_CHROMEDRIVER", &["chromedriver"])?,
    ))
}

/// A chromedriver process and one headless session; both end on [`Browser::quit`] or drop.
pub struct Browser {
    driver: Option<Proc>,
    addr: SocketAddr,
    session: String,
    log: PathBuf,
    /// Bounds every WebDriver call (navigation included).
    pub timeout: Duration,
    _dir: tempfile::TempDir,
}

/// An element reference of the current page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Element(String);

impl Browser {
    /// Starts chromedriver and a headless session (1280×900), or `None` (see the module
    /// docs) when Chromium is not installed. Panics, with the driver's log, when an installed
    /// driver does not come up within `deadline`.
    pub fn start(deadline: Duration) -> Option<Browser> {
        Self::start_with(deadline, &[])
    }

    /// [`Browser::start`] with extra Chromium arguments (e.g. `--host-resolver-rules=MAP
    /// evil.test 127.0.0.1`, to load a loopback page under a foreign name as DNS rebinding
    /// would).
    pub fn start_with(deadline: Duration, extra_args: &[&str]) -> Option<Browser> {
        let Some((chromium, driver)) = find() else {
            return crate::unavailable(
                "headless Chromium",
                "chromium or chromedriver not on PATH; run scripts/setup-chromium",
            );
        };
        let dir = tempfile::Builder::new().prefix("gw-browser-").tempdir().expect("temp dir");
        let log = dir.path().join("chromedriver.log");
        let port = crate::api::free_port();
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let mut cmd = Command::new(&driver);
        cmd.arg(format!("--port={port}")).arg("--allowed-ips=127.0.0.1").arg(format!("--log-path={}", log.display()));
        let mut proc = Proc::spawn(cmd, &dir.path().join("chromedriver.out")).expect("spawn chromedriver");
        let probe_timeout = Duration::from_millis(500);
        crate::servers::wait_ready("chromedriver", &mut proc, &log, deadline, || {
            request(addr, "GET", "/status", None, probe_timeout)
                .ok()
                .and_then(|r| r.json().ok())
                .is_some_and(|v| v["value"]["ready"] == true)
        });
        let mut b = Browser { driver: Some(proc), addr, session: String::new(), log, timeout: deadline, _dir: dir };
        let profile = b._dir.path().join("profile");
        // --no-sandbox: tests run as root in containers, where Chromium's sandbox cannot start;
        // the pages are our own, served on loopback.
        let mut args: Vec<String> = [
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--window-size=1280,900",
            "--no-first-run",
            "--disable-extensions",
        ]
        .iter()
        .map(|a| (*a).to_owned())
        .collect();
        args.push(format!("--user-data-dir={}", profile.display()));
        args.extend(extra_args.iter().map(|a| (*a).to_owned()));
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": args,
            },
        }}});
        let v = b.call("POST", "/session", Some(caps)).unwrap_or_else(|e| panic!("new session: {e}; {}", b.log_tail()));
        b.session = v["sessionId"].as_str().map(str::to_owned).unwrap_or_else(|| panic!("no sessionId in {v}"));
        Some(b)
    }

    /// One WebDriver command; its `value`, or the WebDriver error as text.
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, String> {
        let bytes = body.map(|b| b.to_string().into_bytes());
        let r = request(self.addr, method, path, bytes.as_deref(), self.timeout)
            .map_err(|e| format!("{method} {path}: {e}"))?;
        let v = r.json()?;
        if r.status == 200 {
            Ok(v["value"].clone())
        } else {
            Err(format!("{method} {path}: HTTP {}: {} {}", r.status, v["value"]["error"], v["value"]["message"]))
        }
    }

    fn session_call(&self, method: &str, rest: &str, body: Option<Value>) -> Result<Value, String> {
        self.call(method, &format!("/session/{}{rest}", self.session), body)
    }

    pub fn navigate(&self, url: &str) -> Result<(), String> {
        self.session_call("POST", "/url", Some(json!({"url": url}))).map(drop)
    }

    pub fn title(&self) -> Result<String, String> {
        self.session_call("GET", "/title", None).map(|v| v.as_str().unwrap_or_default().to_owned())
    }

    /// Every element matching a CSS selector (none is not an error).
    pub fn find_all(&self, css: &str) -> Result<Vec<Element>, String> {
        let v = self.session_call("POST", "/elements", Some(json!({"using": "css selector", "value": css})))?;
        Ok(v.as_array()
            .map(|a| a.iter().filter_map(|e| e[ELEMENT_KEY].as_str()).map(|s| Element(s.to_owned())).collect())
            .unwrap_or_default())
    }

    /// The first element matching `css`, or an error naming the selector.
    pub fn find(&self, css: &str) -> Result<Element, String> {
        self.find_all(css)?.into_iter().next().ok_or_else(|| format!("no element matches {css:?}"))
    }

    /// The rendered text of an element (what a user sees).
    pub fn text(&self, e: &Element) -> Result<String, String> {
        self.session_call("GET", &format!("/element/{}/text", e.0), None)
            .map(|v| v.as_str().unwrap_or_default().to_owned())
    }

    pub fn attribute(&self, e: &Element, name: &str) -> Result<Option<String>, String> {
        self.session_call("GET", &format!("/element/{}/attribute/{name}", e.0), None)
            .map(|v| v.as_str().map(str::to_owned))
    }

    pub fn click(&self, e: &Element) -> Result<(), String> {
        self.session_call("POST", &format!("/element/{}/click", e.0), Some(json!({}))).map(drop)
    }

    /// Types `text` into an element (an input).
    pub fn send_keys(&self, e: &Element, text: &str) -> Result<(), String> {
        self.session_call("POST", &format!("/element/{}/value", e.0), Some(json!({"text": text}))).map(drop)
    }

    /// The text of the open `alert`/`confirm` dialog, if one is open.
    pub fn alert_text(&self) -> Option<String> {
        self.session_call("GET", "/alert/text", None).ok().and_then(|v| v.as_str().map(str::to_owned))
    }

    /// Accepts (OK) the open dialog.
    pub fn accept_alert(&self) -> Result<(), String> {
        self.session_call("POST", "/alert/accept", Some(json!({}))).map(drop)
    }

    /// The current page's URL.
    pub fn url(&self) -> Result<String, String> {
        self.session_call("GET", "/url", None).map(|v| v.as_str().unwrap_or_default().to_owned())
    }

    /// Runs a script in the page (`return …;` gives a value).
    pub fn execute(&self, script: &str) -> Result<Value, String> {
        self.session_call("POST", "/execute/sync", Some(json!({"script": script, "args": []})))
    }

    /// Waits until the first element matching `css` shows text containing `needle`; the last
    /// text seen (or the last error) on timeout.
    pub fn wait_text(&self, css: &str, needle: &str, timeout: Duration) -> Result<String, String> {
        let mut last = String::new();
        let ok = crate::wait_until(timeout, || match self.find(css).and_then(|e| self.text(&e)) {
            Ok(t) => {
                last = t;
                last.contains(needle)
            }
            Err(e) => {
                last = e;
                false
            }
        });
        if ok { Ok(last) } else { Err(format!("{css:?} did not show {needle:?} within {timeout:?}; last: {last:?}")) }
    }

    /// The first element matching `css`, waiting for it up to `timeout`; panics naming the
    /// page's text when none comes.
    #[track_caller]
    pub fn wait_find(&self, css: &str, timeout: Duration) -> Element {
        let mut found = None;
        crate::wait_until(timeout, || {
            found = self.find(css).ok();
            found.is_some()
        });
        found.unwrap_or_else(|| panic!("no {css:?} within {timeout:?}; page: {:?}", self.find("body").and_then(|e| self.text(&e))))
    }

    /// The dashboard's page without a session (crates/runtime/src/http/ui.rs, and the fleet's):
    /// a login form, no action buttons, and a forged POST refused as not logged in.
    #[track_caller]
    pub fn assert_read_only_page(&self) {
        self.find("form#login").expect("the login form");
        assert!(self.find_all("form[action='/ui/action/restart']").expect("find").is_empty());
        let forged = self
            .execute("return fetch('/ui/action/restart', {method: 'POST', headers: {'Content-Type': 'application/x-www-form-urlencoded'}, body: 'csrf=guess'}).then(async r => r.status + ' ' + await r.text())")
            .expect("fetch");
        let forged = forged.as_str().unwrap_or_default();
        assert!(forged.starts_with("403 ") && forged.contains("not logged in"), "{forged}");
    }

    /// A PNG of the viewport, written to `path` (parent directories created).
    pub fn screenshot(&self, path: &Path) -> Result<(), String> {
        let v = self.session_call("GET", "/screenshot", None)?;
        let png = base64_decode(v.as_str().ok_or("screenshot: no data")?).ok_or("screenshot: bad base64")?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        }
        std::fs::write(path, png).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Ends the session and the driver (and the browser with it).
    pub fn quit(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if !self.session.is_empty() {
            let _ = self.session_call("DELETE", "", None);
            self.session.clear();
        }
        // The browser runs in the driver's process group: killing the group ends both.
        if let Some(p) = self.driver.take() {
            p.kill();
        }
    }

    fn log_tail(&self) -> String {
        let raw = std::fs::read(&self.log).unwrap_or_default();
        format!("chromedriver log tail:\n{}", String::from_utf8_lossy(&raw[raw.len().saturating_sub(3000)..]))
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// One request to chromedriver. Unlike `crate::api::request` this does not read to EOF:
/// chromedriver keeps the connection open despite `Connection: close`, so the body is read by
/// its `Content-Length` (which chromedriver always sends). `timeout` bounds each read.
fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
    timeout: Duration,
) -> std::io::Result<HttpResponse> {
    use std::io::{Read, Write};
    let bad = |why: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, why.to_owned());
    let mut s = std::net::TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let body = body.unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())?;
    s.write_all(body)?;
    let mut raw = Vec::new();
    let mut buf = [0u8; 16 << 10];
    loop {
        if let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .ok_or_else(|| bad("no Content-Length from chromedriver"))?;
            if raw.len() >= end + 4 + len {
                raw.truncate(end + 4 + len);
                return crate::http::parse(&raw).ok_or_else(|| bad("bad HTTP response from chromedriver"));
            }
        }
        // A screenshot is a few hundred KB; nothing chromedriver answers is near 64 MB.
        if raw.len() > 64 << 20 {
            return Err(bad("response too large"));
        }
        let n = s.read(&mut buf)?;
        if n == 0 {
            return Err(bad("chromedriver closed the connection mid-response"));
        }
        raw.extend_from_slice(&buf[..n]);
    }
}

/// Standard base64 (padding and line breaks tolerated); `None` on any other byte.
fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let val = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let clean: Vec<u8> = s.bytes().filter(|c| !c.is_ascii_whitespace() && *c != b'=').collect();
    let mut out = Vec::with_capacity(clean.len() * 3 / 4);
    for chunk in clean.chunks(4) {
        let n = chunk.iter().try_fold((0u32, 0), |(n, k), &c| Some((n | (val(c)? << (18 - 6 * k)), k + 1)))?.0;
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..chunk.len().saturating_sub(1)]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips_with_the_kits_encoder() {
        for data in [&b""[..], b"f", b"fo", b"foo", b"foob", b"\x89PNG\r\n\x1a\n\x00\xff"] {
            assert_eq!(base64_decode(&crate::servers::base64_unpadded(data)).as_deref(), Some(data));
        }
        assert_eq!(base64_decode("Zm9v\nYmFy").as_deref(), Some(&b"foobar"[..]));
        assert_eq!(base64_decode("Zm8=").as_deref(), Some(&b"fo"[..]));
        assert_eq!(base64_decode("Zm9v!"), None);
    }
}
