//! `gatewarden update`: replace this home's gateway binary as a verified transaction.
//!
//! 1. **Stage** the release into `<home>/releases/<version>-<sha12>/gatewarden` after checking
//!    its sha256 (`--sha256`, required for URLs) and, when `[update] public_key` is set, its
//!    minisign signature, both over the bytes as fetched; a `.tar.gz` is then opened in memory
//!    for its one `gatewarden` executable (`update/archive.rs`). The version is what the
//!    staged binary itself prints.
//! 2. **Preflight**: the staged binary runs `check` against the live home (no lock taken).
//! 3. **Record** the transaction in `<home>/update.json` and the ledger; `<home>/update.lock`
//!    (an OS lock, released by death) is held for the whole transaction, so a second update
//!    is refused and a dead updater is told apart from a busy one.
//! 4. **Swap**: copy the current binary to its own release directory (last known good), then
//!    rename the staged copy over the executable (on Windows the running image is renamed
//!    aside first).
//! 5. **Restart** through the one restart ladder (`ladder/`).
//! 6. **Probation**: the new incarnation reports the expected version and stays up for
//!    `[update] probation_s`.
//! 7. Success: `committed` with a receipt. Failure: swap back, restart, verify the old version
//!    runs, exit 1 with the reason and the log tail.
//!
//! A transaction left unfinished (the updater was killed) is finished by whoever finds it
//! with `update.lock` free: the next `run` of either binary (see [`on_gateway_start`]), the
//! next `update`, `supervise` when the candidate crashes, or `update --resume`.

//!
//! The transaction's decisions are a pure machine (`machine.rs`, its invariants listed there);
//! `driver.rs` carries out its actions with the edges: `fetch.rs` (download), `verify.rs`
//! (sha256, signature), `swap.rs` (staging and the swap), `run.rs` (the staged binary's
//! `--version` and `check`), `candidates.rs` (the processes the update started).

use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::time::Duration;

use crate::bail;
use gatewarden_control::Endpoint;
use gatewarden_lifecycle::desired::{self, Refusal, Starter};
use gatewarden_lifecycle::ledger::{Ledger, Writer};
use gatewarden_lifecycle::{Home, InstanceLock, VERSION, fsio, timefmt};
use serde::{Deserialize, Serialize};
use serde_json::json;

mod archive;
mod candidates;
mod driver;
mod fetch;
mod machine;
mod run;
mod swap;
mod verify;
mod version;

pub use swap::package_manager_owner;

use crate::options::UpdateArgs;
use crate::owner;
use crate::ready::status_of;
use crate::release::sha256_file;
use driver::Updater;
use machine::AtStart;

/// The transaction record's file name in the home.
pub const UPDATE_FILE: &str = "update.json";
const LOCK_FILE: &str = "update.lock";
/// Internal (tests): the phase in which the updater pauses, to be killed there.
const PAUSE_ENV: &str = "GATEWARDEN_TEST_UPDATE_PAUSE";
const POLL: Duration = Duration::from_millis(50);

/// Where a transaction is. `committed`, `rolled_back` and `failed` are final.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Swapping,
    Swapped,
    Restarting,
    Probation,
    RollingBack,
    Committed,
    RolledBack,
    Failed,
}

impl Phase {
    pub fn is_final(self) -> bool {
        matches!(self, Phase::Committed | Phase::RolledBack | Phase::Failed)
    }
}

/// `<home>/update.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Txn {
    pub from: String,
    pub to: String,
    pub phase: Phase,
    pub started: String,
    /// The executable that is swapped.
    pub target: PathBuf,
    /// The staged release.
    pub staged: PathBuf,
    /// The last known good copy of the replaced binary.
    pub previous: PathBuf,
    pub from_sha256: String,
    pub to_sha256: String,
    pub updater_pid: u32,
    #[serde(default)]
    pub chat: Option<String>,
    /// The adapter `chat` belongs to (`None`: an HTTP chat).
    #[serde(default)]
    pub platform: Option<String>,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub incarnation: Option<String>,
    #[serde(default)]
    pub finished: Option<String>,
    #[serde(default)]
    pub elapsed_ms: Option<u64>,
}

pub fn update(home: &Home, args: UpdateArgs) -> crate::Result<ExitCode> {
    // `--json`: stdout holds exactly one JSON document on every path, errors included.
    let json_outcome = args.json && !args.status;
    let result = transact(home, args);
    if json_outcome && let Err(e) = &result {
        outln!("{}", json!({"ok": false, "changed": false, "reason": e.chain()}));
    }
    result
}

