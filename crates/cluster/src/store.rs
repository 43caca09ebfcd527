//! [`PgStore`]: the gateway's journal on PostgreSQL, behind the synchronous
//! `gatewarden_journal::Store` trait the runtime uses.
//!
//! The sync/async bridge: the runtime calls the store from tokio workers and blocking threads,
//! so the store never calls `block_on` on the caller's runtime. A dedicated thread owns its own
//! current-thread tokio runtime and the journal's connection (separate from the lease's, so
//! renewals never queue behind journal work); requests travel over a channel, one at a time,
//! and the caller waits for the answer at most [`PgStore::timeout`]. A store that does not
//! answer is an error, never a hang: the thread bounds each request by the same timeout and
//! then forgets the connection, which the next request reopens (`PgLease::client`).
//!
//! Every write carries the epoch of the lease driver's snapshot at the time of the call (the
//! handle [`PgStore::attach`]ed when the cluster role starts). Without a live epoch (a standby,
//! a demoted active) a write fails at once; a write the database's fence refuses fails with
//! `JournalError::Fenced` and tells the driver, which demotes now (stops intake) rather than
//! at its next renewal.

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use gatewarden_journal::JournalError;
use gatewarden_journal::{Counts, Message, NewMessage, Outgoing, Pruned, State, Store, TraceEvent};
use tokio::sync::mpsc;

use crate::driver::Handle;
use crate::journal::PgJournal;
use crate::{ClusterError, PgLease};

/// How long a journal call may take, queueing included (a TTL-sized bound: a store slower than
/// this has lost the lease anyway).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

type Job = Box<dyn FnOnce(&mut PgJournal) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> + Send>;

/// The journal of one cluster, shared by all of its gateways.
pub struct PgStore {
    jobs: mpsc::UnboundedSender<Job>,
    /// `(message id, run tag)` of claims whose answer was lost: retried, they count as ours if
    /// the row is `running` under that run (see `claim`).
    unsettled: Arc<Mutex<HashSet<(String, String)>>>,
    handle: OnceLock<Handle>,
    name: String,
    timeout: Duration,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore").field("name", &self.name).field("timeout", &self.timeout).finish()
    }
}

impl PgStore {
    /// [`PgStore::start`] as this process's journal (the gateway's, or a CLI reading it): the
    /// application name the store's sessions show, "gatewarden journal pid N".
    pub fn start_journal(url: &str, password: Option<&str>, name: &str) -> Result<PgStore, ClusterError> {
        PgStore::start(url, password, name, &format!("gatewarden journal pid {}", std::process::id()))
    }

