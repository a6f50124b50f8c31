//! The admin API: JSON under `/api/v1`, axum.
//!
//! User mistakes are 4xx with a stable code and a message that names the
//! field; internal failures are 500 with no detail leaked.
//!
//! **Who may act.** A request is made by an identity with a role: a named
//! token (`Authorization: Bearer rgt_…`, made with `POST /api/v1/tokens`,
//! stored hashed, revoked at once), the shared token (`ROLLGATE_TOKEN`, an
//! admin named `token`), an OIDC token from the team's identity provider
//! (`[api.oidc]`: a JWT verified against its JWKS, the role from a claim),
//! or — only when no token is required, which needs a
//! loopback address — `local`, an admin. `viewer` reads; `operator` also
//! starts, pauses, resumes and aborts rollouts; `admin` may do everything;
//! `labeler` only sends labels (as operators and admins may).
//! The audit actor is the identity; a name the client sends in
//! `x-rollgate-actor` is recorded only as "on behalf of".
//!
//! Here the router and its OpenAPI document are assembled from the
//! handlers, one module per resource (`models`, `revisions`, `rollouts`
//! with `timeline`, `audit`, `tokens`, `controller`), on what they share:
//! the error envelope (`error`), the extractors (`extract`), the state
//! (`state`), who a request is (`auth`) and who may reach the API (`guard`).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::middleware;
use axum::routing::get;
use axum::{Json, Router};
use utoipa_axum::{router::OpenApiRouter, routes};

mod audit;
mod auth;
mod controller;
mod error;
mod extract;
mod guard;
mod labels;
mod models;
mod registries;
mod revisions;
mod rollouts;
mod state;
mod timeline;
mod tokens;

pub use auth::Identity;
pub use error::{ApiError, ErrorBody, ErrorDetail};
pub use extract::{JsonBody, Path, Query};
pub use state::{ApiState, allowed_hosts};

use error::{method_not_allowed, not_found};
use rollouts::RolloutAction;

/// The API's router (tests drive it with `oneshot`, no socket). Its
/// routes and its OpenAPI document come from the same handlers.
pub fn router(state: ApiState) -> Router {
    let (routes, spec) = routes_and_spec();
    let spec = Arc::new(spec);
    routes
        .route(
            "/api/v1/openapi.json",
            get(move || std::future::ready(Json(Arc::clone(&spec)))),
        )
        .merge(crate::dashboard::routes())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        // Innermost first: a body is read (within its timeout) only for a
        // request that named the API and authenticated.
        .layer(middleware::from_fn(guard::read_body_in_time))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            auth::authorize,
        ))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            guard::guard_host,
        ))
        // gzip for clients that ask (browsers, Prometheus): a long
        // rollout's timeline or an audit export shrinks several-fold.
        .layer(tower_http::compression::CompressionLayer::new())
        .with_state(state)
}

/// The API's OpenAPI document (served at `/api/v1/openapi.json`).
pub fn openapi() -> utoipa::openapi::OpenApi {
    routes_and_spec().1
}

fn routes_and_spec() -> (Router<ApiState>, utoipa::openapi::OpenApi) {
    use utoipa::{Modify as _, OpenApi as _};
    let (routes, mut spec) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(controller::healthz))
        .routes(routes!(controller::readyz))
        .routes(routes!(controller::metrics))
        .routes(routes!(models::list_models, models::create_model))
        .routes(routes!(
            models::show_model,
            models::update_model,
            models::delete_model
        ))
        .routes(routes!(revisions::list_revisions, revisions::add_revision))
        .routes(routes!(models::set_champion))
        .routes(routes!(labels::send_labels))
        .routes(routes!(revisions::show_revision))
        .routes(routes!(revisions::unblock))
        .routes(routes!(rollouts::list_rollouts, rollouts::start_rollout))
        .routes(routes!(rollouts::show_rollout))
        .routes(routes!(rollouts::rollout_action))
        .routes(routes!(tokens::list_tokens, tokens::create_token))
        .routes(routes!(tokens::revoke_token))
        .routes(routes!(audit::audit))
        .routes(routes!(audit::audit_export))
        .routes(routes!(audit::audit_verify))
        .routes(routes!(controller::leader))
        .routes(routes!(controller::notifications))
        .routes(routes!(tokens::whoami))
        .routes(routes!(timeline::timeline))
        .routes(routes!(registries::webhook))
        .split_for_parts();
    // After the paths are in: the conventions apply to every operation.
    Conventions.modify(&mut spec);
    (routes, spec)
}

#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "rollgate admin API",
        description = "Models, revisions, rollouts, tokens and the audit log. See docs/api.md."
    ),
    security(("bearer" = [])),
    components(schemas(ErrorBody, RolloutAction))
)]
struct ApiDoc;

/// What every operation shares: bearer authentication, and the error
/// envelope for any status it does not list.
struct Conventions;

impl utoipa::Modify for Conventions {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        use utoipa::openapi::{RefOr, ResponseBuilder, content::ContentBuilder};
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        let error = ResponseBuilder::new()
            .description("An error, in the envelope (docs/api.md lists the codes)")
            .content(
                "application/json",
                ContentBuilder::new()
                    .schema(Some(utoipa::openapi::Ref::from_schema_name("ErrorBody")))
                    .build(),
            )
            .build();
        for item in doc.paths.paths.values_mut() {
            for op in [
                &mut item.get,
                &mut item.put,
                &mut item.post,
                &mut item.delete,
            ]
            .into_iter()
            .flatten()
            {
                op.responses
                    .responses
                    .entry("default".into())
                    .or_insert_with(|| RefOr::T(error.clone()));
            }
        }
    }
}

/// Refuses to expose an unauthenticated API beyond loopback.
pub fn check_binding(addr: SocketAddr, state: &ApiState) -> Result<(), String> {
    let shared_empty = state.token.as_ref().is_some_and(|t| t.trim().is_empty());
    if !addr.ip().is_loopback() && (!state.token_required() || shared_empty) {
        return Err(format!(
            "the admin API on {addr} is not loopback: set ROLLGATE_TOKEN, [api] token_file \
             or [api] require_token = true (with named tokens)"
        ));
    }
    Ok(())
}

/// Serves the API until `shutdown` resolves: over TLS when `tls` is set
/// (HTTP/2 offered by ALPN), else plain HTTP/1.1 or h2c.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: ApiState,
    tls: Option<rollgate_net::ServerTls>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let addr = listener.local_addr()?;
    check_binding(addr, &state).map_err(std::io::Error::other)?;
    let router = router(state);
    let serving = rollgate_net::Serving {
        header_timeout: std::time::Duration::from_secs(10),
        drain_timeout: std::time::Duration::from_secs(30),
        tls,
        refusal_body: Some(guard::refusal_body),
    };
    let make = move || hyper_util::service::TowerToHyperService::new(router.clone());
    rollgate_net::serve(listener, serving, make, shutdown).await
}
