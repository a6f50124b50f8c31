//! The rollout state machine, driven through its public API with synthetic,
//! seeded traffic. No clock, no sockets: `now` is an argument.

use std::time::Duration;

use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, LogNormal};
use rollgate_core::{
    AuditKind, Effect, Exposure, FailureClass, GateKind, Input, Observation, OperatorAction,
    Outcome, Phase, Plan, RollbackReason, RolloutSpec, RolloutState, Routing, Snapshot,
    StageReason, StepError, Timestamp, step,
};

const CH: &str = "rev-champion";
const CA: &str = "rev-candidate";

fn spec(plan: Plan) -> RolloutSpec {
    RolloutSpec {
        model: "risk".into(),
        champion: CH.into(),
        candidate: CA.into(),
        plan,
    }
}

/// A short plan for tests: 10 s stages, 60 s deadline, under the
/// `windowed` policy (whose confirmation rules most tests here pin; the
/// `sequential` default has its own tests below).
fn quick_plan() -> Plan {
    Plan {
        policy: rollgate_core::Policy::Windowed,
        min_stage_duration: Duration::from_secs(10),
        evidence_timeout: Duration::from_secs(60),
        readiness_timeout: Duration::from_secs(30),
        ..Plan::default()
    }
}

/// How each arm behaves.
#[derive(Clone, Copy)]
struct Arm {
    failure: f64,
    median_ms: f64,
}

const HEALTHY: Arm = Arm {
    failure: 0.005,
    median_ms: 20.0,
};

/// An arm failing `failure` of its requests, at the healthy 20 ms median.
fn failing(failure: f64) -> Arm {
    Arm {
        failure,
        median_ms: 20.0,
    }
}

/// A seeded traffic source that records what a gateway would, following the
/// routing the state machine asks for.
struct Traffic {
    rng: StdRng,
    snapshot: Snapshot,
    routing: Routing,
    rps: u64,
    champion: Arm,
    candidate: Arm,
    /// Probability a mirrored pair agrees.
    agreement: f64,
    /// Probability of a 4xx answer: (champion, candidate).
    client_errors: (f64, f64),
    /// Share of answers of class "fraud": (champion, candidate).
    fraud: (f64, f64),
}

impl Traffic {
    fn new(seed: u64, rps: u64, champion: Arm, candidate: Arm) -> Self {
        Traffic {
            rng: StdRng::seed_from_u64(seed),
            snapshot: Snapshot::default(),
            routing: Routing::CHAMPION_ONLY,
            rps,
            champion,
            candidate,
            agreement: 0.99,
            client_errors: (0.0, 0.0),
            fraud: (0.3, 0.3),
        }
    }

    fn serve(&mut self, rev: &str, arm: Arm) -> Option<String> {
        let latency = LogNormal::new((arm.median_ms * 1000.0).ln(), 0.3).expect("valid lognormal");
        let fraud = if rev == CA {
            self.fraud.1
        } else {
            self.fraud.0
        };
        let class = if self.rng.random_bool(fraud) {
            "fraud"
        } else {
            "ok"
        };
        let p4 = if rev == CA {
            self.client_errors.1
        } else {
            self.client_errors.0
        };
        if self.rng.random_bool(p4) {
            self.snapshot.revision_mut(rev).record_client_error();
            None
        } else if self.rng.random_bool(arm.failure) {
            self.snapshot
                .revision_mut(rev)
                .record_failure(FailureClass::Upstream5xx);
            None
        } else {
            let us = latency.sample(&mut self.rng) as u64;
            self.snapshot.revision_mut(rev).record_success(us, [class]);
            Some(class.to_string())
        }
    }

    /// One second of traffic.
    fn tick(&mut self) {
        for _ in 0..self.rps {
            let to_candidate = self.rng.random_range(0..10_000) < self.routing.candidate_weight_bp;
            if to_candidate {
                self.serve(CA, self.candidate);
                continue;
            }
            let served = self.serve(CH, self.champion);
            if self.rng.random_range(0..10_000) < self.routing.mirror_bp {
                let shadow = self.serve(CA, self.candidate);
                if served.is_some() && shadow.is_some() {
                    let agreed = self.rng.random_bool(self.agreement);
                    let confident = self.rng.random_bool(0.5);
                    self.snapshot.pairs_mut(CA).record_pair(agreed, confident);
                }
            }
        }
    }
}

/// Runs a rollout to its end (or `max_s` seconds), one evaluation a second.
struct Run {
    state: RolloutState,
    effects: Vec<Effect>,
    seconds: u64,
}

fn run(spec: &RolloutSpec, traffic: &mut Traffic, max_s: u64) -> Run {
    let mut state = RolloutState::new(Timestamp(0));
    let mut effects = Vec::new();
    let mut s = 0;
    while s < max_s && !state.phase.is_terminal() {
        traffic.tick();
        s += 1;
        let obs = Observation {
            routing_applied: None,
            candidate_ready: true,
            exposure: Some(Exposure::pooled(traffic.snapshot.clone())),
        };
        let t = step(spec, &state, Input::Observe(obs), Timestamp(s * 1000))
            .expect("observe never errs");
        for e in &t.effects {
            if let Effect::SetRouting { routing } = e {
                traffic.routing = *routing;
            }
        }
        effects.extend(t.effects);
        state = t.state;
    }
    Run {
        state,
        effects,
        seconds: s,
    }
}

fn audits(effects: &[Effect]) -> Vec<AuditKind> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Audit { event } => Some(event.kind),
            _ => None,
        })
        .collect()
}

/// `state` paused by an operator at time 0.
fn paused(spec: &RolloutSpec, state: &RolloutState) -> RolloutState {
    let pause = Input::Operator {
        actor: "alice".into(),
        action: OperatorAction::Pause,
    };
    step(spec, state, pause, Timestamp(0)).expect("pause").state
}

fn observe(
    spec: &RolloutSpec,
    state: &RolloutState,
    ready: bool,
    snapshot: Option<Snapshot>,
    now_s: u64,
) -> rollgate_core::Transition {
    step(
        spec,
        state,
        Input::Observe(Observation {
            routing_applied: None,
            candidate_ready: ready,
            exposure: snapshot.map(Exposure::pooled),
        }),
        Timestamp(now_s * 1000),
    )
    .expect("observe never errs")
}

