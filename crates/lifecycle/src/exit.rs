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
