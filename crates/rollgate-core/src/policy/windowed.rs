//! The `windowed` policy: fixed-horizon bounds on each stage's window, and
//! breach confirmation on disjoint windows.
//!
//! Each gate is a two-sided `1 − α` interval (`plan.alpha`) on the
//! stage's window — Newcombe for differences of rates, Wilson for a rate,
//! order statistics for quantiles, Bonferroni over classes — judged only
//! from its sample floor on. A non-gross breach rolls back only when
//! `confirm_breaches` consecutive disjoint windows breach ([`WindowCheck`]):
//! re-testing one growing window at every look would spend `α` again and
//! again. The stage's outcome comes from the one rule chain
//! ([`crate::safety`]), with `on_evidence` semantics: a stage passes only
//! when every gate showed the candidate within budget.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::look::{Judged, LookInput, Next, failed_safe};
use crate::gate::{
    Arms, Counts, Evidence, GateKind, GateVerdict, Outcome, QuantileComparison, Reason,
    guard_rail_verdict, judge_quantile, latency_verdict, sample_floor, shadow_verdict,
    shift_verdict,
};
use crate::histogram::LatencyHistogram;
use crate::plan::{Advance, ErrorRateGate, GuardRails, LatencyGate, Plan, ShadowGate, ShiftGate};
use crate::safety::{StageFloors, champion_health, judge, stats_unavailable};
use crate::snapshot::{PairStats, Snapshot};
use crate::stage::{RollbackReason, StageKind, StageReason, StageVerdict, WindowCheck};
use crate::stats::{newcombe, wilson, z_two_sided};

/// The windowed policy's state within one stage: where its windows start,
/// and the breaches not yet confirmed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WindowedTests {
    /// Cumulative stats when the stage started; the stage's window is the
    /// current snapshot minus this. `None` until a snapshot is first seen.
    pub baseline: Option<Snapshot>,
    /// Start of the current breach-confirmation window.
    pub window_baseline: Option<Snapshot>,
    /// Consecutive breached windows.
    pub consecutive_breaches: u32,
}

impl WindowedTests {
    /// Both windows starting at `baseline`, no breach pending.
    pub fn starting_at(baseline: Option<Snapshot>) -> Self {
        WindowedTests {
            window_baseline: baseline.clone(),
            baseline,
            consecutive_breaches: 0,
        }
    }
}

/// What one windowed look decided.
#[derive(Debug, Clone)]
pub struct Look {
    /// The stage's verdict on its whole window, with the confirmation
    /// window's check attached.
    pub verdict: StageVerdict,
    /// A breach confirmed on enough disjoint windows (or gross): roll back.
    pub confirmed: Option<RollbackReason>,
    /// A breach awaits confirmation: the stage must not advance.
    pub pending_breach: bool,
    /// Why the windows restarted, if they did.
    pub note: Option<String>,
}

/// One look of the windowed policy, and what it means for the rollout: a
/// gross breach, or one confirmed on enough disjoint windows, rolls back; a
/// breach on the stage's whole window alone neither passes nor rolls back;
/// starvation and missing metrics fail safe unless paused; a pass advances
/// unless paused or a breach awaits confirmation. The stage judges its own
/// epoch on: counts of requests that arrived under its routing, over every
/// series, which never go backwards whatever the gateways do.
pub fn look(plan: &Plan, tests: &mut WindowedTests, input: &LookInput) -> Judged {
    let current = input
        .evidence
        .map(|(ledger, _)| ledger.pooled(input.stage_epoch, input.epoch));
    let Look {
        verdict,
        confirmed,
        pending_breach,
        note,
    } = look_at_windows(
        plan,
        tests,
        input.stage,
        current.as_ref(),
        (input.champion, input.candidate),
        input.elapsed,
    );
    let next = if verdict.outcome == Outcome::Fail && verdict.gross {
        let gates = match &verdict.reason {
            StageReason::Breach { gates }
            | StageReason::EvidenceTimeout { gates }
            | StageReason::MetricsMissing { gates } => gates.clone(),
            _ => vec![],
        };
        Next::RollBack(RollbackReason::GrossBreach { gates })
    } else if let Some(reason) = confirmed {
        Next::RollBack(reason)
    } else {
        match (verdict.outcome, &verdict.reason) {
            (Outcome::Fail, StageReason::Breach { .. }) | (Outcome::Wait, _) => Next::Stay,
            (Outcome::Fail, reason) if !input.paused => Next::RollBack(failed_safe(reason)),
            (Outcome::Pass, _) if !input.paused && !pending_breach => Next::Advance {
                // The next stage is a new epoch: its counts start at zero.
                fresh_counts: true,
            },
            _ => Next::Stay,
        }
    };
    Judged {
        verdict,
        note,
        next,
    }
}

