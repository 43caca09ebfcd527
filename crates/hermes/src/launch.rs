//! What `start` and `restart` will run, resolved before anything is stopped.
//!
//! A restart that stops hermes and then finds nothing to start leaves the gateway down (issue
//! 22 item 4: `hermes` was not on `PATH`). So the command is resolved first, and by default it
//! is exactly what ran: hermes's own record of its `sys.argv` (`gateway.pid`; for a console
//! script `argv[0]` is the venv's `bin/hermes`, whose shebang names the venv's interpreter),
//! else the live process's command line, else `hermes` on `PATH`. An explicit `--hermes` /
//! `GATEWARDEN_HERMES` wins, and must resolve too. Nothing resolvable: the restart is refused
//! and nothing is stopped.
//!
//! A recorded argv is a command of its writer's choosing, so it never runs with more rights
//! than whoever could write it ([`may_run`]): the record (read through the home's folder
//! handle, crates/hermes/src/sys) must belong to the user hermes runs as, or to root; and to
//! run as root, root alone must be able to have written it (the record and every folder above
//! it root's, not writable by others unless sticky). The running process's command line likewise counts only
//! when that process runs as that user or as root.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use gatewarden_lifecycle::ProcessIdentity;
use gatewarden_lifecycle::fsio;
use gatewarden_lifecycle::platform::{self, spawn};
use gatewarden_lifecycle::records::parse_pid_record;

use crate::home::HermesHome;
use crate::sys;

/// Where the command came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    /// `--hermes` / `GATEWARDEN_HERMES`.
    Explicit,
    /// hermes's record of what ran (`gateway.pid` / `gateway_state.json` `argv`).
    Record,
    /// The running process's command line.
    Running,
    /// `hermes` found on `PATH`.
    Path,
}

/// A resolved `hermes gateway run` command line (program and its arguments, `gateway run`
/// included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    pub program: PathBuf,
    pub args: Vec<OsString>,
    pub source: Source,
}

impl Launch {
    /// `<hermes> gateway run`.
    pub fn hermes(program: impl Into<PathBuf>, source: Source) -> Launch {
        Launch { program: program.into(), args: vec!["gateway".into(), "run".into()], source }
    }

    /// For messages: the command line as one string.
    pub fn display(&self) -> String {
        std::iter::once(self.program.to_string_lossy().into_owned())
            .chain(self.args.iter().map(|a| a.to_string_lossy().into_owned()))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// What [`choose`] picks from, in order of preference.
#[derive(Debug, Clone, Default)]
pub struct Candidates {
    pub explicit: Option<PathBuf>,
    /// `argv` of hermes's record (`sys.argv`).
    pub record: Option<Vec<String>>,
    /// `/proc/<pid>/cmdline` of the running gateway.
    pub running: Option<Vec<String>>,
    /// Candidates set aside before choosing (an untrusted record), said when nothing else runs.
    pub set_aside: Vec<String>,
}

/// Whether an argv its writer chose may run as `runs_as`. `writer`: the uid that owns the
/// record (or runs the process it came from); `root_only`: only root can write the record and
/// the folders above it. Pure. No uids on this OS (`runs_as` `None`): the home's ACL decides.
pub fn may_run(runs_as: Option<u32>, writer: Option<u32>, root_only: bool) -> bool {
    match (runs_as, writer) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(0), Some(w)) => w == 0 && root_only,
        (Some(u), Some(w)) => w == u || w == 0,
    }
}

/// Flags of the previous run that are ours to decide, not to repeat: `--replace` (a takeover)
/// and `--external-supervisor` (only a supervisor that revives exit 75 may pass it).
const NOT_REPEATED: &[&str] = &["--replace", "--external-supervisor"];

