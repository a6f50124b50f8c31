//! The watch after promotion through the state machine: labels slower than
//! the rollout (the stages do not wait for them), the promoted candidate
//! judged against the previous champion, mirrored, for the plan's window.
//! Traffic and labels: `quality.rs` and `rollout.rs`.

use std::time::Duration;

use proptest::prelude::*;
use rollgate_core::{
    Actor, AuditKind, Effect, GateKind, Input, OperatorAction, Phase, Plan, RollbackReason,
    RolloutState, Routing, StageKind, Timestamp, Transition, sequential, step,
};

use crate::quality::{Delay, Labelled, drive_with, labelled_plan};
use crate::rollout::spec;

/// Stages judged without labels (they come minutes later); a watch of
/// `window_s` after promotion, mirroring a quarter of the requests.
fn watched_plan(window_s: u64) -> Plan {
    let mut plan = labelled_plan();
    plan.gates.quality.in_stages = false;
    plan.watch.window = Duration::from_secs(window_s);
    plan.watch.mirror_percent = 25;
    // Labels judged once half the watch (at most 5 minutes) old.
    plan.gates.quality.label_window = Some(Duration::from_secs((window_s / 2).clamp(1, 300)));
    plan
}

/// A rollout with labels until it ends or `max_s`; every look that left
/// the watch, as (the state before, its transition, its second).
fn run(
    plan: &Plan,
    labels: &mut Labelled,
    max_s: u64,
) -> (RolloutState, Vec<(RolloutState, Transition, u64)>) {
    let mut left_watch = Vec::new();
    let (state, _, _) = drive_with(plan, labels, max_s, Phase::is_terminal, |before, t, s| {
        let watching = |p: &Phase| matches!(p, Phase::Watching { .. });
        if watching(&before.phase) != watching(&t.state.phase) {
            left_watch.push((before.clone(), t.clone(), s));
        }
    });
    (state, left_watch)
}

fn audited(t: &Transition) -> Vec<AuditKind> {
    t.effects
        .iter()
        .filter_map(|e| match e {
            Effect::Audit { event } => Some(event.kind),
            _ => None,
        })
        .collect()
}

#[test]
fn a_promoted_candidate_whose_late_labels_come_in_worse_is_rolled_back_by_the_watch() {
    let plan = watched_plan(1200);
    for seed in 0..3u64 {
        // Labels a minute and more behind; the candidate 15 points worse.
        let mut labels = Labelled::new(40 + seed, (0.85, 0.70), Delay::Exponential(90.0), 1.0);
        let (state, steps) = run(&plan, &mut labels, 1300);
        // Entered the watch at promotion, without any label yet judged.
        let (before, enter, s) = &steps[0];
        assert!(matches!(before.phase, Phase::Canary { .. }), "{before:?}");
        assert!(s < &60, "promoted at {s} s");
        assert_eq!(audited(enter).last(), Some(&AuditKind::Promoted));
        assert!(enter.effects.contains(&Effect::PromoteCandidate));
        let routing = enter.effects.iter().find_map(|e| match e {
            Effect::SetRouting { routing } => Some(*routing),
            _ => None,
        });
        let routing = routing.expect("the watch's routing");
        assert_eq!((routing.candidate_weight_bp, routing.mirror_bp), (0, 2500));
        // Left it rolled back, the previous champion restored and the
        // candidate rejected, routing back first.
        let (_, leave, s) = &steps[1];
        assert_eq!(
            state.phase,
            Phase::RolledBack {
                reason: RollbackReason::WatchRegression {
                    gates: vec![GateKind::Quality]
                }
            },
            "seed {seed}"
        );
        assert!(*s < 1200, "seed {seed}: rolled back at {s} s");
        let at = |want: &Effect| leave.effects.iter().position(|e| e == want);
        let routed = at(&Effect::SetRouting {
            routing: Routing::CHAMPION_ONLY,
        });
        let restored = at(&Effect::RestoreChampion).expect("restored");
        let rejected = at(&Effect::RejectCandidate).expect("rejected");
        assert!(routed.expect("routed") < restored && restored < rejected);
        let verdict = state.last_verdict.as_ref().expect("verdict");
        assert_eq!(verdict.stage, StageKind::Watch);
        assert_eq!(audited(leave).last(), Some(&AuditKind::RolledBack));
    }
}

