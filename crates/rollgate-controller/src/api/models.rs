//! Models: registering one, reading, changing and deleting it, and setting
//! its champion. A change to a model's routing reaches the in-process
//! gateway at once.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::{Extension, Json};
use rollgate_store::ModelSpec;
use serde::Deserialize;
use utoipa::{IntoParams, ToSchema};

use super::auth::{Identity, actor};
use super::error::{ApiError, ApiResult, in_body};
use super::extract::{JsonBody, NamePage, Path, Query};
use super::state::ApiState;
use crate::context::{Context, blocking};

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct CreateModel {
    name: String,
    #[serde(default)]
    spec: ModelSpec,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct SetChampion {
    revision: String,
    reason: String,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct DeleteModel {
    /// Why, for the audit log.
    reason: String,
}

#[utoipa::path(post, path = "/api/v1/models", tag = "models",
    request_body = CreateModel,
    responses((status = 201, description = "Registered", body = rollgate_store::Model)))]
pub(super) async fn create_model(
    State(s): State<ApiState>,
    Extension(me): Extension<Identity>,
    headers: HeaderMap,
    JsonBody(b): JsonBody<CreateModel>,
) -> ApiResult<impl IntoResponse> {
    let who = actor(&me, &headers);
    within_host(&s, &b.spec)?;
    let m = blocking(&s.ctx.store, move |st| {
        st.create_model(&b.name, &b.spec, &who)
    })
    .await?;
    Ok((StatusCode::CREATED, Json(m)))
}

/// Replaces a model's spec (validated like a new one; 409 while a rollout
/// is active).
#[utoipa::path(put, path = "/api/v1/models/{name}", tag = "models",
    params(("name" = String, Path, description = "The model")),
    request_body = ModelSpec,
    responses((status = 200, description = "The model with its new spec", body = rollgate_store::Model)))]
pub(super) async fn update_model(
    State(s): State<ApiState>,
    Path(name): Path<String>,
    Extension(me): Extension<Identity>,
    headers: HeaderMap,
    JsonBody(spec): JsonBody<ModelSpec>,
) -> ApiResult<impl IntoResponse> {
    let who = actor(&me, &headers);
    within_host(&s, &spec)?;
    let model = name.clone();
    let m = blocking(&s.ctx.store, move |st| st.update_model(&name, &spec, &who)).await?;
    resync(&s.ctx, &model).await;
    Ok(Json(m))
}

/// Deletes a model with no active rollout (`?reason=` required).
#[utoipa::path(delete, path = "/api/v1/models/{name}", tag = "models",
    params(("name" = String, Path, description = "The model"), DeleteModel),
    responses((status = 204, description = "Deleted")))]
pub(super) async fn delete_model(
    State(s): State<ApiState>,
    Path(name): Path<String>,
    Extension(me): Extension<Identity>,
    headers: HeaderMap,
    Query(q): Query<DeleteModel>,
) -> ApiResult<impl IntoResponse> {
    let who = actor(&me, &headers);
    let model = name.clone();
    blocking(&s.ctx.store, move |st| {
        st.delete_model(&name, &who, &q.reason)
    })
    .await?;
    resync(&s.ctx, &model).await;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/api/v1/models", tag = "models",
    params(NamePage),
    responses((status = 200, description = "Models by name, a page at a time", body = [rollgate_store::Model])))]
pub(super) async fn list_models(
    State(s): State<ApiState>,
    Query(page): Query<NamePage>,
) -> ApiResult<impl IntoResponse> {
    let all = blocking(&s.ctx.store, |st| st.models()).await?;
    Ok(Json(page.of(all, |m| &m.name)?))
}

#[utoipa::path(get, path = "/api/v1/models/{name}", tag = "models",
    params(("name" = String, Path, description = "The model")),
    responses((status = 200, description = "The model", body = rollgate_store::Model)))]
pub(super) async fn show_model(
    State(s): State<ApiState>,
    Path(name): Path<String>,
) -> ApiResult<impl IntoResponse> {
    Ok(Json(
        blocking(&s.ctx.store, move |st| st.model(&name)).await?,
    ))
}

#[utoipa::path(put, path = "/api/v1/models/{name}/champion", tag = "models",
    params(("name" = String, Path, description = "The model")),
    request_body = SetChampion,
    responses((status = 200, description = "The new champion", body = rollgate_store::Revision)))]
pub(super) async fn set_champion(
    State(s): State<ApiState>,
    Path(name): Path<String>,
    Extension(me): Extension<Identity>,
    headers: HeaderMap,
    JsonBody(b): JsonBody<SetChampion>,
) -> ApiResult<impl IntoResponse> {
    let who = actor(&me, &headers);
    let model = name.clone();
    let r = blocking(&s.ctx.store, move |st| {
        st.set_champion(&name, &b.revision, &who, &b.reason)
    })
    .await
    .map_err(in_body(&["revision"]))?;
    resync(&s.ctx, &model).await;
    Ok(Json(r))
}

/// A spec written through the API names only what the host declared
/// ([`crate::host::Host::check`]): 422 saying where to declare it. (One
/// that holds a definition itself is refused by the store's validation,
/// `ModelSpec::validate`, as every write is.)
fn within_host(s: &ApiState, spec: &ModelSpec) -> ApiResult<()> {
    s.ctx
        .host
        .check(spec)
        .map_err(|e| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid", e.to_string()))
}

/// Pushes the store's routing to the in-process gateway right away.
async fn resync(ctx: &Context, model: &str) {
    crate::reconcile::push_model(ctx, model).await;
}
