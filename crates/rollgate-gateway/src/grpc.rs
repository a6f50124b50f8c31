//! gRPC's side of the wire: the Open Inference Protocol's
//! `GRPCInferenceService` over HTTP/2 is routed, split, mirrored and
//! measured like its REST twin (`POST /v2/models/{name}/infer`; the request
//! path takes a call in at `proxy::endpoint`). Only the wire differs, and
//! this is it: the gateway's own answers and statuses, the model's name
//! rewritten in a request message, the outcome read from the `grpc-status`
//! trailer, the predictions from the protobuf answer.

use bytes::Bytes;
use http::header::HeaderMap;
use http::{Response, StatusCode};
use rollgate_oip::{self as oip, Code, GRPC_STATUS};

use crate::body::Body;
use crate::extract::{ExtractError, Prediction};

/// A gRPC answer of the gateway's own: `message`, then status OK.
pub(crate) fn answer(message: &impl prost::Message) -> Response<Body> {
    oip::answer(Body::with_trailers(
        oip::encode(message),
        Some(oip::ok_trailers()),
    ))
}

/// A call the gateway ends itself, with a status and why.
pub(crate) fn status(code: Code, message: &str) -> Response<Body> {
    oip::trailers_only(Body::default(), code, message)
}

/// The request for a revision serving the model as `served`: the message's
/// model name rewritten, sent uncompressed. A body that cannot be read is
/// sent as it came (the upstream answers it as it would have).
pub(crate) fn renamed(headers: &HeaderMap, body: Bytes, served: &str, limit: usize) -> Bytes {
    match oip::read_message(headers, &body, limit).map(|m| oip::rename(&m, served)) {
        Ok(Ok(renamed)) => oip::frame(&renamed),
        _ => body,
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
    let m =
        oip::read_message(headers, body, usize::MAX).map_err(|e| ExtractError(e.to_string()))?;
    let response = <oip::ModelInferResponse as prost::Message>::decode(&m[..])
        .map_err(|e| ExtractError(format!("not a ModelInferResponse: {e}")))?;
    crate::extract::extract_oip(output, &response)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

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
    fn a_gzip_request_is_renamed_and_sent_uncompressed() {
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
        h.insert(oip::GRPC_ENCODING, HeaderValue::from_static("gzip"));
        let out = renamed(&h, Bytes::from(framed), "champion", 1 << 20);
        let (compressed, m) = oip::unframe(&out).expect("framed");
        assert!(!compressed);
        assert_eq!(oip::model_name(m).as_deref(), Ok("champion"));
    }
}
