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
//! up, in [`crate::safety`].
//!
//! This module holds what both policies share: the verdict types and the
//! verdict each gate draws from bounds; the bounds themselves are each
//! policy's ([`crate::policy`]).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::histogram::QuantileBounds;
use crate::plan::{GuardRails, LatencyGate, ShadowGate, ShiftGate};
use crate::snapshot::{PairStats, RevisionStats};
use crate::stats::{Interval, rate};

/// The three answers of a gate. Ordered by severity: `Pass < Wait < Fail`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Pass,
    Wait,
    Fail,
}

/// Which gate spoke.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum GateKind {
    ErrorRate,
    Latency,
    PredictionShift,
    ShadowAgreement,
    GuardRails,
    /// Quality from delayed labels, on labelled mirrored pairs.
    Quality,
}

impl GateKind {
    pub fn as_str(self) -> &'static str {
        match self {
            GateKind::ErrorRate => "error_rate",
            GateKind::Latency => "latency",
            GateKind::PredictionShift => "prediction_shift",
            GateKind::ShadowAgreement => "shadow_agreement",
            GateKind::GuardRails => "guard_rails",
            GateKind::Quality => "quality",
        }
    }
}

/// Why a gate answered as it did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "code", rename_all = "snake_case")]
pub enum Reason {
    /// The bound shows the candidate within budget.
    WithinBudget,
    /// The candidate arm has too few samples to judge.
    InsufficientSamples { have: u64, need: u64 },
    /// The candidate's requests come from fewer unit groups (of keys) than
    /// the 8 needed to judge per key: the gate may fail but not pass
    /// (docs/statistics.md, "The statistical unit").
    TooFewKeys {
        groups: u64,
        need: u64,
        /// The keys the model's traffic carries: declared (`plan.keys`) or
        /// estimated from the unit groups it occupies; absent when many.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        keys: Option<u64>,
    },
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
    /// Part of the gate could not be evaluated on what was measured (not
    /// a pass: the gate waits, and an on-time stage names it).
    NotEvaluated { what: String },
    /// The arms' answers are labelled at shown different rates: the
    /// quality test's assumption (labelling does not depend on the arm)
    /// does not hold, so it neither passes nor fails; the stage holds, and
    /// fails safe at the label deadline.
    LabelCoverageDiffers {
        candidate_labelled: u64,
        candidate_recorded: u64,
        champion_labelled: u64,
        champion_recorded: u64,
    },
}

/// Failures out of requests for one arm, and the client errors (4xx)
/// answered beside them (not counted in `requests`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Counts {
    pub failures: u64,
    pub requests: u64,
    pub rate: f64,
    #[serde(default)]
    pub client_errors: u64,
}

impl Counts {
    pub(crate) fn of(s: &RevisionStats) -> Counts {
        Counts {
            failures: s.failure_count(),
            requests: s.requests(),
            rate: rate(s.failure_count(), s.requests()),
            client_errors: s.client_errors(),
        }
    }

    /// Answers of any kind: requests and client errors.
    pub fn answers(&self) -> u64 {
        self.requests + self.client_errors
    }
}

/// Both arms' counts in one routing epoch: the strata the `sequential`
/// error tests compare within (a shared outage or a routing change starts
/// a new one).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EpochCounts {
    pub epoch: u32,
    pub candidate: Counts,
    pub champion: Counts,
}

/// What the `sequential` policy's one-sided shadow tests showed: they
/// decide, the intervals beside them are for reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ShadowShown {
    /// Agreement shown below `min_agreement`.
    pub agreement_below: bool,
    /// The confident-flip rate shown above `max_flip_rate`.
    pub flips_above: bool,
    /// Agreement shown at or above `min_agreement`.
    #[serde(default)]
    pub agreement_above: bool,
    /// The confident-flip rate shown at or below `max_flip_rate` (or not
    /// tested: `max_flip_rate` = 1).
    #[serde(default)]
    pub flips_below: bool,
    /// Both shown within their limits.
    pub within: bool,
}

