//! The one mapping between a store's rows and the journal's types, shared by the SQLite journal
//! ([`crate::sqlite`]) and the cluster's PostgreSQL journal (crates/cluster/src/journal.rs):
//! which columns a message and an outbox entry are read from, in which order, and how the
//! stored words become [`Kind`], [`State`] and [`Counts`]. A store supplies only how its driver
//! reads one cell ([`Cells`]) and how it formats a timestamp column as the protocol's text.

use crate::{Counts, JournalError, Kind, Message, Outgoing, State};

/// A message's columns, in the order [`read_message`] reads them.
pub const MESSAGE_COLUMNS: [&str; 14] = [
    "id",
    "chat_id",
    "user_id",
    "text",
    "kind",
    "state",
    "reply",
    "reason",
    "attempts",
    "incarnation",
    "is_command",
    "platform",
    "created_at",
    "updated_at",
];

/// An outbox entry's columns, in the order [`read_outgoing`] reads them.
pub const OUTGOING_COLUMNS: [&str; 5] = ["seq", "chat_id", "text", "message_id", "created_at"];

/// `columns` as a select list; each timestamp column (`*_at`) goes through `timestamp`, which
/// turns it into RFC 3339 UTC text (crates/lifecycle/src/timefmt.rs) when the store keeps its
/// own timestamp type.
pub fn select_list(columns: &[&str], timestamp: impl Fn(&str) -> String) -> String {
    let each = columns.iter().map(|c| if c.ends_with("_at") { timestamp(c) } else { (*c).to_owned() });
    each.collect::<Vec<_>>().join(", ")
}

/// One row of a store's driver, read by 0-based column index in the select list's order. A
/// cell of the wrong type or a driver failure is an error, never a panic.
pub trait Cells {
    fn text(&self, i: usize) -> Result<String, JournalError>;
    fn text_opt(&self, i: usize) -> Result<Option<String>, JournalError>;
    fn int(&self, i: usize) -> Result<i64, JournalError>;
    fn int_opt(&self, i: usize) -> Result<Option<i64>, JournalError>;
    fn flag(&self, i: usize) -> Result<bool, JournalError>;
}

/// A message from a row selected with [`MESSAGE_COLUMNS`]; a `kind` or `state` word this build
/// does not know is [`JournalError::Corrupt`].
pub fn read_message(row: &impl Cells) -> Result<Message, JournalError> {
    let id = row.text(0)?;
    let corrupt = |column: &'static str, value: String| JournalError::Corrupt { id: id.clone(), column, value };
    let kind = row.text(4)?;
    let kind = Kind::parse(&kind).ok_or_else(|| corrupt("kind", kind.clone()))?;
    let state = row.text(5)?;
    let state = State::parse(&state).ok_or_else(|| corrupt("state", state.clone()))?;
    Ok(Message {
        chat_id: row.text(1)?,
        user_id: row.text(2)?,
        text: row.text(3)?,
        kind,
        state,
        reply: row.text_opt(6)?,
        reason: row.text_opt(7)?,
        attempts: row.int(8)?,
        incarnation: row.text_opt(9)?,
        is_command: row.flag(10)?,
        platform: row.text_opt(11)?,
        created_at: row.text_opt(12)?.unwrap_or_default(),
        updated_at: row.text_opt(13)?.unwrap_or_default(),
        id,
    })
}

/// An outbox entry from a row selected with [`OUTGOING_COLUMNS`].
pub fn read_outgoing(row: &impl Cells) -> Result<Outgoing, JournalError> {
    Ok(Outgoing {
        seq: row.int(0)?,
        chat_id: row.text(1)?,
        text: row.text(2)?,
        message_id: row.text_opt(3)?,
        created_at: row.text_opt(4)?.unwrap_or_default(),
    })
}

impl Counts {
    /// Sets the count of the stored state `state` to `n` (a row of `SELECT state, count(*) …
    /// GROUP BY state`); a state this build does not know counts nowhere.
    pub fn record(&mut self, state: &str, n: i64) {
        let n = u64::try_from(n).unwrap_or(0);
        match State::parse(state) {
            Some(State::Queued) => self.queued = n,
            Some(State::Running) => self.running = n,
            Some(State::Done) => self.done = n,
            Some(State::Failed) => self.failed = n,
            None => {}
        }
    }
}

/// A run's `(prompt, completion)` tokens as the two nullable integer columns both stores keep
/// (`prompt_tokens`, `completion_tokens`); a count past `i64::MAX` is stored as the maximum.
pub fn usage_columns(usage: Option<(u64, u64)>) -> (Option<i64>, Option<i64>) {
    let column = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    (usage.map(|u| column(u.0)), usage.map(|u| column(u.1)))
}

/// The inverse of [`usage_columns`]: none without a prompt count, a missing completion count
/// read as 0, a negative one (never written) as none.
pub fn usage_from(prompt: Option<i64>, completion: Option<i64>) -> Option<(u64, u64)> {
    let count = |v: Option<i64>| v.and_then(|v| u64::try_from(v).ok());
    Some((count(prompt)?, count(completion).unwrap_or(0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_alone_go_through_the_store_format() {
        let list = select_list(&OUTGOING_COLUMNS, |c| format!("fmt({c})"));
        assert_eq!(list, "seq, chat_id, text, message_id, fmt(created_at)");
    }
}