/// One look at the stage's counts so far (`current`: everything that
/// arrived under the stage's routing; `None` when no stats could be read).
pub fn look_at_windows(
    plan: &Plan,
    tests: &mut WindowedTests,
    stage: StageKind,
    current: Option<&Snapshot>,
    (champion, candidate): (&str, &str),
    elapsed: Duration,
) -> Look {
    // The stage's window and the confirmation window. A missing baseline is
    // taken now; counters that went backwards restart both windows from
    // here: evidence is lost, never invented.
    let mut note = None;
    let (window, recent) = match (&tests.baseline, &tests.window_baseline, current) {
        (_, _, None) => (None, None),
        (Some(b), Some(wb), Some(s)) => match (s.window_since(b), s.window_since(wb)) {
            (Ok(w), Ok(r)) => (Some(w), Some(r)),
            (Err(e), _) | (_, Err(e)) => {
                note = Some(format!("window restarted: {e}"));
                *tests = WindowedTests::starting_at(Some(s.clone()));
                (Some(Snapshot::default()), Some(Snapshot::default()))
            }
        },
        (_, _, Some(s)) => {
            *tests = WindowedTests::starting_at(Some(s.clone()));
            (Some(Snapshot::default()), Some(Snapshot::default()))
        }
    };
    let mut verdict = evaluate(
        plan,
        &StageInput {
            stage,
            window: window.as_ref(),
            champion,
            candidate,
            elapsed,
        },
    );
    // Breach confirmation on disjoint windows.
    let mut confirmed = None;
    if let (Some(recent), Some(current)) = (&recent, current) {
        let mut check = check_window(plan, stage, recent, champion, candidate);
        if check.breached {
            tests.consecutive_breaches += 1;
            tests.window_baseline = Some(current.clone());
            if check.gross || tests.consecutive_breaches >= plan.confirm_breaches {
                let gates = check
                    .gates
                    .iter()
                    .filter(|g| g.outcome == Outcome::Fail)
                    .map(|g| g.gate)
                    .collect();
                confirmed = Some(if check.gross {
                    RollbackReason::GrossBreach { gates }
                } else {
                    RollbackReason::Breach {
                        gates,
                        confirmations: tests.consecutive_breaches,
                    }
                });
            }
        } else if check.judged {
            tests.consecutive_breaches = 0;
            tests.window_baseline = Some(current.clone());
        }
        check.consecutive_breaches = tests.consecutive_breaches;
        verdict.confirmation = Some(check);
    }
    Look {
        verdict,
        confirmed,
        pending_breach: tests.consecutive_breaches > 0,
        note,
    }
}

/// What a stage is judged on.
#[derive(Debug, Clone, Copy)]
pub struct StageInput<'a> {
    pub stage: StageKind,
    /// Measurements since the stage's clock started; `None` if no stats
    /// could be read.
    pub window: Option<&'a Snapshot>,
    pub champion: &'a str,
    pub candidate: &'a str,
    /// Time since the stage's clock started.
    pub elapsed: Duration,
}

/// Runs the gates that apply to this stage.
pub fn evaluate_gates(
    plan: &Plan,
    stage: StageKind,
    window: &Snapshot,
    champion: &str,
    candidate: &str,
) -> Vec<GateVerdict> {
    let (h, c) = (window.revision(champion), window.revision(candidate));
    let arms = Arms {
        champion: h,
        candidate: c,
    };
    let g = &plan.gates;
    let mut out = Vec::new();
    if g.error_rate.enabled {
        out.push(error_rate_gate(&g.error_rate, arms, plan.alpha));
    }
    if g.latency.enabled {
        out.push(latency_gate(&g.latency, arms, plan.alpha));
    }
    match stage {
        StageKind::Shadow => out.push(shadow_gate(
            &g.shadow,
            arms,
            window.pairs_for(candidate),
            plan.alpha,
        )),
        StageKind::Canary if g.prediction_shift.enabled => {
            out.push(prediction_shift_gate(&g.prediction_shift, arms, plan.alpha))
        }
        StageKind::Canary | StageKind::Watch => {}
    }
    out.extend(guard_rail_gate(
        &g.guard_rails,
        g.error_rate.min_requests,
        arms,
        plan.alpha,
    ));
    out
}

