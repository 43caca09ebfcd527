//! The Discord adapter against the fake Discord (crates/discord-fake), with an in-memory host:
//! the round trip, RESUME across a restart with the replay of what was missed, commit before
//! the saved `seq`, heartbeat-ACK loss, op 7 and op 9, fatal close codes, rate limits and a
//! fake that dies and comes back.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gatewarden_config::{PlatformConfig, platform};
use gatewarden_discord_fake::{FakeDiscord, Fault, Options, RestCall, Route};
use gatewarden_platforms::discord::Discord;
use gatewarden_platforms::{Activity, Adapter, Host, Inbound, Outgoing, Sent, State};

mod support;
use support::{MemHost, wait_for};

const TOKEN: &str = "fake-bot-token";
const CHANNEL: &str = "100";
const USER: &str = "7";

/// The shared in-memory host (tests/support), with a state dir, as the gateway's
/// `<home>/platforms`, and a way to lose outbox commits.
struct DirHost {
    mem: MemHost,
    dir: PathBuf,
    /// `sent` calls to drop: a crash between the send and the outbox commit.
    forget_sent: Mutex<u32>,
}

impl DirHost {
    fn new(dir: PathBuf) -> Arc<DirHost> {
        Arc::new(DirHost { mem: MemHost::echoing(), dir, forget_sent: Mutex::new(0) })
    }

    fn texts(&self) -> Vec<String> {
        self.mem.inbox.lock().unwrap().iter().map(|m| m.text.clone()).collect()
    }
}

impl Host for DirHost {
    fn deliver(&self, adapter: &str, msg: Inbound) -> Result<(), String> {
        self.mem.deliver(adapter, msg)
    }
    fn outbox(&self, adapter: &str, limit: usize) -> Result<Vec<Outgoing>, String> {
        self.mem.outbox(adapter, limit)
    }
    fn sent(&self, seq: i64, outcome: Sent) {
        let mut forget = self.forget_sent.lock().unwrap();
        if *forget > 0 {
            *forget -= 1;
            return;
        }
        self.mem.sent(seq, outcome);
    }
    fn state_changed(&self, adapter: &str, state: &State) {
        self.mem.state_changed(adapter, state);
    }
    fn state_dir(&self) -> Option<PathBuf> {
        Some(self.dir.clone())
    }
}

fn config(base: &str) -> PlatformConfig {
    PlatformConfig {
        token_env: Some("UNUSED".into()),
        conflict_standby_s: 30,
        ..PlatformConfig::with(platform::Discord { api_base: Some(base.into()) })
    }
}

fn fake(opts: Options) -> FakeDiscord {
    FakeDiscord::start(Options { heartbeat_interval: Duration::from_millis(500), ..opts }).unwrap()
}

fn start(fake: &FakeDiscord, host: &Arc<DirHost>, token: &str) -> Arc<Discord> {
    let d = Arc::new(Discord::new(&config(&fake.api_base()), token.into()).unwrap());
    d.start(Arc::clone(host) as Arc<dyn Host>).unwrap();
    d
}

fn stop(d: &Discord) {
    d.stop_intake();
    assert!(d.close(Instant::now() + Duration::from_secs(5)), "the outbox was flushed");
}

fn echoed(fake: &FakeDiscord, text: &str) {
    let want = format!("echo: {text}");
    if let Err(sent) = fake.wait_sent(Duration::from_secs(15), |s| s.iter().any(|m| m.content == want)) {
        panic!("no {want:?} among {sent:?}");
    }
}

fn count(fake: &FakeDiscord, content: &str) -> usize {
    fake.sent().iter().filter(|m| m.content == content).count()
}

