//! Delayed labels in the simulator: mirrored requests (SHADOW) or split
//! ones (CANARY) of a binary task, each arm answering with its own misses
//! and false alarms (the candidate copying the champion's answer on a
//! share `overlap` of requests, as a retrained model mostly does), and
//! labels coming by the cell's label process: rules on what users saw,
//! the truth, whether it was right and whose answer it was (a flagged
//! transaction reviewed in seconds, a passed one known at its chargeback,
//! a legitimate one never), with per-key accuracy and labelling. Judged by
//! rollgate's real state machine; the other gates see two identical,
//! healthy arms, so what decides is the quality gate. A plan with a watch
//! after promotion runs on through it (requests mirrored to the previous
//! champion) to its end.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rollgate_core::labels::Recorded;
use rollgate_core::plan::Unlabelled;
use rollgate_core::{
    Effect, Exposure, GateKind, Input, Observation, Outcome, Phase, Plan, RollbackReason,
    RolloutSpec, RolloutState, Snapshot, Timestamp, step,
};
use serde::{Deserialize, Serialize};

use crate::scenario::{CANDIDATE, CHAMPION, Expect};

/// The label cells of a run, read from their TOML file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabelMatrix {
    pub plan: Plan,
    pub cells: Vec<LabelCell>,
}

/// How long a label takes to come.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum LabelDelay {
    Exponential {
        mean_s: f64,
    },
    /// Pareto: `min_s` at least, tail index `shape` (1.2: heavy).
    Pareto {
        min_s: f64,
        shape: f64,
    },
    Fixed {
        s: f64,
    },
}

/// One arm's mistakes on the binary task: the share of positives ("1")
/// it answers "0", and of negatives it answers "1".
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mistakes {
    pub miss: f64,
    pub false_alarm: f64,
}

impl Mistakes {
    fn on(&self, positive: bool) -> f64 {
        if positive {
            self.miss
        } else {
            self.false_alarm
        }
    }
}

/// Whose answer users saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Arm {
    Champion,
    Candidate,
}

/// One rule of a label process: the requests it applies to (each field
/// unset matches all), how many of them get a label and after how long.
/// A request takes the first rule that matches; none: never labelled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabelRule {
    /// The class users saw ("0" or "1").
    #[serde(default)]
    pub shown: Option<String>,
    /// The truth ("0" or "1").
    #[serde(default)]
    pub truth: Option<String>,
    /// Whether what users saw was right.
    #[serde(default)]
    pub right: Option<bool>,
    /// Whose answer users saw.
    #[serde(default)]
    pub arm: Option<Arm>,
    /// The share of matching requests labelled.
    #[serde(default = "one")]
    pub p: f64,
    pub delay: LabelDelay,
}

fn one() -> f64 {
    1.0
}

/// A cell's own settings of the plan's quality gate.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QualityOverride {
    #[serde(default, with = "humantime_serde")]
    pub label_window: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub label_deadline: Option<Duration>,
    #[serde(default)]
    pub absent_label: Option<String>,
    #[serde(default)]
    pub unlabelled: Option<Unlabelled>,
    #[serde(default)]
    pub margin: Option<f64>,
}

/// One cell: the arms, the label process, and what a correct gate does.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabelCell {
    pub name: String,
    pub expect: Expect,
    /// Requests a second (mirrored in SHADOW, split in CANARY).
    pub rate: f64,
    /// The share of requests whose truth is "1".
    #[serde(default = "half")]
    pub positive_rate: f64,
    /// Accuracy of (champion, candidate), alike on both classes; or
    /// `mistakes`.
    #[serde(default)]
    pub accuracy: Option<(f64, f64)>,
    /// The mistakes of (champion, candidate).
    #[serde(default)]
    pub mistakes: Option<(Mistakes, Mistakes)>,
    /// Share of requests on which the candidate answers as the champion.
    #[serde(default)]
    pub overlap: f64,
    /// The label process.
    pub labels: Vec<LabelRule>,
    /// Per-key accuracy: each unit group's mistakes (both arms') times a
    /// lognormal factor of this σ (mean 1).
    #[serde(default)]
    pub key_spread: f64,
    /// Key-clustered labelling: each unit group's label shares times a
    /// lognormal factor of this σ (mean 1).
    #[serde(default)]
    pub key_labelling: f64,
    /// Whether the rollout starts in SHADOW (else at its first canary step).
    pub shadow: bool,
    /// Seconds simulated at most.
    pub window_s: u64,
    /// Seconds between looks.
    #[serde(default = "ten")]
    pub look_every_s: u64,
    #[serde(default)]
    pub quality: QualityOverride,
}

