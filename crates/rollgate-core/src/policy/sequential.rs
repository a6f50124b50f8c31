//! The `sequential` policy: anytime-valid gates over the whole rollout.
//!
//! Every bound here stays valid however often it is looked at (Ville's
//! inequality), so the controller may evaluate after every snapshot and
//! across weight changes without spending `α` again: one test runs from the
//! first stage to the decision. `α` (`plan.sequential.alpha`) is split
//! evenly over the metrics that can fail anywhere in the rollout
//! ([`metric_alpha`], Bonferroni); promotion needs every gate to pass, which
//! needs no adjustment (intersection–union).
//!
//! - Errors: FAIL by the conditional-binomial e-process
//!   ([`ConditionalBinomial`]: null "candidate failure rate ≤
//!   `max_error_ratio` × champion's");
//!   PASS when the Robbins confidence sequences show `candidate − champion ≤
//!   margin`.
//! - Latency: Howard & Ramdas' confidence sequences for the median and the
//!   tail quantile of each arm (a beta-binomial mixture on the count below
//!   the quantile); the rule stays "median AND tail regressed" to fail.
//! - Shadow agreement and high-confidence flips: one-sided beta-binomial
//!   mixture tests against the budgets (disagreement ≤ `1 − min_agreement`,
//!   flips ≤ `max_flip_rate`): FAIL when a rate is shown above its budget,
//!   PASS when both are shown below; the Robbins intervals beside them are
//!   for reading.
//! - Prediction shift: one conditional multinomial e-process on the whole
//!   class distribution against "every class's rate ratio within
//!   `[1/max_class_ratio, max_class_ratio]`" ([`shift_tests`]).
//!
//! What each test is fed (see [`crate::exposure`]): the error e-process
//! adds each look's new counts epoch by epoch (every increment from one
//! routing epoch, the candidate's share taken from that increment's own
//! requests), and so does the prediction-shift e-process; every
//! two-sample comparison (latency, the error PASS) is made within one
//! epoch, never pooled across epochs, with the metric's `α` split over the plan's stages for the comparisons that
//! can fail; the champion's outage is judged on the last
//! `outage_window` of evidence.
//!
//! References: Robbins (1970); Lindon & Malek, NeurIPS 2022; Howard,
//! Ramdas, McAuliffe & Sekhon, Ann. Statist. 2021; Howard & Ramdas,
//! Bernoulli 2022.

use std::collections::BTreeMap;

mod budget;
mod errors;
mod quality;
mod state;

pub use budget::{metric_alpha, stage_alpha, stage_count};
use errors::{error_gate, error_tests};
use quality::stage_quality_gate;
pub use quality::{answers_to_pass, pairs_to_pass, watch_verdict};
use state::Counted;
pub use state::{ArmTally, MAX_CLASSES, SequentialState, Tally};

use super::look::{Judged, LookInput, Next, failed_safe};
use crate::anytime::{
    ConditionalBinomial, log_sum_exp, quantile_cs_ranks_tempered, rate_exceeds_tempered,
    robbins_cs, robbins_cs_tempered,
};
use crate::exposure::{Epoch, Ledger};
use crate::gate::{
    Arms, GateKind, GateVerdict, Outcome, QuantileComparison, Reason, ShadowShown, ShiftJudgement,
    guard_rail_verdict, judge_quantile, latency_verdict, sample_floor, shadow_verdict,
    shift_verdict,
};
use crate::histogram::LatencyHistogram;
use crate::plan::{Assignment, Plan};
use crate::safety::{StageFloors, champion_health_of, judge, stats_unavailable};
use crate::snapshot::{RevisionStats, Snapshot};
use crate::stage::{ChampionHealth, RollbackReason, StageKind, StageReason, StageVerdict};
use crate::stats::Interval;
use crate::unit::{MIN_UNITS, count_design_effect, latency_design_effect};

/// Restarts beyond this many are not taken (their weight is left unused,
/// which only makes the test more conservative).
pub const MAX_RESTARTS: usize = 16;

/// Observations around which the mixture boundaries are tightest: rollouts
/// are decided on tens to hundreds of requests or pairs per arm.
const DESIGN_SAMPLES: f64 = 100.0;

