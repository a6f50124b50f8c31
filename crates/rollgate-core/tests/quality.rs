//! The quality gate through the state machine: mirrored requests whose
//! labels come later (exponential or heavy-tailed delays, part of them
//! never), each arm right or wrong at its own accuracy. Traffic and
//! helpers: `rollout.rs`.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rollgate_core::labels::Recorded;
use rollgate_core::{
    Advance, Exposure, GateKind, Input, Observation, Phase, Plan, RollbackReason, RolloutState,
    StageKind, StageReason, Timestamp, step,
};

use crate::rollout::*;

/// A sequential plan whose SHADOW stage is judged on labels alone (the
/// agreement gate off), with a quality gate.
pub(crate) fn labelled_plan() -> Plan {
    let mut plan = Plan {
        min_stage_duration: Duration::from_secs(10),
        evidence_timeout: Duration::from_secs(60),
        steps: vec![50],
        ..Plan::default()
    };
    plan.sequential.advance = Advance::OnTime;
    plan.gates.shadow.min_agreement = 0.0;
    plan.gates.shadow.max_flip_rate = 1.0;
    plan.gates.shadow.min_pairs = 1;
    let q = &mut plan.gates.quality;
    q.enabled = true;
    q.margin = 0.1;
    q.min_labels = 50;
    q.label_deadline = Duration::from_secs(600);
    plan
}

/// How labels come back.
#[derive(Clone, Copy)]
pub(crate) enum Delay {
    /// Exponential with this mean (seconds).
    Exponential(f64),
    /// Pareto with shape 1.2 and this minimum (seconds): a heavy tail.
    Pareto(f64),
}

pub(crate) struct Labelled {
    rng: StdRng,
    /// Mirrored requests a second.
    rate: u64,
    /// Accuracy of (champion, candidate).
    accuracy: (f64, f64),
    delay: Delay,
    /// Share of requests ever labelled: of the champion's answers, of the
    /// candidate's (in SHADOW a request's label is both arms').
    coverage: (f64, f64),
    /// Every recorded answer, with when its label comes (if it does).
    rows: Vec<(Recorded, Option<u64>)>,
    /// From this time (ms) on the store cannot give the labels.
    unreadable_from: u64,
}

impl Labelled {
    pub(crate) fn new(seed: u64, accuracy: (f64, f64), delay: Delay, coverage: f64) -> Self {
        Labelled {
            rng: StdRng::seed_from_u64(seed),
            rate: 10,
            accuracy,
            delay,
            coverage: (coverage, coverage),
            rows: Vec::new(),
            unreadable_from: u64::MAX,
        }
    }

    /// When a label for an answer at `now_ms` comes, if one does (at
    /// coverage `p`).
    fn comes(&mut self, now_ms: u64, p: f64) -> Option<u64> {
        self.rng.random_bool(p).then(|| {
            let u: f64 = self.rng.random_range(1e-9..1.0);
            let secs = match self.delay {
                Delay::Exponential(mean) => -mean * u.ln(),
                Delay::Pareto(min) => min * u.powf(-1.0 / 1.2),
            };
            now_ms + (secs * 1000.0) as u64
        })
    }

    fn answer(&mut self, id: &str, rev: &str, epoch: u32, unit: u16) -> Recorded {
        let acc = if rev == CA {
            self.accuracy.1
        } else {
            self.accuracy.0
        };
        let right = self.rng.random_bool(acc);
        Recorded {
            request_id: id.into(),
            revision: rev.into(),
            epoch,
            unit,
            class: Some(if right { "fraud" } else { "ok" }.into()),
            value: None,
            label: None,
        }
    }

    /// One second of mirrored requests, answered by both arms at `now_ms`.
    fn tick(&mut self, now_ms: u64, epoch: u32) {
        for i in 0..self.rate {
            let id = format!("{now_ms}-{i}");
            let unit = self.rng.random_range(0..64u16);
            let comes = self.comes(now_ms, self.coverage.0);
            for rev in [CH, CA] {
                let row = self.answer(&id, rev, epoch, unit);
                self.rows.push((row, comes));
            }
        }
    }

    /// One second of live requests split at `weight_bp` (each answered by
    /// one arm), at `now_ms`.
    fn tick_split(&mut self, now_ms: u64, epoch: u32, weight_bp: u32) {
        for i in 0..self.rate {
            let id = format!("{now_ms}-{i}");
            let unit = self.rng.random_range(0..64u16);
            let to_candidate = self.rng.random_range(0..10_000) < weight_bp;
            let (rev, p) = if to_candidate {
                (CA, self.coverage.1)
            } else {
                (CH, self.coverage.0)
            };
            let comes = self.comes(now_ms, p);
            let row = self.answer(&id, rev, epoch, unit);
            self.rows.push((row, comes));
        }
    }

    /// What the store holds at `now_ms`: every answer, labelled if its
    /// label has come.
    fn seen(&self, now_ms: u64) -> Vec<Recorded> {
        self.rows
            .iter()
            .map(|(r, comes)| Recorded {
                label: comes.filter(|&t| t <= now_ms).map(|_| "fraud".to_string()),
                ..r.clone()
            })
            .collect()
    }

