//! The request path: route, forward, measure, and maybe mirror.
//!
//! The gateway measures and never judges. Failures are attributed to the
//! revision that caused them (5xx, timeout, connect error, unreadable
//! output); a client's 4xx is counted apart; gateway limits (413, 503 at
//! capacity) are the gateway's own and count against no revision. Request
//! and response payloads are never logged.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::PathAndQuery;
use http::{Method, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Body as _;
use hyper::body::Incoming;
use rollgate_core::{FailureClass, Protocol};

use crate::Inner;
use crate::extract::{Prediction, agree, extract};
use crate::pool::SendError;
use crate::routing::{Route, Target};
use crate::stream::{Outgoing, Prefixed, Read, ReadError, Streamed, Tally};
use http_body_util::Either;
use rollgate_net::WholeBody;

/// What the gateway answers: whole (bytes, then trailers for gRPC), or an
/// answer beyond the response limit passed on as it arrives.
#[derive(Debug)]
pub(crate) enum Body {
    Whole(WholeBody),
    Streamed(Box<Streamed>),
}

impl Body {
    pub fn new(data: Bytes) -> Body {
        Body::Whole(WholeBody::new(data))
    }

    pub fn with_trailers(data: Bytes, trailers: Option<HeaderMap>) -> Body {
        Body::Whole(WholeBody::with_trailers(data, trailers))
    }
}

impl Default for Body {
    fn default() -> Body {
        Body::Whole(WholeBody::default())
    }
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        match self.get_mut() {
            Body::Whole(b) => std::pin::Pin::new(b)
                .poll_frame(cx)
                .map(|f| f.map(|f| f.map_err(|never| match never {}))),
            Body::Streamed(s) => std::pin::Pin::new(s.as_mut()).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Body::Whole(b) => b.is_end_stream(),
            Body::Streamed(s) => s.is_end_stream(),
        }
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        match self {
            Body::Whole(b) => b.size_hint(),
            Body::Streamed(s) => s.size_hint(),
        }
    }
}

/// The header naming the revision that answered.
pub const REVISION_HEADER: &str = "x-rollgate-revision";
const REVISION: HeaderName = HeaderName::from_static(REVISION_HEADER);

/// What became of one upstream call.
enum Upstreamed {
    Answer {
        status: StatusCode,
        headers: HeaderMap,
        body: Bytes,
        /// What ended the answer after its body (gRPC's status).
        trailers: Option<Box<HeaderMap>>,
        latency_us: u64,
    },
    /// Beyond the response limit, nothing needing it whole: the part read
    /// and the rest to pass on (counted when it ends).
    /// (Boxed: rare, and large to move.)
    Streamed(Box<Partial>),
    Timeout,
    Connect,
    Broken,
}

/// An answer beyond the response limit, as far as it was read.
struct Partial {
    status: StatusCode,
    headers: HeaderMap,
    prefix: Bytes,
    rest: Incoming,
    /// When it was sent, and when the revision's timeout runs out.
    times: (Instant, Instant),
}

/// How a call travels: REST (JSON over HTTP/1.1 or HTTP/2) or gRPC. The
/// same route, split and counts serve both; the wire decides only how a
/// call is sent, how its outcome and predictions are read, and how the
/// gateway's own refusals are said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wire {
    Rest,
    Grpc,
}

/// The gateway's own refusal of a call (never a revision's outcome), in
/// the caller's wire: a JSON error, or a gRPC status.
pub(crate) fn refuse(wire: Wire, status: StatusCode, code: &str, message: &str) -> Response<Body> {
    match wire {
        Wire::Rest => json_error(status, code, message),
        Wire::Grpc => crate::grpc::status(rollgate_oip::Code::of_http(status.as_u16()), message),
    }
}