fn half() -> f64 {
    0.5
}

fn ten() -> u64 {
    10
}

impl LabelCell {
    /// The mistakes of (champion, candidate).
    pub fn arms(&self) -> (Mistakes, Mistakes) {
        if let Some(m) = self.mistakes {
            return m;
        }
        let (h, c) = self.accuracy.unwrap_or((0.85, 0.85));
        let m = |a: f64| Mistakes {
            miss: 1.0 - a,
            false_alarm: 1.0 - a,
        };
        (m(h), m(c))
    }

    /// The plan this cell runs: `plan` with its shadow stage and quality
    /// settings.
    pub fn plan(&self, plan: &Plan) -> Plan {
        let mut plan = plan.clone();
        plan.shadow.enabled = self.shadow;
        let q = &mut plan.gates.quality;
        let o = &self.quality;
        q.label_window = o.label_window.or(q.label_window);
        q.label_deadline = o.label_deadline.unwrap_or(q.label_deadline);
        q.absent_label = o.absent_label.clone().or(q.absent_label.take());
        q.unlabelled = o.unlabelled.unwrap_or(q.unlabelled);
        q.margin = o.margin.unwrap_or(q.margin);
        plan
    }

    /// The candidate's error rate given the class, where it does not copy
    /// the champion: what makes its own overall rate the cell's.
    fn own(&self, positive: bool) -> f64 {
        let (h, c) = self.arms();
        let (h, c) = (h.on(positive), c.on(positive));
        ((c - self.overlap * h) / (1.0 - self.overlap).max(1e-9)).clamp(0.0, 1.0)
    }

    /// The share of mirrored pairs exactly one arm gets wrong (for the
    /// planner's estimate), with per-key spread ignored.
    pub fn discordant(&self) -> f64 {
        let (h, _) = self.arms();
        let at = |positive: bool| {
            let mh = h.on(positive);
            let own = self.own(positive);
            let copy = self.overlap;
            // Champion wrong, candidate right; champion right, candidate wrong.
            mh * (1.0 - copy) * (1.0 - own) + (1.0 - mh) * (1.0 - copy) * own
        };
        self.positive_rate * at(true) + (1.0 - self.positive_rate) * at(false)
    }

    /// The share of matured requests judged by a label under `plan` (its
    /// window and meaning of none), estimated from 100,000 draws of the
    /// cell's label process as users in SHADOW see it: the planner's
    /// `coverage`.
    pub fn coverage(&self, plan: &Plan) -> f64 {
        let q = &plan.gates.quality;
        if q.absent_label.is_some() {
            return 1.0;
        }
        let window = q.label_window.map_or(u64::MAX, |w| w.as_millis() as u64);
        let mut rng = StdRng::seed_from_u64(7);
        let draws = 100_000;
        let judged = (0..draws)
            .filter(|_| {
                let positive = rng.random_bool(self.positive_rate.clamp(0.0, 1.0));
                let (h, _) = answers(&mut rng, self, positive, 1.0);
                let at = label_comes(&mut rng, self, (h, positive, Arm::Champion), (0, 1.0));
                at.is_some_and(|t| t < window)
            })
            .count();
        judged as f64 / draws as f64
    }

    /// The champion's error rate.
    pub fn champion_error(&self) -> f64 {
        let (h, _) = self.arms();
        self.positive_rate * h.miss + (1.0 - self.positive_rate) * h.false_alarm
    }
}

/// How one run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LabelOutcome {
    /// Rolled back by the quality gate's test (shown worse).
    Refused,
    /// Rolled back at the label deadline, short of labels.
    LabelTimeout,
    /// Rolled back for another reason.
    OtherRollback,
    /// The stage judged on labels passed on evidence (SHADOW cells stop
    /// there; CANARY cells at promotion; watch cells at its end).
    Passed,
    /// It passed without the quality gate passing: at its label deadline
    /// as "no regression shown" (`on_time`).
    PassedOnTime,
    /// Still undecided at the end of the window.
    Undecided,
}

/// One run's end, and the candidate's judged labelled answers then
/// (SHADOW: pairs).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LabelRun {
    pub outcome: LabelOutcome,
    pub labelled: u64,
    pub seconds: u64,
}

/// The answers recorded so far (shared with each look without a copy),
/// and when each one's label comes.
struct Answered {
    rows: std::sync::Arc<Vec<Recorded>>,
    /// Per row: its label, and when it comes (ms), if ever.
    comes: Vec<(String, Option<u64>)>,
    /// Rows from here on may still get a label.
    open_from: usize,
}

