//! Settings from the environment (containers, compose, Kubernetes): every key of config.toml
//! can also come from a `GATEWARDEN_…` variable. Not a second parser: the variables are laid
//! over the file's TOML document, and the result goes through the one load path (serde,
//! validation, located errors) like a file would.
//!
//! - A top-level key: `GATEWARDEN_<KEY>` (`GATEWARDEN_LISTEN`, `GATEWARDEN_DRAIN_TIMEOUT_S`); a
//!   key of a table: `GATEWARDEN_<TABLE>__<KEY>` (`GATEWARDEN_AGENT__BACKEND`,
//!   `GATEWARDEN_CLUSTER__PASSWORD_FILE`); a whole table or list of tables as inline TOML
//!   (`GATEWARDEN_CLUSTER='{name = "prod", store = "postgres://gw@db/gw"}'`,
//!   `GATEWARDEN_PLATFORM='[{kind = "telegram", token_file = "/run/secrets/tg"}]'`).
//! - A value is read as a TOML value (`20`, `true`, `["alice"]`, `"quoted"`); one that is not
//!   valid TOML is taken as a string, so addresses, URLs and tokens need no quotes. A string
//!   that would read as another type (`"123"`, `"true"`) is written with its quotes.
//! - The environment wins over the file: whole tables first, then single keys.
//! - Errors name the variable for what it set, and the file's line for the rest.
//!
//! Only the names built from the key lists are read: other `GATEWARDEN_*` variables
//! (`GATEWARDEN_HOME`, `GATEWARDEN_CONFIG`, `GATEWARDEN_SUPERVISOR`, …) are not settings;
//! `GATEWARDEN_CONFIG` names the file itself (crates/lifecycle/src/home.rs).

use std::path::Path;

use super::{
    AGENT_KEYS, CLUSTER_KEYS, Config, ConfigError, HTTP_KEYS, JOURNAL_KEYS, KeyIndex, TELEMETRY_KEYS, TOP_KEYS,
    UPDATE_KEYS,
};

/// Every variable's prefix.
pub const ENV_PREFIX: &str = "GATEWARDEN_";

/// The tables whose keys can be set one by one (lists of tables, `[[platform]]` and
/// `[[agent.provider]]`, are set whole).
const TABLES: &[(&str, &[&str])] = &[
    ("http", HTTP_KEYS),
    ("journal", JOURNAL_KEYS),
    ("agent", AGENT_KEYS),
    ("cluster", CLUSTER_KEYS),
    ("update", UPDATE_KEYS),
    ("telemetry", TELEMETRY_KEYS),
];

/// The variable for a key path: `["agent", "backend"]` → `GATEWARDEN_AGENT__BACKEND`.
pub fn var_name(path: &[&str]) -> String {
    format!("{ENV_PREFIX}{}", path.join("__").to_ascii_uppercase())
}

/// Every settable key path, whole tables before their keys (the order they are applied in).
pub fn key_paths() -> Vec<Vec<&'static str>> {
    let mut out: Vec<Vec<&str>> = TOP_KEYS.iter().map(|k| vec![*k]).collect();
    for (table, keys) in TABLES {
        out.extend(keys.iter().map(|k| vec![*table, *k]));
    }
    out
}

/// One setting the environment gave: its key path, its variable, its value.
#[derive(Debug)]
struct Setting {
    path: Vec<&'static str>,
    var: String,
    value: toml::Value,
}

/// A variable's text as a TOML value, else as a string. A text that parses as more than one
/// value (`1\nlisten = …`) is a string too: a variable never sets a key it is not named after.
fn value_of(raw: &str) -> toml::Value {
    match toml::from_str::<toml::Table>(&format!("v = {raw}")) {
        Ok(mut t) if t.len() == 1 => t.remove("v").unwrap_or_else(|| toml::Value::String(raw.to_owned())),
        _ => toml::Value::String(raw.to_owned()),
    }
}

