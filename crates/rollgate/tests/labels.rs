//! Quality from delayed labels, end to end with real processes on
//! 127.0.0.1: `rollgate controller` and `rollgate gateway` meeting in one
//! store, the gateway recording each arm's answer under the request's id,
//! the controller reading them, labels sent to the admin API afterwards by
//! a `labeler` token, and the SHADOW stage judged on them. Every wait is
//! bounded.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use serde_json::{Value, json};

use crate::common::*;

/// A plan whose SHADOW stage is judged on labels alone: the agreement
/// gate is off, the quality gate on.
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
            "quality": { "enabled": true, "min_labels": 20, "margin": 0.05, "label_deadline": "60s" }
        }
    })
}

/// One prediction through the gateway under request id `id`.
async fn predict(c: &HttpClient, gateway: &str, id: &str) -> u16 {
    let req = Request::builder()
        .method("POST")
        .uri(format!("http://{gateway}/v1/models/m:predict"))
        .header("content-type", "application/json")
        .header("x-request-id", id)
        .body(Full::new(Bytes::from(r#"{"instances":[[1]]}"#)))
        .expect("request");
    let resp = tokio::time::timeout(Duration::from_secs(10), c.request(req))
        .await
        .expect("answered within 10 s")
        .expect("http");
    let status = resp.status().as_u16();
    let _ = resp.into_body().collect().await;
    status
}

/// Labels sent to the API as `token` (`None`: as the local admin).
async fn send_labels(c: &HttpClient, ctl: &Proc, token: Option<&str>, body: Value) -> (u16, Value) {
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
    // Ids of a batch whose labels were all applied (its answers were read
    // from the gateway in time).
    let mut labelled: Vec<String> = Vec::new();
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
        if counts["applied"] == 10 {
            labelled.clone_from(&ids);
        }
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
    // conflict (not applied), an id no answer has is unknown; one bad
    // entry refuses the whole batch, naming it, and applies nothing.
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
    let big = "x".repeat(3 << 20);
    let (s, _) = send_labels(&c, &ctl, Some(&labeler), json!({"labels": [], "pad": big})).await;
    assert_eq!(s, 413, "a body over the API's limit");
    // Each accepted batch is one audit record of its counts.
    let (_, audit) = api(&c, &ctl, "GET", "/api/v1/audit?model=m&limit=1000", None).await;
    let batches = audit
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["kind"] == "labels_received")
        .count() as u64;
    assert_eq!(batches, sent / 10 + 1, "{audit}");

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
