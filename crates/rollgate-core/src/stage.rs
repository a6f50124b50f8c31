//! One stage's verdict from its gates: the safety model.
//!
//! The rules run in this order; the first that applies decides:
//! 0. [`stats_unavailable_waits`]: no stats at all is no evidence: wait, and
//!    fail with `evidence_timeout` at the deadline.
//! 1. [`shared_outage_holds`]: if the champion itself is failing, hold;
//!    never roll a candidate back for an upstream outage, never promote.
//! 2. [`breach_fails_at_once`]: any gate that shows a breach fails the stage,
//!    without waiting for the minimum duration.
//! 3. [`clean_stage_waits_for_min_duration`].
//! 4. [`starved_stage_fails_at_deadline`]: a gate still without a verdict at
//!    the evidence deadline fails the stage; before it, the stage waits.
//! 5. [`missing_metrics_fail`]: traffic seen but a metric missing fails.
//! 6. Otherwise every gate passed: the stage passes.
//!
//! `Wait` is never `Pass`: only rule 6 passes, and only when every gate did.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::gate::{
    Arms, GateKind, GateVerdict, Outcome, error_rate_gate, guard_rail_gate, latency_gate,
    prediction_shift_gate, shadow_gate,
};
use crate::histogram::LatencyHistogram;
use crate::plan::Plan;
use crate::snapshot::{RevisionStats, Snapshot};
use crate::stats::{Interval, wilson, z_two_sided};

/// Which kind of stage is being judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StageKind {
    /// The candidate answers mirrored traffic; nobody sees its answers.
    Shadow,
    /// The candidate serves a share of live traffic.
    Canary,
}

/// Why the stage answered as it did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "code", rename_all = "snake_case")]
pub enum StageReason {
    StatsUnavailable,
    SharedOutage,
    Breach {
        gates: Vec<GateKind>,
    },
    MinDuration {
        remaining_ms: u64,
    },
    AwaitingEvidence {
        gates: Vec<GateKind>,
    },
    EvidenceTimeout {
        gates: Vec<GateKind>,
    },
    MetricsMissing {
        gates: Vec<GateKind>,
    },
    /// Every gate showed the candidate within budget.
    AllGatesPass,
    /// The stage passed on time (`advance = "on_time"`): no gate showed a
    /// regression, but these gates did not show the candidate within
    /// budget either. Not a proof of non-inferiority.
    NoRegressionShown {
        gates: Vec<GateKind>,
    },
}

impl StageReason {
    /// A short stable code, for metrics labels and the CLI.
    pub fn code(&self) -> &'static str {
        match self {
            StageReason::StatsUnavailable => "stats_unavailable",
            StageReason::SharedOutage => "shared_outage",
            StageReason::Breach { .. } => "breach",
            StageReason::MinDuration { .. } => "min_duration",
            StageReason::AwaitingEvidence { .. } => "awaiting_evidence",
            StageReason::EvidenceTimeout { .. } => "evidence_timeout",
            StageReason::MetricsMissing { .. } => "metrics_missing",
            StageReason::AllGatesPass => "all_gates_pass",
            StageReason::NoRegressionShown { .. } => "no_regression_shown",
        }
    }
}

/// The champion's own health in the window: the candidate is judged only
/// against a champion that has a verdict.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ChampionHealth {
    pub requests: u64,
    pub failures: u64,
    pub error_rate: Interval,
    /// The lower bound of the champion's error rate is above the outage
    /// threshold (or its p95 lower bound above `max_p95_ms`).
    pub outage: bool,
}

/// A stage's verdict: outcome, reason, and every gate's verdict as evidence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageVerdict {
    pub stage: StageKind,
    pub outcome: Outcome,
    pub reason: StageReason,
    /// A gross breach rolls back without waiting for confirmation.
    pub gross: bool,
    pub elapsed_ms: u64,
    pub champion: Option<ChampionHealth>,
    pub gates: Vec<GateVerdict>,
    /// The breach-confirmation window, filled in by the rollout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmation: Option<WindowCheck>,
}

/// Breach confirmation on disjoint windows (the `windowed` policy).
///
/// Re-testing one growing window every few seconds would look at the same
/// evidence again and again, and a single unlucky stretch would "confirm"
/// itself. So a non-gross breach counts once per window: a window closes
/// when its gates have judged (or breached), and the next one starts empty.
/// `confirm_breaches` consecutive breached windows roll back; a window that
/// judged without a breach resets the count.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WindowCheck {
    pub gates: Vec<GateVerdict>,
    /// Some gate failed in this window (and the champion was not in outage).
    pub breached: bool,
    pub gross: bool,
    /// Every gate had enough samples in both arms to judge.
    pub judged: bool,
    /// Consecutive breached windows, including this one.
    pub consecutive_breaches: u32,
    pub needed: u32,
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
    let judged = gates.iter().all(|g| {
        !matches!(
            g.reason,
            crate::gate::Reason::InsufficientSamples { .. }
                | crate::gate::Reason::ChampionNoVerdict { .. }
        )
    });
    WindowCheck {
        gates,
        breached,
        gross,
        judged,
        consecutive_breaches: 0,
        needed: plan.confirm_breaches,
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
        StageKind::Canary => {}
    }
    out.extend(guard_rail_gate(
        &g.guard_rails,
        g.error_rate.min_requests,
        arms,
        plan.alpha,
    ));
    out
}

