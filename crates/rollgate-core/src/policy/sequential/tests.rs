use super::errors::{error_design_effect, error_log_e, pass_log_e};
use super::*;
use crate::exposure::Exposure;
use crate::snapshot::FailureClass;
use proptest::prelude::*;

/// One epoch in which the champion fails 0.5% of 64,000 requests, evenly
/// over its unit groups, and the candidate fails `per_group[u]` of 50
/// requests in group `u`.
fn ledger(per_group: &[u64]) -> Ledger {
    let mut s = Snapshot::default();
    let h = s.revision_mut("h");
    for u in 0..64u16 {
        h.record_latencies(std::iter::repeat_n(20_000, 995));
        h.record_failures(FailureClass::Upstream5xx, 5);
        h.unit_mut(u).record_latency(20_000, 995);
        h.unit_mut(u).requests += 995;
        h.unit_mut(u).record_failures(5);
    }
    let c = s.revision_mut("c");
    for (u, &k) in per_group.iter().enumerate() {
        c.record_latency_counts([(20_000, 50 - k)]);
        c.record_failures(FailureClass::Upstream5xx, k);
        let t = c.unit_mut(u as u16);
        t.requests += 50 - k;
        t.record_latency(20_000, 50 - k);
        t.record_failures(k);
    }
    for r in ["h", "c"] {
        let n = s.revision(r).requests();
        s.revision_mut(r).record_arrivals(n);
    }
    let mut l = Ledger::default();
    l.absorb(
        &Exposure::default().with_epochs("gw/1", [(1, s)].into()),
        1,
        crate::types::Timestamp(0),
    );
    l
}

fn log_e(l: &Ledger) -> (f64, f64) {
    let plan = Plan::default();
    let state = SequentialState::default();
    let ids = ("h", "c");
    let d = error_design_effect(l, ids, Counted::Failures);
    (
        error_log_e(&plan, &state, l, ids, Counted::Failures, 1.0),
        error_log_e(&plan, &state, l, ids, Counted::Failures, d),
    )
}

/// The same 70 candidate failures (expected: 16): spread over every
/// key group they show a regression; from three groups of keys (a few
/// users) they are what users who differ produce, and the unit's
/// design effect keeps them from showing one.
#[test]
fn failures_from_a_few_keys_are_weak_evidence_and_from_every_key_strong() {
    let threshold = (2.0 / metric_alpha(&Plan::default())).ln();
    let mut few = vec![0u64; 64];
    few[..3].fill(20);
    few[3..13].fill(1);
    let (raw, tempered) = log_e(&ledger(&few));
    assert!(raw >= threshold, "requests as units: {raw} < {threshold}");
    assert!(
        tempered < threshold,
        "keys as units: {tempered} >= {threshold}"
    );

    let mut spread = vec![1u64; 64];
    spread[..6].fill(2);
    assert_eq!(spread.iter().sum::<u64>(), 70);
    let (raw, tempered) = log_e(&ledger(&spread));
    assert!(
        tempered >= threshold,
        "{tempered} < {threshold} (raw {raw})"
    );
    assert!(
        (raw - tempered).abs() < 1e-9,
        "no design effect: {raw} vs {tempered}"
    );
}

/// One epoch's counts of the champion `h` and the candidate `c`, each as
/// `(requests with an outcome, failures among them, requests without one
/// yet)`.
fn arms(h: (u64, u64, u64), c: (u64, u64, u64)) -> Snapshot {
    let mut s = Snapshot::default();
    for (id, (n, k, unresolved)) in [("h", h), ("c", c)] {
        let r = s.revision_mut(id);
        r.record_latency_counts([(20_000, n - k)]);
        r.record_failures(FailureClass::Upstream5xx, k);
        r.record_arrivals(n + unresolved);
    }
    s
}

/// A fresh ledger holding `epochs` as one gateway reported them.
fn epochs_ledger(epochs: &[(Epoch, Snapshot)]) -> Ledger {
    let current = epochs.iter().map(|(e, _)| *e).max().unwrap_or(1);
    let mut l = Ledger::default();
    l.absorb(
        &Exposure::default().with_epochs("gw/1", epochs.iter().cloned().collect()),
        current,
        crate::types::Timestamp(0),
    );
    l
}

/// `ln` of the failing and of the passing error e-process, untempered.
fn error_e_values(l: &Ledger) -> (f64, f64) {
    let (plan, ids) = (Plan::default(), ("h", "c"));
    (
        error_log_e(
            &plan,
            &SequentialState::default(),
            l,
            ids,
            Counted::Failures,
            1.0,
        ),
        pass_log_e(&plan, l, ids, 1.0),
    )
}