pub(crate) fn json_error(status: StatusCode, code: &str, message: &str) -> Response<Body> {
    let body = serde_json::json!({ "error": { "code": code, "message": message } }).to_string();
    let mut r = Response::new(Body::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

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

pub(crate) async fn handle(inner: Arc<Inner>, req: Request<Incoming>) -> Response<Body> {
    // gRPC is HTTP/2 only: an HTTP/1.1 request (most) skips the lookup.
    if req.version() == http::Version::HTTP_2
        && req.method() == Method::POST
        && req
            .headers()
            .get(header::CONTENT_TYPE)
            .is_some_and(|v| rollgate_oip::is_grpc(v.as_bytes()))
    {
        return crate::grpc::handle(inner, req).await;
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

/// Marks `answer` as the connection's last.
pub(crate) fn closing(answer: &mut Response<Body>) {
    answer
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
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

/// Metadata and readiness are the champion's; passed through unmeasured.
pub(crate) async fn passthrough(
    inner: &Inner,
    route: &Route,
    parts: &http::request::Parts,
    body: Bytes,
    wire: Wire,
) -> Response<Body> {
    let path_q = path_and_query(&parts.uri);
    let champion = &route.champion;
    let outcome = forward(
        inner,
        champion,
        parts.method.clone(),
        &path_q,
        &parts.headers,
        Sent::Whole(body),
        wire,
        wire == Wire::Rest,
    )
    .await;
    finish(outcome, champion, None, false, wire)
}

/// A request's path and query (`/` if it has none).
fn path_and_query(uri: &Uri) -> PathAndQuery {
    uri.path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"))
}

/// The sticky key: the configured header, else a JSON field of the body,
/// else random (that request alone is then assigned at random).
/// (A gRPC call's key is its metadata header: its body is not JSON.)
fn sticky_key<'a>(
    inner: &Inner,
    route: &Route,
    headers: &'a HeaderMap,
    body: &[u8],
    wire: Wire,
) -> std::borrow::Cow<'a, [u8]> {
    if let Some(v) = headers.get(&inner.key_header) {
        return v.as_bytes().into();
    }
    if wire == Wire::Rest
        && let Some(ptr) = &route.key_field
        && let Ok(doc) = serde_json::from_slice::<serde_json::Value>(body)
        && let Some(v) = doc.pointer(ptr)
    {
        return match v {
            serde_json::Value::String(s) => s.as_bytes().to_vec(),
            other => other.to_string().into_bytes(),
        }
        .into();
    }
    rand::random::<u64>().to_le_bytes().to_vec().into()
}

/// A tester's pin: the pin header, else the pin cookie (trimmed).
/// `Err` for a pin that is present but unreadable or empty: it is refused
/// rather than routed at random (a tester's request must never become
/// evidence by mistake).
fn pin_of<'a>(
    inner: &Inner,
    headers: &'a HeaderMap,
) -> Result<Option<std::borrow::Cow<'a, str>>, ()> {
    let readable = |v: &'a str| {
        let v = v.trim().trim_matches('"');
        (!v.is_empty()).then_some(v).ok_or(())
    };
    if let Some(v) = headers.get(&inner.pin_header) {
        return readable(v.to_str().map_err(|_| ())?).map(|v| Some(v.into()));
    }
    let Some(name) = inner.pin_cookie.as_deref() else {
        return Ok(None);
    };
    for v in headers.get_all(header::COOKIE) {
        let v = v.to_str().map_err(|_| ())?;
        if let Some((_, pin)) = v
            .split(';')
            .filter_map(|pair| pair.trim().split_once('='))
            .find(|(n, _)| *n == name)
        {
            return readable(pin).map(|v| Some(v.into()));
        }
    }
    Ok(None)
}

/// Counts a request in flight for as long as it lives: dropped (also when
/// the client goes away and the request's future is dropped), it counts
/// the request out, so the gauge cannot leak.
struct InFlight<'a>(&'a std::sync::atomic::AtomicI64);