#[test]
fn candidate_not_ready_waits_then_rolls_back_at_readiness_timeout() {
    let spec = spec(quick_plan());
    let s0 = RolloutState::new(Timestamp(0));
    let t = observe(&spec, &s0, false, Some(Snapshot::default()), 29);
    assert_eq!(t.state.phase, Phase::Pending);
    assert!(t.effects.is_empty());
    let t = observe(&spec, &t.state, false, Some(Snapshot::default()), 30);
    assert_eq!(
        t.state.phase,
        Phase::RolledBack {
            reason: RollbackReason::ReadinessTimeout
        }
    );
    assert!(t.effects.contains(&Effect::RejectCandidate));
}

#[test]
fn ready_candidate_enters_shadow_with_full_mirroring_and_no_live_exposure() {
    let spec = spec(quick_plan());
    let t = observe(&spec, &RolloutState::new(Timestamp(0)), true, None, 1);
    assert_eq!(t.state.phase, Phase::Shadow);
    assert_eq!(
        t.effects[0],
        Effect::SetRouting {
            routing: Routing {
                candidate_weight_bp: 0,
                mirror_bp: 10_000,
                epoch: 1,
                assignment: Default::default(),
                fallback_to_champion: false,
            }
        }
    );
    assert_eq!(audits(&t.effects), vec![AuditKind::Started]);
}

#[test]
fn without_shadow_the_first_stage_is_the_first_canary_step() {
    let mut plan = quick_plan();
    plan.shadow.enabled = false;
    let t = observe(&spec(plan), &RolloutState::new(Timestamp(0)), true, None, 1);
    assert_eq!(
        t.state.phase,
        Phase::Canary {
            step: 0,
            weight_percent: 5
        }
    );
}

#[test]
fn healthy_candidate_walks_every_stage_to_promoted() {
    let spec = spec(quick_plan());
    let mut traffic = Traffic::new(7, 400, HEALTHY, HEALTHY);
    let r = run(&spec, &mut traffic, 600);
    assert_eq!(
        r.state.phase,
        Phase::Promoted { manual: false },
        "after {}s: {:?}",
        r.seconds,
        r.state.last_verdict
    );
    let weights: Vec<u32> = r
        .effects
        .iter()
        .filter_map(|e| match e {
            Effect::SetRouting { routing } => Some(routing.candidate_weight_bp),
            _ => None,
        })
        .collect();
    assert_eq!(weights, vec![0, 500, 2500, 5000]);
    assert_eq!(
        r.effects
            .iter()
            .filter(|e| **e == Effect::PromoteCandidate)
            .count(),
        1
    );
    assert!(!r.effects.contains(&Effect::RejectCandidate));
}

#[test]
fn always_failing_candidate_is_refused_in_shadow_with_zero_live_exposure() {
    let spec = spec(quick_plan());
    let dead = Arm {
        failure: 1.0,
        median_ms: 5.0,
    };
    let mut traffic = Traffic::new(1, 100, HEALTHY, dead);
    let r = run(&spec, &mut traffic, 120);
    let Phase::RolledBack { reason } = &r.state.phase else {
        panic!("expected rollback, got {:?}", r.state.phase)
    };
    assert_eq!(
        *reason,
        RollbackReason::GrossBreach {
            gates: vec![GateKind::ErrorRate]
        }
    );
    // Gross: no confirmation, and before the stage's minimum duration.
    assert!(r.seconds < 10, "{}s", r.seconds);
    // The candidate never served a live request: only mirrors.
    let live_weight: u32 = r
        .effects
        .iter()
        .filter_map(|e| match e {
            Effect::SetRouting { routing } => Some(routing.candidate_weight_bp),
            _ => None,
        })
        .sum();
    assert_eq!(live_weight, 0);
}

#[test]
fn routing_returns_to_champion_before_the_rollout_is_marked_rolled_back() {
    let spec = spec(quick_plan());
    let dead = Arm {
        failure: 1.0,
        median_ms: 5.0,
    };
    let r = run(&spec, &mut Traffic::new(2, 100, HEALTHY, dead), 120);
    let pos = |pred: &dyn Fn(&Effect) -> bool| r.effects.iter().position(pred).expect("present");
    let routing = pos(&|e| {
        *e == Effect::SetRouting {
            routing: Routing::CHAMPION_ONLY,
        }
    });
    let rejected = pos(&|e| *e == Effect::RejectCandidate);
    let marked =
        pos(&|e| matches!(e, Effect::Audit { event } if event.kind == AuditKind::RolledBack));
    assert!(routing < rejected && rejected < marked);
}

#[test]
fn latency_regression_rolls_back_at_the_first_canary_step_after_confirmation() {
    let mut plan = quick_plan();
    plan.shadow.enabled = false;
    let spec = spec(plan);
    let slow = Arm {
        failure: 0.005,
        median_ms: 120.0,
    };
    let r = run(&spec, &mut Traffic::new(3, 2000, HEALTHY, slow), 120);
    let Phase::RolledBack { reason } = &r.state.phase else {
        panic!("expected rollback, got {:?}", r.state.phase)
    };
    assert_eq!(
        *reason,
        RollbackReason::Breach {
            gates: vec![GateKind::Latency],
            confirmations: 2
        }
    );
    let breaches = r
        .effects
        .iter()
        .filter(|e| matches!(e, Effect::Audit { event } if event.verdict.as_ref().is_some_and(|v| v.outcome == Outcome::Fail)))
        .count();
    // Two failing evaluations, plus the rollback record that carries the last one.
    assert_eq!(breaches, 3);
}

/// Adds `ok` successes and `failed` failures to one arm.
fn add(s: &mut Snapshot, rev: &str, ok: u64, failed: u64) {
    for _ in 0..ok {
        s.revision_mut(rev).record_success(20_000, ["ok"]);
    }
    for _ in 0..failed {
        s.revision_mut(rev).record_failure(FailureClass::Timeout);
    }
}

