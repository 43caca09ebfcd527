//! Issue 20: the Discord adapter in a cluster, with real gateways in separate homes (standing in
//! for hosts), a real throwaway PostgreSQL (testkit::postgres, as in cluster_platforms.rs) and
//! the in-repo fake Discord, which counts gateway connections and IDENTIFYs: only the active
//! connects; after a kill -9 of the active, the promoted standby identifies and answers.
#![cfg(target_os = "linux")]

mod common;

use std::time::Duration;

use common::*;
use gatewarden_discord_fake::{FakeDiscord, Options};
use gatewarden_testkit::api::Api;
use gatewarden_testkit::postgres::{Cluster, PASSWORD};

const TTL: Duration = Duration::from_secs(3);
const PW_ENV: &str = "GW_TEST_STORE_PASSWORD";
const TOKEN_ENV: &str = "GW_TEST_DISCORD_TOKEN";
const REPLY: Duration = Duration::from_secs(15);

struct Node {
    home: TempHome,
    g: Gateway,
}

impl Node {
    fn spawn(cluster: &str, url: &str, fake: &FakeDiscord, token: &str) -> Node {
        let home = TempHome::new();
        let cfg = format!(
            "drain_timeout_s = 5\n[agent]\nbackend = \"echo\"\n\
             [cluster]\nname = \"{cluster}\"\nstore = \"{url}\"\npassword_env = \"{PW_ENV}\"\nlease_ttl_s = {}\nrenew_interval_s = 1\n\
             [[platform]]\nkind = \"discord\"\naccess = \"open\"\nrequire_mention = false\nname = \"bot\"\ntoken_env = \"{TOKEN_ENV}\"\napi_base = \"{}\"\nconflict_standby_s = 2\n",
            TTL.as_secs(),
            fake.api_base()
        );
        gatewarden_testkit::api::write_config(home.path(), &cfg);
        let g = builder(&home).env(PW_ENV, PASSWORD).env(TOKEN_ENV, token).spawn();
        Node { home, g }
    }

    fn role(&self) -> Option<String> {
        let v = self.home.state_record()?;
        if v["pid"].as_u64()? != u64::from(self.g.pid()) || v["gateway_state"] != "running" {
            return None;
        }
        let api = Api::new(v["listen"].as_str()?.parse().ok()?).with_timeout(Duration::from_secs(2));
        api.status().and_then(|s| s["cluster"]["role"].as_str().map(str::to_owned))
    }

    fn adapter_state(&self) -> Value {
        let out = run_cli(&self.home, &["status", "--json"]);
        let v: Value = serde_json::from_str(&out.stdout).unwrap_or(Value::Null);
        v["platforms"][0]["state"].clone()
    }

    #[track_caller]
    fn wait_role(&mut self, role: &str, within: Duration) {
        let ok = wait_until(within, || self.role().as_deref() == Some(role));
        assert!(ok, "pid {} not {role} within {within:?}\n{}", self.g.pid(), self.g.diag());
    }

    #[track_caller]
    fn wait_adapter(&mut self, state: &str, within: Duration) {
        let ok = wait_until(within, || self.adapter_state() == state);
        assert!(ok, "adapter of pid {} not {state}: {}\n{}", self.g.pid(), self.adapter_state(), self.g.diag());
    }
}

#[track_caller]
fn wait_reply(fake: &FakeDiscord, channel: &str, text: &str) {
    let got = fake.wait_sent(REPLY, |s| s.iter().any(|m| m.channel_id == channel && m.content == text));
    if let Err(sent) = got {
        panic!("no reply {text:?} in channel {channel} within {REPLY:?}; sent: {sent:#?}");
    }
}

/// Only the active holds a gateway session (the standby never connects, so Discord delivers
/// each event once); kill -9 of the active: the promoted standby identifies and answers.
#[test]
fn only_the_active_connects_and_the_standby_takes_over_after_kill9() {
    let Some(pg) = Cluster::start_or_skip() else { return };
    let tok = format!("discord-cluster-{}", std::process::id());
    let fake = FakeDiscord::start(Options {
        token: tok.clone(),
        heartbeat_interval: Duration::from_millis(500),
        ..Options::default()
    })
    .expect("fake Discord");
    let mut a = Node::spawn("dck9", &pg.url(), &fake, &tok);
    a.wait_role("active", READY);
    a.wait_adapter("connected", READY);
    let mut b = Node::spawn("dck9", &pg.url(), &fake, &tok);
    b.wait_role("standby", READY);
    b.wait_adapter("standby", READY);
    fake.message("7", "1", "before");
    wait_reply(&fake, "7", "before");
    // A few renewals later the standby still has no connection of its own.
    let one = holds_for(Duration::from_secs(3), || {
        let s = fake.stats();
        s.connections == 1 && s.identifies == 1
    });
    assert!(one.is_ok(), "the standby connected: {:?}", fake.stats());

    a.g.kill();
    b.wait_role("active", TTL + Duration::from_secs(5));
    b.wait_adapter("connected", READY);
    assert_eq!(fake.stats().identifies, 2, "the promoted standby identified: {:?}", fake.stats());
    fake.message("7", "1", "after");
    wait_reply(&fake, "7", "after");
    let again = fake.sent().iter().filter(|m| m.content == "before").count();
    assert_eq!(again, 1, "answered twice across the failover");
}
