//! gRPC inference through the gateway, end to end on 127.0.0.1: tonic (an
//! independent gRPC client) calls the gateway over h2c; the gateway calls
//! the model kit's gRPC endpoint. Split, sticky, renamed, mirrored and
//! paired, and every outcome counted as its REST twin's would be.

use std::net::SocketAddr;
use std::time::Duration;

use rollgate_core::{GatewaySnapshot, Protocol, RevisionStats};
use rollgate_gateway::{
    Gateway, GatewayConfig, MirroredUpstream, ModelRoute, WeightedUpstream, serve,
};
use rollgate_modelkit::model::LinearModel;
use rollgate_modelkit::server::{Faults, ServerConfig};
use rollgate_oip as oip;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tonic::Code;
use tonic::codegen::http::uri::PathAndQuery;

use crate::common::{route, up};

/// The model kit's server for model `name` (weights `w`), answering REST
/// and gRPC on one port; stops when the sender is dropped.
async fn model_server(name: &str, w: [f64; 2], faults: Faults) -> (String, oneshot::Sender<()>) {
    let cfg = ServerConfig {
        name: name.into(),
        model: LinearModel {
            name: name.into(),
            weights: w.to_vec(),
            intercept: 0.0,
            holdout_accuracy: 1.0,
        },
        faults,
        tls: None,
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let (tx, rx) = oneshot::channel::<()>();
    tokio::spawn(rollgate_modelkit::server::serve(listener, cfg, async {
        let _ = rx.await;
    }));
    (url, tx)
}

fn grpc_up(revision: &str, url: &str) -> rollgate_gateway::Upstream {
    let mut u = up(revision, url);
    u.grpc_url = Some(url.into());
    u
}

/// Model `m` over the Open Inference Protocol, its champion at `url`.
fn oip_route(url: &str) -> ModelRoute {
    let mut r = route(url);
    r.protocol = Protocol::OipV2;
    r.champion = grpc_up("champ", url);
    r
}

async fn start(models: Vec<ModelRoute>) -> (SocketAddr, Gateway, oneshot::Sender<()>) {
    let config = GatewayConfig {
        models,
        ..GatewayConfig::default()
    };
    let gateway = Gateway::new(&config).expect("valid config");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = oneshot::channel::<()>();
    tokio::spawn(serve(listener, gateway.clone(), async move {
        let _ = rx.await;
    }));
    (addr, gateway, tx)
}

type Client = tonic::client::Grpc<tonic::transport::Channel>;

async fn client(addr: SocketAddr) -> Client {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .expect("connect");
    tonic::client::Grpc::new(channel)
}

/// One unary call of `method`; the answer and the revision that gave it.
async fn call<Q, A>(
    c: &mut Client,
    method: oip::Method,
    message: Q,
    key: Option<&str>,
) -> Result<(A, Option<String>), tonic::Status>
where
    Q: prost::Message + Send + Sync + 'static,
    A: prost::Message + Default + Send + Sync + 'static,
{
    let mut req = tonic::Request::new(message);
    if let Some(k) = key {
        req.metadata_mut()
            .insert("x-rollgate-key", k.parse().expect("ascii key"));
    }
    c.ready()
        .await
        .map_err(|e| tonic::Status::unknown(e.to_string()))?;
    let codec = tonic_prost::ProstCodec::<Q, A>::default();
    let resp = c
        .unary(req, PathAndQuery::from_static(method.path()), codec)
        .await?;
    let revision = resp
        .metadata()
        .get("x-rollgate-revision")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    Ok((resp.into_inner(), revision))
}

fn infer(model: &str, rows: &[[f64; 2]]) -> oip::ModelInferRequest {
    oip::ModelInferRequest {
        model_name: model.into(),
        inputs: vec![oip::InferInputTensor {
            name: "x".into(),
            datatype: "FP64".into(),
            shape: vec![rows.len() as i64, 2],
            contents: Some(oip::InferTensorContents {
                fp64_contents: rows.iter().flatten().copied().collect(),
                ..Default::default()
            }),
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn rev(s: &GatewaySnapshot, r: &str) -> RevisionStats {
    s.models
        .get("m")
        .map(|m| m.revision(r).clone())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_calls_are_split_sticky_renamed_and_counted() {
    let (champ, _c) = model_server("m", [1.0, -1.0], Faults::default()).await;
    // The candidate serves the model under another name, as KServe does.
    let (cand, _d) = model_server("m-v2", [1.0, -1.0], Faults::default()).await;
    let mut r = oip_route(&champ);
    let mut cu = grpc_up("cand", &cand);
    cu.served_name = Some("m-v2".into());
    r.candidate = Some(WeightedUpstream {
        upstream: cu,
        weight_bp: 5000,
    });
    let (addr, gateway, _stop) = start(vec![r]).await;
    let mut c = client(addr).await;

    // The server's own health is the gateway's.
    let (live, _): (oip::ServerLiveResponse, _) = call(
        &mut c,
        oip::Method::ServerLive,
        oip::ServerLiveRequest {},
        None,
    )
    .await
    .expect("live");
    assert!(live.live);
    // A model's readiness and metadata are its champion's.
    let ready = oip::ModelReadyRequest {
        name: "m".into(),
        version: String::new(),
    };
    let (ready, by): (oip::ModelReadyResponse, _) =
        call(&mut c, oip::Method::ModelReady, ready, None)
            .await
            .expect("ready");
    assert!(ready.ready);
    assert_eq!(by.as_deref(), Some("champ"));

    let mut first_by_key = std::collections::HashMap::new();
    for i in 0..200 {
        let key = format!("user-{}", i % 40);
        let (answer, by): (oip::ModelInferResponse, _) = call(
            &mut c,
            oip::Method::ModelInfer,
            infer("m", &[[2.0, 0.0], [0.0, 2.0]]),
            Some(&key),
        )
        .await
        .expect("infer");
        let by = by.expect("revision header");
        let out = &answer.outputs[0];
        assert_eq!(out.shape, vec![2, 2]);
        let p = &out.contents.as_ref().expect("contents").fp64_contents;
        assert!(p[1] > 0.5 && p[2] > 0.5, "{p:?}");
        // Sticky: a key stays with the revision it was first given.
        assert_eq!(first_by_key.entry(key).or_insert(by.clone()), &by);
    }
    let s = gateway.snapshot();
    let (champ, cand) = (rev(&s, "champ"), rev(&s, "cand"));
    assert_eq!(champ.requests() + cand.requests(), 200, "{s:?}");
    assert!(champ.requests() > 20 && cand.requests() > 20, "{s:?}");
    assert_eq!(
        champ.failures().total() + cand.failures().total(),
        0,
        "{s:?}"
    );
    // Read predictions: classes counted per revision.
    assert!(!champ.predictions().is_empty(), "{champ:?}");

    // What the gateway refuses itself is a gRPC status, never forwarded.
    let err = call::<_, oip::ModelInferResponse>(
        &mut c,
        oip::Method::ModelInfer,
        infer("nope", &[[1.0, 1.0]]),
        None,
    )
    .await
    .expect_err("unknown model");
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    // A caller's mistake answered by the model server is a client error,
    // counted apart from the revision's failures.
    let bad = call::<_, oip::ModelInferResponse>(
        &mut c,
        oip::Method::ModelInfer,
        infer("m", &[]),
        Some("user-1"),
    )
    .await
    .expect_err("no rows");
    assert_eq!(bad.code(), Code::InvalidArgument, "{bad:?}");
    let s = gateway.snapshot();
    let client_errors = rev(&s, "champ").client_errors() + rev(&s, "cand").client_errors();
    assert_eq!(client_errors, 1, "{s:?}");
    assert_eq!(
        rev(&s, "champ").failures().total() + rev(&s, "cand").failures().total(),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_grpc_candidate_is_counted_and_shadows_are_paired() {
    let (champ, _c) = model_server("m", [1.0, -1.0], Faults::default()).await;
    let unavailable = Faults {
        ready_then_503: true,
        ..Faults::default()
    };
    let (cand, _d) = model_server("m", [1.0, -1.0], unavailable).await;
    // Disagrees with the champion on every row below.
    let (shadow, _e) = model_server("m", [-1.0, 1.0], Faults::default()).await;

    let mut r = oip_route(&champ);
    r.candidate = Some(WeightedUpstream {
        upstream: grpc_up("cand", &cand),
        weight_bp: 10_000,
    });
    let (addr, gateway, _stop) = start(vec![r]).await;
    let mut c = client(addr).await;
    for i in 0..20 {
        let err = call::<_, oip::ModelInferResponse>(
            &mut c,
            oip::Method::ModelInfer,
            infer("m", &[[1.0, 0.0]]),
            Some(&format!("k{i}")),
        )
        .await
        .expect_err("unavailable");
        assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    }
    let s = gateway.snapshot();
    assert_eq!(rev(&s, "cand").failures().upstream_5xx, 20, "{s:?}");
    assert_eq!(rev(&s, "champ").requests(), 0);

    // Now a shadow: every call mirrored, its answer paired with the
    // champion's. Some calls compressed with gzip, as clients may send.
    let mut r = oip_route(&champ);
    r.shadow = Some(MirroredUpstream {
        upstream: grpc_up("shadow", &shadow),
        mirror_bp: 10_000,
    });
    // A revision without a gRPC endpoint cannot be reached by gRPC.
    let mut plain = up("plain", &champ);
    plain.grpc_url = None;
    gateway.set_routes(&[r]);
    let mut zipped = client(addr)
        .await
        .send_compressed(tonic::codec::CompressionEncoding::Gzip);
    for i in 0..30 {
        let c = if i % 2 == 0 { &mut c } else { &mut zipped };
        let (_, by): (oip::ModelInferResponse, _) = call(
            c,
            oip::Method::ModelInfer,
            infer("m", &[[2.0, 0.0], [0.0, 2.0]]),
            Some(&format!("k{i}")),
        )
        .await
        .expect("infer");
        assert_eq!(by.as_deref(), Some("champ"));
    }
    let paired = || {
        let s = gateway.snapshot();
        s.models["m"]
            .pairs_for("shadow")
            .cloned()
            .unwrap_or_default()
    };
    for _ in 0..100 {
        if paired().pairs() == 60 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pairs = paired();
    assert_eq!(pairs.pairs(), 60, "two rows a call: {pairs:?}");
    assert_eq!(pairs.agreements(), 0, "every row disagrees: {pairs:?}");
    assert_eq!(rev(&gateway.snapshot(), "shadow").requests(), 30);

    // A live share on a revision without a gRPC endpoint: a connect
    // failure of that revision, as an unreachable REST upstream is.
    let mut r = oip_route(&champ);
    r.candidate = Some(WeightedUpstream {
        upstream: plain,
        weight_bp: 10_000,
    });
    gateway.set_routes(&[r]);
    let err = call::<_, oip::ModelInferResponse>(
        &mut c,
        oip::Method::ModelInfer,
        infer("m", &[[1.0, 0.0]]),
        Some("k"),
    )
    .await
    .expect_err("no gRPC endpoint");
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert_eq!(rev(&gateway.snapshot(), "plain").failures().connect, 1);
}
