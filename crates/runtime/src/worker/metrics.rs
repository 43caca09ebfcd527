//! The counters `/metrics`, `status` and `top` read: runs by outcome, failures in a row, the
//! last failure, token usage per chat, and what earlier incarnations left in the ledger.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use gatewarden_agent::AgentError;

/// Counters for `/metrics`.
#[derive(Debug, Default)]
pub struct Metrics {
    pub ok: AtomicU64,
    pub failed: AtomicU64,
    pub cancelled: AtomicU64,
    pub timeout: AtomicU64,
    pub unavailable: AtomicU64,
    pub accepted_async: AtomicU64,
    /// From the ledger at boot: restarts and drains of earlier incarnations.
    pub restarts_before: AtomicU64,
    pub drains_before: AtomicU64,
    pub drain_ms_before: AtomicU64,
    /// The last run that failed (not cancelled) and why, for `status`: an upstream that cannot
    /// be reached (a certificate that does not verify, crates/net) shows there by name.
    /// When the last run failed, why, and its reference (the message or run id a chat or
    /// caller was given).
    pub last_failure: Mutex<Option<(std::time::SystemTime, String, String)>>,
    /// Tokens the upstream reported (openai), this incarnation.
    pub prompt_tokens: AtomicU64,
    pub completion_tokens: AtomicU64,
    /// The same per `(platform, chat)` (`None`: the HTTP API), with the runs that reported
    /// them; at most [`MAX_USAGE_CHATS`] chats, the rest counted together.
    pub chat_usage: Mutex<std::collections::BTreeMap<(Option<String>, String), ChatUsage>>,
    /// Runs that failed (not cancelled) since the last that succeeded: `doctor`'s
    /// `runs-failing`, `status`'s agent line.
    pub failures_in_a_row: AtomicU64,
    /// Runs finished in the last minute (`top`'s messages per minute).
    pub finished: Mutex<PerMinute>,
}

/// Events counted per second over the last minute: 60 buckets, each stamped with its second,
/// so a bucket from a minute ago is never counted again. Pure; the clock is the caller's.
#[derive(Debug)]
pub struct PerMinute {
    buckets: [(u64, u32); 60],
}

impl Default for PerMinute {
    fn default() -> PerMinute {
        PerMinute { buckets: [(0, 0); 60] }
    }
}

impl PerMinute {
    /// One event at `second` (seconds on any monotonic scale).
    pub fn note(&mut self, second: u64) {
        let b = &mut self.buckets[(second % 60) as usize];
        if b.0 != second {
            *b = (second, 0);
        }
        b.1 = b.1.saturating_add(1);
    }

    /// Events in the minute up to and including `second`.
    pub fn last_minute(&self, second: u64) -> u64 {
        self.buckets.iter().filter(|(s, _)| *s <= second && second - *s < 60).map(|(_, n)| u64::from(*n)).sum()
    }
}

/// Seconds since this process first asked: the clock of [`PerMinute`].
pub fn uptime_second() -> u64 {
    static T0: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    T0.get_or_init(std::time::Instant::now).elapsed().as_secs()
}

/// Chats whose token usage `status --json` shows one by one.
pub const MAX_USAGE_CHATS: usize = 4096;

/// One chat's token usage this incarnation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChatUsage {
    pub runs: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

impl Metrics {
    pub fn count<T>(&self, r: &Result<T, AgentError>, reference: &str) {
        let c = match r {
            Ok(_) => &self.ok,
            Err(AgentError::Cancelled) => &self.cancelled,
            Err(AgentError::Timeout(_)) => &self.timeout,
            Err(_) => &self.failed,
        };
        c.fetch_add(1, Ordering::Relaxed);
        self.finished.lock().unwrap_or_else(|p| p.into_inner()).note(uptime_second());
        match r {
            Ok(_) => self.failures_in_a_row.store(0, Ordering::Relaxed),
            Err(AgentError::Cancelled) => {}
            Err(e) => {
                self.failures_in_a_row.fetch_add(1, Ordering::Relaxed);
                *self.last_failure.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some((std::time::SystemTime::now(), e.to_string(), reference.to_owned()));
            }
        }
    }

