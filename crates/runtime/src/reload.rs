//! `gatewarden reload` (control `reload`) and SIGHUP: the configuration and the secrets are
//! read again through the start's own load path (settings.rs), and what can change live is
//! applied live.
//!
//! - [`KEYS`] is the one table of key → [`Apply::Live`] or [`Apply::Restart`]; [`plan`] is
//!   pure and compares the new configuration with what runs: live keys against what the last
//!   reload applied, restart keys against what this incarnation started with (so a pending
//!   restart key is reported by every reload until a restart, and stops being once the file
//!   says what runs again).
//! - A configuration that does not load is refused before anything changes (`reload_refused`,
//!   the file, line and key): the gateway runs on exactly as it was.
//! - Otherwise the live part is applied even when some keys need a restart, and the reload
//!   says which (`reload`, `restart_needed`). Why not all or nothing: every restart key keeps
//!   its running value, which stands on its own (the table is by key, and the one coupling in
//!   the file, `listen` with `api_token`, is restart-only on both sides), so the result is a
//!   configuration that works; refusing the live part would let one pending restart key hold
//!   back every admin and provider change until the next restart.
//!
//! Runs on the main loop (main_loop/mod.rs), so it never overlaps a drain or another reload.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use gatewarden_config::{BackendKind, Config};
use gatewarden_control::Response;
use gatewarden_lifecycle::records::GatewayState;
use gatewarden_lifecycle::supervisor::RestartRoute;
use serde_json::{Value, json};

use crate::app::App;
use crate::commands::{Admins, platform_admins};
use crate::settings::{self, LoadError, Overrides};

/// How a change to a key is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Apply {
    /// At once, by the running incarnation.
    Live,
    /// By the next incarnation: the reload names the key, and the gateway runs on with the old
    /// value.
    Restart,
}

/// Every key of config.toml (or the table holding it) and how a change to it is applied; the
/// most specific entry wins (`agent.hermes_home` over `agent`). `platform.*` keys are a
/// `[[platform]]` table's, matched by adapter name. A key missing here is a restart (a unit
/// test keeps every top-level key listed).
pub const KEYS: &[(&str, Apply)] = &[
    // Bound once, before `running`.
    ("listen", Apply::Restart),
    // The dashboard's sessions and its actions are keyed by it at start.
    ("api_token", Apply::Restart),
    ("api_token_env", Apply::Restart),
    ("api_token_file", Apply::Restart),
    // The chat-command rule (commands.rs), read per command.
    ("admins", Apply::Live),
    // A successor and a backstop are given it at start.
    ("drain_timeout_s", Apply::Restart),
    ("log_level", Apply::Live),
    // A new backend for new runs (providers, their keys, timeouts, retries, history), built by
    // every reload, so keys are read again even when the file is unchanged (provider health
    // starts afresh); runs in flight finish on the one they started with.
    ("agent", Apply::Live),
    // hermes's gateway is this incarnation's child (runtime hermes.rs).
    ("agent.hermes_home", Apply::Restart),
    ("agent.hermes_program", Apply::Restart),
    // The accept loop's limits and Host rule are set at bind.
    ("http", Apply::Restart),
    // Retention and the queue caps, read per message and per pruning round.
    ("journal", Apply::Live),
    // The adapter is restarted in place on the credential lock it holds (platforms.rs).
    ("platform", Apply::Live),
    // Read per command: the adapter is not restarted.
    ("platform.admins", Apply::Live),
    // The access policy (access/), read per message: the adapter is not restarted.
    ("platform.access", Apply::Live),
    ("platform.allowed_users", Apply::Live),
    ("platform.require_mention", Apply::Live),
    // A table added or removed, or one whose kind or credential changed: another adapter.
    ("platform.name", Apply::Restart),
    ("platform.kind", Apply::Restart),
    ("platform.credential", Apply::Restart),
    // The lease, the store and the journal in it are this incarnation's.
    ("cluster", Apply::Restart),
    // `/update` reads its source per command; `gatewarden update` reads the file itself.
    ("update", Apply::Live),
    // A new exporter; the old one sends what it has queued and ends.
    ("telemetry", Apply::Live),
    // Read per download (platforms.rs, Host::attachments).
    ("attachments", Apply::Live),
];