fn transact(home: &Home, args: UpdateArgs) -> crate::Result<ExitCode> {
    let home = home.ensure()?;
    if args.status {
        return status(&home, args.json);
    }
    if args.after_exit {
        return Ok(after_exit(&home));
    }
    if args.from.is_none() && !args.rollback && !args.resume {
        bail!("say what to install: `gatewarden update --from PATH|URL` (or --status, --rollback)");
    }
    // The updater outlives the gateway it restarts (chat `/update` runs it from inside).
    crate::orchestrator::escape_unit(&home);
    if let Some(code) = crate::orchestrator::detach() {
        return Ok(code);
    }
    let Some(lock) = take_update_lock(&home, args.resume)? else {
        if args.resume {
            return Ok(ExitCode::SUCCESS); // a live updater carries on
        }
        let who = read_txn(&home).map(|t| format!(" (pid {}, {} → {}, {:?})", t.updater_pid, t.from, t.to, t.phase));
        let why = format!("another update is in progress{}", who.unwrap_or_default());
        let ledger = Ledger::new(home.ledger(), Writer::current());
        let _ = ledger.append("update_refused", json!({"reason": why, "requester": requester(args.chat.is_some())}));
        if args.json {
            outln!("{}", json!({"ok": false, "changed": false, "reason": why}));
        }
        errln!("{why}; nothing changed");
        if let Some(chat) = &args.chat {
            notify_chat(&home, chat, args.chat_platform.as_deref(), &format!("update refused: {why}; nothing changed"));
        }
        return Ok(ExitCode::from(1));
    };
    let mut u = Updater::new(&home, args.timeout, args.json);
    u.chat = args.chat.clone().map(|c| (c, args.chat_platform.clone()));
    // A transaction a killed updater left behind is finished first (reported as text: the
    // JSON outcome is this command's own).
    if let Some(t) = read_txn(&home).filter(|t| !t.phase.is_final()) {
        let code = if args.resume {
            u.resume(t)
        } else {
            let mut first = Updater::new(&home, args.timeout, false);
            first.text_to_stderr = args.json;
            first.resume(t)
        };
        if args.resume {
            return Ok(code);
        }
    } else if args.resume {
        return Ok(ExitCode::SUCCESS);
    }
    let code = if args.rollback { Ok(u.rollback_by_hand()) } else { u.install(&args) };
    drop(lock);
    code
}

