//! Server-sent events (the WHATWG `text/event-stream` format), encoded by one pure function,
//! and the ids of the page fragments the script (assets/dash.js) swaps when an event arrives.

/// The fragments a live page replaces: an SSE event named after one of these carries that
/// element's new outer HTML as its data.
pub const FRAGMENTS: &[&str] = &[
    HEADER,
    ACTIONS,
    OUTCOME,
    TIMELINE,
    RUNS,
    QUEUE,
    CONVERSATIONS,
    PLATFORMS,
    ACCESS,
    PROVIDERS,
    DOCTOR,
    UPDATE,
    LOG,
];

pub const HEADER: &str = "truth";
pub const TIMELINE: &str = "timeline";
pub const RUNS: &str = "runs";
pub const QUEUE: &str = "queue";
pub const PLATFORMS: &str = "platforms";
pub const ACCESS: &str = "access";
pub const DOCTOR: &str = "doctor";
pub const UPDATE: &str = "update";
pub const LOG: &str = "log";
pub const ACTIONS: &str = "actions";
pub const OUTCOME: &str = "action";
pub const CONVERSATIONS: &str = "conversations";
pub const PROVIDERS: &str = "providers";

/// One event: `event:` (when named), `id:` (when given), one `data:` line per line of `data`
/// (CR, LF and CRLF all split, as a browser would), then the blank line that ends it. A name
/// or id with a line break cannot be sent intact: its breaks become spaces, so an event never
/// injects another.
pub fn encode(event: Option<&str>, id: Option<&str>, data: &str) -> String {
    let one_line = |s: &str| s.replace(['\r', '\n'], " ");
    let mut out = String::with_capacity(data.len() + 32);
    if let Some(e) = event {
        out.push_str("event: ");
        out.push_str(&one_line(e));
        out.push('\n');
    }
    if let Some(i) = id {
        // An id with NUL is ignored by browsers (WHATWG): drop it rather than send it.
        out.push_str("id: ");
        out.push_str(&one_line(i).replace('\0', ""));
        out.push('\n');
    }
    let data = data.replace("\r\n", "\n").replace('\r', "\n");
    for line in data.split('\n') {
        out.push_str("data: ");
        out.push_str(line);
        out.push('\n');
    }
    out.push('\n');
    out
}

/// How long a browser waits before reconnecting a stream that ended (a restarting gateway's).
pub fn retry(ms: u32) -> String {
    format!("retry: {ms}\n\n")
}

/// A comment line: keeps a quiet stream from being cut by idle proxies.
pub fn keepalive() -> &'static str {
    ": keepalive\n\n"
}

/// A fragment update: the event is named after the fragment id (see [`FRAGMENTS`]).
pub fn fragment(id: &str, seq: u64, html: &str) -> String {
    encode(Some(id), Some(&seq.to_string()), html)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multiline_data_and_named_events() {
        assert_eq!(encode(None, None, "x"), "data: x\n\n");
        assert_eq!(
            encode(Some("truth"), Some("7"), "a\nb\r\nc\rd"),
            "event: truth\nid: 7\ndata: a\ndata: b\ndata: c\ndata: d\n\n"
        );
        assert_eq!(encode(None, None, ""), "data: \n\n");
        assert_eq!(encode(None, None, "end\n"), "data: end\ndata: \n\n");
        assert_eq!(retry(250), "retry: 250\n\n");
    }

    #[test]
    fn a_name_or_id_cannot_inject_another_event() {
        let e = encode(Some("x\n\ndata: evil"), Some("1\nevent: y\0"), "ok");
        assert_eq!(e, "event: x  data: evil\nid: 1 event: y\ndata: ok\n\n");
        // Exactly one blank line: one event.
        assert_eq!(e.matches("\n\n").count(), 1);
    }

    #[test]
    fn fragments_are_named_by_their_element_id() {
        assert_eq!(
            fragment(TIMELINE, 3, "<section id=\"timeline\"></section>"),
            "event: timeline\nid: 3\ndata: <section id=\"timeline\"></section>\n\n"
        );
        let mut ids = FRAGMENTS.to_vec();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), FRAGMENTS.len());
    }
}
