//! The quality gate, in the SHADOW stage: labelled mirrored pairs.
//!
//! A labelled pair is both-right, both-wrong or discordant, and only a
//! discordant pair says which arm is better. Given that a pair is
//! discordant, it goes against the candidate (the candidate wrong, the
//! champion right) with probability `p₁₀ / (p₁₀ + p₀₁)`; under the null
//! "the candidate's own mistakes are at most `r₀` times the champion's"
//! (`p₁₀ ≤ r₀·p₀₁`) that is at most `r₀ / (1 + r₀)`: the conditional
//! binomial e-process with the candidate's share ½. Its null contains
//! every candidate no worse than the champion (candidate error ≤ champion
//! error means `p₁₀ ≤ p₀₁`), whatever the mix of requests, however the
//! label rate drifts, whenever labels come: a label is the request's, so
//! whether it comes cannot depend on which arm answered (users saw only
//! the champion's answer). The e-process is a function of the totals, so
//! late labels that extend earlier counts are no new look at the same
//! data; its unit is the key, as for the other tests (tempered by the
//! design effect of the discordant pairs over their unit groups).
//!
//! It passes when the Robbins sequences show the candidate's error rate
//! at most `margin` above the champion's, on at least `min_labels`
//! labelled pairs covering `min_coverage` of those recorded.

use crate::anytime::{ConditionalBinomial, robbins_cs_tempered};
use crate::gate::{Evidence, GateKind, GateVerdict, Outcome, Reason};
use crate::labels::{PairedLabels, Recorded, paired};
use crate::plan::Plan;
use crate::stats::Interval;
use crate::unit::count_design_effect;

/// The quality gate's verdict on the rollout's labelled pairs at `alpha`;
/// `rows`: `None` when they could not be read (the gate waits).
pub(super) fn quality_gate(
    plan: &Plan,
    alpha: f64,
    rows: Option<&[Recorded]>,
    (champion, candidate): (&str, &str),
) -> GateVerdict {
    let cfg = &plan.gates.quality;
    let Some(rows) = rows else {
        return verdict(
            plan,
            Outcome::Wait,
            Reason::NotEvaluated {
                what: "labels: the recorded predictions could not be read".into(),
            },
            Shown::of(plan, PairedLabels::default(), alpha),
        );
    };
    let shown = Shown::of(plan, paired(rows, champion, candidate, cfg), alpha);
    let p = &shown.pairs;
    let need = cfg
        .min_labels
        .max((cfg.min_coverage * p.recorded as f64).ceil() as u64);
    let (outcome, reason) = if shown.log_e >= (1.0 / alpha).ln() {
        (Outcome::Fail, Reason::Breach)
    } else if p.labelled < need {
        (
            Outcome::Wait,
            Reason::InsufficientSamples {
                have: p.labelled,
                need,
            },
        )
    } else if shown.difference.upper <= cfg.margin {
        (Outcome::Pass, Reason::WithinBudget)
    } else {
        (Outcome::Wait, Reason::Inconclusive)
    };
    verdict(plan, outcome, reason, shown)
}

/// What the tests show on the labelled pairs.
struct Shown {
    pairs: PairedLabels,
    /// `ln` of the tempered discordant-pairs e-value.
    log_e: f64,
    design_effect: f64,
    /// Candidate error rate minus the champion's: `(p₁₀ − p₀₁)`, each side
    /// by a Robbins sequence at `alpha / 2`.
    difference: Interval,
    alpha: f64,
}

impl Shown {
    fn of(plan: &Plan, pairs: PairedLabels, alpha: f64) -> Shown {
        let cfg = &plan.gates.quality;
        let d = count_design_effect(&pairs.units, |u| (u.requests, u.failures));
        let mut test = ConditionalBinomial::new(cfg.max_error_ratio);
        test.update(pairs.champion_only_wrong, pairs.candidate_only_wrong, 0.5);
        let n = pairs.labelled;
        let c = robbins_cs_tempered(pairs.candidate_only_wrong, n, d, alpha / 2.0);
        let h = robbins_cs_tempered(pairs.champion_only_wrong, n, d, alpha / 2.0);
        Shown {
            log_e: test.log_e_value_tempered(1.0 / d),
            design_effect: d,
            difference: Interval {
                lower: c.lower - h.upper,
                upper: c.upper - h.lower,
            },
            pairs,
            alpha,
        }
    }
}

fn verdict(plan: &Plan, outcome: Outcome, reason: Reason, s: Shown) -> GateVerdict {
    let cfg = &plan.gates.quality;
    let coverage = s.pairs.coverage();
    GateVerdict::new(
        GateKind::Quality,
        outcome,
        reason,
        Evidence::Quality {
            pairs: s.pairs,
            difference: s.difference,
            margin: cfg.margin,
            e_value: s.log_e.exp(),
            fail_at: 1.0 / s.alpha,
            design_effect: s.design_effect,
            max_error_ratio: cfg.max_error_ratio,
            coverage,
            min_coverage: cfg.min_coverage,
        },
    )
}
