//! The rollout state machine under the `sequential` policy (the default):
//! identical candidates, shifts, outages, detection, guard rails, what the
//! audit log keeps. Traffic and helpers: `rollout.rs`.

use proptest::prelude::*;
use rollgate_core::{
    Effect, Exposure, FailureClass, GateKind, Input, Observation, OperatorAction, Phase, Plan,
    RollbackReason, RolloutState, Snapshot, StageReason, Timestamp, step,
};

use crate::rollout::*;

#[test]
fn sequential_identical_candidates_are_promoted_and_never_rolled_back_for_a_breach() {
    use rollgate_core::Advance;
    for advance in [Advance::OnTime, Advance::OnEvidence] {
        let spec = spec(sequential_plan(advance));
        let mut promoted = 0;
        for seed in 0..60u64 {
            let arm = failing([0.0, 0.005, 0.01][seed as usize % 3]);
            let r = run(&spec, &mut Traffic::new(5000 + seed, 400, arm, arm), 900);
            match &r.state.phase {
                Phase::Promoted { .. } => promoted += 1,
                Phase::RolledBack { reason } => assert!(
                    !matches!(reason, RollbackReason::AnytimeBreach { .. }),
                    "{advance:?} seed {seed}: {reason:?}"
                ),
                other => panic!("{advance:?} seed {seed}: unfinished {other:?}"),
            }
        }
        // `on_evidence` must show the failure rate below 1.5× the
        // champion's (or below 0.1%): at 0.5–1% that takes some hundred
        // failures, more than a 120 s stage always sees; such stages fail
        // safe by evidence timeout.
        let need = match advance {
            Advance::OnTime => 55,
            Advance::OnEvidence => 45,
        };
        assert!(promoted >= need, "{advance:?}: only {promoted}/60 promoted");
    }
}

/// The prediction-shift gate under `sequential`: a candidate whose class
/// mix matches the champion's is never rolled back for it; one that calls
/// twice as much fraud is, before it is promoted.
#[test]
fn sequential_prediction_shift_stops_a_shifted_class_mix_and_only_that() {
    let mut plan = sequential_plan(rollgate_core::Advance::OnTime);
    plan.gates.prediction_shift.enabled = true;
    let spec = spec(plan);
    for seed in 0..20u64 {
        let mut same = Traffic::new(9100 + seed, 400, HEALTHY, HEALTHY);
        let r = run(&spec, &mut same, 900);
        assert!(
            matches!(r.state.phase, Phase::Promoted { .. }),
            "seed {seed}: {:?}",
            r.state.phase
        );
        let mut shifted = Traffic::new(9200 + seed, 400, HEALTHY, HEALTHY);
        shifted.fraud = (0.3, 0.6);
        let r = run(&spec, &mut shifted, 900);
        match &r.state.phase {
            Phase::RolledBack {
                reason: RollbackReason::AnytimeBreach { gates },
            } => assert_eq!(gates, &[GateKind::PredictionShift], "seed {seed}"),
            other => panic!("seed {seed}: {other:?}"),
        }
    }
}

#[test]
fn sequential_always_failing_candidate_is_refused_in_shadow_within_a_few_mirrors() {
    let spec = spec(sequential_plan(rollgate_core::Advance::OnTime));
    let dead = Arm {
        failure: 1.0,
        median_ms: 5.0,
    };
    let mut needed = Vec::new();
    for seed in 0..20u64 {
        let mut traffic = Traffic::new(7000 + seed, 20, HEALTHY, dead);
        let r = run(&spec, &mut traffic, 120);
        assert!(
            matches!(
                r.state.phase,
                Phase::RolledBack {
                    reason: RollbackReason::AnytimeBreach { .. }
                }
            ),
            "{:?}",
            r.state.phase
        );
        needed.push(traffic.snapshot.revision(CA).requests());
    }
    needed.sort_unstable();
    // A handful of failed mirrors is enough evidence at alpha = 1%.
    assert!(
        needed[10] <= 40,
        "median {} candidate requests: {needed:?}",
        needed[10]
    );
}

