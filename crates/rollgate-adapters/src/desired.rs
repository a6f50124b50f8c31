//! What a data plane must route for one model ([`Desired`]), made from the
//! routes the store holds, and the check every routing passes before any
//! adapter writes it ([`servable`]).

use rollgate_core::{Epoch, epoch_label};
use rollgate_store::ModelRoutes;
use serde::Serialize;

use crate::AdapterError;

/// What a data plane must route for one model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Desired {
    pub model: String,
    /// Names this routing: the rollout's epoch label while one is active
    /// (`"<rollout>.<epoch>"`), else `"champion:<revision>"`. The data
    /// plane confirms by answering it.
    pub version: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rollout: Option<i64>,
    pub epoch: Epoch,
    /// The store's `routes_version` read before the routes this routing
    /// was made from (0: none, a seed). It only grows, so an adapter never
    /// replaces a routing of a higher generation with a lower one: an old
    /// leader cut off from the store cannot undo a newer leader's routing.
    pub generation: u64,
    /// The revisions to route to, the champion first; weights in basis
    /// points add up to 10,000.
    pub arms: Vec<Arm>,
    /// The candidate while it has no share of the traffic (SHADOW: only
    /// rollgate's gateway mirrors to it): a data plane that deploys
    /// revisions (KServe) deploys it dark; the others ignore it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shadow: Option<Arm>,
}

/// One revision a data plane routes to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Arm {
    pub role: &'static str,
    pub revision: String,
    pub upstream: String,
    pub weight_bp: u32,
    /// The revision's KServe predictor (`RevisionSpec::predictor`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub predictor: Option<serde_json::Value>,
}

impl Desired {
    /// The routing `routes` asks of a data plane (mirroring is not a data
    /// plane's: a shadow needs rollgate's gateway), as of `generation`:
    /// the store's `routes_version` read before `routes` were.
    pub fn of(routes: &ModelRoutes, generation: u64) -> Desired {
        let model = routes.model.name.clone();
        let candidate = routes
            .rollout
            .as_ref()
            .filter(|(_, routing, _)| routing.candidate_weight_bp > 0);
        let share = candidate.map_or(0, |(_, r, _)| r.candidate_weight_bp.min(10_000));
        let mut arms = Vec::with_capacity(2);
        if let Some(champion) = &routes.champion {
            arms.push(Arm {
                role: "champion",
                revision: champion.id.clone(),
                upstream: champion.spec.upstream.clone(),
                weight_bp: 10_000 - share,
                predictor: champion.spec.predictor.clone(),
            });
        }
        let candidate_arm = |rev: &rollgate_store::Revision, weight_bp| Arm {
            role: "candidate",
            revision: rev.id.clone(),
            upstream: rev.spec.upstream.clone(),
            weight_bp,
            predictor: rev.spec.predictor.clone(),
        };
        if let Some((rev, _, _)) = candidate {
            arms.push(candidate_arm(rev, share));
        }
        let shadow = match (&routes.rollout, candidate) {
            (Some((rev, _, _)), None) => Some(candidate_arm(rev, 0)),
            _ => None,
        };
        let (version, rollout, epoch) = match &routes.rollout {
            Some((_, routing, id)) => (epoch_label(*id, routing.epoch), Some(*id), routing.epoch),
            None => (
                format!(
                    "champion:{}",
                    routes.champion.as_ref().map_or("none", |c| c.id.as_str())
                ),
                None,
                0,
            ),
        };
        Desired {
            model,
            version,
            rollout,
            epoch,
            generation,
            arms,
            shadow,
        }
    }
}

/// Whether `desired` can serve: at least one arm, weights adding up to
/// the whole, every live arm's upstream an `http(s)://host` URL (the rule
/// revisions are registered under).
/// Checked before any adapter writes anything: no adapter ever puts a
/// routing in force that would answer users with errors.
pub fn servable(desired: &Desired) -> Result<(), AdapterError> {
    let unroutable = |upstream: &str, why: &str| AdapterError::Unroutable {
        upstream: upstream.to_string(),
        why: why.to_string(),
    };
    if desired.arms.is_empty() {
        return Err(unroutable("", "no revision to route to (no champion)"));
    }
    let total: u32 = desired.arms.iter().map(|a| a.weight_bp).sum();
    if total != 10_000 {
        return Err(unroutable(
            "",
            &format!("the weights add up to {total} basis points, not 10000"),
        ));
    }
    for arm in desired.arms.iter().filter(|a| a.weight_bp > 0) {
        // The one upstream rule revisions are registered under.
        if let Err(e) = rollgate_core::spec::check_upstream_url("upstream", &arm.upstream) {
            return Err(unroutable(&arm.upstream, &e.to_string()));
        }
    }
    Ok(())
}
