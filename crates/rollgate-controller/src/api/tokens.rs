//! Named tokens (made with their secret shown once, listed, revoked) and
//! who the caller is, with the rollout actions its role allows.

use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::IntoResponse;
use axum::{Extension, Json};
use rollgate_store::{Role, secret_hash};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::auth::{Identity, actor, required_role};
use super::error::ApiResult;
use super::extract::{JsonBody, NamePage, Path, Query};
use super::rollouts::RolloutAction;
use super::state::ApiState;
use crate::context::blocking;

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct CreateToken {
    name: String,
    role: Role,
}

/// A new named token: its secret is here and nowhere else.
#[derive(Debug, Serialize, ToSchema)]
struct CreatedToken {
    token: rollgate_store::ApiToken,
    secret: String,
}

/// Makes a named token. Its secret is in this answer and nowhere else:
/// the store keeps its hash.
#[utoipa::path(post, path = "/api/v1/tokens", tag = "tokens",
    request_body = CreateToken,
    responses((status = 201, description = "The token and its secret (shown only here)", body = CreatedToken)))]
pub(super) async fn create_token(
    State(s): State<ApiState>,
    Extension(me): Extension<Identity>,
    headers: HeaderMap,
    JsonBody(b): JsonBody<CreateToken>,
) -> ApiResult<impl IntoResponse> {
    let who = actor(&me, &headers);
    let secret = new_secret();
    let hash = secret_hash(&secret);
    let t = blocking(&s.ctx.store, move |st| {
        st.create_token(&b.name, b.role, &hash, &who)
    })
    .await?;
    Ok((StatusCode::CREATED, Json(CreatedToken { token: t, secret })))
}

/// A token secret: `rgt_` and 256 random bits in hex.
fn new_secret() -> String {
    use rand::Rng;
    let bytes: [u8; 32] = rand::rng().random();
    format!("rgt_{}", hex::encode(bytes))
}

#[utoipa::path(get, path = "/api/v1/tokens", tag = "tokens",
    params(NamePage),
    responses((status = 200, description = "Tokens by name (never their secrets), a page at a time", body = [rollgate_store::ApiToken])))]
pub(super) async fn list_tokens(
    State(s): State<ApiState>,
    Query(page): Query<NamePage>,
) -> ApiResult<impl IntoResponse> {
    let all = blocking(&s.ctx.store, |st| st.tokens()).await?;
    Ok(Json(page.of(all, |t| &t.name)?))
}

/// Revokes a token: the next request that carries it is refused.
#[utoipa::path(delete, path = "/api/v1/tokens/{name}", tag = "tokens",
    params(("name" = String, Path, description = "The token's name")),
    responses((status = 200, description = "The revoked token", body = rollgate_store::ApiToken)))]
pub(super) async fn revoke_token(
    State(s): State<ApiState>,
    Path(name): Path<String>,
    Extension(me): Extension<Identity>,
    headers: HeaderMap,
) -> ApiResult<impl IntoResponse> {
    let who = actor(&me, &headers);
    Ok(Json(
        blocking(&s.ctx.store, move |st| st.revoke_token(&name, &who)).await?,
    ))
}

/// Who the caller is, and which rollout actions its role allows.
#[derive(Serialize, ToSchema)]
pub(super) struct WhoAmI {
    name: String,
    role: Role,
    /// The rollout actions (`POST /api/v1/rollouts/{id}/{action}`) this
    /// identity may take: what the dashboard offers as buttons.
    rollout_actions: Vec<RolloutAction>,
}

#[utoipa::path(get, path = "/api/v1/whoami", tag = "tokens",
    responses((status = 200, description = "The caller's identity and role", body = WhoAmI)))]
pub(super) async fn whoami(Extension(me): Extension<Identity>) -> Json<WhoAmI> {
    let rollout_actions = RolloutAction::ALL
        .into_iter()
        .filter(|a| {
            let path = format!("/api/v1/rollouts/1/{}", a.as_str());
            me.role >= required_role(&Method::POST, &path)
        })
        .collect();
    Json(WhoAmI {
        name: me.name,
        role: me.role,
        rollout_actions,
    })
}
