//! Baselines rebuilt from published rules of other systems, to measure
//! rollgate against (shared/STATISTICS.md, "what the field gets wrong"):
//!
//! - [`Baseline::absolute`]: fixed thresholds on the candidate alone — error
//!   rate above 1% after at least 20 requests, or p95 above 500 ms, fails at
//!   once; 60 s steps of 10/25/50/100%; a step that ends with fewer than 20
//!   candidate requests fails (no data counted as failure).
//! - [`Baseline::point_estimate`]: error rate above 2% or p95 above 500 ms on
//!   point estimates once the candidate has 50 samples; same steps, no floor
//!   at the end of a step.
//!
//! Both are checked once per simulated tick (the published point-estimate
//! rule checks after every request, which only adds looks: the false
//! rollback rates measured here are lower bounds for it).

use std::time::Duration;

use rollgate_core::{
    AuditEvent, Exposure, GateKind, Phase, RevisionStats, RollbackReason, Routing, Snapshot,
};

use crate::{CANDIDATE, Decider};

/// A candidate-only, point-estimate rollout.
#[derive(Debug, Clone)]
pub struct Baseline {
    max_error_rate: f64,
    min_requests: u64,
    max_p95_ms: f64,
    steps: Vec<u32>,
    step_duration: Duration,
    /// A step ending below `min_requests` candidate requests fails.
    starved_fails: bool,
    step: usize,
    step_started: Duration,
    /// The candidate's cumulative stats when the step started: the rules
    /// read the candidate alone.
    step_baseline: RevisionStats,
    /// Candidate requests in the step at the last look: a look with none
    /// new has nothing new to judge.
    judged: Option<u64>,
    evaluations: u64,
    phase: Phase,
}

impl Baseline {
    fn new(max_error_rate: f64, min_requests: u64, starved_fails: bool) -> Baseline {
        Baseline {
            max_error_rate,
            min_requests,
            max_p95_ms: 500.0,
            steps: vec![10, 25, 50, 100],
            step_duration: Duration::from_secs(60),
            starved_fails,
            step: 0,
            step_started: Duration::ZERO,
            step_baseline: RevisionStats::default(),
            judged: None,
            evaluations: 0,
            phase: Phase::Pending,
        }
    }

    /// Flagger/Argo-style absolute thresholds.
    pub fn absolute() -> Baseline {
        Baseline::new(0.01, 20, true)
    }

    /// Point estimates after 50 samples.
    pub fn point_estimate() -> Baseline {
        Baseline::new(0.02, 50, false)
    }

    fn routing(&self) -> Routing {
        Routing {
            candidate_weight_bp: self.steps[self.step] * 100,
            mirror_bp: 0,
            epoch: 0,
            assignment: Default::default(),
            fallback_to_champion: false,
        }
    }

    fn start_step(&mut self, snapshot: &Snapshot, now: Duration) {
        self.step_started = now;
        self.step_baseline = snapshot.revision(CANDIDATE).clone();
        self.judged = None;
    }

    fn canary(&self) -> Phase {
        Phase::Canary {
            step: self.step,
            weight_percent: self.steps[self.step],
        }
    }
}

impl Decider for Baseline {
    fn observe(
        &mut self,
        exposure: &Exposure,
        now: Duration,
    ) -> (Option<Routing>, Phase, Vec<AuditEvent>) {
        let snapshot = &crate::pooled(exposure);
        if self.phase.is_terminal() {
            return (None, self.phase.clone(), vec![]);
        }
        if self.phase == Phase::Pending {
            self.phase = self.canary();
            self.start_step(snapshot, now);
            return (Some(self.routing()), self.phase.clone(), vec![]);
        }
        self.evaluations += 1;
        let now_c = snapshot.revision(CANDIDATE);
        let requests = now_c
            .requests()
            .saturating_sub(self.step_baseline.requests());
        let enough = requests >= self.min_requests;
        let mut breached = Vec::new();
        if self.judged != Some(requests) {
            self.judged = Some(requests);
            let c = now_c
                .window_since(&self.step_baseline, &CANDIDATE)
                .unwrap_or_default();
            let error = c.error_rate().unwrap_or(0.0);
            let p95_ms = c
                .latency()
                .percentile_us(0.95)
                .map_or(0.0, |us| us as f64 / 1000.0);
            if enough && error > self.max_error_rate {
                breached.push(GateKind::ErrorRate);
            }
            if enough && p95_ms > self.max_p95_ms {
                breached.push(GateKind::Latency);
            }
        }
        if !breached.is_empty() {
            self.phase = Phase::RolledBack {
                reason: RollbackReason::Breach {
                    gates: breached,
                    confirmations: 1,
                },
            };
            return (Some(Routing::CHAMPION_ONLY), self.phase.clone(), vec![]);
        }
        if now.saturating_sub(self.step_started) < self.step_duration {
            return (None, self.phase.clone(), vec![]);
        }
        if !enough && self.starved_fails {
            self.phase = Phase::RolledBack {
                reason: RollbackReason::EvidenceTimeout {
                    gates: vec![GateKind::ErrorRate],
                },
            };
            return (Some(Routing::CHAMPION_ONLY), self.phase.clone(), vec![]);
        }
        if self.step + 1 >= self.steps.len() {
            self.phase = Phase::Promoted { manual: false };
            return (None, self.phase.clone(), vec![]);
        }
        self.step += 1;
        self.phase = self.canary();
        self.start_step(snapshot, now);
        (Some(self.routing()), self.phase.clone(), vec![])
    }

    fn evaluations(&self) -> u64 {
        self.evaluations
    }
}
