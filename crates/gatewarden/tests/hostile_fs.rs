//! Hostile files and the control-socket folder (issue 8, findings 1, 2 and 4, and the marker
//! item of 3): symlinks, foreign owners, wide modes, FIFOs, huge files and a swapped control
//! socket. Real processes throughout; the foreign-owner cases run commands as second users
//! created here (`useradd`, as root). Without root the second-user tests report it and skip,
//! except under `CI=true`, where that is a failure.
#![cfg(target_os = "linux")]

mod common;
use common::*;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Bound for CLI verbs that must never hang on a FIFO (the bug made them hang forever).
const NO_HANG: Duration = Duration::from_secs(15);

fn mkfifo(p: &Path) {
    // One mknod call: `mkfifo -m` chmods afterwards, racing a gateway that removes the FIFO.
    rustix::fs::mknodat(rustix::fs::CWD, p, rustix::fs::FileType::Fifo, rustix::fs::Mode::from(0o600), 0)
        .unwrap_or_else(|e| panic!("mkfifo {}: {e}", p.display()));
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

fn set_mode(p: &Path, m: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
}

/// A precious file outside the home that a planted symlink points at.
fn precious(home: &TempHome, content: &str) -> PathBuf {
    let p = home.scratch("precious", ".txt");
    std::fs::write(&p, content).unwrap();
    set_mode(&p, 0o644);
    p
}

#[track_caller]
fn assert_untouched(p: &Path, content: &str, m: u32) {
    assert_eq!(std::fs::read_to_string(p).unwrap(), content, "{} was written through a symlink", p.display());
    assert_eq!(mode(p), m, "{} was chmodded through a symlink", p.display());
}

// ---------------------------------------------------------------------------------------------
// Finding 1: symlinks and modes.

/// `gateway.lock -> precious`: `run` refuses (78, naming the path) and never truncates,
/// writes or chmods the target. Today's code truncated it, wrote the pid record and made it 0600.
#[test]
fn symlinked_lock_is_refused_with_78_and_its_target_untouched() {
    let home = TempHome::new();
    let target = precious(&home, "root's data\n");
    std::os::unix::fs::symlink(&target, home.lock_file()).unwrap();
    let mut g = builder(&home).spawn();
    let st = g.wait_exit(EXIT);
    assert_exit_code(&g, st, 78, "run with a symlinked gateway.lock");
    assert!(g.stderr().contains("gateway.lock") && g.stderr().contains("symbolic link"), "{}", g.diag());
    assert_untouched(&target, "root's data\n", 0o644);
    // status and stop do not follow it either, and do not hang.
    let out = cli_with(bin(), home.path(), &["status"], &[], NO_HANG);
    assert!(!out.panicked(), "{out:#?}");
    assert_untouched(&target, "root's data\n", 0o644);
}

/// Symlinks at the ledger, the pid record and the state file: the gateway runs,
/// and no target is ever written. Today the ledger's target got `started` lines appended.
#[test]
fn symlinked_records_and_ledger_are_never_written_through() {
    let home = TempHome::new();
    let names = ["lifecycle.jsonl", "gateway.pid", "gateway_state.json"];
    let targets: Vec<PathBuf> = names.iter().map(|_| precious(&home, "keep\n")).collect();
    for (n, t) in names.iter().zip(&targets) {
        std::os::unix::fs::symlink(t, home.file(n)).unwrap();
    }
    let mut g = start(&home);
    assert_pid_record_names(&home, &g);
    // The records were replaced by regular files (rename replaces the link itself).
    for n in ["gateway_state.json", "gateway.pid"] {
        assert!(std::fs::symlink_metadata(home.file(n)).unwrap().file_type().is_file(), "{n} is still a link");
    }
    stop_cleanly(&home, &mut g);
    for t in &targets {
        assert_untouched(t, "keep\n", 0o644);
    }
}

/// `config.toml -> elsewhere` is refused with 78 (it is not followed, whatever it points at).
#[test]
fn symlinked_config_is_refused() {
    let home = TempHome::new();
    let target = precious(&home, "drain_timeout_s = 5\n");
    std::os::unix::fs::symlink(&target, home.file("config.toml")).unwrap();
    let mut g = builder(&home).spawn();
    let st = g.wait_exit(EXIT);
    assert_exit_code(&g, st, 78, "run with a symlinked config.toml");
    assert!(g.stderr().contains("symbolic link"), "{}", g.diag());
}

/// `run --home DIR` on an existing group/world-writable directory refuses (78) and never
/// changes its mode: a 1777 directory used to become 0700 (which breaks `/tmp` for everyone).
/// A safe existing mode (0755) is kept as it is; only a home `run` creates is made 0700.
#[test]
fn existing_home_modes_are_never_changed_and_wide_ones_refused() {
    for wide in [0o1777, 0o777, 0o770] {
        let home = TempHome::new();
        set_mode(home.path(), wide);
        let mut g = builder(&home).spawn();
        let st = g.wait_exit(EXIT);
        assert_exit_code(&g, st, 78, &format!("run in a {wide:o} home"));
        assert!(g.stderr().contains("writable by group or others"), "{}", g.diag());
        assert_eq!(mode(home.path()), wide, "the home's mode was changed");
        assert!(!home.lock_file().exists(), "nothing may be created in a refused home");
    }
    let home = TempHome::new();
    set_mode(home.path(), 0o755);
    let mut g = start(&home);
    stop_cleanly(&home, &mut g);
    assert_eq!(mode(home.path()), 0o755);

    let fresh = TempHome::uncreated();
    let mut g = start(&fresh);
    stop_cleanly(&fresh, &mut g);
    assert_eq!(mode(fresh.path()), 0o700);
}

// ---------------------------------------------------------------------------------------------
// Second users.

/// The uid and gid of a test user, created if missing (as root). `None` (after saying why)
/// when that is impossible outside CI; a panic under `CI=true`.
fn test_user(name: &str) -> Option<(u32, u32)> {
    let lookup = || -> Option<(u32, u32)> {
        let out = Command::new("getent").args(["passwd", name]).output().ok()?;
        let line = String::from_utf8_lossy(&out.stdout).into_owned();
        let f: Vec<&str> = line.trim().split(':').collect();
        Some((f.get(2)?.parse().ok()?, f.get(3)?.parse().ok()?))
    };
    if let Some(ids) = lookup() {
        return Some(ids);
    }
    let why = if rustix::process::geteuid().is_root() {
        // Exit 9: created concurrently by another test; the lookup below decides.
        let _ = Command::new("useradd")
            .args(["--system", "--no-create-home", "--user-group", "--shell", "/usr/sbin/nologin", name])
            .status();
        match lookup() {
            Some(ids) => return Some(ids),
            None => format!("useradd {name} failed"),
        }
    } else {
        "not root, cannot create a second user".to_string()
    };
    gatewarden_testkit::unavailable("a second user", &why)
}

/// A command run as `uid:gid` (setpriv execs directly, so killing the child kills the command).
fn as_user(ids: (u32, u32), program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new("setpriv");
    c.arg(format!("--reuid={}", ids.0)).arg(format!("--regid={}", ids.1)).arg("--clear-groups").arg("--");
    c.arg(program);
    gatewarden_testkit::test_env(&mut c);
    c
}

/// Runs `cmd` to completion within `timeout`; (code, stdout + stderr).
#[track_caller]
fn output_within(mut cmd: Command, timeout: Duration) -> (Option<i32>, String) {
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = cmd.spawn().expect("spawn");
    let pid = child.id();
    let waiter = std::thread::spawn(move || child.wait_with_output());
    let start = Instant::now();
    while !waiter.is_finished() {
        if start.elapsed() > timeout {
            let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
            panic!("{cmd:?} did not finish within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = waiter.join().unwrap().expect("wait");
    (out.status.code(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// Kills and reaps on drop.
struct Owned(Child);

impl Drop for Owned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Another user creates a directory in a shared (1777) folder and plants
/// `gateway.lock -> a root-only file` in it. Root's `run --home` there refuses (78, naming the
/// owner) and the file is untouched. Today root truncated it and wrote the pid record into it.
#[test]
fn a_home_owned_by_another_user_is_refused() {
    let Some(hostile) = test_user("gw-hostile") else { return };
    let scratch = TempHome::new();
    let shared = scratch.scratch("shared", "");
    std::fs::create_dir(&shared).unwrap();
    set_mode(scratch.root(), 0o755);
    set_mode(&shared, 0o1777);
    let target = precious(&scratch, "root only\n");
    set_mode(&target, 0o600);
    let home = shared.join("home");
    let mut mk = as_user(hostile, "sh");
    mk.arg("-c").arg(format!("mkdir -m 700 {0} && ln -s {1} {0}/gateway.lock", home.display(), target.display()));
    let (code, text) = output_within(mk, NO_HANG);
    assert_eq!(code, Some(0), "the second user's setup failed: {text}");
    assert_eq!(std::fs::metadata(&home).unwrap().uid(), hostile.0);

    let out = cli_with(bin(), &home, &["run", "--listen", "127.0.0.1:0"], &[], NO_HANG);
    assert_eq!(out.code, Some(78), "{out:#?}");
    assert!(out.text_lc().contains(&format!("owned by uid {}", hostile.0)), "{out:#?}");
    assert_untouched(&target, "root only\n", 0o600);
    // And the shared folder itself (like `--home /tmp`) is refused without a chmod.
    let out = cli_with(bin(), &shared, &["run", "--listen", "127.0.0.1:0"], &[], NO_HANG);
    assert_eq!(out.code, Some(78), "{out:#?}");
    assert_eq!(mode(&shared), 0o1777);
}

/// A home path too long for `sun_path`: the socket goes to the short folder.
fn long_home(root: &Path) -> PathBuf {
    let mut p = root.join("long");
    while p.as_os_str().len() < 120 {
        p = p.join("deeper-directory-level");
    }
    p
}

const FAKE_SERVER: &str = r#"
import json, os, socket, sys
path = sys.argv[1]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(path)
os.chmod(path, 0o777)
s.listen(8)
while True:
    c, _ = s.accept()
    c.sendall(b'{"proto":"gatewarden-control","v":1,"version":"6.6.6","pid":1,"incarnation":"fake"}\n')
    f = c.makefile("rb")
    for line in f:
        c.sendall(b'{"ok":true,"result":{"accepted":true,"running":true,"pid":1,"version":"6.6.6","state":"running"}}\n')
    c.close()
"#;

/// The socket swap: another user pre-creates `/tmp/gatewarden-<uid>/` with a fake control
/// server at the victim's socket name. Today the victim's `status` printed "pid 1, version
/// 6.6.6" and `stop` ended in SIGKILL. Now: `run` refuses the folder (78) unless
/// `XDG_RUNTIME_DIR` gives it a private one; `status` and `stop` (which compute the /tmp path
/// when XDG_RUNTIME_DIR is unset) refuse to talk to the fake and say why, and `stop` still
/// drains the real gateway (exit 0) through the marker + SIGTERM path.
#[test]
fn a_swapped_control_socket_is_never_believed() {
    let Some(hostile) = test_user("gw-hostile") else { return };
    let Some(victim) = test_user("gw-victim") else { return };
    let python = ["/usr/bin/python3", "/usr/local/bin/python3"].into_iter().find(|p| Path::new(p).exists());
    let Some(python) = python else {
        gatewarden_testkit::unavailable::<()>("python3", "no system python3 for the fake server");
        return;
    };
    let scratch = TempHome::new();
    set_mode(scratch.root(), 0o755);
    let base = scratch.scratch("victim", "");
    std::fs::create_dir(&base).unwrap();
    std::os::unix::fs::chown(&base, Some(victim.0), Some(victim.1)).unwrap();
    let home = long_home(&base);
    let mut mk = as_user(victim, "mkdir");
    mk.arg("-p").arg("-m").arg("700").arg(&home);
    assert_eq!(output_within(mk, NO_HANG).0, Some(0));
    let run_dir = base.join("xdg");
    let mut mk = as_user(victim, "mkdir");
    mk.arg("-m").arg("700").arg(&run_dir);
    assert_eq!(output_within(mk, NO_HANG).0, Some(0));

    // The attacker's folder and fake server at the victim's /tmp socket name.
    let short = PathBuf::from(format!("/tmp/gatewarden-{}", victim.0));
    let _ = Command::new("rm").arg("-rf").arg(&short).status();
    // Removed however the test ends: it is the test user's well-known folder.
    let _cleanup = RemoveOnDrop(short.clone());
    let hash = gatewarden_control::endpoint::fnv1a(home.to_string_lossy().as_bytes());
    let fake_sock = short.join(format!("{hash:016x}.sock"));
    let mut mk = as_user(hostile, "mkdir");
    mk.arg("-m").arg("777").arg(&short);
    assert_eq!(output_within(mk, NO_HANG).0, Some(0), "attacker cannot create {}", short.display());
    let mut fake = as_user(hostile, python);
    fake.arg("-c").arg(FAKE_SERVER).arg(&fake_sock).stdin(Stdio::null());
    let _fake = Owned(fake.spawn().expect("spawn the fake server"));
    must_wait_until(Duration::from_secs(10), "the fake socket exists", || fake_sock.exists());

    let victim_cli = |args: &[&str], xdg: &Path| {
        let mut c = as_user(victim, bin());
        c.arg("--home").arg(&home).args(args).env("XDG_RUNTIME_DIR", xdg);
        output_within(c, Duration::from_secs(40))
    };

    // Without a private runtime dir, start-up refuses the attacker's folder and says why.
    let (code, text) = victim_cli(&["run", "--listen", "127.0.0.1:0"], Path::new(""));
    assert_eq!(code, Some(78), "{text}");
    assert!(text.contains(&format!("owned by uid {}", hostile.0)), "{text}");

    // With XDG_RUNTIME_DIR, the gateway binds in $XDG_RUNTIME_DIR/gatewarden.
    let log = std::fs::File::create(scratch.scratch("victim-gw", ".log")).unwrap();
    let mut run = as_user(victim, bin());
    run.arg("--home").arg(&home).args(["run", "--listen", "127.0.0.1:0"]).env("XDG_RUNTIME_DIR", &run_dir);
    run.stdin(Stdio::null()).stdout(log.try_clone().unwrap()).stderr(log);
    let mut gw = Owned(run.spawn().expect("spawn the victim's gateway"));
    let state = home.join("gateway_state.json");
    must_wait_until(READY, "the victim's gateway is running", || {
        std::fs::read(&state).is_ok_and(|b| String::from_utf8_lossy(&b).contains("\"running\""))
    });
    let control = String::from_utf8_lossy(&std::fs::read(&state).unwrap()).into_owned();
    assert!(control.contains(&run_dir.join("gatewarden").to_string_lossy().into_owned()), "{control}");

    // status and stop from a shell without XDG_RUNTIME_DIR find the attacker's socket: refused.
    let (_, text) = victim_cli(&["status"], Path::new(""));
    assert!(!text.contains("6.6.6"), "status believed the fake server:\n{text}");
    assert!(text.contains("refusing to talk to the control endpoint"), "{text}");
    assert!(text.contains(&format!("owned by uid {}", hostile.0)), "{text}");

    let (code, text) = victim_cli(&["stop", "--timeout", "20"], Path::new(""));
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("refusing to talk to the control endpoint"), "{text}");
    let start = Instant::now();
    let st: ExitStatus = loop {
        if let Some(st) = gw.0.try_wait().unwrap() {
            break st;
        }
        assert!(start.elapsed() < EXIT, "the victim's gateway did not exit after stop");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(st.code(), Some(0), "the gateway must drain and exit 0 (planned stop), not be killed: {st}");
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

// ---------------------------------------------------------------------------------------------
// Finding 4: FIFOs, devices, huge files.

/// FIFOs at every file `status`, `stop` and `run` read: nothing hangs. `run` replaces the
/// records (rename replaces a FIFO) and serves; `status`/`stop` report "unreadable".
#[test]
fn fifos_never_hang_status_stop_or_run() {
    let home = TempHome::new();
    for n in ["gateway.pid", "gateway_state.json", "supervise_state.json"] {
        mkfifo(&home.file(n));
    }
    let out = cli_with(bin(), home.path(), &["status"], &[], NO_HANG);
    assert!(!out.panicked() && out.code.is_some(), "{out:#?}");
    let out = cli_with(bin(), home.path(), &["stop", "--timeout", "5"], &[], NO_HANG);
    assert!(!out.panicked() && out.code.is_some(), "{out:#?}");

    let mut g = builder(&home).spawn();
    // The testkit reads the records with plain reads: let the gateway replace the FIFOs first.
    must_wait_until(READY, "the gateway replaced the FIFO records", || {
        ["gateway.pid", "gateway_state.json"]
            .iter()
            .all(|n| std::fs::symlink_metadata(home.file(n)).is_ok_and(|m| m.file_type().is_file()))
    });
    g.wait_ready(READY);
    assert_pid_record_names(&home, &g);
    let out = cli_with(bin(), home.path(), &["status"], &[], NO_HANG);
    assert_cli(&out, 0, "status with a FIFO supervise_state.json");
    assert!(out.stdout.contains("not a regular file"), "{out:#?}");
    stop_cleanly(&home, &mut g);
}

/// A FIFO config.toml: `run` refuses it (78) at once instead of blocking while holding nothing,
/// and `status` does not hang on it.
#[test]
fn a_fifo_config_is_refused_not_read() {
    let home = TempHome::new();
    mkfifo(&home.file("config.toml"));
    let mut g = builder(&home).spawn();
    let st = g.try_wait_exit(NO_HANG).unwrap_or_else(|| panic!("run hung on a FIFO config.toml\n{}", g.diag()));
    assert_exit_code(&g, st, 78, "run with a FIFO config.toml");
    assert!(g.stderr().contains("FIFO"), "{}", g.diag());
    let out = cli_with(bin(), home.path(), &["status"], &[], NO_HANG);
    assert!(!out.panicked() && out.code.is_some(), "{out:#?}");
}

/// A FIFO planted as the planned-stop marker of a running gateway: removed as not a regular
/// file; the main loop keeps going, and a later `stop` is a clean drain (exit 0), not a kill.
#[test]
fn a_fifo_marker_never_blocks_the_main_loop() {
    let home = TempHome::new();
    let mut g = start(&home);
    mkfifo(&home.planned_stop_marker());
    must_wait_until(Duration::from_secs(5), "the FIFO marker is removed", || {
        std::fs::symlink_metadata(home.planned_stop_marker()).is_err()
    });
    assert!(serving(&mut g), "{}", g.diag());
    let out = cli_with(bin(), home.path(), &["stop", "--timeout", "10"], &[], NO_HANG);
    assert_cli(&out, 0, "stop after a FIFO marker");
    let st = g.wait_exit(EXIT);
    assert_exit_code(&g, st, 0, "a planned stop after a FIFO marker");
}

/// A 1 GB sparse config.toml is refused from its size (78), never allocated; `status` does
/// not abort on it either.
#[test]
fn a_huge_config_is_refused_from_its_size() {
    let home = TempHome::new();
    std::fs::File::create(home.file("config.toml")).unwrap().set_len(1 << 30).unwrap();
    let mut g = builder(&home).spawn();
    let st = g.wait_exit(EXIT);
    assert_exit_code(&g, st, 78, "run with a 1 GB config.toml");
    assert!(g.stderr().contains("larger than"), "{}", g.diag());
    let out = cli_with(bin(), home.path(), &["status"], &[], NO_HANG);
    assert!(!out.panicked() && out.code.is_some(), "{out:#?}");
}

/// `history -n 1` on a 200 MB ledger reads the tail only: its peak RSS stays far below the
/// file size (it used 414 MB).
#[test]
fn history_reads_only_the_tail_of_a_huge_ledger() {
    let home = TempHome::new();
    let ledger = home.ledger();
    let mut line = Vec::new();
    for i in 0..1000 {
        line.extend_from_slice(
            format!("{{\"ts\":\"2026-01-01T00:00:00Z\",\"event\":\"filler\",\"n\":{i}}}\n").as_bytes(),
        );
    }
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&ledger).unwrap();
        while f.metadata().unwrap().len() < 200 << 20 {
            f.write_all(&line).unwrap();
        }
        f.write_all(b"{\"ts\":\"2026-01-01T00:00:01Z\",\"event\":\"the_last_one\"}\n").unwrap();
    }
    let before = children_peak_rss_kib();
    let out = cli_with(bin(), home.path(), &["history", "-n", "1", "--json"], &[], NO_HANG);
    assert_cli(&out, 0, "history -n 1");
    assert!(out.stdout.contains("the_last_one") && !out.stdout.contains("filler"), "{out:#?}");
    let peak_kib = children_peak_rss_kib();
    assert!(before < 64 * 1024, "an earlier child of this test already peaked at {before} KiB");
    assert!(peak_kib < 64 * 1024, "history peaked at {peak_kib} KiB on a 200 MB ledger");
}

/// The largest peak RSS of any reaped child of this test process, in KiB.
fn children_peak_rss_kib() -> i64 {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) }, 0);
    ru.ru_maxrss
}

/// A `/dev/zero` link or a device node at the pid record is refused, not read until OOM.
#[test]
fn devices_and_links_to_devices_are_refused() {
    let home = TempHome::new();
    std::os::unix::fs::symlink("/dev/zero", home.pid_file()).unwrap();
    let st = Command::new("mknod").arg(home.state_file()).args(["c", "1", "5"]).status();
    let out = cli_with(bin(), home.path(), &["status", "--json"], &[], NO_HANG);
    assert!(!out.panicked() && out.code.is_some(), "{out:#?}");
    let v = out.json();
    assert!(v["files"]["pid"].as_str().is_some_and(|s| s.contains("symbolic link")), "{v}");
    if st.is_ok_and(|s| s.success()) {
        assert!(v["files"]["state"].as_str().is_some_and(|s| s.contains("not a regular file")), "{v}");
    }
}
