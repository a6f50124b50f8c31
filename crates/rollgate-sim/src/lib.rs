//! Synthetic traffic for rollgate's real state machine and gates.
//!
//! A seeded, deterministic stand-in for the gateway: Poisson arrivals,
//! sticky keys hashed into buckets, per-arm failure probability, lognormal
//! latency, and paired answers with a chosen disagreement and
//! high-confidence-flip rate. It records exactly what a gateway records
//! (a cumulative [`Snapshot`]) and feeds it to [`rollgate_core::step`] once a
//! tick, applying the routing effects it returns. No clock, no network.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, LogNormal, Poisson};
use rollgate_core::{
    AuditEvent, Effect, FailureClass, Input, Observation, Phase, Plan, RolloutSpec, RolloutState,
    Routing, Snapshot, Timestamp, step,
};
use serde::{Deserialize, Serialize};

pub mod baseline;
pub mod matrix;

pub const CHAMPION: &str = "champion";
pub const CANDIDATE: &str = "candidate";

/// How one revision behaves.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ArmModel {
    /// Probability that a request fails (5xx).
    pub failure: f64,
    /// Median latency of successes, in milliseconds (lognormal).
    pub median_ms: f64,
    /// Lognormal shape: the spread of latency.
    pub sigma: f64,
}

impl Default for ArmModel {
    fn default() -> Self {
        ArmModel::HEALTHY
    }
}

impl Default for Scenario {
    fn default() -> Self {
        Scenario::identical("unnamed", 100.0)
    }
}

impl ArmModel {
    pub const HEALTHY: ArmModel = ArmModel {
        failure: 0.0,
        median_ms: 20.0,
        sigma: 0.25,
    };
}

/// What a correct gate does with a scenario.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Expect {
    /// The candidate is no worse: a breach rollback is a false rollback
    /// (starving for evidence is reported apart: it is fail-safe, not wrong).
    #[default]
    Promote,
    /// The candidate is worse: promoting it is wrong.
    Stop,
    /// Not enough evidence (traffic stops): promoting is wrong, a fail-safe
    /// rollback is right.
    NoPromote,
    /// A shared outage: promoting or rolling back are both wrong.
    Hold,
}

/// A rollout scenario: traffic, both arms, and how the candidate's answers
/// relate to the champion's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    #[serde(default)]
    pub expect: Expect,
    /// Mean arrivals per second (Poisson).
    pub rps: f64,
    pub champion: ArmModel,
    pub candidate: ArmModel,
    /// Share of requests on which the champion is highly confident.
    pub confident_share: f64,
    /// P(candidate disagrees | champion confident): high-confidence flips.
    pub flip_rate: f64,
    /// P(candidate disagrees | champion not confident).
    pub unconfident_disagreement: f64,
    /// Seconds `[from, to)` during which both arms fail every request.
    pub shared_outage: Option<(u64, u64)>,
    /// From this second on, no traffic arrives.
    pub traffic_stops_at: Option<u64>,
    /// Distinct request keys (users); assignment is sticky per key.
    pub keys: u64,
    /// Controller evaluation interval.
    #[serde(with = "humantime_serde")]
    pub tick: Duration,
    /// Give up after this long (the result is then unfinished).
    #[serde(with = "humantime_serde")]
    pub max_duration: Duration,
}

impl Scenario {
    /// An identical candidate at `rps`: same arm, same answers.
    pub fn identical(name: &str, rps: f64) -> Scenario {
        Scenario {
            name: name.to_string(),
            expect: Expect::Promote,
            rps,
            champion: ArmModel::HEALTHY,
            candidate: ArmModel::HEALTHY,
            confident_share: 0.5,
            flip_rate: 0.0,
            unconfident_disagreement: 0.0,
            shared_outage: None,
            traffic_stops_at: None,
            keys: 10_000,
            tick: Duration::from_secs(1),
            max_duration: Duration::from_secs(3600),
        }
    }
}

