//! A rollout's history shaped for reading: what happened (every decision
//! but the evaluations, in words), and each gate's evidence over the
//! evaluations as a series against its limit. The dashboard draws it; it
//! is computed here, once, so the page gets a few numbers per evaluation
//! rather than every verdict's full evidence.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use rollgate_core::plot::{Fails, GatePoint, gate_point};
use rollgate_core::{AuditEvent, GateKind, Outcome, Phase, Timestamp, words};
use rollgate_store::AuditRecord;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::error::{ApiError, ApiResult};
use super::extract::{Path, Query};
use super::state::ApiState;
use crate::context::blocking;

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct TimelineQuery {
    /// About this many evaluations per series: evenly spaced, with the last
    /// and every failing one kept (default 2,000).
    #[param(minimum = 10, maximum = 100_000)]
    points: Option<i64>,
}

/// A rollout's history for reading.
#[derive(Serialize, ToSchema)]
pub(super) struct Timeline {
    rollout: i64,
    model: String,
    /// The phase now, in words (`PROMOTED: every stage passed`, `ROLLED
    /// BACK: error_rate shown worse …`).
    phase_line: String,
    /// For an ended rollout: whether the candidate was rejected, or what
    /// its promotion guarantees.
    outcome_lines: Vec<String>,
    /// Every record of the rollout except evaluations, in order.
    events: Vec<TimelineEvent>,
    /// How many evaluations the rollout has had.
    evaluations: u64,
    /// How many of them the audit log recorded (each change of verdict,
    /// every failure, and a summary at least every minute); the series
    /// show these, or an even sample of them as `points` asks.
    recorded: u64,
    /// The latest verdict (the deciding one, for an ended rollout), a line
    /// per gate with its bounds, as `rollout status` prints it.
    last_verdict: Vec<String>,
    /// Each gate's measure over the evaluations.
    gates: Vec<GateSeries>,
}

#[derive(Serialize, ToSchema)]
struct TimelineEvent {
    seq: u64,
    at: Timestamp,
    kind: String,
    actor: String,
    /// The phase it led to (`CANARY 20%`, `PROMOTED`, …), for a rollout
    /// decision.
    #[serde(skip_serializing_if = "Option::is_none")]
    to: Option<String>,
    /// What happened and why, in one line.
    summary: String,
}

#[derive(Serialize, ToSchema)]
struct GateSeries {
    gate: GateKind,
    /// What is plotted (from the latest point).
    measure: String,
    log: bool,
    fails: Fails,
    points: Vec<SeriesPoint>,
}

#[derive(Serialize, ToSchema)]
struct SeriesPoint {
    at: Timestamp,
    /// The stage judged: `SHADOW`, `CANARY 5%`, ….
    stage: String,
    outcome: Outcome,
    #[serde(flatten)]
    point: GatePoint,
}

#[utoipa::path(get, path = "/api/v1/rollouts/{id}/timeline", tag = "rollouts",
    params(("id" = i64, Path, description = "The rollout"), TimelineQuery),
    responses((status = 200, description = "What happened, in words, and each gate's evidence over the evaluations against its limit (what the dashboard plots)", body = Timeline)))]
pub(super) async fn timeline(
    State(s): State<ApiState>,
    Path(id): Path<i64>,
    Query(q): Query<TimelineQuery>,
) -> ApiResult<impl IntoResponse> {
    let points = match q.points {
        None => 2_000,
        Some(n) if (10..=100_000).contains(&n) => n as usize,
        Some(n) => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!("query `points` must be in 10..=100000, got {n}"),
            ));
        }
    };
    let (rollout, (records, recorded)) = blocking(&s.ctx.store, move |st| {
        Ok((st.rollout(id)?, st.audit_sample(id, points as u64)?))
    })
    .await?;
    Ok(Json(build(&rollout, &records, recorded)))
}

/// The timeline of `rollout` from its audit records (as
/// [`rollgate_store::Store::audit_sample`] reads them: the evaluations
/// among them a sample of the `recorded` ones).
fn build(
    rollout: &rollgate_store::RolloutRecord,
    records: &[AuditRecord],
    recorded: u64,
) -> Timeline {
    let plan = &rollout.spec.plan;
    // Bodies are read by reference and only where needed: a long rollout
    // has tens of thousands of evaluation records.
    let event = |rec: &AuditRecord| AuditEvent::deserialize(&rec.body).ok();
    let events = records
        .iter()
        .filter(|rec| rec.kind != "evaluated")
        .map(|rec| TimelineEvent {
            seq: rec.seq,
            at: rec.at,
            kind: rec.kind.clone(),
            actor: rec.actor.clone(),
            to: event(rec).map(|e| words::stage_label(&e.to)),
            summary: crate::notify::summary(rec),
        })
        .collect();
    // The verdict of the latest record that carries one: for an ended
    // rollout, the one that decided. (A pruned body has none left.)
    let deciding = records
        .iter()
        .rev()
        .find(|rec| rec.body.get("verdict").is_some_and(|v| !v.is_null()))
        .and_then(&event)
        .and_then(|e| e.verdict);
    let mut gates: Vec<GateSeries> = Vec::new();
    for rec in records.iter().filter(|rec| rec.kind == "evaluated") {
        let Some(e) = event(rec) else { continue };
        let Some(v) = &e.verdict else { continue };
        for g in &v.gates {
            let Some(point) = gate_point(g, plan) else {
                continue;
            };
            let series = match gates.iter_mut().position(|s| s.gate == g.gate) {
                Some(k) => &mut gates[k],
                None => {
                    gates.push(GateSeries {
                        gate: g.gate,
                        measure: String::new(),
                        log: point.log,
                        fails: point.fails,
                        points: Vec::new(),
                    });
                    gates.last_mut().expect("just pushed")
                }
            };
            series.measure.clone_from(&point.measure);
            series.log = point.log;
            series.fails = point.fails;
            series.points.push(SeriesPoint {
                at: rec.at,
                stage: words::stage_label(&e.from),
                outcome: g.outcome,
                point,
            });
        }
    }
    let last_verdict = deciding
        .as_deref()
        .or(rollout.state.last_verdict.as_deref())
        .map(words::verdict_lines)
        .unwrap_or_default();
    let mut outcome_lines = Vec::new();
    match &rollout.state.phase {
        Phase::RolledBack { reason } => outcome_lines.push(words::rejection_line(reason, plan)),
        Phase::Promoted { manual: false } => outcome_lines.push(words::promotion_line(plan)),
        _ => {}
    }
    Timeline {
        rollout: rollout.id,
        model: rollout.spec.model.clone(),
        phase_line: words::rollout_phase_line(plan, &rollout.state.phase),
        outcome_lines,
        events,
        evaluations: rollout.state.evaluations,
        recorded,
        last_verdict,
        gates,
    }
}
