//! Who may reach the admin API at all: the host guard (the API's own names
//! only; no writes from web pages), and bounded body reads. (Who a request
//! is, and what its role allows, is `auth`.)

use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::{ApiError, ErrorBody, ErrorDetail};
use super::state::ApiState;

/// The API answers only to its own names, and web pages cannot change it.
///
/// A DNS-rebinding page reaches the API under the page's own name, in
/// `Host` (HTTP/1.1) or `:authority` (HTTP/2, no `Host`). So that name
/// must be one the API answers to ([`allowed_hosts`](super::state::allowed_hosts)): for every request
/// but the health checks when no token is required (else a page could
/// read the tokenless loopback API: the audit log, the models), and for
/// every write always. A write also needs no foreign `Origin` and a body
/// declared JSON (a page can send that cross-site only after a CORS
/// preflight, which this API never grants; checked where the body is read:
/// [`JsonBody`](super::extract::JsonBody), [`require_json`](super::extract::require_json)).
pub(super) async fn guard_host(
    State(s): State<ApiState>,
    req: Request<Body>,
    next: Next,
) -> Response {
    let write = !matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS);
    let health = matches!(req.uri().path(), "/healthz" | "/readyz");
    let checked = !s.allowed_hosts.is_empty() && (write || (!s.token_required() && !health));
    if !checked {
        return next.run(req).await;
    }
    let forbidden = |code, message: String| ApiError::new(StatusCode::FORBIDDEN, code, message);
    let allowed = |authority: &str| {
        s.allowed_hosts
            .iter()
            .any(|h| h.eq_ignore_ascii_case(authority))
    };
    // Every name the request gives must be the API's. (A request that
    // gives none is no browser's: every page's request names its host.)
    let names: Vec<String> = req
        .headers()
        .get_all(header::HOST)
        .iter()
        .map(|h| h.to_str().unwrap_or("").to_string())
        .chain(req.uri().authority().map(|a| a.to_string()))
        .collect();
    if let Some(foreign) = names.iter().find(|n| !allowed(n)) {
        return forbidden(
            "forbidden_host",
            format!("Host {foreign:?} does not name this API (add it to [api] allowed_hosts)"),
        )
        .into_response();
    }
    if write && let Some(origin) = req.headers().get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("");
        let authority = origin.split_once("://").map_or("", |(_, a)| a);
        if !allowed(authority) {
            return forbidden(
                "forbidden_origin",
                format!("requests from origin {origin:?} cannot change state"),
            )
            .into_response();
        }
    }
    next.run(req).await
}

/// A request's body must arrive within this long of its headers: a client
/// that trickles one holds a connection no longer than one that trickles
/// its headers (the listener's header timeout).
pub const BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest body the API reads (a model spec, a plan: kilobytes).
pub const BODY_LIMIT: usize = 2 << 20;

/// Reads the whole body, at most [`BODY_LIMIT`] bytes, within
/// [`BODY_TIMEOUT`]: 408 or 413 in the JSON envelope otherwise, and the
/// connection closed (nothing more is read from a client that was cut
/// off).
pub(super) async fn read_body_in_time(req: Request<Body>, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    let refuse = |status, code, message: String| {
        let mut r = ApiError::new(status, code, message).into_response();
        r.headers_mut().insert(
            header::CONNECTION,
            header::HeaderValue::from_static("close"),
        );
        r
    };
    // A registry's webhook is read before it is authenticated (by its
    // signature): a delivery is a few hundred bytes.
    let limit = if super::registries::is_webhook(parts.uri.path()) {
        super::registries::WEBHOOK_BODY_LIMIT
    } else {
        BODY_LIMIT
    };
    match tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(body, limit)).await {
        Ok(Ok(bytes)) => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        Ok(Err(e)) if is_too_large(&e) => refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("the body is over {limit} bytes"),
        ),
        Ok(Err(e)) => refuse(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("the body could not be read: {e}"),
        ),
        Err(_) => refuse(
            StatusCode::REQUEST_TIMEOUT,
            "request_timeout",
            format!(
                "the body did not arrive within {} s",
                BODY_TIMEOUT.as_secs()
            ),
        ),
    }
}

/// The JSON envelope for the refusals hyper answers itself, before the
/// router sees a request: a head too large, malformed, or a URI too long.
pub(super) fn refusal_body(status: u16) -> Option<String> {
    let (code, message) = match status {
        431 => (
            "header_too_large",
            "the request's headers are too large (a bearer token is a few kilobytes)",
        ),
        414 => ("uri_too_long", "the request's URI is too long"),
        400 => ("bad_request", "the request's head is not valid HTTP/1.1"),
        _ => return None,
    };
    serde_json::to_string(&ErrorBody {
        error: ErrorDetail {
            code: code.into(),
            message: message.into(),
        },
    })
    .ok()
}

/// Whether reading a body failed on its length limit.
fn is_too_large(e: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if err.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = err.source();
    }
    false
}
