//! Answers beyond the response limit, against a raw HTTP/1.1 model server
//! on 127.0.0.1 that answers large, breaks off, or stalls: passed on as
//! they arrive when nothing needs them whole, and counted when they end.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rollgate_core::{GatewaySnapshot, Protocol, RevisionStats};
use rollgate_gateway::{Gateway, GatewayConfig, MirroredUpstream, ModelRoute, serve};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

use crate::common::{route, up};

const BIG: usize = 1 << 20;
const LIMIT: usize = 64 << 10;

/// What the raw model server does after a request's headers.
#[derive(Clone, Copy)]
enum Answer {
    /// 200 with `BIG` bytes.
    Big,
    /// Announces `BIG` bytes, sends a fifth, closes.
    BreaksOff,
    /// Announces `BIG` bytes, sends a fifth, then nothing (until the test
    /// ends).
    Stalls,
    /// 200 with `{"predictions":[n]}`: how many of the request body's
    /// bytes were as sent (`byte(i)`).
    Count,
}

fn byte(i: usize) -> u8 {
    (i % 251) as u8
}

async fn raw_server(answer: Answer) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            tokio::spawn(serve_conn(conn, answer));
        }
    });
    url
}

async fn serve_conn(mut conn: TcpStream, answer: Answer) {
    let mut buf = Vec::new();
    loop {
        let Some((_, request)) = crate::common::read_request(&mut conn, &mut buf).await else {
            return;
        };
        let intact = request
            .iter()
            .enumerate()
            .filter(|&(i, &b)| b == byte(i))
            .count();
        if let Answer::Count = answer {
            let body = format!(r#"{{"predictions":[{intact}]}}"#);
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                body.len()
            );
            if conn.write_all(head.as_bytes()).await.is_err()
                || conn.write_all(body.as_bytes()).await.is_err()
            {
                return;
            }
            continue;
        }
        let body: Vec<u8> = (0..BIG).map(byte).collect();
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ncontent-length: {BIG}\r\n\r\n"
        );
        if conn.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        match answer {
            Answer::Big => {
                if conn.write_all(&body).await.is_err() {
                    return;
                }
            }
            Answer::BreaksOff => {
                let _ = conn.write_all(&body[..BIG / 5]).await;
                return;
            }
            Answer::Stalls => {
                let _ = conn.write_all(&body[..BIG / 5]).await;
                tokio::time::sleep(Duration::from_secs(3600)).await;
                return;
            }
            Answer::Count => unreachable!("answered above"),
        }
    }
}

/// A generic JSON model on `/score` whose output is not read.
fn json_route(url: &str) -> ModelRoute {
    let mut r = route(url);
    r.protocol = Protocol::Json;
    r.json_path = Some("/score".into());
    r
}

async fn start(models: Vec<ModelRoute>) -> (SocketAddr, Gateway) {
    let mut config = GatewayConfig {
        models,
        ..GatewayConfig::default()
    };
    config.limits.max_response_bytes = LIMIT;
    config.limits.max_body_bytes = LIMIT;
    let gateway = Gateway::new(&config).expect("valid config");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(serve(listener, gateway.clone(), std::future::pending()));
    (addr, gateway)
}