/// One quantile of both arms with anytime-valid bounds, each arm's at
/// level `alpha`, each arm's sequence widened by its design effect.
fn compare(
    q: f64,
    c: (&LatencyHistogram, f64),
    h: (&LatencyHistogram, f64),
    alpha: f64,
    ratio: f64,
    ms: f64,
) -> Option<QuantileComparison> {
    let bounds = |(x, d): (&LatencyHistogram, f64)| {
        x.quantile_rank_bounds(
            q,
            quantile_cs_ranks_tempered(q, x.len(), d, alpha, DESIGN_SAMPLES),
        )
    };
    Some(judge_quantile(q, bounds(c)?, bounds(h)?, ratio, ms))
}

/// Latency: fails iff the median AND the tail regressed. A false failure
/// needs one of the two comparisons to be wrong where the truth did not
/// regress; each comparison is wrong only if one of its two arms' sequences
/// misses, so each arm's sequence runs at `alpha / 2`.
fn latency_gate(plan: &Plan, alpha: f64, arms: Arms) -> GateVerdict {
    let cfg = &plan.gates.latency;
    let (c, h) = (arms.candidate, arms.champion);
    let c = (c.latency(), latency_design_effect(c.units()));
    let h = (h.latency(), latency_design_effect(h.units()));
    let a = alpha / 2.0;
    let median = compare(0.5, c, h, a, cfg.median_ratio, cfg.median_ms);
    let tail = compare(cfg.tail_quantile, c, h, a, cfg.tail_ratio, cfg.tail_ms);
    latency_verdict(cfg, arms, median, tail, true)
}

/// Whether `k` of `n` show the rate above `p0` at level `alpha`, with the
/// design effect `d` of the rate's unit.
fn shown_above(k: u64, n: u64, d: f64, p0: f64, alpha: f64) -> bool {
    rate_exceeds_tempered(k, n, d, p0, alpha, DESIGN_SAMPLES)
}

/// Shadow agreement and high-confidence flips, two metrics each at
/// `alpha`: FAIL when disagreement or flips are shown above budget, PASS
/// when both are shown within it (one-sided beta-binomial mixtures).
fn shadow_gate(
    plan: &Plan,
    alpha: f64,
    window: &Snapshot,
    candidate: &str,
    arms: Arms,
) -> GateVerdict {
    let cfg = &plan.gates.shadow;
    let p = window.pairs_for(candidate).copied().unwrap_or_default();
    let (disagreements, confident) = (p.pairs() - p.agreements(), p.champion_confident());
    // Shown for reading; the decisions are the one-sided tests.
    // The mirrored request is the unit: a batch's pairs are correlated.
    let (dd, df) = (p.disagreement_design_effect(), p.flip_design_effect());
    let agreement = robbins_cs_tempered(p.agreements(), p.pairs(), dd, alpha);
    let flip_rate = robbins_cs_tempered(p.confident_flips(), confident, df, alpha);
    let flips_off = cfg.max_flip_rate >= 1.0;
    let agreement_below = shown_above(disagreements, p.pairs(), dd, 1.0 - cfg.min_agreement, alpha);
    let flips_above = shown_above(p.confident_flips(), confident, df, cfg.max_flip_rate, alpha);
    let agreement_above = shown_above(p.agreements(), p.pairs(), dd, cfg.min_agreement, alpha);
    let flips_below = flips_off
        || shown_above(
            confident - p.confident_flips(),
            confident,
            df,
            1.0 - cfg.max_flip_rate,
            alpha,
        );
    let within = agreement_above && flips_below;
    shadow_verdict(
        cfg,
        arms,
        &p,
        (agreement, flip_rate),
        (agreement_below || flips_above, within),
        true,
        Some(ShadowShown {
            agreement_below,
            flips_above,
            agreement_above,
            flips_below,
            within,
        }),
    )
}

/// The prediction-shift tests' results at one look.
#[derive(Debug, Clone, Copy)]
struct ShiftTests {
    /// `ln` e-value against "every class's rate ratio, candidate over
    /// champion, is within `[1/ρ, ρ]`".
    fail: f64,
    /// Every cell was shown within the band, or rarer than
    /// `min_class_share` in both arms.
    within: bool,
}

