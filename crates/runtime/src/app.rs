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
    wakes: Mutex<Option<WakeRx>>,
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
        App { gw, work, platforms, wakes: Mutex::new(Some(wakes)) }
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

    /// `status`: the incarnation's, with the agent, the platforms and the cluster.
    pub fn status(&self) -> StatusReport {
        let mut s = self.gw.status();
        if let Some(h) = self.gw.cluster.get() {
            let mut v = h.snapshot().to_json(Instant::now());
            v["journal"] = json!(self.work.journal.describe());
            s.extra.insert("cluster".into(), v);
        }
        s.extra.insert(
            "agent".to_owned(),
            json!({"backend": self.work.agent.name(), "last_failure": self.work.metrics.last_failure_json(),
                   "usage_by_chat": self.work.metrics.chat_usage_json(100)}),
        );
        if !self.platforms.is_empty() {
            s.extra.insert("platforms".to_owned(), Value::Array(self.platforms.report()));
        }
        s.providers = provider_statuses(&*self.work.agent);
        s
    }
}

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
