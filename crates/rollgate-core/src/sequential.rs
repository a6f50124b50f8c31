//! The `sequential` policy: anytime-valid gates over the whole rollout.
//!
//! Every bound here stays valid however often it is looked at (Ville's
//! inequality), so the controller may evaluate after every snapshot and
//! across weight changes without spending `α` again: one test runs from the
//! first stage to the decision. `α` (`plan.sequential.alpha`) is split
//! evenly over the metrics that can fail anywhere in the rollout
//! ([`metric_alpha`], Bonferroni); promotion needs every gate to pass, which
//! needs no adjustment (intersection–union).
//!
//! - Errors: FAIL by the conditional-binomial e-process
//!   ([`ConditionalBinomial`]: null "candidate failure rate ≤
//!   `max_error_ratio` × champion's");
//!   PASS when the Robbins confidence sequences show `candidate − champion ≤
//!   margin`.
//! - Latency: Howard & Ramdas' confidence sequences for the median and the
//!   tail quantile of each arm (a beta-binomial mixture on the count below
//!   the quantile); the rule stays "median AND tail regressed" to fail.
//! - Shadow agreement and high-confidence flips: FAIL by a one-sided
//!   beta-binomial mixture test of "rate within budget" (disagreement ≤
//!   `1 − min_agreement`, flips ≤ `max_flip_rate`); PASS by Robbins
//!   confidence sequences.
//! - Prediction shift: Robbins confidence sequences on each class rate.
//!
//! References: Robbins (1970); Lindon & Malek, NeurIPS 2022; Howard,
//! Ramdas, McAuliffe & Sekhon, Ann. Statist. 2021; Howard & Ramdas,
//! Bernoulli 2022.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::anytime::{ConditionalBinomial, quantile_cs_ranks, rate_exceeds, robbins_cs};
use crate::gate::{
    ClassShift, Counts, Evidence, GateKind, GateVerdict, Outcome, QuantileComparison, Reason,
    judge_quantile, latency_missing, sample_floor,
};
use crate::histogram::LatencyHistogram;
use crate::plan::{Advance, Plan};
use crate::snapshot::{RevisionStats, Snapshot};
use crate::stage::{ChampionHealth, StageKind, StageReason, StageVerdict, champion_health};
use crate::stats::{Interval, rate};

/// The sequential test's state: small, serialisable, restored exactly.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SequentialState {
    /// Cumulative stats when the first stage started: the test's origin.
    pub origin: Option<Snapshot>,
    /// Both arms' request and failure counts at the previous look, for the
    /// e-process increments.
    #[serde(default)]
    pub last: Option<ErrorCounts>,
    pub errors: ConditionalBinomial,
    /// Looks taken (evaluations with stats).
    pub looks: u64,
}

/// Cumulative requests and failures of both arms.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorCounts {
    pub champion_requests: u64,
    pub champion_failures: u64,
    pub candidate_requests: u64,
    pub candidate_failures: u64,
}

impl ErrorCounts {
    fn of(s: &Snapshot, champion: &str, candidate: &str) -> Self {
        let (h, c) = (s.revision(champion), s.revision(candidate));
        ErrorCounts {
            champion_requests: h.requests(),
            champion_failures: h.failure_count(),
            candidate_requests: c.requests(),
            candidate_failures: c.failure_count(),
        }
    }

    /// `self − earlier`, or `None` if any counter went backwards.
    fn since(&self, earlier: &ErrorCounts) -> Option<ErrorCounts> {
        Some(ErrorCounts {
            champion_requests: self
                .champion_requests
                .checked_sub(earlier.champion_requests)?,
            champion_failures: self
                .champion_failures
                .checked_sub(earlier.champion_failures)?,
            candidate_requests: self
                .candidate_requests
                .checked_sub(earlier.candidate_requests)?,
            candidate_failures: self
                .candidate_failures
                .checked_sub(earlier.candidate_failures)?,
        })
    }
}

/// What a stage's sample floors count, per arm: the stage's own traffic.
#[derive(Debug, Clone, Copy, Default)]
struct StageTally {
    candidate: ArmTally,
    champion: ArmTally,
    pairs: u64,
}

#[derive(Debug, Clone, Copy, Default)]
struct ArmTally {
    requests: u64,
    latencies: u64,
    predictions: u64,
}

impl ArmTally {
    fn of(s: &RevisionStats) -> Self {
        ArmTally {
            requests: s.requests(),
            latencies: s.latency().len(),
            predictions: s.predictions().values().sum(),
        }
    }

