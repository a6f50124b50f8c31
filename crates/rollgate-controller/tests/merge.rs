//! The controller reads every live gateway as its own series of counts per
//! routing epoch; a silent gateway adds nothing (its earlier counts stay in
//! the rollout's ledger), and no gateway at all is "no stats" (never health).

use crate::common;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rollgate_controller::reconcile::exposure;
use rollgate_controller::{Context, HttpClient};
use rollgate_core::GatewaySnapshot;
use rollgate_core::{FailureClass, SeriesReport, Snapshot, Timestamp};
use rollgate_store::{SqlStore, Store};
use tokio::net::TcpListener;

/// A stand-in gateway answering `GET /rollgate/stats` with `snap`.
async fn gateway(snap: GatewaySnapshot) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let body = Bytes::from(serde_json::to_string(&snap).expect("json"));
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let body = body.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |_req| {
                    let body = body.clone();
                    async move { Ok::<_, Infallible>(hyper::Response::new(Full::new(body))) }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    format!("http://{addr}/rollgate/stats")
}

fn counts(requests: u64, failures: u64) -> Snapshot {
    let mut s = Snapshot::default();
    for _ in 0..requests - failures {
        s.revision_mut("cand").record_success(1_000, ["ok"]);
    }
    for _ in 0..failures {
        s.revision_mut("cand").record_failure(FailureClass::Timeout);
    }
    s
}

/// A gateway process `id` (boot `boot`) that counted `requests` in epoch 2
/// of rollout 7 and 5 more in epoch 1 of rollout 6.
fn replica(id: &str, boot: &str, requests: u64, failures: u64) -> GatewaySnapshot {
    let epochs = [
        ("7.2".to_string(), counts(requests, failures)),
        ("6.1".to_string(), counts(5, 0)),
    ];
    let mut pooled = Snapshot::default();
    for (_, s) in &epochs {
        pooled.merge(s);
    }
    GatewaySnapshot {
        gateway: id.into(),
        boot: boot.into(),
        models: [("m".to_string(), pooled)].into_iter().collect(),
        epochs: [("m".to_string(), epochs.into_iter().collect())]
            .into_iter()
            .collect(),
        overloaded: 0,
        retried: 0,
        slow_clients: 0,
        streamed_requests: 0,
        wrong_protocol: 0,
        answers_dropped: 0,
        fallbacks: Default::default(),
        in_flight: 0,
        unroutable: Default::default(),
        pinned: Default::default(),
    }
}

fn requests_in(e: &rollgate_core::Exposure, series: &str, epoch: u32) -> Option<u64> {
    match e.series.get(series)? {
        SeriesReport::Epochs { epochs } => Some(epochs.get(&epoch)?.revision("cand").requests()),
        SeriesReport::Pooled { total } => Some(total.revision("cand").requests()),
    }
}

fn context(store: Arc<dyn Store>) -> Context {
    let mut ctx = common::context(store, Timestamp(0));
    ctx.gateway_ttl = Duration::from_secs(60);
    ctx.http = HttpClient::new(Duration::from_secs(2));
    ctx
}

#[tokio::test]
async fn every_live_gateway_process_is_its_own_series_of_this_rollouts_epochs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store: Arc<dyn Store> = Arc::new(SqlStore::open_dir(dir.path()).expect("store"));
    store
        .heartbeat("a", &gateway(replica("a", "b1", 30, 3)).await)
        .expect("heartbeat");
    store
        .heartbeat("b", &gateway(replica("b", "b9", 70, 7)).await)
        .expect("heartbeat");
    let e = exposure(&context(Arc::clone(&store)), "m", 7)
        .await
        .expect("store")
        .expect("both answered");
    assert_eq!(e.series.len(), 2);
    assert_eq!(requests_in(&e, "a/b1", 2), Some(30));
    assert_eq!(requests_in(&e, "b/b9", 2), Some(70));
    // Rollout 6's epochs are not rollout 7's evidence.
    assert_eq!(requests_in(&e, "a/b1", 1), None);
}

#[tokio::test]
async fn a_silent_gateway_adds_nothing_and_no_gateway_means_no_stats() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store: Arc<dyn Store> = Arc::new(SqlStore::open_dir(dir.path()).expect("store"));
    store
        .heartbeat("a", &gateway(replica("a", "b1", 30, 3)).await)
        .expect("heartbeat");
    let closed = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let dead = format!(
        "http://{}/rollgate/stats",
        closed.local_addr().expect("addr")
    );
    drop(closed);
    store.heartbeat("b", &dead).expect("heartbeat");
    let e = exposure(&context(Arc::clone(&store)), "m", 7)
        .await
        .expect("store")
        .expect("one answered");
    assert_eq!(e.series.len(), 1);
    assert_eq!(requests_in(&e, "a/b1", 2), Some(30));
    // Only silent gateways, or none at all, is no stats.
    let silent: Arc<dyn Store> =
        Arc::new(SqlStore::open_dir(&dir.path().join("silent")).expect("store"));
    silent.heartbeat("b", &dead).expect("heartbeat");
    assert_eq!(
        exposure(&context(silent), "m", 7).await.expect("store"),
        None
    );
    let empty: Arc<dyn Store> =
        Arc::new(SqlStore::open_dir(&dir.path().join("empty")).expect("store"));
    assert_eq!(
        exposure(&context(empty), "m", 7).await.expect("store"),
        None
    );
}

#[tokio::test]
async fn a_gateway_without_a_boot_id_is_one_pooled_series() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store: Arc<dyn Store> = Arc::new(SqlStore::open_dir(dir.path()).expect("store"));
    let mut old = replica("", "", 30, 3);
    old.epochs.clear();
    let url = gateway(old).await;
    store.heartbeat("old", &url).expect("heartbeat");
    let e = exposure(&context(Arc::clone(&store)), "m", 7)
        .await
        .expect("store")
        .expect("answered");
    assert_eq!(requests_in(&e, &url, 0), Some(35));
}
