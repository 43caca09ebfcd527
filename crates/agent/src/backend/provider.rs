//! The openai backend's failover decisions, as pure data: what an attempt's outcome means
//! ([`classify`]), how long to wait before the next one ([`Backoff`], `Retry-After`), and each
//! provider's health ([`Health`]: a circuit breaker with a half-open probe). No I/O and no
//! clock here: callers pass `now`, so every transition is unit-tested.

use std::time::{Duration, Instant, SystemTime};

/// A provider failing this many calls in a row is cooled down (skipped) for `cooldown`.
pub const TRIP_AFTER: u32 = 3;
/// Longest single backoff, whatever `backoff_ms` and the retry count say.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Longest `Retry-After` honoured; a longer one moves on to the next provider.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(600);

/// How one attempt at one provider ended, when it did not succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// An HTTP status, with `Retry-After` when the provider sent one we could read.
    Status { status: u16, retry_after: Option<Duration>, body: String },
    /// Connection refused or reset, DNS, TLS handshake: nothing was answered.
    Connect(String),
    /// No response head within the attempt's timeout.
    TimedOut,
    /// The answer broke off after its head (the connection dropped, the stream ended or
    /// reported an error before it was complete): retried like a refused connection while
    /// nothing of it has reached the caller (backend/delivery.rs).
    Interrupted(String),
    /// The reply was unusable (not JSON, no content, a stream cut short).
    Protocol(String),
}

impl Failure {
    /// For status, the ledger and error messages: "HTTP 429", "connection refused: …".
    pub fn reason(&self) -> String {
        match self {
            Failure::Status { status, body, .. } if body.is_empty() => format!("HTTP {status}"),
            Failure::Status { status, body, .. } => format!("HTTP {status}: {}", super::truncate(body, 200)),
            Failure::Connect(why) => format!("cannot connect: {why}"),
            Failure::TimedOut => "no response within attempt_timeout_s".into(),
            Failure::Interrupted(why) | Failure::Protocol(why) => why.clone(),
        }
    }
}

/// What to do after a [`Failure`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Transient (429, 408, 409, 5xx, refused, timed out, broken off): retry this provider after a backoff
    /// (at least `Retry-After`), then fall back.
    Retry { after: Option<Duration> },
    /// This provider cannot serve us (401, 403, 404, a broken reply): the next provider,
    /// without retrying this one.
    Next,
    /// The request itself is refused (400, 413, 422 and other 4xx): every provider would say
    /// the same, so the run fails now.
    Fatal,
}

/// The verdict for a failure. 4xx other than 408 (request timeout), 409 (conflict, which
/// OpenAI documents as retryable) and 429 (rate limit) is never retried.
pub fn classify(f: &Failure) -> Verdict {
    match f {
        Failure::Status { status, retry_after, .. } => match status {
            408 | 409 | 429 | 500..=599 => Verdict::Retry { after: *retry_after },
            401 | 403 | 404 => Verdict::Next,
            _ => Verdict::Fatal,
        },
        Failure::Connect(_) | Failure::TimedOut | Failure::Interrupted(_) => Verdict::Retry { after: None },
        Failure::Protocol(_) => Verdict::Next,
    }
}

/// `Retry-After`: delay-seconds or an HTTP-date (RFC 9110 §10.2.3), relative to `now`. A date
/// in the past is zero; garbage is `None` (the backoff applies).
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let v = value.trim();
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
        return Some(Duration::from_secs(v.parse::<u64>().unwrap_or(u64::MAX)).min(MAX_RETRY_AFTER * 2));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// Exponential backoff with "equal jitter": retry `n` (0-based) waits between half and all of
/// `base * 2^n`, capped at [`MAX_BACKOFF`]. `unit` in [0, 1) is the jitter draw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub base: Duration,
}

impl Backoff {
    pub fn delay(&self, retry: u32, unit: f64) -> Duration {
        let full = self.base.saturating_mul(1u32 << retry.min(16)).min(MAX_BACKOFF);
        let unit = if unit.is_finite() { unit.clamp(0.0, 1.0) } else { 0.0 };
        full / 2 + full.mul_f64(unit / 2.0)
    }

    /// The wait before retry `n`: the jittered backoff, or `Retry-After` when it asks for more.
    pub fn wait(&self, retry: u32, unit: f64, retry_after: Option<Duration>) -> Duration {
        let d = self.delay(retry, unit);
        retry_after.map_or(d, |r| r.max(d).min(MAX_RETRY_AFTER))
    }