/// One cell's four conditional-binomial e-processes: against "ratio ≤ ρ"
/// and "ratio ≥ 1/ρ" (to fail), and against "ratio ≥ ρ" and "ratio ≤ 1/ρ"
/// (to pass); and its counts `(k_c, n_c, k_h, n_h)`, for the rare clause.
struct Cell {
    above: ConditionalBinomial,
    below: ConditionalBinomial,
    not_above: ConditionalBinomial,
    not_below: ConditionalBinomial,
    counts: (u64, u64, u64, u64),
}

impl Cell {
    fn new(rho: f64) -> Self {
        Cell {
            above: ConditionalBinomial::new(rho),
            below: ConditionalBinomial::below(1.0 / rho),
            not_above: ConditionalBinomial::below(rho),
            not_below: ConditionalBinomial::new(1.0 / rho),
            counts: (0, 0, 0, 0),
        }
    }

    fn update(&mut self, (kh, nh): (u64, u64), (kc, nc): (u64, u64), share: f64) {
        for cb in [
            &mut self.above,
            &mut self.below,
            &mut self.not_above,
            &mut self.not_below,
        ] {
            cb.update(kh, kc, share);
        }
        let (a, b, c, d) = self.counts;
        self.counts = (a + kc, b + nc, c + kh, d + nh);
    }
}

/// Prediction shift, one test on the whole class distribution over the
/// canary epochs (Lindon & Malek's conditional multinomial e-process):
/// given that a prediction is of class `k`, it came from the candidate
/// with probability `θ = ρ_k·w / (ρ_k·w + 1 − w)`, where `w` is the
/// candidate's share of the epoch's predictions and `ρ_k` its class rate
/// over the champion's. Under the null "`ρ_k` in `[1/ρ, ρ]` for every
/// class" that probability is pinned between two known values, with no
/// nuisance left (the class mix cancels, as the load does for errors).
///
/// Each epoch's classes are the cells named before it began (the rest are
/// one "other" cell, whose ratio is within the band whenever every member's
/// is); each cell gets two one-sided grid mixtures, averaged, and the
/// cells' e-values multiply (given the class, each factor has expectation
/// at most 1 under the null, whatever the class mix). Passing needs every
/// cell shown inside the band (two one-sided tests, each at `alpha / 2`),
/// or shown rarer than `min_class_share` in both arms (Robbins, `alpha / 2`
/// each).
fn shift_tests(
    plan: &Plan,
    state: &SequentialState,
    ledger: &Ledger,
    ids: (&str, &str),
    canary_from: Option<Epoch>,
    alpha: f64,
) -> ShiftTests {
    let cfg = &plan.gates.prediction_shift;
    let (champion, candidate) = ids;
    let mut cells: BTreeMap<Option<&str>, Cell> = BTreeMap::new();
    let total = |s: &RevisionStats| s.predictions().values().sum::<u64>();
    for e in ledger.epochs() {
        if canary_from.is_none_or(|from| e < from) {
            continue;
        }
        let snap = ledger.epoch(e);
        let (c, h) = (snap.revision(candidate), snap.revision(champion));
        let (nc, nh) = (total(c), total(h));
        if nc + nh == 0 {
            continue;
        }
        let share = nc as f64 / (nc + nh) as f64;
        let (mut rest_c, mut rest_h) = (nc, nh);
        for class in state.cells_of(e) {
            let kc = c.predictions().get(class).copied().unwrap_or(0);
            let kh = h.predictions().get(class).copied().unwrap_or(0);
            rest_c -= kc.min(rest_c);
            rest_h -= kh.min(rest_h);
            cells
                .entry(Some(class.as_str()))
                .or_insert_with(|| Cell::new(cfg.max_class_ratio))
                .update((kh, nh), (kc, nc), share);
        }
        cells
            .entry(None)
            .or_insert_with(|| Cell::new(cfg.max_class_ratio))
            .update((rest_h, nh), (rest_c, nc), share);
    }
    // Cell `j` (other first, then the classes in naming order) deviates
    // with prior weight `1/(j+1)`; otherwise its factor is 1. So cells that
    // match the null cost little (`ln(1 + 1/j)` each) instead of voting
    // against a cell that shows a shift.
    let fail = std::iter::once(cells.get(&None))
        .chain(state.classes.iter().map(|c| cells.get(&Some(c.as_str()))))
        .flatten()
        .enumerate()
        .map(|(i, c)| {
            let w = 1.0 / (i as f64 + 2.0);
            let (a, b) = (c.above.log_e_value(), c.below.log_e_value());
            let deviates = log_sum_exp(&[a, b]) - std::f64::consts::LN_2;
            log_sum_exp(&[(1.0 - w).ln(), w.ln() + deviates])
        })
        .sum();
    let shown = (2.0 / alpha).ln();
    let rare = |k: u64, n: u64| n > 0 && robbins_cs(k, n, alpha / 2.0).upper < cfg.min_class_share;
    let within = !cells.is_empty()
        && cells.values().all(|c| {
            let (kc, nc, kh, nh) = c.counts;
            (c.not_above.log_e_value() >= shown && c.not_below.log_e_value() >= shown)
                || (rare(kc, nc) && rare(kh, nh))
        });
    ShiftTests { fail, within }
}

