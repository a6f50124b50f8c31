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
//! starts, pauses, resumes and aborts rollouts; `admin` may do everything.
//! The audit actor is the identity; a name the client sends in
//! `x-rollgate-actor` is recorded only as "on behalf of".

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, FromRequestParts, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use rollgate_core::{Input, OperatorAction, Plan, StepError, Timestamp, step};
use rollgate_store::{
    AuditFilter, ModelSpec, RevisionSpec, Role, RolloutRecord, StoreError, secret_hash, write_jsonl,
};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::reconcile::{Context, Error as ReconcileError, blocking, commit};

mod guard;
mod timeline;

/// An API error: status, stable code, message.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }
}

/// The envelope of every error answer (4xx and 5xx).
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable and machine-readable: `bad_request`, `unauthorized`,
    /// `forbidden_role`, `not_found`, `conflict`, `invalid`, … (docs/api.md).
    pub code: String,
    /// For a person; names the field at fault when there is one.
    pub message: String,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code.to_string(),
                message: self.message,
            },
        };
        (self.status, Json(body)).into_response()
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound { .. } => {
                ApiError::new(StatusCode::NOT_FOUND, "not_found", e.to_string())
            }
            StoreError::Conflict(_) => {
                ApiError::new(StatusCode::CONFLICT, "conflict", e.to_string())
            }
            StoreError::Rejected { .. } => {
                ApiError::new(StatusCode::CONFLICT, "revision_rejected", e.to_string())
            }
            StoreError::VersionConflict { .. } => {
                ApiError::new(StatusCode::CONFLICT, "version_conflict", e.to_string())
            }
            StoreError::Fenced { .. } => {
                ApiError::new(StatusCode::CONFLICT, "not_leader", e.to_string())
            }
            StoreError::Invalid(m) => ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid", m),
            StoreError::Database(_) | StoreError::Corrupt(_) => {
                tracing::error!(error = %e, "store failure");
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "internal error",
                )
            }
        }
    }
}

impl From<ReconcileError> for ApiError {
    fn from(e: ReconcileError) -> Self {
        match e {
            ReconcileError::Store(s) => s.into(),
            ReconcileError::Join(m) => {
                tracing::error!(error = %m, "task failure");
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "internal error",
                )
            }
        }
    }
}

impl From<StepError> for ApiError {
    fn from(e: StepError) -> Self {
        match e {
            StepError::ReasonRequired { .. } => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid",
                format!("field `reason`: {e}"),
            ),
            StepError::Terminal { .. } => {
                ApiError::new(StatusCode::CONFLICT, "rollout_finished", e.to_string())
            }
            StepError::AlreadyPaused
            | StepError::NotPaused
            | StepError::NothingToApprove
            | StepError::DryRunCannotPromote => {
                ApiError::new(StatusCode::CONFLICT, "conflict", e.to_string())
            }
        }
    }
}

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

/// Shared state of the API. Its `Debug` never shows the token.
#[derive(Clone)]
pub struct ApiState {
    pub ctx: Context,
    /// The shared bearer token (an admin named `token`).
    pub token: Option<Arc<str>>,
    /// Every request must carry a token, named or shared. Without one (and
    /// only on loopback) a request without a token is the `local` admin.
    pub require_token: bool,
    /// OIDC tokens from the team's identity provider, if configured.
    pub oidc: Option<Arc<crate::oidc::Oidc>>,
    /// `Host` (and `Origin` authority) values a state-changing request may
    /// carry ([`allowed_hosts`]); empty: not checked.
    pub allowed_hosts: Arc<[String]>,
}

/// The names the API at `addr` answers to: its address, and for loopback
/// also `localhost` and both loopback addresses on its port; plus `extra`
/// (e.g. the name a proxy in front of it uses).
pub fn allowed_hosts(addr: SocketAddr, extra: &[String]) -> Arc<[String]> {
    let mut hosts = vec![addr.to_string()];
    if addr.ip().is_loopback() {
        let port = addr.port();
        hosts.extend([
            format!("127.0.0.1:{port}"),
            format!("localhost:{port}"),
            format!("[::1]:{port}"),
        ]);
    }
    hosts.extend(extra.iter().cloned());
    hosts.sort();
    hosts.dedup();
    hosts.into()
}

