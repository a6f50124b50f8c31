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
fn labelled_plan() -> Plan {
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
enum Delay {
    /// Exponential with this mean (seconds).
    Exponential(f64),
    /// Pareto with shape 1.2 and this minimum (seconds): a heavy tail.
    Pareto(f64),
}

struct Labelled {
    rng: StdRng,
    /// Mirrored requests a second.
    rate: u64,
    /// Accuracy of (champion, candidate).
    accuracy: (f64, f64),
    delay: Delay,
    /// Share of requests ever labelled.
    coverage: f64,
    /// Every recorded answer, with when its label comes (if it does).
    rows: Vec<(Recorded, Option<u64>)>,
}

impl Labelled {
    fn new(seed: u64, accuracy: (f64, f64), delay: Delay, coverage: f64) -> Self {
        Labelled {
            rng: StdRng::seed_from_u64(seed),
            rate: 10,
            accuracy,
            delay,
            coverage,
            rows: Vec::new(),
        }
    }

    /// One second of mirrored requests, answered by both arms at `now_ms`.
    fn tick(&mut self, now_ms: u64) {
        for i in 0..self.rate {
            let id = format!("{now_ms}-{i}");
            let unit = self.rng.random_range(0..64u16);
            let comes = self.rng.random_bool(self.coverage).then(|| {
                let u: f64 = self.rng.random_range(1e-9..1.0);
                let secs = match self.delay {
                    Delay::Exponential(mean) => -mean * u.ln(),
                    Delay::Pareto(min) => min * u.powf(-1.0 / 1.2),
                };
                now_ms + (secs * 1000.0) as u64
            });
            for (rev, acc) in [(CH, self.accuracy.0), (CA, self.accuracy.1)] {
                let right = self.rng.random_bool(acc);
                let row = Recorded {
                    request_id: id.clone(),
                    revision: rev.into(),
                    epoch: 1,
                    unit,
                    class: Some(if right { "fraud" } else { "ok" }.into()),
                    value: None,
                    label: None,
                };
                self.rows.push((row, comes));
            }
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

/// The SHADOW stage run with labels, one look a second, until it leaves
/// SHADOW or `max_s`. Returns the phase and the labelled pairs then.
fn run_shadow(plan: &Plan, labels: &mut Labelled, max_s: u64) -> (Phase, usize) {
    let spec = spec(plan.clone());
    let mut traffic = Traffic::new(1, 20, HEALTHY, HEALTHY);
    let mut state = RolloutState::new(Timestamp(0));
    for s in 1..=max_s {
        let now = s * 1000;
        traffic.tick();
        if state.phase == Phase::Shadow {
            labels.tick(now);
        }
        let obs = Observation {
            routing_applied: None,
            candidate_ready: true,
            exposure: Some(Exposure::pooled(traffic.snapshot.clone())),
            labels: Some(labels.seen(now)),
        };
        let t = step(&spec, &state, Input::Observe(obs), Timestamp(now)).expect("observe");
        for e in &t.effects {
            if let rollgate_core::Effect::SetRouting { routing } = e {
                traffic.routing = *routing;
            }
        }
        state = t.state;
        if state.phase != Phase::Pending && state.phase != Phase::Shadow {
            return (state.phase, labels.labelled_pairs(now));
        }
    }
    (state.phase, labels.labelled_pairs(max_s * 1000))
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
    let spec = spec(plan.clone());
    let mut traffic = Traffic::new(1, 20, HEALTHY, HEALTHY);
    let mut state = RolloutState::new(Timestamp(0));
    let mut last = None;
    for s in 1..=700u64 {
        traffic.tick();
        labels.tick(s * 1000);
        let obs = Observation {
            routing_applied: None,
            candidate_ready: true,
            exposure: Some(Exposure::pooled(traffic.snapshot.clone())),
            labels: Some(labels.seen(s * 1000)),
        };
        let t = step(&spec, &state, Input::Observe(obs), Timestamp(s * 1000)).expect("observe");
        for e in &t.effects {
            if let rollgate_core::Effect::SetRouting { routing } = e {
                traffic.routing = *routing;
            }
        }
        if let Some(v) = &t.state.last_verdict {
            last = Some((s, v.stage, v.reason.clone()));
        }
        state = t.state;
        if state.phase.is_terminal() {
            break;
        }
    }
    match &state.phase {
        Phase::RolledBack {
            reason: RollbackReason::LabelTimeout { labelled, recorded },
        } => {
            assert_eq!(*labelled, 0);
            assert!(*recorded > 1000, "{recorded}");
        }
        other => panic!("{other:?}"),
    }
    let (s, stage, reason) = last.expect("judged");
    assert_eq!(stage, StageKind::Shadow);
    assert!(matches!(reason, StageReason::LabelTimeout { .. }));
    // Stage clock: from the first look in SHADOW (1 s), deadline 600 s.
    assert!((600..=602).contains(&s), "ended at {s} s");
}