/// A `[[platform]]` key read per message or command (the command rule, the access policy), so
/// a change to it restarts no adapter, even in a cluster.
fn per_message(rule: &str) -> bool {
    matches!(rule, "platform.admins" | "platform.access" | "platform.allowed_users" | "platform.require_mention")
}

/// What the table cannot know from a key alone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Facts {
    /// The `hermes` backend runs (or is asked for): its approvals and child belong to the
    /// incarnation, so every `[agent]` change waits for a restart.
    pub hermes: bool,
    /// With `[cluster]` the adapters follow the role task: only their admins change live.
    pub cluster: bool,
}

/// How a change to `rule` (a key path without adapter names, `platform.allowed_chats`) is
/// applied.
pub fn rule(rule: &str, facts: Facts) -> Apply {
    let top = rule.split('.').next().unwrap_or(rule);
    if facts.hermes && top == "agent" {
        return Apply::Restart;
    }
    if facts.cluster && top == "platform" && !per_message(rule) {
        return Apply::Restart;
    }
    let mut key = rule;
    loop {
        if let Some((_, a)) = KEYS.iter().find(|(k, _)| *k == key) {
            return *a;
        }
        match key.rsplit_once('.') {
            Some((parent, _)) => key = parent,
            None => return Apply::Restart,
        }
    }
}

/// One changed key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Change {
    /// As shown: `agent.timeout_s`, `platform[telegram].allowed_chats`.
    pub key: String,
    /// As [`KEYS`] names it: `agent.timeout_s`, `platform.allowed_chats`.
    pub rule: String,
    /// The `[[platform]]` adapter it belongs to.
    pub platform: Option<String>,
}

/// Every key whose value differs between `old` and `new` (a list counts as one value).
pub fn changes(old: &Config, new: &Config) -> Vec<Change> {
    let (a, b) = (to_value(old), to_value(new));
    let mut out = Vec::new();
    for key in keys(&a, &b) {
        let (x, y) = (a.get(&key).unwrap_or(&Value::Null), b.get(&key).unwrap_or(&Value::Null));
        if key == "platform" {
            platform_changes(x, y, &mut out);
        } else {
            walk(&key, &key, None, x, y, &mut out);
        }
    }
    // A difference serde does not show (a secret the config crate resolved and keeps out of
    // its serialized form) is still a change of the table holding it.
    if old.agent != new.agent && !out.iter().any(|c| c.rule.starts_with("agent")) {
        out.push(Change { key: "agent".into(), rule: "agent".into(), platform: None });
    }
    out.sort();
    out
}

fn to_value(c: &Config) -> Value {
    serde_json::to_value(c).unwrap_or(Value::Null)
}

fn keys(a: &Value, b: &Value) -> BTreeSet<String> {
    let names = |v: &Value| v.as_object().map(|o| o.keys().cloned().collect::<Vec<_>>()).unwrap_or_default();
    names(a).into_iter().chain(names(b)).collect()
}

fn walk(shown: &str, rule: &str, platform: Option<&str>, a: &Value, b: &Value, out: &mut Vec<Change>) {
    match (a, b) {
        (Value::Object(_), Value::Object(_)) => {
            for k in keys(a, b) {
                let (x, y) = (a.get(&k).unwrap_or(&Value::Null), b.get(&k).unwrap_or(&Value::Null));
                walk(&format!("{shown}.{k}"), &format!("{rule}.{k}"), platform, x, y, out);
            }
        }
        (a, b) if a == b => {}
        _ => out.push(Change { key: shown.to_owned(), rule: rule.to_owned(), platform: platform.map(str::to_owned) }),
    }
}

