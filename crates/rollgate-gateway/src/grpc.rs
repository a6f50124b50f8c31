//! gRPC inference: the Open Inference Protocol's `GRPCInferenceService`
//! over HTTP/2, routed, split, mirrored and measured like its REST twin
//! (`POST /v2/models/{name}/infer`): the same route, the same sticky key
//! (a metadata header), the same counts. Only the wire differs: the model's
//! name is in the request message, the outcome in the `grpc-status`
//! trailer, the predictions in the protobuf answer.

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use rollgate_core::Protocol;
use rollgate_oip::{self as oip, Code, Method};

use crate::Inner;
use crate::extract::{ExtractError, Prediction};
use crate::proxy::{Body, Wire};

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
const GRPC_ENCODING: HeaderName = HeaderName::from_static("grpc-encoding");

pub(crate) async fn handle(inner: Arc<Inner>, req: Request<Incoming>) -> Response<Body> {
    let Some(method) = Method::of_path(req.uri().path()) else {
        return status(
            Code::Unimplemented,
            "rollgate serves the Open Inference Protocol's inference.GRPCInferenceService only",
        );
    };
    // The server's own health is the gateway's, as over REST.
    match method {
        Method::ServerLive => return answer(&oip::ServerLiveResponse { live: true }),
        Method::ServerReady => return answer(&oip::ServerReadyResponse { ready: true }),
        Method::ServerMetadata => {
            return answer(&oip::ServerMetadataResponse {
                name: "rollgate".into(),
                version: env!("CARGO_PKG_VERSION").into(),
                extensions: Vec::new(),
            });
        }
        Method::ModelReady | Method::ModelMetadata | Method::ModelInfer => {}
    }
    let (parts, body) = req.into_parts();
    // Held whole: the model's name is in it.
    let body = match crate::proxy::read_body(&inner, body, Wire::Grpc, false).await {
        Ok(crate::stream::Read::Whole(body, _)) => body,
        Ok(crate::stream::Read::Partial(..)) => {
            return status(Code::Internal, "a gRPC message is read whole");
        }
        Err(refused) => return refused,
    };
    let limit = inner.limits.max_body_bytes;
    let model = match message(&parts.headers, &body, limit)
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
        Method::ModelInfer => {
            let body = crate::proxy::Sent::Whole(body);
            crate::proxy::predict_admitted(inner, route, parts, body, Wire::Grpc).await
        }
        _ => crate::proxy::passthrough(&inner, &route, &parts, body, Wire::Grpc).await,
    }
}

/// A gRPC answer of the gateway's own: `message`, then status OK.
fn answer(message: &impl prost::Message) -> Response<Body> {
    let mut trailers = HeaderMap::new();
    trailers.insert(GRPC_STATUS, HeaderValue::from_static(Code::Ok.as_header()));
    let mut r = Response::new(Body::with_trailers(oip::encode(message), Some(trailers)));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    r
}

/// A call the gateway ends itself ("trailers-only": status in the headers,
/// no message), as gRPC clients expect instead of an HTTP error status.
pub(crate) fn status(code: Code, message: &str) -> Response<Body> {
    let mut r = Response::new(Body::default());
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    h.insert(GRPC_STATUS, HeaderValue::from_static(code.as_header()));
    if let Ok(v) = HeaderValue::from_str(&percent_encoded(message)) {
        h.insert(GRPC_MESSAGE, v);
    }
    r
}

/// `grpc-message` is percent-encoded: anything outside printable ASCII,
/// and `%` itself.
fn percent_encoded(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for b in message.bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The one message of a unary call's body, uncompressed: a message
/// compressed with gzip (`grpc-encoding: gzip`) is inflated, within
/// `limit` bytes, to be read; other encodings cannot be.
fn message<'a>(headers: &HeaderMap, body: &'a [u8], limit: usize) -> Result<Cow<'a, [u8]>, String> {
    use std::io::Read;
    let (compressed, message) = oip::unframe(body).map_err(|e| e.to_string())?;
    if !compressed {
        return Ok(Cow::Borrowed(message));
    }
    let encoding = headers
        .get(GRPC_ENCODING)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !encoding.eq_ignore_ascii_case("gzip") {
        return Err(format!(
            "messages compressed with {encoding:?} cannot be read"
        ));
    }
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(message)
        .take(limit as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("gzip: {e}"))?;
    if out.len() > limit {
        return Err(format!("the message inflates beyond {limit} bytes"));
    }
    Ok(Cow::Owned(out))
}

