//! `gatewarden --hermes-home DIR`, run as root against a home owned by another user (issue 18,
//! high items): that user must never make root write, read, chown or signal anything outside
//! what they own. Each attack is planted as the home's owner would plant it (files and links
//! owned by them, created here by root and handed over with `lchown`), then the real binary
//! runs as root against the home.
//!
//! Needs root and `useradd` (a second user made for each lab, with a unique name, and removed
//! with it: `testkit::users::TempUser`); under `CI` a missing one fails the test.
#![cfg(target_os = "linux")]

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use gatewarden_testkit::users::TempUser;
use gatewarden_testkit::{CliOutput, cli_with, lock_is_held, must_wait_until, pid_alive, proc_start_time};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_gatewarden")
}

/// A lab: a traversable temp folder with `home/` owned by the attacker (0755) and a
/// root-only `secret` file and `rootdir/` folder beside it.
struct Lab {
    dir: tempfile::TempDir,
    uid: u32,
    gid: u32,
    children: Vec<Child>,
    /// Removed last, once its processes and files are gone.
    _user: TempUser,
}

impl Lab {
    fn new() -> Option<Lab> {
        Lab::new_in(&std::env::temp_dir())
    }

    /// A lab whose folder is made in `parent`.
    fn new_in(parent: &Path) -> Option<Lab> {
        let user = TempUser::create()?;
        let (uid, gid) = user.ids();
        let dir = tempfile::tempdir_in(parent).expect("tempdir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let lab = Lab { dir, uid, gid, children: Vec::new(), _user: user };
        std::fs::create_dir(lab.home()).unwrap();
        std::fs::set_permissions(lab.home(), std::fs::Permissions::from_mode(0o755)).unwrap();
        lab.give(&lab.home());
        std::fs::write(lab.secret(), "TOPSECRET root only\n").unwrap();
        std::fs::set_permissions(lab.secret(), std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::create_dir(lab.rootdir()).unwrap();
        std::fs::set_permissions(lab.rootdir(), std::fs::Permissions::from_mode(0o700)).unwrap();
        Some(lab)
    }

    fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }
    fn secret(&self) -> PathBuf {
        self.dir.path().join("secret")
    }
    fn rootdir(&self) -> PathBuf {
        self.dir.path().join("rootdir")
    }

    /// Hands a planted path (a link itself, not its target) to the attacker.
    fn give(&self, p: &Path) {
        std::os::unix::fs::lchown(p, Some(self.uid), Some(self.gid)).unwrap();
    }

    /// Plants `rel` in the home as the attacker: a symlink to `target`.
    fn plant_link(&self, rel: &str, target: &Path) {
        let p = self.home().join(rel);
        std::os::unix::fs::symlink(target, &p).unwrap();
        self.give(&p);
    }

    fn mkdir(&self, rel: &str) -> PathBuf {
        let p = self.home().join(rel);
        std::fs::create_dir_all(&p).unwrap();
        self.give(&p);
        p
    }

    fn write(&self, rel: &str, text: &str) {
        let p = self.home().join(rel);
        std::fs::write(&p, text).unwrap();
        self.give(&p);
    }

    /// `gatewarden --hermes-home HOME <args>` as root, bounded.
    fn cli(&self, args: &[&str], env: &[(&str, &str)], timeout: Duration) -> CliOutput {
        let home = self.home();
        let mut all: Vec<&str> = vec!["--hermes-home", home.to_str().unwrap()];
        all.extend_from_slice(args);
        cli_with(bin(), &self.dir.path().join("native-unused"), &all, env, timeout)
    }

    /// A root process to be protected: `sleep` in its own group, killed with the lab.
    fn victim(&mut self) -> u32 {
        let child = Command::new("sleep").arg("300").process_group(0).spawn().expect("sleep");
        let pid = child.id();
        self.children.push(child);
        pid
    }

    /// The home owner's gateway: `… gateway run` with `HERMES_HOME` = the home, holding its
    /// lock, exiting 0 on SIGTERM; returns once it holds the lock.
    fn owners_gateway(&mut self) -> u32 {
        let home = self.home();
        let script = "import fcntl,signal,sys,time,os\n\
                      f=open(sys.argv[1]+'/gateway.lock','a'); fcntl.flock(f, fcntl.LOCK_EX)\n\
                      signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n\
                      open(sys.argv[1]+'/ready','w').write(str(os.getpid()))\n\
                      time.sleep(300)\n";
        let child = Command::new("python3")
            .args(["-c", script])
            .arg(&home)
            .args(["gateway", "run"])
            .env("HERMES_HOME", &home)
            .uid(self.uid)
            .gid(self.gid)
            .process_group(0)
            .stdin(Stdio::null())
            .spawn()
            .expect("python3");
        let pid = child.id();
        self.children.push(child);
        must_wait_until(Duration::from_secs(10), "the owner's gateway to hold its lock", || {
            home.join("ready").exists()
        });
        pid
    }

    fn assert_secret_untouched(&self) {
        let m = std::fs::metadata(self.secret()).unwrap();
        assert_eq!((m.uid(), m.mode() & 0o777), (0, 0o600), "the root-only file changed owner or mode");
        assert_eq!(std::fs::read_to_string(self.secret()).unwrap(), "TOPSECRET root only\n");
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for c in &mut self.children {
            // Each child leads its own group (flock's `sleep` included).
            // SAFETY: plain kill(2) of a group this lab created.
            unsafe { libc::kill(-(c.id() as libc::pid_t), libc::SIGKILL) };
            let _ = c.wait();
        }
    }
}

fn pid_record(pid: u32) -> String {
    let st = proc_start_time(pid).expect("start time");
    format!(r#"{{"pid": {pid}, "kind": "hermes-gateway", "argv": ["hermes", "gateway", "run"], "start_time": {st}}}"#)
}

/// Item 2: with `gateway.lock` missing, a `gateway.pid` naming root's process (its start
/// time is public) made a root `stop` kill it.
#[test]
fn stop_never_signals_a_process_named_only_by_a_planted_record() {
    let Some(mut lab) = Lab::new() else { return };
    let victim = lab.victim();
    lab.write("gateway.pid", &pid_record(victim));
    lab.write("gateway_state.json", &format!(r#"{{"pid": {victim}, "gateway_state": "starting"}}"#));
    let out = lab.cli(&["stop", "--timeout", "3"], &[], Duration::from_secs(30));
    assert!(pid_alive(victim), "root's process was signalled on the word of the user's record: {out:?}");
    assert_ne!(out.code, Some(0), "{out:?}");
    assert!(out.stderr.contains("not proven"), "the refusal names why: {out:?}");
    let status = lab.cli(&["status"], &[], Duration::from_secs(30));
    assert!(status.text_lc().contains("not this home's gateway"), "{status:?}");
}

/// Item 2, the lock variant: `gateway.lock` hard-linked to a file a root process locks.
#[test]
fn stop_never_signals_a_foreign_lock_holder_reached_through_a_hard_link() {
    let Some(mut lab) = Lab::new() else { return };
    let root_lock = lab.rootdir().join("daemon.lock");
    std::fs::write(&root_lock, "").unwrap();
    // A root daemon holding its own lock file (flock(1) keeps it for its child's lifetime).
    let child = Command::new("flock")
        .arg(&root_lock)
        .args(["sleep", "300"])
        .process_group(0)
        .spawn()
        .expect("flock(1) from util-linux");
    let daemon = child.id();
    lab.children.push(child);
    must_wait_until(Duration::from_secs(5), "the root daemon to hold its lock", || lock_is_held(&root_lock));
    std::fs::hard_link(&root_lock, lab.home().join("gateway.lock")).unwrap();
    lab.write("gateway.pid", &pid_record(daemon));
    let out = lab.cli(&["stop", "--timeout", "3"], &[], Duration::from_secs(30));
    assert!(pid_alive(daemon), "a root daemon was signalled through a planted hard link: {out:?}");
    assert_ne!(out.code, Some(0), "{out:?}");
    assert!(out.stderr.contains("not proven"), "{out:?}");
}

/// The control: a real gateway of the home's owner (argv `… gateway run`, `HERMES_HOME` = the
/// home, holding the lock) is still stopped by root.
#[test]
fn root_still_stops_the_owners_proven_gateway() {
    let Some(mut lab) = Lab::new() else { return };
    let home = lab.home();
    let pid = lab.owners_gateway();
    let out = lab.cli(&["stop", "--timeout", "5"], &[], Duration::from_secs(30));
    assert_eq!(out.code, Some(0), "{out:?}");
    must_wait_until(Duration::from_secs(5), "the owner's gateway to exit", || !pid_alive(pid));
    // What root wrote into the home belongs to the home's owner.
    for rel in ["gatewarden", "gatewarden/actions.jsonl"] {
        let m = std::fs::symlink_metadata(home.join(rel)).unwrap();
        assert_eq!(m.uid(), lab.uid, "{rel} belongs to the home's owner");
    }
}

/// Item 1: the marker's temp file was opened with create+truncate (following links), then
/// chowned to the home's owner. Planted links at every predictable temp name must stay
/// untouched, and the marker still lands, owned by the home's owner.
#[test]
fn the_marker_temp_file_never_follows_a_planted_link() {
    let Some(mut lab) = Lab::new() else { return };
    let home = lab.home();
    lab.owners_gateway();
    // The pid of the coming `stop` is unknown: plant the old name for the next pids.
    let next = std::fs::read_to_string("/proc/sys/kernel/ns_last_pid").unwrap().trim().parse::<u32>().unwrap();
    for pid in next..next + 400 {
        lab.plant_link(&format!(".gateway-planned-stop.json.gatewarden-{pid}"), &lab.secret());
    }
    // Not serving (no state file): marker and SIGTERM back to back; only the marker matters.
    let out = lab.cli(&["stop", "--timeout", "2", "--no-kill"], &[], Duration::from_secs(30));
    lab.assert_secret_untouched();
    let m = std::fs::symlink_metadata(home.join(".gateway-planned-stop.json")).expect("the marker was written");
    assert!(m.is_file() && m.uid() == lab.uid && m.mode() & 0o777 == 0o644, "the owner's readable marker: {out:?}");
    assert!(!out.stderr.contains("cannot write the planned-stop marker"), "{out:?}");
}

/// Item 3: `start` appended hermes's output through a linked `gatewarden/` folder or a linked
/// log; and a root `start` ran hermes as root against the user's configuration.
#[test]
fn start_writes_nothing_through_links_and_runs_hermes_as_the_owner() {
    let Some(lab) = Lab::new() else { return };
    let stub = lab.dir.path().join("hermes-stub");
    std::fs::write(&stub, "#!/bin/sh\necho \"stub ran as uid $(id -u)\"\nexit 1\n").unwrap();
    std::fs::set_permissions(&stub, std::fs::Permissions::from_mode(0o755)).unwrap();
    let env = [("GATEWARDEN_HERMES", stub.to_str().unwrap())];

    // (a) `gatewarden/` is a link to a root-only folder.
    lab.plant_link("gatewarden", &lab.rootdir());
    let out = lab.cli(&["start", "--timeout", "5"], &env, Duration::from_secs(30));
    assert_ne!(out.code, Some(0), "{out:?}");
    assert_eq!(std::fs::read_dir(lab.rootdir()).unwrap().count(), 0, "root wrote through the linked folder: {out:?}");
    assert!(out.text_lc().contains("link"), "the refusal says why: {out:?}");
    std::fs::remove_file(lab.home().join("gatewarden")).unwrap();

    // (b) the log itself is a link to a root-only file.
    lab.mkdir("gatewarden");
    lab.plant_link("gatewarden/gateway-stdio.log", &lab.secret());
    let out = lab.cli(&["start", "--timeout", "5"], &env, Duration::from_secs(30));
    assert_ne!(out.code, Some(0), "{out:?}");
    lab.assert_secret_untouched();
    std::fs::remove_file(lab.home().join("gatewarden/gateway-stdio.log")).unwrap();

    // (c) a clean home: hermes runs as the home's owner, its log belongs to them.
    let out = lab.cli(&["start", "--timeout", "5"], &env, Duration::from_secs(30));
    assert_ne!(out.code, Some(0), "the stub exits 1: {out:?}");
    let log = lab.home().join("gatewarden/gateway-stdio.log");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains(&format!("stub ran as uid {}", lab.uid)), "hermes ran as root: {text}");
    let m = std::fs::metadata(&log).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o777), (lab.uid, 0o600));
}

/// Item 4: FIFOs at hermes's log names hung `history` and `logs`; `logs` printed a linked
/// root-only file, and so would a linked `logs/` folder.
#[test]
fn history_and_logs_refuse_fifos_and_links() {
    let Some(lab) = Lab::new() else { return };
    let logs = lab.mkdir("logs");
    for name in ["gateway-exit-diag.log", "gateway.log"] {
        rustix::fs::mkfifoat(rustix::fs::CWD, logs.join(name), rustix::fs::Mode::from_raw_mode(0o644)).unwrap();
        lab.give(&logs.join(name));
    }
    // A hang is the failure: each verb is bounded well above its normal few milliseconds.
    let history = lab.cli(&["history"], &[], Duration::from_secs(10));
    assert_eq!(history.code, Some(0), "{history:?}");
    let out = lab.cli(&["logs"], &[], Duration::from_secs(10));
    assert_ne!(out.code, Some(0), "a FIFO is not a log: {out:?}");
    assert!(out.stderr.contains("not a regular file"), "{out:?}");

    std::fs::remove_file(logs.join("gateway.log")).unwrap();
    lab.plant_link("logs/gateway.log", &lab.secret());
    let out = lab.cli(&["logs"], &[], Duration::from_secs(10));
    assert!(!out.stdout.contains("TOPSECRET"), "printed a linked root-only file: {out:?}");
    assert_ne!(out.code, Some(0), "{out:?}");

    // The folder itself linked to a root-only folder holding a `gateway.log`.
    std::fs::write(lab.rootdir().join("gateway.log"), "TOPSECRET in a root folder\n").unwrap();
    std::fs::remove_dir_all(&logs).unwrap();
    lab.plant_link("logs", &lab.rootdir());
    let out = lab.cli(&["logs"], &[], Duration::from_secs(10));
    assert!(!out.stdout.contains("TOPSECRET"), "printed through a linked folder: {out:?}");
    let history = lab.cli(&["history", "--json"], &[], Duration::from_secs(10));
    assert!(!history.stdout.contains("TOPSECRET"), "{history:?}");
}

/// Item 5: a system unit for a home of another user ran supervise and hermes as root.
#[test]
fn a_system_unit_for_another_users_home_runs_as_that_user() {
    let Some(lab) = Lab::new() else { return };
    let out =
        lab.cli(&["service", "install", "--system", "--print", "--hermes", "/bin/true"], &[], Duration::from_secs(30));
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stdout.contains(&format!("User={}\nGroup={}\n", lab.uid, lab.gid)), "{}", out.stdout);
    // A user unit of root's manager would run hermes as root against the user's home.
    let out = lab.cli(&["service", "install", "--print", "--hermes", "/bin/true"], &[], Duration::from_secs(30));
    assert_ne!(out.code, Some(0), "{out:?}");
    assert!(out.stderr.contains("--system"), "{out:?}");
}