/// The prediction-shift verdict: the class-distribution test decides; the
/// stage's per-class Robbins sequences (at `alpha`) are shown for reading.
fn shift_gate(plan: &Plan, alpha: f64, tests: ShiftTests, stage: Arms) -> GateVerdict {
    let cfg = &plan.gates.prediction_shift;
    let bound = |kc, nc, kh, nh, _| {
        let (ic, ih) = (robbins_cs(kc, nc, alpha), robbins_cs(kh, nh, alpha));
        Interval {
            lower: ic.lower - ih.upper,
            upper: ic.upper - ih.lower,
        }
    };
    let judgement = ShiftJudgement {
        breached: tests.fail >= (1.0 / alpha).ln(),
        within: tests.within,
        // Finite: a stored verdict must read back (JSON has no infinity).
        e_value: tests.fail.exp().min(f64::MAX),
        max_class_ratio: cfg.max_class_ratio,
        fail_at: 1.0 / alpha,
    };
    shift_verdict(cfg, stage, bound, Some(judgement), true)
}

/// The sample floor of `gate` over the current stage's own traffic.
fn stage_floor(plan: &Plan, gate: GateKind, w: &Tally) -> Option<Reason> {
    let g = &plan.gates;
    let (c, h) = (&w.candidate, &w.champion);
    match gate {
        GateKind::ErrorRate | GateKind::GuardRails => {
            sample_floor(c.requests, h.requests, g.error_rate.min_requests)
        }
        GateKind::Latency => sample_floor(c.latencies, h.latencies, g.latency.min_requests),
        GateKind::ShadowAgreement => {
            (w.pairs < g.shadow.min_pairs).then_some(Reason::InsufficientSamples {
                have: w.pairs,
                need: g.shadow.min_pairs,
            })
        }
        GateKind::PredictionShift => sample_floor(
            c.predictions,
            h.predictions,
            g.prediction_shift.min_predictions,
        ),
        // Its floor is its own: labelled pairs, not this stage's requests.
        GateKind::Quality => None,
    }
}

/// Guard rails: absolute limits on the candidate over its whole exposure
/// (no comparison, so pooling across epochs is sound), with anytime-valid
/// bounds at the metric's `α`.
fn guard_gate(plan: &Plan, alpha: f64, pooled: Arms) -> Option<GateVerdict> {
    let c = pooled.candidate;
    let d = count_design_effect(c.units(), Counted::Failures.in_unit());
    let error_rate = robbins_cs_tempered(c.failure_count(), c.requests(), d, alpha);
    let p95 = c.latency().quantile_rank_bounds(
        0.95,
        quantile_cs_ranks_tempered(
            0.95,
            c.latency().len(),
            latency_design_effect(c.units()),
            alpha,
            DESIGN_SAMPLES,
        ),
    );
    guard_rail_verdict(
        &plan.gates.guard_rails,
        plan.gates.error_rate.min_requests,
        pooled,
        error_rate,
        p95,
    )
}