#[test]
fn a_clean_window_between_breached_windows_resets_the_confirmation() {
    let mut plan = quick_plan();
    plan.shadow.enabled = false;
    let spec = spec(plan);
    let mut snap = Snapshot::default();
    let mut state = observe(
        &spec,
        &RolloutState::new(Timestamp(0)),
        true,
        Some(snap.clone()),
        0,
    )
    .state;
    let breaches = |s: &RolloutState| s.unconfirmed_breaches();
    // Window 1: the candidate fails 10% against a clean champion.
    add(&mut snap, CH, 200, 0);
    add(&mut snap, CA, 180, 20);
    state = observe(&spec, &state, true, Some(snap.clone()), 1).state;
    assert_eq!(breaches(&state), Some(1));
    // Stats unavailable: no window closes, nothing changes.
    state = observe(&spec, &state, true, None, 2).state;
    assert_eq!(breaches(&state), Some(1));
    // Window 2: clean and judged: the count resets.
    add(&mut snap, CH, 200, 0);
    add(&mut snap, CA, 200, 0);
    state = observe(&spec, &state, true, Some(snap.clone()), 3).state;
    assert_eq!(breaches(&state), Some(0));
    // Window 3 breaches: one, not yet a rollback.
    add(&mut snap, CH, 200, 0);
    add(&mut snap, CA, 180, 20);
    state = observe(&spec, &state, true, Some(snap.clone()), 4).state;
    assert_eq!(breaches(&state), Some(1));
    assert!(!state.phase.is_terminal());
    // Too few requests in the next window: no judgement, still one.
    add(&mut snap, CA, 5, 1);
    state = observe(&spec, &state, true, Some(snap.clone()), 5).state;
    assert_eq!(breaches(&state), Some(1));
    // Window 4 breaches: confirmed.
    add(&mut snap, CH, 200, 0);
    add(&mut snap, CA, 180, 20);
    state = observe(&spec, &state, true, Some(snap), 6).state;
    assert_eq!(
        state.phase,
        Phase::RolledBack {
            reason: RollbackReason::Breach {
                gates: vec![GateKind::ErrorRate],
                confirmations: 2
            }
        }
    );
}

#[test]
fn a_breached_window_holds_the_stage_until_a_clean_window() {
    let mut plan = quick_plan();
    plan.shadow.enabled = false;
    let spec = spec(plan);
    let mut snap = Snapshot::default();
    let mut state = observe(
        &spec,
        &RolloutState::new(Timestamp(0)),
        true,
        Some(snap.clone()),
        0,
    )
    .state;
    add(&mut snap, CH, 200, 0);
    add(&mut snap, CA, 180, 20);
    state = observe(&spec, &state, true, Some(snap.clone()), 1).state;
    // Long after the minimum duration, with a big clean champion and a
    // candidate that recovered, the stage still does not advance while the
    // last window breached...
    add(&mut snap, CH, 50_000, 0);
    add(&mut snap, CA, 20, 0);
    state = observe(&spec, &state, true, Some(snap.clone()), 30).state;
    assert_eq!(state.phase.name(), "CANARY");
    assert_eq!(state.unconfirmed_breaches(), Some(1));
}

#[test]
fn starved_canary_rolls_back_with_evidence_timeout_and_never_promotes() {
    let spec = spec(quick_plan());
    // 2 requests a second: the 5% step sees about one candidate request in 10 s.
    let r = run(&spec, &mut Traffic::new(4, 2, HEALTHY, HEALTHY), 1000);
    let Phase::RolledBack { reason } = &r.state.phase else {
        panic!("expected rollback, got {:?}", r.state.phase)
    };
    assert!(
        matches!(reason, RollbackReason::EvidenceTimeout { .. }),
        "{reason:?}"
    );
}

#[test]
fn stats_that_never_arrive_fail_safe_at_the_deadline() {
    let spec = spec(quick_plan());
    let mut state = observe(&spec, &RolloutState::new(Timestamp(0)), true, None, 0).state;
    for s in 1..60 {
        state = observe(&spec, &state, true, None, s).state;
        assert_eq!(state.phase, Phase::Shadow);
    }
    let t = observe(&spec, &state, true, None, 60);
    assert!(matches!(
        t.state.phase,
        Phase::RolledBack {
            reason: RollbackReason::EvidenceTimeout { .. }
        }
    ));
}

#[test]
fn shared_outage_never_rolls_back_and_never_promotes() {
    let spec = spec(quick_plan());
    let down = Arm {
        failure: 1.0,
        median_ms: 5.0,
    };
    for seed in 0..20 {
        let mut traffic = Traffic::new(seed, 50 + seed * 10, down, down);
        let r = run(&spec, &mut traffic, 400);
        assert!(
            !r.state.phase.is_terminal(),
            "seed {seed}: {:?}",
            r.state.phase
        );
        assert_eq!(
            r.state.last_verdict.as_ref().map(|v| &v.reason),
            Some(&StageReason::SharedOutage)
        );
    }
}

/// Every evaluation is accounted for in the audit log: written with its
/// verdict when it says something new (or a minute passed), else counted
/// in the next record's summary; nothing is lost or counted twice.
#[test]
fn every_evaluation_is_audited_or_summarised_with_its_verdict() {
    let spec = spec(quick_plan());
    let r = run(&spec, &mut Traffic::new(5, 400, HEALTHY, HEALTHY), 600);
    let records: Vec<&rollgate_core::AuditEvent> = r
        .effects
        .iter()
        .filter_map(|e| match e {
            Effect::Audit { event } if event.kind == AuditKind::Evaluated => Some(event.as_ref()),
            _ => None,
        })
        .collect();
    assert!(records.iter().all(|e| e.verdict.is_some()));
    let accounted: u64 = records
        .iter()
        .map(|e| {
            1 + e
                .note
                .as_deref()
                .and_then(|n| n.split(" evaluations alike").next())
                .and_then(|n| n.rsplit(' ').next())
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0)
        })
        .sum();
    let last = r.state.audited.as_ref().expect("audited").evaluation;
    assert_eq!(accounted, last);
    assert!(last <= r.state.evaluations);
    assert!(
        (records.len() as u64) * 3 < r.state.evaluations,
        "{} records for {} evaluations",
        records.len(),
        r.state.evaluations
    );
}

