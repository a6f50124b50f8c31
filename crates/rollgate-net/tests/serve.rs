//! The accept loop against real clients over 127.0.0.1: TLS by ALPN,
//! h2c with prior knowledge, mTLS, certificate reload, bounded
//! handshakes. Certificates are made here with rcgen.

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, Version};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rollgate_net::testing::{Ca, Pair};
use rollgate_net::{ClientTls, ListenerTls, Serving};
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;

fn write_pair(dir: &Path, stem: &str, pair: &Pair) -> (PathBuf, PathBuf) {
    pair.write(dir, stem)
}

/// Answers with the HTTP version the request came in.
async fn version(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(Response::new(Full::new(Bytes::from(format!(
        "{:?}",
        req.version()
    )))))
}

/// Serves `version` until the returned sender is dropped.
async fn start(serving: Serving) -> (String, tokio::sync::oneshot::Sender<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(rollgate_net::serve(
        listener,
        serving,
        || service_fn(version),
        async {
            let _ = rx.await;
        },
    ));
    (addr.to_string(), tx)
}

fn serving(tls: Option<&ListenerTls>) -> Serving {
    Serving {
        header_timeout: Duration::from_millis(500),
        drain_timeout: Duration::from_secs(5),
        tls: tls.map(|t| t.server().expect("server tls")),
        refusal_body: None,
    }
}

/// GETs `url` with a client trusting `tls`; `http2_only` speaks h2c
/// with prior knowledge in the clear. The version answered and the
/// version the server saw.
async fn get(url: &str, tls: &ClientTls, http2_only: bool) -> Result<(Version, String), String> {
    let connector =
        rollgate_net::connector(HttpConnector::new(), tls).map_err(|e| e.to_string())?;
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(http2_only)
        .build(connector);
    let call = async {
        let resp = client
            .get(url.parse().map_err(|e| format!("{e}"))?)
            .await
            .map_err(|e| format!("{e:?}"))?;
        let v = resp.version();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok((v, String::from_utf8_lossy(&body).into_owned()))
    };
    tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .map_err(|_| "timed out".to_string())?
}

#[tokio::test]
async fn tls_listener_speaks_http2_by_alpn_and_http1_to_the_rest() {
    let dir = tempfile::tempdir().expect("tmp");
    let ca = Ca::new("test CA");
    let (cert_file, key_file) = write_pair(dir.path(), "server", &ca.issue(&["localhost"]));
    let tls = ListenerTls {
        cert_file,
        key_file,
        client_ca_file: None,
    };
    let (addr, _stop) = start(serving(Some(&tls))).await;
    let port = addr.rsplit(':').next().expect("port");
    let url = format!("https://localhost:{port}/");
    let trusting = ClientTls {
        ca_file: Some(ca.write(dir.path(), "ca.pem")),
        ..ClientTls::default()
    };
    // The connector offers h2 and http/1.1: the server picks h2.
    assert_eq!(
        get(&url, &trusting, false).await,
        Ok((Version::HTTP_2, "HTTP/2.0".into()))
    );
    // A client that offers only http/1.1 is served HTTP/1.1.
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    let h1 = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(trusting.config().expect("config"))
        .https_only()
        .enable_http1()
        .wrap_connector(http);
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build(h1);
    let resp = client.get(url.parse().expect("uri")).await.expect("h1");
    assert_eq!(resp.version(), Version::HTTP_11);
    // A client that does not trust the CA is refused at the handshake.
    let err = get(&url, &ClientTls::default(), false)
        .await
        .expect_err("untrusted");
    assert!(
        err.contains("UnknownIssuer") || err.contains("certificate"),
        "{err}"
    );
    // Plain HTTP to the TLS port gets no answer.
    assert!(
        get(&format!("http://{addr}/"), &trusting, false)
            .await
            .is_err()
    );
}

#[tokio::test]
async fn a_plain_listener_serves_http1_and_h2c_with_prior_knowledge() {
    let (addr, _stop) = start(serving(None)).await;
    let url = format!("http://{addr}/");
    let tls = ClientTls::default();
    assert_eq!(
        get(&url, &tls, false).await,
        Ok((Version::HTTP_11, "HTTP/1.1".into()))
    );
    assert_eq!(
        get(&url, &tls, true).await,
        Ok((Version::HTTP_2, "HTTP/2.0".into()))
    );
}

