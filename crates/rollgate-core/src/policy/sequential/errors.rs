//! The error-rate gate: two e-processes to fail (failures, client errors),
//! one to pass (not worse), each tempered by its design effect, and the
//! rates shown beside them for reading.

use super::budget::stage_count;
use super::state::{Counted, SequentialState};
use crate::anytime::{ConditionalBinomial, robbins_cs_tempered, start_mixture};
use crate::exposure::{Epoch, Ledger};
use crate::gate::{
    Arms, Counts, EpochCounts, Evidence, GateKind, GateVerdict, Negligible, decide, sample_floor,
};
use crate::plan::Plan;
use crate::snapshot::{RevisionStats, Snapshot};
use crate::stats::Interval;
use crate::unit::{count_design_effect, ratio_design_effect};

/// Which side an e-process tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Side {
    /// Null "the candidate is no worse" (up to the margin): rejecting it
    /// fails the gate.
    Worse,
    /// Null "the candidate is worse by the non-inferiority ratio":
    /// rejecting it passes the gate.
    NotWorse,
}

/// The design effect of comparing the arms' counts over the whole
/// rollout: the same users stay in their arm across stages, so their
/// correlation spans every epoch (see [`crate::unit`]).
pub(super) fn error_design_effect(ledger: &Ledger, ids: (&str, &str), what: Counted) -> f64 {
    let (champion, candidate) = ids;
    let all = ledger.pooled(0, Epoch::MAX);
    ratio_design_effect(
        all.revision(candidate).units(),
        all.revision(champion).units(),
        what.in_unit(),
    )
}

/// One epoch's counts for an error e-process, with every request that has
/// no outcome yet (in flight, abandoned by its client, lost with a killed
/// gateway) taken at its worst for a rejection: to show the candidate
/// worse, the champion's as counted against it and the candidate's as
/// not; to show it not worse, the other way round. This factor is at most
/// the one the epoch's final counts will give, whatever those outcomes
/// turn out to be and whenever they arrive. Returns `(champion's,
/// candidate's, candidate share)`.
pub(super) fn pessimistic(
    s: &Snapshot,
    ids: (&str, &str),
    what: Counted,
    side: Side,
) -> (u64, u64, f64) {
    let (champion, candidate) = ids;
    let (c, h) = (s.revision(candidate), s.revision(champion));
    let (uc, uh) = (c.unresolved(), h.unresolved());
    let (kc, kh, nc, nh) = match what {
        Counted::Failures => (
            c.failure_count(),
            h.failure_count(),
            c.requests(),
            h.requests(),
        ),
        Counted::ClientErrors => (
            c.client_errors(),
            h.client_errors(),
            c.requests() + c.client_errors(),
            h.requests() + h.client_errors(),
        ),
    };
    let (nc, nh) = (nc + uc, nh + uh);
    let share = if nc + nh == 0 {
        0.0
    } else {
        nc as f64 / (nc + nh) as f64
    };
    match side {
        Side::Worse => (kh + uh, kc, share),
        Side::NotWorse => (kh, kc + uc, share),
    }
}

