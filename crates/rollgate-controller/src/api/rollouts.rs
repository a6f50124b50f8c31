//! Rollouts: starting one, listing and reading them, and the operator's
//! actions (pause, resume, abort, promote, approve) through the state
//! machine, committed like the controller's own decisions.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::{Extension, Json};
use rollgate_core::{Input, OperatorAction, Plan, step};
use rollgate_store::RolloutRecord;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::auth::{Identity, actor};
use super::error::{ApiError, ApiResult, in_body};
use super::extract::{JsonBody, Path, Query, Reason, page_size, require_json};
use super::state::ApiState;
use crate::context::blocking;
use crate::reconcile::commit;

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct StartRollout {
    model: String,
    revision: String,
    #[serde(default)]
    plan: Option<Plan>,
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct RolloutQuery {
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

/// An operator action on a rollout (`POST /api/v1/rollouts/{id}/{action}`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(super) enum RolloutAction {
    Pause,
    Resume,
    Abort,
    Promote,
    Approve,
}

impl RolloutAction {
    pub(super) const ALL: [RolloutAction; 5] = [
        RolloutAction::Pause,
        RolloutAction::Resume,
        RolloutAction::Abort,
        RolloutAction::Promote,
        RolloutAction::Approve,
    ];

    pub(super) fn as_str(self) -> &'static str {
        match self {
            RolloutAction::Pause => "pause",
            RolloutAction::Resume => "resume",
            RolloutAction::Abort => "abort",
            RolloutAction::Promote => "promote",
            RolloutAction::Approve => "approve",
        }
    }
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
            weight_percent: r.routing.live_percent(&r.state.phase),
            evaluations: r.state.evaluations,
            version: r.version,
            created_at: r.created_at,
            updated_at: r.updated_at,
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

#[utoipa::path(post, path = "/api/v1/rollouts", tag = "rollouts",
    request_body = StartRollout,
    responses((status = 201, description = "Started", body = RolloutRecord)))]
pub(super) async fn start_rollout(
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
pub(super) async fn list_rollouts(
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
pub(super) async fn show_rollout(
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
pub(super) async fn rollout_action(
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
