//! `gatewarden init`: the first hour in one command. One chat platform and one agent backend,
//! asked on a terminal or given as flags (a flag given is never asked; without a terminal, or
//! with `--no-input`, nothing is asked and what is missing is an error). Secrets go to
//! `<home>/secrets.env` through the config crate's one writer (crates/config/src/secrets.rs),
//! never to `config.toml`, which gets the rest with a comment on each key. Credentials are tried
//! where they can be (Telegram `getMe`, the provider's `/models`, `probe.rs`, a few seconds
//! each): a refused one is asked again or refused before anything is written; an upstream that
//! cannot be reached is a warning (offline works). Then `check` runs on what was written and
//! the next step is printed.
//!
//! An existing `config.toml` is never overwritten without `--force`, and then kept as
//! `config.toml.bak-<time>`. Questions and progress go to stderr, the summary to stdout
//! (`--json`: one document, docs/protocol.md §6.3). Exit 0 written and `check` passes; 1
//! otherwise (nothing written when refused before writing).

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use gatewarden_config::Secret;
use gatewarden_lifecycle::Home;
use gatewarden_net::Outbound;
use serde_json::{Value, json};

use crate::options::InitArgs;
use crate::probe::{self, Verdict};
use crate::ui::{Tone, paint, paint_err};

const DEFAULT_TOKEN_ENV: &str = "TELEGRAM_BOT_TOKEN";
const DEFAULT_KEY_ENV: &str = "OPENAI_API_KEY";
const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";
const DEFAULT_MODEL: &str = "gpt-4o-mini";
const DEFAULT_LISTEN: &str = "127.0.0.1:7878";
/// A typed credential the upstream refuses is asked again this many times in all.
const TRIES: usize = 3;

/// The platform `init` sets up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Platform {
    Telegram,
    None,
}

impl Platform {
    pub fn parse(s: &str) -> Option<Platform> {
        match s.trim().to_ascii_lowercase().as_str() {
            "telegram" => Some(Platform::Telegram),
            "none" => Some(Platform::None),
            _ => None,
        }
    }
}

/// The agent backend `init` sets up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Openai,
    Echo,
}

impl Backend {
    pub fn parse(s: &str) -> Option<Backend> {
        match s.trim().to_ascii_lowercase().as_str() {
            "openai" => Some(Backend::Openai),
            "echo" => Some(Backend::Echo),
            _ => None,
        }
    }
}

/// Everything `init` writes, decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answers {
    pub listen: String,
    pub platform: Platform,
    pub token_env: String,
    pub api_base: Option<String>,
    pub admins: Vec<String>,
    pub backend: Backend,
    pub base_url: String,
    pub model: String,
    pub key_env: String,
}

/// Where an answer comes from: a person at a terminal, or nobody.
struct Asker {
    interactive: bool,
}

impl Asker {
    /// The answer to `question` (`default` on an empty line); without a terminal, `default` or
    /// an error naming `flag`.
    fn ask(&self, question: &str, default: Option<&str>, flag: &str) -> crate::Result<String> {
        if !self.interactive {
            return default.map(str::to_owned).ok_or_else(|| {
                crate::Error::msg(format!("{question}: give it with {flag} (nothing is asked without a terminal)"))
            });
        }
        let shown = default.filter(|d| !d.is_empty()).map(|d| format!(" [{d}]")).unwrap_or_default();
        prompt(&format!("{question}{shown}: "));
        let mut line = String::new();
        if std::io::stdin().lock().read_line(&mut line)? == 0 {
            crate::bail!("no answer to \"{question}\" (end of input)");
        }
        let line = line.trim();
        Ok(match (line.is_empty(), default) {
            (true, Some(d)) => d.to_owned(),
            _ => line.to_owned(),
        })
    }

    /// One of `choices` (the first is the default).
    fn choose<T>(
        &self,
        question: &str,
        choices: &[&str],
        parse: impl Fn(&str) -> Option<T>,
        flag: &str,
    ) -> crate::Result<T> {
        loop {
            let answer = self.ask(&format!("{question} ({})", choices.join(", ")), choices.first().copied(), flag)?;
            match parse(&answer) {
                Some(t) => return Ok(t),
                None if self.interactive => note(Tone::Warn, &format!("please answer one of: {}", choices.join(", "))),
                None => crate::bail!("{flag}: {answer:?} is not one of {}", choices.join(", ")),
            }
        }
    }