    /// Starts the store's thread. Nothing is connected yet: the first request connects (and
    /// migrates), so a gateway starts while the database is down and its requests fail.
    pub fn start(url: &str, password: Option<&str>, name: &str, app: &str) -> Result<PgStore, ClusterError> {
        let lease = PgLease::new(url, password, name)?.with_application_name(app);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| ClusterError::Store(format!("cannot start the store's runtime: {e}")))?;
        let (jobs, mut rx) = mpsc::unbounded_channel::<Job>();
        std::thread::Builder::new()
            .name("gw-pgjournal".into())
            .spawn(move || {
                let mut journal = PgJournal::new(lease);
                // Ends when the store is dropped (the channel closes).
                rt.block_on(async move {
                    while let Some(job) = rx.recv().await {
                        job(&mut journal).await;
                    }
                });
            })
            .map_err(|e| ClusterError::Store(format!("cannot start the store's thread: {e}")))?;
        Ok(PgStore {
            jobs,
            unsettled: Arc::default(),
            handle: OnceLock::new(),
            name: name.to_owned(),
            timeout: DEFAULT_TIMEOUT,
        })
    }

    /// Bounds every call (default [`DEFAULT_TIMEOUT`]).
    pub fn with_timeout(mut self, timeout: Duration) -> PgStore {
        self.timeout = timeout;
        self
    }

    /// The bound on every call.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Connects the store to the lease driver: writes carry its epoch from now on.
    pub fn attach(&self, handle: Handle) {
        let _ = self.handle.set(handle);
    }

    /// The epoch to write under: ours while the snapshot says active.
    fn epoch(&self) -> Result<i64, JournalError> {
        let snap = self
            .handle
            .get()
            .map(Handle::snapshot)
            .ok_or_else(|| JournalError::Fenced("the cluster role has not started".into()))?;
        match snap.epoch {
            Some(e) if snap.is_active_at(Instant::now()) => Ok(e),
            _ => Err(JournalError::Fenced(format!("this gateway is not the active of cluster {}", self.name))),
        }
    }

    /// Runs `f` on the store's thread and waits for its answer, at most the timeout.
    fn call<T, F>(&self, f: F) -> Result<T, JournalError>
    where
        T: Send + 'static,
        F: for<'a> FnOnce(&'a mut PgJournal) -> Pin<Box<dyn Future<Output = Result<T, ClusterError>> + Send + 'a>>
            + Send
            + 'static,
    {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let budget = self.timeout;
        let job: Job = Box::new(move |j: &mut PgJournal| {
            Box::pin(async move {
                let r = match tokio::time::timeout(budget, f(j)).await {
                    Ok(r) => r,
                    Err(_) => {
                        // The connection's state is unknown: the next request reconnects.
                        j.reset();
                        Err(ClusterError::Timeout(budget))
                    }
                };
                let _ = tx.send(r);
            })
        });
        self.jobs.send(job).map_err(|_| JournalError::Store("the store's thread is gone".into()))?;
        match rx.recv_timeout(budget + Duration::from_millis(100)) {
            Ok(r) => r.map_err(|e| self.error(e)),
            Err(_) => Err(JournalError::Store(format!("the cluster store did not answer within {budget:?}"))),
        }
    }

    /// A fenced write tells the driver at once: this gateway is no longer the active.
    fn error(&self, e: ClusterError) -> JournalError {
        match e {
            ClusterError::Fenced { epoch, detail } => {
                if let Some(h) = self.handle.get() {
                    h.fenced(epoch);
                }
                JournalError::Fenced(detail)
            }
            other => JournalError::Store(other.to_string()),
        }
    }

    /// A fenced write under the current epoch.
    fn write<T, F>(&self, f: F) -> Result<T, JournalError>
    where
        T: Send + 'static,
        F: for<'a> FnOnce(&'a mut PgJournal, i64) -> Pin<Box<dyn Future<Output = Result<T, ClusterError>> + Send + 'a>>
            + Send
            + 'static,
    {
        let epoch = self.epoch()?;
        self.call(move |j| f(j, epoch))
    }
}

/// Who runs a message: the process incarnation *and* the epoch it claimed it under. A run is
/// finished only by its incarnation while that epoch is current: after a demotion and a later
/// promotion of the same process, `recover` (under the new epoch) requeues the runs of the old
/// term like any other gateway's, and a late completion of such a run matches nothing.
fn run_tag(incarnation: &str, epoch: i64) -> String {
    format!("{incarnation}/e{epoch}")
}

/// A claim or finish whose answer was lost (a dropped connection after the commit) is settled
/// by reading the row: it is ours if it is in `want` under our run tag. Without this, a lost
/// acknowledgement would leave a row `running` under a live run that no longer runs it.
async fn settle(
    j: &mut PgJournal,
    r: Result<bool, ClusterError>,
    id: &str,
    run: &str,
    want: State,
) -> Result<bool, ClusterError> {
    match r {
        Err(e) if !matches!(e, ClusterError::Fenced { .. }) => match j.message(id).await {
            Ok(Some(m)) => Ok(m.state == want && m.incarnation.as_deref() == Some(run)),
            Ok(None) => Ok(false),
            Err(_) => Err(e),
        },
        r => r,
    }
}

impl Store for PgStore {
    fn describe(&self) -> String {
        format!("postgres cluster {}", self.name)
    }

    fn accept(&self, msg: &NewMessage) -> Result<String, JournalError> {
        let msg = msg.clone();
        self.write(move |j, e| Box::pin(async move { j.accept_message(e, &msg).await }))
    }

    fn accept_claimed(&self, msg: &NewMessage, incarnation: &str) -> Result<String, JournalError> {
        let (msg, inc) = (msg.clone(), incarnation.to_owned());
        // Under the run tag, as a claim records it ([`run_tag`]).
        self.write(move |j, e| Box::pin(async move { j.accept_claimed(e, &msg, &run_tag(&inc, e)).await }))
    }

