//! The gateway against real upstream servers over real sockets on
//! 127.0.0.1: fixed answers, failures, stalls and slow answers.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rollgate_core::Protocol;
use rollgate_gateway::assign::bucket;
use rollgate_gateway::{
    Gateway, GatewayConfig, GatewaySnapshot, MirroredUpstream, ModelRoute, WeightedUpstream, serve,
};
use tokio::net::TcpListener;
use tokio::sync::{Notify, oneshot};

use crate::common::{route, up};

/// What a test upstream does with each request.
#[derive(Clone)]
pub(crate) enum Behaviour {
    Answer(u16, &'static str),
    /// Answers after a delay.
    Slow(Duration, &'static str),
    /// Never answers.
    Stall,
    /// Waits until notified, then answers 200.
    Gated(Arc<Notify>),
    /// Answers 200 and records each request's path and chosen headers.
    Record(Arc<std::sync::Mutex<Vec<Seen>>>),
}

/// What a recording upstream saw of one request.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Seen {
    pub(crate) path: String,
    pub(crate) authorization: Option<String>,
    pub(crate) host: Option<String>,
    pub(crate) request_id: Option<String>,
}

pub(crate) struct TestUpstream {
    pub(crate) url: String,
    pub(crate) hits: Arc<AtomicU64>,
    /// Connections accepted.
    pub(crate) conns: Arc<AtomicU64>,
}

pub(crate) async fn upstream(behaviour: Behaviour) -> TestUpstream {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let hits = Arc::new(AtomicU64::new(0));
    let conns = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&hits);
    let accepted = Arc::clone(&conns);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            accepted.fetch_add(1, Ordering::SeqCst);
            let behaviour = behaviour.clone();
            let counter = Arc::clone(&counter);
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                    let behaviour = behaviour.clone();
                    let counter = Arc::clone(&counter);
                    async move {
                        let header = |n: &str| {
                            req.headers()
                                .get(n)
                                .and_then(|v| v.to_str().ok())
                                .map(str::to_string)
                        };
                        let seen = Seen {
                            path: req.uri().path().to_string(),
                            authorization: header("authorization"),
                            host: header("host"),
                            request_id: header("x-request-id"),
                        };
                        let _ = req.into_body().collect().await;
                        counter.fetch_add(1, Ordering::SeqCst);
                        let (status, body) = match behaviour {
                            Behaviour::Answer(s, b) => (s, b),
                            Behaviour::Slow(d, b) => {
                                tokio::time::sleep(d).await;
                                (200, b)
                            }
                            Behaviour::Stall => std::future::pending().await,
                            Behaviour::Gated(n) => {
                                n.notified().await;
                                (200, r#"{"predictions":[1]}"#)
                            }
                            Behaviour::Record(log) => {
                                log.lock().expect("log").push(seen);
                                (200, r#"{"predictions":[1]}"#)
                            }
                        };
                        let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
                        *r.status_mut() = StatusCode::from_u16(status).expect("status");
                        r.headers_mut()
                            .insert("content-type", "application/json".parse().expect("hv"));
                        Ok::<_, Infallible>(r)
                    }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    TestUpstream {
        url: format!("http://{addr}"),
        hits,
        conns,
    }
}

/// A URL where nothing listens.
pub(crate) async fn closed_url() -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr");
    drop(l);
    format!("http://{addr}")
}

pub(crate) fn with_candidate(mut r: ModelRoute, url: &str, weight_bp: u32) -> ModelRoute {
    r.candidate = Some(WeightedUpstream {
        upstream: up("cand", url),
        weight_bp,
    });
    r
}

pub(crate) fn with_shadow(mut r: ModelRoute, url: &str, mirror_bp: u32) -> ModelRoute {
    r.shadow = Some(MirroredUpstream {
        upstream: up("shadow", url),
        mirror_bp,
    });
    r
}

pub(crate) struct Running {
    pub(crate) addr: SocketAddr,
    pub(crate) gateway: Gateway,
    stop: Option<oneshot::Sender<()>>,
    done: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl Running {
    pub(crate) async fn shutdown(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(d) = self.done.take() {
            let _ = tokio::time::timeout(Duration::from_secs(10), d).await;
        }
    }
}

pub(crate) async fn start(config: GatewayConfig) -> Running {
    let gateway = Gateway::new(&config).expect("valid config");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = oneshot::channel::<()>();
    let done = tokio::spawn(serve(listener, gateway.clone(), async move {
        let _ = rx.await;
    }));
    Running {
        addr,
        gateway,
        stop: Some(tx),
        done: Some(done),
    }
}

pub(crate) fn config(models: Vec<ModelRoute>) -> GatewayConfig {
    GatewayConfig {
        models,
        ..GatewayConfig::default()
    }
}

pub(crate) struct Reply {
    pub(crate) status: StatusCode,
    pub(crate) revision: Option<String>,
    /// The answer's `x-request-id`.
    pub(crate) request_id: Option<String>,
    pub(crate) body: String,
}

pub(crate) fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

/// `method path` with a JSON `body` and `headers` (beside its content
/// type): what the gateway answered, within 10 s.
pub(crate) async fn call(
    c: &Client<HttpConnector, Full<Bytes>>,
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Reply {
    let mut b = Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .header("content-type", "application/json");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let req = b
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("request");
    let resp = tokio::time::timeout(Duration::from_secs(10), c.request(req))
        .await
        .expect("the gateway answered within 10 s")
        .expect("http");
    let status = resp.status();
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let (revision, request_id) = (header("x-rollgate-revision"), header("x-request-id"));
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    Reply {
        status,
        revision,
        request_id,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

pub(crate) async fn predict(
    c: &Client<HttpConnector, Full<Bytes>>,
    addr: SocketAddr,
    key: Option<&str>,
) -> Reply {
    let key = key.map(|k| ("x-rollgate-key", k));
    call(
        c,
        addr,
        "POST",
        "/v1/models/m:predict",
        key.as_slice(),
        r#"{"instances":[[1,2]]}"#,
    )
    .await
}

/// Polls the gateway's snapshot until `cond` holds (bounded: 10 s).
pub(crate) async fn eventually(
    g: &Gateway,
    cond: impl Fn(&GatewaySnapshot) -> bool,
) -> GatewaySnapshot {
    for _ in 0..1000 {
        let s = g.snapshot();
        if cond(&s) {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("condition not reached: {:?}", g.snapshot());
}

pub(crate) fn rev(s: &GatewaySnapshot, r: &str) -> rollgate_core::RevisionStats {
    s.models
        .get("m")
        .map(|m| m.revision(r).clone())
        .unwrap_or_default()
}

pub(crate) const ONE: &str = r#"{"predictions":[1]}"#;

/// A bare HTTP/1.1 upstream on a raw socket, for what a hyper server would
/// not do: `answer(request)` returns the status, body, whether to gzip it,
/// and whether to drop the *next* request on this connection unanswered
/// (as a server that closed the connection right after a 500 does to the
/// client that reuses it). Records every `accept-encoding` it was sent.
pub(crate) async fn raw_upstream(
    answer: fn(&str) -> (u16, &'static str, bool, bool),
) -> (String, Arc<std::sync::Mutex<Vec<String>>>) {
    use tokio::io::AsyncWriteExt;
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let log = Arc::clone(&log);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut drop_next = false;
                loop {
                    let Some((head, body)) =
                        crate::common::read_request(&mut stream, &mut buf).await
                    else {
                        return;
                    };
                    let body = String::from_utf8_lossy(&body).into_owned();
                    if let Some(ae) = head
                        .lines()
                        .find_map(|l| l.strip_prefix("accept-encoding:"))
                    {
                        log.lock().expect("log").push(ae.trim().to_string());
                    }
                    if drop_next {
                        return; // closed, no answer
                    }
                    let (status, text, gzip, drop_after) = answer(&body);
                    drop_next = drop_after;
                    let (payload, encoding) = if gzip {
                        use std::io::Write;
                        let mut e =
                            flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                        e.write_all(text.as_bytes()).expect("gzip");
                        (e.finish().expect("gzip"), "content-encoding: gzip\r\n")
                    } else {
                        (text.as_bytes().to_vec(), "")
                    };
                    let head = format!(
                        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n{encoding}content-length: {}\r\n\r\n",
                        payload.len()
                    );
                    if stream.write_all(head.as_bytes()).await.is_err()
                        || stream.write_all(&payload).await.is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    (format!("http://{addr}"), seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assignment_is_sticky_and_follows_the_documented_hash() {
    let champ = upstream(Behaviour::Answer(200, ONE)).await;
    let cand = upstream(Behaviour::Answer(200, ONE)).await;
    let gw = start(config(vec![with_candidate(
        route(&champ.url),
        &cand.url,
        1000,
    )]))
    .await;
    let c = client();
    let mut on_candidate = 0;
    for i in 0..1000 {
        let key = format!("user-{i}");
        let r = predict(&c, gw.addr, Some(&key)).await;
        assert_eq!(r.status, StatusCode::OK);
        let expected = if bucket("m", key.as_bytes()) < 1000 {
            "cand"
        } else {
            "champ"
        };
        assert_eq!(r.revision.as_deref(), Some(expected), "key {key}");
        on_candidate += usize::from(expected == "cand");
    }
    assert!(
        (70..=130).contains(&on_candidate),
        "{on_candidate}/1000 at 10%"
    );
    for _ in 0..20 {
        let r = predict(&c, gw.addr, Some("user-7")).await;
        let expected = if bucket("m", b"user-7") < 1000 {
            "cand"
        } else {
            "champ"
        };
        assert_eq!(r.revision.as_deref(), Some(expected));
    }
    let s = gw.gateway.snapshot();
    assert_eq!(
        rev(&s, "cand").requests() + rev(&s, "champ").requests(),
        1020
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ramping_up_only_moves_keys_to_the_candidate() {
    let champ = upstream(Behaviour::Answer(200, ONE)).await;
    let cand = upstream(Behaviour::Answer(200, ONE)).await;
    let gw = start(config(vec![with_candidate(
        route(&champ.url),
        &cand.url,
        500,
    )]))
    .await;
    let c = client();
    let mut was_candidate: HashMap<String, bool> = HashMap::new();
    for weight in [500u32, 2500, 5000] {
        let bad = gw
            .gateway
            .set_routes(&[with_candidate(route(&champ.url), &cand.url, weight)]);
        assert_eq!(bad, vec![]);
        for i in 0..300 {
            let key = format!("k{i}");
            let now = predict(&c, gw.addr, Some(&key)).await.revision.as_deref() == Some("cand");
            if let Some(&before) = was_candidate.get(&key) {
                assert!(
                    !before || now,
                    "key {key} moved back to the champion at {weight}bp"
                );
            }
            was_candidate.insert(key, now);
        }
    }
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_attributed_to_the_revision_that_caused_them() {
    let champ = upstream(Behaviour::Answer(200, ONE)).await;
    let c = client();
    let cases: Vec<(Behaviour, StatusCode, &str)> = vec![
        (
            Behaviour::Answer(503, "unavailable"),
            StatusCode::SERVICE_UNAVAILABLE,
            "upstream_5xx",
        ),
        (
            Behaviour::Answer(200, "not json"),
            StatusCode::OK,
            "invalid_output",
        ),
        (
            Behaviour::Answer(400, r#"{"error":"bad input"}"#),
            StatusCode::BAD_REQUEST,
            "client",
        ),
        (
            Behaviour::Slow(Duration::from_secs(5), ONE),
            StatusCode::GATEWAY_TIMEOUT,
            "timeout",
        ),
    ];
    for (behaviour, want_status, class) in cases {
        let cand = upstream(behaviour).await;
        let mut r = with_candidate(route(&champ.url), &cand.url, 10_000);
        if let Some(c) = r.candidate.as_mut() {
            c.upstream.timeout = Some(Duration::from_millis(200));
        }
        let gw = start(config(vec![r])).await;
        for i in 0..5 {
            let reply = predict(&c, gw.addr, Some(&format!("u{i}"))).await;
            assert_eq!(reply.status, want_status, "{class}");
            assert_eq!(reply.revision.as_deref(), Some("cand"), "{class}");
        }
        let s = gw.gateway.snapshot();
        let cand_stats = rev(&s, "cand");
        let counted = match class {
            "upstream_5xx" => cand_stats.failures().upstream_5xx,
            "invalid_output" => cand_stats.failures().invalid_output,
            "timeout" => cand_stats.failures().timeout,
            _ => cand_stats.client_errors(),
        };
        assert_eq!(counted, 5, "{class}: {cand_stats:?}");
        if class == "client" {
            assert_eq!(
                cand_stats.requests(),
                0,
                "a client's 4xx is not the revision's request"
            );
        }
        assert_eq!(rev(&s, "champ").requests(), 0);
        gw.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_candidate_fails_or_falls_back_to_the_champion_counted() {
    let champ = upstream(Behaviour::Answer(200, ONE)).await;
    let dead = closed_url().await;
    let c = client();
    for fallback in [false, true] {
        let mut r = with_candidate(route(&champ.url), &dead, 10_000);
        r.fallback_to_champion = fallback;
        let gw = start(config(vec![r])).await;
        let reply = predict(&c, gw.addr, Some("u1")).await;
        let s = gw.gateway.snapshot();
        assert_eq!(rev(&s, "cand").failures().connect, 1);
        if fallback {
            assert_eq!(reply.status, StatusCode::OK);
            assert_eq!(reply.revision.as_deref(), Some("champ"));
            assert_eq!(s.fallbacks.get("m"), Some(&1));
            assert_eq!(rev(&s, "champ").requests(), 1);
        } else {
            assert_eq!(reply.status, StatusCode::BAD_GATEWAY);
            assert_eq!(reply.revision.as_deref(), Some("cand"));
            assert!(s.fallbacks.is_empty());
        }
        gw.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_bodies_a_shadow_needs_get_413_and_never_reach_a_model() {
    // (Without a shadow, nor a key to find in it, such a body streams:
    // stream.rs.)
    let champ = upstream(Behaviour::Answer(200, ONE)).await;
    let mut cfg = config(vec![with_shadow(route(&champ.url), &champ.url, 10_000)]);
    cfg.limits.max_body_bytes = 1024;
    let gw = start(cfg).await;
    let c = client();
    let big = format!(r#"{{"instances":["{}"]}}"#, "x".repeat(4096));
    let r = call(&c, gw.addr, "POST", "/v1/models/m:predict", &[], &big).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(r.body.contains("body_too_large"));
    assert_eq!(champ.hits.load(Ordering::SeqCst), 0);
    assert_eq!(rev(&gw.gateway.snapshot(), "champ").requests(), 0);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_the_concurrency_cap_requests_get_503_at_once() {
    let gate = Arc::new(Notify::new());
    let champ = upstream(Behaviour::Gated(Arc::clone(&gate))).await;
    let mut cfg = config(vec![route(&champ.url)]);
    cfg.limits.max_concurrent = 1;
    let gw = start(cfg).await;
    let c = client();
    let addr = gw.addr;
    let c2 = c.clone();
    let first = tokio::spawn(async move { predict(&c2, addr, Some("a")).await });
    // Wait (bounded) until the first request holds the only slot.
    let champ_hits = Arc::clone(&champ.hits);
    for _ in 0..500 {
        if champ_hits.load(Ordering::SeqCst) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let second = predict(&c, gw.addr, Some("b")).await;
    assert_eq!(second.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(second.body.contains("at_capacity"));
    gate.notify_waiters();
    assert_eq!(first.await.expect("join").status, StatusCode::OK);
    assert_eq!(gw.gateway.snapshot().overloaded, 1);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_requests_in_flight() {
    let champ = upstream(Behaviour::Slow(Duration::from_millis(300), ONE)).await;
    let gw = start(config(vec![route(&champ.url)])).await;
    let c = client();
    let addr = gw.addr;
    let in_flight = tokio::spawn(async move { predict(&c, addr, Some("a")).await });
    for _ in 0..500 {
        if champ.hits.load(Ordering::SeqCst) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    gw.shutdown().await;
    let r = in_flight.await.expect("join");
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body, ONE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routing_change_does_not_disturb_requests_in_flight() {
    let old = upstream(Behaviour::Slow(Duration::from_millis(200), ONE)).await;
    let new = upstream(Behaviour::Answer(200, r#"{"predictions":[0]}"#)).await;
    let gw = start(config(vec![route(&old.url)])).await;
    let c = client();
    let addr = gw.addr;
    let c2 = c.clone();
    let in_flight = tokio::spawn(async move { predict(&c2, addr, Some("a")).await });
    for _ in 0..500 {
        if old.hits.load(Ordering::SeqCst) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut next = route(&new.url);
    next.champion.revision = "champ-2".into();
    assert_eq!(gw.gateway.set_routes(&[next]), vec![]);
    let after = predict(&c, gw.addr, Some("b")).await;
    assert_eq!(after.revision.as_deref(), Some("champ-2"));
    let before = in_flight.await.expect("join");
    assert_eq!(
        (before.status, before.revision.as_deref()),
        (StatusCode::OK, Some("champ"))
    );
    gw.shutdown().await;
}

#[test]
fn invalid_routes_are_rejected_with_the_field_named() {
    let mut r = route("ftp://nope");
    let e = Gateway::new(&config(vec![r.clone()])).expect_err("bad url");
    assert_eq!(e.field, "models[0].champion.url");
    r = route("http://127.0.0.1:1");
    r.protocol = Protocol::Json;
    let e = Gateway::new(&config(vec![r])).expect_err("json without path");
    assert_eq!(e.field, "models[0].json_path");
    let e = Gateway::new(&config(vec![
        route("http://127.0.0.1:1"),
        route("http://127.0.0.1:2"),
    ]))
    .expect_err("duplicate");
    assert_eq!(e.field, "models[1].name");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_counted_in_their_epoch_and_old_epochs_fold_into_the_totals() {
    let champ = upstream(Behaviour::Answer(200, ONE)).await;
    let g = start(config(vec![route(&champ.url)])).await;
    let c = client();
    for e in 1..=12 {
        let mut r = route(&champ.url);
        r.epoch = Some(format!("7.{e}"));
        assert_eq!(g.gateway.set_routes(&[r]), vec![]);
        assert_eq!(predict(&c, g.addr, Some("k")).await.status, StatusCode::OK);
    }
    let s = eventually(&g.gateway, |s| rev(s, "champ").requests() == 12).await;
    let epochs = &s.epochs["m"];
    // The current epoch and the 8 most recently retired are reported apart,
    // each with its own request; older ones are folded into the totals.
    assert_eq!(epochs.len(), 9, "{:?}", epochs.keys().collect::<Vec<_>>());
    assert!(epochs.contains_key("7.12") && !epochs.contains_key("7.3"));
    for snap in epochs.values() {
        assert_eq!(snap.revision("champ").requests(), 1);
        assert_eq!(snap.revision("champ").arrived(), 1);
    }
    assert_eq!(rev(&s, "champ").arrived(), 12);
}

/// The key, not the request, is the statistical unit: outcomes are also
/// counted per unit group of the key's bucket. Per-request assignment
/// ignores the key: one user's requests reach both arms, in many groups.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcomes_are_counted_per_unit_group_and_per_request_assignment_ignores_the_key() {
    let champ = upstream(Behaviour::Answer(200, ONE)).await;
    let cand = upstream(Behaviour::Answer(200, ONE)).await;
    let sticky = with_candidate(route(&champ.url), &cand.url, 5000);
    let gw = start(config(vec![sticky.clone()])).await;
    let c = client();
    for _ in 0..20 {
        predict(&c, gw.addr, Some("user-7")).await;
    }
    let arm = if bucket("m", b"user-7") < 5000 {
        "cand"
    } else {
        "champ"
    };
    let s = gw.gateway.snapshot();
    let units = rev(&s, arm).units().clone();
    let unit = rollgate_core::unit_of(bucket("m", b"user-7"));
    assert_eq!(units.keys().copied().collect::<Vec<_>>(), vec![unit]);
    assert_eq!((units[&unit].requests, units[&unit].latencies), (20, 20));
    gw.shutdown().await;

    let per_request = ModelRoute {
        assignment: rollgate_core::plan::Assignment::PerRequest,
        ..sticky
    };
    let gw = start(config(vec![per_request])).await;
    for _ in 0..200 {
        let r = predict(&c, gw.addr, Some("user-7")).await;
        assert_eq!(r.status, StatusCode::OK);
    }
    let s = gw.gateway.snapshot();
    for arm in ["cand", "champ"] {
        let r = rev(&s, arm);
        assert!(r.requests() >= 50, "{arm}: {}", r.requests());
        assert!(r.units().len() >= 20, "{arm}: {} groups", r.units().len());
        let total: u64 = r.units().values().map(|u| u.requests).sum();
        assert_eq!(total, r.requests());
    }
    gw.shutdown().await;
}

/// One bad model spec never blocks the others: it is answered 404 with its
/// reason, reported in the snapshot and /metrics, and the good models keep
/// routing (also a json path claimed twice: the first keeps it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_cannot_be_routed_is_isolated_and_the_others_keep_routing() {
    let champ = upstream(Behaviour::Answer(200, ONE)).await;
    let gw = start(config(vec![route(&champ.url)])).await;
    let bad_pointer = ModelRoute {
        name: "bad".into(),
        key_field: Some("user_id".into()),
        ..route(&champ.url)
    };
    let json = |name: &str| ModelRoute {
        name: name.into(),
        protocol: Protocol::Json,
        json_path: Some("/score".into()),
        ..route(&champ.url)
    };
    let ftp = ModelRoute {
        name: "tls".into(),
        champion: up("champ", "ftp://127.0.0.1:1"),
        ..route(&champ.url)
    };
    let isolated = gw.gateway.set_routes(&[
        bad_pointer,
        route(&champ.url),
        json("first"),
        json("second"),
        ftp,
    ]);
    let names: Vec<&str> = isolated.iter().map(|u| u.model.as_str()).collect();
    assert_eq!(names, ["bad", "second", "tls"]);
    assert!(
        isolated[0].reason.contains("key_field"),
        "{:?}",
        isolated[0]
    );
    assert!(isolated[2].reason.contains("http://"), "{:?}", isolated[2]);

    let c = client();
    assert_eq!(predict(&c, gw.addr, Some("u")).await.status, StatusCode::OK);
    let r = call(
        &c,
        gw.addr,
        "POST",
        "/v1/models/bad:predict",
        &[],
        r#"{"instances":[1]}"#,
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert!(
        r.body.contains("unroutable_model") && r.body.contains("key_field"),
        "{}",
        r.body
    );
    let r = call(&c, gw.addr, "POST", "/score", &[], "{}").await;
    assert_eq!(r.status, StatusCode::OK, "the first model keeps its path");
    let r = call(&c, gw.addr, "POST", "/v1/models/nope:predict", &[], "{}").await;
    assert!(r.body.contains("unknown_model"), "{}", r.body);

    let s = gw.gateway.snapshot();
    assert_eq!(
        s.unroutable.keys().collect::<Vec<_>>(),
        ["bad", "second", "tls"]
    );
    let metrics = gw.gateway.metrics_text();
    assert!(
        metrics.contains(r#"rollgate_model_unroutable{model="bad"} 1"#),
        "{metrics}"
    );
    // Fixed: the model routes again and is no longer reported.
    assert_eq!(gw.gateway.set_routes(&[route(&champ.url)]), vec![]);
    assert!(gw.gateway.snapshot().unroutable.is_empty());
    gw.shutdown().await;
}

/// A revision served under another name gets its paths rewritten and its
/// own headers (over the client's); a request in the wrong protocol is
/// refused before any model sees it; version-pinned V2 paths route.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revisions_get_their_served_name_and_headers_and_wrong_protocols_are_refused() {
    let log = Arc::new(std::sync::Mutex::new(Vec::new()));
    let champ = upstream(Behaviour::Record(Arc::clone(&log))).await;
    let mut up = up("champ", &champ.url);
    up.served_name = Some("served".into());
    up.headers = [
        ("authorization".to_string(), "Bearer revision".to_string()),
        ("host".to_string(), "models.internal".to_string()),
    ]
    .into();
    let gw = start(config(vec![ModelRoute {
        champion: up,
        ..route(&champ.url)
    }]))
    .await;
    let c = client();
    let req = Request::builder()
        .method("POST")
        .uri(format!("http://{}/v1/models/m:predict", gw.addr))
        .header("authorization", "Bearer client")
        .body(Full::new(Bytes::from_static(br#"{"instances":[1]}"#)))
        .expect("request");
    let r = c.request(req).await.expect("answer");
    assert_eq!(r.status(), StatusCode::OK);
    let seen = log.lock().expect("log").clone();
    assert_eq!(
        seen,
        [Seen {
            path: "/v1/models/served:predict".into(),
            authorization: Some("Bearer revision".into()),
            host: Some("models.internal".into()),
            request_id: seen[0].request_id.clone(),
        }]
    );

    let r = call(
        &c,
        gw.addr,
        "POST",
        "/v2/models/m/infer",
        &[],
        r#"{"inputs":[]}"#,
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(
        r.body.contains("wrong_protocol") && r.body.contains("kserve_v1"),
        "{}",
        r.body
    );
    assert_eq!(champ.hits.load(Ordering::SeqCst), 1, "never forwarded");
    let s = gw.gateway.snapshot();
    assert_eq!(s.wrong_protocol, 1);
    assert_eq!(
        rev(&s, "champ").client_errors(),
        0,
        "not held against a revision"
    );
    let r = call(&c, gw.addr, "GET", "/v2/models/m/versions/3", &[], "").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        log.lock().expect("log")[1].path,
        "/v2/models/served/versions/3"
    );
    gw.shutdown().await;
}

/// Every answer names its request (`x-request-id`): the client's id kept,
/// else one made; the same id reaches the model server and its shadow
/// copy, and the gateway's own refusals carry one too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_names_its_request_and_the_model_servers_see_the_same_id() {
    let champ_log = Arc::new(std::sync::Mutex::new(Vec::new()));
    let shadow_log = Arc::new(std::sync::Mutex::new(Vec::new()));
    let champ = upstream(Behaviour::Record(Arc::clone(&champ_log))).await;
    let shadow = upstream(Behaviour::Record(Arc::clone(&shadow_log))).await;
    let gw = start(config(vec![with_shadow(
        route(&champ.url),
        &shadow.url,
        10_000,
    )]))
    .await;
    let c = client();
    let body = r#"{"instances":[1]}"#;
    let theirs = call(
        &c,
        gw.addr,
        "POST",
        "/v1/models/m:predict",
        &[("x-request-id", "order-42")],
        body,
    )
    .await;
    assert_eq!(theirs.status, StatusCode::OK);
    assert_eq!(theirs.request_id.as_deref(), Some("order-42"));
    let ours = call(&c, gw.addr, "POST", "/v1/models/m:predict", &[], body).await;
    let made = ours.request_id.clone().expect("an id made");
    assert_eq!(made.len(), 32, "{made}");
    let unusable = "x".repeat(200);
    let replaced = call(
        &c,
        gw.addr,
        "POST",
        "/v1/models/m:predict",
        &[("x-request-id", &unusable)],
        body,
    )
    .await;
    let replaced = replaced.request_id.expect("an id");
    assert!(replaced.len() == 32 && replaced != made, "{replaced}");
    let refused = call(&c, gw.addr, "POST", "/v1/models/nope:predict", &[], body).await;
    assert_eq!(refused.status, StatusCode::NOT_FOUND);
    assert!(
        refused
            .request_id
            .is_some_and(|id| id.len() == 32 && id != made)
    );
    let ids = |log: &Arc<std::sync::Mutex<Vec<Seen>>>| -> Vec<Option<String>> {
        log.lock()
            .expect("log")
            .iter()
            .map(|s| s.request_id.clone())
            .collect()
    };
    let want = vec![Some("order-42".to_string()), Some(made), Some(replaced)];
    assert_eq!(ids(&champ_log), want, "the champion saw each request's id");
    let started = std::time::Instant::now();
    while shadow_log.lock().expect("log").len() < 3 && started.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(ids(&shadow_log), want, "the shadow saw the same ids");
    gw.shutdown().await;
}
