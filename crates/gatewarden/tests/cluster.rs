//! Active/standby with real gateways in separate homes (standing in for hosts) against a real
//! throwaway PostgreSQL (testkit::postgres). TTL 3 s, renewal every 1 s.
//!
//! Every test ends by checking the database's own grant history: epochs strictly increase and
//! each has exactly one holder (`at_most_one_active_per_epoch`).
#![cfg(target_os = "linux")]

mod common;
mod work_common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use gatewarden_telegram_fake::{FakeTelegram, Options, PollRecord};
use gatewarden_testkit::api::{Api, header};
use gatewarden_testkit::postgres::{Cluster, PASSWORD, Proxy, ProxyMode};
use work_common::wait_final;

const TTL: Duration = Duration::from_secs(3);
const RENEW: Duration = Duration::from_secs(1);
const PW_ENV: &str = "GW_TEST_STORE_PASSWORD";
const TOKEN_ENV: &str = "GW_TEST_TELEGRAM_TOKEN";
/// The chaos load's Telegram pace and chat count.
const TG_PACE: Duration = Duration::from_millis(150);
const TG_CHATS: usize = 4;

struct Node {
    home: TempHome,
    g: Gateway,
    /// Extra environment of every process in this home (a platform token).
    envs: Vec<(&'static str, String)>,
}

impl Node {
    fn spawn(name: &str, url: &str) -> Node {
        Node::spawn_with(name, url, "")
    }

    /// A gateway whose config.toml starts with `top` (top-level keys and tables before
    /// `[cluster]`).
    fn spawn_with(name: &str, url: &str, top: &str) -> Node {
        let home = TempHome::new();
        let g = Node::configure(&home, name, url, top, "", &[]);
        Node { home, g, envs: Vec::new() }
    }

    /// A gateway that trusts only `ca_file` for its store (`[cluster] ca_file`).
    fn spawn_ca(name: &str, url: &str, ca_file: &std::path::Path) -> Node {
        let home = TempHome::new();
        let keys = format!("ca_file = \"{}\"\n", ca_file.display());
        let g = Node::configure(&home, name, url, "", &keys, &[]);
        Node { home, g, envs: Vec::new() }
    }

    /// A gateway with the echo agent and a Telegram adapter on `token` polling through
    /// `api_base` (a per-consumer address of the fake, so its poll log names this gateway).
    fn spawn_telegram(name: &str, url: &str, api_base: &str, token: &str) -> Node {
        let home = TempHome::new();
        let top = format!(
            "[agent]\nbackend = \"echo\"\n[[platform]]\nkind = \"telegram\"\naccess = \"open\"\nrequire_mention = false\nname = \"bot\"\ntoken_env = \"{TOKEN_ENV}\"\n\
             api_base = \"{api_base}\"\npoll_timeout_s = 20\nconflict_standby_s = 2\n"
        );
        let envs = vec![(TOKEN_ENV, token.to_owned())];
        let g = Node::configure(&home, name, url, &top, "", &envs);
        Node { home, g, envs }
    }

    /// A gateway whose exec agent takes `secs` per message, appends each run id to `<home>/runs`
    /// (the test's readiness signal that a run started here) and replies `<text> by <label>`;
    /// the drain gives runs `drain_s` before cancelling them.
    fn spawn_slow(name: &str, url: &str, label: &str, secs: f64, drain_s: u64) -> Node {
        let home = TempHome::new();
        let script = home.path().join("agent.sh");
        let runs = home.path().join("agent_runs");
        std::fs::write(
            &script,
            format!(
                "echo \"$GATEWARDEN_RUN_ID\" >> '{}'\nsleep {secs}\nprintf '%s by {label}' \"$(cat)\"\n",
                runs.display()
            ),
        )
        .unwrap();
        let top = format!(
            "drain_timeout_s = {drain_s}\n[agent]\nbackend = \"exec\"\ncommand = [\"sh\", '{}']\n",
            script.display()
        );
        let g = Node::configure(&home, name, url, &top, "", &[]);
        Node { home, g, envs: Vec::new() }
    }

    /// The run ids this node's slow agent started.
    fn runs(&self) -> Vec<String> {
        std::fs::read_to_string(self.home.path().join("agent_runs"))
            .map(|s| s.lines().map(str::to_owned).collect())
            .unwrap_or_default()
    }

    /// A new process in the same home (after a kill or a stop).
    fn respawn(&mut self) {
        let _ = self.g.kill();
        let mut b = builder(&self.home).env(PW_ENV, PASSWORD);
        for (k, v) in &self.envs {
            b = b.env(*k, v.as_str());
        }
        self.g = b.spawn();
    }

    /// A gateway with `top`, then a `[cluster]` table with `cluster_keys` at its end.
    fn configure(
        home: &TempHome,
        name: &str,
        url: &str,
        top: &str,
        cluster_keys: &str,
        envs: &[(&str, String)],
    ) -> Gateway {
        gatewarden_testkit::api::write_config(
            home.path(),
            &format!(
                "{top}[cluster]\nname = \"{name}\"\nstore = \"{url}\"\npassword_env = \"{PW_ENV}\"\nlease_ttl_s = {}\nrenew_interval_s = {}\n{cluster_keys}",
                TTL.as_secs(),
                RENEW.as_secs()
            ),
        );
        let mut b = builder(home).env(PW_ENV, PASSWORD);
        for (k, v) in envs {
            b = b.env(*k, v.as_str());
        }
        b.spawn()
    }

    /// The API address once this process runs (standby or active).
    fn addr(&self) -> Option<SocketAddr> {
        let v = self.home.state_record()?;
        if v["pid"].as_u64()? != u64::from(self.g.pid()) || v["gateway_state"] != "running" {
            return None;
        }
        v["listen"].as_str()?.parse().ok()
    }

    fn api(&self) -> Option<Api> {
        self.addr().map(|a| Api::new(a).with_timeout(Duration::from_secs(2)))
    }

    /// The `cluster` object of `/v1/status`.
    fn cluster(&self) -> Option<Value> {
        let v = self.api()?.status()?;
        v.get("cluster").cloned()
    }

    fn role(&self) -> Option<String> {
        self.cluster().and_then(|c| c["role"].as_str().map(str::to_owned))
    }

    fn epoch(&self) -> Option<i64> {
        self.cluster().and_then(|c| c["epoch"].as_i64())
    }

    /// Waits until this node is a standby that knows the active's pid.
    #[track_caller]
    fn wait_standby_of(&mut self, active: u32, within: Duration) {
        let ok = wait_until(within, || {
            self.cluster().is_some_and(|c| c["role"] == "standby" && c["active"]["pid"] == u64::from(active))
        });
        assert!(
            ok,
            "pid {} not a standby of {active} within {within:?} (now {:?})\n{}",
            self.g.pid(),
            self.cluster(),
            self.g.diag()
        );
    }

