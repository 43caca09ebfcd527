//! The openai backend's failover against the fake provider of crates/testkit (llmfake.rs):
//! retries with backoff and `Retry-After`, fallbacks, the circuit breaker, the run's deadline,
//! and usage. Times are measured on the fake's request timestamps; wall-clock bounds are
//! generous.
#![cfg(unix)]

use std::time::{Duration, Instant};

use gatewarden_agent::{Agent, AgentError, AgentRequest, Usage, build_agent};
use gatewarden_config::{AgentConfig, BackendKind, ProviderConfig};
use gatewarden_testkit::llmfake::{FakeLlm, Reply};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

fn provider(name: &str, base_url: String) -> ProviderConfig {
    ProviderConfig { name: Some(name.into()), base_url, model: format!("model-{name}"), ..Default::default() }
}

fn config(providers: Vec<ProviderConfig>, retries: u32, backoff_ms: u64) -> AgentConfig {
    AgentConfig {
        backend: BackendKind::Openai,
        provider: providers,
        retries,
        backoff_ms,
        timeout_s: 20,
        ..AgentConfig::default()
    }
}

fn req(text: &str) -> AgentRequest {
    AgentRequest::new("r1", "c", "u", text, vec![])
}

async fn run(a: &dyn Agent, text: &str) -> Result<gatewarden_agent::AgentReply, AgentError> {
    tokio::time::timeout(Duration::from_secs(60), a.run(req(text), CancellationToken::new())).await.expect("run ended")
}

/// A loopback port nothing listens on.
fn refused_url() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    format!("http://{addr}/v1")
}

#[tokio::test]
async fn primary_429_is_retried_then_the_fallback_answers() {
    let primary = FakeLlm::start(Reply::rate_limited("0")).unwrap();
    let fallback = FakeLlm::start(Reply::text("from the fallback")).unwrap();
    let a = build_agent(&config(
        vec![provider("primary", primary.base_url()), provider("fallback", fallback.base_url())],
        2,
        10,
    ));
    let r = run(&*a, "hi").await.unwrap();
    // The reply says nothing of the failover.
    assert_eq!(r.text, "from the fallback");
    assert_eq!(primary.requests(), 3, "one attempt and two retries");
    assert_eq!(fallback.requests(), 1);
    assert_eq!(fallback.seen()[0].body["model"], "model-fallback");
    let st = a.providers();
    assert_eq!((st[0].state.as_str(), st[0].attempts, st[0].failures), ("failing", 3, 3));
    assert!(st[0].reason.as_deref().unwrap().contains("HTTP 429"), "{:?}", st[0]);
    assert_eq!((st[1].state.as_str(), st[1].attempts, st[1].failures), ("healthy", 1, 0));
    let ev = a.take_provider_events();
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(
        (ev[0].from.as_str(), ev[0].status.name.as_str(), ev[0].status.state.as_str()),
        ("healthy", "primary", "failing")
    );
    assert!(a.take_provider_events().is_empty());
}

#[tokio::test]
async fn retry_after_is_honoured_in_seconds_and_as_a_date() {
    let primary = FakeLlm::start(Reply::text("ok")).unwrap();
    primary.then([Reply::rate_limited("1")]);
    let a = build_agent(&config(vec![provider("primary", primary.base_url())], 2, 10));
    assert_eq!(run(&*a, "hi").await.unwrap().text, "ok");
    let seen = primary.seen();
    assert_eq!(seen.len(), 2);
    let gap = seen[1].at - seen[0].at;
    assert!(gap >= Duration::from_millis(950) && gap < Duration::from_secs(10), "gap {gap:?}");

    // An HTTP date two seconds ahead (second granularity: at least one second of wait).
    let date = httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(2));
    primary.then([Reply::rate_limited(&date)]);
    assert_eq!(run(&*a, "hi").await.unwrap().text, "ok");
    let seen = primary.seen();
    let gap = seen[3].at - seen[2].at;
    assert!(gap >= Duration::from_millis(950) && gap < Duration::from_secs(10), "gap {gap:?}");
}