impl std::fmt::Debug for ApiState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiState")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish_non_exhaustive()
    }
}

type ApiResult<T> = Result<T, ApiError>;

impl ApiState {
    /// Whether a request must carry a token.
    pub fn token_required(&self) -> bool {
        self.require_token || self.token.is_some()
    }
}

/// Who made a request, as the API authenticated it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub name: String,
    pub role: Role,
}

/// The audit actor of a request: the authenticated identity; a different
/// name the client sends in `x-rollgate-actor` is kept as "on behalf of".
fn actor(who: &Identity, headers: &HeaderMap) -> String {
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

/// The role a request needs: reading is `viewer`; starting and stopping
/// rollouts `operator`; everything else that changes state `admin`.
fn required_role(method: &Method, path: &str) -> Role {
    if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return Role::Viewer;
    }
    let parts: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    match parts.as_slice() {
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

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct CreateModel {
    name: String,
    #[serde(default)]
    spec: ModelSpec,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct SetChampion {
    revision: String,
    reason: String,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct StartRollout {
    model: String,
    revision: String,
    #[serde(default)]
    plan: Option<Plan>,
}

/// Why an action was taken, for the audit log.
#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = ReasonBody)]
struct Reason {
    #[serde(default)]
    reason: String,
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct AuditQuery {
    /// Only this model's records.
    model: Option<String>,
    /// Only this rollout's records.
    rollout: Option<i64>,
    /// Only records after this sequence number: the next page after the
    /// last `seq` of the previous one.
    after: Option<i64>,
    /// At most this many records (all of them if absent).
    #[param(minimum = 1, maximum = 1_000_000)]
    limit: Option<i64>,
}

impl AuditQuery {
    fn filter(self) -> ApiResult<AuditFilter> {
        let limit = match self.limit {
            None => None,
            Some(n) => Some(limit_in(n, 1_000_000)? as u64),
        };
        Ok(AuditFilter {
            model: self.model,
            rollout: self.rollout,
            after_seq: self.after.map(|a| a.max(0) as u64),
            limit,
        })
    }
}

/// A page size checked against its bounds: a `limit` out of them is the
/// client's mistake, said so, not silently clamped.
fn limit_in(n: i64, max: usize) -> ApiResult<usize> {
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
fn page_size(limit: Option<i64>) -> ApiResult<usize> {
    limit.map_or(Ok(100), |n| limit_in(n, 1_000))
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct RolloutQuery {
    /// Only rollouts that have not ended.
    #[serde(default)]
    active: bool,
    /// At most this many (default 100).
    #[param(minimum = 1, maximum = 1_000)]
    limit: Option<i64>,
    /// Only rollouts older than this id: the next page after the last id
    /// of the previous one.
    before: Option<i64>,
    /// Only this model's rollouts.
    model: Option<String>,
}

/// A page of a list ordered by name (or, for revisions, by registration).
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct NamePage {
    /// Only entries after this one (by name; for revisions, by id): the
    /// next page after the last entry of the previous one.
    after: Option<String>,
    /// At most this many (default 100).
    #[param(minimum = 1, maximum = 1_000)]
    limit: Option<i64>,
}

impl NamePage {
    /// The page of `all` (already in list order) this query asks for.
    fn of<T>(&self, all: Vec<T>, key: impl Fn(&T) -> &str) -> ApiResult<Vec<T>> {
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

/// An operator action on a rollout (`POST /api/v1/rollouts/{id}/{action}`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
enum RolloutAction {
    Pause,
    Resume,
    Abort,
    Promote,
    Approve,
}

impl RolloutAction {
    const ALL: [RolloutAction; 5] = [
        RolloutAction::Pause,
        RolloutAction::Resume,
        RolloutAction::Abort,
        RolloutAction::Promote,
        RolloutAction::Approve,
    ];

    fn as_str(self) -> &'static str {
        match self {
            RolloutAction::Pause => "pause",
            RolloutAction::Resume => "resume",
            RolloutAction::Abort => "abort",
            RolloutAction::Promote => "promote",
            RolloutAction::Approve => "approve",
        }
    }
}

/// A rollout as the API shows it: the record, with the plan showing only
/// the settings its policy reads ([`Plan::unused_by_policy`]).
fn rollout_json(r: &RolloutRecord) -> ApiResult<Json<serde_json::Value>> {
    let mut v = serde_json::to_value(r).map_err(|e| {
        tracing::error!(error = %e, "rollout did not serialise");
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "internal error",
        )
    })?;
    if let Some(plan) = v.pointer_mut("/spec/plan") {
        for path in r.spec.plan.unused_by_policy() {
            let (parent, leaf) = path.rsplit_once('.').unwrap_or(("", path));
            let parent = if parent.is_empty() {
                Some(&mut *plan)
            } else {
                plan.pointer_mut(&format!("/{}", parent.replace('.', "/")))
            };
            if let Some(serde_json::Value::Object(map)) = parent {
                map.remove(leaf);
            }
        }
    }
    Ok(Json(v))
}

/// `GET /api/v1/audit/verify`: the chain, and with an anchor key the
/// signed checkpoints against it.
#[derive(Debug, Serialize, ToSchema)]
struct Verification {
    #[serde(flatten)]
    chain: rollgate_store::ChainReport,
    #[serde(skip_serializing_if = "Option::is_none")]
    anchors: Option<rollgate_store::AnchorReport>,
}

/// `GET /api/v1/leader`.
#[derive(Debug, Serialize, ToSchema)]
struct LeaderView {
    /// This controller's standing.
    this: LeaderSelf,
    /// The lease as stored (none before any controller took it); when the
    /// store does not answer within a second, as this controller last saw it.
    lease: Option<rollgate_store::Lease>,
    /// Whether the lease above was read from the store now.
    #[serde(default)]
    store_answered: bool,
    /// Since when this controller's campaigns have not reached the store
    /// (epoch ms), if they have not.
    #[serde(skip_serializing_if = "Option::is_none")]
    store_unreachable_since: Option<Timestamp>,
}

#[derive(Debug, Serialize, ToSchema)]
struct LeaderSelf {
    holder: String,
    leading: bool,
    /// `leading`, `standing by`, or `store unreachable` (not leading: a
    /// controller that cannot reach the store cannot renew its lease).
    standing: String,
}

#[derive(Debug, Serialize, ToSchema)]
struct Healthz {
    ok: bool,
}

#[derive(Debug, Serialize, ToSchema)]
struct Readyz {
    ready: bool,
}

/// A new named token: its secret is here and nowhere else.
#[derive(Debug, Serialize, ToSchema)]
struct CreatedToken {
    token: rollgate_store::ApiToken,
    secret: String,
}

/// A rollout in a list: where it stands, not its evidence (the full record
/// with every gate's state is `GET /api/v1/rollouts/{id}`).
#[derive(Debug, Serialize, ToSchema)]
struct RolloutSummary {
    id: i64,
    model: String,
    champion: String,
    candidate: String,
    phase: rollgate_core::Phase,
    paused: bool,
    /// A dry run (plan `mode = "observe"`): its decisions are recorded,
    /// not taken.
    dry_run: bool,
    weight_percent: u32,
    evaluations: u64,
    version: u64,
    created_at: rollgate_core::Timestamp,
    updated_at: rollgate_core::Timestamp,
}

impl From<&RolloutRecord> for RolloutSummary {
    fn from(r: &RolloutRecord) -> Self {
        RolloutSummary {
            id: r.id,
            model: r.spec.model.clone(),
            champion: r.spec.champion.clone(),
            candidate: r.spec.candidate.clone(),
            phase: r.state.phase.clone(),
            paused: r.state.paused,
            dry_run: !r.spec.plan.mode.is_enforce(),
            weight_percent: r.routing.candidate_weight_bp / 100,
            evaluations: r.state.evaluations,
            version: r.version,
            created_at: r.created_at,
            updated_at: r.updated_at,
        }
    }
}

#[utoipa::path(post, path = "/api/v1/models", tag = "models",
    request_body = CreateModel,
    responses((status = 201, description = "Registered", body = rollgate_store::Model)))]
async fn create_model(
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
async fn update_model(
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

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct DeleteModel {
    /// Why, for the audit log.
    reason: String,
}

/// Deletes a model with no active rollout (`?reason=` required).
#[utoipa::path(delete, path = "/api/v1/models/{name}", tag = "models",
    params(("name" = String, Path, description = "The model"), DeleteModel),
    responses((status = 204, description = "Deleted")))]
async fn delete_model(
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
async fn list_models(
    State(s): State<ApiState>,
    Query(page): Query<NamePage>,
) -> ApiResult<impl IntoResponse> {
    let all = blocking(&s.ctx.store, |st| st.models()).await?;
    Ok(Json(page.of(all, |m| &m.name)?))
}

#[utoipa::path(get, path = "/api/v1/models/{name}", tag = "models",
    params(("name" = String, Path, description = "The model")),
    responses((status = 200, description = "The model", body = rollgate_store::Model)))]
async fn show_model(
    State(s): State<ApiState>,
    Path(name): Path<String>,
) -> ApiResult<impl IntoResponse> {
    Ok(Json(
        blocking(&s.ctx.store, move |st| st.model(&name)).await?,
    ))
}

#[utoipa::path(post, path = "/api/v1/models/{name}/revisions", tag = "revisions",
    params(("name" = String, Path, description = "The model")),
    request_body = RevisionSpec,
    responses((status = 201, description = "Registered (or the same spec registered before)", body = rollgate_store::Revision)))]
async fn add_revision(
    State(s): State<ApiState>,
    Path(name): Path<String>,
    Extension(me): Extension<Identity>,
    headers: HeaderMap,
    JsonBody(spec): JsonBody<RevisionSpec>,
) -> ApiResult<impl IntoResponse> {
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
async fn list_revisions(
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
async fn show_revision(
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
async fn unblock(
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

#[utoipa::path(put, path = "/api/v1/models/{name}/champion", tag = "models",
    params(("name" = String, Path, description = "The model")),
    request_body = SetChampion,
    responses((status = 200, description = "The new champion", body = rollgate_store::Revision)))]
async fn set_champion(
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

#[utoipa::path(post, path = "/api/v1/rollouts", tag = "rollouts",
    request_body = StartRollout,
    responses((status = 201, description = "Started", body = RolloutRecord)))]
async fn start_rollout(
    State(s): State<ApiState>,
    Extension(me): Extension<Identity>,
    headers: HeaderMap,
    JsonBody(b): JsonBody<StartRollout>,
) -> ApiResult<impl IntoResponse> {
    let who = actor(&me, &headers);
    let plan = b.plan.unwrap_or_default();
    let name = b.model.clone();
    if let Ok(model) = blocking(&s.ctx.store, move |st| st.model(&name)).await
        && let Some(named) = &model.spec.data_plane
        && let Err(e) = s.ctx.host.data_plane(&model.name, named)
    {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "model_isolated",
            e.to_string(),
        ));
    }
    let r = blocking(&s.ctx.store, move |st| {
        st.create_rollout(&b.model, &b.revision, &plan, &who)
    })
    .await
    .map_err(in_body(&["model", "revision"]))?;
    Ok((StatusCode::CREATED, rollout_json(&r)?))
}

/// Rollouts newest first, as summaries, a page at a time.
#[utoipa::path(get, path = "/api/v1/rollouts", tag = "rollouts",
    params(RolloutQuery),
    responses((status = 200, description = "Rollouts newest first, as summaries, a page at a time", body = [RolloutSummary])))]