#[test]
fn round_trip_then_a_restart_resumes_and_replays_what_was_missed() {
    let dir = tempfile::tempdir().unwrap();
    let fake = fake(Options::default());
    let host = DirHost::new(dir.path().join("platforms"));
    let d = start(&fake, &host, TOKEN);
    wait_for("connected", Duration::from_secs(10), || d.status().state() == State::Connected);
    fake.message(CHANNEL, USER, "hi");
    echoed(&fake, "hi");
    assert_eq!(fake.sent()[0].channel_id, CHANNEL);
    assert!(fake.sent()[0].nonce.is_some(), "replies carry an enforced nonce");
    stop(&d);
    let saved = std::fs::read_to_string(dir.path().join("platforms/discord-discord.json")).unwrap();
    assert!(saved.contains("session_id") && saved.contains("/resume"), "{saved}");

    // Sent while no gateway listened: the successor resumes and Discord replays them.
    fake.message(CHANNEL, USER, "while down 1");
    fake.message(CHANNEL, USER, "while down 2");
    let d = start(&fake, &host, TOKEN);
    echoed(&fake, "while down 1");
    echoed(&fake, "while down 2");
    let stats = fake.stats();
    assert_eq!(stats.identifies, 1, "a restart resumes, never identifies: {stats:?}");
    assert!(stats.resumed >= 1 && stats.replayed >= 2 && stats.resume_url_connects >= 1, "{stats:?}");
    stop(&d);
    assert_eq!(host.texts(), ["hi", "while down 1", "while down 2"], "nothing lost, nothing twice");
    for t in ["echo: hi", "echo: while down 1", "echo: while down 2"] {
        assert_eq!(count(&fake, t), 1, "{t} answered once");
    }
}

#[test]
fn the_seq_is_saved_only_after_the_journal_commit() {
    let dir = tempfile::tempdir().unwrap();
    let fake = fake(Options::default());
    let host = DirHost::new(dir.path().join("platforms"));
    let d = start(&fake, &host, TOKEN);
    wait_for("connected", Duration::from_secs(10), || d.status().state() == State::Connected);
    fake.message(CHANNEL, USER, "first");
    echoed(&fake, "first");
    // The journal refuses: degraded, and the message must come back to the successor.
    *host.mem.refuse.lock().unwrap() = true;
    fake.message(CHANNEL, USER, "uncommitted");
    wait_for(
        "degraded",
        Duration::from_secs(10),
        || matches!(d.status().state(), State::Degraded(r) if r.contains("cannot journal")),
    );
    stop(&d);
    *host.mem.refuse.lock().unwrap() = false;
    let d = start(&fake, &host, TOKEN);
    echoed(&fake, "uncommitted");
    stop(&d);
    assert_eq!(host.texts(), ["first", "uncommitted"]);
    assert_eq!(fake.stats().identifies, 1);
}

#[test]
fn a_missing_heartbeat_ack_reconnects_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let fake = fake(Options { heartbeat_interval: Duration::from_millis(200), ..Options::default() });
    let host = DirHost::new(dir.path().join("platforms"));
    let d = start(&fake, &host, TOKEN);
    wait_for("connected", Duration::from_secs(10), || d.status().state() == State::Connected);
    fake.message(CHANNEL, USER, "before");
    echoed(&fake, "before");
    fake.set_acks(false);
    fake.message(CHANNEL, USER, "during");
    if let Err(s) = fake.wait_stats(Duration::from_secs(10), |s| s.resume_url_connects >= 1) {
        panic!("no reconnect to the resume URL: {s:?}");
    }
    fake.set_acks(true);
    fake.message(CHANNEL, USER, "after");
    echoed(&fake, "during");
    echoed(&fake, "after");
    let last = d.status().snapshot().last_error.unwrap_or_default();
    assert!(last.contains("heartbeat ACK"), "{last}");
    stop(&d);
    assert_eq!(fake.stats().identifies, 1, "the zombied connection was resumed, not replaced");
    assert_eq!(host.texts(), ["before", "during", "after"]);
}