/// How a simulated rollout ended.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SimResult {
    pub scenario: String,
    pub seed: u64,
    /// The final phase (not terminal if `max_duration` ran out).
    pub phase: Phase,
    /// Simulated time from start to the final phase.
    pub seconds: f64,
    /// Live requests the candidate served (its exposure).
    pub candidate_live_requests: u64,
    /// Mirrored requests the candidate answered in the shadow stage.
    pub candidate_mirrored_requests: u64,
    pub evaluations: u64,
    /// Every audit record the rollout produced, in order.
    pub audit: Vec<TimedEvent>,
}

/// An audit record and the simulated second it was written at.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TimedEvent {
    pub at_s: f64,
    pub event: AuditEvent,
}

/// SplitMix64: a fixed, well-mixed stand-in for the gateway's salted key
/// hash, so that assignment is sticky per key.
fn bucket(key: u64, salt: u64) -> u32 {
    let mut z = key ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ((z ^ (z >> 31)) % 10_000) as u32
}

struct Arm {
    model: ArmModel,
    latency: LogNormal<f64>,
}

impl Arm {
    fn new(model: ArmModel) -> Arm {
        let median_us = (model.median_ms * 1000.0).max(1.0);
        // sigma is a positive finite constant in every scenario we build; a
        // bad one degrades to a point mass rather than panicking.
        let latency = LogNormal::new(median_us.ln(), model.sigma.max(1e-9))
            .unwrap_or_else(|_| LogNormal::new(median_us.ln(), 1e-9).expect("tiny sigma is valid"));
        Arm { model, latency }
    }
}

/// Runs one rollout of `scenario` under `plan` (its own policy),
/// deterministically for `seed`.
pub fn simulate(plan: &Plan, scenario: &Scenario, seed: u64) -> SimResult {
    simulate_with(&mut CoreDecider::new(plan), scenario, seed)
}

/// Decides a rollout from cumulative snapshots: rollgate's state machine,
/// or a baseline rebuilt from another system's published rules.
pub trait Decider {
    /// One look at `now`: the routing to apply, the phase, and audit records.
    fn observe(
        &mut self,
        snapshot: &Snapshot,
        now: Duration,
    ) -> (Option<Routing>, Phase, Vec<AuditEvent>);
    fn evaluations(&self) -> u64;
}

/// rollgate's own state machine and gates (either policy).
#[derive(Debug)]
pub struct CoreDecider {
    spec: RolloutSpec,
    state: RolloutState,
}

impl CoreDecider {
    pub fn new(plan: &Plan) -> CoreDecider {
        CoreDecider {
            spec: RolloutSpec {
                model: "sim".into(),
                champion: CHAMPION.into(),
                candidate: CANDIDATE.into(),
                plan: plan.clone(),
            },
            state: RolloutState::new(Timestamp(0)),
        }
    }
}

impl Decider for CoreDecider {
    fn observe(
        &mut self,
        snapshot: &Snapshot,
        now: Duration,
    ) -> (Option<Routing>, Phase, Vec<AuditEvent>) {
        let obs = Observation {
            candidate_ready: true,
            snapshot: Some(snapshot.clone()),
        };
        let Ok(t) = step(
            &self.spec,
            &self.state,
            Input::Observe(obs),
            Timestamp(now.as_millis() as u64),
        ) else {
            // Observations never err; report no change rather than loop.
            return (None, self.state.phase.clone(), vec![]);
        };
        let mut routing = None;
        let mut audit = Vec::new();
        for e in t.effects {
            match e {
                Effect::SetRouting { routing: r } => routing = Some(r),
                Effect::Audit { event } => audit.push(*event),
                Effect::PromoteCandidate | Effect::RejectCandidate => {}
            }
        }
        self.state = t.state;
        (routing, self.state.phase.clone(), audit)
    }

    fn evaluations(&self) -> u64 {
        self.state.evaluations
    }
}

