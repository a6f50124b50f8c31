//! Forwarding: a call sent to one revision (over its own connection pool,
//! or the pooled clients for TLS and gRPC; once more on a fresh connection
//! when a pooled one was closed before answering) and its answer read back,
//! whole up to the response limit or streamed beyond it, within the
//! revision's timeout.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::HeaderMap;
use http::uri::PathAndQuery;
use http::{Method, Request, StatusCode, Uri};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use tokio::time::error::Elapsed;

use super::encoding::decoded;
use super::headers::upstream_headers;
use super::wire::Wire;
use crate::Inner;
use crate::pool::SendError;
use crate::routing::{Direct, Target};
use crate::stream::{Outgoing, Prefixed, Read};

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
    pub(super) fn outgoing(&self) -> Option<Outgoing> {
        match self {
            Sent::Whole(b) => Some(Either::Left(Full::new(b.clone()))),
            Sent::Streamed(s) => s
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take()
                .map(|p| Either::Right(Box::new(p))),
        }
    }

    pub(super) fn whole(&self) -> Option<&Bytes> {
        match self {
            Sent::Whole(b) => Some(b),
            Sent::Streamed(_) => None,
        }
    }

    /// The same body for another sending: a whole one's copy; a streamed
    /// one moves (this one is then spent).
    pub(super) fn again(&self) -> Sent {
        match self {
            Sent::Whole(b) => Sent::Whole(b.clone()),
            Sent::Streamed(s) => Sent::Streamed(Box::new(std::sync::Mutex::new(
                s.lock().unwrap_or_else(|p| p.into_inner()).take(),
            ))),
        }
    }
}

/// What became of one upstream call.
pub(super) enum Upstreamed {
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
pub(super) struct Partial {
    pub(super) status: StatusCode,
    pub(super) headers: HeaderMap,
    pub(super) prefix: Bytes,
    pub(super) rest: Incoming,
    /// When it was sent, and when the revision's timeout runs out.
    pub(super) times: (Instant, Instant),
}

/// Sends a call to `target` and reads its answer: whole up to the response
/// limit; beyond it, when `may_stream` (nothing needs it whole), as a
/// [`Upstreamed::Streamed`] answer, else as broken.
#[allow(clippy::too_many_arguments)]
pub(super) async fn forward(
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
    let (uri, direct) = match upstream_uri(target, path_q, wire) {
        Ok(to) => to,
        Err(unanswered) => return unanswered.into(),
    };
    // A gRPC message names its model: renamed for a revision that serves
    // it under another name.
    let body = match (wire, &target.rename, body) {
        (Wire::Grpc, Some((_, served)), Sent::Whole(b)) => {
            Sent::Whole(crate::grpc::renamed(headers, b, served, limit))
        }
        (_, _, body) => body,
    };
    let build = || upstream_request(&method, &uri, headers, target, direct, wire, &body);
    let again = body.whole().is_some();
    let started = Instant::now();
    let call = exchange(inner, direct, wire, build, again, limit, may_stream);
    let answered = tokio::time::timeout(target.timeout, call).await;
    upstreamed(answered, started, target.timeout, wire, limit)
}

/// Why a call was not answered: the revision could not be reached, or the
/// exchange broke (a request that could not be sent, an answer that could
/// not be read).
#[derive(Debug, Clone, Copy)]
enum Unanswered {
    Connect,
    Broken,
}

impl From<Unanswered> for Upstreamed {
    fn from(u: Unanswered) -> Upstreamed {
        match u {
            Unanswered::Connect => Upstreamed::Connect,
            Unanswered::Broken => Upstreamed::Broken,
        }
    }
}

impl Unanswered {
    /// A plain-HTTP upstream's send that failed.
    fn of_send(e: SendError) -> Unanswered {
        match e {
            SendError::Connect => Unanswered::Connect,
            _ => Unanswered::Broken,
        }
    }

    /// A pooled client's request that failed.
    fn of_client(e: &hyper_util::client::legacy::Error) -> Unanswered {
        if e.is_connect() {
            Unanswered::Connect
        } else {
            Unanswered::Broken
        }
    }
}

/// Where a call to `target` is sent, and over which plain-HTTP upstream's
/// own pool, if any. Plain-HTTP REST upstreams are sent the path (origin
/// form) and a `Host` over their own pool; the pooled clients (TLS, and
/// HTTP/2 for gRPC) take the absolute URL.
fn upstream_uri<'t>(
    target: &'t Target,
    path_q: &PathAndQuery,
    wire: Wire,
) -> Result<(Uri, Option<&'t Direct>), Unanswered> {
    let (uri, direct) = match wire {
        Wire::Rest => match &target.direct {
            // The path as it came (no copy, no parsing again).
            Some(d) if d.prefix.is_empty() && target.rename.is_none() => {
                (Ok(Uri::from(path_q.clone())), Some(d))
            }
            Some(d) => (
                format!("{}{}", d.prefix, target.upstream_path(path_q.as_str())).parse(),
                Some(d),
            ),
            None => (
                format!("{}{}", target.base, target.upstream_path(path_q.as_str())).parse(),
                None,
            ),
        },
        Wire::Grpc => {
            // A revision without a gRPC endpoint cannot be reached by gRPC.
            let Some(base) = &target.grpc else {
                return Err(Unanswered::Connect);
            };
            (format!("{base}{path_q}").parse(), None)
        }
    };
    let uri = uri.map_err(|_| Unanswered::Broken)?;
    Ok((uri, direct))
}