impl<'a> InFlight<'a> {
    fn enter(gauge: &'a std::sync::atomic::AtomicI64) -> Self {
        gauge.fetch_add(1, Ordering::Relaxed);
        InFlight(gauge)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A call's body as it is sent upstream: held whole (it can be sent again,
/// on a fresh connection or to the champion, and mirrored), or streamed,
/// once.
pub(crate) enum Sent {
    Whole(Bytes),
    Streamed(Box<std::sync::Mutex<Option<Prefixed>>>),
}

impl Sent {
    /// The body for one sending: a whole one every time, a streamed one
    /// the first time only.
    fn outgoing(&self) -> Option<Outgoing> {
        match self {
            Sent::Whole(b) => Some(Either::Left(Full::new(b.clone()))),
            Sent::Streamed(s) => s
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take()
                .map(|p| Either::Right(Box::new(p))),
        }
    }

    fn whole(&self) -> Option<&Bytes> {
        match self {
            Sent::Whole(b) => Some(b),
            Sent::Streamed(_) => None,
        }
    }

    /// The same body for another sending: a whole one's copy; a streamed
    /// one moves (this one is then spent).
    fn again(&self) -> Sent {
        match self {
            Sent::Whole(b) => Sent::Whole(b.clone()),
            Sent::Streamed(s) => Sent::Streamed(Box::new(std::sync::Mutex::new(
                s.lock().unwrap_or_else(|p| p.into_inner()).take(),
            ))),
        }
    }
}

async fn predict(inner: Arc<Inner>, route: Arc<Route>, req: Request<Incoming>) -> Response<Body> {
    let (parts, body) = req.into_parts();
    // A body beyond the limit may stream to the revision that serves it
    // when nothing needs it whole: no shadow to mirror it to, no sticky
    // key to find in it.
    let may_stream = route.shadow.is_none()
        && (route.per_request
            || route.key_field.is_none()
            || parts.headers.contains_key(&inner.key_header));
    let body = match read_body(&inner, body, Wire::Rest, may_stream).await {
        Ok(Read::Whole(body, _)) => Sent::Whole(body),
        Ok(Read::Partial(prefix, rest)) => {
            inner.counters.streamed.fetch_add(1, Ordering::Relaxed);
            Sent::Streamed(Box::new(std::sync::Mutex::new(Some(Prefixed::new(
                prefix, rest,
            )))))
        }
        Err(mut refused) => {
            // The body was cut off: the connection cannot carry another
            // request.
            if parts.version < http::Version::HTTP_2 {
                closing(&mut refused);
            }
            return refused;
        }
    };
    predict_admitted(inner, route, parts, body, Wire::Rest).await
}

/// The request body, within the body limit (beyond it, when `may_stream`,
/// the part read and the rest to stream) and the client body timeout.
/// Read before a capacity slot is taken: a client that sends its body
/// slowly holds only its own connection, never a slot real users need.
pub(crate) async fn read_body(
    inner: &Inner,
    body: Incoming,
    wire: Wire,
    may_stream: bool,
) -> Result<Read, Response<Body>> {
    let read = crate::stream::read(body, inner.limits.max_body_bytes, may_stream);
    let Ok(read) = tokio::time::timeout(inner.limits.client_body_timeout, read).await else {
        inner.counters.slow_clients.fetch_add(1, Ordering::Relaxed);
        return Err(refuse(
            wire,
            StatusCode::REQUEST_TIMEOUT,
            "body_timeout",
            &format!(
                "request body not received within {:?}",
                inner.limits.client_body_timeout
            ),
        ));
    };
    match read {
        Ok(read) => Ok(read),
        Err(ReadError::TooLarge) => Err(refuse(
            wire,
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            &format!("request body exceeds {} bytes", inner.limits.max_body_bytes),
        )),
        Err(ReadError::Broken) => Err(refuse(
            wire,
            StatusCode::BAD_REQUEST,
            "bad_body",
            "could not read the request body",
        )),
    }
}

/// A prediction whose body is read: beyond the capacity cap it is
/// answered at once rather than queued.
pub(crate) async fn predict_admitted(
    inner: Arc<Inner>,
    route: Arc<Route>,
    parts: http::request::Parts,
    body: Sent,
    wire: Wire,
) -> Response<Body> {
    let Ok(_permit) = Arc::clone(&inner.capacity).try_acquire_owned() else {
        inner.counters.overloaded.fetch_add(1, Ordering::Relaxed);
        return refuse(
            wire,
            StatusCode::SERVICE_UNAVAILABLE,
            "at_capacity",
            "gateway at capacity, retry",
        );
    };
    let _in_flight = InFlight::enter(&inner.counters.in_flight);
    // (One function with what follows: a call through another async fn
    // would move its large future once more per request.)
    let (inner, route) = (&inner, &route);
    let path_q = path_and_query(&parts.uri);
    // gRPC compresses by its own rules (`grpc-encoding`), not HTTP's.
    let gzip = wire == Wire::Rest && accepts_gzip(&parts.headers);
    let may_stream = wire == Wire::Rest && !route.read_predictions;
    // A tester's pinned request: served by the revision it names and
    // counted apart, never as evidence (it was not assigned at random).
    let pin = if route.pinning {
        match pin_of(inner, &parts.headers) {
            Ok(pin) => pin,
            Err(()) => {
                return refuse(
                    wire,
                    StatusCode::BAD_REQUEST,
                    "bad_pin",
                    "the request's pin (header or cookie) is empty or not readable text",
                );
            }
        }
    } else {
        None
    };
    if let Some(pin) = pin {
        let Some(target) = route.pinned(&pin) else {
            return refuse(
                wire,
                StatusCode::CONFLICT,
                "pin_not_routed",
                &format!(
                    "the request is pinned to {:?}, which model {} does not route now \
                     (pin `candidate`, `shadow` or a routed revision's id)",
                    rollgate_core::words::clean(&pin),
                    route.name
                ),
            );
        };
        inner.counters.pinned(&route.name, &target.revision);
        let outcome = forward(
            inner,
            target,
            parts.method,
            &path_q,
            &parts.headers,
            body.again(),
            wire,
            may_stream,
        )
        .await;
        return finish(outcome, target, None, gzip, wire);
    }
    let key = if route.per_request {
        rand::random::<u64>().to_le_bytes().to_vec().into()
    } else {
        let whole = body.whole().map_or(&[][..], |b| &b[..]);
        sticky_key(inner, route, &parts.headers, whole, wire)
    };
    let bucket = crate::assign::bucket(&route.salt, &key);
    // The key's unit group: outcomes are also counted per group, since the
    // key, not the request, is what the split randomised.
    let unit = rollgate_core::unit_of(bucket);
    // (An answer beyond the response limit may be passed on as it arrives
    // only when nothing needs it whole: `may_stream`.)

    let chosen = match &route.candidate {
        Some((target, weight)) if crate::assign::to_candidate(bucket, *weight) => Some(target),
        _ => None,
    };
    if let Some(candidate) = chosen {
        candidate.stats.with(|s| s.record_arrivals(1));
        let outcome = forward(
            inner,
            candidate,
            parts.method.clone(),
            &path_q,
            &parts.headers,
            body.again(),
            wire,
            may_stream,
        )
        .await;
        let unreachable = matches!(outcome, Upstreamed::Connect);
        record(route, candidate, unit, &outcome, wire);
        // A streamed body went to the candidate: it cannot be sent again.
        if !(unreachable && route.fallback_to_champion && body.whole().is_some()) {
            return finish(outcome, candidate, Some(unit), gzip, wire);
        }
        inner.counters.fallback(&route.name);
    }
    // A copy from another data plane is worth sending on only to be
    // paired with the shadow's answer.
    let mirrored = chosen.is_none()
        && route
            .shadow
            .as_ref()
            .is_some_and(|(_, mirror_bp, _)| rand::random_range(0..10_000u32) < *mirror_bp);
    if route.mirror_only && !mirrored {
        return refuse(
            wire,
            StatusCode::MISDIRECTED_REQUEST,
            "mirror_only",
            "this model is served by another data plane; this gateway only \
             measures a shadow, from copies of its requests, while one runs",
        );
    }
    let champion = &route.champion;
    champion.stats.with(|s| s.record_arrivals(1));
    let outcome = forward(
        inner,
        champion,
        parts.method.clone(),
        &path_q,
        &parts.headers,
        body.again(),
        wire,
        may_stream,
    )
    .await;
    let preds = record(route, champion, unit, &outcome, wire);
    // (With a shadow, a body is always held whole.)
    if mirrored
        && let Some((_, _, pairs)) = &route.shadow
        && let Sent::Whole(body) = body
    {
        mirror(
            inner,
            route,
            pairs,
            parts.method,
            path_q,
            parts.headers,
            body,
            (unit, preds, wire),
        );
    }
    finish(outcome, champion, Some(unit), gzip, wire)
}

/// Records the outcome against `target`. Returns the predictions of a
/// successful answer (empty if the model's output is not read). Every
/// request was counted as arrived before it was sent: one whose outcome
/// never comes (its client went away) stays unresolved, which the
/// controller's error test takes at its worst for a rejection.
fn record(
    route: &Route,
    target: &Target,
    unit: u16,
    outcome: &Upstreamed,
    wire: Wire,
) -> Option<Vec<Prediction>> {
    let tally = Tally {
        stats: &*target.stats,
        unit,
    };
    let failure = |class| {
        tally.failure(class);
        None
    };
    match outcome {
        Upstreamed::Timeout => failure(FailureClass::Timeout),
        Upstreamed::Connect => failure(FailureClass::Connect),
        Upstreamed::Broken => failure(FailureClass::Upstream5xx),
        // Counted when it ends (see `finish`).
        Upstreamed::Streamed(_) => None,
        Upstreamed::Answer {
            status,
            headers,
            body,
            trailers,
            latency_us,
        } => {
            // A gRPC answer's outcome is its `grpc-status`, counted as the
            // HTTP status it maps to, so both wires are judged alike.
            let status = match wire {
                Wire::Rest => *status,
                Wire::Grpc => crate::grpc::outcome(*status, headers, trailers.as_deref()),
            };
            if status.is_server_error() {
                return failure(FailureClass::Upstream5xx);
            }
            if status.is_client_error() {
                tally.client_error();
                return None;
            }
            let preds = if route.read_predictions {
                let read = match (wire, &route.output) {
                    (Wire::Grpc, output) => {
                        crate::grpc::predictions(output.as_deref(), headers, body)
                    }
                    (Wire::Rest, Some(name)) => crate::extract::extract_v2_output(name, body),
                    (Wire::Rest, None) => {
                        extract(route.protocol, route.output_pointer.as_deref(), body)
                    }
                };
                match read {
                    Ok(p) => p,
                    Err(_) => return failure(FailureClass::InvalidOutput),
                }
            } else {
                Vec::new()
            };
            tally.success(*latency_us, preds.iter().filter_map(|p| p.class.as_deref()));
            Some(preds)
        }
    }
}

/// The user's response. A 2xx with unreadable output is still passed through
/// (the gateway does not judge); it was counted as a failure by `record`.
/// A streamed answer is counted, in `unit`, when it ends (`None`: an
/// unmeasured call).
fn finish(
    outcome: Upstreamed,
    target: &Target,
    unit: Option<u16>,
    gzip: bool,
    wire: Wire,
) -> Response<Body> {
    let revision = target.revision_header.as_ref();
    match outcome {
        Upstreamed::Streamed(partial) => {
            let Partial {
                status,
                headers,
                prefix,
                rest,
                times,
            } = *partial;
            let tally = unit.map(|unit| Tally {
                stats: Arc::clone(&target.stats),
                unit,
            });
            let body = Streamed::new(prefix, rest, status, times, tally);
            let mut r = Response::new(Body::Streamed(Box::new(body)));
            *r.status_mut() = status;
            *r.headers_mut() = passed_on(headers);
            with_revision(r, revision)
        }
        Upstreamed::Answer {
            status,
            headers,
            body,
            trailers,
            ..
        } => respond(
            status,
            headers,
            (body, trailers.map(|t| *t)),
            revision,
            gzip,
        ),
        Upstreamed::Timeout => with_revision(
            refuse(
                wire,
                StatusCode::GATEWAY_TIMEOUT,
                "upstream_timeout",
                "the model did not answer in time",
            ),
            revision,
        ),
        Upstreamed::Connect | Upstreamed::Broken => with_revision(
            refuse(
                wire,
                StatusCode::BAD_GATEWAY,
                "upstream_unavailable",
                "the model could not be reached",
            ),
            revision,
        ),
    }
}

fn with_revision(mut r: Response<Body>, revision: Option<&HeaderValue>) -> Response<Body> {
    if let Some(v) = revision {
        r.headers_mut().insert(REVISION, v.clone());
    }
    r
}

/// Headers of one hop, never passed on: the connection's own, and those
/// the gateway sets itself (`host`, `content-length`). (Names, not
/// `HeaderName`s: a `const` array of those is built and dropped at every
/// use.)
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "host",
    "content-length",
];

fn hop_by_hop(name: &HeaderName) -> bool {
    HOP_BY_HOP.contains(&name.as_str())
}

/// The headers a `Connection` header names: of this hop too (RFC 9110,
/// 7.6.1), never passed on. Empty without one (the common case costs a
/// lookup).
fn named_by_connection(headers: &HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        // `keep-alive`, `close` and the like: no header to drop beyond the
        // hop-by-hop ones (the common case allocates nothing).
        .filter(|t| {
            !t.eq_ignore_ascii_case("close")
                && !HOP_BY_HOP.iter().any(|h| h.eq_ignore_ascii_case(t))
        })
        .filter_map(|t| HeaderName::from_bytes(t.as_bytes()).ok())
        .collect()
}

/// Answers at least this large are compressed for a client that accepts
/// gzip (smaller ones gain less than the header costs).
const COMPRESS_FROM: usize = 1024;

/// Whether the client accepts gzip (`Accept-Encoding` lists `gzip` or `*`
/// without `q=0`).
fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|item| {
            let mut parts = item.split(';').map(str::trim);
            let coding = parts.next().unwrap_or("");
            let refused = parts.any(|p| {
                p.strip_prefix("q=")
                    .and_then(|q| q.parse::<f32>().ok())
                    .is_some_and(|q| q == 0.0)
            });
            (coding.eq_ignore_ascii_case("gzip") || coding == "*") && !refused
        })
}