    #[track_caller]
    fn wait_role(&mut self, role: &str, within: Duration) {
        let ok = wait_until(within, || self.role().as_deref() == Some(role));
        assert!(ok, "pid {} not {role} within {within:?} (now {:?})\n{}", self.g.pid(), self.cluster(), self.g.diag());
    }
}

/// Waits until exactly one node is active and every other live one is standby; its index.
#[track_caller]
fn wait_one_active(nodes: &mut [Node], within: Duration) -> usize {
    let mut active = None;
    let ok = wait_until(within, || {
        let roles: Vec<Option<String>> = nodes.iter().map(Node::role).collect();
        let act: Vec<usize> = (0..roles.len()).filter(|&i| roles[i].as_deref() == Some("active")).collect();
        let settled = roles.iter().all(|r| matches!(r.as_deref(), Some("active" | "standby")));
        active = act.first().copied();
        act.len() == 1 && settled
    });
    let diag: Vec<String> = nodes.iter().map(|n| format!("{:?}\n{}", n.cluster(), n.g.diag())).collect();
    assert!(ok, "no single active within {within:?}:\n{}", diag.join("\n"));
    active.unwrap_or_default()
}

/// The invariant, from the database's own history: epochs of `name` are 1..=n, strictly
/// increasing in grant time, one holder each (the primary key guarantees the last part; the
/// query proves no gap or reordering).
#[track_caller]
fn at_most_one_active_per_epoch(pg: &Cluster, name: &str) -> i64 {
    let rows = pg.sql(&format!(
        "SELECT count(*), count(DISTINCT epoch), coalesce(max(epoch), 0),
                count(*) FILTER (WHERE granted_at <= prev)
           FROM (SELECT epoch, granted_at, lag(granted_at) OVER (ORDER BY epoch) AS prev
                   FROM gw_lease_history WHERE name = '{name}') h"
    ));
    let v: Vec<i64> = rows.split('|').map(|x| x.parse().unwrap_or(-1)).collect();
    assert_eq!(v.len(), 4, "{rows}");
    assert_eq!(v[0], v[1], "an epoch granted twice: {rows}");
    assert_eq!(v[0], v[2], "epochs are not 1..=n: {rows}");
    assert_eq!(v[3], 0, "grant times not increasing with the epoch: {rows}");
    // No fenced write of an epoch committed after the next epoch was granted.
    let late = pg.sql(&format!(
        "SELECT count(*) FROM gw_events e JOIN gw_lease_history n ON n.name = e.name AND n.epoch = e.epoch + 1
          WHERE e.name = '{name}' AND e.at >= n.granted_at"
    ));
    assert_eq!(late, "0", "a write of an old epoch committed after a newer grant");
    v[2]
}

fn ledger_has(n: &Node, event: &str, pred: impl Fn(&Value) -> bool) -> bool {
    n.home.events(event).iter().any(pred)
}

#[test]
fn standby_refuses_intake_and_points_at_the_active_then_kill9_fails_over_within_ttl() {
    let Some(pg) = Cluster::start_or_skip() else { return };
    kill9_failover(&pg, "k9", &|| Node::spawn("k9", &pg.url()));
}

/// The same failover with the store over TLS (issue 16): PostgreSQL with `ssl = on` and a
/// certificate from a test CA, the URL on `sslmode=verify-full` by the name the certificate
/// carries, `[cluster] ca_file`; every gateway session is encrypted (`pg_stat_ssl`).
#[test]
fn kill9_fails_over_within_ttl_over_tls_verify_full() {
    use gatewarden_testkit::tls::{TestCa, Validity};
    let Some(pg) = Cluster::start_or_skip() else { return };
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("gatewarden store CA");
    let ca_file = ca.write_pem(dir.path(), "ca.pem");
    let leaf = ca.leaf(&["localhost"], Validity::Now);
    pg.enable_tls(&leaf.cert_pem, &leaf.key_pem);
    let url = format!("{}?sslmode=verify-full", pg.url_named("localhost"));
    let nodes = kill9_failover(&pg, "k9tls", &|| Node::spawn_ca("k9tls", &url, &ca_file));
    let sessions = pg.sql(
        "SELECT count(*) FILTER (WHERE s.ssl) || ' ' || count(*) FILTER (WHERE NOT s.ssl) \
         FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE a.application_name LIKE 'gatewarden pid %'",
    );
    let (tls, plain) = sessions.trim().split_once(' ').unwrap_or_default();
    assert!(tls.parse::<u32>().is_ok_and(|n| n >= 1) && plain == "0", "gateway sessions (tls plain): {sessions}");
    drop(nodes);
}

/// Two gateways from `spawn` in cluster `name`: the standby refuses intake and points at the
/// active, then the active is SIGKILLed and the standby takes over within the TTL. Returns the
/// nodes (the survivor still running).
fn kill9_failover(pg: &Cluster, name: &str, spawn: &dyn Fn() -> Node) -> Vec<Node> {
    let mut nodes = vec![spawn()];
    nodes[0].wait_role("active", READY);
    nodes.push(spawn());
    let a_pid = nodes[0].g.pid();
    nodes[1].wait_standby_of(a_pid, READY);
    let (a, b) = (0, 1);
    let a_addr = nodes[a].addr().unwrap();
    let epoch = nodes[a].epoch().unwrap();
    let api_a = nodes[a].api().unwrap();
    let api_b = nodes[b].api().unwrap();
    assert_eq!(api_a.readyz(), Some(200));
    assert_eq!(api_b.readyz(), Some(503), "a standby is not ready");
    // The standby answers the API with 503 and the active's address.
    let r = api_b.send("c1", "u1", "hello").unwrap();
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(
        header(&r, "x-gatewarden-active"),
        Some(a_addr.to_string().as_str()),
        "{:?} {} {:?}",
        r.headers,
        r.text(),
        nodes[b].cluster()
    );
    assert_eq!(r.json().unwrap()["error"]["type"], "standby");
    let c = nodes[b].cluster().unwrap();
    assert_eq!(c["active"]["pid"], u64::from(nodes[a].g.pid()));
    assert_eq!(c["active"]["home"], nodes[a].home.path().to_string_lossy().as_ref());
    assert_eq!(c["epoch"], epoch);
    assert!(c["active"]["since"].as_str().is_some_and(|s| s.ends_with('Z')), "{c}");
    // The active serves.
    let r = api_a.send("c1", "u1", "hello").unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let out = run_cli(&nodes[b].home, &["status"]);
    assert_cli(&out, 0, "status of the standby");
    let line = format!("cluster:     standby in {name} (epoch {epoch}); active: ");
    assert!(out.stdout.contains(&line), "{}", out.stdout);
    assert!(out.stdout.contains(&format!("pid {}", nodes[a].g.pid())), "{}", out.stdout);
    // `status --json` shows the same object.
    let out = run_cli(&nodes[a].home, &["status", "--json"]);
    assert_cli(&out, 0, "status");
    assert_eq!(out.json()["cluster"]["role"], "active");
    assert_eq!(out.json()["cluster"]["epoch"], epoch);
    assert_eq!(out.json()["cluster"]["journal"], format!("postgres cluster {name}"));

    nodes[a].g.kill();
    let killed = Instant::now();
    nodes[b].wait_role("active", TTL + Duration::from_secs(3));
    let took = killed.elapsed();
    eprintln!("kill -9 failover: {took:?}");
    assert!(
        took <= TTL + Duration::from_secs(1),
        "failover took {took:?} (TTL + 1 s = {:?})",
        TTL + Duration::from_secs(1)
    );
    assert!(nodes[b].epoch().unwrap() > epoch);
    assert_eq!(api_b.readyz(), Some(200));
    assert_eq!(api_b.send("c1", "u1", "again").unwrap().status, 200);
    assert_eq!(at_most_one_active_per_epoch(pg, name), epoch + 1);
    nodes
}

#[test]
fn a_paused_active_demotes_on_wake_and_the_fence_refuses_its_writes() {
    let Some(pg) = Cluster::start_or_skip() else { return };
    let mut nodes = vec![Node::spawn("stop", &pg.url())];
    nodes[0].wait_role("active", READY);
    nodes.push(Node::spawn("stop", &pg.url()));
    let a_pid = nodes[0].g.pid();
    nodes[1].wait_standby_of(a_pid, READY);
    let old = nodes[0].epoch().unwrap();
    let api_a = nodes[0].api().unwrap();
    nodes[0].g.signal(sig::SIGSTOP);
    let stopped = Instant::now();
    nodes[1].wait_role("active", TTL + Duration::from_secs(3));
    assert!(stopped.elapsed() <= TTL + Duration::from_secs(1), "takeover took {:?}", stopped.elapsed());
    let new = nodes[1].epoch().unwrap();
    assert!(new > old);
    nodes[0].g.signal(sig::SIGCONT);
    // On waking, the old active demotes (its deadline passed) and its last write under the
    // old epoch is refused by the store's fence.
    let fenced = wait_until(Duration::from_secs(10), || {
        ledger_has(&nodes[0], "cluster_demoted", |e| e["epoch"] == old && e["fence_refused"] == true)
    });
    assert!(
        fenced,
        "no fenced demotion in the old active's ledger:\n{}\n{}",
        nodes[0].home.ledger_text(),
        nodes[0].g.diag()
    );
    nodes[0].wait_role("standby", Duration::from_secs(5));
    assert_eq!(api_a.readyz(), Some(503));
    assert_eq!(api_a.send("c", "u", "x").unwrap().status, 503);
    assert_eq!(nodes[1].role().as_deref(), Some("active"));
    assert_eq!(
        pg.sql(&format!("SELECT count(*) FROM gw_events WHERE name = 'stop' AND epoch = {old} AND event = 'demoted'")),
        "0"
    );
    at_most_one_active_per_epoch(&pg, "stop");
}

/// A terminated backend is not a lost lease: the lease row is keyed by holder and epoch, not
/// by session, so the active reconnects at its next renewal and keeps its epoch (documented in
/// crates/cluster/README.md).
#[test]
fn a_terminated_store_connection_reconnects_holding_the_lease() {
    let Some(pg) = Cluster::start_or_skip() else { return };
    let mut nodes = vec![Node::spawn("term", &pg.url())];
    nodes[0].wait_role("active", READY);
    nodes.push(Node::spawn("term", &pg.url()));
    let a_pid = nodes[0].g.pid();
    nodes[1].wait_standby_of(a_pid, READY);
    let epoch = nodes[0].epoch().unwrap();
    let app = format!("gatewarden pid {}", nodes[0].g.pid());
    let backend = |pg: &Cluster| pg.sql(&format!("SELECT pid FROM pg_stat_activity WHERE application_name = '{app}'"));
    let before = backend(&pg);
    assert!(
        !before.is_empty(),
        "no session of the active: {}",
        pg.sql("SELECT string_agg(application_name || '=' || pid, ',') FROM pg_stat_activity")
    );
    assert_eq!(pg.sql(&format!("SELECT pg_terminate_backend({before})")), "t");
    let reconnected = wait_until(Duration::from_secs(5), || {
        let now = backend(&pg);
        !now.is_empty() && now != before
    });
    assert!(reconnected, "the active did not reconnect\n{}", nodes[0].g.diag());
    assert!(
        holds_for(TTL, || nodes[0].role().as_deref() == Some("active") && nodes[0].epoch() == Some(epoch)).is_ok(),
        "the active lost its lease after a reconnect: {:?}",
        nodes[0].cluster()
    );
    assert_eq!(nodes[1].role().as_deref(), Some("standby"));
    assert_eq!(at_most_one_active_per_epoch(&pg, "term"), epoch);
}

/// A store connection that stalls silently (a partition TCP does not notice): the active
/// demotes on its local deadline, before the database lets the standby take the lease.
#[test]
fn a_stalled_store_connection_demotes_the_active_before_the_standby_is_granted() {
    let Some(pg) = Cluster::start_or_skip() else { return };
    let proxy = Proxy::start(pg.addr());
    let mut nodes = vec![Node::spawn("stall", &pg.url_via(proxy.addr()))];
    nodes[0].wait_role("active", READY);
    nodes.push(Node::spawn("stall", &pg.url()));
    let a_pid = nodes[0].g.pid();
    nodes[1].wait_standby_of(a_pid, READY);
    let old = nodes[0].epoch().unwrap();
    proxy.set(ProxyMode::Stall);
    nodes[0].wait_role("standby", TTL + Duration::from_secs(2));
    nodes[1].wait_role("active", TTL + Duration::from_secs(3));
    // The ledger line follows the last (timed-out) fenced write; it carries when intake stopped.
    let mut ts = None;
    wait_until(Duration::from_secs(5), || {
        let demoted = nodes[0].home.events("cluster_demoted");
        ts = demoted.iter().find(|e| e["epoch"] == old).and_then(|e| e["demoted_at"].as_str()).map(str::to_owned);
        ts.is_some()
    });
    let ts = ts.unwrap_or_else(|| panic!("no demotion in the ledger:\n{}", nodes[0].home.ledger_text()));
    // Same host, same clock: the demotion (local) came before the grant (database clock).
    let before = pg.sql(&format!(
        "SELECT '{ts}'::timestamptz < granted_at FROM gw_lease_history WHERE name = 'stall' AND epoch = {}",
        old + 1
    ));
    assert_eq!(before, "t", "the standby was granted the lease before the old active demoted ({ts})");
    at_most_one_active_per_epoch(&pg, "stall");
}

#[test]
fn after_a_database_restart_one_gateway_is_active_again() {
    let Some(pg) = Cluster::start_or_skip() else { return };
    let mut nodes = vec![Node::spawn("dbr", &pg.url()), Node::spawn("dbr", &pg.url())];
    wait_one_active(&mut nodes, READY);
    pg.restart();
    // Both keep running; exactly one is active once the store is back.
    wait_one_active(&mut nodes, TTL * 3);
    assert!(nodes.iter_mut().all(|n| n.g.alive()));
    at_most_one_active_per_epoch(&pg, "dbr");
}

/// `gatewarden stop` of the active drains, then releases the lease: the standby takes over
/// within one renewal interval of the release.
#[test]
fn a_graceful_stop_hands_over_within_one_renewal_interval() {
    let Some(pg) = Cluster::start_or_skip() else { return };
    let mut nodes = vec![Node::spawn("grace", &pg.url())];
    nodes[0].wait_role("active", READY);
    nodes.push(Node::spawn("grace", &pg.url()));
    let a_pid = nodes[0].g.pid();
    nodes[1].wait_standby_of(a_pid, READY);
    let old = nodes[0].epoch().unwrap();
    let out = run_cli(&nodes[0].home, &["stop"]);
    assert_cli(&out, 0, "stop");
    nodes[0].g.wait_exit(EXIT);
    nodes[1].wait_role("active", TTL);
    assert!(ledger_has(&nodes[0], "cluster_released", |e| e["epoch"] == old), "{}", nodes[0].home.ledger_text());
    // The gap, by the database clock: from the release record to the next grant.
    let gap_ms: f64 = pg
        .sql(&format!(
            "SELECT extract(epoch FROM h.granted_at - e.at) * 1000 FROM gw_events e, gw_lease_history h
              WHERE e.name = 'grace' AND e.event = 'released' AND e.epoch = {old}
                AND h.name = 'grace' AND h.epoch = {}",
            old + 1
        ))
        .parse()
        .unwrap_or(f64::MAX);
    eprintln!("graceful handover gap: {gap_ms:.0} ms");
    // Standbys retry every 0.9 interval; the rest is query latency (allowed 0.2 s on a loaded
    // CI machine).
    assert!(gap_ms >= 0.0 && gap_ms <= RENEW.as_millis() as f64 + 200.0, "handover gap {gap_ms} ms");
    at_most_one_active_per_epoch(&pg, "grace");
}

/// A message's row in the cluster's journal: `state|finishes|attempts|reply` (finishes counts
/// running → done/failed transitions, so 1 means finished exactly once).
fn journal_row(pg: &Cluster, id: &str) -> String {
    pg.sql(&format!(
        "SELECT state || '|' || finishes || '|' || attempts || '|' || coalesce(reply, '') FROM gw_messages WHERE id = '{id}'"
    ))
}

/// Waits until `n` runs started on `node` (its slow agent's own record).
#[track_caller]
fn wait_runs(node: &Node, n: usize) {
    let ok = wait_until(READY, || node.runs().len() >= n);
    assert!(ok, "{n} run(s) not started on pid {}: {:?}\n{}", node.g.pid(), node.runs(), node.g.diag());
}

/// An async message accepted by the active, which is SIGKILLed mid-run: the standby becomes
/// active, recovers the interrupted run and completes it exactly once; the API of the new
/// active answers for a message the old one accepted.
#[test]
fn an_async_message_interrupted_by_kill9_is_done_once_by_the_successor() {
    let Some(pg) = Cluster::start_or_skip() else { return };
    let mut nodes = vec![Node::spawn_slow("jk9", &pg.url(), "A", 30.0, 1)];
    nodes[0].wait_role("active", READY);
    nodes.push(Node::spawn_slow("jk9", &pg.url(), "B", 0.2, 1));
    let a_pid = nodes[0].g.pid();
    nodes[1].wait_standby_of(a_pid, READY);
    let id = nodes[0].api().unwrap().submit("c1", "hello");
    wait_runs(&nodes[0], 1);
    assert_eq!(journal_row(&pg, &id), "running|0|1|");
    nodes[0].g.kill();
    nodes[1].wait_role("active", TTL + Duration::from_secs(3));
    let api_b = nodes[1].api().unwrap();
    let m = wait_final(&api_b, &id, Duration::from_secs(15));
    assert_eq!(
        (m["state"].as_str(), m["reply"].as_str(), m["attempts"].as_i64()),
        (Some("done"), Some("hello by B"), Some(2)),
        "{m}"
    );
    assert_eq!(journal_row(&pg, &id), "done|1|2|hello by B");
    assert_eq!(nodes[1].runs().len(), 1, "the successor ran it once");
    // The journal counts of /metrics are the cluster's (B's own home journal is empty).
    let metrics = api_b.get("/metrics").unwrap().text();
    assert!(metrics.contains("gatewarden_journal_messages{state=\"done\"} 1"), "{metrics}");
    at_most_one_active_per_epoch(&pg, "jk9");
}

/// Issue 29 §3: an HTTP conversation and a stored response made on the active are continued on
/// the standby after a kill -9: the history and the response chain live in the cluster's
/// journal, and `GET /v1/responses/{id}` answers on the successor.
#[test]
fn http_conversations_and_responses_continue_after_failover() {
    use gatewarden_testkit::llmfake::{FakeLlm, Reply};
    let Some(pg) = Cluster::start_or_skip() else { return };
    let llm = FakeLlm::start(Reply::text("later")).unwrap();
    llm.on("user", "on A", [Reply::text("answered on A")]);
    let top = format!(
        "[agent]\nbackend = \"openai\"\nretries = 0\ntimeout_s = 30\n[[agent.provider]]\nname = \"p\"\nbase_url = \"{}\"\nmodel = \"m\"\n",
        llm.base_url()
    );
    let mut nodes = vec![Node::spawn_with("hc", &pg.url(), &top)];
    nodes[0].wait_role("active", READY);
    nodes.push(Node::spawn_with("hc", &pg.url(), &top));
    let a_pid = nodes[0].g.pid();
    nodes[1].wait_standby_of(a_pid, READY);
    let api_a = nodes[0].api().unwrap().with_timeout(Duration::from_secs(30));
    let r = api_a.post_json("/v1/messages", &json!({"chat_id": "conv", "text": "message on A"})).unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let r = api_a.post_json("/v1/responses", &json!({"input": "response on A"})).unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let resp = r.json().unwrap()["id"].as_str().unwrap().to_owned();

    nodes[0].g.kill();
    nodes[1].wait_role("active", TTL + Duration::from_secs(3));
    let api_b = nodes[1].api().unwrap().with_timeout(Duration::from_secs(30));
    let got = api_b.get(&format!("/v1/responses/{resp}")).unwrap().json().unwrap();
    assert_eq!(
        (got["status"].as_str(), got["output"][0]["content"][0]["text"].as_str()),
        (Some("completed"), Some("answered on A")),
        "{got}"
    );
    let r = api_b.post_json("/v1/responses", &json!({"input": "response on B", "previous_response_id": resp})).unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let r = api_b.post_json("/v1/messages", &json!({"chat_id": "conv", "text": "message on B"})).unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    // What the provider was asked on B: the turn made on A first.
    let history = |text: &str| -> Vec<String> {
        let asked = llm.asked(text);
        assert_eq!(asked.len(), 1, "{text}");
        asked[0].body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|m| m["content"].as_str().map(str::to_owned))
            .collect()
    };
    assert_eq!(history("response on B"), ["response on A", "answered on A", "response on B"]);
    assert_eq!(history("message on B"), ["message on A", "answered on A", "message on B"]);
    at_most_one_active_per_epoch(&pg, "hc");
}

