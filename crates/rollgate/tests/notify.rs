//! Notifications end to end: a webhook receiver that is down while a
//! rollout is rolled back and the controller is killed (SIGKILL) and
//! restarted gets every decision afterwards — none lost, none twice, in
//! the audit log's order, each signed. Every wait is bounded.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::Value;

use crate::common::*;

/// What the receiver got: `(delivery id, kind, signature ok)`.
#[derive(Default)]
struct Inbox {
    up: AtomicBool,
    attempts: AtomicU64,
    got: Mutex<Vec<(u64, String, bool)>>,
}

/// A webhook receiver on 127.0.0.1: 503 while down; while up, 200 and the
/// notification recorded with whether its signature checks out.
async fn receiver(inbox: Arc<Inbox>, key: &'static [u8]) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let inbox = Arc::clone(&inbox);
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                    let inbox = Arc::clone(&inbox);
                    async move {
                        let header = |n: &str| {
                            req.headers()
                                .get(n)
                                .and_then(|v| v.to_str().ok())
                                .unwrap_or("")
                                .to_string()
                        };
                        let (id, ts, sig) = (
                            header("x-rollgate-delivery"),
                            header("x-rollgate-timestamp"),
                            header("x-rollgate-signature"),
                        );
                        let body = req.into_body().collect().await.map(|b| b.to_bytes());
                        inbox.attempts.fetch_add(1, Ordering::SeqCst);
                        let status = if inbox.up.load(Ordering::SeqCst) {
                            let body = body.unwrap_or_default();
                            let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                            let ok = sig == rollgate_controller::notify::signature(key, &ts, &body);
                            let kind = v["kind"].as_str().unwrap_or("").to_string();
                            let same_id =
                                v["id"].as_u64().map(|i| i.to_string()) == Some(id.clone());
                            inbox.got.lock().expect("inbox").push((
                                id.parse().unwrap_or(0),
                                kind,
                                ok && same_id,
                            ));
                            200
                        } else {
                            503
                        };
                        let mut r = Response::new(Full::new(Bytes::new()));
                        *r.status_mut() = hyper::StatusCode::from_u16(status).expect("status");
                        Ok::<_, Infallible>(r)
                    }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    format!("http://{addr}/hooks/rollgate")
}

/// The notifiable decisions in the audit log, in order: `(seq, kind)`.
async fn decisions(c: &HttpClient, ctl: &Proc) -> Vec<(u64, String)> {
    let (s, v) = api(c, ctl, "GET", "/api/v1/audit", None).await;
    assert_eq!(s, 200);
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| Some((r["seq"].as_u64()?, r["kind"].as_str()?.to_string())))
        .filter(|(_, k)| rollgate_controller::notify::DEFAULT_KINDS.contains(&k.as_str()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_down_across_a_rollback_and_a_controller_kill_gets_every_decision_once_in_order()
{
    const KEY: &[u8] = b"shared-webhook-secret";
    let dir = tempfile::tempdir().expect("tempdir");
    let inbox = Arc::new(Inbox::default());
    let url = receiver(Arc::clone(&inbox), KEY).await;
    let key_file = write(dir.path(), "hook.key", "shared-webhook-secret\n");
    let cfg = write(
        dir.path(),
        "controller.toml",
        &format!(
            "{CONTROLLER_TOML}\n[[notify.webhooks]]\nname = \"ops\"\nurl = \"{url}\"\n\
             secret_file = \"{key_file}\"\nmax_backoff = \"500ms\"\n"
        ),
    );
    let mut ctl = start_controller_with(dir.path(), &cfg, &[]);
    let gw = start_gateway(dir.path());
    let c = client();
    // A receiver added now hears from now on (its cursor starts at the
    // audit log's head once the leader sees it): the setup below is news.
    let started = Instant::now();
    loop {
        let (_, status) = api(&c, &ctl, "GET", "/api/v1/notifications", None).await;
        if !status[0]["cursor"].is_null() {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "{status}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let champion = model_server(Model::new(false)).await;
    let broken = model_server(Model::new(true)).await;
    let (_, cand) = setup(&c, &ctl, &champion, &broken).await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = traffic(gw.addr(), Arc::clone(&stop));
    let id = start_rollout(&c, &ctl, &cand).await;
    let r = wait_for(&c, &ctl, id, Duration::from_secs(60), finished).await;
    assert_eq!(phase(&r), "rolled_back", "{r}");
    stop.store(true, Ordering::SeqCst);
    let _ = load.await;
    assert!(
        inbox.attempts.load(Ordering::SeqCst) > 0,
        "it tried the receiver"
    );

    // Killed while the receiver is down; a new controller takes over.
    ctl.kill();
    let ctl = start_controller_with(dir.path(), &cfg, &[]);
    let tried = inbox.attempts.load(Ordering::SeqCst);
    let started = Instant::now();
    while inbox.attempts.load(Ordering::SeqCst) == tried {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the new leader never tried"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, status) = api(&c, &ctl, "GET", "/api/v1/notifications", None).await;
    assert_eq!(status[0]["name"], "ops", "{status}");
    assert!(status[0]["failures"].as_u64() >= Some(1), "{status}");
    assert!(status[0]["failing_for"].as_u64() >= Some(1), "{status}");
    assert!(inbox.got.lock().expect("inbox").is_empty());

    // The receiver comes back: everything arrives, once, in order.
    inbox.up.store(true, Ordering::SeqCst);
    let want = decisions(&c, &ctl).await;
    assert!(
        want.iter().any(|(_, k)| k == "rolled_back") && want.len() >= 5,
        "{want:?}"
    );
    let started = Instant::now();
    loop {
        let got = inbox.got.lock().expect("inbox").len();
        if got >= want.len() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{got} of {} delivered",
            want.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Nothing more than that arrives (no repeats).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let got = inbox.got.lock().expect("inbox").clone();
    let got_ids: Vec<(u64, String)> = got.iter().map(|(i, k, _)| (*i, k.clone())).collect();
    assert_eq!(
        got_ids, want,
        "every decision once, in the audit log's order"
    );
    assert!(got.iter().all(|(_, _, signed)| *signed), "{got:?}");
    let (_, status) = api(&c, &ctl, "GET", "/api/v1/notifications", None).await;
    assert_eq!(
        status[0]["delivered"].as_u64(),
        Some(want.len() as u64),
        "{status}"
    );
    assert_eq!(status[0]["failing_for"], 0, "{status}");
    let resp = c
        .get(
            format!("http://{}/metrics", ctl.addr())
                .parse()
                .expect("uri"),
        )
        .await
        .expect("metrics");
    let text = resp.into_body().collect().await.expect("body").to_bytes();
    let text = String::from_utf8_lossy(&text);
    let sent = format!(
        "rollgate_notifications_sent_total{{receiver=\"ops\"}} {}",
        want.len()
    );
    assert!(text.contains(&sent), "{sent} not in:\n{text}");
}