/// Whether the answer's `Vary` already names `Accept-Encoding` (or `*`):
/// an upstream that compresses says so too, and saying it twice is noise.
fn varies_by_encoding(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::VARY)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|name| {
            let name = name.trim();
            name == "*" || name.eq_ignore_ascii_case("accept-encoding")
        })
}

/// The answer, gzip-compressed (fast level) when the client accepts it,
/// it is large enough and not already encoded. Answers are measured
/// unencoded (the gateway asks upstreams for identity); compressing for the
/// client is the gateway's own job, like a reverse proxy's.
fn compressed(headers: &mut HeaderMap, body: Bytes) -> Bytes {
    if body.len() < COMPRESS_FROM || headers.contains_key(header::CONTENT_ENCODING) {
        return body;
    }
    match gzip(&body) {
        Some(out) => {
            headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
            if !varies_by_encoding(headers) {
                headers.append(header::VARY, HeaderValue::from_static("accept-encoding"));
            }
            Bytes::from(out)
        }
        None => body,
    }
}

/// `data` as a gzip member (RFC 1952), deflated by a compressor kept per
/// thread. Written here rather than with `flate2::write::GzEncoder`, which
/// builds a fresh deflate state (hundreds of KiB, zeroed) for every answer:
/// measured, that tripled the gateway's CPU per 1 KiB answer
/// (bench/results/gateway.md, "Compressing for clients").
fn gzip(data: &[u8]) -> Option<Vec<u8>> {
    use flate2::{Compress, Compression, FlushCompress, Status};
    thread_local! {
        static DEFLATE: std::cell::RefCell<Compress> =
            std::cell::RefCell::new(Compress::new(Compression::fast(), false));
    }
    // Header: magic, deflate, no flags, no mtime, no extra flags, unknown OS.
    let mut out = Vec::with_capacity(data.len() / 2 + 64);
    out.extend_from_slice(&[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 255]);
    let done = DEFLATE.with(|d| {
        let mut d = d.borrow_mut();
        d.reset();
        // Each pass either finishes or fills the reserved room; bounded all
        // the same.
        for _ in 0..1024 {
            let read = d.total_in() as usize;
            if out.capacity() - out.len() < 64 {
                out.reserve(data.len() / 2 + 64);
            }
            match d.compress_vec(&data[read..], &mut out, FlushCompress::Finish) {
                Ok(Status::StreamEnd) => return true,
                Ok(_) => {}
                Err(_) => return false,
            }
        }
        false
    });
    if !done {
        return None;
    }
    let mut crc = flate2::Crc::new();
    crc.update(data);
    out.extend_from_slice(&crc.sum().to_le_bytes());
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    Some(out)
}

