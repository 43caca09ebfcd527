//! Issue 28: the image (the repository's Containerfile) in a real container runtime: Debian's
//! podman with runc (`scripts/setup-podman`, `testkit::podman`). The image is built once per
//! test binary with the debug build CI already made (`--build-arg BINARY=prebuilt`).
//!
//! Each test prints what it measured (`[container] …`: image size, idle memory, stop time) for
//! the README's table.
#![cfg(target_os = "linux")]

mod common;
use common::*;
use gatewarden_testkit::api::Api;
use gatewarden_testkit::podman::{Container, Podman};
use std::time::{Duration, Instant};

const TOKEN: &str = "t0k-container-0123456789abcdef";
const READY: Duration = Duration::from_secs(60);

/// The image and podman, or `None` (reported; a failure under CI) without podman.
fn image() -> Option<(Podman, String)> {
    let p = Podman::get()?;
    let image = p.image(std::path::Path::new(bin()));
    Some((p, image))
}

/// A container of the image publishing 7878 on a free loopback port, with the API token and
/// `extra` podman arguments; returns once `/readyz` answers 200.
fn start(p: &Podman, image: &str, extra: &[&str]) -> (Container, Api) {
    let token = format!("GATEWARDEN_API_TOKEN={TOKEN}");
    let mut args = vec!["-p", "127.0.0.1::7878", "-e", token.as_str()];
    args.extend_from_slice(extra);
    let c = Container::run(p, &args, image, &["run"]);
    let api = wait_ready(&c);
    (c, api)
}

#[track_caller]
fn wait_ready(c: &Container) -> Api {
    let mut api = None;
    let ok = wait_until(READY, || {
        let a = Api::new(c.addr()).with_token(TOKEN);
        let ready = a.readyz() == Some(200);
        api = Some(a);
        ready
    });
    assert!(ok, "the container never answered /readyz 200:\n{}", c.logs());
    api.expect("an address")
}

fn status(c: &Container) -> Value {
    let out = c.exec(&["gatewarden", "status", "--json"]);
    serde_json::from_str(out.stdout.trim()).unwrap_or(Value::Null)
}

fn history(c: &Container, event: &str) -> Vec<Value> {
    let out = c.exec(&["gatewarden", "history", "--json", "-n", "500"]);
    out.stdout.lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()).filter(|v| v["event"] == event).collect()
}

/// The lifecycle in a container: ready, `restart` inside it (re-executed in place as PID 1),
/// the healthcheck through the binary, `podman stop` (exit 0 within the grace time, the ledger
/// shows the runtime's stop, and it is no durable stop: the next `podman start` runs), then
/// `podman restart`.
#[test]
fn the_image_runs_restarts_and_stops_as_the_runtime_asks() {
    let Some((p, image)) = image() else { return };
    let size: u64 = p.ok(&["image", "inspect", "--format", "{{.Size}}", &image]).trim().parse().unwrap_or(0);
    eprintln!("[container] image size (debug binary): {:.1} MB", size as f64 / 1e6);
    let (c, api) = start(&p, &image, &[]);
    let st = status(&c);
    assert_eq!((st["pid"].clone(), st["supervisor"].clone()), (json!(1), json!("container")), "{st:#}");
    let user = c.exec(&["id", "-u"]);
    assert_eq!(user.stdout.trim(), "10001", "a non-root user: {user:?}");
    let rss = c.exec(&["sh", "-c", "grep VmRSS /proc/1/status"]);
    eprintln!("[container] idle memory of PID 1 (debug build): {}", rss.stdout.trim());

    // restart inside the container: same PID 1, a new incarnation, the same port.
    let old = st["incarnation"].as_str().unwrap_or_default().to_owned();
    let r = c.exec(&["gatewarden", "restart", "--timeout", "60"]);
    assert!(r.ok(), "restart in the container: {r:#?}");
    let st = status(&c);
    assert_eq!(st["pid"], json!(1), "{st:#}");
    assert_ne!(st["incarnation"].as_str(), Some(old.as_str()), "{st:#}");
    assert_eq!(api.readyz(), Some(200));
    let health = p.run(&["healthcheck", "run", &c.name]).expect("healthcheck");
    assert!(health.ok(), "the HEALTHCHECK (gatewarden status): {health:#?}");

    // podman stop: the runtime's SIGTERM.
    let t0 = Instant::now();
    p.ok(&["stop", "-t", "10", &c.name]);
    let took = t0.elapsed();
    eprintln!("[container] podman stop took {:.2} s", took.as_secs_f64());
    assert_eq!(c.inspect("{{.State.ExitCode}}"), "0", "{}", c.logs());
    assert!(took < Duration::from_secs(10), "within the grace time: {took:?}");
    // Not a durable stop: the next start of the container runs.
    p.ok(&["start", &c.name]);
    let api = wait_ready(&c);
    let stops = history(&c, "stop_requested");
    assert!(stops.iter().any(|s| s["by"] == "container runtime" && s["reason"] == "owner_stop"), "{stops:#?}");
    let exited = history(&c, "exited");
    assert!(
        exited.iter().any(|e| e["code"] == 0 && e["reason"].as_str().is_some_and(|r| r.contains("container runtime"))),
        "{exited:#?}"
    );

    // podman restart: stop (the same way) and start.
    let before = status(&c)["incarnation"].clone();
    p.ok(&["restart", "-t", "10", &c.name]);
    let api2 = wait_ready(&c);
    assert_ne!(status(&c)["incarnation"], before);
    assert_eq!(api2.send("c", "u", "hello").map(|r| r.status).ok(), Some(200));
    drop(api);
}

