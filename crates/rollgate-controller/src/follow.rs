//! Gateways follow the store: every interval a gateway reads the routing of
//! every model from the store, applies it atomically, and heartbeats so the
//! controller knows whose stats to merge.

use std::sync::Arc;
use std::time::Duration;

use rollgate_gateway::{Gateway, MirroredUpstream, ModelRoute, Upstream, WeightedUpstream};
use rollgate_store::{ModelRoutes, Revision, Store};

fn upstream(r: &Revision) -> Upstream {
    Upstream {
        revision: r.id.clone(),
        url: r.spec.upstream.clone(),
        timeout: r.spec.timeout_ms.map(Duration::from_millis),
    }
}

/// The routing epoch label gateways count under: rollout id and epoch.
pub fn epoch_label(rollout: i64, epoch: rollgate_core::Epoch) -> String {
    format!("{rollout}.{epoch}")
}

/// The epoch of `rollout` a label names, if it is one of that rollout's.
pub fn epoch_of(label: &str, rollout: i64) -> Option<rollgate_core::Epoch> {
    let (r, e) = label.split_once('.')?;
    (r.parse::<i64>().ok()? == rollout)
        .then(|| e.parse().ok())
        .flatten()
}

/// The gateway routes implied by the store. Models without a champion are
/// not routed (they have nothing to serve yet).
pub fn gateway_routes(routes: &[ModelRoutes]) -> Vec<ModelRoute> {
    routes
        .iter()
        .filter_map(|m| {
            let champion = m.champion.as_ref()?;
            let spec = &m.model.spec;
            let (candidate, shadow) = match &m.rollout {
                Some((cand, routing, _)) => (
                    (routing.candidate_weight_bp > 0).then(|| WeightedUpstream {
                        upstream: upstream(cand),
                        weight_bp: routing.candidate_weight_bp.min(10_000),
                    }),
                    (routing.mirror_bp > 0).then(|| MirroredUpstream {
                        upstream: upstream(cand),
                        mirror_bp: routing.mirror_bp.min(10_000),
                    }),
                ),
                None => (None, None),
            };
            Some(ModelRoute {
                name: m.model.name.clone(),
                protocol: spec.protocol,
                json_path: spec.json_path.clone(),
                key_field: spec.key_field.clone(),
                salt: None,
                assignment: m
                    .rollout
                    .as_ref()
                    .map_or(Default::default(), |(_, routing, _)| routing.assignment),
                output_pointer: spec.output_pointer.clone(),
                confidence_threshold: spec.confidence_threshold.unwrap_or(0.9),
                numeric_tolerance: 1e-6,
                fallback_to_champion: false,
                champion: upstream(champion),
                candidate,
                shadow,
                epoch: m
                    .rollout
                    .as_ref()
                    .map(|(_, routing, id)| epoch_label(*id, routing.epoch)),
            })
        })
        .collect()
}

/// Why loading routes from the store failed.
#[derive(Debug, thiserror::Error)]
pub enum FollowError {
    #[error(transparent)]
    Store(#[from] rollgate_store::StoreError),
}

/// Loads the store's routing into `gateway` once. A model the gateway
/// cannot route is isolated (answered 404 with its reason, logged once),
/// never blocking the others.
pub fn sync_once(store: &dyn Store, gateway: &Gateway) -> Result<(), FollowError> {
    let routes = store.routes()?;
    gateway.set_routes(&gateway_routes(&routes));
    Ok(())
}

/// Follows the store until `shutdown` resolves: routes and heartbeat every
/// `every`. Errors are logged and retried; the last good routing stays.
pub async fn follow(
    store: Arc<dyn Store>,
    gateway: Gateway,
    id: String,
    stats_url: String,
    every: Duration,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        let (s, g, i, u) = (
            Arc::clone(&store),
            gateway.clone(),
            id.clone(),
            stats_url.clone(),
        );
        let res = tokio::task::spawn_blocking(move || {
            sync_once(s.as_ref(), &g)?;
            s.heartbeat(&i, &u)?;
            Ok::<_, FollowError>(())
        })
        .await;
        match res {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "following the store failed; keeping the last routes")
            }
            Err(e) => tracing::warn!(error = %e, "route follower task failed"),
        }
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = &mut shutdown => return,
        }
    }
}