/// POSTs to `path`; the status and the body as read (or why it broke).
async fn post(addr: SocketAddr, path: &str) -> (StatusCode, Result<Bytes, String>) {
    post_body(addr, path, Bytes::from_static(br#"{"instances":[[1,2]]}"#)).await
}

async fn post_body(
    addr: SocketAddr,
    path: &str,
    body: Bytes,
) -> (StatusCode, Result<Bytes, String>) {
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let req = http::Request::post(format!("http://{addr}{path}"))
        .header("content-type", "application/json")
        .header("x-rollgate-key", "user-1")
        .body(Full::new(body))
        .expect("request");
    let resp = tokio::time::timeout(Duration::from_secs(10), client.request(req))
        .await
        .expect("headers within 10 s")
        .expect("http");
    let status = resp.status();
    let body = tokio::time::timeout(Duration::from_secs(10), resp.into_body().collect())
        .await
        .expect("body ends within 10 s")
        .map(|b| b.to_bytes())
        .map_err(|e| e.to_string());
    (status, body)
}

fn rev(s: &GatewaySnapshot, r: &str) -> RevisionStats {
    s.models
        .get("m")
        .map(|m| m.revision(r).clone())
        .unwrap_or_default()
}

/// Waits (bounded) until `rev` has `n` outcomes (successes and failures).
async fn counted(g: &Gateway, r: &str, n: u64) -> RevisionStats {
    for _ in 0..200 {
        let s = rev(&g.snapshot(), r);
        if s.requests() >= n {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    rev(&g.snapshot(), r)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_beyond_the_limit_streams_when_nothing_reads_it() {
    let url = raw_server(Answer::Big).await;
    let mut json = json_route(&url);
    json.shadow = Some(MirroredUpstream {
        upstream: up("shadow", &url),
        mirror_bp: 10_000,
    });
    // Model `k`: KServe V1, whose predictions are read.
    let mut kserve = route(&url);
    kserve.name = "k".into();
    let (addr, gateway) = start(vec![json, kserve]).await;

    let (status, body) = post(addr, "/score").await;
    assert_eq!(status, StatusCode::OK);
    let body = body.expect("the whole answer");
    assert_eq!(body.len(), BIG, "16 times the limit, passed on");
    assert!(
        body.iter().enumerate().all(|(i, &b)| b == byte(i)),
        "intact"
    );
    let champ = counted(&gateway, "champ", 1).await;
    assert_eq!(
        (champ.requests(), champ.failures().total()),
        (1, 0),
        "{champ:?}"
    );
    // The mirrored copy was read to its end, thrown away, and counted.
    let shadow = counted(&gateway, "shadow", 1).await;
    assert_eq!(
        (shadow.requests(), shadow.failures().total()),
        (1, 0),
        "{shadow:?}"
    );

    // Where predictions are read, an answer beyond the limit cannot be:
    // refused, and a failure of the revision, as before.
    let (status, _) = post(addr, "/v1/models/k:predict").await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    let s = gateway.snapshot();
    let k = s.models["k"].revision("champ");
    assert_eq!(k.failures().upstream_5xx, 1, "{k:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_answer_that_breaks_off_or_stalls_is_a_failure() {
    let broken = raw_server(Answer::BreaksOff).await;
    let (addr, gateway) = start(vec![json_route(&broken)]).await;
    let (status, body) = post(addr, "/score").await;
    assert_eq!(status, StatusCode::OK, "the headers were on their way");
    assert!(body.is_err(), "the client sees the answer break off");
    let champ = counted(&gateway, "champ", 1).await;
    assert_eq!(
        (champ.requests(), champ.failures().upstream_5xx),
        (1, 1),
        "{champ:?}"
    );

    let stalls = raw_server(Answer::Stalls).await;
    let mut r = json_route(&stalls);
    r.champion.timeout = Some(Duration::from_millis(300));
    gateway.set_routes(&[r]);
    let (status, body) = post(addr, "/score").await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.is_err(), "cut at the revision's timeout");
    let champ = counted(&gateway, "champ", 2).await;
    assert_eq!(champ.failures().timeout, 1, "{champ:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_body_beyond_the_limit_streams_when_nothing_needs_it_whole() {
    let url = raw_server(Answer::Count).await;
    let (addr, gateway) = start(vec![route(&url)]).await;
    let big: Bytes = (0..BIG).map(byte).collect::<Vec<u8>>().into();
    let (status, body) = post_body(addr, "/v1/models/m:predict", big.clone()).await;
    assert_eq!(status, StatusCode::OK);
    let body = body.expect("answer");
    assert_eq!(
        std::str::from_utf8(&body).expect("utf-8"),
        format!(r#"{{"predictions":[{BIG}]}}"#),
        "every byte reached the model intact"
    );
    let s = gateway.snapshot();
    assert_eq!(s.streamed_requests, 1);
    assert_eq!(rev(&s, "champ").failures().total(), 0);

    // With a shadow, the body must be held whole to be mirrored: refused.
    let mut shadowed = route(&url);
    shadowed.shadow = Some(MirroredUpstream {
        upstream: up("shadow", &url),
        mirror_bp: 10_000,
    });
    gateway.set_routes(&[shadowed]);
    let (status, _) = post_body(addr, "/v1/models/m:predict", big).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(gateway.snapshot().streamed_requests, 1);
}