/// A two-sample gate judged within each stage (one split): the first
/// stage whose comparison fails (only stages with new counts can newly
/// fail), else the current stage's verdict. `stages` are `(stage number
/// from 1, its evidence)`, the current one last.
fn within_stages(
    stages: &[(usize, Snapshot)],
    judge: impl Fn(usize, &Snapshot) -> Option<GateVerdict>,
) -> Option<GateVerdict> {
    let mut last = None;
    for (i, snap) in stages {
        let v = judge(*i, snap);
        if v.as_ref().is_some_and(|v| v.outcome == Outcome::Fail) {
            return v;
        }
        last = v;
    }
    last
}

/// One look: the verdict, and what it means for the rollout. A failing
/// gate rolls back at once (its error is bounded over the whole rollout, so
/// no confirmation is needed); a pause holds everything but a breach.
pub fn look(plan: &Plan, state: &mut SequentialState, input: &LookInput) -> Judged {
    let verdict = evaluate(plan, state, input);
    let new_epoch = std::mem::take(&mut state.new_epoch_due);
    let next = match (verdict.outcome, &verdict.reason) {
        (Outcome::Fail, StageReason::Breach { gates }) => {
            Next::RollBack(RollbackReason::AnytimeBreach {
                gates: gates.clone(),
            })
        }
        (Outcome::Fail, reason) if !input.paused => Next::RollBack(failed_safe(reason)),
        (Outcome::Pass, _) if !input.paused => Next::Advance {
            fresh_counts: false,
        },
        _ if new_epoch => Next::NewEpoch,
        _ => Next::Stay,
    };
    Judged {
        verdict,
        note: None,
        next,
    }
}

/// Takes one look: updates the test state and judges the stage.
/// A `Fail` here is final (its error is controlled by `α`): the caller rolls
/// back at once.
pub fn evaluate(plan: &Plan, state: &mut SequentialState, input: &LookInput) -> StageVerdict {
    let elapsed_ms = input.elapsed.as_millis() as u64;
    let base =
        |outcome, reason: StageReason, champion: Option<ChampionHealth>, gates| StageVerdict {
            stage: input.stage,
            outcome,
            gross: matches!(reason, StageReason::Breach { .. }),
            reason,
            elapsed_ms,
            champion,
            gates,
            confirmation: None,
        };
    let Some((ledger, increments)) = input.evidence else {
        let (outcome, reason) = stats_unavailable(plan, input.elapsed);
        return base(outcome, reason, None, vec![]);
    };
    let ids = (input.champion, input.candidate);
    let tests = error_tests(plan, state, ledger, ids);

    let g = &plan.gates;
    // This epoch's cells are the classes named before this look: fixed
    // before any of its data could name more.
    state
        .class_cells
        .entry(input.epoch)
        .or_insert(state.classes.len());
    let stage_epoch = input.stage_starts.last().copied().unwrap_or(input.epoch);
    let stage_snap = ledger.pooled(stage_epoch, input.epoch);
    let (c, h) = arms_of(&stage_snap, ids);
    let arms = Arms {
        champion: &h,
        candidate: &c,
    };
    let alpha = metric_alpha(plan);
    let mut gates = Vec::new();
    if g.error_rate.enabled {
        let all: Vec<(Epoch, Snapshot)> = ledger
            .epochs()
            .into_iter()
            .map(|e| (e, ledger.epoch(e)))
            .collect();
        let all: Vec<(Epoch, &Snapshot)> = all.iter().map(|(e, s)| (*e, s)).collect();
        gates.push(error_gate(plan, tests, alpha, &all, ids, arms));
    }
    if g.latency.enabled {
        gates.extend(latency_within_stages(plan, input, ledger, increments));
    }
    let canary_from = input
        .stage_starts
        .get(usize::from(plan.shadow.enabled))
        .copied();
    match input.stage {
        StageKind::Shadow => {
            gates.push(shadow_gate(plan, alpha, &stage_snap, input.candidate, arms));
        }
        StageKind::Canary if g.prediction_shift.enabled => {
            let tests = shift_tests(plan, state, ledger, ids, canary_from, alpha);
            gates.push(shift_gate(plan, alpha, tests, arms));
        }
        // The watch is judged by `watch_verdict`, never by a stage's look.
        _ => {}
    }
    gates.extend(stage_quality_gate(
        plan,
        alpha,
        input,
        (canary_from, stage_epoch),
    ));
    // The whole rollout's counts, pooled once for what reads them whole.
    let whole = ledger.pooled(0, Epoch::MAX);
    if g.prediction_shift.enabled {
        let min_share = g.prediction_shift.min_class_share;
        state.note_classes(&whole, min_share);
    }
    let (pc, ph) = arms_of(&ledger.pooled(1, input.epoch.max(1)), ids);
    gates.extend(guard_gate(
        plan,
        alpha,
        Arms {
            champion: &ph,
            candidate: &pc,
        },
    ));
    let (champion, outage_ended) = champion_now(plan, state, ledger, input.now, h.latency());
    let (outcome, reason) = judge_stage(
        plan,
        input,
        (ledger, &whole),
        &mut gates,
        (&champion, outage_ended),
    );
    base(outcome, reason, Some(champion), gates)
}