/// A command of the attacker's choosing, recorded as hermes's argv: when run, it appends the
/// uid it runs as to `drop/ran` (a sticky folder anyone can write) and exits 1.
fn plant_command(lab: &Lab) -> (PathBuf, PathBuf) {
    let drop = lab.dir.path().join("drop");
    std::fs::create_dir(&drop).unwrap();
    std::fs::set_permissions(&drop, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let ran = drop.join("ran");
    let evil = lab.dir.path().join("evil.sh");
    std::fs::write(
        &evil,
        format!("#!/bin/sh\nid -u >> {}\necho \"evil ran as uid $(id -u)\"\nexit 1\n", ran.display()),
    )
    .unwrap();
    std::fs::set_permissions(&evil, std::fs::Permissions::from_mode(0o755)).unwrap();
    (evil, ran)
}

fn argv_record(program: &Path) -> String {
    format!(
        r#"{{"pid": 999999, "kind": "hermes-gateway", "argv": ["{}", "gateway", "run"], "start_time": 1}}"#,
        program.display()
    )
}

/// No `hermes` on PATH: only a recorded argv could run.
const NO_HERMES: [(&str, &str); 1] = [("PATH", "/usr/bin:/bin")];

/// Issue 31 item 1: the owner links `hh` to a root-owned, world-writable folder (like
/// /var/tmp) and writes a `gateway.pid` there whose argv is any command ending in `gateway
/// run`. Root's `start` executed it as uid 0, and `service install --system` wrote a unit with
/// no `User=`. The linked home, and the shared folder named directly, are refused.
#[test]
fn a_linked_or_world_writable_hermes_home_is_refused() {
    let Some(lab) = Lab::new() else { return };
    let (evil, ran) = plant_command(&lab);
    let shared = lab.dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    std::fs::write(shared.join("gateway.pid"), argv_record(&evil)).unwrap();
    std::os::unix::fs::lchown(shared.join("gateway.pid"), Some(lab.uid), Some(lab.gid)).unwrap();
    lab.plant_link("hh", &shared);
    let hh = lab.home().join("hh");
    let cli = |home: &Path, args: &[&str]| {
        let mut all = vec!["--hermes-home", home.to_str().unwrap()];
        all.extend_from_slice(args);
        cli_with(bin(), &lab.dir.path().join("native-unused"), &all, &NO_HERMES, Duration::from_secs(30))
    };
    for home in [hh.clone(), PathBuf::from(format!("{}/", hh.display()))] {
        let out = cli(&home, &["start", "--timeout", "5"]);
        assert_ne!(out.code, Some(0), "{out:?}");
        assert!(out.stderr.contains("symbolic link"), "the refusal says why: {out:?}");
        let out = cli(&home, &["service", "install", "--system", "--print", "--hermes", "/bin/true"]);
        assert_ne!(out.code, Some(0), "a unit for a linked home: {out:?}");
        assert!(out.stderr.contains("symbolic link"), "{out:?}");
    }
    let out = cli(&shared, &["start", "--timeout", "5"]);
    assert_ne!(out.code, Some(0), "{out:?}");
    assert!(out.stderr.contains("writable by group or others (mode 1777)"), "{out:?}");
    let out = cli(&shared, &["stop"]);
    assert!(out.stderr.contains("writable by group or others"), "every verb refuses it: {out:?}");
    // Writable by its group alone is refused the same way (a group is other people too).
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o775)).unwrap();
    let out = cli(&shared, &["start", "--timeout", "5"]);
    assert_ne!(out.code, Some(0), "{out:?}");
    assert!(out.stderr.contains("writable by group or others (mode 775)"), "{out:?}");
    assert!(!ran.exists(), "the planted command ran: {:?}", std::fs::read_to_string(&ran));
}

