//! The admin API is not the host: against a real controller process, an
//! admin (a named admin token) who posts a model spec naming a command, a
//! file or a token file directly is refused with 422 saying where to
//! declare it, and nothing runs, nothing is written, no secret leaves. A
//! credential goes only to the URL it was declared for. Specs stored
//! before names keep working only where the config declares an identical
//! entry; otherwise the model is isolated. Reads by a foreign `Host` (a
//! DNS-rebinding page) and HTTP/2 writes under a foreign `:authority` are
//! refused; a client trickling its body is cut off.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use rollgate_store::{DataPlaneRef, ModelSpec, PrometheusEvidence, RevisionSpec, SqlStore, Store};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::common::*;

/// What a listener was sent: `(path and query, Authorization header)`.
type Seen = Arc<Mutex<Vec<(String, Option<String>)>>>;

/// A listener on loopback that records every request and answers like a
/// Prometheus with no samples (an empty range vector).
async fn recorder() -> (String, Seen) {
    let seen: Seen = Arc::default();
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let log = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let log = Arc::clone(&log);
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| {
                    let log = Arc::clone(&log);
                    async move {
                        let auth = req
                            .headers()
                            .get("authorization")
                            .and_then(|v| v.to_str().ok())
                            .map(str::to_string);
                        let path = req
                            .uri()
                            .path_and_query()
                            .map_or(String::new(), |p| p.to_string());
                        log.lock().expect("log").push((path, auth));
                        let body =
                            r#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#;
                        Ok::<_, std::convert::Infallible>(Response::new(Full::new(
                            Bytes::from_static(body.as_bytes()),
                        )))
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

/// `dir` as a string, for paths in configs and specs.
fn at(dir: &Path, name: &str) -> String {
    dir.join(name).to_string_lossy().into_owned()
}

/// The controller's config: `edge`, an nginx data plane whose reload
/// command leaves a mark per model, and `prom`, a token for `prom_url`.
fn config(dir: &Path, confirm: &str, prom_url: &str) -> String {
    let token = write(dir, "prom.token", "s3cret-prom-token\n");
    let edge = json!({
        "kind": "nginx",
        "include_file": at(dir, "edge-$model.conf"),
        "reload_command": ["touch", at(dir, "reloaded-$model")],
        "confirm_url": format!("{confirm}/routing/$model"),
    });
    let cfg = format!(
        "{CONTROLLER_TOML}{}{}",
        toml_table("data_planes.edge", &edge),
        toml_table(
            "credentials.prom",
            &json!({ "file": token, "url": prom_url })
        ),
    );
    write(dir, "controller.toml", &cfg)
}

/// An admin token made by the loopback `local` admin: its secret.
async fn admin_token(c: &HttpClient, ctl: &Proc) -> String {
    let (s, v) = api(
        c,
        ctl,
        "POST",
        "/api/v1/tokens",
        Some(json!({ "name": "alice", "role": "admin" })),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    v["secret"].as_str().expect("secret").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_cannot_make_the_host_run_write_or_send_anything_undeclared() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let (prom, prom_seen) = recorder().await;
    let (elsewhere, elsewhere_seen) = recorder().await;
    let cfg = config(d, &prom, &prom);
    let ctl = start_controller_with(d, &cfg, &[]);
    let c = client();
    let admin = admin_token(&c, &ctl).await;
    let url = |p: &str| format!("http://{}{p}", ctl.addr());
    let store_file = at(d, "data/rollgate.db");
    let audit_key = at(d, "data/audit.key");
    let before = std::fs::read(&store_file).expect("the store exists");
    let evidence = |extra: Value| {
        let mut p = json!({ "url": prom });
        for (k, v) in extra.as_object().into_iter().flatten() {
            p[k] = v.clone();
        }
        p
    };
    // Each host-touching field, written directly: (what, spec, must name).
    let attempts = [
        (
            "an nginx reload command and include file",
            json!({ "prometheus": evidence(json!({})), "data_plane": {
                "kind": "nginx", "include_file": at(d, "pwned.conf"),
                "reload_command": ["/bin/sh", "-c", format!("id > {}", at(d, "ran"))],
                "confirm_url": format!("{elsewhere}/v") } }),
            "[data_planes.NAME]",
        ),
        (
            "Envoy files over the store",
            json!({ "prometheus": evidence(json!({})), "data_plane": {
                "kind": "envoy", "routes_file": store_file,
                "clusters_file": at(d, "pwned-cds.json"), "admin_url": elsewhere } }),
            "[data_planes.NAME]",
        ),
        (
            "a webhook's token file",
            json!({ "prometheus": evidence(json!({})), "data_plane": {
                "kind": "webhook", "url": elsewhere, "bearer_token_file": audit_key } }),
            "[data_planes.NAME]",
        ),
        (
            "Prometheus's token file",
            json!({ "prometheus": {
                "url": elsewhere, "bearer_token_file": audit_key } }),
            "[credentials.NAME]",
        ),
        (
            "a declared credential sent elsewhere",
            json!({ "prometheus": { "url": elsewhere, "credential": "prom" } }),
            "not for",
        ),
        (
            "an undeclared credential",
            json!({ "prometheus": evidence(json!({ "credential": "vault" })) }),
            "[credentials.vault]",
        ),
        (
            "an undeclared data plane",
            json!({ "prometheus": evidence(json!({})), "data_plane": "mesh" }),
            "[data_planes.mesh]",
        ),
    ];
    // A model to update, routed by rollgate's gateway.
    let (s, v, _) = request(
        &c,
        "POST",
        &url("/api/v1/models"),
        Some(json!({ "name": "m", "spec": {} })),
        Some(&admin),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    for (what, spec, names) in attempts {
        for (method, path, body) in [
            (
                "POST",
                "/api/v1/models",
                json!({ "name": "evil", "spec": spec }),
            ),
            ("PUT", "/api/v1/models/m", spec.clone()),
        ] {
            let (s, v, _) = request(&c, method, &url(path), Some(body), Some(&admin)).await;
            assert_eq!(
                (s, v["error"]["code"].as_str()),
                (422, Some("invalid")),
                "{what} ({method}): {v}"
            );
            let message = v["error"]["message"].as_str().unwrap_or("");
            assert!(message.contains(names), "{what}: {message}");
        }
    }
    // Nothing ran, nothing was written, nothing was sent.
    tokio::time::sleep(Duration::from_millis(600)).await;
    for absent in ["ran", "pwned.conf", "pwned-cds.json"] {
        assert!(!d.join(absent).exists(), "{absent} was written");
    }
    let (s, v, _) = request(&c, "GET", &url("/api/v1/models"), None, Some(&admin)).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v.as_array().map(Vec::len), Some(1), "only m: {v}");
    assert!(
        std::fs::read(&store_file).expect("store").len() >= before.len(),
        "the store was not overwritten"
    );
    assert!(
        elsewhere_seen.lock().expect("seen").is_empty(),
        "nothing reached the undeclared URL"
    );

    // Named as declared: the token goes to its URL, and only there.
    let champion = model_server(Model::new(false)).await;
    let candidate = model_server(Model::new(false)).await;
    let spec = json!({ "prometheus": evidence(json!({
        "credential": "prom", "scrape_interval_ms": 100, "horizon_ms": 100 })) });
    let (s, v, _) = request(
        &c,
        "PUT",
        &url("/api/v1/models/m"),
        Some(spec),
        Some(&admin),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let champion = register(&c, &ctl, &champion).await;
    let candidate = register(&c, &ctl, &candidate).await;
    let (s, v) = api(
        &c,
        &ctl,
        "PUT",
        "/api/v1/models/m/champion",
        Some(json!({ "revision": champion, "reason": "first" })),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let mut plan = plan();
    plan["shadow"] = json!({ "enabled": false });
    let id = start_rollout_with(&c, &ctl, &candidate, plan).await;
    let started = Instant::now();
    let sent = loop {
        let seen = prom_seen.lock().expect("seen").clone();
        if let Some(sent) = seen.iter().find(|(p, _)| p.starts_with("/api/v1/query")) {
            break sent.clone();
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "Prometheus was never asked"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(sent.1.as_deref(), Some("Bearer s3cret-prom-token"));
    let (s, v) = api(
        &c,
        &ctl,
        "POST",
        &format!("/api/v1/rollouts/{id}/abort"),
        Some(json!({ "reason": "done" })),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert!(elsewhere_seen.lock().expect("seen").is_empty());
}

/// Specs written by an earlier version with the definitions inline: the
/// one identical to a declared data plane keeps working (its adapter
/// runs); the other is isolated (its command never runs, a rollout on it
/// is refused), and a stored token file that no credential declares is
/// never read or sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn specs_stored_with_host_fields_run_only_as_declared() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let (prom, _) = recorder().await;
    let (elsewhere, elsewhere_seen) = recorder().await;
    let upstream = model_server(Model::new(false)).await;
    let candidate_upstream = model_server(Model::new(false)).await;
    let named = ModelSpec {
        prometheus: Some(PrometheusEvidence {
            url: prom.clone(),
            ..PrometheusEvidence::default()
        }),
        data_plane: Some(DataPlaneRef::Named("edge".into())),
        ..ModelSpec::default()
    };
    let revision = |u: &str| RevisionSpec {
        upstream: u.to_string(),
        ..RevisionSpec::default()
    };
    let mut candidates = Vec::new();
    {
        let store = SqlStore::open_dir(&d.join("data")).expect("store");
        for model in ["kept", "cut", "cut-prom"] {
            store.create_model(model, &named, "test").expect("model");
            let champion = store
                .register_revision(model, &revision(&upstream), "test")
                .expect("revision");
            store
                .set_champion(model, &champion.id, "test", "first")
                .expect("champion");
            let candidate = store
                .register_revision(model, &revision(&candidate_upstream), "test")
                .expect("revision");
            candidates.push(candidate.id);
        }
    }
    // What an earlier version stored: definitions, not names.
    let inline = |model: &str, include: String, command: Vec<String>| {
        json!({ "prometheus": { "url": prom }, "data_plane": {
            "kind": "nginx", "include_file": include, "reload_command": command,
            "confirm_url": format!("{prom}/routing/{model}") } })
    };
    let kept = inline(
        "kept",
        at(d, "edge-kept.conf"),
        vec!["touch".into(), at(d, "reloaded-kept")],
    );
    let cut = inline(
        "cut",
        at(d, "cut.conf"),
        vec!["touch".into(), at(d, "pwned")],
    );
    let cut_prom = json!({ "prometheus": { "url": elsewhere,
        "bearer_token_file": at(d, "data/audit.key"), "horizon_ms": 100,
        "scrape_interval_ms": 100 } });
    {
        let db = rusqlite::Connection::open(d.join("data/rollgate.db")).expect("sqlite");
        for (model, spec) in [("kept", &kept), ("cut", &cut), ("cut-prom", &cut_prom)] {
            let n = db
                .execute(
                    "UPDATE models SET spec = ?1 WHERE name = ?2",
                    (spec.to_string(), model),
                )
                .expect("update");
            assert_eq!(n, 1);
        }
    }
    let cfg = config(d, &prom, &prom);
    let ctl = start_controller_with(d, &cfg, &[]);
    let c = client();

    // The declared one is driven: its adapter writes and reloads.
    let started = Instant::now();
    while !d.join("reloaded-kept").exists() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the declared data plane never ran"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(d.join("edge-kept.conf").exists());
    // The isolated one: refused, never run.
    let (s, v) = api(
        &c,
        &ctl,
        "POST",
        "/api/v1/rollouts",
        Some(json!({ "model": "cut", "revision": candidates[1] })),
    )
    .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (409, Some("model_isolated")),
        "{v}"
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("isolated")),
        "{v}"
    );
    // A rollout on the model whose token file is undeclared runs on no
    // evidence: Prometheus is never asked, the key never sent.
    let mut plan = plan();
    plan["shadow"] = json!({ "enabled": false });
    let (s, v) = api(
        &c,
        &ctl,
        "POST",
        "/api/v1/rollouts",
        Some(json!({ "model": "cut-prom", "revision": candidates[2], "plan": plan })),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    let id = v["id"].as_i64().expect("id");
    let r = wait_for(&c, &ctl, id, Duration::from_secs(30), |r| {
        r["state"]["evaluations"].as_u64().unwrap_or(0) >= 3 || finished(r)
    })
    .await;
    assert_ne!(phase(&r), "promoted", "{r}");
    for absent in ["pwned", "cut.conf", "reloaded-cut"] {
        assert!(!d.join(absent).exists(), "{absent} was written");
    }
    assert!(
        elsewhere_seen.lock().expect("seen").is_empty(),
        "the undeclared token file was sent"
    );
}

/// The tokenless loopback API answers only to its own names: a read under
/// a foreign `Host` (a DNS-rebinding page) is refused, and so is an HTTP/2
/// write whose `:authority` is foreign; the same under a loopback name is
/// served. A client that trickles its body is cut off within the body
/// timeout while an operator's request is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_loopback_api_answers_only_to_its_own_names_and_bounds_bodies() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ctl = start_controller(dir.path(), &[]);
    let addr = ctl.addr().to_string();
    let port = addr.rsplit(':').next().expect("port").to_string();
    let raw = |host: String| {
        let addr = addr.clone();
        async move {
            let mut s = tokio::net::TcpStream::connect(&addr)
                .await
                .expect("connect");
            let req =
                format!("GET /api/v1/audit HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
            s.write_all(req.as_bytes()).await.expect("write");
            let mut out = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
            String::from_utf8_lossy(&out).into_owned()
        }
    };
    let foreign = raw(format!("rebind.example:{port}")).await;
    assert!(foreign.starts_with("HTTP/1.1 403"), "{foreign}");
    assert!(foreign.contains("forbidden_host"), "{foreign}");
    for name in [format!("localhost:{port}"), addr.clone()] {
        let home = raw(name).await;
        assert!(home.starts_with("HTTP/1.1 200"), "{home}");
    }

    // hyper's own refusals (a head too large, a malformed one) come in the
    // API's JSON envelope too.
    let head = |extra: String| {
        let addr = addr.clone();
        async move {
            let mut s = tokio::net::TcpStream::connect(&addr)
                .await
                .expect("connect");
            let req = format!("GET /api/v1/models HTTP/1.1\r\nHost: {addr}\r\n{extra}\r\n\r\n");
            let _ = s.write_all(req.as_bytes()).await;
            let mut out = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
            String::from_utf8_lossy(&out).into_owned()
        }
    };
    let big = head(format!("Authorization: Bearer {}", "a".repeat(2_000_000))).await;
    assert!(big.starts_with("HTTP/1.1 431 "), "{big}");
    assert!(
        big.contains(r#"{"error":{"code":"header_too_large""#),
        "{big}"
    );
    let bad = head("Not A Header".into()).await;
    assert!(bad.starts_with("HTTP/1.1 400 "), "{bad}");
    assert!(bad.contains(r#"{"error":{"code":"bad_request""#), "{bad}");

    // HTTP/2 with prior knowledge: no Host, only :authority.
    let h2 = |authority: String| {
        let addr = addr.clone();
        async move {
            let stream = tokio::net::TcpStream::connect(&addr)
                .await
                .expect("connect");
            let (mut send, conn) = hyper::client::conn::http2::handshake(
                hyper_util::rt::TokioExecutor::new(),
                TokioIo::new(stream),
            )
            .await
            .expect("h2 handshake");
            tokio::spawn(conn);
            let req = Request::builder()
                .method("POST")
                .uri(format!("http://{authority}/api/v1/models"))
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(r#"{"name":"h2","spec":{}}"#)))
                .expect("request");
            let resp = send.send_request(req).await.expect("answered");
            let status = resp.status().as_u16();
            let body = resp.into_body().collect().await.expect("body").to_bytes();
            (status, String::from_utf8_lossy(&body).into_owned())
        }
    };
    let (s, body) = h2(format!("rebind.example:{port}")).await;
    assert_eq!(s, 403, "{body}");
    assert!(body.contains("forbidden_host"), "{body}");
    let (s, body) = h2(addr.clone()).await;
    assert_eq!(s, 201, "{body}");

    // Slow bodies: each sends headers and then one byte of a long body.
    let mut slow = Vec::new();
    for _ in 0..1_000 {
        let mut s = tokio::net::TcpStream::connect(&addr)
            .await
            .expect("connect");
        let req = format!(
            "POST /api/v1/models HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{{"
        );
        s.write_all(req.as_bytes()).await.expect("write");
        slow.push(s);
    }
    let c = client();
    let (s, v) = api(&c, &ctl, "GET", "/api/v1/models", None).await;
    assert_eq!(s, 200, "an operator is served meanwhile: {v}");
    // Each is answered 408 and closed within the body timeout (10 s),
    // bounded here at 30 s.
    let readers: Vec<_> = slow
        .into_iter()
        .map(|mut s| {
            tokio::spawn(async move {
                let mut out = Vec::new();
                let read =
                    tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut out)).await;
                read.is_ok() && String::from_utf8_lossy(&out).starts_with("HTTP/1.1 408")
            })
        })
        .collect();
    for r in readers {
        assert!(
            r.await.expect("reader"),
            "every slow body is cut off with 408"
        );
    }
}