/// `ln` of an error e-process: every epoch of the rollout is one factor of
/// the conditional-binomial e-process (its cumulative counts, unresolved
/// requests at their worst), mixed over start times — the origin, and each
/// restart epoch after an outage ([`start_mixture`]).
///
/// Why per epoch and not per look: within an epoch, *when* a request's
/// outcome is counted depends on its latency, and a candidate that fails
/// fast beside a champion that times out (equal rates) would show its
/// failures first. Epochs are fixed in advance of their data, so the
/// product over epochs of their final factors is a test supermartingale;
/// at any look each factor is bounded above by its final value, so a
/// rejection implies the final product crossed `1/α` (Ville's inequality
/// bounds that by `α`).
pub(super) fn error_log_e(
    plan: &Plan,
    state: &SequentialState,
    ledger: &Ledger,
    ids: (&str, &str),
    what: Counted,
    design_effect: f64,
) -> f64 {
    let factors: Vec<(Epoch, (u64, u64, f64))> = ledger
        .epochs()
        .into_iter()
        .map(|e| (e, pessimistic(&ledger.epoch(e), ids, what, Side::Worse)))
        .collect();
    let component = |from: Epoch| {
        let mut cb = ConditionalBinomial::new(plan.sequential.max_error_ratio);
        for &(_, (kh, kc, share)) in factors.iter().filter(|(e, _)| *e >= from) {
            cb.update(kh, kc, share);
        }
        cb.log_e_value_tempered(1.0 / design_effect)
    };
    start_mixture(
        std::iter::once(0)
            .chain(state.restarts.iter().copied())
            .map(component),
    )
}

/// `ln` of the non-inferiority e-process: null "the candidate's failure
/// rate is at least `non_inferiority_ratio` times the champion's", one
/// factor per epoch (unresolved requests at their worst for a pass),
/// tempered by the design effect like the failing side.
pub(super) fn pass_log_e(
    plan: &Plan,
    ledger: &Ledger,
    ids: (&str, &str),
    design_effect: f64,
) -> f64 {
    let mut cb = ConditionalBinomial::below(plan.sequential.non_inferiority_ratio);
    for e in ledger.epochs() {
        let (kh, kc, share) = pessimistic(&ledger.epoch(e), ids, Counted::Failures, Side::NotWorse);
        cb.update(kh, kc, share);
    }
    cb.log_e_value_tempered(1.0 / design_effect)
}

/// The error tests' `ln` e-values at one look, and the design effect they
/// were tempered by.
#[derive(Debug, Clone, Copy)]
pub(super) struct ErrorTests {
    failures: f64,
    client_errors: f64,
    not_worse: f64,
    design_effect: f64,
    client_design_effect: f64,
}

/// Error rate: two e-processes to fail, on failures and on client errors,
/// each at `alpha / 2`. To pass (what `on_evidence` waits for): the
/// non-inferiority e-process at `alpha`, or the candidate's own failure
/// rate shown below `negligible_error_rate`. The rates and difference
/// shown are for reading, and do not pool arms across time: the
/// candidate's pooled rate is its own exposure-weighted average over the
/// epochs, compared with the champion's rates *reweighted to the
/// candidate's exposure* (each epoch's champion sequence at
/// `alpha / stages`, so that all epochs hold at once).
pub(super) fn error_gate(
    plan: &Plan,
    tests: ErrorTests,
    alpha: f64,
    epochs: &[(Epoch, &Snapshot)],
    ids: (&str, &str),
    stage: Arms,
) -> GateVerdict {
    let cfg = &plan.gates.error_rate;
    let (champion_id, candidate_id) = ids;
    let (mut c_all, mut h_all) = (RevisionStats::default(), RevisionStats::default());
    for (_, s) in epochs {
        c_all.merge(s.revision(candidate_id));
        h_all.merge(s.revision(champion_id));
    }
    let d = tests.design_effect;
    let own_d = count_design_effect(c_all.units(), Counted::Failures.in_unit());
    let cand = robbins_cs_tempered(c_all.failure_count(), c_all.requests(), own_d, alpha / 2.0);
    let champ = champion_rate(plan, epochs, ids, (&c_all, &h_all), d, alpha);
    let difference = Interval {
        lower: (cand.lower - champ.upper).max(-1.0),
        upper: (cand.upper - champ.lower).min(1.0),
    };
    let own = robbins_cs_tempered(c_all.failure_count(), c_all.requests(), own_d, alpha).upper;
    let negligible = own < plan.sequential.negligible_error_rate;
    let evidence = Evidence::ErrorRate {
        candidate: Counts::of(&c_all),
        champion: Counts::of(&h_all),
        difference,
        margin: cfg.margin,
        candidate_rate: cand,
        champion_rate: champ,
        e_value: Some(tests.failures.exp()),
        client_error_e_value: Some(tests.client_errors.exp()),
        pass_e_value: Some(tests.not_worse.exp()),
        design_effect: Some(d),
        client_error_design_effect: Some(tests.client_design_effect),
        fail_at: Some(2.0 / alpha),
        pass_at: Some(1.0 / alpha),
        negligible: Some(Negligible {
            upper: own,
            limit: plan.sequential.negligible_error_rate,
        }),
        epochs: epochs_counted(epochs, ids),
    };
    let (outcome, reason) = decide(
        None,
        sample_floor(
            stage.candidate.requests(),
            stage.champion.requests(),
            cfg.min_requests,
        ),
        tests.failures.max(tests.client_errors) >= (2.0 / alpha).ln(),
        tests.not_worse >= (1.0 / alpha).ln() || negligible,
        true,
    );
    GateVerdict::new(GateKind::ErrorRate, outcome, reason, evidence)
}