    fn accept_command(&self, msg: &NewMessage, reply: &str) -> Result<String, JournalError> {
        let (msg, reply) = (msg.clone(), reply.to_owned());
        self.write(move |j, e| Box::pin(async move { j.accept_command(e, &msg, &reply).await }))
    }

    fn claim(&self, id: &str, incarnation: &str) -> Result<bool, JournalError> {
        let (id, inc, unsettled) = (id.to_owned(), incarnation.to_owned(), Arc::clone(&self.unsettled));
        self.write(move |j, e| {
            Box::pin(async move {
                let key = (id.clone(), run_tag(&inc, e));
                let run = key.1.clone();
                // Marked before the statement and cleared on a definite answer, so that a claim
                // cut short (an error, a timeout dropping this future) leaves the mark behind.
                let retry = !unsettled.lock().unwrap_or_else(|p| p.into_inner()).insert(key.clone());
                let r = match j.claim(e, &id, &run).await {
                    // The earlier attempt of this same run may have committed: then it is ours.
                    Ok(false) if retry => {
                        let lost = ClusterError::Store("the answer to an earlier claim was lost".into());
                        settle(j, Err(lost), &id, &run, State::Running).await
                    }
                    r => settle(j, r, &id, &run, State::Running).await,
                };
                if !matches!(r, Err(ClusterError::Store(_) | ClusterError::Connect(_) | ClusterError::Timeout(_))) {
                    unsettled.lock().unwrap_or_else(|p| p.into_inner()).remove(&key);
                }
                r
            })
        })
    }

    fn complete_traced(
        &self,
        id: &str,
        incarnation: &str,
        reply: &str,
        usage: Option<(u64, u64)>,
        steps: &[TraceEvent],
    ) -> Result<bool, JournalError> {
        let (id, inc, reply, steps) = (id.to_owned(), incarnation.to_owned(), reply.to_owned(), steps.to_vec());
        self.write(move |j, e| {
            Box::pin(async move {
                let run = run_tag(&inc, e);
                let r = j.complete_traced(e, &id, &run, &reply, usage, &steps).await;
                settle(j, r, &id, &run, State::Done).await
            })
        })
    }

    fn fail_traced(
        &self,
        id: &str,
        incarnation: &str,
        reason: &str,
        notice: &str,
        steps: &[TraceEvent],
    ) -> Result<bool, JournalError> {
        let (id, inc, reason, steps) = (id.to_owned(), incarnation.to_owned(), reason.to_owned(), steps.to_vec());
        let notice = notice.to_owned();
        self.write(move |j, e| {
            Box::pin(async move {
                let run = run_tag(&inc, e);
                let r = j.fail_traced(e, &id, &run, &reason, &notice, &steps).await;
                settle(j, r, &id, &run, State::Failed).await
            })
        })
    }

    fn trace(&self, id: &str) -> Result<Vec<TraceEvent>, JournalError> {
        let id = id.to_owned();
        self.call(move |j| Box::pin(async move { j.trace(&id).await }))
    }

    fn accept_inbound(&self, platform: &str, event_id: &str, msg: &NewMessage) -> Result<Option<String>, JournalError> {
        let (p, ev, msg) = (platform.to_owned(), event_id.to_owned(), msg.clone());
        self.write(move |j, e| Box::pin(async move { j.accept_inbound(e, &p, &ev, &msg).await }))
    }

    fn accept_inbound_command(
        &self,
        platform: &str,
        event_id: &str,
        msg: &NewMessage,
        reply: &str,
    ) -> Result<Option<String>, JournalError> {
        let (p, ev, msg, reply) = (platform.to_owned(), event_id.to_owned(), msg.clone(), reply.to_owned());
        self.write(move |j, e| Box::pin(async move { j.accept_inbound_command(e, &p, &ev, &msg, &reply).await }))
    }

    fn has_event(&self, platform: &str, event_id: &str) -> Result<bool, JournalError> {
        let (p, ev) = (platform.to_owned(), event_id.to_owned());
        self.call(move |j| Box::pin(async move { j.has_event(&p, &ev).await }))
    }

    fn event_message(&self, platform: &str, event_id: &str) -> Result<Option<String>, JournalError> {
        let (p, ev) = (platform.to_owned(), event_id.to_owned());
        self.call(move |j| Box::pin(async move { j.event_message(&p, &ev).await }))
    }

