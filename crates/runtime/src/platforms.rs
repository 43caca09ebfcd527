//! The gateway's chat platform adapters (crates/platforms): built from `[[platform]]` tables,
//! started after the home lock is held and before `running`, each behind its credential lock;
//! inbound messages journaled through [`GatewayHost`]; drained intake-first.

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use gatewarden_agent::journal::{Kind, NewMessage};
use gatewarden_lifecycle::records::GatewayState;
use gatewarden_platforms::credlock::{self, CredLock, CredLockError, Holder};
use gatewarden_platforms::{Adapter, Host, Inbound, Outgoing, Sent, State};
use serde_json::{Value, json};

use crate::gateway::Gateway;
use crate::work::{Command, parse_command};

/// How often the watchdog looks at the adapters.
const WATCHDOG_EVERY: Duration = Duration::from_secs(5);
/// The least time a drain gives the outboxes, whatever is left of its budget.
const MIN_FLUSH: Duration = Duration::from_secs(2);
/// The most time a drain gives the outboxes.
const MAX_FLUSH: Duration = Duration::from_secs(10);

struct Entry {
    adapter: Arc<dyn Adapter>,
    admins: Vec<String>,
    lock: Mutex<Option<CredLock>>,
}

/// Every configured adapter.
#[derive(Default)]
pub struct Platforms {
    entries: Vec<Entry>,
    started: Mutex<Option<Instant>>,
}

impl Platforms {
    /// Builds the adapters; a missing credential is a configuration error (exit 78).
    pub fn build(config: &gatewarden_agent::Config) -> Result<Platforms, String> {
        let mut entries = Vec::new();
        for p in &config.platform {
            let adapter = gatewarden_platforms::build(p).map_err(|e| e.to_string())?;
            entries.push(Entry { adapter, admins: p.admins.clone(), lock: Mutex::new(None) });
        }
        Ok(Platforms { entries, started: Mutex::new(None) })
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn get(&self, name: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.adapter.name() == name)
    }

    pub fn is_admin(&self, adapter: &str, user: &str) -> bool {
        self.get(adapter).is_some_and(|e| e.admins.iter().any(|a| a == user))
    }

    /// Takes each credential lock, then starts the adapter. A credential held by another
    /// gateway parks that adapter, or fails the start (exit 78) when it is the only one.
    pub fn start(&self, gw: &Arc<Gateway>) -> Result<(), String> {
        *self.started.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        let host: Arc<dyn Host> = Arc::new(GatewayHost { gw: Arc::downgrade(gw) });
        for e in &self.entries {
            let a = &e.adapter;
            let me = Holder {
                home: gw.home_str.clone(),
                pid: gw.me.pid,
                incarnation: Some(gw.me.id.clone()),
                adapter: Some(a.name().to_owned()),
            };
            match credlock::acquire(a.kind(), a.credential(), &me) {
                Ok(lock) => *e.lock.lock().unwrap_or_else(|p| p.into_inner()) = Some(lock),
                Err(err @ CredLockError::Held { .. }) if self.entries.len() == 1 => {
                    return Err(format!(
                        "[[platform]] {}: {err}; one bot credential serves one gateway (stop the other one, or remove this [[platform]] table)",
                        a.name()
                    ));
                }
                Err(err) => {
                    let reason = err.to_string();
                    crate::warn!("[[platform]] {}: parked: {reason}", a.name());
                    a.park(reason);
                    host.state_changed(a.name(), &a.status().state());
                    continue;
                }
            }
            a.start(Arc::clone(&host)).map_err(|e| e.to_string())?;
            crate::info!("[[platform]] {} ({}) started", a.name(), a.kind());
        }
        Ok(())
    }

    /// The outbox has something for `adapter`.
    pub fn wake(&self, adapter: &str) {
        if let Some(e) = self.get(adapter) {
            e.adapter.wake();
        }
    }

    /// Drain, step 1 (blocking, bounded by one short call per adapter).
    pub fn stop_intake(&self) {
        for e in &self.entries {
            e.adapter.stop_intake();
        }
    }

    /// Drain, step 2 (blocking until `deadline`): flush the outboxes, close, release the
    /// credentials.
    pub fn close(&self, deadline: Instant) {
        for e in &self.entries {
            if !e.adapter.close(deadline) {
                crate::warn!(
                    "[[platform]] {}: replies still queued at the end of the drain (the next incarnation sends them)",
                    e.adapter.name()
                );
            }
            drop(e.lock.lock().unwrap_or_else(|p| p.into_inner()).take());
        }
    }

    /// How long the drain lets the outboxes flush, from what is left of its budget.
    pub fn flush_budget(left: Duration) -> Duration {
        left.clamp(MIN_FLUSH, MAX_FLUSH)
    }

