//! The gateway over TLS and HTTP/2, against real servers on 127.0.0.1:
//! clients reach it by h2 over TLS (ALPN) and h2c, and it reaches model
//! servers at `https://` URLs, verified against a team's CA, presenting
//! its client certificate to one that requires it (mTLS).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode, Version};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rollgate_gateway::{Gateway, GatewayConfig, serve};
use rollgate_net::testing::Ca;
use rollgate_net::{ClientTls, ListenerTls, Serving};
use tokio::net::TcpListener;

use crate::common::route;

/// A model server on `https://localhost:port` that requires a client
/// certificate from `clients`; counts the requests it answered over
/// HTTP/2 (`+1`) and HTTP/1.1 (`+1_000_000`).
async fn tls_model_server(
    dir: &std::path::Path,
    ca: &Ca,
    clients: &Ca,
) -> (String, Arc<AtomicU64>, tokio::sync::oneshot::Sender<()>) {
    let (cert_file, key_file) = ca.issue(&["localhost"]).write(dir, "model");
    let tls = ListenerTls {
        cert_file,
        key_file,
        client_ca_file: Some(clients.write(dir, "clients.pem")),
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let answered = Arc::new(AtomicU64::new(0));
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let count = Arc::clone(&answered);
    let make = move || {
        let count = Arc::clone(&count);
        service_fn(move |req: Request<Incoming>| {
            let count = Arc::clone(&count);
            async move {
                let n = if req.version() == Version::HTTP_2 {
                    1
                } else {
                    1_000_000
                };
                count.fetch_add(n, Ordering::SeqCst);
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(
                    br#"{"predictions":[1]}"#,
                ))))
            }
        })
    };
    tokio::spawn(rollgate_net::serve(
        listener,
        Serving {
            header_timeout: Duration::from_secs(5),
            drain_timeout: Duration::from_secs(5),
            tls: Some(tls.server().expect("tls")),
            refusal_body: None,
        },
        make,
        async {
            let _ = rx.await;
        },
    ));
    (format!("https://localhost:{port}"), answered, tx)
}

async fn start(config: GatewayConfig) -> (SocketAddr, Gateway, tokio::sync::oneshot::Sender<()>) {
    let gateway = Gateway::new(&config).expect("valid config");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(serve(listener, gateway.clone(), async move {
        let _ = rx.await;
    }));
    (addr, gateway, tx)
}

