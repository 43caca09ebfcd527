//! A real XMPP server for tests: Debian's prosody (0.12), one per test, from a private config in
//! its own temp dir (data, pid file, log), listening for clients on a free loopback port with
//! STARTTLS required, a certificate from the test's CA, SCRAM-SHA-1 over hashed storage, the
//! message archive for every account (`mam`, archiving by default), stream management
//! (`smacks`), a MUC service (`muc` with `muc_mam`, rooms persistent and logged) and HTTP file
//! upload (XEP-0363: `http_file_share` as `upload.localhost`, served over plain http on another
//! loopback port, [`Prosody::http_url`]; a test's gateway needs `http_files_on_loopback`). No
//! server-to-server, no https, and no offline storage (`mod_offline`): a direct message missed
//! while a client is away comes back only through the archive, so a test proves that path.
//!
//! Like the servers in [`crate::servers`] it runs in its own process group, killed on drop;
//! [`Prosody::stop`] / [`Prosody::restart`] keep the data (accounts, archives, rooms).
//!
//! Tests run as root here: the config says `run_as_root = true`, so neither `prosody` nor
//! `prosodyctl` switches to the `prosody` user (which could not read the temp dir).
//!
//! Where it comes from: `$GATEWARDEN_PROSODY`, else `prosody` on `PATH` (`scripts/setup-prosody`).
//! `start()` returns `None` with a `SKIPPED:` line when it is not installed; under `CI` it panics.

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::api::free_port;
use crate::servers::{Proc, tail, wait_ready};

/// prosody listens within about a second; the bound only guards a broken install.
const READY: Duration = Duration::from_secs(20);
/// The virtual host: accounts are `name@localhost`.
pub const DOMAIN: &str = "localhost";
/// The MUC service: rooms are `name@conference.localhost`.
pub const MUC_DOMAIN: &str = "conference.localhost";
/// The HTTP upload service (XEP-0363).
pub const UPLOAD_DOMAIN: &str = "upload.localhost";

/// A running (or stopped) prosody.
pub struct Prosody {
    dir: TempDir,
    bin: PathBuf,
    ctl: PathBuf,
    port: u16,
    http_port: u16,
    log: PathBuf,
    proc: Option<Proc>,
    startup: Duration,
}

fn binaries() -> Option<(PathBuf, PathBuf)> {
    let bin = match std::env::var_os("GATEWARDEN_PROSODY") {
        Some(p) => PathBuf::from(p),
        None => which("prosody")?,
    };
    let ctl = bin.with_file_name("prosodyctl");
    (bin.exists() && ctl.exists()).then_some((bin, ctl))
}

fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).chain([PathBuf::from("/usr/bin").join(name)]).find(|p| p.exists())
}

impl Prosody {
    /// Writes the config (presenting `cert_pem`, the chain, with `key_pem`, for
    /// [`DOMAIN`] and [`MUC_DOMAIN`]), starts `prosody -F` and waits for the port.
    pub fn start(cert_pem: &str, key_pem: &str) -> Option<Prosody> {
        let Some((bin, ctl)) = binaries() else {
            return crate::unavailable("prosody", "no prosody binary (run scripts/setup-prosody)");
        };
        let dir = tempfile::Builder::new().prefix("gw-prosody-").tempdir().expect("prosody temp dir");
        let port = free_port();
        let http_port = free_port();
        for sub in ["data", "certs"] {
            std::fs::create_dir(dir.path().join(sub)).expect("prosody dir");
        }
        let (cert, key) = (dir.path().join("certs/server.crt"), dir.path().join("certs/server.key"));
        std::fs::write(&cert, cert_pem).expect("write server.crt");
        std::fs::write(&key, key_pem).expect("write server.key");
        std::fs::write(dir.path().join("prosody.cfg.lua"), config(dir.path(), port, http_port)).expect("write prosody.cfg.lua");
        let log = dir.path().join("prosody.log");
        let mut s = Prosody { dir, bin, ctl, port, http_port, log, proc: None, startup: Duration::ZERO };
        s.launch();
        eprintln!("[testkit] prosody ready on {} in {:.3} s", s.addr(), s.startup.as_secs_f64());
        Some(s)
    }

