//! The gates: pure functions from one window of measurements to a verdict
//! with its typed reason and evidence.
//!
//! Each gate compares the candidate with the champion over the same window
//! and answers three ways, kept apart as Kayenta and Argo keep
//! Inconclusive/NoData apart from Fail:
//! - `Fail`: a bound shows the candidate is worse than its budget;
//! - `Pass`: a bound shows it is not;
//! - `Wait`: not enough evidence either way. `Wait` is never `Pass`.
//!
//! A gate judges the candidate only once the champion has a verdict of its
//! own (enough samples in the window). Champion outages are handled one level
//! up, in [`crate::stage`].

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::histogram::{LatencyHistogram, QuantileBounds};
use crate::plan::{ErrorRateGate, GuardRails, LatencyGate, ShadowGate, ShiftGate};
use crate::snapshot::{PairStats, RevisionStats};
use crate::stats::{Interval, newcombe, rate, wilson, z_two_sided};

/// The three answers of a gate. Ordered by severity: `Pass < Wait < Fail`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Pass,
    Wait,
    Fail,
}

/// Which gate spoke.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GateKind {
    ErrorRate,
    Latency,
    PredictionShift,
    ShadowAgreement,
    GuardRails,
}

impl GateKind {
    pub fn as_str(self) -> &'static str {
        match self {
            GateKind::ErrorRate => "error_rate",
            GateKind::Latency => "latency",
            GateKind::PredictionShift => "prediction_shift",
            GateKind::ShadowAgreement => "shadow_agreement",
            GateKind::GuardRails => "guard_rails",
        }
    }
}

/// Why a gate answered as it did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "code", rename_all = "snake_case")]
pub enum Reason {
    /// The bound shows the candidate within budget.
    WithinBudget,
    /// The candidate arm has too few samples to judge.
    InsufficientSamples { have: u64, need: u64 },
    /// The champion has too few samples to judge, so the candidate cannot be
    /// judged against it either.
    ChampionNoVerdict { have: u64, need: u64 },
    /// Enough samples, but the bound straddles the budget.
    Inconclusive,
    /// The bound shows the candidate beyond budget.
    Breach,
    /// Beyond budget by so much that no confirmation is needed.
    GrossBreach,
    /// Traffic was seen but this metric was not reported.
    MetricsMissing { metric: String },
}

/// Failures out of requests for one arm.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Counts {
    pub failures: u64,
    pub requests: u64,
    pub rate: f64,
}

impl Counts {
    pub(crate) fn of(s: &RevisionStats) -> Counts {
        Counts {
            failures: s.failure_count(),
            requests: s.requests(),
            rate: rate(s.failure_count(), s.requests()),
        }
    }
}

/// One quantile of both arms, and what the bounds show.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct QuantileComparison {
    pub quantile: f64,
    pub candidate: QuantileBounds,
    pub champion: QuantileBounds,
    pub max_ratio: f64,
    pub max_added_ms: f64,
    /// Candidate lower bound beyond both margins over the champion's upper bound.
    pub regressed: bool,
    /// Candidate upper bound within a margin of the champion's lower bound.
    pub not_regressed: bool,
}

/// One class's rate in both arms.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassShift {
    pub class: String,
    pub candidate_rate: f64,
    pub champion_rate: f64,
    /// Bound on candidate rate minus champion rate.
    pub difference: Interval,
}

