//! Evidence that matches the exposure, on the committed scenarios in a
//! reduced form (`bench/sim/scenarios.toml`; full runs: bench/results). The
//! assertions are the safety properties: identical arms are never rolled
//! back for a breach whatever the requests' timing, the gateways' restarts
//! and flaps or a shared drift do; an outage that starts late holds and
//! then promotes; a candidate that fails right after an outage is caught
//! within seconds of its end.

use rollgate_core::{Phase, RollbackReason};
use rollgate_sim::matrix::{Matrix, PolicyKind, run_cell};
use rollgate_sim::{Scenario, simulate};

fn matrix() -> Matrix {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../bench/sim/scenarios.toml"
    );
    toml::from_str(&std::fs::read_to_string(path).expect("scenario file")).expect("valid matrix")
}

fn scenario<'a>(m: &'a Matrix, name: &str) -> &'a Scenario {
    m.scenarios
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("scenario {name}"))
}

#[test]
fn identical_arms_are_never_rolled_back_whatever_the_exposure_does() {
    let m = matrix();
    for (name, runs) in [
        ("timeouts-0.5pct-200rps-shadow", 12),
        ("timeouts-0.1pct-1000rps-shadow", 4),
        ("slow-model-fast-failures", 12),
        ("fast-failures-vs-timeouts", 12),
        ("outage-at-routing-change", 12),
        ("gateways-4-flap-30s", 12),
        ("gateway-restart-mid-stage", 12),
        ("ramp-drift-20-400ms-no-shadow", 8),
        ("shared-step-20-100ms-no-shadow", 12),
        ("scraped-identical-100rps-0.5pct", 8),
        ("scraped-timeouts-0.5pct-100rps", 8),
        ("scraped-identical-target-restarts", 8),
        ("scraped-identical-stale-2min", 8),
    ] {
        let r = run_cell(
            &m.plan,
            scenario(&m, name),
            PolicyKind::Sequential,
            runs,
            2,
            &|| {},
        );
        assert_eq!(r.rolled_back_breach, 0, "{name}: {r:?}");
        assert_eq!(r.promoted, runs, "{name}: {r:?}");
    }
    // The windowed policy judges each stage on its own epoch: late SHADOW
    // timeouts never land in the 5% window.
    let r = run_cell(
        &m.plan,
        scenario(&m, "timeouts-0.5pct-200rps-shadow"),
        PolicyKind::Windowed,
        12,
        2,
        &|| {},
    );
    assert_eq!(r.rolled_back_breach, 0, "windowed: {r:?}");
}

/// A scrape target removed for good, or Prometheus paused: no stage passes
/// once the newest sample of a series the look reads is more than two
/// scrape intervals old, the looks say `evidence_stale`, and the rollout
/// fails safe at its deadline — never promoted.
#[test]
fn no_stage_passes_on_a_series_that_stopped() {
    let m = matrix();
    for name in [
        "scraped-candidate-target-vanishes",
        "scraped-prometheus-paused",
    ] {
        let s = scenario(&m, name);
        let scrape = s.scrape.as_ref().expect("scraped");
        let (stopped, _) = scrape.stale.or(scrape.paused).expect("a series stops");
        // The last scrape is at most one interval before `stopped`; a look
        // a tick after two intervals past it sees the series stale.
        let stale_by = stopped as f64 + 2.0 * scrape.interval.as_secs_f64() + 1.0;
        for seed in 0..6 {
            let r = simulate(&m.plan, s, seed);
            assert!(
                matches!(
                    r.phase,
                    Phase::RolledBack {
                        reason: RollbackReason::EvidenceTimeout { .. }
                    }
                ),
                "{name} seed {seed}: {:?}",
                r.phase
            );
            for e in &r.audit {
                let passed = matches!(
                    e.event.kind,
                    rollgate_core::AuditKind::Advanced | rollgate_core::AuditKind::Promoted
                );
                assert!(
                    !(passed && e.at_s > stale_by),
                    "{name} seed {seed}: {:?} at {} s, the series stopped at {stopped} s",
                    e.event.kind,
                    e.at_s
                );
            }
            assert!(
                r.audit
                    .iter()
                    .any(|e| e.event.verdict.as_ref().is_some_and(|v| matches!(
                        v.reason,
                        rollgate_core::StageReason::EvidenceStale { .. }
                    ))),
                "{name} seed {seed}: no look said evidence_stale"
            );
        }
    }
}

#[test]
fn an_outage_late_in_a_stage_holds_and_then_promotes() {
    let m = matrix();
    let s = scenario(&m, "outage-late-in-50pct-stage");
    for seed in 0..12 {
        let r = simulate(&m.plan, s, seed);
        assert!(
            matches!(r.phase, Phase::Promoted { .. }),
            "seed {seed}: {:?}",
            r.phase
        );
        // Held while the outage lasted: not promoted before it ended.
        let (_, to) = s.shared_outage.expect("an outage");
        assert!(
            r.seconds >= to as f64,
            "seed {seed}: promoted at {}",
            r.seconds
        );
        // Recognised within 5 s of its start at 100 rps.
        let (from, _) = s.shared_outage.expect("an outage");
        let first_hold = r
            .audit
            .iter()
            .find(|e| {
                e.event
                    .verdict
                    .as_ref()
                    .is_some_and(|v| v.reason == rollgate_core::StageReason::SharedOutage)
            })
            .map(|e| e.at_s);
        assert!(
            first_hold.is_some_and(|t| t >= from as f64 && t <= from as f64 + 5.0),
            "seed {seed}: first shared_outage hold at {first_hold:?}"
        );
    }
}

#[test]
fn a_candidate_failing_after_an_outage_is_rolled_back_within_seconds_of_its_end() {
    let m = matrix();
    let s = scenario(&m, "errors-50pct-after-outage");
    let (_, end) = s.shared_outage.expect("an outage");
    let mut after: Vec<f64> = (0..20)
        .map(|seed| {
            let r = simulate(&m.plan, s, seed);
            assert!(
                matches!(
                    r.phase,
                    Phase::RolledBack {
                        reason: RollbackReason::AnytimeBreach { .. }
                    }
                ),
                "seed {seed}: {:?}",
                r.phase
            );
            r.seconds - end as f64
        })
        .collect();
    after.sort_by(f64::total_cmp);
    assert!(after[10] <= 10.0, "median {} s after the outage", after[10]);
}

#[test]
fn scraped_evidence_stops_a_failing_candidate_a_horizon_and_a_scrape_later() {
    let m = matrix();
    let s = scenario(&m, "scraped-errors-50pct");
    let direct = scenario(&m, "errors-50pct");
    let scrape = s.scrape.as_ref().expect("scraped");
    for seed in 0..8 {
        let r = simulate(&m.plan, s, seed);
        assert!(
            matches!(
                r.phase,
                Phase::RolledBack {
                    reason: RollbackReason::AnytimeBreach { .. }
                        | RollbackReason::GrossBreach { .. }
                }
            ),
            "seed {seed}: {:?}",
            r.phase
        );
        // Through the gateway it is stopped within a second or so; here
        // the first counts come a horizon plus at most two scrapes in.
        let d = simulate(&m.plan, direct, seed);
        let bound = d.seconds + (scrape.horizon + 2 * scrape.interval).as_secs_f64() + 1.0;
        assert!(
            r.seconds <= bound,
            "seed {seed}: {}s scraped, {}s through the gateway",
            r.seconds,
            d.seconds
        );
    }
}