/// POSTs a prediction; `(version, status, revision header, body)`.
async fn predict(
    url: &str,
    tls: &ClientTls,
    http2_only: bool,
) -> (Version, StatusCode, Option<String>, String) {
    let connector = rollgate_net::connector(HttpConnector::new(), tls).expect("connector");
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(http2_only)
        .build(connector);
    let req = Request::post(format!("{url}/v1/models/m:predict"))
        .header("content-type", "application/json")
        .header("x-rollgate-key", "user-1")
        .body(Full::new(Bytes::from_static(br#"{"instances":[[1,2]]}"#)))
        .expect("request");
    let resp = tokio::time::timeout(Duration::from_secs(10), client.request(req))
        .await
        .expect("answered within 10 s")
        .expect("http");
    let (v, s) = (resp.version(), resp.status());
    let rev = resp
        .headers()
        .get("x-rollgate-revision")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (v, s, rev, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_over_tls_in_and_mtls_to_an_https_model_server_out() {
    let dir = tempfile::tempdir().expect("tmp");
    let (models_ca, gateways_ca, edge_ca) =
        (Ca::new("models"), Ca::new("gateways"), Ca::new("edge"));
    let (model_url, answered, _stop_model) =
        tls_model_server(dir.path(), &models_ca, &gateways_ca).await;
    let (gw_cert, gw_key) = gateways_ca
        .issue(&["gateway"])
        .write(dir.path(), "gw-client");
    let (edge_cert, edge_key) = edge_ca.issue(&["localhost"]).write(dir.path(), "edge");
    let config = GatewayConfig {
        tls: Some(ListenerTls {
            cert_file: edge_cert,
            key_file: edge_key,
            client_ca_file: None,
        }),
        upstream_tls: ClientTls {
            ca_file: Some(models_ca.write(dir.path(), "models.pem")),
            cert_file: Some(gw_cert),
            key_file: Some(gw_key),
        },
        models: vec![route(&model_url)],
        ..GatewayConfig::default()
    };
    let (addr, gateway, _stop) = start(config).await;
    let url = format!("https://localhost:{}", addr.port());
    let client_tls = ClientTls {
        ca_file: Some(edge_ca.write(dir.path(), "edge.pem")),
        ..ClientTls::default()
    };
    for _ in 0..3 {
        let (v, status, rev, body) = predict(&url, &client_tls, false).await;
        assert_eq!((v, status), (Version::HTTP_2, StatusCode::OK), "{body}");
        assert_eq!(rev.as_deref(), Some("champ"));
        assert_eq!(body, r#"{"predictions":[1]}"#);
    }
    // All three reached the model server, over HTTP/2 (offered by ALPN).
    assert_eq!(answered.load(Ordering::SeqCst), 3);
    let champ = gateway.snapshot().models["m"].revision("champ").clone();
    assert_eq!((champ.requests(), champ.failure_count()), (3, 0));
    assert_eq!(champ.predictions().get("1"), Some(&3), "answers were read");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_model_server_the_gateway_cannot_trust_or_satisfy_is_a_counted_connect_failure() {
    let dir = tempfile::tempdir().expect("tmp");
    let (models_ca, gateways_ca) = (Ca::new("models"), Ca::new("gateways"));
    let (model_url, answered, _stop_model) =
        tls_model_server(dir.path(), &models_ca, &gateways_ca).await;
    // Untrusted server certificate; then trusted, but no client certificate.
    let untrusting = ClientTls::default();
    let anonymous = ClientTls {
        ca_file: Some(models_ca.write(dir.path(), "models.pem")),
        ..ClientTls::default()
    };
    for (n, upstream_tls) in [untrusting, anonymous].into_iter().enumerate() {
        let (addr, gateway, _stop) = start(GatewayConfig {
            upstream_tls,
            models: vec![route(&model_url)],
            ..GatewayConfig::default()
        })
        .await;
        // h2c with prior knowledge on the plain listener.
        let (v, status, rev, body) =
            predict(&format!("http://{addr}"), &ClientTls::default(), true).await;
        assert_eq!(v, Version::HTTP_2);
        assert!(status.is_server_error(), "case {n}: {status} {body}");
        assert_eq!(rev.as_deref(), Some("champ"));
        let champ = gateway.snapshot().models["m"].revision("champ").clone();
        assert_eq!(
            champ.failure_count(),
            1,
            "case {n}: counted against the revision"
        );
    }
    assert_eq!(answered.load(Ordering::SeqCst), 0);
}

#[test]
fn bad_tls_files_are_config_errors_naming_the_field() {
    let dir = tempfile::tempdir().expect("tmp");
    let err = Gateway::new(&GatewayConfig {
        tls: Some(ListenerTls {
            cert_file: dir.path().join("none.crt"),
            key_file: dir.path().join("none.key"),
            client_ca_file: None,
        }),
        ..GatewayConfig::default()
    })
    .expect_err("missing files");
    assert!(
        err.to_string().contains("`tls`") && err.to_string().contains("none.crt"),
        "{err}"
    );
    let err = Gateway::new(&GatewayConfig {
        upstream_tls: ClientTls {
            cert_file: Some(dir.path().join("c.crt")),
            ..ClientTls::default()
        },
        ..GatewayConfig::default()
    })
    .expect_err("half a client certificate");
    assert!(err.to_string().contains("upstream_tls"), "{err}");
}