/// An idle rollout (no request counted, a stage waiting out its minimum
/// duration) records what it said once; its later looks, which all say
/// the same, are counted but not recorded again — under both policies,
/// over an hour of looks a second apart. Evidence that moves is summarised
/// again (the test above).
#[test]
fn an_idle_rollouts_unchanged_looks_are_not_recorded_again() {
    for policy in [
        rollgate_core::Policy::Sequential,
        rollgate_core::Policy::Windowed,
    ] {
        let spec = spec(Plan {
            policy,
            min_stage_duration: Duration::from_secs(7200),
            evidence_timeout: Duration::from_secs(7200),
            ..quick_plan()
        });
        let mut state = RolloutState::new(Timestamp(0));
        let mut records = Vec::new();
        for s in 0..3600 {
            let t = observe(&spec, &state, true, Some(Snapshot::default()), s);
            records.extend(t.effects.iter().filter_map(|e| match e {
                Effect::Audit { event } if event.kind == AuditKind::Evaluated => Some(s),
                _ => None,
            }));
            state = t.state;
        }
        assert!(!state.phase.is_terminal(), "{policy:?}: {:?}", state.phase);
        assert!(
            state.evaluations >= 3_590,
            "{policy:?}: {}",
            state.evaluations
        );
        // The first look, and one per change of what a stage says (into
        // SHADOW, evidence awaited): a handful, all in the first minutes.
        assert!(records.len() <= 4, "{policy:?}: records at {records:?}");
        assert!(
            records.iter().all(|&s| s < 120),
            "{policy:?}: records at {records:?}"
        );
    }
}

/// A stage that fails safe while paused (here: no stats past its
/// deadline) is held, and its failing look is recorded once, not at every
/// look of the pause.
#[test]
fn a_failing_look_held_by_a_pause_is_recorded_once() {
    let spec = spec(quick_plan());
    let mut state = observe(&spec, &RolloutState::new(Timestamp(0)), true, None, 0).state;
    state = paused(&spec, &state);
    let mut failing = 0;
    for s in 1..600 {
        let t = observe(&spec, &state, true, None, s);
        failing += t
            .effects
            .iter()
            .filter(|e| {
                matches!(e, Effect::Audit { event } if event.kind == AuditKind::Evaluated
                && event.verdict.as_ref().is_some_and(|v| v.outcome == Outcome::Fail))
            })
            .count();
        state = t.state;
    }
    assert!(!state.phase.is_terminal(), "{:?}", state.phase);
    assert_eq!(
        state.last_verdict.as_ref().map(|v| v.outcome),
        Some(Outcome::Fail)
    );
    assert_eq!(failing, 1, "failing looks recorded while paused");
}

#[test]
fn a_gateway_restart_neither_invents_nor_loses_evidence() {
    let spec = spec(quick_plan());
    let mut traffic = Traffic::new(6, 200, HEALTHY, HEALTHY);
    traffic.tick();
    let mut state = observe(
        &spec,
        &RolloutState::new(Timestamp(0)),
        true,
        Some(traffic.snapshot.clone()),
        0,
    )
    .state;
    traffic.routing = Routing {
        candidate_weight_bp: 0,
        mirror_bp: 10_000,
        epoch: 1,
        assignment: Default::default(),
        fallback_to_champion: false,
    };
    traffic.tick();
    state = observe(&spec, &state, true, Some(traffic.snapshot.clone()), 1).state;
    let before = state.evidence.pooled(1, 1);
    assert!(before.revision(CH).requests() > 0);
    // The gateway restarted: its counters start again from zero.
    let t = observe(&spec, &state, true, Some(Snapshot::default()), 2);
    assert_eq!(t.state.evidence.pooled(1, 1), before);
    // What it counts after the restart is added, not what it counted before.
    let mut after = Snapshot::default();
    after.revision_mut(CH).record_failure(FailureClass::Timeout);
    let t = observe(&spec, &t.state, true, Some(after), 3);
    assert_eq!(
        t.state.evidence.pooled(1, 1).revision(CH).requests(),
        before.revision(CH).requests() + 1
    );
}

#[test]
fn paused_rollout_does_not_advance_but_still_rolls_back_on_a_breach() {
    let spec = spec(quick_plan());
    let t = step(
        &spec,
        &RolloutState::new(Timestamp(0)),
        Input::Operator {
            actor: "alice".into(),
            action: OperatorAction::Pause,
        },
        Timestamp(0),
    )
    .expect("pause");
    assert!(t.state.paused);
    // Paused in PENDING: the candidate is ready but nothing starts.
    let t2 = observe(&spec, &t.state, true, None, 1);
    assert_eq!(t2.state.phase, Phase::Pending);

    // Paused in SHADOW with healthy traffic: stays in SHADOW however long.
    let mut traffic = Traffic::new(8, 400, HEALTHY, HEALTHY);
    let mut state = observe(
        &spec,
        &RolloutState::new(Timestamp(0)),
        true,
        Some(traffic.snapshot.clone()),
        0,
    )
    .state;
    traffic.routing = Routing::for_phase(&spec.plan, &Phase::Shadow);
    state = paused(&spec, &state);
    for s in 1..=120 {
        traffic.tick();
        state = observe(&spec, &state, true, Some(traffic.snapshot.clone()), s).state;
    }
    assert_eq!(state.phase, Phase::Shadow);
    assert_eq!(
        state.last_verdict.as_ref().map(|v| v.outcome),
        Some(Outcome::Pass)
    );
    // A dead candidate while paused is still rolled back.
    traffic.candidate = Arm {
        failure: 1.0,
        median_ms: 1.0,
    };
    let mut s = 120;
    while !state.phase.is_terminal() && s < 300 {
        traffic.tick();
        s += 1;
        state = observe(&spec, &state, true, Some(traffic.snapshot.clone()), s).state;
    }
    assert!(
        matches!(state.phase, Phase::RolledBack { .. }),
        "{:?}",
        state.phase
    );
}

#[test]
fn manual_promote_requires_a_reason_and_is_audited_as_the_operator() {
    let spec = spec(quick_plan());
    let s0 = RolloutState::new(Timestamp(0));
    let op = |action| Input::Operator {
        actor: "bob".into(),
        action,
    };
    assert_eq!(
        step(
            &spec,
            &s0,
            op(OperatorAction::Promote {
                reason: "  ".into()
            }),
            Timestamp(0)
        ),
        Err(StepError::ReasonRequired { action: "promote" })
    );
    let t = step(
        &spec,
        &s0,
        op(OperatorAction::Promote {
            reason: "hotfix, verified by hand".into(),
        }),
        Timestamp(0),
    )
    .expect("promote");
    assert_eq!(t.state.phase, Phase::Promoted { manual: true });
    let Some(Effect::Audit { event }) = t.effects.last() else {
        panic!("audit last")
    };
    assert_eq!(event.note.as_deref(), Some("hotfix, verified by hand"));
    assert_eq!(
        event.actor,
        rollgate_core::Actor::Operator { name: "bob".into() }
    );
    assert!(t.effects.contains(&Effect::PromoteCandidate));
}

