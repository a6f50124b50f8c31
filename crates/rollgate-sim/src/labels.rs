//! Delayed labels in the simulator: mirrored requests (SHADOW) or split
//! ones (CANARY), each arm right or wrong at its own accuracy (the
//! candidate copying the champion's rightness on a share `overlap` of
//! requests, as a retrained model mostly does), labels coming after a
//! delay (exponential or heavy-tailed) for a share of the requests (per
//! arm: a model's decision may change whether a label comes), judged by
//! rollgate's real state machine. The other gates see two identical,
//! healthy arms, so what decides is the quality gate. A plan with a watch
//! after promotion runs on through it (requests mirrored to the previous
//! champion) to its end.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rollgate_core::labels::Recorded;
use rollgate_core::{
    Effect, Exposure, GateKind, Input, Observation, Phase, Plan, RollbackReason, RolloutSpec,
    RolloutState, Snapshot, Timestamp, step,
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
}

/// One cell: the arms, the labels, and what a correct gate does.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabelCell {
    pub name: String,
    pub expect: Expect,
    /// Requests a second (mirrored in SHADOW, split in CANARY).
    pub rate: f64,
    /// Accuracy of (champion, candidate).
    pub accuracy: (f64, f64),
    /// Share of requests on which the candidate is right exactly when the
    /// champion is.
    #[serde(default)]
    pub overlap: f64,
    pub delay: LabelDelay,
    /// Share of (champion's, candidate's) answers ever labelled.
    pub coverage: (f64, f64),
    /// Whether the rollout starts in SHADOW (else at its first canary step).
    pub shadow: bool,
    /// Seconds simulated at most (the scenario's label window).
    pub window_s: u64,
    /// Seconds between looks.
    #[serde(default = "five")]
    pub look_every_s: u64,
}

fn five() -> u64 {
    5
}

/// How one run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LabelOutcome {
    /// Rolled back by the quality gate's test (shown worse).
    Refused,
    /// Rolled back at the label deadline, short of labels (or held by
    /// differing coverage).
    LabelTimeout,
    /// Rolled back for another reason.
    OtherRollback,
    /// The stage judged on labels passed (SHADOW cells stop there).
    Passed,
    /// Still undecided at the end of the window.
    Undecided,
}

/// One run's end, and the labelled requests then.
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
    /// Per row: when its label comes (ms), if ever.
    comes: Vec<Option<u64>>,
}

impl Answered {
    /// Labels that have come by `now` set on their rows.
    fn label(&mut self, now: u64) {
        let rows = std::sync::Arc::make_mut(&mut self.rows);
        for (r, c) in rows.iter_mut().zip(&self.comes) {
            if r.label.is_none() && c.is_some_and(|t| t <= now) {
                r.label = Some("1".to_string());
            }
        }
    }
}

fn delay_s(rng: &mut StdRng, d: LabelDelay) -> f64 {
    let u: f64 = rng.random_range(1e-12..1.0);
    match d {
        LabelDelay::Exponential { mean_s } => -mean_s * u.ln(),
        LabelDelay::Pareto { min_s, shape } => min_s * u.powf(-1.0 / shape),
    }
}

/// Whether each arm is right on one request: the champion at its
/// accuracy; the candidate as the champion on a share `overlap`, else at
/// the accuracy that makes its own overall accuracy the cell's.
fn rightness(rng: &mut StdRng, cell: &LabelCell) -> (bool, bool) {
    let (ah, ac) = cell.accuracy;
    let h = rng.random_bool(ah.clamp(0.0, 1.0));
    if rng.random_bool(cell.overlap.clamp(0.0, 1.0)) {
        return (h, h);
    }
    let rest = ((ac - cell.overlap * ah) / (1.0 - cell.overlap).max(1e-9)).clamp(0.0, 1.0);
    (h, rng.random_bool(rest))
}

fn row(id: &str, revision: &str, epoch: u32, unit: u16, right: bool) -> Recorded {
    Recorded {
        request_id: id.to_string(),
        revision: revision.to_string(),
        epoch,
        unit,
        class: Some(if right { "1" } else { "0" }.to_string()),
        value: None,
        label: None,
    }
}

/// One second of requests at `now_s`, recorded as the gateways would,
/// into `snap` (identical healthy arms) and `answered`.
fn tick(
    rng: &mut StdRng,
    cell: &LabelCell,
    (state, weight_bp): (&RolloutState, u32),
    now_s: u64,
    snap: &mut Snapshot,
    answered: &mut Answered,
) {
    let n = rand_distr::Poisson::new(cell.rate.max(1e-9)).map_or(0, |p| {
        rand_distr::Distribution::<f64>::sample(&p, rng) as u64
    });
    // Mirrored: to the candidate in SHADOW, to the previous champion in
    // the watch after promotion; both arms answer.
    let shadow = matches!(state.phase, Phase::Shadow | Phase::Watching { .. });
    for i in 0..n {
        let id = format!("{now_s}-{i}");
        let unit = rng.random_range(0..64u16);
        let (h, c) = rightness(rng, cell);
        let to_candidate = !shadow && rng.random_range(0..10_000) < weight_bp;
        let mut arms = Vec::with_capacity(2);
        if shadow || !to_candidate {
            arms.push((CHAMPION, h, cell.coverage.0));
        }
        if shadow || to_candidate {
            arms.push((CANDIDATE, c, cell.coverage.1));
        }
        // A request's label is one: in SHADOW it judges both answers.
        let p = arms.first().map_or(0.0, |a| a.2);
        let comes = rng
            .random_bool(p.clamp(0.0, 1.0))
            .then(|| (now_s as f64 * 1000.0 + delay_s(rng, cell.delay) * 1000.0) as u64);
        for (rev, right, _) in arms {
            snap.revision_mut(rev)
                .record_success(20_000, [if right { "1" } else { "0" }]);
            std::sync::Arc::make_mut(&mut answered.rows).push(row(
                &id,
                rev,
                state.epoch,
                unit,
                right,
            ));
            answered.comes.push(comes);
        }
        if state.phase == Phase::Shadow {
            snap.pairs_mut(CANDIDATE).record_pair(h == c, false);
        }
    }
}