/// Runs one rollout of `scenario` with `decider`, deterministically for `seed`.
pub fn simulate_with(decider: &mut dyn Decider, scenario: &Scenario, seed: u64) -> SimResult {
    let mut rng = StdRng::seed_from_u64(seed);
    let champion = Arm::new(scenario.champion);
    let candidate = Arm::new(scenario.candidate);
    let tick_s = scenario.tick.as_secs_f64();
    let arrivals = Poisson::new((scenario.rps * tick_s).max(1e-9)).ok();
    let salt = seed;

    let mut snapshot = Snapshot::default();
    let mut routing = Routing::CHAMPION_ONLY;
    let mut phase = Phase::Pending;
    let mut audit = Vec::new();
    let (mut live, mut mirrored) = (0u64, 0u64);
    let mut now = Duration::ZERO;

    while now < scenario.max_duration && !phase.is_terminal() {
        now += scenario.tick;
        let second = now.as_secs();
        let stopped = scenario.traffic_stops_at.is_some_and(|t| second >= t);
        let outage = scenario
            .shared_outage
            .is_some_and(|(from, to)| (from..to).contains(&second));
        let n = if stopped {
            0
        } else {
            arrivals.as_ref().map_or(0, |p| p.sample(&mut rng) as u64)
        };
        for _ in 0..n {
            let key = rng.random_range(0..scenario.keys.max(1));
            let to_candidate = bucket(key, salt) < routing.candidate_weight_bp;
            let confident = rng.random_bool(scenario.confident_share.clamp(0.0, 1.0));
            if to_candidate {
                live += 1;
                serve(&mut rng, &mut snapshot, CANDIDATE, &candidate, outage);
                continue;
            }
            let champion_ok = serve(&mut rng, &mut snapshot, CHAMPION, &champion, outage);
            if rng.random_range(0..10_000) < routing.mirror_bp {
                mirrored += 1;
                let shadow_ok = serve(&mut rng, &mut snapshot, CANDIDATE, &candidate, outage);
                if champion_ok && shadow_ok {
                    let p_disagree = if confident {
                        scenario.flip_rate
                    } else {
                        scenario.unconfident_disagreement
                    };
                    let agreed = !rng.random_bool(p_disagree.clamp(0.0, 1.0));
                    snapshot.pairs_mut(CANDIDATE).record_pair(agreed, confident);
                }
            }
        }
        let (r, p, events) = decider.observe(&snapshot, now);
        if let Some(r) = r {
            routing = r;
        }
        phase = p;
        audit.extend(events.into_iter().map(|event| TimedEvent {
            at_s: now.as_secs_f64(),
            event,
        }));
    }
    SimResult {
        scenario: scenario.name.clone(),
        seed,
        phase,
        seconds: now.as_secs_f64(),
        candidate_live_requests: live,
        candidate_mirrored_requests: mirrored,
        evaluations: decider.evaluations(),
        audit,
    }
}

/// Serves one request on `arm`, recording it; returns whether it succeeded.
fn serve(rng: &mut StdRng, snapshot: &mut Snapshot, rev: &str, arm: &Arm, outage: bool) -> bool {
    if outage || rng.random_bool(arm.model.failure.clamp(0.0, 1.0)) {
        snapshot
            .revision_mut(rev)
            .record_failure(FailureClass::Upstream5xx);
        return false;
    }
    let us = arm.latency.sample(rng).max(1.0) as u64;
    let class = if rng.random_bool(0.3) { "fraud" } else { "ok" };
    snapshot.revision_mut(rev).record_success(us, [class]);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn sticky_buckets_are_stable_and_spread() {
        assert_eq!(bucket(42, 7), bucket(42, 7));
        let below: usize = (0..10_000u64).filter(|&k| bucket(k, 7) < 1000).count();
        assert!((800..1200).contains(&below), "{below}");
    }
}