    /// A secret, typed without echo.
    fn secret(&self, question: &str, var: &str) -> crate::Result<Secret> {
        if !self.interactive {
            crate::bail!(
                "{question}: set {var} in init's environment (it is written to secrets.env), or add {var}=… to secrets.env"
            );
        }
        loop {
            prompt(&format!("{question} (not shown): "));
            let line = gatewarden_lifecycle::platform::read_hidden_line()?;
            if line.is_empty() {
                crate::bail!("no answer to \"{question}\" (end of input)");
            }
            let v = line.trim();
            if !v.is_empty() {
                return Ok(Secret::new(v));
            }
            note(Tone::Warn, "it cannot be empty");
        }
    }
}

fn prompt(text: &str) {
    let mut err = std::io::stderr().lock();
    let _ = write!(err, "{text}");
    let _ = err.flush();
}

/// A line on stderr (what `init` found and does).
fn note(tone: Tone, text: &str) {
    errln!("{}", paint_err(tone, text));
}

/// What was found about one credential, for the summary and `--json`.
#[derive(Debug, Clone)]
struct Tried {
    what: &'static str,
    verdict: &'static str,
    detail: String,
}

pub fn init(home: &Home, a: InitArgs) -> crate::Result<ExitCode> {
    let asker = Asker { interactive: !a.no_input && std::io::stdin().is_terminal() && std::io::stderr().is_terminal() };
    let refuse = |why: String| -> crate::Result<ExitCode> {
        if a.json {
            crate::ui::print_json(&json!({"ok": false, "written": false, "reason": why}));
        } else {
            errln!("gatewarden init: {why}");
        }
        Ok(ExitCode::from(1))
    };
    let home = match home.ensure() {
        Ok(h) => h,
        Err(e) => return refuse(e.to_string()),
    };
    let config_path = home.config_file();
    let exists = std::fs::symlink_metadata(&config_path).is_ok();
    if exists && !a.force {
        return refuse(format!(
            "{} already exists; init never overwrites it: `gatewarden init --force` replaces it and keeps the old one beside it as {}.bak-<time>",
            config_path.display(),
            file_name(&config_path)
        ));
    }
    let existing = existing_secrets(&home);
    let out = Outbound::system();
    let mut tried: Vec<Tried> = Vec::new();
    let mut secrets: Vec<(String, Secret)> = Vec::new();
    let mut bot_name: Option<String> = None;

    if asker.interactive && !a.json {
        note(Tone::Dim, &format!("setting up {} (Ctrl-C leaves it as it was)", home.dir().display()));
    }
    let answered = (|| -> crate::Result<Answers> {
        let platform = match a.platform.as_deref() {
            Some(p) => {
                Platform::parse(p).ok_or_else(|| crate::Error::msg(format!("--platform {p:?}: telegram or none")))?
            }
            None => asker.choose("Chat platform", &["telegram", "none"], Platform::parse, "--platform")?,
        };
        let token_env = a.token_env.clone().unwrap_or_else(|| DEFAULT_TOKEN_ENV.to_owned());
        let mut admins = a.admins.clone();
        if platform == Platform::Telegram {
            let api_base = a.api_base.clone().unwrap_or_else(|| probe::TELEGRAM_API.to_owned());
            let check = |token: &Secret| match a.offline {
                true => Verdict::Unreachable("not tried (--offline)".into()),
                false => probe::telegram(&api_base, token.expose(), &out),
            };
            let (token, verdict) =
                credential(&asker, "Telegram bot token (from @BotFather)", &token_env, &existing, check)?;
            if let Verdict::Accepted(w) = &verdict {
                bot_name = w.strip_prefix("bot @").and_then(|r| r.split(' ').next()).map(str::to_owned);
            }
            tried.push(tried_of("telegram bot token", &verdict));
            if let Some(t) = token {
                secrets.push((token_env.clone(), t));
            }
            if admins.is_empty() && asker.interactive {
                let id = asker.ask(
                    "Your Telegram user id, the bot's owner, who may /restart and /stop it (@userinfobot tells it; empty: nobody)",
                    Some(""),
                    "--admin",
                )?;
                admins.extend(id.split([',', ' ']).filter(|s| !s.is_empty()).map(str::to_owned));
            }
            if let Some(bad) = admins.iter().find(|id| !id.chars().all(|c| c.is_ascii_digit()) || id.is_empty()) {
                crate::bail!("--admin {bad:?}: a Telegram user id is a number (@userinfobot tells it)");
            }
        }
        let backend = match a.backend.as_deref() {
            Some(b) => {
                Backend::parse(b).ok_or_else(|| crate::Error::msg(format!("--backend {b:?}: openai or echo")))?
            }
            None => asker.choose("Agent backend", &["openai", "echo"], Backend::parse, "--backend")?,
        };
        let key_env = a.api_key_env.clone().unwrap_or_else(|| DEFAULT_KEY_ENV.to_owned());
        let mut base_url = DEFAULT_BASE_URL.to_owned();
        let mut model = DEFAULT_MODEL.to_owned();
        if backend == Backend::Openai {
            base_url = match &a.base_url {
                Some(u) => u.clone(),
                None => {
                    asker.ask("Provider base URL (any OpenAI-compatible API)", Some(DEFAULT_BASE_URL), "--base-url")?
                }
            };
            if !(base_url.starts_with("https://") || base_url.starts_with("http://")) {
                crate::bail!("--base-url {base_url:?}: an http:// or https:// URL");
            }
            let mut listed: Vec<String> = Vec::new();
            let check = |key: &Secret| match a.offline {
                true => (Verdict::Unreachable("not tried (--offline)".into()), Vec::new()),
                false => probe::provider(&base_url, Some(key.expose()), &out),
            };
            let (key, verdict) = credential(&asker, "Provider API key", &key_env, &existing, |k| {
                let (v, models) = check(k);
                listed = models;
                v
            })?;
            tried.push(tried_of("provider API key", &verdict));
            if let Some(k) = key {
                secrets.push((key_env.clone(), k));
            }
            let suggested = match listed.iter().any(|m| m == DEFAULT_MODEL) || listed.is_empty() {
                true => DEFAULT_MODEL.to_owned(),
                false => listed[0].clone(),
            };
            model = match &a.model {
                Some(m) => m.clone(),
                None => asker.ask("Model", Some(&suggested), "--model")?,
            };
            if !listed.is_empty() && !listed.contains(&model) {
                tried.push(Tried {
                    what: "model",
                    verdict: "warning",
                    detail: format!("{model} is not among the {} models the provider lists", listed.len()),
                });
            }
        }
        Ok(Answers {
            listen: a.listen.clone().unwrap_or_else(|| DEFAULT_LISTEN.to_owned()),
            platform,
            token_env,
            api_base: a.api_base.clone(),
            admins,
            backend,
            base_url,
            model,
            key_env,
        })
    })();
    let answers = match answered {
        Ok(x) => x,
        Err(e) => return refuse(format!("{e:#} (nothing was written)")),
    };

    // What would be written must load, before anything is.
    let text = render(&answers, &home);
    if let Err(e) = gatewarden_config::Config::from_toml_str(&config_path, &text) {
        return refuse(format!("the configuration would not load: {e} (nothing was written)"));
    }
    // Secrets first: a config never names a secret that is not there yet.
    let mut secrets_file = None;
    if !secrets.is_empty() {
        let set: Vec<(&str, &Secret)> = secrets.iter().map(|(k, v)| (k.as_str(), v)).collect();
        match gatewarden_config::secrets::set_env_lines(home.dir(), &set) {
            Ok(p) => secrets_file = Some(p),
            Err(why) => return refuse(format!("cannot write the secrets: {why} (nothing was written)")),
        }
    }
    let backup = match exists {
        true => match backup_of(&config_path) {
            Ok(p) => Some(p),
            Err(why) => return refuse(format!("cannot keep the old configuration: {why}")),
        },
        false => None,
    };
    gatewarden_lifecycle::fsio::atomic_write(&config_path, text.as_bytes())
        .map_err(|e| crate::Error::msg(format!("cannot write {}: {e}", config_path.display())))?;

    let check = crate::check::report(&home)?;
    let ok = check.ok();
    let next = next_steps(&home, ok);
    if a.json {
        crate::ui::print_json(&json!({
            "ok": ok,
            "written": {"config": config_path, "secrets": secrets_file, "backup": backup},
            "platform": match answers.platform { Platform::Telegram => "telegram", Platform::None => "none" },
            "backend": match answers.backend { Backend::Openai => "openai", Backend::Echo => "echo" },
            "bot": bot_name,
            "credentials": tried.iter().map(|t| json!({"what": t.what, "verdict": t.verdict, "detail": t.detail}))
                .collect::<Vec<Value>>(),
            "check": check.to_json(),
            "next": next,
        }));
        return Ok(ExitCode::from(if ok { 0 } else { 1 }));
    }
    for t in &tried {
        let tone = match t.verdict {
            "accepted" => Tone::Good,
            "rejected" => Tone::Bad,
            _ => Tone::Warn,
        };
        outln!("{} {}: {}", paint(tone, t.verdict), t.what, t.detail);
    }
    if let Some(b) = &backup {
        outln!("kept the old configuration as {}", b.display());
    }
    outln!("wrote {}", config_path.display());
    if let Some(s) = &secrets_file {
        outln!("wrote the secrets to {} (mode 0600)", s.display());
    }
    outln!("check:");
    check.print();
    match ok {
        true => outln!("next:"),
        false => outln!("{} fix what check says, then:", paint(Tone::Bad, "not ready:")),
    }
    for n in &next {
        outln!("  {n}");
    }
    if let Some(b) = &bot_name {
        outln!("then say hello to your bot: https://t.me/{b}");
    }
    Ok(ExitCode::from(if ok { 0 } else { 1 }))
}

