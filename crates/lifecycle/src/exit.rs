//! The one table from "why the gateway is ending" to its process exit code.
//!
//! Every exit path goes through [`ExitIntent::code`]; the supervisor is never guessed here.
//! Supervisor detection only decides *who* performs a restart (see `supervisor`).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExitIntent {
    /// A deliberate stop: control request, our planned-stop marker, SIGINT, console close.
    PlannedStop,
    /// Replaced by `run --replace` in the same home.
    Takeover,
    /// A deliberate restart handed to the supervisor.
    PlannedRestart,
    /// A signal nobody announced (bare SIGTERM, any signal before `running`) or a crash.
    Unexpected,
    /// Configuration that cannot work by retrying: the lock is held by another instance, bad
    /// config, unusable home, listen address taken.
    FatalConfig,
}

impl ExitIntent {
    pub const ALL: [ExitIntent; 5] = [
        ExitIntent::PlannedStop,
        ExitIntent::Takeover,
        ExitIntent::PlannedRestart,
        ExitIntent::Unexpected,
        ExitIntent::FatalConfig,
    ];

    /// The exit code. 0 = leave me down, 1 = revive me, 75 (EX_TEMPFAIL) = planned restart,
    /// 78 (EX_CONFIG) = do not revive.
    pub const fn code(self) -> u8 {
        match self {
            ExitIntent::PlannedStop | ExitIntent::Takeover => 0,
            ExitIntent::Unexpected => 1,
            ExitIntent::PlannedRestart => 75,
            ExitIntent::FatalConfig => 78,
        }
    }

    /// How a supervisor should read an exit code (ours or hermes-agent's).
    pub fn from_code(code: i32) -> ExitIntent {
        match code {
            0 => ExitIntent::PlannedStop,
            75 => ExitIntent::PlannedRestart,
            78 => ExitIntent::FatalConfig,
            _ => ExitIntent::Unexpected,
        }
    }

    /// When a gateway ends this way, in a reader's words (the exit table in
    /// docs/architecture.md is rendered from this and [`ExitIntent::manager_should`]; a test
    /// fails when the two drift: crates/gatewarden/tests/docs.rs).
    pub const fn when(self) -> &'static str {
        match self {
            ExitIntent::PlannedStop => {
                "planned stop: `stop`, control or chat `/stop`, SIGINT, console close, a bare SIGTERM from the proven owner (container runtime, declared supervisor)"
            }
            ExitIntent::Takeover => "takeover: `run --replace` in the same home",
            ExitIntent::PlannedRestart => "planned restart: `restart`, SIGUSR1, chat or HTTP `/restart`, `update`",
            ExitIntent::Unexpected => {
                "unexpected: a bare SIGTERM no owner is proven to have sent, SIGQUIT, a stop or restart signal during start-up, a crash"
            }
            ExitIntent::FatalConfig => {
                "fatal configuration: bad config or secret, another instance holds the lock, unusable home, listen address taken"
            }
        }
    }

    /// What a service manager should do with this exit.
    pub const fn manager_should(self) -> &'static str {
        match self {
            ExitIntent::PlannedStop | ExitIntent::Takeover => "leave it down",
            ExitIntent::PlannedRestart => {
                "revive it now, not a failure (only a proven manager is left to; otherwise the gateway started its successor, or re-executed in place as PID 1)"
            }
            ExitIntent::Unexpected => "revive it",
            ExitIntent::FatalConfig => "do not revive it",
        }
    }

    /// The one table as Markdown, every intent in [`ExitIntent::ALL`]'s order.
    pub fn markdown_table() -> String {
        let mut t = String::from("| code | intent | when | a service manager should |\n|---|---|---|---|\n");
        for i in ExitIntent::ALL {
            t.push_str(&format!("| {} | `{}` | {} | {} |\n", i.code(), i.as_str(), i.when(), i.manager_should()));
        }
        t
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ExitIntent::PlannedStop => "planned_stop",
            ExitIntent::Takeover => "takeover",
            ExitIntent::PlannedRestart => "planned_restart",
            ExitIntent::Unexpected => "unexpected",
            ExitIntent::FatalConfig => "fatal_config",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table() {
        let table: Vec<(ExitIntent, u8)> = ExitIntent::ALL.iter().map(|i| (*i, i.code())).collect();
        assert_eq!(
            table,
            vec![
                (ExitIntent::PlannedStop, 0),
                (ExitIntent::Takeover, 0),
                (ExitIntent::PlannedRestart, 75),
                (ExitIntent::Unexpected, 1),
                (ExitIntent::FatalConfig, 78),
            ]
        );
    }

    #[test]
    fn codes_read_back_as_their_class() {
        for i in ExitIntent::ALL {
            let back = ExitIntent::from_code(i32::from(i.code()));
            assert_eq!(back.code(), i.code());
        }
        assert_eq!(ExitIntent::from_code(143), ExitIntent::Unexpected);
        assert_eq!(ExitIntent::from_code(-1), ExitIntent::Unexpected);
    }
}