async fn list_rollouts(
    State(s): State<ApiState>,
    Query(q): Query<RolloutQuery>,
) -> ApiResult<impl IntoResponse> {
    let limit = page_size(q.limit)?;
    let all = blocking(&s.ctx.store, move |st| st.rollouts(q.active)).await?;
    let page: Vec<RolloutSummary> = all
        .iter()
        .filter(|r| q.before.is_none_or(|b| r.id < b))
        .filter(|r| q.model.as_ref().is_none_or(|m| *m == r.spec.model))
        .take(limit)
        .map(RolloutSummary::from)
        .collect();
    Ok(Json(page))
}

#[utoipa::path(get, path = "/api/v1/rollouts/{id}", tag = "rollouts",
    params(("id" = i64, Path, description = "The rollout")),
    responses((status = 200, description = "The rollout with every gate's evidence; its plan shows only the settings its policy reads", body = RolloutRecord)))]
async fn show_rollout(
    State(s): State<ApiState>,
    Path(id): Path<i64>,
) -> ApiResult<impl IntoResponse> {
    rollout_json(&blocking(&s.ctx.store, move |st| st.rollout(id)).await?)
}

#[utoipa::path(post, path = "/api/v1/rollouts/{id}/{action}", tag = "rollouts",
    params(("id" = i64, Path, description = "The rollout"),
        ("action" = RolloutAction, Path, description = "pause and resume need no body; abort, promote and approve need a reason")),
    request_body(content = Option<Reason>, description = "A reason (required for abort and promote)"),
    responses((status = 200, description = "The rollout after the action", body = RolloutRecord)))]
