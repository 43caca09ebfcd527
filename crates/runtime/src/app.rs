//! One gateway as the HTTP API and the control channel see it: the incarnation's state
//! ([`Gateway`], which it dereferences to), the worker that runs messages ([`Work`]) and the
//! chat platform host ([`Platforms`]). The worker and the host do not hold each other: the
//! host delivers through the worker's [`crate::intake::Intake`], the worker wakes the host
//! through a channel ([`App::follow_wakes`]).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use gatewarden_control::StatusReport;
use serde_json::{Value, json};

use crate::gateway::Gateway;
use crate::intake::{Intake, Nudge, WakeRx};
use crate::platforms::Platforms;
use crate::worker::Work;

pub struct App {
    pub gw: Arc<Gateway>,
    pub work: Arc<Work>,
    pub platforms: Arc<Platforms>,
    /// What the gateway was configured with, for `reload` (reload.rs).
    pub reload: crate::reload::State,
    wakes: Mutex<Option<WakeRx>>,
    /// Where each secret came from, as last resolved (status: never a value).
    secrets: Mutex<Vec<gatewarden_config::secrets::Report>>,
}

impl std::ops::Deref for App {
    type Target = Gateway;
    fn deref(&self) -> &Gateway {
        &self.gw
    }
}

impl App {
    /// Ties the parts together: the host delivers to `work`, `wakes` is the other end of
    /// `work.wake`.
    pub fn new(gw: Arc<Gateway>, work: Arc<Work>, platforms: Arc<Platforms>, wakes: WakeRx) -> App {
        platforms.set_intake(Arc::clone(&work) as Arc<dyn Intake>);
        App {
            gw,
            work,
            platforms,
            reload: Default::default(),
            wakes: Mutex::new(Some(wakes)),
            secrets: Mutex::new(Vec::new()),
        }
    }

    /// Records where the secrets were found (crates/config/src/secrets.rs), for `status`.
    pub fn set_secrets(&self, secrets: &gatewarden_config::Secrets) {
        *self.secrets.lock().unwrap_or_else(|p| p.into_inner()) = secrets.report();
    }

    /// Forwards the worker's wakes to the adapters until the worker is gone (once).
    pub fn follow_wakes(&self) {
        let Some(mut rx) = self.wakes.lock().unwrap_or_else(|p| p.into_inner()).take() else { return };
        let platforms = Arc::clone(&self.platforms);
        tokio::spawn(async move {
            while let Some(nudge) = rx.recv().await {
                match nudge {
                    Nudge::Outbox(adapter) => platforms.wake(&adapter),
                    Nudge::Show { adapter, chat, run, activity } => platforms.show(&adapter, &chat, &run, activity),
                }
            }
        });
    }

    /// Tells whoever asked for a restart how it went (`restart::begin`).
    pub fn tell(&self, asker: crate::cause::Asker, verdict: crate::cause::Verdict) {
        use crate::cause::Asker;
        match (asker, verdict) {
            (Asker::Waiting(tx), v) => {
                let _ = tx.send(v);
            }
            (Asker::Chat { platform, chat_id }, Err(why)) => {
                let text = format!("restart refused: {why}; still running (incarnation {})", self.gw.me.id);
                match self.work.journal.enqueue(&platform, &chat_id, &text) {
                    Ok(_) => self.work.wake.wake(&platform),
                    Err(e) => crate::warn!("cannot tell chat {chat_id} on {platform} why the restart was refused: {e}"),
                }
            }
            (Asker::Chat { .. } | Asker::Nobody, _) => {}
        }
    }

    /// `status`: the incarnation's, with the agent, the platforms and the cluster.
    pub fn status(&self) -> StatusReport {
        let mut s = self.gw.status();
        if let Some(h) = self.gw.cluster.get() {
            let mut v = h.snapshot().to_json(Instant::now());
            v["journal"] = json!(self.work.journal.describe());
            s.extra.insert("cluster".into(), v);
        }
        let agent = Arc::clone(&self.work.live().agent);
        s.extra.insert(
            "agent".to_owned(),
            json!({"backend": agent.name(), "last_failure": self.work.metrics.last_failure_json(),
                   "runs": self.work.metrics.runs_json(),
                   "usage_by_chat": self.work.metrics.chat_usage_json(100)}),
        );
        if !self.platforms.is_empty() {
            let mut report = self.platforms.report();
            self.add_access(&mut report);
            s.extra.insert("platforms".to_owned(), Value::Array(report));
        }
        let secrets = self.secrets.lock().unwrap_or_else(|p| p.into_inner());
        if !secrets.is_empty() {
            s.extra.insert("secrets".to_owned(), json!(*secrets));
        }
        let pending = self.reload.restart_needed();
        if !pending.is_empty() {
            s.extra.insert("restart_needed".to_owned(), json!(pending));
        }
        s.providers = provider_statuses(&*agent);
        s
    }
}

impl App {
    /// [`App::status`] with how full the journal is against its caps (`journal`): what the
    /// control `status` request and `GET /v1/status` answer. The journal is read off the async
    /// threads, and left out when it does not answer within [`JOURNAL_WAIT`] (a status is never
    /// held up by a busy journal).
    pub async fn status_with_journal(&self) -> StatusReport {
        let mut s = self.status();
        let caps = self.work.live().retention.clone();
        if let Ok(Ok(d)) = tokio::time::timeout(JOURNAL_WAIT, self.work.with_journal(|j| j.depth())).await {
            let cap = |n: u64| (n > 0).then_some(n);
            s.extra.insert(
                "journal".to_owned(),
                json!({"queued": d.queued, "busiest_chat_queued": d.busiest_chat, "bytes": d.bytes,
                       "max_bytes": caps.max_bytes(), "max_queued": cap(caps.max_queued),
                       "max_queued_per_chat": cap(caps.max_queued_per_chat)}),
            );
        }
        s
    }

    /// Each platform's access policy and pairing count beside its adapter's state
    /// (docs/protocol.md §4): `access`, `open` (anyone can reach the agent), `pending`,
    /// `approved` and `refused` by reason, this incarnation.
    fn add_access(&self, report: &mut [Value]) {
        let gate = &self.work.gate;
        let access = gate.report_cached(std::time::SystemTime::now());
        for p in report.iter_mut() {
            let Some(name) = p["name"].as_str().map(str::to_owned) else { continue };
            let Some(a) = access.iter().find(|a| a["name"] == name.as_str()) else { continue };
            let count = |k: &str| a[k].as_array().map_or(0, Vec::len);
            p["access"] = a["access"].clone();
            p["open"] = json!(a["access"] == "open");
            p["pending"] = json!(count("pending"));
            p["approved"] = json!(count("approved"));
            p["refused"] = gate.refused_json(&name);
        }
    }
}

/// How long a status waits for the journal's depth.
const JOURNAL_WAIT: std::time::Duration = std::time::Duration::from_millis(60);

/// The agent's upstream providers for `status` (`None` when the backend has none).
fn provider_statuses(agent: &dyn gatewarden_agent::Agent) -> Option<Vec<gatewarden_control::proto::ProviderStatus>> {
    let ps = agent.providers();
    let unix = |t: std::time::SystemTime| t.duration_since(std::time::UNIX_EPOCH).ok().map(|d| d.as_secs());
    (!ps.is_empty()).then(|| {
        ps.into_iter()
            .map(|p| gatewarden_control::proto::ProviderStatus {
                name: p.name,
                state: p.state,
                reason: p.reason,
                until: p.until.and_then(unix),
                attempts: p.attempts,
                failures: p.failures,
            })
            .collect()
    })
}
