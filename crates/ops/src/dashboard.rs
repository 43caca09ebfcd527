//! `gatewarden dashboard`: one page for every gateway home of this user on the machine (the
//! per-user registry each gateway joins at start, crates/dashboard/src/registry.rs), the
//! hermes homes it was given (`--hermes-home`), the homes named with `--home-dir`, and the
//! cluster members their status reports name. A home whose gateway is down still shows its
//! last state and why it ended (its `status` report, the same one `status --json` prints).
//!
//! Each home links to its own page (`http://<listen>/ui`, served by its gateway) and to a page
//! this server renders from the home's files (`/ui/home/<key>`), which also works while the
//! gateway is down and so carries Start. This file is the fleet's [`Site`] for the dashboard's
//! one web layer (crates/dashboard/src/web.rs): every page, the list included, needs a session
//! of this server's token (`GATEWARDEN_DASHBOARD_TOKEN`, or the file `…_TOKEN_FILE` names; at
//! least 16 bytes, else a random one printed at start), failed logins are throttled per client and recorded in the ledger of each
//! home listed that is ours, and actions run the CLI's own verbs (`actions::launch`) with
//! `channel: dashboard`. Loopback only, unless a token is given; run as root it says it serves
//! root's homes.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use gatewarden_control::StatusReport;
use gatewarden_dashboard::actions::{self, Action};
use gatewarden_dashboard::auth::{self, Failed, Policy};
use gatewarden_dashboard::snapshot::{Finding, Snapshot};
use gatewarden_dashboard::web::{self, Page, ReadRule, Site, Web};
use gatewarden_dashboard::{HomeSummary, gather, registry, render};
use gatewarden_lifecycle::{ExitIntent, Home};
use serde_json::{Value, json};

/// `dashboard`'s options (crates/gatewarden/src/cli.rs documents them).
#[derive(Debug, Clone, Default)]
pub struct DashboardArgs {
    pub listen: String,
    pub homes: Vec<PathBuf>,
    pub hermes_homes: Vec<PathBuf>,
}

/// The token's environment variable (else a random token is printed at start).
pub const TOKEN_ENV: &str = "GATEWARDEN_DASHBOARD_TOKEN";
/// Or the file holding it, read by the secret files' rules (fsio `read_private`): a systemd
/// credential (`%d/…`), a Kubernetes Secret, a file of ours that nobody else reads.
pub const TOKEN_FILE_ENV: &str = "GATEWARDEN_DASHBOARD_TOKEN_FILE";
const DOCTOR_EVERY: Duration = Duration::from_secs(30);

struct Fleet {
    homes: Vec<PathBuf>,
    hermes_homes: Vec<PathBuf>,
    registry: Option<PathBuf>,
    doctor: Mutex<HashMap<String, (Instant, Vec<Finding>)>>,
}

/// One row's source.
#[derive(Debug, Clone)]
enum Source {
    Gatewarden(Home),
    Hermes(PathBuf),
}

/// What the fleet page says about whose homes these are, when it runs as root.
fn served_as_root() -> Option<String> {
    crate::os::proc::is_root().then(|| {
        "This dashboard runs as root: it serves root's homes (root's registry and the homes named on its command line), \
         and their private files only to sessions holding its token."
            .to_owned()
    })
}

