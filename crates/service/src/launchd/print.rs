//! Parsing `launchctl print gui/<uid>/<label>`.
//!
//! The format is undocumented and changes between macOS releases, so the parser only reads
//! top-level `key = value` lines of the service block (nested blocks such as `environment`
//! are skipped, so an environment variable named `pid` cannot fool it) and treats everything
//! as optional.

/// `last exit code = …`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LastExit {
    /// `(never exited)`.
    Never,
    /// A numeric code.
    Code(i32),
    /// Something else, verbatim.
    Other(String),
}

/// What `launchctl print` says about a job.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct LaunchdPrint {
    /// `state = running | waiting | not running | spawn scheduled | …`.
    pub state: Option<String>,
    /// `pid = N` (only present while running).
    pub pid: Option<u32>,
    /// `last exit code = …`.
    pub last_exit: Option<LastExit>,
    /// `last terminating signal = …`.
    pub last_signal: Option<String>,
    /// `path = …` (the plist).
    pub path: Option<String>,
    /// launchd reports a throttled / pended spawn.
    pub spawn_pending: bool,
}

/// Parses `launchctl print` output. Never fails.
#[must_use]
pub fn parse_print(text: &str) -> LaunchdPrint {
    let mut p = LaunchdPrint::default();
    let mut depth = 0usize;
    for line in text.lines() {
        let t = line.trim();
        if t.contains("pended") || t.contains("spawn scheduled") {
            p.spawn_pending = true;
        }
        if t == "}" {
            depth = depth.saturating_sub(1);
            continue;
        }
        let opens = t.ends_with('{');
        if depth == 1
            && !opens
            && let Some((k, v)) = t.split_once(" = ")
        {
            let v = v.trim();
            match k.trim() {
                "state" => p.state = Some(v.to_owned()),
                "pid" => p.pid = v.parse().ok().filter(|n| *n != 0),
                "last exit code" => {
                    p.last_exit = Some(if v.contains("never exited") {
                        LastExit::Never
                    } else {
                        v.parse().map_or_else(|_| LastExit::Other(v.to_owned()), LastExit::Code)
                    });
                }
                "last terminating signal" => p.last_signal = Some(v.to_owned()),
                "path" => p.path = Some(v.to_owned()),
                _ => {}
            }
        }
        if opens {
            depth += 1;
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    const RUNNING: &str = "gui/501/ai.gatewarden.gateway = {
\tactive count = 1
\tpath = /Users/a/Library/LaunchAgents/ai.gatewarden.gateway.plist
\ttype = LaunchAgent
\tstate = running

\tprogram = /usr/local/bin/gatewarden
\targuments = {
\t\t/usr/local/bin/gatewarden
\t\tsupervise
\t}

\tenvironment = {
\t\tpid = 999
\t\tGATEWARDEN_HOME = /Users/a/gw
\t}

\tpid = 4242
\timmediate reason = speculative
\tlast exit code = 0
\tproperties = keepalive | runatload
}
";

    #[test]
    fn parses_running_job_and_ignores_nested_blocks() {
        let p = parse_print(RUNNING);
        assert_eq!(p.state.as_deref(), Some("running"));
        assert_eq!(p.pid, Some(4242));
        assert_eq!(p.last_exit, Some(LastExit::Code(0)));
        assert_eq!(p.path.as_deref(), Some("/Users/a/Library/LaunchAgents/ai.gatewarden.gateway.plist"));
        assert!(!p.spawn_pending);
    }

    #[test]
    fn parses_never_exited_and_pended() {
        let p = parse_print(
            "gui/501/x = {\n\tstate = spawn scheduled\n\tlast exit code = (never exited)\n\tlast terminating signal = Terminated: 15\n}\n",
        );
        assert_eq!(p.state.as_deref(), Some("spawn scheduled"));
        assert_eq!(p.pid, None);
        assert_eq!(p.last_exit, Some(LastExit::Never));
        assert_eq!(p.last_signal.as_deref(), Some("Terminated: 15"));
        assert!(p.spawn_pending);
    }

    #[test]
    fn garbage_is_tolerated() {
        assert_eq!(parse_print(""), LaunchdPrint::default());
        let p = parse_print("}}}\n{\n\tpid = x\n\tlast exit code = weird\n");
        assert_eq!(p.pid, None);
        assert_eq!(p.last_exit, Some(LastExit::Other("weird".into())));
    }
}
