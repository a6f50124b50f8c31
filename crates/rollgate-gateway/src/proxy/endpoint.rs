//! The front door: what a call asks for. A REST request by its method and
//! path (a model's prediction or metadata, or the gateway's own health,
//! stats and metrics), a gRPC call by its method and the model its message
//! names. Predictions go on to admission; everything else is answered here,
//! an unread request body drained so the connection can carry the next one.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt as _;
use hyper::body::Body as _;
use hyper::body::Incoming;
use rollgate_core::Protocol;
use rollgate_oip::{self as oip, Code};

use super::admission::{passthrough, predict, predict_admitted, read_body};
use super::answer::closing;
use super::forward::Sent;
use super::request_id::{self, REQUEST_ID};
use super::wire::{Wire, json_error};
use crate::Inner;
use crate::body::Body;
use crate::grpc::{answer, status};
use crate::stream::Read;

fn json_ok(body: String) -> Response<Body> {
    let mut r = Response::new(Body::new(Bytes::from(body)));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// What a path asks for.
enum Endpoint<'a> {
    /// A model's inference path, and the protocol its path belongs to.
    Predict(&'a str, Protocol),
    JsonRoute,
    Metadata(&'a str),
    Health,
    Stats,
    Metrics,
    NotFound,
}

fn classify<'a>(method: &Method, path: &'a str) -> Endpoint<'a> {
    if let Some(rest) = path.strip_prefix("/v1/models/")
        && let Some(model) = rest.strip_suffix(":predict")
        && method == Method::POST
    {
        return Endpoint::Predict(model, Protocol::KserveV1);
    }
    if let Some(rest) = path.strip_prefix("/v2/models/") {
        // `{model}[/versions/{v}]/infer`, `…/ready`, or the metadata itself.
        let model = rest.split('/').next().unwrap_or(rest);
        if rest.ends_with("/infer") && method == Method::POST {
            return Endpoint::Predict(model, Protocol::OipV2);
        }
        if method == Method::GET {
            return Endpoint::Metadata(model);
        }
    }
    match (method, path) {
        (&Method::GET, "/healthz" | "/v2/health/live" | "/v2/health/ready" | "/v2") => {
            Endpoint::Health
        }
        (&Method::GET, "/rollgate/stats") => Endpoint::Stats,
        (&Method::GET, "/metrics") => Endpoint::Metrics,
        (&Method::POST, _) => Endpoint::JsonRoute,
        _ => Endpoint::NotFound,
    }
}

/// A client's request, under its id (`x-request-id`: the client's, or
/// one made here), which goes upstream with it and back on the answer,
/// whoever made the answer.
pub(crate) async fn handle(inner: Arc<Inner>, mut req: Request<Incoming>) -> Response<Body> {
    let id = request_id::of(req.headers_mut());
    let mut answer = routed(inner, req).await;
    answer.headers_mut().insert(REQUEST_ID, id);
    answer
}

