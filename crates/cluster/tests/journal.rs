//! The fenced message journal on a real throwaway PostgreSQL.
#![cfg(target_os = "linux")]

use std::time::Duration;

use std::time::Instant;

use gatewarden_cluster::driver::RoleView;
use gatewarden_cluster::journal::PgJournal;
use gatewarden_cluster::{Acquired, ClusterError, Handle, LeaseBackend, PgLease, PgStore, Timing};
use gatewarden_journal::JournalError;
use gatewarden_journal::{Counts, Kind, NewMessage, State, Store};
use gatewarden_testkit::postgres::{Cluster, PASSWORD};

mod common;
use common::holder;

/// A deposed active cannot finish a run; the new active re-runs it exactly once.
#[test]
fn a_deposed_active_cannot_complete_and_the_new_one_reruns_once() {
    let Some(pg) = Cluster::start_or_skip() else { return };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let lease = |pg: &Cluster| PgLease::new(&pg.url(), Some(PASSWORD), "j").unwrap();
        let (mut la, mut lb) = (lease(&pg), lease(&pg));
        let (ha, hb) = (holder(1), holder(2));
        let Acquired::Granted(ga) = la.acquire(&ha, Duration::from_secs(30)).await.unwrap() else { panic!("A") };
        let mut ja = PgJournal::new(lease(&pg));
        let m1 = ja.accept(ga.epoch, "c", "u", "one").await.unwrap();
        let m2 = ja.accept(ga.epoch, "c", "u", "two").await.unwrap();
        assert!(ja.claim(ga.epoch, &m1, "inc1").await.unwrap());
        assert!(!ja.claim(ga.epoch, &m1, "inc1").await.unwrap(), "a claim is taken once");
        assert!(ja.complete(ga.epoch, &m1, "inc1", "ONE").await.unwrap());
        assert!(ja.claim(ga.epoch, &m2, "inc1").await.unwrap());
        // B cannot write before it holds the lease.
        let mut jb = PgJournal::new(lease(&pg));
        assert!(matches!(jb.accept(ga.epoch + 1, "c", "u", "x").await, Err(ClusterError::Fenced { .. })));
        // A is deposed while running m2 (its lease released, as after a pause).
        la.release(&ha, ga.epoch).await.unwrap();
        let Acquired::Granted(gb) = lb.acquire(&hb, Duration::from_secs(30)).await.unwrap() else { panic!("B") };
        assert!(gb.epoch > ga.epoch);
        let late = ja.complete(ga.epoch, &m2, "inc1", "TWO-late").await;
        assert!(matches!(late, Err(ClusterError::Fenced { .. })), "{late:?}");
        assert!(matches!(ja.accept(ga.epoch, "c", "u", "late").await, Err(ClusterError::Fenced { .. })));
        // B recovers: m2 is requeued once, run and completed by B.
        assert_eq!(jb.recover(gb.epoch, "inc2").await.unwrap(), vec![m2.clone()]);
        assert!(jb.claim(gb.epoch, &m2, "inc2").await.unwrap());
        assert!(jb.complete(gb.epoch, &m2, "inc2", "TWO").await.unwrap());
        let two = jb.message(&m2).await.unwrap().unwrap();
        assert_eq!((two.state.as_str(), two.reply.as_deref(), two.attempts), ("done", Some("TWO"), 2));
        let one = jb.message(&m1).await.unwrap().unwrap();
        assert_eq!((one.state.as_str(), one.reply.as_deref()), ("done", Some("ONE")));
        assert!(jb.recover(gb.epoch, "inc2").await.unwrap().is_empty());
        // Each row's last write carries the epoch of its writer.
        let epoch_of = |id: &str| pg.sql(&format!("SELECT epoch FROM gw_messages WHERE name = 'j' AND id = '{id}'"));
        assert_eq!((epoch_of(&m2), epoch_of(&m1)), (gb.epoch.to_string(), ga.epoch.to_string()));
    });
    assert_eq!(pg.sql("SELECT count(*) FROM gw_messages WHERE name = 'j'"), "2", "the late accept left no row");
    assert_eq!(
        pg.sql("SELECT string_agg(version::text, ',' ORDER BY version) FROM gw_schema_version"),
        gatewarden_cluster::schema_versions().map(|v| v.to_string()).collect::<Vec<_>>().join(",")
    );
    assert_eq!(pg.sql("SELECT string_agg(finishes::text, ',') FROM gw_messages WHERE name = 'j'"), "1,1");
}

