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
//!
//! In CANARY stages each request is answered by one arm: the test is the
//! error gate's, on labelled wrong answers. Given that a labelled answer
//! of epoch `e` is wrong, it is the candidate's with probability
//! `ρ·w / (ρ·w + 1 − w)`, `w` the candidate's share of the epoch's
//! *recorded* answers — if labelling does not depend on the arm. In
//! CANARY it may (a blocked transaction has no chargeback), so the arms'
//! label coverage is compared per epoch with its own test (two
//! conditional binomials against coverage ratios outside `[1/1.2, 1.2]`,
//! tempered by the key's design effect); while it shows them different
//! the gate neither passes nor fails (`label_coverage_differs`), and the
//! stage fails safe at its label deadline. A coverage ratio inside the
//! band is not held, so the fail test's null is widened by it: "error
//! ratio ≤ `max_error_ratio` × 1.2". Late labels extend their own epoch's
//! counts.

use crate::anytime::{ConditionalBinomial, robbins_cs_tempered};
use crate::exposure::Epoch;
use crate::gate::{Evidence, GateKind, GateVerdict, Outcome, Reason};
use crate::labels::{ArmLabels, CanaryLabels, PairedLabels, Recorded, paired, unpaired};
use crate::plan::Plan;
use crate::stats::Interval;
use crate::unit::{count_design_effect, ratio_design_effect};

/// Label coverage ratios (candidate over champion) within `[1/x, x]` are
/// not held (a test against exactly 1 would hold every long rollout); the
/// fail test's null is widened by `x` to stay valid under any of them.
const COVERAGE_RATIO: f64 = 1.2;

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
        // The e-process counts discordant pairs; each side of the PASS
        // bound counts one arm's own mistakes among the labelled pairs.
        let d = count_design_effect(&pairs.units, |u| (u.failures + u.client_errors, u.failures));
        let dc = count_design_effect(&pairs.units, |u| (u.requests, u.failures));
        let dh = count_design_effect(&pairs.units, |u| (u.requests, u.client_errors));
        let mut test = ConditionalBinomial::new(cfg.max_error_ratio);
        test.update(pairs.champion_only_wrong, pairs.candidate_only_wrong, 0.5);
        let n = pairs.labelled;
        let c = robbins_cs_tempered(pairs.candidate_only_wrong, n, dc, alpha / 2.0);
        let h = robbins_cs_tempered(pairs.champion_only_wrong, n, dh, alpha / 2.0);
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
            e_value: s.log_e.exp().min(f64::MAX),
            fail_at: 1.0 / s.alpha,
            design_effect: s.design_effect,
            max_error_ratio: cfg.max_error_ratio,
            coverage,
            min_coverage: cfg.min_coverage,
            canary: None,
        },
    )
}

/// What the CANARY tests showed over the canary epochs, and the current
/// stage's labelled answers.
struct CanaryShown {
    /// Over every canary epoch: (candidate, champion).
    all: (ArmLabels, ArmLabels),
    /// Over the current stage's epochs.
    stage: (ArmLabels, ArmLabels),
    log_e: f64,
    design_effect: f64,
    /// The arms' label coverage shown different.
    differs: bool,
    difference: Interval,
}

impl CanaryShown {
    fn of(
        plan: &Plan,
        alpha: f64,
        rows: &[Recorded],
        ids: (&str, &str),
        from: (Epoch, Epoch),
    ) -> Self {
        let cfg = &plan.gates.quality;
        let (canary_from, stage_from) = from;
        // Coverage ratios within the band are not held, so the fail test
        // must stay valid under any of them: the band widens its null.
        let mut test = ConditionalBinomial::new(cfg.max_error_ratio * COVERAGE_RATIO);
        let mut more = ConditionalBinomial::new(COVERAGE_RATIO);
        let mut less = ConditionalBinomial::below(1.0 / COVERAGE_RATIO);
        let (mut all, mut stage) = (
            (ArmLabels::default(), ArmLabels::default()),
            (ArmLabels::default(), ArmLabels::default()),
        );
        for (e, l) in &unpaired(rows, ids, cfg, canary_from) {
            let (c, h) = (&l.candidate, &l.champion);
            all = (all.0.plus(c), all.1.plus(h));
            if *e >= stage_from {
                stage = (stage.0.plus(c), stage.1.plus(h));
            }
            if c.recorded + h.recorded == 0 {
                continue;
            }
            let w = c.recorded as f64 / (c.recorded + h.recorded) as f64;
            test.update(h.wrong, c.wrong, w);
            more.update(h.labelled, c.labelled, w);
            less.update(h.labelled, c.labelled, w);
        }
        let d = ratio_design_effect(&all.0.units, &all.1.units, |u| (u.requests, u.failures));
        // Whether a request is labelled clusters by key too (a tenant that
        // never sends chargebacks): the coverage test is tempered alike.
        let dl = ratio_design_effect(&all.0.units, &all.1.units, |u| (u.latencies, u.requests));
        let shown =
            |cb: &ConditionalBinomial| cb.log_e_value_tempered(1.0 / dl) >= (1.0 / alpha).ln();
        let pick = |u: &crate::unit::UnitTotals| (u.requests, u.failures);
        let (c, h) = &stage;
        let ic = robbins_cs_tempered(
            c.wrong,
            c.labelled,
            count_design_effect(&c.units, pick),
            alpha / 2.0,
        );
        let ih = robbins_cs_tempered(
            h.wrong,
            h.labelled,
            count_design_effect(&h.units, pick),
            alpha / 2.0,
        );
        CanaryShown {
            log_e: test.log_e_value_tempered(1.0 / d),
            design_effect: d,
            differs: shown(&more) || shown(&less),
            difference: Interval {
                lower: ic.lower - ih.upper,
                upper: ic.upper - ih.lower,
            },
            all,
            stage,
        }
    }