/// A client's request: a gRPC call, or a REST request by what its path
/// asks for.
async fn routed(inner: Arc<Inner>, req: Request<Incoming>) -> Response<Body> {
    // gRPC is HTTP/2 only: an HTTP/1.1 request (most) skips the lookup.
    if req.version() == http::Version::HTTP_2
        && req.method() == Method::POST
        && req
            .headers()
            .get(header::CONTENT_TYPE)
            .is_some_and(|v| rollgate_oip::is_grpc(v.as_bytes()))
    {
        return grpc_call(inner, req).await;
    }
    // (A clone of the URI shares its bytes: the path is not copied.)
    let uri = req.uri().clone();
    let path = uri.path();
    let refusal = match classify(req.method(), path) {
        Endpoint::Health => json_ok(r#"{"live":true,"ready":true}"#.into()),
        Endpoint::Stats => json_ok(serde_json::to_string(&inner.snapshot()).unwrap_or_default()),
        Endpoint::Metrics => {
            let accept = req
                .headers()
                .get(header::ACCEPT)
                .and_then(|v| v.to_str().ok());
            let (body, kind) = crate::metrics::expose(&inner, accept);
            let mut r = Response::new(Body::new(Bytes::from(body)));
            r.headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
            r
        }
        Endpoint::Metadata(model) => {
            let route = inner.routes.load().model(model).cloned();
            match route {
                Some(route) => {
                    let (parts, _) = req.into_parts();
                    return passthrough(&inner, &route, &parts, Bytes::new(), Wire::Rest).await;
                }
                None => json_error(
                    StatusCode::NOT_FOUND,
                    "unknown_model",
                    &format!("no model {model:?}"),
                ),
            }
        }
        Endpoint::Predict(model, protocol) => {
            let table = inner.routes.load();
            match table.model(model).cloned() {
                Some(route) if route.protocol != protocol => {
                    // Never forwarded, so never held against a revision.
                    inner
                        .counters
                        .wrong_protocol
                        .fetch_add(1, Ordering::Relaxed);
                    json_error(
                        StatusCode::BAD_REQUEST,
                        "wrong_protocol",
                        &format!(
                            "model {model:?} speaks {}, not {}",
                            protocol_name(route.protocol),
                            protocol_name(protocol)
                        ),
                    )
                }
                Some(route) => return predict(inner, route, req).await,
                None => match table.unroutable(model) {
                    Some(reason) => unroutable(model, reason),
                    None => json_error(
                        StatusCode::NOT_FOUND,
                        "unknown_model",
                        &format!("no model {model:?}"),
                    ),
                },
            }
        }
        Endpoint::JsonRoute => {
            let table = inner.routes.load();
            match table.json_path(path).cloned() {
                Some(route) => return predict(inner, route, req).await,
                None => match table.unroutable_path(path) {
                    Some(reason) => unroutable(path, reason),
                    None => {
                        json_error(StatusCode::NOT_FOUND, "not_found", "no route for this path")
                    }
                },
            }
        }
        Endpoint::NotFound => {
            json_error(StatusCode::NOT_FOUND, "not_found", "no route for this path")
        }
    };
    answered_unread(req, refusal).await
}

/// A gRPC call: the server's own health answered here; a model's call
/// read whole (the model's name is in its message) and taken on the
/// route of the model it names, as its REST twin is.
async fn grpc_call(inner: Arc<Inner>, req: Request<Incoming>) -> Response<Body> {
    let Some(method) = oip::Method::of_path(req.uri().path()) else {
        return status(
            Code::Unimplemented,
            "rollgate serves the Open Inference Protocol's inference.GRPCInferenceService only",
        );
    };
    // The server's own health is the gateway's, as over REST.
    match method {
        oip::Method::ServerLive => return answer(&oip::ServerLiveResponse { live: true }),
        oip::Method::ServerReady => return answer(&oip::ServerReadyResponse { ready: true }),
        oip::Method::ServerMetadata => {
            return answer(&oip::ServerMetadataResponse {
                name: "rollgate".into(),
                version: env!("CARGO_PKG_VERSION").into(),
                extensions: Vec::new(),
            });
        }
        oip::Method::ModelReady | oip::Method::ModelMetadata | oip::Method::ModelInfer => {}
    }
    let (parts, body) = req.into_parts();
    // Held whole: the model's name is in it.
    let body = match read_body(&inner, body, Wire::Grpc, false).await {
        Ok(Read::Whole(body, _)) => body,
        Ok(Read::Partial(..)) => {
            return status(Code::Internal, "a gRPC message is read whole");
        }
        Err(refused) => return refused,
    };
    let limit = inner.limits.max_body_bytes;
    let model = match oip::read_message(&parts.headers, &body, limit)
        .map_err(|e| e.to_string())
        .and_then(|m| oip::model_name(&m).map_err(|e| e.to_string()))
    {
        Ok(model) => model,
        Err(e) => return status(Code::InvalidArgument, &format!("unreadable request: {e}")),
    };
    let table = inner.routes.load();
    let route = match table.model(&model).cloned() {
        Some(route) if route.protocol == Protocol::OipV2 => route,
        Some(_) => {
            // Never forwarded, so never held against a revision.
            inner
                .counters
                .wrong_protocol
                .fetch_add(1, Ordering::Relaxed);
            return status(
                Code::InvalidArgument,
                &format!("model {model:?} does not speak the Open Inference Protocol (oip_v2)"),
            );
        }
        None => {
            let why = match table.unroutable(&model) {
                Some(reason) => format!("{model:?} cannot be routed: {reason}"),
                None => format!("no model {model:?}"),
            };
            return status(Code::NotFound, &why);
        }
    };
    drop(table);
    match method {
        oip::Method::ModelInfer => {
            let body = Sent::Whole(body);
            predict_admitted(inner, route, parts, body, Wire::Grpc).await
        }
        _ => passthrough(&inner, &route, &parts, body, Wire::Grpc).await,
    }
}

/// The most of an unread body the gateway reads (and drops) after an answer
/// that did not need it, so that the connection can carry the next request.
pub(crate) const DRAIN_LIMIT: usize = 64 << 10;

/// How long it waits for that body.
pub(crate) const DRAIN_WITHIN: Duration = Duration::from_secs(2);

/// `answer`, given to a request whose body the gateway did not read (a
/// refusal, or an endpoint without a body). HTTP/1.1 reuses a connection
/// only once the request's body has been read; an unread body makes the
/// server close it, and a pooling client writes its next request on the
/// dead socket. So the body is drained (at most [`DRAIN_LIMIT`] bytes,
/// within [`DRAIN_WITHIN`], however late it arrives in that time); one
/// larger or slower gets `Connection: close`, which tells the client not
/// to reuse the connection. (HTTP/2 resets the stream of an unread body
/// itself; the connection stays.)
pub(crate) async fn answered_unread(
    req: Request<Incoming>,
    mut answer: Response<Body>,
) -> Response<Body> {
    if req.version() >= http::Version::HTTP_2 {
        return answer;
    }
    let body = req.into_body();
    if body.is_end_stream() {
        return answer;
    }
    let drained = tokio::time::timeout(
        DRAIN_WITHIN,
        http_body_util::Limited::new(body, DRAIN_LIMIT).collect(),
    )
    .await;
    if !matches!(drained, Ok(Ok(_))) {
        closing(&mut answer);
    }
    answer
}

fn protocol_name(p: Protocol) -> &'static str {
    match p {
        Protocol::KserveV1 => "kserve_v1 (POST /v1/models/{name}:predict)",
        Protocol::OipV2 => "oip_v2 (POST /v2/models/{name}/infer)",
        Protocol::Json => "json (its own path)",
    }
}

/// A model the gateway cannot route: 404 with the reason (its spec is the
/// operator's to fix; other models are unaffected).
fn unroutable(what: &str, reason: &str) -> Response<Body> {
    json_error(
        StatusCode::NOT_FOUND,
        "unroutable_model",
        &format!("{what:?} cannot be routed: {reason}"),
    )
}
