//! A message's trace: the steps of its path through the gateway, recorded in the journal with
//! the commits that already happen (received and journaled with the accept, claimed with the
//! claim, the run's steps with its finish, outbox sent with the outbox update), so that tracing
//! adds rows to transactions, never a transaction (an fsync) of its own. Read back with
//! [`crate::Store::trace`]; shown by `gatewarden trace` (crates/ops/src/trace.rs), the dashboard,
//! and exported as OpenTelemetry spans (crates/telemetry).

use std::time::{Duration, SystemTime};

/// Steps a run notes in memory and hands to its finish at most (a provider tried per attempt
/// round is bounded by the providers, but a store must never take an unbounded list).
pub const MAX_RUN_STEPS: usize = 32;

/// One step of a message's path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    /// The gateway took the message (the HTTP request or the platform event).
    Received,
    /// Its row is durable (the commit that holds it).
    Journaled,
    /// A worker claimed it (`subject`: the incarnation).
    Claimed,
    /// The agent backend was called (`subject`: the backend).
    BackendCalled,
    /// One upstream provider was tried (`subject`: the provider, `outcome`: `ok` or why not).
    ProviderTried,
    /// The first piece of the reply arrived.
    FirstToken,
    /// Finished with a reply.
    Done,
    /// Finished without one (`outcome`: why).
    Failed,
    /// Interrupted (stop, restart, crash) and queued again for a re-run.
    Requeued,
    /// Interrupted on its last attempt: failed for good.
    GivenUp,
    /// Its reply (or failure notice) was sent to the chat (`subject`: the platform).
    OutboxSent,
    /// Its reply could not be sent for good (`outcome`: the platform's reason).
    OutboxFailed,
}

impl Step {
    pub const ALL: [Step; 12] = [
        Step::Received,
        Step::Journaled,
        Step::Claimed,
        Step::BackendCalled,
        Step::ProviderTried,
        Step::FirstToken,
        Step::Done,
        Step::Failed,
        Step::Requeued,
        Step::GivenUp,
        Step::OutboxSent,
        Step::OutboxFailed,
    ];

    /// The stored (and displayed) word.
    pub fn as_str(self) -> &'static str {
        match self {
            Step::Received => "received",
            Step::Journaled => "journaled",
            Step::Claimed => "claimed",
            Step::BackendCalled => "backend_called",
            Step::ProviderTried => "provider_tried",
            Step::FirstToken => "first_token",
            Step::Done => "done",
            Step::Failed => "failed",
            Step::Requeued => "requeued",
            Step::GivenUp => "given_up",
            Step::OutboxSent => "outbox_sent",
            Step::OutboxFailed => "outbox_failed",
        }
    }

    /// The inverse of [`Step::as_str`].
    pub fn parse(s: &str) -> Option<Step> {
        Step::ALL.into_iter().find(|step| step.as_str() == s)
    }

    /// Ends the message's run (done, failed, given up).
    pub fn is_final(self) -> bool {
        matches!(self, Step::Done | Step::Failed | Step::GivenUp)
    }
}

/// One recorded step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceEvent {
    pub step: Step,
    /// When it happened (a step with `elapsed_ms`: when it began), RFC 3339 UTC with
    /// microseconds (crates/lifecycle/src/timefmt.rs).
    pub at: String,
    /// Who: the incarnation, backend, provider or platform the step names.
    pub subject: Option<String>,
    /// How it went: `ok`, or a reason.
    pub outcome: Option<String>,
    /// How long the step took, when it is a span rather than an instant (a provider tried).
    pub elapsed_ms: Option<u64>,
}

impl TraceEvent {
    /// A step that happened at `at`.
    pub fn at(step: Step, at: SystemTime) -> TraceEvent {
        TraceEvent {
            step,
            at: gatewarden_lifecycle::timefmt::format(at),
            subject: None,
            outcome: None,
            elapsed_ms: None,
        }
    }

    pub fn subject(mut self, subject: impl Into<String>) -> TraceEvent {
        self.subject = Some(subject.into());
        self
    }

    pub fn outcome(mut self, outcome: impl Into<String>) -> TraceEvent {
        self.outcome = Some(outcome.into());
        self
    }

    pub fn elapsed(mut self, d: Duration) -> TraceEvent {
        self.elapsed_ms = Some(u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        self
    }

    /// `at` as a time (`None`: not the protocol's format).
    pub fn time(&self) -> Option<SystemTime> {
        gatewarden_lifecycle::timefmt::parse(&self.at)
    }
}

/// A trace row's columns, in the order [`read_event`] reads them (both stores).
pub const TRACE_COLUMNS: [&str; 5] = ["step", "at", "subject", "outcome", "elapsed_ms"];

/// A trace event from a row selected with [`TRACE_COLUMNS`]; `id` names the message for
/// [`crate::JournalError::Corrupt`].
pub fn read_event(id: &str, row: &impl crate::row::Cells) -> Result<TraceEvent, crate::JournalError> {
    let word = row.text(0)?;
    let step = Step::parse(&word).ok_or_else(|| crate::JournalError::Corrupt {
        id: id.to_owned(),
        column: "step",
        value: word.clone(),
    })?;
    let elapsed = row.int_opt(4)?.and_then(|v| u64::try_from(v).ok());
    Ok(TraceEvent {
        step,
        at: row.text_opt(1)?.unwrap_or_default(),
        subject: row.text_opt(2)?,
        outcome: row.text_opt(3)?,
        elapsed_ms: elapsed,
    })
}

/// The steps of one run, noted in memory while it runs and written with its finish
/// ([`crate::Store::complete_traced`] / [`crate::Store::fail_traced`]); bounded by
/// [`MAX_RUN_STEPS`] (the steps past it are dropped and counted).
#[derive(Debug, Default, Clone)]
pub struct RunSteps {
    steps: Vec<TraceEvent>,
    dropped: u64,
}

impl RunSteps {
    pub fn push(&mut self, e: TraceEvent) {
        if self.steps.len() < MAX_RUN_STEPS {
            self.steps.push(e);
        } else {
            self.dropped += 1;
        }
    }

    pub fn steps(&self) -> &[TraceEvent] {
        &self.steps
    }

    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_step_word_parses_back() {
        for s in Step::ALL {
            assert_eq!(Step::parse(s.as_str()), Some(s));
        }
        assert_eq!(Step::parse("bogus"), None);
    }

    #[test]
    fn run_steps_are_bounded() {
        let mut r = RunSteps::default();
        for _ in 0..MAX_RUN_STEPS + 5 {
            r.push(TraceEvent::at(Step::ProviderTried, SystemTime::now()));
        }
        assert_eq!(r.steps().len(), MAX_RUN_STEPS);
        assert_eq!(r.dropped(), 5);
    }
}