    fn since(&self, e: &ArmTally) -> Option<ArmTally> {
        Some(ArmTally {
            requests: self.requests.checked_sub(e.requests)?,
            latencies: self.latencies.checked_sub(e.latencies)?,
            predictions: self.predictions.checked_sub(e.predictions)?,
        })
    }
}

impl StageTally {
    fn of(s: &Snapshot, champion: &str, candidate: &str) -> Self {
        StageTally {
            candidate: ArmTally::of(&s.revision(candidate)),
            champion: ArmTally::of(&s.revision(champion)),
            pairs: s.pairs_for(candidate).map_or(0, |p| p.pairs()),
        }
    }

    /// The counts since `origin`; nothing if counters went backwards (a
    /// gateway restarted): evidence is lost, never invented.
    fn since(&self, origin: &StageTally) -> StageTally {
        let diff = || {
            Some(StageTally {
                candidate: self.candidate.since(&origin.candidate)?,
                champion: self.champion.since(&origin.champion)?,
                pairs: self.pairs.checked_sub(origin.pairs)?,
            })
        };
        diff().unwrap_or_default()
    }
}

impl SequentialState {
    /// A test starting at `origin`, with `plan`'s error margin.
    pub fn new(plan: &Plan, origin: Option<Snapshot>) -> Self {
        SequentialState {
            last: None,
            origin,
            errors: ConditionalBinomial::new(plan.sequential.max_error_ratio),
            looks: 0,
        }
    }
}

fn verdict(gate: GateKind, outcome: Outcome, reason: Reason, evidence: Evidence) -> GateVerdict {
    GateVerdict {
        gate,
        outcome,
        reason,
        evidence,
    }
}

/// Error rate: e-process to fail, confidence sequences to pass.
fn error_gate(
    plan: &Plan,
    errors: &ConditionalBinomial,
    alpha: f64,
    c: &RevisionStats,
    h: &RevisionStats,
) -> GateVerdict {
    let cfg = &plan.gates.error_rate;
    let cand = robbins_cs(c.failure_count(), c.requests(), alpha / 2.0);
    let champ = robbins_cs(h.failure_count(), h.requests(), alpha / 2.0);
    let difference = Interval {
        lower: (cand.lower - champ.upper).max(-1.0),
        upper: (cand.upper - champ.lower).min(1.0),
    };
    let evidence = Evidence::ErrorRate {
        candidate: counts(c),
        champion: counts(h),
        difference,
        margin: cfg.margin,
        candidate_rate: cand,
        champion_rate: champ,
    };
    let (outcome, reason) = if errors.rejects(alpha) {
        (Outcome::Fail, Reason::Breach)
    } else if let Some(r) = sample_floor(c.requests(), h.requests(), cfg.min_requests) {
        (Outcome::Wait, r)
    } else if difference.upper <= cfg.margin {
        (Outcome::Pass, Reason::WithinBudget)
    } else {
        (Outcome::Wait, Reason::Inconclusive)
    };
    verdict(GateKind::ErrorRate, outcome, reason, evidence)
}

fn counts(s: &RevisionStats) -> Counts {
    Counts {
        failures: s.failure_count(),
        requests: s.requests(),
        rate: rate(s.failure_count(), s.requests()),
    }
}

/// Observations around which the mixture boundaries are tightest: rollouts
/// are decided on tens to hundreds of requests or pairs per arm.
const DESIGN_SAMPLES: f64 = 100.0;

/// One quantile of both arms with anytime-valid bounds, each arm's at
/// level `alpha`.
fn compare(
    q: f64,
    c: &LatencyHistogram,
    h: &LatencyHistogram,
    alpha: f64,
    ratio: f64,
    ms: f64,
) -> Option<QuantileComparison> {
    let bounds = |x: &LatencyHistogram| {
        x.quantile_rank_bounds(q, quantile_cs_ranks(q, x.len(), alpha, DESIGN_SAMPLES))
    };
    Some(judge_quantile(q, bounds(c)?, bounds(h)?, ratio, ms))
}

