//! What the page's buttons do, as data: the typed [`Action`] a POST names, the CLI verb a
//! lifecycle action runs (the same `crates/ops` code as the command line, with the same
//! verification: `restart` exits 0 only when a new incarnation is ready), and the [`Outcome`]
//! file through which that command reports back to the page.
//!
//! A lifecycle action cannot be carried out inside the gateway it restarts or stops: the
//! server that received the POST is gone before the verdict exists. So the server starts the
//! CLI verb detached, with its output in `logs/` ([`OUTPUT_FILE`]) and [`OUTCOME_ENV`] naming
//! [`OUTCOME_FILE`]; the binary writes its exit code there when it ends (crates/gatewarden's
//! `main`), and whichever page reads the home next (the new incarnation's, or the fleet's) shows
//! it. The ledger records the request with `channel: dashboard` (`Requester::cli`, crates/control).

use std::path::{Path, PathBuf};

use gatewarden_lifecycle::fsio::{self, ReadOutcome};
use gatewarden_lifecycle::{Home, ledger, timefmt};
use serde::{Deserialize, Serialize};

/// The outcome record, in the home.
pub const OUTCOME_FILE: &str = "dashboard_action.json";
/// The running command's output, in the home's `logs/`.
pub const OUTPUT_FILE: &str = "dashboard_action.log";
/// Set on the command a dashboard starts: where to write its exit code.
pub const OUTCOME_ENV: &str = "GATEWARDEN_ACTION_OUTCOME";
/// Output lines shown with an outcome.
pub const OUTPUT_LINES: usize = 12;
const MAX_OUTCOME_BYTES: u64 = 64 << 10;

/// One button of the page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// `gatewarden restart` (drain, then a verified new incarnation).
    Restart,
    /// `gatewarden stop`.
    Stop,
    /// `gatewarden cancel-drain` (a restart's drain; the gateway says when it cannot be).
    CancelDrain,
    /// `gatewarden start --as-before` (the fleet page: a stopped gateway serves no page of its
    /// own), with the settings of the gateway it revives.
    Start,
    /// `gatewarden update --from <[update] source>`.
    Update,
    /// `gatewarden update --rollback`.
    Rollback,
    /// Queue a failed message again (in the gateway, through its journal).
    Retry { id: String },
    /// A platform chat's `/new`: later runs see no earlier turns.
    NewConversation { platform: String, chat: String },
    /// Approve the sender a pairing code was given to (in the gateway, at once).
    Approve { platform: String, code: String },
    /// Take a sender's approval back (in the gateway, at once).
    Revoke { platform: String, user: String },
}

impl Action {
    /// The action a `POST /ui/action/<verb>` names, with its form fields (`id`, `platform`,
    /// `chat`) read by `field`. Identifiers are bounded and printable.
    pub fn parse(verb: &str, field: impl Fn(&str) -> Option<String>) -> Result<Action, String> {
        let arg = |k: &str| -> Result<String, String> {
            let v = field(k).unwrap_or_default();
            if v.is_empty() || v.len() > 512 || v.chars().any(char::is_control) {
                return Err(format!("{verb}: a missing or malformed {k}"));
            }
            Ok(v)
        };
        Ok(match verb {
            "restart" => Action::Restart,
            "stop" => Action::Stop,
            "cancel-drain" => Action::CancelDrain,
            "start" => Action::Start,
            "update" => Action::Update,
            "rollback" => Action::Rollback,
            "retry" => Action::Retry { id: arg("id")? },
            "new" => Action::NewConversation { platform: arg("platform")?, chat: arg("chat")? },
            "approve" => Action::Approve { platform: arg("platform")?, code: arg("code")? },
            "revoke" => Action::Revoke { platform: arg("platform")?, user: arg("user")? },
            other => return Err(format!("no such action: {:?}", other.chars().take(40).collect::<String>())),
        })
    }

    pub fn verb(&self) -> &'static str {
        match self {
            Action::Restart => "restart",
            Action::Stop => "stop",
            Action::CancelDrain => "cancel-drain",
            Action::Start => "start",
            Action::Update => "update",
            Action::Rollback => "rollback",
            Action::Retry { .. } => "retry",
            Action::NewConversation { .. } => "new",
            Action::Approve { .. } => "approve",
            Action::Revoke { .. } => "revoke",
        }
    }

    /// The CLI arguments (after `--home DIR`) of a lifecycle action; `Ok(None)` for the
    /// journal's (the gateway does those itself); `Err` when it cannot run here (an update
    /// without a configured source).
    pub fn cli_args(&self, update_source: Option<&str>) -> Result<Option<Vec<String>>, String> {
        let v = |a: &[&str]| Ok(Some(a.iter().map(|s| (*s).to_owned()).collect()));
        match self {
            Action::Restart => v(&["restart"]),
            Action::Stop => v(&["stop"]),
            Action::CancelDrain => v(&["cancel-drain"]),
            Action::Start => v(&["start", "--as-before"]),
            Action::Rollback => v(&["update", "--rollback"]),
            Action::Update => match update_source {
                Some(src) => v(&["update", "--from", src]),
                None => Err("no [update] source is configured: run `gatewarden update --from …`".into()),
            },
            Action::Retry { .. } | Action::NewConversation { .. } | Action::Approve { .. } | Action::Revoke { .. } => {
                Ok(None)
            }
        }
    }
}

