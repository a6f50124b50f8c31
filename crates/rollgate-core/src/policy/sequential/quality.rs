//! The quality gate: labelled answers, judged once *matured*.
//!
//! When a label comes often says whether the answer was right (a complaint
//! takes longer than a confirmation; a flagged transaction is reviewed at
//! once, a passed one known at its chargeback), so the labels that came
//! first are no sample of the answers. The tests therefore read only
//! answers at least `label_window` old, each with the label it had by
//! then ([`Maturity`]): a matured answer never changes, and matured
//! answers enter the tests in the order they were answered — an i.i.d.
//! sequence, whatever the label process, for delays within the window.
//!
//! Which matured answers have labels may still depend on anything (the
//! answer, its rightness, the arm). Under `unlabelled = "worst_case"` (the
//! default) an unlabelled answer counts against the verdict being tested:
//! for the candidate when testing a refusal, against it when testing a
//! pass. Both tests then hold under every coverage pattern, and decide
//! only when nearly every matured answer has a label — which
//! `absent_label` gives labels for one outcome only ("no chargeback within
//! the window = legitimate"). Under `"at_random"` unlabelled answers are
//! left out, on the declaration that labelling does not depend on
//! rightness.
//!
//! SHADOW (and the watch): labelled mirrored pairs. A matured pair is the
//! candidate's own mistake (`A`), the champion's own (`B`), unlabelled
//! (`U`), or says nothing. FAIL: the conditional-binomial e-process on
//! `A` against `B ∪ U` with share ½ — under the null "the candidate's own
//! mistakes at most `r₀` times the champion's", `P(A) ≤ p₁₀ ≤ r₀·p₀₁ ≤
//! r₀·P(B ∪ U)`. PASS: `p₁₀ − p₀₁ ≤ P(A ∪ U) − P(B) = δ·(2θ − 1)`, with `δ`
//! the share of matured pairs in `A ∪ U ∪ B` and `θ` the share of those in
//! `A ∪ U`: two Robbins sequences at `α/2` each, tempered by their design
//! effects (the key is the unit).
//!
//! CANARY: each matured answer is one arm's. FAIL: given that a matured
//! answer is the candidate's labelled wrong one (`A`) or the champion's
//! wrong or unlabelled one (`B`), it is `A` with probability at most
//! `ρ·w / (ρ·w + 1 − w)`, `w` the candidate's share of the epoch's
//! matured answers (exposures, which do not depend on rightness: the
//! split's share, measured): one factor per epoch. PASS: the
//! candidate's error rate (its unlabelled answers counted wrong) at most
//! `margin` above the champion's (its unlabelled counted right), on the
//! stage's matured answers.

use crate::anytime::{ConditionalBinomial, robbins_cs_tempered};
use crate::exposure::Epoch;
use crate::gate::{Evidence, GateKind, GateVerdict, Outcome, Reason};
use crate::labels::{ArmLabels, CanaryLabels, Maturity, PairedLabels, Recorded, paired, unpaired};
use crate::plan::{Plan, Unlabelled};
use crate::policy::look::LookInput;
use crate::stage::StageKind;
use crate::stats::Interval;
use crate::types::Timestamp;
use crate::unit::{Pick, UnitTotals, count_design_effect, ratio_design_effect_each};

/// The quality tests' alternatives: mistakes from 1.1 to 10 times the
/// champion's (the error gate's reach 100 times): a retrained model that is
/// worse is worse by a third or a half, and a broken one by more than that
/// is shown in a few labels whatever the grid.
const RATIO_SPAN: f64 = 10.0;