#[test]
fn abort_returns_traffic_to_the_champion_without_rejecting_the_candidate() {
    let spec = spec(quick_plan());
    let state = observe(&spec, &RolloutState::new(Timestamp(0)), true, None, 0).state;
    let t = step(
        &spec,
        &state,
        Input::Operator {
            actor: "carol".into(),
            action: OperatorAction::Abort {
                reason: "wrong artifact".into(),
            },
        },
        Timestamp(1000),
    )
    .expect("abort");
    assert_eq!(t.state.phase, Phase::Aborted);
    assert_eq!(
        t.effects[0],
        Effect::SetRouting {
            routing: Routing::CHAMPION_ONLY
        }
    );
    assert!(!t.effects.contains(&Effect::RejectCandidate));
}

#[test]
fn operator_actions_that_do_not_apply_are_errors() {
    let spec = spec(quick_plan());
    let s0 = RolloutState::new(Timestamp(0));
    let op = |action| Input::Operator {
        actor: "dan".into(),
        action,
    };
    assert_eq!(
        step(&spec, &s0, op(OperatorAction::Resume), Timestamp(0)),
        Err(StepError::NotPaused)
    );
    let paused = step(&spec, &s0, op(OperatorAction::Pause), Timestamp(0))
        .expect("pause")
        .state;
    assert_eq!(
        step(&spec, &paused, op(OperatorAction::Pause), Timestamp(0)),
        Err(StepError::AlreadyPaused)
    );
    let done = step(
        &spec,
        &s0,
        op(OperatorAction::Abort { reason: "x".into() }),
        Timestamp(0),
    )
    .expect("abort")
    .state;
    assert_eq!(
        step(&spec, &done, op(OperatorAction::Pause), Timestamp(0)),
        Err(StepError::Terminal { phase: "ABORTED" })
    );
    // Observations of a finished rollout change nothing.
    let t = observe(&spec, &done, true, Some(Snapshot::default()), 5);
    assert_eq!((t.state, t.effects), (done, vec![]));
}

#[test]
fn rollout_state_round_trips_through_json() {
    let spec = spec(quick_plan());
    let r = run(&spec, &mut Traffic::new(9, 300, HEALTHY, HEALTHY), 25);
    let json = serde_json::to_string(&r.state).expect("serialise");
    let back: RolloutState = serde_json::from_str(&json).expect("parse");
    assert_eq!(back, r.state);
}

/// The field bug (model-canary-gate): a byte-identical candidate was rolled
/// back on noisy ~60-request windows. Two hundred seeded rollouts of an
/// identical candidate at low and high traffic: none may roll back on a
/// breach; with enough traffic every one is promoted.
#[test]
fn identical_candidate_with_noisy_windows_is_never_rolled_back_for_a_breach() {
    let spec = spec(quick_plan());
    let mut promoted_at_high_rps = 0;
    for seed in 0..200u64 {
        let rps = [60, 150, 400, 1000][seed as usize % 4];
        let arm = failing([0.0, 0.005, 0.015][seed as usize % 3]);
        let r = run(&spec, &mut Traffic::new(1000 + seed, rps, arm, arm), 600);
        match &r.state.phase {
            Phase::Promoted { .. } => {
                promoted_at_high_rps += u32::from(rps >= 400 && arm.failure <= 0.005)
            }
            Phase::RolledBack { reason } => assert!(
                matches!(reason, RollbackReason::EvidenceTimeout { .. }),
                "seed {seed} rps {rps}: {reason:?}"
            ),
            other => panic!("seed {seed}: unfinished {other:?}"),
        }
    }
    // At 400 and 1000 rps with up to 0.5% errors every stage has evidence
    // before its 60 s deadline. At 60 and 150 rps, or 1.5% errors, some 5%
    // steps cannot show non-inferiority in time and fail safe, as they must.
    assert_eq!(promoted_at_high_rps, 67);
}

/// The `sequential` policy with the quick clocks.
fn sequential_plan(advance: rollgate_core::Advance) -> Plan {
    let mut p = quick_plan();
    p.policy = rollgate_core::Policy::Sequential;
    p.sequential.advance = advance;
    p.evidence_timeout = Duration::from_secs(120);
    p
}

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

fn arb_snapshot() -> impl Strategy<Value = Option<(u64, u64, u64, u64)>> {
    proptest::option::of((0u64..400, 0u64..40, 0u64..400, 0u64..40))
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
            let t = step(&spec, &state, Input::Observe(Observation { routing_applied: None, candidate_ready: ready, exposure: snapshot.map(Exposure::pooled) }), Timestamp(i as u64 * 5000)).expect("observe");
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

// ---- Approval steps -------------------------------------------------------

use rollgate_core::plan::{ApprovalPoint, ApprovalStep, OnDeadline};

fn with_approval(
    mut plan: Plan,
    before: ApprovalPoint,
    deadline: Option<u64>,
    on: OnDeadline,
) -> Plan {
    plan.approvals.push(ApprovalStep {
        before,
        deadline: deadline.map(Duration::from_secs),
        on_deadline: on,
    });
    assert_eq!(plan.validate(), Ok(()));
    plan
}

/// A fresh rollout of `plan` with one approval step, and healthy traffic
/// for both revisions from `seed`.
fn approval_run(
    plan: Plan,
    before: ApprovalPoint,
    deadline: Option<u64>,
    on: OnDeadline,
    seed: u64,
) -> (RolloutSpec, Traffic, Run) {
    let spec = spec(with_approval(plan, before, deadline, on));
    (spec, Traffic::new(seed, 400, HEALTHY, HEALTHY), fresh())
}

/// Steps the rollout a second at a time over `(from, to]` seconds (or to
/// its end), with the operator's `act` (if any) applied before each look.
fn drive(
    spec: &RolloutSpec,
    run: &mut Run,
    traffic: &mut Traffic,
    to: u64,
    mut act: impl FnMut(u64, &RolloutState) -> Option<OperatorAction>,
) {
    while run.seconds < to && !run.state.phase.is_terminal() {
        run.seconds += 1;
        let now = Timestamp(run.seconds * 1000);
        if let Some(action) = act(run.seconds, &run.state) {
            let t = step(
                spec,
                &run.state,
                Input::Operator {
                    actor: "alice".into(),
                    action,
                },
                now,
            )
            .expect("the action applies");
            run.effects.extend(t.effects);
            run.state = t.state;
        }
        traffic.tick();
        let obs = Observation {
            routing_applied: None,
            candidate_ready: true,
            exposure: Some(Exposure::pooled(traffic.snapshot.clone())),
        };
        let t = step(spec, &run.state, Input::Observe(obs), now).expect("observe never errs");
        for e in &t.effects {
            if let Effect::SetRouting { routing } = e {
                traffic.routing = *routing;
            }
        }
        run.effects.extend(t.effects);
        run.state = t.state;
    }
}

fn fresh() -> Run {
    Run {
        state: RolloutState::new(Timestamp(0)),
        effects: Vec::new(),
        seconds: 0,
    }
}

fn weights(effects: &[Effect]) -> Vec<u32> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::SetRouting { routing } => Some(routing.candidate_weight_bp),
            _ => None,
        })
        .collect()
}

