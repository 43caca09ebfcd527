//! The vocabulary of diagnostics: what was found, how bad it is, and what fixes it.

use std::fmt;

/// How much a finding matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Worth knowing; nothing is wrong.
    Info,
    /// Works today but will bite (a short stop timeout, a missing brake).
    Warning,
    /// A lifecycle path is broken (a planned restart will not come back, the wrong binary runs).
    Error,
}

/// Stable identifiers so the CLI and tests can match findings without parsing messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum FindingId {
    /// No definition is installed for this home.
    NotInstalled,
    /// The installed definition could not be read or parsed.
    DefinitionUnreadable,
    /// A directive/key the generator writes is missing from the installed definition.
    DirectiveMissing,
    /// A directive/key has a different value than the generator's.
    DirectiveDiffers,
    /// The definition launches a different executable than the current one.
    WrongBinary,
    /// The definition serves a different home.
    WrongHome,
    /// The stop timeout is shorter than the drain needs; the manager would kill mid-drain.
    StopTimeoutTooShort,
    /// A launchd plist with a policy that strands or loops the gateway.
    OldKeepAlivePolicy,
    /// `gatewarden supervise` parked the gateway after a crash loop.
    ParkedCrashLoop,
    /// `gatewarden supervise` parked the gateway after a fatal-configuration exit (78).
    ParkedFatalConfig,
    /// The parked-state file exists but cannot be read.
    ParkedStateUnreadable,
    /// systemd's start-rate limit tripped; the unit will not start until reset.
    StartLimitHit,
    /// The user manager stops at logout (no lingering).
    LingerDisabled,
    /// The home is missing, not a directory, or not writable.
    HomeUnusable,
    /// The home is readable by others.
    HomePermissions,
    /// The configured listen address is taken by another process.
    PortInUse,
    /// The service manager does not answer (systemd's bus is gone, launchd refuses): the
    /// gateway can be neither started nor stopped through it.
    ManagerUnreachable,
    /// The definition is on disk but the manager has not loaded it (a failed `daemon-reload`,
    /// a unit systemd refused, a changed file not reloaded, a plist not bootstrapped): what
    /// a half-finished install leaves.
    DefinitionNotLoaded,
    /// The definition is loaded but not enabled: it will not start at boot or login (every
    /// install enables it; systemd loads a unit file on demand, so a failed `daemon-reload`
    /// leaves exactly this).
    DefinitionNotEnabled,
}

impl FindingId {
    /// The stable kebab-case name (also the serde name).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotInstalled => "not-installed",
            Self::DefinitionUnreadable => "definition-unreadable",
            Self::DirectiveMissing => "directive-missing",
            Self::DirectiveDiffers => "directive-differs",
            Self::WrongBinary => "wrong-binary",
            Self::WrongHome => "wrong-home",
            Self::StopTimeoutTooShort => "stop-timeout-too-short",
            Self::OldKeepAlivePolicy => "old-keep-alive-policy",
            Self::ParkedCrashLoop => "parked-crash-loop",
            Self::ParkedFatalConfig => "parked-fatal-config",
            Self::ParkedStateUnreadable => "parked-state-unreadable",
            Self::StartLimitHit => "start-limit-hit",
            Self::LingerDisabled => "linger-disabled",
            Self::HomeUnusable => "home-unusable",
            Self::HomePermissions => "home-permissions",
            Self::PortInUse => "port-in-use",
            Self::ManagerUnreachable => "manager-unreachable",
            Self::DefinitionNotLoaded => "definition-not-loaded",
            Self::DefinitionNotEnabled => "definition-not-enabled",
        }
    }
}

impl fmt::Display for FindingId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which manager definition a refresh rewrites.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Manager {
    /// systemd unit.
    Systemd,
    /// launchd LaunchAgent plist.
    Launchd,
    /// Windows Task Scheduler task.
    WindowsTask,
    /// Windows SCM service.
    WindowsService,
}

/// What resolves a finding.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum FixAction {
    /// Nothing to do.
    None,
    /// Re-render and reinstall the definition (then reload the manager).
    RefreshDefinition {
        /// Which manager's definition.
        manager: Manager,
    },
    /// Run this command.
    Run {
        /// Program and arguments.
        argv: Vec<String>,
    },
    /// A human has to act; the hint says how.
    Manual {
        /// What to do.
        hint: String,
    },
}

/// One diagnostic.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Finding {
    /// Stable identifier.
    pub id: FindingId,
    /// How much it matters.
    pub severity: Severity,
    /// What it is about: a directive (`Service.TimeoutStopSec`), a plist key, a file.
    pub subject: String,
    /// One human sentence naming the problem.
    pub message: String,
    /// How to resolve it.
    pub fix: FixAction,
}

impl Finding {
    /// Shorthand constructor.
    #[must_use]
    pub fn new(
        id: FindingId,
        severity: Severity,
        subject: impl Into<String>,
        message: impl Into<String>,
        fix: FixAction,
    ) -> Self {
        Self { id, severity, subject: subject.into(), message: message.into(), fix }
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sev = match self.severity {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Error => "error",
        };
        write!(f, "{sev}[{}] {}: {}", self.id, self.subject, self.message)
    }
}