/// Picks the command (pure; `resolve` finds a program: an absolute executable file as is, a
/// bare name on `PATH`, anything else `None`; `exists` says whether a file exists). An
/// absolute path among the arguments before `gateway` (an interpreter's script) must exist.
/// `Err` lists what was tried.
pub fn choose(
    c: &Candidates,
    resolve: impl Fn(&Path) -> Option<PathBuf>,
    exists: impl Fn(&Path) -> bool,
) -> Result<Launch, String> {
    let mut tried = Vec::new();
    if let Some(e) = &c.explicit {
        return resolve(e).map(|p| Launch::hermes(p, Source::Explicit)).ok_or_else(|| {
            format!("{} (given with --hermes / GATEWARDEN_HERMES) is not an executable file", e.display())
        });
    }
    for (argv, source) in [(&c.record, Source::Record), (&c.running, Source::Running)] {
        let Some(argv) = argv else { continue };
        let is_gateway_run = argv.iter().any(|a| a == "gateway") && argv.iter().any(|a| a == "run");
        match argv.split_first() {
            Some((first, rest)) if is_gateway_run => match (resolve(Path::new(first)), missing_script(rest, &exists)) {
                (Some(_), Some(script)) => tried.push(format!("{script} (from {}) does not exist", label(source))),
                (Some(program), None) => {
                    let args =
                        rest.iter().filter(|a| !NOT_REPEATED.contains(&a.as_str())).map(OsString::from).collect();
                    return Ok(Launch { program, args, source });
                }
                (None, _) => tried.push(format!("{first} (from {}) is not an executable file", label(source))),
            },
            _ => tried.push(format!("{} is not `… gateway run`", label(source))),
        }
    }
    match resolve(Path::new("hermes")) {
        Some(p) => Ok(Launch::hermes(p, Source::Path)),
        None => {
            tried.push("`hermes` is not on PATH".into());
            Err(c.set_aside.iter().chain(&tried).cloned().collect::<Vec<_>>().join("; "))
        }
    }
}

/// The first rooted path before `gateway` (`/…`, `C:\…`) that does not exist.
fn missing_script<'a>(args: &'a [String], exists: &impl Fn(&Path) -> bool) -> Option<&'a str> {
    args.iter()
        .take_while(|a| *a != "gateway")
        .find(|a| Path::new(a.as_str()).has_root() && !exists(Path::new(a.as_str())))
        .map(String::as_str)
}

fn label(s: Source) -> &'static str {
    match s {
        Source::Record => "hermes's gateway.pid",
        Source::Running => "the running gateway's command line",
        Source::Explicit => "--hermes",
        Source::Path => "PATH",
    }
}

/// Whom hermes must run as: the home's owner, when that is not us (we are root, or the spawn
/// fails on its own for lack of rights). A home that cannot be opened is an error.
pub fn run_as(home: &HermesHome) -> std::io::Result<Option<(u32, u32)>> {
    Ok(home.owner()?.filter(|(uid, _)| Some(*uid) != sys::effective_uid()))
}

/// The uid hermes runs with for `home` ([`run_as`], else ours); `None` where the OS has none.
pub fn runs_as_uid(home: &HermesHome) -> std::io::Result<Option<u32>> {
    Ok(run_as(home)?.map(|(uid, _)| uid).or_else(sys::effective_uid))
}

/// Gathers the candidates for `home` (`running`: the gateway about to be stopped, if any) and
/// chooses. The record counts only when it describes `running` (or, with nothing running, the
/// last run), and only when [`may_run`] lets it run as the user hermes runs as.
pub fn resolve(
    home: &HermesHome,
    explicit: Option<PathBuf>,
    running: Option<ProcessIdentity>,
) -> Result<Launch, String> {
    let dir = home.open_dir().map_err(|e| e.to_string())?;
    let runs_as = runs_as_uid(home).map_err(|e| e.to_string())?;
    let mut set_aside = Vec::new();
    let record = [crate::home::PID_FILE, crate::home::STATE_FILE]
        .into_iter()
        .find_map(|name| {
            let f = dir.open_read(name).ok()??;
            let writer = sys::file_owner(&f);
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut std::io::Read::take(f, fsio::MAX_RECORD_BYTES), &mut bytes).ok()?;
            let r = parse_pid_record(&bytes).ok()?;
            Some((name, r, writer))
        })
        .filter(|(_, r, _)| running.is_none_or(|id| r.identity() == Some(id)))
        .filter(|(name, r, writer)| {
            let ok = may_run(runs_as, *writer, sys::only_root_writes(dir.path()));
            if !ok && !r.argv.is_empty() {
                set_aside.push(format!(
                    "the argv in {name} is not run: it was written by uid {}, and hermes would run as uid {}",
                    writer.map_or_else(|| "?".into(), |w| w.to_string()),
                    runs_as.map_or_else(|| "?".into(), |u| u.to_string())
                ));
            }
            ok
        })
        .map(|(_, r, _)| r.argv)
        .filter(|a| !a.is_empty());
    let running_argv = running
        .filter(|id| {
            let ok = may_run(runs_as, platform::process_uid(id.pid), true);
            if !ok {
                set_aside.push(format!("the command line of pid {} is not run: it runs as another user", id.pid));
            }
            ok
        })
        .and_then(|id| platform::argv(id.pid));
    let candidates = Candidates { explicit, record, running: running_argv, set_aside };
    choose(&candidates, find_program, Path::exists)
}