#[test]
fn reconnect_and_invalid_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let fake = fake(Options::default());
    let host = DirHost::new(dir.path().join("platforms"));
    let d = start(&fake, &host, TOKEN);
    wait_for("connected", Duration::from_secs(10), || d.status().state() == State::Connected);
    // Op 7: resume on a new connection, no state change worth a report.
    fake.reconnect();
    if let Err(s) = fake.wait_stats(Duration::from_secs(10), |s| s.resumed >= 1) {
        panic!("op 7 did not resume: {s:?}");
    }
    fake.message(CHANNEL, USER, "after op 7");
    echoed(&fake, "after op 7");
    assert_eq!(d.status().snapshot().last_error, None, "op 7 is routine");
    // Op 9 resumable: resumed again.
    fake.invalidate(true);
    if let Err(s) = fake.wait_stats(Duration::from_secs(10), |s| s.resumed >= 2) {
        panic!("a resumable op 9 did not resume: {s:?}");
    }
    // Op 9 not resumable: a new session, and the gap is reported, not silent.
    fake.invalidate(false);
    if let Err(s) = fake.wait_stats(Duration::from_secs(15), |s| s.identifies >= 2) {
        panic!("no new IDENTIFY after a non-resumable op 9: {s:?}");
    }
    wait_for("the gap reported", Duration::from_secs(10), || {
        d.status().snapshot().last_error.is_some_and(|e| e.contains("could not be resumed"))
    });
    fake.message(CHANNEL, USER, "new session");
    echoed(&fake, "new session");
    wait_for("connected", Duration::from_secs(10), || d.status().state() == State::Connected);
    stop(&d);
}

#[test]
fn fatal_close_codes_park_naming_the_code_and_others_resume() {
    let dir = tempfile::tempdir().unwrap();
    // The privileged intent is not enabled for the app: 4014.
    let fake1 = fake(Options { message_content_enabled: false, ..Options::default() });
    let host = DirHost::new(dir.path().join("a"));
    let d = start(&fake1, &host, TOKEN);
    wait_for("parked", Duration::from_secs(10), || matches!(d.status().state(), State::Parked(_)));
    let why = d.status().state().reason().unwrap_or_default().to_owned();
    assert!(why.contains("4014") && why.contains("Message Content Intent"), "{why}");
    stop(&d);
    assert_eq!(fake1.stats().closes, [4014], "parked: no second try");

    // A token the REST API refuses parks before any gateway connection.
    let fake2 = fake(Options::default());
    let host = DirHost::new(dir.path().join("b"));
    let d = start(&fake2, &host, "wrong-token");
    wait_for("parked", Duration::from_secs(10), || matches!(d.status().state(), State::Parked(_)));
    let why = d.status().state().reason().unwrap_or_default().to_owned();
    assert!(why.contains("401") && !why.contains("wrong-token"), "{why}");
    stop(&d);

    // A live connection closed with 4000 resumes; with 4004, parks naming it.
    let host = DirHost::new(dir.path().join("c"));
    let d = start(&fake2, &host, TOKEN);
    wait_for("connected", Duration::from_secs(10), || d.status().state() == State::Connected);
    fake2.close_all(4000);
    if let Err(s) = fake2.wait_stats(Duration::from_secs(10), |s| s.resumed >= 1) {
        panic!("4000 did not resume: {s:?}");
    }
    wait_for("connected", Duration::from_secs(10), || d.status().state() == State::Connected);
    fake2.close_all(4004);
    wait_for("parked", Duration::from_secs(10), || matches!(d.status().state(), State::Parked(_)));
    let why = d.status().state().reason().unwrap_or_default().to_owned();
    assert!(why.contains("4004 authentication failed"), "{why}");
    stop(&d);
}

