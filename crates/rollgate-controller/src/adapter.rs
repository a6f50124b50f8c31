//! The controller's side of the data planes rollgate does not run: the
//! [`Applier`] remembers the routing each adapter-routed model's data
//! plane confirmed, and when to try again one that failed (back-off),
//! and calls the adapters (`rollgate_adapters`) only through their trait.
//! A rollout's stage clock starts only once its routing is confirmed
//! (`Observation::routing_applied`), and a rollback is sent to the data
//! plane as champion-only routing before it is committed.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use rollgate_core::Epoch;
use rollgate_store::{DataPlane, ModelRoutes};
use tokio::time::Instant;

use crate::http::HttpClient;

pub use rollgate_adapters::{Adapter, AdapterError, Arm, Desired, render_nginx, seed, servable};

#[derive(Debug, Clone)]
struct Confirmed {
    version: String,
    rollout: Option<i64>,
    epoch: Epoch,
}

/// The routing each adapter-routed model's data plane confirmed, and when
/// to try again one that failed.
#[derive(Debug, Default)]
pub struct Applier {
    confirmed: Mutex<BTreeMap<String, Confirmed>>,
    retry: Mutex<BTreeMap<String, (Instant, u32)>>,
    /// The store's `routes_version` at the last pass that synced every
    /// model.
    synced: Mutex<Option<u64>>,
    /// Models left unrouted for want of a champion (each said once).
    no_champion: Mutex<std::collections::BTreeSet<String>>,
}

/// How long an apply may take (a reload and its confirmation included).
const APPLY_TIMEOUT: Duration = Duration::from_secs(10);

impl Applier {
    /// The latest epoch of `rollout` the model's data plane confirmed (0:
    /// none yet).
    pub fn applied_epoch(&self, model: &str, rollout: i64) -> Epoch {
        let confirmed = self.confirmed.lock().unwrap_or_else(|p| p.into_inner());
        confirmed
            .get(model)
            .filter(|c| c.rollout == Some(rollout))
            .map_or(0, |c| c.epoch)
    }

    /// Whether a pass must read the routes: they changed since the last
    /// sync (`routes_version`), or a failed routing waits to be sent again.
    pub fn needs_sync(&self, routes_version: u64) -> bool {
        let synced = *self.synced.lock().unwrap_or_else(|p| p.into_inner());
        synced != Some(routes_version)
            || !self
                .retry
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_empty()
    }

    /// Records that every model was synced to the routes of
    /// `routes_version`.
    pub fn synced(&self, routes_version: u64) {
        *self.synced.lock().unwrap_or_else(|p| p.into_inner()) = Some(routes_version);
    }

    /// Whether the model's data plane confirmed `desired` already; if so,
    /// nothing of the model waits to be sent again (a failed attempt since,
    /// such as a stale write that lost to this newer routing, is dropped).
    fn is_confirmed(&self, desired: &Desired) -> bool {
        let done = self
            .confirmed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&desired.model)
            .is_some_and(|c| c.version == desired.version);
        if done {
            self.retry
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&desired.model);
        }
        done
    }

    /// Brings the model's data plane to `routes` unless it already
    /// confirmed them, or a failed attempt's back-off has not passed
    /// (unless `now_or_never`: a rollback's champion-only routing goes at
    /// once). `generation` is the store's `routes_version` read before
    /// `routes` were: a data plane holding a routing of a higher one keeps
    /// it. A model without a champion has nothing to route: its data
    /// plane is left as it is (as seeded) until a champion is set.
    pub async fn sync(
        &self,
        http: &HttpClient,
        plane: &DataPlane,
        routes: &ModelRoutes,
        generation: u64,
        now_or_never: bool,
    ) {
        let desired = Desired::of(routes, generation);
        if desired.arms.is_empty() {
            let mut waiting = self.no_champion.lock().unwrap_or_else(|p| p.into_inner());
            if waiting.insert(desired.model.clone()) {
                tracing::info!(model = %desired.model, "no champion yet: its data plane is left as it is until one is set");
            }
            return;
        }
        self.no_champion
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&desired.model);
        if self.is_confirmed(&desired) {
            return;
        }
        let model = desired.model.clone();
        if !now_or_never {
            let retry = self.retry.lock().unwrap_or_else(|p| p.into_inner());
            if retry
                .get(&model)
                .is_some_and(|(at, _)| *at > Instant::now())
            {
                return;
            }
        }
        let adapter = rollgate_adapters::for_plane(plane, http);
        let applied = tokio::time::timeout(APPLY_TIMEOUT, adapter.apply(&desired))
            .await
            .unwrap_or_else(|_| Err(AdapterError::Io("timed out".into())));
        match applied {
            Ok(()) => {
                tracing::info!(model = %model, version = %desired.version, "data plane confirmed the routing");
                self.retry
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&model);
                self.confirmed
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(
                        model,
                        Confirmed {
                            version: desired.version,
                            rollout: desired.rollout,
                            epoch: desired.epoch,
                        },
                    );
            }
            Err(e) => {
                let mut retry = self.retry.lock().unwrap_or_else(|p| p.into_inner());
                let failures = retry.get(&model).map_or(0, |(_, n)| *n) + 1;
                // 250 ms, doubling, at most 30 s.
                let wait =
                    Duration::from_millis(250 << failures.min(7)).min(Duration::from_secs(30));
                tracing::warn!(model = %model, version = %desired.version, "data plane did not confirm the routing (try {failures}, again in {wait:?}): {e}");
                retry.insert(model, (Instant::now() + wait, failures));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_reads_the_routes_only_when_they_moved_or_a_routing_waits() {
        let a = Applier::default();
        assert!(a.needs_sync(3), "never synced");
        a.synced(3);
        assert!(!a.needs_sync(3), "nothing changed");
        assert!(a.needs_sync(4), "the routes moved");
        a.retry
            .lock()
            .expect("retry")
            .insert("m".into(), (Instant::now(), 1));
        assert!(a.needs_sync(3), "a failed routing waits to be sent again");
    }

    /// Two sends of one model race (a pass's and a commit's): the newer
    /// routing is confirmed, the older one is refused as stale. The
    /// refusal waits for nothing once the confirmed routing is the one
    /// the store holds, so passes go back to reading only the version.
    #[test]
    fn a_stale_attempt_waits_for_nothing_once_the_routing_is_confirmed() {
        let a = Applier::default();
        a.confirmed.lock().expect("confirmed").insert(
            "m".into(),
            Confirmed {
                version: "1.2".into(),
                rollout: Some(1),
                epoch: 2,
            },
        );
        a.retry
            .lock()
            .expect("retry")
            .insert("m".into(), (Instant::now(), 1));
        a.synced(7);
        assert!(a.needs_sync(7));
        let desired = Desired {
            model: "m".into(),
            version: "1.2".into(),
            rollout: Some(1),
            epoch: 2,
            generation: 7,
            shadow: None,
            arms: vec![],
        };
        assert!(a.is_confirmed(&desired));
        assert!(!a.needs_sync(7), "nothing waits to be sent again");
    }
}