/// A credential: the environment variable `var` given to `init`, else the line already in
/// secrets.env (kept as it is), else typed (asked again while `try_it` says rejected). A
/// rejected one from the environment or secrets.env is refused, naming where it came from.
/// `(the value to write, or None to keep the file's; the verdict)`.
fn credential(
    asker: &Asker,
    question: &str,
    var: &str,
    existing: &[(String, Secret)],
    mut try_it: impl FnMut(&Secret) -> Verdict,
) -> crate::Result<(Option<Secret>, Verdict)> {
    let from_env = std::env::var(var).ok().map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
    let given = match from_env {
        Some(v) => Some((Secret::new(v), "init's environment", true)),
        None => existing.iter().find(|(k, _)| k == var).map(|(_, v)| (v.clone(), "secrets.env", false)),
    };
    if let Some((secret, whence, write)) = given {
        if asker.interactive {
            note(Tone::Dim, &format!("{question}: {var} from {whence}"));
        }
        let verdict = try_it(&secret);
        if let Verdict::Rejected(why) = &verdict {
            crate::bail!("{var} from {whence} is refused: {why}");
        }
        return Ok((write.then_some(secret), verdict));
    }
    for n in 1..=TRIES {
        let secret = asker.secret(question, var)?;
        let verdict = try_it(&secret);
        match &verdict {
            Verdict::Rejected(why) if n < TRIES => note(Tone::Bad, &format!("refused: {why}; try again")),
            Verdict::Rejected(why) => crate::bail!("refused {TRIES} times: {why}"),
            _ => return Ok((Some(secret), verdict)),
        }
    }
    crate::bail!("refused {TRIES} times")
}