/// The stage's outcome from its gates and its own floors (its own
/// samples, the per-key floor, keys too few for the step), by the shared
/// rule chain.
fn judge_stage(
    plan: &Plan,
    input: &LookInput,
    (ledger, whole): (&Ledger, &Snapshot),
    gates: &mut [GateVerdict],
    (champion, outage_ended): (&ChampionHealth, bool),
) -> (Outcome, StageReason) {
    let groups = candidate_groups(whole, input.candidate);
    let keys = model_keys(plan, whole, (input.champion, input.candidate));
    let floors = StageFloors {
        held: stage_floors(plan, gates, (ledger, groups, keys), input, outage_ended),
        hopeless_keys: hopeless_keys(plan, input, (groups, keys)),
    };
    let advance = plan.sequential.advance;
    judge(plan, (advance, champion), gates, &floors, input.elapsed)
}

/// Each stage needs its own sample floor before it may pass, whatever the
/// cumulative evidence says (a stage nobody exercised proved nothing): the
/// gates the stage's own counts (counted afresh after an outage ended) or
/// unit groups do not yet reach, and why.
fn stage_floors(
    plan: &Plan,
    gates: &[GateVerdict],
    (ledger, groups, keys): (&Ledger, usize, Option<u64>),
    input: &LookInput,
    outage_ended: bool,
) -> Vec<(GateKind, Reason)> {
    let stage_window = if outage_ended {
        Tally::default()
    } else {
        Tally::of(
            &ledger.pooled(input.floor_epoch, input.epoch),
            input.champion,
            input.candidate,
        )
    };
    gates
        .iter()
        .filter_map(|v| {
            let why = stage_floor(plan, v.gate, &stage_window)
                .or_else(|| unit_floor(v.gate, groups, keys))?;
            Some((v.gate, why))
        })
        .collect()
}

/// How many unit groups hold the candidate's requests in `whole` (the
/// rollout's counts pooled).
fn candidate_groups(whole: &Snapshot, candidate: &str) -> usize {
    whole
        .revision(candidate)
        .units()
        .values()
        .filter(|u| u.requests > 0)
        .count()
}

/// The per-key floor of a gate whose tests are tempered by a design
/// effect: with fewer than [`MIN_UNITS`] unit groups holding the
/// candidate's requests there is no variance to estimate, the tests take
/// requests as independent, and so a stage may not *pass* on them (it may
/// still fail). A stage of a model with few keys then fails safe at its
/// deadline instead of passing on one or two users. A source without unit
/// groups (no group holds anything) states independence and is not held.
fn unit_floor(gate: GateKind, groups: usize, keys: Option<u64>) -> Option<Reason> {
    let tempered = matches!(
        gate,
        GateKind::ErrorRate | GateKind::GuardRails | GateKind::Latency
    );
    (tempered && (1..MIN_UNITS).contains(&groups)).then_some(Reason::TooFewKeys {
        groups: groups as u64,
        need: MIN_UNITS as u64,
        keys,
    })
}

