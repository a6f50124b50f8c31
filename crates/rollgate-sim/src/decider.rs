//! Who decides a simulated rollout from what the gateways report:
//! rollgate's own state machine, or (in `baseline.rs`) another system's
//! published rules.

use std::time::Duration;

use rollgate_core::{
    AuditEvent, Effect, Exposure, Input, Observation, Phase, Plan, RolloutSpec, RolloutState,
    Routing, SeriesReport, Snapshot, Timestamp, step,
};

use crate::scenario::{CANDIDATE, CHAMPION};

/// Decides a rollout from what the gateways report: rollgate's state
/// machine, or a baseline rebuilt from another system's published rules.
pub trait Decider {
    /// One look at `now`: the routing to apply, the phase, and audit records.
    fn observe(
        &mut self,
        exposure: &Exposure,
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

impl CoreDecider {
    /// The rollout as the state machine left it (what `rollout status`
    /// reads).
    pub fn rollout(&self) -> (&RolloutSpec, &RolloutState) {
        (&self.spec, &self.state)
    }
}

impl Decider for CoreDecider {
    fn observe(
        &mut self,
        exposure: &Exposure,
        now: Duration,
    ) -> (Option<Routing>, Phase, Vec<AuditEvent>) {
        let obs = Observation {
            candidate_ready: true,
            exposure: Some(exposure.clone()),
            // The simulated gateways count by epoch of arrival.
            routing_applied: None,
            labels: None,
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
                Effect::PromoteCandidate | Effect::RejectCandidate | Effect::RestoreChampion => {}
            }
        }
        self.state = t.state;
        (routing, self.state.phase.clone(), audit)
    }

    fn evaluations(&self) -> u64 {
        self.state.evaluations
    }
}

/// Every series' counts pooled into one snapshot, for deciders that do not
/// split by series or epoch (the baselines).
pub fn pooled(exposure: &Exposure) -> Snapshot {
    let mut out = Snapshot::default();
    for r in exposure.series.values() {
        match r {
            SeriesReport::Epochs { epochs } => epochs.values().for_each(|s| out.merge(s)),
            SeriesReport::Pooled { total } => out.merge(total),
        }
    }
    out
}