/// The champion's verdict on itself.
pub fn champion_health(plan: &Plan, champion: &RevisionStats) -> ChampionHealth {
    champion_health_of(
        plan,
        champion.requests(),
        champion.failure_count(),
        champion.latency(),
    )
}

/// The champion's verdict on itself from its counts (e.g. of a recent
/// window) and a latency histogram.
pub fn champion_health_of(
    plan: &Plan,
    requests: u64,
    failures: u64,
    latency: &LatencyHistogram,
) -> ChampionHealth {
    let rails = &plan.gates.guard_rails;
    let error_rate = wilson(failures, requests, z_two_sided(plan.alpha));
    let enough = requests >= plan.gates.error_rate.min_requests;
    let slow = rails.max_p95_ms.is_some_and(|max| {
        latency
            .quantile_bounds(0.95, plan.alpha)
            .and_then(|b| b.lower_us)
            .is_some_and(|lo| lo as f64 / 1000.0 > max)
    });
    ChampionHealth {
        requests,
        failures,
        error_rate,
        outage: enough && (error_rate.lower > rails.champion_outage_error_rate || slow),
    }
}

type Decision = Option<(Outcome, StageReason)>;

fn kinds(gates: &[GateVerdict], keep: impl Fn(&GateVerdict) -> bool) -> Vec<GateKind> {
    gates.iter().filter(|g| keep(g)).map(|g| g.gate).collect()
}

/// Rule 0: no stats is no evidence, never health.
pub fn stats_unavailable_waits(
    plan: &Plan,
    window: Option<&Snapshot>,
    elapsed: Duration,
) -> Decision {
    if window.is_some() {
        return None;
    }
    Some(if elapsed >= plan.evidence_timeout {
        (
            Outcome::Fail,
            StageReason::EvidenceTimeout { gates: vec![] },
        )
    } else {
        (Outcome::Wait, StageReason::StatsUnavailable)
    })
}

/// Rule 1: a champion in outage holds the stage, whatever the gates say.
pub fn shared_outage_holds(champion: &ChampionHealth) -> Decision {
    champion
        .outage
        .then_some((Outcome::Wait, StageReason::SharedOutage))
}

/// Rule 2: a breach fails at once, once its gate has enough evidence.
pub fn breach_fails_at_once(gates: &[GateVerdict]) -> Decision {
    let failed = kinds(gates, |g| g.outcome == Outcome::Fail);
    (!failed.is_empty()).then_some((Outcome::Fail, StageReason::Breach { gates: failed }))
}

/// Rule 3: a clean stage waits out its minimum duration.
pub fn clean_stage_waits_for_min_duration(plan: &Plan, elapsed: Duration) -> Decision {
    (elapsed < plan.min_stage_duration).then(|| {
        (
            Outcome::Wait,
            StageReason::MinDuration {
                remaining_ms: (plan.min_stage_duration - elapsed).as_millis() as u64,
            },
        )
    })
}

/// Rule 4: gates still waiting for evidence wait until the deadline, then fail.
pub fn starved_stage_fails_at_deadline(
    plan: &Plan,
    gates: &[GateVerdict],
    elapsed: Duration,
) -> Decision {
    let waiting = kinds(gates, |g| {
        g.outcome == Outcome::Wait && !g.metrics_missing()
    });
    if waiting.is_empty() {
        None
    } else if elapsed >= plan.evidence_timeout {
        Some((
            Outcome::Fail,
            StageReason::EvidenceTimeout { gates: waiting },
        ))
    } else {
        Some((
            Outcome::Wait,
            StageReason::AwaitingEvidence { gates: waiting },
        ))
    }
}

/// Rule 5: traffic was seen but a metric is missing: nothing is assumed.
pub fn missing_metrics_fail(gates: &[GateVerdict]) -> Decision {
    let missing = kinds(gates, GateVerdict::metrics_missing);
    (!missing.is_empty()).then_some((
        Outcome::Fail,
        StageReason::MetricsMissing { gates: missing },
    ))
}

/// Judges one stage by the safety model (see the module docs).
pub fn evaluate_stage(plan: &Plan, input: &StageInput) -> StageVerdict {
    let elapsed_ms = input.elapsed.as_millis() as u64;
    let Some(window) = input.window else {
        let (outcome, reason) = stats_unavailable_waits(plan, None, input.elapsed)
            .unwrap_or((Outcome::Wait, StageReason::StatsUnavailable));
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
    let gates = evaluate_gates(plan, input.stage, window, input.champion, input.candidate);
    let champion = champion_health(plan, window.revision(input.champion));
    let (outcome, reason) = shared_outage_holds(&champion)
        .or_else(|| breach_fails_at_once(&gates))
        .or_else(|| clean_stage_waits_for_min_duration(plan, input.elapsed))
        .or_else(|| starved_stage_fails_at_deadline(plan, &gates, input.elapsed))
        .or_else(|| missing_metrics_fail(&gates))
        .unwrap_or((Outcome::Pass, StageReason::AllGatesPass));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::FailureClass;
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
        evaluate_stage(
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
        let v = evaluate_stage(
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
            let v = evaluate_stage(&Plan::default(), &StageInput {
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
