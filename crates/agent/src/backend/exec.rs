//! `exec`: runs a command once per message.
//!
//! The argv from `[agent] command` is spawned directly (no shell) with
//! - stdin: the message text, then end-of-file;
//! - environment: the gateway's, plus `GATEWARDEN_CHAT_ID`, `GATEWARDEN_USER_ID`,
//!   `GATEWARDEN_RUN_ID` and `GATEWARDEN_HISTORY_FILE`: a file holding the conversation so far
//!   as a JSON array of `{"role", "content"}` (oldest first; `[]` for a single turn). It is
//!   0600 from its creation, in a folder of its own with an unpredictable name (0700, created
//!   new: nothing planted is reused) under the gateway's private scratch folder
//!   (`<home>/runs/<incarnation>/`, [`ExecAgent::with_scratch`]; else the temp folder), and
//!   removed when the run ends, however it ends (the runtime removes its incarnation's folder
//!   at exit, and the next incarnation what a killed one left: issue 31 §2);
//!   `GATEWARDEN_ATTACHMENTS` ([`ATTACHMENTS_ENV`]): the message's files as a JSON list of
//!   `{"path", "name", "type", "size"}` (`[]` without files; the paths are the gateway's
//!   stored copies: read them, never change them); each is also named on a line of stdin,
//!   `[file: name, type, size bytes]`;
//! - stdout: the reply; a line that is exactly `{"attach": "/absolute/path"}` is not text but
//!   attaches that file to the reply (the gateway copies it into its store under the download
//!   bounds before the run's end is journaled; a file it cannot take is named in the reply
//!   instead); the rest of stdout is the reply's text, at most `[agent] max_reply_bytes` ([`MAX_STDOUT_BYTES`] by default;
//!   more fails the run, because a reply that size is a runaway, not an answer), decoded as lossy UTF-8 with trailing line breaks removed;
//!   streamed line by line (each chunk ends with its `\n`);
//! - stderr: its last 4 KiB are kept for the failure reason.
//!
//! The command runs in its own process group (a job object on Windows; see the private
//! `process_group` facade). When the command exits, the group is swept with SIGKILL so that a
//! background leftover can neither outlive the run nor hold the stdout pipe open. On cancel or
//! timeout the group gets SIGTERM, `kill_grace_ms` to exit, then SIGKILL, and the leader is
//! reaped before the run's future resolves. A non-zero exit fails the run with the exit status
//! and the stderr tail.

use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::process_group::{self, Group};
use super::{Agent, AgentError, AgentFuture, AgentReply, AgentRequest, send_chunk, tail, with_timeout};

/// Largest stdout accepted from one run by default (1 MiB; `[agent] max_reply_bytes`).
pub const MAX_STDOUT_BYTES: usize = 1 << 20;

/// The environment variable naming the message's files (module notes).
pub const ATTACHMENTS_ENV: &str = "GATEWARDEN_ATTACHMENTS";

/// The reply's text without its attach lines, and the files they name: a line of stdout that
/// is exactly a JSON object `{"attach": "/absolute/path"}` attaches that file (module notes).
fn attached(out: &str) -> (String, Vec<std::path::PathBuf>) {
    let mut files = Vec::new();
    let mut text = Vec::new();
    for line in out.split_inclusive('\n') {
        let t = line.trim();
        let path = t
            .starts_with("{\"attach\"")
            .then(|| serde_json::from_str::<serde_json::Value>(t).ok())
            .flatten()
            .and_then(|v| v.as_object().filter(|o| o.len() == 1).and_then(|o| o["attach"].as_str().map(str::to_owned)))
            .map(std::path::PathBuf::from)
            .filter(|p| p.is_absolute());
        match path {
            Some(p) => files.push(p),
            None => text.push(line),
        }
    }
    (text.concat(), files)
}

/// How much of stderr is kept for the failure reason.
const STDERR_TAIL_BYTES: usize = 4096;

/// After the command exited and its group was swept, how long its pipes may take to report
/// end-of-file. Only a descendant that left the group (`setsid`) can hold them open that long.
const PIPE_DRAIN: Duration = Duration::from_secs(2);

