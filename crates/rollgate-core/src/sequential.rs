//! The `sequential` policy: anytime-valid gates over the whole rollout.
//!
//! Every bound here stays valid however often it is looked at (Ville's
//! inequality), so the controller may evaluate after every snapshot and
//! across weight changes without spending `α` again: one test runs from the
//! first stage to the decision. `α` (`plan.sequential.alpha`) is split
//! evenly over the gates that can fail (Bonferroni); promotion needs every
//! gate to pass, which needs no adjustment (intersection–union).
//!
//! - Errors: FAIL by the conditional-binomial e-process
//!   ([`ConditionalBinomial`]: null "candidate failure rate ≤ champion's");
//!   PASS when the Robbins confidence sequences show `candidate − champion ≤
//!   margin`.
//! - Latency: a time-uniform CDF band per arm — Dvoretzky–Kiefer–Wolfowitz
//!   with Massart's constant, `P(sup|F̂_n − F| > ε) ≤ 2e^{−2nε²}`, union-bounded
//!   over looks with `α_j = α / (j(j+1))` — gives quantile bounds; the rule
//!   stays "median AND tail regressed" to fail.
//! - Shadow agreement and high-confidence flips, and prediction shift:
//!   Robbins confidence sequences on each rate.
//!
//! References: Robbins (1970); Lindon & Malek, NeurIPS 2022; Massart, Ann.
//! Probab. 1990; Howard & Ramdas, Bernoulli 2022 (the band used here is the
//! simpler union-bound cousin of theirs, valid and somewhat wider).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::anytime::{ConditionalBinomial, robbins_cs};
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
    /// Cumulative stats at the previous look, for the e-process increments.
    pub last: Option<Snapshot>,
    pub errors: ConditionalBinomial,
    /// Looks taken (evaluations with stats).
    pub looks: u64,
}

impl SequentialState {
    pub fn new(origin: Option<Snapshot>) -> Self {
        SequentialState {
            last: origin.clone(),
            origin,
            errors: ConditionalBinomial::new(1.0),
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

/// Half-width of the DKW band for `n` samples at look `j` with budget `alpha`.
fn dkw_eps(n: u64, look: u64, alpha: f64) -> f64 {
    if n == 0 {
        return 1.0;
    }
    let j = look.max(1) as f64;
    let alpha_j = alpha / (j * (j + 1.0));
    ((2.0 / alpha_j).ln() / (2.0 * n as f64)).sqrt()
}

fn compare(
    q: f64,
    c: &LatencyHistogram,
    h: &LatencyHistogram,
    eps_c: f64,
    eps_h: f64,
    ratio: f64,
    ms: f64,
) -> Option<QuantileComparison> {
    let cb = c.quantile_band_bounds(q, eps_c)?;
    let hb = h.quantile_band_bounds(q, eps_h)?;
    Some(judge_quantile(q, cb, hb, ratio, ms))
}

fn latency_gate(
    plan: &Plan,
    alpha: f64,
    look: u64,
    c: &RevisionStats,
    h: &RevisionStats,
) -> GateVerdict {
    let cfg = &plan.gates.latency;
    let eps_c = dkw_eps(c.latency().len(), look, alpha / 2.0);
    let eps_h = dkw_eps(h.latency().len(), look, alpha / 2.0);
    let median = compare(
        0.5,
        c.latency(),
        h.latency(),
        eps_c,
        eps_h,
        cfg.median_ratio,
        cfg.median_ms,
    );
    let tail = compare(
        cfg.tail_quantile,
        c.latency(),
        h.latency(),
        eps_c,
        eps_h,
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
    let agreement = robbins_cs(p.agreements(), p.pairs(), alpha / 2.0);
    let flip_rate = robbins_cs(p.confident_flips(), p.champion_confident(), alpha / 2.0);
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
    } else if agreement.upper < cfg.min_agreement || flip_rate.lower > cfg.max_flip_rate {
        (Outcome::Fail, Reason::Breach)
    } else if p.pairs() < cfg.min_pairs {
        (
            Outcome::Wait,
            Reason::InsufficientSamples {
                have: p.pairs(),
                need: cfg.min_pairs,
            },
        )
    } else if agreement.lower >= cfg.min_agreement && flip_rate.upper <= cfg.max_flip_rate {
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

/// The sample floor of `gate` over the current stage's own window.
fn stage_floor(
    plan: &Plan,
    gate: GateKind,
    w: &Snapshot,
    champion: &str,
    candidate: &str,
) -> Option<Reason> {
    let g = &plan.gates;
    let (c, h) = (w.revision(candidate), w.revision(champion));
    match gate {
        GateKind::ErrorRate | GateKind::GuardRails => {
            sample_floor(c.requests(), h.requests(), g.error_rate.min_requests)
        }
        GateKind::Latency => {
            sample_floor(c.latency().len(), h.latency().len(), g.latency.min_requests)
        }
        GateKind::ShadowAgreement => {
            let pairs = w.pairs_for(candidate).map_or(0, |p| p.pairs());
            (pairs < g.shadow.min_pairs).then_some(Reason::InsufficientSamples {
                have: pairs,
                need: g.shadow.min_pairs,
            })
        }
        GateKind::PredictionShift => {
            let total = |s: &RevisionStats| s.predictions().values().sum::<u64>();
            sample_floor(total(&c), total(&h), g.prediction_shift.min_predictions)
        }
    }
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
    let origin = state.origin.get_or_insert_with(|| current.clone()).clone();
    let (window, increment) = match (
        current.window_since(&origin),
        state.last.as_ref().map(|l| current.window_since(l)),
    ) {
        (Ok(w), Some(Ok(i))) => (w, i),
        (Ok(w), None) => (w, Snapshot::default()),
        _ => {
            state.origin = Some(current.clone());
            (Snapshot::default(), Snapshot::default())
        }
    };
    state.last = Some(current.clone());
    state.looks += 1;
    let (ic, ih) = (
        increment.revision(input.candidate),
        increment.revision(input.champion),
    );
    let exposure = ic.requests() + ih.requests();
    if exposure > 0 {
        state.errors.update(
            ih.failure_count(),
            ic.failure_count(),
            ic.requests() as f64 / exposure as f64,
        );
    }

    let g = &plan.gates;
    let (c, h) = (
        window.revision(input.candidate),
        window.revision(input.champion),
    );
    let failable = usize::from(g.error_rate.enabled)
        + usize::from(g.latency.enabled)
        + usize::from(input.stage == StageKind::Shadow)
        + usize::from(input.stage == StageKind::Canary && g.prediction_shift.enabled);
    let alpha = plan.sequential.alpha / failable.max(1) as f64;
    let mut gates = Vec::new();
    if g.error_rate.enabled {
        gates.push(error_gate(plan, &state.errors, alpha, &c, &h));
    }
    if g.latency.enabled {
        gates.push(latency_gate(plan, alpha, state.looks, &c, &h));
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
    let stage_window = input
        .stage_origin
        .and_then(|o| current.window_since(o).ok())
        .unwrap_or_default();
    for v in gates
        .iter_mut()
        .filter(|v| v.outcome != Outcome::Fail && !v.metrics_missing())
    {
        if let Some(r) = stage_floor(plan, v.gate, &stage_window, input.champion, input.candidate) {
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