fn msg(text: &str) -> NewMessage {
    NewMessage { chat_id: "c1".into(), user_id: "u1".into(), text: text.into(), kind: Kind::Async }
}

/// A lease driver for cluster `name` on `rt` (long renewals: only the tests' own moves change
/// the role), once it is active.
fn active_driver(rt: &tokio::runtime::Runtime, pg: &Cluster, name: &str, n: u32) -> Handle {
    active_driver_with(rt, pg, name, n, Timing::new(Duration::from_secs(30), Duration::from_secs(10)).unwrap())
}

fn active_driver_with(rt: &tokio::runtime::Runtime, pg: &Cluster, name: &str, n: u32, timing: Timing) -> Handle {
    let lease = PgLease::new(&pg.url(), Some(PASSWORD), name).unwrap();
    let (h, _changes) = rt.block_on(async { gatewarden_cluster::spawn(lease, name, holder(n), timing) });
    let deadline = Instant::now() + Duration::from_secs(10);
    while !h.is_active() {
        assert!(Instant::now() < deadline, "driver {n} not active: {:?}", h.snapshot().error);
        std::thread::sleep(Duration::from_millis(10));
    }
    h
}

fn store(pg: &Cluster, name: &str) -> PgStore {
    PgStore::start(&pg.url(), Some(PASSWORD), name, "gatewarden journal test").unwrap()
}

