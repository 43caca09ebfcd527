//! A throwaway PostgreSQL server for tests, and a TCP proxy that can stall or drop the
//! connections through it (partition tests).
//!
//! [`Cluster::start`] runs `initdb` and `pg_ctl` from the PostgreSQL server binaries (found in
//! `$GATEWARDEN_PG_BIN`, `/usr/lib/postgresql/<newest>/bin`, or `PATH`) in a temp dir, on a
//! free loopback port, with password authentication over TCP. As root they run as the
//! `postgres` user (`runuser -u postgres --`): initdb and postgres refuse root. The server is
//! stopped (immediate mode) on drop. `scripts/setup-postgres` installs the binaries.
//!
//! Under `CI=true` missing binaries are a failure ([`Cluster::start_or_skip`] panics);
//! elsewhere a test prints why it skipped.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The password of the `postgres` role in every test cluster.
pub const PASSWORD: &str = "gatewarden-test";
/// The database every test cluster creates.
pub const DATABASE: &str = "gatewarden";
/// How long start-up (initdb + start + createdb) may take on a loaded 2-core machine.
const START_DEADLINE: Duration = Duration::from_secs(60);

/// A running throwaway server.
pub struct Cluster {
    bin: PathBuf,
    dir: tempfile::TempDir,
    port: u16,
    as_postgres: bool,
}

/// Why no server could be started.
#[derive(Debug)]
pub struct Missing(pub String);

