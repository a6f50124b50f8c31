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
    q.label_window = Some(Duration::from_secs(120));
    plan
}

/// How long labels take.
#[derive(Clone, Copy)]
pub(crate) enum Delay {
    /// Exponential with this mean (seconds).
    Exponential(f64),
    /// Pareto with shape 1.2 and this minimum (seconds): a heavy tail.
    Pareto(f64),
}

/// Which answers get labels, and when: what real label processes do.
#[derive(Clone, Copy)]
pub(crate) enum Process {
    /// After `Delay`, for a share of the requests: of the champion's
    /// answers, of the candidate's (in SHADOW a request's label is both
    /// arms'). Whether and when do not depend on the answers.
    AtRandom(Delay, (f64, f64)),
    /// Every request labelled, `right_s` after an answer users saw right,
    /// `wrong_s` after one they saw wrong (a complaint takes longer than a
    /// confirmation, or the reverse).
    ByRightness { right_s: f64, wrong_s: f64 },
    /// Fraud: an answer users saw flagged ("fraud") is reviewed and
    /// labelled after `review_s`; a passed one ("ok") is labelled "fraud"
    /// at its chargeback, `chargeback_s` later, if it was fraud, and never
    /// otherwise (no chargeback: legitimate).
    Fraud { review_s: f64, chargeback_s: f64 },
    /// Only answers users saw right get labels (after `Delay`).
    OnlyRight(Delay),
}

/// One arm's mistakes: the share of frauds it passes, of legitimate
/// requests it flags.
#[derive(Clone, Copy)]
pub(crate) struct Mistakes {
    pub(crate) miss: f64,
    pub(crate) false_alarm: f64,
}

impl Mistakes {
    /// Wrong on `1 − accuracy` of each class.
    pub(crate) fn accuracy(a: f64) -> Self {
        Mistakes {
            miss: 1.0 - a,
            false_alarm: 1.0 - a,
        }
    }
}

pub(crate) struct Labelled {
    rng: StdRng,
    /// Mirrored requests a second.
    pub(crate) rate: u64,
    /// The mistakes of (champion, candidate), made independently.
    arms: (Mistakes, Mistakes),
    pub(crate) process: Process,
    /// Every recorded answer, with when its label comes (if it does).
    rows: Vec<(Recorded, Option<u64>)>,
    /// From this time (ms) on the store cannot give the labels.
    unreadable_from: u64,
}

impl Labelled {
    /// Arms right at `accuracy` on either class, labels after `delay` for
    /// a share `coverage` of requests, at random.
    pub(crate) fn new(seed: u64, accuracy: (f64, f64), delay: Delay, coverage: f64) -> Self {
        let arms = (
            Mistakes::accuracy(accuracy.0),
            Mistakes::accuracy(accuracy.1),
        );
        Self::with(seed, arms, Process::AtRandom(delay, (coverage, coverage)))
    }

    pub(crate) fn with(seed: u64, arms: (Mistakes, Mistakes), process: Process) -> Self {
        Labelled {
            rng: StdRng::seed_from_u64(seed),
            rate: 10,
            arms,
            process,
            rows: Vec::new(),
            unreadable_from: u64::MAX,
        }
    }

    fn delay_s(&mut self, d: Delay) -> f64 {
        let u: f64 = self.rng.random_range(1e-9..1.0);
        match d {
            Delay::Exponential(mean) => -mean * u.ln(),
            Delay::Pareto(min) => min * u.powf(-1.0 / 1.2),
        }
    }

