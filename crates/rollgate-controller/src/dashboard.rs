//! The web dashboard's static files, embedded in the binary (no CDN, no
//! network at run time) and served without a token: they hold no data.
//! The page reads and acts through `/api/v1` with the caller's own token.

use axum::Router;
use axum::http::header;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;

const INDEX: &str = include_str!("../dashboard/index.html");
const SCRIPT: &str = include_str!("../dashboard/app.js");
const STYLE: &str = include_str!("../dashboard/app.css");

/// Only the page's own files run and only its own origin is reached; no
/// framing (clickjacking).
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

fn file(kind: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, kind),
            (header::CONTENT_SECURITY_POLICY, POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// Whether `path` is one of the dashboard's (served without a token).
pub fn is_dashboard(path: &str) -> bool {
    path == "/" || path == "/dashboard" || path.starts_with("/dashboard/")
}

/// `/` and `/dashboard` lead to the page; its three files.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(|| async { Redirect::to("/dashboard/") }))
        .route("/dashboard", get(|| async { Redirect::to("/dashboard/") }))
        .route(
            "/dashboard/",
            get(|| async { file("text/html; charset=utf-8", INDEX) }),
        )
        .route(
            "/dashboard/app.js",
            get(|| async { file("text/javascript; charset=utf-8", SCRIPT) }),
        )
        .route(
            "/dashboard/app.css",
            get(|| async { file("text/css; charset=utf-8", STYLE) }),
        )
}
