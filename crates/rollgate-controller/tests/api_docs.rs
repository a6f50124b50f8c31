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
    let state = ApiState {
        ctx: Context {
            store: Arc::new(store),
            http: HttpClient::new(Duration::from_secs(1)),
            gateway_ttl: Duration::from_secs(5),
            tick: Duration::from_secs(1),
            clock: Arc::new(move || fixed),
            local_gateway: None,
            metrics: Arc::new(ControllerMetrics::default()),
        },
        token: None,
    };
    let app = router(state);
    for ex in examples {
        let mut req = Request::builder().method(ex.method.as_str()).uri(&ex.path);
        let body = match &ex.request {
            Some(v) => {
                req = req.header("content-type", "application/json");
                Body::from(v.to_string())
            }
            None => Body::empty(),
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