#[test]
fn replies_honour_the_route_buckets_and_the_global_limit() {
    let dir = tempfile::tempdir().unwrap();
    let fake = fake(Options {
        bucket_limit: 2,
        bucket_window: Duration::from_millis(500),
        global_per_s: 3,
        ..Options::default()
    });
    let host = DirHost::new(dir.path().join("platforms"));
    let d = start(&fake, &host, TOKEN);
    wait_for("connected", Duration::from_secs(10), || d.status().state() == State::Connected);
    // Six replies in one channel: its bucket (2 per 500 ms) is waited out from the headers.
    for i in 0..6 {
        fake.message(CHANNEL, USER, &format!("same {i}"));
    }
    for i in 0..6 {
        echoed(&fake, &format!("same {i}"));
    }
    assert_eq!(fake.stats().limited_route, 0, "the bucket's headers were honoured before a 429");
    // Eight replies in eight channels: more than 3 a second hits the global limit; its 429
    // (`global: true`) is waited out and nothing is lost or sent twice.
    for i in 0..8 {
        fake.message(&format!("{}", 200 + i), USER, &format!("spread {i}"));
    }
    for i in 0..8 {
        echoed(&fake, &format!("spread {i}"));
    }
    assert!(fake.stats().limited_global >= 1, "{:?}", fake.stats());
    stop(&d);
    for i in 0..8 {
        assert_eq!(count(&fake, &format!("echo: spread {i}")), 1);
    }
}

#[test]
fn a_dead_fake_degrades_and_the_revived_one_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let fake = fake(Options::default());
    let host = DirHost::new(dir.path().join("platforms"));
    let d = start(&fake, &host, TOKEN);
    wait_for("connected", Duration::from_secs(10), || d.status().state() == State::Connected);
    fake.message(CHANNEL, USER, "before");
    echoed(&fake, "before");
    fake.kill();
    wait_for("degraded", Duration::from_secs(10), || matches!(d.status().state(), State::Degraded(_)));
    fake.message(CHANNEL, USER, "while dead");
    fake.revive().unwrap();
    echoed(&fake, "while dead");
    wait_for("connected", Duration::from_secs(10), || d.status().state() == State::Connected);
    assert_eq!(fake.stats().identifies, 1, "resumed after the outage");
    stop(&d);
    assert_eq!(host.texts(), ["before", "while dead"]);
}

#[test]
fn a_reply_sent_again_after_a_lost_outbox_commit_is_not_duplicated() {
    let dir = tempfile::tempdir().unwrap();
    let fake = fake(Options::default());
    let host = DirHost::new(dir.path().join("platforms"));
    *host.forget_sent.lock().unwrap() = 1;
    let d = start(&fake, &host, TOKEN);
    wait_for("connected", Duration::from_secs(10), || d.status().state() == State::Connected);
    fake.message(CHANNEL, USER, "once");
    echoed(&fake, "once");
    // The entry stayed in the outbox and went again, with the same enforced nonce.
    if let Err(s) = fake.wait_stats(Duration::from_secs(10), |s| s.nonce_hits >= 1) {
        panic!("not sent again: {s:?}");
    }
    wait_for("the outbox emptied", Duration::from_secs(10), || host.mem.outbox.lock().unwrap().is_empty());
    stop(&d);
    assert_eq!(count(&fake, "echo: once"), 1, "Discord returned the first message instead of a second");
}

/// The calls to `channel` that succeeded, in order.
fn done(fake: &FakeDiscord, channel: &str) -> Vec<RestCall> {
    fake.calls().into_iter().filter(|c| c.channel == channel && c.status < 300).collect()
}

/// Waits for a call that `pred` picks (any status); all calls so far.
#[track_caller]
fn saw(fake: &FakeDiscord, what: &str, pred: impl Fn(&RestCall) -> bool) -> Vec<RestCall> {
    match fake.wait_calls(Duration::from_secs(15), |cs| cs.iter().any(&pred)) {
        Ok(c) => c,
        Err(c) => panic!("no {what} among {c:#?}"),
    }
}

fn is(route: Route, channel: &str, content: &str) -> impl Fn(&RestCall) -> bool {
    move |c| c.route == route && c.channel == channel && c.status < 300 && c.content.as_deref() == Some(content)
}

