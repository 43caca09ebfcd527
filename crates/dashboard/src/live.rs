//! One SSE connection's live view: the page's fragments ([`crate::render::fragment`]) encoded
//! as events ([`crate::sse`]), only those that changed since the last update. Its own module, so
//! the encoder stays a leaf that the renderer can name its fragment ids from.

use crate::sse::{FRAGMENTS, fragment};

/// One SSE connection's view of the page: which fragment HTML it last sent, so an update
/// sends only the fragments that changed (a quiet gateway costs a few bytes a second).
/// A new connection starts empty and so first sends every fragment: a browser that reconnects
/// after a restart is brought up to date whatever it missed.
#[derive(Debug, Default)]
pub struct Live {
    last: Vec<(&'static str, String)>,
    seq: u64,
    viewer: crate::Viewer,
}

impl Live {
    /// A stream for this viewer: its fragments carry its session's forms (and CSRF token).
    pub fn for_viewer(viewer: crate::Viewer) -> Live {
        Live { viewer, ..Live::default() }
    }

    /// The events that bring a page from the last update to `s` (empty when nothing changed).
    pub fn update(&mut self, s: &crate::Snapshot) -> String {
        let mut out = String::new();
        for &id in FRAGMENTS {
            let Some(html) = crate::render::fragment_for(id, s, &self.viewer) else { continue };
            match self.last.iter_mut().find(|(k, _)| *k == id) {
                Some((_, old)) if *old == html => continue,
                Some((_, old)) => *old = html.clone(),
                None => self.last.push((id, html.clone())),
            }
            self.seq += 1;
            out.push_str(&fragment(id, self.seq, &html));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sse::HEADER;

    #[test]
    fn live_sends_only_what_changed() {
        let mut s = crate::Snapshot::default();
        s.status.state = Some("running".into());
        let mut live = Live::default();
        let first = live.update(&s);
        assert_eq!(first.matches("\n\n").count(), FRAGMENTS.len(), "a new connection gets every fragment");
        assert_eq!(live.update(&s), "", "nothing changed, nothing sent");
        s.status.state = Some("draining".into());
        let next = live.update(&s);
        assert!(next.starts_with(&format!("event: {HEADER}\nid: {}\n", FRAGMENTS.len() + 1)), "{next}");
        assert_eq!(next.matches("\n\n").count(), 1, "only the header changed: {next}");
        assert!(next.contains("draining"));
    }
}