fn approve() -> OperatorAction {
    OperatorAction::Approve {
        reason: "looked at the dashboards".into(),
    }
}

#[test]
fn an_approval_step_holds_the_rollout_until_an_operator_approves() {
    for plan in [
        quick_plan(),
        sequential_plan(rollgate_core::Advance::OnTime),
    ] {
        let (spec, mut traffic, mut r) = approval_run(
            plan,
            ApprovalPoint::Weight(25),
            None,
            OnDeadline::RollBack,
            7,
        );
        drive(&spec, &mut r, &mut traffic, 900, |_, _| None);
        // Stopped before 25%, still judged, waiting (once audited).
        assert_eq!(
            r.state.phase,
            Phase::Canary {
                step: 0,
                weight_percent: 5
            },
            "{:?}",
            r.state.last_verdict
        );
        let a = r.state.awaiting.clone().expect("awaiting");
        assert_eq!(a.before, ApprovalPoint::Weight(25));
        assert_eq!(weights(&r.effects), vec![0, 500]);
        let kinds = audits(&r.effects);
        assert_eq!(
            kinds
                .iter()
                .filter(|k| **k == AuditKind::AwaitingApproval)
                .count(),
            1
        );
        assert!(r.state.evaluations > 100, "it kept judging the stage");
        // Approved: it walks on to promotion.
        let mut once = Some(approve());
        drive(&spec, &mut r, &mut traffic, 2000, |_, _| once.take());
        assert_eq!(r.state.phase, Phase::Promoted { manual: false });
        assert_eq!(weights(&r.effects), vec![0, 500, 2500, 5000]);
        assert!(r.state.awaiting.is_none());
        assert_eq!(r.state.approved, vec![ApprovalPoint::Weight(25)]);
        let approved: Vec<_> = r
            .effects
            .iter()
            .filter_map(|e| match e {
                Effect::Audit { event } if event.kind == AuditKind::Approved => Some(event),
                _ => None,
            })
            .collect();
        assert_eq!(approved.len(), 1);
        assert_eq!(
            approved[0].actor,
            rollgate_core::Actor::Operator {
                name: "alice".into()
            }
        );
        assert!(
            approved[0]
                .note
                .as_deref()
                .is_some_and(|n| n.contains("25%"))
        );
    }
}

#[test]
fn an_unapproved_promotion_rolls_back_at_its_deadline_without_rejecting() {
    let (spec, mut traffic, mut r) = approval_run(
        sequential_plan(rollgate_core::Advance::OnTime),
        ApprovalPoint::PROMOTION,
        Some(120),
        OnDeadline::RollBack,
        3,
    );
    drive(&spec, &mut r, &mut traffic, 3000, |_, _| None);
    assert_eq!(
        r.state.phase,
        Phase::RolledBack {
            reason: RollbackReason::ApprovalTimeout {
                before: ApprovalPoint::PROMOTION
            }
        }
    );
    assert!(!r.effects.contains(&Effect::RejectCandidate));
    assert!(!r.effects.contains(&Effect::PromoteCandidate));
    assert_eq!(weights(&r.effects).last(), Some(&0));
    assert!(r.state.awaiting.is_none());
    // It waited its deadline at the last step, not less.
    let waited_from = r
        .effects
        .iter()
        .position(
            |e| matches!(e, Effect::Audit { event } if event.kind == AuditKind::AwaitingApproval),
        )
        .expect("it waited");
    assert!(waited_from > 0);
}

#[test]
fn a_held_approval_keeps_waiting_past_its_deadline_until_approved() {
    let (spec, mut traffic, mut r) = approval_run(
        quick_plan(),
        ApprovalPoint::Weight(50),
        Some(60),
        OnDeadline::Hold,
        5,
    );
    drive(&spec, &mut r, &mut traffic, 1500, |_, _| None);
    assert_eq!(
        r.state.phase,
        Phase::Canary {
            step: 1,
            weight_percent: 25
        }
    );
    let a = r.state.awaiting.clone().expect("awaiting");
    assert!(a.deadline_passed);
    // Two records: the wait, and the deadline passing (once).
    assert_eq!(
        audits(&r.effects)
            .iter()
            .filter(|k| **k == AuditKind::AwaitingApproval)
            .count(),
        2
    );
    let mut once = Some(approve());
    drive(&spec, &mut r, &mut traffic, 3000, |_, _| once.take());
    assert_eq!(r.state.phase, Phase::Promoted { manual: false });
}

#[test]
fn a_breach_while_waiting_for_approval_still_rolls_back() {
    let (spec, mut traffic, mut r) = approval_run(
        sequential_plan(rollgate_core::Advance::OnTime),
        ApprovalPoint::Weight(25),
        None,
        OnDeadline::RollBack,
        9,
    );
    drive(&spec, &mut r, &mut traffic, 900, |_, _| None);
    assert!(r.state.awaiting.is_some());
    traffic.candidate = failing(0.5);
    drive(&spec, &mut r, &mut traffic, 1200, |_, _| None);
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
    assert!(r.effects.contains(&Effect::RejectCandidate));
    assert!(r.state.awaiting.is_none());
}

#[test]
fn approving_needs_a_reason_and_something_to_approve() {
    let spec = spec(with_approval(
        quick_plan(),
        ApprovalPoint::Weight(25),
        None,
        OnDeadline::Hold,
    ));
    let state = RolloutState::new(Timestamp(0));
    let act = |state: &RolloutState, reason: &str| {
        step(
            &spec,
            state,
            Input::Operator {
                actor: "bob".into(),
                action: OperatorAction::Approve {
                    reason: reason.into(),
                },
            },
            Timestamp(1),
        )
    };
    assert_eq!(act(&state, "ok").err(), Some(StepError::NothingToApprove));
    assert_eq!(
        act(&state, "  ").err(),
        Some(StepError::ReasonRequired { action: "approve" })
    );
}

