//! How the incarnation a start replaces or revives ran: what a recovery start (the
//! restart ladder's own start, its kick through an unmanaged owner, the backstop's), an
//! update's rollback, `doctor --fix` (which restarts through the ladder) and the dashboard's
//! Start (`start --as-before`) run the gateway with. Read from the ledger, which every start
//! and readiness is recorded in (a refused start rewrites the state file, the ledger keeps
//! what ran): the newest `started` line's argv and that incarnation's `ready` address. An
//! address given with `--listen` is kept (its bound port, when it asked for port 0: the one
//! its clients know); without one, the config decides, and nothing else.

use gatewarden_lifecycle::Home;
use gatewarden_lifecycle::fsio::ReadOutcome;
use gatewarden_lifecycle::ledger::{Line, read_tail};
use serde_json::{Map, Value};

/// How far back the ledger is read for the last start.
const LOOK_BACK: usize = 2000;

/// What the replaced incarnation was given on its command line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Previous {
    pub listen: Option<String>,
    pub drain_timeout_s: Option<u64>,
}

impl Previous {
    /// The `run`/`start` arguments that give a new gateway these settings.
    pub fn args(&self) -> Vec<String> {
        let mut a = Vec::new();
        if let Some(l) = &self.listen {
            a.extend(["--listen".to_owned(), l.clone()]);
        }
        if let Some(d) = self.drain_timeout_s {
            a.extend(["--drain-timeout".to_owned(), d.to_string()]);
        }
        a
    }
}

/// The settings of the newest incarnation the ledger shows started (module doc); none found:
/// the config's.
pub fn of(home: &Home) -> Previous {
    let ReadOutcome::Ok(lines) = read_tail(&home.ledger(), Some(LOOK_BACK)) else { return Previous::default() };
    let events: Vec<&Map<String, Value>> = lines
        .iter()
        .filter_map(|l| match l {
            Line::Event(e) => Some(e),
            Line::Garbage(_) => None,
        })
        .collect();
    let text = |e: &Map<String, Value>, k: &str| e.get(k).and_then(Value::as_str).map(str::to_owned);
    let Some(started) = events.iter().rev().find(|e| text(e, "event").as_deref() == Some("started")) else {
        return Previous::default();
    };
    let argv: Vec<String> = started
        .get("argv")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect())
        .unwrap_or_default();
    let inc = text(started, "incarnation");
    let bound = events
        .iter()
        .rev()
        .find(|e| text(e, "event").as_deref() == Some("ready") && text(e, "incarnation") == inc)
        .and_then(|e| text(e, "listen"));
    from_argv(&argv, bound.as_deref())
}

/// The pure part: `--listen` (its `bound` address when it asked for port 0) and
/// `--drain-timeout` from a recorded argv.
pub fn from_argv(argv: &[String], bound: Option<&str>) -> Previous {
    let value = |flag: &str| {
        argv.iter().enumerate().find_map(|(i, a)| match a.strip_prefix(flag) {
            Some("") => argv.get(i + 1).cloned(),
            Some(rest) => rest.strip_prefix('=').map(str::to_owned),
            None => None,
        })
    };
    let listen = value("--listen").map(|given| {
        let any_port = given.parse::<std::net::SocketAddr>().is_ok_and(|a| a.port() == 0);
        match bound {
            Some(b) if any_port => b.to_owned(),
            _ => given,
        }
    });
    Previous { listen, drain_timeout_s: value("--drain-timeout").and_then(|d| d.parse().ok()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_given_address_is_kept_and_port_0_becomes_the_bound_port() {
        let p = from_argv(&argv(&["gw", "--home", "/h", "run", "--listen", "127.0.0.1:0"]), Some("127.0.0.1:41234"));
        assert_eq!(p.listen.as_deref(), Some("127.0.0.1:41234"));
        let p = from_argv(&argv(&["gw", "run", "--listen=127.0.0.1:9000", "--drain-timeout", "7"]), Some("x"));
        assert_eq!((p.listen.as_deref(), p.drain_timeout_s), (Some("127.0.0.1:9000"), Some(7)));
        assert_eq!(p.args(), ["--listen", "127.0.0.1:9000", "--drain-timeout", "7"]);
        // Without `--listen`, the config decides: nothing is carried over.
        let p = from_argv(&argv(&["gw", "run"]), Some("127.0.0.1:7878"));
        assert_eq!(p, Previous::default());
        assert!(p.args().is_empty());
        // Port 0 never seen bound: as given (the new gateway picks one).
        assert_eq!(
            from_argv(&argv(&["gw", "run", "--listen", "127.0.0.1:0"]), None).listen.as_deref(),
            Some("127.0.0.1:0")
        );
    }
}