    /// After transient failure number `retry` (0-based) of one provider: waits out the backoff
    /// (at least `retry_after`) and says to try again, unless `retries` are spent or the wait
    /// would end past `deadline` (then the provider is given up) or `cancel` fires meanwhile.
    /// The openai backend and the transcriber retry through here.
    pub async fn pause(
        &self,
        retry: u32,
        retries: u32,
        retry_after: Option<Duration>,
        deadline: Instant,
        cancel: &tokio_util::sync::CancellationToken,
    ) -> Pause {
        let wait = self.wait(retry, fastrand::f64(), retry_after);
        if retry >= retries || Instant::now() + wait >= deadline {
            return Pause::GiveUp;
        }
        tokio::select! {
            () = tokio::time::sleep(wait) => Pause::Again,
            () = cancel.cancelled() => Pause::Cancelled,
        }
    }
}

/// What [`Backoff::pause`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pause {
    /// Waited: try the same provider again.
    Again,
    /// No retry left, or no time: on to the next provider.
    GiveUp,
    Cancelled,
}

/// A provider's state as shown in `status`, `/metrics` and the ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    Healthy,
    /// The last call failed (fewer than [`TRIP_AFTER`] in a row so far).
    Failing {
        reason: String,
    },
    /// Skipped until `until`; then one call is let through as a probe.
    CoolingDown {
        until: Instant,
        reason: String,
    },
}

impl State {
    pub fn name(&self) -> &'static str {
        match self {
            State::Healthy => "healthy",
            State::Failing { .. } => "failing",
            State::CoolingDown { .. } => "cooling_down",
        }
    }
}

/// Whether a provider may be called now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    Yes,
    /// Cooling down until then; another run's probe may be in flight.
    Skip {
        until: Instant,
    },
}

/// One provider's circuit breaker and counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    pub state: State,
    /// Failed calls in a row (a call is all attempts of one run at this provider).
    pub streak: u32,
    /// A half-open probe is in flight: other runs skip the provider until it ends.
    pub probing: bool,
    pub attempts: u64,
    pub failures: u64,
}

impl Default for Health {
    fn default() -> Self {
        Health { state: State::Healthy, streak: 0, probing: false, attempts: 0, failures: 0 }
    }
}

impl Health {
    /// May a call start at `now`? A cool-down that has ended lets exactly one call through (the
    /// probe) until that call's outcome is known.
    pub fn admit(&mut self, now: Instant) -> Admit {
        match &self.state {
            State::CoolingDown { until, .. } if now < *until || self.probing => {
                Admit::Skip { until: (*until).max(now) }
            }
            State::CoolingDown { .. } => {
                self.probing = true;
                Admit::Yes
            }
            State::Healthy | State::Failing { .. } => Admit::Yes,
        }
    }

    /// One attempt (one HTTP request) was made.
    pub fn attempted(&mut self) {
        self.attempts += 1;
    }

    /// One attempt failed.
    pub fn attempt_failed(&mut self) {
        self.failures += 1;
    }

    /// The call succeeded: healthy again. Returns the previous state when it changed.
    pub fn succeeded(&mut self) -> Option<State> {
        self.probing = false;
        self.streak = 0;
        (self.state != State::Healthy).then(|| std::mem::replace(&mut self.state, State::Healthy))
    }

    /// The call failed for good (its retries spent, or not retryable). A failed probe, or the
    /// [`TRIP_AFTER`]th failure in a row, cools the provider down until `now + cooldown`
    /// (longer when the provider asked for more with `Retry-After`). Returns the previous
    /// state when the state's kind changed.
    pub fn failed(
        &mut self,
        reason: String,
        now: Instant,
        cooldown: Duration,
        retry_after: Option<Duration>,
    ) -> Option<State> {
        let was_probe = std::mem::take(&mut self.probing);
        self.streak = self.streak.saturating_add(1);
        let next = if (was_probe || self.streak >= TRIP_AFTER) && !cooldown.is_zero() {
            let until = now + cooldown.max(retry_after.unwrap_or_default().min(MAX_RETRY_AFTER));
            State::CoolingDown { until, reason }
        } else {
            State::Failing { reason }
        };
        let changed = self.state.name() != next.name();
        let before = std::mem::replace(&mut self.state, next);
        changed.then_some(before)
    }