/// The request a revision is sent, built on a header map directly (not
/// `Request::builder`, which converts and validates each name and value
/// again): the request path runs this for every request. `None` for a
/// streamed body already sent: it is sent once, so no second request can
/// be built.
fn upstream_request(
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    target: &Target,
    direct: Option<&Direct>,
    wire: Wire,
    body: &Sent,
) -> Option<Request<Outgoing>> {
    let body = body.outgoing()?;
    let out = upstream_headers(headers, target, direct, wire);
    let mut req = Request::new(body);
    *req.method_mut() = method.clone();
    *req.uri_mut() = uri.clone();
    *req.headers_mut() = out;
    Some(req)
}

/// One exchange with the revision: the request sent (built by `build`) and
/// its answer's head and body read (whole within `limit`, or its start when
/// `may_stream`). A pooled connection the upstream closed before answering
/// (uvicorn closes one right after a 500 without saying so) fails the
/// request before any response byte: when the body can be sent `again`
/// (held whole), it is sent once more, on another connection; nothing of
/// the first try was answered. (A streamed body is sent once.)
async fn exchange(
    inner: &Inner,
    direct: Option<&Direct>,
    wire: Wire,
    build: impl Fn() -> Option<Request<Outgoing>>,
    again: bool,
    limit: usize,
    may_stream: bool,
) -> Result<(http::response::Parts, Read), Unanswered> {
    let built = || build().ok_or(Unanswered::Broken);
    match direct {
        Some(d) => {
            let pool = inner.pool(d);
            let (resp, sender) = match pool.send(built()?, false).await {
                Ok(sent) => sent,
                Err(SendError::Http(e)) if again && closed_before_answer(&e) => {
                    inner.counters.retried.fetch_add(1, Ordering::Relaxed);
                    pool.send(built()?, true)
                        .await
                        .map_err(Unanswered::of_send)?
                }
                Err(e) => return Err(Unanswered::of_send(e)),
            };
            let (parts, body) = resp.into_parts();
            let read = crate::stream::read(body, limit, may_stream)
                .await
                .map_err(|_| Unanswered::Broken)?;
            // Read in full: the connection can carry the next request
            // (one still streaming closes when its answer ends).
            if matches!(read, Read::Whole(..)) {
                pool.put(sender);
            }
            Ok((parts, read))
        }
        None => {
            let (client, fresh) = match wire {
                Wire::Rest => (&inner.client, &inner.fresh),
                Wire::Grpc => (&inner.h2, &inner.h2),
            };
            let resp = match client.request(built()?).await {
                Ok(r) => r,
                Err(e) if again && !e.is_connect() && closed_before_answer(&e) => {
                    inner.counters.retried.fetch_add(1, Ordering::Relaxed);
                    let req = built()?;
                    fresh
                        .request(req)
                        .await
                        .map_err(|e| Unanswered::of_client(&e))?
                }
                Err(e) => return Err(Unanswered::of_client(&e)),
            };
            let (parts, body) = resp.into_parts();
            let read = crate::stream::read(body, limit, may_stream)
                .await
                .map_err(|_| Unanswered::Broken)?;
            Ok((parts, read))
        }
    }
}

/// What became of a call, from its exchange within the revision's timeout:
/// an answer (unencoded, for REST), the start of one to stream, or why
/// there was none. `started`: when it was sent.
fn upstreamed(
    answered: Result<Result<(http::response::Parts, Read), Unanswered>, Elapsed>,
    started: Instant,
    timeout: Duration,
    wire: Wire,
    limit: usize,
) -> Upstreamed {
    match answered {
        Err(_) => Upstreamed::Timeout,
        Ok(Err(unanswered)) => unanswered.into(),
        Ok(Ok((parts, Read::Partial(prefix, rest)))) => Upstreamed::Streamed(Box::new(Partial {
            status: parts.status,
            headers: parts.headers,
            prefix,
            rest,
            times: (started, started + timeout),
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