/// The numbers behind a verdict: what an operator reads in the audit log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Evidence {
    ErrorRate {
        candidate: Counts,
        champion: Counts,
        /// Bound on candidate rate minus champion rate.
        difference: Interval,
        margin: f64,
        /// Wilson bound on the candidate's own rate (for the gross rule).
        candidate_rate: Interval,
        champion_rate: Interval,
        /// The failures e-process's value (`sequential`: FAIL at `2/α`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        e_value: Option<f64>,
        /// The client-errors e-process's value (`sequential`: FAIL at `2/α`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        client_error_e_value: Option<f64>,
        /// The non-inferiority e-process's value (`sequential`,
        /// `on_evidence`: PASS at `1/α`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pass_e_value: Option<f64>,
        /// The design effect the error tests were tempered by: the key,
        /// not the request, is the unit (see `rollgate_core::unit`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        design_effect: Option<f64>,
    },
    Latency {
        candidate_successes: u64,
        champion_successes: u64,
        median: Option<QuantileComparison>,
        tail: Option<QuantileComparison>,
    },
    PredictionShift {
        candidate_predictions: u64,
        champion_predictions: u64,
        /// `windowed`: the per-class difference budget.
        margin: f64,
        /// `windowed`: the decision's bounds; `sequential`: Robbins
        /// sequences per class, for reading.
        classes: Vec<ClassShift>,
        /// The class-distribution e-process's value (`sequential`: FAIL at `1/α`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        e_value: Option<f64>,
        /// The rate ratio it tests against (`sequential`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_class_ratio: Option<f64>,
    },
    ShadowAgreement {
        pairs: u64,
        agreements: u64,
        agreement: Interval,
        min_agreement: f64,
        champion_confident: u64,
        confident_flips: u64,
        flip_rate: Interval,
        max_flip_rate: f64,
        mirror_dropped: u64,
    },
    GuardRails {
        candidate: Counts,
        error_rate: Interval,
        max_error_rate: Option<f64>,
        p95: Option<QuantileBounds>,
        max_p95_ms: Option<f64>,
    },
}

/// A gate's answer, its reason and its evidence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GateVerdict {
    pub gate: GateKind,
    pub outcome: Outcome,
    pub reason: Reason,
    pub evidence: Evidence,
}

impl GateVerdict {
    pub(crate) fn new(
        gate: GateKind,
        outcome: Outcome,
        reason: Reason,
        evidence: Evidence,
    ) -> Self {
        GateVerdict {
            gate,
            outcome,
            reason,
            evidence,
        }
    }

    pub fn is_gross(&self) -> bool {
        self.reason == Reason::GrossBreach
    }

    pub fn metrics_missing(&self) -> bool {
        matches!(self.reason, Reason::MetricsMissing { .. })
    }
}

/// The two arms of one window.
#[derive(Debug, Clone, Copy)]
pub struct Arms<'a> {
    pub champion: &'a RevisionStats,
    pub candidate: &'a RevisionStats,
}

/// `Wait` when either arm is below its floor; the candidate is checked first
/// so that its own shortage is reported before the champion's.
pub(crate) fn sample_floor(candidate: u64, champion: u64, need: u64) -> Option<Reason> {
    if candidate < need {
        Some(Reason::InsufficientSamples {
            have: candidate,
            need,
        })
    } else if champion < need {
        Some(Reason::ChampionNoVerdict {
            have: champion,
            need,
        })
    } else {
        None
    }
}

/// Successes seen but no latency recorded for an arm: the metric is missing.
pub(crate) fn latency_missing(c: &RevisionStats, h: &RevisionStats) -> Option<Reason> {
    let missing = |s: &RevisionStats| s.successes() > 0 && s.latency().is_empty();
    (missing(c) || missing(h)).then(|| Reason::MetricsMissing {
        metric: "latency".into(),
    })
}

/// The three-way decision every gate makes, whatever its bounds: missing
/// metrics wait; a breach fails; below the sample floor waits; shown within
/// budget passes; anything else is inconclusive. `anytime`: the bounds stay
/// valid at every sample size (the `sequential` policy), so a breach fails
/// even before the floor; fixed-horizon bounds judge only from the floor on.
pub(crate) fn decide(
    missing: Option<Reason>,
    floor: Option<Reason>,
    breached: bool,
    within: bool,
    anytime: bool,
) -> (Outcome, Reason) {
    if let Some(r) = missing {
        (Outcome::Wait, r)
    } else if breached && (anytime || floor.is_none()) {
        (Outcome::Fail, Reason::Breach)
    } else if let Some(r) = floor {
        (Outcome::Wait, r)
    } else if within {
        (Outcome::Pass, Reason::WithinBudget)
    } else {
        (Outcome::Wait, Reason::Inconclusive)
    }
}

