//! Issue 27 §2 and issue 30 §6–§7: what `status` and the ledger say is only what is known, and
//! every start that revives a gateway runs it as it ran. A gateway killed without its exit path
//! is said to have ended for reasons not known (never a guessed SIGKILL or OOM killer), and the
//! next reader records that once; a recovery start, and the dashboard's Start, listen where
//! the replaced gateway listened (started with `--listen 127.0.0.1:0`). Real processes,
//! loopback only.
#![cfg(target_os = "linux")]

mod common;
mod work_common;
use common::*;
use std::time::Duration;
use work_common::*;

/// kill -9: `status` says the end was not recorded and why is not known, with what the record
/// tells, and names no signal; the ledger gets one `exited` on its behalf (`recorded_by`),
/// however many readers look, and the next gateway's start adds none.
#[test]
fn a_killed_gateway_ended_for_reasons_not_known_and_that_is_recorded_once() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    let mut g = gateway(&home, &sw, "[agent]\nbackend = \"echo\"\n");
    let inc = incarnation_of(&home, g.pid()).expect("incarnation");
    g.kill();

    for _ in 0..3 {
        let st = run_cli(&home, &["status"]);
        assert_cli(&st, 3, "status of a killed gateway");
        assert!(st.stdout.contains("ended without recording an exit; why is not known"), "{st:#?}");
        assert!(st.stdout.contains(&format!("pid {}", g.pid())) && st.stdout.contains("last seen running"), "{st:#?}");
        for guess in ["SIGKILL", "OOM", "killed"] {
            assert!(!st.stdout.contains(guess), "status guesses {guess:?}: {st:#?}");
        }
    }
    let exited = home.events("exited");
    assert_eq!(exited.len(), 1, "{}", home.ledger_text());
    let e = &exited[0];
    assert_eq!((e["incarnation"].as_str(), e["pid"].as_u64()), (Some(inc.as_str()), Some(u64::from(g.pid()))), "{e}");
    assert_eq!((e["code"].clone(), e["intent"].as_str()), (Value::Null, Some("unknown")), "{e}");
    assert_eq!(e["recorded_by"]["by"], json!("status"), "{e}");

    let h = run_cli(&home, &["history", "--json"]);
    assert!(!h.stdout.contains("SIGKILL") && !h.stdout.contains("OOM"), "{h:#?}");
    let g2 = gateway(&home, &sw, "[agent]\nbackend = \"echo\"\n");
    assert_eq!(home.events("exited").len(), 1, "the next start adds none:\n{}", home.ledger_text());
    drop(g2);
}

/// A gateway started with `--listen 127.0.0.1:0` is killed, a refused start rewrites the state
/// file meanwhile, and the config names another port: `restart` (nothing runs, so it starts
/// one) brings it back on the port it had, and so does the dashboard's Start (`start
/// --as-before`) after a stop. A plain `start` follows the config.
#[test]
fn recovery_starts_listen_where_the_replaced_gateway_listened() {
    let home = TempHome::new();
    let sw = Sweeper::new();
    let other = gatewarden_testkit::api::free_port();
    let config = format!("listen = \"127.0.0.1:{other}\"\n[agent]\nbackend = \"echo\"\n");
    let mut g = gateway(&home, &sw, &config);
    let port = g.listen().port();
    assert_ne!(port, other);
    g.kill();
    write_config(home.path(), &format!("{config}bogus_key = 1\n"));
    assert_cli(&cli_tagged(&home, &sw, &["start"], Duration::from_secs(30)), 78, "start with a bad config");
    assert_eq!(home.state_record().map(|s| s["listen"].clone()), Some(Value::Null), "the refusal rewrote the state");
    write_config(home.path(), &config);

    let listening = |what: &str| {
        let st = run_cli(&home, &["status", "--json"]);
        assert_cli(&st, 0, what);
        st.json()["listen"].as_str().unwrap_or_default().to_owned()
    };
    let out = cli_tagged(&home, &sw, &["restart", "--timeout", "30"], Duration::from_secs(60));
    assert_cli(&out, 0, "restart with nothing running");
    assert_eq!(listening("after the recovery start"), format!("127.0.0.1:{port}"), "{}", home.ledger_text());

    assert_cli(&cli_tagged(&home, &sw, &["stop"], Duration::from_secs(30)), 0, "stop");
    let args = gatewarden_dashboard::actions::Action::Start.cli_args(None).unwrap().unwrap();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_cli(&cli_tagged(&home, &sw, &args, Duration::from_secs(30)), 0, "the dashboard's Start");
    assert_eq!(listening("after the dashboard's Start"), format!("127.0.0.1:{port}"));

    assert_cli(&cli_tagged(&home, &sw, &["stop"], Duration::from_secs(30)), 0, "stop");
    assert_cli(&cli_tagged(&home, &sw, &["start"], Duration::from_secs(30)), 0, "start");
    assert_eq!(listening("after a plain start"), format!("127.0.0.1:{other}"));
    assert_cli(&cli_tagged(&home, &sw, &["stop"], Duration::from_secs(30)), 0, "stop");
}

/// Nothing runs because the last start was refused for something other than the config file
/// (a secret missing from the gateway's environment): `doctor` names it with the reason and
/// what to do (issue 27 §1, belt and braces), and `status` shows the same reason.
#[test]
fn doctor_and_status_name_a_refused_start() {
    const VAR: &str = "GW_TEST_DOCTOR_UNSET_TOKEN";
    let home = TempHome::new();
    let sw = Sweeper::new();
    write_config(
        home.path(),
        &format!(
            "[agent]\nbackend = \"echo\"\n[[platform]]\nkind = \"telegram\"\ntoken_env = \"{VAR}\"\napi_base = \"http://127.0.0.1:9\"\n"
        ),
    );
    assert_cli(&cli_tagged(&home, &sw, &["start", "--listen", "127.0.0.1:0"], Duration::from_secs(30)), 78, "start");
    let doc = run_cli(&home, &["doctor"]);
    assert_cli(&doc, 1, "doctor");
    assert!(doc.stdout.contains("error[start-refused]") && doc.stdout.contains(VAR), "{doc:#?}");
    assert!(doc.stdout.contains("check && gatewarden"), "the fix says what to run: {doc:#?}");
    let st = run_cli(&home, &["status"]);
    assert_cli(&st, 3, "status");
    assert!(st.stdout.contains(VAR) && st.stdout.contains("78"), "{st:#?}");
}