/// Issue 31 item 1: a recorded argv never runs with more rights than whoever could write the
/// record. A home of root's whose `gateway.pid` (root's) sits below a folder the user owns
/// (the user could have swapped the home): root's `start` does not run it. A user's home and
/// record: the argv runs, as that user. And a system unit always names its user, root's too.
#[test]
fn a_recorded_argv_runs_only_with_the_rights_of_whoever_could_write_it() {
    let Some(lab) = Lab::new() else { return };
    let (evil, ran) = plant_command(&lab);
    let env = NO_HERMES;

    // A root-owned home in a folder of the user's.
    let userdir = lab.mkdir("../userdir");
    let root_home = userdir.join("roothome");
    std::fs::create_dir(&root_home).unwrap();
    std::fs::set_permissions(&root_home, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(root_home.join("gateway.pid"), argv_record(&evil)).unwrap();
    let args = ["--hermes-home", root_home.to_str().unwrap(), "start", "--timeout", "5"];
    let out = cli_with(bin(), &lab.dir.path().join("native-unused"), &args, &env, Duration::from_secs(30));
    assert_ne!(out.code, Some(0), "{out:?}");
    assert!(!ran.exists(), "root ran a record others could have written: {:?}", std::fs::read_to_string(&ran));
    assert!(out.stderr.contains("is not run"), "the refusal says why: {out:?}");
    let unit = cli_with(
        bin(),
        &lab.dir.path().join("native-unused"),
        &[
            "--hermes-home",
            root_home.to_str().unwrap(),
            "service",
            "install",
            "--system",
            "--print",
            "--hermes",
            "/bin/true",
        ],
        &[],
        Duration::from_secs(30),
    );
    assert_eq!(unit.code, Some(0), "{unit:?}");
    assert!(unit.stdout.contains("User=0\nGroup=0\n"), "a system unit names its user, root too: {}", unit.stdout);

    // The user's own home and record: it runs, as the user.
    lab.write("gateway.pid", &argv_record(&evil));
    let out = lab.cli(&["start", "--timeout", "5"], &env, Duration::from_secs(30));
    assert_ne!(out.code, Some(0), "the command exits 1: {out:?}");
    let uids = std::fs::read_to_string(&ran).unwrap_or_default();
    assert_eq!(uids.trim(), lab.uid.to_string(), "the user's record runs as the user, and only that: {out:?}");
}

/// The control: a record in a home that only root can change (every folder above it root's,
/// none writable by others) is root's own, and root's `start` runs it.
#[test]
fn root_runs_the_record_of_a_home_only_root_can_write() {
    let Some(lab) = Lab::new_in(Path::new("/run")) else { return };
    let (evil, ran) = plant_command(&lab);
    let home = lab.dir.path().join("roothome");
    std::fs::create_dir(&home).unwrap();
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(home.join("gateway.pid"), argv_record(&evil)).unwrap();
    let args = ["--hermes-home", home.to_str().unwrap(), "start", "--timeout", "5"];
    let out = cli_with(bin(), &lab.dir.path().join("native-unused"), &args, &NO_HERMES, Duration::from_secs(30));
    assert_ne!(out.code, Some(0), "the command exits 1: {out:?}");
    assert_eq!(std::fs::read_to_string(&ran).unwrap_or_default().trim(), "0", "{out:?}");
}