/// Latency: fails iff the median AND the tail regressed. A false failure
/// needs one of the two comparisons to be wrong where the truth did not
/// regress; each comparison is wrong only if one of its two arms' sequences
/// misses, so each arm's sequence runs at `alpha / 2`.
fn latency_gate(plan: &Plan, alpha: f64, c: &RevisionStats, h: &RevisionStats) -> GateVerdict {
    let cfg = &plan.gates.latency;
    let a = alpha / 2.0;
    let median = compare(
        0.5,
        c.latency(),
        h.latency(),
        a,
        cfg.median_ratio,
        cfg.median_ms,
    );
    let tail = compare(
        cfg.tail_quantile,
        c.latency(),
        h.latency(),
        a,
        cfg.tail_ratio,
        cfg.tail_ms,
    );
    let evidence = Evidence::Latency {
        candidate_successes: c.successes(),
        champion_successes: h.successes(),
        median,
        tail,
    };
    let (outcome, reason) = if let Some(r) = latency_missing(c, h) {
        (Outcome::Wait, r)
    } else {
        match (median, tail) {
            (Some(m), Some(t)) if m.regressed && t.regressed => (Outcome::Fail, Reason::Breach),
            _ => match sample_floor(c.latency().len(), h.latency().len(), cfg.min_requests) {
                Some(r) => (Outcome::Wait, r),
                None => match (median, tail) {
                    (Some(m), Some(t)) if m.not_regressed || t.not_regressed => {
                        (Outcome::Pass, Reason::WithinBudget)
                    }
                    _ => (Outcome::Wait, Reason::Inconclusive),
                },
            },
        }
    };
    verdict(GateKind::Latency, outcome, reason, evidence)
}

/// Whether `k` of `n` show the rate above `p0` at level `alpha`.
fn shown_above(k: u64, n: u64, p0: f64, alpha: f64) -> bool {
    rate_exceeds(k, n, p0, alpha, DESIGN_SAMPLES)
}

/// Shadow agreement and high-confidence flips, two metrics each at
/// `alpha`: FAIL when disagreement or flips are shown above budget, PASS
/// when both are shown within it (one-sided beta-binomial mixtures).
fn shadow_gate(
    plan: &Plan,
    alpha: f64,
    window: &Snapshot,
    candidate: &str,
    c: &RevisionStats,
    h: &RevisionStats,
) -> GateVerdict {
    let cfg = &plan.gates.shadow;
    let p = window.pairs_for(candidate).copied().unwrap_or_default();
    let (disagreements, confident) = (p.pairs() - p.agreements(), p.champion_confident());
    // Shown for reading; the decisions are the one-sided tests below.
    let agreement = robbins_cs(p.agreements(), p.pairs(), alpha);
    let flip_rate = robbins_cs(p.confident_flips(), confident, alpha);
    let evidence = Evidence::ShadowAgreement {
        pairs: p.pairs(),
        agreements: p.agreements(),
        agreement,
        min_agreement: cfg.min_agreement,
        champion_confident: p.champion_confident(),
        confident_flips: p.confident_flips(),
        flip_rate,
        max_flip_rate: cfg.max_flip_rate,
        mirror_dropped: p.mirror_dropped(),
    };
    let (outcome, reason) = if c.successes() > 0 && h.successes() > 0 && p.pairs() == 0 {
        (
            Outcome::Wait,
            Reason::MetricsMissing {
                metric: "pairs".into(),
            },
        )
    } else if shown_above(disagreements, p.pairs(), 1.0 - cfg.min_agreement, alpha)
        || shown_above(p.confident_flips(), confident, cfg.max_flip_rate, alpha)
    {
        (Outcome::Fail, Reason::Breach)
    } else if p.pairs() < cfg.min_pairs {
        (
            Outcome::Wait,
            Reason::InsufficientSamples {
                have: p.pairs(),
                need: cfg.min_pairs,
            },
        )
    } else if shown_above(p.agreements(), p.pairs(), cfg.min_agreement, alpha)
        && (cfg.max_flip_rate >= 1.0
            || shown_above(
                confident - p.confident_flips(),
                confident,
                1.0 - cfg.max_flip_rate,
                alpha,
            ))
    {
        (Outcome::Pass, Reason::WithinBudget)
    } else {
        (Outcome::Wait, Reason::Inconclusive)
    };
    verdict(GateKind::ShadowAgreement, outcome, reason, evidence)
}

