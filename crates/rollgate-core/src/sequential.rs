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
//! - Shadow agreement and high-confidence flips: one-sided beta-binomial
//!   mixture tests against the budgets (disagreement ≤ `1 − min_agreement`,
//!   flips ≤ `max_flip_rate`): FAIL when a rate is shown above its budget,
//!   PASS when both are shown below; the Robbins intervals beside them are
//!   for reading.
//! - Prediction shift: Robbins confidence sequences on each class rate.
//!
//! References: Robbins (1970); Lindon & Malek, NeurIPS 2022; Howard,
//! Ramdas, McAuliffe & Sekhon, Ann. Statist. 2021; Howard & Ramdas,
//! Bernoulli 2022.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::anytime::{ConditionalBinomial, quantile_cs_ranks, rate_exceeds, robbins_cs};
use crate::gate::{
    Arms, Counts, Evidence, GateKind, GateVerdict, Outcome, QuantileComparison, Reason, decide,
    judge_quantile, latency_verdict, sample_floor, shadow_verdict, shift_verdict,
};
use crate::histogram::LatencyHistogram;
use crate::plan::{Advance, Plan};
use crate::snapshot::{RevisionStats, Snapshot};
use crate::stage::{ChampionHealth, StageKind, StageReason, StageVerdict, champion_health};
use crate::stats::Interval;

/// The sequential test's state: small, serialisable, restored exactly.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SequentialState {
    /// Cumulative stats when the first stage started: the test's origin.
    pub origin: Option<Snapshot>,
    /// Both arms' counts at the previous look, for the e-process increments.
    #[serde(default)]
    pub last: Option<Tally>,
    pub errors: ConditionalBinomial,
}

/// Cumulative counts of both arms: what the error e-process adds up and
/// what each stage's sample floors count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tally {
    pub candidate: ArmTally,
    pub champion: ArmTally,
    /// Compared champion/shadow pairs.
    pub pairs: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArmTally {
    pub requests: u64,
    pub failures: u64,
    pub latencies: u64,
    pub predictions: u64,
}

impl ArmTally {
    fn of(s: &RevisionStats) -> Self {
        ArmTally {
            requests: s.requests(),
            failures: s.failure_count(),
            latencies: s.latency().len(),
            predictions: s.predictions().values().sum(),
        }
    }

    fn since(&self, e: &ArmTally) -> Option<ArmTally> {
        Some(ArmTally {
            requests: self.requests.checked_sub(e.requests)?,
            failures: self.failures.checked_sub(e.failures)?,
            latencies: self.latencies.checked_sub(e.latencies)?,
            predictions: self.predictions.checked_sub(e.predictions)?,
        })
    }
}

impl Tally {
    fn of(s: &Snapshot, champion: &str, candidate: &str) -> Self {
        Tally {
            candidate: ArmTally::of(s.revision(candidate)),
            champion: ArmTally::of(s.revision(champion)),
            pairs: s.pairs_for(candidate).map_or(0, |p| p.pairs()),
        }
    }

    /// `self − earlier`, or `None` if a counter went backwards (a gateway
    /// restarted).
    fn since(&self, earlier: &Tally) -> Option<Tally> {
        Some(Tally {
            candidate: self.candidate.since(&earlier.candidate)?,
            champion: self.champion.since(&earlier.champion)?,
            pairs: self.pairs.checked_sub(earlier.pairs)?,
        })
    }
}

impl SequentialState {
    /// A test starting at `origin`, with `plan`'s error margin.
    pub fn new(plan: &Plan, origin: Option<Snapshot>) -> Self {
        SequentialState {
            last: None,
            origin,
            errors: ConditionalBinomial::new(plan.sequential.max_error_ratio),
        }
    }
}

