//! Replays every example in `docs/api.md`, in order, against the API's
//! router (no socket), so the documentation cannot drift from the code.

use crate::common;
use std::sync::Arc;

use axum::body::Body;
use http::Request;
use rollgate_controller::router;
use rollgate_core::Timestamp;
use rollgate_store::{SqlStore, Store};
use serde_json::Value;

#[derive(Debug)]
struct Example {
    method: String,
    path: String,
    status: u16,
    request: Option<Value>,
    response: Option<Value>,
    line: usize,
}

/// Parses "`METHOD PATH` → `STATUS`" headers and the `json request` /
/// `json response` blocks that follow them.
fn examples(doc: &str) -> Vec<Example> {
    let mut out: Vec<Example> = Vec::new();
    let mut lines = doc.lines().enumerate();
    while let Some((i, line)) = lines.next() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix('`')
            && let Some((call, tail)) = rest.split_once("` → `")
            && let Some((method, path)) = call.split_once(' ')
        {
            let status: String = tail.chars().take_while(char::is_ascii_digit).collect();
            out.push(Example {
                method: method.to_string(),
                path: path.to_string(),
                status: status.parse().expect("a status"),
                request: None,
                response: None,
                line: i + 1,
            });
        } else if let Some(kind) = t.strip_prefix("```json ") {
            let mut text = String::new();
            for (_, l) in lines.by_ref() {
                if l.trim() == "```" {
                    break;
                }
                text.push_str(l);
                text.push('\n');
            }
            let v: Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("line {}: bad JSON: {e}", i + 1));
            let ex = out.last_mut().expect("a block belongs to an example");
            match kind {
                "request" => ex.request = Some(v),
                "response" => ex.response = Some(v),
                other => panic!("line {}: unknown block {other}", i + 1),
            }
        }
    }
    out
}

/// Every documented field equals the actual one; "*" matches anything.
fn subset(doc: &Value, actual: &Value, at: &str) -> Result<(), String> {
    match (doc, actual) {
        (Value::String(s), _) if s == "*" => Ok(()),
        (Value::Object(d), Value::Object(a)) => d.iter().try_for_each(|(k, dv)| {
            let av = a.get(k).ok_or_else(|| format!("{at}.{k}: missing"))?;
            subset(dv, av, &format!("{at}.{k}"))
        }),
        (Value::Array(d), Value::Array(a)) => {
            if d.len() != a.len() {
                return Err(format!(
                    "{at}: {} items documented, {} returned",
                    d.len(),
                    a.len()
                ));
            }
            d.iter()
                .zip(a)
                .enumerate()
                .try_for_each(|(i, (dv, av))| subset(dv, av, &format!("{at}[{i}]")))
        }
        (d, a) if d == a => Ok(()),
        (d, a) => Err(format!("{at}: documented {d}, returned {a}")),
    }
}

#[tokio::test]
async fn every_documented_example_holds() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/api.md"))
        .expect("docs/api.md");
    let examples = examples(&doc);
    assert!(
        examples.len() >= 20,
        "only {} examples parsed",
        examples.len()
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let fixed = Timestamp(1_767_225_600_000);
    let store = SqlStore::open_dir(dir.path())
        .expect("store")
        .with_clock(move || fixed);
    let state = common::api_state(Arc::new(store), fixed);
    let app = router(state);
    for ex in examples {
        let mut req = Request::builder().method(ex.method.as_str()).uri(&ex.path);
        // Writes carry JSON (`{}` when the example shows no body), as the
        // CLI sends them.
        let body = match (&ex.request, ex.method.as_str()) {
            (Some(v), _) => {
                req = req.header("content-type", "application/json");
                Body::from(v.to_string())
            }
            (None, "POST" | "PUT") => {
                req = req.header("content-type", "application/json");
                Body::from("{}")
            }
            (None, _) => Body::empty(),
        };
        let (status, actual) = common::send(&app, req.body(body).expect("request")).await;
        assert_eq!(
            status, ex.status,
            "docs/api.md line {}: {} {}: {actual}",
            ex.line, ex.method, ex.path
        );
        if let Some(expected) = &ex.response
            && let Err(e) = subset(expected, &actual, "$")
        {
            panic!(
                "docs/api.md line {}: {} {}: {e}\nactual: {actual}",
                ex.line, ex.method, ex.path
            );
        }
    }
}