/// The request for a revision serving the model as `served`: the message's
/// model name rewritten, sent uncompressed. A body that cannot be read is
/// sent as it came (the upstream answers it as it would have).
pub(crate) fn renamed(headers: &HeaderMap, body: Bytes, served: &str, limit: usize) -> Bytes {
    let Ok(m) = message(headers, &body, limit) else {
        return body;
    };
    match oip::rename(&m, served) {
        Ok(renamed) => {
            let mut framed = Vec::with_capacity(5 + renamed.len());
            framed.push(0);
            framed.extend_from_slice(&(renamed.len() as u32).to_be_bytes());
            framed.extend_from_slice(&renamed);
            Bytes::from(framed)
        }
        Err(_) => body,
    }
}

/// The HTTP status a gRPC answer counts as: its `grpc-status` (from the
/// trailers, or the headers of a trailers-only answer) mapped as
/// [`Code::http_equivalent`] says. An HTTP error is itself; an answer
/// without a status is broken (`Unknown`, a server failure).
pub(crate) fn outcome(
    http: StatusCode,
    headers: &HeaderMap,
    trailers: Option<&HeaderMap>,
) -> StatusCode {
    if http != StatusCode::OK {
        return http;
    }
    let code = trailers
        .and_then(|t| t.get(GRPC_STATUS))
        .or_else(|| headers.get(GRPC_STATUS))
        .map_or(Code::Unknown, |v| Code::of_header(v.as_bytes()));
    StatusCode::from_u16(code.http_equivalent()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// The predictions of a `ModelInferResponse`: the output named `output`,
/// else the first.
pub(crate) fn predictions(
    output: Option<&str>,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Vec<Prediction>, ExtractError> {
    let bad = |m: String| ExtractError(m);
    let m = message(headers, body, usize::MAX).map_err(bad)?;
    let response = <oip::ModelInferResponse as prost::Message>::decode(&m[..])
        .map_err(|e| bad(format!("not a ModelInferResponse: {e}")))?;
    crate::extract::extract_oip(output, &response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_is_read_from_trailers_else_headers() {
        let mut t = HeaderMap::new();
        t.insert(GRPC_STATUS, HeaderValue::from_static("0"));
        let none = HeaderMap::new();
        assert_eq!(outcome(StatusCode::OK, &none, Some(&t)), StatusCode::OK);
        t.insert(GRPC_STATUS, HeaderValue::from_static("14"));
        assert_eq!(
            outcome(StatusCode::OK, &none, Some(&t)),
            StatusCode::SERVICE_UNAVAILABLE
        );
        let mut h = HeaderMap::new();
        h.insert(GRPC_STATUS, HeaderValue::from_static("3"));
        assert_eq!(outcome(StatusCode::OK, &h, None), StatusCode::BAD_REQUEST);
        assert_eq!(
            outcome(StatusCode::OK, &none, None),
            StatusCode::INTERNAL_SERVER_ERROR,
            "no status at all is a broken answer"
        );
        assert_eq!(
            outcome(StatusCode::BAD_GATEWAY, &h, None),
            StatusCode::BAD_GATEWAY
        );
    }

    #[test]
    fn messages_are_percent_encoded() {
        assert_eq!(
            percent_encoded("no model \"x\" 100%"),
            "no model \"x\" 100%25"
        );
        assert_eq!(percent_encoded("é\n"), "%C3%A9%0A");
    }

    #[test]
    fn gzip_messages_are_read_and_others_refused() {
        use std::io::Write;
        let plain = oip::ModelInferRequest {
            model_name: "fraud".into(),
            ..Default::default()
        };
        let bytes = prost::Message::encode_to_vec(&plain);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&bytes).expect("gzip");
        let gz = gz.finish().expect("gzip");
        let mut framed = vec![1];
        framed.extend_from_slice(&(gz.len() as u32).to_be_bytes());
        framed.extend_from_slice(&gz);
        let mut h = HeaderMap::new();
        assert!(message(&h, &framed, 1 << 20).is_err(), "no grpc-encoding");
        h.insert(GRPC_ENCODING, HeaderValue::from_static("gzip"));
        assert_eq!(
            message(&h, &framed, 1 << 20).expect("read").as_ref(),
            &bytes[..]
        );
        assert!(message(&h, &framed, 2).is_err(), "beyond the limit");
        // Renamed: uncompressed, the new name, nothing else changed.
        let out = renamed(&h, Bytes::from(framed), "champion", 1 << 20);
        let (compressed, m) = oip::unframe(&out).expect("framed");
        assert!(!compressed);
        assert_eq!(oip::model_name(m).as_deref(), Ok("champion"));
    }
}