async fn rollout_action(
    State(s): State<ApiState>,
    Path((id, verb)): Path<(i64, String)>,
    Extension(me): Extension<Identity>,
    headers: HeaderMap,
    body: bytes::Bytes,
) -> ApiResult<impl IntoResponse> {
    require_json(&headers)?;
    // The body is optional here (pause and resume need none).
    let reason = if body.iter().all(u8::is_ascii_whitespace) {
        String::new()
    } else {
        serde_json::from_slice::<Reason>(&body)
            .map_err(|e| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "bad_request",
                    format!("invalid JSON body: {e}"),
                )
            })?
            .reason
    };
    let action = match verb.as_str() {
        "pause" => OperatorAction::Pause,
        "resume" => OperatorAction::Resume,
        "abort" => OperatorAction::Abort { reason },
        "promote" => OperatorAction::Promote { reason },
        "approve" => OperatorAction::Approve { reason },
        other => {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                format!(
                    "no rollout action {other:?}; use pause, resume, abort, promote or approve"
                ),
            ));
        }
    };
    let who = actor(&me, &headers);
    // CAS retry: the controller may commit between our read and our write.
    for _ in 0..5 {
        let rec = blocking(&s.ctx.store, move |st| st.rollout(id)).await?;
        let t = step(
            &rec.spec,
            &rec.state,
            Input::Operator {
                actor: who.clone(),
                action: action.clone(),
            },
            (s.ctx.clock)(),
        )?;
        if let Some(done) = commit(&s.ctx, &rec, t.state, t.effects, &who, None).await? {
            return rollout_json(&done);
        }
    }
    Err(ApiError::new(
        StatusCode::CONFLICT,
        "version_conflict",
        "the rollout kept changing; retry",
    ))
}