/// The upstream's headers a client is given: hop-by-hop ones dropped (in
/// place: an answer has one or two of them, and removing those costs less
/// than copying all the others).
fn passed_on(mut headers: HeaderMap) -> HeaderMap {
    for name in named_by_connection(&headers) {
        headers.remove(name);
    }
    let mut present = 0u16;
    for k in headers.keys() {
        if let Some(i) = HOP_BY_HOP.iter().position(|h| *h == k.as_str()) {
            present |= 1 << i;
        }
    }
    for (i, name) in HOP_BY_HOP.iter().enumerate() {
        if present & (1 << i) != 0 {
            headers.remove(*name);
        }
    }
    headers
}

fn respond(
    status: StatusCode,
    headers: HeaderMap,
    (body, trailers): (Bytes, Option<HeaderMap>),
    revision: Option<&HeaderValue>,
    gzip: bool,
) -> Response<Body> {
    let mut out = passed_on(headers);
    let body = if gzip {
        compressed(&mut out, body)
    } else {
        body
    };
    let mut r = Response::new(Body::with_trailers(body, trailers));
    *r.status_mut() = status;
    *r.headers_mut() = out;
    with_revision(r, revision)
}

/// Sends a call to `target` and reads its answer: whole up to the response
/// limit; beyond it, when `may_stream` (nothing needs it whole), as a
/// [`Upstreamed::Streamed`] answer, else as broken.
#[allow(clippy::too_many_arguments)]
async fn forward(
    inner: &Inner,
    target: &Target,
    method: Method,
    path_q: &PathAndQuery,
    headers: &HeaderMap,
    body: Sent,
    wire: Wire,
    may_stream: bool,
) -> Upstreamed {
    let limit = inner.limits.max_response_bytes;
    // Plain-HTTP REST upstreams are sent the path (origin form) and a
    // `Host` over their own pool; the pooled clients (TLS, and HTTP/2 for
    // gRPC) take the absolute URL.
    let (target_uri, direct, body) = match wire {
        Wire::Rest => match &target.direct {
            // The path as it came (no copy, no parsing again).
            Some(d) if d.prefix.is_empty() && target.rename.is_none() => {
                (Ok(Uri::from(path_q.clone())), Some(d), body)
            }
            Some(d) => (
                format!("{}{}", d.prefix, target.upstream_path(path_q.as_str())).parse(),
                Some(d),
                body,
            ),
            None => (
                format!("{}{}", target.base, target.upstream_path(path_q.as_str())).parse(),
                None,
                body,
            ),
        },
        Wire::Grpc => {
            // A revision without a gRPC endpoint cannot be reached by gRPC.
            let Some(base) = &target.grpc else {
                return Upstreamed::Connect;
            };
            let body = match (&target.rename, body) {
                (Some((_, served)), Sent::Whole(b)) => {
                    Sent::Whole(crate::grpc::renamed(headers, b, served, limit))
                }
                (_, body) => body,
            };
            (format!("{base}{path_q}").parse(), None, body)
        }
    };
    let Ok(uri) = target_uri else {
        return Upstreamed::Broken;
    };
    // Built on a header map directly (not `Request::builder`, which
    // converts and validates each name and value again): the request path
    // runs this for every request.
    let build = || {
        // A streamed body is sent once: no second request can be built.
        let body = body.outgoing()?;
        let mut out = HeaderMap::with_capacity(headers.len() + target.headers.len() + 2);
        let named = named_by_connection(headers);
        for (k, v) in headers {
            let overridden = target.headers.iter().any(|(name, _)| name == k);
            if !hop_by_hop(k) && k != header::ACCEPT_ENCODING && !overridden && !named.contains(k) {
                out.append(k.clone(), v.clone());
            }
        }
        // The revision's own headers (a `Host`, an auth token).
        for (k, v) in &target.headers {
            out.append(k.clone(), v.clone());
        }
        if let Some(d) = direct
            && !out.contains_key(header::HOST)
        {
            out.insert(header::HOST, d.host.clone());
        }
        // Answers are measured, so the gateway asks for them unencoded;
        // the client gets them unencoded too (identity is always
        // acceptable to it), and the gateway spends no CPU on compression.
        match wire {
            Wire::Rest => out.insert(
                header::ACCEPT_ENCODING,
                HeaderValue::from_static("identity"),
            ),
            Wire::Grpc => {
                // gRPC's own: trailers expected (`te` is hop-by-hop, so it
                // is set here, not passed on), messages uncompressed.
                out.insert(header::TE, HeaderValue::from_static("trailers"));
                out.insert(
                    HeaderName::from_static("grpc-accept-encoding"),
                    HeaderValue::from_static("identity"),
                )
            }
        };
        let mut req = Request::new(body);
        *req.method_mut() = method.clone();
        *req.uri_mut() = uri.clone();
        *req.headers_mut() = out;
        Some(req)
    };
    let again = body.whole().is_some();
    let started = Instant::now();
    let call = async {
        // A pooled connection the upstream closed before answering (uvicorn
        // closes one right after a 500 without saying so) fails the request
        // before any response byte: sent again once, on another connection.
        // The body is held whole, and nothing of the first try was
        // answered. (A streamed body is sent once.)
        let (parts, read) = match direct {
            Some(d) => {
                let pool = inner.pool(d);
                let (resp, sender) = match pool.send(build().ok_or(false)?, false).await {
                    Ok(sent) => sent,
                    Err(SendError::Http(e)) if again && closed_before_answer(&e) => {
                        inner.counters.retried.fetch_add(1, Ordering::Relaxed);
                        pool.send(build().ok_or(false)?, true)
                            .await
                            .map_err(|e| matches!(e, SendError::Connect))?
                    }
                    Err(e) => return Err(matches!(e, SendError::Connect)),
                };
                let (parts, body) = resp.into_parts();
                let read = crate::stream::read(body, limit, may_stream)
                    .await
                    .map_err(|_| false)?;
                // Read in full: the connection can carry the next request
                // (one still streaming closes when its answer ends).
                if matches!(read, Read::Whole(..)) {
                    pool.put(sender);
                }
                (parts, read)
            }
            None => {
                let (client, fresh) = match wire {
                    Wire::Rest => (&inner.client, &inner.fresh),
                    Wire::Grpc => (&inner.h2, &inner.h2),
                };
                let resp = match client.request(build().ok_or(false)?).await {
                    Ok(r) => r,
                    Err(e) if again && !e.is_connect() && closed_before_answer(&e) => {
                        inner.counters.retried.fetch_add(1, Ordering::Relaxed);
                        let req = build().ok_or(false)?;
                        fresh.request(req).await.map_err(|e| e.is_connect())?
                    }
                    Err(e) => return Err(e.is_connect()),
                };
                let (parts, body) = resp.into_parts();
                let read = crate::stream::read(body, limit, may_stream)
                    .await
                    .map_err(|_| false)?;
                (parts, read)
            }
        };
        Ok::<_, bool>((parts, read))
    };
    match tokio::time::timeout(target.timeout, call).await {
        Err(_) => Upstreamed::Timeout,
        Ok(Err(true)) => Upstreamed::Connect,
        Ok(Err(false)) => Upstreamed::Broken,
        Ok(Ok((parts, Read::Partial(prefix, rest)))) => Upstreamed::Streamed(Box::new(Partial {
            status: parts.status,
            headers: parts.headers,
            prefix,
            rest,
            times: (started, started + target.timeout),
        })),
        Ok(Ok((mut parts, Read::Whole(body, trailers)))) => {
            let body = match wire {
                Wire::Rest => match decoded(&mut parts.headers, body, limit) {
                    Some(body) => body,
                    // Beyond the response limit once decoded (a gzip
                    // bomb): the upstream's failure, as an answer beyond
                    // the limit is.
                    None => return Upstreamed::Broken,
                },
                Wire::Grpc => body,
            };
            Upstreamed::Answer {
                status: parts.status,
                body,
                headers: parts.headers,
                trailers,
                latency_us: started.elapsed().as_micros() as u64,
            }
        }
    }
}

