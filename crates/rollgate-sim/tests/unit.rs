//! The right statistical unit, on the committed scenarios in a reduced
//! form (`bench/sim/scenarios.toml`; full runs: bench/results/sim.md). The
//! assertions are the safety properties: an identical candidate is not
//! rolled back when users differ or requests carry correlated batches; a
//! candidate worse for everyone is still caught at once; under
//! `on_evidence` a candidate with twice the champion's failures is never
//! promoted.

use rollgate_core::{Phase, RollbackReason};
use rollgate_sim::matrix::{Matrix, PolicyKind, run_cell};
use rollgate_sim::{ArmModel, Scenario, simulate};

fn matrix() -> Matrix {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../bench/sim/scenarios.toml"
    );
    toml::from_str(&std::fs::read_to_string(path).expect("scenario file")).expect("valid matrix")
}

fn scenario(m: &Matrix, name: &str) -> Scenario {
    m.scenarios
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("scenario {name}"))
        .clone()
}

#[test]
fn an_identical_candidate_is_not_rolled_back_when_users_differ_or_batches_correlate() {
    let m = matrix();
    for (name, runs) in [
        ("users-2pct-fail-20pct-200rps-60s", 6),
        ("users-2pct-fail-20pct-heavy-volume-1000rps-300s", 2),
        ("users-latency-1-volume-2-1000rps-300s", 2),
        ("users-2pct-fail-20pct-1000rps-300s-per-request", 1),
        ("batch-32-corr-0.5-disagree-8pct", 12),
        ("batch-8-corr-0.3-disagree-8pct", 12),
    ] {
        let r = run_cell(
            &m.plan,
            &scenario(&m, name),
            PolicyKind::Sequential,
            runs,
            2,
            &|| {},
        );
        assert_eq!(r.rolled_back_breach, 0, "{name}: {r:?}");
        assert_eq!(r.promoted, runs, "{name}: {r:?}");
    }
}

#[test]
fn a_candidate_worse_for_every_user_is_still_caught_at_once() {
    let m = matrix();
    let mut s = scenario(&m, "users-2pct-fail-20pct-200rps-60s");
    s.candidate = ArmModel {
        failure: 0.5,
        ..ArmModel::HEALTHY
    };
    s.shadow = Some(false);
    s.tick = std::time::Duration::from_millis(100);
    for seed in 0..6 {
        let r = simulate(&m.plan, &s, seed);
        assert!(
            matches!(
                &r.phase,
                Phase::RolledBack {
                    reason: RollbackReason::AnytimeBreach { .. }
                }
            ),
            "seed {seed}: {:?}",
            r.phase
        );
        // Half its requests fail: a few dozen suffice, users or not.
        assert!(
            r.candidate_live_requests <= 60,
            "seed {seed}: {} requests",
            r.candidate_live_requests
        );
    }
}

#[test]
fn on_evidence_never_promotes_twice_the_champions_failures() {
    let m = matrix();
    for name in [
        "errors-doubled-0.5-to-1pct",
        "errors-doubled-1-to-2pct-100rps",
    ] {
        let r = run_cell(
            &m.plan,
            &scenario(&m, name),
            PolicyKind::SequentialEvidence,
            8,
            2,
            &|| {},
        );
        assert_eq!(r.promoted, 0, "{name}: {r:?}");
    }
}

/// Prediction shift on the committed scenarios: an identical class mix is
/// never rolled back; a doubled class is stopped, and by the shift gate.
#[test]
fn a_shifted_class_mix_is_stopped_and_an_identical_one_is_not() {
    let m = matrix();
    let r = run_cell(
        &m.plan,
        &scenario(&m, "shift-identical-class-mix"),
        PolicyKind::Sequential,
        8,
        2,
        &|| {},
    );
    assert_eq!((r.rolled_back_breach, r.promoted), (0, 8), "{r:?}");
    let s = scenario(&m, "shift-fraud-doubled");
    for seed in 0..8 {
        let r = simulate(&m.plan, &s, seed);
        assert!(
            matches!(
                &r.phase,
                Phase::RolledBack { reason: RollbackReason::AnytimeBreach { gates } }
                    if gates == &[rollgate_core::GateKind::PredictionShift]
            ),
            "seed {seed}: {:?}",
            r.phase
        );
    }
}