/// The keys the model's traffic carries, if few enough to matter: the
/// plan's declared count, or an estimate from the unit groups either arm's
/// requests occupied over the rollout ([`crate::keys::estimate`]) once the
/// requests say every key has shown ([`crate::keys::seen_all`]). `None`
/// when split per request (the request is the unit).
fn model_keys(plan: &Plan, whole: &Snapshot, (champion, candidate): (&str, &str)) -> Option<u64> {
    if plan.assignment == Assignment::PerRequest {
        return None;
    }
    if plan.keys.is_some() {
        return plan.keys;
    }
    let mut occupied = BTreeMap::<u16, u64>::new();
    for id in [champion, candidate] {
        for (g, u) in whole.revision(id).units() {
            *occupied.entry(*g).or_default() += u.requests;
        }
    }
    occupied.retain(|_, requests| *requests > 0);
    let requests = occupied.values().sum();
    let rarest = occupied.values().copied().min().unwrap_or(0);
    crate::keys::estimate(occupied.len()).filter(|&k| crate::keys::seen_all(k, requests, rarest))
}

/// A canary step the model's keys can never fill, when the candidate's
/// unit groups are below the per-key floor: its weight gives the
/// candidate on average fewer than half the keys the floor needs
/// ([`crate::keys::hopeless`]) — often none at all. The chain then fails
/// a starving stage once its minimum duration is over (its keys have had
/// time to show), naming why, instead of at its evidence deadline; not a
/// breach: nothing was shown against the candidate.
fn hopeless_keys(
    plan: &Plan,
    input: &LookInput,
    (groups, keys): (usize, Option<u64>),
) -> Option<(u64, u32)> {
    let keys = keys?;
    // The stage's index among the canary steps.
    let canary = input
        .stage_starts
        .len()
        .checked_sub(1 + usize::from(plan.shadow.enabled))?;
    let weight_percent = *plan.steps.get(canary)?;
    (input.stage == StageKind::Canary
        && groups < MIN_UNITS
        && crate::keys::hopeless(keys, weight_percent))
    .then_some((keys, weight_percent))
}

/// The candidate's and the champion's stats in `s`.
fn arms_of(s: &Snapshot, (champion, candidate): (&str, &str)) -> (RevisionStats, RevisionStats) {
    (s.revision(candidate).clone(), s.revision(champion).clone())
}

/// The latency gate, judged within each stage that may newly fail (those
/// with new counts, and the current one, whose verdict is shown).
fn latency_within_stages(
    plan: &Plan,
    input: &LookInput,
    ledger: &Ledger,
    increments: &BTreeMap<Epoch, Snapshot>,
) -> Option<GateVerdict> {
    let stages: Vec<(usize, Snapshot)> = input
        .stage_starts
        .iter()
        .enumerate()
        .filter_map(|(i, &from)| {
            let to = input
                .stage_starts
                .get(i + 1)
                .map_or(input.epoch, |&next| next.saturating_sub(1));
            let current = i + 1 == input.stage_starts.len();
            let touched = increments.keys().any(|e| (from..=to).contains(e));
            (current || touched).then(|| (i + 1, ledger.pooled(from, to)))
        })
        .collect();
    within_stages(&stages, |i, s| {
        let (c, h) = arms_of(s, (input.champion, input.candidate));
        Some(latency_gate(
            plan,
            stage_alpha(plan, i),
            Arms {
                champion: &h,
                candidate: &c,
            },
        ))
    })
}

/// The champion's health on recent evidence (totals since the rollout
/// began would dilute an outage that starts late), and whether an outage
/// just ended. When one ends, a new epoch starts (a fresh component of the
/// error e-process and the stage's floors start there), so this look
/// cannot pass.
fn champion_now(
    plan: &Plan,
    state: &mut SequentialState,
    ledger: &Ledger,
    now: crate::types::Timestamp,
    latency: &LatencyHistogram,
) -> (ChampionHealth, bool) {
    let window = plan.outage_window.as_millis() as u64;
    let (recent_requests, recent_failures) = ledger.recent_champion(now, window);
    let champion = champion_health_of(plan, recent_requests, recent_failures, latency);
    let outage_ended = state.champion_outage && !champion.outage;
    state.new_epoch_due = outage_ended;
    state.champion_outage = champion.outage;
    (champion, outage_ended)
}

#[cfg(test)]
mod tests;