/// Error rate: e-process to fail, confidence sequences to pass.
fn error_gate(plan: &Plan, errors: &ConditionalBinomial, alpha: f64, arms: Arms) -> GateVerdict {
    let cfg = &plan.gates.error_rate;
    let (c, h) = (arms.candidate, arms.champion);
    let cand = robbins_cs(c.failure_count(), c.requests(), alpha / 2.0);
    let champ = robbins_cs(h.failure_count(), h.requests(), alpha / 2.0);
    let difference = Interval {
        lower: (cand.lower - champ.upper).max(-1.0),
        upper: (cand.upper - champ.lower).min(1.0),
    };
    let evidence = Evidence::ErrorRate {
        candidate: Counts::of(c),
        champion: Counts::of(h),
        difference,
        margin: cfg.margin,
        candidate_rate: cand,
        champion_rate: champ,
    };
    let (outcome, reason) = decide(
        None,
        sample_floor(c.requests(), h.requests(), cfg.min_requests),
        errors.rejects(alpha),
        difference.upper <= cfg.margin,
        true,
    );
    GateVerdict::new(GateKind::ErrorRate, outcome, reason, evidence)
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
fn latency_gate(plan: &Plan, alpha: f64, arms: Arms) -> GateVerdict {
    let cfg = &plan.gates.latency;
    let (c, h) = (arms.candidate.latency(), arms.champion.latency());
    let a = alpha / 2.0;
    let median = compare(0.5, c, h, a, cfg.median_ratio, cfg.median_ms);
    let tail = compare(cfg.tail_quantile, c, h, a, cfg.tail_ratio, cfg.tail_ms);
    latency_verdict(cfg, arms, median, tail, true)
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
    arms: Arms,
) -> GateVerdict {
    let cfg = &plan.gates.shadow;
    let p = window.pairs_for(candidate).copied().unwrap_or_default();
    let (disagreements, confident) = (p.pairs() - p.agreements(), p.champion_confident());
    // Shown for reading; the decisions are the one-sided tests.
    let agreement = robbins_cs(p.agreements(), p.pairs(), alpha);
    let flip_rate = robbins_cs(p.confident_flips(), confident, alpha);
    let flips_off = cfg.max_flip_rate >= 1.0;
    let breached = shown_above(disagreements, p.pairs(), 1.0 - cfg.min_agreement, alpha)
        || shown_above(p.confident_flips(), confident, cfg.max_flip_rate, alpha);
    let within = shown_above(p.agreements(), p.pairs(), cfg.min_agreement, alpha)
        && (flips_off
            || shown_above(
                confident - p.confident_flips(),
                confident,
                1.0 - cfg.max_flip_rate,
                alpha,
            ));
    shadow_verdict(
        cfg,
        arms,
        &p,
        (agreement, flip_rate),
        (breached, within),
        true,
    )
}

/// Class rates: Robbins sequences per class and arm, Bonferroni over the
/// classes (two sequences each).
fn shift_gate(plan: &Plan, alpha: f64, arms: Arms) -> GateVerdict {
    shift_verdict(
        &plan.gates.prediction_shift,
        arms,
        true,
        |kc, nc, kh, nh, classes| {
            let a = alpha / (2.0 * classes.max(1) as f64);
            let (ic, ih) = (robbins_cs(kc, nc, a), robbins_cs(kh, nh, a));
            Interval {
                lower: ic.lower - ih.upper,
                upper: ic.upper - ih.lower,
            }
        },
    )
}

/// The sample floor of `gate` over the current stage's own traffic.
fn stage_floor(plan: &Plan, gate: GateKind, w: &Tally) -> Option<Reason> {
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
    let shadow = usize::from(plan.shadow.enabled);
    let metrics = usize::from(g.error_rate.enabled)
        + usize::from(g.latency.enabled)
        + shadow * (1 + usize::from(g.shadow.max_flip_rate < 1.0))
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
    let tally = Tally::of(current, champion_id, candidate_id);
    let origin = state.origin.get_or_insert_with(|| current.clone());
    let last = state
        .last
        .unwrap_or_else(|| Tally::of(origin, champion_id, candidate_id));
    let window = match (current.window_since(origin), tally.since(&last)) {
        (Ok(w), Some(increment)) => {
            let (ic, ih) = (increment.candidate, increment.champion);
            let exposure = ic.requests + ih.requests;
            if exposure > 0 {
                state.errors.update(
                    ih.failures,
                    ic.failures,
                    ic.requests as f64 / exposure as f64,
                );
            }
            w
        }
        _ => {
            state.origin = Some(current.clone());
            Snapshot::default()
        }
    };
    state.last = Some(tally);

    let g = &plan.gates;
    let (c, h) = (
        window.revision(input.candidate),
        window.revision(input.champion),
    );
    let arms = Arms {
        champion: h,
        candidate: c,
    };
    let alpha = metric_alpha(plan);
    let mut gates = Vec::new();
    if g.error_rate.enabled {
        gates.push(error_gate(plan, &state.errors, alpha, arms));
    }
    if g.latency.enabled {
        gates.push(latency_gate(plan, alpha, arms));
    }
    match input.stage {
        StageKind::Shadow => gates.push(shadow_gate(plan, alpha, &window, input.candidate, arms)),
        StageKind::Canary if g.prediction_shift.enabled => {
            gates.push(shift_gate(plan, alpha, arms))
        }
        StageKind::Canary => {}
    }
    // Each stage needs its own sample floor before it may pass, whatever the
    // cumulative evidence says (a stage nobody exercised proved nothing).
    // A stage whose counters went backwards has gathered nothing yet.
    let stage_window = input
        .stage_origin
        .and_then(|o| tally.since(&Tally::of(o, champion_id, candidate_id)))
        .unwrap_or_default();
    for v in gates
        .iter_mut()
        .filter(|v| v.outcome != Outcome::Fail && !v.metrics_missing())
    {
        if let Some(r) = stage_floor(plan, v.gate, &stage_window) {
            v.outcome = Outcome::Wait;
            v.reason = r;
        }
    }
    let champion = champion_health(plan, h);
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
