//! `rollgate demo --simulated`: the demo's three rollouts decided by the
//! real gates and state machine on traffic simulated in-process by
//! `rollgate-sim` (seeded Poisson arrivals, sticky keys, per-arm failures and
//! latency, paired answers). No sockets; runs in a second.

use std::process::ExitCode;
use std::time::Duration;

use rollgate_core::{AuditKind, Phase, Plan};
use rollgate_sim::{ArmModel, Scenario, SimResult, simulate};

use rollgate_core::words;

struct Case {
    scenario: Scenario,
    plan: Plan,
    expect: fn(&Phase) -> bool,
    story: &'static str,
}

fn demo_plan() -> Plan {
    Plan {
        min_stage_duration: Duration::from_secs(10),
        evidence_timeout: Duration::from_secs(120),
        ..Plan::default()
    }
}

fn cases(rps: f64) -> Vec<Case> {
    let base = Scenario::identical("", rps);
    let mut no_shadow = demo_plan();
    no_shadow.shadow.enabled = false;
    vec![
        Case {
            scenario: Scenario {
                name: "retrained".into(),
                candidate: ArmModel {
                    median_ms: 21.0,
                    ..ArmModel::HEALTHY
                },
                flip_rate: 0.005,
                unconfident_disagreement: 0.03,
                ..base.clone()
            },
            plan: demo_plan(),
            expect: |p| matches!(p, Phase::Promoted { .. }),
            story: "same recipe, new seed: a healthy new version",
        },
        Case {
            scenario: Scenario {
                name: "broken-feature".into(),
                flip_rate: 0.124,
                unconfident_disagreement: 0.25,
                ..base.clone()
            },
            plan: demo_plan(),
            expect: |p| matches!(p, Phase::RolledBack { .. }),
            story: "one informative feature dead: fast, well-formed, and different",
        },
        Case {
            scenario: Scenario {
                name: "ready-then-503".into(),
                candidate: ArmModel {
                    failure: 1.0,
                    ..ArmModel::HEALTHY
                },
                ..base
            },
            plan: no_shadow,
            expect: |p| matches!(p, Phase::RolledBack { .. }),
            story: "passes readiness, then answers 503 to every prediction (no shadow stage)",
        },
    ]
}

fn print_result(r: &SimResult, story: &str) {
    println!("\n== {} — {story}", r.scenario);
    for t in &r.audit {
        let e = &t.event;
        match e.kind {
            AuditKind::Started | AuditKind::Advanced => {
                println!(
                    "  t={:>5.0}s  {} -> {}",
                    t.at_s,
                    phase_label(&e.from),
                    phase_label(&e.to)
                )
            }
            AuditKind::Promoted | AuditKind::RolledBack => {
                println!("  t={:>5.0}s  {}", t.at_s, words::phase_line(&e.to));
                if let Some(v) = &e.verdict {
                    println!(
                        "  evidence at {} ({} s into the stage):",
                        phase_label(&e.from),
                        v.elapsed_ms / 1000
                    );
                    for line in words::verdict_lines(v) {
                        println!("    {line}");
                    }
                }
            }
            _ => {}
        }
    }
    println!(
        "  candidate exposure: {} live requests, {} mirrored; {} evaluations, all in the audit trail",
        r.candidate_live_requests, r.candidate_mirrored_requests, r.evaluations
    );
}

fn phase_label(p: &Phase) -> String {
    match p {
        Phase::Canary { weight_percent, .. } => format!("CANARY {weight_percent}%"),
        other => other.name().to_string(),
    }
}

/// Three rollouts over simulated traffic at `rps`, seeded by `seed`.
pub fn run(rps: f64, seed: u64) -> anyhow::Result<ExitCode> {
    println!(
        "rollgate demo: three rollouts at {} rps of simulated traffic (seed {}), plan: shadow, then 5/25/50%, 10 s minimum per stage",
        rps, seed
    );
    let mut all_as_expected = true;
    for case in cases(rps) {
        case.plan.validate()?;
        let r = simulate(&case.plan, &case.scenario, seed);
        print_result(&r, case.story);
        if !(case.expect)(&r.phase) {
            all_as_expected = false;
            println!("  !! unexpected outcome");
        }
    }
    Ok(if all_as_expected {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