fn tried_of(what: &'static str, v: &Verdict) -> Tried {
    let (verdict, detail) = match v {
        Verdict::Accepted(d) => ("accepted", d.clone()),
        Verdict::Rejected(d) => ("rejected", d.clone()),
        Verdict::Unreachable(d) => ("not tried", format!("{d}; it is tried again when the gateway starts")),
    };
    if verdict == "not tried" && !detail.starts_with("not tried (--offline)") {
        note(Tone::Warn, &format!("warning: {what} could not be tried: {detail}"));
    }
    Tried { what, verdict, detail }
}

/// The lines secrets.env holds now (none when it is missing or cannot be used: then each
/// secret is asked, and writing tells why the file cannot be used).
fn existing_secrets(home: &Home) -> Vec<(String, Secret)> {
    gatewarden_config::secrets::read_env_lines(home.dir()).unwrap_or_default()
}

/// `config.toml.bak-<UTC time>`: a copy of the old file, private like it.
fn backup_of(path: &Path) -> Result<PathBuf, String> {
    let stamp = gatewarden_lifecycle::timefmt::now().replace([':', '-'], "").chars().take(15).collect::<String>();
    let backup = path.with_file_name(format!("{}.bak-{stamp}", file_name(path)));
    let old = match gatewarden_lifecycle::fsio::read_capped(path, 1 << 20) {
        gatewarden_lifecycle::fsio::ReadOutcome::Ok(b) => b,
        other => return Err(format!("{}: {}", path.display(), other.describe())),
    };
    gatewarden_lifecycle::fsio::atomic_write(&backup, &old).map_err(|e| format!("{}: {e}", backup.display()))?;
    Ok(backup)
}