#[test]
fn approval_steps_are_checked_and_read_from_toml() {
    let plan: Plan = toml::from_str(
        r#"
steps = [5, 25, 50]
[[approvals]]
before = 50
deadline = "2h"
on_deadline = "hold"
[[approvals]]
before = "promotion"
"#,
    )
    .expect("a plan");
    assert_eq!(plan.validate(), Ok(()));
    assert_eq!(plan.approvals[0].before, ApprovalPoint::Weight(50));
    assert_eq!(plan.approvals[0].deadline, Some(Duration::from_secs(7200)));
    assert_eq!(plan.approvals[1].before, ApprovalPoint::PROMOTION);
    assert_eq!(plan.approvals[1].on_deadline, OnDeadline::RollBack);
    let mut bad = plan.clone();
    bad.approvals[0].before = ApprovalPoint::Weight(30);
    assert_eq!(
        bad.validate().expect_err("30 is no step").field,
        "approvals[0].before"
    );
    let mut dup = plan.clone();
    dup.approvals[1].before = ApprovalPoint::Weight(50);
    assert_eq!(
        dup.validate().expect_err("twice").field,
        "approvals[1].before"
    );
    assert!(toml::from_str::<Plan>("[[approvals]]\nbefore = \"later\"\n").is_err());
    // A plan without approvals serialises as before (stored plans unchanged).
    let json = serde_json::to_value(Plan::default()).expect("json");
    assert!(json.get("approvals").is_none());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// With an approval step before every canary weight and promotion, and
    /// nobody approving, whatever is observed the candidate never gets live
    /// traffic and is never promoted.
    #[test]
    fn without_approval_no_gated_step_is_ever_entered(obs in proptest::collection::vec((any::<bool>(), arb_snapshot()), 1..120), sequential in any::<bool>()) {
        let mut plan = if sequential { sequential_plan(rollgate_core::Advance::OnTime) } else { quick_plan() };
        for w in plan.steps.clone() {
            plan.approvals.push(ApprovalStep { before: ApprovalPoint::Weight(w), deadline: None, on_deadline: OnDeadline::Hold });
        }
        plan.approvals.push(ApprovalStep { before: ApprovalPoint::PROMOTION, deadline: None, on_deadline: OnDeadline::Hold });
        let spec = spec(plan);
        let mut state = RolloutState::new(Timestamp(0));
        let mut cumulative = Snapshot::default();
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
            let t = step(&spec, &state, Input::Observe(Observation { routing_applied: None, candidate_ready: ready, exposure: snapshot.map(Exposure::pooled) }), Timestamp(i as u64 * 5000)).expect("observe");
            for e in &t.effects {
                if let Effect::SetRouting { routing } = e {
                    prop_assert_eq!(routing.candidate_weight_bp, 0);
                }
                prop_assert!(*e != Effect::PromoteCandidate);
            }
            let gated = matches!(t.state.phase, Phase::Canary { .. } | Phase::Promoted { .. });
            prop_assert!(!gated, "entered {:?}", t.state.phase);
            state = t.state;
        }
    }
}

// --- dry runs (plan `mode = "observe"`) -------------------------------------

fn dry(mut plan: Plan) -> RolloutSpec {
    plan.mode = rollgate_core::Mode::Observe;
    spec(plan)
}

/// What a dry run must never do, whatever it decides: serve a user from
/// the candidate, or touch the registry; and every record says dry run.
fn assert_harmless(effects: &[Effect]) {
    for e in effects {
        match e {
            Effect::SetRouting { routing } => assert_eq!(routing.candidate_weight_bp, 0, "{e:?}"),
            Effect::PromoteCandidate | Effect::RejectCandidate => panic!("{e:?} in a dry run"),
            Effect::Audit { event } => assert!(event.dry_run, "{event:?}"),
        }
    }
}

fn mirrors(effects: &[Effect]) -> Vec<u32> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::SetRouting { routing } => Some(routing.mirror_bp),
            _ => None,
        })
        .collect()
}

#[test]
fn a_dry_run_walks_every_stage_on_mirrored_traffic_and_changes_nothing() {
    for plan in [
        quick_plan(),
        sequential_plan(rollgate_core::Advance::OnTime),
    ] {
        let spec = dry(plan);
        let mut traffic = Traffic::new(11, 400, HEALTHY, HEALTHY);
        let mut r = fresh();
        drive(&spec, &mut r, &mut traffic, 3000, |_, _| None);
        assert_eq!(r.state.phase, Phase::Promoted { manual: false });
        assert_harmless(&r.effects);
        // Shadow at its share, each canary step mirrored at its weight,
        // then everything back to the champion.
        assert_eq!(mirrors(&r.effects), vec![10_000, 500, 2500, 5000, 0]);
        assert!(audits(&r.effects).contains(&AuditKind::Promoted));
    }
}

#[test]
fn a_dry_run_of_a_broken_candidate_would_roll_back_and_rejects_nothing() {
    let spec = dry(sequential_plan(rollgate_core::Advance::OnTime));
    let mut traffic = Traffic::new(12, 400, HEALTHY, failing(0.5));
    let mut r = fresh();
    drive(&spec, &mut r, &mut traffic, 3000, |_, _| None);
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
    assert_harmless(&r.effects);
    assert_eq!(mirrors(&r.effects).last(), Some(&0));
}