#[tokio::test]
async fn mtls_refuses_a_client_without_a_certificate_from_the_ca() {
    let dir = tempfile::tempdir().expect("tmp");
    let (server_ca, client_ca, other_ca) =
        (Ca::new("servers"), Ca::new("clients"), Ca::new("other"));
    let (cert_file, key_file) = write_pair(dir.path(), "server", &server_ca.issue(&["localhost"]));
    let tls = ListenerTls {
        cert_file,
        key_file,
        client_ca_file: Some(client_ca.write(dir.path(), "clients.pem")),
    };
    let (addr, _stop) = start(serving(Some(&tls))).await;
    let port = addr.rsplit(':').next().expect("port");
    let url = format!("https://localhost:{port}/");
    let ca_file = Some(server_ca.write(dir.path(), "servers.pem"));
    let anonymous = ClientTls {
        ca_file: ca_file.clone(),
        ..ClientTls::default()
    };
    assert!(get(&url, &anonymous, false).await.is_err());
    let (c, k) = write_pair(dir.path(), "stranger", &other_ca.issue(&["gateway"]));
    let stranger = ClientTls {
        ca_file: ca_file.clone(),
        cert_file: Some(c),
        key_file: Some(k),
    };
    assert!(get(&url, &stranger, false).await.is_err());
    let (c, k) = write_pair(dir.path(), "gateway", &client_ca.issue(&["gateway"]));
    let known = ClientTls {
        ca_file,
        cert_file: Some(c),
        key_file: Some(k),
    };
    assert_eq!(
        get(&url, &known, false).await.map(|(v, _)| v),
        Ok(Version::HTTP_2)
    );
    // Half a client certificate is a configuration error.
    let half = ClientTls {
        key_file: None,
        ..known
    };
    assert!(half.validate().is_err());
}

#[tokio::test]
async fn a_renewed_certificate_is_served_without_a_restart_and_a_broken_one_is_not() {
    let dir = tempfile::tempdir().expect("tmp");
    let (old_ca, new_ca) = (Ca::new("old"), Ca::new("new"));
    let (cert_file, key_file) = write_pair(dir.path(), "server", &old_ca.issue(&["localhost"]));
    let tls = ListenerTls {
        cert_file: cert_file.clone(),
        key_file: key_file.clone(),
        client_ca_file: None,
    };
    let serving = serving(Some(&tls));
    let handle = serving.tls.clone().expect("tls");
    let (addr, _stop) = start(serving).await;
    let port = addr.rsplit(':').next().expect("port");
    let url = format!("https://localhost:{port}/");
    let trusts_new = ClientTls {
        ca_file: Some(new_ca.write(dir.path(), "new.pem")),
        ..ClientTls::default()
    };
    assert!(get(&url, &trusts_new, false).await.is_err(), "old cert");
    // Renewed in place (as cert-manager or certbot would).
    write_pair(dir.path(), "server", &new_ca.issue(&["localhost"]));
    let mut served = false;
    for _ in 0..100 {
        if get(&url, &trusts_new, false).await.is_ok() {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(served, "the renewed certificate was not served within 10 s");
    // A key that does not fit the certificate (a half-finished renewal)
    // is refused, and the certificate in use stays.
    let other = new_ca.issue(&["localhost"]);
    std::fs::write(&key_file, other.key).expect("write");
    let err = handle.cert.reload_if_changed().expect_err("mismatched key");
    assert!(err.to_string().contains("server.key"), "{err}");
    std::fs::write(&cert_file, "not a certificate").expect("write");
    assert!(handle.cert.reload_if_changed().is_err());
    assert!(get(&url, &trusts_new, false).await.is_ok());
}

#[tokio::test]
async fn a_client_that_says_nothing_is_closed_after_the_header_timeout() {
    let dir = tempfile::tempdir().expect("tmp");
    let ca = Ca::new("ca");
    let (cert_file, key_file) = write_pair(dir.path(), "server", &ca.issue(&["localhost"]));
    let tls = ListenerTls {
        cert_file,
        key_file,
        client_ca_file: None,
    };
    for serving in [serving(None), serving(Some(&tls))] {
        let (addr, _stop) = start(serving).await;
        let mut silent = tokio::net::TcpStream::connect(&addr)
            .await
            .expect("connect");
        let mut buf = [0u8; 16];
        // Closed by the server (0 bytes or a reset), not left open.
        let read = tokio::time::timeout(Duration::from_secs(10), silent.read(&mut buf))
            .await
            .expect("the silent connection was still open after 10 s");
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    }
}

#[test]
fn bad_files_are_errors_that_name_the_file() {
    let dir = tempfile::tempdir().expect("tmp");
    let missing = ListenerTls {
        cert_file: dir.path().join("absent.crt"),
        key_file: dir.path().join("absent.key"),
        client_ca_file: None,
    };
    assert!(
        missing
            .server()
            .expect_err("absent")
            .to_string()
            .contains("absent.crt")
    );
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "hello").expect("write");
    let ca = ClientTls {
        ca_file: Some(junk),
        ..ClientTls::default()
    };
    assert!(
        ca.validate()
            .expect_err("junk")
            .to_string()
            .contains("junk.pem")
    );
}
