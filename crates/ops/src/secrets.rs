//! What `check` and `doctor` say about the configuration's secrets, resolved here the way the
//! gateway resolves them (crates/config/src/secrets.rs): each missing or unreadable one named
//! with how to give it, and each that only an environment holds. A secret only this shell has
//! is lost on every start this shell does not make (a service, the dashboard's Start); one only
//! the running gateway's environment has is inherited by its successor but by no fresh start.
//! A `*_file` this user cannot read (a root-only file of a system unit) passes when the
//! installed systemd unit loads it as a credential: systemd reads it, not us.

use std::time::Duration;

use gatewarden_config::secrets::{Named, Problem, Source, credential_id};
use gatewarden_config::{Config, Secrets};
use gatewarden_control::Endpoint;
use gatewarden_lifecycle::Home;

/// How a secret stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Ok,
    /// Found, but a start from elsewhere would not find it.
    Warn,
    /// A gateway could not start here.
    Fail,
}

/// One secret (or `secrets.env` itself), in words: never a value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub level: Level,
    pub detail: String,
}

/// How long the running gateway may take to say where its secrets came from.
const ASK: Duration = Duration::from_millis(500);

/// Each secret of `config` for `home`, as a gateway started now would find it.
pub fn verdicts(home: &Home, config: &Config) -> Vec<Verdict> {
    let secrets = Secrets::resolve(home.dir(), config);
    let fail = |detail: String| Verdict { level: Level::Fail, detail };
    // The problems that are not about one secret (an unusable secrets.env) come first.
    let per_secret: Vec<String> = secrets.entries().iter().filter_map(|e| e.problem()).collect();
    let mut out: Vec<Verdict> = secrets.problems().into_iter().filter(|p| !per_secret.contains(p)).map(fail).collect();
    // Asked only when a secret is missing here: each costs a round trip.
    let live = std::cell::OnceCell::new();
    let loaded = std::cell::OnceCell::new();
    for e in secrets.entries() {
        let what = e.spec.what();
        out.push(match &e.outcome {
            Ok(found) if found.source == Source::Environment => Verdict {
                level: Level::Warn,
                detail: e.only_in_environment(secrets.env_file(), "this shell").unwrap_or(what),
            },
            Ok(found) => Verdict { level: Level::Ok, detail: format!("{what}: from {}", found.source) },
            Err(Problem::Unset { var, env_file })
                if live.get_or_init(|| live_environment_secrets(home)).contains(&e.spec.named_as()) =>
            {
                let detail = format!(
                    "{what}: {var} ({}_env) comes only from the running gateway's environment: its successor inherits it, but no fresh start (a service, the dashboard's Start, this shell) has it; add the line {var}=… to {} (mode 0600)",
                    e.spec.key(),
                    env_file.display()
                );
                Verdict { level: Level::Warn, detail }
            }
            Err(Problem::File { why, .. })
                if matches!(&e.spec.named, Named::File(p)
                    if loaded.get_or_init(|| unit_credentials(home)).contains(&credential_id(p))) =>
            {
                Verdict {
                    level: Level::Ok,
                    detail: format!("{what}: loaded by the installed systemd unit as a credential (not usable here: {why})"),
                }
            }
            Err(_) => fail(e.problem().unwrap_or(what)),
        });
    }
    out
}

/// The credential names the installed systemd unit loads (`LoadCredential=<id>:<path>`).
fn unit_credentials(home: &Home) -> Vec<String> {
    let Some(m) = crate::owner::installed(home) else { return Vec::new() };
    let Some(text) = m.managed().state.path.as_ref().and_then(|p| std::fs::read_to_string(p).ok()) else {
        return Vec::new();
    };
    let unit = gatewarden_service::systemd::unit_file::parse_unit(&text);
    let lines = unit.get_list("Service", "LoadCredential").unwrap_or_default();
    lines.iter().filter_map(|l| l.split_once(':').map(|(id, _)| id.to_owned())).collect()
}

/// The secrets (as `named_as`) the running gateway of `home`, if any, found in its environment.
fn live_environment_secrets(home: &Home) -> Vec<String> {
    let Ok(status) = crate::ready::status_of(&Endpoint::for_home(home.dir()), ASK) else { return Vec::new() };
    let Some(list) = status.extra.get("secrets").and_then(|v| v.as_array()) else { return Vec::new() };
    list.iter()
        .filter(|s| s["source"] == "environment")
        .filter_map(|s| s["named"].as_str().map(str::to_owned))
        .collect()
}