/// Messages accepted before a graceful stop whose runs the drain cut short are run again by
/// the successor (once each), as the SQLite journal does across a restart.
#[test]
fn messages_accepted_before_a_graceful_stop_are_done_by_the_successor() {
    let Some(pg) = Cluster::start_or_skip() else { return };
    let mut nodes = vec![Node::spawn_slow("jgr", &pg.url(), "A", 30.0, 1)];
    nodes[0].wait_role("active", READY);
    nodes.push(Node::spawn_slow("jgr", &pg.url(), "B", 0.2, 1));
    let a_pid = nodes[0].g.pid();
    nodes[1].wait_standby_of(a_pid, READY);
    let api_a = nodes[0].api().unwrap();
    let ids: Vec<String> = (0..3).map(|i| api_a.submit("c1", &format!("m{i}"))).collect();
    wait_runs(&nodes[0], 3);
    assert_cli(&run_cli(&nodes[0].home, &["stop"]), 0, "stop");
    nodes[0].g.wait_exit(EXIT);
    nodes[1].wait_role("active", TTL);
    let api_b = nodes[1].api().unwrap();
    for (i, id) in ids.iter().enumerate() {
        let m = wait_final(&api_b, id, Duration::from_secs(15));
        assert_eq!(m["reply"].as_str(), Some(format!("m{i} by B").as_str()), "{m}");
        assert_eq!(journal_row(&pg, id), format!("done|1|2|m{i} by B"));
    }
    assert_eq!(nodes[1].runs().len(), 3);
    at_most_one_active_per_epoch(&pg, "jgr");
}