fn file_name(p: &Path) -> String {
    p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "config.toml".into())
}

/// What to run next, with `--home` (and `--config`) when they are not the defaults.
fn next_steps(home: &Home, ok: bool) -> Vec<String> {
    let env_home = |k: &str| std::env::var_os(k).filter(|_| k != "GATEWARDEN_HOME");
    let default = gatewarden_lifecycle::home::resolve_with(None, env_home).ok();
    let mut gw = "gatewarden".to_owned();
    if default
        .as_deref()
        .is_none_or(|d| gatewarden_lifecycle::platform::canonical(d).ok().as_deref() != Some(home.dir()))
    {
        gw.push_str(&format!(" --home {}", shell_word(&home.dir().to_string_lossy())));
    }
    if let Some(c) = std::env::var_os(gatewarden_lifecycle::home::CONFIG_ENV).filter(|c| !c.is_empty()) {
        gw.push_str(&format!(" --config {}", shell_word(&c.to_string_lossy())));
    }
    match ok {
        true => vec![
            format!("{gw} start            # run it in the background now"),
            format!("{gw} service install  # or: run it as a service (starts at login, restarted when it fails)"),
        ],
        false => vec![format!("{gw} check"), format!("{gw} start")],
    }
}

/// A path as one shell word.
fn shell_word(s: &str) -> String {
    match s.chars().all(|c| c.is_ascii_alphanumeric() || "/._-+:@%".contains(c)) {
        true => s.to_owned(),
        false => format!("'{}'", s.replace('\'', r"'\''")),
    }
}