fn shift_gate(plan: &Plan, alpha: f64, c: &RevisionStats, h: &RevisionStats) -> GateVerdict {
    let cfg = &plan.gates.prediction_shift;
    let total = |s: &RevisionStats| s.predictions().values().sum::<u64>();
    let (nc, nh) = (total(c), total(h));
    let classes: std::collections::BTreeSet<&String> = c
        .predictions()
        .keys()
        .chain(h.predictions().keys())
        .collect();
    let a = alpha / (2.0 * classes.len().max(1) as f64);
    let shifts: Vec<ClassShift> = classes
        .iter()
        .map(|&k| {
            let kc = c.predictions().get(k).copied().unwrap_or(0);
            let kh = h.predictions().get(k).copied().unwrap_or(0);
            let (ic, ih) = (robbins_cs(kc, nc, a), robbins_cs(kh, nh, a));
            ClassShift {
                class: k.clone(),
                candidate_rate: rate(kc, nc),
                champion_rate: rate(kh, nh),
                difference: Interval {
                    lower: ic.lower - ih.upper,
                    upper: ic.upper - ih.lower,
                },
            }
        })
        .collect();
    let (outcome, reason) = if (c.successes() > 0 && nc == 0) || (h.successes() > 0 && nh == 0) {
        (
            Outcome::Wait,
            Reason::MetricsMissing {
                metric: "predictions".into(),
            },
        )
    } else if shifts
        .iter()
        .any(|s| s.difference.lower > cfg.margin || s.difference.upper < -cfg.margin)
    {
        (Outcome::Fail, Reason::Breach)
    } else if let Some(r) = sample_floor(nc, nh, cfg.min_predictions) {
        (Outcome::Wait, r)
    } else if shifts
        .iter()
        .all(|s| s.difference.lower >= -cfg.margin && s.difference.upper <= cfg.margin)
    {
        (Outcome::Pass, Reason::WithinBudget)
    } else {
        (Outcome::Wait, Reason::Inconclusive)
    };
    verdict(
        GateKind::PredictionShift,
        outcome,
        reason,
        Evidence::PredictionShift {
            candidate_predictions: nc,
            champion_predictions: nh,
            margin: cfg.margin,
            classes: shifts,
        },
    )
}

/// The sample floor of `gate` over the current stage's own traffic.
fn stage_floor(plan: &Plan, gate: GateKind, w: &StageTally) -> Option<Reason> {
    let g = &plan.gates;
    let (c, h) = (&w.candidate, &w.champion);
    match gate {
        GateKind::ErrorRate | GateKind::GuardRails => {
            sample_floor(c.requests, h.requests, g.error_rate.min_requests)
        }
        GateKind::Latency => sample_floor(c.latencies, h.latencies, g.latency.min_requests),
        GateKind::ShadowAgreement => {
            (w.pairs < g.shadow.min_pairs).then_some(Reason::InsufficientSamples {
                have: w.pairs,
                need: g.shadow.min_pairs,
            })
        }
        GateKind::PredictionShift => sample_floor(
            c.predictions,
            h.predictions,
            g.prediction_shift.min_predictions,
        ),
    }
}

/// `α` per metric: the plan's `α` split evenly (Bonferroni) over every
/// metric that can fail anywhere in the rollout — fixed for the whole
/// rollout, so the chance of any false failure stays at most `α` however
/// the stages run.
pub fn metric_alpha(plan: &Plan) -> f64 {
    let g = &plan.gates;
    let metrics = usize::from(g.error_rate.enabled)
        + usize::from(g.latency.enabled)
        + 2 * usize::from(plan.shadow.enabled)
        + usize::from(g.prediction_shift.enabled);
    plan.sequential.alpha / metrics.max(1) as f64
}

/// What one sequential look is judged on.
#[derive(Debug, Clone, Copy)]
pub struct SequentialInput<'a> {
    pub stage: StageKind,
    /// The cumulative snapshot now; `None` if no stats could be read.
    pub current: Option<&'a Snapshot>,
    /// The cumulative snapshot when the current stage started: each stage
    /// must gather its own sample floor before it may pass, so a stage whose
    /// traffic stopped never passes on earlier stages' evidence.
    pub stage_origin: Option<&'a Snapshot>,
    pub champion: &'a str,
    pub candidate: &'a str,
    /// Time since the current stage's clock started.
    pub elapsed: Duration,
}

