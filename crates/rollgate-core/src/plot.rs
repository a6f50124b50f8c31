//! A gate's evidence as one number (or interval) against the limit it is
//! judged by: what the dashboard plots over a rollout's evaluations. One
//! measure per gate, chosen as the policy decides: the e-process against
//! its threshold under `sequential`, the bound against the margin under
//! `windowed`.

use serde::{Deserialize, Serialize};

use crate::gate::{ClassShift, Evidence, QuantileComparison};
use crate::histogram::QuantileBounds;
use crate::sequential::metric_alpha;
use crate::stats::Interval;
use crate::{GateVerdict, Plan};

/// Which side of the limit fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Fails {
    /// The gate fails when the measure (its lower bound) rises above the limit.
    Above,
    /// The gate fails when the measure (its upper bound) falls below the limit.
    Below,
}

/// One evaluation of one gate, as plotted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GatePoint {
    /// What is plotted, in words (e.g. "failures e-value").
    pub measure: String,
    /// The point estimate (or the e-value).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lower: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upper: Option<f64>,
    /// The threshold or margin the gate judges by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<f64>,
    pub fails: Fails,
    /// Plot on a log scale (e-values).
    pub log: bool,
    /// Both arms' own values at this look, plotted side by side (rates
    /// and latency).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arms: Option<ArmValues>,
}

/// The candidate's and the champion's value of one measure at one look.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ArmValues {
    /// What both values are (e.g. "failure rate in the current epoch (%)").
    pub measure: String,
    pub candidate: f64,
    pub champion: f64,
}

impl GatePoint {
    fn interval(measure: &str, lower: f64, upper: f64, limit: Option<f64>, fails: Fails) -> Self {
        GatePoint {
            measure: measure.into(),
            value: None,
            lower: Some(lower),
            upper: Some(upper),
            limit,
            fails,
            log: false,
            arms: None,
        }
    }

    fn e_value(measure: &str, e: f64, threshold: f64) -> Self {
        GatePoint {
            measure: measure.into(),
            value: Some(e),
            lower: None,
            upper: None,
            limit: Some(threshold),
            fails: Fails::Above,
            log: true,
            arms: None,
        }
    }

    fn with_arms(mut self, arms: Option<ArmValues>) -> Self {
        self.arms = arms;
        self
    }
}

fn ms(us: Option<u64>) -> Option<f64> {
    us.map(|u| u as f64 / 1000.0)
}

/// A latency quantile: the candidate's bounds in ms against the champion's
/// upper bound widened by both margins (a regression must exceed both).
fn latency(name: &str, q: &QuantileComparison) -> GatePoint {
    let limit = ms(q.champion.upper_us).map(|up| (up * q.max_ratio).max(up + q.max_added_ms));
    GatePoint {
        measure: format!("{name} candidate (ms)"),
        value: ms(Some(q.candidate.estimate_us)),
        lower: ms(q.candidate.lower_us),
        upper: ms(q.candidate.upper_us),
        limit,
        fails: Fails::Above,
        log: false,
        arms: Some(ArmValues {
            measure: format!("{name} estimate (ms)"),
            candidate: q.candidate.estimate_us as f64 / 1000.0,
            champion: q.champion.estimate_us as f64 / 1000.0,
        }),
    }
}

/// Both arms' failure rates (%) as the gate compared them: in the latest
/// epoch that has counts under `sequential`, over the window under
/// `windowed`; their 4xx shares of answers instead when either arm had
/// client errors there; `None` before either arm has an answer.
fn failure_rates(evidence: &Evidence) -> Option<ArmValues> {
    let Evidence::ErrorRate {
        candidate,
        champion,
        epochs,
        ..
    } = evidence
    else {
        return None;
    };
    let (c, h, measure) = match epochs.last() {
        Some(e) => (
            e.candidate,
            e.champion,
            format!("failure rate in epoch {} (%)", e.epoch),
        ),
        None => (*candidate, *champion, "failure rate (%)".to_string()),
    };
    if c.client_errors + h.client_errors > 0 {
        let share =
            |x: &crate::gate::Counts| crate::stats::rate(x.client_errors, x.answers()) * 100.0;
        return Some(ArmValues {
            measure: measure.replace("failure rate", "4xx share of answers"),
            candidate: share(&c),
            champion: share(&h),
        });
    }
    (c.requests + h.requests > 0).then_some(ArmValues {
        measure,
        candidate: c.rate * 100.0,
        champion: h.rate * 100.0,
    })
}

