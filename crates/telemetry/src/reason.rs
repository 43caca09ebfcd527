//! A failure reason as exported: a code and a short sentence from a fixed vocabulary, never
//! the reason's own words. Reasons carry outside text (an agent's stderr, an upstream's error
//! body, which often quotes the prompt), and a collector is read by more people than the
//! journal: `gatewarden trace` keeps the whole reason, OTLP gets this.

/// What an error span says: `code` (`timeout`, `http_502`, …) as the
/// `gatewarden.reason_code` attribute, `message` as `status.message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reason {
    pub code: String,
    pub message: String,
}

impl Reason {
    fn fixed(code: &str, message: &str) -> Reason {
        Reason { code: code.to_owned(), message: message.to_owned() }
    }
}

/// The code and sentence for a recorded reason (a trace step's outcome, a message's failure).
/// Only the words of our own error shapes are matched; what comes out is one of the fixed
/// sentences below, or an HTTP status's three digits.
pub fn classify(reason: &str) -> Reason {
    let r = reason.trim_start().to_ascii_lowercase();
    if r.starts_with(gatewarden_journal::REASON_INTERRUPTED_TWICE) {
        return Reason::fixed("interrupted", "the run was interrupted on both attempts");
    }
    if r.starts_with("cancelled") {
        return Reason::fixed("cancelled", "the run was cancelled");
    }
    if r.starts_with("timed out") || r.contains("no response within") {
        return Reason::fixed("timeout", "no answer within the time allowed");
    }
    if let Some(status) = http_status(&r) {
        return Reason { code: format!("http_{status}"), message: format!("the upstream answered HTTP {status}") };
    }
    if r.contains("cannot connect") {
        return Reason::fixed("connect", "the upstream could not be reached");
    }
    if r.contains("certificate") || r.contains("tls") {
        return Reason::fixed("tls", "the upstream's TLS was refused");
    }
    // The exec backend's `"<program>" failed (exit status 3): <stderr>`.
    if r.starts_with("exec") || (r.starts_with('"') && r.contains("\" failed (")) {
        return Reason::fixed("agent_failed", "the agent command failed");
    }
    Reason::fixed("failed", "failed")
}

/// The status of the first `HTTP nnn` in one of our reasons (`upstream returned HTTP 502: …`,
/// a provider's `HTTP 429`).
fn http_status(r: &str) -> Option<u16> {
    let at = r.find("http ")?;
    let digits = r.get(at + 5..at + 8)?;
    let after = r.as_bytes().get(at + 8).copied();
    (digits.bytes().all(|b| b.is_ascii_digit()) && !after.is_some_and(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
        .filter(|s| (100..600).contains(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_become_codes_without_their_text() {
        let secret = "the launch code is 0000";
        for (reason, code) in [
            (format!("upstream returned HTTP 400: context too long: {secret}"), "http_400"),
            (format!("openai backend: no provider answered: primary: HTTP 502: {secret}"), "http_502"),
            (format!("exec backend: cannot write the history file: {secret}"), "agent_failed"),
            (format!("\"/bin/agent\" failed (exit status: 3): {secret}"), "agent_failed"),
            ("timed out after 120 s".to_owned(), "timeout"),
            ("no response within attempt_timeout_s".to_owned(), "timeout"),
            ("cancelled".to_owned(), "cancelled"),
            ("interrupted twice".to_owned(), "interrupted"),
            (format!("cannot connect: connection refused {secret}"), "connect"),
            (format!("\u{1b}]0;{secret}\u{7}"), "failed"),
            (secret.to_owned(), "failed"),
        ] {
            let r = classify(&reason);
            assert_eq!(r.code, code, "{reason}");
            assert!(!r.message.contains("launch") && !r.code.contains("launch"), "{r:?}");
        }
        assert_eq!(classify("HTTP 5021").code, "failed", "three digits, no more");
    }
}
