//! The settings a policy never reads (`Plan::unused_by_policy`, which the
//! API and `rollout status` leave out of a plan's view) really decide
//! nothing: changing every one of them changes no decision, on scenarios
//! that promote, roll back and stop, under both policies.

use rollgate_core::Plan;
use rollgate_core::plan::Policy;
use rollgate_sim::matrix::Matrix;
use rollgate_sim::simulate;
use serde_json::{Value, json};

fn matrix() -> Matrix {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../bench/sim/scenarios.toml"
    );
    toml::from_str(&std::fs::read_to_string(path).expect("scenario file")).expect("valid matrix")
}

/// A valid value for each setting, far from its default.
fn other_value(path: &str) -> Value {
    match path {
        "confirm_breaches" => json!(5),
        "gates.error_rate.margin" => json!(0.3),
        "gates.error_rate.gross_error_rate" => json!(0.05),
        "gates.prediction_shift.margin" => json!(0.01),
        "gates.prediction_shift.max_class_ratio" => json!(1.05),
        "gates.prediction_shift.min_class_share" => json!(0.3),
        "sequential" => json!({
            "alpha": 0.3,
            "advance": "on_evidence",
            "max_error_ratio": 3.0,
            "non_inferiority_ratio": 5.0,
            "negligible_error_rate": 0.2
        }),
        other => panic!("no other value for {other}: add one"),
    }
}

/// `plan` with every setting its policy does not read changed.
fn perturbed(plan: &Plan) -> Plan {
    let mut v = serde_json::to_value(plan).expect("plan");
    for path in plan.unused_by_policy() {
        let pointer = format!("/{}", path.replace('.', "/"));
        let slot = v
            .pointer_mut(&pointer)
            .unwrap_or_else(|| panic!("{path} is not a plan setting"));
        assert_ne!(*slot, other_value(path), "{path}: pick another value");
        *slot = other_value(path);
    }
    let p: Plan = serde_json::from_value(v).expect("still a plan");
    assert_eq!(p.validate(), Ok(()));
    p
}

#[test]
fn settings_a_policy_does_not_read_decide_nothing() {
    let m = matrix();
    let scenarios = [
        "identical-100rps-0.5pct",
        "errors-50pct",
        "errors-doubled-1-to-2pct",
        "latency-plus-100ms",
        "broken-feature",
        "shared-outage-60s",
        "shift-identical-class-mix",
        "shift-fraud-doubled",
    ];
    for policy in [Policy::Sequential, Policy::Windowed] {
        let mut plan = m.plan.clone();
        plan.policy = policy;
        let other = perturbed(&plan);
        assert_ne!(plan, other);
        for name in scenarios {
            let s = m
                .scenarios
                .iter()
                .find(|s| s.name == name)
                .unwrap_or_else(|| panic!("scenario {name}"));
            for seed in 0..3 {
                let a = simulate(&plan, s, seed);
                let b = simulate(&other, s, seed);
                assert_eq!(
                    (a.phase.clone(), a.evaluations, a.candidate_live_requests),
                    (b.phase.clone(), b.evaluations, b.candidate_live_requests),
                    "{name} under {policy:?}, seed {seed}"
                );
                assert_eq!(a.seconds, b.seconds, "{name} under {policy:?}, seed {seed}");
            }
        }
    }
}