impl Answered {
    /// Labels that have come by `now` set on their rows.
    fn label(&mut self, now: u64) {
        let rows = std::sync::Arc::make_mut(&mut self.rows);
        let mut first_open = None;
        for (i, (r, (truth, comes))) in rows
            .iter_mut()
            .zip(&self.comes)
            .enumerate()
            .skip(self.open_from)
        {
            match comes {
                Some(t) if *t <= now && r.label.is_none() => {
                    r.label = Some(truth.clone());
                    r.labelled_at_ms = Some(*t);
                }
                Some(t) if *t <= now => {}
                Some(_) => {
                    first_open.get_or_insert(i);
                }
                None => {}
            }
        }
        self.open_from = first_open.unwrap_or(rows.len());
    }

    /// The candidate's answers judged by `now` under `plan`: matured, with
    /// a label within the window (or the declared meaning of none).
    fn judged(&self, plan: &Plan, now: u64) -> u64 {
        let q = &plan.gates.quality;
        let m = rollgate_core::labels::Maturity::of(q, now);
        self.rows
            .iter()
            .filter(|r| r.revision == CANDIDATE && m.matured(r.at_ms))
            .filter(|r| m.label_of(r, r.at_ms).is_some())
            .count() as u64
    }
}

fn delay_s(rng: &mut StdRng, d: LabelDelay) -> f64 {
    let u: f64 = rng.random_range(1e-12..1.0);
    match d {
        LabelDelay::Exponential { mean_s } => -mean_s * u.ln(),
        LabelDelay::Pareto { min_s, shape } => min_s * u.powf(-1.0 / shape),
        LabelDelay::Fixed { s } => s,
    }
}

/// A lognormal factor of mean 1 and shape `sigma`.
fn lognormal(rng: &mut StdRng, sigma: f64) -> f64 {
    if sigma <= 0.0 {
        return 1.0;
    }
    let z = rand_distr::Distribution::<f64>::sample(&rand_distr::StandardNormal, rng);
    (sigma * z - sigma * sigma / 2.0).exp()
}

/// Each unit group's factors: on the arms' mistakes, on label shares.
struct Keys {
    accuracy: Vec<f64>,
    labelling: Vec<f64>,
}

impl Keys {
    fn draw(rng: &mut StdRng, cell: &LabelCell) -> Self {
        Keys {
            accuracy: (0..64).map(|_| lognormal(rng, cell.key_spread)).collect(),
            labelling: (0..64)
                .map(|_| lognormal(rng, cell.key_labelling))
                .collect(),
        }
    }
}

/// Both arms' answers ("0"/"1") to one request whose truth is
/// `positive`, in unit group `unit`.
fn answers(rng: &mut StdRng, cell: &LabelCell, positive: bool, factor: f64) -> (bool, bool) {
    let (h, _) = cell.arms();
    let flip = |rng: &mut StdRng, p: f64| rng.random_bool((p * factor).clamp(0.0, 1.0));
    let h_wrong = flip(rng, h.on(positive));
    let h_says = positive != h_wrong;
    if rng.random_bool(cell.overlap.clamp(0.0, 1.0)) {
        return (h_says, h_says);
    }
    let c_wrong = flip(rng, cell.own(positive));
    (h_says, positive != c_wrong)
}

/// When the label of a request comes, if it does, by the first rule that
/// matches what users saw.
fn label_comes(
    rng: &mut StdRng,
    cell: &LabelCell,
    (shown, positive, arm): (bool, bool, Arm),
    (now_ms, factor): (u64, f64),
) -> Option<u64> {
    let class = |b: bool| if b { "1" } else { "0" };
    let rule = cell.labels.iter().find(|r| {
        r.shown.as_deref().is_none_or(|s| s == class(shown))
            && r.truth.as_deref().is_none_or(|t| t == class(positive))
            && r.right.is_none_or(|right| right == (shown == positive))
            && r.arm.is_none_or(|a| a == arm)
    })?;
    rng.random_bool((rule.p * factor).clamp(0.0, 1.0))
        .then(|| now_ms + (delay_s(rng, rule.delay) * 1000.0) as u64)
}

fn row(id: &str, revision: &str, (epoch, unit): (u32, u16), says: bool, at_ms: u64) -> Recorded {
    Recorded {
        request_id: id.to_string(),
        revision: revision.to_string(),
        epoch,
        unit,
        class: Some(if says { "1" } else { "0" }.to_string()),
        value: None,
        label: None,
        at_ms,
        labelled_at_ms: None,
    }
}

