//! Real chat servers for integration tests: [`Synapse`] (Matrix) and [`Ngircd`] (IRC).
//!
//! Each server runs from a private config in its own temp dir, on a free loopback port, in its
//! own process group, and is killed (the whole group, SIGKILL) on drop. On Linux the server also
//! gets `PR_SET_PDEATHSIG(SIGKILL)`, so a crashed test never leaves one behind.
//! [`Synapse::stop`] / [`Synapse::restart`] (and the same on [`Ngircd`]) kill the server and bring
//! it back on the same port with the same data, for reconnect tests.
//!
//! Where the servers come from (installed by `scripts/test`):
//! - Synapse: the venv built by `scripts/setup-synapse` (`$GATEWARDEN_SYNAPSE_VENV`, else
//!   `${XDG_CACHE_HOME:-$HOME/.cache}/gatewarden/synapse-venv`).
//! - ngIRCd: `$GATEWARDEN_NGIRCD`, else `ngircd` on `PATH`, else `/usr/sbin/ngircd`
//!   (`scripts/setup-ngircd`).
//!
//! `start()` returns `None` with a `SKIPPED:` line when the server is not installed; under `CI`
//! it panics instead, so a CI machine without the server fails rather than passes vacuously.

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gatewarden_lifecycle::platform;
use serde_json::{Value, json};
use tempfile::TempDir;

/// How long a first Synapse start (schema creation included) may take: 3.4 s measured on a
/// 2-core machine, 44 s and more than 60 s (nothing logged yet: still importing) with both
/// cores busy. The start is CPU-bound Python and [`wait_ready`] already ends at once when the
/// process exits, so this bound only catches a hang: it is about a slow machine, and generous.
const SYNAPSE_READY: Duration = Duration::from_secs(150);
/// ngIRCd listens within 0.05 s; the bound only guards a broken install.
const NGIRCD_READY: Duration = Duration::from_secs(10);
/// Matrix server name: user ids are `@name:localhost`. Federation is off, so it is never resolved.
pub const SYNAPSE_SERVER_NAME: &str = "localhost";

use crate::api::free_port;

