//! A real container runtime for the container and deploy tests: Debian's podman with runc,
//! set up by `scripts/setup-podman` (its containers.conf, the offline base images).
//!
//! [`Podman::get`] finds it (under `CI` a missing podman fails the test); [`Podman::image`]
//! builds the repository's Containerfile once per binary and test run, with the binary this
//! test build already made (`--build-arg BINARY=prebuilt`), under a lock so parallel tests
//! share one build; [`Container`] removes its container and volume when dropped. Every podman
//! call has a deadline.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Where `scripts/setup-podman` leaves its containers.conf and tarballs.
pub const CACHE: &str = "/var/cache/gatewarden-podman";
/// The Containerfile's runtime base, built offline by the setup script.
pub const BASE_IMAGE: &str = "docker.io/library/debian:bookworm-slim";
/// The deadline of one podman call (an image build included).
const CALL_LIMIT: Duration = Duration::from_secs(300);

/// What one podman call printed.
#[derive(Debug)]
pub struct Out {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    pub fn ok(&self) -> bool {
        self.code == Some(0)
    }
}

/// The podman CLI with this machine's settings.
#[derive(Debug, Clone)]
pub struct Podman {
    conf: PathBuf,
}

impl Podman {
    /// Podman, its containers.conf and the base image, or `None` (reported; a failure under
    /// `CI`) when `scripts/setup-podman` has not run.
    pub fn get() -> Option<Podman> {
        let conf =
            std::env::var_os("CONTAINERS_CONF").map(PathBuf::from).unwrap_or_else(|| Path::new(CACHE).join("containers.conf"));
        if !conf.is_file() {
            return crate::unavailable("podman", &format!("no {} (run scripts/setup-podman)", conf.display()));
        }
        let p = Podman { conf };
        match p.run(&["image", "exists", BASE_IMAGE]) {
            Some(o) if o.ok() => Some(p),
            Some(_) => crate::unavailable("podman", &format!("no {BASE_IMAGE} image (run scripts/setup-podman)")),
            None => crate::unavailable("podman", "the podman command cannot be run (run scripts/setup-podman)"),
        }
    }

    /// `podman ARGS`, within the call deadline; `None` when podman cannot be started.
    pub fn run(&self, args: &[&str]) -> Option<Out> {
        self.run_for(args, CALL_LIMIT)
    }

    /// `podman ARGS` within `limit` (killed past it).
    pub fn run_for(&self, args: &[&str], limit: Duration) -> Option<Out> {
        let mut cmd = Command::new("podman");
        cmd.args(args).env("CONTAINERS_CONF", &self.conf).stdin(Stdio::null());
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().ok()?;
        let (mut so, mut se) = (child.stdout.take()?, child.stderr.take()?);
        let out = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = so.read_to_string(&mut s);
            s
        });
        let err = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = se.read_to_string(&mut s);
            s
        });
        let t0 = Instant::now();
        let status = loop {
            if let Ok(Some(st)) = child.try_wait() {
                break Some(st);
            }
            if t0.elapsed() > limit {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        Some(Out {
            code: status.and_then(|s| s.code()),
            stdout: out.join().unwrap_or_default(),
            stderr: err.join().unwrap_or_default(),
        })
    }

    /// `podman ARGS` that must succeed; its stdout.
    #[track_caller]
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args).expect("podman runs");
        assert!(out.ok(), "podman {args:?} failed: {out:#?}");
        out.stdout
    }

    /// The image of the repository's Containerfile with `binary` in it (the prebuilt-binary
    /// stage), built once per binary: the tag carries the binary's size and modification time,
    /// and a lock file makes parallel tests wait for the one build.
    pub fn image(&self, binary: &Path) -> String {
        let meta = std::fs::metadata(binary).expect("the gatewarden binary");
        let stamp = meta.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
        let tag = format!("localhost/gatewarden:test-{:x}-{:x}", meta.len(), stamp.map_or(0, |d| d.as_micros()));
        let lock_path = std::env::temp_dir().join("gatewarden-podman-image.lock");
        let lock = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&lock_path).expect("lock");
        lock.lock().expect("the image build lock");
        if self.run(&["image", "exists", &tag]).is_some_and(|o| o.ok()) {
            return tag;
        }
        let ctx = tempfile::tempdir().expect("build context");
        std::fs::copy(binary, ctx.path().join("gatewarden")).expect("copy the binary");
        let containerfile = repo_root().join("Containerfile");
        let t0 = Instant::now();
        self.ok(&[
            "build",
            "--format",
            "docker",
            "--build-arg",
            "BINARY=prebuilt",
            "-f",
            containerfile.to_str().unwrap_or_default(),
            "-t",
            &tag,
            ctx.path().to_str().unwrap_or_default(),
        ]);
        eprintln!("[podman] built {tag} in {:.1} s", t0.elapsed().as_secs_f64());
        tag
    }
}

/// The repository root (the Containerfile and deploy/ live there).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap_or_else(|_| PathBuf::from("../.."))
}

/// A unique name for this process's `n`-th object.
pub fn unique(what: &str) -> String {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("gwtest-{what}-{}-{n}", std::process::id())
}

/// A named container and its named volume; both removed on drop.
pub struct Container {
    pub podman: Podman,
    pub name: String,
    pub volume: String,
}

impl Container {
    /// `podman run -d --name NAME -v VOLUME:/data ARGS IMAGE CMD…` (a fresh named volume, so
    /// the image's /data ownership is copied into it).
    #[track_caller]
    pub fn run(podman: &Podman, args: &[&str], image: &str, cmd: &[&str]) -> Container {
        let c = Container { podman: podman.clone(), name: unique("c"), volume: unique("v") };
        let mount = format!("{}:/data", c.volume);
        let mut all = vec!["run", "-d", "--name", &c.name, "-v", &mount];
        all.extend_from_slice(args);
        all.push(image);
        all.extend_from_slice(cmd);
        podman.ok(&all);
        c
    }

    /// `podman exec NAME ARGS`.
    pub fn exec(&self, args: &[&str]) -> Out {
        let mut all = vec!["exec", self.name.as_str()];
        all.extend_from_slice(args);
        self.podman.run_for(&all, Duration::from_secs(120)).expect("podman exec")
    }

    /// The host address published for the container's port 7878 (`-p 127.0.0.1::7878`).
    #[track_caller]
    pub fn addr(&self) -> std::net::SocketAddr {
        let out = self.podman.ok(&["port", &self.name, "7878/tcp"]);
        out.lines().next().and_then(|l| l.trim().parse().ok()).unwrap_or_else(|| panic!("no published port: {out}"))
    }

    /// `podman inspect --format FORMAT NAME`, trimmed.
    pub fn inspect(&self, format: &str) -> String {
        self.podman.run(&["inspect", "--format", format, &self.name]).map(|o| o.stdout.trim().to_owned()).unwrap_or_default()
    }

    pub fn logs(&self) -> String {
        self.podman.run(&["logs", &self.name]).map(|o| format!("{}{}", o.stdout, o.stderr)).unwrap_or_default()
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = self.podman.run_for(&["rm", "-f", "-t", "0", &self.name], Duration::from_secs(60));
        let _ = self.podman.run_for(&["volume", "rm", "-f", &self.volume], Duration::from_secs(60));
    }
}