/// Whether a request failed because its pooled connection was closed by
/// the upstream before any part of an answer arrived: closed cleanly (the
/// answer never started), or reset while the request was being sent
/// (uvicorn resets a connection it closed after a 500 when the next
/// request arrives on it).
fn closed_before_answer(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(s) = next {
        if let Some(h) = s.downcast_ref::<hyper::Error>()
            && (h.is_incomplete_message() || h.is_canceled())
        {
            return true;
        }
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::ConnectionAborted
            );
        }
        next = s.source();
    }
    false
}

/// The answer unencoded: an upstream that compresses despite being asked
/// for identity (gzip or deflate) is decoded, within `limit` bytes, and the
/// `Content-Encoding` dropped, so the answer is measured and passed on as
/// what it is; `None` when it decodes to more than `limit`. Anything else
/// (another encoding, a body that does not decode) is passed on as it
/// came.
fn decoded(headers: &mut HeaderMap, body: Bytes, limit: usize) -> Option<Bytes> {
    use std::io::Read;
    let Some(encoding) = headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().to_ascii_lowercase())
    else {
        return Some(body);
    };
    let mut out = Vec::new();
    let cap = limit as u64 + 1;
    let read = match encoding.as_str() {
        "gzip" | "x-gzip" => flate2::read::MultiGzDecoder::new(&body[..])
            .take(cap)
            .read_to_end(&mut out),
        "deflate" => flate2::read::ZlibDecoder::new(&body[..])
            .take(cap)
            .read_to_end(&mut out),
        "identity" => {
            headers.remove(header::CONTENT_ENCODING);
            return Some(body);
        }
        _ => return Some(body),
    };
    match read {
        Ok(n) if n <= limit => {
            headers.remove(header::CONTENT_ENCODING);
            Some(Bytes::from(out))
        }
        Ok(_) => None,
        Err(_) => Some(body),
    }
}