/// An arm's `(requests, failures, unresolved)` and the share of its
/// unresolved requests that will turn out to fail.
fn arm_and_fate() -> impl Strategy<Value = ((u64, u64, u64), f64)> {
    (1u64..3000, 0.0..0.2f64, 0u64..300, 0.0..=1.0f64)
        .prop_map(|(n, rate, u, fate)| ((n, (n as f64 * rate) as u64, u), fate))
}

proptest! {
    /// Whatever the requests still without an outcome turn out to be, the
    /// epoch's factor now is at most its factor once they are counted,
    /// for failing and for passing alike: a look never sees more evidence
    /// than the epoch will hold.
    #[test]
    fn requests_without_an_outcome_count_at_their_worst(
        (h, h_fate) in arm_and_fate(),
        (c, c_fate) in arm_and_fate(),
    ) {
        let resolved = |(n, k, u): (u64, u64, u64), fate: f64| {
            (n + u, k + (u as f64 * fate) as u64, 0)
        };
        let now = error_e_values(&epochs_ledger(&[(1, arms(h, c))]));
        let last = arms(resolved(h, h_fate), resolved(c, c_fate));
        let then = error_e_values(&epochs_ledger(&[(1, last)]));
        prop_assert!(now.0 <= then.0 + 1e-9, "failing: {} now, {} once resolved", now.0, then.0);
        prop_assert!(now.1 <= then.1 + 1e-9, "passing: {} now, {} once resolved", now.1, then.1);
    }
}

/// Two epochs in which both arms fail alike, 10% of requests in the
/// first and 0.1% in the second, while the candidate serves 90% of the
/// first and 10% of the second: pooled, it failed 9% of its requests and
/// the champion 1.1%. Compared within each epoch nothing is shown;
/// counted as one epoch it would be a regression.
#[test]
fn arms_alike_in_every_epoch_show_nothing_however_their_shares_moved() {
    let threshold = (2.0 / metric_alpha(&Plan::default())).ln();
    let bad = arms((1000, 100, 0), (9000, 900, 0));
    let good = arms((9000, 9, 0), (1000, 1, 0));
    let (per_epoch, _) = error_e_values(&epochs_ledger(&[(1, bad.clone()), (2, good.clone())]));
    let (pooled, _) = error_e_values(&epochs_ledger(&[(1, Snapshot::merged([&bad, &good]))]));
    assert!(
        pooled >= threshold,
        "the trap is real: {pooled} < {threshold}"
    );
    assert!(
        per_epoch < threshold,
        "epoch by epoch: {per_epoch} >= {threshold}"
    );
}

/// One epoch's cumulative class counts: `(epoch, [(class, candidate,
/// champion)])`.
type ClassCounts<'a> = (Epoch, Vec<(&'a str, u64, u64)>);

/// Class counts per epoch, read into a fresh ledger.
fn class_ledger(epochs: &[ClassCounts]) -> Ledger {
    let mut map = BTreeMap::new();
    for (e, classes) in epochs {
        let mut s = Snapshot::default();
        for &(class, kc, kh) in classes {
            s.revision_mut("c").record_predictions(class, kc);
            s.revision_mut("h").record_predictions(class, kh);
        }
        map.insert(*e, s);
    }
    let last = epochs.iter().map(|(e, _)| *e).max().unwrap_or(1);
    let mut l = Ledger::default();
    l.absorb(
        &Exposure::default().with_epochs("gw/1", map),
        last,
        crate::types::Timestamp(0),
    );
    l
}

fn shift_plan() -> Plan {
    let mut plan = Plan::default();
    plan.gates.prediction_shift.enabled = true;
    plan
}

/// Named classes for epochs 1.. (every epoch sees `named`).
fn named(classes: &[&str], epochs: std::ops::RangeInclusive<Epoch>) -> SequentialState {
    SequentialState {
        classes: classes.iter().map(|c| c.to_string()).collect(),
        class_cells: epochs.map(|e| (e, classes.len())).collect(),
        ..SequentialState::default()
    }
}

#[test]
fn classes_are_named_once_common_enough_and_an_epoch_keeps_the_cells_it_began_with() {
    let mut state = SequentialState::default();
    let mut s = Snapshot::default();
    s.revision_mut("h").record_predictions("ok", 980);
    s.revision_mut("c").record_predictions("rare", 5);
    s.revision_mut("c").record_predictions("fraud", 15);
    state.class_cells.insert(1, state.classes.len());
    state.note_classes(&s, 0.01);
    assert_eq!(state.classes, ["fraud", "ok"], "rare is 0.5%");
    state.class_cells.insert(2, state.classes.len());
    s.revision_mut("c").record_predictions("rare", 30);
    state.note_classes(&s, 0.01);
    assert_eq!(state.classes, ["fraud", "ok", "rare"]);
    assert!(state.cells_of(1).is_empty());
    assert_eq!(state.cells_of(2), ["fraud", "ok"]);
    assert_eq!(
        state.cells_of(9),
        [] as [String; 0],
        "never looked at: all other"
    );
}