pub fn dashboard(args: DashboardArgs) -> crate::Result<ExitCode> {
    let refuse = |why: String| {
        errln!("gatewarden dashboard: {why}");
        Ok(ExitCode::from(ExitIntent::FatalConfig.code()))
    };
    let addr: std::net::SocketAddr = match args.listen.parse() {
        Ok(a) => a,
        Err(e) => return refuse(format!("invalid listen address {:?}: {e}", args.listen)),
    };
    let set = |k: &str| std::env::var_os(k).filter(|t| !t.is_empty());
    let (given, from) = match (set(TOKEN_ENV), set(TOKEN_FILE_ENV)) {
        (Some(_), Some(_)) => return refuse(format!("set {TOKEN_ENV} or {TOKEN_FILE_ENV}, not both")),
        (None, Some(file)) => match gatewarden_config::secrets::read_secret_file(std::path::Path::new(&file)) {
            Ok(t) => (Some(t.expose().to_owned()), TOKEN_FILE_ENV),
            Err(why) => return refuse(format!("{TOKEN_FILE_ENV}: {why}")),
        },
        (Some(t), None) => (Some(t.to_string_lossy().into_owned()), TOKEN_ENV),
        (None, None) => (None, TOKEN_ENV),
    };
    if let Some(why) = given.as_deref().and_then(gatewarden_config::token_problem) {
        return refuse(format!("{from} {why}"));
    }
    if !addr.ip().is_loopback() && given.is_none() {
        return refuse(format!(
            "the fleet dashboard listens on loopback only unless {TOKEN_ENV} (or {TOKEN_FILE_ENV}) is set (at least 16 bytes), not on {addr}: \
             set it, or reach it through an SSH tunnel"
        ));
    }
    let token = match given.clone() {
        Some(t) => t,
        None => auth::random_token().map_err(|e| crate::Error::msg(e.to_string()))?,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| crate::Error::msg(format!("cannot start the runtime: {e}")))?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| crate::Error::msg(format!("cannot listen on {addr}: {e}")))?;
        let bound = listener.local_addr().map_err(|e| crate::Error::msg(e.to_string()))?;
        let fleet = Arc::new(Fleet {
            homes: args.homes,
            hermes_homes: args.hermes_homes,
            registry: registry::dir().ok().flatten(),
            doctor: Mutex::new(HashMap::new()),
        });
        let note = served_as_root();
        {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "dashboard: http://{bound}/ui/fleet");
            if given.is_none() {
                let _ = writeln!(out, "token (this run only; every page asks for it): {token}");
            }
            if let Some(n) = &note {
                let _ = writeln!(out, "{n}");
            }
            let _ = out.flush();
        }
        let policy = Policy { api_token: Some(token), bound: Some(bound.to_string()), allowed_hosts: Vec::new() };
        let app = web::fleet_routes(Web::new(fleet, policy, ReadRule::Session, note));
        axum::serve(listener, app.into_make_service_with_connect_info::<std::net::SocketAddr>())
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await
            .map_err(|e| crate::Error::msg(format!("dashboard server: {e}")))
    })?;
    Ok(ExitCode::SUCCESS)
}

impl Fleet {
    /// Every home this page lists, each once: the registry's, then `--home-dir`, then hermes.
    fn sources(&self) -> (Vec<Source>, Vec<(String, String)>) {
        let mut out: Vec<Source> = Vec::new();
        let mut skipped = Vec::new();
        let mut seen = std::collections::HashSet::new();
        if let Some(dir) = &self.registry {
            match registry::list(dir) {
                Ok(l) => {
                    skipped = l.skipped;
                    for e in l.entries {
                        if seen.insert(e.home.clone()) {
                            out.push(Source::Gatewarden(Home::at(&e.home)));
                        }
                    }
                }
                Err(e) => skipped.push((dir.display().to_string(), e.to_string())),
            }
        }
        for h in &self.homes {
            let home = Home::at(h).canonicalized();
            if seen.insert(home.dir().to_string_lossy().into_owned()) {
                out.push(Source::Gatewarden(home));
            }
        }
        for h in &self.hermes_homes {
            if seen.insert(h.to_string_lossy().into_owned()) {
                out.push(Source::Hermes(h.clone()));
            }
        }
        (out, skipped)
    }

    /// A gatewarden home this page lists, by its key (never an arbitrary path from the URL).
    fn home(&self, key: &str) -> Option<Home> {
        self.sources().0.into_iter().find_map(|s| match s {
            Source::Gatewarden(h) if render::home_key(&h.dir().to_string_lossy()) == key => Some(h),
            _ => None,
        })
    }

    fn doctor(&self, key: &str, home: &Home) -> Vec<Finding> {
        let mut cache = self.doctor.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, f)) = cache.get(key)
            && at.elapsed() < DOCTOR_EVERY
        {
            return f.clone();
        }
        let f = crate::doctor::findings(home);
        cache.insert(key.to_owned(), (Instant::now(), f.clone()));
        f
    }
}

/// The fleet's rows: a status report per home, the cluster members those reports name.
fn summaries(f: &Fleet) -> (Vec<HomeSummary>, Vec<(String, String)>) {
    let (sources, skipped) = f.sources();
    let mut rows = Vec::new();
    let mut members = Vec::new();
    for s in sources {
        match s {
            Source::Gatewarden(h) => {
                let (_, r) = crate::status::report(&h);
                if let Some(m) = cluster_member(&r) {
                    members.push(m);
                }
                rows.push(HomeSummary::from_status(&r));
            }
            Source::Hermes(dir) => {
                let s = gatewarden_hermes::status::status(&gatewarden_hermes::home::HermesHome::at(&dir));
                let phase = serde_json::to_value(s.phase).ok().and_then(|v| v.as_str().map(str::to_owned));
                rows.push(HomeSummary {
                    path: s.home.clone(),
                    state: s.gateway_state.clone().or(phase).unwrap_or_else(|| "unknown".into()),
                    pid: s.pid.filter(|_| s.running),
                    version: None,
                    listen: None,
                    last_exit_code: None,
                    last_exit_reason: if s.running { None } else { s.exit_reason.clone() },
                    kind: "hermes".into(),
                });
            }
        }
    }
    for m in members {
        if !rows.iter().any(|r| r.path == m.path) {
            rows.push(m);
        }
    }
    (rows, skipped)
}