/// Paired unit groups: `requests` matured pairs, `failures` the
/// candidate's own mistakes (A), `client_errors` the champion's (B),
/// `latencies` the unlabelled (U).
mod pair_picks {
    use super::UnitTotals;
    pub fn fail_worst(u: &UnitTotals) -> (u64, u64) {
        (u.failures + u.client_errors + u.latencies, u.failures)
    }
    pub fn fail_random(u: &UnitTotals) -> (u64, u64) {
        (u.failures + u.client_errors, u.failures)
    }
    pub fn share_worst(u: &UnitTotals) -> (u64, u64) {
        (u.requests, u.failures + u.client_errors + u.latencies)
    }
    pub fn share_random(u: &UnitTotals) -> (u64, u64) {
        (
            u.requests.saturating_sub(u.latencies),
            u.failures + u.client_errors,
        )
    }
    pub fn against_worst(u: &UnitTotals) -> (u64, u64) {
        (
            u.failures + u.client_errors + u.latencies,
            u.failures + u.latencies,
        )
    }
}

/// One arm's unit groups in CANARY: `latencies` matured answers,
/// `requests` labelled, `failures` labelled wrong.
mod arm_picks {
    use super::UnitTotals;
    /// Wrong, the unlabelled counted wrong, over matured.
    pub fn wrong_or_unlabelled(u: &UnitTotals) -> (u64, u64) {
        (
            u.latencies,
            u.failures + u.latencies.saturating_sub(u.requests),
        )
    }
    /// Labelled wrong over matured.
    pub fn wrong_of_matured(u: &UnitTotals) -> (u64, u64) {
        (u.latencies, u.failures)
    }
    /// Labelled wrong over labelled.
    pub fn wrong_of_labelled(u: &UnitTotals) -> (u64, u64) {
        (u.requests, u.failures)
    }
}

