//! Notifications across a receiver outage of ten minutes and a controller
//! crash, on tokio's paused clock (the back-off's minutes pass at once; the
//! receiver is a real HTTP server on 127.0.0.1 in the same runtime). The
//! end-to-end test with real processes and a SIGKILL is
//! `crates/rollgate/tests/notify.rs`.

use crate::common;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use rollgate_controller::notify::{self, Format, Notifier, Webhook};
use rollgate_core::{AuditKind, Timestamp};
use rollgate_store::{SqlStore, Store};

/// What the receiver saw: the decision ids it accepted, in order, and how
/// many attempts it refused while down.
#[derive(Default)]
struct Seen {
    up: bool,
    accepted: Vec<u64>,
    refused: u64,
}

async fn receiver(seen: Arc<Mutex<Seen>>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let seen = Arc::clone(&seen);
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                    let seen = Arc::clone(&seen);
                    async move {
                        let id: u64 = req
                            .headers()
                            .get("x-rollgate-delivery")
                            .and_then(|v| v.to_str().ok())
                            .and_then(|v| v.parse().ok())
                            .unwrap_or(0);
                        let mut s = seen.lock().expect("lock");
                        let status = if s.up {
                            s.accepted.push(id);
                            200
                        } else {
                            s.refused += 1;
                            503
                        };
                        Ok::<_, Infallible>(
                            Response::builder()
                                .status(status)
                                .body(Full::new(Bytes::new()))
                                .expect("response"),
                        )
                    }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    format!("http://{addr}/hook")
}

/// One notifying controller: its task and the way to kill it.
fn start(ctx: rollgate_controller::Context, url: &str) -> tokio::task::JoinHandle<()> {
    let hook = Webhook {
        name: "ops".into(),
        url: url.into(),
        format: Format::Json,
        kinds: Vec::new(),
        secret_file: None,
        timeout: Duration::from_secs(10),
        max_backoff: Duration::from_secs(300),
    };
    let notifier = Arc::new(Notifier::new(&[hook]).expect("notifier"));
    tokio::spawn(notify::run(ctx, notifier, std::future::pending()))
}

#[tokio::test(start_paused = true)]
async fn a_receiver_down_ten_minutes_across_a_crash_gets_every_decision_once_in_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store: Arc<dyn Store> = Arc::new(SqlStore::open_dir(dir.path()).expect("store"));
    let id = common::model_in_rollout(store.as_ref());
    let seen = Arc::new(Mutex::new(Seen {
        up: true,
        ..Seen::default()
    }));
    let url = receiver(Arc::clone(&seen)).await;
    let ctx = common::context(Arc::clone(&store), Timestamp(0));

    // The receiver is known (its cursor set) while it is up.
    let first = start(ctx.clone(), &url);
    tokio::time::sleep(Duration::from_secs(3)).await;
    seen.lock().expect("lock").up = false;

    // Ten minutes down: a decision every minute; after five, the
    // controller dies (its task killed mid-back-off, nothing saved but the
    // store) and another starts on the same store.
    let mut expected = Vec::new();
    let mut controller = first;
    for minute in 0..10 {
        let kind = if minute % 2 == 0 {
            AuditKind::Paused
        } else {
            AuditKind::Resumed
        };
        expected.push(common::record(store.as_ref(), id, kind));
        tokio::time::sleep(Duration::from_secs(60)).await;
        if minute == 4 {
            controller.abort();
            let _ = controller.await;
            controller = start(ctx.clone(), &url);
        }
    }
    let refused = seen.lock().expect("lock").refused;
    assert!(refused >= 5, "the receiver was tried while down: {refused}");
    assert!(seen.lock().expect("lock").accepted.is_empty());

    // Back up: within the longest back-off (5 min) and a tick, every
    // decision arrives, once, in the audit log's order.
    seen.lock().expect("lock").up = true;
    tokio::time::sleep(Duration::from_secs(300 + 5)).await;
    let accepted = seen.lock().expect("lock").accepted.clone();
    assert_eq!(accepted, expected, "refused {refused} attempts meanwhile");
    // And the cursor says so: a further restart sends nothing again.
    controller.abort();
    let _ = controller.await;
    let again = start(ctx.clone(), &url);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(seen.lock().expect("lock").accepted, expected);
    again.abort();
}
