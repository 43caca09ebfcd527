//! Issue 28: deploy/ for real where this machine can. `podman kube play` runs
//! deploy/kubernetes/gatewarden.yaml as it is (two replicas of the image in a cluster) against
//! PostgreSQL in a pod of its own, on a network of the test's (pods find each other by name);
//! the active's pod is SIGKILLed (as when its node is lost: a container killed alone is
//! restarted in its pod and takes its lease back) and the standby takes over within the lease
//! TTL, its `/readyz` flipping to 200. The manifests are validated against the Kubernetes schemas
//! offline (PyPI's kubernetes-validate, `scripts/setup-kubernetes-validate`).
//! deploy/compose.yaml is checked by parsing it (Debian's podman-compose 1.0.3 has no `config`,
//! and its `--dry-run` creates volumes and networks).
//!
//! What podman 4.3's kube play can run decided the manifest's form (its comments say so): the
//! secrets come from the Secret as variables (`secretKeyRef`; a Secret volume's files are
//! mounted root-owned and world-readable, or not at all for a played Secret), no port is
//! declared (kube play publishes a containerPort on the host), and each replica's home is named
//! after its pod (an emptyDir is one volume for every replica). The test makes what an operator
//! makes: the Secret (`podman secret create` of what `kubectl create secret generic` stores, a
//! JSON object of base64 values, as kube play's `secretKeyRef` reads it), the image tagged as
//! the manifest names it, and PostgreSQL as a Pod named `postgres` (kube play has no
//! StatefulSet or Service; the pod's name is what the store URL resolves).
#![cfg(target_os = "linux")]

mod common;
use common::*;
use gatewarden_testkit::podman::{Podman, repo_root, unique};
use std::process::Command;
use std::time::{Duration, Instant};

/// The image the manifests name (`imagePullPolicy: IfNotPresent`).
const MANIFEST_IMAGE: &str = "localhost/gatewarden:latest";

