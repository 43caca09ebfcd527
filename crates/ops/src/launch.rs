//! Starting a gateway and waiting until it is ready: the one launcher, shared by `start`
//! (`start.rs`) and the restart ladder (`ladder/`). Through the owner when a service is
//! installed (then readiness over the control channel, `ready.rs`), else `run` in the
//! background, in its own session, ready once the child proves it over its stdout pipe — or
//! printing the child's error.

use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::process::{Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::Context;
use gatewarden_control::{Client, Endpoint};
use gatewarden_lifecycle::desired::{self, Desired, Starter, Want};
use gatewarden_lifecycle::ledger::{Ledger, Writer};
use gatewarden_lifecycle::platform::spawn;
use gatewarden_lifecycle::{ExitIntent, Home};
use std::net::SocketAddr;

use crate::owner::{self, ServiceManager};
use crate::presence::{Presence, presence};

/// Where the launcher's outcome lines go: stdout for the verb itself, stderr inside a command
/// whose stdout is its own (`update --json` starting the old version again).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Report {
    Stdout,
    Stderr,
}

impl Report {
    fn line(self, line: &str) {
        match self {
            Report::Stdout => outln!("{line}"),
            Report::Stderr => errln!("{line}"),
        }
    }
}

/// Who starts the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// The installed service definition's manager, if any (every lifecycle verb).
    Owner,
    /// `run` detached, whatever is installed: what a failed `service install` puts back (the
    /// gateway that ran outside the manager, at its address).
    Direct,
}

