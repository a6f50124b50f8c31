//! The safety model: one rule chain that turns a stage's gate verdicts
//! into the stage's outcome, the same for every policy. A policy (see
//! [`crate::policy`]) only computes bounds and gate verdicts.
//!
//! The rules run in this order; the first that applies decides:
//! 0. [`stats_unavailable`]: no stats at all is no evidence: wait, and
//!    fail with `evidence_timeout` at the deadline.
//!
//!    0½. [`hold_below_stage_floors`]: a gate not failing whose stage has
//!    not yet given it its own sample floor (or enough unit groups) waits,
//!    whatever its cumulative evidence says ([`StageFloors`]: a stage
//!    nobody exercised proved nothing). It only holds gates; the rules
//!    below decide.
//! 1. [`shared_outage_holds`]: if the champion itself is failing, hold;
//!    never roll a candidate back for an upstream outage, never promote.
//! 2. [`breach_fails_at_once`]: any gate that shows a breach fails the stage,
//!    without waiting for the minimum duration.
//! 3. [`clean_stage_waits_for_min_duration`].
//! 4. [`waiting_stage_fails_at_deadline`]: a gate still waiting for evidence
//!    at the deadline fails the stage; before it, the stage waits. Which
//!    gates wait depends on [`Advance`]: under `on_evidence` every gate not
//!    yet shown within budget; under `on_time` only those below their sample
//!    floors. A quality gate holding for labels (rule 5½) is not judged
//!    here.
//! 5. [`missing_metrics_fail`]: traffic seen but a metric missing fails.
//!
//!    5½. [`labels_hold`]: a quality gate waiting for labels holds the stage
//!    until its own `label_deadline` (not `evidence_timeout`), whatever
//!    [`Advance`]; at the deadline, one still short of labels fails the
//!    stage with `label_timeout`. Labels that could not be read hold it,
//!    never time it out. Past the deadline, a quality gate with its labels
//!    is judged by rule 4 like any other.
//!    5¾. [`few_keys_fail_fast`]: a stage left waiting for evidence
//!    (rule 4 or 5½) whose model has too few keys for its canary step ever
//!    to give the floors fails at once once past its minimum duration
//!    (`too_few_keys`), instead of waiting out the deadline.
//! 6. [`unproven_gates_pass_on_time`]: under `on_time`, gates with their
//!    floors but no verdict pass the stage as "no regression shown", never
//!    as "passed".
//! 7. Otherwise every gate passed: the stage passes.
//!
//! `Wait` is never `Pass`: only rules 6 and 7 pass, rule 6 says which gates
//! proved nothing, and a gate that did not pass never reads as passed.

use std::time::Duration;

use crate::gate::{GateKind, GateVerdict, Outcome, Reason};
use crate::histogram::LatencyHistogram;
use crate::plan::{Advance, Plan};
use crate::snapshot::RevisionStats;
use crate::stage::{ChampionHealth, StageReason};
use crate::stats::{wilson, z_two_sided};

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

/// A rule's answer, if it applies.
pub type Decision = Option<(Outcome, StageReason)>;

/// What a stage's own counts say beyond its gates' verdicts (the
/// sequential policy's, whose gates read the whole rollout; the windowed
/// policy's windows are the stage's own, so it has none).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StageFloors {
    /// The gates below the stage's own floor (its counts, or its unit
    /// groups), each with why.
    pub held: Vec<(GateKind, Reason)>,
    /// A canary step the model's keys can never fill (`keys`,
    /// `weight_percent`), when the candidate's unit groups are too few.
    pub hopeless_keys: Option<(u64, u32)>,
}

/// Rule 0½: gates below their stage's floors wait (a failing gate still
/// fails; a missing metric is rule 5's).
pub fn hold_below_stage_floors(gates: &mut [GateVerdict], floors: &StageFloors) {
    for v in gates
        .iter_mut()
        .filter(|v| v.outcome != Outcome::Fail && !v.metrics_missing())
    {
        if let Some((_, why)) = floors.held.iter().find(|(g, _)| *g == v.gate) {
            v.outcome = Outcome::Wait;
            v.reason = why.clone();
        }
    }
}

/// Rule 5¾: a stage waiting for evidence that its keys can never give
/// (a starving gate, too few keys for the step) fails once past its
/// minimum duration.
pub fn few_keys_fail_fast(
    plan: &Plan,
    gates: &[GateVerdict],
    floors: &StageFloors,
    elapsed: Duration,
) -> Decision {
    let (keys, weight_percent) = floors.hopeless_keys?;
    (elapsed >= plan.min_stage_duration && gates.iter().any(GateVerdict::starving)).then_some((
        Outcome::Fail,
        StageReason::TooFewKeys {
            keys,
            weight_percent,
        },
    ))
}