/// The id of the message created in `channel` with `content`.
fn created(fake: &FakeDiscord, channel: &str, content: &str) -> String {
    let c = fake.calls().into_iter().find(is(Route::CreateMessage, channel, content));
    c.and_then(|c| c.message).unwrap_or_else(|| panic!("no {content:?} created"))
}

fn deleted(channel: &str, id: &str) -> impl Fn(&RestCall) -> bool {
    move |c| {
        c.route == Route::DeleteMessage && c.channel == channel && c.status < 300 && c.message.as_deref() == Some(id)
    }
}

/// What a user sees in `channel`: the bot's messages not deleted.
fn visible(fake: &FakeDiscord, channel: &str) -> Vec<String> {
    fake.sent().into_iter().filter(|m| m.channel_id == channel && !m.deleted).map(|m| m.content).collect()
}

/// Issue 20, "typing and progress": a streaming run shows "typing…" (Trigger Typing Indicator,
/// refreshed), a preview message edited as it grows, then the reply as its own message and the
/// preview deleted; an abandoned run's preview is deleted and nothing replaces it. While that
/// second run refreshes its typing, the first chat gets none: its typing stopped with its run.
#[test]
fn a_streaming_run_types_previews_and_is_replaced_by_the_reply() {
    const OTHER: &str = "300";
    let dir = tempfile::tempdir().unwrap();
    let fake = fake(Options::default());
    let host = DirHost::new(dir.path().join("platforms"));
    let d = start(&fake, &host, TOKEN);
    wait_for("connected", Duration::from_secs(10), || d.status().state() == State::Connected);

    d.show(CHANNEL, "run-1", Activity::Started);
    d.show(CHANNEL, "run-1", Activity::Text("Hello ".into()));
    saw(&fake, "typing", |c| c.route == Route::Typing && c.channel == CHANNEL);
    saw(&fake, "a preview", is(Route::CreateMessage, CHANNEL, "Hello …"));
    d.show(CHANNEL, "run-1", Activity::Text("world".into()));
    saw(&fake, "an edit", is(Route::EditMessage, CHANNEL, "Hello world …"));
    d.show(CHANNEL, "run-1", Activity::Ended { replied: true });
    host.mem.queue_reply(CHANNEL, "Hello world.", Some("run-1"));
    d.wake();
    let preview = created(&fake, CHANNEL, "Hello …");
    saw(&fake, "the preview deleted", deleted(CHANNEL, &preview));
    let reply = created(&fake, CHANNEL, "Hello world.");
    assert_ne!(reply, preview, "the reply is a message of its own");

    let calls = done(&fake, CHANNEL);
    let steps: Vec<(Route, Option<&str>, Option<&str>)> = calls
        .iter()
        .filter(|c| c.route != Route::Typing)
        .map(|c| (c.route, c.message.as_deref(), c.content.as_deref()))
        .collect();
    assert_eq!(
        steps,
        [
            (Route::CreateMessage, Some(preview.as_str()), Some("Hello …")),
            (Route::EditMessage, Some(preview.as_str()), Some("Hello world …")),
            (Route::CreateMessage, Some(reply.as_str()), Some("Hello world.")),
            (Route::DeleteMessage, Some(preview.as_str()), None),
        ],
        "create, edit, reply, delete"
    );
    let reply_at = calls.iter().find(|c| c.message.as_deref() == Some(reply.as_str())).map(|c| c.at).unwrap();

    // An abandoned run (cancelled by a drain): its preview goes, no reply comes.
    d.show(OTHER, "run-2", Activity::Started);
    d.show(OTHER, "run-2", Activity::Text("Thinking".into()));
    saw(&fake, "a preview in the other channel", is(Route::CreateMessage, OTHER, "Thinking …"));
    // Typing is refreshed while a run is in progress (at its start, again after the preview
    // message ended it, then every 4 s)...
    let typing = |cs: &[RestCall]| cs.iter().filter(|c| c.route == Route::Typing && c.channel == OTHER).count();
    if let Err(cs) = fake.wait_calls(Duration::from_secs(15), |cs| typing(cs) >= 3) {
        panic!("typing not refreshed: {cs:#?}");
    }
    d.show(OTHER, "run-2", Activity::Ended { replied: false });
    let abandoned = created(&fake, OTHER, "Thinking …");
    saw(&fake, "the abandoned preview deleted", deleted(OTHER, &abandoned));
    stop(&d);
    // ...and not after: none in the first channel once its reply was out, though the other
    // run's refreshes came 4 s and more later.
    let late: Vec<_> =
        done(&fake, CHANNEL).into_iter().filter(|c| c.route == Route::Typing && c.at > reply_at).collect();
    assert!(late.is_empty(), "typing after the run ended: {late:?}");
    assert_eq!(visible(&fake, CHANNEL), ["Hello world."], "the final text, once");
    assert!(visible(&fake, OTHER).is_empty(), "nothing left of the abandoned run");
    assert_eq!(fake.stats().limited_route + fake.stats().limited_global, 0, "within the buckets");
}