#[tokio::test]
async fn a_primary_failing_every_call_is_cooled_down_and_skipped() {
    let primary = FakeLlm::start(Reply::status(502)).unwrap();
    let fallback = FakeLlm::start(Reply::text("fb")).unwrap();
    let mut cfg =
        config(vec![provider("primary", primary.base_url()), provider("fallback", fallback.base_url())], 1, 5);
    cfg.cooldown_s = 3600;
    let a = build_agent(&cfg);
    // Three failed calls in a row (two attempts each) trip the breaker.
    for _ in 0..3 {
        assert_eq!(run(&*a, "hi").await.unwrap().text, "fb");
    }
    assert_eq!(primary.requests(), 6);
    let st = &a.providers()[0];
    assert_eq!(st.state, "cooling_down");
    assert!(st.until.is_some() && st.reason.as_deref().is_some_and(|r| r.contains("HTTP 502")), "{st:?}");
    // During the cool-down the primary is not asked at all.
    for _ in 0..5 {
        assert_eq!(run(&*a, "hi").await.unwrap().text, "fb");
    }
    assert_eq!(primary.requests(), 6, "the primary was called during its cool-down");
    assert_eq!(fallback.requests(), 8);
    let ev: Vec<_> = a.take_provider_events().into_iter().map(|e| (e.from, e.status.state)).collect();
    assert_eq!(ev, vec![("healthy".into(), "failing".into()), ("failing".into(), "cooling_down".into())]);
}

