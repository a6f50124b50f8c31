//! The statistical unit under concentration, on the committed `conc-*`
//! scenarios in a reduced form (`bench/sim/scenarios.toml`; full runs:
//! bench/results/sim.md). The assertion is the safety property: an
//! identical candidate is never rolled back for a breach when one key
//! carries much of the traffic and fails more — here in exactly the runs
//! where that key (a bot) lands in the candidate's first canary step,
//! which is where an estimate of the design effect from the groups that
//! hold the bot understated it.

use rollgate_core::{Phase, RollbackReason};
use rollgate_sim::matrix::Matrix;
use rollgate_sim::{bot_bucket, simulate};

fn matrix() -> Matrix {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../bench/sim/scenarios.toml"
    );
    toml::from_str(&std::fs::read_to_string(path).expect("scenario file")).expect("valid matrix")
}

fn scenario<'a>(m: &'a Matrix, name: &str) -> &'a rollgate_sim::Scenario {
    m.scenarios
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("scenario {name}"))
}

#[test]
fn a_failing_bot_in_the_first_canary_step_does_not_roll_back_an_identical_candidate() {
    let m = matrix();
    let first_step_bp = m.plan.steps[0] * 100;
    for name in ["conc-bot-20pct-fail-30pct", "conc-bot-5pct-fail-30pct"] {
        let s = m
            .scenarios
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("scenario {name}"));
        // The first seeds whose bot the candidate serves from its first step.
        let seeds: Vec<u64> = (0..2_000)
            .filter(|&seed| bot_bucket(s.keys, seed) < first_step_bp)
            .take(3)
            .collect();
        assert_eq!(
            seeds.len(),
            3,
            "{name}: too few seeds with the bot in the canary"
        );
        for seed in seeds {
            let r = simulate(&m.plan, s, seed);
            assert!(
                !matches!(
                    &r.phase,
                    Phase::RolledBack {
                        reason: RollbackReason::AnytimeBreach { .. }
                    }
                ),
                "{name}, seed {seed}: {:?}",
                r.phase
            );
        }
    }
}

/// A 12-key model, sticky: a stage holding one or two keys cannot tell a
/// bad candidate from a bad user, so it may not pass — a candidate
/// failing half its requests is never promoted (it is rolled back, or
/// fails safe at a stage's deadline).
#[test]
fn a_stage_holding_few_keys_never_passes_a_failing_candidate() {
    let m = matrix();
    let s = scenario(&m, "conc-12-keys-sticky-50pct-failing");
    for seed in 0..12 {
        let r = simulate(&m.plan, s, seed);
        assert!(
            !matches!(r.phase, Phase::Promoted { .. }),
            "seed {seed}: {:?}",
            r.phase
        );
    }
}

/// The same 12-key model with an identical candidate: a 5% stage holds
/// about 0.6 keys and can never reach the per-key floor, so the rollout
/// says so and fails safe once the stage's minimum duration is over —
/// not ten minutes later at its evidence deadline — naming the keys it
/// estimated and the stage's weight, without rejecting the candidate.
#[test]
fn a_stage_that_cannot_hold_enough_keys_fails_fast_and_says_why() {
    let m = matrix();
    let s = scenario(&m, "conc-12-keys-sticky");
    let plan = s.plan(&m.plan);
    for seed in 0..12 {
        let r = simulate(&m.plan, s, seed);
        let Phase::RolledBack { reason } = &r.phase else {
            panic!("seed {seed}: {:?}", r.phase);
        };
        let RollbackReason::TooFewKeys {
            keys,
            weight_percent,
        } = reason
        else {
            panic!("seed {seed}: {reason:?}");
        };
        assert_eq!(*weight_percent, m.plan.steps[0], "seed {seed}");
        assert!(
            (6..=24).contains(keys),
            "seed {seed}: estimated {keys} keys"
        );
        let min = plan.min_stage_duration.as_secs_f64();
        assert!(
            r.seconds >= min && r.seconds < min + 5.0,
            "seed {seed}: decided at {} s",
            r.seconds
        );
        assert!(!reason.rejects(&plan), "seed {seed}: candidate rejected");
    }
}

/// Many keys with heavy volumes and little traffic look, early on, like a
/// model with few keys (a few keys send most requests); rollgate must not
/// fail such a model's stages as `too_few_keys`.
#[test]
fn a_model_with_many_heavy_tailed_keys_is_not_taken_for_a_few_key_one() {
    let m = matrix();
    let s = scenario(&m, "conc-sigma4-1000-keys-10rps");
    for seed in 0..12 {
        let r = simulate(&m.plan, s, seed);
        assert!(
            !matches!(
                &r.phase,
                Phase::RolledBack {
                    reason: RollbackReason::TooFewKeys { .. }
                }
            ),
            "seed {seed}: {:?}",
            r.phase
        );
    }
}