/// The runtime's `Store` on PostgreSQL keeps the SQLite journal's semantics
/// (crates/journal/src/sqlite.rs tests): dedup, commands, the outbox, sessions and history,
/// recovery, counts and retention.
#[test]
fn the_store_trait_on_postgres_behaves_like_the_sqlite_journal() {
    let Some(pg) = Cluster::start_or_skip() else { return };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let s = store(&pg, "st");
    // Before the cluster role starts, and so without an epoch, nothing is written.
    assert!(matches!(s.accept(&msg("early")), Err(JournalError::Fenced(_))));
    s.attach(active_driver(&rt, &pg, "st", 1));

    let id = s.accept_inbound("tg", "1001", &msg("hi")).unwrap().expect("new event");
    assert_eq!(s.accept_inbound("tg", "1001", &msg("hi")).unwrap(), None, "redelivery is deduplicated");
    assert!(s.has_event("tg", "1001").unwrap());
    assert!(!s.has_event("tg", "9999").unwrap());
    let other = s.accept_inbound("other", "1001", &msg("hi")).unwrap().expect("ids are per platform");
    let m = s.get(&id).unwrap().unwrap();
    assert_eq!((m.platform.as_deref(), m.state, m.kind, m.attempts), (Some("tg"), State::Queued, Kind::Async, 0));
    assert!(m.created_at.ends_with("+00:00") && m.created_at.len() == 32, "{}", m.created_at);
    assert!(s.claim(&id, "a").unwrap());
    assert!(!s.claim(&id, "a").unwrap(), "claimed once");
    assert!(!s.complete(&id, "b", "stolen").unwrap(), "only the claiming incarnation completes");
    assert!(s.complete(&id, "a", "hello").unwrap());
    assert!(!s.complete(&id, "a", "again").unwrap(), "completed once");
    let out = s.outbox_pending("tg", 10).unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!((out[0].chat_id.as_str(), out[0].text.as_str()), ("c1", "hello"));
    assert_eq!(out[0].message_id.as_deref(), Some(id.as_str()));
    assert!(s.outbox_done(out[0].seq, None).unwrap());
    assert!(!s.outbox_done(out[0].seq, None).unwrap(), "sent once");
    assert_eq!(s.outbox_counts("tg").unwrap(), (0, 1, 0));
    // A failed platform message tells its chat.
    let f = s.accept_inbound("tg", "1003", &msg("boom")).unwrap().unwrap();
    assert!(s.claim(&f, "a").unwrap());
    assert!(s.fail(&f, "a", "agent crashed").unwrap());
    let failed = s.get(&f).unwrap().unwrap();
    assert_eq!((failed.state, failed.reason.as_deref()), (State::Failed, Some("agent crashed")));
    let out = s.outbox_pending("tg", 10).unwrap();
    assert_eq!(out.last().map(|o| o.text.as_str()), Some("sorry, that failed: agent crashed"));
    assert!(s.outbox_done(out[0].seq, Some("chat gone")).unwrap());
    assert_eq!(s.outbox_counts("tg").unwrap(), (0, 1, 1));
    // A command is final at once, its reply queued once, never again on redelivery.
    assert!(s.accept_inbound_command("tg", "1002", &msg("/status"), "fine").unwrap().is_some());
    assert!(s.accept_inbound_command("tg", "1002", &msg("/status"), "fine").unwrap().is_none());
    assert_eq!(s.outbox_pending("tg", 10).unwrap().len(), 1);
    let cmd = s.accept_command(&msg("/help"), "commands").unwrap();
    assert!(s.get(&cmd).unwrap().unwrap().is_command);
    let marked = s.accept(&msg("restart me")).unwrap();
    assert!(s.mark_command(&marked).unwrap());
    assert!(!s.mark_command(&marked).unwrap(), "already final");
    assert!(s.enqueue("tg", "c9", "back online").unwrap() > 0);
    // Only the unanswered message is work; a run of another incarnation is requeued.
    let http = s.accept(&NewMessage { kind: Kind::Sync, ..msg("x") }).unwrap();
    assert_eq!(s.get(&http).unwrap().unwrap().kind, Kind::Sync);
    assert!(s.claim(&http, "old").unwrap());
    assert_eq!(s.pending().unwrap().len(), 2);
    assert_eq!(s.recover("b").unwrap(), vec![other.clone(), http.clone()]);
    assert_eq!(s.counts().unwrap(), Counts { queued: 2, running: 0, done: 4, failed: 1 });

    // History: per chat and session.
    let turn = |ev: &str, text: &str, reply: &str| {
        let id = s.accept_inbound("chat", ev, &msg(text)).unwrap().unwrap();
        assert!(s.claim(&id, "b").unwrap());
        assert!(s.complete(&id, "b", reply).unwrap());
    };
    turn("1", "one", "r1");
    turn("2", "two", "r2");
    s.accept_inbound("chat", "3", &NewMessage { chat_id: "c2".into(), ..msg("elsewhere") }).unwrap();
    let now = s.accept_inbound("chat", "4", &msg("three")).unwrap().unwrap();
    assert_eq!(s.history(&now, 10).unwrap(), vec![("one".into(), "r1".into()), ("two".into(), "r2".into())]);
    assert_eq!(s.history(&now, 1).unwrap(), vec![("two".to_owned(), "r2".to_owned())]);
    s.new_session("chat", "c1").unwrap();
    let fresh = s.accept_inbound("chat", "5", &msg("four")).unwrap().unwrap();
    assert!(s.history(&fresh, 10).unwrap().is_empty(), "/new forgets the earlier turns");

    // Retention: finished rows past the age go, unfinished ones stay whatever their age.
    pg.sql("UPDATE gw_messages SET updated_at = updated_at - interval '40 days' WHERE name = 'st'");
    let p = s.prune(Some(Duration::from_secs(30 * 24 * 3600)), None).unwrap();
    let c = s.counts().unwrap();
    assert_eq!((c.done, c.failed), (0, 0), "{p:?}");
    assert_eq!(p.by_age, 7);
    assert!(c.queued >= 2);
    assert!(s.get(&other).unwrap().is_some());
    // By size: a bound below the unfinished rows deletes every finished row and nothing else.
    let big = "x".repeat(4096);
    for _ in 0..5 {
        let id = s.accept(&msg(&big)).unwrap();
        assert!(s.claim(&id, "b").unwrap());
        assert!(s.complete(&id, "b", &big).unwrap());
    }
    let before = s.counts().unwrap();
    let p = s.prune(None, Some(1)).unwrap();
    assert_eq!(p.by_size, 5);
    assert_eq!(s.counts().unwrap(), Counts { done: 0, ..before });
    // Every table (issue 18): outbox entries left for good and old sessions go too; pending
    // entries stay whatever their age.
    let pending = s.outbox_pending("chat", 100).unwrap();
    assert!(pending.len() >= 2, "{pending:?}");
    assert!(s.outbox_done(pending[0].seq, None).unwrap());
    assert!(s.outbox_done(pending[1].seq, Some("gone")).unwrap());
    pg.sql("UPDATE gw_outbox SET updated_at = updated_at - interval '40 days' WHERE name = 'st'");
    pg.sql("UPDATE gw_sessions SET started_at = started_at - interval '40 days' WHERE name = 'st'");
    let p = s.prune(Some(Duration::from_secs(30 * 24 * 3600)), None).unwrap();
    assert_eq!(p.outbox, 3, "two outbox entries and one session: {p:?}");
    assert_eq!(s.outbox_counts("chat").unwrap(), (pending.len() as u64 - 2, 0, 0));
    // Queued messages, for the queue caps: per chat (platform and id) and in all.
    let (chat, all) = s.queued(Some("chat"), "c1").unwrap();
    assert_eq!(all, s.counts().unwrap().queued);
    assert!(chat >= 1 && chat <= all, "{chat} {all}");
    assert_eq!(s.queued(None, "nobody").unwrap(), (0, all));
}

