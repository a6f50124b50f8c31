//! `rollgate serve`'s metrics: what it counts, that Prometheus's linter
//! accepts them, and that their families have MLServer's names, types and
//! labels (checked against a running MLServer: `tests/mlserver/start.sh`,
//! started by `.ci/run`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rollgate_modelkit::model::LinearModel;
use rollgate_modelkit::server::{Faults, ServerConfig, serve};

#[path = "../../../tests/support/promtool.rs"]
mod promtool;

type HttpClient = Client<HttpConnector, Full<Bytes>>;

async fn call(c: &HttpClient, method: &str, url: &str, body: &str) -> (u16, String) {
    let req = http::Request::builder()
        .method(method)
        .uri(url)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("request");
    let resp = tokio::time::timeout(Duration::from_secs(10), c.request(req))
        .await
        .expect("answered within 10 s")
        .expect("http");
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// `# TYPE` of every family named `model_infer_*` or `rest_server_*`, and
/// the label names of each such family's samples.
fn families(text: &str) -> (BTreeMap<String, String>, BTreeMap<String, BTreeSet<String>>) {
    let ours = |n: &str| n.starts_with("model_infer_") || n.starts_with("rest_server_");
    let mut types = BTreeMap::new();
    let mut labels: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut it = rest.split_whitespace();
            if let (Some(name), Some(kind)) = (it.next(), it.next())
                && ours(name)
                && !name.ends_with("_created")
            {
                types.insert(name.to_string(), kind.to_string());
            }
        } else if !line.starts_with('#')
            && let Some((name, rest)) = line.split_once('{')
            && ours(name)
            && !name.ends_with("_created")
        {
            let set = labels.entry(name.to_string()).or_default();
            for pair in rest.split(',') {
                if let Some((k, _)) = pair.split_once('=')
                    && k != "le"
                {
                    set.insert(k.trim().to_string());
                }
            }
        }
    }
    (types, labels)
}

#[tokio::test]
async fn the_model_server_counts_in_mlservers_shape() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let cfg = ServerConfig {
        name: "fraud".into(),
        model: LinearModel {
            name: "fraud".into(),
            weights: vec![0.1, -0.2],
            intercept: 0.0,
            holdout_accuracy: 0.5,
        },
        faults: Faults::default(),
        tls: None,
    };
    let server = tokio::spawn(serve(listener, cfg, std::future::pending()));
    let c: HttpClient = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let infer = format!("{url}/v2/models/fraud/infer");
    let good = r#"{"inputs":[{"name":"x","shape":[1,2],"datatype":"FP64","data":[1.0,2.0]}]}"#;
    for _ in 0..3 {
        assert_eq!(call(&c, "POST", &infer, good).await.0, 200);
    }
    assert_eq!(call(&c, "POST", &infer, r#"{"inputs":[]}"#).await.0, 400);
    assert_eq!(
        call(&c, "GET", &format!("{url}/v2/models/fraud/ready"), "")
            .await
            .0,
        200
    );
    let (status, text) = call(&c, "GET", &format!("{url}/metrics"), "").await;
    assert_eq!(status, 200);
    for sample in [
        r#"model_infer_request_success_total{model="fraud",version="None"} 3"#,
        r#"model_infer_request_failure_total{model="fraud",version="None"} 1"#,
        r#"model_infer_request_duration_count{model="fraud",version="None"} 4"#,
        r#"rest_server_requests_total{app_name="rollgate",method="POST",path="/v2/models/{model_name}/infer",status_code="200"} 3"#,
        r#"rest_server_requests_total{app_name="rollgate",method="GET",path="/v2/models/{model_name}/ready",status_code="200"} 1"#,
    ] {
        assert!(text.contains(sample), "{sample} not in:\n{text}");
    }
    assert!(
        text.contains("rest_server_request_duration_seconds_bucket{"),
        "{text}"
    );
    promtool::promtool_accepts(&text);

    // MLServer's own families: the same names, types and labels.
    let mlserver = match std::env::var("ROLLGATE_MLSERVER_METRICS_URL") {
        Ok(u) => u,
        Err(_) if std::env::var_os("CI").is_some() => {
            panic!(
                "ROLLGATE_MLSERVER_METRICS_URL is not set: CI starts MLServer with tests/mlserver/start.sh"
            )
        }
        Err(_) => {
            eprintln!(
                "skipped the comparison with MLServer: run `eval \"$(tests/mlserver/start.sh)\"` first"
            );
            server.abort();
            return;
        }
    };
    // One inference (refused: a wrong input) so its per-model series exist.
    let api = std::env::var("ROLLGATE_MLSERVER_URL").expect("ROLLGATE_MLSERVER_URL beside it");
    let _ = call(
        &c,
        "POST",
        &format!("{api}/v2/models/champion/infer"),
        r#"{"inputs":[]}"#,
    )
    .await;
    let (status, theirs) = call(&c, "GET", &mlserver, "").await;
    assert_eq!(status, 200);
    let (their_types, their_labels) = families(&theirs);
    let (our_types, our_labels) = families(&text);
    assert!(their_types.len() >= 5, "{their_types:?}");
    for (name, kind) in &their_types {
        let ours = our_types.get(name).map(String::as_str);
        if name == "model_infer_request_duration" {
            // A summary there, a histogram here (same _count and _sum).
            assert_eq!((kind.as_str(), ours), ("summary", Some("histogram")));
        } else {
            assert_eq!(ours, Some(kind.as_str()), "{name}: MLServer's is a {kind}");
        }
    }
    for (name, set) in &their_labels {
        if let Some(mine) = our_labels.get(name) {
            assert_eq!(mine, set, "labels of {name}");
        }
    }
    for name in [
        "model_infer_request_failure_total",
        "rest_server_requests_total",
    ] {
        assert!(
            their_labels.contains_key(name) && our_labels.contains_key(name),
            "{name}"
        );
    }
    server.abort();
}