/// `[[platform]]` tables are matched by adapter name (`name`, else `kind`).
fn platform_changes(a: &Value, b: &Value, out: &mut Vec<Change>) {
    let by_name = |v: &Value| -> BTreeMap<String, Value> {
        v.as_array()
            .map(|tables| {
                tables
                    .iter()
                    .map(|t| {
                        let name =
                            t.get("name").and_then(Value::as_str).or_else(|| t.get("kind").and_then(Value::as_str));
                        (name.unwrap_or_default().to_owned(), t.clone())
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let (old, new) = (by_name(a), by_name(b));
    for name in old.keys().chain(new.keys()).collect::<BTreeSet<_>>() {
        let shown = format!("platform[{name}]");
        match (old.get(name), new.get(name)) {
            (Some(x), Some(y)) => walk(&shown, "platform", Some(name), x, y, out),
            _ => out.push(Change { key: shown, rule: "platform.name".into(), platform: Some(name.clone()) }),
        }
    }
}

/// What a reload does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Applied now.
    pub live: Vec<Change>,
    /// Need a restart; the gateway runs on with their old values.
    pub restart: Vec<Change>,
}

/// Live keys compared with what the last reload applied, restart keys with what this
/// incarnation started with (module notes).
pub fn plan(boot: &Config, applied: &Config, new: &Config, facts: Facts) -> Plan {
    let live = changes(applied, new).into_iter().filter(|c| rule(&c.rule, facts) == Apply::Live).collect();
    let restart = changes(boot, new).into_iter().filter(|c| rule(&c.rule, facts) == Apply::Restart).collect();
    Plan { live, restart }
}

impl Plan {
    /// Whether a live change falls under `section` (`agent`, `telemetry`).
    pub fn touches(&self, section: &str) -> bool {
        self.live.iter().any(|c| c.rule == section || c.rule.starts_with(&format!("{section}.")))
    }

    /// The adapters whose tables changed beyond what is read per message (admins, the access
    /// policy): restarted in place.
    pub fn adapters(&self) -> BTreeSet<String> {
        self.live.iter().filter(|c| !per_message(&c.rule)).filter_map(|c| c.platform.clone()).collect()
    }

    /// Adapter `name` cannot be restarted in place (its kind or credential changed): its
    /// changes wait for a restart, with the credential named.
    pub fn block(&mut self, name: &str) {
        let (moved, kept): (Vec<Change>, Vec<Change>) = std::mem::take(&mut self.live)
            .into_iter()
            .partition(|c| c.platform.as_deref() == Some(name) && !per_message(&c.rule));
        self.live = kept;
        self.restart.extend(moved);
        self.restart.push(Change {
            key: format!("platform[{name}].credential"),
            rule: "platform.credential".into(),
            platform: Some(name.to_owned()),
        });
        self.restart.sort();
        self.restart.dedup();
    }
}

/// What the running incarnation was configured with: at start, and by the last reload.
struct Basis {
    boot: Config,
    applied: Config,
    /// `run --listen`, `--drain-timeout`: applied on every load as at start.
    overrides: Overrides,
    /// What the last reload said needs a restart (`status`).
    restart_needed: Vec<String>,
}

/// The reload's memory, held by the [`App`].
#[derive(Default)]
pub struct State(Mutex<Option<Basis>>);

impl State {
    /// At start (lib.rs `prepare`): the configuration the gateway runs with.
    pub fn begin(&self, config: Config, overrides: Overrides) {
        *self.lock() = Some(Basis { applied: config.clone(), boot: config, overrides, restart_needed: Vec::new() });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Basis>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn snapshot(&self) -> Option<(Config, Config, Overrides)> {
        self.lock().as_ref().map(|b| (b.boot.clone(), b.applied.clone(), b.overrides.clone()))
    }

    fn set_applied(&self, c: Config, restart_needed: Vec<String>) {
        if let Some(b) = self.lock().as_mut() {
            b.applied = c;
            b.restart_needed = restart_needed;
        }
    }

    /// The keys the last reload found changed in the file that only a restart applies.
    pub fn restart_needed(&self) -> Vec<String> {
        self.lock().as_ref().map(|b| b.restart_needed.clone()).unwrap_or_default()
    }
}

fn shown(changes: &[Change]) -> Vec<String> {
    changes.iter().map(|c| c.key.clone()).collect()
}

/// Reloads the configuration of `app`'s home on behalf of `requester` (the ledger's), and
/// answers the control request (docs/protocol.md §3): `reloaded`, or `reload_refused` naming
/// the file, line and key.
pub async fn reload(app: &Arc<App>, requester: Value) -> Response {
    let gw = &app.gw;
    if gw.phase.get() != GatewayState::Running {
        return refuse_draining(app, requester);
    }
    let Some((boot, applied, overrides)) = app.reload.snapshot() else {
        return refuse(app, requester, None, "this gateway was not started from a home's configuration".into());
    };
    let (home, incarnation) = (gw.home.clone(), gw.me.id.clone());
    let loaded = tokio::task::spawn_blocking(move || settings::load(&home, &overrides, &incarnation)).await;
    let s = match loaded {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return refuse(app, requester, Some(&e), e.message.clone()),
        Err(e) => return refuse(app, requester, None, format!("the load failed: {e}")),
    };
    let facts = Facts {
        hermes: [&boot, &s.config].iter().any(|c| c.agent.backend == BackendKind::Hermes),
        cluster: boot.cluster.is_some(),
    };
    let mut plan = plan(&boot, &applied, &s.config, facts);
    // The token's value can change where the file does not (its variable or file): it is
    // still a restart key, the sessions are keyed by the running one.
    let token = s.secrets.api_token();
    if token.as_ref().map(|t| t.expose()) != app.work.api_token.as_deref()
        && !plan.restart.iter().any(|c| c.rule.starts_with("api_token"))
    {
        plan.restart.push(Change { key: "api_token".into(), rule: "api_token".into(), platform: None });
        plan.restart.sort();
    }
    let mut adapters = Vec::new();
    for name in plan.adapters() {
        match s.platforms.take(&name) {
            Some(next) if app.platforms.same_credential(&name, &*next) => adapters.push((name, next)),
            _ => plan.block(&name),
        }
    }
    // Built before anything is applied: an endpoint that cannot be used refuses the reload.
    let telemetry = match plan.touches("telemetry") {
        false => None,
        true => match gatewarden_telemetry::Exporter::start(&s.config.telemetry) {
            Ok(x) => Some(x.map(Arc::new)),
            Err(e) => {
                let e = LoadError {
                    message: format!("[telemetry]: {e}"),
                    file: gw.home.dir().join(gatewarden_config::CONFIG_FILE),
                    line: None,
                    key: Some("telemetry".into()),
                };
                return refuse(app, requester, Some(&e), e.message.clone());
            }
        },
    };

    // Applied from here on: nothing below refuses.
    let current = app.work.live();
    let mut live = crate::worker::Live::clone(&current);
    // Always the new one (but hermes's, which waits for a restart): the keys its providers are
    // called with were read again by the load, and a key may change where the file does not.
    if !facts.hermes {
        live.agent = Arc::from(s.agent);
        live.transcriber = gatewarden_agent::Transcriber::from_config(&s.config.agent, &s.secrets).map(Arc::new);
        live.history_turns = s.config.agent.history_turns;
        live.history_chars = s.config.agent.history_chars;
    }
    live.failure_text = s.config.agent.failure_text.clone();
    live.failure_reasons_for_admins = s.config.agent.failure_reasons_for_admins;
    live.admins = admins(&current.admins, &s.config);
    live.retention = s.config.journal.clone();
    live.update_source = s.config.update.source.clone();
    if let Some(t) = telemetry {
        live.telemetry = t;
    }
    app.work.set_live(live);
    // Who may reach the agent, from the next message on (its keys are all read per message).
    app.work.gate.policies.apply(&s.config);
    app.set_secrets(&s.secrets);
    crate::log::set_level(s.config.log_level);
    if plan.touches("journal") {
        app.work.prune_soon.notify_one();
    }
    let restarted: Vec<String> = adapters.iter().map(|(n, _)| n.clone()).collect();
    let platforms_error = restart_adapters(app, adapters).await;

    // What the next reload compares with: the new file, except the tables of adapters that
    // could not take it in place (still pending).
    let mut next = s.config;
    let blocked: BTreeSet<&str> =
        plan.restart.iter().filter(|c| c.rule == "platform.credential").filter_map(|c| c.platform.as_deref()).collect();
    next.platform.retain(|p| !blocked.contains(p.adapter_name().as_str()));
    next.platform.extend(applied.platform.iter().filter(|p| blocked.contains(p.adapter_name().as_str())).cloned());
    let (changed, restart_needed) = (shown(&plan.live), shown(&plan.restart));
    app.reload.set_applied(next, restart_needed.clone());
    let apply_with = apply_with(gw.supervisor.route(), &plan.restart);
    gw.record(
        "reload",
        json!({"requester": requester, "changed": changed, "restart_needed": restart_needed,
               "apply_with": apply_with, "adapters_restarted": restarted, "platforms_error": platforms_error}),
    );
    let said = match (changed.is_empty(), restart_needed.is_empty()) {
        (true, true) => "nothing changed".to_owned(),
        (false, true) => format!("applied {}", changed.join(", ")),
        (true, false) => format!("nothing applied; needs a restart: {}", restart_needed.join(", ")),
        (false, false) => format!("applied {}; needs a restart: {}", changed.join(", "), restart_needed.join(", ")),
    };
    let said = match &apply_with {
        Some(cmd) => format!("{said} (`{cmd}`)"),
        None => said,
    };
    crate::info!("reloaded {}: {said}", gw.home.dir().join(gatewarden_config::CONFIG_FILE).display());
    if let Some(e) = &platforms_error {
        crate::error!("after the reload: {e}");
    }
    Response::ok(json!({
        "reloaded": true, "incarnation": gw.me.id, "pid": gw.me.pid, "changed": changed,
        "restart_needed": restart_needed, "apply_with": apply_with, "adapters_restarted": restarted,
        "platforms_error": platforms_error,
    }))
}

/// What applies the keys a reload could not: a restart, except where a restart's successor is
/// given the running `--listen` and `--drain-timeout` (an unsupervised gateway, restart.rs):
/// a change to those takes a stop and a start. `None` when nothing waits.
pub fn apply_with(route: RestartRoute, restart: &[Change]) -> Option<&'static str> {
    let kept = restart.iter().any(|c| c.rule == "listen" || c.rule == "drain_timeout_s");
    match (restart.is_empty(), route, kept) {
        (true, _, _) => None,
        (false, RestartRoute::SpawnSuccessor, true) => Some("gatewarden stop && gatewarden start"),
        (false, _, _) => Some("gatewarden restart"),
    }
}

/// The command rule of `config`: the top-level and per-platform admins, the token's presence
/// kept from start (`api_token` is a restart key), and the admins of a running adapter whose
/// table is gone kept until the restart that removes it.
fn admins(current: &Admins, config: &Config) -> Admins {
    let mut platforms = platform_admins(config);
    for (name, list) in &current.platforms {
        platforms.entry(name.clone()).or_insert_with(|| list.clone());
    }
    Admins { http: config.admins.clone(), api_token: current.api_token, platforms }
}

/// Restarts each adapter in place with its new settings (blocking, bounded by the flush).
async fn restart_adapters(
    app: &Arc<App>,
    adapters: Vec<(String, Arc<dyn gatewarden_platforms::Adapter>)>,
) -> Option<String> {
    if adapters.is_empty() {
        return None;
    }
    let (p, gw) = (Arc::clone(&app.platforms), Arc::clone(&app.gw));
    let deadline = Instant::now() + crate::platforms::RESTART_FLUSH;
    let done = tokio::task::spawn_blocking(move || {
        let errors: Vec<String> =
            adapters.into_iter().filter_map(|(name, next)| p.replace(&gw, &name, next, deadline).err()).collect();
        errors
    })
    .await;
    match done {
        Ok(errors) if errors.is_empty() => None,
        Ok(errors) => Some(errors.join("; ")),
        Err(e) => Some(format!("cannot restart the chat platform adapters: {e}")),
    }
}

/// A reload asked for during a drain: nothing is left to apply it to (the next incarnation, if
/// any, reads the file). Recorded and answered.
pub fn refuse_draining(app: &App, requester: Value) -> Response {
    let why = format!("the gateway is {}; the next start reads the configuration", app.gw.phase.get());
    refuse(app, requester, None, why)
}

/// A reload refused: nothing changed. Recorded and logged; the answer is `reload_refused`
/// when the configuration is what was refused, `not_running` otherwise (a drain, a test
/// gateway without a home's configuration).
fn refuse(app: &App, requester: Value, located: Option<&LoadError>, reason: String) -> Response {
    let mut fields = located.map_or_else(|| json!({"reason": reason}), LoadError::json);
    fields["requester"] = requester;
    app.gw.record("reload_refused", fields);
    crate::error!("reload refused: {reason}; the gateway runs on as it was");
    let code = if located.is_some() { "reload_refused" } else { "not_running" };
    Response::err(code, reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Config {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.toml"), text).unwrap();
        Config::load(dir.path()).unwrap()
    }

    fn keys_of(c: &[Change]) -> Vec<&str> {
        c.iter().map(|c| c.key.as_str()).collect()
    }

    /// A Telegram table (plain http: this crate's tests may build without TLS).
    const TG: &str = "[[platform]]\nkind = \"telegram\"\ntoken_env = \"T\"\napi_base = \"http://127.0.0.1:1\"\n";

    #[test]
    fn every_top_level_key_is_in_the_table() {
        let v = to_value(&Config::default());
        for k in v.as_object().unwrap().keys() {
            assert!(KEYS.iter().any(|(key, _)| key == k), "config key '{k}' is not in reload::KEYS");
        }
    }

    #[test]
    fn the_table_decides_by_the_most_specific_key() {
        let f = Facts::default();
        assert_eq!(rule("agent.timeout_s", f), Apply::Live);
        assert_eq!(rule("agent.hermes_home", f), Apply::Restart);
        assert_eq!(rule("listen", f), Apply::Restart);
        assert_eq!(rule("http.max_connections", f), Apply::Restart);
        assert_eq!(rule("platform.allowed_chats", f), Apply::Live);
        assert_eq!(rule("platform.kind", f), Apply::Restart);
        assert_eq!(rule("telemetry.otlp_endpoint", f), Apply::Live);
        assert_eq!(rule("something_new", f), Apply::Restart, "unknown keys wait for a restart");
        let hermes = Facts { hermes: true, cluster: false };
        assert_eq!(rule("agent.timeout_s", hermes), Apply::Restart);
        let cluster = Facts { hermes: false, cluster: true };
        assert_eq!(rule("platform.allowed_chats", cluster), Apply::Restart);
        assert_eq!(rule("platform.admins", cluster), Apply::Live);
        assert_eq!(rule("platform.access", cluster), Apply::Live, "the access policy is read per message");
        assert_eq!(rule("platform.allowed_users", Facts::default()), Apply::Live);
    }

    #[test]
    fn live_and_restart_keys_are_told_apart() {
        let old = parse(&format!("admins = [\"a\"]\n[agent]\ntimeout_s = 10\n{TG}allowed_chats = [\"1\"]\n"));
        let new = parse(&format!(
            "listen = \"127.0.0.1:9999\"\nadmins = [\"a\", \"b\"]\n[agent]\ntimeout_s = 20\n[http]\nmax_connections = 9\n\
             {TG}allowed_chats = [\"1\", \"2\"]\nadmins = [\"x\"]\n"
        ));
        let p = plan(&old, &old, &new, Facts::default());
        assert_eq!(
            keys_of(&p.live),
            vec!["admins", "agent.timeout_s", "platform[telegram].admins", "platform[telegram].allowed_chats"]
        );
        assert_eq!(keys_of(&p.restart), vec!["http.max_connections", "listen"]);
        assert!(p.touches("agent") && !p.touches("telemetry"));
        assert_eq!(p.adapters(), BTreeSet::from(["telegram".to_owned()]));
        assert_eq!(plan(&old, &old, &old, Facts::default()), Plan::default(), "nothing changed");
    }

    #[test]
    fn a_pending_restart_key_is_reported_until_the_file_says_what_runs() {
        let boot = parse("listen = \"127.0.0.1:7000\"\n");
        let edited = parse("listen = \"127.0.0.1:7001\"\nadmins = [\"a\"]\n");
        let first = plan(&boot, &boot, &edited, Facts::default());
        assert_eq!((keys_of(&first.live), keys_of(&first.restart)), (vec!["admins"], vec!["listen"]));
        // The next reload of the same file: the admins are applied, the listener still waits.
        let again = plan(&boot, &edited, &edited, Facts::default());
        assert_eq!((keys_of(&again.live), keys_of(&again.restart)), (vec![], vec!["listen"]));
        let back = parse("listen = \"127.0.0.1:7000\"\nadmins = [\"a\"]\n");
        assert_eq!(plan(&boot, &edited, &back, Facts::default()), Plan::default());
    }

    #[test]
    fn what_applies_the_rest_is_named_by_route() {
        let change = |rule: &str| Change { key: rule.into(), rule: rule.into(), platform: None };
        assert_eq!(apply_with(RestartRoute::SpawnSuccessor, &[]), None);
        assert_eq!(
            apply_with(RestartRoute::SpawnSuccessor, &[change("http.max_connections")]),
            Some("gatewarden restart")
        );
        assert_eq!(
            apply_with(RestartRoute::SpawnSuccessor, &[change("listen")]),
            Some("gatewarden stop && gatewarden start"),
            "a successor keeps the running listen address"
        );
        assert_eq!(apply_with(RestartRoute::ExitForManager, &[change("drain_timeout_s")]), Some("gatewarden restart"));
    }

    #[test]
    fn platform_tables_are_matched_by_name() {
        let one = parse(&format!("{TG}name = \"a\"\n{TG}name = \"b\"\n"));
        let other = parse(&format!("{TG}name = \"b\"\npoll_timeout_s = 5\n{TG}name = \"c\"\n"));
        let p = plan(&one, &one, &other, Facts::default());
        assert_eq!(keys_of(&p.live), vec!["platform[b].poll_timeout_s"]);
        assert_eq!(keys_of(&p.restart), vec!["platform[a]", "platform[c]"]);
        let kind = parse(
            "[[platform]]\nkind = \"discord\"\nname = \"b\"\ntoken_env = \"T\"\napi_base = \"http://127.0.0.1:1\"\n",
        );
        let p = plan(&one, &one, &kind, Facts::default());
        assert!(keys_of(&p.restart).contains(&"platform[b].kind"), "{p:?}");
    }

    #[test]
    fn a_blocked_adapter_waits_for_a_restart_but_its_admins_do_not() {
        let old = parse(&format!("{TG}allowed_chats = [\"1\"]\n"));
        let new = parse(&format!("{TG}allowed_chats = [\"2\"]\nadmins = [\"x\"]\n"));
        let mut p = plan(&old, &old, &new, Facts::default());
        p.block("telegram");
        assert_eq!(keys_of(&p.live), vec!["platform[telegram].admins"]);
        assert_eq!(keys_of(&p.restart), vec!["platform[telegram].allowed_chats", "platform[telegram].credential"]);
        assert!(p.adapters().is_empty());
    }

    #[test]
    fn hermes_keeps_the_agent_for_a_restart() {
        let old = parse("[agent]\nbackend = \"hermes\"\nbase_url = \"http://127.0.0.1:1\"\napi_key_env = \"K\"\n");
        let new = parse(
            "[agent]\nbackend = \"hermes\"\nbase_url = \"http://127.0.0.1:1\"\napi_key_env = \"K\"\ntimeout_s = 9\n",
        );
        let p = plan(&old, &old, &new, Facts { hermes: true, cluster: false });
        assert_eq!((keys_of(&p.live), keys_of(&p.restart)), (vec![], vec!["agent.timeout_s"]));
    }
}
