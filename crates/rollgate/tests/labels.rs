//! Quality from delayed labels, end to end with real processes on
//! 127.0.0.1: `rollgate controller` and `rollgate gateway` meeting in one
//! store, the gateway recording each arm's answer under the request's id,
//! the controller reading them, labels sent to the admin API afterwards by
//! a `labeler` token, and the SHADOW stage judged on them. Every wait is
//! bounded.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::*;

/// A plan whose SHADOW stage is judged on labels alone: the agreement
/// gate is off, the quality gate on; answers judged once 2 s old (the
/// tests' labels come within it, or are sent with their window widened).
fn labelled_plan() -> Value {
    json!({
        "steps": [50],
        "min_stage_duration": "1s",
        "evidence_timeout": "60s",
        "readiness_timeout": "5s",
        "gates": {
            "error_rate": { "min_requests": 20, "margin": 0.05 },
            "latency": { "min_requests": 20 },
            "shadow": { "min_pairs": 1, "min_agreement": 0.0, "max_flip_rate": 1.0 },
            "quality": {
                "enabled": true, "min_labels": 20, "margin": 0.05,
                "label_window": "2s", "label_deadline": "60s"
            }
        }
    })
}

/// One prediction through the gateway under request id `id`.
async fn predict(c: &HttpClient, gateway: &str, id: &str) -> u16 {
    predict_body(c, gateway, id, r#"{"instances":[[1]]}"#.into()).await
}

/// One prediction of `body` through the gateway under request id `id`.
async fn predict_body(c: &HttpClient, gateway: &str, id: &str, body: String) -> u16 {
    predict_answered_by(c, gateway, Some(id), body).await.0
}

/// Labels sent to the API as `token` (`None`: as the local admin).
pub(crate) async fn send_labels(
    c: &HttpClient,
    ctl: &Proc,
    token: Option<&str>,
    body: Value,
) -> (u16, Value) {
    let (s, v, _) = request(
        c,
        "POST",
        &format!("http://{}/api/v1/models/m/labels", ctl.addr()),
        Some(body),
        token,
    )
    .await;
    (s, v)
}

/// A label batch announcing 10 MB, as `token`, over a raw connection: the
/// answer's status and body, read once the API has answered (the body
/// is written only as far as the API takes it).
async fn ten_megabytes(api: &str, token: &str) -> (u16, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(api).await.expect("connect");
    let head = format!(
        "POST /api/v1/models/m/labels HTTP/1.1\r\nhost: {api}\r\nauthorization: Bearer {token}\r\n\
         content-type: application/json\r\ncontent-length: 10000000\r\nconnection: close\r\n\r\n"
    );
    conn.write_all(head.as_bytes()).await.expect("head");
    let chunk = vec![b' '; 64 << 10];
    for _ in 0..(10_000_000 / chunk.len()) {
        let write = tokio::time::timeout(Duration::from_millis(200), conn.write_all(&chunk));
        if !matches!(write.await, Ok(Ok(()))) {
            break;
        }
    }
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), conn.read_to_end(&mut answer));
    let _ = read.await;
    let text = String::from_utf8_lossy(&answer);
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    // The JSON document, whatever the framing (whole, or one chunk).
    let json = match (text.find('{'), text.rfind('}')) {
        (Some(a), Some(b)) if a < b => serde_json::from_str(&text[a..=b]).unwrap_or(Value::Null),
        _ => Value::Null,
    };
    (status, json)
}