/// Fire-and-forget: the user's response never waits for this. A slot from
/// the bounded pool, or a counted drop.
#[allow(clippy::too_many_arguments)]
fn mirror(
    inner: &Arc<Inner>,
    route: &Arc<Route>,
    pairs: &Arc<crate::recorder::Sharded<rollgate_core::PairStats>>,
    method: Method,
    path_q: PathAndQuery,
    headers: HeaderMap,
    body: Bytes,
    (unit, champion, wire): (u16, Option<Vec<Prediction>>, Wire),
) {
    let Ok(slot) = Arc::clone(&inner.mirror_slots).try_acquire_owned() else {
        pairs.with(|p| p.record_drop());
        return;
    };
    let inner = Arc::clone(inner);
    let route = Arc::clone(route);
    let pairs = Arc::clone(pairs);
    tokio::spawn(async move {
        let _slot = slot;
        let Some((shadow, _, _)) = &route.shadow else {
            return;
        };
        shadow.stats.with(|s| s.record_arrivals(1));
        let may_stream = wire == Wire::Rest && !route.read_predictions;
        let sent = Sent::Whole(body);
        let outcome = forward(
            &inner, shadow, method, &path_q, &headers, sent, wire, may_stream,
        )
        .await;
        if let Upstreamed::Streamed(partial) = outcome {
            // Nobody receives it: read to its end and counted then.
            let tally = Tally {
                stats: Arc::clone(&shadow.stats),
                unit,
            };
            let Partial {
                status,
                prefix,
                rest,
                times,
                ..
            } = *partial;
            Streamed::new(prefix, rest, status, times, Some(tally))
                .drain()
                .await;
            return;
        }
        let answer = record(&route, shadow, unit, &outcome, wire);
        if let (Some(champion), Some(answer)) = (champion, answer)
            && route.read_predictions
        {
            pair(&route, &pairs, &champion, &answer);
        }
    });
}