#[test]
fn sequential_shared_outage_never_rolls_back() {
    let spec = spec(sequential_plan(rollgate_core::Advance::OnTime));
    let down = Arm {
        failure: 1.0,
        median_ms: 5.0,
    };
    for seed in 0..10 {
        let r = run(&spec, &mut Traffic::new(seed, 200, down, down), 300);
        assert!(
            !r.state.phase.is_terminal(),
            "seed {seed}: {:?}",
            r.state.phase
        );
    }
}

#[test]
fn sequential_latency_regression_is_rolled_back_before_live_exposure() {
    let spec = spec(sequential_plan(rollgate_core::Advance::OnTime));
    let slow = Arm {
        failure: 0.0,
        median_ms: 120.0,
    };
    let r = run(&spec, &mut Traffic::new(9, 400, HEALTHY, slow), 120);
    assert_eq!(
        r.state.phase,
        Phase::RolledBack {
            reason: RollbackReason::AnytimeBreach {
                gates: vec![GateKind::Latency]
            }
        }
    );
}

/// How many of the 900 s rollouts of `candidate` against `champion` under
/// `plan`, one per seed, end in a phase that `ends` picks.
fn rollouts_ending(
    plan: Plan,
    seeds: std::ops::Range<u64>,
    (champion, candidate): (Arm, Arm),
    ends: impl Fn(&Phase) -> bool,
) -> usize {
    let spec = spec(plan);
    seeds
        .filter(|&seed| {
            let r = run(
                &spec,
                &mut Traffic::new(seed, 400, champion, candidate),
                900,
            );
            ends(&r.state.phase)
        })
        .count()
}

#[test]
fn sequential_on_evidence_stops_a_candidate_twice_as_error_prone() {
    use rollgate_core::Advance;
    let arms = (failing(0.005), failing(0.01));
    let promoted = [Advance::OnTime, Advance::OnEvidence].map(|advance| {
        let mut plan = sequential_plan(advance);
        plan.gates.error_rate.margin = 0.0025;
        rollouts_ending(plan, 8000..8030, arms, |p| {
            matches!(p, Phase::Promoted { .. })
        })
    });
    // Time alone lets a small regression through; evidence does not.
    assert!(
        promoted[1] <= 6,
        "on_evidence promoted {}/30 (on_time {}/30)",
        promoted[1],
        promoted[0]
    );
    assert!(
        promoted[0] > promoted[1],
        "on_time {} vs on_evidence {}",
        promoted[0],
        promoted[1]
    );
}

/// `sequential.max_error_ratio` is the error test's non-inferiority margin:
/// a candidate failing 3× as often as the champion is rolled back without
/// one, and not for its errors with a 4× margin.
#[test]
fn sequential_error_margin_is_a_rate_ratio() {
    use rollgate_core::{Advance, GateKind};
    let error_breaches = [1.0, 4.0].map(|ratio| {
        let mut plan = sequential_plan(Advance::OnTime);
        plan.sequential.max_error_ratio = ratio;
        rollouts_ending(plan, 9000..9020, (failing(0.01), failing(0.03)), |p| {
            matches!(
                p,
                Phase::RolledBack { reason: RollbackReason::AnytimeBreach { gates } }
                    if gates.contains(&GateKind::ErrorRate)
            )
        })
    });
    assert!(
        error_breaches[0] >= 15,
        "no margin: {}/20",
        error_breaches[0]
    );
    assert!(
        error_breaches[1] <= 1,
        "4x margin: {}/20",
        error_breaches[1]
    );
}