/// Starts a gateway (module doc) `via` its owner or directly, its outcome lines to `report`;
/// `on_behalf`: the desired-state request this start carries out (a restart's), else the start
/// records its own.
pub fn launch(
    home: &Home,
    listen: Option<&str>,
    timeout_s: u64,
    drain_timeout_s: Option<u64>,
    on_behalf: Option<u64>,
    report: Report,
    via: Via,
) -> crate::Result<ExitCode> {
    // The operator's start records `run` first (a start of a stopped gateway is what ends the
    // stop); a start on behalf of an earlier request (a restart's kick) obeys a later stop, and
    // is asked before the home is made: it never makes one (`desired::Refusal::HomeGone`).
    let recorded = on_behalf
        .map(|seq| crate::intent::may_start(home, "start", Starter::Carry { basis: seq }).map(|_| (seq, None)));
    let home = home.ensure()?;
    let recorded = recorded.unwrap_or_else(|| crate::intent::record_run_replacing(&home, "start"));
    let (seq, replaced) = match recorded {
        Ok(r) => r,
        Err(r) => {
            errln!("not starting: {}", r.describe());
            return Ok(ExitCode::from(1));
        }
    };
    let deadline = Instant::now() + Duration::from_secs(timeout_s);
    // The stop this start replaced may still be on its way to the gateway (issue 30, item 1:
    // `stop`, then `start` 5 ms later, said "already running" of the gateway that stop then
    // ended): its process is waited for, so what runs afterwards is what this start finds.
    if let Some(stop) = replaced.filter(|d| d.want == Want::Stopped && desired::in_flight_alive(d))
        && let Some(code) = await_stop(&home, &stop, deadline)
    {
        return Ok(code);
    }
    if let Some(code) = already_running(&home, report, deadline, seq)? {
        return Ok(code);
    }
    // The gateway itself fails fast on a taken port (a manager must park, not loop); the
    // operator's start waits for one on its way out, within its timeout (issue 22, item 3).
    let installed = owner::installed(&home).filter(|_| via == Via::Owner);
    let addr = listen_address(&home, listen.filter(|_| installed.is_none()));
    if let Some(addr) = addr
        && let Err(why) = wait_for_port(addr, deadline)
    {
        errln!("{why}");
        let ledger = Ledger::new(home.ledger(), Writer::current());
        let code = ExitIntent::FatalConfig.code();
        let _ = ledger.append("start_refused", serde_json::json!({"code": code, "reason": why, "by": "start"}));
        return Ok(ExitCode::from(code));
    }
    // An explicit start clears a supervisor's park: the operator has decided.
    let _ = gatewarden_service::supervise::clear_parked_state(home.dir());
    // Every lifecycle verb goes through whoever owns the gateway: with a service installed for
    // this home, its manager starts it (and will supervise it).
    if let Some(m) = installed {
        return start_via_manager(
            &home,
            m.as_ref(),
            seq,
            listen.is_some() || drain_timeout_s.is_some(),
            timeout_s,
            report,
        );
    }
    let log = home.logs_dir().join("gateway.log");
    // 0700 / 0600 whatever the umask, never through a symlink: the log holds what chats said.
    gatewarden_lifecycle::platform::create_private_dir(&home.logs_dir())
        .with_context(|| format!("cannot create {}", home.logs_dir().display()))?;
    let log_start = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
    let early =
        gatewarden_lifecycle::fsio::open_append(&log).with_context(|| format!("cannot open {}", log.display()))?;

    let mut cmd = Command::new(crate::owner::current_exe()?);
    cmd.arg("--home").arg(home.dir()).arg("run");
    if let Some(l) = listen {
        cmd.args(["--listen", l]);
    }
    if let Some(d) = drain_timeout_s {
        cmd.args(["--drain-timeout", &d.to_string()]);
    }
    // `start` is the launcher: what it launches is unsupervised (no manager owns this home, or
    // it would have started it above, or this start puts back the gateway that ran outside
    // it), whatever unit this shell inherited its environment from.
    cmd.args(["--supervisor", "none"]);
    // The child checks the desired state again once it holds the lock: a stop recorded after
    // this line still wins (crates/runtime/src/claim.rs, `obey_desired`).
    cmd.args(["--desired-seq", &seq.to_string()]);
    for k in gatewarden_lifecycle::supervisor::MANAGER_ENV {
        cmd.env_remove(k);
    }
    // Started by a restart's orchestrator: the gateway is not part of that restart.
    cmd.env_remove(crate::env::ORCHESTRATOR_ENV);
    cmd.arg("--ready-stdout");
    cmd.arg("--log-file").arg(&log);
    // stderr catches anything printed before the logger is up (argument errors, panics).
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::from(early));
    spawn::detach(&mut cmd, None);
    let mut child = cmd.spawn().context("cannot start the gateway process")?;
    crate::intent::note_spawned(&home, child.id());
    let stdout = child.stdout.take().context("no stdout pipe")?;
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });

    loop {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) => {
                let mut f = line.split_whitespace();
                if f.next() == Some("ready") {
                    if let Some(code) = overtaken(&home, seq) {
                        return Ok(code);
                    }
                    let (inc, pid, addr) = (f.next().unwrap_or("?"), f.next().unwrap_or("?"), f.next().unwrap_or("?"));
                    report.line(&format!("started gateway pid {pid} (incarnation {inc}) on http://{addr}"));
                    report.line(&format!("logs: {}", log.display()));
                    return Ok(ExitCode::SUCCESS);
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                // stdout closed before readiness: the child exited (or is exiting).
                let status = child.wait()?;
                if let Err(r) = desired::check(home.dir(), Starter::Carry { basis: seq }) {
                    errln!("the gateway did not start: {}", r.describe());
                    return Ok(ExitCode::from(1));
                }
                // Lost the lock race to a concurrent start (issue 22, item 7): that gateway
                // runs, which is what was asked.
                if status.code() == Some(i32::from(ExitIntent::FatalConfig.code()))
                    && let Some(code) = already_running(&home, report, deadline, seq)?
                {
                    return Ok(code);
                }
                errln!("the gateway exited during start-up ({status}); its log says:");
                err!("{}", tail_since(&log, log_start, 30));
                let code = status.code().and_then(|c| u8::try_from(c).ok()).filter(|c| *c != 0).unwrap_or(1);
                return Ok(ExitCode::from(code));
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                errln!(
                    "the gateway (pid {}) did not become ready within {timeout_s}s; it is still running. Log so far:",
                    child.id()
                );
                err!("{}", tail_since(&log, log_start, 30));
                errln!("check again with `gatewarden --home {} status`", home.dir().display());
                return Ok(ExitCode::from(1));
            }
        }
    }
}