/// The latency verdict from the two quantile comparisons: FAIL iff the
/// median AND the tail regressed; PASS iff either is shown not to have.
pub(crate) fn latency_verdict(
    cfg: &LatencyGate,
    arms: Arms,
    median: Option<QuantileComparison>,
    tail: Option<QuantileComparison>,
    anytime: bool,
) -> GateVerdict {
    let (c, h) = (arms.candidate, arms.champion);
    let both = |f: fn(&QuantileComparison) -> bool, all: bool| match (&median, &tail) {
        (Some(m), Some(t)) if all => f(m) && f(t),
        (Some(m), Some(t)) => f(m) || f(t),
        _ => false,
    };
    let (outcome, reason) = decide(
        latency_missing(c, h),
        sample_floor(c.latency().len(), h.latency().len(), cfg.min_requests),
        both(|q| q.regressed, true),
        both(|q| q.not_regressed, false),
        anytime,
    );
    let evidence = Evidence::Latency {
        candidate_successes: c.successes(),
        champion_successes: h.successes(),
        median,
        tail,
    };
    GateVerdict::new(GateKind::Latency, outcome, reason, evidence)
}

/// What the `sequential` policy's class-distribution test showed (see
/// `sequential::shift_tests`); the windowed policy decides on the margin.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ShiftJudgement {
    pub breached: bool,
    pub within: bool,
    pub e_value: f64,
    pub max_class_ratio: f64,
}

/// Per-class prediction rates of both arms, each difference bounded by
/// `bound(k_candidate, n_candidate, k_champion, n_champion, classes)`.
/// Without a `judgement`: FAIL iff some class is confidently beyond
/// ±margin, PASS iff every class is confidently within.
pub(crate) fn shift_verdict(
    cfg: &ShiftGate,
    arms: Arms,
    bound: impl Fn(u64, u64, u64, u64, usize) -> Interval,
    judgement: Option<ShiftJudgement>,
    anytime: bool,
) -> GateVerdict {
    let (c, h) = (arms.candidate, arms.champion);
    let total = |s: &RevisionStats| s.predictions().values().sum::<u64>();
    let (nc, nh) = (total(c), total(h));
    let classes: BTreeSet<&String> = c
        .predictions()
        .keys()
        .chain(h.predictions().keys())
        .collect();
    let shifts: Vec<ClassShift> = classes
        .iter()
        .map(|&k| {
            let kc = c.predictions().get(k).copied().unwrap_or(0);
            let kh = h.predictions().get(k).copied().unwrap_or(0);
            ClassShift {
                class: k.clone(),
                candidate_rate: rate(kc, nc),
                champion_rate: rate(kh, nh),
                difference: bound(kc, nc, kh, nh, classes.len()),
            }
        })
        .collect();
    let (breached, within) = judgement.map_or_else(
        || {
            (
                shifts
                    .iter()
                    .any(|s| s.difference.lower > cfg.margin || s.difference.upper < -cfg.margin),
                shifts
                    .iter()
                    .all(|s| s.difference.lower >= -cfg.margin && s.difference.upper <= cfg.margin),
            )
        },
        |j| (j.breached, j.within),
    );
    let missing = |s: &RevisionStats, n: u64| s.successes() > 0 && n == 0;
    let (outcome, reason) = decide(
        (missing(c, nc) || missing(h, nh)).then(|| Reason::MetricsMissing {
            metric: "predictions".into(),
        }),
        sample_floor(nc, nh, cfg.min_predictions),
        breached,
        within,
        anytime,
    );
    let evidence = Evidence::PredictionShift {
        candidate_predictions: nc,
        champion_predictions: nh,
        margin: cfg.margin,
        classes: shifts,
        e_value: judgement.map(|j| j.e_value),
        max_class_ratio: judgement.map(|j| j.max_class_ratio),
    };
    GateVerdict::new(GateKind::PredictionShift, outcome, reason, evidence)
}

