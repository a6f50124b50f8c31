//! Rollouts end to end against MLServer, a real Open Inference Protocol
//! server (REST and gRPC), with `rollgate gateway` and `rollgate
//! controller` on 127.0.0.1. Every wait is bounded.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::common::*;

/// MLServer's URL, started with three scikit-learn models (`champion`,
/// `retrained`, `broken`) by `tests/mlserver/start.sh` (in CI by `.ci/run`).
/// Without it the tests are skipped locally and fail in CI.
fn mlserver() -> Option<String> {
    match std::env::var("ROLLGATE_MLSERVER_URL") {
        Ok(url) => Some(url),
        Err(_) if std::env::var_os("CI").is_some() => panic!(
            "ROLLGATE_MLSERVER_URL is not set: CI starts MLServer with tests/mlserver/start.sh (.ci/run)"
        ),
        Err(_) => {
            eprintln!("skipped: no MLServer; run `eval \"$(tests/mlserver/start.sh)\"` first");
            None
        }
    }
}

/// What the V2 clients saw.
#[derive(Debug, Default)]
struct Seen {
    good: AtomicU64,
    /// Well-formed requests that did not get 200.
    good_failed: AtomicU64,
    malformed: AtomicU64,
    /// The first few failures of good requests: status and body.
    failures: std::sync::Mutex<Vec<(u16, String)>>,
}

/// Registers the OIP V2 model `fraud` (predictions read from the
/// `predict_proba` output by name) on MLServer, with a revision per served
/// name (`None`: served under the model's own name, which MLServer lacks);
/// makes the first the champion. Returns the revision ids. With `grpc`,
/// each revision also has MLServer's gRPC endpoint.
async fn setup_v2(
    c: &HttpClient,
    ctl: &Proc,
    (url, grpc): (&str, Option<&str>),
    served: &[Option<&str>],
) -> Vec<String> {
    let spec = json!({ "protocol": "oip_v2", "output": "predict_proba" });
    let (s, m) = api(
        c,
        ctl,
        "POST",
        "/api/v1/models",
        Some(json!({ "name": "fraud", "spec": spec })),
    )
    .await;
    assert_eq!(s, 201, "{m}");
    let mut ids = Vec::new();
    for name in served {
        let mut rev = json!({ "upstream": url, "readiness_path": "/v2/health/ready" });
        if let Some(g) = grpc {
            rev["grpc_upstream"] = json!(g);
        }
        if let Some(n) = name {
            rev["served_name"] = json!(n);
        }
        let (s, r) = api(c, ctl, "POST", "/api/v1/models/fraud/revisions", Some(rev)).await;
        assert_eq!(s, 201, "{r}");
        ids.push(r["id"].as_str().expect("id").to_string());
    }
    let (s, _) = api(
        c,
        ctl,
        "PUT",
        "/api/v1/models/fraud/champion",
        Some(json!({ "revision": ids[0], "reason": "first" })),
    )
    .await;
    assert_eq!(s, 200);
    ids
}

/// Starts a rollout of `fraud` to `revision` with the short plan.
async fn start_v2_rollout(c: &HttpClient, ctl: &Proc, revision: &str) -> i64 {
    let body = json!({ "model": "fraud", "revision": revision, "plan": plan() });
    let (s, r) = api(c, ctl, "POST", "/api/v1/rollouts", Some(body)).await;
    assert_eq!(s, 201, "{r}");
    r["id"].as_i64().expect("rollout id")
}