/// Found by the simulator: with cumulative evidence, later stages passed on
/// earlier stages' samples after traffic stopped. Each stage needs its own.
#[test]
fn sequential_traffic_that_stops_never_promotes() {
    use rollgate_core::Advance;
    for advance in [Advance::OnTime, Advance::OnEvidence] {
        let spec = spec(sequential_plan(advance));
        let mut traffic = Traffic::new(21, 400, HEALTHY, HEALTHY);
        let mut state = RolloutState::new(Timestamp(0));
        for s in 1..=600u64 {
            if s == 15 {
                traffic.rps = 0;
            }
            traffic.tick();
            let t = step(
                &spec,
                &state,
                Input::Observe(Observation {
                    routing_applied: None,
                    candidate_ready: true,
                    exposure: Some(Exposure::pooled(traffic.snapshot.clone())),
                    labels: None,
                }),
                Timestamp(s * 1000),
            )
            .expect("observe");
            for e in &t.effects {
                if let Effect::SetRouting { routing } = e {
                    traffic.routing = *routing;
                }
            }
            state = t.state;
            assert!(
                !matches!(state.phase, Phase::Promoted { .. }),
                "{advance:?}: promoted at {s}s"
            );
            if state.phase.is_terminal() {
                break;
            }
        }
        assert!(
            matches!(
                state.phase,
                Phase::RolledBack {
                    reason: RollbackReason::EvidenceTimeout { .. }
                }
            ),
            "{advance:?}: {:?}",
            state.phase
        );
    }
}

#[test]
fn sequential_state_round_trips_through_json_and_resumes_identically() {
    let spec = spec(sequential_plan(rollgate_core::Advance::OnTime));
    let r = run(&spec, &mut Traffic::new(3, 300, HEALTHY, HEALTHY), 8);
    assert!(matches!(
        r.state.tests,
        Some(rollgate_core::PolicyTests::Sequential(_))
    ));
    let json = serde_json::to_string(&r.state).expect("serialise");
    let back: RolloutState = serde_json::from_str(&json).expect("parse");
    assert_eq!(back, r.state);

    // A state stored before the policies had one enum kept the sequential
    // state under `sequential`: it is read, and taken over at the next look.
    let mut old: serde_json::Value = serde_json::from_str(&json).expect("value");
    let tests = old["tests"]["sequential"].take();
    assert!(tests.is_object(), "{json}");
    let map = old.as_object_mut().expect("object");
    map.remove("tests");
    map.insert("sequential".into(), tests);
    let legacy: RolloutState = serde_json::from_value(old).expect("legacy state");
    assert_eq!(legacy.tests, None);
    let Some(rollgate_core::PolicyTests::Sequential(seq)) = &r.state.tests else {
        unreachable!("checked above")
    };
    assert_eq!(legacy.legacy_sequential.as_ref(), Some(seq));
    let next = step(
        &spec,
        &legacy,
        Input::Observe(Observation::default()),
        Timestamp(9000),
    )
    .expect("observe");
    assert!(next.state.legacy_sequential.is_none());
    assert!(matches!(
        next.state.tests,
        Some(rollgate_core::PolicyTests::Sequential(_))
    ));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Whatever is observed, in whatever order: an automatic promotion only
    /// follows a stage verdict of "all gates pass", phases only move forward,
    /// and a rollout never promotes while no stats have ever been seen.
    #[test]
    fn promotion_only_follows_all_gates_passing(obs in proptest::collection::vec((any::<bool>(), arb_snapshot()), 1..120), sequential in any::<bool>()) {
        let spec = spec(if sequential { sequential_plan(rollgate_core::Advance::OnTime) } else { quick_plan() });
        let mut state = RolloutState::new(Timestamp(0));
        let mut cumulative = Snapshot::default();
        let mut order = 0;
        let rank = |p: &Phase| match p { Phase::Pending => 0, Phase::Shadow => 1, Phase::Canary { step, .. } => 2 + *step, _ => 100 };
        let mut saw_stats = false;
        for (i, (ready, snap)) in obs.into_iter().enumerate() {
            let snapshot = snap.map(|(ho, hf, co, cf)| {
                let r = cumulative.revision_mut(CH);
                for _ in 0..ho { r.record_success(20_000, ["ok"]); }
                for _ in 0..hf { r.record_failure(FailureClass::Timeout); }
                let r = cumulative.revision_mut(CA);
                for _ in 0..co { r.record_success(21_000, ["ok"]); }
                for _ in 0..cf { r.record_failure(FailureClass::Timeout); }
                for _ in 0..co.min(ho) { cumulative.pairs_mut(CA).record_pair(true, true); }
                cumulative.clone()
            });
            saw_stats |= snapshot.is_some();
            let t = step(&spec, &state, Input::Observe(Observation { routing_applied: None, candidate_ready: ready, exposure: snapshot.map(Exposure::pooled), labels: None }), Timestamp(i as u64 * 5000)).expect("observe");
            if let Phase::Promoted { manual } = t.state.phase {
                prop_assert!(!manual);
                prop_assert!(saw_stats);
                let v = t.state.last_verdict.as_ref().expect("verdict");
                prop_assert!(matches!(v.reason, StageReason::AllGatesPass | StageReason::NoRegressionShown { .. }), "{:?}", v.reason);
                prop_assert!(v.gates.iter().all(|g| g.outcome != rollgate_core::Outcome::Fail));
            }
            let r = rank(&t.state.phase);
            prop_assert!(r >= order);
            order = r;
            state = t.state;
        }
    }
}