#[test]
fn a_shifted_class_mix_fails_an_identical_one_passes_and_a_new_class_fails() {
    let plan = shift_plan();
    let alpha = metric_alpha(&plan);
    let tests = |epochs: &[ClassCounts]| {
        let state = named(&["fraud", "ok"], 1..=3);
        shift_tests(
            &plan,
            &state,
            &class_ledger(epochs),
            ("h", "c"),
            Some(2),
            alpha,
        )
    };
    // 5% then 25% canary: fraud 30% -> 60% in the candidate.
    let shifted = tests(&[
        (2, vec![("fraud", 60, 570), ("ok", 40, 1330)]),
        (3, vec![("fraud", 600, 900), ("ok", 400, 2100)]),
    ]);
    assert!(shifted.fail >= (1.0 / alpha).ln(), "{}", shifted.fail);
    assert!(!shifted.within);
    // The same mix in both arms, and a shadow epoch (1) that is ignored.
    let same = tests(&[
        (1, vec![("fraud", 0, 900)]),
        (2, vec![("fraud", 300, 5700), ("ok", 700, 13300)]),
        (3, vec![("fraud", 3000, 9000), ("ok", 7000, 21000)]),
    ]);
    assert!(same.fail < 1.0, "{}", same.fail);
    assert!(same.within);
    // A class only the candidate predicts, 10% of its answers, in the
    // "other" cell: shown at once.
    let new = tests(&[(
        2,
        vec![
            ("fraud", 30, 570),
            ("ok", 60, 1330),
            ("hallucinated", 10, 0),
        ],
    )]);
    assert!(new.fail >= (1.0 / alpha).ln(), "{}", new.fail);
    // Before any canary epoch there is nothing to judge.
    let none = shift_tests(
        &plan,
        &named(&["fraud"], 1..=1),
        &class_ledger(&[(1, vec![("fraud", 900, 0)])]),
        ("h", "c"),
        None,
        alpha,
    );
    assert_eq!((none.fail, none.within), (0.0, false));
}

/// Class mixes identical, or at the null's edge (one class at exactly
/// `1/ρ` of the champion's rate), over three canary epochs at 5, 25 and
/// 50% with a look every 200 predictions: the test fails at most `α`
/// of the rollouts (here `α = 0.05` per rollout, 400 rollouts; seen:
/// 0 of 400 for both).
#[test]
fn the_class_mix_test_keeps_its_alpha_under_the_null() {
    use rand::{Rng, SeedableRng, rngs::StdRng};
    let plan = shift_plan();
    let alpha = 0.05;
    let champion = [("a", 0.3), ("b", 0.6), ("c", 0.095), ("rare", 0.005)];
    // The last is no null: `a` doubles. The test sees it in nearly every
    // run, so the silence under the nulls is not a blind test's.
    for (candidate, null) in [
        (champion, true),
        (
            [("a", 0.2), ("b", 0.7), ("c", 0.095), ("rare", 0.005)],
            true,
        ),
        (
            [("a", 0.6), ("b", 0.3), ("c", 0.095), ("rare", 0.005)],
            false,
        ),
    ] {
        let mut rng = StdRng::seed_from_u64(7);
        let mut failed = 0;
        for _ in 0..400 {
            let state = named(&["a", "b", "c"], 1..=4);
            let mut counts: Vec<ClassCounts> = Vec::new();
            let mut rejected = false;
            'run: for (e, w) in [(2, 0.05), (3, 0.25), (4, 0.5)] {
                counts.push((e, champion.iter().map(|(k, _)| (*k, 0, 0)).collect()));
                for _look in 0..10 {
                    let cell = counts.last_mut().expect("pushed");
                    for _ in 0..200 {
                        let to_candidate = rng.random::<f64>() < w;
                        let dist = if to_candidate { &candidate } else { &champion };
                        let mut u = rng.random::<f64>();
                        let i = dist
                            .iter()
                            .position(|(_, p)| {
                                u -= p;
                                u < 0.0
                            })
                            .unwrap_or(dist.len() - 1);
                        if to_candidate {
                            cell.1[i].1 += 1;
                        } else {
                            cell.1[i].2 += 1;
                        }
                    }
                    let t = shift_tests(
                        &plan,
                        &state,
                        &class_ledger(&counts),
                        ("h", "c"),
                        Some(2),
                        alpha,
                    );
                    if t.fail >= (1.0 / alpha).ln() {
                        rejected = true;
                        break 'run;
                    }
                }
            }
            failed += u32::from(rejected);
        }
        if null {
            assert!(
                failed <= 20,
                "{failed}/400 false failures for {candidate:?}"
            );
        } else {
            assert!(failed >= 360, "{failed}/400 shifts seen");
        }
    }
}