    /// The gate's outcome: held while coverage differs (its assumption
    /// fails), failed when shown worse, passed when shown within budget on
    /// enough labels.
    fn decide(&self, plan: &Plan, alpha: f64) -> (Outcome, Reason) {
        let cfg = &plan.gates.quality;
        let (c, h) = &self.stage;
        let need = cfg
            .min_labels
            .max((cfg.min_coverage * c.recorded as f64).ceil() as u64);
        if self.differs {
            (
                Outcome::Wait,
                Reason::LabelCoverageDiffers {
                    candidate_labelled: self.all.0.labelled,
                    candidate_recorded: self.all.0.recorded,
                    champion_labelled: self.all.1.labelled,
                    champion_recorded: self.all.1.recorded,
                },
            )
        } else if self.log_e >= (1.0 / alpha).ln() {
            (Outcome::Fail, Reason::Breach)
        } else if c.labelled < need {
            (
                Outcome::Wait,
                Reason::InsufficientSamples {
                    have: c.labelled,
                    need,
                },
            )
        } else if h.labelled < cfg.min_labels {
            (
                Outcome::Wait,
                Reason::ChampionNoVerdict {
                    have: h.labelled,
                    need: cfg.min_labels,
                },
            )
        } else if self.difference.upper <= cfg.margin {
            (Outcome::Pass, Reason::WithinBudget)
        } else {
            (Outcome::Wait, Reason::Inconclusive)
        }
    }
}

/// The quality gate's verdict in a CANARY stage at `alpha`: the unpaired
/// test over the canary epochs (from `canary_from`), passed on the
/// current stage's (from `stage_from`); `rows`: `None` when they could
/// not be read (the gate waits).
pub(super) fn canary_quality_gate(
    plan: &Plan,
    alpha: f64,
    rows: Option<&[Recorded]>,
    ids: (&str, &str),
    from: (Epoch, Epoch),
) -> GateVerdict {
    let cfg = &plan.gates.quality;
    let shown = CanaryShown::of(plan, alpha, rows.unwrap_or(&[]), ids, from);
    let (outcome, reason) = match rows {
        Some(_) => shown.decide(plan, alpha),
        None => (
            Outcome::Wait,
            Reason::NotEvaluated {
                what: "labels: the recorded predictions could not be read".into(),
            },
        ),
    };
    let CanaryShown {
        all,
        stage,
        log_e,
        design_effect,
        differs,
        difference,
    } = shown;
    let coverage = stage.0.coverage();
    GateVerdict::new(
        GateKind::Quality,
        outcome,
        reason,
        Evidence::Quality {
            pairs: PairedLabels::default(),
            difference,
            margin: cfg.margin,
            e_value: log_e.exp().min(f64::MAX),
            fail_at: 1.0 / alpha,
            design_effect,
            max_error_ratio: cfg.max_error_ratio,
            coverage,
            min_coverage: cfg.min_coverage,
            canary: Some(CanaryLabels {
                candidate: all.0,
                champion: all.1,
                coverage_differs: differs,
            }),
        },
    )
}

/// The watch after promotion (`Phase::Watching`): the SHADOW stage's
/// paired test, continued on every labelled pair of the rollout — those of
/// the SHADOW stage whose labels came late, and those of the watch, where
/// the promoted revision answers and the previous champion is mirrored. One
/// e-process from the first pair to the watch's end, at the share of `α`
/// the plan gives it, so looking on after promotion spends nothing more.
/// It fails (a regression shown) or waits; it never ends the watch early.
pub fn watch_verdict(
    plan: &Plan,
    rows: Option<&[Recorded]>,
    ids: (&str, &str),
    elapsed: std::time::Duration,
) -> crate::stage::StageVerdict {
    use crate::stage::{StageKind, StageReason, StageVerdict};
    let gate = quality_gate(plan, super::metric_alpha(plan), rows, ids);
    let (outcome, reason) = match gate.outcome {
        Outcome::Fail => (
            Outcome::Fail,
            StageReason::Breach {
                gates: vec![GateKind::Quality],
            },
        ),
        Outcome::Pass => (Outcome::Pass, StageReason::AllGatesPass),
        Outcome::Wait => (
            Outcome::Wait,
            StageReason::AwaitingEvidence {
                gates: vec![GateKind::Quality],
            },
        ),
    };
    StageVerdict {
        stage: StageKind::Watch,
        outcome,
        reason,
        gross: false,
        elapsed_ms: elapsed.as_millis().min(u128::from(u64::MAX)) as u64,
        champion: None,
        gates: vec![gate],
        confirmation: None,
    }
}