    fn labelled_pairs(&self, now_ms: u64) -> usize {
        self.rows
            .iter()
            .filter(|(r, comes)| r.revision == CA && comes.is_some_and(|t| t <= now_ms))
            .count()
    }
}

/// A rollout run with labels, one look a second, until `done` says so or
/// `max_s`: mirrored requests in SHADOW, split ones in CANARY. Returns
/// the state, the second it stopped, and the last verdict's second.
pub(crate) fn drive(
    plan: &Plan,
    labels: &mut Labelled,
    max_s: u64,
    done: impl Fn(&Phase) -> bool,
) -> (RolloutState, u64, u64) {
    drive_with(plan, labels, max_s, done, |_, _, _| {})
}

/// [`drive`], with `seen` shown each look's state before it, its
/// transition, and its second.
pub(crate) fn drive_with(
    plan: &Plan,
    labels: &mut Labelled,
    max_s: u64,
    done: impl Fn(&Phase) -> bool,
    mut seen: impl FnMut(&RolloutState, &rollgate_core::Transition, u64),
) -> (RolloutState, u64, u64) {
    let spec = spec(plan.clone());
    let mut traffic = Traffic::new(1, 20, HEALTHY, HEALTHY);
    let mut state = RolloutState::new(Timestamp(0));
    let mut judged_at = 0;
    for s in 1..=max_s {
        let now = s * 1000;
        traffic.tick();
        match state.phase {
            // Mirrored: in SHADOW to the candidate, in the watch after
            // promotion to the previous champion; both arms answer.
            Phase::Shadow | Phase::Watching { .. } => labels.tick(now, state.epoch),
            Phase::Canary { .. } => {
                labels.tick_split(now, state.epoch, traffic.routing.candidate_weight_bp)
            }
            _ => {}
        }
        let obs = Observation {
            routing_applied: None,
            candidate_ready: true,
            exposure: Some(Exposure::pooled(traffic.snapshot.clone())),
            labels: (now < labels.unreadable_from).then(|| std::sync::Arc::new(labels.seen(now))),
        };
        let t = step(&spec, &state, Input::Observe(obs), Timestamp(now)).expect("observe");
        seen(&state, &t, s);
        for e in &t.effects {
            if let rollgate_core::Effect::SetRouting { routing } = e {
                traffic.routing = *routing;
            }
        }
        if t.state.last_verdict.is_some() {
            judged_at = s;
        }
        state = t.state;
        if done(&state.phase) {
            return (state, s, judged_at);
        }
    }
    (state, max_s, judged_at)
}

/// The SHADOW stage run with labels until it leaves SHADOW or `max_s`.
/// Returns the phase and the labelled pairs then.
fn run_shadow(plan: &Plan, labels: &mut Labelled, max_s: u64) -> (Phase, usize) {
    let left = |p: &Phase| *p != Phase::Pending && *p != Phase::Shadow;
    let (state, s, _) = drive(plan, labels, max_s, left);
    let pairs = labels.labelled_pairs(s * 1000);
    (state.phase, pairs)
}

fn quality_breach(phase: &Phase) -> bool {
    matches!(
        phase,
        Phase::RolledBack {
            reason: RollbackReason::AnytimeBreach { gates }
        } if gates.contains(&GateKind::Quality)
    )
}

#[test]
fn an_equally_accurate_candidate_passes_shadow_on_labels_whatever_their_delay() {
    let plan = labelled_plan();
    for (seed, delay, coverage) in [
        (1, Delay::Exponential(5.0), 1.0),
        (2, Delay::Pareto(2.0), 1.0),
        (3, Delay::Exponential(20.0), 0.3),
        (4, Delay::Pareto(5.0), 0.3),
    ] {
        let mut labels = Labelled::new(seed, (0.85, 0.85), delay, coverage);
        let (phase, labelled) = run_shadow(&plan, &mut labels, 900);
        assert!(
            matches!(phase, Phase::Canary { .. }),
            "seed {seed}: {phase:?} after {labelled} labelled pairs"
        );
    }
}

#[test]
fn an_equally_accurate_candidate_is_rarely_refused_on_labels() {
    // The quality test alone at its share of alpha; 200 rollouts of 300 s.
    let plan = labelled_plan();
    let refused = (0..200u64)
        .filter(|seed| {
            let mut labels = Labelled::new(100 + seed, (0.85, 0.85), Delay::Pareto(2.0), 0.5);
            let (phase, _) = run_shadow(&plan, &mut labels, 300);
            quality_breach(&phase)
        })
        .count();
    // alpha = 0.05 over the plan's five metrics: 1% each, 2 expected.
    assert!(refused <= 8, "{refused}/200 refused on labels");
}

