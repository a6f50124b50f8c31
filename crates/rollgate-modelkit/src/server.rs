//! A model server speaking KServe V1 and Open Inference Protocol V2, with
//! fault injection for tests, the demo and benchmarks. Faults touch only
//! predictions: health, readiness and metadata always answer, so a
//! "ready-then-503" server passes its readiness probe and fails every call.
//! `GET /metrics` serves Prometheus metrics in MLServer's shape
//! ([`crate::metrics`]), on the same port.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use rollgate_net::WholeBody;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::config::Fault;
pub use crate::config::{Faults, ServerConfig};
use crate::metrics::ServerMetrics;

fn reply(status: StatusCode, body: Value) -> Response<WholeBody> {
    let mut r = Response::new(WholeBody::new(Bytes::from(body.to_string())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

fn bad(msg: impl Into<String>) -> Response<WholeBody> {
    reply(StatusCode::BAD_REQUEST, json!({ "error": msg.into() }))
}

/// Reads KServe V1 `instances` or OIP V2 `inputs[0]` into rows.
fn rows(v2: bool, body: &Value, width: usize) -> Result<Vec<Vec<f64>>, String> {
    let numbers = |v: &Value| -> Result<Vec<f64>, String> {
        v.as_array()
            .ok_or("an instance must be an array of numbers")?
            .iter()
            .map(|x| {
                x.as_f64()
                    .ok_or_else(|| "features must be numbers".to_string())
            })
            .collect()
    };
    if !v2 {
        let inst = body
            .get("instances")
            .and_then(Value::as_array)
            .ok_or("body must be {\"instances\": [[...], ...]}")?;
        return inst.iter().map(numbers).collect();
    }
    let input = body
        .pointer("/inputs/0")
        .ok_or("body must have inputs[0]")?;
    let data = numbers(input.get("data").ok_or("inputs[0].data is required")?)?;
    if data.is_empty() || data.len() % width != 0 {
        return Err(format!("inputs[0].data must hold rows of {width} features"));
    }
    Ok(data.chunks(width).map(<[f64]>::to_vec).collect())
}

async fn predict(cfg: &ServerConfig, v2: bool, req: Request<Incoming>) -> Response<WholeBody> {
    let Ok(body) = Limited::new(req.into_body(), 8 << 20).collect().await else {
        return bad("could not read the body (limit 8 MiB)");
    };
    let Ok(doc) = serde_json::from_slice::<Value>(&body.to_bytes()) else {
        return bad("body is not JSON");
    };
    let width = cfg.model.weights.len();
    let rows = match rows(v2, &doc, width) {
        Ok(r) => r,
        Err(e) => return bad(e),
    };
    let mut probs = Vec::with_capacity(rows.len());
    for r in &rows {
        match cfg.model.predict_proba(r) {
            Ok(p) => probs.push(p),
            Err(e) => return bad(e),
        }
    }
    match cfg.faults.inject().await {
        Some(Fault::Unavailable) => {
            return reply(
                StatusCode::SERVICE_UNAVAILABLE,
                json!({ "error": "model unavailable" }),
            );
        }
        Some(Fault::Failure) => {
            return reply(
                StatusCode::INTERNAL_SERVER_ERROR,
                json!({ "error": "injected failure" }),
            );
        }
        None => {}
    }
    if v2 {
        let data: Vec<f64> = probs.iter().flat_map(|p| p.iter().copied()).collect();
        reply(
            StatusCode::OK,
            json!({ "model_name": cfg.name, "outputs": [{ "name": "probabilities", "shape": [probs.len(), 2], "datatype": "FP64", "data": data }] }),
        )
    } else {
        reply(StatusCode::OK, json!({ "predictions": probs }))
    }
}

async fn handle(cfg: Arc<ServerConfig>, req: Request<Incoming>) -> Response<WholeBody> {
    let path = req.uri().path().to_string();
    let name = cfg.name.as_str();
    let is_get = req.method() == Method::GET;
    let is_post = req.method() == Method::POST;
    if let Some(rest) = path.strip_prefix("/v1/models/") {
        if is_post && let Some(m) = rest.strip_suffix(":predict") {
            return if m == name {
                predict(&cfg, false, req).await
            } else {
                not_found(m)
            };
        }
        if is_get {
            return if rest == name {
                reply(StatusCode::OK, json!({ "name": name, "ready": true }))
            } else {
                not_found(rest)
            };
        }
    }
    if let Some(rest) = path.strip_prefix("/v2/models/") {
        if is_post && let Some(m) = rest.strip_suffix("/infer") {
            return if m == name {
                predict(&cfg, true, req).await
            } else {
                not_found(m)
            };
        }
        if is_get && let Some(m) = rest.strip_suffix("/ready") {
            return if m == name {
                reply(StatusCode::OK, json!({ "name": name, "ready": true }))
            } else {
                not_found(m)
            };
        }
        if is_get {
            return if rest == name {
                reply(
                    StatusCode::OK,
                    json!({
                        "name": name, "versions": [], "platform": "rollgate-linear",
                        "inputs": [{ "name": "x", "datatype": "FP64", "shape": [-1, cfg.model.weights.len()] }],
                        "outputs": [{ "name": "probabilities", "datatype": "FP64", "shape": [-1, 2] }]
                    }),
                )
            } else {
                not_found(rest)
            };
        }
    }
    match (is_get, path.as_str()) {
        (true, "/v2/health/live") => reply(StatusCode::OK, json!({ "live": true })),
        (true, "/v2/health/ready") => reply(StatusCode::OK, json!({ "ready": true })),
        _ => reply(
            StatusCode::NOT_FOUND,
            json!({ "error": "no such endpoint" }),
        ),
    }
}

/// The route template a request matched (bounded label values), and the
/// model when it is an inference of the served one.
fn route_of<'a>(method: &Method, path: &str, name: &'a str) -> (&'static str, Option<&'a str>) {
    let post = method == Method::POST;
    if let Some(rest) = path.strip_prefix("/v1/models/") {
        if post && rest.strip_suffix(":predict").is_some() {
            let ours = rest.strip_suffix(":predict") == Some(name);
            return ("/v1/models/{model_name}:predict", ours.then_some(name));
        }
        return ("/v1/models/{model_name}", None);
    }
    if let Some(rest) = path.strip_prefix("/v2/models/") {
        if post && rest.strip_suffix("/infer").is_some() {
            let ours = rest.strip_suffix("/infer") == Some(name);
            return ("/v2/models/{model_name}/infer", ours.then_some(name));
        }
        if rest.ends_with("/ready") {
            return ("/v2/models/{model_name}/ready", None);
        }
        return ("/v2/models/{model_name}", None);
    }
    match path {
        "/v2/health/live" => ("/v2/health/live", None),
        "/v2/health/ready" => ("/v2/health/ready", None),
        _ => ("unknown", None),
    }
}

fn not_found(model: &str) -> Response<WholeBody> {
    reply(
        StatusCode::NOT_FOUND,
        json!({ "error": format!("model {model:?} is not served here") }),
    )
}

/// Answers `req`, counting it in `metrics` (`GET /metrics` itself is not
/// counted).
async fn measured(
    cfg: Arc<ServerConfig>,
    metrics: &ServerMetrics,
    req: Request<Incoming>,
) -> Response<WholeBody> {
    if req.method() == Method::GET && req.uri().path() == "/metrics" {
        let accept = req
            .headers()
            .get(http::header::ACCEPT)
            .and_then(|v| v.to_str().ok());
        let (body, kind) = metrics.expose(accept);
        let mut r = Response::new(WholeBody::new(Bytes::from(body)));
        r.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static(kind),
        );
        return r;
    }
    let started = std::time::Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let name = cfg.name.clone();
    metrics.begin(method.as_str());
    let grpc = method == Method::POST
        && req
            .headers()
            .get(http::header::CONTENT_TYPE)
            .is_some_and(|v| rollgate_oip::is_grpc(v.as_bytes()));
    if grpc {
        // Counted under the method's path, with the HTTP status its
        // outcome maps to.
        let (resp, code, ours) = crate::grpc::handle(&cfg, req).await;
        let route = rollgate_oip::Method::of_path(&path).map_or("unknown", |m| m.path());
        metrics.record(
            ours.then_some(name.as_str()),
            method.as_str(),
            route,
            code.http_equivalent(),
            started.elapsed(),
        );
        return resp;
    }
    let resp = handle(cfg, req).await;
    let (route, model) = route_of(&method, &path, &name);
    metrics.record(
        model,
        method.as_str(),
        route,
        resp.status().as_u16(),
        started.elapsed(),
    );
    resp
}

/// Serves until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    cfg: ServerConfig,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let serving = rollgate_net::Serving {
        header_timeout: Duration::from_secs(30),
        drain_timeout: Duration::from_secs(5),
        tls: cfg.tls.clone(),
        refusal_body: None,
    };
    let cfg = Arc::new(cfg);
    let metrics = Arc::new(ServerMetrics::default());
    let make = move || {
        let cfg = Arc::clone(&cfg);
        let metrics = Arc::clone(&metrics);
        service_fn(move |req: Request<Incoming>| {
            let cfg = Arc::clone(&cfg);
            let metrics = Arc::clone(&metrics);
            async move { Ok::<_, Infallible>(measured(cfg, &metrics, req).await) }
        })
    };
    rollgate_net::serve(listener, serving, make, shutdown).await
}
