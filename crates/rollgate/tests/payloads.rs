//! The store never sees request or response payloads: a rollout judged to
//! its end on traffic whose every request, answer and error answer carries
//! a marker leaves no trace of it in the store's files (the database and
//! its write-ahead log, read as raw bytes).

use std::convert::Infallible;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::common::*;

const MARKER: &str = "payload-3f9c1e7a-never-stored";

/// A KServe-V1 model server (ready on every GET) that answers every POST
/// with the marker, one in twenty as a 503 error: how many POSTs it got
/// that carried the marker.
async fn marked_model() -> (String, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (posts, marked) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let seen = Arc::clone(&marked);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (posts, marked) = (Arc::clone(&posts), Arc::clone(&marked));
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                    let (posts, marked) = (Arc::clone(&posts), Arc::clone(&marked));
                    async move {
                        let post = req.method() == hyper::Method::POST;
                        let body = req.into_body().collect().await.map(|b| b.to_bytes());
                        let (status, answer) = if !post {
                            (200, r#"{"name":"m","ready":true}"#.to_string())
                        } else {
                            if body.is_ok_and(|b| contains(&b, MARKER.as_bytes())) {
                                marked.fetch_add(1, Ordering::SeqCst);
                            }
                            if posts.fetch_add(1, Ordering::SeqCst) % 20 == 19 {
                                (503, format!(r#"{{"error":"{MARKER} overloaded"}}"#))
                            } else {
                                (
                                    200,
                                    format!(r#"{{"predictions":[[0.1,0.9]],"trace":"{MARKER}"}}"#),
                                )
                            }
                        };
                        let mut r = Response::new(Full::new(Bytes::from(answer)));
                        *r.status_mut() = StatusCode::from_u16(status).expect("status");
                        Ok::<_, Infallible>(r)
                    }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (format!("http://{addr}"), seen)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// The store's files in data directory `data`: the database, its
/// write-ahead log and shared memory, whatever is there.
fn store_files(data: &Path) -> Vec<(String, Vec<u8>)> {
    std::fs::read_dir(data)
        .expect("data dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("rollgate.db"))
        })
        .map(|p| (p.display().to_string(), std::fs::read(&p).expect("read")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_request_or_answer_reaches_the_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut ctl = start_controller(dir.path(), &[]);
    let c = client();
    let (champion, champion_saw) = marked_model().await;
    let (candidate, candidate_saw) = marked_model().await;
    let (_, cand) = setup(&c, &ctl, &champion, &candidate).await;
    let mut gw = start_gateway(dir.path());
    let stop = Arc::new(AtomicBool::new(false));
    let load = traffic_with(
        gw.addr(),
        |n| Bytes::from(format!(r#"{{"instances":[[1,2]],"trace":"{MARKER}-{n}"}}"#)),
        "x-rollgate-revision",
        Arc::clone(&stop),
    );
    let id = start_rollout(&c, &ctl, &cand).await;
    let r = wait_for(&c, &ctl, id, Duration::from_secs(90), finished).await;
    stop.store(true, Ordering::SeqCst);
    let _ = load.await;
    // The payloads went through, and the rollout was judged on them.
    assert!(champion_saw.load(Ordering::SeqCst) > 0);
    assert!(candidate_saw.load(Ordering::SeqCst) > 0);
    assert!(ledger_requests(&r, &cand) > 0, "{r}");
    assert!(r["state"]["evaluations"].as_u64() > Some(0), "{r}");
    gw.kill();
    ctl.kill();
    let files = store_files(&dir.path().join("data"));
    assert!(
        files
            .iter()
            .any(|(name, bytes)| name.ends_with("rollgate.db") && !bytes.is_empty()),
        "no database among {:?}",
        files.iter().map(|(n, _)| n).collect::<Vec<_>>()
    );
    // The scan reads what the store wrote: the candidate's upstream is there.
    assert!(
        files
            .iter()
            .any(|(_, bytes)| contains(bytes, candidate.as_bytes()))
    );
    for (name, bytes) in &files {
        assert!(
            !contains(bytes, MARKER.as_bytes()),
            "{name} holds a payload"
        );
    }
}
