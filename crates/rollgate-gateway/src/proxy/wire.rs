//! The two wires a call travels (REST, gRPC), and the gateway's own
//! refusals said in the caller's one.

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};

use crate::body::Body;

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