    /// When the label of a request whose users saw `shown` (answered by
    /// the champion or not: `champions`), truly `fraud`, answered at
    /// `now_ms`, comes, if it does.
    fn comes(&mut self, now_ms: u64, shown: &str, fraud: bool, champions: bool) -> Option<u64> {
        let right = (shown == "fraud") == fraud;
        let secs = match self.process {
            Process::AtRandom(delay, (h, c)) => {
                let p = if champions { h } else { c };
                self.rng.random_bool(p).then(|| self.delay_s(delay))
            }
            Process::ByRightness { right_s, wrong_s } => {
                Some(if right { right_s } else { wrong_s })
            }
            Process::Fraud {
                review_s,
                chargeback_s,
            } => match (shown == "fraud", fraud) {
                (true, _) => Some(review_s),
                (false, true) => Some(chargeback_s),
                (false, false) => None,
            },
            Process::OnlyRight(delay) => right.then(|| self.delay_s(delay)),
        }?;
        Some(now_ms + (secs * 1000.0) as u64)
    }

    /// One arm's answer to a request that is `fraud` or not.
    fn answer(
        &mut self,
        (id, rev): (&str, &str),
        (epoch, unit): (u32, u16),
        fraud: bool,
        at_ms: u64,
    ) -> Recorded {
        let m = if rev == CA { self.arms.1 } else { self.arms.0 };
        let wrong = self
            .rng
            .random_bool(if fraud { m.miss } else { m.false_alarm });
        let class = if fraud != wrong { "fraud" } else { "ok" };
        Recorded {
            request_id: id.into(),
            revision: rev.into(),
            epoch,
            unit,
            class: Some(class.into()),
            value: None,
            label: Some(if fraud { "fraud" } else { "ok" }.into()),
            at_ms,
            labelled_at_ms: None,
        }
    }

    /// One second of mirrored requests, answered by both arms at `now_ms`;
    /// users saw the champion's answer (`promoted`: the candidate's, in
    /// the watch after promotion).
    fn tick(&mut self, now_ms: u64, epoch: u32, promoted: bool) {
        for i in 0..self.rate {
            let id = format!("{now_ms}-{i}");
            let unit = self.rng.random_range(0..64u16);
            let fraud = self.rng.random_bool(0.5);
            let h = self.answer((&id, CH), (epoch, unit), fraud, now_ms);
            let c = self.answer((&id, CA), (epoch, unit), fraud, now_ms);
            let shown = if promoted { &c } else { &h };
            let shown = shown.class.clone().unwrap_or_default();
            let comes = self.comes(now_ms, &shown, fraud, !promoted);
            self.rows.push((h, comes));
            self.rows.push((c, comes));
        }
    }

    /// One second of live requests split at `weight_bp` (each answered by
    /// one arm), at `now_ms`.
    fn tick_split(&mut self, now_ms: u64, epoch: u32, weight_bp: u32) {
        for i in 0..self.rate {
            let id = format!("{now_ms}-{i}");
            let unit = self.rng.random_range(0..64u16);
            let to_candidate = self.rng.random_range(0..10_000) < weight_bp;
            let rev = if to_candidate { CA } else { CH };
            let fraud = self.rng.random_bool(0.5);
            let row = self.answer((&id, rev), (epoch, unit), fraud, now_ms);
            let shown = row.class.clone().unwrap_or_default();
            let comes = self.comes(now_ms, &shown, fraud, !to_candidate);
            self.rows.push((row, comes));
        }
    }

    /// What the store holds at `now_ms`: every answer, with its label if
    /// it has come (and when).
    fn seen(&self, now_ms: u64) -> Vec<Recorded> {
        self.rows
            .iter()
            .map(|(r, comes)| {
                let came = comes.filter(|&t| t <= now_ms);
                Recorded {
                    label: came.and(r.label.clone()),
                    labelled_at_ms: came,
                    ..r.clone()
                }
            })
            .collect()
    }

