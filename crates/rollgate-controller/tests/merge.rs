//! The controller merges one snapshot from every live gateway, and treats a
//! silent gateway as "no stats" (never as health).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rollgate_controller::reconcile::merged_stats;
use rollgate_controller::{Context, ControllerMetrics, HttpClient};
use rollgate_core::{FailureClass, Snapshot, Timestamp};
use rollgate_gateway::GatewaySnapshot;
use rollgate_store::{SqliteStore, Store};
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

fn replica(requests: u64, failures: u64) -> GatewaySnapshot {
    let mut s = Snapshot::default();
    for _ in 0..requests - failures {
        s.revision_mut("cand").record_success(1_000, ["ok"]);
    }
    for _ in 0..failures {
        s.revision_mut("cand").record_failure(FailureClass::Timeout);
    }
    GatewaySnapshot {
        models: [("m".to_string(), s)].into_iter().collect(),
        overloaded: 0,
        fallbacks: Default::default(),
        in_flight: 0,
    }
}

fn context(store: Arc<dyn Store>) -> Context {
    Context {
        store,
        http: HttpClient::new(Duration::from_secs(2)),
        gateway_ttl: Duration::from_secs(60),
        tick: Duration::from_secs(1),
        clock: Arc::new(|| Timestamp(0)),
        local_gateway: None,
        metrics: Arc::new(ControllerMetrics::default()),
    }
}

#[tokio::test]
async fn snapshots_of_every_live_gateway_are_summed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_dir(dir.path()).expect("store"));
    store
        .heartbeat("a", &gateway(replica(30, 3)).await)
        .expect("heartbeat");
    store
        .heartbeat("b", &gateway(replica(70, 7)).await)
        .expect("heartbeat");
    let merged = merged_stats(&context(Arc::clone(&store)), "m")
        .await
        .expect("store")
        .expect("both answered");
    let cand = merged.revision("cand");
    assert_eq!((cand.requests(), cand.failure_count()), (100, 10));
}

#[tokio::test]
async fn a_silent_gateway_means_no_stats_not_partial_stats() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_dir(dir.path()).expect("store"));
    store
        .heartbeat("a", &gateway(replica(30, 3)).await)
        .expect("heartbeat");
    let closed = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let dead = format!(
        "http://{}/rollgate/stats",
        closed.local_addr().expect("addr")
    );
    drop(closed);
    store.heartbeat("b", &dead).expect("heartbeat");
    assert_eq!(
        merged_stats(&context(Arc::clone(&store)), "m")
            .await
            .expect("store"),
        None
    );
    // And no gateway at all is no stats either.
    let empty: Arc<dyn Store> =
        Arc::new(SqliteStore::open_dir(&dir.path().join("empty")).expect("store"));
    assert_eq!(
        merged_stats(&context(empty), "m").await.expect("store"),
        None
    );
}