/// A web page cannot change state: a cross-site form (`text/plain`, a
/// foreign `Origin`), a DNS-rebinding page (its own name in `Host`) and an
/// empty-body post are refused; the CLI's requests pass.
#[tokio::test]
async fn writes_from_web_pages_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SqlStore::open_dir(dir.path()).expect("store");
    let state = common::api_state(Arc::new(store), Timestamp(0));
    let app = router(state);
    let send = |host: &str, origin: Option<&str>, content_type: Option<&str>, body: &str| {
        let mut req = Request::builder()
            .method("POST")
            .uri("/api/v1/models")
            .header("host", host);
        if let Some(o) = origin {
            req = req.header("origin", o);
        }
        if let Some(t) = content_type {
            req = req.header("content-type", t);
        }
        let req = req.body(Body::from(body.to_string())).expect("request");
        let app = app.clone();
        async move {
            let (status, v) = common::send(&app, req).await;
            (
                status,
                v["error"]["code"].as_str().unwrap_or("").to_string(),
            )
        }
    };
    let model = r#"{"name": "m"}"#;
    let cases = [
        // A cross-site form post.
        (
            "127.0.0.1:7070",
            Some("http://evil.example"),
            Some("text/plain"),
            model,
            (403, "forbidden_origin"),
        ),
        // The same with a JSON type (a preflight would have stopped it).
        (
            "127.0.0.1:7070",
            Some("http://evil.example"),
            Some("application/json"),
            model,
            (403, "forbidden_origin"),
        ),
        // DNS rebinding: the page's own name in Host.
        (
            "evil.example:7070",
            None,
            Some("application/json"),
            model,
            (403, "forbidden_host"),
        ),
        // A form post with no Origin, and an empty-body post.
        (
            "127.0.0.1:7070",
            None,
            Some("application/x-www-form-urlencoded"),
            "name=m",
            (415, "unsupported_media_type"),
        ),
        (
            "localhost:7070",
            None,
            None,
            "",
            (415, "unsupported_media_type"),
        ),
        // The CLI (no Origin, JSON) and a page on the API's own origin.
        (
            "localhost:7070",
            None,
            Some("application/json"),
            model,
            (201, ""),
        ),
        (
            "127.0.0.1:7070",
            Some("http://127.0.0.1:7070"),
            Some("application/json; charset=utf-8"),
            r#"{"name": "n"}"#,
            (201, ""),
        ),
    ];
    for (host, origin, ct, body, (status, code)) in cases {
        let got = send(host, origin, ct, body).await;
        assert_eq!(
            got,
            (status, code.to_string()),
            "Host {host} Origin {origin:?} type {ct:?}"
        );
    }
}

/// Named tokens with roles: the shared token (an admin) makes them; a
/// viewer reads but cannot pause; an operator pauses but cannot promote; the
/// audit actor is the token's name, a claimed name only "on behalf of"; a
/// revoked token is refused on the very next request.
#[tokio::test]
async fn roles_limit_tokens_the_actor_is_the_token_and_revocation_is_immediate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SqlStore::open_dir(dir.path()).expect("store");
    common::model_in_rollout(&store);
    let mut state = common::api_state(Arc::new(store), Timestamp(0));
    state.token = Some("shared-secret".into());
    let app = router(state);

    assert_eq!(
        common::call(&app, ("GET", "/api/v1/models"), None, None, None)
            .await
            .0,
        401
    );
    assert_eq!(
        common::call(
            &app,
            ("GET", "/api/v1/models"),
            Some("rgt_guess"),
            None,
            None
        )
        .await
        .0,
        401
    );
    let mut secrets = std::collections::BTreeMap::new();
    for (name, role) in [("vera", "viewer"), ("otto", "operator")] {
        let (status, v) = common::call(
            &app,
            ("POST", "/api/v1/tokens"),
            Some("shared-secret"),
            None,
            Some(serde_json::json!({ "name": name, "role": role })),
        )
        .await;
        assert_eq!(status, 201, "{v}");
        assert_eq!(v["token"]["created_by"], "token");
        secrets.insert(name, v["secret"].as_str().expect("secret").to_string());
    }
    let (vera, otto) = (secrets["vera"].as_str(), secrets["otto"].as_str());
    let pause = ("POST", "/api/v1/rollouts/1/pause");
    let (status, v) =
        common::call(&app, ("GET", "/api/v1/rollouts/1"), Some(vera), None, None).await;
    assert_eq!(status, 200, "{v}");
    let (status, v) =
        common::call(&app, pause, Some(vera), None, Some(serde_json::json!({}))).await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (403, Some("forbidden_role"))
    );
    // The operator may not make tokens or promote, but may pause, and is
    // the actor whatever name it claims.
    let (status, _) = common::call(
        &app,
        ("POST", "/api/v1/tokens"),
        Some(otto),
        None,
        Some(serde_json::json!({ "name": "x", "role": "admin" })),
    )
    .await;
    assert_eq!(status, 403);
    let (status, _) = common::call(
        &app,
        ("POST", "/api/v1/rollouts/1/promote"),
        Some(otto),
        None,
        Some(serde_json::json!({ "reason": "trust me" })),
    )
    .await;
    assert_eq!(status, 403);
    // Approving is an operator's: a viewer may not; with nothing waiting
    // for approval it is a conflict, not a silent no-op.
    let approve = ("POST", "/api/v1/rollouts/1/approve");
    let why = Some(serde_json::json!({ "reason": "dashboards look fine" }));
    let (status, _) = common::call(&app, approve, Some(vera), None, why.clone()).await;
    assert_eq!(status, 403);
    let (status, v) = common::call(&app, approve, Some(otto), None, why).await;
    assert_eq!(
        (status, v["error"]["message"].as_str()),
        (409, Some("the rollout is not waiting for an approval")),
        "{v}"
    );
    let (status, v) = common::call(
        &app,
        pause,
        Some(otto),
        Some("controller"),
        Some(serde_json::json!({})),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let (_, audit) = common::call(
        &app,
        ("GET", "/api/v1/audit?rollout=1"),
        Some(vera),
        None,
        None,
    )
    .await;
    let paused = audit
        .as_array()
        .and_then(|a| a.iter().find(|r| r["kind"] == "paused"))
        .expect("paused record");
    assert_eq!(paused["actor"], "otto (on behalf of controller)");
    // Revoked: refused on the next request, no restart.
    let (status, _) = common::call(
        &app,
        ("DELETE", "/api/v1/tokens/otto"),
        Some("shared-secret"),
        None,
        None,
    )
    .await;
    assert_eq!(status, 200);
    let resume = ("POST", "/api/v1/rollouts/1/resume");
    let (status, _) =
        common::call(&app, resume, Some(otto), None, Some(serde_json::json!({}))).await;
    assert_eq!(status, 401);
    // The token list shows no secret and no hash.
    let (_, list) = common::call(&app, ("GET", "/api/v1/tokens"), Some(vera), None, None).await;
    let text = list.to_string();
    assert!(!text.contains(otto) && !text.contains("hash"), "{text}");
}

