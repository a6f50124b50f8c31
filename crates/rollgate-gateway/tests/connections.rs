//! The gateway keeps every connection it answers: a refusal or an
//! upstream's 500 never costs the client its connection, slow and idle
//! clients are cut off by the client timeouts without holding capacity,
//! and plain upstream connections are reused until idle too long.

use crate::common::route;
use crate::it::*;
use http::StatusCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::Notify;

/// The gateway's own refusals (an unknown model, the wrong protocol, a
/// path with no route) answered without reading the request's body keep
/// the connection for the next request: the body is drained, however late
/// it arrives; a body too large to drain gets `Connection: close`. Raw
/// sockets, so nothing retries behind the test's back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_keeps_the_connection_for_the_next_request() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let champ = upstream(Behaviour::Answer(200, ONE)).await;
    let g = start(config(vec![route(&champ.url)])).await;
    let mut stream = tokio::net::TcpStream::connect(g.addr)
        .await
        .expect("connect");
    let mut buf = Vec::new();
    // Reads one answer; its status and head.
    async fn answer(stream: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) -> (u16, String) {
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                if buf.len() >= end + 4 + len {
                    buf.drain(..end + 4 + len);
                    let status = head[9..12].parse().expect("status");
                    return (status, head);
                }
            }
            let mut chunk = [0u8; 4096];
            let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut chunk))
                .await
                .expect("an answer within 10 s")
                .expect("read");
            assert!(n > 0, "the connection was closed");
            buf.extend_from_slice(&chunk[..n]);
        }
    }
    let body = r#"{"instances":[[1,2]]}"#;
    let head = |path: &str, len: usize| {
        format!(
            "POST {path} HTTP/1.1\r\nhost: g\r\ncontent-type: application/json\r\ncontent-length: {len}\r\n\r\n"
        )
    };
    for (path, refused) in [
        ("/v1/models/nope:predict", 404),
        ("/v2/models/m/infer", 400),
        ("/no/route/here", 404),
    ] {
        for late in [false, true] {
            // The refused request, its body early or 300 ms late.
            stream
                .write_all(head(path, body.len()).as_bytes())
                .await
                .expect("write");
            if late {
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            stream.write_all(body.as_bytes()).await.expect("write");
            let (status, h) = answer(&mut stream, &mut buf).await;
            assert_eq!(status, refused, "{path}: {h}");
            assert!(!h.contains("connection: close"), "{path}: {h}");
            // The next, valid request on the same connection.
            stream
                .write_all(format!("{}{body}", head("/v1/models/m:predict", body.len())).as_bytes())
                .await
                .expect("write");
            let (status, h) = answer(&mut stream, &mut buf).await;
            assert_eq!(status, 200, "after {path} (late body: {late}): {h}");
        }
    }
    // A body beyond what is drained: told the connection ends.
    let big = "x".repeat(200 << 10);
    stream
        .write_all(format!("{}{big}", head("/v1/models/nope:predict", big.len())).as_bytes())
        .await
        .expect("write");
    let (status, h) = answer(&mut stream, &mut buf).await;
    assert_eq!(status, 404, "{h}");
    assert!(h.contains("connection: close"), "{h}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_closed_after_a_500_never_fails_the_next_good_request() {
    // After each 500 the upstream drops the next request on that
    // connection unanswered, as uvicorn does after closing it silently.
    let (url, _) = raw_upstream(|body| {
        if body.contains("bad") {
            (500, "Internal Server Error", false, true)
        } else {
            (200, ONE, false, false)
        }
    })
    .await;
    let g = start(config(vec![route(&url)])).await;
    let c = client();
    let (mut good, mut bad) = (0, 0);
    for i in 0..40 {
        let body = if i % 2 == 0 {
            r#"{"bad":1}"#
        } else {
            r#"{"instances":[[1]]}"#
        };
        let r = call(&c, g.addr, "POST", "/v1/models/m:predict", &[], body).await;
        if i % 2 == 0 {
            assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "{}", r.body);
            bad += 1;
        } else {
            assert_eq!(r.status, StatusCode::OK, "request {i}: {}", r.body);
            good += 1;
        }
    }
    let s = eventually(&g.gateway, |s| rev(s, "champ").requests() == good + bad).await;
    let champ = rev(&s, "champ");
    assert_eq!(champ.failures().upstream_5xx, bad);
    assert_eq!(champ.failure_count(), bad, "{champ:?}");
    assert!(s.retried > 0, "the dropped requests were sent again: {s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_bodies_hold_no_capacity_and_gone_clients_leave_no_request_in_flight() {
    use tokio::io::AsyncWriteExt;
    let gate = Arc::new(Notify::new());
    let champ = upstream(Behaviour::Gated(Arc::clone(&gate))).await;
    let mut cfg = config(vec![route(&champ.url)]);
    cfg.limits.max_concurrent = 2;
    let gw = start(cfg).await;
    // More slow-body clients than slots: each sends its headers and a
    // byte of a 100-byte body, then nothing.
    let mut slow = Vec::new();
    for _ in 0..4 {
        let mut s = tokio::net::TcpStream::connect(gw.addr)
            .await
            .expect("connect");
        s.write_all(
            b"POST /v1/models/m:predict HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{",
        )
        .await
        .expect("write");
        slow.push(s);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // A real user still gets a slot (the upstream answers once released).
    let c = client();
    let addr = gw.addr;
    let c2 = c.clone();
    let user = tokio::spawn(async move { predict(&c2, addr, Some("u")).await });
    for _ in 0..500 {
        if champ.hits.load(Ordering::SeqCst) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        champ.hits.load(Ordering::SeqCst),
        1,
        "the user's request reached the model"
    );
    assert_eq!(gw.gateway.snapshot().overloaded, 0);
    assert_eq!(gw.gateway.snapshot().in_flight, 1);
    // The user gives up while its request is in flight: nothing leaks.
    user.abort();
    let _ = user.await;
    let s = eventually(&gw.gateway, |s| s.in_flight == 0).await;
    assert_eq!(s.in_flight, 0);
    gate.notify_waiters();
    drop(slow);
    gw.shutdown().await;
}

/// Reads from `s` until the gateway closes it or `within` passes; returns
/// what was read and whether it was closed.
async fn read_until_closed(s: &mut tokio::net::TcpStream, within: Duration) -> (String, bool) {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let closed = tokio::time::timeout(within, async {
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .is_ok();
    (String::from_utf8_lossy(&got).into_owned(), closed)
}

/// Slowloris clients (headers dribbled), idle keep-alive connections and
/// slow bodies are cut off by the client timeouts, while a real user is
/// served beside them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_idle_clients_are_cut_off_by_the_client_timeouts() {
    use tokio::io::AsyncWriteExt;
    let champ = upstream(Behaviour::Answer(200, ONE)).await;
    let mut cfg = config(vec![route(&champ.url)]);
    cfg.limits.client_header_timeout = Duration::from_millis(300);
    cfg.limits.client_body_timeout = Duration::from_millis(300);
    let gw = start(cfg).await;
    let connect = || tokio::net::TcpStream::connect(gw.addr);

    // Headers never finished: the connection is closed.
    let mut loris = connect().await.expect("connect");
    loris
        .write_all(b"POST /v1/models/m:predict HTTP/1.1\r\nhost: x\r\n")
        .await
        .expect("write");
    // An idle keep-alive connection after one answered request.
    let mut idle = connect().await.expect("connect");
    idle.write_all(b"POST /v1/models/m:predict HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}")
        .await
        .expect("write");
    // A body that never completes: 408.
    let mut slow_body = connect().await.expect("connect");
    slow_body
        .write_all(b"POST /v1/models/m:predict HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{")
        .await
        .expect("write");

    let r = predict(&client(), gw.addr, Some("u")).await;
    assert_eq!(r.status, StatusCode::OK, "a real user is served meanwhile");

    let (_, closed) = read_until_closed(&mut loris, Duration::from_secs(10)).await;
    assert!(closed, "a slowloris connection is closed");
    let (answer, closed) = read_until_closed(&mut idle, Duration::from_secs(10)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(closed, "an idle keep-alive connection is closed");
    let (answer, _) = read_until_closed(&mut slow_body, Duration::from_secs(10)).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("body_timeout"), "{answer}");
    assert_eq!(gw.gateway.snapshot().slow_clients, 1);
    assert_eq!(gw.gateway.snapshot().in_flight, 0);
    gw.shutdown().await;
}

/// Plain-HTTP upstreams are reached through the gateway's own pool: one
/// connection carries sequential requests, a connection idle past
/// `pool_idle_timeout` is not reused, the base URL's path is kept and the
/// `Host` is the upstream's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_upstream_connections_are_reused_until_idle_too_long() {
    let log = Arc::new(std::sync::Mutex::new(Vec::new()));
    let champ = upstream(Behaviour::Record(Arc::clone(&log))).await;
    let mut cfg = config(vec![route(&format!("{}/prefix/", champ.url))]);
    cfg.limits.pool_idle_timeout = Duration::from_millis(300);
    let gw = start(cfg).await;
    let c = client();
    for _ in 0..5 {
        assert_eq!(predict(&c, gw.addr, Some("u")).await.status, StatusCode::OK);
    }
    assert_eq!(champ.hits.load(Ordering::SeqCst), 5);
    assert_eq!(
        champ.conns.load(Ordering::SeqCst),
        1,
        "one connection, reused"
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(predict(&c, gw.addr, Some("u")).await.status, StatusCode::OK);
    assert_eq!(
        champ.conns.load(Ordering::SeqCst),
        2,
        "idle too long: a new one"
    );
    let seen = log.lock().expect("log").clone();
    let authority = champ.url.trim_start_matches("http://");
    assert!(
        seen.iter().all(
            |s| s.path == "/prefix/v1/models/m:predict" && s.host.as_deref() == Some(authority)
        ),
        "{seen:?}"
    );
    gw.shutdown().await;
}
