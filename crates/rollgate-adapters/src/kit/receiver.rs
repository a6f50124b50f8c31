//! The reference webhook receiver: what the webhook contract asks of a
//! receiver (docs/config.md, "webhook"), on 127.0.0.1, with a router of
//! its own as its data plane. `POST /routing` applies the routing it is
//! sent and answers `{"version": ...}` — unless it holds a higher
//! generation, which it keeps, answering `409` and `{"generation": <the
//! one it holds>}`. Any other request is routed by its sticky key
//! ([`KEY_HEADER`]) to one of the routing's upstreams, in proportion to
//! the weights, and answered with what the upstream answered.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use super::KEY_HEADER;

/// The routing a receiver holds.
#[derive(Debug, Default)]
struct Held {
    generation: u64,
    version: String,
    /// `(upstream, weight_bp)` of the arms with a share.
    arms: Vec<(String, u32)>,
}

/// A receiver on 127.0.0.1, stopped when dropped.
#[derive(Debug)]
pub struct Receiver {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Receiver {
    /// A receiver holding no routing yet (its router answers `503`).
    pub async fn start() -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let held = Arc::new(Mutex::new(Held::default()));
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let held = Arc::clone(&held);
                tokio::spawn(async move {
                    let svc = service_fn(move |req| answer(Arc::clone(&held), req));
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Receiver { addr, task }
    }

    /// Where the webhook adapter POSTs (`DataPlane::Webhook`'s `url`).
    pub fn url(&self) -> String {
        format!("http://{}/routing", self.addr)
    }

    /// Where requests are routed through the receiver's data plane.
    pub fn router_url(&self) -> String {
        format!("http://{}/", self.addr)
    }
}

async fn answer(
    held: Arc<Mutex<Held>>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.method() == hyper::Method::POST && req.uri().path() == "/routing" {
        let body = req.into_body().collect().await.map(|b| b.to_bytes());
        let routing = body
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok());
        return Ok(match routing {
            Some(routing) => apply(&held, &routing),
            None => reply(StatusCode::BAD_REQUEST, json!({"error": "not JSON"})),
        });
    }
    let key = req
        .headers()
        .get(KEY_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let upstream = pick(&held.lock().unwrap_or_else(|p| p.into_inner()), &key);
    let Some(upstream) = upstream else {
        return Ok(reply(
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"error": "no routing"}),
        ));
    };
    Ok(match super::get(&upstream, &key).await {
        Some(name) => Response::new(Full::new(Bytes::from(name))),
        None => reply(StatusCode::BAD_GATEWAY, json!({"error": "no answer"})),
    })
}

/// Applies `routing` unless a higher generation is held.
fn apply(held: &Mutex<Held>, routing: &Value) -> Response<Full<Bytes>> {
    let mut held = held.lock().unwrap_or_else(|p| p.into_inner());
    let generation = routing["generation"].as_u64().unwrap_or(0);
    if generation < held.generation {
        return reply(
            StatusCode::CONFLICT,
            json!({"generation": held.generation, "error": "a newer routing is in force"}),
        );
    }
    let arms = routing["arms"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| {
            let upstream = a["upstream"].as_str()?.to_string();
            let weight = u32::try_from(a["weight_bp"].as_u64()?).ok()?;
            (weight > 0).then_some((upstream, weight))
        })
        .collect();
    *held = Held {
        generation,
        version: routing["version"].as_str().unwrap_or_default().to_string(),
        arms,
    };
    reply(StatusCode::OK, json!({"version": held.version}))
}

/// The upstream `key` is routed to: its hash's place among the weights.
fn pick(held: &Held, key: &str) -> Option<String> {
    let total: u64 = held.arms.iter().map(|(_, w)| u64::from(*w)).sum();
    if total == 0 {
        return None;
    }
    // FNV-1a: the same key, the same place, every time.
    let hash = key.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let mut at = hash % total;
    for (upstream, weight) in &held.arms {
        if at < u64::from(*weight) {
            return Some(upstream.clone());
        }
        at -= u64::from(*weight);
    }
    None
}

fn reply(status: StatusCode, body: Value) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body.to_string())));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    resp
}
