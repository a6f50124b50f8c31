//! Request admission: a prediction's body read (within the body limit and
//! the client's time), a capacity slot taken, a tester's pin honoured, the
//! sticky key's bucket sent to the candidate or the champion, and a copy
//! perhaps mirrored to the shadow. Also metadata's unmeasured way through.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use http::header::{self, HeaderMap};
use http::uri::PathAndQuery;
use http::{Request, Response, StatusCode, Uri};
use hyper::body::Incoming;

use super::answer::{closing, finish, record};
use super::encoding::accepts_gzip;
use super::forward::{Sent, Upstreamed, forward};
use super::mirror::mirror;
use super::wire::{Wire, refuse};
use crate::Inner;
use crate::body::Body;
use crate::routing::{Route, Target};
use crate::stream::{Prefixed, Read, ReadError};

/// A REST prediction: its body read (streamed on beyond the body limit
/// when nothing needs it whole), then admitted.
pub(super) async fn predict(
    inner: Arc<Inner>,
    route: Arc<Route>,
    req: Request<Incoming>,
) -> Response<Body> {
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
/// answered at once rather than queued. A tester's pinned request goes to
/// the revision it names; any other is split by its key's bucket between
/// the candidate and the champion, whose request may be mirrored to the
/// shadow.
pub(crate) async fn predict_admitted(
    inner: Arc<Inner>,
    route: Arc<Route>,
    parts: http::request::Parts,
    body: Sent,
    wire: Wire,
) -> Response<Body> {
    let Ok(_permit) = Arc::clone(&inner.capacity).try_acquire_owned() else {
        return at_capacity(&inner, wire);
    };
    let _in_flight = InFlight::enter(&inner.counters.in_flight);
    // (One function with what follows, its steps plain functions: a call
    // through another async fn would move its large future once more per
    // request.)
    let (inner, route) = (&inner, &route);
    // Who asked: an answer is recorded under the request's id.
    let asked = |joinable| (inner.as_ref(), &parts.headers, joinable);
    let path_q = path_and_query(&parts.uri);
    // gRPC compresses by its own rules (`grpc-encoding`), not HTTP's.
    let gzip = wire == Wire::Rest && accepts_gzip(&parts.headers);
    // (An answer beyond the response limit may be passed on as it arrives
    // only when nothing needs it whole.)
    let may_stream = wire == Wire::Rest && !route.read_predictions;
    // This request, sent to one revision (its future is `forward`'s own).
    let send = |target, method, body| {
        forward(
            inner,
            target,
            method,
            &path_q,
            &parts.headers,
            body,
            wire,
            may_stream,
        )
    };
    // A tester's pinned request: served by the revision it names and
    // counted apart, never as evidence (it was not assigned at random).
    match pinned(inner, route, &parts.headers) {
        Pin::Unpinned => {}
        Pin::To(target) => {
            let outcome = send(target, parts.method, body.again()).await;
            return finish(outcome, target, None, gzip, wire);
        }
        Pin::Refused(refused) => return refused.answer(route, wire),
    }
    let bucket = bucket_of(inner, route, &parts.headers, &body, wire);
    // The key's unit group: outcomes are also counted per group, since the
    // key, not the request, is what the split randomised.
    let unit = rollgate_core::unit_of(bucket);
    let chosen = candidate_for(route, bucket);
    if let Some(candidate) = chosen {
        candidate.stats.with(|s| s.record_arrivals(1));
        let outcome = send(candidate, parts.method.clone(), body.again()).await;
        let unreachable = matches!(outcome, Upstreamed::Connect);
        record(asked(true), route, candidate, unit, &outcome, wire);
        // A streamed body went to the candidate: it cannot be sent again.
        if !(unreachable && route.fallback_to_champion && body.whole().is_some()) {
            return finish(outcome, candidate, Some(unit), gzip, wire);
        }
        inner.counters.fallback(&route.name);
    }
    // A copy from another data plane is worth sending on only to be
    // paired with the shadow's answer.
    let mirrored = chosen.is_none() && drawn_for_mirroring(route);
    if route.mirror_only && !mirrored {
        return not_a_mirror(wire);
    }
    let champion = &route.champion;
    champion.stats.with(|s| s.record_arrivals(1));
    let outcome = send(champion, parts.method.clone(), body.again()).await;
    let joinable = mirrored || route.shadow.is_none();
    let preds = record(asked(joinable), route, champion, unit, &outcome, wire);
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

/// The refusal of a request beyond the capacity cap (503, counted): it is
/// answered at once rather than queued.
fn at_capacity(inner: &Inner, wire: Wire) -> Response<Body> {
    inner.counters.overloaded.fetch_add(1, Ordering::Relaxed);
    refuse(
        wire,
        StatusCode::SERVICE_UNAVAILABLE,
        "at_capacity",
        "gateway at capacity, retry",
    )
}

/// The refusal (421) of a request for a mirror-only model that is not a
/// copy worth pairing: another data plane serves that model.
fn not_a_mirror(wire: Wire) -> Response<Body> {
    refuse(
        wire,
        StatusCode::MISDIRECTED_REQUEST,
        "mirror_only",
        "this model is served by another data plane; this gateway only \
         measures a shadow, from copies of its requests, while one runs",
    )
}

/// What a request's pin asks of its route.
enum Pin<'a> {
    /// No pin, or the model takes none: assigned as any request is.
    Unpinned,
    /// Served by this revision (and counted as pinned to it).
    To(&'a Target),
    /// A pin that cannot be served.
    Refused(PinRefused<'a>),
}

/// Why a pin cannot be served.
enum PinRefused<'a> {
    /// Present, but empty or not readable text.
    Unreadable,
    /// Names a revision the model does not route now.
    NotRouted(std::borrow::Cow<'a, str>),
}

impl PinRefused<'_> {
    /// The refusal, in the caller's wire: a tester's request is never
    /// routed at random instead.
    fn answer(self, route: &Route, wire: Wire) -> Response<Body> {
        match self {
            PinRefused::Unreadable => refuse(
                wire,
                StatusCode::BAD_REQUEST,
                "bad_pin",
                "the request's pin (header or cookie) is empty or not readable text",
            ),
            PinRefused::NotRouted(pin) => refuse(
                wire,
                StatusCode::CONFLICT,
                "pin_not_routed",
                &format!(
                    "the request is pinned to {:?}, which model {} does not route now \
                     (pin `candidate`, `shadow` or a routed revision's id)",
                    rollgate_core::words::clean(&pin),
                    route.name
                ),
            ),
        }
    }
}

/// The request's pin on `route` (read only when the model takes pins); a
/// pin to a revision it routes is counted there.
fn pinned<'a>(inner: &Inner, route: &'a Route, headers: &'a HeaderMap) -> Pin<'a> {
    if !route.pinning {
        return Pin::Unpinned;
    }
    match pin_of(inner, headers) {
        Ok(None) => Pin::Unpinned,
        Ok(Some(pin)) => match route.pinned(&pin) {
            Some(target) => {
                inner.counters.pinned(&route.name, &target.revision);
                Pin::To(target)
            }
            None => Pin::Refused(PinRefused::NotRouted(pin)),
        },
        Err(()) => Pin::Refused(PinRefused::Unreadable),
    }
}

/// The request's bucket of the split: its sticky key (a random one when
/// the model is split per request) hashed with the route's salt.
fn bucket_of(inner: &Inner, route: &Route, headers: &HeaderMap, body: &Sent, wire: Wire) -> u32 {
    let key = if route.per_request {
        rand::random::<u64>().to_le_bytes().to_vec().into()
    } else {
        let whole = body.whole().map_or(&[][..], |b| &b[..]);
        sticky_key(inner, route, headers, whole, wire)
    };
    crate::assign::bucket(&route.salt, &key)
}

/// The candidate, when the bucket falls in its share.
fn candidate_for(route: &Route, bucket: u32) -> Option<&Target> {
    match &route.candidate {
        Some((target, weight)) if crate::assign::to_candidate(bucket, *weight) => Some(target),
        _ => None,
    }
}

/// Whether a request the champion serves is also mirrored to the shadow:
/// drawn at random, at the shadow's mirrored share.
fn drawn_for_mirroring(route: &Route) -> bool {
    route
        .shadow
        .as_ref()
        .is_some_and(|(_, mirror_bp, _)| rand::random_range(0..10_000u32) < *mirror_bp)
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