    fn config_path(&self) -> PathBuf {
        self.dir.path().join("prosody.cfg.lua")
    }

    fn launch(&mut self) {
        assert!(self.proc.is_none(), "prosody already running");
        let _ = std::fs::remove_file(self.dir.path().join("prosody.pid"));
        let mut cmd = Command::new(&self.bin);
        cmd.arg("--config").arg(self.config_path()).arg("-F").current_dir(self.dir.path());
        let started = Instant::now();
        let mut proc = Proc::spawn(cmd, &self.log).expect("spawn prosody");
        let addr = self.addr();
        wait_ready("prosody", &mut proc, &self.log, READY, || {
            TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok()
        });
        self.startup = started.elapsed();
        self.proc = Some(proc);
    }

    /// Creates the account `user@localhost` (works while the server runs or not).
    pub fn register(&self, user: &str, password: &str) {
        let out = Command::new(&self.ctl)
            .arg("--config")
            .arg(self.config_path())
            .args(["register", user, DOMAIN, password])
            .current_dir(self.dir.path())
            .output()
            .expect("run prosodyctl");
        assert!(
            out.status.success(),
            "prosodyctl register {user}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The client port (STARTTLS required).
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// The plain-http base of the upload service's files, `http://127.0.0.1:<port>/`.
    pub fn http_url(&self) -> String {
        format!("http://127.0.0.1:{}/", self.http_port)
    }

    /// Time from spawn to an accepted connection, for the last (re)start.
    pub fn startup_time(&self) -> Duration {
        self.startup
    }

    /// Pid of the running server (`None` while stopped).
    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().map(Proc::pid)
    }

    /// Kills the server (SIGKILL to its group): every client connection breaks; the data stays.
    pub fn stop(&mut self) {
        if let Some(p) = self.proc.take() {
            p.kill();
        }
    }

    /// Stops (if running) and starts again on the same port with the same data.
    pub fn restart(&mut self) {
        self.stop();
        self.launch();
    }

    /// The server's log so far.
    pub fn log_tail(&self) -> String {
        tail(&self.log, 8000)
    }

    /// The temp dir (config, data, log).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Prosody {
    fn drop(&mut self) {
        self.stop();
    }
}

fn config(dir: &Path, port: u16, http_port: u16) -> String {
    let d = |name: &str| dir.join(name).to_string_lossy().into_owned();
    format!(
        r#"-- gatewarden test server (crates/testkit/src/prosody.rs): loopback only.
run_as_root = true
daemonize = false
pidfile = "{pid}"
data_path = "{data}"
certificates = "{certs}"
log = {{ {{ levels = {{ min = "info" }}, to = "console" }} }}
interfaces = {{ "127.0.0.1" }}
c2s_ports = {{ {port} }}
c2s_direct_tls_ports = {{ }}
legacy_ssl_ports = {{ }}
s2s_ports = {{ }}
component_ports = {{ }}
http_ports = {{ {http_port} }}
http_interfaces = {{ "127.0.0.1" }}
https_ports = {{ }}
https_interfaces = {{ }}
http_default_host = "{UPLOAD_DOMAIN}"
http_external_url = "http://127.0.0.1:{http_port}/"
c2s_require_encryption = true
allow_unencrypted_plain_auth = false
authentication = "internal_hashed"
storage = "internal"
modules_enabled = {{ "roster"; "saslauth"; "tls"; "disco"; "ping"; "mam"; "smacks"; "posix" }}
modules_disabled = {{ "s2s" }}
default_archive_policy = true
archive_expires_after = "never"
max_archive_query_results = 100
ssl = {{ certificate = "{cert}"; key = "{key}" }}

VirtualHost "{DOMAIN}"

Component "{MUC_DOMAIN}" "muc"
  modules_enabled = {{ "muc_mam" }}
  muc_room_locking = false
  muc_room_default_persistent = true
  muc_room_default_public = true
  muc_log_by_default = true
  muc_log_all_rooms = true
  muc_room_default_history_length = 0

Component "{UPLOAD_DOMAIN}" "http_file_share"
  http_file_share_size_limit = 4194304
"#,
        pid = d("prosody.pid"),
        data = d("data"),
        certs = d("certs"),
        cert = d("certs/server.crt"),
        key = d("certs/server.key"),
    )
}