/// A paused active's run finishes while it is stopped; meanwhile the successor re-ran and
/// completed the message. On waking, the old active's completion is refused (it demotes, the
/// store's fence refusing its writes) and the row keeps the successor's one completion.
#[test]
fn a_paused_old_actives_completion_is_refused() {
    let Some(pg) = Cluster::start_or_skip() else { return };
    let mut nodes = vec![Node::spawn_slow("jps", &pg.url(), "A", 1.0, 1)];
    nodes[0].wait_role("active", READY);
    nodes.push(Node::spawn_slow("jps", &pg.url(), "B", 0.2, 1));
    let a_pid = nodes[0].g.pid();
    nodes[1].wait_standby_of(a_pid, READY);
    let old = nodes[0].epoch().unwrap();
    let id = nodes[0].api().unwrap().submit("c1", "hello");
    wait_runs(&nodes[0], 1);
    nodes[0].g.signal(sig::SIGSTOP);
    nodes[1].wait_role("active", TTL + Duration::from_secs(3));
    let m = wait_final(&nodes[1].api().unwrap(), &id, Duration::from_secs(15));
    assert_eq!(m["reply"].as_str(), Some("hello by B"), "{m}");
    nodes[0].g.signal(sig::SIGCONT);
    let refused = wait_until(Duration::from_secs(10), || {
        ledger_has(&nodes[0], "cluster_demoted", |e| e["epoch"] == old)
            && nodes[0].g.stderr().contains("journal update failed: journal store: fenced")
    });
    assert!(
        refused,
        "the old active's completion was not refused:\n{}\n{}",
        nodes[0].home.ledger_text(),
        nodes[0].g.diag()
    );
    assert_eq!(journal_row(&pg, &id), "done|1|2|hello by B");
    at_most_one_active_per_epoch(&pg, "jps");
}