#[test]
fn an_equally_accurate_candidate_stays_promoted_when_the_watch_ends() {
    let plan = watched_plan(600);
    for seed in 0..3u64 {
        let mut labels = Labelled::new(60 + seed, (0.85, 0.85), Delay::Pareto(20.0), 0.5);
        let (state, steps) = run(&plan, &mut labels, 800);
        assert_eq!(
            state.phase,
            Phase::Promoted { manual: false },
            "seed {seed}"
        );
        let (before, leave, s) = steps.last().expect("left the watch");
        let Phase::Watching { since, .. } = before.phase else {
            panic!("{before:?}")
        };
        // At the first look at or past the window's end, not before.
        assert_eq!(*s * 1000, since.0 + 600_000, "seed {seed}");
        assert_eq!(audited(leave).last(), Some(&AuditKind::WatchEnded));
        assert!(!leave.effects.contains(&Effect::RestoreChampion));
        assert!(leave.effects.contains(&Effect::SetRouting {
            routing: Routing::CHAMPION_ONLY
        }));
    }
}

/// A rollout of `plan` driven into its watch; the state there.
fn watching(plan: &Plan) -> RolloutState {
    let mut labels = Labelled::new(7, (0.85, 0.85), Delay::Exponential(90.0), 1.0);
    let into = |p: &Phase| matches!(p, Phase::Watching { .. }) || p.is_terminal();
    let (state, _, _) = drive_with(plan, &mut labels, 200, into, |_, _, _| {});
    assert!(matches!(state.phase, Phase::Watching { .. }), "{state:?}");
    state
}

fn operate(plan: &Plan, state: &RolloutState, action: OperatorAction) -> Transition {
    let at = Timestamp(state.created_at.0 + 100_000);
    step(
        &spec(plan.clone()),
        state,
        Input::Operator {
            actor: "ana".into(),
            action,
        },
        at,
    )
    .expect("taken")
}

#[test]
fn an_operator_aborts_a_watch_back_to_the_previous_champion_or_makes_the_promotion_final() {
    let plan = watched_plan(3600);
    let state = watching(&plan);
    let abort = OperatorAction::Abort {
        reason: "a bad week".into(),
    };
    let t = operate(&plan, &state, abort);
    assert_eq!(t.state.phase, Phase::Aborted);
    assert!(t.effects.contains(&Effect::RestoreChampion));
    // Nothing was shown against it: not rejected.
    assert!(!t.effects.contains(&Effect::RejectCandidate));
    assert_eq!(audited(&t), [AuditKind::Aborted]);

    let promote = OperatorAction::Promote {
        reason: "labels look fine".into(),
    };
    let t = operate(&plan, &state, promote);
    assert_eq!(t.state.phase, Phase::Promoted { manual: false });
    assert!(!t.effects.contains(&Effect::RestoreChampion));
    assert!(!t.effects.contains(&Effect::PromoteCandidate));
    assert_eq!(audited(&t), [AuditKind::WatchEnded]);
    let Effect::Audit { event } = t.effects.last().expect("audited") else {
        panic!("{:?}", t.effects)
    };
    assert_eq!(event.actor, Actor::Operator { name: "ana".into() });

    // A pause holds the window's end; so do labels that could not be read.
    let t = operate(&plan, &state, OperatorAction::Pause);
    let spec = spec(plan.clone());
    let late = Timestamp(state.created_at.0 + 10_000_000);
    let read = Input::Observe(rollgate_core::Observation {
        labels: Some(std::sync::Arc::new(Vec::new())),
        ..Default::default()
    });
    let held = step(&spec, &t.state, read.clone(), late).expect("observe");
    assert!(matches!(held.state.phase, Phase::Watching { .. }));
    let resumed = operate(&plan, &held.state, OperatorAction::Resume);
    let unread = Input::Observe(rollgate_core::Observation::default());
    let held = step(&spec, &resumed.state, unread, late).expect("observe");
    assert!(matches!(held.state.phase, Phase::Watching { .. }));
    let ended = step(&spec, &held.state, read, late).expect("observe");
    assert_eq!(ended.state.phase, Phase::Promoted { manual: false });
}