impl std::fmt::Display for Missing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The directory holding `initdb`, `pg_ctl`, `postgres` and `psql`.
pub fn bin_dir() -> Option<PathBuf> {
    let has = |d: &Path| ["initdb", "pg_ctl", "postgres", "psql"].iter().all(|b| d.join(b).is_file());
    if let Some(d) = std::env::var_os("GATEWARDEN_PG_BIN").map(PathBuf::from) {
        return has(&d).then_some(d);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .filter(|(_, d)| has(d))
        .collect();
    versions.sort();
    if let Some((_, d)) = versions.pop() {
        return Some(d);
    }
    std::env::var_os("PATH").and_then(|p| std::env::split_paths(&p).find(|d| has(d)))
}

impl Cluster {
    /// A server, or `None` after printing why (a panic under `CI=true`).
    #[track_caller]
    pub fn start_or_skip() -> Option<Cluster> {
        match Cluster::start() {
            Ok(c) => Some(c),
            Err(m) => crate::unavailable("PostgreSQL", &format!("{m} (scripts/setup-postgres installs it)")),
        }
    }

    pub fn start() -> Result<Cluster, Missing> {
        let bin = bin_dir().ok_or_else(|| Missing("initdb/pg_ctl/postgres/psql not found".into()))?;
        let as_postgres = is_root();
        let dir = tempfile::Builder::new().prefix("gw-pg-").tempdir().map_err(|e| Missing(e.to_string()))?;
        let c = Cluster { bin, dir, port: 0, as_postgres };
        std::fs::write(c.dir.path().join("pwfile"), format!("{PASSWORD}\n")).map_err(|e| Missing(e.to_string()))?;
        if as_postgres {
            let ok = Command::new("chown")
                .args(["-R", "postgres:"])
                .arg(c.dir.path())
                .status()
                .map_err(|e| Missing(format!("chown: {e}")))?;
            if !ok.success() {
                return Err(Missing("chown to the postgres user failed (no such user?)".into()));
            }
        }
        let data = c.data_dir();
        let out = c.pg("initdb", |cmd| {
            cmd.arg("-D").arg(&data).args(["-U", "postgres", "-E", "UTF8", "--no-sync", "--locale=C"]);
            cmd.args(["--auth-local=trust", "--auth-host=scram-sha-256"]);
            cmd.arg(format!("--pwfile={}", c.dir.path().join("pwfile").display()));
        });
        if !out.status.success() {
            return Err(Missing(format!("initdb failed: {}", String::from_utf8_lossy(&out.stderr))));
        }
        let mut c = c;
        let deadline = Instant::now() + START_DEADLINE;
        // A free port can be taken between our probe and the server's bind: retry.
        loop {
            c.port = crate::api::free_port();
            match c.start_server() {
                Ok(()) => break,
                Err(e) if Instant::now() < deadline => eprintln!("postgres start on {} failed, retrying: {e}", c.port),
                Err(e) => return Err(Missing(e)),
            }
        }
        let out = c.pg("createdb", |cmd| {
            cmd.args(["-h"]).arg(c.dir.path()).args(["-p", &c.port.to_string(), "-U", "postgres", DATABASE]);
        });
        if !out.status.success() {
            return Err(Missing(format!("createdb failed: {}", String::from_utf8_lossy(&out.stderr))));
        }
        Ok(c)
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Runs a server binary, as `postgres` when we are root.
    fn pg(&self, tool: &str, args: impl FnOnce(&mut Command)) -> Output {
        let mut cmd = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(self.bin.join(tool));
            c
        } else {
            Command::new(self.bin.join(tool))
        };
        cmd.current_dir(self.dir.path()).stdin(Stdio::null());
        args(&mut cmd);
        cmd.output().unwrap_or_else(|e| panic!("cannot run {tool}: {e}"))
    }

    /// `pg_ctl start -w`: returns once the server accepts connections (pg_ctl's own deadline).
    fn start_server(&self) -> Result<(), String> {
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200",
            self.port,
            self.dir.path().display()
        );
        let log = self.dir.path().join("postgres.log");
        let out = self.pg("pg_ctl", |cmd| {
            cmd.arg("-D").arg(self.data_dir()).arg("-l").arg(&log).args(["-w", "-t", "30", "-o", &opts, "start"]);
            // pg_ctl's stdout is the server's until -l takes over; do not hold our pipe open.
            cmd.stdout(Stdio::null());
        });
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "pg_ctl start: {}\n{}",
                String::from_utf8_lossy(&out.stderr),
                std::fs::read_to_string(&log).unwrap_or_default()
            ))
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The store URL for config.toml (no password: that comes from [`PASSWORD`]).
    pub fn url(&self) -> String {
        self.url_via(self.addr())
    }

    /// The store URL by a host name (`localhost`, the name a test certificate carries, for
    /// `sslmode=verify-full`).
    pub fn url_named(&self, host: &str) -> String {
        format!("postgres://postgres@{host}:{}/{DATABASE}", self.port)
    }

    /// The store URL through another address (a [`Proxy`]).
    pub fn url_via(&self, addr: SocketAddr) -> String {
        format!("postgres://postgres@{addr}/{DATABASE}")
    }

    /// Runs SQL with psql over TCP; returns the unaligned, tuples-only output, or psql's error.
    pub fn try_sql(&self, sql: &str) -> Result<String, String> {
        let out = Command::new(self.bin.join("psql"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", "postgres", "-d", DATABASE])
            .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql])
            .env("PGPASSWORD", PASSWORD)
            .env("PGCONNECT_TIMEOUT", "5")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run psql: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim_end().to_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// [`Cluster::try_sql`], panicking on error.
    #[track_caller]
    pub fn sql(&self, sql: &str) -> String {
        self.try_sql(sql).unwrap_or_else(|e| panic!("psql {sql:?}: {e}"))
    }

    /// Turns TLS on (`ssl = on`, reloaded, no restart) with `cert_pem` (the chain) and
    /// `key_pem` as the server's certificate and key; plain connections stay allowed.
    pub fn enable_tls(&self, cert_pem: &str, key_pem: &str) {
        use std::os::unix::fs::PermissionsExt;
        for (name, text) in [("server.crt", cert_pem), ("server.key", key_pem)] {
            let path = self.data_dir().join(name);
            std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {name}: {e}"));
            // The server refuses a key readable by others.
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
            if self.as_postgres {
                let ok = Command::new("chown").arg("postgres:").arg(&path).status().is_ok_and(|s| s.success());
                assert!(ok, "chown {name} to postgres");
            }
        }
        self.sql("ALTER SYSTEM SET ssl = on");
        self.sql("SELECT pg_reload_conf()");
    }

    /// Stops the server (fast mode: connections are terminated) and starts it again.
    pub fn restart(&self) {
        self.stop();
        self.start_server().unwrap_or_else(|e| panic!("restart: {e}"));
    }

    /// Stops the server, fast mode.
    pub fn stop(&self) {
        let out = self.pg("pg_ctl", |cmd| {
            cmd.arg("-D").arg(self.data_dir()).args(["-m", "fast", "-w", "stop"]);
        });
        assert!(out.status.success(), "pg_ctl stop: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// Starts a stopped server again on the same port.
    pub fn start_again(&self) {
        self.start_server().unwrap_or_else(|e| panic!("start: {e}"));
    }

    /// CPU seconds (user + system) used so far by the server: the postmaster and every
    /// backend and auxiliary process it started (Linux `/proc`; 0 elsewhere). Backends that
    /// already exited are not counted: measure with long-lived connections.
    pub fn cpu_seconds(&self) -> f64 {
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        self.cpu_ticks() as f64 / hz
    }

    fn cpu_ticks(&self) -> u64 {
        let pm: Option<u32> = std::fs::read_to_string(self.data_dir().join("postmaster.pid"))
            .ok()
            .and_then(|s| s.lines().next().and_then(|l| l.trim().parse().ok()));
        let Some(pm) = pm else { return 0 };
        let ticks = |stat: &str| -> Option<(u32, u64)> {
            // Fields after the parenthesised command: state ppid … utime(14) stime(15).
            let rest = &stat[stat.rfind(')')? + 2..];
            let f: Vec<&str> = rest.split_whitespace().collect();
            Some((f.get(1)?.parse().ok()?, f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?))
        };
        let mut total = 0;
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
            let Some((ppid, t)) = std::fs::read_to_string(e.path().join("stat")).ok().as_deref().and_then(ticks) else {
                continue;
            };
            if pid == pm || ppid == pm {
                total += t;
            }
        }
        total
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("postgres.log")).unwrap_or_default()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.port != 0 {
            let _ = self.pg("pg_ctl", |cmd| {
                cmd.arg("-D").arg(self.data_dir()).args(["-m", "immediate", "-w", "stop"]);
            });
        }
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// What the proxy does with traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyMode {
    /// Forward both ways.
    Pass = 0,
    /// Keep connections open but forward nothing (a partition that TCP does not notice).
    Stall = 1,
    /// Close every connection, and every new one at once.
    Drop = 2,
}

/// A loopback TCP proxy to `target` whose behaviour can change at any time.
pub struct Proxy {
    addr: SocketAddr,
    mode: Arc<AtomicU8>,
    closed: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    pub fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let addr = listener.local_addr().expect("proxy addr");
        let mode = Arc::new(AtomicU8::new(ProxyMode::Pass as u8));
        let closed = Arc::new(AtomicBool::new(false));
        let conns = Arc::new(Mutex::new(Vec::new()));
        let (m, c, cs) = (Arc::clone(&mode), Arc::clone(&closed), Arc::clone(&conns));
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if c.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(client) = client else { continue };
                if m.load(Ordering::Relaxed) == ProxyMode::Drop as u8 {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(target) else { continue };
                // Copied in pieces, a reply would otherwise wait for Nagle and a delayed ACK
                // (40 ms a query) on each hop.
                let _ = (client.set_nodelay(true), server.set_nodelay(true));
                if let (Ok(a), Ok(b)) = (client.try_clone(), server.try_clone())
                    && let Ok(mut g) = cs.lock()
                {
                    g.push(a);
                    g.push(b);
                }
                for (from, to) in [(client.try_clone(), server.try_clone()), (server.try_clone(), client.try_clone())] {
                    if let (Ok(from), Ok(to)) = (from, to) {
                        let m = Arc::clone(&m);
                        std::thread::spawn(move || pump(from, to, &m));
                    }
                }
            }
        });
        Proxy { addr, mode, closed, conns }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn set(&self, mode: ProxyMode) {
        self.mode.store(mode as u8, Ordering::Relaxed);
        if mode == ProxyMode::Drop
            && let Ok(mut g) = self.conns.lock()
        {
            for s in g.drain(..) {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.closed.store(true, Ordering::Relaxed);
        self.set(ProxyMode::Drop);
        let _ = TcpStream::connect(self.addr); // wakes the accept loop so it sees `closed`
    }
}

/// Copies `from` → `to` while the mode is `Pass`; while `Stall`, reads nothing (the bytes wait
/// in the kernel buffers, as on a silent network); ends on `Drop`, EOF or an error.
fn pump(mut from: TcpStream, mut to: TcpStream, mode: &AtomicU8) {
    let _ = from.set_read_timeout(Some(Duration::from_millis(50)));
    let mut buf = [0u8; 16 * 1024];
    loop {
        match mode.load(Ordering::Relaxed) {
            m if m == ProxyMode::Drop as u8 => break,
            m if m == ProxyMode::Stall as u8 => {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            _ => {}
        }
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}