#[tokio::test]
async fn after_the_cool_down_one_probe_closes_the_breaker() {
    let primary = FakeLlm::start(Reply::text("primary again")).unwrap();
    primary.then([Reply::status(503), Reply::status(503), Reply::status(503)]);
    let fallback = FakeLlm::start(Reply::text("fb")).unwrap();
    let mut cfg =
        config(vec![provider("primary", primary.base_url()), provider("fallback", fallback.base_url())], 0, 5);
    cfg.cooldown_s = 1;
    let a = build_agent(&cfg);
    for _ in 0..3 {
        assert_eq!(run(&*a, "hi").await.unwrap().text, "fb");
    }
    assert_eq!(a.providers()[0].state, "cooling_down");
    let until = a.providers()[0].until.unwrap();
    // Wait out the cool-down (bounded), then the next run probes the primary.
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::time::SystemTime::now() < until + Duration::from_millis(50) {
        assert!(Instant::now() < deadline, "cool-down never ended");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(run(&*a, "hi").await.unwrap().text, "primary again");
    assert_eq!(a.providers()[0].state, "healthy");
    assert_eq!(primary.requests(), 4);
}

#[tokio::test]
async fn connection_refused_falls_back() {
    let fallback = FakeLlm::start(Reply::text("fb")).unwrap();
    let a =
        build_agent(&config(vec![provider("gone", refused_url()), provider("fallback", fallback.base_url())], 1, 5));
    assert_eq!(run(&*a, "hi").await.unwrap().text, "fb");
    let st = &a.providers()[0];
    assert_eq!((st.attempts, st.failures), (2, 2));
    assert!(st.reason.as_deref().is_some_and(|r| r.contains("cannot connect")), "{st:?}");
}

#[tokio::test]
async fn other_4xx_are_not_retried() {
    // 401: this provider cannot serve us; the next one is asked, without a retry.
    let primary = FakeLlm::start(Reply::status(401)).unwrap();
    let fallback = FakeLlm::start(Reply::text("fb")).unwrap();
    let a = build_agent(&config(
        vec![provider("primary", primary.base_url()), provider("fallback", fallback.base_url())],
        3,
        5,
    ));
    assert_eq!(run(&*a, "hi").await.unwrap().text, "fb");
    assert_eq!(primary.requests(), 1);
    // 400: the request itself is refused; nobody else is asked.
    let bad = FakeLlm::start(Reply::status(400)).unwrap();
    let fallback2 = FakeLlm::start(Reply::text("fb")).unwrap();
    let a =
        build_agent(&config(vec![provider("bad", bad.base_url()), provider("fallback", fallback2.base_url())], 3, 5));
    match run(&*a, "hi").await {
        Err(AgentError::Upstream { status: 400, body }) => assert!(body.contains("Bad Request"), "{body}"),
        other => panic!("expected HTTP 400, got {other:?}"),
    }
    assert_eq!((bad.requests(), fallback2.requests()), (1, 0));
}

#[tokio::test]
async fn the_run_deadline_bounds_retries_and_names_the_providers() {
    let p1 = FakeLlm::start(Reply::status(502)).unwrap();
    let p2 = FakeLlm::start(Reply::status(503)).unwrap();
    let mut cfg = config(vec![provider("p1", p1.base_url()), provider("p2", p2.base_url())], 10, 300);
    cfg.timeout_s = 1;
    let a = build_agent(&cfg);
    let t0 = Instant::now();
    let r = run(&*a, "hi").await;
    assert!(t0.elapsed() < Duration::from_secs(10), "took {:?}", t0.elapsed());
    match r {
        Err(AgentError::Failed(m)) => {
            assert!(m.contains("no provider answered") && m.contains("p1: HTTP 502") && m.contains("p2"), "{m}")
        }
        other => panic!("expected a failure naming the providers, got {other:?}"),
    }
    assert!(p1.requests() < 10, "p1 retried {} times within one second", p1.requests());

    // A provider that never answers: the run times out at timeout_s, not later.
    let hang = FakeLlm::start(Reply::Hang).unwrap();
    let mut cfg = config(vec![provider("hang", hang.base_url())], 10, 10);
    cfg.timeout_s = 1;
    let a = build_agent(&cfg);
    let t0 = Instant::now();
    assert_eq!(run(&*a, "hi").await.unwrap_err(), AgentError::Timeout(Duration::from_secs(1)));
    assert!(t0.elapsed() < Duration::from_secs(10));
    assert_eq!(hang.requests(), 1);
}

#[tokio::test]
async fn usage_is_reported_plain_and_streamed() {
    let p = FakeLlm::start(Reply::Text { text: "one two three".into(), usage: Some((11, 4)) }).unwrap();
    let a = build_agent(&config(vec![provider("p", p.base_url())], 0, 5));
    let r = run(&*a, "hi").await.unwrap();
    assert_eq!((r.text.as_str(), r.usage), ("one two three", Some(Usage { prompt_tokens: 11, completion_tokens: 4 })));

    let (tx, mut rx) = mpsc::channel(64);
    let r = a.run_streaming(req("hi"), CancellationToken::new(), tx).await.unwrap();
    let mut chunks = Vec::new();
    while let Ok(c) = rx.try_recv() {
        chunks.push(c);
    }
    assert_eq!(chunks, vec!["one ", "two ", "three"]);
    assert_eq!((r.text.as_str(), r.usage), ("one two three", Some(Usage { prompt_tokens: 11, completion_tokens: 4 })));
    let body = &p.seen()[1].body;
    assert_eq!((body["stream"].as_bool(), body["stream_options"]["include_usage"].as_bool()), (Some(true), Some(true)));
}

#[tokio::test]
async fn a_stream_failing_before_its_first_token_fails_over() {
    let primary = FakeLlm::start(Reply::status(500)).unwrap();
    let fallback = FakeLlm::start(Reply::text("streamed fallback")).unwrap();
    let a = build_agent(&config(
        vec![provider("primary", primary.base_url()), provider("fallback", fallback.base_url())],
        0,
        5,
    ));
    let (tx, mut rx) = mpsc::channel(64);
    let r = a.run_streaming(req("hi"), CancellationToken::new(), tx).await.unwrap();
    let mut got = String::new();
    while let Ok(c) = rx.try_recv() {
        got.push_str(&c);
    }
    assert_eq!((r.text.as_str(), got.as_str()), ("streamed fallback", "streamed fallback"));
}

#[tokio::test]
async fn each_provider_gets_its_own_key_headers_and_model() {
    // Set once, before any thread reads the environment (nextest runs each test in its own process).
    unsafe {
        std::env::set_var("GW_TEST_FAILOVER_K1", "sk-primary");
        std::env::set_var("GW_TEST_FAILOVER_K2", "sk-fallback");
    }
    let primary = FakeLlm::start(Reply::status(503)).unwrap();
    let fallback = FakeLlm::start(Reply::text("fb")).unwrap();
    let mut p1 = provider("primary", primary.base_url());
    p1.api_key_env = Some("GW_TEST_FAILOVER_K1".into());
    p1.headers.insert("OpenAI-Organization".into(), "org-primary".into());
    let mut p2 = provider("fallback", fallback.base_url());
    p2.api_key_env = Some("GW_TEST_FAILOVER_K2".into());
    let a = build_agent(&config(vec![p1, p2], 0, 5));
    assert_eq!(run(&*a, "hi").await.unwrap().text, "fb");
    let (s1, s2) = (&primary.seen()[0], &fallback.seen()[0]);
    assert_eq!(
        (s1.header("authorization"), s1.header("openai-organization")),
        (Some("Bearer sk-primary"), Some("org-primary"))
    );
    assert_eq!((s2.header("authorization"), s2.header("openai-organization")), (Some("Bearer sk-fallback"), None));
    assert_eq!((s1.body["model"].as_str(), s2.body["model"].as_str()), (Some("model-primary"), Some("model-fallback")));
    assert_eq!(s2.path, "/v1/chat/completions");
}

#[tokio::test]
async fn a_provider_silent_past_attempt_timeout_falls_back() {
    let silent = FakeLlm::start(Reply::Hang).unwrap();
    let fallback = FakeLlm::start(Reply::text("fb")).unwrap();
    let mut cfg = config(vec![provider("silent", silent.base_url()), provider("fallback", fallback.base_url())], 0, 5);
    cfg.attempt_timeout_s = 1;
    let a = build_agent(&cfg);
    assert_eq!(run(&*a, "hi").await.unwrap().text, "fb");
    let waited = fallback.seen()[0].at - silent.seen()[0].at;
    assert!(waited >= Duration::from_millis(900) && waited < Duration::from_secs(10), "{waited:?}");
    let st = &a.providers()[0];
    assert!(st.reason.as_deref().is_some_and(|r| r.contains("attempt_timeout_s")), "{st:?}");
}

/// A streaming run whose consumer shows each chunk through the run's delivery
/// (crates/agent/src/backend/delivery.rs) the way the runtime does; the chunks it showed.
async fn run_shown(a: &dyn Agent, text: &str) -> (Result<gatewarden_agent::AgentReply, AgentError>, Vec<String>) {
    use gatewarden_agent::backend::delivery::{self, Delivery};
    let d = Delivery::default();
    let (tx, mut rx) = mpsc::channel::<String>(64);
    let consumer = {
        let d = d.clone();
        tokio::spawn(async move {
            let mut shown = Vec::new();
            while let Some(c) = rx.recv().await {
                if d.take().is_some_and(|e| d.reach(e)) {
                    shown.push(c);
                }
            }
            shown
        })
    };
    let r = tokio::time::timeout(
        Duration::from_secs(60),
        delivery::scope(d, a.run_streaming(req(text), CancellationToken::new(), tx)),
    )
    .await
    .expect("run ended");
    (r, consumer.await.unwrap())
}

/// Issue 27 §6: a provider that breaks off mid-stream is retried and failed over while none of
/// its reply was shown: here the consumer shows every chunk at once, so the first piece
/// reached it and the run ends (as before); with nothing shown yet it is failed over, its
/// pieces dropped. Either way the provider's `failures` count the drop.
#[tokio::test]
async fn a_stream_broken_off_is_failed_over_until_something_was_shown() {
    let primary = FakeLlm::start(Reply::broken("half an ans")).unwrap();
    let fallback = FakeLlm::start(Reply::text("the whole answer")).unwrap();
    // The pieces come 200 ms apart: each is shown long before the stream breaks off.
    primary.set_latency(Duration::ZERO, Duration::from_millis(200));
    let a = build_agent(&config(
        vec![provider("primary", primary.base_url()), provider("fallback", fallback.base_url())],
        1,
        10,
    ));
    // Shown at once: too late to fail over.
    let (r, shown) = run_shown(&*a, "hi").await;
    assert!(matches!(&r, Err(AgentError::Failed(why)) if why.contains("[DONE]")), "{r:?}");
    assert_eq!(shown.concat(), "half an ans");
    assert_eq!(fallback.requests(), 0);
    let st = a.providers();
    assert_eq!((st[0].attempts, st[0].failures), (1, 1), "a mid-stream drop is a failure: {st:?}");

    // Nothing shown (a chat's preview comes later, an async caller reads the end): the broken
    // provider is retried, then the fallback answers; none of the broken pieces remain.
    let primary = FakeLlm::start(Reply::broken("half an ans")).unwrap();
    let fallback = FakeLlm::start(Reply::text("the whole answer")).unwrap();
    let a = build_agent(&config(
        vec![provider("primary", primary.base_url()), provider("fallback", fallback.base_url())],
        1,
        10,
    ));
    let (tx, mut rx) = mpsc::channel::<String>(64);
    let d = gatewarden_agent::backend::delivery::Delivery::default();
    let held = {
        let d = d.clone();
        tokio::spawn(async move {
            let mut kept: Vec<(u64, String)> = Vec::new();
            while let Some(c) = rx.recv().await {
                if let Some(e) = d.take() {
                    kept.push((e, c));
                }
            }
            // Shown only at the end, in the epoch it was taken.
            kept.into_iter().filter(|(e, _)| d.reach(*e)).map(|(_, c)| c).collect::<String>()
        })
    };
    let r =
        gatewarden_agent::backend::delivery::scope(d, a.run_streaming(req("hi"), CancellationToken::new(), tx)).await;
    assert_eq!(r.unwrap().text, "the whole answer");
    assert_eq!(held.await.unwrap(), "the whole answer", "only the fallback's pieces are shown");
    assert_eq!(primary.requests(), 2, "retried like a refused connection, then failed over");
    let st = a.providers();
    assert_eq!((st[0].attempts, st[0].failures), (2, 2), "{st:?}");
}

/// Issue 31 §5: an upstream that streams forever ends the run once the reply passes
/// `max_reply_bytes`, with a failure that names the key; the provider is not blamed.
#[tokio::test]
async fn an_endless_stream_ends_at_max_reply_bytes() {
    let endless = FakeLlm::start(Reply::Endless).unwrap();
    let mut c = config(vec![provider("endless", endless.base_url())], 0, 10);
    c.max_reply_bytes = 64 * 1024;
    let a = build_agent(&c);
    let t0 = Instant::now();
    let (r, shown) = run_shown(&*a, "hi").await;
    assert!(matches!(&r, Err(AgentError::Failed(why)) if why.contains("max_reply_bytes")), "{r:?}");
    assert!(t0.elapsed() < Duration::from_secs(15), "ended by the cap, not the timeout: {:?}", t0.elapsed());
    let streamed: usize = shown.iter().map(String::len).sum();
    assert!(streamed <= 64 * 1024, "{streamed} bytes passed on");
    // Not streamed (a sync caller): the same cap on the body's content.
    let r = tokio::time::timeout(Duration::from_secs(60), a.run(req("hi"), CancellationToken::new())).await.unwrap();
    assert!(r.is_err(), "{r:?}");
}
