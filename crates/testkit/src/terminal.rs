//! A person at a terminal: the CLI under a pseudo-terminal (util-linux `script`, as
//! [`crate::cli_on_terminal`]), its output read as it comes, and answers typed once the
//! question shows (`gatewarden init`'s questions, hidden input included).

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// `text` without its colours (SGR escapes, `ESC [ … m`) and with `\r\n` as `\n`: what a
/// person reads.
pub fn plain(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
            continue;
        }
        out.push(c);
    }
    out.replace("\r\n", "\n")
}

/// The CLI running on a terminal, with its transcript so far.
pub struct Terminal {
    child: Child,
    stdin: Option<ChildStdin>,
    out: Arc<Mutex<Vec<u8>>>,
    /// How far [`Terminal::expect`] has read.
    seen: usize,
    started: Instant,
}

impl Terminal {
    /// `bin --home HOME <args>` on a fresh pseudo-terminal, in the deterministic test
    /// environment plus `env`.
    pub fn spawn<S: AsRef<OsStr>>(bin: impl AsRef<Path>, home: &Path, args: &[S], env: &[(&str, &str)]) -> Terminal {
        let quote = |s: &str| format!("'{}'", s.replace('\'', r"'\''"));
        let mut line = vec![quote(&bin.as_ref().to_string_lossy()), "--home".into(), quote(&home.to_string_lossy())];
        line.extend(args.iter().map(|a| quote(&a.as_ref().to_string_lossy())));
        let mut cmd = Command::new("script");
        crate::test_env(&mut cmd);
        cmd.args(["-qefc", &line.join(" "), "/dev/null"]);
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null());
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn script (util-linux): {e}"));
        let stdin = child.stdin.take();
        let mut stdout = child.stdout.take().expect("piped stdout");
        let out = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&out);
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stdout.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap_or_else(|p| p.into_inner()).extend_from_slice(&buf[..n]);
            }
        });
        Terminal { child, stdin, out, seen: 0, started: Instant::now() }
    }

    /// Everything the terminal showed so far.
    pub fn transcript(&self) -> String {
        String::from_utf8_lossy(&self.out.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
    }

    /// Waits until `text` shows after what was expected before, and returns what showed up to
    /// and including it; panics with the transcript after `timeout`.
    #[track_caller]
    pub fn expect(&mut self, text: &str, timeout: Duration) -> String {
        let mut found = None;
        crate::wait_until(timeout, || {
            let all = self.transcript();
            let rest = all.get(self.seen..).unwrap_or_default();
            found = rest.find(text).map(|i| (rest[..i + text.len()].to_owned(), self.seen + i + text.len()));
            found.is_some()
        });
        match found {
            Some((shown, upto)) => {
                self.seen = upto;
                shown
            }
            None => panic!(
                "{text:?} did not show within {timeout:?} ({:?} after the start); the terminal showed:\n{}",
                self.started.elapsed(),
                self.transcript()
            ),
        }
    }

    /// Types `line` and Enter.
    pub fn type_line(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("the terminal is open");
        stdin.write_all(format!("{line}\r").as_bytes()).expect("type into the terminal");
        stdin.flush().expect("type into the terminal");
    }

    /// Waits for the command to end: its exit code and the whole transcript; panics after
    /// `timeout` (the command is killed).
    #[track_caller]
    pub fn finish(mut self, timeout: Duration) -> (Option<i32>, String) {
        let mut status = None;
        crate::wait_until(timeout, || {
            status = self.child.try_wait().ok().flatten();
            status.is_some()
        });
        let Some(status) = status else {
            let _ = self.child.kill();
            let _ = self.child.wait();
            panic!("the command did not end within {timeout:?}; the terminal showed:\n{}", self.transcript());
        };
        drop(self.stdin.take());
        // The reader drains what is left once the terminal closes.
        crate::wait_until(Duration::from_secs(2), || Arc::strong_count(&self.out) == 1);
        (status.code(), self.transcript())
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