/// An absolute (or relative-with-folder) executable file as is, a bare name on `PATH`.
pub fn find_program(p: &Path) -> Option<PathBuf> {
    if p.components().count() > 1 {
        return spawn::is_executable(p).then(|| p.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(p)).find(|c| c.is_absolute() && spawn::is_executable(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(words: &[&str]) -> Option<Vec<String>> {
        Some(words.iter().map(|w| w.to_string()).collect())
    }

    /// Only `/venv/bin/hermes`, `/usr/bin/python3` and `/opt/h` exist; `hermes` is not on PATH.
    fn exists(p: &Path) -> Option<PathBuf> {
        on_disk(p).then(|| p.to_path_buf())
    }

    fn on_disk(p: &Path) -> bool {
        ["/venv/bin/hermes", "/usr/bin/python3", "/opt/h"].contains(&p.to_str().unwrap_or_default())
    }

    #[test]
    fn what_ran_is_what_restarts() {
        let c = Candidates {
            record: v(&["/venv/bin/hermes", "gateway", "run", "--replace", "-v"]),
            running: v(&["/usr/bin/python3", "/venv/bin/hermes", "gateway", "run"]),
            ..Candidates::default()
        };
        let l = choose(&c, exists, on_disk).unwrap();
        assert_eq!((l.program.as_path(), l.source), (Path::new("/venv/bin/hermes"), Source::Record));
        assert_eq!(l.args, ["gateway", "run", "-v"], "--replace is ours to decide");
    }

    #[test]
    fn the_live_command_line_when_the_record_cannot_run() {
        // `python -m hermes_cli.main gateway run`: sys.argv[0] is a module file.
        let c = Candidates {
            record: v(&["/venv/lib/hermes_cli/main.py", "gateway", "run"]),
            running: v(&["/usr/bin/python3", "-m", "hermes_cli.main", "gateway", "run", "--external-supervisor"]),
            ..Candidates::default()
        };
        let l = choose(&c, exists, on_disk).unwrap();
        assert_eq!((l.program.as_path(), l.source), (Path::new("/usr/bin/python3"), Source::Running));
        assert_eq!(l.args, ["-m", "hermes_cli.main", "gateway", "run"]);
    }

    #[test]
    fn nothing_to_start_is_an_error_naming_what_was_tried() {
        let c = Candidates { record: v(&["/gone/bin/hermes", "gateway", "run"]), ..Candidates::default() };
        let e = choose(&c, exists, on_disk).unwrap_err();
        assert!(e.contains("/gone/bin/hermes") && e.contains("not on PATH"), "{e}");
        // Not a gateway command line: never repeated.
        let c = Candidates { running: v(&["/usr/bin/python3", "-c", "evil"]), ..Candidates::default() };
        assert!(choose(&c, exists, on_disk).unwrap_err().contains("not `… gateway run`"));
        // The interpreter exists, its script does not: python would exit at once.
        let c =
            Candidates { running: v(&["/usr/bin/python3", "/gone/hermes", "gateway", "run"]), ..Candidates::default() };
        assert!(choose(&c, exists, on_disk).unwrap_err().contains("/gone/hermes (from the running"));
    }

    #[test]
    fn an_explicit_hermes_wins_and_must_exist() {
        let c = Candidates {
            explicit: Some("/opt/h".into()),
            record: v(&["/venv/bin/hermes", "gateway", "run"]),
            ..Candidates::default()
        };
        assert_eq!(choose(&c, exists, on_disk).unwrap(), Launch::hermes("/opt/h", Source::Explicit));
        let c = Candidates { explicit: Some("/nope".into()), ..Candidates::default() };
        assert!(choose(&c, exists, on_disk).unwrap_err().contains("/nope"));
    }
}
