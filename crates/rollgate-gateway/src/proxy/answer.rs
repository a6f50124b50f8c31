//! Answer classification: what became of a call, counted against the
//! revision that answered it (a success with its latency and predictions, a
//! client's 4xx apart, or a failure by class), and the user's response made
//! from it, naming that revision.

use std::sync::Arc;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Response, StatusCode};
use rollgate_core::FailureClass;

use super::encoding::compressed;
use super::forward::{Partial, Upstreamed};
use super::headers::passed_on;
use super::wire::{Wire, refuse};
use crate::body::Body;
use crate::extract::{Prediction, extract};
use crate::routing::{Route, Target};
use crate::stream::{Streamed, Tally};

/// The header naming the revision that answered.
pub const REVISION_HEADER: &str = "x-rollgate-revision";
const REVISION: HeaderName = HeaderName::from_static(REVISION_HEADER);

/// Records the outcome against `target`. Returns the predictions of a
/// successful answer (empty if the model's output is not read). Every
/// request was counted as arrived before it was sent: one whose outcome
/// never comes (its client went away) stays unresolved, which the
/// controller's error test takes at its worst for a rejection.
/// A successful answer of one prediction is also remembered for labels
/// when the route asks for it and `asked` says to ([`remember`]):
/// `asked` is the gateway, the request's headers (its id) and whether
/// this answer may be joined with a label (a champion's answer in SHADOW
/// only when it was mirrored: only pairs are judged there).
pub(super) fn record(
    (inner, request, joinable): (&crate::Inner, &HeaderMap, bool),
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
            if joinable {
                remember(inner, route, target, unit, request, &preds);
            }
            Some(preds)
        }
    }
}

/// Records `target`'s answer in the answers log, for a label sent later,
/// when the route asks for it and the answer is one prediction.
fn remember(
    inner: &crate::Inner,
    route: &Route,
    target: &Target,
    unit: u16,
    headers: &HeaderMap,
    predictions: &[Prediction],
) {
    if !route.record_answers {
        return;
    }
    let ([p], Some(id)) = (
        predictions,
        headers
            .get(super::request_id::REQUEST_ID)
            .and_then(|v| v.to_str().ok()),
    ) else {
        return;
    };
    // A class longer than any label can never match one: kept cut to one
    // byte past the longest label, so it still counts, as wrong.
    let class = p.class.as_deref().map(|c| {
        let mut end = c.len().min(crate::answers::MAX_CLASS + 1);
        while !c.is_char_boundary(end) {
            end += 1;
        }
        c[..end].to_string()
    });
    let at_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    inner.answers.push(crate::answers::AnswerRecord {
        seq: 0,
        request_id: id.to_string(),
        model: route.name.clone(),
        epoch: route.epoch.clone(),
        revision: target.revision.clone(),
        unit,
        at_ms,
        class,
        value: p.value,
    });
}

/// The user's response. A 2xx with unreadable output is still passed through
/// (the gateway does not judge); it was counted as a failure by `record`.
/// A streamed answer is counted, in `unit`, when it ends (`None`: an
/// unmeasured call).
pub(super) fn finish(
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

fn with_revision(mut r: Response<Body>, revision: Option<&HeaderValue>) -> Response<Body> {
    if let Some(v) = revision {
        r.headers_mut().insert(REVISION, v.clone());
    }
    r
}

/// Marks `answer` as the connection's last.
pub(super) fn closing(answer: &mut Response<Body>) {
    answer
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
}
