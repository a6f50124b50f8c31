//! The rollout state machine's approval steps, dry runs and external data
//! planes. Traffic and helpers: `rollout.rs`.

use std::time::Duration;

use proptest::prelude::*;
use rollgate_core::{
    AuditKind, Effect, Exposure, FailureClass, Input, Observation, OperatorAction, Phase, Plan,
    RollbackReason, RolloutSpec, RolloutState, Routing, Snapshot, StepError, Timestamp, step,
};

use rollgate_core::plan::{ApprovalPoint, ApprovalStep, OnDeadline};

use crate::rollout::*;

// ---- Approval steps -------------------------------------------------------

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
            labels: None,
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
            let t = step(&spec, &state, Input::Observe(Observation { routing_applied: None, candidate_ready: ready, exposure: snapshot.map(Exposure::pooled), labels: None }), Timestamp(i as u64 * 5000)).expect("observe");
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
            Effect::PromoteCandidate | Effect::RejectCandidate | Effect::RestoreChampion => {
                panic!("{e:?} in a dry run")
            }
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
            let t = step(&spec, &state, Input::Observe(Observation { routing_applied: None, candidate_ready: ready, exposure: snapshot.map(Exposure::pooled), labels: None }), now).expect("observe");
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
            labels: None,
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
