//! What handlers take from a request, its rejections answered in the error
//! envelope: the JSON body, the path and the query; and what requests to
//! several resources share: a reason for the audit log, a page of a list.

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::{HeaderMap, StatusCode, header};
use serde::Deserialize;
use utoipa::{IntoParams, ToSchema};

use super::error::{ApiError, ApiResult};

/// `Json<T>` whose rejections are API errors naming the problem (serde's
/// message names the field: "missing field `revision`").
#[derive(Debug)]
pub struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;
    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(JsonBody(v)),
            Err(rejection) => Err(bad_json(rejection)),
        }
    }
}

fn bad_json(r: JsonRejection) -> ApiError {
    let status = match r.status() {
        s @ (StatusCode::UNSUPPORTED_MEDIA_TYPE | StatusCode::PAYLOAD_TOO_LARGE) => s,
        _ => StatusCode::BAD_REQUEST,
    };
    ApiError::new(status, error_code(status), r.body_text())
}

/// The envelope's `code` for a status the router itself answers.
fn error_code(status: StatusCode) -> &'static str {
    match status {
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::NOT_FOUND => "not_found",
        _ => "bad_request",
    }
}

/// An axum extractor of the request's parts whose rejections are API
/// errors in the JSON envelope (400, the rejection's text as the message).
macro_rules! enveloped {
    ($(#[$doc:meta])* $name:ident wraps $inner:path) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $name<T>(pub T);

        impl<S: Send + Sync, T: serde::de::DeserializeOwned + Send> FromRequestParts<S>
            for $name<T>
        {
            type Rejection = ApiError;
            async fn from_request_parts(
                parts: &mut axum::http::request::Parts,
                state: &S,
            ) -> Result<Self, ApiError> {
                match <$inner>::from_request_parts(parts, state).await {
                    Ok(v) => Ok($name(v.0)),
                    Err(r) => Err(ApiError::new(
                        StatusCode::BAD_REQUEST,
                        "bad_request",
                        r.body_text(),
                    )),
                }
            }
        }
    };
}

enveloped!(
    /// `Path<T>` whose rejections are API errors in the JSON envelope.
    Path wraps axum::extract::Path<T>
);

enveloped!(
    /// `Query<T>` whose rejections are API errors in the JSON envelope.
    Query wraps axum::extract::Query<T>
);

/// A write's body must be declared JSON ([`guard_host`](super::guard::guard_host) says why). The
/// [`JsonBody`] extractor checks it; handlers that read their body
/// themselves call this. (Not in the middleware: a method the endpoint
/// does not have is a 405, whatever its content type.)
pub(super) fn require_json(headers: &HeaderMap) -> ApiResult<()> {
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.trim()
                .to_ascii_lowercase()
                .starts_with("application/json")
        });
    if json {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "requests that change state carry a JSON body (Content-Type: application/json)",
        ))
    }
}

/// Why an action was taken, for the audit log.
#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = ReasonBody)]
pub(super) struct Reason {
    #[serde(default)]
    pub(super) reason: String,
}

/// A page of a list ordered by name (or, for revisions, by registration).
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct NamePage {
    /// Only entries after this one (by name; for revisions, by id): the
    /// next page after the last entry of the previous one.
    after: Option<String>,
    /// At most this many (default 100).
    #[param(minimum = 1, maximum = 1_000)]
    limit: Option<i64>,
}

impl NamePage {
    /// The page of `all` (already in list order) this query asks for.
    pub(super) fn of<T>(&self, all: Vec<T>, key: impl Fn(&T) -> &str) -> ApiResult<Vec<T>> {
        let limit = page_size(self.limit)?;
        let start = match &self.after {
            None => 0,
            Some(after) => all
                .iter()
                .position(|x| key(x) == after)
                .map_or(all.len(), |i| i + 1),
        };
        Ok(all.into_iter().skip(start).take(limit).collect())
    }
}

/// A page size checked against its bounds: a `limit` out of them is the
/// client's mistake, said so, not silently clamped.
pub(super) fn limit_in(n: i64, max: usize) -> ApiResult<usize> {
    usize::try_from(n)
        .ok()
        .filter(|n| (1..=max).contains(n))
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!("query `limit` must be in 1..={max}, got {n}"),
            )
        })
}

/// A list page's size: `limit`, or 100.
pub(super) fn page_size(limit: Option<i64>) -> ApiResult<usize> {
    limit.map_or(Ok(100), |n| limit_in(n, 1_000))
}