fn settings(env: &dyn Fn(&str) -> Option<String>) -> Vec<Setting> {
    key_paths()
        .into_iter()
        .filter_map(|path| {
            let var = var_name(&path);
            let raw = env(&var)?;
            Some(Setting { value: value_of(&raw), path, var })
        })
        .collect()
}

/// `text` (config.toml, or `""` without one) with the environment's settings applied, parsed
/// and validated by [`Config::from_toml_str`]. Without any setting, exactly that.
pub(crate) fn load(
    path: &Path,
    home: &Path,
    text: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Config, ConfigError> {
    let set = settings(env);
    if set.is_empty() {
        return Config::from_toml_in(path, text, home);
    }
    // The file's own syntax errors first, on its own lines.
    let file_index = KeyIndex::build(path, text)?;
    let mut doc: toml::Table = toml::from_str(text).map_err(|e| file_index.serde_error(&e))?;
    for s in &set {
        let (last, tables) = s.path.split_last().unwrap_or((&"", &[]));
        let mut at = &mut doc;
        for t in tables {
            let entry = at.entry((*t).to_owned()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
            let Some(inner) = entry.as_table_mut() else {
                return Err(ConfigError::Env {
                    var: s.var.clone(),
                    key: (*last).to_owned(),
                    message: format!("[{t}] is not a table in {}", path.display()),
                });
            };
            at = inner;
        }
        at.insert((*last).to_owned(), s.value.clone());
    }
    let merged = toml::to_string(&doc).map_err(|e| ConfigError::Env {
        var: set[0].var.clone(),
        key: set[0].path.join("."),
        message: format!("cannot be combined with {}: {e}", path.display()),
    })?;
    Config::from_toml_in(path, &merged, home).map_err(|e| attribute(e, &set, &file_index))
}

/// An error of the merged document, told as the variable's when a variable set the key, else
/// on the file's own line.
fn attribute(e: ConfigError, set: &[Setting], file_index: &KeyIndex<'_>) -> ConfigError {
    let Some(key) = e.key().map(str::to_owned) else { return e };
    let mut full: Vec<String> = e.table().map(|t| t.split('.').map(str::to_owned).collect()).unwrap_or_default();
    full.push(key.clone());
    // The most specific setting whose path the key is under (a key beats its whole table).
    let by = set
        .iter()
        .filter(|s| s.path.len() <= full.len() && s.path.iter().zip(&full).all(|(a, b)| *a == b.as_str()))
        .max_by_key(|s| s.path.len());
    if let Some(s) = by {
        return ConfigError::Env { var: s.var.clone(), key, message: e.without_location() };
    }
    let path: Vec<&str> = full.iter().map(String::as_str).collect();
    match file_index.find(&path) {
        Some(entry) => e.at_line(file_index.line(entry.key.start)),
        None => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)], file: &str) -> Result<Config, ConfigError> {
        let env = |k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| (*v).to_owned());
        load(Path::new("/h/config.toml"), Path::new("/h"), file, &env)
    }

    #[test]
    fn every_key_can_come_from_the_environment() {
        let c = with(
            &[
                ("GATEWARDEN_LISTEN", "0.0.0.0:7878"),
                ("GATEWARDEN_API_TOKEN", "0123456789abcdef0123"),
                ("GATEWARDEN_DRAIN_TIMEOUT_S", "5"),
                ("GATEWARDEN_ADMINS", "[\"alice\"]"),
                ("GATEWARDEN_AGENT__BACKEND", "exec"),
                ("GATEWARDEN_AGENT__COMMAND", "[\"/bin/cat\"]"),
                ("GATEWARDEN_HTTP__ALLOWED_HOSTS", "[\"gw.example.com\"]"),
                ("GATEWARDEN_PLATFORM", "[{kind = \"telegram\", token_env = \"TG\"}]"),
                ("GATEWARDEN_CLUSTER", "{name = \"prod\", store = \"postgres://gw@db:5432/gw\"}"),
                ("GATEWARDEN_CLUSTER__PASSWORD_FILE", "/run/secrets/pg"),
                // Not settings: ignored.
                ("GATEWARDEN_HOME", "/data"),
                ("GATEWARDEN_SUPERVISOR", "container"),
            ],
            "",
        )
        .unwrap();
        assert_eq!(c.listen.to_string(), "0.0.0.0:7878");
        assert_eq!(c.api_token.as_deref(), Some("0123456789abcdef0123"));
        assert_eq!(c.drain_timeout_s, 5);
        assert_eq!(c.admins, ["alice"]);
        assert_eq!(c.agent.command, ["/bin/cat"]);
        assert_eq!(c.http.allowed_hosts, ["gw.example.com"]);
        assert_eq!(c.platform.len(), 1);
        let cl = c.cluster.unwrap();
        assert_eq!((cl.name.as_str(), cl.password_file.as_deref()), ("prod", Some(Path::new("/run/secrets/pg"))));
        // A string that would read as a number keeps its quotes.
        let c = with(&[("GATEWARDEN_API_TOKEN", "\"1234567890123456\"")], "").unwrap();
        assert_eq!(c.api_token.as_deref(), Some("1234567890123456"));
    }

    #[test]
    fn the_environment_wins_over_the_file_and_keys_over_their_table() {
        let file = "listen = \"127.0.0.1:1\"\ndrain_timeout_s = 9\n[agent]\nbackend = \"echo\"\ndelay_ms = 7\n";
        let c = with(&[("GATEWARDEN_LISTEN", "127.0.0.1:2"), ("GATEWARDEN_AGENT__DELAY_MS", "8")], file).unwrap();
        assert_eq!((c.listen.port(), c.drain_timeout_s, c.agent.delay_ms), (2, 9, 8));
        let c = with(
            &[("GATEWARDEN_AGENT", "{backend = \"echo\", delay_ms = 1}"), ("GATEWARDEN_AGENT__DELAY_MS", "3")],
            file,
        )
        .unwrap();
        assert_eq!(c.agent.delay_ms, 3);
    }

    #[test]
    fn errors_name_the_variable_or_the_files_line() {
        let e = with(&[("GATEWARDEN_DRAIN_TIMEOUT_S", "soon")], "").unwrap_err().to_string();
        assert!(e.starts_with("GATEWARDEN_DRAIN_TIMEOUT_S (environment): invalid value for 'drain_timeout_s'"), "{e}");
        let e = with(&[("GATEWARDEN_AGENT", "{backend = \"exec\", bogus = 1}")], "").unwrap_err().to_string();
        assert!(e.starts_with("GATEWARDEN_AGENT (environment): unknown key 'bogus' in [agent]"), "{e}");
        // A key of the file keeps its own line, though the environment set another.
        let file = "# one\n\n[http]\nmax_connections = 0\n";
        let e = with(&[("GATEWARDEN_LISTEN", "127.0.0.1:2")], file).unwrap_err().to_string();
        assert!(e.starts_with("/h/config.toml:4: invalid value for 'max_connections' in [http]"), "{e}");
        let e = with(&[("GATEWARDEN_LISTEN", "127.0.0.1:2")], "[agent\n").unwrap_err().to_string();
        assert!(e.starts_with("/h/config.toml:1:"), "{e}");
        // Nothing set: the file alone, as before.
        assert!(with(&[], "listen = 1\n").unwrap_err().to_string().starts_with("/h/config.toml:1:"));
        // A variable never sets a key it is not named after.
        let e = with(&[("GATEWARDEN_DRAIN_TIMEOUT_S", "1\nlisten = \"0.0.0.0:1\"")], "").unwrap_err().to_string();
        assert!(e.contains("GATEWARDEN_DRAIN_TIMEOUT_S"), "{e}");
    }

    #[test]
    fn names() {
        assert_eq!(var_name(&["agent", "api_key_env"]), "GATEWARDEN_AGENT__API_KEY_ENV");
        assert!(key_paths().contains(&vec!["listen"]));
        assert!(key_paths().contains(&vec!["cluster", "password_file"]));
        assert!(key_paths().contains(&vec!["platform"]));
    }
}