/// The chaos test's steady load, driven against whichever gateway is active: a sync message
/// and an async one per visit. Accepted async ids are recorded for the end's invariant. Beside
/// it, users write to the Telegram bot at a steady pace whoever is active ([`users`]), checked
/// by [`Load::check_telegram`].
#[derive(Default)]
struct Load {
    /// The fake Bot API and the bot's token, when the gateways run a Telegram adapter.
    telegram: Option<(std::sync::Arc<FakeTelegram>, String)>,
    /// What users wrote: `(update_id, chat, text)`, every text distinct.
    injected: Vec<(i64, i64, String)>,
    served: u64,
    refused: u64,
    /// Async messages answered 202: each must end exactly once.
    accepted: Vec<String>,
    /// Why async messages were refused (a standby's 503, a store error's 500, a timeout).
    async_refused: Vec<String>,
    /// How many async messages were accepted so far, for the fault loop to wait on.
    progress: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Load {
    fn visit(&mut self, api: &Api) {
        match api.send("load", "u", "ping").map(|r| r.status) {
            Ok(200) => self.served += 1,
            _ => self.refused += 1,
        }
        let n = self.accepted.len();
        match api.send_async("load-async", "u", &format!("a{n}")) {
            Ok(r) if r.status == 202 => match r.json().ok().and_then(|v| v["message_id"].as_str().map(str::to_owned)) {
                Some(id) => {
                    self.accepted.push(id);
                    self.progress.store(self.accepted.len(), std::sync::atomic::Ordering::Relaxed);
                }
                None => panic!("a 202 without a message id: {}", r.text()),
            },
            Ok(r) => self.async_refused.push(format!("{} {}", r.status, r.text())),
            Err(e) => self.async_refused.push(e.to_string()),
        }
    }

    /// No inbound Telegram message lost or run twice: every injected one is journalled once
    /// (its `update_id` is the event id) and ends once, like an async message: done by one
    /// completion (`finishes = 1`) with its echo in the fake's sent messages for its chat, or
    /// failed by recovery after two interrupted runs (`MAX_ATTEMPTS`, crates/cluster/README.md; its chat gets the failure notice instead). A reply sent more than once is the documented duplicate (the
    /// Bot API takes no idempotency key, so a gateway that dies between `sendMessage` and the
    /// outbox commit has it sent again by its successor): at most `crashes` of them.
    /// Returns `(answered, given up, duplicate replies)`.
    #[track_caller]
    fn check_telegram(
        &self,
        pg: &Cluster,
        name: &str,
        seed: u64,
        crashes: usize,
        diag: &dyn Fn() -> String,
    ) -> (usize, usize, usize) {
        let Some((fake, token)) = &self.telegram else { return (0, 0, 0) };
        let n = self.injected.len();
        assert!(n > 0, "no Telegram message injected (seed {seed})");
        let ids = self.injected.iter().map(|(id, _, _)| format!("'{id}'")).collect::<Vec<_>>().join(",");
        let rows = |filter: &str| {
            pg.sql(&format!(
                "SELECT coalesce(string_agg(platform || '/' || event_id || ' ' || id || ' ' || state || ' finishes ' || finishes
                                            || ' attempts ' || attempts || ' reason ' || coalesce(reason, '-')
                                            || ' epoch ' || epoch, '; '), 'none')
                   FROM gw_messages WHERE name = '{name}' AND event_id IN ({ids}) AND ({filter})"
            ))
        };
        // Every update is fetched, journalled and settled (the last ones after the chaos).
        let settled = || {
            pg.sql(&format!(
                "SELECT count(*) FROM gw_messages WHERE name = '{name}' AND event_id IN ({ids}) AND state IN ('done', 'failed')"
            ))
        };
        let ok = wait_until(Duration::from_secs(30), || settled() == n.to_string());
        assert!(
            ok,
            "{} of {n} Telegram messages journalled and settled (seed {seed}); unsettled: {}; fake: {:?}\n{}",
            settled(),
            rows("state NOT IN ('done', 'failed')"),
            fake.stats(token),
            diag()
        );
        let summary = pg.sql(&format!(
            "SELECT count(DISTINCT event_id), count(*),
                    count(*) FILTER (WHERE state = 'done' AND finishes = 1
                                        OR state = 'failed' AND finishes = 0 AND attempts = 2 AND reason = 'interrupted twice')
               FROM gw_messages WHERE name = '{name}' AND event_id IN ({ids})"
        ));
        assert_eq!(
            summary,
            format!("{n}|{n}|{n}"),
            "injected {n}: journalled|rows|ended once (seed {seed}); not once: {}\n{}",
            rows(&format!(
                "NOT (state = 'done' AND finishes = 1
                      OR state = 'failed' AND finishes = 0 AND attempts = 2 AND reason = 'interrupted twice')
                 OR event_id IN (SELECT event_id FROM gw_messages WHERE name = '{name}' GROUP BY event_id HAVING count(*) > 1)"
            )),
            diag()
        );
        let done = pg.sql(&format!(
            "SELECT coalesce(string_agg(event_id, ','), '') FROM gw_messages WHERE name = '{name}' AND event_id IN ({ids}) AND state = 'done'"
        ));
        let done: std::collections::BTreeSet<&str> = done.split(',').filter(|s| !s.is_empty()).collect();
        let answer: Vec<&(i64, i64, String)> =
            self.injected.iter().filter(|(id, _, _)| done.contains(id.to_string().as_str())).collect();
        let given_up = n - answer.len();
        // A message given up is told to its chat (the journal's failure notice), once per message.
        let notice = gatewarden_journal::failure_notice("interrupted twice");
        let mut owed: std::collections::BTreeMap<i64, usize> = Default::default();
        for (_, chat, _) in self.injected.iter().filter(|(id, _, _)| !done.contains(id.to_string().as_str())) {
            *owed.entry(*chat).or_default() += 1;
        }
        // How many times each (chat, text) was sent.
        let tally = |sent: &[gatewarden_telegram_fake::SentMessage]| {
            let mut t: std::collections::HashMap<(String, String), usize> = Default::default();
            for m in sent {
                *t.entry((m.chat_id.to_string(), m.text.clone())).or_default() += 1;
            }
            t
        };
        let count = |t: &std::collections::HashMap<(String, String), usize>, chat: i64, text: &str| {
            t.get(&(chat.to_string(), text.to_owned())).copied().unwrap_or(0)
        };
        let sent = fake
            .wait_sent(token, Duration::from_secs(30), |sent| {
                let t = tally(sent);
                answer.iter().all(|(_, chat, text)| count(&t, *chat, text) > 0)
                    && owed.iter().all(|(chat, n)| count(&t, *chat, &notice) >= *n)
            })
            .map(|sent| tally(&sent))
            .unwrap_or_else(|sent| {
                let t = tally(&sent);
                let missing: Vec<_> = answer.iter().filter(|(_, chat, text)| count(&t, *chat, text) == 0).collect();
                let untold: Vec<_> = owed.iter().filter(|(chat, n)| count(&t, **chat, &notice) < **n).collect();
                panic!(
                    "{} of {} done Telegram messages never answered, chats owed a failure notice {untold:?} (seed {seed}): {missing:?}\noutbox: {}\n{}",
                    missing.len(),
                    answer.len(),
                    pg.sql(&format!(
                        "SELECT coalesce(string_agg(chat_id || ' ' || text || ' ' || state || ' epoch ' || epoch, '; '), 'none')
                           FROM gw_outbox WHERE name = '{name}' AND state <> 'sent'"
                    )),
                    diag()
                )
            });
        if given_up > 0 {
            eprintln!("chaos: Telegram messages given up after two interrupted runs: {}", rows("state = 'failed'"));
        }
        let dups: Vec<(i64, &str, usize)> = self
            .injected
            .iter()
            .map(|(_, chat, text)| (*chat, text.as_str(), count(&sent, *chat, text)))
            .filter(|(_, _, c)| *c > 1)
            .collect();
        let extra: usize = dups.iter().map(|(_, _, c)| c - 1).sum();
        eprintln!("chaos: duplicate Telegram replies (chat, text, times sent): {dups:?}");
        assert!(
            extra <= crashes,
            "{extra} duplicate replies, more than one per lost lease ({crashes} faults) allows (seed {seed}): {dups:?}\n{}",
            diag()
        );
        (answer.len(), given_up, extra)
    }

    /// Every accepted async message is in the cluster's journal once and ends exactly once:
    /// done or failed by one completion, or failed by recovery after two interrupted runs.
    #[track_caller]
    fn check(&self, pg: &Cluster, name: &str, seed: u64) {
        assert!(!self.accepted.is_empty(), "no async message was accepted (seed {seed})");
        let ids = self.accepted.iter().map(|id| format!("'{id}'")).collect::<Vec<_>>().join(",");
        let unfinished = || {
            pg.sql(&format!(
                "SELECT count(*) FROM gw_messages WHERE name = '{name}' AND id IN ({ids}) AND state IN ('queued', 'running')"
            ))
        };
        let settled = wait_until(Duration::from_secs(30), || unfinished() == "0");
        assert!(
            settled,
            "{} accepted message(s) never finished (seed {seed}): {}; lease: {}",
            unfinished(),
            pg.sql(&format!(
                "SELECT string_agg(id || ' ' || state || ' ' || coalesce(incarnation, '-') || ' attempts ' || attempts
                                   || ' epoch ' || epoch || ' at ' || updated_at, '; ')
                   FROM gw_messages WHERE name = '{name}' AND id IN ({ids}) AND state IN ('queued', 'running')"
            )),
            pg.sql(&format!("SELECT epoch || ' ' || holder_id FROM gw_lease WHERE name = '{name}'"))
        );
        let summary = pg.sql(&format!(
            "SELECT count(*), count(*) FILTER (WHERE state IN ('done', 'failed')),
                    count(*) FILTER (WHERE finishes = 1 OR (finishes = 0 AND reason = 'interrupted twice')),
                    count(*) FILTER (WHERE attempts > 2)
               FROM gw_messages WHERE name = '{name}' AND id IN ({ids})"
        ));
        let n = self.accepted.len();
        assert_eq!(summary, format!("{n}|{n}|{n}|0"), "accepted {n}: found|final|finished once|over-run (seed {seed})");
    }
}