    fn enqueue(&self, platform: &str, chat_id: &str, text: &str) -> Result<i64, JournalError> {
        let (p, c, t) = (platform.to_owned(), chat_id.to_owned(), text.to_owned());
        self.write(move |j, e| Box::pin(async move { j.enqueue(e, &p, &c, &t).await }))
    }

    fn outbox_pending(&self, platform: &str, limit: usize) -> Result<Vec<Outgoing>, JournalError> {
        let p = platform.to_owned();
        self.call(move |j| Box::pin(async move { j.outbox_pending(&p, limit).await }))
    }

    fn outbox_done(&self, seq: i64, failed: Option<&str>) -> Result<bool, JournalError> {
        let failed = failed.map(str::to_owned);
        self.write(move |j, e| Box::pin(async move { j.outbox_done(e, seq, failed.as_deref()).await }))
    }

    fn outbox_counts(&self, platform: &str) -> Result<(u64, u64, u64), JournalError> {
        let p = platform.to_owned();
        self.call(move |j| Box::pin(async move { j.outbox_counts(&p).await }))
    }

    fn new_session(&self, platform: &str, chat_id: &str) -> Result<(), JournalError> {
        let (p, c) = (platform.to_owned(), chat_id.to_owned());
        self.write(move |j, e| Box::pin(async move { j.new_session(e, &p, &c).await }))
    }

    fn session_started(&self, platform: &str, chat_id: &str) -> Result<Option<String>, JournalError> {
        let (p, c) = (platform.to_owned(), chat_id.to_owned());
        self.call(move |j| Box::pin(async move { j.session_started(&p, &c).await }))
    }

    fn history(&self, before: &str, turns: usize) -> Result<Vec<(String, String)>, JournalError> {
        let before = before.to_owned();
        self.call(move |j| Box::pin(async move { j.history(&before, turns).await }))
    }

    fn mark_command(&self, id: &str) -> Result<bool, JournalError> {
        let id = id.to_owned();
        self.write(move |j, e| Box::pin(async move { j.mark_command(e, &id).await }))
    }

    fn recover(&self, new_incarnation: &str) -> Result<Vec<String>, JournalError> {
        let inc = new_incarnation.to_owned();
        self.write(move |j, e| Box::pin(async move { j.recover(e, &run_tag(&inc, e)).await }))
    }

    fn get(&self, id: &str) -> Result<Option<Message>, JournalError> {
        let id = id.to_owned();
        self.call(move |j| Box::pin(async move { j.message(&id).await }))
    }

    fn usage(&self, id: &str) -> Result<Option<(u64, u64)>, JournalError> {
        let id = id.to_owned();
        self.call(move |j| Box::pin(async move { j.usage(&id).await }))
    }

    fn pending(&self) -> Result<Vec<Message>, JournalError> {
        self.call(move |j| Box::pin(async move { j.pending().await }))
    }

    fn counts(&self) -> Result<Counts, JournalError> {
        self.call(move |j| Box::pin(async move { j.counts().await }))
    }

    fn prune(&self, max_age: Option<Duration>, max_bytes: Option<u64>) -> Result<Pruned, JournalError> {
        // Retention is the active's job: a standby's timer finds nothing to do.
        if self.epoch().is_err() {
            return Ok(Pruned::default());
        }
        self.write(move |j, e| Box::pin(async move { j.prune(e, max_age, max_bytes).await }))
    }

    fn texts_with(&self, needle: &str) -> Result<Vec<String>, JournalError> {
        let needle = needle.to_owned();
        self.call(move |j| Box::pin(async move { j.texts_with(&needle).await }))
    }

    fn queued(&self, platform: Option<&str>, chat_id: &str) -> Result<(u64, u64), JournalError> {
        let (platform, chat_id) = (platform.map(str::to_owned), chat_id.to_owned());
        self.call(move |j| Box::pin(async move { j.queued(platform.as_deref(), &chat_id).await }))
    }

    fn access_doc(&self) -> Result<Option<String>, JournalError> {
        self.call(|j| Box::pin(async move { j.access_doc().await }))
    }

    fn put_access_doc(&self, doc: &str) -> Result<(), JournalError> {
        let doc = doc.to_owned();
        self.write(move |j, e| Box::pin(async move { j.put_access_doc(e, &doc).await }))
    }
}