    /// A call that ended without an outcome (cancelled, the run's deadline): a probe slot is
    /// given back so that the next run may probe.
    pub fn abandoned(&mut self) {
        self.probing = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(status: u16) -> Failure {
        Failure::Status { status, retry_after: None, body: String::new() }
    }

    #[test]
    fn verdicts() {
        for s in [429, 408, 409, 500, 502, 503, 504] {
            assert_eq!(classify(&status(s)), Verdict::Retry { after: None }, "{s}");
        }
        for s in [401, 403, 404] {
            assert_eq!(classify(&status(s)), Verdict::Next, "{s}");
        }
        for s in [400, 413, 422, 418] {
            assert_eq!(classify(&status(s)), Verdict::Fatal, "{s}");
        }
        assert_eq!(classify(&Failure::Connect("refused".into())), Verdict::Retry { after: None });
        assert_eq!(classify(&Failure::TimedOut), Verdict::Retry { after: None });
        assert_eq!(classify(&Failure::Interrupted("dropped".into())), Verdict::Retry { after: None });
        let ra = Failure::Status { status: 429, retry_after: Some(Duration::from_secs(2)), body: String::new() };
        assert_eq!(classify(&ra), Verdict::Retry { after: Some(Duration::from_secs(2)) });
    }

    #[test]
    fn retry_after_seconds_and_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480); // Wed, 21 Oct 2015 07:28:00 GMT
        assert_eq!(parse_retry_after("2", now), Some(Duration::from_secs(2)));
        assert_eq!(parse_retry_after(" 0 ", now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:05 GMT", now), Some(Duration::from_secs(5)));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:27:00 GMT", now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-1", now), None);
        assert_eq!(parse_retry_after("", now), None);
        assert!(parse_retry_after("99999999999999999999999", now).is_some());
    }

    #[test]
    fn backoff_doubles_with_jitter_and_honours_retry_after() {
        let b = Backoff { base: Duration::from_millis(100) };
        assert_eq!(b.delay(0, 0.0), Duration::from_millis(50));
        assert_eq!(b.delay(0, 1.0), Duration::from_millis(100));
        assert_eq!(b.delay(2, 0.0), Duration::from_millis(200));
        assert_eq!(b.delay(40, 1.0), MAX_BACKOFF);
        assert_eq!(b.delay(1, f64::NAN), Duration::from_millis(100));
        assert_eq!(b.wait(0, 0.0, Some(Duration::from_secs(3))), Duration::from_secs(3));
        assert_eq!(b.wait(0, 0.0, Some(Duration::from_millis(1))), Duration::from_millis(50));
        assert_eq!(b.wait(0, 0.0, Some(Duration::from_secs(100_000))), MAX_RETRY_AFTER);
    }

    #[test]
    fn breaker_trips_after_a_streak_and_probes_once() {
        let t0 = Instant::now();
        let cool = Duration::from_secs(30);
        let mut h = Health::default();
        assert_eq!(h.admit(t0), Admit::Yes);
        assert_eq!(h.failed("HTTP 502".into(), t0, cool, None), Some(State::Healthy));
        assert_eq!(h.state, State::Failing { reason: "HTTP 502".into() });
        assert_eq!(h.failed("HTTP 502".into(), t0, cool, None), None);
        let before = h.failed("HTTP 503".into(), t0, cool, None);
        assert_eq!(before.map(|s| s.name()), Some("failing"));
        assert_eq!(h.state, State::CoolingDown { until: t0 + cool, reason: "HTTP 503".into() });
        // Skipped during the cool-down.
        assert_eq!(h.admit(t0 + Duration::from_secs(29)), Admit::Skip { until: t0 + cool });
        // After it: one probe, and only one.
        assert_eq!(h.admit(t0 + cool), Admit::Yes);
        assert!(h.probing);
        assert!(matches!(h.admit(t0 + cool), Admit::Skip { .. }));
        // A failed probe cools down again at once.
        let t1 = t0 + cool;
        assert_eq!(h.failed("HTTP 502".into(), t1, cool, None), None);
        assert_eq!(h.state, State::CoolingDown { until: t1 + cool, reason: "HTTP 502".into() });
        // A successful probe closes the breaker.
        assert_eq!(h.admit(t1 + cool), Admit::Yes);
        assert_eq!(h.succeeded().map(|s| s.name()), Some("cooling_down"));
        assert_eq!(h.state, State::Healthy);
        assert_eq!((h.streak, h.probing), (0, false));
        assert_eq!(h.succeeded(), None);
    }

    #[test]
    fn abandoned_probe_frees_the_slot_and_retry_after_lengthens_the_cool_down() {
        let t0 = Instant::now();
        let mut h = Health::default();
        for _ in 0..TRIP_AFTER {
            h.failed("HTTP 429".into(), t0, Duration::from_secs(1), Some(Duration::from_secs(60)));
        }
        assert_eq!(h.admit(t0 + Duration::from_secs(59)), Admit::Skip { until: t0 + Duration::from_secs(60) });
        assert_eq!(h.admit(t0 + Duration::from_secs(60)), Admit::Yes);
        h.abandoned();
        assert_eq!(h.admit(t0 + Duration::from_secs(60)), Admit::Yes);
        // A zero cool-down never trips.
        let mut z = Health::default();
        for _ in 0..5 {
            z.failed("x".into(), t0, Duration::ZERO, None);
        }
        assert_eq!(z.state.name(), "failing");
        assert_eq!(z.admit(t0), Admit::Yes);
    }
}