    /// `status --json`'s `platforms` array.
    pub fn report(&self) -> Vec<Value> {
        self.entries
            .iter()
            .map(|e| {
                let s = e.adapter.status().snapshot();
                json!({
                    "name": e.adapter.name(),
                    "kind": e.adapter.kind(),
                    "state": s.state.name(),
                    "reason": s.state.reason(),
                    "since": s.since,
                    "last_progress": s.last_progress,
                    "progress_age_s": s.progress_age_s,
                    "lag_s": s.lag_s,
                    "received": s.received,
                    "sent": s.sent,
                    "conflicts": s.conflicts,
                })
            })
            .collect()
    }

    /// `(name, kind, snapshot)` per adapter, for /metrics.
    pub fn snapshots(&self) -> Vec<(String, &'static str, gatewarden_platforms::Snapshot)> {
        self.entries
            .iter()
            .map(|e| (e.adapter.name().to_owned(), e.adapter.kind(), e.adapter.status().snapshot()))
            .collect()
    }

    /// Reconnects every connected adapter that made no progress for too long (a deaf
    /// connection looks alive to the adapter itself).
    pub fn watchdog(self: &Arc<Self>, gw: Arc<Gateway>) {
        if self.is_empty() {
            return;
        }
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(WATCHDOG_EVERY);
            loop {
                tick.tick().await;
                if gw.phase.get() != GatewayState::Running {
                    return;
                }
                let Some(started) = *me.started.lock().unwrap_or_else(|p| p.into_inner()) else { continue };
                for e in &me.entries {
                    let a = &e.adapter;
                    let age = a.status().progress_age(started);
                    if a.status().state() == State::Connected && age > a.watchdog_after() {
                        crate::warn!("[[platform]] {}: no progress for {age:?}; reconnecting", a.name());
                        gw.record("platform_watchdog", json!({"platform": a.name(), "idle_s": age.as_secs()}));
                        a.reconnect();
                    }
                }
            }
        });
    }
}

/// The gateway as the adapters see it. Weak: the adapters' threads must not keep the gateway
/// alive.
struct GatewayHost {
    gw: Weak<Gateway>,
}

impl GatewayHost {
    fn gw(&self) -> Result<Arc<Gateway>, String> {
        self.gw.upgrade().ok_or_else(|| "the gateway is shutting down".to_owned())
    }
}

impl Host for GatewayHost {
    fn deliver(&self, adapter: &str, m: Inbound) -> Result<(), String> {
        let gw = self.gw()?;
        let work = &gw.work;
        let j = &work.journal;
        let msg = NewMessage {
            chat_id: m.chat_id.clone(),
            user_id: m.user_id.clone(),
            text: m.text.clone(),
            kind: Kind::Async,
        };
        let Some(cmd) = parse_command(&m.text) else {
            if let Some(id) = j.accept_inbound(adapter, &m.event_id, &msg).map_err(|e| e.to_string())? {
                work.metrics.accepted_async.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                // Only a running gateway runs it; otherwise the next incarnation does.
                if gw.phase.get() == GatewayState::Running {
                    work.enqueue(id);
                }
            }
            return Ok(());
        };
        // A redelivered command was handled already: never restart twice.
        if j.has_event(adapter, &m.event_id).map_err(|e| e.to_string())? {
            return Ok(());
        }
        let admin = work.platforms().is_admin(adapter, &m.user_id);
        let (reply, then) = if matches!(cmd, Command::Restart | Command::Stop) && !admin {
            ("/restart and /stop are for this platform's admins ([[platform]] admins in config.toml)".to_owned(), None)
        } else {
            let out = work.command_from(&gw, cmd, Some(adapter), &m.chat_id, &m.user_id);
            (out.reply, out.then)
        };
        j.accept_inbound_command(adapter, &m.event_id, &msg, &reply).map_err(|e| e.to_string())?;
        work.platforms().wake(adapter);
        if let Some(cause) = then {
            work.send_cause(cause);
        }
        Ok(())
    }

    fn outbox(&self, adapter: &str, limit: usize) -> Result<Vec<Outgoing>, String> {
        self.gw()?.work.journal.outbox_pending(adapter, limit).map_err(|e| e.to_string())
    }

    fn sent(&self, seq: i64, outcome: Sent) {
        let Ok(gw) = self.gw() else { return };
        let failed = match &outcome {
            Sent::Ok => None,
            Sent::Rejected(why) => Some(why.as_str()),
        };
        if let Some(why) = failed {
            crate::warn!("outbox entry {seq} refused by the platform for good: {why}");
        }
        if let Err(e) = gw.work.journal.outbox_done(seq, failed) {
            crate::error!("cannot record outbox entry {seq} as sent: {e}");
        }
    }

    fn state_dir(&self) -> Option<std::path::PathBuf> {
        self.gw.upgrade().map(|gw| gw.home.dir().join("platforms"))
    }

    fn state_changed(&self, adapter: &str, state: &State) {
        let Ok(gw) = self.gw() else { return };
        match state {
            State::Degraded(r) | State::Parked(r) | State::Standby(r) => {
                crate::warn!("[[platform]] {adapter}: {} ({r})", state.name());
            }
            _ => crate::info!("[[platform]] {adapter}: {}", state.name()),
        }
        gw.record("platform_state", json!({"platform": adapter, "state": state.name(), "reason": state.reason()}));
    }
}