fn b64(s: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// The keys of Secret `name` that `doc` reads (`secretKeyRef: {name: NAME, key: KEY}`).
fn secret_keys(doc: &str, name: &str) -> Vec<String> {
    let pat = format!("secretKeyRef: {{name: {name}, key: ");
    let mut keys: Vec<String> = doc
        .match_indices(&pat)
        .filter_map(|(i, _)| doc[i + pat.len()..].split('}').next())
        .map(str::to_owned)
        .collect();
    keys.dedup();
    keys
}

/// What the test created, removed on drop.
struct Played {
    p: Podman,
    files: Vec<std::path::PathBuf>,
    network: String,
    _dir: tempfile::TempDir,
}

impl Drop for Played {
    fn drop(&mut self) {
        for f in self.files.iter().rev() {
            let _ = self.p.run_for(&["kube", "down", f.to_str().unwrap_or_default()], Duration::from_secs(120));
        }
        let _ = self.p.run(&["secret", "rm", "gatewarden"]);
        let _ = self.p.run(&["volume", "rm", "-f", "gatewarden-home"]);
        let _ = self.p.run(&["network", "rm", "-f", &self.network]);
    }
}

fn status_of(p: &Podman, container: &str) -> Value {
    let out = p.run_for(&["exec", container, "gatewarden", "status", "--json"], Duration::from_secs(30));
    out.and_then(|o| serde_json::from_str(o.stdout.trim()).ok()).unwrap_or(Value::Null)
}

/// The pod's address on the test's network.
fn ip_of(p: &Podman, pod: &str) -> Option<std::net::IpAddr> {
    let infra = p.run(&["pod", "inspect", pod, "--format", "{{.InfraContainerID}}"])?.stdout.trim().to_owned();
    let ip = p.run(&["inspect", &infra, "--format", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}"])?;
    ip.stdout.trim().parse().ok()
}

fn readyz(ip: std::net::IpAddr) -> Option<u16> {
    http_get(std::net::SocketAddr::new(ip, 7878), "/readyz", Duration::from_secs(1)).ok().map(|r| r.status)
}

/// deploy/kubernetes/gatewarden.yaml played as it is: two replicas elect one active, only it
/// is ready, a standby is alive; SIGKILL to the active's pod (`podman pod kill`) and the
/// standby is active and ready within the lease TTL. Prints the failover time.
#[test]
fn kube_play_runs_active_standby_and_fails_over_within_the_ttl() {
    let Some(p) = Podman::get() else { return };
    let image = p.image(std::path::Path::new(bin()));
    let manifest_path = repo_root().join("deploy/kubernetes/gatewarden.yaml");
    let manifest = std::fs::read_to_string(&manifest_path).unwrap();
    assert!(!manifest.contains("kind: Secret"), "the Secret is the operator's, never the manifest's");
    let keys = secret_keys(&manifest, "gatewarden");
    assert_eq!(keys, ["api-token", "store-password"], "the manifest reads these from its Secret");
    let token = format!("deploy-test-token-{:016x}", std::process::id());
    let password = format!("deploy-test-password-{}", std::process::id());
    let dir = tempfile::tempdir().unwrap();
    // What `kubectl create secret generic gatewarden --from-literal=…` stores.
    let secret_file = dir.path().join("secret.json");
    let secret = json!({"api-token": b64(&token), "store-password": b64(&password)});
    std::fs::write(&secret_file, secret.to_string()).unwrap();
    let pg = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: postgres\nspec:\n  containers:\n    - name: postgres\n      \
         image: docker.io/library/postgres:15-bookworm\n      env:\n        - {{name: POSTGRES_USER, value: gatewarden}}\n        \
         - {{name: POSTGRES_DB, value: gatewarden}}\n        - {{name: POSTGRES_PASSWORD, value: \"{password}\"}}\n"
    );
    let pg_file = dir.path().join("postgres.yaml");
    std::fs::write(&pg_file, pg).unwrap();
    let network = unique("net");
    let mut g = Played { p: p.clone(), files: Vec::new(), network: network.clone(), _dir: dir };
    // One run at a time owns these names (the Secret, the pods, the home volume): a stale
    // run's are removed.
    let _ = p.run(&["pod", "rm", "-f", "postgres", "gatewarden-pod-0", "gatewarden-pod-1"]);
    let _ = p.run(&["secret", "rm", "gatewarden"]);
    let _ = p.run(&["volume", "rm", "-f", "gatewarden-home"]);
    p.ok(&["network", "create", &network]);
    p.ok(&["secret", "create", "gatewarden", secret_file.to_str().unwrap()]);
    p.ok(&["tag", &image, MANIFEST_IMAGE]);
    g.files.push(pg_file.clone());
    p.ok(&["kube", "play", "--network", &network, pg_file.to_str().unwrap()]);
    g.files.push(manifest_path.clone());
    let t0 = Instant::now();
    p.ok(&["kube", "play", "--network", &network, manifest_path.to_str().unwrap()]);

    let pods = ["gatewarden-pod-0", "gatewarden-pod-1"];
    let containers = pods.map(|pod| format!("{pod}-gatewarden"));
    let mut roles = Vec::new();
    let elected = wait_until(Duration::from_secs(90), || {
        roles = containers.iter().map(|c| status_of(&p, c)["cluster"]["role"].clone()).collect();
        roles.iter().filter(|r| **r == "active").count() == 1 && roles.iter().filter(|r| **r == "standby").count() == 1
    });
    assert!(
        elected,
        "no active and standby: {roles:?}\n{}",
        p.run(&["logs", &containers[0]]).map(|o| o.stderr).unwrap_or_default()
    );
    eprintln!("[deploy] two replicas, one active, in {:.1} s", t0.elapsed().as_secs_f64());
    let active = roles.iter().position(|r| *r == "active").unwrap_or(0);
    let standby = 1 - active;
    // Each replica its own home, named after its pod (two in one home could not both run).
    for (c, pod) in containers.iter().zip(pods) {
        let home = status_of(&p, c)["home"].clone();
        assert!(home.as_str().is_some_and(|h| h.trim_end_matches('/').ends_with(pod)), "{c}: {home}");
    }
    let ips = pods.map(|pod| ip_of(&p, pod).expect("a pod address"));
    // Only the active is ready: the Service sends it all traffic. The API needs the Secret's
    // token.
    assert!(wait_until(Duration::from_secs(10), || readyz(ips[active]) == Some(200)));
    assert_eq!(readyz(ips[standby]), Some(503), "the standby is not ready");
    let api = |ip| gatewarden_testkit::api::Api::new(std::net::SocketAddr::new(ip, 7878));
    assert_eq!(api(ips[active]).status().map(|_| ()), None, "no status without the token");
    assert!(api(ips[active]).with_token(&token).status().is_some(), "the Secret's token");
    let st = status_of(&p, &containers[standby]);
    assert_eq!(st["state"], json!("running"), "the standby is alive (liveness): {st:#}");
    let live = p.run(&["exec", &containers[standby], "gatewarden", "status"]).map(|o| o.code);
    assert_eq!(live, Some(Some(0)), "the liveness probe's command passes on the standby");
    let ttl = Duration::from_secs(st["cluster"]["lease_ttl_s"].as_u64().unwrap_or(15));

    // The active's pod dies as with its node (SIGKILL to every container of it): a container
    // that died alone is restarted in its pod (restartPolicy Always, podman's too) and takes
    // its own home's lease back at once, so the standby is what a lost pod tests.
    let killed = Instant::now();
    p.ok(&["pod", "kill", "--signal", "KILL", pods[active]]);
    let flipped = wait_until(ttl + Duration::from_secs(15), || readyz(ips[standby]) == Some(200));
    let failover = killed.elapsed();
    eprintln!(
        "[deploy] failover after SIGKILL of the active: {:.2} s (lease TTL {} s)",
        failover.as_secs_f64(),
        ttl.as_secs()
    );
    assert!(flipped, "the standby never became ready:\n{:#}", status_of(&p, &containers[standby]));
    assert!(failover <= ttl + Duration::from_secs(5), "failover took {failover:?} (TTL {ttl:?})");
    assert_eq!(status_of(&p, &containers[standby])["cluster"]["role"], json!("active"));
}

/// The manifests against the Kubernetes API's schemas, offline: kubernetes-validate (PyPI,
/// bundling the schemas; `scripts/setup-kubernetes-validate`) in strict mode (an unknown
/// field is an error), for the oldest and newest versions it carries. A misspelt field is
/// refused, so the validator is known to look.
#[test]
fn the_manifests_are_valid_kubernetes() {
    let dir = repo_root().join("deploy/kubernetes");
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.retain(|f| f.extension().is_some_and(|e| e == "yaml"));
    files.sort();
    assert_eq!(files.len(), 3, "{files:?}");
    let validate = |version: &str, files: &[std::path::PathBuf]| {
        Command::new("kubernetes-validate").args(["--strict", "--quiet", "-k", version]).args(files).output()
    };
    let t0 = Instant::now();
    for version in ["1.25.0", "1.37.0"] {
        let out = match validate(version, &files) {
            Ok(o) => o,
            Err(e) => {
                let why = format!("{e} (run scripts/setup-kubernetes-validate)");
                gatewarden_testkit::unavailable::<()>("kubernetes-validate", &why);
                return;
            }
        };
        let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "Kubernetes {version}: {said}");
    }
    eprintln!("[deploy] manifests validated in {:.2} s", t0.elapsed().as_secs_f64());
    let tmp = tempfile::tempdir().unwrap();
    let bad = tmp.path().join("bad.yaml");
    let text = std::fs::read_to_string(&files[0]).unwrap();
    std::fs::write(&bad, text.replacen("terminationGracePeriodSeconds", "terminationGracePeriodSecond", 1)).unwrap();
    let out = validate("1.37.0", std::slice::from_ref(&bad)).expect("kubernetes-validate runs");
    assert!(!out.status.success(), "a misspelt field passed: {}", String::from_utf8_lossy(&out.stdout));
}

/// deploy/compose.yaml: two gateways of the image on the cluster store, PostgreSQL, the
/// secrets as files, the stop within the owner's budget (parsed with PyYAML, which
/// podman-compose itself uses).
#[test]
fn the_compose_file_has_two_gateways_and_postgres() {
    let path = repo_root().join("deploy/compose.yaml");
    let script = "import json, sys, yaml; print(json.dumps(yaml.safe_load(open(sys.argv[1]))))";
    let out = match Command::new("python3").args(["-c", script]).arg(&path).output() {
        Ok(o) if o.status.success() => o,
        Ok(o) => {
            let why = String::from_utf8_lossy(&o.stderr).into_owned();
            let Some(o) = gatewarden_testkit::unavailable::<std::process::Output>("python3-yaml", &why) else { return };
            o
        }
        Err(e) => {
            let Some(o) = gatewarden_testkit::unavailable::<std::process::Output>("python3", &e.to_string()) else {
                return;
            };
            o
        }
    };
    let v: Value = serde_json::from_slice(&out.stdout).expect("compose.yaml as JSON");
    let services = &v["services"];
    for gw in ["gw1", "gw2"] {
        let s = &services[gw];
        assert_eq!(s["image"], json!("localhost/gatewarden:latest"), "{gw}: {s:#}");
        assert!(s["environment"]["GATEWARDEN_CLUSTER"].as_str().is_some_and(|c| c.contains("postgres://")), "{s:#}");
        assert_eq!(s["read_only"], json!(true), "{s:#}");
        assert_eq!(s["stop_grace_period"], json!("10s"), "{s:#}");
        assert!(s["secrets"].as_array().is_some_and(|a| a.contains(&json!("store-password"))), "{s:#}");
        // The secrets by their files: no shell reading one into a variable.
        assert_eq!(s["environment"]["GATEWARDEN_API_TOKEN_FILE"], json!("/run/secrets/api-token"), "{s:#}");
        assert!(s["environment"]["GATEWARDEN_CLUSTER"].as_str().is_some_and(|c| c.contains("password_file")), "{s:#}");
        assert!(s.get("entrypoint").is_none(), "{s:#}");
    }
    assert!(services["postgres"]["image"].as_str().is_some_and(|i| i.contains("postgres")), "{v:#}");
    assert!(v["secrets"]["api-token"]["file"].is_string(), "{v:#}");
}
