//! Rollouts end to end with real processes on 127.0.0.1: `rollgate gateway`
//! and `rollgate controller` meeting in one store, small upstream servers
//! that answer, fail, or are ready and then answer 503, and live traffic.
//! Every wait is bounded.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use serde_json::{Value, json};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::common::*;
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_candidate_is_promoted_and_becomes_champion() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Its log in JSON, into a file: every decision is a line of it.
    let log = dir.path().join("controller.log");
    let cfg = write(dir.path(), "controller.toml", CONTROLLER_TOML);
    let data = dir.path().join("data");
    let ctl = spawn_logged(
        &[
            "controller",
            "--data",
            &data.to_string_lossy(),
            "--config",
            &cfg,
            "--log-format",
            "json",
        ],
        &[("RUST_LOG", "info")],
        &log,
    );
    let c = client();
    let (champion, candidate) = (model_server(Model::new(false)).await, Model::new(false));
    let cand_url = model_server(candidate.clone()).await;
    let (_, cand) = setup(&c, &ctl, &champion, &cand_url).await;
    let gw = start_gateway(dir.path());
    let stop = Arc::new(AtomicBool::new(false));
    let load = traffic(gw.addr(), Arc::clone(&stop));
    let id = start_rollout(&c, &ctl, &cand).await;
    let r = wait_for(&c, &ctl, id, Duration::from_secs(60), finished).await;
    assert_eq!(phase(&r), "promoted", "{r}");
    let (_, m) = api(&c, &ctl, "GET", "/api/v1/models/m", None).await;
    assert_eq!(m["champion"].as_str(), Some(cand.as_str()));
    // The gateway follows the store: soon every request is the new champion's.
    let url = format!("http://{}/v1/models/m:predict", gw.addr());
    let started = Instant::now();
    loop {
        let (s, _, rev) = request(&c, "POST", &url, Some(json!({"instances": [[1]]})), None).await;
        if s == 200 && rev.as_deref() == Some(cand.as_str()) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "gateway never switched"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let kinds = audit_kinds(&c, &ctl, id).await;
    assert_eq!(count(&kinds, "advanced"), 2, "{kinds:?}");
    assert_eq!(count(&kinds, "promoted"), 1);
    assert!(chain_intact(&c, &ctl).await);
    stop.store(true, Ordering::SeqCst);
    let _ = load.await;
    // Every line of the log is JSON without colour codes, and each decision
    // names the model, the rollout, the phases and why.
    let text = std::fs::read_to_string(&log).expect("log");
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect();
    assert!(!text.contains('\u{1b}'), "colour codes in a file");
    let decisions: Vec<(String, String)> = lines
        .iter()
        .filter(|l| l["fields"]["message"] == "decision")
        .map(|l| {
            let f = &l["fields"];
            assert_eq!(f["model"], "m", "{l}");
            assert_eq!(f["rollout"], id, "{l}");
            assert!(f["reason"].is_string(), "{l}");
            (
                f["from"].as_str().unwrap_or("").to_string(),
                f["to"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    let last = decisions.last().cloned().unwrap_or_default();
    assert_eq!(last.1, "PROMOTED", "{decisions:?}");
    assert!(decisions.len() >= 4, "{decisions:?}");
}

/// Several gateways serve one model, meeting the controller in the store:
/// both follow the rollout's routing, and the controller merges the stats of
/// every live gateway (traffic goes through both).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_gateways_serve_one_model_and_their_stats_are_merged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ctl = start_controller(dir.path(), &[]);
    let c = client();
    let champion = model_server(Model::new(false)).await;
    let candidate = model_server(Model::new(false)).await;
    let (_, cand) = setup(&c, &ctl, &champion, &candidate).await;
    let (a, b) = (start_gateway(dir.path()), start_gateway(dir.path()));
    let stop = Arc::new(AtomicBool::new(false));
    let loads = [
        traffic(a.addr(), Arc::clone(&stop)),
        traffic(b.addr(), Arc::clone(&stop)),
    ];
    let id = start_rollout(&c, &ctl, &cand).await;
    let r = wait_for(&c, &ctl, id, Duration::from_secs(60), finished).await;
    assert_eq!(phase(&r), "promoted", "{r}");
    stop.store(true, Ordering::SeqCst);
    for l in loads {
        let _ = l.await;
    }
    for g in [&a, &b] {
        let (s, stats, _) = request(
            &c,
            "GET",
            &format!("http://{}/rollgate/stats", g.addr()),
            None,
            None,
        )
        .await;
        assert_eq!(s, 200);
        let served = stats["models"]["m"]["revisions"][cand.as_str()]["requests"]
            .as_u64()
            .unwrap_or(0);
        assert!(
            served > 0,
            "gateway {} never sent the candidate anything: {stats}",
            g.addr()
        );
    }
    // Both follow the store: each now routes to the new champion.
    for g in [&a, &b] {
        let url = format!("http://{}/v1/models/m:predict", g.addr());
        let started = Instant::now();
        while request(&c, "POST", &url, Some(json!({"instances": [[1]]})), None)
            .await
            .2
            .as_deref()
            != Some(cand.as_str())
        {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "gateway {} never switched",
                g.addr()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_then_503_is_rolled_back_rejected_and_the_champion_serves_everyone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ctl = start_controller(dir.path(), &[]);
    let c = client();
    let champion = model_server(Model::new(false)).await;
    let broken = model_server(Model::new(true)).await;
    let (champ, cand) = setup(&c, &ctl, &champion, &broken).await;
    let gw = start_gateway(dir.path());
    let stop = Arc::new(AtomicBool::new(false));
    let load = traffic(gw.addr(), Arc::clone(&stop));
    let id = start_rollout(&c, &ctl, &cand).await;
    let r = wait_for(&c, &ctl, id, Duration::from_secs(60), finished).await;
    assert_eq!(phase(&r), "rolled_back", "{r}");
    stop.store(true, Ordering::SeqCst);
    let _ = load.await;
    let (_, rev) = api(&c, &ctl, "GET", &format!("/api/v1/revisions/{cand}"), None).await;
    assert_eq!(rev["state"], "rejected");
    assert_eq!(rev["blocked"], true);
    // A new rollout of it is refused until unblocked.
    let (s, e) = api(
        &c,
        &ctl,
        "POST",
        "/api/v1/rollouts",
        Some(json!({ "model": "m", "revision": cand })),
    )
    .await;
    assert_eq!(
        (s, e["error"]["code"].as_str()),
        (409, Some("revision_rejected"))
    );
    // Afterwards every request is served, by the champion (once the gateway
    // has followed the store: bounded wait for the first champion answer).
    let url = format!("http://{}/v1/models/m:predict", gw.addr());
    let started = Instant::now();
    while request(&c, "POST", &url, Some(json!({"instances": [[1]]})), None)
        .await
        .2
        .as_deref()
        != Some(champ.as_str())
    {
        assert!(started.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for i in 0..30 {
        let key = format!("after-{i}");
        let req = Request::builder()
            .method("POST")
            .uri(&url)
            .header("x-rollgate-key", key)
            .body(Full::new(Bytes::from_static(b"{\"instances\":[[1]]}")))
            .expect("req");
        let resp = c.request(req).await.expect("http");
        assert_eq!(resp.status(), 200);
        let rev = resp
            .headers()
            .get("x-rollgate-revision")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        assert_eq!(rev.as_deref(), Some(champ.as_str()));
    }
    assert!(chain_intact(&c, &ctl).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_outage_does_not_roll_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ctl = start_controller(dir.path(), &[]);
    let c = client();
    let (champion_model, candidate_model) = (Model::new(true), Model::new(true));
    let champion = model_server(champion_model.clone()).await;
    let candidate = model_server(candidate_model.clone()).await;
    let (_, cand) = setup(&c, &ctl, &champion, &candidate).await;
    let gw = start_gateway(dir.path());
    let stop = Arc::new(AtomicBool::new(false));
    let load = traffic(gw.addr(), Arc::clone(&stop));
    let id = start_rollout(&c, &ctl, &cand).await;
    // Held, not rolled back: first the verdict, then past the 10 s deadline.
    let r = wait_for(&c, &ctl, id, Duration::from_secs(30), |r| {
        r["state"]["last_verdict"]["reason"]["code"] == "shared_outage"
    })
    .await;
    assert!(!finished(&r));
    tokio::time::sleep(Duration::from_secs(12)).await;
    let (_, r) = api(&c, &ctl, "GET", &format!("/api/v1/rollouts/{id}"), None).await;
    assert!(!finished(&r), "{r}");
    assert_eq!(
        r["state"]["last_verdict"]["reason"]["code"],
        "shared_outage"
    );
    stop.store(true, Ordering::SeqCst);
    let _ = load.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traffic_that_stops_fails_safe_and_never_promotes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ctl = start_controller(dir.path(), &[]);
    let c = client();
    let champion = model_server(Model::new(false)).await;
    let candidate = model_server(Model::new(false)).await;
    let (_, cand) = setup(&c, &ctl, &champion, &candidate).await;
    let _gw = start_gateway(dir.path());
    // No traffic at all.
    let id = start_rollout(&c, &ctl, &cand).await;
    let r = wait_for(&c, &ctl, id, Duration::from_secs(60), finished).await;
    assert_eq!(phase(&r), "rolled_back", "{r}");
    assert_eq!(r["state"]["phase"]["reason"]["code"], "evidence_timeout");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_killed_mid_rollout_resumes_to_the_same_outcome() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut ctl = start_controller(dir.path(), &[]);
    let c = client();
    let champion = model_server(Model::new(false)).await;
    let candidate = model_server(Model::new(false)).await;
    let (_, cand) = setup(&c, &ctl, &champion, &candidate).await;
    let gw = start_gateway(dir.path());
    let stop = Arc::new(AtomicBool::new(false));
    let load = traffic(gw.addr(), Arc::clone(&stop));
    let id = start_rollout(&c, &ctl, &cand).await;
    wait_for(&c, &ctl, id, Duration::from_secs(30), |r| {
        phase(r) == "canary"
    })
    .await;
    ctl.kill(); // SIGKILL, mid-rollout
    let ctl = start_controller(dir.path(), &[]);
    let r = wait_for(&c, &ctl, id, Duration::from_secs(60), finished).await;
    assert_eq!(phase(&r), "promoted", "{r}");
    let kinds = audit_kinds(&c, &ctl, id).await;
    assert_eq!(count(&kinds, "started"), 1, "{kinds:?}");
    assert_eq!(count(&kinds, "advanced"), 2, "{kinds:?}");
    assert_eq!(count(&kinds, "promoted"), 1, "{kinds:?}");
    assert!(chain_intact(&c, &ctl).await);
    stop.store(true, Ordering::SeqCst);
    let _ = load.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_controllers_never_double_advance_a_rollout() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ctl = start_controller(dir.path(), &[]);
    let _second = start_controller(dir.path(), &[]);
    let c = client();
    let champion = model_server(Model::new(false)).await;
    let candidate = model_server(Model::new(false)).await;
    let (_, cand) = setup(&c, &ctl, &champion, &candidate).await;
    let gw = start_gateway(dir.path());
    let stop = Arc::new(AtomicBool::new(false));
    let load = traffic(gw.addr(), Arc::clone(&stop));
    let id = start_rollout(&c, &ctl, &cand).await;
    let r = wait_for(&c, &ctl, id, Duration::from_secs(60), finished).await;
    assert_eq!(phase(&r), "promoted", "{r}");
    let kinds = audit_kinds(&c, &ctl, id).await;
    assert_eq!(count(&kinds, "started"), 1, "{kinds:?}");
    assert_eq!(count(&kinds, "advanced"), 2, "{kinds:?}");
    assert_eq!(count(&kinds, "promoted"), 1, "{kinds:?}");
    assert_eq!(count(&kinds, "champion_set"), 1, "{kinds:?}");
    // Evaluations are written when they say something new (others are
    // summarised): never more records than evaluations committed.
    let evaluations = r["state"]["evaluations"].as_u64().expect("evaluations");
    let evaluated = count(&kinds, "evaluated") as u64;
    assert!(
        (1..=evaluations).contains(&evaluated),
        "{evaluated} of {evaluations}"
    );
    assert!(chain_intact(&c, &ctl).await);
    stop.store(true, Ordering::SeqCst);
    let _ = load.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_errors_name_the_problem_and_auth_guards_every_endpoint() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ctl = start_controller(dir.path(), &[("ROLLGATE_TOKEN", "s3cret")]);
    let c = client();
    let base = format!("http://{}", ctl.addr());
    let (s, e, _) = request(&c, "GET", &format!("{base}/api/v1/models"), None, None).await;
    assert_eq!(
        (s, e["error"]["code"].as_str()),
        (401, Some("unauthorized"))
    );
    let (s, _, _) = request(
        &c,
        "GET",
        &format!("{base}/api/v1/models"),
        None,
        Some("wrong"),
    )
    .await;
    assert_eq!(s, 401);
    let (s, _, _) = request(&c, "GET", &format!("{base}/healthz"), None, None).await;
    assert_eq!(s, 200);
    let tok = Some("s3cret");
    let (s, _, _) = request(&c, "GET", &format!("{base}/api/v1/models"), None, tok).await;
    assert_eq!(s, 200);
    let (s, e, _) = request(
        &c,
        "POST",
        &format!("{base}/api/v1/rollouts"),
        Some(json!({ "model": "m" })),
        tok,
    )
    .await;
    assert_eq!(s, 400);
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("revision"),
        "{e}"
    );
    let (s, e, _) = request(&c, "GET", &format!("{base}/api/v1/models/nope"), None, tok).await;
    assert_eq!((s, e["error"]["code"].as_str()), (404, Some("not_found")));
    let (s, e, _) = request(
        &c,
        "POST",
        &format!("{base}/api/v1/models"),
        Some(json!({ "name": "bad name!" })),
        tok,
    )
    .await;
    assert_eq!((s, e["error"]["code"].as_str()), (422, Some("invalid")));
    let bad_plan = json!({ "model": "m", "revision": "r", "plan": { "steps": [50, 5] } });
    let (s, e, _) = request(
        &c,
        "POST",
        &format!("{base}/api/v1/rollouts"),
        Some(bad_plan),
        tok,
    )
    .await;
    assert_eq!(s, 422, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("steps[1]"),
        "{e}"
    );
}

#[test]
fn the_admin_api_refuses_a_public_address_without_a_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let out = Command::new(env!("CARGO_BIN_EXE_rollgate"))
        .args([
            "controller",
            "--data",
            &data.to_string_lossy(),
            "--api-listen",
            "0.0.0.0:0",
        ])
        .env_remove("ROLLGATE_TOKEN")
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("ROLLGATE_TOKEN"));
}

/// The CLI with its stdout a pipe whose reader is already gone; its exit
/// code and stderr.
fn cli_into_closed_pipe(api: &str, args: &[&str]) -> (i32, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rollgate"))
        .args(args)
        .env("ROLLGATE_API", format!("http://{api}"))
        .env_remove("ROLLGATE_TOKEN")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run the CLI");
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("wait");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_drives_a_rollout_against_rollgate_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write(
        dir.path(),
        "up.toml",
        "[api]\nlisten = \"127.0.0.1:0\"\n[controller]\ntick = \"200ms\"\nfollow_interval = \"200ms\"\n[gateway]\nlisten = \"127.0.0.1:0\"\n",
    );
    let data = dir.path().join("data");
    // `rollgate up` prints "gateway http://GW  admin API http://API".
    let up = spawn(
        &["up", "--config", &cfg, "--data", &data.to_string_lossy()],
        &[],
    );
    let (gw, api) = (up.addrs[0].clone(), up.addrs[1].clone());
    let champion = model_server(Model::new(false)).await;
    let candidate = model_server(Model::new(false)).await;

    assert_eq!(cli(&api, &["model", "add", "m"]).0, 0);
    let (code, champ, _) = cli(&api, &["revision", "add", "m", "--upstream", &champion]);
    assert_eq!(code, 0);
    let (_, cand, _) = cli(&api, &["revision", "add", "m", "--upstream", &candidate]);
    assert_eq!(
        cli(&api, &["champion", "set", "m", &champ, "--reason", "first"]).0,
        0
    );
    // A bad plan file: exit 2, naming the line and the field.
    let bad = write(dir.path(), "bad.toml", "steps = [5, 25]\nstepz = 1\n");
    let (code, _, err) = cli(&api, &["rollout", "start", "m", &cand, "--plan", &bad]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("line 2") && err.contains("stepz"), "{err}");
    let plan = write(
        dir.path(),
        "plan.toml",
        "steps = [20, 50]\nmin_stage_duration = \"1s\"\nevidence_timeout = \"10s\"\n[gates.error_rate]\nmin_requests = 20\nmargin = 0.05\n[gates.latency]\nmin_requests = 20\n[gates.shadow]\nmin_pairs = 30\n[[approvals]]\nbefore = \"promotion\"\n",
    );
    let stop = Arc::new(AtomicBool::new(false));
    let load = traffic(&gw, Arc::clone(&stop));
    assert_eq!(
        cli(&api, &["rollout", "start", "m", &cand, "--plan", &plan]).0,
        0
    );
    // The last stage passes, then it waits for a person (the status says
    // for what and how to give it); approving lets it promote.
    let started = std::time::Instant::now();
    loop {
        let (_, out, _) = cli(&api, &["rollout", "status", "1"]);
        if out.contains("WAITING FOR APPROVAL of promotion") {
            assert!(out.contains("rollgate rollout approve 1"), "{out}");
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "{out}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (code, _, err) = cli(
        &api,
        &["rollout", "approve", "1", "--reason", "metrics look right"],
    );
    assert_eq!(code, 0, "{err}");
    let (code, out, _) = cli(&api, &["rollout", "wait", "1", "--timeout", "60s"]);
    assert_eq!((code, out.starts_with("PROMOTED")), (0, true), "{out}");
    stop.store(true, Ordering::SeqCst);
    let _ = load.await;
    let (code, out, _) = cli(&api, &["rollout", "status", "1", "--output", "json"]);
    assert_eq!(code, 0);
    let status: Value = serde_json::from_str(&out).expect("status json");
    assert_eq!(status["state"]["phase"]["phase"], "promoted");
    let (code, out, _) = cli(&api, &["rollout", "status", "1"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("guarantee: no regression was shown"),
        "an on_time promotion says what it guarantees: {out}"
    );
    let (code, out, _) = cli(&api, &["audit", "--rollout", "1"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("promoted") && out.contains("error_rate"),
        "{out}"
    );
    assert!(
        out.contains("awaiting_approval") && out.contains(" approved "),
        "{out}"
    );
    // Decisions by default; every audited evaluation with --all.
    assert!(!out.contains(" evaluated "), "{out}");
    assert!(out.contains("evaluations not shown"), "{out}");
    let (code, all, _) = cli(&api, &["audit", "--rollout", "1", "--all"]);
    assert_eq!(code, 0);
    assert!(
        all.contains(" evaluated ") && all.len() > out.len(),
        "{all}"
    );
    assert_eq!(cli(&api, &["audit", "verify"]).0, 0);
    // Times in RFC 3339 (UTC); `--watch` off a terminal with JSON output:
    // one line per change, and it ends with the rollout.
    let first = out.lines().next().unwrap_or("");
    let at = first.split_whitespace().nth(1).unwrap_or("");
    assert!(
        at.ends_with('Z') && at.parse::<jiff::Timestamp>().is_ok(),
        "{first}"
    );
    // The same instants in the local zone with `--local-time` (TZ names it).
    let local = Command::new(env!("CARGO_BIN_EXE_rollgate"))
        .args(["audit", "--rollout", "1", "--local-time"])
        .env("ROLLGATE_API", format!("http://{api}"))
        .env("TZ", "Asia/Kolkata")
        .env_remove("ROLLGATE_TOKEN")
        .output()
        .expect("run the CLI");
    let local = String::from_utf8_lossy(&local.stdout).into_owned();
    let local_at = local
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("");
    assert!(local_at.ends_with("+05:30"), "{local}");
    assert_eq!(
        local_at.parse::<jiff::Timestamp>().ok(),
        at.parse::<jiff::Timestamp>().ok(),
        "{local_at} and {at} are one instant"
    );
    let (code, watched, err) = cli(
        &api,
        &["rollout", "status", "1", "--watch", "--output", "json"],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(watched.lines().count(), 1, "{watched}");
    let v: Value = serde_json::from_str(&watched).expect("a JSON line");
    assert_eq!(phase(&v), "promoted");
    // Piped into a reader that is gone (`| head -1`), every command that
    // prints ends quietly and successfully.
    for args in [
        &["audit", "--rollout", "1", "--all"][..],
        &["audit", "--format", "json"],
        &["audit", "--output", "json"],
        &["audit", "verify"],
        &["token", "list"],
        &["rollout", "--help"],
        &["completions", "bash"],
        &["man"],
        &["demo", "--simulated"],
        &["sim", "--help"],
        &["rollout", "status", "1"],
        &["rollout", "status"],
        &["rollout", "status", "--output", "json"],
        &["model", "list"],
        &["revision", "list", "m"],
        &["--help"],
    ] {
        let (code, err) = cli_into_closed_pipe(&api, args);
        assert_eq!(code, 0, "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    let (code, _, err) = cli(&api, &["rollout", "pause", "1"]);
    assert_eq!(
        code, 2,
        "pausing a finished rollout is an input error: {err}"
    );
    let (code, _, _) = cli(&api, &["model", "show", "nope"]);
    assert_eq!(code, 2);
    // A spec the gateway could not route is refused, naming the field;
    // a model's spec changes, and a model is deleted, through the API.
    let (code, _, err) = cli(&api, &["model", "add", "x", "--key-field", "user"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("key_field"), "{err}");
    let json_model = ["--protocol", "json", "--json-path", "/x"];
    assert_eq!(
        cli(&api, &[&["model", "add", "x"][..], &json_model].concat()).0,
        0
    );
    let (code, out, err) = cli(
        &api,
        &[
            &["model", "update", "x"][..],
            &json_model,
            &["--key-field", "/user"],
        ]
        .concat(),
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("/user"), "{out}");
    assert_eq!(
        cli(&api, &["model", "delete", "x", "--reason", "a test model"]).0,
        0
    );
    assert_eq!(cli(&api, &["model", "show", "x"]).0, 2);
    let (code, _, err) = cli(&api, &["model", "delete", "m", "--reason", "x"]);
    assert_eq!(code, 0, "m has no active rollout once promoted: {err}");
}

/// Named tokens over the CLI against a controller process: the shared
/// token makes a viewer; the viewer reads but cannot change anything; once
/// revoked it is refused, with no restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_makes_a_viewer_token_that_reads_cannot_write_and_stops_when_revoked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ctl = start_controller(dir.path(), &[("ROLLGATE_TOKEN", "boot-secret")]);
    let api = ctl.addr().to_string();
    let boot = Some("boot-secret");
    let (code, out, err) = cli_as(&api, boot, &["token", "create", "vera", "--role", "viewer"]);
    assert_eq!(code, 0, "{err}");
    let secret = out.lines().last().unwrap_or("").trim().to_string();
    assert!(secret.starts_with("rgt_"), "{out}");
    let vera = Some(secret.as_str());
    assert_eq!(cli_as(&api, vera, &["model", "list"]).0, 0);
    let (code, _, err) = cli_as(&api, vera, &["model", "add", "m"]);
    assert_ne!(code, 0);
    assert!(
        err.contains("forbidden_role") || err.contains("viewer"),
        "{err}"
    );
    let (code, out, _) = cli_as(&api, boot, &["token", "list"]);
    assert_eq!(code, 0);
    assert!(out.contains("vera") && !out.contains("rgt_"), "{out}");
    assert_eq!(cli_as(&api, boot, &["token", "revoke", "vera"]).0, 0);
    let (code, _, err) = cli_as(&api, vera, &["model", "list"]);
    assert_ne!(code, 0);
    assert!(err.contains("unauthorized") || err.contains("401"), "{err}");
}

/// A running controller signs the audit chain's head into the store and a
/// sink file; cutting the log's tail (with the triggers dropped, as an
/// attacker with the database would) leaves the chain verifying but not
/// the checkpoints, and `rollgate audit verify` says so and exits 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_audit_tail_is_caught_by_the_controllers_signed_checkpoints() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ctl = start_controller(dir.path(), &[]);
    let c = client();
    for name in ["a", "b", "c"] {
        let (s, v) = api(
            &c,
            &ctl,
            "POST",
            "/api/v1/models",
            Some(json!({ "name": name })),
        )
        .await;
        assert_eq!(s, 201, "{v}");
    }
    // Bounded wait for the controller's next pass to sign record 3.
    let started = Instant::now();
    loop {
        let (_, v) = api(&c, &ctl, "GET", "/api/v1/audit/verify", None).await;
        if v["anchors"]["latest"] == 3 {
            assert_eq!(v["anchors"]["problems"], json!([]), "{v}");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "never signed: {v}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let sink = std::fs::read_to_string(dir.path().join("data/checkpoints.jsonl")).expect("sink");
    assert!(sink.contains("\"seq\":3"), "{sink}");
    let db = rusqlite::Connection::open(dir.path().join("data/rollgate.db")).expect("raw");
    db.busy_timeout(Duration::from_secs(10))
        .expect("busy timeout");
    db.execute_batch("DROP TRIGGER audit_is_append_only_delete; DELETE FROM audit WHERE seq = 3;")
        .expect("tamper");
    let (code, out, _) = cli(ctl.addr(), &["audit", "verify"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("cut from its tail"), "{out}");
    assert!(
        out.contains("\"first_break\": null"),
        "the chain alone misses it: {out}"
    );
}

/// The candidate's requests in the ledger never exceed what its model
/// server answered: nothing is counted twice.
async fn assert_counted_once(c: &HttpClient, ctl: &Proc, id: i64, cand: &str, served: &Model) {
    let (_, r) = api(c, ctl, "GET", &format!("/api/v1/rollouts/{id}"), None).await;
    let counted = ledger_requests(&r, cand);
    let answered = served.predictions.load(Ordering::SeqCst);
    assert!(counted > 0, "nothing counted: {r}");
    assert!(
        counted <= answered,
        "counted {counted} candidate requests, the model server answered {answered}"
    );
}

/// What a promoted rollout interrupted by kills must look like: started
/// once, two advances, no rollback, nothing counted twice, the audit chain
/// intact — as if nothing had been killed.
async fn assert_as_if_uninterrupted(
    c: &HttpClient,
    ctl: &Proc,
    id: i64,
    cand: &str,
    served: &Model,
) {
    let kinds = audit_kinds(c, ctl, id).await;
    assert_eq!(count(&kinds, "started"), 1, "{kinds:?}");
    assert_eq!(count(&kinds, "advanced"), 2, "{kinds:?}");
    assert_eq!(count(&kinds, "rolled_back"), 0, "{kinds:?}");
    assert_counted_once(c, ctl, id, cand, served).await;
    assert!(chain_intact(c, ctl).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_killed_mid_canary_and_restarted_loses_and_double_counts_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ctl = start_controller(dir.path(), &[]);
    let c = client();
    let champion = model_server(Model::new(false)).await;
    let candidate = Model::new(false);
    let cand_url = model_server(candidate.clone()).await;
    let (_, cand) = setup(&c, &ctl, &champion, &cand_url).await;
    let listen = free_addr();
    let mut gw = start_gateway_on(dir.path(), &listen);
    let stop = Arc::new(AtomicBool::new(false));
    let load = traffic(gw.addr(), Arc::clone(&stop));
    let id = start_rollout(&c, &ctl, &cand).await;
    wait_for(&c, &ctl, id, Duration::from_secs(30), |r| {
        phase(r) == "canary"
    })
    .await;
    gw.kill(); // SIGKILL, mid-canary, after a SHADOW stage
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _gw = start_gateway_on(dir.path(), &listen);
    // It serves only once its routes are loaded: the first request after
    // the restart is routed, never a 404.
    let (s, body, _) = request(
        &c,
        "POST",
        &format!("http://{listen}/v1/models/m:predict"),
        Some(json!({"instances": [[1]]})),
        None,
    )
    .await;
    assert_eq!(s, 200, "first request after the restart: {body}");
    let r = wait_for(&c, &ctl, id, Duration::from_secs(60), finished).await;
    assert_eq!(phase(&r), "promoted", "{r}");
    assert!(ledger_series(&r) >= 2, "a restart is a new series: {r}");
    assert_as_if_uninterrupted(&c, &ctl, id, &cand, &candidate).await;
    stop.store(true, Ordering::SeqCst);
    let _ = load.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_one_restarted_twice_promote_an_identical_candidate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ctl = start_controller(dir.path(), &[]);
    let c = client();
    let champion = model_server(Model::new(false)).await;
    let candidate = Model::new(false);
    let cand_url = model_server(candidate.clone()).await;
    let (_, cand) = setup(&c, &ctl, &champion, &cand_url).await;
    let listen = free_addr();
    let steady = start_gateway(dir.path());
    let mut flappy = start_gateway_on(dir.path(), &listen);
    let stop = Arc::new(AtomicBool::new(false));
    let loads = [
        traffic(steady.addr(), Arc::clone(&stop)),
        traffic(&listen, Arc::clone(&stop)),
    ];
    let id = start_rollout(&c, &ctl, &cand).await;
    for stage in ["shadow", "canary"] {
        wait_for(&c, &ctl, id, Duration::from_secs(30), |r| {
            phase(r) == stage || finished(r)
        })
        .await;
        flappy.kill();
        tokio::time::sleep(Duration::from_millis(300)).await;
        flappy = start_gateway_on(dir.path(), &listen);
    }
    let r = wait_for(&c, &ctl, id, Duration::from_secs(60), finished).await;
    assert_eq!(phase(&r), "promoted", "{r}");
    assert_counted_once(&c, &ctl, id, &cand, &candidate).await;
    assert!(chain_intact(&c, &ctl).await);
    stop.store(true, Ordering::SeqCst);
    for l in loads {
        let _ = l.await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_late_in_the_last_stage_holds_then_promotes_without_rejecting() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ctl = start_controller(dir.path(), &[]);
    let c = client();
    let (champion_model, candidate_model) = (Model::new(false), Model::new(false));
    let champion = model_server(champion_model.clone()).await;
    let candidate = model_server(candidate_model.clone()).await;
    let (_, cand) = setup(&c, &ctl, &champion, &candidate).await;
    let gw = start_gateway(dir.path());
    let stop = Arc::new(AtomicBool::new(false));
    let load = traffic(gw.addr(), Arc::clone(&stop));
    let mut p = plan();
    p["min_stage_duration"] = json!("8s");
    p["evidence_timeout"] = json!("40s");
    let id = start_rollout_with(&c, &ctl, &cand, p).await;
    // Healthy for 3 s of the 50% stage, then both arms fail everything.
    wait_for(&c, &ctl, id, Duration::from_secs(60), |r| {
        r["state"]["phase"]["weight_percent"] == 50
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    champion_model.failing.store(true, Ordering::SeqCst);
    candidate_model.failing.store(true, Ordering::SeqCst);
    let began = Instant::now();
    let r = wait_for(&c, &ctl, id, Duration::from_secs(10), |r| {
        r["state"]["last_verdict"]["reason"]["code"] == "shared_outage" || finished(r)
    })
    .await;
    assert!(!finished(&r), "{r}");
    assert!(
        began.elapsed() <= Duration::from_secs(6),
        "outage recognised after {:?}",
        began.elapsed()
    );
    // Held past the stage's minimum duration while the outage lasts.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let (_, r) = api(&c, &ctl, "GET", &format!("/api/v1/rollouts/{id}"), None).await;
    assert!(!finished(&r), "{r}");
    champion_model.failing.store(false, Ordering::SeqCst);
    candidate_model.failing.store(false, Ordering::SeqCst);
    let r = wait_for(&c, &ctl, id, Duration::from_secs(60), finished).await;
    assert_eq!(phase(&r), "promoted", "{r}");
    let (_, rev) = api(&c, &ctl, "GET", &format!("/api/v1/revisions/{cand}"), None).await;
    assert_eq!(rev["blocked"], false, "{rev}");
    assert_eq!(rev["rejections"], 0, "{rev}");
    stop.store(true, Ordering::SeqCst);
    let _ = load.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_timeouts_on_both_arms_across_shadow_and_canary_do_not_roll_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ctl = start_controller(dir.path(), &[]);
    let c = client();
    // One request in 200 hangs past the revisions' 1 s timeout, on both.
    let champion = model_server(Model::hanging_one_in(200)).await;
    let candidate = model_server(Model::hanging_one_in(200)).await;
    let (s, _) = api(
        &c,
        &ctl,
        "POST",
        "/api/v1/models",
        Some(json!({ "name": "m" })),
    )
    .await;
    assert_eq!(s, 201);
    let mut ids = Vec::new();
    for url in [&champion, &candidate] {
        let (s, rev) = api(
            &c,
            &ctl,
            "POST",
            "/api/v1/models/m/revisions",
            Some(json!({ "upstream": url, "timeout_ms": 1000 })),
        )
        .await;
        assert_eq!(s, 201, "{rev}");
        ids.push(rev["id"].as_str().expect("id").to_string());
    }
    let (s, _) = api(
        &c,
        &ctl,
        "PUT",
        "/api/v1/models/m/champion",
        Some(json!({ "revision": ids[0], "reason": "first" })),
    )
    .await;
    assert_eq!(s, 200);
    let gw = start_gateway(dir.path());
    let stop = Arc::new(AtomicBool::new(false));
    let load = traffic(gw.addr(), Arc::clone(&stop));
    let mut p = plan();
    p["steps"] = json!([5]);
    p["min_stage_duration"] = json!("4s");
    p["evidence_timeout"] = json!("30s");
    let (s, r) = api(
        &c,
        &ctl,
        "POST",
        "/api/v1/rollouts",
        Some(json!({ "model": "m", "revision": ids[1], "plan": p })),
    )
    .await;
    assert_eq!(s, 201, "{r}");
    let id = r["id"].as_i64().expect("id");
    let r = wait_for(&c, &ctl, id, Duration::from_secs(60), finished).await;
    assert_eq!(phase(&r), "promoted", "{r}");
    stop.store(true, Ordering::SeqCst);
    let _ = load.await;
}

/// `rollgate up` on fixed loopback ports; `addr()` is its admin API and
/// `addrs[1]` its gateway.
pub(crate) fn start_up(dir: &Path, gateway: &str, api: &str) -> Proc {
    let cfg = write(
        dir,
        "up.toml",
        &format!(
            "[api]\nlisten = \"{api}\"\n[controller]\ntick = \"200ms\"\nfollow_interval = \"200ms\"\ngateway_ttl = \"3s\"\nlease_ttl = \"2s\"\n[gateway]\nlisten = \"{gateway}\"\n"
        ),
    );
    let data = dir.join("data");
    let mut up = spawn(
        &["up", "--config", &cfg, "--data", &data.to_string_lossy()],
        &[],
    );
    up.addrs.swap(0, 1);
    up
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollgate_up_killed_mid_canary_and_restarted_reaches_the_same_outcome() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (gw_addr, api_addr) = (free_addr(), free_addr());
    let mut up = start_up(dir.path(), &gw_addr, &api_addr);
    let c = client();
    let champion = model_server(Model::new(false)).await;
    let candidate = Model::new(false);
    let cand_url = model_server(candidate.clone()).await;
    let (_, cand) = setup(&c, &up, &champion, &cand_url).await;
    let stop = Arc::new(AtomicBool::new(false));
    let load = traffic(&gw_addr, Arc::clone(&stop));
    let id = start_rollout(&c, &up, &cand).await;
    wait_for(&c, &up, id, Duration::from_secs(30), |r| {
        phase(r) == "canary"
    })
    .await;
    up.kill(); // SIGKILL: gateway, controller and API at once
    tokio::time::sleep(Duration::from_millis(300)).await;
    let up = start_up(dir.path(), &gw_addr, &api_addr);
    let r = wait_for(&c, &up, id, Duration::from_secs(60), finished).await;
    assert_eq!(phase(&r), "promoted", "{r}");
    assert_as_if_uninterrupted(&c, &up, id, &cand, &candidate).await;
    stop.store(true, Ordering::SeqCst);
    let _ = load.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_answering_404_is_rolled_back_for_a_breach_not_a_timeout() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ctl = start_controller(dir.path(), &[]);
    let c = client();
    let champion = model_server(Model::new(false)).await;
    let wrong_name = model_server(Model {
        not_found: true,
        ..Model::new(false)
    })
    .await;
    let (_, cand) = setup(&c, &ctl, &champion, &wrong_name).await;
    let gw = start_gateway(dir.path());
    let stop = Arc::new(AtomicBool::new(false));
    let load = traffic(gw.addr(), Arc::clone(&stop));
    let id = start_rollout(&c, &ctl, &cand).await;
    let r = wait_for(&c, &ctl, id, Duration::from_secs(30), finished).await;
    assert_eq!(phase(&r), "rolled_back", "{r}");
    assert_eq!(
        r["state"]["phase"]["reason"]["code"], "anytime_breach",
        "{r}"
    );
    let (_, rev) = api(&c, &ctl, "GET", &format!("/api/v1/revisions/{cand}"), None).await;
    assert_eq!(rev["blocked"], true, "shown worse: rejected: {rev}");
    stop.store(true, Ordering::SeqCst);
    let _ = load.await;
}

/// A dry run (plan `mode = "observe"`) through real processes: the broken
/// candidate is judged on mirrored traffic and "would roll back", the
/// healthy one "would promote"; meanwhile every user is answered by the
/// champion, nothing is rejected or promoted, every record is marked, and
/// no rollback is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_judges_on_mirrored_traffic_and_changes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ctl = start_controller(dir.path(), &[]);
    let c = client();
    let champion = model_server(Model::new(false)).await;
    let broken = model_server(Model::new(true)).await;
    let healthy = model_server(Model::new(false)).await;
    let (champ, bad) = setup(&c, &ctl, &champion, &broken).await;
    let good = register(&c, &ctl, &healthy).await;
    let gw = start_gateway(dir.path());
    let mut observe = plan();
    observe["mode"] = json!("observe");
    for (cand, ends) in [(&bad, "rolled_back"), (&good, "promoted")] {
        let stop = Arc::new(AtomicBool::new(false));
        let load = traffic_by_revision(gw.addr(), Arc::clone(&stop));
        let id = start_rollout_with(&c, &ctl, cand, observe.clone()).await;
        let r = wait_for(&c, &ctl, id, Duration::from_secs(60), finished).await;
        stop.store(true, Ordering::SeqCst);
        let by = load.await.expect("traffic");
        assert_eq!(phase(&r), ends, "{r}");
        // Every user was answered by the champion, all along.
        assert_eq!(by.keys().collect::<Vec<_>>(), [&champ], "{by:?}");
        assert!(by[&champ] > 50, "{by:?}");
        // The candidate was judged on mirrored copies.
        assert!(ledger_requests(&r, cand) > 0, "{}", r["state"]["evidence"]);
        let (_, rev) = api(&c, &ctl, "GET", &format!("/api/v1/revisions/{cand}"), None).await;
        assert_eq!(rev["state"], "available", "{rev}");
        assert_eq!(rev["blocked"], false, "{rev}");
        let (_, m) = api(&c, &ctl, "GET", "/api/v1/models/m", None).await;
        assert_eq!(m["champion"].as_str(), Some(champ.as_str()));
        let (_, records) = api(
            &c,
            &ctl,
            "GET",
            &format!("/api/v1/audit?rollout={id}"),
            None,
        )
        .await;
        for rec in records.as_array().into_iter().flatten() {
            if rec["kind"] != "rollout_created" {
                assert_eq!(rec["body"]["dry_run"], true, "{rec}");
            }
        }
        let (_, list) = api(&c, &ctl, "GET", "/api/v1/rollouts?model=m&limit=1", None).await;
        assert_eq!(list[0]["dry_run"], true, "{list}");
    }
    let metrics = raw_get(&format!("http://{}/metrics", ctl.addr())).await;
    // No rollback counted, for any reason (each series is there, at 0).
    let rollbacks: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("rollgate_rollbacks_total{"))
        .collect();
    assert!(!rollbacks.is_empty(), "{metrics}");
    assert!(rollbacks.iter().all(|l| l.ends_with(" 0")), "{rollbacks:?}");
    assert!(chain_intact(&c, &ctl).await);
}

async fn raw_get(url: &str) -> String {
    let resp = client()
        .request(
            Request::builder()
                .uri(url)
                .body(Full::new(Bytes::new()))
                .expect("req"),
        )
        .await
        .expect("http");
    String::from_utf8_lossy(&resp.into_body().collect().await.expect("body").to_bytes())
        .into_owned()
}