/// `rollgate labels send m FILE --output json` as `token`: its exit code,
/// stdout and stderr.
fn labels_cli(api: &str, token: &str, file: &std::path::Path) -> (i32, String, String) {
    let file = file.to_str().expect("a UTF-8 path");
    let args = ["labels", "send", "m", file, "--output", "json"];
    cli_as(api, Some(token), &args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_wrong_on_labels_is_refused_in_shadow_and_the_label_api_counts_what_it_cannot_apply()
 {
    let dir = tempfile::tempdir().expect("tempdir");
    let ctl = start_controller(dir.path(), &[]);
    let c = client();
    // The champion predicts class 1, the truth for every request; the
    // candidate predicts class 0 for every other one.
    let champion = model_server(Model::new(false)).await;
    let candidate = model_server(Model {
        class_0_every: 2,
        ..Model::new(false)
    })
    .await;
    let (_, cand) = setup(&c, &ctl, &champion, &candidate).await;
    // A labelling pipeline's token: it may send labels and nothing else.
    let (s, t) = api(
        &c,
        &ctl,
        "POST",
        "/api/v1/tokens",
        Some(json!({"name": "pipeline", "role": "labeler"})),
    )
    .await;
    assert_eq!(s, 201, "{t}");
    let labeler = t["secret"].as_str().expect("secret").to_string();
    let gw = start_gateway(dir.path());
    let id = start_rollout_with(&c, &ctl, &cand, labelled_plan()).await;
    wait_for(&c, &ctl, id, Duration::from_secs(20), |r| {
        phase(r) == "shadow"
    })
    .await;

    let started = Instant::now();
    let mut sent = 0u64;
    let r = loop {
        // Ten requests, then their labels, as a pipeline would send them
        // once the truth is known.
        let ids: Vec<String> = (sent..sent + 10).map(|i| format!("req-{i}")).collect();
        for rid in &ids {
            assert_eq!(predict(&c, gw.addr(), rid).await, 200);
        }
        sent += 10;
        // The controller keeps answers it has read from the gateway; give
        // it a pass to read these before their labels come.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let labels: Vec<Value> = ids
            .iter()
            .map(|rid| json!({"request_id": rid, "label": 1}))
            .collect();
        let (s, counts) = send_labels(&c, &ctl, Some(&labeler), json!({"labels": labels})).await;
        assert_eq!(s, 200, "{counts}");
        assert_eq!(counts["received"], 10, "{counts}");
        let (_, r) = api(&c, &ctl, "GET", &format!("/api/v1/rollouts/{id}"), None).await;
        if finished(&r) {
            break r;
        }
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "not decided after {sent} labelled requests: {r}"
        );
    };
    assert_eq!(phase(&r), "rolled_back", "{r}");
    let reason = &r["state"]["phase"]["reason"];
    assert_eq!(reason["code"], "anytime_breach", "{r}");
    assert_eq!(reason["gates"], json!(["quality"]), "{r}");
    assert!(
        sent <= 200,
        "refused after {sent} requests (half of the candidate's answers wrong)"
    );

    // Labels again: the same ones are duplicates, a different one is a
    // conflict (not applied), an id no answer has is unknown (kept); one
    // bad entry refuses the whole batch, naming it, and applies nothing.
    let labelled: Vec<String> = (0..4).map(|i| format!("req-{i}")).collect();
    let (s, counts) = send_labels(
        &c,
        &ctl,
        Some(&labeler),
        json!({"labels": [
            {"request_id": labelled[0], "label": 1},
            {"request_id": labelled[1], "label": 0},
            {"request_id": "never-seen", "label": 1},
        ]}),
    )
    .await;
    assert_eq!(s, 200, "{counts}");
    assert_eq!(
        (
            &counts["applied"],
            &counts["duplicates"],
            &counts["conflicts"],
            &counts["unknown"]
        ),
        (&json!(0), &json!(1), &json!(1), &json!(1)),
        "{counts}"
    );
    let (s, e) = send_labels(
        &c,
        &ctl,
        Some(&labeler),
        json!({"labels": [
            {"request_id": labelled[2], "label": 1},
            {"request_id": "x", "label": {"nested": true}},
        ]}),
    )
    .await;
    assert_eq!(s, 422, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("labels[1].label"),
        "{e}"
    );
    // A 10 MB body: refused from its length, before it is read, with the
    // error envelope (a client still writing it finds the socket closed).
    let (s, e) = ten_megabytes(ctl.addr(), &labeler).await;
    assert_eq!(s, 413, "a body over the API's limit: {e}");
    assert!(e["error"]["message"].is_string(), "{e}");
    // Each accepted batch is one audit record of its counts.
    let (_, audit) = api(&c, &ctl, "GET", "/api/v1/audit?model=m&limit=1000", None).await;
    let batches = audit
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["kind"] == "labels_received")
        .count() as u64;
    assert_eq!(batches, sent / 10 + 1, "{audit}");

    // The CLI sends a file of them the same way, as the labeler: a bad
    // line stops it before anything is sent.
    let file = dir.path().join("labels.csv");
    std::fs::write(
        &file,
        format!("request_id,label\n{},1\nfresh-id,0\n", labelled[3]),
    )
    .expect("csv");
    let (code, out, err) = labels_cli(ctl.addr(), &labeler, &file);
    assert_eq!(code, 0, "{err}");
    let sent_counts: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(
        (&sent_counts["duplicates"], &sent_counts["unknown"]),
        (&json!(1), &json!(1)),
        "{out}"
    );
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"request_id\": \"a\", \"label\": 1}\nnot json\n").expect("jsonl");
    let (code, _, err) = labels_cli(ctl.addr(), &labeler, &bad);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("line 2"), "{err}");

    // The labeler may do nothing else: not read, not start a rollout.
    let (s, _, _) = request(
        &c,
        "GET",
        &format!("http://{}/api/v1/models", ctl.addr()),
        None,
        Some(&labeler),
    )
    .await;
    assert_eq!(s, 403);
    let (s, _, _) = request(
        &c,
        "POST",
        &format!("http://{}/api/v1/rollouts", ctl.addr()),
        Some(json!({"model": "m", "revision": cand})),
        Some(&labeler),
    )
    .await;
    assert_eq!(s, 403);
    assert!(chain_intact(&c, &ctl).await);
}