/// One run of `cell` under `plan`, seeded.
pub fn simulate_labels(plan: &Plan, cell: &LabelCell, seed: u64) -> LabelRun {
    let mut plan = plan.clone();
    plan.shadow.enabled = cell.shadow;
    // With a watch after promotion a run goes on to the watch's end.
    let watch = !plan.watch.is_off();
    let spec = RolloutSpec {
        model: "sim".into(),
        champion: CHAMPION.into(),
        candidate: CANDIDATE.into(),
        plan,
    };
    let mut rng = StdRng::seed_from_u64(seed);
    let mut state = RolloutState::new(Timestamp(0));
    let mut snap = Snapshot::default();
    let mut answered = Answered {
        rows: std::sync::Arc::new(Vec::new()),
        comes: Vec::new(),
    };
    let mut weight_bp = 0;
    let labelled = |a: &Answered, now: u64| {
        a.rows
            .iter()
            .zip(&a.comes)
            .filter(|(r, c)| r.revision == CANDIDATE && c.is_some_and(|t| t <= now))
            .count() as u64
    };
    for s in 1..=cell.window_s {
        if matches!(
            state.phase,
            Phase::Shadow | Phase::Canary { .. } | Phase::Watching { .. }
        ) {
            tick(
                &mut rng,
                cell,
                (&state, weight_bp),
                s,
                &mut snap,
                &mut answered,
            );
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
        let outcome = match &state.phase {
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
            Phase::Promoted { .. } => Some(LabelOutcome::Passed),
            Phase::Canary { .. } if left_shadow && !watch => Some(LabelOutcome::Passed),
            _ => None,
        };
        if let Some(outcome) = outcome {
            return LabelRun {
                outcome,
                labelled: labelled(&answered, now),
                seconds: s,
            };
        }
    }
    LabelRun {
        outcome: LabelOutcome::Undecided,
        labelled: labelled(&answered, cell.window_s * 1000),
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
    pub undecided: u64,
    /// Median labelled requests (candidate's answers labelled) at a
    /// refusal.
    pub median_labelled_at_refusal: Option<u64>,
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
    let mut at: Vec<u64> = results
        .iter()
        .filter(|r| r.outcome == LabelOutcome::Refused)
        .map(|r| r.labelled)
        .collect();
    at.sort_unstable();
    LabelReport {
        cell: cell.name.clone(),
        expect: cell.expect,
        runs,
        refused: count(LabelOutcome::Refused),
        label_timeout: count(LabelOutcome::LabelTimeout),
        other_rollback: count(LabelOutcome::OtherRollback),
        passed: count(LabelOutcome::Passed),
        undecided: count(LabelOutcome::Undecided),
        median_labelled_at_refusal: at.get(at.len() / 2).copied(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(accuracy: (f64, f64)) -> LabelCell {
        LabelCell {
            name: "t".into(),
            expect: Expect::Stop,
            rate: 5.0,
            accuracy,
            overlap: 0.8,
            delay: LabelDelay::Exponential { mean_s: 30.0 },
            coverage: (1.0, 1.0),
            shadow: true,
            window_s: 1200,
            look_every_s: 5,
        }
    }

    fn plan() -> Plan {
        let mut plan = Plan::default();
        plan.gates.shadow.min_agreement = 0.0;
        plan.gates.shadow.max_flip_rate = 1.0;
        plan.gates.quality.enabled = true;
        plan
    }

    #[test]
    fn a_candidate_much_worse_on_labels_is_refused_and_the_draws_match_the_cell() {
        let r = simulate_labels(&plan(), &cell((0.85, 0.6)), 1);
        assert_eq!(r.outcome, LabelOutcome::Refused, "{r:?}");
        let mut rng = StdRng::seed_from_u64(3);
        let c = cell((0.85, 0.80));
        let (mut h, mut k) = (0, 0);
        for _ in 0..100_000 {
            let (a, b) = rightness(&mut rng, &c);
            h += u32::from(a);
            k += u32::from(b);
        }
        assert!((f64::from(h) / 1e5 - 0.85).abs() < 0.01);
        assert!((f64::from(k) / 1e5 - 0.80).abs() < 0.01);
    }

    #[test]
    fn with_a_watch_a_run_goes_on_past_promotion_and_the_watch_decides() {
        let mut plan = plan();
        plan.gates.quality.in_stages = false;
        plan.watch.window = std::time::Duration::from_secs(900);
        plan.min_stage_duration = std::time::Duration::from_secs(30);
        let long = |accuracy| LabelCell {
            window_s: 3000,
            ..cell(accuracy)
        };
        let r = simulate_labels(&plan, &long((0.85, 0.6)), 1);
        assert_eq!(r.outcome, LabelOutcome::Refused, "{r:?}");
        let r = simulate_labels(&plan, &long((0.85, 0.85)), 2);
        assert_eq!(r.outcome, LabelOutcome::Passed, "{r:?}");
        // At the watch's end, not when SHADOW passed.
        assert!(r.seconds >= 900, "{r:?}");
    }
}