/// Counts agreement per instance, and the request as one unit of the
/// shadow tests; a missing counterpart is a disagreement.
fn pair(
    route: &Route,
    pairs: &crate::recorder::Sharded<rollgate_core::PairStats>,
    champion: &[Prediction],
    shadow: &[Prediction],
) {
    let instances: Vec<(bool, bool)> = champion
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let agreed = shadow
                .get(i)
                .is_some_and(|s| agree(c, s, route.numeric_tolerance));
            let confident = c
                .confidence
                .is_some_and(|x| x >= route.confidence_threshold);
            (agreed, confident)
        })
        .collect();
    pairs.with(|p| p.record_request(&instances));
}

#[cfg(test)]
mod gzip_tests {
    use std::io::Read;

    /// Compressible and incompressible answers, small and large, and the
    /// same compressor reused: each decodes to what went in.
    #[test]
    fn gzip_members_decode_to_the_input() {
        let mut seed = 7u64;
        let mut noise = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) as u8
        };
        let inputs: Vec<Vec<u8>> = vec![
            br#"{"predictions":[[0.1,0.9]]}"#.repeat(200),
            (0..300_000).map(|_| noise()).collect(),
            vec![b'x'; 1],
        ];
        for input in inputs.iter().chain(inputs.iter()) {
            let out = super::gzip(input).expect("gzip");
            let mut back = Vec::new();
            flate2::read::GzDecoder::new(&out[..])
                .read_to_end(&mut back)
                .expect("a valid gzip member");
            assert_eq!(&back, input);
        }
    }
}

#[cfg(test)]
mod header_tests {
    use http::header::{HeaderMap, HeaderValue};

    /// An upstream that names `Accept-Encoding` in `Vary` is not echoed a
    /// second time when the gateway compresses.
    #[test]
    fn accept_encoding_is_named_in_vary_once() {
        let big = bytes::Bytes::from(vec![b'a'; super::COMPRESS_FROM * 2]);
        for upstream_vary in [
            None,
            Some("Accept-Encoding"),
            Some("origin, accept-encoding"),
        ] {
            let mut h = HeaderMap::new();
            if let Some(v) = upstream_vary {
                h.insert(http::header::VARY, HeaderValue::from_static(v));
            }
            let _ = super::compressed(&mut h, big.clone());
            let named = h
                .get_all(http::header::VARY)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(','))
                .filter(|n| n.trim().eq_ignore_ascii_case("accept-encoding"))
                .count();
            assert_eq!(named, 1, "{upstream_vary:?}: {h:?}");
        }
    }

    /// An answer's headers reach the client without the hop-by-hop ones
    /// (every value of each), the others kept with all their values, in
    /// order within each name (the order HTTP gives meaning to: the
    /// relative order of different names carries none, and removing in
    /// place may change it); a map without any is returned as it came.
    #[test]
    fn only_hop_by_hop_headers_are_dropped() {
        // A header the `Connection` header names is of this hop too.
        let mut h = HeaderMap::new();
        h.insert(
            "connection",
            HeaderValue::from_static("X-Secret-Hop, close"),
        );
        h.insert("x-secret-hop", HeaderValue::from_static("1"));
        h.insert("x-kept", HeaderValue::from_static("2"));
        let out = super::passed_on(h);
        assert!(out.get("x-secret-hop").is_none() && out.get("connection").is_none());
        assert_eq!(out.get("x-kept").map(|v| v.as_bytes()), Some(&b"2"[..]));
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("content-type", "application/json"),
            ("connection", "keep-alive"),
            ("set-cookie", "a=1"),
            ("keep-alive", "timeout=5"),
            ("set-cookie", "b=2"),
            ("content-length", "27"),
            ("proxy-connection", "close"),
            ("x-model", "m"),
            ("trailer", "grpc-status"),
            ("upgrade", "h2c"),
            ("te", "trailers"),
            ("host", "upstream:8080"),
            ("transfer-encoding", "chunked"),
            ("connection", "x-model"),
        ] {
            h.append(k, HeaderValue::from_static(v));
        }
        let out = super::passed_on(h);
        let mut kept: Vec<(&str, Vec<&str>)> = out
            .keys()
            .map(|k| {
                let values = out.get_all(k).iter().map(|v| v.to_str().unwrap_or("?"));
                (k.as_str(), values.collect())
            })
            .collect();
        kept.sort();
        assert_eq!(
            kept,
            [
                ("content-type", vec!["application/json"]),
                ("set-cookie", vec!["a=1", "b=2"]),
                // x-model is named by `Connection: x-model`: of this hop.
            ]
        );
        let mut plain = HeaderMap::new();
        plain.append("content-type", HeaderValue::from_static("text/plain"));
        assert_eq!(super::passed_on(plain.clone()), plain);
    }
}