/// SIGKILL to the container's init under `--restart=on-failure`: the runtime revives the
/// container, and every async message accepted before the kill is done once after it, from the
/// volume. The SIGKILL is sent to PID 1's host pid (what an OOM kill or a crash looks like):
/// podman 4.3 counts its own `podman kill` as a stop by the user, which no restart policy
/// revives (`podman kill` then `podman start` is the same test with one more step).
#[test]
fn a_killed_container_is_revived_and_loses_nothing() {
    let Some((p, image)) = image() else { return };
    // Each run takes a while, so most are queued or running at the kill.
    let agent = r#"GATEWARDEN_AGENT={backend = "exec", command = ["/bin/sh", "-c", "sleep 0.3; cat"]}"#;
    let (c, api) = start(&p, &image, &["--restart=on-failure", "-e", agent]);
    let ids: Vec<String> = (0..12).map(|i| api.submit(&format!("chat{}", i % 3), &format!("m{i}"))).collect();
    let pid1 = c.inspect("{{.State.Pid}}");
    let host_pid: u32 = pid1.parse().expect("PID 1's host pid");
    send_signal(host_pid, sig::SIGKILL).expect("SIGKILL to the container's init");
    // Revived by the runtime (a new PID 1 on the host), then ready again.
    let revived = wait_until(READY, || {
        let now = c.inspect("{{.State.Pid}}");
        c.inspect("{{.State.Running}}") == "true" && now != pid1 && now != "0"
    });
    assert!(revived, "not revived after SIGKILL:\n{}", c.logs());
    let api = wait_ready(&c);
    assert!(c.inspect("{{.RestartCount}}").parse::<u32>().unwrap_or(0) >= 1, "{}", c.inspect("{{.RestartCount}}"));
    for (i, id) in ids.iter().enumerate() {
        let mut m = Value::Null;
        let done = wait_until(READY, || {
            m = api.message(id).unwrap_or(Value::Null);
            m["state"] == "done"
        });
        assert!(done, "message {id} not done after the revival: {m:#}\n{}", c.logs());
        assert!(m["reply"].as_str().is_some_and(|r| r.contains(&format!("m{i}"))), "{m:#}");
    }
    // Done once: one `done` per message in its trace.
    for id in &ids {
        let t = c.exec(&["gatewarden", "trace", id, "--json"]);
        let v: Value = serde_json::from_str(t.stdout.trim()).unwrap_or(Value::Null);
        let steps = v["steps"].as_array().cloned().unwrap_or_default();
        let done = steps.iter().filter(|s| s["step"] == "done").count();
        assert_eq!(done, 1, "message {id} finished {done} times: {v:#}");
    }
}

/// PID 1 reaps every child: 20 exec-backend runs, each leaving a background process that
/// exits after the run (an orphan re-parented to PID 1), leave no zombie behind.
#[test]
fn no_zombies_after_twenty_exec_runs() {
    let Some((p, image)) = image() else { return };
    let agent =
        r#"GATEWARDEN_AGENT={backend = "exec", command = ["/bin/sh", "-c", "(sleep 0.2 >/dev/null 2>&1 &); cat"]}"#;
    let (c, api) = start(&p, &image, &["-e", agent]);
    for i in 0..20 {
        let r = api.send("c", "u", &format!("run {i}")).expect("a reply");
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let mut zombies = String::new();
    let clean = wait_until(Duration::from_secs(20), || {
        let out = c.exec(&["sh", "-c", "grep -l '^State:.Z' /proc/[0-9]*/status || true"]);
        zombies = out.stdout.trim().to_owned();
        out.ok() && zombies.is_empty()
    });
    assert!(clean, "zombies left in the container: {zombies}");
}

/// A read-only root filesystem (no tmpfs either) with only the /data volume writable: the
/// gateway starts, answers, journals, restarts and stops cleanly.
#[test]
fn a_read_only_root_with_only_data_writable() {
    let Some((p, image)) = image() else { return };
    let (c, api) = start(&p, &image, &["--read-only", "--read-only-tmpfs=false"]);
    let touch = c.exec(&["sh", "-c", "touch /tmp/x"]);
    assert!(!touch.ok(), "the root filesystem is writable: {touch:#?}");
    let id = api.submit("c", "kept");
    assert!(wait_until(READY, || api.message(&id).is_some_and(|m| m["state"] == "done")));
    let r = c.exec(&["gatewarden", "restart", "--timeout", "60"]);
    assert!(r.ok(), "restart on a read-only root: {r:#?}");
    assert_eq!(api.message(&id).map(|m| m["state"].clone()), Some(json!("done")));
    p.ok(&["stop", "-t", "10", &c.name]);
    assert_eq!(c.inspect("{{.State.ExitCode}}"), "0", "{}", c.logs());
}