/// The active member of a cluster a standby's report names, when it is another home.
fn cluster_member(r: &StatusReport) -> Option<HomeSummary> {
    let a = r.extra.get("cluster")?.get("active")?.as_object()?;
    let s = |k: &str| a.get(k).and_then(Value::as_str).map(str::to_owned);
    let (host, home) = (s("host")?, s("home")?);
    if home == r.home {
        return None;
    }
    Some(HomeSummary {
        path: format!("{host}:{home}"),
        state: "active".into(),
        pid: a.get("pid").and_then(Value::as_u64).and_then(|p| u32::try_from(p).ok()),
        version: None,
        listen: s("listen"),
        last_exit_code: None,
        last_exit_reason: None,
        kind: "cluster member".into(),
    })
}

/// A home's page from its files and its status report (its gateway may be down).
fn snapshot(f: &Fleet, key: &str, home: &Home) -> Snapshot {
    let (_, report) = crate::status::report(home);
    let version = report.version.clone().unwrap_or_else(|| gatewarden_lifecycle::VERSION.to_owned());
    let mut s = gather::from_home(home, report, SystemTime::now());
    s.doctor = f.doctor(key, home);
    s.update = Some(gather::update_view(home, &version));
    s.outcome = actions::read(home);
    s
}

impl Site for Fleet {
    type Wake = ();

    async fn snapshot(self: Arc<Self>, page: Page) -> Option<Snapshot> {
        let Page::Home(key) = page else { return None };
        tokio::task::spawn_blocking(move || {
            let home = self.home(&key)?;
            Some(snapshot(&self, &key, &home))
        })
        .await
        .ok()
        .flatten()
    }

    async fn fleet(self: Arc<Self>) -> Option<web::FleetRows> {
        tokio::task::spawn_blocking(move || summaries(&self)).await.ok()
    }

    async fn act(self: Arc<Self>, page: Page, act: Action) -> Result<(), String> {
        let Page::Home(key) = page else { return Err("actions are on a home's page".into()) };
        tokio::task::spawn_blocking(move || -> Result<(), String> {
            let home = self.home(&key).ok_or("no such home in this fleet")?;
            let source = gatewarden_config::Config::load(home.dir()).ok().and_then(|c| c.update.source.clone());
            let args = act.cli_args(source.as_deref())?.ok_or("retry and /new are on the gateway's own page")?;
            let (_, r) = crate::status::report(&home);
            let exe = gatewarden_lifecycle::platform::spawn::self_exe().map_err(|e| format!("no executable: {e}"))?;
            actions::launch(&home, &exe, act.verb(), &args, r.incarnation)
                .map_err(|e| format!("cannot run it: {e}"))?;
            Ok(())
        })
        .await
        .unwrap_or_else(|e| Err(e.to_string()))
    }

    /// In the ledger of the home whose page it was, or of every home listed for the list's
    /// login; only homes of this user (a home named on the command line may be another's).
    async fn login_failed(self: Arc<Self>, page: Page, client: String, failed: Failed) {
        let _ = tokio::task::spawn_blocking(move || {
            let homes: Vec<Home> = match &page {
                Page::Home(key) => self.home(key).into_iter().collect(),
                _ => self
                    .sources()
                    .0
                    .into_iter()
                    .filter_map(|s| match s {
                        Source::Gatewarden(h) => Some(h),
                        Source::Hermes(_) => None,
                    })
                    .collect(),
            };
            let fields = json!({"client": client, "failures": failed.failures, "wait_s": failed.wait_s,
                                "page": page.base(), "server": "fleet"});
            let ours = |h: &Home| {
                std::fs::symlink_metadata(h.dir()).is_ok_and(|m| crate::os::proc::foreign_owner(&m).is_none())
            };
            for h in homes.iter().filter(|h| ours(h)) {
                let ledger = gatewarden_lifecycle::ledger::Ledger::new(
                    h.ledger(),
                    gatewarden_lifecycle::ledger::Writer::current(),
                );
                let _ = ledger.append("dashboard_login_failed", fields.clone());
            }
        })
        .await;
    }

    fn wake(&self) -> Self::Wake {}

    async fn woken(_: &mut Self::Wake) {
        std::future::pending::<()>().await;
    }
}