/// A preview call that fails (a 500) or is rate limited (a 429 for a minute) never holds up the
/// reply, nor sends it twice; the preview the limit kept on screen is listed in the home, and
/// the successor deletes it.
#[test]
fn failed_and_rate_limited_previews_never_hold_up_or_double_the_reply() {
    let dir = tempfile::tempdir().unwrap();
    let fake = fake(Options::default());
    fake.fault(Route::CreateMessage, 1, Fault::Status(500));
    fake.fault(Route::EditMessage, 1, Fault::Limited(Duration::from_secs(60)));
    let host = DirHost::new(dir.path().join("platforms"));
    let d = start(&fake, &host, TOKEN);
    wait_for("connected", Duration::from_secs(10), || d.status().state() == State::Connected);

    d.show(CHANNEL, "run-1", Activity::Started);
    d.show(CHANNEL, "run-1", Activity::Text("Hello ".into()));
    saw(&fake, "the failed preview", |c| c.route == Route::CreateMessage && c.status == 500);
    saw(&fake, "the preview, tried again", is(Route::CreateMessage, CHANNEL, "Hello …"));
    d.show(CHANNEL, "run-1", Activity::Text("world".into()));
    saw(&fake, "the rate-limited edit", |c| c.route == Route::EditMessage && c.status == 429);
    d.show(CHANNEL, "run-1", Activity::Ended { replied: true });
    let seq = host.mem.queue_reply(CHANNEL, "Hello world.", Some("run-1"));
    d.wake();
    // Well inside the edit route's minute: the outbox is not held by the previews' limit.
    saw(&fake, "the reply", is(Route::CreateMessage, CHANNEL, "Hello world."));
    stop(&d);
    assert!(host.mem.outcomes.lock().unwrap().contains(&(seq, Sent::Ok)));
    let preview = created(&fake, CHANNEL, "Hello …");
    assert_eq!(visible(&fake, CHANNEL), ["Hello …", "Hello world."], "the preview waits out the limit");
    let listed = std::fs::read_to_string(dir.path().join("platforms/previews-discord.json")).unwrap();
    assert!(listed.contains(&preview), "{listed}");

    let d = start(&fake, &host, TOKEN);
    saw(&fake, "the leftover preview deleted by the successor", deleted(CHANNEL, &preview));
    stop(&d);
    assert_eq!(visible(&fake, CHANNEL), ["Hello world."]);
    assert_eq!(count(&fake, "Hello world."), 1, "the reply once");
    let edits = fake.calls().into_iter().filter(|c| c.route == Route::EditMessage).count();
    assert_eq!(edits, 1, "the held chat was not edited again (nor retried in a loop)");
}