/// After SIGKILL, how long reaping may take before we stop waiting (tokio reaps the orphan
/// later); keeps a process stuck in the kernel from wedging the run.
const REAP_LIMIT: Duration = Duration::from_secs(5);

/// Runs a command per message.
#[derive(Debug, Clone)]
pub struct ExecAgent {
    argv: Vec<String>,
    timeout: Duration,
    kill_grace: Duration,
    env: Vec<(String, String)>,
    /// Where each run's private history folder is made; `None`: the temp folder.
    scratch: Option<std::path::PathBuf>,
    /// The most stdout a run may write (`[agent] max_reply_bytes`).
    max_stdout: usize,
}

enum StdoutError {
    Overflow,
    Io(std::io::Error),
    Cancelled,
}

enum Ended {
    Exited(ExitStatus),
    Cancelled,
    Failed(String),
}

impl ExecAgent {
    /// `argv[0]` is the program; `timeout` bounds each run; `kill_grace` is the time between
    /// SIGTERM and SIGKILL of the process group.
    pub fn new(argv: Vec<String>, timeout: Duration, kill_grace: Duration) -> Self {
        ExecAgent { argv, timeout, kill_grace, env: Vec::new(), scratch: None, max_stdout: MAX_STDOUT_BYTES }
    }

    /// The most stdout a run may write (default [`MAX_STDOUT_BYTES`]).
    #[must_use]
    pub fn with_max_stdout(mut self, bytes: usize) -> Self {
        self.max_stdout = bytes;
        self
    }

    /// A private folder of the gateway's (created 0700 if missing) for the runs' history files.
    #[must_use]
    pub fn with_scratch(mut self, dir: Option<std::path::PathBuf>) -> Self {
        self.scratch = dir;
        self
    }

    /// Extra environment for every run (the runtime tags runs with its home and incarnation,
    /// so a later incarnation can find runs a crashed one left behind).
    #[must_use]
    pub fn with_env(mut self, env: Vec<(String, String)>) -> Self {
        self.env = env;
        self
    }

    async fn go(
        &self,
        req: AgentRequest,
        cancel: CancellationToken,
        chunks: Option<mpsc::Sender<String>>,
    ) -> Result<AgentReply, AgentError> {
        with_timeout(self.timeout, &cancel, |cancel| self.exec(req, cancel, chunks)).await
    }

