//! systemd units for a hermes home: finding hermes's own `hermes-gateway*.service` for the
//! home (two managers must never own one gateway), and rendering ours, which runs
//! `gatewarden --hermes-home DIR supervise`.
//!
//! hermes's generated unit (0.19, `hermes_cli/gateway.py` `generate_systemd_unit`) and what
//! ours changes is listed in [`FIXES`]; `service install --print` shows it as comments.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::home::HermesHome;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    User,
    System,
}

/// A hermes-generated unit that manages this home.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HermesUnit {
    pub name: String,
    pub path: PathBuf,
    pub scope: Scope,
    pub enabled: bool,
}

/// hermes's units for `home`, in the user's and the system's unit directories.
pub fn find_hermes_units(home: &HermesHome) -> Vec<HermesUnit> {
    let user_home = std::env::var_os("HOME").filter(|h| !h.is_empty()).map(PathBuf::from);
    let mut dirs = Vec::new();
    if let Some(d) = user_unit_dir() {
        dirs.push((d, Scope::User));
    }
    dirs.push((PathBuf::from("/etc/systemd/system"), Scope::System));
    find_hermes_units_in(home, &dirs, user_home.map(|h| h.join(".hermes")).as_deref())
}

/// [`find_hermes_units`] over explicit directories; `default_home` is hermes's `~/.hermes`,
/// which a unit without `HERMES_HOME` manages.
pub fn find_hermes_units_in(
    home: &HermesHome,
    dirs: &[(PathBuf, Scope)],
    default_home: Option<&Path>,
) -> Vec<HermesUnit> {
    let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let ours = canon(home.dir());
    let mut out = Vec::new();
    for (dir, scope) in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else { continue };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !(name.starts_with("hermes-gateway") && name.ends_with(".service")) {
                continue;
            }
            let Ok(text) = std::fs::read_to_string(e.path()) else { continue };
            let manages = match unit_hermes_home(&text) {
                Some(h) => canon(Path::new(&h)) == ours,
                None => default_home.is_some_and(|d| canon(d) == ours),
            };
            if manages {
                out.push(HermesUnit { enabled: is_enabled(dir, &name), name, path: e.path(), scope: *scope });
            }
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// The `HERMES_HOME` a unit sets (`Environment="HERMES_HOME=…"` or unquoted).
pub fn unit_hermes_home(text: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let v = l.trim().strip_prefix("Environment=")?.trim().trim_matches('"');
        v.strip_prefix("HERMES_HOME=").map(|h| h.trim_matches('"').to_owned())
    })
}

fn is_enabled(dir: &Path, name: &str) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else { return false };
    entries.flatten().any(|e| e.file_name().to_string_lossy().ends_with(".wants") && e.path().join(name).exists())
}

/// Where the user manager reads units: `$XDG_CONFIG_HOME/systemd/user`, else
/// `~/.config/systemd/user`.
pub fn user_unit_dir() -> Option<PathBuf> {
    let set = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    set("XDG_CONFIG_HOME")
        .filter(|p| p.is_absolute())
        .or_else(|| set("HOME").map(|h| h.join(".config")))
        .map(|c| c.join("systemd/user"))
}

/// Our unit file for `home`, if installed (user or system scope).
pub fn find_our_unit(home: &HermesHome) -> Option<PathBuf> {
    let name = unit_name(home);
    let user = user_unit_dir();
    user.into_iter().chain([PathBuf::from("/etc/systemd/system")]).map(|d| d.join(&name)).find(|p| p.exists())
}

/// What rendering needs.
#[derive(Debug, Clone)]
pub struct UnitOptions {
    pub home: HermesHome,
    /// Absolute path of the gatewarden binary.
    pub gatewarden: PathBuf,
    /// Absolute path of hermes's executable (`$VENV/bin/hermes`).
    pub hermes: PathBuf,
    pub scope: Scope,
    /// hermes's `restart_drain_timeout` (default 0); the stop timeout adds 30 s to it.
    pub drain_timeout_s: u64,
    /// `User=`/`Group=` (numeric): a system unit always has them ([`run_as_for`]: the home's
    /// owner, root included), so supervise and hermes run as the home's owner, never as root
    /// against a folder another user controls. A user unit has none (it runs as its manager's
    /// user).
    pub run_as: Option<(u32, u32)>,
}

/// Whom a unit for a home owned by `owner` (uid, gid) runs as, installed by `me` in `scope`:
/// the one rule of native and hermes units (`gatewarden_service::spec::run_as_for`): a system
/// unit always as the home's owner, root's included.
pub fn run_as_for(scope: Scope, owner: Option<(u32, u32)>, me: Option<u32>) -> Result<Option<(u32, u32)>, String> {
    let scope = match scope {
        Scope::User => gatewarden_service::Scope::User,
        Scope::System => gatewarden_service::Scope::System,
    };
    gatewarden_service::spec::run_as_for(scope, owner, me)
}

