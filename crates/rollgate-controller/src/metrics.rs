//! The controller's own Prometheus metrics: rollouts by phase, each active
//! rollout's phase and weight by model, evaluations, rollbacks by reason
//! (every reason from zero), leadership and the build.

use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelLabel {
    model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelPhaseLabel {
    model: String,
    phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RegistryLabel {
    registry: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabel {
    version: String,
}

pub struct ControllerMetrics {
    registry: Mutex<Registry>,
    active: Family<PhaseLabel, Gauge>,
    evaluations: Counter,
    rollbacks: Family<ReasonLabel, Counter>,
    leader: Gauge,
    weight: Family<ModelLabel, Gauge>,
    phase: Family<ModelPhaseLabel, Gauge>,
    /// The `(model, phase)` series set last time, to remove those that ended.
    shown: Mutex<Vec<(String, String)>>,
    notifications_sent: Family<ReceiverLabel, Counter>,
    notification_failures: Family<ReceiverLabel, Counter>,
    notifications_behind: Family<ReceiverLabel, Gauge>,
    registry_passes: Family<RegistryLabel, Counter>,
    registry_failures: Family<RegistryLabel, Counter>,
    /// Labels received, by what became of them.
    labels: Family<OutcomeLabel, Counter>,
    pass_seconds: Histogram,
    lag_seconds: Histogram,
    /// The largest look interval of the last pass, for the API's overview.
    last_lag: Mutex<f64>,
}

/// Buckets (seconds) of a pass's duration and of a rollout's look
/// interval: a tick is usually 1 s.
const SECONDS: [f64; 12] = [
    0.05, 0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0,
];

/// The histograms of the controller's cadence: each pass's duration, and
/// the time between two looks at a rollout.
fn cadence(registry: &mut Registry) -> (Histogram, Histogram) {
    let pass_seconds = Histogram::new(SECONDS);
    registry.register(
        "rollgate_controller_pass_seconds",
        "How long each pass over the due rollouts took",
        pass_seconds.clone(),
    );
    let lag_seconds = Histogram::new(SECONDS);
    registry.register(
        "rollgate_controller_rollout_lag_seconds",
        "Time between two looks at a rollout (a tick when the controller keeps up)",
        lag_seconds.clone(),
    );
    (pass_seconds, lag_seconds)
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReceiverLabel {
    receiver: String,
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
            "Active rollouts by phase",
            active.clone(),
        );
        registry.register(
            "rollgate_evaluations",
            "Stage evaluations committed",
            evaluations.clone(),
        );
        registry.register(
            "rollgate_rollbacks",
            "Rollbacks by reason",
            rollbacks.clone(),
        );
        for reason in rollgate_core::RollbackReason::CODES {
            rollbacks
                .get_or_create(&ReasonLabel {
                    reason: reason.into(),
                })
                .inc_by(0);
        }
        let weight = Family::<ModelLabel, Gauge>::default();
        registry.register(
            "rollgate_rollout_weight_percent",
            "The candidate's share of live traffic, by model, while its rollout is active",
            weight.clone(),
        );
        let phase = Family::<ModelPhaseLabel, Gauge>::default();
        registry.register(
            "rollgate_rollout_phase",
            "1 for the phase each model's active rollout is in",
            phase.clone(),
        );
        registry.register(
            "rollgate_build",
            "The running build",
            prometheus_client::metrics::info::Info::new(BuildLabel {
                version: env!("CARGO_PKG_VERSION").into(),
            }),
        );
        let notifications_sent = Family::<ReceiverLabel, Counter>::default();
        registry.register(
            "rollgate_notifications_sent",
            "Notifications a receiver answered with a 2xx",
            notifications_sent.clone(),
        );
        let notification_failures = Family::<ReceiverLabel, Counter>::default();
        registry.register(
            "rollgate_notification_failures",
            "Notification attempts that failed (each is retried)",
            notification_failures.clone(),
        );
        let notifications_behind = Family::<ReceiverLabel, Gauge>::default();
        registry.register(
            "rollgate_notifications_behind",
            "Audit records a receiver has not been sent (or skipped) yet",
            notifications_behind.clone(),
        );
        rollgate_process::register(&mut registry);
        let leader = Gauge::default();
        registry.register(
            "rollgate_controller_leader",
            "1 while this controller holds the lease and reconciles, 0 while it stands by",
            leader.clone(),
        );
        let (registry_passes, registry_failures) = model_registries(&mut registry);
        let (pass_seconds, lag_seconds) = cadence(&mut registry);
        let labels = labels_received(&mut registry);
        ControllerMetrics {
            labels,
            pass_seconds,
            lag_seconds,
            last_lag: Mutex::new(0.0),
            registry: Mutex::new(registry),
            active,
            evaluations,
            rollbacks,
            leader,
            weight,
            phase,
            shown: Mutex::new(Vec::new()),
            notifications_sent,
            notification_failures,
            notifications_behind,
            registry_passes,
            registry_failures,
        }
    }
}

/// Labels received, by what became of them.
fn labels_received(registry: &mut Registry) -> Family<OutcomeLabel, Counter> {
    let labels = Family::<OutcomeLabel, Counter>::default();
    registry.register(
        "rollgate_labels",
        "Labels received, by outcome: applied, unknown (kept; no recorded answer has the id \
         yet), duplicate, or conflict (a different label for a labelled request: not kept)",
        labels.clone(),
    );
    labels
}

/// The model registries' passes, ended and cut short.
fn model_registries(
    registry: &mut Registry,
) -> (
    Family<RegistryLabel, Counter>,
    Family<RegistryLabel, Counter>,
) {
    let passes = Family::<RegistryLabel, Counter>::default();
    registry.register(
        "rollgate_registry_passes",
        "Passes over a model registry that ended: verdicts written back, then its aliases read",
        passes.clone(),
    );
    let failures = Family::<RegistryLabel, Counter>::default();
    registry.register(
        "rollgate_registry_failures",
        "Passes over a model registry cut short (it or the store did not answer); retried",
        failures.clone(),
    );
    (passes, failures)
}

impl ControllerMetrics {
    /// Starts a receiver's series at zero (an alert on failures fires on
    /// the first).
    pub fn receiver(&self, receiver: &str) {
        let l = ReceiverLabel {
            receiver: receiver.into(),
        };
        self.notifications_sent.get_or_create(&l).inc_by(0);
        self.notification_failures.get_or_create(&l).inc_by(0);
        self.notifications_behind.get_or_create(&l).set(0);
    }

    /// What became of a batch of labels.
    pub fn labels(&self, c: &rollgate_store::LabelCounts) {
        for (outcome, n) in [
            ("applied", c.applied),
            ("duplicate", c.duplicates),
            ("conflict", c.conflicts),
            ("unknown", c.unknown),
        ] {
            self.labels
                .get_or_create(&OutcomeLabel {
                    outcome: outcome.into(),
                })
                .inc_by(n);
        }
    }

    /// A pass over registry `name` ended (`ok`) or was cut short.
    pub fn registry_pass(&self, name: &str, ok: bool) {
        let l = RegistryLabel {
            registry: name.into(),
        };
        let (done, failed) = (
            self.registry_passes.get_or_create(&l),
            self.registry_failures.get_or_create(&l),
        );
        // Both series exist from the first pass (an alert fires on the first failure).
        done.inc_by(u64::from(ok));
        failed.inc_by(u64::from(!ok));
    }

    pub fn notification_sent(&self, receiver: &str) {
        self.notifications_sent
            .get_or_create(&ReceiverLabel {
                receiver: receiver.into(),
            })
            .inc();
    }

    pub fn notification_failed(&self, receiver: &str) {
        self.notification_failures
            .get_or_create(&ReceiverLabel {
                receiver: receiver.into(),
            })
            .inc();
    }

    pub fn notifications_behind(&self, receiver: &str, records: u64) {
        self.notifications_behind
            .get_or_create(&ReceiverLabel {
                receiver: receiver.into(),
            })
            .set(i64::try_from(records).unwrap_or(i64::MAX));
    }

    /// A pass took `seconds`; the rollouts it looked at had waited
    /// `waits` (seconds since each one's previous look).
    pub fn pass(&self, seconds: f64, waits: &[f64]) {
        self.pass_seconds.observe(seconds);
        for w in waits {
            self.lag_seconds.observe(*w);
        }
        // A pass with nothing due says nothing of the lag.
        if !waits.is_empty() {
            let largest = waits.iter().copied().fold(0.0, f64::max);
            *self.last_lag.lock().unwrap_or_else(|p| p.into_inner()) = largest;
        }
    }

    /// The longest a rollout looked at in the last pass had waited.
    pub fn last_lag(&self) -> f64 {
        *self.last_lag.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    /// `n` looks committed.
    pub fn evaluations(&self, n: u64) {
        self.evaluations.inc_by(n);
    }

    pub fn rollback(&self, reason: &str) {
        self.rollbacks
            .get_or_create(&ReasonLabel {
                reason: reason.to_string(),
            })
            .inc();
    }

    pub fn set_active(&self, rollouts: &[RolloutRecord]) {
        let now: Vec<(String, String)> = rollouts
            .iter()
            .map(|r| (r.spec.model.clone(), r.state.phase.name().to_string()))
            .collect();
        // Sets: a pass over 1,000 rollouts must not compare every pair.
        let current: std::collections::HashSet<&(String, String)> = now.iter().collect();
        let models: std::collections::HashSet<&str> = now.iter().map(|(m, _)| m.as_str()).collect();
        let mut shown = self.shown.lock().unwrap_or_else(|p| p.into_inner());
        for (model, phase) in shown.iter().filter(|s| !current.contains(s)) {
            self.phase.remove(&ModelPhaseLabel {
                model: model.clone(),
                phase: phase.clone(),
            });
            if !models.contains(model.as_str()) {
                self.weight.remove(&ModelLabel {
                    model: model.clone(),
                });
            }
        }
        for r in rollouts {
            let model = r.spec.model.clone();
            self.phase
                .get_or_create(&ModelPhaseLabel {
                    model: model.clone(),
                    phase: r.state.phase.name().into(),
                })
                .set(1);
            self.weight
                .get_or_create(&ModelLabel { model })
                .set(i64::from(r.routing.live_percent(&r.state.phase)));
        }
        *shown = now;
        drop(shown);
        for phase in ["PENDING", "SHADOW", "CANARY", "WATCHING"] {
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

    /// The registry as the scraper's `Accept` asks: body and content type.
    pub fn expose(&self, accept: Option<&str>) -> (String, &'static str) {
        let registry = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        rollgate_process::expose(&registry, accept)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rollback_reason_starts_at_zero_and_the_build_is_shown() {
        let text = ControllerMetrics::default().expose(None).0;
        for reason in rollgate_core::RollbackReason::CODES {
            assert!(
                text.contains(&format!(
                    "rollgate_rollbacks_total{{reason=\"{reason}\"}} 0"
                )),
                "{reason}: {text}"
            );
        }
        assert!(text.contains("rollgate_build_info{version="), "{text}");
        assert!(text.contains("process_cpu_seconds_total "), "{text}");
        assert!(text.contains("process_open_fds "), "{text}");
    }
}