    async fn exec(
        &self,
        req: AgentRequest,
        cancel: CancellationToken,
        chunks: Option<mpsc::Sender<String>>,
    ) -> Result<AgentReply, AgentError> {
        let Some((program, args)) = self.argv.split_first() else {
            return Err(AgentError::Failed("exec backend: no command configured ([agent] command)".into()));
        };
        if cancel.is_cancelled() {
            return Err(AgentError::Cancelled);
        }
        let history = HistoryFile::write(self.scratch.as_deref(), &req.history)
            .map_err(|e| AgentError::Failed(format!("exec backend: cannot write the history file: {e}")))?;
        let mut cmd = Command::new(program);
        cmd.env(HISTORY_ENV, history.path());
        cmd.args(args)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env("GATEWARDEN_CHAT_ID", &req.chat_id)
            .env("GATEWARDEN_USER_ID", &req.user_id)
            .env("GATEWARDEN_RUN_ID", &req.run_id)
            .env(ATTACHMENTS_ENV, super::files::env_json(&req.attachments))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Backstop for the leader only; the group is handled by `Group`'s Drop.
            .kill_on_drop(true);
        process_group::configure(&mut cmd);
        let mut child = cmd.spawn().map_err(|e| AgentError::Failed(format!("cannot start {program:?}: {e}")))?;
        let group = Group::attach(&child);

        let stdin = child.stdin.take();
        let text = super::files::named_text(&req.text, &req.attachments).into_bytes();
        // A command that never reads its input makes this write fail (EPIPE) or block until the
        // group dies; neither is the run's failure, so the result is ignored.
        let stdin_task = tokio::spawn(async move {
            if let Some(mut stdin) = stdin {
                let _ = stdin.write_all(&text).await;
                let _ = stdin.shutdown().await;
            }
        });
        let stderr_task = child.stderr.take().map(|e| tokio::spawn(read_tail(e)));
        let stdout = child.stdout.take();
        let max = self.max_stdout;
        let out = read_stdout(stdout, chunks, cancel.clone(), max);
        tokio::pin!(out);

        let mut output: Option<Vec<u8>> = None;
        let ended = loop {
            tokio::select! {
                status = child.wait() => break match status {
                    Ok(status) => Ended::Exited(status),
                    Err(e) => Ended::Failed(format!("waiting for {program:?}: {e}")),
                },
                r = &mut out, if output.is_none() => match r {
                    // End-of-file on stdout; the command may still be running.
                    Ok(bytes) => output = Some(bytes),
                    Err(StdoutError::Cancelled) => break Ended::Cancelled,
                    Err(StdoutError::Overflow) => break Ended::Failed(format!(
                        "{program:?} wrote more than {max} bytes to stdout ([agent] max_reply_bytes)"
                    )),
                    Err(StdoutError::Io(e)) => {
                        break Ended::Failed(format!("reading stdout of {program:?}: {e}"))
                    }
                },
                () = cancel.cancelled() => break Ended::Cancelled,
            }
        };

        let status = match ended {
            Ended::Exited(status) => {
                // Sweep leftovers (a backgrounded grandchild) so they cannot hold stdout open.
                group.kill();
                status
            }
            Ended::Cancelled | Ended::Failed(_) => {
                self.shut_down(&group, &mut child).await;
                group.release();
                stdin_task.abort();
                return Err(match ended {
                    Ended::Failed(reason) => AgentError::Failed(reason),
                    _ => AgentError::Cancelled,
                });
            }
        };
        group.release();
        stdin_task.abort();

        let output = match output {
            Some(bytes) => Ok(bytes),
            None => match tokio::time::timeout(PIPE_DRAIN, &mut out).await {
                Ok(Ok(bytes)) => Ok(bytes),
                Ok(Err(StdoutError::Overflow)) => {
                    Err(format!("{program:?} wrote more than {max} bytes to stdout ([agent] max_reply_bytes)"))
                }
                Ok(Err(StdoutError::Cancelled)) => return Err(AgentError::Cancelled),
                Ok(Err(StdoutError::Io(e))) => Err(format!("reading stdout of {program:?}: {e}")),
                Err(_) => {
                    Err(format!("{program:?} exited but its stdout stayed open (a descendant left its process group)"))
                }
            },
        };
        let stderr = match stderr_task {
            Some(task) => match tokio::time::timeout(PIPE_DRAIN, task).await {
                Ok(Ok(s)) => s,
                _ => String::new(),
            },
            None => String::new(),
        };

        if !status.success() {
            let how = process_group::describe_exit(status);
            let stderr = stderr.trim();
            return Err(AgentError::Failed(if stderr.is_empty() {
                format!("{program:?} failed ({how})")
            } else {
                format!("{program:?} failed ({how}): {stderr}")
            }));
        }
        let output = output.map_err(AgentError::Failed)?;
        let (text, files) = attached(&String::from_utf8_lossy(&output));
        Ok(AgentReply { text: text.trim_end_matches(['\n', '\r']).to_string(), usage: None, files })
    }

    /// SIGTERM to the group, up to `kill_grace` for the leader to exit, SIGKILL to the group,
    /// then reap the leader.
    async fn shut_down(&self, group: &Group, child: &mut Child) {
        group.terminate();
        let _ = tokio::time::timeout(self.kill_grace, child.wait()).await;
        group.kill();
        let _ = tokio::time::timeout(REAP_LIMIT, child.wait()).await;
    }
}

/// Reads stdout to end-of-file (bounded), sending each complete line as a chunk.
/// Names the file holding the conversation so far.
pub const HISTORY_ENV: &str = "GATEWARDEN_HISTORY_FILE";

/// The history file of one run, in a folder of its own; both removed when dropped (the run's
/// end, however it ends).
struct HistoryFile {
    dir: std::path::PathBuf,
    file: std::path::PathBuf,
}

