//! Whole simulated rollouts: deterministic per seed, and the plain cases
//! decided the way a correct gate decides them.

use std::time::Duration;

use rollgate_core::{Phase, Plan};

use crate::{Scenario, simulate};

fn quick() -> Plan {
    Plan {
        min_stage_duration: Duration::from_secs(10),
        evidence_timeout: Duration::from_secs(120),
        ..Plan::default()
    }
}

#[test]
fn same_seed_same_result() {
    let s = Scenario::identical("same", 200.0);
    assert_eq!(simulate(&quick(), &s, 3), simulate(&quick(), &s, 3));
}

#[test]
fn identical_candidate_is_promoted() {
    let r = simulate(&quick(), &Scenario::identical("identical", 300.0), 1);
    assert_eq!(r.phase, Phase::Promoted { manual: false });
    assert!(r.candidate_live_requests > 0);
}

#[test]
fn broken_feature_is_refused_in_shadow_with_zero_exposure() {
    let s = Scenario {
        flip_rate: 0.12,
        unconfident_disagreement: 0.2,
        ..Scenario::identical("broken-feature", 300.0)
    };
    let r = simulate(&quick(), &s, 2);
    assert!(matches!(r.phase, Phase::RolledBack { .. }), "{:?}", r.phase);
    assert_eq!(r.candidate_live_requests, 0);
    assert!(r.candidate_mirrored_requests > 0);
}

#[test]
fn traffic_that_stops_never_promotes() {
    let s = Scenario {
        traffic_stops_at: Some(5),
        ..Scenario::identical("stops", 300.0)
    };
    let r = simulate(&quick(), &s, 4);
    assert!(matches!(r.phase, Phase::RolledBack { .. }), "{:?}", r.phase);
}