    /// The candidate's answers matured by `now_ms` (answered at least
    /// `window_ms` before) that were labelled within their window.
    fn labelled_pairs(&self, now_ms: u64, window_ms: u64) -> usize {
        self.rows
            .iter()
            .filter(|(r, comes)| {
                r.revision == CA
                    && r.at_ms + window_ms <= now_ms
                    && comes.is_some_and(|t| t < r.at_ms + window_ms)
            })
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
            Phase::Shadow => labels.tick(now, state.epoch, false),
            Phase::Watching { .. } => labels.tick(now, state.epoch, true),
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
    let window = plan.gates.quality.label_window.unwrap_or_default();
    let pairs = labels.labelled_pairs(s * 1000, window.as_millis() as u64);
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

/// [`labelled_plan`] declaring labels sampled at random (for coverage
/// below 1).
fn at_random(mut plan: Plan) -> Plan {
    plan.gates.quality.unlabelled = rollgate_core::plan::Unlabelled::AtRandom;
    plan
}

#[test]
fn an_equally_accurate_candidate_passes_shadow_on_labels_whatever_their_delay() {
    for (seed, delay, coverage) in [
        (1, Delay::Exponential(5.0), 1.0),
        (2, Delay::Pareto(2.0), 1.0),
        (3, Delay::Exponential(20.0), 0.3),
        (4, Delay::Pareto(5.0), 0.3),
    ] {
        let plan = if coverage < 1.0 {
            at_random(labelled_plan())
        } else {
            labelled_plan()
        };
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
    let plan = at_random(labelled_plan());
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
    plan.gates.quality.label_window = Some(Duration::from_secs(60));
    plan.gates.quality.label_deadline = Duration::from_secs(800);
    let mut needed = Vec::new();
    for seed in 0..20u64 {
        let mut labels = Labelled::new(500 + seed, (0.85, 0.80), Delay::Exponential(10.0), 1.0);
        labels.rate = 20;
        let (phase, labelled) = run_shadow(&plan, &mut labels, 900);
        assert!(quality_breach(&phase), "seed {seed}: {phase:?}");
        needed.push(labelled);
    }
    needed.sort_unstable();
    // Errors independent between the arms (the hardest case: 29% of pairs
    // discordant, 59% of those against the candidate): about 2,000.
    assert!(
        needed[10] <= 2500,
        "median labelled pairs at the decision: {needed:?}"
    );
}

/// The chargeback pattern in SHADOW: every request labelled, those whose
/// users saw a wrong answer (the champion's) `wrong_s` late, the rest
/// `right_s`. Judged as they come, the first labelled pairs would be those
/// the champion got right, every discordant one "candidate wrong".
fn by_rightness(seed: u64, accuracy: (f64, f64), (right_s, wrong_s): (f64, f64)) -> Labelled {
    let arms = (
        Mistakes::accuracy(accuracy.0),
        Mistakes::accuracy(accuracy.1),
    );
    let mut l = Labelled::with(seed, arms, Process::ByRightness { right_s, wrong_s });
    l.rate = 20;
    l
}

#[test]
fn when_labels_come_by_rightness_an_equal_candidate_is_not_refused_in_shadow_and_a_worse_one_never_passes()
 {
    let mut plan = labelled_plan();
    plan.gates.quality.label_window = Some(Duration::from_secs(60));
    plan.gates.quality.margin = 0.04;
    for seed in 0..10u64 {
        // Wrong answers labelled 40 s late, right ones 3 s: equal accuracy.
        let mut equal = by_rightness(1_000 + seed, (0.85, 0.85), (3.0, 40.0));
        let (phase, labelled) = run_shadow(&plan, &mut equal, 900);
        assert!(
            matches!(phase, Phase::Canary { .. }),
            "seed {seed}: {phase:?} after {labelled} labelled pairs"
        );
        // The reverse delay (the champion's mistakes labelled first), a
        // candidate 5 points worse: refused, never passed.
        let mut worse = by_rightness(2_000 + seed, (0.85, 0.80), (40.0, 3.0));
        let (phase, labelled) = run_shadow(&plan, &mut worse, 900);
        assert!(
            quality_breach(&phase),
            "seed {seed}: {phase:?} after {labelled} labelled pairs"
        );
    }
}

#[test]
fn when_only_answers_users_saw_right_get_labels_an_equal_candidate_fails_safe_and_is_never_refused()
{
    let plan = labelled_plan();
    for seed in 0..5u64 {
        let arms = (Mistakes::accuracy(0.85), Mistakes::accuracy(0.85));
        let mut labels = Labelled::with(
            3_000 + seed,
            arms,
            Process::OnlyRight(Delay::Exponential(5.0)),
        );
        let (state, _, _) = drive(&plan, &mut labels, 700, Phase::is_terminal);
        match &state.phase {
            Phase::RolledBack {
                reason: RollbackReason::LabelTimeout { .. },
            } => {}
            other => panic!("seed {seed}: {other:?}"),
        }
        // SHADOW's words are its paired test's.
        let lines = quality_lines(&state);
        assert!(lines.contains("matured pairs labelled"), "{lines}");
    }
}

/// The last verdict's quality gate, in the words status and audit show.
fn quality_lines(state: &RolloutState) -> String {
    let verdict = state.last_verdict.as_ref().expect("a verdict");
    let quality = verdict.gates.iter().find(|g| g.gate == GateKind::Quality);
    rollgate_core::words::gate_lines(quality.expect("a quality gate")).join("\n")
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

/// The fraud label process in CANARY at 50%, equal accuracy (85%), the
/// champion's mistakes misses (labelled only at their chargeback), the
/// candidate's false alarms (reviewed at once).
fn fraud(seed: u64, candidate: Mistakes) -> Labelled {
    let champion = Mistakes {
        miss: 0.3,
        false_alarm: 0.0,
    };
    let process = Process::Fraud {
        review_s: 3.0,
        chargeback_s: 100.0,
    };
    let mut l = Labelled::with(seed, (champion, candidate), process);
    l.rate = 20;
    l
}

#[test]
fn in_canary_the_fraud_label_process_promotes_an_equal_candidate_with_absent_labels_declared_and_never_refuses_it()
 {
    let equal = Mistakes {
        miss: 0.0,
        false_alarm: 0.3,
    };
    let mut declared = canary_plan();
    declared.gates.quality.absent_label = Some("ok".into());
    for seed in 0..5u64 {
        let s = run_canary(&declared, &mut fraud(4_000 + seed, equal), 900);
        assert!(
            matches!(s.phase, Phase::Promoted { .. }),
            "seed {seed}: {:?}",
            s.phase
        );
        // Undeclared, the legitimate passed transactions never get a
        // label: the stage fails safe, never refuses.
        let s = run_canary(&canary_plan(), &mut fraud(5_000 + seed, equal), 900);
        match &s.phase {
            Phase::RolledBack {
                reason: RollbackReason::LabelTimeout { .. },
            } => {}
            other => panic!("seed {seed}: {other:?}"),
        }
        // Its words are the test that judged it: each arm's matured
        // answers and their coverage by the class answered, not pairs.
        let lines = quality_lines(&s);
        assert!(
            lines.contains("candidate ")
                && lines.contains("matured answers labelled")
                && lines.contains("labelled by the class answered")
                && !lines.contains("pairs"),
            "{lines}"
        );
    }
    // Five points worse (its false alarms at 40%): refused, with a margin
    // below the five points (passing it would be a false pass).
    let worse = Mistakes {
        miss: 0.0,
        false_alarm: 0.4,
    };
    declared.gates.quality.margin = 0.04;
    declared.gates.quality.label_deadline = Duration::from_secs(1500);
    for seed in 0..5u64 {
        let s = run_canary(&declared, &mut fraud(6_000 + seed, worse), 1600);
        assert!(quality_breach(&s.phase), "seed {seed}: {:?}", s.phase);
    }
}

#[test]
fn in_canary_labels_that_come_more_for_one_arm_never_refuse_an_equal_candidate() {
    // The candidate's answers labelled a third as often: under the default
    // worst case its unlabelled answers could be anything, so the stage
    // waits for labels and fails safe at its deadline.
    let plan = canary_plan();
    for seed in 0..5u64 {
        let arms = (Mistakes::accuracy(0.9), Mistakes::accuracy(0.9));
        let process = Process::AtRandom(Delay::Exponential(2.0), (0.9, 0.3));
        let mut skewed = Labelled::with(900 + seed, arms, process);
        let s = run_canary(&plan, &mut skewed, 900);
        match &s.phase {
            Phase::RolledBack {
                reason: RollbackReason::LabelTimeout { .. },
            } => {}
            other => panic!("seed {seed}: {other:?}"),
        }
        // Declared at random (per arm), the same labels judge it: promoted.
        let mut skewed = Labelled::with(900 + seed, arms, process);
        let s = run_canary(&at_random(canary_plan()), &mut skewed, 900);
        assert!(
            matches!(s.phase, Phase::Promoted { .. }),
            "seed {seed}: {:?}",
            s.phase
        );
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

/// A quality gate is judged only with a label window: a plan without one,
/// or whose window no stage or watch outlasts, or whose meaning of no
/// label cannot be a label, is refused naming the field.
#[test]
fn a_quality_gate_without_a_sound_label_window_is_refused_naming_the_field() {
    let field = |plan: &Plan| plan.validate().err().map(|e| e.field);
    let plan = labelled_plan();
    assert_eq!(field(&plan), None);
    let with = |edit: fn(&mut Plan)| {
        let mut p = labelled_plan();
        edit(&mut p);
        field(&p)
    };
    let window = Some("gates.quality.label_window".to_string());
    assert_eq!(with(|p| p.gates.quality.label_window = None), window);
    assert_eq!(
        with(|p| p.gates.quality.label_window = Some(Duration::from_micros(500))),
        window
    );
    assert_eq!(
        with(|p| p.gates.quality.label_deadline = Duration::from_secs(120)),
        Some("gates.quality.label_deadline".into())
    );
    assert_eq!(
        with(|p| {
            p.watch.window = Duration::from_secs(60);
            p.watch.mirror_percent = 100;
        }),
        Some("watch.window".into())
    );
    assert_eq!(
        with(|p| p.gates.quality.absent_label = Some(" ".into())),
        Some("gates.quality.absent_label".into())
    );
    assert_eq!(
        with(|p| {
            p.gates.quality.kind = rollgate_core::plan::QualityKind::Regression;
            p.gates.quality.absent_label = Some("legitimate".into());
        }),
        Some("gates.quality.absent_label".into())
    );
    // Labels slower than a stage: judged in a watch only.
    assert_eq!(
        with(|p| {
            p.gates.quality.in_stages = false;
            p.gates.quality.label_window = Some(Duration::from_secs(3600));
            p.watch.window = Duration::from_secs(7200);
            p.watch.mirror_percent = 100;
        }),
        None
    );
    // A class as the meaning of no label is one.
    let mut p = labelled_plan();
    p.gates.quality.absent_label = Some("0".into());
    assert_eq!(field(&p), None);
}

/// A label whose arrival time is unknown counts only without a window: it
/// might have come after the answer's window ended.
#[test]
fn a_label_of_unknown_arrival_counts_only_without_a_window() {
    use rollgate_core::labels::Maturity;
    let r = Recorded {
        request_id: "r".into(),
        revision: "c".into(),
        epoch: 1,
        unit: 0,
        class: Some("1".into()),
        value: None,
        label: Some("1".into()),
        at_ms: 0,
        labelled_at_ms: None,
    };
    let at = |window_ms| Maturity {
        now_ms: 10_000,
        window_ms,
        absent: None,
    };
    assert_eq!(at(0).label_of(&r, 0), Some("1"));
    assert_eq!(at(1_000).label_of(&r, 0), None);
}
