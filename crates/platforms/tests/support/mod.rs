//! What every adapter test shares: an in-memory [`Host`] standing in for the gateway's journal
//! and outbox, and a bounded wait. Include it with `mod support;`.
#![allow(dead_code)] // each test binary uses a part of it

use std::sync::Mutex;
use std::time::{Duration, Instant};

use gatewarden_platforms::{Host, Inbound, Outgoing, Sent, State};

/// The journal of a test: inbound messages deduplicated by event id (as the journal's
/// `(platform, event_id)` key does), an outbox, and the outcome of every send. An echoing host
/// queues `echo: <text>` for each new message; a silent one only what the test queues.
pub struct MemHost {
    pub inbox: Mutex<Vec<Inbound>>,
    pub outbox: Mutex<Vec<Outgoing>>,
    pub outcomes: Mutex<Vec<(i64, Sent)>>,
    /// Refuse commits ("disk full") while set.
    pub refuse: Mutex<bool>,
    /// What `receive_budget` answers (`None`: unbounded).
    pub budget: Mutex<Option<Duration>>,
    /// Every state the adapter reported, in order.
    pub states: Mutex<Vec<State>>,
    seq: Mutex<i64>,
    echo: bool,
}

impl MemHost {
    fn new(echo: bool) -> Self {
        MemHost {
            inbox: Mutex::default(),
            outbox: Mutex::default(),
            outcomes: Mutex::default(),
            refuse: Mutex::default(),
            budget: Mutex::default(),
            states: Mutex::default(),
            seq: Mutex::default(),
            echo,
        }
    }

    /// Replies `echo: <text>` to each new message.
    pub fn echoing() -> Self {
        Self::new(true)
    }

    /// Sends only what the test queues.
    pub fn silent() -> Self {
        Self::new(false)
    }

    /// Queues `text` for `chat`; returns its outbox sequence number (1, 2, …).
    pub fn queue(&self, chat: &str, text: &str) -> i64 {
        let mut seq = self.seq.lock().unwrap();
        *seq += 1;
        let o = Outgoing {
            seq: *seq,
            chat_id: chat.into(),
            text: text.into(),
            message_id: None,
            created_at: String::new(),
        };
        self.outbox.lock().unwrap().push(o);
        *seq
    }
}

impl Host for MemHost {
    fn deliver(&self, _adapter: &str, msg: Inbound) -> Result<(), String> {
        if *self.refuse.lock().unwrap() {
            return Err("disk full".into());
        }
        if self.inbox.lock().unwrap().iter().any(|m| m.event_id == msg.event_id) {
            return Ok(());
        }
        if self.echo {
            self.queue(&msg.chat_id, &format!("echo: {}", msg.text));
        }
        self.inbox.lock().unwrap().push(msg);
        Ok(())
    }
    fn outbox(&self, _adapter: &str, limit: usize) -> Result<Vec<Outgoing>, String> {
        Ok(self.outbox.lock().unwrap().iter().take(limit).cloned().collect())
    }
    fn sent(&self, seq: i64, outcome: Sent) {
        self.outbox.lock().unwrap().retain(|o| o.seq != seq);
        self.outcomes.lock().unwrap().push((seq, outcome));
    }
    fn state_changed(&self, _adapter: &str, state: &State) {
        self.states.lock().unwrap().push(state.clone());
    }
    fn receive_budget(&self) -> Option<Duration> {
        *self.budget.lock().unwrap()
    }
}

/// Waits up to 10 s for `f`, or fails the test naming `what`.
#[track_caller]
pub fn wait(what: &str, f: impl FnMut() -> bool) {
    wait_for(what, Duration::from_secs(10), f);
}

/// Waits up to `timeout` for `f`, or fails the test naming `what`.
#[track_caller]
pub fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    // Not testkit's: it is Unix-only, and these tests also run under Wine.
    let end = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < end, "timed out after {timeout:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}