/// A TOML string.
fn q(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// The commented `config.toml` for `a`. Pure but for the date in its first line.
pub fn render(a: &Answers, home: &Home) -> String {
    let secrets = home.dir().join(gatewarden_config::secrets::SECRETS_FILE);
    let mut t = String::new();
    t.push_str(&format!(
        "# gatewarden configuration, written by `gatewarden init` ({}).\n\
         # Every key is documented in crates/config/config.example.toml (README, \"Configuration\").\n\
         # No secret is in this file: each *_env key names a line of {} (README, \"Secrets\").\n\
         # After an edit: `gatewarden check`, then `gatewarden reload` (or `restart` for what reload names).\n\n",
        gatewarden_lifecycle::timefmt::now(),
        secrets.display()
    ));
    t.push_str("# The HTTP API and the dashboard (/ui). A loopback address: this machine only.\n");
    t.push_str(&format!("listen = {}\n", q(&a.listen)));
    t.push_str("\n[agent]\n");
    match a.backend {
        Backend::Echo => {
            t.push_str("# echo: every message is answered with itself; set an `openai` backend to talk to a model\n");
            t.push_str("# (`gatewarden init --force`, or see README, \"Configuration\").\n");
            t.push_str("backend = \"echo\"\n");
        }
        Backend::Openai => {
            t.push_str("# Any OpenAI-compatible chat completions API.\nbackend = \"openai\"\n");
            t.push_str(&format!("base_url = {}\n", q(&a.base_url)));
            t.push_str(&format!("model = {}\n", q(&a.model)));
            t.push_str(&format!("# The API key: the line {}=… of secrets.env.\n", a.key_env));
            t.push_str(&format!("api_key_env = {}\n", q(&a.key_env)));
            t.push_str("# A whole run, retries and fallbacks included; add [[agent.provider]] tables for fallbacks.\n");
            t.push_str("timeout_s = 120\n");
        }
    }
    if a.platform == Platform::Telegram {
        t.push_str("\n[[platform]]\nkind = \"telegram\"\n");
        t.push_str(&format!("# The bot token: the line {}=… of secrets.env.\n", a.token_env));
        t.push_str(&format!("token_env = {}\n", q(&a.token_env)));
        t.push_str("# Telegram user ids that always reach the agent and may run /restart, /stop, /update,\n");
        t.push_str("# /approve CODE and /revoke USER from a chat.\n");
        let admins: Vec<String> = a.admins.iter().map(|x| q(x)).collect();
        t.push_str(&format!("admins = [{}]\n", admins.join(", ")));
        t.push_str("# Anyone else first gets a pairing code, which you approve with\n");
        t.push_str("# `gatewarden pairing approve telegram CODE` (README \"Access\"); \"allowlist\": no codes.\n");
        t.push_str("access = \"pairing\"\n# User ids that need no code.\nallowed_users = []\n");
        t.push_str("# Groups served (there the bot answers when mentioned or replied to); empty: none.\n");
        t.push_str("allowed_chats = []\n");
        match &a.api_base {
            Some(b) => t.push_str(&format!("# Another Bot API server.\napi_base = {}\n", q(b))),
            None => t.push_str("# api_base = \"https://api.telegram.org\"   # another Bot API server\n"),
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answers() -> Answers {
        Answers {
            listen: "127.0.0.1:0".into(),
            platform: Platform::Telegram,
            token_env: "TG_TOKEN".into(),
            api_base: Some("http://127.0.0.1:9".into()),
            admins: vec!["42".into()],
            backend: Backend::Openai,
            base_url: "https://llm.example/v1".into(),
            model: "m \"quoted\"".into(),
            key_env: "LLM_KEY".into(),
        }
    }

    #[test]
    fn the_written_config_loads_and_holds_no_secret() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::at(dir.path());
        let text = render(&answers(), &home);
        let c = gatewarden_config::Config::from_toml_str(&dir.path().join("config.toml"), &text).unwrap();
        assert_eq!(c.agent.model.as_deref(), Some("m \"quoted\""));
        assert_eq!(c.agent.api_key_env.as_deref(), Some("LLM_KEY"));
        assert_eq!(c.platform[0].token_env.as_deref(), Some("TG_TOKEN"));
        assert_eq!(c.platform[0].admins, ["42"]);
        // The access policy is written out, so `check` has no default to warn about.
        let said = gatewarden_runtime::access::said(&c);
        assert!(said.iter().all(|s| !s.implicit && !s.open), "{:?}", said.iter().map(|s| &s.text).collect::<Vec<_>>());
        assert!(text.lines().filter(|l| l.starts_with('#')).count() >= 8, "commented:\n{text}");
        let echo = Answers { backend: Backend::Echo, platform: Platform::None, ..answers() };
        let c =
            gatewarden_config::Config::from_toml_str(&dir.path().join("config.toml"), &render(&echo, &home)).unwrap();
        assert!(c.platform.is_empty());
    }

    #[test]
    fn a_path_is_one_shell_word() {
        assert_eq!(shell_word("/home/a/.local/state/gatewarden"), "/home/a/.local/state/gatewarden");
        assert_eq!(shell_word("/tmp/my home/it's"), r"'/tmp/my home/it'\''s'");
    }
}