/// The plotted measure of one gate's verdict under `plan`; `None` when the
/// evidence has nothing to plot yet (no samples).
pub fn gate_point(g: &GateVerdict, plan: &Plan) -> Option<GatePoint> {
    let alpha = metric_alpha(plan);
    match &g.evidence {
        Evidence::ErrorRate {
            difference,
            margin,
            e_value,
            client_error_e_value,
            fail_at,
            ..
        } => Some(
            error_rate_point(
                difference,
                *margin,
                *e_value,
                *client_error_e_value,
                *fail_at,
                alpha,
            )
            .with_arms(failure_rates(&g.evidence)),
        ),
        Evidence::Latency { median, tail, .. } => match (tail, median) {
            (Some(t), _) => Some(latency("p95", t)),
            (None, Some(m)) => Some(latency("p50", m)),
            (None, None) => None,
        },
        Evidence::PredictionShift {
            classes,
            margin,
            e_value,
            ..
        } => prediction_shift_point(classes, *margin, *e_value, alpha),
        Evidence::ShadowAgreement {
            pairs,
            agreement,
            min_agreement,
            ..
        } => {
            if *pairs == 0 {
                return None;
            }
            Some(GatePoint::interval(
                "shadow agreement",
                agreement.lower,
                agreement.upper,
                Some(*min_agreement),
                Fails::Below,
            ))
        }
        Evidence::Quality {
            pairs,
            difference,
            margin,
            canary,
            ..
        } => (pairs.labelled > 0 || canary.as_ref().is_some_and(|c| c.candidate.labelled > 0))
            .then(|| {
                GatePoint::interval(
                    "labelled error rate, candidate - champion",
                    difference.lower,
                    difference.upper,
                    Some(*margin),
                    Fails::Above,
                )
            }),
        Evidence::GuardRails {
            error_rate,
            max_error_rate,
            p95,
            max_p95_ms,
            ..
        } => Some(guard_rail_point(
            error_rate,
            *max_error_rate,
            p95.as_ref(),
            *max_p95_ms,
        )),
    }
}

/// The error gate: under `sequential` its e-value against the threshold
/// it fails at (the two error tests fail at one threshold: the larger
/// decides), under `windowed` the difference's bounds against the margin.
fn error_rate_point(
    difference: &Interval,
    margin: f64,
    e_value: Option<f64>,
    client_error_e_value: Option<f64>,
    fail_at: Option<f64>,
    alpha: f64,
) -> GatePoint {
    match e_value {
        Some(e) => GatePoint::e_value(
            "error e-value (failures or 4xx, the larger)",
            e.max(client_error_e_value.unwrap_or(0.0)),
            fail_at.unwrap_or(2.0 / alpha),
        ),
        None => GatePoint::interval(
            "error-rate difference",
            difference.lower,
            difference.upper,
            Some(margin),
            Fails::Above,
        ),
    }
}

/// The prediction-shift gate: under `sequential` its e-value against
/// `1/α`, under `windowed` the class whose difference is farthest from
/// zero against the margin; `None` before any class was seen.
fn prediction_shift_point(
    classes: &[ClassShift],
    margin: f64,
    e_value: Option<f64>,
    alpha: f64,
) -> Option<GatePoint> {
    if let Some(e) = e_value {
        return Some(GatePoint::e_value("class-shift e-value", e, 1.0 / alpha));
    }
    // The class whose difference is farthest from zero.
    let far = |d: &Interval| d.lower.max(-d.upper);
    let worst = classes
        .iter()
        .max_by(|a, b| far(&a.difference).total_cmp(&far(&b.difference)))?;
    Some(GatePoint {
        measure: format!("class {:?}: distance of the difference from 0", worst.class),
        value: Some(far(&worst.difference)),
        lower: None,
        upper: None,
        limit: Some(margin),
        fails: Fails::Above,
        log: false,
        arms: None,
    })
}