#[test]
fn a_candidate_five_points_worse_is_refused_in_shadow_on_labels_alone() {
    // A margin below the five points: passing would be a false pass.
    let mut plan = labelled_plan();
    plan.gates.quality.margin = 0.04;
    let mut needed = Vec::new();
    for seed in 0..20u64 {
        let mut labels = Labelled::new(500 + seed, (0.85, 0.80), Delay::Exponential(10.0), 1.0);
        let (phase, labelled) = run_shadow(&plan, &mut labels, 900);
        assert!(quality_breach(&phase), "seed {seed}: {phase:?}");
        needed.push(labelled);
    }
    needed.sort_unstable();
    // Errors independent between the arms (the hardest case: 29% of pairs
    // discordant, 59% of those against the candidate): about 1,600.
    assert!(
        needed[10] <= 2000,
        "median labelled pairs at the decision: {needed:?}"
    );
}

#[test]
fn a_stage_without_labels_fails_at_the_label_deadline_not_at_the_evidence_timeout() {
    let plan = labelled_plan();
    let mut labels = Labelled::new(9, (0.85, 0.85), Delay::Exponential(1.0), 0.0);
    let (state, _, s) = drive(&plan, &mut labels, 700, Phase::is_terminal);
    match &state.phase {
        Phase::RolledBack {
            reason: RollbackReason::LabelTimeout { labelled, recorded },
        } => {
            assert_eq!(*labelled, 0);
            assert!(*recorded > 1000, "{recorded}");
        }
        other => panic!("{other:?}"),
    }
    let last = state.last_verdict.as_ref().expect("judged");
    assert_eq!(last.stage, StageKind::Shadow);
    assert!(matches!(last.reason, StageReason::LabelTimeout { .. }));
    // Stage clock: from the first look in SHADOW (1 s), deadline 600 s.
    assert!((600..=602).contains(&s), "ended at {s} s");
}

/// A plan without a shadow stage: quality is judged in CANARY only, on
/// each arm's labelled answers.
fn canary_plan() -> Plan {
    let mut plan = labelled_plan();
    plan.shadow.enabled = false;
    plan.steps = vec![50];
    plan
}

/// A CANARY-only rollout run with labels until it ends or `max_s`.
fn run_canary(plan: &Plan, labels: &mut Labelled, max_s: u64) -> RolloutState {
    drive(plan, labels, max_s, Phase::is_terminal).0
}

#[test]
fn in_canary_a_worse_candidate_is_refused_on_labels_and_an_equal_one_promoted() {
    let plan = canary_plan();
    for seed in 0..5u64 {
        let mut worse = Labelled::new(700 + seed, (0.9, 0.7), Delay::Exponential(5.0), 1.0);
        let s = run_canary(&plan, &mut worse, 900);
        assert!(quality_breach(&s.phase), "seed {seed}: {:?}", s.phase);
        let mut equal = Labelled::new(800 + seed, (0.9, 0.9), Delay::Pareto(2.0), 1.0);
        let s = run_canary(&plan, &mut equal, 900);
        assert!(
            matches!(s.phase, Phase::Promoted { .. }),
            "seed {seed}: {:?}",
            s.phase
        );
    }
}

#[test]
fn in_canary_labels_that_come_more_for_one_arm_hold_the_stage_and_never_refuse_it() {
    // The candidate's answers are labelled a third as often: the test's
    // assumption fails, so the stage holds and fails safe at its deadline.
    let plan = canary_plan();
    for seed in 0..5u64 {
        let mut skewed = Labelled::new(900 + seed, (0.9, 0.9), Delay::Exponential(2.0), 1.0);
        skewed.coverage = (0.9, 0.3);
        let s = run_canary(&plan, &mut skewed, 900);
        match &s.phase {
            Phase::RolledBack {
                reason: RollbackReason::LabelTimeout { .. },
            } => {}
            other => panic!("seed {seed}: {other:?}"),
        }
        let held = s.last_verdict.as_ref().is_some_and(|v| {
            v.gates
                .iter()
                .any(|g| matches!(g.reason, rollgate_core::Reason::LabelCoverageDiffers { .. }))
        });
        assert!(held, "seed {seed}: {:?}", s.last_verdict);
    }
}

#[test]
fn labels_that_cannot_be_read_hold_the_stage_past_its_deadline_and_never_time_it_out() {
    let plan = labelled_plan();
    // Too few labels for the deadline (600 s), and from 500 s on the store
    // cannot give them: the stage holds, never `label_timeout` on a read
    // that failed.
    let mut labels = Labelled::new(11, (0.85, 0.85), Delay::Exponential(1.0), 0.0);
    labels.unreadable_from = 500_000;
    let (state, s, _) = drive(&plan, &mut labels, 800, Phase::is_terminal);
    assert_eq!(state.phase, Phase::Shadow, "at {s} s");
    let v = state.last_verdict.as_ref().expect("judged");
    assert!(
        !matches!(v.reason, StageReason::LabelTimeout { .. }),
        "{v:?}"
    );
    // The control: the same labels, readable, time the stage out.
    labels.unreadable_from = u64::MAX;
    let (state, _, _) = drive(&plan, &mut labels, 700, Phase::is_terminal);
    assert!(matches!(
        state.phase,
        Phase::RolledBack {
            reason: RollbackReason::LabelTimeout { .. }
        }
    ));
}