/// V2 clients as Python's `requests` behaves: `Accept-Encoding: gzip`,
/// batches of 8–32 rows, sticky keys; every `malformed_every`-th request
/// (if any) has the wrong shape, which MLServer answers with a plain-text
/// 500. Runs until `stop` (bounded by 120 s).
fn v2_traffic(
    gateway: &str,
    stop: Arc<AtomicBool>,
    seen: Arc<Seen>,
    malformed_every: Option<u64>,
) -> tokio::task::JoinHandle<()> {
    let url = format!("http://{gateway}/v2/models/fraud/infer");
    tokio::spawn(async move {
        let c = client();
        let started = Instant::now();
        let mut n = 0u64;
        while !stop.load(Ordering::SeqCst) && started.elapsed() < Duration::from_secs(120) {
            n += 1;
            let rows = 8 + (n * 7) % 25;
            let malformed = malformed_every.is_some_and(|k| n.is_multiple_of(k));
            let width = if malformed { 3 } else { 4 };
            // Deterministic, varied feature values.
            let data: Vec<f64> = (0..rows * width)
                .map(|i| (((n * 31 + i * 17) % 97) as f64 / 24.0) - 2.0)
                .collect();
            let body = json!({
                "inputs": [{ "name": "x", "shape": [rows, width], "datatype": "FP64", "data": data }],
                "outputs": [{ "name": "predict_proba" }],
            });
            let req = Request::builder()
                .method("POST")
                .uri(&url)
                .header("content-type", "application/json")
                .header("accept-encoding", "gzip, deflate")
                .header("x-rollgate-key", format!("user-{}", n % 2000))
                .body(Full::new(Bytes::from(body.to_string())))
                .expect("request");
            let (status, text) =
                match tokio::time::timeout(Duration::from_secs(10), c.request(req)).await {
                    Ok(Ok(r)) => {
                        let s = r.status().as_u16();
                        let body = r
                            .into_body()
                            .collect()
                            .await
                            .map(|b| b.to_bytes())
                            .unwrap_or_default();
                        (
                            s,
                            String::from_utf8_lossy(&body).chars().take(200).collect(),
                        )
                    }
                    Ok(Err(e)) => (0, e.to_string()),
                    Err(_) => (0, "no answer in 10 s".to_string()),
                };
            if malformed {
                seen.malformed.fetch_add(1, Ordering::SeqCst);
            } else {
                seen.good.fetch_add(1, Ordering::SeqCst);
                if status != 200 {
                    seen.good_failed.fetch_add(1, Ordering::SeqCst);
                    let mut f = seen.failures.lock().expect("failures");
                    if f.len() < 5 {
                        f.push((status, text));
                    }
                }
            }
        }
    })
}

