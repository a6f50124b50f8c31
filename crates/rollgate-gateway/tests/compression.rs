//! Compression on both sides: an upstream that compresses anyway is
//! measured decoded, one that decodes beyond the limit is its own
//! failure, and clients that accept gzip get large answers compressed
//! while the gateway measures them unencoded.

use crate::common::route;
use crate::it::*;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_compresses_anyway_is_measured_decoded() {
    // Asked for identity, this upstream gzips every answer regardless.
    let (url, seen) = raw_upstream(|_| (200, r#"{"predictions":[[0.1,0.9]]}"#, true, false)).await;
    let g = start(config(vec![route(&url)])).await;
    let req = Request::builder()
        .method("POST")
        .uri(format!("http://{}/v1/models/m:predict", g.addr))
        .header("content-type", "application/json")
        .header("accept-encoding", "gzip, deflate")
        .body(Full::new(Bytes::from_static(br#"{"instances":[[1,2]]}"#)))
        .expect("request");
    let resp = client().request(req).await.expect("http");
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(resp.headers().get("content-encoding").is_none());
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(&body[..], br#"{"predictions":[[0.1,0.9]]}"#);
    // The upstream was asked for identity, not for the client's gzip.
    assert_eq!(seen.lock().expect("log").as_slice(), ["identity"]);
    // Measured as a success with its prediction, not as invalid output.
    let s = eventually(&g.gateway, |s| rev(s, "champ").requests() == 1).await;
    let champ = rev(&s, "champ");
    assert_eq!(champ.failure_count(), 0, "{champ:?}");
    assert_eq!(champ.predictions().values().sum::<u64>(), 1);
}

/// An answer that decodes to 64 KiB from a few hundred bytes.
static BOMB: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| format!(r#"{{"predictions":[{}0]}}"#, "0,".repeat(32 << 10)));

/// An upstream whose gzip answer decodes beyond the response limit (a gzip
/// bomb) fails: 502, counted as the upstream's, never its compressed bytes
/// passed on as a 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_that_decodes_beyond_the_limit_is_the_upstreams_failure() {
    let (url, _) = raw_upstream(|_| (200, BOMB.as_str(), true, false)).await;
    let mut cfg = config(vec![route(&url)]);
    cfg.limits.max_response_bytes = 16 << 10;
    let g = start(cfg).await;
    let r = call(&client(), g.addr, "POST", "/v1/models/m:predict", &[], "{}").await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY, "{}", r.body);
    let s = eventually(&g.gateway, |s| rev(s, "champ").requests() == 1).await;
    assert_eq!(
        rev(&s, "champ").failure_count(),
        1,
        "the upstream's failure"
    );
}

/// Answers are measured unencoded and compressed for a client that accepts
/// gzip (when worth it): the client gets what it asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_accept_gzip_get_large_answers_compressed_and_measured_unencoded() {
    use std::io::Read;
    let rows: Vec<String> = (0..64)
        .map(|i| format!("[0.{:04},0.{:04}]", i, 9999 - i))
        .collect();
    let large: &'static str =
        Box::leak(format!(r#"{{"predictions":[{}]}}"#, rows.join(",")).into_boxed_str());
    assert!(large.len() > 1024);
    let champ = upstream(Behaviour::Answer(200, large)).await;
    let gw = start(config(vec![route(&champ.url)])).await;
    let c = client();
    let ask = |encoding: Option<&'static str>| {
        let mut b = Request::builder()
            .method("POST")
            .uri(format!("http://{}/v1/models/m:predict", gw.addr));
        if let Some(e) = encoding {
            b = b.header("accept-encoding", e);
        }
        let req = b
            .body(Full::new(Bytes::from_static(br#"{"instances":[[1]]}"#)))
            .expect("request");
        let c = c.clone();
        async move {
            let r = c.request(req).await.expect("answer");
            let enc = r
                .headers()
                .get("content-encoding")
                .map(|v| v.to_str().unwrap_or("").to_string());
            let body = r.into_body().collect().await.expect("body").to_bytes();
            (enc, body)
        }
    };
    let (enc, body) = ask(Some("gzip, deflate")).await;
    assert_eq!(enc.as_deref(), Some("gzip"));
    assert!(body.len() < large.len() / 2, "{} bytes", body.len());
    let mut plain = String::new();
    flate2::read::GzDecoder::new(&body[..])
        .read_to_string(&mut plain)
        .expect("gzip");
    assert_eq!(plain, large);
    for refused in [None, Some("identity"), Some("gzip;q=0")] {
        let (enc, body) = ask(refused).await;
        assert_eq!((enc, &body[..]), (None, large.as_bytes()), "{refused:?}");
    }
    let s = gw.gateway.snapshot();
    assert_eq!(rev(&s, "champ").requests(), 4);
    assert_eq!(rev(&s, "champ").failure_count(), 0, "measured unencoded");
    assert_eq!(rev(&s, "champ").predictions().values().sum::<u64>(), 4 * 64);
    gw.shutdown().await;
}