/// The guard rails: the candidate's p95 against `max_p95_ms` when that is
/// the only rail, else its error rate's bounds against `max_error_rate`.
fn guard_rail_point(
    error_rate: &Interval,
    max_error_rate: Option<f64>,
    p95: Option<&QuantileBounds>,
    max_p95_ms: Option<f64>,
) -> GatePoint {
    match (max_error_rate, max_p95_ms) {
        (None, Some(max)) => GatePoint {
            measure: "p95 candidate (ms)".into(),
            value: ms(p95.map(|b| b.estimate_us)),
            lower: ms(p95.and_then(|b| b.lower_us)),
            upper: ms(p95.and_then(|b| b.upper_us)),
            limit: Some(max),
            fails: Fails::Above,
            log: false,
            arms: None,
        },
        (max, _) => GatePoint::interval(
            "candidate error rate",
            error_rate.lower,
            error_rate.upper,
            max,
            Fails::Above,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Policy;
    use crate::gate::{Counts, GateKind, Outcome, Reason};

    fn verdict(evidence: Evidence) -> GateVerdict {
        GateVerdict {
            gate: GateKind::ErrorRate,
            outcome: Outcome::Wait,
            reason: Reason::Inconclusive,
            evidence,
        }
    }

    fn error_rate(e_value: Option<f64>) -> Evidence {
        let c = Counts {
            failures: 1,
            requests: 100,
            rate: 0.01,
            client_errors: 0,
        };
        Evidence::ErrorRate {
            candidate: c,
            champion: c,
            difference: Interval {
                lower: -0.02,
                upper: 0.03,
            },
            margin: 0.01,
            candidate_rate: Interval {
                lower: 0.0,
                upper: 0.05,
            },
            champion_rate: Interval {
                lower: 0.0,
                upper: 0.05,
            },
            e_value,
            client_error_e_value: None,
            pass_e_value: None,
            design_effect: None,
            client_error_design_effect: None,
            negligible: None,
            fail_at: None,
            pass_at: None,
            epochs: Vec::new(),
        }
    }

    #[test]
    fn sequential_plots_the_e_process_against_two_over_its_alpha() {
        let plan = Plan::default();
        assert_eq!(plan.policy, Policy::Sequential);
        let p = gate_point(&verdict(error_rate(Some(3.0))), &plan).expect("point");
        assert_eq!(p.value, Some(3.0));
        assert!(p.log);
        let limit = p.limit.expect("limit");
        assert!((limit - 2.0 / metric_alpha(&plan)).abs() < 1e-9, "{limit}");
        assert_eq!(p.fails, Fails::Above);
    }

    #[test]
    fn both_arms_rates_are_those_of_the_epoch_the_test_compared_last() {
        let counts = |failures, requests| Counts {
            failures,
            requests,
            rate: failures as f64 / requests as f64,
            client_errors: 0,
        };
        let mut ev = error_rate(Some(3.0));
        if let Evidence::ErrorRate { epochs, .. } = &mut ev {
            *epochs = vec![
                crate::gate::EpochCounts {
                    epoch: 1,
                    candidate: counts(1, 100),
                    champion: counts(1, 100),
                },
                crate::gate::EpochCounts {
                    epoch: 2,
                    candidate: counts(90, 100),
                    champion: counts(45, 50),
                },
            ];
        }
        let p = gate_point(&verdict(ev), &Plan::default()).expect("point");
        let arms = p.arms.expect("both arms");
        assert_eq!((arms.candidate, arms.champion), (90.0, 90.0));
        assert!(arms.measure.contains("epoch 2"), "{}", arms.measure);
        // Windowed: the window's own rates.
        let p = gate_point(&verdict(error_rate(None)), &Plan::default()).expect("point");
        assert_eq!(p.arms.map(|a| (a.candidate, a.champion)), Some((1.0, 1.0)));
    }

    /// A candidate answering 404 to everything: the client-error test
    /// decides, so its e-value is what is plotted, and the arms are their
    /// 4xx shares (their failure rates are 0 of 0).
    #[test]
    fn a_4xx_rollback_plots_the_test_and_the_shares_that_decided() {
        let mut ev = error_rate(Some(0.9));
        if let Evidence::ErrorRate {
            client_error_e_value,
            epochs,
            ..
        } = &mut ev
        {
            *client_error_e_value = Some(4.0e7);
            let arm = |client_errors, requests| Counts {
                failures: 0,
                requests,
                rate: 0.0,
                client_errors,
            };
            *epochs = vec![crate::gate::EpochCounts {
                epoch: 1,
                candidate: arm(8, 0),
                champion: arm(0, 92),
            }];
        }
        let p = gate_point(&verdict(ev), &Plan::default()).expect("point");
        assert_eq!(p.value, Some(4.0e7));
        let arms = p.arms.expect("both arms");
        assert_eq!((arms.candidate, arms.champion), (100.0, 0.0));
        assert!(arms.measure.contains("4xx"), "{}", arms.measure);
    }

    #[test]
    fn windowed_plots_the_bound_against_the_margin() {
        let plan = Plan::default();
        let p = gate_point(&verdict(error_rate(None)), &plan).expect("point");
        assert_eq!(
            (p.lower, p.upper, p.limit),
            (Some(-0.02), Some(0.03), Some(0.01))
        );
        assert!(!p.log);
    }

    #[test]
    fn latency_is_judged_against_the_larger_of_both_margins() {
        let q = |est, lo, up| QuantileBounds {
            estimate_us: est,
            lower_us: lo,
            upper_us: up,
        };
        let cmp = QuantileComparison {
            quantile: 0.95,
            candidate: q(30_000, Some(28_000), Some(32_000)),
            champion: q(20_000, Some(19_000), Some(21_000)),
            max_ratio: 1.2,
            max_added_ms: 10.0,
            regressed: false,
            not_regressed: false,
        };
        let ev = Evidence::Latency {
            candidate_successes: 100,
            champion_successes: 100,
            median: None,
            tail: Some(cmp),
        };
        let p = gate_point(&verdict(ev), &Plan::default()).expect("point");
        // max(21 × 1.2, 21 + 10) = 31 ms.
        assert_eq!(p.limit, Some(31.0));
        assert_eq!((p.lower, p.upper), (Some(28.0), Some(32.0)));
        let arms = p.arms.expect("both arms");
        assert_eq!((arms.candidate, arms.champion), (30.0, 20.0));
        let empty = Evidence::Latency {
            candidate_successes: 0,
            champion_successes: 0,
            median: None,
            tail: None,
        };
        assert_eq!(gate_point(&verdict(empty), &Plan::default()), None);
    }
}