/// The last dashboard action of a home: what was asked, when, and (once the command ended)
/// its exit code, with the command's last lines of output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    pub verb: String,
    pub requested_at: String,
    /// The command's pid while it runs.
    #[serde(default)]
    pub pid: Option<u32>,
    /// The incarnation that received the request (a restart's result is a different one).
    #[serde(default)]
    pub from_incarnation: Option<String>,
    #[serde(default)]
    pub code: Option<i32>,
    #[serde(default)]
    pub finished_at: Option<String>,
    /// For actions the gateway carries out itself: what it did, in words.
    #[serde(default)]
    pub said: Option<String>,
    /// Filled when read: the command's last lines.
    #[serde(skip)]
    pub output: Vec<String>,
}

impl Outcome {
    pub fn started(verb: &str, from_incarnation: Option<String>) -> Outcome {
        Outcome {
            verb: verb.into(),
            requested_at: timefmt::now(),
            pid: None,
            from_incarnation,
            code: None,
            finished_at: None,
            said: None,
            output: Vec::new(),
        }
    }

    /// `running`, `done` (exit 0), `refused (exit 78)` (a restart the gateway refused because
    /// the next incarnation could not start: it keeps serving) or `failed (exit N)`.
    pub fn verdict(&self) -> String {
        let refused = i32::from(gatewarden_lifecycle::ExitIntent::FatalConfig.code());
        match self.code {
            None if self.said.is_some() => "done".into(),
            None => "running".into(),
            Some(0) => "done".into(),
            Some(c) if c == refused && self.verb == "restart" => format!("refused (exit {c})"),
            Some(c) => format!("failed (exit {c})"),
        }
    }
}

pub fn outcome_path(home: &Home) -> PathBuf {
    home.dir().join(OUTCOME_FILE)
}

pub fn output_path(home: &Home) -> PathBuf {
    home.logs_dir().join(OUTPUT_FILE)
}

pub fn write(path: &Path, o: &Outcome) -> std::io::Result<()> {
    fsio::write_json(path, o)
}

/// The home's last outcome with its output's last lines; `None` when there is none (or it
/// cannot be read as one: a link, a FIFO, too big, not ours).
pub fn read(home: &Home) -> Option<Outcome> {
    let ReadOutcome::Ok(bytes) = fsio::read_capped(&outcome_path(home), MAX_OUTCOME_BYTES) else { return None };
    let mut o: Outcome = serde_json::from_slice(&bytes).ok()?;
    if let Some((mut f, len)) = fsio::open_regular(&output_path(home)).ok()
        && let Ok(tail) = ledger::tail_bytes(&mut f, len, Some(OUTPUT_LINES))
    {
        o.output = String::from_utf8_lossy(&tail)
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| l.chars().map(|c| if c.is_control() { ' ' } else { c }).collect())
            .collect();
    }
    Some(o)
}

/// Starts `exe --home <home> <args>` for `verb`, the way an operator would run it, detached
/// (its own session: it outlives a gateway it stops or restarts) with its output in
/// [`OUTPUT_FILE`], `channel: dashboard` for the ledger and [`OUTCOME_ENV`] for its exit code.
/// The outcome record is written first, so a page shows `running` at once. A thread reaps the
/// command when it ends (while this process lives).
pub fn launch(
    home: &Home,
    exe: &Path,
    verb: &str,
    args: &[String],
    from_incarnation: Option<String>,
) -> std::io::Result<Outcome> {
    use std::process::{Command, Stdio};
    gatewarden_lifecycle::platform::create_private_dir(&home.logs_dir())?;
    let out_path = output_path(home);
    // A new file each time (a link planted there is removed, never followed).
    let _ = std::fs::remove_file(&out_path);
    let out = fsio::open_append(&out_path)?;
    let o = Outcome::started(verb, from_incarnation);
    write(&outcome_path(home), &o)?;
    let mut cmd = Command::new(exe);
    cmd.arg("--home").arg(home.dir()).args(args);
    cmd.env(gatewarden_control::proto::REQUESTER_CHANNEL_ENV, "dashboard").env(OUTCOME_ENV, outcome_path(home));
    cmd.stdin(Stdio::null()).stdout(out.try_clone()?).stderr(out);
    gatewarden_lifecycle::platform::spawn::detach(&mut cmd, None);
    let mut child = cmd.spawn()?;
    std::thread::spawn(move || child.wait());
    Ok(o)
}