#[test]
fn a_dry_run_cannot_be_promoted_by_hand_and_does_not_wait_for_approvals() {
    let plan = with_approval(
        quick_plan(),
        ApprovalPoint::Weight(25),
        None,
        OnDeadline::Hold,
    );
    let spec = dry(plan);
    let promote = step(
        &spec,
        &RolloutState::new(Timestamp(0)),
        Input::Operator {
            actor: "bob".into(),
            action: OperatorAction::Promote {
                reason: "ship it".into(),
            },
        },
        Timestamp(0),
    );
    assert_eq!(promote.err(), Some(StepError::DryRunCannotPromote));
    let mut traffic = Traffic::new(13, 400, HEALTHY, HEALTHY);
    let mut r = fresh();
    drive(&spec, &mut r, &mut traffic, 3000, |_, _| None);
    assert_eq!(r.state.phase, Phase::Promoted { manual: false });
    assert!(!audits(&r.effects).contains(&AuditKind::AwaitingApproval));
    assert_harmless(&r.effects);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Whatever is observed and whatever an operator does (but promote),
    /// a dry run never routes a user to the candidate, never touches the
    /// registry, and marks every record.
    #[test]
    fn a_dry_run_is_harmless_whatever_happens(obs in proptest::collection::vec((any::<bool>(), arb_snapshot(), 0u8..8), 1..120), sequential in any::<bool>()) {
        let plan = if sequential { sequential_plan(rollgate_core::Advance::OnTime) } else { quick_plan() };
        let spec = dry(plan);
        let mut state = RolloutState::new(Timestamp(0));
        let mut cumulative = Snapshot::default();
        for (i, (ready, snap, act)) in obs.into_iter().enumerate() {
            let now = Timestamp(i as u64 * 5000);
            let action = match act {
                0 => Some(OperatorAction::Pause),
                1 => Some(OperatorAction::Resume),
                2 => Some(OperatorAction::Abort { reason: "stop".into() }),
                3 => Some(OperatorAction::Approve { reason: "go".into() }),
                _ => None,
            };
            if let Some(action) = action
                && let Ok(t) = step(&spec, &state, Input::Operator { actor: "op".into(), action }, now)
            {
                assert_harmless(&t.effects);
                state = t.state;
            }
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
            let t = step(&spec, &state, Input::Observe(Observation { routing_applied: None, candidate_ready: ready, exposure: snapshot.map(Exposure::pooled) }), now).expect("observe");
            assert_harmless(&t.effects);
            if t.state.phase.is_terminal() && !state.phase.is_terminal() {
                let last = mirrors(&t.effects).last().copied();
                prop_assert_eq!(last, Some(0), "{:?}", t.effects);
            }
            state = t.state;
        }
    }
}

/// Drives a rollout whose routing an external data plane applies `lag_s`
/// seconds after it is decided (never, with `None`), confirming each
/// epoch as it does; checks at every look that nothing is judged while the
/// current routing is unconfirmed and that a stage's clock starts at its
/// confirmation.
fn run_external(spec: &RolloutSpec, traffic: &mut Traffic, lag_s: Option<u64>, max_s: u64) -> Run {
    let mut state = RolloutState::new(Timestamp(0));
    let mut effects = Vec::new();
    // Routings decided and not yet applied: (apply at, epoch, routing).
    let mut queued: Vec<(u64, u32, Routing)> = Vec::new();
    let mut applied = 0;
    let mut s = 0;
    while s < max_s && !state.phase.is_terminal() {
        s += 1;
        for (_, epoch, routing) in queued.iter().filter(|(at, _, _)| *at <= s) {
            traffic.routing = *routing;
            applied = *epoch;
        }
        queued.retain(|(at, _, _)| *at > s);
        traffic.tick();
        let obs = Observation {
            candidate_ready: true,
            exposure: Some(Exposure::pooled(traffic.snapshot.clone())),
            routing_applied: Some(applied),
        };
        let before = state.clone();
        let t = step(spec, &state, Input::Observe(obs), Timestamp(s * 1000))
            .expect("observe never errs");
        if before.epoch > 0 && applied < before.epoch && !t.state.phase.is_terminal() {
            assert_eq!(
                t.state.evaluations, before.evaluations,
                "judged at {s}s before its routing applied"
            );
        }
        if before.epoch > 0
            && before.confirmed_epoch < before.epoch
            && applied >= before.epoch
            && let Some(clock) = &t.state.stage
            && clock.epoch == before.epoch
        {
            assert_eq!(
                clock.started_at,
                Timestamp(s * 1000),
                "the clock starts when confirmed"
            );
            assert_eq!(t.state.epoch_began[&before.epoch], Timestamp(s * 1000));
        }
        for e in &t.effects {
            if let Effect::SetRouting { routing } = e {
                match lag_s {
                    // The rollback's routing: the adapter sends it before
                    // the commit, so it is in force at once.
                    _ if t.state.phase.is_terminal() => traffic.routing = *routing,
                    Some(lag) => queued.push((s + lag, routing.epoch, *routing)),
                    None => {}
                }
            }
        }
        effects.extend(t.effects);
        state = t.state;
    }
    Run {
        state,
        effects,
        seconds: s,
    }
}

#[test]
fn an_external_data_plane_starts_each_stage_when_it_confirms_the_routing() {
    let spec = spec(sequential_plan(rollgate_core::Advance::OnTime));
    let mut traffic = Traffic::new(3, 200, HEALTHY, HEALTHY);
    let direct = run(&spec, &mut traffic, 600);
    let mut traffic = Traffic::new(3, 200, HEALTHY, HEALTHY);
    let lagged = run_external(&spec, &mut traffic, Some(7), 600);
    assert!(
        matches!(direct.state.phase, Phase::Promoted { .. }),
        "{:?}",
        direct.state.phase
    );
    assert!(
        matches!(lagged.state.phase, Phase::Promoted { .. }),
        "{:?}",
        lagged.state.phase
    );
    // Every stage waited for its routing: at least 7 s more per stage.
    let stages = lagged.state.stage_starts.len() as u64;
    assert!(
        lagged.seconds >= direct.seconds + 7 * stages,
        "{}s with a 7 s lag, {}s without, {stages} stages",
        lagged.seconds,
        direct.seconds
    );
}

#[test]
fn a_routing_never_confirmed_rolls_back_at_the_deadline_without_rejecting() {
    let spec = spec(quick_plan());
    let mut traffic = Traffic::new(4, 100, HEALTHY, HEALTHY);
    let r = run_external(&spec, &mut traffic, None, 600);
    assert_eq!(
        r.state.phase,
        Phase::RolledBack {
            reason: RollbackReason::RoutingNotApplied { epoch: 1 }
        }
    );
    // At the stage's evidence timeout (60 s after it was entered at 1 s),
    // with nothing judged, and the candidate free to be rolled out again.
    assert_eq!(r.seconds, 61);
    assert_eq!(r.state.evaluations, 0);
    assert!(
        !r.effects
            .iter()
            .any(|e| matches!(e, Effect::RejectCandidate))
    );
    assert!(r.effects.contains(&Effect::SetRouting {
        routing: Routing::CHAMPION_ONLY
    }));
}