#[utoipa::path(get, path = "/api/v1/audit", tag = "audit",
    params(AuditQuery),
    responses((status = 200, description = "Audit records in chain order, a page at a time", body = [rollgate_store::AuditRecord])))]
async fn audit(
    State(s): State<ApiState>,
    Query(q): Query<AuditQuery>,
) -> ApiResult<impl IntoResponse> {
    let f = q.filter()?;
    Ok(Json(blocking(&s.ctx.store, move |st| st.audit(&f)).await?))
}

#[utoipa::path(get, path = "/api/v1/audit/export", tag = "audit",
    params(AuditQuery),
    responses((status = 200, description = "The same records as JSON Lines", content_type = "application/x-ndjson", body = String)))]
async fn audit_export(
    State(s): State<ApiState>,
    Query(q): Query<AuditQuery>,
) -> ApiResult<impl IntoResponse> {
    let f = q.filter()?;
    let records = blocking(&s.ctx.store, move |st| st.audit(&f)).await?;
    let mut out = Vec::new();
    write_jsonl(&records, &mut out).map_err(|_| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "internal error",
        )
    })?;
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], out))
}

/// The chain, and (with an anchor) the chain against the signed
/// checkpoints of the store and of the sink.
#[utoipa::path(get, path = "/api/v1/audit/verify", tag = "audit",
    responses((status = 200, description = "The chain, and the signed checkpoints against it", body = Verification)))]
