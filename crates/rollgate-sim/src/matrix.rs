//! Runs scenarios × policies × seeds and summarises the outcomes: the
//! decision-quality simulator behind `rollgate sim`.

use rollgate_core::{Advance, Plan, Policy};
use serde::{Deserialize, Serialize};

use crate::baseline::Baseline;
use crate::{CoreDecider, Decider, Expect, Scenario, SimResult, Traffic, simulate_with};

/// Who decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyKind {
    Sequential,
    /// `sequential` with `advance = "on_evidence"`.
    SequentialEvidence,
    Windowed,
    Absolute,
    PointEstimate,
}

impl PolicyKind {
    pub const ALL: [PolicyKind; 5] = [
        PolicyKind::Sequential,
        PolicyKind::SequentialEvidence,
        PolicyKind::Windowed,
        PolicyKind::Absolute,
        PolicyKind::PointEstimate,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Sequential => "sequential",
            PolicyKind::SequentialEvidence => "sequential-evidence",
            PolicyKind::Windowed => "windowed",
            PolicyKind::Absolute => "absolute",
            PolicyKind::PointEstimate => "point-estimate",
        }
    }

    fn decider(self, plan: &Plan) -> Box<dyn Decider> {
        match self {
            PolicyKind::Sequential | PolicyKind::SequentialEvidence | PolicyKind::Windowed => {
                let mut p = plan.clone();
                p.policy = if self == PolicyKind::Windowed {
                    Policy::Windowed
                } else {
                    Policy::Sequential
                };
                if self == PolicyKind::SequentialEvidence {
                    p.sequential.advance = Advance::OnEvidence;
                }
                Box::new(CoreDecider::new(&p))
            }
            PolicyKind::Absolute => Box::new(Baseline::absolute()),
            PolicyKind::PointEstimate => Box::new(Baseline::point_estimate()),
        }
    }
}

/// One cell of the matrix.
#[derive(Debug, Clone, Serialize)]
pub struct CellReport {
    pub scenario: String,
    pub expect: Expect,
    pub policy: &'static str,
    pub runs: u64,
    pub promoted: u64,
    /// Rolled back because a gate showed a breach.
    pub rolled_back_breach: u64,
    /// Rolled back for lack of evidence or metrics.
    pub rolled_back_other: u64,
    pub unfinished: u64,
    /// Wrong decisions for the scenario's expectation (for `promote`: false
    /// regression rollbacks), with a 95% Wilson interval.
    pub wrong: u64,
    pub wrong_rate: f64,
    pub wrong_rate_ci: (f64, f64),
    /// Medians over runs that reached a decision.
    pub median_seconds: Option<f64>,
    pub median_candidate_requests: Option<f64>,
    /// Runs in which the candidate served any live request.
    pub live_exposed: u64,
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[v.len() / 2])
}

/// Rolled back because a gate showed a breach.
fn breach(r: &SimResult) -> bool {
    matches!(&r.phase, rollgate_core::Phase::RolledBack { reason } if reason.is_breach())
}

fn wrong(expect: Expect, r: &SimResult) -> bool {
    use rollgate_core::Phase::*;
    match expect {
        Expect::Promote => breach(r),
        Expect::Stop | Expect::NoPromote => matches!(r.phase, Promoted { .. }),
        Expect::Hold => matches!(r.phase, Promoted { .. } | RolledBack { .. }),
    }
}

/// Runs `runs` seeds of one cell on `threads` threads; `tick` is called after
/// each run (for a progress bar).
pub fn run_cell(
    plan: &Plan,
    scenario: &Scenario,
    policy: PolicyKind,
    runs: u64,
    threads: usize,
    tick: &(dyn Fn() + Sync),
) -> CellReport {
    let threads = threads.max(1) as u64;
    let plan = &scenario.plan(plan);
    let traffic = &Traffic::new(scenario);
    let results: Vec<SimResult> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    (0..runs)
                        .filter(|i| i % threads == t)
                        .map(|i| {
                            let mut d = policy.decider(plan);
                            let mut r = simulate_with(d.as_mut(), traffic, 1_000_003 * (i + 1));
                            // The summary needs outcomes, not every run's audit log
                            // (2,000 runs × 115 cells of them would hold gigabytes).
                            r.audit = Vec::new();
                            tick();
                            r
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_default())
            .collect()
    });
    use rollgate_core::Phase::*;
    let count = |f: &dyn Fn(&SimResult) -> bool| results.iter().filter(|r| f(r)).count() as u64;
    let decided: Vec<&SimResult> = results.iter().filter(|r| r.phase.is_terminal()).collect();
    let n = results.len() as u64;
    let w = count(&|r| wrong(scenario.expect, r));
    let ci = rollgate_core::stats::wilson(w, n, rollgate_core::stats::z_two_sided(0.05));
    CellReport {
        scenario: scenario.name.clone(),
        expect: scenario.expect,
        policy: policy.name(),
        runs: n,
        promoted: count(&|r| matches!(r.phase, Promoted { .. })),
        rolled_back_breach: count(&breach),
        rolled_back_other: count(&|r| matches!(r.phase, RolledBack { .. }) && !breach(r)),
        unfinished: count(&|r| !r.phase.is_terminal()),
        wrong: w,
        wrong_rate: if n == 0 { 0.0 } else { w as f64 / n as f64 },
        wrong_rate_ci: (ci.lower, ci.upper),
        median_seconds: median(decided.iter().map(|r| r.seconds).collect()),
        median_candidate_requests: median(
            decided
                .iter()
                .map(|r| (r.candidate_live_requests + r.candidate_mirrored_requests) as f64)
                .collect(),
        ),
        live_exposed: count(&|r| r.candidate_live_requests > 0),
    }
}

/// A scenario file: a plan for rollgate's policies and the scenarios.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Matrix {
    pub plan: Plan,
    pub scenarios: Vec<Scenario>,
}