/// The address the gateway will listen on: `--listen`, else the config's (none when the config
/// cannot be read: the gateway reports that itself).
fn listen_address(home: &Home, listen: Option<&str>) -> Option<SocketAddr> {
    match listen {
        Some(l) => l.parse().ok(),
        None => gatewarden_config::Config::load(home.dir()).ok().map(|c| c.listen),
    }
}

/// Waits until `addr` can be bound, saying once who holds it; past `until`, the refusal names
/// the holder. Only "address in use" is waited for: any other failure is the gateway's to report.
fn wait_for_port(addr: SocketAddr, until: Instant) -> Result<(), String> {
    if addr.port() == 0 {
        return Ok(());
    }
    // Naming the holder scans every process's descriptors: done once to say who is waited
    // for, and once more if it is still there at the deadline, not on every retry.
    let who = || {
        let holders = gatewarden_lifecycle::platform::port_listeners(addr.port());
        if holders.is_empty() {
            "a process this user cannot inspect".to_owned()
        } else {
            holders.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
        }
    };
    let mut said = false;
    loop {
        match std::net::TcpListener::bind(addr) {
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                if Instant::now() >= until {
                    return Err(format!("cannot listen on {addr}: the port is taken by {}", who()));
                }
                if !said {
                    errln!("waiting for {addr}: the port is held by {}", who());
                    said = true;
                }
                std::thread::sleep(Duration::from_millis(100).min(until.saturating_duration_since(Instant::now())));
            }
            _ => return Ok(()),
        }
    }
}

/// A stop recorded after this start's request `seq` wins (its sequence is later): said, recorded
/// (`start_prevented`), and exit 1; `start` exits 0 only for a gateway that stays up.
fn overtaken(home: &Home, seq: u64) -> Option<ExitCode> {
    let r = crate::intent::later_stop(home, "start", seq)?;
    errln!("not started: {} (a later request than this start)", r.describe());
    Some(ExitCode::from(1))
}