async fn audit_verify(State(s): State<ApiState>) -> ApiResult<impl IntoResponse> {
    let anchor = s.ctx.anchor.clone();
    let (chain, anchors) =
        blocking(&s.ctx.store, move |st| {
            let chain = st.verify_audit()?;
            let Some(a) = anchor else {
                return Ok((chain, None));
            };
            let (sink, unreadable) = match &a.sink {
                Some(path) => rollgate_store::read_sink(path).map_err(|e| {
                    StoreError::Invalid(format!("checkpoint sink {}: {e}", path.display()))
                })?,
                None => (vec![], vec![]),
            };
            let mut report = rollgate_store::verify_store_anchors(st, &a.key, &sink)?;
            report.problems.extend(unreadable.into_iter().map(|line| {
                rollgate_store::AnchorProblem {
                    seq: 0,
                    problem: format!("line {line} of the checkpoint sink is not a checkpoint"),
                }
            }));
            Ok((chain, Some(report)))
        })
        .await?;
    Ok(Json(Verification { chain, anchors }))
}

/// Each webhook receiver's delivery as this controller sees it: its
/// cursor in the audit log, what it was sent and whether it is failing.
#[utoipa::path(get, path = "/api/v1/notifications", tag = "controller",
    responses((status = 200, description = "Every receiver's delivery (none configured: an empty list)", body = [crate::notify::Delivery])))]
async fn notifications(State(s): State<ApiState>) -> impl IntoResponse {
    Json(
        s.ctx
            .notify
            .as_ref()
            .map(|n| n.deliveries())
            .unwrap_or_default(),
    )
}

/// Who leads: this controller's standing and the lease as stored.
#[utoipa::path(get, path = "/api/v1/leader", tag = "controller",
    responses((status = 200, description = "Who leads", body = LeaderView)))]
async fn leader(State(s): State<ApiState>) -> ApiResult<impl IntoResponse> {
    // Answered within a second whatever the store's state: a controller
    // cut off from it says so rather than going dark.
    let read = tokio::time::timeout(
        std::time::Duration::from_secs(1),
        blocking(&s.ctx.store, |st| st.lease(crate::lead::CONTROLLER_LEASE)),
    )
    .await;
    let seen = s.ctx.leader.seen();
    let leading = s.ctx.leader.fence().is_some();
    let (lease, store_answered) = match read {
        Ok(Ok(lease)) => (lease, true),
        _ => (seen.lease, false),
    };
    let standing = match (leading, store_answered && seen.unreachable_since.is_none()) {
        (true, _) => "leading",
        (false, true) => "standing by",
        (false, false) => "store unreachable",
    };
    Ok(Json(LeaderView {
        this: LeaderSelf {
            holder: s.ctx.leader.holder().to_string(),
            leading,
            standing: standing.into(),
        },
        lease,
        store_answered,
        store_unreachable_since: seen.unreachable_since,
    }))
}