/// The shadow verdict, given what the policy's bounds show: `breached`
/// (agreement or flips confidently beyond budget) and `within` (both
/// confidently inside); `agreement` and `flip_rate` are shown as evidence.
pub(crate) fn shadow_verdict(
    cfg: &ShadowGate,
    arms: Arms,
    p: &PairStats,
    (agreement, flip_rate): (Interval, Interval),
    (breached, within): (bool, bool),
    anytime: bool,
) -> GateVerdict {
    let answered_both = arms.candidate.successes() > 0 && arms.champion.successes() > 0;
    let (outcome, reason) = decide(
        (answered_both && p.pairs() == 0).then(|| Reason::MetricsMissing {
            metric: "pairs".into(),
        }),
        (p.pairs() < cfg.min_pairs).then_some(Reason::InsufficientSamples {
            have: p.pairs(),
            need: cfg.min_pairs,
        }),
        breached,
        within,
        anytime,
    );
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
    GateVerdict::new(GateKind::ShadowAgreement, outcome, reason, evidence)
}

/// Error rate, candidate minus champion (Newcombe interval).
/// Fail iff `lower > margin`; pass iff `upper <= margin`.
pub fn error_rate_gate(cfg: &ErrorRateGate, arms: Arms, alpha: f64) -> GateVerdict {
    let z = z_two_sided(alpha);
    let (c, h) = (arms.candidate, arms.champion);
    let difference = newcombe(
        c.failure_count(),
        c.requests(),
        h.failure_count(),
        h.requests(),
        z,
    );
    let candidate_rate = wilson(c.failure_count(), c.requests(), z);
    let champion_rate = wilson(h.failure_count(), h.requests(), z);
    let evidence = Evidence::ErrorRate {
        candidate: Counts::of(c),
        champion: Counts::of(h),
        difference,
        margin: cfg.margin,
        candidate_rate,
        champion_rate,
        e_value: None,
        client_error_e_value: None,
        pass_e_value: None,
        design_effect: None,
    };
    let (outcome, reason) =
        if let Some(r) = sample_floor(c.requests(), h.requests(), cfg.min_requests) {
            (Outcome::Wait, r)
        } else if candidate_rate.lower > cfg.gross_error_rate
            && champion_rate.upper < cfg.gross_error_rate
        {
            (Outcome::Fail, Reason::GrossBreach)
        } else if difference.lower > cfg.margin {
            (Outcome::Fail, Reason::Breach)
        } else if difference.upper <= cfg.margin {
            (Outcome::Pass, Reason::WithinBudget)
        } else {
            (Outcome::Wait, Reason::Inconclusive)
        };
    GateVerdict::new(GateKind::ErrorRate, outcome, reason, evidence)
}

/// Compares one quantile of both arms from their bounds. A side that the
/// sample cannot bound takes its conservative value (0 below, infinity
/// above), so it can never show a regression or its absence. Shared by both
/// policies: only the way the bounds are made differs.
pub(crate) fn judge_quantile(
    q: f64,
    c: QuantileBounds,
    h: QuantileBounds,
    max_ratio: f64,
    max_added_ms: f64,
) -> QuantileComparison {
    let lo = |b: Option<u64>| b.map_or(0.0, |v| v as f64);
    let hi = |b: Option<u64>| b.map_or(f64::INFINITY, |v| v as f64);
    let added_us = max_added_ms * 1000.0;
    let (c_lo, h_hi) = (lo(c.lower_us), hi(h.upper_us));
    let (c_hi, h_lo) = (hi(c.upper_us), lo(h.lower_us));
    QuantileComparison {
        quantile: q,
        candidate: c,
        champion: h,
        max_ratio,
        max_added_ms,
        regressed: h_hi.is_finite() && c_lo > h_hi * max_ratio && c_lo - h_hi > added_us,
        not_regressed: c_hi.is_finite() && (c_hi <= h_lo * max_ratio || c_hi - h_lo <= added_us),
    }
}