#[test]
fn only_a_candidate_shown_worse_or_never_ready_is_rejected() {
    use rollgate_core::plan::RejectOn;
    let rejected = |plan: Plan, traffic: &mut Traffic| {
        let r = run(&spec(plan), traffic, 900);
        let phase = r.state.phase.clone();
        (phase, r.effects.contains(&Effect::RejectCandidate))
    };
    // Starved: no traffic at all, the deadline passes. Not rejected.
    let (phase, rej) = rejected(
        sequential_plan(rollgate_core::Advance::OnTime),
        &mut Traffic::new(1, 0, HEALTHY, HEALTHY),
    );
    assert!(
        matches!(
            phase,
            Phase::RolledBack {
                reason: RollbackReason::EvidenceTimeout { .. }
            }
        ),
        "{phase:?}"
    );
    assert!(!rej, "a starved rollout must leave the candidate startable");
    // The strict plan option keeps the old behaviour.
    let mut strict = sequential_plan(rollgate_core::Advance::OnTime);
    strict.reject_on = RejectOn::AnyRollback;
    let (_, rej) = rejected(strict, &mut Traffic::new(1, 0, HEALTHY, HEALTHY));
    assert!(rej);
    // Shown worse: rejected.
    let (phase, rej) = rejected(
        sequential_plan(rollgate_core::Advance::OnTime),
        &mut Traffic::new(2, 200, HEALTHY, failing(1.0)),
    );
    assert!(
        matches!(
            phase,
            Phase::RolledBack {
                reason: RollbackReason::AnytimeBreach { .. }
            }
        ),
        "{phase:?}"
    );
    assert!(rej);
}

#[test]
fn guard_rails_run_under_the_sequential_policy() {
    // Both arms fail 5%: no relative regression, but an absolute limit of
    // 2% is breached by the candidate, as the plan asks.
    let mut plan = sequential_plan(rollgate_core::Advance::OnTime);
    plan.gates.guard_rails.max_error_rate = Some(0.02);
    let r = run(
        &spec(plan.clone()),
        &mut Traffic::new(3, 400, failing(0.05), failing(0.05)),
        900,
    );
    match &r.state.phase {
        Phase::RolledBack {
            reason: RollbackReason::AnytimeBreach { gates },
        } => assert_eq!(gates, &vec![GateKind::GuardRails]),
        other => panic!("{other:?}"),
    }
    // Within the limit: promoted.
    plan.gates.guard_rails.max_error_rate = Some(0.2);
    let r = run(
        &spec(plan),
        &mut Traffic::new(3, 400, failing(0.05), failing(0.05)),
        900,
    );
    assert!(
        matches!(r.state.phase, Phase::Promoted { .. }),
        "{:?}",
        r.state.phase
    );
}