/// Judges one stage's window: its gates, then the safety model's rule
/// chain ([`crate::safety::judge`]; a stage passes only when every gate
/// did).
pub fn evaluate(plan: &Plan, input: &StageInput) -> StageVerdict {
    let elapsed_ms = input.elapsed.as_millis() as u64;
    let Some(window) = input.window else {
        let (outcome, reason) = stats_unavailable(plan, input.elapsed);
        return StageVerdict {
            stage: input.stage,
            outcome,
            reason,
            gross: false,
            elapsed_ms,
            champion: None,
            gates: vec![],
            confirmation: None,
        };
    };
    let mut gates = evaluate_gates(plan, input.stage, window, input.champion, input.candidate);
    let champion = champion_health(plan, window.revision(input.champion));
    // The window is the stage's own: no floor beyond its gates'.
    let floors = StageFloors::default();
    let health = (Advance::OnEvidence, &champion);
    let (outcome, reason) = judge(plan, health, &mut gates, &floors, input.elapsed);
    let gross = outcome == Outcome::Fail
        && matches!(reason, StageReason::Breach { .. })
        && gates.iter().any(GateVerdict::is_gross);
    StageVerdict {
        stage: input.stage,
        outcome,
        reason,
        gross,
        elapsed_ms,
        champion: Some(champion),
        gates,
        confirmation: None,
    }
}