/// One quantile of both arms with distribution-free order-statistic bounds.
fn compare_quantile(
    q: f64,
    candidate: &LatencyHistogram,
    champion: &LatencyHistogram,
    max_ratio: f64,
    max_added_ms: f64,
    alpha: f64,
) -> Option<QuantileComparison> {
    let c = candidate.quantile_bounds(q, alpha)?;
    let h = champion.quantile_bounds(q, alpha)?;
    Some(judge_quantile(q, c, h, max_ratio, max_added_ms))
}

/// Latency of successes. Fail iff the median AND the tail have both
/// regressed with confidence; pass iff at least one of them is shown not to
/// have (the exact complement: the failing condition is then excluded).
pub fn latency_gate(cfg: &LatencyGate, arms: Arms, alpha: f64) -> GateVerdict {
    let (c, h) = (arms.candidate, arms.champion);
    let median = compare_quantile(
        0.5,
        c.latency(),
        h.latency(),
        cfg.median_ratio,
        cfg.median_ms,
        alpha,
    );
    let tail = compare_quantile(
        cfg.tail_quantile,
        c.latency(),
        h.latency(),
        cfg.tail_ratio,
        cfg.tail_ms,
        alpha,
    );
    latency_verdict(cfg, arms, median, tail, false)
}

/// Per-class prediction rates, candidate minus champion, each a Newcombe
/// interval at `alpha / classes` (Bonferroni). Fail iff some class is
/// confidently beyond ±margin; pass iff every class is confidently within.
pub fn prediction_shift_gate(cfg: &ShiftGate, arms: Arms, alpha: f64) -> GateVerdict {
    let bound = |kc, nc, kh, nh, classes: usize| {
        newcombe(kc, nc, kh, nh, z_two_sided(alpha / classes.max(1) as f64))
    };
    shift_verdict(cfg, arms, bound, None, false)
}

/// Paired champion/shadow answers: agreement must clear its budget (Wilson
/// lower bound) and high-confidence flips must stay under theirs (Wilson
/// upper bound). Fail when either bound shows the budget missed.
pub fn shadow_gate(
    cfg: &ShadowGate,
    arms: Arms,
    pairs: Option<&PairStats>,
    alpha: f64,
) -> GateVerdict {
    let z = z_two_sided(alpha);
    let p = pairs.copied().unwrap_or_default();
    let agreement = wilson(p.agreements(), p.pairs(), z);
    let flip_rate = wilson(p.confident_flips(), p.champion_confident(), z);
    shadow_verdict(
        cfg,
        arms,
        &p,
        (agreement, flip_rate),
        (
            agreement.upper < cfg.min_agreement || flip_rate.lower > cfg.max_flip_rate,
            agreement.lower >= cfg.min_agreement && flip_rate.upper <= cfg.max_flip_rate,
        ),
        false,
    )
}

/// Absolute limits on the candidate alone at two-sided level `alpha`
/// (fixed-sample bounds: the `windowed` policy). `None` when no rail is set.
/// A breach still needs a champion verdict (its floor met), as every gate.
pub fn guard_rail_gate(
    cfg: &GuardRails,
    min_requests: u64,
    arms: Arms,
    alpha: f64,
) -> Option<GateVerdict> {
    let c = arms.candidate;
    let error_rate = wilson(c.failure_count(), c.requests(), z_two_sided(alpha));
    let p95 = c.latency().quantile_bounds(0.95, alpha);
    guard_rail_verdict(cfg, min_requests, arms, error_rate, p95)
}