/// Every error the router itself produces (a bad path or query, an unknown
/// endpoint, a wrong method, a wrong or oversized body) answers in the JSON
/// envelope, with a code that says which.
#[tokio::test]
async fn router_errors_answer_in_the_json_envelope() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SqlStore::open_dir(dir.path()).expect("store");
    let app = router(common::api_state(Arc::new(store), Timestamp(0)));
    let big = format!(r#"{{"name": "m", "pad": "{}"}}"#, "x".repeat(3 << 20));
    /// Method, URI, content type, body; the status and code expected.
    type Case<'a> = (&'a str, &'a str, Option<&'a str>, String, u16, &'a str);
    let cases: [Case; 6] = [
        (
            "GET",
            "/api/v1/rollouts/abc",
            None,
            String::new(),
            400,
            "bad_request",
        ),
        (
            "GET",
            "/api/v1/audit?limit=lots",
            None,
            String::new(),
            400,
            "bad_request",
        ),
        (
            "GET",
            "/api/v1/nothing-here",
            None,
            String::new(),
            404,
            "not_found",
        ),
        (
            "DELETE",
            "/api/v1/audit",
            None,
            String::new(),
            405,
            "method_not_allowed",
        ),
        (
            "POST",
            "/api/v1/models",
            Some("text/plain"),
            r#"{"name": "m"}"#.into(),
            415,
            "unsupported_media_type",
        ),
        (
            "POST",
            "/api/v1/models",
            Some("application/json"),
            big,
            413,
            "payload_too_large",
        ),
    ];
    for (method, uri, content_type, body, status, code) in cases {
        let mut req = Request::builder()
            .method(method)
            .uri(uri)
            .header("host", "127.0.0.1:7070");
        if let Some(t) = content_type {
            req = req.header("content-type", t);
        }
        let (s, v) = common::send(&app, req.body(Body::from(body)).expect("request")).await;
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (status, Some(code)),
            "{method} {uri}: {v}"
        );
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{method} {uri}: {v}"
        );
    }
}

