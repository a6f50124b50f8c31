//! The audit log: its records a page at a time, exported as JSON Lines,
//! and its chain verified (with an anchor key, against the signed
//! checkpoints too).

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use rollgate_store::{AuditFilter, StoreError, write_jsonl};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::error::{ApiError, ApiResult};
use super::extract::{Query, limit_in};
use super::state::ApiState;
use crate::context::blocking;

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct AuditQuery {
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

/// `GET /api/v1/audit/verify`: the chain, and with an anchor key the
/// signed checkpoints against it.
#[derive(Debug, Serialize, ToSchema)]
struct Verification {
    #[serde(flatten)]
    chain: rollgate_store::ChainReport,
    #[serde(skip_serializing_if = "Option::is_none")]
    anchors: Option<rollgate_store::AnchorReport>,
}

#[utoipa::path(get, path = "/api/v1/audit", tag = "audit",
    params(AuditQuery),
    responses((status = 200, description = "Audit records in chain order, a page at a time", body = [rollgate_store::AuditRecord])))]
pub(super) async fn audit(
    State(s): State<ApiState>,
    Query(q): Query<AuditQuery>,
) -> ApiResult<impl IntoResponse> {
    let f = q.filter()?;
    Ok(Json(blocking(&s.ctx.store, move |st| st.audit(&f)).await?))
}

#[utoipa::path(get, path = "/api/v1/audit/export", tag = "audit",
    params(AuditQuery),
    responses((status = 200, description = "The same records as JSON Lines", content_type = "application/x-ndjson", body = String)))]
pub(super) async fn audit_export(
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
pub(super) async fn audit_verify(State(s): State<ApiState>) -> ApiResult<impl IntoResponse> {
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