/// No answer of any revision was miscounted as unreadable output.
async fn no_invalid_output(c: &HttpClient, gw: &Proc) {
    let (s, stats, _) = request(
        c,
        "GET",
        &format!("http://{}/rollgate/stats", gw.addr()),
        None,
        None,
    )
    .await;
    assert_eq!(s, 200);
    for (rev, r) in stats["models"]["fraud"]["revisions"]
        .as_object()
        .into_iter()
        .flatten()
    {
        assert_eq!(
            r["failures"]["invalid_output"].as_u64().unwrap_or(0),
            0,
            "{rev}: {r}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mlserver_a_retrain_is_promoted_and_a_broken_feature_refused_in_shadow_with_gzip_batches() {
    let Some(url) = mlserver() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let ctl = start_controller(dir.path(), &[]);
    let c = client();
    let ids = setup_v2(
        &c,
        &ctl,
        (&url, None),
        &[Some("champion"), Some("broken"), Some("retrained")],
    )
    .await;
    let gw = start_gateway(dir.path());
    let (stop, seen) = (Arc::new(AtomicBool::new(false)), Arc::new(Seen::default()));
    let load = v2_traffic(gw.addr(), Arc::clone(&stop), Arc::clone(&seen), None);

    refused_in_shadow(&c, &ctl, &ids[1]).await;
    promoted(&c, &ctl, &ids[2]).await;
    all_answered(stop, load, &seen).await;
    no_invalid_output(&c, &gw).await;
}

/// A rollout of `revision` is rolled back in SHADOW by the anytime test.
async fn refused_in_shadow(c: &HttpClient, ctl: &Proc, revision: &str) {
    let rollout = start_v2_rollout(c, ctl, revision).await;
    let r = wait_for(c, ctl, rollout, Duration::from_secs(60), finished).await;
    assert_eq!(phase(&r), "rolled_back", "{r}");
    assert_eq!(
        r["state"]["phase"]["reason"]["code"], "anytime_breach",
        "{r}"
    );
    let kinds = audit_kinds(c, ctl, rollout).await;
    assert_eq!(count(&kinds, "advanced"), 0, "refused in SHADOW: {kinds:?}");
}

/// A rollout of `revision` is promoted.
async fn promoted(c: &HttpClient, ctl: &Proc, revision: &str) {
    let rollout = start_v2_rollout(c, ctl, revision).await;
    let r = wait_for(c, ctl, rollout, Duration::from_secs(90), finished).await;
    assert_eq!(phase(&r), "promoted", "{r}");
}

/// Stops the clients; each of their more than 100 well-formed requests was
/// answered well.
async fn all_answered(stop: Arc<AtomicBool>, load: tokio::task::JoinHandle<()>, seen: &Seen) {
    stop.store(true, Ordering::SeqCst);
    load.await.expect("traffic");
    let good = seen.good.load(Ordering::SeqCst);
    assert!(good > 100, "{good} requests");
    assert_eq!(
        seen.good_failed.load(Ordering::SeqCst),
        0,
        "of {good} good requests: {:?}",
        seen.failures.lock().expect("failures")
    );
}

/// MLServer's gRPC endpoint (`ROLLGATE_MLSERVER_GRPC_URL`, started with
/// it by `tests/mlserver/start.sh`).
fn mlserver_grpc() -> Option<(String, String)> {
    let url = mlserver()?;
    match std::env::var("ROLLGATE_MLSERVER_GRPC_URL") {
        Ok(grpc) => Some((url, grpc)),
        Err(_) if std::env::var_os("CI").is_some() => panic!(
            "ROLLGATE_MLSERVER_GRPC_URL is not set: tests/mlserver/start.sh prints it (.ci/run)"
        ),
        Err(_) => {
            eprintln!(
                "skipped: MLServer's gRPC endpoint unknown; restart it with tests/mlserver/start.sh"
            );
            None
        }
    }
}

/// gRPC clients (tonic, over h2c to the gateway): `ModelInfer` with
/// batches of 8–32 rows and a sticky key in the call's metadata, until
/// `stop` (bounded by 120 s). A call not answered OK is a failure.
fn grpc_traffic(
    gateway: &str,
    stop: Arc<AtomicBool>,
    seen: Arc<Seen>,
) -> tokio::task::JoinHandle<()> {
    use rollgate_oip as oip;
    let url = format!("http://{gateway}");
    tokio::spawn(async move {
        let channel = tonic::transport::Endpoint::from_shared(url)
            .expect("endpoint")
            .timeout(Duration::from_secs(10))
            .connect_lazy();
        let mut grpc = tonic::client::Grpc::new(channel);
        let started = Instant::now();
        let mut n = 0u64;
        while !stop.load(Ordering::SeqCst) && started.elapsed() < Duration::from_secs(120) {
            n += 1;
            let rows = 8 + (n * 7) % 25;
            let data: Vec<f64> = (0..rows * 4)
                .map(|i| (((n * 31 + i * 17) % 97) as f64 / 24.0) - 2.0)
                .collect();
            let mut req = tonic::Request::new(oip::ModelInferRequest {
                model_name: "fraud".into(),
                inputs: vec![oip::InferInputTensor {
                    name: "x".into(),
                    datatype: "FP64".into(),
                    shape: vec![rows as i64, 4],
                    contents: Some(oip::InferTensorContents {
                        fp64_contents: data,
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                outputs: vec![oip::InferRequestedOutputTensor {
                    name: "predict_proba".into(),
                    ..Default::default()
                }],
                ..Default::default()
            });
            let key = format!("user-{}", n % 2000);
            req.metadata_mut()
                .insert("x-rollgate-key", key.parse().expect("ascii"));
            let answer = async {
                grpc.ready()
                    .await
                    .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
                let codec = tonic_prost::ProstCodec::<
                    oip::ModelInferRequest,
                    oip::ModelInferResponse,
                >::default();
                let path = tonic::codegen::http::uri::PathAndQuery::from_static(
                    oip::Method::ModelInfer.path(),
                );
                grpc.unary(req, path, codec).await
            }
            .await;
            seen.good.fetch_add(1, Ordering::SeqCst);
            let failure = match answer {
                Ok(r)
                    if r.get_ref()
                        .outputs
                        .first()
                        .is_some_and(|o| o.shape == [rows as i64, 2]) =>
                {
                    None
                }
                Ok(r) => Some((0, format!("unexpected answer: {:?}", r.get_ref().outputs))),
                Err(s) => Some((s.code() as u16, s.message().chars().take(200).collect())),
            };
            if let Some(f) = failure {
                seen.good_failed.fetch_add(1, Ordering::SeqCst);
                let mut all = seen.failures.lock().expect("failures");
                if all.len() < 5 {
                    all.push(f);
                }
            }
        }
    })
}

/// The gRPC twin of the REST test above: the same models, every call over
/// gRPC (tonic to the gateway, the gateway to MLServer's gRPC endpoint),
/// the same decisions: the broken feature refused in SHADOW, the
/// champion redeployed (identical) and the retrain promoted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mlserver_over_grpc_broken_refused_in_shadow_identical_and_retrain_promoted() {
    let Some((url, grpc)) = mlserver_grpc() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let ctl = start_controller(dir.path(), &[]);
    let c = client();
    let ids = setup_v2(
        &c,
        &ctl,
        (&url, Some(&grpc)),
        &[Some("champion"), Some("broken"), Some("retrained")],
    )
    .await;
    let gw = start_gateway(dir.path());
    let (stop, seen) = (Arc::new(AtomicBool::new(false)), Arc::new(Seen::default()));
    let load = grpc_traffic(gw.addr(), Arc::clone(&stop), Arc::clone(&seen));

    refused_in_shadow(&c, &ctl, &ids[1]).await;

    // The champion's own model again, as a new revision: identical.
    let same = json!({
        "upstream": url, "grpc_upstream": grpc, "readiness_path": "/v2/health/ready",
        "served_name": "champion", "artifact": "the champion, redeployed",
    });
    let (s, same) = api(
        &c,
        &ctl,
        "POST",
        "/api/v1/models/fraud/revisions",
        Some(same),
    )
    .await;
    assert_eq!(s, 201, "{same}");
    promoted(&c, &ctl, same["id"].as_str().expect("id")).await;
    promoted(&c, &ctl, &ids[2]).await;
    all_answered(stop, load, &seen).await;
    no_invalid_output(&c, &gw).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mlserver_wrong_shape_bursts_fail_no_good_request_and_move_neither_arm() {
    let Some(url) = mlserver() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let ctl = start_controller(dir.path(), &[]);
    let c = client();
    let ids = setup_v2(
        &c,
        &ctl,
        (&url, None),
        &[Some("champion"), Some("retrained")],
    )
    .await;
    let gw = start_gateway(dir.path());
    let (stop, seen) = (Arc::new(AtomicBool::new(false)), Arc::new(Seen::default()));
    // One request in ten has the wrong shape: MLServer answers a plain-text
    // 500 and (uvicorn) closes the connection without saying so.
    let load = v2_traffic(gw.addr(), Arc::clone(&stop), Arc::clone(&seen), Some(10));
    let id = start_v2_rollout(&c, &ctl, &ids[1]).await;
    let r = wait_for(&c, &ctl, id, Duration::from_secs(90), finished).await;
    assert_eq!(phase(&r), "promoted", "both arms failed alike: {r}");
    stop.store(true, Ordering::SeqCst);
    load.await.expect("traffic");
    assert!(seen.malformed.load(Ordering::SeqCst) > 10);
    let good = seen.good.load(Ordering::SeqCst);
    assert_eq!(
        seen.good_failed.load(Ordering::SeqCst),
        0,
        "of {good} good requests: {:?}",
        seen.failures.lock().expect("failures")
    );
    no_invalid_output(&c, &gw).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mlserver_a_candidate_served_under_another_name_is_rolled_back_by_breach() {
    let Some(url) = mlserver() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let ctl = start_controller(dir.path(), &[]);
    let c = client();
    // The candidate forgot its served name: MLServer has no model "fraud".
    let ids = setup_v2(&c, &ctl, (&url, None), &[Some("champion"), None]).await;
    let gw = start_gateway(dir.path());
    let (stop, seen) = (Arc::new(AtomicBool::new(false)), Arc::new(Seen::default()));
    let load = v2_traffic(gw.addr(), Arc::clone(&stop), Arc::clone(&seen), None);
    let id = start_v2_rollout(&c, &ctl, &ids[1]).await;
    let r = wait_for(&c, &ctl, id, Duration::from_secs(60), finished).await;
    assert_eq!(phase(&r), "rolled_back", "{r}");
    assert_eq!(
        r["state"]["phase"]["reason"]["code"], "anytime_breach",
        "not a timeout: {r}"
    );
    stop.store(true, Ordering::SeqCst);
    load.await.expect("traffic");
    assert_eq!(
        seen.good_failed.load(Ordering::SeqCst),
        0,
        "users only ever saw the champion"
    );
}