/// Waits until the process carrying out `stop` has ended (the gateway it stops is gone, or the
/// stop gave up), bounded by `until`; `Some(1)` when it is still under way then.
fn await_stop(home: &Home, stop: &Desired, until: Instant) -> Option<ExitCode> {
    errln!("waiting for the stop under way ({}) to finish", stop.describe());
    while desired::in_flight_alive(stop) {
        if Instant::now() >= until {
            errln!("not started: the stop by {} is still under way", stop.describe());
            errln!("check again with `gatewarden --home {} status`", home.dir().display());
            return Some(ExitCode::from(1));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// `Some(0)` with the "already running" line when a gateway runs (or holds the lock silently);
/// `Some(1)` when a stop recorded after `seq` will end it. One on its way out is waited for
/// until `until` (`settled_presence`).
fn already_running(home: &Home, report: Report, until: Instant, seq: u64) -> crate::Result<Option<ExitCode>> {
    let settled = settled_presence(home, until);
    if matches!(settled, Settled::Answering(_) | Settled::Silent)
        && let Some(code) = overtaken(home, seq)
    {
        return Ok(Some(code));
    }
    match settled {
        Settled::Answering(s) => {
            report.line(&format!(
                "already running: pid {} on http://{}",
                s.pid.map_or("?".into(), |p| p.to_string()),
                s.listen.unwrap_or_default()
            ));
            Ok(Some(ExitCode::SUCCESS))
        }
        Settled::Silent => {
            report.line(&format!(
                "already running in {} (it holds the lock but does not answer on its control endpoint)",
                home.dir().display()
            ));
            Ok(Some(ExitCode::SUCCESS))
        }
        // Not a gateway at all (issue 22, item 1): never "already running".
        Settled::Foreign(why) => {
            errln!("cannot start a gateway in {}: {why}", home.dir().display());
            Ok(Some(ExitCode::from(1)))
        }
        Settled::Unknown(why) => crate::bail!("cannot tell whether a gateway runs: {why}"),
        Settled::NotRunning => Ok(None),
    }
}

/// Asks the manager to start the service (systemd: `reset-failed` + `start`, which returns once
/// the gateway sent `READY=1`), then verifies readiness over the control channel.
fn start_via_manager(
    home: &Home,
    m: &dyn ServiceManager,
    seq: u64,
    overrides: bool,
    timeout_s: u64,
    report: Report,
) -> crate::Result<ExitCode> {
    if overrides {
        errln!("note: --listen / --drain-timeout are ignored: {} decides how the gateway runs", m.describe());
    }
    errln!("starting the gateway through {}…", m.describe());
    if let Err(e) = m.start(seq) {
        errln!("{} could not start the gateway: {}", m.kind(), e.chain());
        errln!("check: gatewarden --home {} service status; gatewarden --home {0} doctor", home.dir().display());
        return Ok(ExitCode::from(1));
    }
    match crate::ready::wait_ready(home, Duration::from_secs(timeout_s)) {
        Some(_) if let Some(code) = overtaken(home, seq) => Ok(code),
        Some(s) => {
            report.line(&format!(
                "started gateway pid {} (incarnation {}) on http://{} via {}",
                s.pid.map_or("?".into(), |p| p.to_string()),
                s.incarnation.unwrap_or_default(),
                s.listen.unwrap_or_default(),
                m.describe()
            ));
            Ok(ExitCode::SUCCESS)
        }
        None => {
            errln!("{} started, but the gateway did not report ready within {timeout_s}s", m.describe());
            errln!("check: gatewarden --home {} service status; gatewarden --home {0} doctor", home.dir().display());
            Ok(ExitCode::from(1))
        }
    }
}

/// What `start` found, after giving a silent lock holder a moment to either answer or go.
enum Settled {
    Answering(Box<gatewarden_control::StatusReport>),
    /// Held the lock for the whole grace and never answered.
    Silent,
    /// Held the lock for the whole grace, and the holder is not a gateway (`flock`, …).
    Foreign(String),
    NotRunning,
    Unknown(String),
}

/// How long a lock holder that does not answer may take to either answer or release the lock
/// (a gateway still starting, or a SIGKILLed one whose threads are still exiting).
const SETTLE: Duration = Duration::from_secs(3);

/// A gateway that answers while it leaves (the drain of a stop or of a restart) is not running:
/// it is waited for, until `until`, to go (then this start starts one) or to hand over to a
/// successor that answers (issue 22, item 7: a `start` right after a `stop` said "already
/// running" of the gateway that stop was draining, and nothing ran afterwards).
fn settled_presence(home: &Home, until: Instant) -> Settled {
    let mut deadline = Instant::now() + SETTLE;
    let ep = Endpoint::for_home(home.dir());
    loop {
        match presence(home, "start") {
            Presence::NotRunning { .. } => return Settled::NotRunning,
            Presence::Unknown(why) => return Settled::Unknown(why),
            Presence::Running => {}
        }
        let left = deadline.saturating_duration_since(Instant::now()).min(Duration::from_millis(500));
        if let Ok(s) = Client::connect(&ep, left).and_then(|mut c| c.status(left)) {
            if !gatewarden_lifecycle::overlap::leaving(s.state.as_deref()) || Instant::now() >= until {
                return Settled::Answering(Box::new(s));
            }
            deadline = Instant::now() + SETTLE;
        }
        if Instant::now() >= deadline {
            return gatewarden_lifecycle::holder::foreign_holder(home).map_or(Settled::Silent, Settled::Foreign);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The last `n` lines written to `path` since byte `offset`.
fn tail_since(path: &std::path::Path, offset: u64, n: usize) -> String {
    let mut buf = Vec::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let _ = f.seek(SeekFrom::Start(offset));
        let _ = f.read_to_end(&mut buf);
    }
    let text = String::from_utf8_lossy(&buf);
    let lines: Vec<&str> = text.lines().collect();
    let mut out = String::new();
    for l in &lines[lines.len().saturating_sub(n)..] {
        out.push_str("  ");
        out.push_str(l);
        out.push('\n');
    }
    out
}