/// Random bytes for secrets and keys (test-only; `/dev/urandom` on every Unix).
fn random_bytes<const N: usize>() -> [u8; N] {
    use std::io::Read;
    let mut b = [0u8; N];
    std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)).expect("read /dev/urandom");
    b
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Standard base64 without padding (the form Synapse writes signing keys in).
pub(crate) fn base64_unpadded(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, &b)| n | (u32::from(b) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

/// The last `max` bytes of a log file, for failure messages.
pub(crate) fn tail(path: &Path, max: usize) -> String {
    let raw = std::fs::read(path).unwrap_or_default();
    String::from_utf8_lossy(&raw[raw.len().saturating_sub(max)..]).into_owned()
}

/// A server process in its own process group; the group is SIGKILLed on [`Proc::kill`] / drop.
/// Shared with crate::browser (chromedriver and its browser).
pub(crate) struct Proc {
    child: Child,
}

impl Proc {
    pub(crate) fn spawn(mut cmd: Command, log: &Path) -> std::io::Result<Proc> {
        let out = std::fs::OpenOptions::new().create(true).append(true).open(log)?;
        cmd.stdin(Stdio::null()).stdout(out.try_clone()?).stderr(out);
        platform::spawn::own_process_group(&mut cmd);
        crate::proc::die_with_test(&mut cmd);
        Ok(Proc { child: cmd.spawn()? })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `Some(description)` once the process has exited.
    fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(s)) => Some(s.to_string()),
            Ok(None) => None,
            Err(e) => Some(format!("wait failed: {e}")),
        }
    }

    pub(crate) fn kill(mut self) {
        // The group id is the child's pid (its own group); the child is not reaped yet, so the id
        // cannot have been reused.
        platform::spawn::kill_process_group(self.child.id());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until `probe` succeeds, the process exits, or `deadline` passes; panics with the log
/// tail in the last two cases.
pub(crate) fn wait_ready(what: &str, proc: &mut Proc, log: &Path, deadline: Duration, mut probe: impl FnMut() -> bool) {
    let mut exited = None;
    let ready = crate::wait_until(deadline, || {
        if probe() {
            return true;
        }
        exited = proc.exited();
        exited.is_some()
    }) && exited.is_none();
    if !ready {
        let why = exited.map_or_else(|| format!("not ready after {deadline:?}"), |s| format!("exited ({s})"));
        panic!("{what} {why}; log tail:\n{}", tail(log, 4000));
    }
}

// ---------------------------------------------------------------------------------------------
// Synapse

/// A user registered on a [`Synapse`] through the shared-secret admin API.
#[derive(Debug, Clone)]
pub struct MatrixUser {
    /// `@localpart:localhost`.
    pub user_id: String,
    /// The localpart given to [`Synapse::register`].
    pub localpart: String,
    pub password: String,
    /// The access token the registration returned (its own device).
    pub access_token: String,
}

/// A Synapse homeserver: SQLite, `http://127.0.0.1:<port>`, client API only (no federation
/// listener, no key servers), registration by shared secret only, rate limits raised so tests
/// are not throttled.
pub struct Synapse {
    dir: TempDir,
    python: PathBuf,
    port: u16,
    shared_secret: String,
    log: PathBuf,
    proc: Option<Proc>,
    startup: Duration,
    /// The admin user behind [`Synapse::limit_messages`], registered on first use.
    admin: std::cell::OnceCell<MatrixUser>,
}

/// The venv `scripts/setup-synapse` builds.
pub fn synapse_venv() -> PathBuf {
    if let Some(v) = std::env::var_os("GATEWARDEN_SYNAPSE_VENV") {
        return PathBuf::from(v);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"));
    cache.join("gatewarden").join("synapse-venv")
}

impl Synapse {
    /// Generates a config, starts Synapse and waits for `/_matrix/client/versions`. `None` (with
    /// a `SKIPPED:` line) when the venv is missing, a panic under `CI`.
    pub fn start() -> Option<Synapse> {
        let venv = synapse_venv();
        let python = venv.join("bin").join("python");
        if !venv.join("bin").join("synapse_homeserver").exists() || !python.exists() {
            return crate::unavailable(
                "Synapse",
                &format!("no Synapse venv at {} (run scripts/setup-synapse)", venv.display()),
            );
        }
        let dir = tempfile::Builder::new().prefix("gw-synapse-").tempdir().expect("synapse temp dir");
        let port = free_port();
        let shared_secret = hex(&random_bytes::<24>());
        let config = synapse_config(dir.path(), port, &shared_secret);
        std::fs::write(dir.path().join("homeserver.yaml"), config).expect("write homeserver.yaml");
        // Written here rather than by `--generate-keys`, which would cost a second Python start.
        let key = format!("ed25519 a_test {}\n", base64_unpadded(&random_bytes::<32>()));
        std::fs::write(dir.path().join("signing.key"), key).expect("write signing.key");
        let log = dir.path().join("synapse.log");
        let mut s = Synapse {
            dir,
            python,
            port,
            shared_secret,
            log,
            proc: None,
            startup: Duration::ZERO,
            admin: std::cell::OnceCell::new(),
        };
        s.launch();
        eprintln!("[testkit] synapse ready on {} in {:.2} s", s.base_url(), s.startup.as_secs_f64());
        Some(s)
    }

    fn launch(&mut self) {
        assert!(self.proc.is_none(), "synapse already running");
        let mut cmd = Command::new(&self.python);
        cmd.args(["-m", "synapse.app.homeserver", "--config-path"])
            .arg(self.dir.path().join("homeserver.yaml"))
            .current_dir(self.dir.path());
        let started = Instant::now();
        let mut proc = Proc::spawn(cmd, &self.log).expect("spawn synapse");
        let addr = self.addr();
        wait_ready("synapse", &mut proc, &self.log, SYNAPSE_READY, || {
            crate::http_get(addr, "/_matrix/client/versions", Duration::from_secs(2)).is_ok_and(|r| r.status == 200)
        });
        self.startup = started.elapsed();
        self.proc = Some(proc);
    }

    /// `http://127.0.0.1:<port>`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr())
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// Time from spawn to the first successful `/versions` of the last (re)start.
    pub fn startup_time(&self) -> Duration {
        self.startup
    }

    /// Pid of the running server (`None` while stopped).
    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().map(Proc::pid)
    }

    /// Kills the server (SIGKILL to its group). Its data (SQLite) survives for [`Self::restart`].
    pub fn stop(&mut self) {
        if let Some(p) = self.proc.take() {
            p.kill();
        }
    }

    /// Stops (if running) and starts again on the same port with the same data.
    pub fn restart(&mut self) {
        self.stop();
        self.launch();
        eprintln!("[testkit] synapse restarted in {:.2} s", self.startup.as_secs_f64());
    }

    /// The server's log so far (stdout and stderr), its last 8 kB.
    pub fn log_tail(&self) -> String {
        tail(&self.log, 8000)
    }

    /// The server's log file (kept across restarts).
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Registers `localpart` with `password` through `/_synapse/admin/v1/register` (nonce, then
    /// HMAC-SHA1 over `nonce NUL user NUL password NUL notadmin` keyed by the shared secret).
    /// Panics on failure: it is test setup.
    pub fn register(&self, localpart: &str, password: &str) -> MatrixUser {
        self.register_as(localpart, password, false)
    }

    fn register_as(&self, localpart: &str, password: &str, admin: bool) -> MatrixUser {
        let path = "/_synapse/admin/v1/register";
        let t = Duration::from_secs(20);
        let r = crate::http_get(self.addr(), path, t).expect("GET register nonce");
        let body = r.json().expect("register nonce JSON");
        let nonce = body["nonce"].as_str().unwrap_or_else(|| panic!("no nonce in {body}"));
        let role = if admin { "admin" } else { "notadmin" };
        let msg = format!("{nonce}\0{localpart}\0{password}\0{role}");
        let mac = hex(&sha1::hmac(self.shared_secret.as_bytes(), msg.as_bytes()));
        let req = json!({
            "nonce": nonce, "username": localpart, "password": password, "admin": admin, "mac": mac,
        });
        let r = crate::http_post_json(self.addr(), path, &req, t).expect("POST register");
        let out: Value = r.json().expect("register JSON");
        assert_eq!(r.status, 200, "register {localpart}: {out}");
        let field = |k: &str| out[k].as_str().unwrap_or_else(|| panic!("no {k} in {out}")).to_string();
        MatrixUser {
            user_id: field("user_id"),
            localpart: localpart.to_string(),
            password: password.to_string(),
            access_token: field("access_token"),
        }
    }

    /// Gives `user_id` its own message rate limit (`messages_per_second`, `burst_count`; both
    /// at least 1, since 0 means unlimited) through the admin API, so a test can provoke a real
    /// 429 `M_LIMIT_EXCEEDED` while everyone else stays unthrottled. Registers an admin user on
    /// first use.
    pub fn limit_messages(&self, user_id: &str, per_second: u32, burst: u32) {
        assert!(per_second >= 1 && burst >= 1, "0 would mean no limit");
        let admin = self.admin.get_or_init(|| self.register_as("gw_admin", "gw-admin-pw", true));
        let user: String = user_id.bytes().map(|b| format!("%{b:02X}")).collect();
        let path = format!("/_synapse/admin/v1/users/{user}/override_ratelimit?access_token={}", admin.access_token);
        let req = json!({"messages_per_second": per_second, "burst_count": burst});
        let r =
            crate::http_post_json(self.addr(), &path, &req, Duration::from_secs(20)).expect("POST override_ratelimit");
        assert_eq!(r.status, 200, "override_ratelimit {user_id}: {}", r.text());
    }
}

impl Drop for Synapse {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `homeserver.yaml` as JSON (YAML is a superset of JSON, so no YAML writer is needed and no
/// value can break the syntax).
fn synapse_config(dir: &Path, port: u16, shared_secret: &str) -> String {
    let d = |name: &str| dir.join(name).to_string_lossy().into_owned();
    // Every limiter a test can hit, raised far above what a test sends.
    let lim = json!({"per_second": 10000, "burst_count": 10000});
    let cfg = json!({
        "server_name": SYNAPSE_SERVER_NAME,
        "pid_file": d("homeserver.pid"),
        "listeners": [{
            "port": port,
            "bind_addresses": ["127.0.0.1"],
            "type": "http",
            "tls": false,
            "x_forwarded": false,
            "resources": [{"names": ["client"], "compress": false}],
        }],
        "database": {"name": "sqlite3", "args": {"database": d("homeserver.db")}},
        "media_store_path": d("media_store"),
        "signing_key_path": d("signing.key"),
        "registration_shared_secret": shared_secret,
        "enable_registration": false,
        "macaroon_secret_key": hex(&random_bytes::<24>()),
        "form_secret": hex(&random_bytes::<24>()),
        "report_stats": false,
        // Every registration and login hashes a password: the default 12 rounds cost ~0.3 s
        // each (seconds on a loaded 2-core box); 4 is what Synapse's own tests use.
        "bcrypt_rounds": 4,
        "enable_metrics": false,
        "trusted_key_servers": [],
        "suppress_key_server_warning": true,
        "federation_domain_whitelist": [],
        "presence": {"enabled": false},
        "url_preview_enabled": false,
        "rc_message": lim,
        "rc_registration": lim,
        "rc_login": {"address": lim, "account": lim, "failed_attempts": lim},
        "rc_joins": {"local": lim, "remote": lim},
        "rc_joins_per_room": lim,
        "rc_invites": {"per_room": lim, "per_user": lim, "per_issuer": lim},
        "rc_admin_redaction": lim,
        "rc_room_creation": lim,
        "rc_presence": {"per_user": lim},
        "rc_delayed_event_mgmt": lim,
    });
    serde_json::to_string_pretty(&cfg).expect("config JSON")
}

// ---------------------------------------------------------------------------------------------
// ngIRCd

/// An ngIRCd on `127.0.0.1:<port>`: no PAM, no ident or DNS lookups, no flood penalties, no
/// per-IP connection limit (every test client comes from 127.0.0.1), nicks up to 30 bytes.
pub struct Ngircd {
    dir: TempDir,
    bin: PathBuf,
    port: u16,
    /// The SSL port ([`Ngircd::start_tls`]).
    tls_port: Option<u16>,
    log: PathBuf,
    proc: Option<Proc>,
    startup: Duration,
}

/// The ngIRCd binary: `$GATEWARDEN_NGIRCD`, `ngircd` on `PATH`, or `/usr/sbin/ngircd`.
pub fn ngircd_bin() -> Option<PathBuf> {
    if let Some(b) = std::env::var_os("GATEWARDEN_NGIRCD") {
        return Some(PathBuf::from(b)).filter(|p| p.is_file());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).chain([PathBuf::from("/usr/sbin")]).map(|d| d.join("ngircd")).find(|p| p.is_file())
}

impl Ngircd {
    /// Writes a config, starts `ngircd -n` and waits for the port. `None` (with a `SKIPPED:`
    /// line) when ngIRCd is not installed, a panic under `CI`.
    pub fn start() -> Option<Ngircd> {
        Ngircd::start_with(None)
    }

    /// [`Ngircd::start`] with an SSL port too ([`Ngircd::tls_addr`]) presenting `cert_pem`
    /// (the chain) and `key_pem` (Debian's ngIRCd is built with GnuTLS).
    pub fn start_tls(cert_pem: &str, key_pem: &str) -> Option<Ngircd> {
        Ngircd::start_with(Some((cert_pem, key_pem)))
    }

    fn start_with(tls: Option<(&str, &str)>) -> Option<Ngircd> {
        let Some(bin) = ngircd_bin() else {
            return crate::unavailable("ngIRCd", "no ngircd binary (run scripts/setup-ngircd)");
        };
        let dir = tempfile::Builder::new().prefix("gw-ngircd-").tempdir().expect("ngircd temp dir");
        let port = free_port();
        std::fs::create_dir(dir.path().join("conf.d")).expect("conf.d");
        // Started as root, ngIRCd drops to `nobody` before it writes its pid file.
        let run = dir.path().join("run");
        std::fs::create_dir(&run).expect("run dir");
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o777)).expect("chmod run dir");
        }
        std::fs::write(dir.path().join("ngircd.conf"), ngircd_config(dir.path(), port)).expect("write ngircd.conf");
        let tls_port = tls.map(|(cert, key)| {
            let tls_port = free_port();
            let (c, k) = (dir.path().join("server.crt"), dir.path().join("server.key"));
            std::fs::write(&c, cert).expect("write server.crt");
            std::fs::write(&k, key).expect("write server.key");
            let conf = format!("[SSL]\nCertFile = {}\nKeyFile = {}\nPorts = {tls_port}\n", c.display(), k.display());
            std::fs::write(dir.path().join("conf.d/ssl.conf"), conf).expect("write ssl.conf");
            tls_port
        });
        let log = dir.path().join("ngircd.log");
        let mut s = Ngircd { dir, bin, port, tls_port, log, proc: None, startup: Duration::ZERO };
        s.launch();
        eprintln!("[testkit] ngircd ready on {} in {:.3} s", s.addr(), s.startup.as_secs_f64());
        Some(s)
    }

    fn launch(&mut self) {
        assert!(self.proc.is_none(), "ngircd already running");
        // A pid file left by a killed run makes ngIRCd log an error; it is ours to remove.
        let _ = std::fs::remove_file(self.dir.path().join("run/ngircd.pid"));
        let mut cmd = Command::new(&self.bin);
        cmd.arg("-n").arg("-f").arg(self.dir.path().join("ngircd.conf")).current_dir(self.dir.path());
        let started = Instant::now();
        let mut proc = Proc::spawn(cmd, &self.log).expect("spawn ngircd");
        let addrs: Vec<SocketAddr> = std::iter::once(self.addr()).chain(self.tls_addr()).collect();
        wait_ready("ngircd", &mut proc, &self.log, NGIRCD_READY, || {
            addrs.iter().all(|a| TcpStream::connect_timeout(a, Duration::from_secs(1)).is_ok())
        });
        self.startup = started.elapsed();
        self.proc = Some(proc);
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// The SSL port's address, when started with [`Ngircd::start_tls`].
    pub fn tls_addr(&self) -> Option<SocketAddr> {
        self.tls_port.map(|p| SocketAddr::from((Ipv4Addr::LOCALHOST, p)))
    }

    /// Time from spawn to an accepted connection, for the last (re)start.
    pub fn startup_time(&self) -> Duration {
        self.startup
    }

    /// Pid of the running server (`None` while stopped).
    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().map(Proc::pid)
    }

    /// Kills the server (SIGKILL to its group): every client connection breaks.
    pub fn stop(&mut self) {
        if let Some(p) = self.proc.take() {
            p.kill();
        }
    }

    /// Stops (if running) and starts again on the same port.
    pub fn restart(&mut self) {
        self.stop();
        self.launch();
    }

    /// The server's log so far.
    pub fn log_tail(&self) -> String {
        tail(&self.log, 8000)
    }
}

impl Drop for Ngircd {
    fn drop(&mut self) {
        self.stop();
    }
}

fn ngircd_config(dir: &Path, port: u16) -> String {
    let d = |name: &str| dir.join(name).to_string_lossy().into_owned();
    format!(
        "[Global]\n\
         Name = irc.gatewarden.test\n\
         Info = gatewarden test server\n\
         AdminInfo1 = gatewarden tests\n\
         AdminInfo2 = loopback only\n\
         AdminEMail = nobody@gatewarden.test\n\
         Listen = 127.0.0.1\n\
         Ports = {port}\n\
         PidFile = {pid}\n\
         MotdPhrase = gatewarden test\n\
         [Limits]\n\
         MaxConnectionsIP = 0\n\
         MaxJoins = 0\n\
         MaxNickLength = 30\n\
         MaxPenaltyTime = 0\n\
         [Options]\n\
         PAM = no\n\
         Ident = no\n\
         DNS = no\n\
         IncludeDir = {confd}\n",
        pid = d("run/ngircd.pid"),
        confd = d("conf.d"),
    )
}

// ---------------------------------------------------------------------------------------------

/// SHA-1 and HMAC-SHA1, only for the Synapse registration MAC (which the admin API fixes to
/// HMAC-SHA1); a crypto crate for one test-setup call is not worth the dependency.
mod sha1 {
    pub fn digest(msg: &[u8]) -> [u8; 20] {
        let mut h: [u32; 5] = [0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476, 0xC3D2E1F0];
        let mut data = msg.to_vec();
        data.push(0x80);
        while data.len() % 64 != 56 {
            data.push(0);
        }
        data.extend_from_slice(&((msg.len() as u64).wrapping_mul(8)).to_be_bytes());
        for block in data.chunks_exact(64) {
            let mut w = [0u32; 80];
            for (i, c) in block.chunks_exact(4).enumerate() {
                w[i] = u32::from_be_bytes([c[0], c[1], c[2], c[3]]);
            }
            for i in 16..80 {
                w[i] = (w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16]).rotate_left(1);
            }
            let [mut a, mut b, mut c, mut d, mut e] = h;
            for (i, wi) in w.iter().enumerate() {
                let (f, k) = match i {
                    0..=19 => ((b & c) | (!b & d), 0x5A827999),
                    20..=39 => (b ^ c ^ d, 0x6ED9EBA1),
                    40..=59 => ((b & c) | (b & d) | (c & d), 0x8F1BBCDC),
                    _ => (b ^ c ^ d, 0xCA62C1D6),
                };
                let t = a.rotate_left(5).wrapping_add(f).wrapping_add(e).wrapping_add(k).wrapping_add(*wi);
                (e, d, c, b, a) = (d, c, b.rotate_left(30), a, t);
            }
            for (hv, v) in h.iter_mut().zip([a, b, c, d, e]) {
                *hv = hv.wrapping_add(v);
            }
        }
        let mut out = [0u8; 20];
        for (o, v) in out.chunks_exact_mut(4).zip(h) {
            o.copy_from_slice(&v.to_be_bytes());
        }
        out
    }

    pub fn hmac(key: &[u8], msg: &[u8]) -> [u8; 20] {
        let mut k = [0u8; 64];
        if key.len() > 64 {
            k[..20].copy_from_slice(&digest(key));
        } else {
            k[..key.len()].copy_from_slice(key);
        }
        let mut inner: Vec<u8> = k.iter().map(|b| b ^ 0x36).collect();
        inner.extend_from_slice(msg);
        let mut outer: Vec<u8> = k.iter().map(|b| b ^ 0x5c).collect();
        outer.extend_from_slice(&digest(&inner));
        digest(&outer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha1_and_hmac_match_published_vectors() {
        assert_eq!(hex(&sha1::digest(b"")), "da39a3ee5e6b4b0d3255bfef95601890afd80709");
        assert_eq!(hex(&sha1::digest(b"abc")), "a9993e364706816aba3e25717850c26c9cd0d89d");
        let long = b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
        assert_eq!(hex(&sha1::digest(long)), "84983e441c3bd26ebaae4aa1f95129e5e54670f1");
        // RFC 2202 test cases 2 and 6 (a key longer than the block is hashed first).
        assert_eq!(
            hex(&sha1::hmac(b"Jefe", b"what do ya want for nothing?")),
            "effcdf6ae5eb2fa2d27416d5f184df9c259a7c79"
        );
        assert_eq!(
            hex(&sha1::hmac(&[0xaa; 80], b"Test Using Larger Than Block-Size Key - Hash Key First")),
            "aa4ae5e15272d00e95705637ce8a3b55ed402112"
        );
    }

    #[test]
    fn base64_unpadded_matches_rfc4648() {
        let cases = [("", ""), ("f", "Zg"), ("fo", "Zm8"), ("foo", "Zm9v"), ("foob", "Zm9vYg"), ("fooba", "Zm9vYmE")];
        for (raw, enc) in cases {
            assert_eq!(base64_unpadded(raw.as_bytes()), enc, "{raw:?}");
        }
    }

    #[test]
    fn synapse_config_is_json_with_the_port_and_no_federation() {
        let cfg: Value = serde_json::from_str(&synapse_config(Path::new("/tmp/x"), 18008, "s3cret")).unwrap();
        assert_eq!(cfg["listeners"][0]["port"], 18008);
        assert_eq!(cfg["listeners"][0]["resources"][0]["names"], json!(["client"]));
        assert_eq!(cfg["registration_shared_secret"], "s3cret");
        assert_eq!(cfg["trusted_key_servers"], json!([]));
    }
}