/// Seeded chaos: random kills, pauses, store partitions and graceful stops of the active
/// under a steady sync and async load ([`Load`]). `GW_CHAOS_SEED` replays a run,
/// `GW_CHAOS_STEPS` lengthens it (scripts/soak-cluster). Invariants: after every fault exactly
/// one gateway is active again within a bound; no epoch was ever seen active on two gateways
/// (sampled every few ms from their own status); the database's grant history has one holder
/// per epoch; and every accepted async message is done exactly once, none lost.
#[test]
fn chaos_seeded() {
    let Some(pg) = Cluster::start_or_skip() else { return };
    let seed: u64 = std::env::var("GW_CHAOS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    });
    let steps: usize = std::env::var("GW_CHAOS_STEPS").ok().and_then(|s| s.parse().ok()).unwrap_or(5);
    eprintln!("chaos: GW_CHAOS_SEED={seed} GW_CHAOS_STEPS={steps}");
    let mut rng = seed | 1;
    let mut next = move |n: u64| {
        // xorshift64: enough for picking faults, and replayable.
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let proxies: Vec<Proxy> = (0..3).map(|_| Proxy::start(pg.addr())).collect();
    // One bot for the whole cluster; each gateway polls it as its own consumer `n<i>`.
    let fake = std::sync::Arc::new(
        FakeTelegram::start(Options { linger: Duration::from_millis(800), ..Options::default() })
            .expect("fake Bot API"),
    );
    let token = format!("{}:chaos-{seed}", std::process::id());
    let mut nodes: Vec<Node> = proxies
        .iter()
        .enumerate()
        .map(|(i, p)| {
            Node::spawn_telegram("chaos", &pg.url_via(p.addr()), &format!("{}/c/n{i}", fake.base_url()), &token)
        })
        .collect();
    wait_one_active(&mut nodes, READY);

    // Sampler and load: every few ms, each home's status; any active answers a sync message.
    let homes: Vec<std::path::PathBuf> = nodes.iter().map(|n| n.home.path().to_path_buf()).collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let progress = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let sampler = {
        let stop = std::sync::Arc::clone(&stop);
        let progress = std::sync::Arc::clone(&progress);
        let (fake, token) = (std::sync::Arc::clone(&fake), token.clone());
        std::thread::spawn(move || {
            let mut seen: std::collections::BTreeMap<i64, std::collections::BTreeSet<String>> = Default::default();
            let mut load = Load { progress, telegram: Some((fake, token)), ..Load::default() };
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for h in &homes {
                    let Some(addr) = gatewarden_testkit::api::current_gateway(h).and_then(|g| g.3) else { continue };
                    let api = Api::new(addr).with_timeout(Duration::from_millis(300));
                    let Some(c) = api.status().and_then(|v| v.get("cluster").cloned()) else { continue };
                    if c["role"] == "active"
                        && let Some(e) = c["epoch"].as_i64()
                    {
                        seen.entry(e).or_default().insert(h.display().to_string());
                        load.visit(&api);
                    }
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            (seen, load)
        })
    };

    let users = users(std::sync::Arc::clone(&fake), token.clone(), std::sync::Arc::clone(&stop));

    // How many of each fault: kill -9, pause, stall, drop, stop.
    let mut faults = [0usize; 5];
    for step in 0..steps {
        let a = wait_one_active(&mut nodes, TTL * 4);
        // Each active takes some of the load before its fault: a healthy active with a healthy
        // store accepts async messages.
        let before = progress.load(std::sync::atomic::Ordering::Relaxed);
        let took = wait_until(Duration::from_secs(5), || progress.load(std::sync::atomic::Ordering::Relaxed) > before);
        assert!(took, "step {step}: the active accepted no async message within 5 s (seed {seed})");
        let fault = next(5);
        faults[fault as usize] += 1;
        eprintln!("chaos step {step}: fault {fault} on node {a} at {:.3}", secs_now());
        let hold = Duration::from_millis(1000 + next(3500));
        match fault {
            0 => {
                nodes[a].g.kill();
                nodes[a].respawn();
            }
            1 => {
                // A pause, as long as a GC stall or a frozen VM: a chaos fault, not a wait.
                nodes[a].g.signal(sig::SIGSTOP);
                std::thread::sleep(hold);
                nodes[a].g.signal(sig::SIGCONT);
            }
            2 => {
                proxies[a].set(ProxyMode::Stall);
                std::thread::sleep(hold);
                proxies[a].set(ProxyMode::Pass);
            }
            3 => {
                proxies[a].set(ProxyMode::Drop);
                std::thread::sleep(Duration::from_millis(100 + next(400)));
                proxies[a].set(ProxyMode::Pass);
            }
            _ => {
                assert_cli(&run_cli(&nodes[a].home, &["stop"]), 0, "stop");
                nodes[a].g.wait_exit(EXIT);
                nodes[a].respawn();
            }
        }
    }
    wait_one_active(&mut nodes, TTL * 4);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (seen, mut load) = sampler.join().expect("sampler");
    load.injected = users.join().expect("users");
    eprintln!(
        "chaos: served {}, refused {}, async accepted {}, epochs seen active: {seen:?}; async refused: {:?}",
        load.served,
        load.refused,
        load.accepted.len(),
        load.async_refused
    );
    for (e, homes) in &seen {
        assert_eq!(homes.len(), 1, "epoch {e} seen active on {homes:?} (seed {seed})");
    }
    at_most_one_active_per_epoch(&pg, "chaos");
    load.check(&pg, "chaos", seed);
    // A reply can be sent again only when its active lost the lease between `sendMessage` and
    // the outbox commit: killed, paused, or cut off from the store (a stall, or a drop that
    // outlasted its deadline). A graceful stop records before it releases.
    let diag = || nodes.iter().map(|n| n.g.diag()).collect::<Vec<_>>().join("\n");
    let crashes = faults[..4].iter().sum();
    let (answered, given_up, dups) = load.check_telegram(&pg, "chaos", seed, crashes, &diag);
    let polls = fake.polls(&token);
    let overlaps = overlapping_polls(&polls);
    eprintln!(
        "chaos summary (GW_CHAOS_SEED={seed}): faults kill/pause/stall/drop/stop {faults:?}; telegram injected {}, \
         answered {answered}, given up {given_up}, duplicate replies {dups}, polls {}, 409s {}, overlapping polls {}",
        load.injected.len(),
        polls.len(),
        polls.iter().filter(|p| p.conflict).count(),
        overlaps.len()
    );
    if std::env::var_os("GW_CHAOS_POLLS").is_some() {
        let t0 = polls.first().map_or(std::time::UNIX_EPOCH, |p| p.start);
        let at = |t: std::time::SystemTime| t.duration_since(t0).unwrap_or_default().as_secs_f64();
        for p in &polls {
            eprintln!(
                "poll {} {:.3}..{:?} timeout {} conflict {}",
                p.consumer,
                at(p.start),
                p.end.map(at),
                p.timeout_s,
                p.conflict
            );
        }
        eprintln!("t0 {:.3}\n{}", t0.duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs_f64(), diag());
    }
    assert!(overlaps.is_empty(), "polls of two gateways overlapped (seed {seed}): {overlaps:#?}");
}

/// Users writing to the bot until `stop`: one message every [`TG_PACE`] (a load generator's
/// pace, not a wait), over [`TG_CHATS`] chats, texts `tg<n>`; returns `(update_id, chat, text)`.
fn users(
    fake: std::sync::Arc<FakeTelegram>,
    token: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<Vec<(i64, i64, String)>> {
    std::thread::spawn(move || {
        let mut injected = Vec::new();
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let n = injected.len();
            let chat = 100 + (n % TG_CHATS) as i64;
            let text = format!("tg{n}");
            let id = fake.inject(&token, chat, 7, &text);
            injected.push((id, chat, text));
            std::thread::sleep(TG_PACE);
        }
        injected
    })
}

fn secs_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs_f64()
}

/// Pairs of `getUpdates` from different consumers (gateways) that were in flight at the same
/// time on the Bot API's side. crates/cluster/README.md ("What cannot be fenced") claims none: every
/// poll of an active ends before its lease can expire, and a successor is granted only after
/// that expiry, so the duplicate poll window is about updates fetched twice, never two polls at
/// once. A poll still in flight counts as ending now.
fn overlapping_polls(polls: &[PollRecord]) -> Vec<(&PollRecord, &PollRecord)> {
    let now = std::time::SystemTime::now();
    let end = |p: &PollRecord| p.end.unwrap_or(now);
    let mut out = Vec::new();
    for (i, a) in polls.iter().enumerate() {
        for b in &polls[i + 1..] {
            if a.consumer != b.consumer && a.start < end(b) && b.start < end(a) {
                out.push((a, b));
            }
        }
    }
    out
}

/// Failover times (scripts/bench-cluster; ignored in the normal suite): kill -9, a pause past
/// the TTL, and a graceful stop of the active, `GW_BENCH_ROUNDS` each, TTL 3 s, renewal 1 s.
/// Measured from the fault to the other gateway's status saying `active`.
#[test]
#[ignore = "benchmark: scripts/bench-cluster"]
fn bench_failover() {
    let Some(pg) = Cluster::start_or_skip() else { return };
    let rounds: usize = std::env::var("GW_BENCH_ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(10);
    let mut nodes = vec![Node::spawn("bench", &pg.url()), Node::spawn("bench", &pg.url())];
    for kind in ["kill -9", "pause", "graceful"] {
        let mut times = Vec::new();
        for _ in 0..rounds {
            let a = wait_one_active(&mut nodes, TTL * 4);
            let b = 1 - a;
            let a_pid = nodes[a].g.pid();
            nodes[b].wait_standby_of(a_pid, READY);
            let t0 = Instant::now();
            match kind {
                "kill -9" => {
                    nodes[a].g.kill();
                }
                "pause" => nodes[a].g.signal(sig::SIGSTOP),
                _ => {
                    assert_cli(&run_cli(&nodes[a].home, &["stop"]), 0, "stop");
                }
            }
            nodes[b].wait_role("active", TTL * 3);
            times.push(t0.elapsed());
            match kind {
                "pause" => nodes[a].g.signal(sig::SIGCONT),
                _ => {
                    nodes[a].g.wait_exit(EXIT);
                    nodes[a].respawn();
                }
            }
        }
        times.sort();
        let pct = |p: f64| times[((times.len() as f64 - 1.0) * p).round() as usize].as_millis();
        println!(
            "bench-cluster failover ({kind}, ttl {}s, renew {}s, {rounds} rounds): p50 {} ms, p99 {} ms, max {} ms",
            TTL.as_secs(),
            RENEW.as_secs(),
            pct(0.5),
            pct(0.99),
            times.last().map_or(0, Duration::as_millis)
        );
    }
    at_most_one_active_per_epoch(&pg, "bench");
}

/// Seconds since midnight UTC of a protocol timestamp (`2026-11-30T19:30:00.123456+00:00`).
fn day_seconds(ts: &str) -> Option<f64> {
    let t = ts.get(11..26)?;
    let (h, m, s) =
        (t.get(0..2)?.parse::<f64>().ok()?, t.get(3..5)?.parse::<f64>().ok()?, t.get(6..)?.parse::<f64>().ok()?);
    Some(h * 3600.0 + m * 60.0 + s)
}

/// Per-message journal cost through the real gateway (scripts/bench-cluster; ignored in the
/// normal suite): the same async load (`GW_BENCH_MESSAGES` messages from 4 client threads,
/// echo agent) against one gateway on the home's SQLite journal and one active on the
/// cluster's PostgreSQL journal. Reports the 202's latency, accepted → done per message (the
/// journal's own timestamps) and the throughput until the last one is done.
#[test]
#[ignore = "benchmark: scripts/bench-cluster"]
fn bench_journal() {
    let Some(pg) = Cluster::start_or_skip() else { return };
    let total: usize = std::env::var("GW_BENCH_MESSAGES").ok().and_then(|s| s.parse().ok()).unwrap_or(400);
    let threads = 4;
    for store in ["sqlite", "postgres"] {
        let node = match store {
            "postgres" => {
                let mut n = Node::spawn("benchj", &pg.url());
                n.wait_role("active", READY);
                n
            }
            _ => {
                let home = TempHome::new();
                let mut g = builder(&home).spawn();
                g.wait_ready(READY);
                Node { home, g, envs: Vec::new() }
            }
        };
        let addr = node.home.state_record().and_then(|v| v["listen"].as_str()?.parse().ok()).expect("listen");
        let t0 = Instant::now();
        let clients: Vec<_> = (0..threads)
            .map(|t| {
                std::thread::spawn(move || {
                    let api = Api::new(addr).with_timeout(Duration::from_secs(10));
                    let mut out = Vec::new();
                    for i in 0..total / threads {
                        let sent = Instant::now();
                        let id = api.submit(&format!("c{t}"), &format!("m{i}"));
                        out.push((id, sent.elapsed()));
                    }
                    out
                })
            })
            .collect();
        let accepted: Vec<(String, Duration)> = clients.into_iter().flat_map(|c| c.join().expect("client")).collect();
        let api = Api::new(addr).with_timeout(Duration::from_secs(10));
        let mut e2e = Vec::new();
        for (id, _) in &accepted {
            let m = work_common::wait_final(&api, id, Duration::from_secs(60));
            assert_eq!(m["state"], "done", "{m}");
            let (a, b) =
                (m["created_at"].as_str().and_then(day_seconds), m["updated_at"].as_str().and_then(day_seconds));
            if let (Some(a), Some(b)) = (a, b) {
                e2e.push(((b - a).rem_euclid(86_400.0) * 1000.0).max(0.0));
            }
        }
        let took = t0.elapsed();
        let mut lat: Vec<f64> = accepted.iter().map(|(_, d)| d.as_secs_f64() * 1000.0).collect();
        lat.sort_by(f64::total_cmp);
        e2e.sort_by(f64::total_cmp);
        let pct = |v: &[f64], p: f64| v.get(((v.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or(f64::NAN);
        println!(
            "bench-cluster journal ({store}, {total} async messages, {threads} clients, echo agent): {:.0} msg/s to done; \
             202 p50 {:.1} ms p99 {:.1} ms; accepted→done p50 {:.1} ms p99 {:.1} ms",
            accepted.len() as f64 / took.as_secs_f64(),
            pct(&lat, 0.5),
            pct(&lat, 0.99),
            pct(&e2e, 0.5),
            pct(&e2e, 0.99)
        );
    }
}