/// One second of requests at `now_s`, recorded as the gateways would,
/// into `snap` (identical healthy arms) and `answered`.
fn tick(
    (rng, keys): (&mut StdRng, &Keys),
    cell: &LabelCell,
    (state, weight_bp): (&RolloutState, u32),
    now_s: u64,
    (snap, answered): (&mut Snapshot, &mut Answered),
) {
    let n = rand_distr::Poisson::new(cell.rate.max(1e-9)).map_or(0, |p| {
        rand_distr::Distribution::<f64>::sample(&p, rng) as u64
    });
    // Mirrored: to the candidate in SHADOW, to the previous champion in
    // the watch after promotion; both arms answer.
    let shadow = matches!(state.phase, Phase::Shadow | Phase::Watching { .. });
    let watching = matches!(state.phase, Phase::Watching { .. });
    let now_ms = now_s * 1000;
    for i in 0..n {
        let id = format!("{now_s}-{i}");
        let unit = rng.random_range(0..64u16);
        let positive = rng.random_bool(cell.positive_rate.clamp(0.0, 1.0));
        let (h, c) = answers(rng, cell, positive, keys.accuracy[usize::from(unit)]);
        let to_candidate = !shadow && rng.random_range(0..10_000) < weight_bp;
        // What users saw: the champion's answer, but the candidate's when
        // it served them (CANARY) or was promoted (the watch).
        let (shown, arm) = if to_candidate || watching {
            (c, Arm::Candidate)
        } else {
            (h, Arm::Champion)
        };
        let factor = keys.labelling[usize::from(unit)];
        let comes = label_comes(rng, cell, (shown, positive, arm), (now_ms, factor));
        let truth = if positive { "1" } else { "0" };
        let mut arms = Vec::with_capacity(2);
        if shadow || !to_candidate {
            arms.push((CHAMPION, h));
        }
        if shadow || to_candidate {
            arms.push((CANDIDATE, c));
        }
        for (rev, says) in arms {
            snap.revision_mut(rev)
                .record_success(20_000, [if says { "1" } else { "0" }]);
            std::sync::Arc::make_mut(&mut answered.rows).push(row(
                &id,
                rev,
                (state.epoch, unit),
                says,
                now_ms,
            ));
            answered.comes.push((truth.to_string(), comes));
        }
        if state.phase == Phase::Shadow {
            snap.pairs_mut(CANDIDATE).record_pair(h == c, false);
        }
    }
}

/// How the run ended, if it did, after a look that moved the rollout to
/// `state` (`left_shadow`: this look left SHADOW).
fn ended(state: &RolloutState, left_shadow: bool, watch: bool) -> Option<LabelOutcome> {
    // Passed on evidence: the quality gate itself passed (the stage may
    // still have passed "on time" for another gate that proved nothing).
    let passed = || {
        let shown = state.last_verdict.as_ref().is_some_and(|v| {
            v.gates
                .iter()
                .any(|g| g.gate == GateKind::Quality && g.outcome == Outcome::Pass)
        });
        if shown {
            LabelOutcome::Passed
        } else {
            LabelOutcome::PassedOnTime
        }
    };
    match &state.phase {
        Phase::RolledBack {
            reason: RollbackReason::AnytimeBreach { gates },
        } if gates.contains(&GateKind::Quality) => Some(LabelOutcome::Refused),
        Phase::RolledBack {
            reason: RollbackReason::WatchRegression { .. },
        } => Some(LabelOutcome::Refused),
        Phase::RolledBack {
            reason: RollbackReason::LabelTimeout { .. },
        } => Some(LabelOutcome::LabelTimeout),
        Phase::RolledBack { .. } | Phase::Aborted => Some(LabelOutcome::OtherRollback),
        Phase::Promoted { .. } if watch => Some(LabelOutcome::Passed),
        Phase::Promoted { .. } => Some(passed()),
        Phase::Canary { .. } if left_shadow && !watch => Some(passed()),
        _ => None,
    }
}