/// The quality gate's verdict on the rollout's matured labelled pairs at
/// `alpha`, at `now`; `rows`: `None` when they could not be read (the gate
/// waits).
fn quality_gate(
    plan: &Plan,
    alpha: f64,
    rows: Option<&[Recorded]>,
    ids: (&str, &str),
    now: Timestamp,
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
    let pairs = paired(rows, ids, cfg, Maturity::of(cfg, now.0));
    let shown = Shown::of(plan, pairs, alpha);
    let p = &shown.pairs;
    let need = labels_needed(plan, p.matured);
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

/// The labels a pass needs among `matured` answers: `min_labels`, and
/// `min_coverage` of them — under `worst_case` at least `1 − margin`, as
/// unlabelled answers beyond `margin` (counted wrong for a pass) could
/// never let an equal candidate pass: short of that the gate waits for
/// labels, and fails safe at its deadline instead of passing on time.
fn labels_needed(plan: &Plan, matured: u64) -> u64 {
    let cfg = &plan.gates.quality;
    let coverage = match cfg.unlabelled {
        Unlabelled::WorstCase => cfg.min_coverage.max(1.0 - cfg.margin),
        Unlabelled::AtRandom => cfg.min_coverage,
    };
    cfg.min_labels
        .max((coverage * matured as f64 - 1e-9).ceil() as u64)
}

/// The quality gate of a stage judged on labels (`in_stages`): SHADOW's
/// paired test, or CANARY's unpaired one over the canary epochs (from the
/// first of `from`, else the stage's), passed on the stage's (the second).
pub(super) fn stage_quality_gate(
    plan: &Plan,
    alpha: f64,
    input: &LookInput,
    (canary_from, stage_from): (Option<Epoch>, Epoch),
) -> Option<GateVerdict> {
    let q = &plan.gates.quality;
    if !(q.enabled && q.in_stages) {
        return None;
    }
    let ids = (input.champion, input.candidate);
    match input.stage {
        StageKind::Shadow => Some(quality_gate(plan, alpha, input.labels, ids, input.now)),
        StageKind::Canary => {
            let from = (canary_from.unwrap_or(stage_from), stage_from);
            let labels = (input.labels, ids, input.now);
            Some(canary_quality_gate(plan, alpha, labels, from))
        }
        StageKind::Watch => None,
    }
}

/// `x = δ·(2θ − 1)` bounded from sequences for `δ` and `θ` (both in
/// [0, 1]): the extremes over the box.
fn share_difference(delta: Interval, theta: (f64, f64)) -> Interval {
    let at = |t: f64| {
        let x = 2.0 * t - 1.0;
        (delta.lower * x, delta.upper * x)
    };
    let (lo_a, lo_b) = at(theta.0);
    let (hi_a, hi_b) = at(theta.1);
    Interval {
        lower: lo_a.min(lo_b),
        upper: hi_a.max(hi_b),
    }
}

/// What the tests show on the matured pairs.
struct Shown {
    pairs: PairedLabels,
    /// `ln` of the tempered e-value against the candidate.
    log_e: f64,
    design_effect: f64,
    /// Candidate error rate minus the champion's, `p₁₀ − p₀₁`.
    difference: Interval,
    alpha: f64,
}

impl Shown {
    fn of(plan: &Plan, pairs: PairedLabels, alpha: f64) -> Shown {
        let cfg = &plan.gates.quality;
        let worst = cfg.unlabelled == Unlabelled::WorstCase;
        let (a, b) = (pairs.candidate_only_wrong, pairs.champion_only_wrong);
        let u = if worst { pairs.unlabelled() } else { 0 };
        let n = if worst { pairs.matured } else { pairs.labelled };
        let (fail_pick, share_pick): (Pick, Pick) = if worst {
            (pair_picks::fail_worst, pair_picks::share_worst)
        } else {
            (pair_picks::fail_random, pair_picks::share_random)
        };
        let d = count_design_effect(&pairs.units, fail_pick);
        let mut test = ConditionalBinomial::spanning(cfg.max_error_ratio, RATIO_SPAN);
        test.update(b + u, a, 0.5);
        // PASS: δ, the share of matured pairs that are A, B or U; θ, the
        // share of those against the candidate (A or U). Each at α/2.
        let discordant = a + b + u;
        let delta = robbins_cs_tempered(
            discordant,
            n,
            count_design_effect(&pairs.units, share_pick),
            alpha / 2.0,
        );
        let theta_pick: Pick = if worst {
            pair_picks::against_worst
        } else {
            pair_picks::fail_random
        };
        let dt = count_design_effect(&pairs.units, theta_pick);
        let against = robbins_cs_tempered(a + u, discordant, dt, alpha / 2.0);
        // The lower end for reading: the unlabelled taken for the candidate.
        let for_reading = robbins_cs_tempered(a, discordant, dt, alpha / 2.0);
        let difference = share_difference(delta, (for_reading.lower, against.upper));
        Shown {
            log_e: test.log_e_value_tempered(1.0 / d),
            design_effect: d,
            difference,
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
            label_window_ms: cfg.label_window_ms(),
            unlabelled: cfg.unlabelled,
        },
    )
}

/// What the CANARY tests showed over the canary epochs, and the current
/// stage's matured answers.
struct CanaryShown {
    /// Over every canary epoch: (candidate, champion).
    all: (ArmLabels, ArmLabels),
    /// Over the current stage's epochs.
    stage: (ArmLabels, ArmLabels),
    log_e: f64,
    design_effect: f64,
    difference: Interval,
}

impl CanaryShown {
    fn of(
        plan: &Plan,
        alpha: f64,
        rows: &[Recorded],
        (ids, now): ((&str, &str), Timestamp),
        (canary_from, stage_from): (Epoch, Epoch),
    ) -> Self {
        let cfg = &plan.gates.quality;
        let worst = cfg.unlabelled == Unlabelled::WorstCase;
        let mut test = ConditionalBinomial::spanning(cfg.max_error_ratio, RATIO_SPAN);
        let (mut all, mut stage) = (
            (ArmLabels::default(), ArmLabels::default()),
            (ArmLabels::default(), ArmLabels::default()),
        );
        let maturity = Maturity::of(cfg, now.0);
        for (e, l) in &unpaired(rows, ids, (cfg, maturity), canary_from) {
            let (c, h) = (&l.candidate, &l.champion);
            all = (all.0.plus(c), all.1.plus(h));
            if *e >= stage_from {
                stage = (stage.0.plus(c), stage.1.plus(h));
            }
            // Worst case: the champion's unlabelled answers may all be
            // wrong, the candidate's all right; the share is of matured
            // answers (the split's). At random: of labelled answers, so
            // arms labelled at different rates stay comparable.
            let (nc, nh, against_h) = if worst {
                (c.recorded, h.recorded, h.wrong + h.unlabelled())
            } else {
                (c.labelled, h.labelled, h.wrong)
            };
            if nc + nh == 0 {
                continue;
            }
            test.update(against_h, c.wrong, nc as f64 / (nc + nh) as f64);
        }
        let (pick_c, pick_h): (Pick, Pick) = if worst {
            (arm_picks::wrong_of_matured, arm_picks::wrong_or_unlabelled)
        } else {
            (arm_picks::wrong_of_labelled, arm_picks::wrong_of_labelled)
        };
        let d = ratio_design_effect_each((&all.0.units, pick_c), (&all.1.units, pick_h));
        let (c, h) = &stage;
        // One arm's error rate, `(wrong, out of)`, tempered by its own
        // groups counted the same way.
        let rate = |(wrong, of): (u64, u64), a: &ArmLabels, pick: Pick| {
            robbins_cs_tempered(wrong, of, count_design_effect(&a.units, pick), alpha / 2.0)
        };
        let (ic, ih) = if worst {
            (
                rate(
                    (c.wrong + c.unlabelled(), c.recorded),
                    c,
                    arm_picks::wrong_or_unlabelled,
                ),
                rate((h.wrong, h.recorded), h, arm_picks::wrong_of_matured),
            )
        } else {
            let pick = arm_picks::wrong_of_labelled;
            (
                rate((c.wrong, c.labelled), c, pick),
                rate((h.wrong, h.labelled), h, pick),
            )
        };
        CanaryShown {
            log_e: test.log_e_value_tempered(1.0 / d),
            design_effect: d,
            difference: Interval {
                lower: ic.lower - ih.upper,
                upper: ic.upper - ih.lower,
            },
            all,
            stage,
        }
    }

    /// The gate's outcome: failed when shown worse, passed when shown
    /// within budget on enough labels.
    fn decide(&self, plan: &Plan, alpha: f64) -> (Outcome, Reason) {
        let cfg = &plan.gates.quality;
        let (c, h) = &self.stage;
        let (need_c, need_h) = (
            labels_needed(plan, c.recorded),
            labels_needed(plan, h.recorded),
        );
        if self.log_e >= (1.0 / alpha).ln() {
            (Outcome::Fail, Reason::Breach)
        } else if c.labelled < need_c {
            (
                Outcome::Wait,
                Reason::InsufficientSamples {
                    have: c.labelled,
                    need: need_c,
                },
            )
        } else if h.labelled < need_h {
            (
                Outcome::Wait,
                Reason::ChampionNoVerdict {
                    have: h.labelled,
                    need: need_h,
                },
            )
        } else if self.difference.upper <= cfg.margin {
            (Outcome::Pass, Reason::WithinBudget)
        } else {
            (Outcome::Wait, Reason::Inconclusive)
        }
    }
}

/// The quality gate's verdict in a CANARY stage at `alpha`, at `now`: the
/// unpaired test over the canary epochs (from the first of `from`),
/// passed on the current stage's (from the second); `rows`: `None` when
/// they could not be read (the gate waits).
fn canary_quality_gate(
    plan: &Plan,
    alpha: f64,
    (rows, ids, now): (Option<&[Recorded]>, (&str, &str), Timestamp),
    from: (Epoch, Epoch),
) -> GateVerdict {
    let cfg = &plan.gates.quality;
    let shown = CanaryShown::of(plan, alpha, rows.unwrap_or(&[]), (ids, now), from);
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
                coverage_differs: false,
            }),
            label_window_ms: cfg.label_window_ms(),
            unlabelled: cfg.unlabelled,
        },
    )
}

