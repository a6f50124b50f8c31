//! Replays every example in `docs/api.md`, in order, against the API's
//! router (no socket), so the documentation cannot drift from the code.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::Request;
use http_body_util::BodyExt;
use rollgate_controller::{ApiState, Context, ControllerMetrics, HttpClient, router};
use rollgate_core::Timestamp;
use rollgate_store::SqliteStore;
use serde_json::Value;
use tower::ServiceExt;

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
    let store = SqliteStore::open_dir(dir.path())
        .expect("store")
        .with_clock(move || fixed);
    let state = api_state(store, fixed);
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
        let resp = app
            .clone()
            .oneshot(req.body(body).expect("request"))
            .await
            .expect("infallible");
        let status = resp.status().as_u16();
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        let actual: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
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

/// The API over `store`, at a fixed clock, answering as `127.0.0.1:7070`.
fn api_state(store: SqliteStore, now: Timestamp) -> ApiState {
    ApiState {
        ctx: Context {
            store: Arc::new(store),
            http: HttpClient::new(Duration::from_secs(1)),
            gateway_ttl: Duration::from_secs(5),
            tick: Duration::from_secs(1),
            clock: Arc::new(move || now),
            local_gateway: None,
            metrics: Arc::new(ControllerMetrics::default()),
        },
        token: None,
        allowed_hosts: rollgate_controller::api::allowed_hosts(
            "127.0.0.1:7070".parse().expect("addr"),
            &[],
        ),
    }
}

/// A web page cannot change state: a cross-site form (`text/plain`, a
/// foreign `Origin`), a DNS-rebinding page (its own name in `Host`) and an
/// empty-body post are refused; the CLI's requests pass.
#[tokio::test]
async fn writes_from_web_pages_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SqliteStore::open_dir(dir.path()).expect("store");
    let state = api_state(store, Timestamp(0));
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
            let resp = app.oneshot(req).await.expect("infallible");
            let status = resp.status().as_u16();
            let bytes = resp.into_body().collect().await.expect("body").to_bytes();
            let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
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