/// The guard-rail verdict from bounds on the candidate's error rate and p95
/// that the policy computed. `None` when no rail is set.
pub fn guard_rail_verdict(
    cfg: &GuardRails,
    min_requests: u64,
    arms: Arms,
    error_rate: Interval,
    p95: Option<QuantileBounds>,
) -> Option<GateVerdict> {
    if cfg.max_error_rate.is_none() && cfg.max_p95_ms.is_none() {
        return None;
    }
    let c = arms.candidate;
    let evidence = Evidence::GuardRails {
        candidate: Counts::of(c),
        error_rate,
        max_error_rate: cfg.max_error_rate,
        p95,
        max_p95_ms: cfg.max_p95_ms,
    };
    let p95_lower_ms = p95
        .and_then(|b| b.lower_us)
        .map_or(0.0, |v| v as f64 / 1000.0);
    let p95_upper_ms = p95
        .and_then(|b| b.upper_us)
        .map_or(f64::INFINITY, |v| v as f64 / 1000.0);
    let breached = cfg.max_error_rate.is_some_and(|m| error_rate.lower > m)
        || cfg.max_p95_ms.is_some_and(|m| p95_lower_ms > m);
    let within = cfg.max_error_rate.is_none_or(|m| error_rate.upper <= m)
        && cfg.max_p95_ms.is_none_or(|m| p95_upper_ms <= m);
    let (outcome, reason) =
        if let Some(r) = sample_floor(c.requests(), arms.champion.requests(), min_requests) {
            (Outcome::Wait, r)
        } else if breached {
            (Outcome::Fail, Reason::Breach)
        } else if within {
            (Outcome::Pass, Reason::WithinBudget)
        } else {
            (Outcome::Wait, Reason::Inconclusive)
        };
    Some(GateVerdict::new(
        GateKind::GuardRails,
        outcome,
        reason,
        evidence,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::FailureClass;
    use proptest::prelude::*;

    fn arm(requests: u64, failures: u64, latency_us: u64) -> RevisionStats {
        let mut s = RevisionStats::default();
        for i in 0..requests {
            if i < failures {
                s.record_failure(FailureClass::Upstream5xx);
            } else {
                // A little spread, deterministic.
                s.record_success(latency_us + (i % 10) * latency_us / 50, ["a"]);
            }
        }
        s
    }

    fn err_gate(c: &RevisionStats, h: &RevisionStats) -> GateVerdict {
        error_rate_gate(
            &ErrorRateGate::default(),
            Arms {
                champion: h,
                candidate: c,
            },
            0.05,
        )
    }

    #[test]
    fn error_gate_waits_below_the_candidate_floor() {
        let v = err_gate(&arm(10, 10, 1000), &arm(500, 0, 1000));
        assert_eq!(v.outcome, Outcome::Wait);
        assert_eq!(v.reason, Reason::InsufficientSamples { have: 10, need: 50 });
    }

    #[test]
    fn error_gate_waits_for_the_champions_verdict() {
        let v = err_gate(&arm(500, 500, 1000), &arm(10, 0, 1000));
        assert_eq!(v.outcome, Outcome::Wait);
        assert_eq!(v.reason, Reason::ChampionNoVerdict { have: 10, need: 50 });
    }

    #[test]
    fn always_failing_candidate_is_a_gross_breach() {
        let v = err_gate(&arm(50, 50, 1000), &arm(500, 0, 1000));
        assert_eq!((v.outcome, v.reason), (Outcome::Fail, Reason::GrossBreach));
    }

    #[test]
    fn clearly_worse_candidate_breaches_relative_to_champion() {
        let v = err_gate(&arm(1000, 80, 1000), &arm(1000, 10, 1000));
        assert_eq!((v.outcome, v.reason), (Outcome::Fail, Reason::Breach));
    }

    #[test]
    fn comparison_is_relative_three_percent_is_fine_against_four() {
        let v = err_gate(&arm(4000, 120, 1000), &arm(4000, 160, 1000));
        assert_eq!(v.outcome, Outcome::Pass);
    }

    #[test]
    fn single_error_against_clean_champion_does_not_breach() {
        let v = err_gate(&arm(100, 1, 1000), &arm(1000, 0, 1000));
        assert_ne!(v.outcome, Outcome::Fail);
    }

    #[test]
    fn identical_small_windows_are_inconclusive_not_pass() {
        let v = err_gate(&arm(60, 1, 1000), &arm(60, 1, 1000));
        assert_eq!((v.outcome, v.reason), (Outcome::Wait, Reason::Inconclusive));
    }

    fn lat_gate(c: &RevisionStats, h: &RevisionStats) -> GateVerdict {
        latency_gate(
            &LatencyGate::default(),
            Arms {
                champion: h,
                candidate: c,
            },
            0.05,
        )
    }

    #[test]
    fn latency_plus_100ms_on_20ms_median_breaches() {
        let v = lat_gate(&arm(200, 0, 120_000), &arm(200, 0, 20_000));
        assert_eq!((v.outcome, v.reason), (Outcome::Fail, Reason::Breach));
    }

    #[test]
    fn latency_of_identical_arms_passes() {
        let v = lat_gate(&arm(200, 0, 20_000), &arm(200, 0, 20_000));
        assert_eq!(v.outcome, Outcome::Pass);
    }

    #[test]
    fn tail_only_regression_does_not_breach() {
        // Same median; the candidate's slowest 10% are 10x slower.
        let mut c = RevisionStats::default();
        let mut h = RevisionStats::default();
        for i in 0..500u64 {
            h.record_success(20_000 + i, ["a"]);
            c.record_success(if i % 10 == 0 { 400_000 } else { 20_000 + i }, ["a"]);
        }
        let v = lat_gate(&c, &h);
        assert_ne!(v.outcome, Outcome::Fail);
        let Evidence::Latency { tail, median, .. } = v.evidence else {
            panic!("latency evidence")
        };
        assert!(tail.expect("tail").regressed);
        assert!(!median.expect("median").regressed);
    }

    #[test]
    fn latency_missing_while_successes_seen_is_reported() {
        let c = RevisionStats::from_parts(
            100,
            Default::default(),
            0,
            LatencyHistogram::new(),
            Default::default(),
        )
        .expect("valid");
        let v = lat_gate(&c, &arm(100, 0, 1000));
        assert_eq!(v.outcome, Outcome::Wait);
        assert!(v.metrics_missing());
    }

    fn classes(counts: &[(&str, u64)]) -> RevisionStats {
        let mut s = RevisionStats::default();
        for &(k, n) in counts {
            for _ in 0..n {
                s.record_success(1000, [k]);
            }
        }
        s
    }

    #[test]
    fn prediction_shift_breaches_on_a_large_rate_change() {
        let c = classes(&[("fraud", 600), ("ok", 400)]);
        let h = classes(&[("fraud", 300), ("ok", 700)]);
        let v = prediction_shift_gate(
            &ShiftGate::default(),
            Arms {
                champion: &h,
                candidate: &c,
            },
            0.05,
        );
        assert_eq!(v.outcome, Outcome::Fail);
    }

    #[test]
    fn prediction_shift_passes_on_similar_rates_and_reports_missing_predictions() {
        let c = classes(&[("fraud", 310), ("ok", 690)]);
        let h = classes(&[("fraud", 300), ("ok", 700)]);
        let arms = Arms {
            champion: &h,
            candidate: &c,
        };
        assert_eq!(
            prediction_shift_gate(&ShiftGate::default(), arms, 0.05).outcome,
            Outcome::Pass
        );
        let unlabeled = arm(1000, 0, 1000);
        let mut no_preds = RevisionStats::default();
        for _ in 0..1000 {
            no_preds.record_success(1000, std::iter::empty());
        }
        let _ = unlabeled;
        let v = prediction_shift_gate(
            &ShiftGate::default(),
            Arms {
                champion: &h,
                candidate: &no_preds,
            },
            0.05,
        );
        assert!(v.metrics_missing());
    }

    fn pairs(n: u64, agree: u64, confident: u64, flips: u64) -> PairStats {
        let mut p = PairStats::default();
        for i in 0..n {
            let is_flip = i < flips;
            let agreed = !is_flip && i < flips + agree;
            let conf = i < confident.max(flips);
            p.record_pair(agreed, conf);
        }
        p
    }

    fn shadow(p: PairStats) -> GateVerdict {
        let (c, h) = (arm(1000, 0, 1000), arm(1000, 0, 1000));
        shadow_gate(
            &ShadowGate::default(),
            Arms {
                champion: &h,
                candidate: &c,
            },
            Some(&p),
            0.05,
        )
    }

    #[test]
    fn shadow_with_broken_feature_flips_is_refused() {
        // 88% agreement, 12% of 500 confident decisions flipped.
        let v = shadow(pairs(1000, 880, 500, 60));
        assert_eq!((v.outcome, v.reason), (Outcome::Fail, Reason::Breach));
    }

    #[test]
    fn shadow_with_identical_answers_passes() {
        // Showing flips under the 2% budget takes ~190 confident pairs.
        let v = shadow(pairs(500, 500, 250, 0));
        assert_eq!(v.outcome, Outcome::Pass);
    }

    #[test]
    fn shadow_answers_without_pairs_are_missing_metrics() {
        let (c, h) = (arm(1000, 0, 1000), arm(1000, 0, 1000));
        let v = shadow_gate(
            &ShadowGate::default(),
            Arms {
                champion: &h,
                candidate: &c,
            },
            None,
            0.05,
        );
        assert!(v.metrics_missing());
        assert_eq!(v.outcome, Outcome::Wait);
    }

    #[test]
    fn guard_rails_are_absent_unless_configured() {
        let (c, h) = (arm(100, 0, 1000), arm(100, 0, 1000));
        let arms = Arms {
            champion: &h,
            candidate: &c,
        };
        assert!(guard_rail_gate(&GuardRails::default(), 50, arms, 0.05).is_none());
        let rails = GuardRails {
            max_p95_ms: Some(500.0),
            ..GuardRails::default()
        };
        let slow = arm(200, 0, 800_000);
        let v = guard_rail_gate(
            &rails,
            50,
            Arms {
                champion: &h,
                candidate: &slow,
            },
            0.05,
        )
        .expect("configured");
        assert_eq!(v.outcome, Outcome::Fail);
        let v = guard_rail_gate(&rails, 50, arms, 0.05).expect("configured");
        assert_eq!(v.outcome, Outcome::Pass);
    }

    proptest! {
        /// More candidate failures never make the error gate more lenient.
        #[test]
        fn error_gate_is_monotone_in_candidate_failures(n in 50u64..1500, k in 0u64..1500, hn in 50u64..1500, hk in 0u64..1500) {
            let k = k.min(n - 1);
            let hk = hk.min(hn);
            let h = arm(hn, hk, 1000);
            let a = err_gate(&arm(n, k, 1000), &h);
            let b = err_gate(&arm(n, k + 1, 1000), &h);
            prop_assert!(b.outcome >= a.outcome, "{:?} then {:?}", a, b);
        }

        /// Slowing every candidate request never makes the latency gate more lenient.
        #[test]
        fn latency_gate_is_monotone_in_candidate_latency(n in 50u64..400, base in 1_000u64..50_000, slow in 1.0f64..20.0, slower in 1.0f64..3.0) {
            let h = arm(n, 0, base);
            let a = lat_gate(&arm(n, 0, (base as f64 * slow) as u64), &h);
            let b = lat_gate(&arm(n, 0, (base as f64 * slow * slower) as u64), &h);
            prop_assert!(b.outcome >= a.outcome, "{:?} then {:?}", a.outcome, b.outcome);
        }

        /// No gate passes on an arm with no data.
        #[test]
        fn no_gate_passes_without_data(n in 0u64..2000, k in 0u64..2000) {
            let full = arm(n, k.min(n), 1000);
            let empty = RevisionStats::default();
            for (c, h) in [(&empty, &full), (&full, &empty)] {
                let arms = Arms { champion: h, candidate: c };
                prop_assert_ne!(error_rate_gate(&ErrorRateGate::default(), arms, 0.05).outcome, Outcome::Pass);
                prop_assert_ne!(latency_gate(&LatencyGate::default(), arms, 0.05).outcome, Outcome::Pass);
                prop_assert_ne!(prediction_shift_gate(&ShiftGate::default(), arms, 0.05).outcome, Outcome::Pass);
                prop_assert_ne!(shadow_gate(&ShadowGate::default(), arms, None, 0.05).outcome, Outcome::Pass);
            }
        }
    }
}