/// Requests of the synthetic task through the gateway, each request's
/// label (the task's ground truth) sent 0–10 s after its answer (plans
/// judging them give a window of [`ZOO_WINDOW`]), until rollout `id` ends.
/// Returns the rollout and the requests sent.
async fn labelled_traffic(
    c: &HttpClient,
    ctl: &Proc,
    gw: &str,
    id: i64,
    seed: u64,
) -> (Value, usize) {
    labelled_traffic_until(c, ctl, gw, (id, seed), finished).await
}

/// [`labelled_traffic`] until `until` holds of the rollout.
async fn labelled_traffic_until(
    c: &HttpClient,
    ctl: &Proc,
    gw: &str,
    (id, seed): (i64, u64),
    until: impl Fn(&Value) -> bool,
) -> (Value, usize) {
    use rand::{Rng, SeedableRng};
    let (xs, ys) = rollgate_modelkit::task::sample(20_000, seed);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    // Labels not yet due: (when, request).
    let mut owed: Vec<(Instant, usize)> = Vec::new();
    let started = Instant::now();
    let mut sent = 0;
    loop {
        for (i, x) in xs.iter().enumerate().skip(sent).take(20) {
            let body = json!({"instances": [x.to_vec()]}).to_string();
            assert_eq!(predict_body(c, gw, &format!("{seed}-{i}"), body).await, 200);
            let delay = Duration::from_millis(rng.random_range(0..10_000));
            owed.push((Instant::now() + delay, i));
        }
        sent += 20;
        let now = Instant::now();
        let due: Vec<Value> = owed
            .iter()
            .filter(|(at, _)| *at <= now)
            .map(|&(_, i)| json!({"request_id": format!("{seed}-{i}"), "label": u8::from(ys[i])}))
            .collect();
        owed.retain(|(at, _)| *at > now);
        if !due.is_empty() {
            let (s, counts) = send_labels(c, ctl, None, json!({"labels": due})).await;
            assert_eq!(s, 200, "{counts}");
        }
        let (_, r) = api(c, ctl, "GET", &format!("/api/v1/rollouts/{id}"), None).await;
        if until(&r) {
            return (r, sent);
        }
        assert!(
            started.elapsed() < Duration::from_secs(240) && sent + 20 <= xs.len(),
            "not decided after {sent} requests: {r}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The label window of the zoo's plans: past every label's delay.
const ZOO_WINDOW: &str = "12s";

/// The model zoo's champion and `candidates` served by `rollgate serve`,
/// the controller and a gateway; returns the servers (kept alive), the
/// controller, the gateway and the candidates' revision ids.
async fn zoo(dir: &std::path::Path, candidates: &[&str]) -> (Vec<Proc>, Proc, Proc, Vec<String>) {
    let champion_path = crate::prometheus::trained_model(dir);
    let models = std::path::Path::new(&champion_path)
        .parent()
        .expect("models dir")
        .to_path_buf();
    let path = |name: &str| {
        models
            .join(format!("{name}.json"))
            .to_string_lossy()
            .into_owned()
    };
    let servers: Vec<Proc> = std::iter::once("champion")
        .chain(candidates.iter().copied())
        .map(|m| crate::prometheus::serve(&path(m), &[]))
        .collect();
    let url = |p: &Proc| format!("http://{}", p.addr());
    let ctl = start_controller(dir, &[]);
    let c = client();
    let (_, first) = setup(&c, &ctl, &url(&servers[0]), &url(&servers[1])).await;
    let mut ids = vec![first];
    for server in &servers[2..] {
        let (s, rev) = api(
            &c,
            &ctl,
            "POST",
            "/api/v1/models/m/revisions",
            Some(json!({ "upstream": url(server) })),
        )
        .await;
        assert_eq!(s, 201, "{rev}");
        ids.push(rev["id"].as_str().expect("id").to_string());
    }
    let gw = start_gateway(dir);
    (servers, ctl, gw, ids)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_model_zoo_broken_feature_is_refused_in_shadow_on_labels_and_retrained_is_promoted()
{
    let dir = tempfile::tempdir().expect("tempdir");
    let (_servers, ctl, gw, ids) = zoo(dir.path(), &["broken-feature", "retrained"]).await;
    let (broken, retrained) = (&ids[0], &ids[1]);
    let c = client();
    // Labels judge alone in SHADOW (the agreement gate is off); the
    // margin lets the canary pass on a few hundred labels.
    let mut plan = labelled_plan();
    plan["gates"]["quality"]["margin"] = json!(0.3);
    plan["gates"]["quality"]["min_labels"] = json!(50);
    plan["gates"]["quality"]["label_window"] = json!(ZOO_WINDOW);

    let id = start_rollout_with(&c, &ctl, broken, plan.clone()).await;
    wait_for(&c, &ctl, id, Duration::from_secs(20), |r| {
        phase(r) == "shadow"
    })
    .await;
    let (r, sent) = labelled_traffic(&c, &ctl, gw.addr(), id, 1).await;
    assert_eq!(phase(&r), "rolled_back", "{r}");
    assert_eq!(
        r["state"]["phase"]["reason"]["gates"],
        json!(["quality"]),
        "{r}"
    );
    eprintln!("broken-feature refused in SHADOW after {sent} requests");

    let id = start_rollout_with(&c, &ctl, retrained, plan).await;
    wait_for(&c, &ctl, id, Duration::from_secs(20), |r| {
        phase(r) == "shadow"
    })
    .await;
    let (r, sent) = labelled_traffic(&c, &ctl, gw.addr(), id, 2).await;
    assert_eq!(phase(&r), "promoted", "{r}");
    eprintln!("retrained promoted after {sent} requests");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watch_after_promotion_rolls_back_a_revision_whose_late_labels_come_in_worse() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_servers, ctl, gw, ids) = zoo(dir.path(), &["broken-feature"]).await;
    let c = client();
    let (_, model) = api(&c, &ctl, "GET", "/api/v1/models/m", None).await;
    let champion = model["champion"].as_str().expect("champion").to_string();
    // Labels come too late for the stages: only the watch judges them.
    let mut plan = labelled_plan();
    plan["gates"]["quality"]["in_stages"] = json!(false);
    plan["gates"]["quality"]["label_window"] = json!(ZOO_WINDOW);
    plan["watch"] = json!({ "window": "10m", "mirror_percent": 100 });
    let id = start_rollout_with(&c, &ctl, &ids[0], plan).await;
    let watching = |r: &Value| phase(r) == "watching" || finished(r);
    let (r, before) = labelled_traffic_until(&c, &ctl, gw.addr(), (id, 3), watching).await;
    assert_eq!(phase(&r), "watching", "{r}");
    let (_, m) = api(&c, &ctl, "GET", "/api/v1/models/m", None).await;
    assert_eq!(m["champion"], ids[0].as_str(), "promoted: {m}");
    let api_addr = ctl.addr().to_string();
    let (code, out, err) = cli(&api_addr, &["rollout", "status", &id.to_string()]);
    assert!(code == 0 && out.contains("WATCHING until"), "{out}{err}");

    let (r, sent) = labelled_traffic(&c, &ctl, gw.addr(), id, 4).await;
    assert_eq!(
        r["state"]["phase"]["reason"]["code"], "watch_regression",
        "{r}"
    );
    eprintln!(
        "broken-feature promoted after {before} requests, rolled back by the watch after {sent} more"
    );
    // The previous champion is champion again; the candidate rejected.
    let (_, m) = api(&c, &ctl, "GET", "/api/v1/models/m", None).await;
    assert_eq!(m["champion"], champion.as_str(), "{m}");
    let (_, rev) = api(
        &c,
        &ctl,
        "GET",
        &format!("/api/v1/revisions/{}", ids[0]),
        None,
    )
    .await;
    assert_eq!(rev["state"], "rejected", "{rev}");
    // The gateway serves the champion again.
    let mut served = None;
    for _ in 0..100 {
        let body = json!({"instances": [rollgate_modelkit::task::sample(1, 99).0[0].to_vec()]});
        let (status, who) = predict_answered_by(&c, gw.addr(), None, body.to_string()).await;
        assert_eq!(status, 200);
        if who == champion {
            served = Some(who);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(served.as_deref(), Some(champion.as_str()));
    // `rollout wait` names it: exit 4.
    let (code, out, err) = cli(&api_addr, &["rollout", "wait", &id.to_string()]);
    assert_eq!(code, 4, "{out}{err}");
    assert!(out.contains("after promotion"), "{out}");
    assert!(chain_intact(&c, &ctl).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_label_deadline_passing_with_too_few_labels_ends_the_rollout_with_label_timeout() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ctl = start_controller(dir.path(), &[]);
    let c = client();
    let champion = model_server(Model::new(false)).await;
    let candidate = model_server(Model::new(false)).await;
    let (_, cand) = setup(&c, &ctl, &champion, &candidate).await;
    let gw = start_gateway(dir.path());
    let mut plan = labelled_plan();
    plan["gates"]["quality"]["label_deadline"] = json!("3s");
    plan["gates"]["quality"]["label_window"] = json!("1s");
    let id = start_rollout_with(&c, &ctl, &cand, plan).await;
    wait_for(&c, &ctl, id, Duration::from_secs(20), |r| {
        phase(r) == "shadow"
    })
    .await;
    // Answers come, labels never do.
    let started = Instant::now();
    let mut n = 0;
    let r = loop {
        assert_eq!(predict(&c, gw.addr(), &format!("t-{n}")).await, 200);
        n += 1;
        let (_, r) = api(&c, &ctl, "GET", &format!("/api/v1/rollouts/{id}"), None).await;
        if finished(&r) {
            break r;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "{r}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        r["state"]["phase"]["reason"]["code"], "label_timeout",
        "{r}"
    );
    assert_eq!(r["state"]["phase"]["reason"]["labelled"], 0, "{r}");
    // Not shown worse: the candidate may be rolled out again.
    let (_, rev) = api(&c, &ctl, "GET", &format!("/api/v1/revisions/{cand}"), None).await;
    assert_ne!(rev["state"], "rejected", "{rev}");
}
