//! The controller's own Prometheus metrics: rollouts by phase, evaluations,
//! rollbacks by reason.

use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use rollgate_store::RolloutRecord;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabel {
    phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

pub struct ControllerMetrics {
    registry: Mutex<Registry>,
    active: Family<PhaseLabel, Gauge>,
    evaluations: Counter,
    rollbacks: Family<ReasonLabel, Counter>,
    leader: Gauge,
}

impl std::fmt::Debug for ControllerMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControllerMetrics").finish_non_exhaustive()
    }
}

impl Default for ControllerMetrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let active = Family::<PhaseLabel, Gauge>::default();
        let evaluations = Counter::default();
        let rollbacks = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "rollgate_rollouts_active",
            "Active rollouts by phase.",
            active.clone(),
        );
        registry.register(
            "rollgate_evaluations",
            "Stage evaluations committed.",
            evaluations.clone(),
        );
        registry.register(
            "rollgate_rollbacks",
            "Rollbacks by reason.",
            rollbacks.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "rollgate_controller_leader",
            "1 while this controller holds the lease and reconciles, 0 while it stands by.",
            leader.clone(),
        );
        ControllerMetrics {
            registry: Mutex::new(registry),
            active,
            evaluations,
            rollbacks,
            leader,
        }
    }
}

impl ControllerMetrics {
    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    pub fn evaluation(&self) {
        self.evaluations.inc();
    }

    pub fn rollback(&self, reason: &str) {
        self.rollbacks
            .get_or_create(&ReasonLabel {
                reason: reason.to_string(),
            })
            .inc();
    }

    pub fn set_active(&self, rollouts: &[RolloutRecord]) {
        for phase in ["PENDING", "SHADOW", "CANARY"] {
            let n = rollouts
                .iter()
                .filter(|r| r.state.phase.name() == phase)
                .count();
            self.active
                .get_or_create(&PhaseLabel {
                    phase: phase.into(),
                })
                .set(n as i64);
        }
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        if prometheus_client::encoding::text::encode(&mut out, &registry).is_err() {
            out.clear();
        }
        out
    }
}
