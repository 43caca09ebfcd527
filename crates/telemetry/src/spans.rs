//! A message's trace as spans. Ids are derived from the message id (sha256), so the spans of
//! one message always share one trace id, whichever incarnation exports them.

use std::time::SystemTime;

use gatewarden_journal::{Message, Step, TraceEvent};
use sha2::Digest;

use crate::reason::{Reason, classify};

/// One span, before encoding ([`crate::otlp::traces`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub parent: Option<[u8; 8]>,
    pub name: &'static str,
    pub start: SystemTime,
    pub end: SystemTime,
    pub attributes: Vec<(&'static str, String)>,
    /// `Some(why)`: the span's status is an error (a code and a fixed sentence, never the
    /// reason's own text: crate::reason).
    pub error: Option<Reason>,
}

/// The trace id of message `id`.
pub fn trace_id(id: &str) -> [u8; 16] {
    let d = sha2::Sha256::digest(format!("gatewarden-trace\0{id}").as_bytes());
    let mut out = [0u8; 16];
    out.copy_from_slice(&d[..16]);
    out
}

fn span_id(id: &str, name: &str, n: usize) -> [u8; 8] {
    let d = sha2::Sha256::digest(format!("gatewarden-span\0{id}\0{name}\0{n}").as_bytes());
    let mut out = [0u8; 8];
    out.copy_from_slice(&d[..8]);
    out
}

