//! Running external manager tools (`systemctl`, `launchctl`, `schtasks`) behind a trait.
//!
//! Everything that talks to a service manager goes through [`CommandRunner`], so the wrappers
//! are tested against a [`ScriptedRunner`] and the real [`SystemRunner`] stays trivial.
//!
//! Output is captured as bytes and decoded lossily (class J: a localized or broken byte
//! sequence must never crash or hang a reader). Every real invocation has a deadline: a
//! `systemctl stop` blocks for up to `TimeoutStopSec`, and nothing here may wait forever.

use std::collections::VecDeque;
use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Single-quotes a word for `/bin/sh`.
pub(crate) fn sh_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '/' | '_' | '.' | '-' | ':' | '@' | '+' | ','))
    {
        return s.to_owned();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// What a finished command produced.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CommandOutput {
    /// Exit code; `None` when the process was killed by a signal.
    pub code: Option<i32>,
    /// Standard output, lossily decoded.
    pub stdout: String,
    /// Standard error, lossily decoded.
    pub stderr: String,
}

impl CommandOutput {
    /// Exit code 0.
    #[must_use]
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }

    /// A successful output carrying `stdout` (test convenience).
    #[must_use]
    pub fn ok(stdout: impl Into<String>) -> Self {
        Self { code: Some(0), stdout: stdout.into(), stderr: String::new() }
    }

    /// A failed output with `code` and `stderr` (test convenience).
    #[must_use]
    pub fn fail(code: i32, stderr: impl Into<String>) -> Self {
        Self { code: Some(code), stdout: String::new(), stderr: stderr.into() }
    }
}

/// Why a command could not be run to completion.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommandError {
    /// The program could not be started (not installed, no permission).
    #[error("while starting `{program}`: {source}")]
    Spawn {
        /// Program name.
        program: String,
        /// OS error.
        #[source]
        source: std::io::Error,
    },
    /// The program ran past its deadline and was killed.
    #[error("`{program}` did not finish within {timeout:?}")]
    TimedOut {
        /// Program name.
        program: String,
        /// The deadline that passed.
        timeout: Duration,
    },
    /// Waiting for the program failed.
    #[error("while waiting for `{program}`: {source}")]
    Wait {
        /// Program name.
        program: String,
        /// OS error.
        #[source]
        source: std::io::Error,
    },
    /// A scripted runner received a call it was not scripted for (tests only).
    #[error("unexpected command: {0}")]
    Unscripted(String),
}

/// Runs a program with arguments and returns its output.
pub trait CommandRunner {
    /// Runs `program args…` to completion (or its deadline). A non-zero exit is `Ok`; only
    /// failing to run at all is an error.
    fn run(&self, program: &str, args: &[&str]) -> Result<CommandOutput, CommandError>;
}

/// The real runner: [`std::process::Command`], stdin closed, output captured, with a deadline.
#[derive(Debug, Clone)]
pub struct SystemRunner {
    /// How long one invocation may take before it is killed.
    pub timeout: Duration,
}

impl Default for SystemRunner {
    fn default() -> Self {
        // Longer than any sane TimeoutStopSec we render for a blocking `systemctl stop`;
        // callers that stop with a long drain should raise it.
        Self { timeout: Duration::from_secs(300) }
    }
}

impl CommandRunner for SystemRunner {
    fn run(&self, program: &str, args: &[&str]) -> Result<CommandOutput, CommandError> {
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| CommandError::Spawn { program: program.to_owned(), source })?;
        // Drain both pipes on their own threads so a chatty child cannot block on a full pipe
        // while we wait for it.
        let out = child.stdout.take().map(spawn_reader);
        let err = child.stderr.take().map(spawn_reader);
        let deadline = Instant::now() + self.timeout;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() >= deadline => {
                    // Best effort: the child may exit between the check and the kill.
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(CommandError::TimedOut { program: program.to_owned(), timeout: self.timeout });
                }
                // A bounded poll: std offers no wait-with-timeout on a child.
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
                Err(source) => {
                    return Err(CommandError::Wait { program: program.to_owned(), source });
                }
            }
        };
        let collect = |h: Option<std::thread::JoinHandle<Vec<u8>>>| {
            h.and_then(|h| h.join().ok()).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
        };
        Ok(CommandOutput { code: status.code(), stdout: collect(out), stderr: collect(err) })
    }
}

fn spawn_reader<R: Read + Send + 'static>(mut r: R) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        // A read error just truncates the captured output.
        let _ = r.read_to_end(&mut buf);
        buf
    })
}

/// A test double: answers calls from a script, in order, and records every call.
///
/// Each scripted step names the exact command line it expects (`"systemctl --user start x"`);
/// a mismatch or an exhausted script is a [`CommandError::Unscripted`], so a test fails loudly
/// instead of silently accepting a wrong invocation.
#[derive(Debug, Default)]
pub struct ScriptedRunner {
    script: Mutex<VecDeque<(String, CommandOutput)>>,
    calls: Mutex<Vec<String>>,
}

impl ScriptedRunner {
    /// An empty script.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a step: when `command_line` is run, answer `output`.
    #[must_use]
    pub fn expect(self, command_line: &str, output: CommandOutput) -> Self {
        lock(&self.script).push_back((command_line.to_owned(), output));
        self
    }

    /// Every command line run so far.
    #[must_use]
    pub fn calls(&self) -> Vec<String> {
        lock(&self.calls).clone()
    }

    /// Whether every scripted step was consumed.
    #[must_use]
    pub fn is_exhausted(&self) -> bool {
        lock(&self.script).is_empty()
    }
}

impl CommandRunner for ScriptedRunner {
    fn run(&self, program: &str, args: &[&str]) -> Result<CommandOutput, CommandError> {
        let line = std::iter::once(program).chain(args.iter().copied()).collect::<Vec<_>>().join(" ");
        lock(&self.calls).push(line.clone());
        match lock(&self.script).pop_front() {
            Some((expected, out)) if expected == line => Ok(out),
            Some((expected, _)) => Err(CommandError::Unscripted(format!("{line} (expected {expected})"))),
            None => Err(CommandError::Unscripted(line)),
        }
    }
}

/// Locks a mutex, recovering from poisoning (a panicking test thread must not cascade).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    #[test]
    fn sh_quote_quotes_only_when_needed() {
        assert_eq!(sh_quote("/a/b.plist"), "/a/b.plist");
        assert_eq!(sh_quote("/a b/it's"), r"'/a b/it'\''s'");
        assert_eq!(sh_quote(""), "''");
    }

    use super::*;

    #[test]
    fn scripted_runner_answers_in_order_and_rejects_surprises() {
        let r = ScriptedRunner::new()
            .expect("systemctl --user start a", CommandOutput::ok(""))
            .expect("systemctl --user show a", CommandOutput::fail(1, "boom"));
        assert!(r.run("systemctl", &["--user", "start", "a"]).unwrap().success());
        assert!(matches!(r.run("systemctl", &["--user", "stop", "a"]), Err(CommandError::Unscripted(_))));
        assert!(r.is_exhausted());
        assert!(matches!(r.run("x", &[]), Err(CommandError::Unscripted(_))));
        assert_eq!(r.calls().len(), 3);
    }

    #[test]
    fn system_runner_reports_missing_program_as_spawn_error() {
        let r = SystemRunner::default();
        let e = r.run("/nonexistent/definitely-not-here", &[]).unwrap_err();
        assert!(matches!(e, CommandError::Spawn { .. }));
    }
}