#[test]
fn a_candidate_answering_4xx_where_the_champion_answers_2xx_is_rolled_back() {
    let spec = spec(sequential_plan(rollgate_core::Advance::OnTime));
    // The candidate serves the model under another name: 404 to everything.
    let mut traffic = Traffic::new(11, 100, HEALTHY, HEALTHY);
    traffic.client_errors = (0.0, 1.0);
    let r = run(&spec, &mut traffic, 900);
    match &r.state.phase {
        Phase::RolledBack {
            reason: RollbackReason::AnytimeBreach { gates },
        } => assert_eq!(gates, &vec![GateKind::ErrorRate]),
        other => panic!("{other:?}"),
    }
    assert!(
        r.seconds <= 5,
        "rolled back after {} s at 100 rps",
        r.seconds
    );
    // A client that sends garbage to both arms alike moves neither.
    for seed in 0..10 {
        let mut traffic = Traffic::new(100 + seed, 200, HEALTHY, HEALTHY);
        traffic.client_errors = (0.3, 0.3);
        let r = run(&spec, &mut traffic, 900);
        assert!(
            matches!(r.state.phase, Phase::Promoted { .. }),
            "seed {seed}: {:?}",
            r.state.phase
        );
    }
}

/// The audit log is a log of decisions: a healthy rollout under the
/// default plan (about four minutes at one look a second) writes at most 50
/// records, and a paused rollout with no traffic about one a minute (seen:
/// 13 records in 241 s; 12 in ten paused minutes).
#[test]
fn the_audit_log_holds_decisions_not_every_look() {
    let audits = |effects: &[Effect]| {
        effects
            .iter()
            .filter(|e| matches!(e, Effect::Audit { .. }))
            .count()
    };
    let spec = spec(Plan::default());
    let r = run(&spec, &mut Traffic::new(11, 100, HEALTHY, HEALTHY), 900);
    assert!(
        matches!(r.state.phase, Phase::Promoted { .. }),
        "{:?}",
        r.state.phase
    );
    assert!((180..=360).contains(&r.seconds), "{} s", r.seconds);
    let n = audits(&r.effects);
    assert!(n <= 50, "{n} records in {} s", r.seconds);

    // In its first canary step, paused, then ten minutes of looks with no
    // traffic.
    let mut traffic = Traffic::new(12, 100, HEALTHY, HEALTHY);
    let mut state = RolloutState::new(Timestamp(0));
    let mut s = 0;
    while !matches!(state.phase, Phase::Canary { .. }) {
        assert!(s < 600, "never reached canary: {:?}", state.phase);
        traffic.tick();
        s += 1;
        let t = observe(&spec, &state, true, Some(traffic.snapshot.clone()), s);
        for e in &t.effects {
            if let Effect::SetRouting { routing } = e {
                traffic.routing = *routing;
            }
        }
        state = t.state;
    }
    let mut t = step(
        &spec,
        &state,
        Input::Operator {
            actor: "alice".into(),
            action: OperatorAction::Pause,
        },
        Timestamp(s * 1000),
    )
    .expect("pause");
    let mut records = audits(&t.effects);
    for i in 1..=600u64 {
        t = observe(&spec, &t.state, true, Some(traffic.snapshot.clone()), s + i);
        records += audits(&t.effects);
    }
    assert!(t.state.paused && matches!(t.state.phase, Phase::Canary { .. }));
    eprintln!(
        "healthy rollout: {n} records in {} s; paused idle: {records} in 600 s",
        r.seconds
    );
    // The pause, the verdict changing once (traffic stopped), and one
    // summary a minute.
    assert!(records <= 12, "{records} records in 10 idle minutes");
}