impl HistoryFile {
    fn write(scratch: Option<&std::path::Path>, history: &[super::Turn]) -> std::io::Result<HistoryFile> {
        use gatewarden_lifecycle::{fsio, platform};
        use std::io::Write;
        let base = match scratch {
            Some(d) => {
                platform::create_private_dir(d)?;
                d.to_path_buf()
            }
            None => std::env::temp_dir(),
        };
        // 128 random bits: nobody can guess the name to plant it, read it or block it.
        let mut id = [0u8; 16];
        getrandom::fill(&mut id).map_err(|e| std::io::Error::other(e.to_string()))?;
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        let dir = base.join(format!("gatewarden-history-{hex}"));
        platform::create_private_dir_new(&dir)?;
        let guard = HistoryFile { file: dir.join("history.json"), dir };
        let mut f = fsio::create_private(&guard.file)?;
        f.write_all(&serde_json::to_vec(history).map_err(std::io::Error::other)?)?;
        Ok(guard)
    }

    fn path(&self) -> &std::path::Path {
        &self.file
    }
}

impl Drop for HistoryFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.file);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

async fn read_stdout(
    stdout: Option<impl AsyncRead + Unpin>,
    chunks: Option<mpsc::Sender<String>>,
    cancel: CancellationToken,
    max: usize,
) -> Result<Vec<u8>, StdoutError> {
    let Some(mut stdout) = stdout else {
        return Ok(Vec::new());
    };
    let mut all = Vec::new();
    let mut line_start = 0;
    let mut buf = [0u8; 8192];
    loop {
        let n = stdout.read(&mut buf).await.map_err(StdoutError::Io)?;
        if n == 0 {
            break;
        }
        if all.len() + n > max {
            return Err(StdoutError::Overflow);
        }
        all.extend_from_slice(&buf[..n]);
        if let Some(chunks) = &chunks {
            while let Some(pos) = all[line_start..].iter().position(|&b| b == b'\n') {
                let end = line_start + pos + 1;
                // Lines split on '\n' never cut a UTF-8 sequence, so the lossy pieces
                // concatenate to the lossy whole.
                let line = String::from_utf8_lossy(&all[line_start..end]).into_owned();
                line_start = end;
                send_chunk(chunks, &cancel, line).await.map_err(|_| StdoutError::Cancelled)?;
            }
        }
    }
    if let Some(chunks) = &chunks
        && line_start < all.len()
    {
        let rest = String::from_utf8_lossy(&all[line_start..]).into_owned();
        send_chunk(chunks, &cancel, rest).await.map_err(|_| StdoutError::Cancelled)?;
    }
    Ok(all)
}

/// Reads stderr to end-of-file, keeping only the last [`STDERR_TAIL_BYTES`].
async fn read_tail(mut stderr: impl AsyncRead + Unpin) -> String {
    let mut kept: Vec<u8> = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = stderr.read(&mut buf).await {
        if n == 0 {
            break;
        }
        kept.extend_from_slice(&buf[..n]);
        if kept.len() > 2 * STDERR_TAIL_BYTES {
            kept.drain(..kept.len() - STDERR_TAIL_BYTES);
        }
    }
    tail(&String::from_utf8_lossy(&kept), STDERR_TAIL_BYTES)
}

impl Agent for ExecAgent {
    fn name(&self) -> &str {
        "exec"
    }

    fn start(
        &self,
        req: AgentRequest,
        cancel: CancellationToken,
        chunks: Option<mpsc::Sender<String>>,
    ) -> AgentFuture<'_> {
        Box::pin(self.go(req, cancel, chunks))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attach_lines_name_files_and_leave_the_text() {
        // An absolute path on this OS (Windows' has a drive), as the JSON string a run prints.
        let abs = std::env::temp_dir().join("a.png");
        let line = serde_json::json!({ "attach": abs }).to_string();
        let (text, files) = attached(&format!("here it is\n{line}\n{{\"attach\": \"rel\"}}\nbye\n"));
        assert_eq!(text, "here it is\n{\"attach\": \"rel\"}\nbye\n", "a relative path is text");
        assert_eq!(files, vec![abs]);
        assert!(attached("{\"attach\": \"/x\", \"y\": 1}").1.is_empty(), "only the one key");
    }
}