/// A write under an epoch the store no longer considers live is refused, and the refusal
/// demotes the writer at once (well before its next renewal); the successor recovers the
/// interrupted run exactly once.
#[test]
fn a_fenced_store_write_is_refused_and_demotes_the_writer() {
    let Some(pg) = Cluster::start_or_skip() else { return };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let a = store(&pg, "fx");
    let ha = active_driver(&rt, &pg, "fx", 1);
    a.attach(ha.clone());
    let id = a.accept(&msg("slow")).unwrap();
    assert!(a.claim(&id, "inc1").unwrap());
    let old = ha.snapshot().epoch.unwrap();
    // A newer epoch exists (as after a pause longer than the TTL): B is granted the lease.
    pg.sql("UPDATE gw_lease SET expires_at = '-infinity' WHERE name = 'fx'");
    let b = store(&pg, "fx");
    let hb = active_driver(&rt, &pg, "fx", 2);
    b.attach(hb.clone());
    assert!(hb.snapshot().epoch.unwrap() > old);
    // A still believes it is active (its renewal is 10 s away): its completion is refused.
    assert!(ha.is_active());
    let late = a.complete(&id, "inc1", "late");
    assert!(matches!(late, Err(JournalError::Fenced(_))), "{late:?}");
    let t0 = Instant::now();
    while ha.snapshot().role != RoleView::Standby {
        assert!(t0.elapsed() < Duration::from_secs(2), "the fenced writer did not demote: {:?}", ha.snapshot());
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(matches!(a.accept(&msg("after")), Err(JournalError::Fenced(_))), "a demoted gateway writes nothing");
    // B re-runs it once.
    assert_eq!(b.recover("inc2").unwrap(), vec![id.clone()]);
    assert!(b.claim(&id, "inc2").unwrap());
    assert!(b.complete(&id, "inc2", "done by B").unwrap());
    let m = b.get(&id).unwrap().unwrap();
    assert_eq!((m.state, m.reply.as_deref(), m.attempts), (State::Done, Some("done by B"), 2));
    assert_eq!(pg.sql(&format!("SELECT finishes FROM gw_messages WHERE id = '{id}'")), "1");
    assert_eq!(pg.sql("SELECT count(*) FROM gw_messages WHERE name = 'fx'"), "1", "the refused accept left no row");
}

/// A store that does not answer is an error within the timeout, never a hang, and the store
/// reconnects once the database is back.
#[test]
fn an_unreachable_store_fails_within_its_timeout_and_recovers() {
    let Some(pg) = Cluster::start_or_skip() else { return };
    let proxy = gatewarden_testkit::postgres::Proxy::start(pg.addr());
    let s = PgStore::start(&pg.url_via(proxy.addr()), Some(PASSWORD), "un", "gatewarden journal test")
        .unwrap()
        .with_timeout(Duration::from_millis(800));
    assert_eq!(s.counts().unwrap(), Counts::default());
    proxy.set(gatewarden_testkit::postgres::ProxyMode::Stall);
    let t0 = Instant::now();
    let r = s.counts();
    assert!(matches!(r, Err(JournalError::Store(_))), "{r:?}");
    assert!(t0.elapsed() < Duration::from_secs(2), "took {:?}", t0.elapsed());
    proxy.set(gatewarden_testkit::postgres::ProxyMode::Pass);
    let t0 = Instant::now();
    while s.counts().is_err() {
        assert!(t0.elapsed() < Duration::from_secs(10), "the store did not reconnect");
        std::thread::sleep(Duration::from_millis(50));
    }
    // A terminated backend (an operator's pg_terminate_backend, a failover of the pooler):
    // the next call reconnects.
    let killed = pg.sql(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = 'gatewarden journal test'",
    );
    // (The connection forgotten after the stall may still have its backend too.)
    assert_ne!(killed, "0");
    let t0 = Instant::now();
    while s.counts().is_err() {
        assert!(t0.elapsed() < Duration::from_secs(5), "the store did not reconnect after termination");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The same process demoted and promoted again (a lost renewal, then a new grant) is a new run:
/// its new term recovers the old term's claim like any other gateway's, and the old run's late
/// completion matches nothing, so the message is still completed exactly once.
#[test]
fn a_re_promoted_process_recovers_its_own_earlier_terms_runs() {
    let Some(pg) = Cluster::start_or_skip() else { return };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let s = store(&pg, "rp");
    let timing = Timing::new(Duration::from_secs(2), Duration::from_millis(200)).unwrap();
    let h = active_driver_with(&rt, &pg, "rp", 1, timing);
    s.attach(h.clone());
    let e1 = h.snapshot().epoch.unwrap();
    let id = s.accept(&msg("m")).unwrap();
    assert!(s.claim(&id, "inc1").unwrap());
    // The lease is lost (expired by the database), and the same driver is granted it again.
    pg.sql("UPDATE gw_lease SET expires_at = '-infinity' WHERE name = 'rp'");
    let t0 = Instant::now();
    while !(h.is_active() && h.snapshot().epoch.is_some_and(|e| e > e1)) {
        assert!(t0.elapsed() < Duration::from_secs(10), "not re-promoted: {:?}", h.snapshot());
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!s.complete(&id, "inc1", "late").unwrap(), "the old term's run cannot complete");
    assert_eq!(s.recover("inc1").unwrap(), vec![id.clone()], "the old term's run is requeued");
    assert!(s.claim(&id, "inc1").unwrap());
    assert!(s.complete(&id, "inc1", "ok").unwrap());
    let m = s.get(&id).unwrap().unwrap();
    assert_eq!((m.state, m.reply.as_deref(), m.attempts), (State::Done, Some("ok"), 2));
    assert_eq!(pg.sql(&format!("SELECT finishes FROM gw_messages WHERE id = '{id}'")), "1");
}

/// A claim whose answer is lost (the caller timed out while the statement waited on a row lock,
/// then committed) is settled when the same run retries it: the row is `running` under that
/// run, so the retry answers "claimed" instead of leaving the message to nobody.
#[test]
fn a_retried_claim_whose_first_answer_was_lost_is_ours() {
    let Some(pg) = Cluster::start_or_skip() else { return };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let s = store(&pg, "lost").with_timeout(Duration::from_millis(700));
    s.attach(active_driver(&rt, &pg, "lost", 1));
    let id = s.accept(&msg("m")).unwrap();
    std::thread::scope(|scope| {
        let locker = scope.spawn(|| {
            pg.sql(&format!(
                "BEGIN; SELECT 1 FROM gw_messages WHERE id = '{id}' FOR UPDATE; SELECT pg_sleep(2); COMMIT;"
            ))
        });
        let t0 = Instant::now();
        while pg.sql("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'") != "1" {
            assert!(t0.elapsed() < Duration::from_secs(5), "the row lock was not taken");
            std::thread::sleep(Duration::from_millis(10));
        }
        let r = s.claim(&id, "inc1");
        assert!(matches!(r, Err(JournalError::Store(_))), "the claim waits on the lock past the timeout: {r:?}");
        locker.join().unwrap();
    });
    // The blocked statement committed after the caller gave up.
    let t0 = Instant::now();
    while pg.sql(&format!("SELECT state FROM gw_messages WHERE id = '{id}'")) != "running" {
        assert!(t0.elapsed() < Duration::from_secs(5), "the first claim never committed");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(s.claim(&id, "inc1").unwrap(), "the retry finds its own run");
    assert!(!s.claim(&id, "inc1").unwrap(), "and only the retry: a later claim is a duplicate");
    assert!(!s.claim(&id, "inc2").unwrap(), "another run's claim is not settled as ours");
    assert!(s.complete(&id, "inc1", "ok").unwrap());
}

fn steps(s: &PgStore, id: &str) -> Vec<&'static str> {
    s.trace(id).unwrap().into_iter().map(|e| e.step.as_str()).collect()
}

/// The trace on PostgreSQL (migration 5): the same steps as the SQLite journal's, written by
/// the statements that change the message (accept, claim, finish, recover, outbox), in order,
/// with the run's steps; and deleted with the message by retention.
#[test]
fn the_trace_on_postgres_matches_the_sqlite_journal_and_is_pruned_with_the_message() {
    use gatewarden_journal::{Step, TraceEvent};
    let Some(pg) = Cluster::start_or_skip() else { return };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let s = store(&pg, "tr");
    s.attach(active_driver(&rt, &pg, "tr", 1));

    let id = s.accept_inbound("tg", "1", &msg("hi")).unwrap().unwrap();
    assert!(s.claim(&id, "a").unwrap());
    let now = std::time::SystemTime::now();
    let run = [
        TraceEvent::at(Step::BackendCalled, now).subject("openai"),
        TraceEvent::at(Step::ProviderTried, now).subject("p1").outcome("HTTP 502").elapsed(Duration::from_millis(4)),
        TraceEvent::at(Step::ProviderTried, now).subject("p2").outcome("ok"),
        TraceEvent::at(Step::FirstToken, now),
    ];
    assert!(s.complete_traced(&id, "a", "hello", Some((12, 5)), &run).unwrap());
    // The run's usage is in the journal, as in SQLite (issue 17).
    assert_eq!(s.usage(&id).unwrap(), Some((12, 5)));
    let out = s.outbox_pending("tg", 10).unwrap();
    assert!(s.outbox_done(out[0].seq, None).unwrap());
    assert_eq!(
        steps(&s, &id),
        [
            "received",
            "journaled",
            "claimed",
            "backend_called",
            "provider_tried",
            "provider_tried",
            "first_token",
            "done",
            "outbox_sent"
        ]
    );
    let t = s.trace(&id).unwrap();
    assert_eq!((t[0].subject.as_deref(), t[8].subject.as_deref()), (Some("tg"), Some("tg")));
    assert_eq!(
        (t[4].subject.as_deref(), t[4].outcome.as_deref(), t[4].elapsed_ms),
        (Some("p1"), Some("HTTP 502"), Some(4))
    );
    assert!(t.iter().all(|e| e.time().is_some()), "protocol timestamps: {t:?}");
    assert_eq!(t[3].at, run[0].at, "a noted step keeps its own time");

    let f = s.accept(&msg("boom")).unwrap();
    assert!(s.claim(&f, "a").unwrap());
    assert!(s.fail_traced(&f, "a", "no provider answered", "sorry, that failed (ref f)", &[]).unwrap());
    assert_eq!(steps(&s, &f), ["received", "journaled", "claimed", "failed"]);
    assert_eq!(s.trace(&f).unwrap()[0].subject.as_deref(), Some("http"));

    let cmd = s.accept_command(&msg("/help"), "commands").unwrap();
    assert_eq!(steps(&s, &cmd), ["received", "journaled", "done"]);

    let r = s.accept(&msg("interrupted")).unwrap();
    assert!(s.claim(&r, "a").unwrap());
    s.recover("b").unwrap();
    assert!(s.claim(&r, "b").unwrap());
    s.recover("c").unwrap();
    assert_eq!(steps(&s, &r), ["received", "journaled", "claimed", "requeued", "claimed", "given_up"]);
    let c = s.accept(&msg("/restart please")).unwrap();
    assert!(s.claim(&c, "c").unwrap());
    assert!(s.mark_command(&c).unwrap());
    assert_eq!(steps(&s, &c), ["received", "journaled", "claimed", "done"]);

    let traced = || pg.sql("SELECT count(*) FROM gw_trace WHERE name = 'tr'").trim().parse::<i64>().unwrap();
    assert!(traced() > 0);
    pg.sql("UPDATE gw_messages SET updated_at = updated_at - interval '40 days' WHERE name = 'tr'");
    s.prune(Some(Duration::from_secs(30 * 24 * 3600)), None).unwrap();
    assert_eq!(traced(), 0, "no step outlives its message");
}

/// The pairing book in the cluster's store (`gw_access`): none at first, written by the
/// active, read by whichever gateway is promoted next; a deposed active's write is refused.
#[test]
fn the_pairing_book_is_shared_and_fenced() {
    let Some(pg) = Cluster::start_or_skip() else { return };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let a = store(&pg, "acc");
    let ha = active_driver(&rt, &pg, "acc", 1);
    a.attach(ha.clone());
    assert_eq!(a.access_doc().unwrap(), None, "no book yet");
    a.put_access_doc(r#"{"v":1,"platforms":{}}"#).unwrap();
    a.put_access_doc(r#"{"v":1,"platforms":{"bot":{"approved":[{"user":"102"}]}}}"#).unwrap();
    pg.sql("UPDATE gw_lease SET expires_at = '-infinity' WHERE name = 'acc'");
    let b = store(&pg, "acc");
    b.attach(active_driver(&rt, &pg, "acc", 2));
    assert!(b.access_doc().unwrap().is_some_and(|d| d.contains("102")), "the successor reads the old active's book");
    let late = a.put_access_doc(r#"{"v":1,"platforms":{}}"#);
    assert!(matches!(late, Err(JournalError::Fenced(_))), "{late:?}");
    assert!(b.access_doc().unwrap().is_some_and(|d| d.contains("102")), "the deposed write changed nothing");
    assert_eq!(pg.sql("SELECT count(*) FROM gw_access"), "1");
}

/// Issue 29 §3: an HTTP API conversation (no platform) on PostgreSQL, as on SQLite: the HTTP
/// messages of its `chat_id` are its history, never a platform chat's of the same id, and
/// `/new` (under `HTTP_SESSIONS`) clears it; so a promoted standby runs it with the same history.
#[test]
fn http_conversations_have_history_on_postgres() {
    let Some(pg) = Cluster::start_or_skip() else { return };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let s = store(&pg, "hh");
    s.attach(active_driver(&rt, &pg, "hh", 1));
    // As the runtime journals them: accepted already running under its incarnation.
    let turn = |chat: &str, text: &str, reply: &str| {
        let id = s.accept_claimed(&NewMessage { chat_id: chat.into(), kind: Kind::Sync, ..msg(text) }, "a").unwrap();
        let m = s.get(&id).unwrap().unwrap();
        assert_eq!((m.state, m.attempts), (State::Running, 1));
        assert!(m.incarnation.is_some_and(|i| i.starts_with("a/e")), "under the run tag");
        assert!(s.complete(&id, "a", reply).unwrap());
    };
    turn("c1", "one", "r1");
    turn("c2", "elsewhere", "r");
    let tg = s.accept_inbound("tg", "1", &msg("platform")).unwrap().unwrap();
    assert!(s.claim(&tg, "a").unwrap() && s.complete(&tg, "a", "tg reply").unwrap());
    turn("c1", "two", "r2");
    let now = s.accept(&NewMessage { kind: Kind::Sync, ..msg("three") }).unwrap();
    assert_eq!(s.history(&now, 10).unwrap(), vec![("one".into(), "r1".into()), ("two".into(), "r2".into())]);
    assert!(s.history(&tg, 10).unwrap().is_empty(), "a platform chat never sees the HTTP chat of its id");
    s.new_session(gatewarden_journal::HTTP_SESSIONS, "c1").unwrap();
    let fresh = s.accept(&msg("four")).unwrap();
    assert!(s.history(&fresh, 10).unwrap().is_empty(), "/new forgets the earlier turns");
    let steps: Vec<String> = s.trace(&now).unwrap().iter().map(|e| e.step.as_str().to_owned()).collect();
    assert_eq!(steps, ["received", "journaled"]);
    let cut = s.accept_claimed(&msg("cut short"), "a").unwrap();
    let steps: Vec<String> = s.trace(&cut).unwrap().iter().map(|e| e.step.as_str().to_owned()).collect();
    assert_eq!(steps, ["received", "journaled", "claimed"]);
    assert!(!s.recover("a").unwrap().contains(&cut), "its own incarnation's recovery leaves it alone");
    assert!(s.recover("b").unwrap().contains(&cut), "a crash leaves it to the next incarnation");
}

/// Attachment retention on PostgreSQL (crates/runtime/src/worker/housekeeping.rs): the texts
/// naming stored files are listed from messages, replies and the outbox as on SQLite
/// (crates/journal/src/sqlite.rs `texts_naming_attachments_…`), only this cluster's, the needle
/// matched literally; a pruned message no longer names its file, so the file can go.
#[test]
fn texts_naming_attachments_are_listed_on_postgres_and_leave_with_their_messages() {
    let Some(pg) = Cluster::start_or_skip() else { return };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let s = store(&pg, "at");
    s.attach(active_driver(&rt, &pg, "at", 1));
    let other = store(&pg, "other");
    other.attach(active_driver(&rt, &pg, "other", 2));
    let id = s.accept_inbound("tg", "ev1", &msg("look\n[attachment: a, image/png, 1 B, sha256:aa]")).unwrap().unwrap();
    s.accept_inbound("tg", "ev2", &msg("plain 100%_")).unwrap();
    assert!(s.claim(&id, "inc-1").unwrap());
    assert!(s.complete(&id, "inc-1", "back\n[attachment: b, text/plain, 1 B, sha256:bb]").unwrap());
    s.enqueue("tg", "c", "[attachment: c, text/plain, 1 B, sha256:cc]").unwrap();
    other.accept_inbound("tg", "ev1", &msg("[attachment: z, image/png, 1 B, sha256:zz]")).unwrap();
    let got = s.texts_with("[attachment: ").unwrap();
    assert_eq!(got.len(), 4, "the message, its reply, the reply in the outbox, the notice: {got:?}");
    assert!(got.iter().all(|t| t.contains("[attachment: ") && !t.contains("sha256:zz")), "{got:?}");
    assert_eq!(s.texts_with("100%_").unwrap().len(), 1, "the needle is literal");
    assert!(s.texts_with("0%x").unwrap().is_empty());
    // Retention deletes the finished message and its sent outbox entry: only the pending
    // notice still names a file.
    let out = s.outbox_pending("tg", 10).unwrap();
    let reply = out.iter().find(|o| o.message_id.as_deref() == Some(id.as_str())).expect("the reply is queued");
    assert!(s.outbox_done(reply.seq, None).unwrap());
    pg.sql("UPDATE gw_messages SET updated_at = updated_at - interval '40 days' WHERE name = 'at'");
    pg.sql("UPDATE gw_outbox SET updated_at = updated_at - interval '40 days' WHERE name = 'at'");
    s.prune(Some(Duration::from_secs(30 * 24 * 3600)), None).unwrap();
    assert_eq!(s.texts_with("[attachment: ").unwrap(), vec!["[attachment: c, text/plain, 1 B, sha256:cc]".to_owned()]);
}