fn kinds(gates: &[GateVerdict], keep: impl Fn(&GateVerdict) -> bool) -> Vec<GateKind> {
    gates.iter().filter(|g| keep(g)).map(|g| g.gate).collect()
}

/// A gate that has not shown the candidate within budget, for a reason
/// other than a missing metric (which rule 5 judges).
fn unproven(g: &GateVerdict) -> bool {
    g.outcome != Outcome::Pass && !g.metrics_missing()
}

/// Rule 0: no stats is no evidence, never health.
pub fn stats_unavailable(plan: &Plan, elapsed: Duration) -> (Outcome, StageReason) {
    if elapsed >= plan.evidence_timeout {
        (
            Outcome::Fail,
            StageReason::EvidenceTimeout { gates: vec![] },
        )
    } else {
        (Outcome::Wait, StageReason::StatsUnavailable)
    }
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

/// A quality gate whose labels could not be read this look.
fn labels_unread(g: &GateVerdict) -> bool {
    g.gate == GateKind::Quality && matches!(g.reason, crate::gate::Reason::NotEvaluated { .. })
}

/// A quality gate still waiting for labels (rule 5½ judges it): before its
/// label deadline, or short of labels, or unread.
fn holds_for_labels(plan: &Plan, g: &GateVerdict, elapsed: Duration) -> bool {
    g.gate == GateKind::Quality
        && g.outcome == Outcome::Wait
        && (elapsed < plan.gates.quality.label_deadline || g.starving() || labels_unread(g))
}

/// Rule 4: gates still waiting for evidence wait until the deadline, then
/// fail (a quality gate holding for labels is rule 5½'s, but named among
/// those the stage waits for).
pub fn waiting_stage_fails_at_deadline(
    plan: &Plan,
    advance: Advance,
    gates: &[GateVerdict],
    elapsed: Duration,
) -> Decision {
    let judged = |g: &GateVerdict| !holds_for_labels(plan, g, elapsed);
    let mut waiting = match advance {
        Advance::OnTime => kinds(gates, |g| judged(g) && g.starving()),
        Advance::OnEvidence => kinds(gates, |g| judged(g) && unproven(g)),
    };
    if waiting.is_empty() {
        None
    } else if elapsed >= plan.evidence_timeout {
        Some((
            Outcome::Fail,
            StageReason::EvidenceTimeout { gates: waiting },
        ))
    } else {
        waiting.extend(kinds(gates, |g| holds_for_labels(plan, g, elapsed)));
        Some((
            Outcome::Wait,
            StageReason::AwaitingEvidence { gates: waiting },
        ))
    }
}

/// Rule 5½: a quality gate waiting for labels holds the stage until its
/// label deadline; then, still short of labels, it fails the stage with
/// `label_timeout` (the candidate is not rejected: nothing was shown
/// against it). Unread labels hold, never time out.
pub fn labels_hold(plan: &Plan, gates: &[GateVerdict], elapsed: Duration) -> Decision {
    let q = gates.iter().find(|g| holds_for_labels(plan, g, elapsed))?;
    if elapsed >= plan.gates.quality.label_deadline && !labels_unread(q) {
        let (labelled, recorded) = match &q.evidence {
            crate::gate::Evidence::Quality {
                canary: Some(c), ..
            } => (c.candidate.labelled, c.candidate.recorded),
            crate::gate::Evidence::Quality { pairs, .. } => (pairs.labelled, pairs.matured),
            _ => (0, 0),
        };
        return Some((
            Outcome::Fail,
            StageReason::LabelTimeout { labelled, recorded },
        ));
    }
    Some((
        Outcome::Wait,
        StageReason::AwaitingEvidence {
            gates: vec![GateKind::Quality],
        },
    ))
}

/// Rule 5: traffic was seen but a metric is missing: nothing is assumed.
pub fn missing_metrics_fail(gates: &[GateVerdict]) -> Decision {
    let missing = kinds(gates, GateVerdict::metrics_missing);
    (!missing.is_empty()).then_some((
        Outcome::Fail,
        StageReason::MetricsMissing { gates: missing },
    ))
}

/// Rule 6: a stage that passes on time says which gates proved nothing.
pub fn unproven_gates_pass_on_time(gates: &[GateVerdict]) -> Decision {
    let unproven = kinds(gates, unproven);
    (!unproven.is_empty()).then_some((
        Outcome::Pass,
        StageReason::NoRegressionShown { gates: unproven },
    ))
}

/// The stage's outcome from its gates and its own floors (see the module
/// docs): the one rule chain both policies feed. Gates the floors hold are
/// left holding, as the verdict records them.
pub fn judge(
    plan: &Plan,
    (advance, champion): (Advance, &ChampionHealth),
    gates: &mut [GateVerdict],
    floors: &StageFloors,
    elapsed: Duration,
) -> (Outcome, StageReason) {
    hold_below_stage_floors(gates, floors);
    let gates = &*gates;
    let waiting = |d: &(Outcome, StageReason)| {
        matches!(d, (Outcome::Wait, StageReason::AwaitingEvidence { .. }))
    };
    let keys_or = |d: (Outcome, StageReason)| {
        if waiting(&d) {
            few_keys_fail_fast(plan, gates, floors, elapsed).unwrap_or(d)
        } else {
            d
        }
    };
    shared_outage_holds(champion)
        .or_else(|| breach_fails_at_once(gates))
        .or_else(|| clean_stage_waits_for_min_duration(plan, elapsed))
        .or_else(|| waiting_stage_fails_at_deadline(plan, advance, gates, elapsed).map(keys_or))
        .or_else(|| missing_metrics_fail(gates))
        .or_else(|| labels_hold(plan, gates, elapsed).map(keys_or))
        .or_else(|| unproven_gates_pass_on_time(gates))
        .unwrap_or((Outcome::Pass, StageReason::AllGatesPass))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gate::{Evidence, Reason};
    use crate::stats::Interval;
    use proptest::prelude::*;

    const KINDS: [GateKind; 6] = [
        GateKind::ErrorRate,
        GateKind::Latency,
        GateKind::PredictionShift,
        GateKind::ShadowAgreement,
        GateKind::GuardRails,
        GateKind::Quality,
    ];

    /// A plan whose quality gate's label deadline (400 s) falls before the
    /// evidence deadline, so both orders of the two clocks are drawn.
    fn plan() -> Plan {
        let mut plan = Plan::default();
        plan.gates.quality.label_deadline = Duration::from_secs(400);
        plan
    }

    fn reason(i: u8) -> (Outcome, Reason) {
        match i % 8 {
            0 => (Outcome::Pass, Reason::WithinBudget),
            1 => (
                Outcome::Wait,
                Reason::InsufficientSamples { have: 1, need: 2 },
            ),
            2 => (
                Outcome::Wait,
                Reason::ChampionNoVerdict { have: 1, need: 2 },
            ),
            3 => (Outcome::Wait, Reason::Inconclusive),
            4 => (Outcome::Fail, Reason::Breach),
            5 => (Outcome::Fail, Reason::GrossBreach),
            6 => (
                Outcome::Wait,
                Reason::NotEvaluated {
                    what: "flips".into(),
                },
            ),
            _ => (
                Outcome::Wait,
                Reason::MetricsMissing {
                    metric: "latency".into(),
                },
            ),
        }
    }

    fn gates(codes: &[u8]) -> Vec<GateVerdict> {
        codes
            .iter()
            .zip(KINDS)
            .map(|(&c, gate)| {
                let (outcome, reason) = reason(c);
                GateVerdict::new(
                    gate,
                    outcome,
                    reason,
                    Evidence::Latency {
                        candidate_successes: 0,
                        champion_successes: 0,
                        median: None,
                        tail: None,
                    },
                )
            })
            .collect()
    }

    fn health(outage: bool) -> ChampionHealth {
        ChampionHealth {
            requests: 100,
            failures: 0,
            error_rate: Interval {
                lower: 0.0,
                upper: 0.1,
            },
            outage,
        }
    }

    #[test]
    fn an_inconclusive_gate_waits_on_evidence_and_passes_on_time_as_no_regression_shown() {
        let plan = plan();
        let g = gates(&[0, 3]);
        let at = Duration::from_secs(120);
        let none = StageFloors::default();
        assert_eq!(
            judge(
                &plan,
                (Advance::OnEvidence, &health(false)),
                &mut g.clone(),
                &none,
                at
            ),
            (
                Outcome::Wait,
                StageReason::AwaitingEvidence {
                    gates: vec![GateKind::Latency]
                }
            )
        );
        assert_eq!(
            judge(
                &plan,
                (Advance::OnTime, &health(false)),
                &mut g.clone(),
                &none,
                at
            ),
            (
                Outcome::Pass,
                StageReason::NoRegressionShown {
                    gates: vec![GateKind::Latency]
                }
            )
        );
    }

    proptest! {
        /// The chain's invariants, for every combination of gate answers,
        /// clock and champion health, under both advance modes.
        #[test]
        fn the_rule_chain_keeps_the_safety_model(
            codes in proptest::collection::vec(0u8..8, 0..=6),
            held_mask in 0u8..64,
            hopeless in any::<bool>(),
            elapsed_s in 0u64..1200,
            outage in any::<bool>(),
            on_time in any::<bool>(),
        ) {
            let plan = plan();
            let advance = if on_time { Advance::OnTime } else { Advance::OnEvidence };
            let drawn = gates(&codes);
            // The stage's own floors: some gates below them (by samples or
            // by unit groups), and maybe keys too few for the step.
            let floors = StageFloors {
                held: KINDS
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| held_mask & (1 << i) != 0)
                    .map(|(i, &k)| {
                        let why = if i % 2 == 0 {
                            Reason::InsufficientSamples { have: 3, need: 20 }
                        } else {
                            Reason::TooFewKeys { groups: 2, need: 4, keys: Some(3) }
                        };
                        (k, why)
                    })
                    .collect(),
                hopeless_keys: hopeless.then_some((3, 20)),
            };
            let mut g = drawn.clone();
            let elapsed = Duration::from_secs(elapsed_s);
            let (outcome, reason) = judge(&plan, (advance, &health(outage)), &mut g, &floors, elapsed);
            // A gate below its stage's floor waits (a failing one still
            // fails, a missing metric stays missing), so no stage passes
            // while one is held.
            for (before, after) in drawn.iter().zip(&g) {
                let held = floors.held.iter().any(|(k, _)| *k == before.gate);
                if held && before.outcome != Outcome::Fail && !before.metrics_missing() {
                    prop_assert_eq!(after.outcome, Outcome::Wait);
                    prop_assert!(after.starving());
                    prop_assert!(outcome != Outcome::Pass);
                } else {
                    prop_assert_eq!(before, after);
                }
            }
            // Too few keys fails only a stage waiting for evidence, past its
            // minimum duration, never one held by an outage or breached.
            if matches!(reason, StageReason::TooFewKeys { .. }) {
                prop_assert!(hopeless && elapsed >= plan.min_stage_duration && !outage);
                prop_assert!(g.iter().any(GateVerdict::starving));
                prop_assert!(!g.iter().any(|v| v.outcome == Outcome::Fail));
            }
            // A shared outage holds, whatever else is true.
            if outage {
                prop_assert_eq!((outcome, reason.clone()), (Outcome::Wait, StageReason::SharedOutage));
            }
            // A breach fails at once, before the minimum duration.
            if !outage && g.iter().any(|v| v.outcome == Outcome::Fail) {
                prop_assert_eq!(outcome, Outcome::Fail);
                let breach = matches!(reason, StageReason::Breach { .. });
                prop_assert!(breach);
            }
            if outcome == Outcome::Pass {
                prop_assert!(elapsed >= plan.min_stage_duration);
                prop_assert!(!g.iter().any(|v| v.outcome == Outcome::Fail || v.metrics_missing() || v.starving()));
                // Only an all-pass reads as passed; anything else names
                // the gates that proved nothing.
                let all = g.iter().all(|v| v.outcome == Outcome::Pass);
                prop_assert_eq!(all, reason == StageReason::AllGatesPass);
                prop_assert!(all || advance == Advance::OnTime);
            }
            // Starvation fails only at the deadline.
            let timed_out = matches!(reason, StageReason::EvidenceTimeout { .. });
            prop_assert!(!timed_out || elapsed >= plan.evidence_timeout);
            // A quality gate waiting for labels holds the stage until its
            // own deadline, under either advance mode; labels that could
            // not be read never time a stage out; a label timeout comes
            // only at the label deadline, from a quality gate short of
            // labels.
            let quality = g.iter().find(|v| v.gate == GateKind::Quality);
            let unread = quality.is_some_and(labels_unread);
            let q_waits = quality.is_some_and(|q| q.outcome == Outcome::Wait);
            if q_waits && (elapsed < plan.gates.quality.label_deadline || unread) {
                prop_assert!(outcome != Outcome::Pass);
            }
            if matches!(reason, StageReason::LabelTimeout { .. }) {
                prop_assert!(elapsed >= plan.gates.quality.label_deadline);
                prop_assert!(!unread);
                prop_assert!(quality.is_some_and(GateVerdict::starving));
            }
            if unread && outcome == Outcome::Fail {
                // Only a failure shown elsewhere, never one for labels.
                let label = matches!(reason, StageReason::LabelTimeout { .. });
                prop_assert!(!label);
            }
        }
    }
}