/// Each active rollout shows its phase and weight by model, and the
/// series go when the rollout ends.
#[tokio::test]
async fn active_rollouts_show_phase_and_weight_until_they_end() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(SqlStore::open_dir(dir.path()).expect("store"));
    common::model_in_rollout(store.as_ref());
    let state = common::api_state(store.clone(), Timestamp(0));
    let metrics = &state.ctx.metrics;
    metrics.set_active(&store.rollouts(true).expect("rollouts"));
    let text = metrics.expose(None).0;
    assert!(
        text.contains(r#"rollgate_rollout_phase{model="m",phase="PENDING"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"rollgate_rollout_weight_percent{model="m"} 0"#),
        "{text}"
    );
    // Served as Prometheus text unless OpenMetrics is asked for; promtool
    // finds nothing to complain about.
    let app = router(state.clone());
    let scrape = |accept: Option<&'static str>| {
        let mut req = Request::builder()
            .uri("/metrics")
            .header("host", "127.0.0.1:7070");
        if let Some(a) = accept {
            req = req.header("accept", a);
        }
        let app = app.clone();
        async move {
            let resp = tower::ServiceExt::oneshot(app, req.body(Body::empty()).expect("request"))
                .await
                .expect("infallible");
            let kind = resp.headers()["content-type"]
                .to_str()
                .unwrap_or("")
                .to_string();
            let body = http_body_util::BodyExt::collect(resp.into_body())
                .await
                .expect("body")
                .to_bytes();
            (kind, String::from_utf8_lossy(&body).into_owned())
        }
    };
    let (kind, plain) = scrape(None).await;
    assert!(kind.starts_with("text/plain; version=0.0.4"), "{kind}");
    assert!(
        plain.contains("# TYPE rollgate_rollbacks_total counter"),
        "{plain}"
    );
    common::promtool_accepts(&plain);
    let (kind, om) = scrape(Some("application/openmetrics-text;version=1.0.0")).await;
    assert!(kind.starts_with("application/openmetrics-text"), "{kind}");
    assert!(om.ends_with("# EOF\n"), "{om}");
    metrics.set_active(&[]);
    let text = metrics.expose(None).0;
    assert!(!text.contains(r#"model="m""#), "{text}");
}

/// The rollout list is summaries, newest first, a page at a time: 100
/// rollouts fit in well under 50 KB.
#[tokio::test]
async fn the_rollout_list_is_summaries_a_page_at_a_time() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(SqlStore::open_dir(dir.path()).expect("store"));
    for m in 0..100 {
        let name = format!("m{m}");
        store
            .create_model(&name, &rollgate_store::ModelSpec::default(), "t")
            .expect("model");
        let revs: Vec<String> = (0..2)
            .map(|n| {
                let spec = rollgate_store::RevisionSpec {
                    upstream: format!("http://127.0.0.1:{}", 9000 + n),
                    ..Default::default()
                };
                store.register_revision(&name, &spec, "t").expect("rev").id
            })
            .collect();
        store
            .set_champion(&name, &revs[0], "t", "first")
            .expect("champion");
        store
            .create_rollout(&name, &revs[1], &rollgate_core::Plan::default(), "t")
            .expect("rollout");
    }
    let app = router(common::api_state(store.clone(), Timestamp(0)));
    let get = |uri: &str| {
        let req = Request::builder()
            .uri(uri)
            .header("host", "127.0.0.1:7070")
            .body(Body::empty())
            .expect("request");
        let app = app.clone();
        async move { common::send(&app, req).await }
    };
    let (s, all) = get("/api/v1/rollouts").await;
    assert_eq!(s, 200);
    let size = all.to_string().len();
    assert!(size < 50_000, "{size} bytes for 100 rollouts");
    let ids: Vec<i64> = all
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|r| r["id"].as_i64())
        .collect();
    assert_eq!(ids.len(), 100);
    assert!(ids.windows(2).all(|w| w[0] > w[1]), "newest first");
    assert_eq!(all[0]["phase"]["phase"], "pending");
    assert!(all[0].get("state").is_none(), "no evidence in a list");
    let (_, page) = get("/api/v1/rollouts?limit=30").await;
    let first: Vec<i64> = page
        .as_array()
        .expect("page")
        .iter()
        .filter_map(|r| r["id"].as_i64())
        .collect();
    assert_eq!(first, ids[..30]);
    let (_, next) = get(&format!("/api/v1/rollouts?limit=30&before={}", first[29])).await;
    let second: Vec<i64> = next
        .as_array()
        .expect("page")
        .iter()
        .filter_map(|r| r["id"].as_i64())
        .collect();
    assert_eq!(second, ids[30..60]);
}

/// `docs/openapi.json` is the document the API serves, byte for byte, so
/// it can be read (and fed to client generators) without a running API.
/// After changing the API: `ROLLGATE_BLESS=1 cargo test -p
/// rollgate-controller --test suite api_docs` rewrites it.
#[test]
fn the_committed_openapi_document_is_the_served_one() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/openapi.json");
    let served = serde_json::to_string_pretty(&rollgate_controller::api::openapi())
        .expect("the document serialises")
        + "\n";
    if std::env::var_os("ROLLGATE_BLESS").is_some() {
        std::fs::write(path, &served).expect("write docs/openapi.json");
    }
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        committed == served,
        "docs/openapi.json is stale: run ROLLGATE_BLESS=1 cargo test -p rollgate-controller --test suite api_docs"
    );
}