/// The spans of `msg` from its trace (oldest step first), all under one `gatewarden.message`
/// span: `gatewarden.journal` (received → journaled), `gatewarden.queue` (→ each claim),
/// `gatewarden.run` (backend called → done/failed) with `gatewarden.provider` per provider
/// tried and `gatewarden.first_token` (time to first token) under it, `gatewarden.requeued` /
/// `gatewarden.given_up`, and `gatewarden.outbox` (→ each send). Empty when the trace has no
/// `received` step (a store that keeps no trace, or a pruned message).
pub fn spans_for(msg: &Message, events: &[TraceEvent]) -> Vec<Span> {
    let timed: Vec<(&TraceEvent, SystemTime)> = events.iter().filter_map(|e| Some((e, e.time()?))).collect();
    let Some(&(_, received)) = timed.iter().find(|(e, _)| e.step == Step::Received) else { return Vec::new() };
    let last = timed.iter().map(|(_, t)| *t).max().unwrap_or(received);
    let tid = trace_id(&msg.id);
    let root_id = span_id(&msg.id, "message", 0);
    let platform = msg.platform.clone().unwrap_or_else(|| "http".into());
    let finished = timed.iter().rev().find(|(e, _)| e.step.is_final());
    let mut root = Span {
        trace_id: tid,
        span_id: root_id,
        parent: None,
        name: "gatewarden.message",
        start: received,
        end: last,
        attributes: vec![
            ("gatewarden.message_id", msg.id.clone()),
            ("gatewarden.platform", platform.clone()),
            ("gatewarden.state", msg.state.as_str().to_owned()),
            ("gatewarden.attempts", msg.attempts.to_string()),
        ],
        error: None,
    };
    if let Some((e, _)) = finished
        && e.step != Step::Done
    {
        root.error = Some(classify(e.outcome.as_deref().unwrap_or(e.step.as_str())));
    }
    let mut out = vec![root];
    let mut n = 0usize;
    let mut child = |name: &'static str, parent: [u8; 8], start: SystemTime, end: SystemTime| {
        n += 1;
        Span {
            trace_id: tid,
            span_id: span_id(&msg.id, name, n),
            parent: Some(parent),
            name,
            start,
            end: end.max(start),
            attributes: vec![("gatewarden.message_id", msg.id.clone())],
            error: None,
        }
    };
    // The step before each one, for spans that run from it.
    let mut prev = received;
    let mut run: Option<usize> = None;
    for (i, &(e, at)) in timed.iter().enumerate() {
        match e.step {
            Step::Received => {}
            Step::Journaled => out.push(child("gatewarden.journal", root_id, prev, at)),
            Step::Claimed => {
                let mut s = child("gatewarden.queue", root_id, prev, at);
                s.attributes.extend(e.subject.clone().map(|s| ("gatewarden.incarnation", s)));
                out.push(s);
            }
            Step::BackendCalled => {
                // The run lasts until its finish (or the last step seen).
                let end = timed[i..].iter().find(|(x, _)| x.step.is_final()).map_or(last, |(_, t)| *t);
                let mut s = child("gatewarden.run", root_id, at, end);
                s.attributes.extend(e.subject.clone().map(|b| ("gatewarden.backend", b)));
                run = Some(out.len());
                out.push(s);
            }
            Step::ProviderTried | Step::FirstToken => {
                let parent = run.map_or(root_id, |r| out[r].span_id);
                let mut s =
                    if e.step == Step::ProviderTried {
                        let end = at + std::time::Duration::from_millis(e.elapsed_ms.unwrap_or(0));
                        let mut s = child("gatewarden.provider", parent, at, end);
                        s.attributes.extend(e.subject.clone().map(|p| ("gatewarden.provider", p)));
                        // The outcome's code: its words may quote an upstream's error body.
                        s.attributes.extend(e.outcome.as_deref().map(|o| {
                            ("gatewarden.outcome", if o == "ok" { "ok".to_owned() } else { classify(o).code })
                        }));
                        s
                    } else {
                        let from = run.map_or(prev, |r| out[r].start);
                        child("gatewarden.first_token", parent, from, at)
                    };
                if let Some(o) = e.outcome.as_deref().filter(|o| *o != "ok") {
                    s.error = Some(classify(o));
                }
                out.push(s);
            }
            Step::Done | Step::Failed => {
                if let Some(r) = run.take() {
                    out[r].end = at.max(out[r].start);
                    if e.step == Step::Failed {
                        out[r].error = Some(classify(e.outcome.as_deref().unwrap_or("failed")));
                    }
                }
            }
            Step::Requeued | Step::GivenUp => {
                let name = if e.step == Step::Requeued { "gatewarden.requeued" } else { "gatewarden.given_up" };
                let mut s = child(name, root_id, at, at);
                if e.step == Step::GivenUp {
                    s.error = e.outcome.as_deref().map(classify);
                }
                out.push(s);
            }
            Step::OutboxSent | Step::OutboxFailed => {
                let mut s = child("gatewarden.outbox", root_id, prev, at);
                s.attributes.push(("gatewarden.platform", e.subject.clone().unwrap_or_else(|| platform.clone())));
                if e.step == Step::OutboxFailed {
                    s.error = Some(classify(e.outcome.as_deref().unwrap_or("failed")));
                }
                out.push(s);
            }
        }
        prev = at;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use gatewarden_journal::{Kind, State};
    use std::time::Duration;

    fn msg() -> Message {
        Message {
            id: "abc".into(),
            chat_id: "c".into(),
            user_id: "u".into(),
            text: "t".into(),
            kind: Kind::Async,
            state: State::Done,
            reply: None,
            reason: None,
            attempts: 1,
            incarnation: None,
            is_command: false,
            platform: Some("irc".into()),
            created_at: String::new(),
            updated_at: String::new(),
        }
    }

    #[test]
    fn the_run_holds_its_providers_and_everything_is_under_the_message() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let at = |ms: u64, step| TraceEvent::at(step, t0 + Duration::from_millis(ms));
        let events = vec![
            at(0, Step::Received),
            at(1, Step::Journaled),
            at(2, Step::Claimed).subject("inc"),
            at(3, Step::BackendCalled).subject("openai"),
            at(4, Step::ProviderTried).subject("p1").outcome("HTTP 502").elapsed(Duration::from_millis(5)),
            at(10, Step::ProviderTried).subject("p2").outcome("ok").elapsed(Duration::from_millis(9)),
            at(12, Step::FirstToken),
            at(20, Step::Done),
            at(30, Step::OutboxSent).subject("irc"),
        ];
        let spans = spans_for(&msg(), &events);
        let names: Vec<&str> = spans.iter().map(|s| s.name).collect();
        assert_eq!(
            names,
            [
                "gatewarden.message",
                "gatewarden.journal",
                "gatewarden.queue",
                "gatewarden.run",
                "gatewarden.provider",
                "gatewarden.provider",
                "gatewarden.first_token",
                "gatewarden.outbox"
            ]
        );
        let root = &spans[0];
        assert!(spans.iter().all(|s| s.trace_id == root.trace_id));
        assert_eq!(spans[3].parent, Some(root.span_id));
        assert_eq!(spans[4].parent, Some(spans[3].span_id), "a provider tried is a child of the run");
        assert_eq!(spans[4].error.as_ref().map(|r| r.code.as_str()), Some("http_502"));
        assert_eq!(spans[5].error, None);
        assert_eq!(spans[3].end, t0 + Duration::from_millis(20));
        assert_eq!((root.start, root.end), (t0, t0 + Duration::from_millis(30)));
        let ids: std::collections::HashSet<_> = spans.iter().map(|s| s.span_id).collect();
        assert_eq!(ids.len(), spans.len(), "span ids are unique");
    }
}