    /// `status`'s run counts: by outcome this incarnation, failed in a row, finished in the
    /// last minute.
    pub fn runs_json(&self) -> serde_json::Value {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let minute = self.finished.lock().unwrap_or_else(|p| p.into_inner()).last_minute(uptime_second());
        serde_json::json!({"ok": n(&self.ok), "failed": n(&self.failed), "timeout": n(&self.timeout),
            "cancelled": n(&self.cancelled), "failures_in_a_row": n(&self.failures_in_a_row),
            "last_minute": minute})
    }

    /// Adds one run's usage to its chat's.
    pub fn add_chat_usage(&self, platform: Option<&str>, chat: &str, u: gatewarden_agent::Usage) {
        let mut m = self.chat_usage.lock().unwrap_or_else(|p| p.into_inner());
        let mut key = (platform.map(str::to_owned), chat.to_owned());
        if m.len() >= MAX_USAGE_CHATS && !m.contains_key(&key) {
            key = (Some("*".to_owned()), "(other chats)".to_owned());
        }
        let e = m.entry(key).or_default();
        e.runs += 1;
        e.prompt_tokens = e.prompt_tokens.saturating_add(u.prompt_tokens);
        e.completion_tokens = e.completion_tokens.saturating_add(u.completion_tokens);
    }

    /// `status --json`'s `agent.usage_by_chat`: the chats that used most tokens first, at most
    /// `limit`.
    pub fn chat_usage_json(&self, limit: usize) -> serde_json::Value {
        let m = self.chat_usage.lock().unwrap_or_else(|p| p.into_inner());
        let mut rows: Vec<_> = m.iter().collect();
        rows.sort_by_key(|(_, u)| std::cmp::Reverse(u.prompt_tokens.saturating_add(u.completion_tokens)));
        serde_json::Value::Array(
            rows.into_iter()
                .take(limit)
                .map(|((p, c), u)| {
                    serde_json::json!({"platform": p, "chat_id": c, "runs": u.runs,
                        "prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens})
                })
                .collect(),
        )
    }

    /// `{"at", "reason", "reference"}` of the last failed run, or null.
    pub fn last_failure_json(&self) -> serde_json::Value {
        match &*self.last_failure.lock().unwrap_or_else(|p| p.into_inner()) {
            Some((at, why, reference)) => serde_json::json!({
                "at": gatewarden_lifecycle::timefmt::format(*at), "reason": why, "reference": reference,
            }),
            None => serde_json::Value::Null,
        }
    }

    /// Restart and drain totals survive restarts: they are counted from the ledger.
    pub fn seed_from_ledger(&self, ledger: &std::path::Path) {
        let Some(lines) = gatewarden_lifecycle::ledger::read_tail(ledger, Some(5000)).ok() else { return };
        for line in lines {
            if let gatewarden_lifecycle::ledger::Line::Event(e) = line {
                match e.get("event").and_then(|v| v.as_str()) {
                    Some("restart_requested") => {
                        self.restarts_before.fetch_add(1, Ordering::Relaxed);
                    }
                    Some("drained") => {
                        self.drains_before.fetch_add(1, Ordering::Relaxed);
                        let ms = e.get("duration_ms").and_then(|v| v.as_u64()).unwrap_or(0);
                        self.drain_ms_before.fetch_add(ms, Ordering::Relaxed);
                    }
                    _ => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minute_of_events_and_no_more() {
        let mut m = PerMinute::default();
        m.note(10);
        m.note(10);
        m.note(30);
        assert_eq!(m.last_minute(30), 3);
        assert_eq!(m.last_minute(69), 3);
        // Second 10 is a minute old at 70; its bucket is reused by second 70.
        assert_eq!(m.last_minute(70), 1);
        m.note(70);
        assert_eq!(m.last_minute(70), 2);
        assert_eq!(m.last_minute(200), 0);
    }

    #[test]
    fn failures_in_a_row_end_with_a_success_and_ignore_cancels() {
        let m = Metrics::default();
        let fail: Result<(), AgentError> = Err(AgentError::Failed("boom".into()));
        m.count(&fail, "r1");
        m.count(&fail, "r1");
        m.count(&Err::<(), _>(AgentError::Cancelled), "r2");
        assert_eq!(m.runs_json()["failures_in_a_row"], 2);
        assert_eq!(m.runs_json()["last_minute"], 3);
        m.count(&Ok(()), "r3");
        assert_eq!(m.runs_json()["failures_in_a_row"], 0);
        assert_eq!(m.runs_json()["failed"], 2);
    }
}