/// Takes one look: updates the test state and judges the stage.
/// A `Fail` here is final (its error is controlled by `α`): the caller rolls
/// back at once.
pub fn evaluate(plan: &Plan, state: &mut SequentialState, input: &SequentialInput) -> StageVerdict {
    let elapsed_ms = input.elapsed.as_millis() as u64;
    let base =
        |outcome, reason: StageReason, champion: Option<ChampionHealth>, gates| StageVerdict {
            stage: input.stage,
            outcome,
            gross: matches!(reason, StageReason::Breach { .. }),
            reason,
            elapsed_ms,
            champion,
            gates,
            confirmation: None,
        };
    let Some(current) = input.current else {
        return if input.elapsed >= plan.evidence_timeout {
            base(
                Outcome::Fail,
                StageReason::EvidenceTimeout { gates: vec![] },
                None,
                vec![],
            )
        } else {
            base(Outcome::Wait, StageReason::StatsUnavailable, None, vec![])
        };
    };
    // Counters that went backwards (a gateway restarted) restart the test's
    // origin: evidence is lost, never invented. The e-process keeps what it
    // has accumulated: it only ever adds increments that really happened.
    let (champion_id, candidate_id) = (input.champion, input.candidate);
    let now_counts = ErrorCounts::of(current, champion_id, candidate_id);
    let origin = state.origin.get_or_insert_with(|| current.clone());
    let last = state
        .last
        .unwrap_or_else(|| ErrorCounts::of(origin, champion_id, candidate_id));
    let window = match (current.window_since(origin), now_counts.since(&last)) {
        (Ok(w), Some(increment)) => {
            let exposure = increment.candidate_requests + increment.champion_requests;
            if exposure > 0 {
                state.errors.update(
                    increment.champion_failures,
                    increment.candidate_failures,
                    increment.candidate_requests as f64 / exposure as f64,
                );
            }
            w
        }
        _ => {
            state.origin = Some(current.clone());
            Snapshot::default()
        }
    };
    state.last = Some(now_counts);
    state.looks += 1;

    let g = &plan.gates;
    let (c, h) = (
        window.revision(input.candidate),
        window.revision(input.champion),
    );
    let alpha = metric_alpha(plan);
    let mut gates = Vec::new();
    if g.error_rate.enabled {
        gates.push(error_gate(plan, &state.errors, alpha, &c, &h));
    }
    if g.latency.enabled {
        gates.push(latency_gate(plan, alpha, &c, &h));
    }
    match input.stage {
        StageKind::Shadow => gates.push(shadow_gate(plan, alpha, &window, input.candidate, &c, &h)),
        StageKind::Canary if g.prediction_shift.enabled => {
            gates.push(shift_gate(plan, alpha, &c, &h))
        }
        StageKind::Canary => {}
    }
    // Each stage needs its own sample floor before it may pass, whatever the
    // cumulative evidence says (a stage nobody exercised proved nothing).
    let stage_window = input.stage_origin.map_or_else(StageTally::default, |o| {
        StageTally::of(current, champion_id, candidate_id).since(&StageTally::of(
            o,
            champion_id,
            candidate_id,
        ))
    });
    for v in gates
        .iter_mut()
        .filter(|v| v.outcome != Outcome::Fail && !v.metrics_missing())
    {
        if let Some(r) = stage_floor(plan, v.gate, &stage_window) {
            v.outcome = Outcome::Wait;
            v.reason = r;
        }
    }
    let champion = champion_health(plan, &h);
    let kinds = |keep: &dyn Fn(&GateVerdict) -> bool| {
        gates
            .iter()
            .filter(|v| keep(v))
            .map(|v| v.gate)
            .collect::<Vec<_>>()
    };
    let failed = kinds(&|v| v.outcome == Outcome::Fail);
    let missing = kinds(&GateVerdict::metrics_missing);
    let starving = kinds(&|v| {
        matches!(
            v.reason,
            Reason::InsufficientSamples { .. } | Reason::ChampionNoVerdict { .. }
        )
    });
    let unproven = kinds(&|v| v.outcome != Outcome::Pass && !v.metrics_missing());
    let deadline = input.elapsed >= plan.evidence_timeout;
    let (outcome, reason) = if champion.outage {
        (Outcome::Wait, StageReason::SharedOutage)
    } else if !failed.is_empty() {
        (Outcome::Fail, StageReason::Breach { gates: failed })
    } else if input.elapsed < plan.min_stage_duration {
        let remaining_ms = (plan.min_stage_duration - input.elapsed).as_millis() as u64;
        (Outcome::Wait, StageReason::MinDuration { remaining_ms })
    } else {
        let waiting = match plan.sequential.advance {
            Advance::OnTime => starving,
            Advance::OnEvidence => unproven,
        };
        if !waiting.is_empty() && deadline {
            (
                Outcome::Fail,
                StageReason::EvidenceTimeout { gates: waiting },
            )
        } else if !waiting.is_empty() {
            (
                Outcome::Wait,
                StageReason::AwaitingEvidence { gates: waiting },
            )
        } else if !missing.is_empty() {
            (
                Outcome::Fail,
                StageReason::MetricsMissing { gates: missing },
            )
        } else {
            (Outcome::Pass, StageReason::AllGatesPass)
        }
    };
    base(outcome, reason, Some(champion), gates)
}
