//! What a run did inside its backend, for the message's trace (crates/journal/src/trace.rs):
//! which providers it tried and how each went, and when the first piece of the reply came.
//!
//! A task-local sink rather than a parameter: the [`super::Agent`] trait and its test doubles
//! stay as they are, a run that is not traced (a sync request, a test) notes nothing, and one
//! shared backend serves concurrent runs each with its own sink.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// Notes a run keeps at most: providers are tried once per round, in few rounds.
const MAX_NOTES: usize = 32;

/// One thing a backend noted during a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    /// A provider was tried from `started` for `elapsed`; `outcome` is `ok` or why not.
    ProviderTried { provider: String, outcome: String, started: SystemTime, elapsed: Duration },
    /// The first piece of the reply was handed on.
    FirstToken { at: SystemTime },
}

/// A run's notes; clone it into [`scope`] and read it with [`RunNotes::take`] afterwards.
#[derive(Debug, Clone, Default)]
pub struct RunNotes(Arc<Mutex<Vec<Note>>>);

impl RunNotes {
    /// The notes so far, oldest first.
    pub fn take(&self) -> Vec<Note> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    fn push(&self, note: Note) {
        let mut v = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let first_token = matches!(note, Note::FirstToken { .. });
        if v.len() < MAX_NOTES && !(first_token && v.iter().any(|n| matches!(n, Note::FirstToken { .. }))) {
            v.push(note);
        }
    }
}

tokio::task_local! {
    static NOTES: RunNotes;
}

/// Runs `f` with `notes` as the sink of what the backend notes.
pub async fn scope<F: Future>(notes: RunNotes, f: F) -> F::Output {
    NOTES.scope(notes, f).await
}

/// Notes `note` for the run in whose [`scope`] this is called (nothing outside one).
pub(crate) fn note(note: Note) {
    let _ = NOTES.try_with(|n| n.push(note));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn notes_go_to_their_own_run_only() {
        let notes = RunNotes::default();
        note(Note::FirstToken { at: SystemTime::now() }); // outside a scope: nowhere
        scope(notes.clone(), async {
            note(Note::FirstToken { at: SystemTime::now() });
            note(Note::FirstToken { at: SystemTime::now() }); // only the first counts
        })
        .await;
        assert_eq!(notes.take().len(), 1);
    }
}
