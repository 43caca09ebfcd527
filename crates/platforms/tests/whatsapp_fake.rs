//! The WhatsApp adapter against the fake Cloud API (crates/testkit/src/whatsappfake.rs), its
//! webhook requests handed straight to `Adapter::hook`: the push intake's promises (200 only
//! after the commit, 5xx otherwise, 503 when not receiving), the window, the Graph API errors.
#![cfg(unix)] // the fake (testkit) is Unix-only

mod support;
use support::{MemHost, wait_for};

use std::sync::Arc;
use std::time::{Duration, Instant};

use gatewarden_config::{PlatformConfig, platform};
use gatewarden_platforms::whatsapp::Whatsapp;
use gatewarden_platforms::{Adapter, HookRequest, Host, Sent, State};
use gatewarden_testkit::whatsappfake::{FakeWhatsapp, Options, sign};

fn config(fake: &FakeWhatsapp) -> PlatformConfig {
    let o = fake.options();
    PlatformConfig {
        token_env: Some("UNUSED".into()),
        ..PlatformConfig::with(platform::Whatsapp {
            phone_number_id: Some(o.phone_number_id),
            api_base: Some(fake.api_base()),
            api_version: Some(o.version),
            ..platform::Whatsapp::default()
        })
    }
}

fn adapter(fake: &FakeWhatsapp) -> Arc<Whatsapp> {
    let o = fake.options();
    Arc::new(Whatsapp::new(&config(fake), o.token, o.app_secret, o.verify_token).unwrap())
}

/// A notification of a text from `from`, composed by the fake (so its window opens there too);
/// `id` is replaced by the fake's wamid only in the fake's records, not in the body.
fn notification(fake: &FakeWhatsapp, from: &str, id: &str, text: &str, at: u64) -> Vec<u8> {
    let (wamid, body) = fake.compose(from, text, at);
    String::from_utf8(body).unwrap().replace(&wamid, id).into_bytes()
}

fn post(fake: &FakeWhatsapp, body: Vec<u8>) -> HookRequest {
    let sig = sign(fake.options().app_secret.as_bytes(), &body);
    HookRequest { post: true, query: String::new(), headers: vec![("x-hub-signature-256".into(), sig)], body }
}

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
}

#[test]
fn answered_200_only_after_the_commit_and_5xx_otherwise() {
    let fake = FakeWhatsapp::start(Options::default()).unwrap();
    let wa = adapter(&fake);
    let host = Arc::new(MemHost::echoing());
    let m1 = notification(&fake, "1555", "wamid.1", "hi", now());
    assert_eq!(wa.hook(&post(&fake, m1.clone())).status, 503, "not started");

    wa.start(Arc::clone(&host) as Arc<dyn Host>).unwrap();
    wait_for("connected", Duration::from_secs(5), || wa.status().state() == State::Connected);
    let a = wa.hook(&post(&fake, m1.clone()));
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(host.inbox.lock().unwrap().len(), 1, "journaled before the 200");
    assert_eq!(wa.hook(&post(&fake, m1)).status, 200, "a redelivery");
    assert_eq!(host.inbox.lock().unwrap().len(), 1, "deduplicated by wamid");
    wait_for("the echo", Duration::from_secs(5), || {
        fake.posted().iter().any(|p| p.text == "echo: hi" && p.to == "1555")
    });

    *host.refuse.lock().unwrap() = true;
    let a = wa.hook(&post(&fake, notification(&fake, "1555", "wamid.2", "second", now())));
    assert_eq!(a.status, 500, "{a:?}");
    assert!(host.inbox.lock().unwrap().iter().all(|m| m.event_id != "wamid.2"));
    *host.refuse.lock().unwrap() = false;
    assert_eq!(wa.hook(&post(&fake, notification(&fake, "1555", "wamid.2", "second", now()))).status, 200);

    // Unsigned: 401, nothing journaled.
    let mut unsigned = post(&fake, notification(&fake, "1555", "wamid.3", "x", now()));
    unsigned.headers.clear();
    assert_eq!(wa.hook(&unsigned).status, 401);
    let get = |q: &str| wa.hook(&HookRequest { query: q.into(), ..HookRequest::default() });
    let token = fake.options().verify_token;
    assert_eq!(get(&format!("hub.mode=subscribe&hub.challenge=42&hub.verify_token={token}")).body, "42");
    assert_eq!(get("hub.mode=subscribe&hub.challenge=42&hub.verify_token=nope").status, 403);

    // Draining: 503 at once, so Meta keeps it for the successor.
    wa.stop_intake();
    let t0 = Instant::now();
    assert_eq!(wa.hook(&post(&fake, notification(&fake, "1555", "wamid.4", "late", now()))).status, 503);
    assert!(t0.elapsed() < Duration::from_secs(1));
    assert!(wa.close(Instant::now() + Duration::from_secs(3)));
    assert_eq!(host.inbox.lock().unwrap().len(), 2);
}

#[test]
fn the_window_rejects_and_errors_follow_meta() {
    let fake = FakeWhatsapp::start(Options::default()).unwrap();
    let wa = adapter(&fake);
    let host = Arc::new(MemHost::silent());
    let dir = tempfile::tempdir().unwrap();
    *host.state_dir.lock().unwrap() = Some(dir.path().to_owned());
    wa.start(Arc::clone(&host) as Arc<dyn Host>).unwrap();
    wait_for("connected", Duration::from_secs(5), || wa.status().state() == State::Connected);
    assert_eq!(wa.hook(&post(&fake, notification(&fake, "1555", "wamid.a", "hi", now()))).status, 200);
    // A chat that never wrote: rejected with the reason, never sent.
    let never = host.queue("1999", "unsolicited");
    // Rate limited once (130429 with Retry-After), then sent.
    fake.flood(1, 1);
    let ok = host.queue("1555", "after the flood");
    wa.wake();
    wait_for("both outcomes", Duration::from_secs(10), || host.outcomes.lock().unwrap().len() == 2);
    let outcomes = host.outcomes.lock().unwrap().clone();
    assert!(
        outcomes.iter().any(|(s, o)| *s == never && matches!(o, Sent::Rejected(m) if m.contains("24-hour"))),
        "{outcomes:?}"
    );
    assert!(outcomes.contains(&(ok, Sent::Ok)), "{outcomes:?}");
    assert_eq!(fake.posted().len(), 1);
    assert!(dir.path().join("whatsapp-whatsapp.json").exists(), "the windows are saved at confirm");
    // The token is revoked: the next send parks the adapter.
    fake.revoke();
    host.queue("1555", "after the revocation");
    wa.wake();
    wait_for("parked", Duration::from_secs(10), || matches!(wa.status().state(), State::Parked(_)));
    // The receive side parks too (nothing taken in that could not be answered), and stays so.
    let parked_for_good = (0..30).all(|_| {
        std::thread::sleep(Duration::from_millis(100));
        matches!(wa.status().state(), State::Parked(_))
    });
    assert!(parked_for_good, "{:?}", wa.status().state());
    assert_eq!(wa.hook(&post(&fake, notification(&fake, "1555", "wamid.b", "parked", now()))).status, 503);
    let _ = wa.close(Instant::now() + Duration::from_secs(2));
}