/// Records an action the server carried out itself (a retry, a `/new`): done at once.
pub fn record_done(home: &Home, verb: &str, from_incarnation: Option<String>, said: String) -> std::io::Result<()> {
    let mut o = Outcome::started(verb, from_incarnation);
    o.said = Some(said);
    o.finished_at = Some(o.requested_at.clone());
    write(&outcome_path(home), &o)
}

/// The command's end, written by the binary when [`OUTCOME_ENV`] is set: the record it was
/// started with, plus the exit code. A record that cannot be read is rewritten from `verb`.
pub fn finish(path: &Path, verb: &str, code: i32) -> std::io::Result<()> {
    let mut o = match fsio::read_capped(path, MAX_OUTCOME_BYTES) {
        ReadOutcome::Ok(b) => serde_json::from_slice(&b).unwrap_or_else(|_| Outcome::started(verb, None)),
        _ => Outcome::started(verb, None),
    };
    o.code = Some(code);
    o.finished_at = Some(timefmt::now());
    write(path, &o)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| (*v).to_owned())
    }

    #[test]
    fn verbs_parse_to_actions_and_cli_verbs() {
        assert_eq!(Action::parse("restart", form(&[])), Ok(Action::Restart));
        assert_eq!(Action::parse("retry", form(&[("id", "m1")])), Ok(Action::Retry { id: "m1".into() }));
        assert!(Action::parse("retry", form(&[])).is_err());
        assert!(Action::parse("retry", form(&[("id", "a\nb")])).is_err());
        assert!(Action::parse("rm -rf", form(&[])).unwrap_err().contains("no such action"));
        assert_eq!(
            Action::parse("new", form(&[("platform", "tg"), ("chat", "42")])),
            Ok(Action::NewConversation { platform: "tg".into(), chat: "42".into() })
        );
        assert_eq!(Action::Restart.cli_args(None), Ok(Some(vec!["restart".to_owned()])));
        assert_eq!(Action::Rollback.cli_args(None), Ok(Some(vec!["update".to_owned(), "--rollback".to_owned()])));
        assert!(Action::Update.cli_args(None).is_err());
        assert_eq!(Action::Update.cli_args(Some("/r/gw")).unwrap().unwrap()[2], "/r/gw");
        assert_eq!(Action::Retry { id: "x".into() }.cli_args(None), Ok(None));
        assert_eq!(Action::parse("cancel-drain", form(&[])), Ok(Action::CancelDrain));
        assert_eq!(
            Action::parse("approve", form(&[("platform", "telegram"), ("code", "XKGH5N7P")])),
            Ok(Action::Approve { platform: "telegram".into(), code: "XKGH5N7P".into() })
        );
        assert_eq!(
            Action::parse("revoke", form(&[("platform", "telegram"), ("user", "102")])),
            Ok(Action::Revoke { platform: "telegram".into(), user: "102".into() })
        );
        assert!(Action::parse("approve", form(&[("platform", "telegram")])).is_err());
        assert_eq!(Action::Revoke { platform: "t".into(), user: "1".into() }.cli_args(None), Ok(None));
        assert_eq!(Action::CancelDrain.cli_args(None), Ok(Some(vec!["cancel-drain".to_owned()])));
        for v in ["restart", "stop", "cancel-drain", "start", "update", "rollback"] {
            assert_eq!(Action::parse(v, form(&[])).unwrap().verb(), v);
        }
    }

    #[test]
    fn an_outcome_is_written_then_finished_and_read_with_its_output() {
        let t = tempfile::tempdir().unwrap();
        let home = Home::at(t.path());
        assert!(read(&home).is_none());
        let mut o = Outcome::started("restart", Some("abc".into()));
        o.pid = Some(9);
        write(&outcome_path(&home), &o).unwrap();
        assert_eq!(read(&home).unwrap().verdict(), "running");
        std::fs::create_dir_all(home.logs_dir()).unwrap();
        std::fs::write(output_path(&home), "restarting…\nrestarted: incarnation def\u{1b}[2J\n").unwrap();
        finish(&outcome_path(&home), "restart", 0).unwrap();
        let r = read(&home).unwrap();
        assert_eq!((r.verdict().as_str(), r.from_incarnation.as_deref()), ("done", Some("abc")));
        assert_eq!(r.output, ["restarting…", "restarted: incarnation def [2J"]);
        finish(&outcome_path(&home), "restart", 1).unwrap();
        assert_eq!(read(&home).unwrap().verdict(), "failed (exit 1)");
        finish(&outcome_path(&home), "restart", 78).unwrap();
        assert_eq!(read(&home).unwrap().verdict(), "refused (exit 78)");
    }
}
