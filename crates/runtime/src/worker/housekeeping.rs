//! What keeps the journal and the chats in order beside the runs: the notices at boot and the
//! journal's retention.

use std::sync::Arc;
use std::time::Duration;

use super::Work;
use crate::gateway::Gateway;
use crate::notices;

/// How often the journal's retention bounds are applied (and once at start).
const PRUNE_EVERY: Duration = Duration::from_secs(60);

impl Work {
    /// At boot: a predecessor's `/restart` becomes one "back online" notice, and `/update`
    /// notices for platform chats are relayed from now on (notices.rs).
    pub fn boot_notices(&self, gw: &Gateway, platforms: bool) {
        if platforms {
            notices::relay_update_notices(gw.home.dir().to_path_buf(), Arc::clone(&self.journal), self.wake.clone());
        }
        notices::back_online(gw.home.dir(), &gw.me.id, &self.notices, &*self.journal, &self.wake);
    }

    /// Applies `[journal]` retention at start, every [`PRUNE_EVERY`] and at once after a reload
    /// changed it ([`Work::prune_soon`]), off the async workers, with the bounds as they are
    /// then; unfinished messages are never pruned (`Journal::prune`). Stored attachments no
    /// message names any more go after a round that deleted something.
    pub fn start_pruning(self: &Arc<Self>, attachments: gatewarden_platforms::attachments::Store) {
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(PRUNE_EVERY);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    () = me.prune_soon.notified() => {}
                }
                let retention = me.live().retention.clone();
                let (age, bytes) = (retention.max_age(), retention.max_bytes());
                if age.is_none() && bytes.is_none() {
                    continue;
                }
                match me.with_journal(move |j| j.prune(age, bytes)).await {
                    Ok(p) if p.by_age + p.by_size + p.outbox > 0 => {
                        crate::info!(
                            "journal retention: deleted {} finished message(s) past max_age_days, {} past max_size_mb, \
                             {} outbox entries and sessions",
                            p.by_age,
                            p.by_size,
                            p.outbox
                        );
                        me.prune_attachments(attachments.clone()).await;
                    }
                    Ok(_) => {}
                    Err(e) => crate::warn!("journal retention failed: {e}"),
                }
            }
        });
    }

    /// Attachment files no journaled text names any more go with their messages (refcounted by
    /// hash: a file two messages share stays while one does). A file younger than
    /// [`ATTACHMENT_GRACE`] stays whatever: its message may not be journaled yet (downloaded,
    /// not yet delivered; a reply's file stored before the run's end is).
    async fn prune_attachments(self: &Arc<Self>, store: gatewarden_platforms::attachments::Store) {
        use gatewarden_platforms::attachments::parse_lines;
        if !store.dir().exists() {
            return;
        }
        let texts = match self.with_journal(|j| j.texts_with("[attachment: ")).await {
            Ok(t) => t,
            Err(e) => return crate::warn!("attachment retention skipped: {e}"),
        };
        let keep = texts.iter().flat_map(|t| parse_lines(t)).map(|n| n.sha256).collect();
        let removed = tokio::task::spawn_blocking(move || store.prune(&keep, ATTACHMENT_GRACE)).await.unwrap_or(0);
        if removed > 0 {
            crate::info!("attachment retention: removed {removed} file(s) no message names any more");
        }
    }
}

/// How old a stored attachment (or event record) must be before retention may remove it.
const ATTACHMENT_GRACE: std::time::Duration = std::time::Duration::from_secs(3600);