/// Our unit's name for a home: never `hermes-gateway*`, so hermes's boot-time unit refresh
/// and its `systemd-run` restart shortcut never match it.
pub fn unit_name(home: &HermesHome) -> String {
    let canon = home.display();
    let name = Path::new(&canon).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let parent_is_profiles = Path::new(&canon).parent().and_then(Path::file_name).is_some_and(|p| p == "profiles");
    let ok = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if name == ".hermes" {
        "gatewarden-hermes.service".into()
    } else if parent_is_profiles && ok(&name) {
        format!("gatewarden-hermes-{name}.service")
    } else {
        format!("gatewarden-hermes-{:08x}.service", fnv1a(canon.as_bytes()) as u32)
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

/// Quotes one word for an `ExecStart=` line and escapes `%` (systemd specifiers).
fn word(s: &str) -> String {
    let s = s.replace('%', "%%");
    if s.chars().any(|c| c.is_whitespace() || c == '"' || c == '\\' || c == '\'') {
        format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
    } else {
        s
    }
}

/// The unit text.
pub fn render(o: &UnitOptions) -> String {
    let home = o.home.dir().to_string_lossy();
    let exec = [
        o.gatewarden.to_string_lossy().as_ref(),
        "--hermes-home",
        home.as_ref(),
        "supervise",
        "--hermes",
        o.hermes.to_string_lossy().as_ref(),
    ]
    .iter()
    .map(|w| word(w))
    .collect::<Vec<_>>()
    .join(" ");
    let user = o.run_as.map_or(String::new(), |(u, g)| format!("User={u}\nGroup={g}\n"));
    let (after, wanted) = match o.scope {
        Scope::System => ("After=network-online.target\nWants=network-online.target\n", "multi-user.target"),
        Scope::User => ("", "default.target"),
    };
    format!(
        "[Unit]\n\
         Description=hermes gateway ({home}) supervised by gatewarden\n\
         {after}\
         StartLimitIntervalSec=60\n\
         StartLimitBurst=5\n\
         \n\
         [Service]\n\
         Type=notify\n\
         NotifyAccess=main\n\
         {user}\
         ExecStart={exec}\n\
         WorkingDirectory={wd}\n\
         Environment={env}\n\
         Restart=on-failure\n\
         RestartSec=1\n\
         KillMode=mixed\n\
         KillSignal=SIGTERM\n\
         TimeoutStopSec={stop}\n\
         \n\
         [Install]\n\
         WantedBy={wanted}\n",
        // WorkingDirectory= takes the rest of the line verbatim: no quotes, only `%` escaped.
        wd = home.replace('%', "%%"),
        env = word(&format!("HERMES_HOME={home}")),
        stop = o.drain_timeout_s.saturating_add(30),
    )
}

/// The lines of hermes's generated unit that ours fixes, and why (measured on 0.19.0).
pub const FIXES: &[(&str, &str)] = &[
    (
        "(no ExecStop=)",
        "systemctl stop sent an unmarked SIGTERM: hermes exits 1 and the unit ends 'failed'; supervise turns SIGTERM into a marker-first stop",
    ),
    (
        "(no SuccessExitStatus=75)",
        "every planned restart was logged as a failure; supervise revives 75 itself, at once",
    ),
    (
        "Restart=always + StartLimitIntervalSec=0",
        "no brake: exit 1 for a foreign lock holder and startup_failed restarted every 5 s forever; supervise parks them",
    ),
    ("RestartSec=5", "a planned restart cost >= 5 s of outage; supervise respawns on exit 75 immediately"),
    (
        "ExecReload=/bin/kill -USR1 $MAINPID",
        "reload reported success while the gateway went down; removed (use gatewarden restart, verified)",
    ),
    ("Type=simple", "start returned before the gateway was ready; Type=notify: READY=1 once hermes reports running"),
    ("After=/Wants=network-online.target (user unit)", "no effect in a user manager; kept only in system units"),
    ("Environment=\"PATH=<installer's PATH>\"", "the installing shell's PATH was baked in; not copied"),
    (
        "(respawn-storm brake)",
        "hermes's own brake slept 10-300 s before starts; disabled under supervise (HERMES_GATEWAY_MAX_STARTS=0)",
    ),
    (
        "unit named hermes-gateway*",
        "hermes rewrote that unit at every boot; ours has another name, so hand edits survive",
    ),
];

/// The unit preceded by comments naming what it fixes compared with hermes's own
/// (`service install --print`).
pub fn render_print(o: &UnitOptions) -> String {
    let mut out = format!("# {} — for the hermes home {}\n", unit_name(&o.home), o.home.dir().display());
    out.push_str("# Compared with hermes's generated hermes-gateway unit, this one fixes:\n");
    for (line, why) in FIXES {
        out.push_str(&format!("#   {line}: {why}\n"));
    }
    out.push_str(&render(o));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(home: &str, scope: Scope) -> UnitOptions {
        UnitOptions {
            home: HermesHome::at(home),
            gatewarden: "/usr/bin/gatewarden".into(),
            hermes: "/opt/v env/bin/hermes".into(),
            scope,
            drain_timeout_s: 0,
            run_as: None,
        }
    }

    #[test]
    fn renders_supervise_with_the_exact_home_and_no_hermes_name() {
        let u = render(&opts("/srv/h 100%", Scope::User));
        assert!(u.contains(
            "ExecStart=/usr/bin/gatewarden --hermes-home \"/srv/h 100%%\" supervise --hermes \"/opt/v env/bin/hermes\"\n"
        ), "{u}");
        assert!(u.contains("Environment=\"HERMES_HOME=/srv/h 100%%\"\n"));
        assert!(u.contains("WorkingDirectory=/srv/h 100%%\n"));
        assert!(u.contains("Type=notify\n") && u.contains("Restart=on-failure\n") && u.contains("TimeoutStopSec=30\n"));
        assert!(!u.contains("network-online") && u.contains("WantedBy=default.target"));
        assert!(!u.contains("ExecReload") && !u.contains("--replace"));
        let s = render(&opts("/srv/h", Scope::System));
        assert!(s.contains("After=network-online.target\n") && s.contains("WantedBy=multi-user.target"));
        assert!(!unit_name(&HermesHome::at("/srv/h")).starts_with("hermes-gateway"));
        assert_eq!(
            unit_name(&HermesHome::at("/nonexistent/.hermes/profiles/coder")),
            "gatewarden-hermes-coder.service"
        );
        let p = render_print(&opts("/srv/h", Scope::User));
        assert!(p.starts_with("# gatewarden-hermes-") && p.contains("#   RestartSec=5: "));
        assert!(!s.contains("User="));
        let owned = render(&UnitOptions { run_as: Some((1001, 1002)), ..opts("/srv/h", Scope::System) });
        assert!(owned.contains("User=1001\nGroup=1002\nExecStart="), "{owned}");
    }

    #[test]
    fn a_unit_runs_as_the_homes_owner_or_is_refused() {
        assert_eq!(run_as_for(Scope::System, Some((1001, 1002)), Some(0)), Ok(Some((1001, 1002))));
        assert_eq!(run_as_for(Scope::System, Some((0, 0)), Some(0)), Ok(Some((0, 0))), "User=0, said");
        assert_eq!(run_as_for(Scope::User, Some((1001, 1002)), Some(1001)), Ok(None));
        assert!(run_as_for(Scope::User, Some((1001, 1002)), Some(0)).unwrap_err().contains("--system"));
        assert!(run_as_for(Scope::System, None, None).is_err(), "no system unit without User=");
        assert_eq!(run_as_for(Scope::User, None, None), Ok(None));
    }

    #[test]
    fn finds_hermes_units_for_this_home_only() {
        let t = tempfile::tempdir().unwrap();
        let units = t.path().join("user");
        let wants = units.join("default.target.wants");
        std::fs::create_dir_all(&wants).unwrap();
        let home = t.path().join("h");
        std::fs::create_dir_all(&home).unwrap();
        let mine = format!("[Service]\nEnvironment=\"HERMES_HOME={}\"\n", home.display());
        std::fs::write(units.join("hermes-gateway-abcd1234.service"), &mine).unwrap();
        std::fs::write(units.join("hermes-gateway-other.service"), "Environment=\"HERMES_HOME=/elsewhere\"\n").unwrap();
        std::fs::write(units.join("unrelated.service"), &mine).unwrap();
        let dirs = [(units.clone(), Scope::User)];
        let found = find_hermes_units_in(&HermesHome::at(&home), &dirs, None);
        assert_eq!(found.len(), 1);
        assert!(!found[0].enabled);
        std::fs::write(wants.join("hermes-gateway-abcd1234.service"), "").unwrap();
        assert!(find_hermes_units_in(&HermesHome::at(&home), &dirs, None)[0].enabled);
        // A unit without HERMES_HOME manages the default home.
        std::fs::write(units.join("hermes-gateway.service"), "[Service]\n").unwrap();
        assert_eq!(find_hermes_units_in(&HermesHome::at(&home), &dirs, Some(&home)).len(), 2);
    }
}