/// The champion's failure rate as the candidate would have met it: each
/// epoch's champion sequence (at `alpha / 2 / stages`, so that all epochs
/// hold at once) weighted by the candidate's exposure in that epoch; its
/// plain sequence while the candidate has no requests.
pub(super) fn champion_rate(
    plan: &Plan,
    epochs: &[(Epoch, &Snapshot)],
    (champion_id, candidate_id): (&str, &str),
    (c_all, h_all): (&RevisionStats, &RevisionStats),
    d: f64,
    alpha: f64,
) -> Interval {
    if c_all.requests() == 0 {
        return robbins_cs_tempered(h_all.failure_count(), h_all.requests(), d, alpha / 2.0);
    }
    let per_epoch = alpha / 2.0 / stage_count(plan).max(epochs.len()).max(1) as f64;
    let mut champ = Interval {
        lower: 0.0,
        upper: 0.0,
    };
    for (_, s) in epochs {
        let (c, h) = (s.revision(candidate_id), s.revision(champion_id));
        let w = c.requests() as f64 / c_all.requests() as f64;
        let i = robbins_cs_tempered(h.failure_count(), h.requests(), d, per_epoch);
        champ.lower += w * i.lower;
        champ.upper += w * i.upper;
    }
    champ
}

/// Every epoch the tests counted anything in (an unresolved request is
/// counted, at its worst), with both arms' counts.
pub(super) fn epochs_counted(
    epochs: &[(Epoch, &Snapshot)],
    (champion_id, candidate_id): (&str, &str),
) -> Vec<EpochCounts> {
    epochs
        .iter()
        .filter(|(_, s)| {
            let (c, h) = (s.revision(candidate_id), s.revision(champion_id));
            c.arrived()
                + c.requests()
                + c.client_errors()
                + h.arrived()
                + h.requests()
                + h.client_errors()
                > 0
        })
        .map(|(e, s)| EpochCounts {
            epoch: *e,
            candidate: Counts::of(s.revision(candidate_id)),
            champion: Counts::of(s.revision(champion_id)),
        })
        .collect()
}

/// Both error e-processes and the not-worse one, each tempered by its
/// design effect, as of this look.
pub(super) fn error_tests(
    plan: &Plan,
    state: &mut SequentialState,
    ledger: &Ledger,
    ids: (&str, &str),
) -> ErrorTests {
    let (df, dc) = (
        error_design_effect(ledger, ids, Counted::Failures),
        error_design_effect(ledger, ids, Counted::ClientErrors),
    );
    ErrorTests {
        failures: error_log_e(plan, state, ledger, ids, Counted::Failures, df),
        client_errors: error_log_e(plan, state, ledger, ids, Counted::ClientErrors, dc),
        not_worse: pass_log_e(plan, ledger, ids, df),
        design_effect: df,
        client_design_effect: dc,
    }
}
