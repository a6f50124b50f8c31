//! The controller's own state: whether it is up and its store answers, its
//! metrics, who leads, and each webhook receiver's delivery.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::IntoResponse;
use rollgate_core::Timestamp;
use serde::Serialize;
use utoipa::ToSchema;

use super::error::ApiResult;
use super::state::ApiState;
use crate::context::blocking;

#[derive(Debug, Serialize, ToSchema)]
struct Healthz {
    ok: bool,
}

#[derive(Debug, Serialize, ToSchema)]
struct Readyz {
    ready: bool,
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
    /// Whether this controller keeps its cadence.
    cadence: Cadence,
}

/// How often this controller looks at each active rollout.
#[derive(Debug, Serialize, ToSchema)]
struct Cadence {
    /// Every active rollout is looked at this often when the controller
    /// keeps up (`[controller] tick`).
    tick_seconds: f64,
    /// The longest any rollout of the last pass had waited since its
    /// previous look: above the tick, passes take longer than a tick
    /// (`rollgate_controller_rollout_lag_seconds` has the distribution).
    lag_seconds: f64,
}

#[derive(Debug, Serialize, ToSchema)]
struct LeaderSelf {
    holder: String,
    leading: bool,
    /// `leading`, `standing by`, or `store unreachable` (not leading: a
    /// controller that cannot reach the store cannot renew its lease).
    standing: String,
}

#[utoipa::path(get, path = "/healthz", tag = "controller", security(()),
    responses((status = 200, description = "The process is up", body = Healthz)))]
pub(super) async fn healthz() -> impl IntoResponse {
    Json(Healthz { ok: true })
}

#[utoipa::path(get, path = "/readyz", tag = "controller", security(()),
    responses((status = 200, description = "The store answers", body = Readyz)))]
pub(super) async fn readyz(State(s): State<ApiState>) -> ApiResult<impl IntoResponse> {
    blocking(&s.ctx.store, |st| st.models()).await?;
    Ok(Json(Readyz { ready: true }))
}

/// Prometheus text, or OpenMetrics for a scraper that asks for it.
#[utoipa::path(get, path = "/metrics", tag = "controller",
    responses((status = 200, description = "Prometheus text, or OpenMetrics when the scraper's Accept asks for it", content_type = "text/plain", body = String)))]
pub(super) async fn metrics(State(s): State<ApiState>, headers: HeaderMap) -> impl IntoResponse {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let (body, kind) = s.ctx.metrics.expose(accept);
    ([(header::CONTENT_TYPE, kind)], body)
}

/// Who leads: this controller's standing and the lease as stored.
#[utoipa::path(get, path = "/api/v1/leader", tag = "controller",
    responses((status = 200, description = "Who leads", body = LeaderView)))]
pub(super) async fn leader(State(s): State<ApiState>) -> ApiResult<impl IntoResponse> {
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
        cadence: Cadence {
            tick_seconds: s.ctx.tick.as_secs_f64(),
            lag_seconds: s.ctx.metrics.last_lag(),
        },
    }))
}

/// Each webhook receiver's delivery as this controller sees it: its
/// cursor in the audit log, what it was sent and whether it is failing.
#[utoipa::path(get, path = "/api/v1/notifications", tag = "controller",
    responses((status = 200, description = "Every receiver's delivery (none configured: an empty list)", body = [crate::notify::Delivery])))]
pub(super) async fn notifications(State(s): State<ApiState>) -> impl IntoResponse {
    Json(
        s.ctx
            .notify
            .as_ref()
            .map(|n| n.deliveries())
            .unwrap_or_default(),
    )
}
