//! Who a request is, and whether its role allows it: authentication (a
//! named token, the shared token, an OIDC token, or `local` on a tokenless
//! loopback API), the role each request needs, and the audit actor.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rollgate_store::{Role, secret_hash};

use super::error::ApiError;
use super::state::ApiState;
use crate::context::blocking;

/// Who made a request, as the API authenticated it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub name: String,
    pub role: Role,
}

/// The role a request needs: reading is `viewer`; sending labels
/// `labeler` (which an operator or an admin may do too); starting and
/// stopping rollouts `operator`; everything else that changes state
/// `admin` ([`Role::may`]).
pub(super) fn required_role(method: &Method, path: &str) -> Role {
    if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return Role::Viewer;
    }
    let parts: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    match parts.as_slice() {
        ["", "api", "v1", "models", _, "labels"] if *method == Method::POST => Role::Labeler,
        ["", "api", "v1", "rollouts"] if *method == Method::POST => Role::Operator,
        [
            "",
            "api",
            "v1",
            "rollouts",
            _,
            "pause" | "resume" | "abort" | "approve",
        ] => Role::Operator,
        _ => Role::Admin,
    }
}

/// The audit actor of a request: the authenticated identity; a different
/// name the client sends in `x-rollgate-actor` is kept as "on behalf of".
pub(super) fn actor(who: &Identity, headers: &HeaderMap) -> String {
    let claimed: Option<String> = headers
        .get("x-rollgate-actor")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.chars().filter(|c| !c.is_control()).take(64).collect());
    match claimed {
        Some(c) if c != who.name => format!("{} (on behalf of {c})", who.name),
        _ => who.name.clone(),
    }
}

/// Authenticates every request but the health checks, and refuses one
/// whose identity's role is below what it needs (401, 403).
pub(super) async fn authorize(
    State(s): State<ApiState>,
    mut req: Request<Body>,
    next: Next,
) -> Response {
    // A registry's webhook delivery authenticates by its signature.
    if matches!(req.uri().path(), "/healthz" | "/readyz")
        || crate::dashboard::is_dashboard(req.uri().path())
        || (req.method() == Method::POST && super::registries::takes_webhooks(&s, req.uri().path()))
    {
        return next.run(req).await;
    }
    let bearer = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|t| t.trim().to_string());
    let identity = match bearer {
        Some(t)
            if s.token
                .as_ref()
                .is_some_and(|shared| constant_time_eq(t.as_bytes(), shared.as_bytes())) =>
        {
            Some(Identity {
                name: "token".into(),
                role: Role::Admin,
            })
        }
        Some(t) => {
            let hash = secret_hash(&t);
            let named = match blocking(&s.ctx.store, move |st| st.token_by_hash(&hash)).await {
                Ok(found) => found.map(|t| Identity {
                    name: t.name,
                    role: t.role,
                }),
                Err(e) => return ApiError::from(e).into_response(),
            };
            match (named, &s.oidc) {
                (Some(id), _) => Some(id),
                // A JWT: three dot-separated parts.
                (None, Some(oidc)) if t.split('.').count() == 3 => match oidc.identity(&t).await {
                    Ok((name, role)) => Some(Identity { name, role }),
                    Err(e) => {
                        return ApiError::new(
                            StatusCode::UNAUTHORIZED,
                            "unauthorized",
                            format!("OIDC token refused: {e}"),
                        )
                        .into_response();
                    }
                },
                (None, _) => None,
            }
        }
        None if !s.token_required() => Some(Identity {
            name: "local".into(),
            role: Role::Admin,
        }),
        None => None,
    };
    let Some(identity) = identity else {
        return ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a valid bearer token is required",
        )
        .into_response();
    };
    let need = required_role(req.method(), req.uri().path());
    if !identity.role.may(need) {
        return ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden_role",
            format!(
                "{} has role {}; this needs {}",
                identity.name,
                identity.role.as_str(),
                need.as_str()
            ),
        )
        .into_response();
    }
    req.extensions_mut().insert(identity);
    next.run(req).await
}

/// Compares without an early exit, so timing does not reveal the prefix.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