/// The candidate's own failure rate against `negligible_error_rate`: shown
/// below it (its anytime upper bound under the limit), the error gate may
/// pass without the non-inferiority test.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Negligible {
    /// The upper bound of the candidate's own failure rate.
    pub upper: f64,
    /// `negligible_error_rate`.
    pub limit: f64,
}

/// One quantile of both arms, and what the bounds show.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ClassShift {
    pub class: String,
    pub candidate_rate: f64,
    pub champion_rate: f64,
    /// Bound on candidate rate minus champion rate.
    pub difference: Interval,
}

/// The numbers behind a verdict: what an operator reads in the audit log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
        /// The design effect the client-error test was tempered by.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        client_error_design_effect: Option<f64>,
        /// `sequential`: the candidate's own failure rate against the
        /// negligible rate (the other way to pass).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        negligible: Option<Negligible>,
        /// The e-value at which the failure and client-error tests fail
        /// (`sequential`: `2/α`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        fail_at: Option<f64>,
        /// The e-value at which the non-inferiority test passes
        /// (`sequential`: `1/α`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pass_at: Option<f64>,
        /// The epochs the tests compared within (`sequential`); `candidate`
        /// and `champion` above are pooled over the rollout.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        epochs: Vec<EpochCounts>,
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
        /// The e-value at which it fails (`sequential`: `1/α`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        fail_at: Option<f64>,
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
        /// `sequential`: what its tests showed (they decide).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        shown: Option<ShadowShown>,
    },
    Quality {
        /// The labelled mirrored pairs, judged by their labels.
        pairs: crate::labels::PairedLabels,
        /// Bound on the candidate's error rate minus the champion's, on
        /// the matured pairs (CANARY: the stage's matured answers).
        difference: Interval,
        margin: f64,
        /// The discordant-pairs e-process's value (FAIL at `fail_at`).
        e_value: f64,
        fail_at: f64,
        /// The design effect it was tempered by (the key is the unit).
        design_effect: f64,
        max_error_ratio: f64,
        /// The labelled share of the matured pairs (CANARY: of the
        /// candidate's matured answers), and its floor.
        coverage: f64,
        min_coverage: f64,
        /// In CANARY stages: each arm's labelled answers (the unpaired
        /// test); `pairs` is then empty.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        canary: Option<crate::labels::CanaryLabels>,
        /// How old an answer must be to be judged (0: no window).
        #[serde(default)]
        label_window_ms: u64,
        /// How matured answers without a label were judged.
        #[serde(default)]
        unlabelled: crate::plan::Unlabelled,
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
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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

    /// Below its sample floor (or waiting for the champion's).
    pub fn starving(&self) -> bool {
        matches!(
            self.reason,
            Reason::InsufficientSamples { .. }
                | Reason::ChampionNoVerdict { .. }
                | Reason::TooFewKeys { .. }
                | Reason::LabelCoverageDiffers { .. }
        )
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
    /// The e-value at which it fails.
    pub fail_at: f64,
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
        fail_at: judgement.map(|j| j.fail_at),
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
    shown: Option<ShadowShown>,
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
    // Flips are judged on the champion's confident answers: with none (a
    // model that reports no confidence) that half of the gate cannot pass,
    // and the verdict says why rather than "inconclusive".
    let (outcome, reason) =
        if reason == Reason::Inconclusive && cfg.max_flip_rate < 1.0 && p.champion_confident() == 0
        {
            (
                Outcome::Wait,
                Reason::NotEvaluated {
                    what: "high-confidence flips: no pair had a confident champion answer \
                       (set max_flip_rate = 1.0 for models without confidence)"
                        .into(),
                },
            )
        } else {
            (outcome, reason)
        };
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
        shown,
    };
    GateVerdict::new(GateKind::ShadowAgreement, outcome, reason, evidence)
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