/// The watch after promotion (`Phase::Watching`): the SHADOW stage's
/// paired test, continued on every matured labelled pair of the rollout —
/// those of the SHADOW stage, and those of the watch, where the promoted
/// revision answers and the previous champion is mirrored. One e-process
/// from the first pair to the watch's end, at the share of `α` the plan
/// gives it, so looking on after promotion spends nothing more. It fails
/// (a regression shown) or waits; it never ends the watch early.
pub fn watch_verdict(
    plan: &Plan,
    rows: Option<&[Recorded]>,
    ids: (&str, &str),
    (now, elapsed): (Timestamp, std::time::Duration),
) -> crate::stage::StageVerdict {
    use crate::stage::{StageKind, StageReason, StageVerdict};
    let gate = quality_gate(plan, super::metric_alpha(plan), rows, ids, now);
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

/// The matured labelled pairs an equally good candidate's SHADOW stage
/// needs to pass at the plan's `margin`, when a share `discordant` of the
/// labelled pairs is discordant (half each way) and a share `coverage` of
/// matured pairs is labelled (under `worst_case` the rest count against a
/// pass): the fewest at which the PASS bound, on counts at their expected
/// values, is within the margin (`None`: not within a billion). The key
/// taken as independent (a design effect widens it).
pub fn pairs_to_pass(plan: &Plan, discordant: f64, coverage: f64) -> Option<u64> {
    let alpha = super::metric_alpha(plan);
    let d = discordant.clamp(0.0, 1.0);
    let within = |n: u64| {
        let (_, u) = cohort(plan, n, coverage);
        let against = (d * n as f64 / 2.0).round() as u64;
        let k = 2 * against + u;
        let delta = robbins_cs_tempered(k, n + u, 1.0, alpha / 2.0);
        let theta = robbins_cs_tempered(against + u, k, 1.0, alpha / 2.0);
        share_difference(delta, (theta.lower, theta.upper)).upper <= plan.gates.quality.margin
    };
    fewest(within).map(|n| n.max(labels_needed(plan, cohort(plan, n, coverage).0)))
}

/// The labelled answers each arm of a CANARY stage needs for an equally
/// good candidate to pass at the plan's `margin`, both arms wrong on a
/// share `error_rate` of their labelled answers and labelled on a share
/// `coverage` of their matured ones (under `worst_case` the candidate's
/// unlabelled count as wrong, the champion's as right: the PASS bound's
/// own reading), as [`pairs_to_pass`].
pub fn answers_to_pass(plan: &Plan, error_rate: f64, coverage: f64) -> Option<u64> {
    let alpha = super::metric_alpha(plan);
    let e = error_rate.clamp(0.0, 1.0);
    let within = |n: u64| {
        let (_, u) = cohort(plan, n, coverage);
        let k = (e * n as f64).round() as u64;
        let candidate = robbins_cs_tempered(k + u, n + u, 1.0, alpha / 2.0);
        let champion = robbins_cs_tempered(k, n + u, 1.0, alpha / 2.0);
        candidate.upper - champion.lower <= plan.gates.quality.margin
    };
    fewest(within).map(|n| n.max(labels_needed(plan, cohort(plan, n, coverage).0)))
}

/// The cohort behind `n` labelled answers at `coverage`: its matured
/// answers, and the unlabelled ones the tests count (all of them under
/// `worst_case`, none declared at random).
fn cohort(plan: &Plan, n: u64, coverage: f64) -> (u64, u64) {
    let matured = (n as f64 / coverage.clamp(1e-9, 1.0)).round() as u64;
    let counted = match plan.gates.quality.unlabelled {
        Unlabelled::WorstCase => matured.saturating_sub(n),
        Unlabelled::AtRandom => 0,
    };
    (matured, counted)
}

/// The least `n` in 1..=10⁹ for which `within(n)` holds, for a `within`
/// that stays true once true (bisection after doubling).
fn fewest(within: impl Fn(u64) -> bool) -> Option<u64> {
    let mut hi = 1u64;
    while !within(hi) {
        hi = hi.checked_mul(2).filter(|&h| h <= 1 << 30)?;
    }
    let mut lo = hi / 2;
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if within(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Some(hi)
}
