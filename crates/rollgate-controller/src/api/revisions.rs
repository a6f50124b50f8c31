//! Revisions: registering a model's immutable revisions, reading them, and
//! unblocking one that rollouts rejected.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::{Extension, Json};
use rollgate_store::RevisionSpec;

use super::auth::{Identity, actor};
use super::error::{ApiError, ApiResult};
use super::extract::{JsonBody, NamePage, Path, Query, Reason};
use super::state::ApiState;
use crate::context::blocking;

#[utoipa::path(post, path = "/api/v1/models/{name}/revisions", tag = "revisions",
    params(("name" = String, Path, description = "The model")),
    request_body = RevisionSpec,
    responses((status = 201, description = "Registered (or the same spec registered before)", body = rollgate_store::Revision)))]
pub(super) async fn add_revision(
    State(s): State<ApiState>,
    Path(name): Path<String>,
    Extension(me): Extension<Identity>,
    headers: HeaderMap,
    JsonBody(spec): JsonBody<RevisionSpec>,
) -> ApiResult<impl IntoResponse> {
    if spec.registry_version.is_some() {
        // The follower's mark: it says which registry version a verdict is
        // written back to, with the registry's token.
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            "revision.registry_version: set only by a model registry's follower \
             (docs/config.md, \"MLflow\"); leave it out",
        ));
    }
    let who = actor(&me, &headers);
    let r = blocking(&s.ctx.store, move |st| {
        st.register_revision(&name, &spec, &who)
    })
    .await?;
    Ok((StatusCode::CREATED, Json(r)))
}

#[utoipa::path(get, path = "/api/v1/models/{name}/revisions", tag = "revisions",
    params(("name" = String, Path, description = "The model"), NamePage),
    responses((status = 200, description = "The model's revisions in the order registered, a page at a time; `after` is a revision id", body = [rollgate_store::Revision])))]
pub(super) async fn list_revisions(
    State(s): State<ApiState>,
    Path(name): Path<String>,
    Query(page): Query<NamePage>,
) -> ApiResult<impl IntoResponse> {
    let all = blocking(&s.ctx.store, move |st| st.revisions(&name)).await?;
    Ok(Json(page.of(all, |r| &r.id)?))
}

#[utoipa::path(get, path = "/api/v1/revisions/{id}", tag = "revisions",
    params(("id" = String, Path, description = "The revision")),
    responses((status = 200, description = "The revision", body = rollgate_store::Revision)))]
pub(super) async fn show_revision(
    State(s): State<ApiState>,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    Ok(Json(
        blocking(&s.ctx.store, move |st| st.revision(&id)).await?,
    ))
}

#[utoipa::path(post, path = "/api/v1/revisions/{id}/unblock", tag = "revisions",
    params(("id" = String, Path, description = "The revision")),
    request_body = Reason,
    responses((status = 200, description = "The revision, startable again", body = rollgate_store::Revision)))]
pub(super) async fn unblock(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    Extension(me): Extension<Identity>,
    headers: HeaderMap,
    JsonBody(b): JsonBody<Reason>,
) -> ApiResult<impl IntoResponse> {
    let who = actor(&me, &headers);
    Ok(Json(
        blocking(&s.ctx.store, move |st| st.unblock(&id, &who, &b.reason)).await?,
    ))
}
