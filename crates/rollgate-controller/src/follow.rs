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
        served_name: r.spec.served_name.clone(),
        headers: r.spec.headers.clone(),
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
                output: spec.output.clone(),
                confidence_threshold: spec.confidence_threshold.unwrap_or(0.9),
                numeric_tolerance: 1e-6,
                fallback_to_champion: m
                    .rollout
                    .as_ref()
                    .is_some_and(|(_, routing, _)| routing.fallback_to_champion),
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

#[cfg(test)]
mod tests {
    use super::*;
    use rollgate_core::{Plan, Routing, Timestamp};
    use rollgate_store::{Model, ModelSpec, Revision, RevisionSpec, RevisionState};

    fn revision(id: &str, spec: RevisionSpec) -> Revision {
        Revision {
            id: id.into(),
            model: "m".into(),
            spec,
            state: RevisionState::Available,
            rejections: 0,
            blocked: false,
            created_at: Timestamp(0),
        }
    }

    /// What a revision and a rollout's plan say reaches the gateway's route:
    /// served name, headers, output, assignment, fallback and epoch.
    #[test]
    fn a_route_carries_the_revision_and_plan_settings() {
        let plan = Plan {
            fallback_to_champion: true,
            assignment: rollgate_core::plan::Assignment::PerRequest,
            ..Plan::default()
        };
        let phase = rollgate_core::Phase::Canary {
            step: 0,
            weight_percent: 5,
        };
        let routing = Routing {
            epoch: 3,
            ..Routing::for_phase(&plan, &phase)
        };
        let mut cand = RevisionSpec {
            upstream: "http://127.0.0.1:2".into(),
            served_name: Some("fraud-v2".into()),
            ..RevisionSpec::default()
        };
        cand.headers.insert("host".into(), "fraud.models".into());
        let routes = [ModelRoutes {
            model: Model {
                name: "m".into(),
                spec: ModelSpec {
                    protocol: rollgate_core::Protocol::OipV2,
                    output: Some("predict_proba".into()),
                    ..ModelSpec::default()
                },
                champion: Some("r1".into()),
                created_at: Timestamp(0),
            },
            champion: Some(revision(
                "r1",
                RevisionSpec {
                    upstream: "http://127.0.0.1:1".into(),
                    ..RevisionSpec::default()
                },
            )),
            rollout: Some((revision("r2", cand), routing, 7)),
        }];
        let r = &gateway_routes(&routes)[0];
        assert!(r.fallback_to_champion);
        assert_eq!(r.assignment, rollgate_core::plan::Assignment::PerRequest);
        assert_eq!(r.output.as_deref(), Some("predict_proba"));
        assert_eq!(r.epoch.as_deref(), Some("7.3"));
        let c = r.candidate.as_ref().expect("candidate");
        assert_eq!(c.weight_bp, 500);
        assert_eq!(c.upstream.served_name.as_deref(), Some("fraud-v2"));
        assert_eq!(c.upstream.headers["host"], "fraud.models");
    }
}