/// Judges one confirmation window; the count is left for the caller.
pub fn check_window(
    plan: &Plan,
    stage: StageKind,
    window: &Snapshot,
    champion: &str,
    candidate: &str,
) -> WindowCheck {
    let gates = evaluate_gates(plan, stage, window, champion, candidate);
    let outage = champion_health(plan, window.revision(champion)).outage;
    let breached = !outage && gates.iter().any(|g| g.outcome == Outcome::Fail);
    let gross = breached && gates.iter().any(GateVerdict::is_gross);
    let judged = !gates.iter().any(GateVerdict::starving);
    WindowCheck {
        gates,
        breached,
        gross,
        judged,
        consecutive_breaches: 0,
        needed: plan.confirm_breaches,
    }
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
        client_error_design_effect: None,
        negligible: None,
        fail_at: None,
        pass_at: None,
        epochs: Vec::new(),
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
        None,
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

#[cfg(test)]
mod gate_tests {
    use super::*;
    use crate::snapshot::FailureClass;
    use crate::snapshot::RevisionStats;
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

    /// A model that reports no confidence gives no confident pairs: the
    /// flip half of the gate is "not evaluated", never a pass.
    #[test]
    fn shadow_flips_without_confident_answers_are_not_evaluated() {
        let v = shadow(pairs(500, 500, 0, 0));
        assert_eq!(v.outcome, Outcome::Wait);
        assert!(
            matches!(&v.reason, Reason::NotEvaluated { what } if what.contains("flips")),
            "{:?}",
            v.reason
        );
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

#[cfg(test)]
mod stage_tests {
    use super::*;
    use crate::snapshot::FailureClass;
    use crate::snapshot::RevisionStats;
    use proptest::prelude::*;

    const CH: &str = "champion";
    const CA: &str = "candidate";

    fn record(s: &mut Snapshot, rev: &str, ok: u64, failed: u64, latency_us: u64) {
        let r = s.revision_mut(rev);
        for i in 0..ok {
            r.record_success(latency_us + i % 7 * 100, ["a"]);
        }
        for _ in 0..failed {
            r.record_failure(FailureClass::Upstream5xx);
        }
    }

    fn window(champion: (u64, u64), candidate: (u64, u64)) -> Snapshot {
        let mut s = Snapshot::default();
        record(&mut s, CH, champion.0, champion.1, 20_000);
        record(&mut s, CA, candidate.0, candidate.1, 20_000);
        s
    }

    fn judge(w: Option<&Snapshot>, elapsed_s: u64) -> StageVerdict {
        evaluate(
            &Plan::default(),
            &StageInput {
                stage: StageKind::Canary,
                window: w,
                champion: CH,
                candidate: CA,
                elapsed: Duration::from_secs(elapsed_s),
            },
        )
    }

    #[test]
    fn breach_fails_before_the_minimum_duration() {
        let v = judge(Some(&window((1000, 0), (0, 100))), 1);
        assert_eq!(v.outcome, Outcome::Fail);
        assert!(v.gross);
        assert_eq!(
            v.reason,
            StageReason::Breach {
                gates: vec![GateKind::ErrorRate]
            }
        );
    }

    #[test]
    fn clean_stage_waits_until_its_minimum_duration() {
        let v = judge(Some(&window((2000, 0), (2000, 0))), 10);
        assert_eq!(v.outcome, Outcome::Wait);
        assert_eq!(
            v.reason,
            StageReason::MinDuration {
                remaining_ms: 50_000
            }
        );
        assert_eq!(
            judge(Some(&window((2000, 0), (2000, 0))), 60).outcome,
            Outcome::Pass
        );
    }

    #[test]
    fn starved_stage_waits_then_fails_at_the_deadline() {
        let w = window((2000, 0), (3, 0));
        let v = judge(Some(&w), 120);
        assert_eq!(v.outcome, Outcome::Wait);
        assert!(matches!(v.reason, StageReason::AwaitingEvidence { .. }));
        let v = judge(Some(&w), 600);
        assert_eq!(v.outcome, Outcome::Fail);
        assert!(matches!(v.reason, StageReason::EvidenceTimeout { .. }));
    }

    #[test]
    fn no_stats_waits_then_fails_at_the_deadline_and_never_passes() {
        assert_eq!(judge(None, 0).outcome, Outcome::Wait);
        assert_eq!(judge(None, 599).reason, StageReason::StatsUnavailable);
        let v = judge(None, 600);
        assert_eq!(v.outcome, Outcome::Fail);
        assert!(matches!(v.reason, StageReason::EvidenceTimeout { .. }));
    }

    #[test]
    fn traffic_without_latency_metrics_fails_after_the_minimum_duration() {
        let mut w = window((2000, 0), (0, 0));
        let blind = RevisionStats::from_parts(
            2000,
            Default::default(),
            0,
            Default::default(),
            Default::default(),
        )
        .expect("valid");
        *w.revision_mut(CA) = blind;
        assert_eq!(judge(Some(&w), 5).outcome, Outcome::Wait);
        let v = judge(Some(&w), 60);
        assert_eq!(v.outcome, Outcome::Fail);
        assert_eq!(
            v.reason,
            StageReason::MetricsMissing {
                gates: vec![GateKind::Latency]
            }
        );
    }

    #[test]
    fn champion_outage_holds_instead_of_rolling_back() {
        let v = judge(Some(&window((0, 1000), (0, 100))), 1);
        assert_eq!(
            (v.outcome, v.reason),
            (Outcome::Wait, StageReason::SharedOutage)
        );
        // ... even past the deadline: an outage is not starvation.
        let v = judge(Some(&window((0, 1000), (0, 100))), 10_000);
        assert_eq!(v.outcome, Outcome::Wait);
    }

    /// The field bug (model-serving-platform): the candidate crossed the
    /// sample floor before the champion, whose silence was read as health.
    #[test]
    fn shared_outage_candidate_reaches_floor_first_then_champion() {
        // Candidate over the floor, champion below it: no verdict yet.
        let v = judge(Some(&window((0, 12), (0, 60))), 1);
        assert_eq!(v.outcome, Outcome::Wait, "{:?}", v.reason);
        // Champion over the floor too, failing: shared outage.
        let v = judge(Some(&window((0, 60), (0, 80))), 2);
        assert_eq!(
            (v.outcome, v.reason),
            (Outcome::Wait, StageReason::SharedOutage)
        );
    }

    #[test]
    fn shared_outage_champion_reaches_floor_first_then_candidate() {
        let v = judge(Some(&window((0, 60), (0, 12))), 1);
        assert_eq!(
            (v.outcome, v.reason),
            (Outcome::Wait, StageReason::SharedOutage)
        );
        let v = judge(Some(&window((0, 80), (0, 60))), 2);
        assert_eq!(
            (v.outcome, v.reason),
            (Outcome::Wait, StageReason::SharedOutage)
        );
    }

    #[test]
    fn shadow_stage_judges_pairs() {
        let mut w = window((2000, 0), (2000, 0));
        for i in 0..2000 {
            w.pairs_mut(CA).record_pair(i % 5 != 0, i % 2 == 0);
        }
        let v = evaluate(
            &Plan::default(),
            &StageInput {
                stage: StageKind::Shadow,
                window: Some(&w),
                champion: CH,
                candidate: CA,
                elapsed: Duration::from_secs(1),
            },
        );
        assert_eq!(v.outcome, Outcome::Fail);
        assert_eq!(
            v.reason,
            StageReason::Breach {
                gates: vec![GateKind::ShadowAgreement]
            }
        );
    }

    proptest! {
        /// Whatever the window, a stage passes only after its minimum
        /// duration, with stats, with no champion outage, and when every gate passed.
        #[test]
        fn stage_passes_only_when_every_gate_passes(ch_ok in 0u64..400, ch_fail in 0u64..50, ca_ok in 0u64..400,
                                                   ca_fail in 0u64..50, elapsed in 0u64..1000, shadow in any::<bool>()) {
            let w = window((ch_ok, ch_fail), (ca_ok, ca_fail));
            let v = evaluate(&Plan::default(), &StageInput {
                stage: if shadow { StageKind::Shadow } else { StageKind::Canary },
                window: Some(&w), champion: CH, candidate: CA, elapsed: Duration::from_secs(elapsed),
            });
            if v.outcome == Outcome::Pass {
                prop_assert!(elapsed >= 60);
                prop_assert!(v.gates.iter().all(|g| g.outcome == Outcome::Pass));
                prop_assert!(!v.champion.expect("stats").outage);
            }
            if v.reason == StageReason::SharedOutage { prop_assert_eq!(v.outcome, Outcome::Wait); }
        }
    }
}