/// One run of `cell` under `plan`, seeded.
pub fn simulate_labels(plan: &Plan, cell: &LabelCell, seed: u64) -> LabelRun {
    let plan = cell.plan(plan);
    // With a watch after promotion a run goes on to the watch's end.
    let watch = !plan.watch.is_off();
    let spec = RolloutSpec {
        model: "sim".into(),
        champion: CHAMPION.into(),
        candidate: CANDIDATE.into(),
        plan,
    };
    let mut rng = StdRng::seed_from_u64(seed);
    let keys = Keys::draw(&mut rng, cell);
    let mut state = RolloutState::new(Timestamp(0));
    let mut snap = Snapshot::default();
    let mut answered = Answered {
        rows: std::sync::Arc::new(Vec::new()),
        comes: Vec::new(),
        open_from: 0,
    };
    let mut weight_bp = 0;
    for s in 1..=cell.window_s {
        if matches!(
            state.phase,
            Phase::Shadow | Phase::Canary { .. } | Phase::Watching { .. }
        ) {
            let at = (&state, weight_bp);
            tick((&mut rng, &keys), cell, at, s, (&mut snap, &mut answered));
        }
        if s % cell.look_every_s.max(1) != 0 && state.phase != Phase::Pending {
            continue;
        }
        let now = s * 1000;
        answered.label(now);
        let obs = Observation {
            candidate_ready: true,
            exposure: Some(Exposure::pooled(snap.clone())),
            routing_applied: None,
            labels: Some(std::sync::Arc::clone(&answered.rows)),
        };
        let Ok(t) = step(&spec, &state, Input::Observe(obs), Timestamp(now)) else {
            break;
        };
        for e in &t.effects {
            if let Effect::SetRouting { routing } = e {
                weight_bp = routing.candidate_weight_bp;
            }
        }
        let left_shadow = state.phase == Phase::Shadow && t.state.phase != Phase::Shadow;
        state = t.state;
        if let Some(outcome) = ended(&state, left_shadow, watch) {
            return LabelRun {
                outcome,
                labelled: answered.judged(&spec.plan, now),
                seconds: s,
            };
        }
    }
    LabelRun {
        outcome: LabelOutcome::Undecided,
        labelled: answered.judged(&spec.plan, cell.window_s * 1000),
        seconds: cell.window_s,
    }
}

/// What a cell's runs came to.
#[derive(Debug, Clone, Serialize)]
pub struct LabelReport {
    pub cell: String,
    pub expect: Expect,
    pub runs: u64,
    pub refused: u64,
    pub label_timeout: u64,
    pub other_rollback: u64,
    pub passed: u64,
    pub passed_on_time: u64,
    pub undecided: u64,
    /// Median judged labelled answers (SHADOW: pairs) at a refusal.
    pub median_labelled_at_refusal: Option<u64>,
    /// Median judged labelled answers (SHADOW: pairs) at a pass on
    /// evidence.
    pub median_labelled_at_pass: Option<u64>,
    /// What the planner says a pass needs (SHADOW: matured labelled
    /// pairs; CANARY: each arm's labelled answers), for cells whose arms
    /// are equal.
    pub planned: Option<u64>,
}

/// `runs` seeded runs of `cell` on `threads` threads.
pub fn label_cell(plan: &Plan, cell: &LabelCell, runs: u64, threads: usize) -> LabelReport {
    let threads = threads.clamp(1, 64) as u64;
    let results: Vec<LabelRun> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                scope.spawn(move || {
                    (0..runs)
                        .filter(|seed| seed % threads == t)
                        .map(|seed| simulate_labels(plan, cell, seed))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_default())
            .collect()
    });
    let count = |o: LabelOutcome| results.iter().filter(|r| r.outcome == o).count() as u64;
    let median = |o: LabelOutcome| {
        let mut at: Vec<u64> = results
            .iter()
            .filter(|r| r.outcome == o)
            .map(|r| r.labelled)
            .collect();
        at.sort_unstable();
        at.get(at.len() / 2).copied()
    };
    let cell_plan = cell.plan(plan);
    let judged_in_stages = cell_plan.gates.quality.in_stages;
    let planned = (cell.expect == Expect::Promote && judged_in_stages).then(|| {
        let coverage = cell.coverage(&cell_plan);
        if cell.shadow {
            rollgate_core::sequential::pairs_to_pass(&cell_plan, cell.discordant(), coverage)
        } else {
            let error = cell.champion_error();
            rollgate_core::sequential::answers_to_pass(&cell_plan, error, coverage)
        }
    });
    LabelReport {
        cell: cell.name.clone(),
        expect: cell.expect,
        runs,
        refused: count(LabelOutcome::Refused),
        label_timeout: count(LabelOutcome::LabelTimeout),
        other_rollback: count(LabelOutcome::OtherRollback),
        passed: count(LabelOutcome::Passed),
        passed_on_time: count(LabelOutcome::PassedOnTime),
        undecided: count(LabelOutcome::Undecided),
        median_labelled_at_refusal: median(LabelOutcome::Refused),
        median_labelled_at_pass: median(LabelOutcome::Passed),
        planned: planned.flatten(),
    }
}

#[cfg(test)]
mod tests;