#[test]
fn a_regression_shown_while_paused_still_rolls_the_watch_back() {
    let plan = watched_plan(3600);
    let state = watching(&plan);
    let paused = operate(&plan, &state, OperatorAction::Pause).state;
    // 60 labelled pairs, the candidate alone wrong on every one.
    let rows: Vec<rollgate_core::labels::Recorded> = (0..60)
        .flat_map(|i| {
            [(crate::rollout::CH, "fraud"), (crate::rollout::CA, "ok")].map(|(rev, class)| {
                rollgate_core::labels::Recorded {
                    request_id: format!("r{i}"),
                    revision: rev.into(),
                    epoch: state.epoch,
                    unit: (i % 64) as u16,
                    class: Some(class.into()),
                    value: None,
                    label: Some("fraud".into()),
                    // Answered and labelled at the start: matured by the
                    // look, 400 s later (the window is 300 s).
                    at_ms: state.created_at.0,
                    labelled_at_ms: Some(state.created_at.0),
                }
            })
        })
        .collect();
    let obs = Input::Observe(rollgate_core::Observation {
        labels: Some(std::sync::Arc::new(rows)),
        ..Default::default()
    });
    let at = Timestamp(state.created_at.0 + 400_000);
    let t = step(&spec(plan.clone()), &paused, obs, at).expect("observe");
    assert!(
        matches!(
            t.state.phase,
            Phase::RolledBack {
                reason: RollbackReason::WatchRegression { .. }
            }
        ),
        "{:?}",
        t.state.phase
    );
    assert!(t.effects.contains(&Effect::RestoreChampion));
}

#[test]
fn a_watch_spends_no_more_alpha_than_the_shadow_test_it_continues() {
    let mut plan = labelled_plan();
    let without = sequential::metric_alpha(&plan);
    plan.watch.window = Duration::from_secs(3600);
    assert_eq!(sequential::metric_alpha(&plan), without);
    // Without a SHADOW stage the watch's paired test is one more.
    plan.shadow.enabled = false;
    let mut no_watch = plan.clone();
    no_watch.watch.window = Duration::ZERO;
    assert!(sequential::metric_alpha(&plan) < sequential::metric_alpha(&no_watch));
}

#[test]
fn a_plan_with_a_watch_is_checked() {
    let field = |plan: &Plan| plan.validate().err().map(|e| e.field);
    let mut plan = watched_plan(60);
    assert_eq!(field(&plan), None);
    plan.watch.mirror_percent = 0;
    assert_eq!(field(&plan).as_deref(), Some("watch.mirror_percent"));
    let mut plan = watched_plan(60);
    plan.gates.quality.enabled = false;
    assert_eq!(field(&plan).as_deref(), Some("watch.window"));
    let mut plan = watched_plan(60);
    plan.mode = rollgate_core::Mode::Observe;
    assert_eq!(field(&plan).as_deref(), Some("watch.window"));
    let mut plan = watched_plan(60);
    plan.watch.window = Duration::ZERO;
    assert_eq!(field(&plan).as_deref(), Some("gates.quality.in_stages"));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Whatever the candidate's accuracy and the labels' delay: a watch
    /// ends only as PROMOTED (at its window's end, nothing shown) or
    /// ROLLED_BACK by a regression shown (the previous champion restored,
    /// after routing went back); it never restores without leaving, and
    /// never leaves promoted before its window.
    #[test]
    fn a_watch_ends_only_at_its_window_or_on_a_regression_shown(
        seed in 0u64..1_000,
        candidate in 0.6f64..0.9,
        delay_s in 1.0f64..120.0,
        window_s in 60u64..400,
    ) {
        let plan = watched_plan(window_s);
        let mut labels = Labelled::new(seed, (0.85, candidate), Delay::Exponential(delay_s), 1.0);
        let (_, steps) = run(&plan, &mut labels, 500);
        for (before, t, s) in steps.iter().skip(1) {
            let Phase::Watching { since, .. } = before.phase else {
                prop_assert!(false, "{before:?}");
                unreachable!()
            };
            let restored = t.effects.contains(&Effect::RestoreChampion);
            match &t.state.phase {
                Phase::Promoted { .. } => {
                    prop_assert!(s * 1000 >= since.0 + window_s * 1000);
                    prop_assert!(!restored);
                }
                Phase::RolledBack { reason: RollbackReason::WatchRegression { .. } } => {
                    prop_assert!(restored);
                    let routed = t.effects.iter().position(|e| {
                        *e == Effect::SetRouting { routing: Routing::CHAMPION_ONLY }
                    });
                    let restore = t.effects.iter().position(|e| *e == Effect::RestoreChampion);
                    prop_assert!(routed < restore);
                    let verdict = t.state.last_verdict.as_ref().expect("verdict");
                    prop_assert_eq!(verdict.outcome, rollgate_core::Outcome::Fail);
                }
                other => prop_assert!(false, "left the watch for {other:?}"),
            }
        }
    }
}