fn take_update_lock(home: &Home, patient: bool) -> crate::Result<Option<InstanceLock>> {
    let path = home.dir().join(LOCK_FILE);
    // Only updaters take this lock, and they hold it for a whole transaction: there is no
    // brief probe to wait out, except a resuming updater racing the one that launched it.
    let taken =
        if patient { InstanceLock::acquire(&path, Duration::from_secs(2)) } else { InstanceLock::try_acquire(&path) };
    match taken {
        Ok(l) => Ok(Some(l)),
        Err(gatewarden_lifecycle::LockError::Held { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

pub fn read_txn(home: &Home) -> Option<Txn> {
    fsio::read_json::<Txn>(&home.dir().join(UPDATE_FILE)).ok()
}

fn status(home: &Home, json_out: bool) -> crate::Result<ExitCode> {
    let Some(t) = read_txn(home) else {
        if json_out {
            outln!("{}", json!({"update": null}));
        } else {
            outln!("no update recorded in {}", home.dir().display());
        }
        return Ok(ExitCode::SUCCESS);
    };
    let running = status_of(&Endpoint::for_home(home.dir()), Duration::from_secs(1)).ok();
    if json_out {
        let mut v = serde_json::to_value(&t)?;
        v["running_version"] = json!(running.as_ref().and_then(|s| s.version.clone()));
        outln!("{}", json!({"update": v}));
    } else {
        outln!("update {} → {}: {:?} (started {})", t.from, t.to, t.phase, t.started);
        if let Some(r) = &t.reason {
            outln!("  reason: {r}");
        }
        outln!("  executable: {}", t.target.display());
        outln!("  last known good: {}", t.previous.display());
        match running.and_then(|s| s.version) {
            Some(v) => outln!("  running now: {v}"),
            None => outln!("  running now: no gateway answers"),
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Who asked, for `update_refused`: the command the operator ran (or the gateway's, for chat
/// `/update`), on its channel.
fn requester(chat: bool) -> serde_json::Value {
    let r = if chat { gatewarden_control::Requester::current("chat") } else { gatewarden_control::Requester::cli() };
    json!({"pid": crate::orchestrator::requester_pid(), "argv": r.argv, "channel": r.channel})
}

/// The operator's stop in force, if any: an update starts nothing after it.
fn stopped(home: &Home) -> Option<Refusal> {
    desired::check(home.dir(), Starter::Resume).err()
}

/// Leaves one outcome notice for `chat` (of the adapter `platform`, or an HTTP chat); the
/// gateway delivers it once (`runtime/src/notices.rs`).
fn notify_chat(home: &Home, chat: &str, platform: Option<&str>, text: &str) {
    let v = json!({"chat_id": chat, "platform": platform, "text": text, "at": timefmt::now()});
    let name = format!("{}{}.json", gatewarden_lifecycle::home::UPDATE_NOTIFY_PREFIX, std::process::id());
    if let Err(e) = fsio::write_json(&home.dir().join(name), &v) {
        errln!("warning: cannot leave the chat notice: {e}");
    }
}

/// At the start of `run`, before the gateway claims the home: an unfinished transaction
/// whose updater is dead (its lock is free) is finished here or handed to `update --resume`.
/// - This binary is the old version and the file on disk is the new one: the restart never
///   happened, so the swap is reverted at once (file operations only) and this start goes on.
/// - This binary is the new version: a detached `update --resume` runs the probation beside
///   this gateway and commits or rolls back.
pub fn on_gateway_start(home: &Home) {
    let Some(t) = read_txn(home).filter(|t| !t.phase.is_final()) else { return };
    let Ok(Some(lock)) = take_update_lock(home, false) else { return };
    let new_on_disk = sha256_file(&t.target).ok().as_deref() == Some(t.to_sha256.as_str());
    if let AtStart::RevertNow { why } = machine::at_gateway_start(VERSION, t.phase, &t.from, new_on_disk) {
        let mut t = t;
        if swap::swap_in(&t.previous, &t.target).is_ok() {
            let u = Updater::new(home, 0, false);
            u.notify(&t, &format!("update to {} failed: {why}; still on {}", t.to, t.from));
            let _ = u.finish(&mut t, Phase::RolledBack, Some(why), None);
        }
        return;
    }
    drop(lock);
    let Ok(exe) = owner::current_exe() else { return };
    let mut cmd = Command::new(exe);
    cmd.arg("--home").arg(home.dir()).args(["update", "--resume"]);
    cmd.env_remove(gatewarden_control::runs::RUN_TAG);
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    gatewarden_lifecycle::platform::spawn::detach(&mut cmd, None);
    let _ = cmd.spawn();
}

/// For `supervise`: its child (running the swapped binary) ended before the update was
/// blessed: put the old binary back so the next child is the old version. With no updater
/// alive this finishes the transaction; a live updater sees the old version come back and
/// finishes its roll back. True when it reverted.
pub fn revert_after_crash(home: &Home, exit: &str, by: &str) -> bool {
    let Some(mut t) = read_txn(home) else { return false };
    if !runs_unblessed(&t, sha256_file(&t.target).ok().as_deref()) || swap::swap_in(&t.previous, &t.target).is_err() {
        return false;
    }
    let why = format!("the new version exited ({exit}) before probation ended; reverted by {by}");
    let u = Updater::new(home, 0, false);
    match take_update_lock(home, false) {
        Ok(Some(_lock)) => {
            u.notify(&t, &format!("update to {} failed: {why}; still on {}", t.to, t.from));
            let _ = u.finish(&mut t, Phase::RolledBack, Some(why), None);
        }
        _ => {
            let _ = u.ledger.append("update_reverted", json!({"by": by, "reason": why}));
        }
    }
    true
}

/// [`machine::runs_unblessed`] for a recorded transaction.
pub fn runs_unblessed(t: &Txn, on_disk: Option<&str>) -> bool {
    machine::runs_unblessed(t.phase, &t.to_sha256, on_disk)
}

/// `update --after-exit` under systemd's `ExecStopPost=`: the unit's main process ended; a
/// planned restart (75) or a clean stop changes nothing, anything else during an unfinished
/// update reverts it ([`revert_after_crash`]) so the relaunch runs the old binary.
fn after_exit(home: &Home) -> ExitCode {
    let result = std::env::var("SERVICE_RESULT").unwrap_or_default();
    let status = std::env::var("EXIT_STATUS").unwrap_or_default();
    if machine::systemd_end_is_planned(&result, &status) {
        return ExitCode::SUCCESS;
    }
    let exit = format!("{result}, exit status {}", if status.is_empty() { "?" } else { &status });
    if revert_after_crash(home, &exit, "the unit's ExecStopPost") {
        errln!("reverted an unfinished update after the gateway ended ({exit})");
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unfinished_phases() {
        assert!(!Phase::Swapped.is_final());
        assert!(Phase::RolledBack.is_final());
        let t: Phase = serde_json::from_value(json!("rolling_back")).unwrap();
        assert_eq!(t, Phase::RollingBack);
    }
}