#[utoipa::path(get, path = "/healthz", tag = "controller", security(()),
    responses((status = 200, description = "The process is up", body = Healthz)))]
async fn healthz() -> impl IntoResponse {
    Json(Healthz { ok: true })
}

#[utoipa::path(get, path = "/readyz", tag = "controller", security(()),
    responses((status = 200, description = "The store answers", body = Readyz)))]
async fn readyz(State(s): State<ApiState>) -> ApiResult<impl IntoResponse> {
    blocking(&s.ctx.store, |st| st.models()).await?;
    Ok(Json(Readyz { ready: true }))
}

/// Prometheus text, or OpenMetrics for a scraper that asks for it.
#[utoipa::path(get, path = "/metrics", tag = "controller",
    responses((status = 200, description = "Prometheus text, or OpenMetrics when the scraper's Accept asks for it", content_type = "text/plain", body = String)))]
async fn metrics(State(s): State<ApiState>, headers: HeaderMap) -> impl IntoResponse {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let (body, kind) = s.ctx.metrics.expose(accept);
    ([(header::CONTENT_TYPE, kind)], body)
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such endpoint")
}

async fn method_not_allowed(method: Method) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("{method} is not allowed on this endpoint"),
    )
}

/// An error about something the request's body names: a model or
/// revision that does not exist is the body's mistake (422 `invalid`),
/// not a missing resource at the URL (404).
fn in_body(named: &'static [&'static str]) -> impl Fn(ReconcileError) -> ApiError {
    move |e| match e {
        ReconcileError::Store(e @ StoreError::NotFound { what, .. }) if named.contains(&what) => {
            ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid", e.to_string())
        }
        other => other.into(),
    }
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

/// A write's body must be declared JSON (`guard::guard_host` says why). The
/// [`JsonBody`] extractor checks it; handlers that read their body
/// themselves call this. (Not in the middleware: a method the endpoint
/// does not have is a 405, whatever its content type.)
fn require_json(headers: &HeaderMap) -> ApiResult<()> {
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

/// Who the caller is, and which rollout actions its role allows.
#[derive(Serialize, ToSchema)]
struct WhoAmI {
    name: String,
    role: Role,
    /// The rollout actions (`POST /api/v1/rollouts/{id}/{action}`) this
    /// identity may take: what the dashboard offers as buttons.
    rollout_actions: Vec<RolloutAction>,
}

#[utoipa::path(get, path = "/api/v1/whoami", tag = "tokens",
    responses((status = 200, description = "The caller's identity and role", body = WhoAmI)))]
async fn whoami(Extension(me): Extension<Identity>) -> Json<WhoAmI> {
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
            guard::authorize,
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
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .routes(routes!(metrics))
        .routes(routes!(list_models, create_model))
        .routes(routes!(show_model, update_model, delete_model))
        .routes(routes!(list_revisions, add_revision))
        .routes(routes!(set_champion))
        .routes(routes!(show_revision))
        .routes(routes!(unblock))
        .routes(routes!(list_rollouts, start_rollout))
        .routes(routes!(show_rollout))
        .routes(routes!(rollout_action))
        .routes(routes!(list_tokens, create_token))
        .routes(routes!(revoke_token))
        .routes(routes!(audit))
        .routes(routes!(audit_export))
        .routes(routes!(audit_verify))
        .routes(routes!(leader))
        .routes(routes!(notifications))
        .routes(routes!(whoami))
        .routes(routes!(timeline::timeline))
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

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct CreateToken {
    name: String,
    role: Role,
}

/// Makes a named token. Its secret is in this answer and nowhere else:
/// the store keeps its hash.
#[utoipa::path(post, path = "/api/v1/tokens", tag = "tokens",
    request_body = CreateToken,
    responses((status = 201, description = "The token and its secret (shown only here)", body = CreatedToken)))]
async fn create_token(
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
async fn list_tokens(
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
async fn revoke_token(
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
