//! The gateways' side of the store: their heartbeats, what they must route
//! (each model's champion and active rollout), and the one counter that
//! moves whenever that changes, so a follower reads the routes only then.

use std::time::Duration;

use super::engine::Db;
use super::rows::{
    MODEL_COLS, active_rollout, all, get_model, get_revision, get_rollout, model_row,
};
use super::store::{SqlStore, millis};
use crate::{GatewayInfo, Model, ModelRoutes, Result, StoreError};

/// Every change to what gateways route bumps one counter (once per
/// transaction), so a follower polls one row and reads the routes only when
/// they changed.
pub(super) fn routes_changed(db: &mut dyn Db) {
    db.memo().routes_changed = true;
}

/// What gateways route for `model`: its champion and active rollout.
fn model_routes_in(db: &mut dyn Db, model: Model) -> Result<ModelRoutes> {
    let champion = match &model.champion {
        Some(id) => Some(get_revision(db, id)?),
        None => None,
    };
    let mut watching = false;
    let (rollout, rollout_seen, record_answers) = match active_rollout(db, &model.name)? {
        Some(id) => {
            let r = get_rollout(db, id)?;
            // Watching after promotion, the rollout's other revision is
            // its previous champion (mirrored); before, its candidate.
            watching = matches!(r.state.phase, rollgate_core::Phase::Watching { .. });
            let other = if watching {
                &r.spec.champion
            } else {
                &r.spec.candidate
            };
            let candidate = get_revision(db, other)?;
            let seen = r
                .state
                .evidence
                .seen()
                .map(|(s, at)| (s.to_string(), at))
                .collect();
            let labels = r.spec.plan.gates.quality.enabled;
            (Some((candidate, r.routing, r.id)), seen, labels)
        }
        None => (None, Default::default(), false),
    };
    Ok(ModelRoutes {
        model,
        champion,
        rollout,
        rollout_seen,
        record_answers,
        watching,
    })
}

pub(super) fn heartbeat(store: &SqlStore, id: &str, stats_url: &str) -> Result<()> {
    store.write(|db, now| {
        db.exec(
            "INSERT INTO gateways (id, stats_url, last_seen) VALUES (?1, ?2, ?3)
                 ON CONFLICT(id) DO UPDATE SET stats_url = excluded.stats_url, last_seen = excluded.last_seen",
            p![id, stats_url, now.0],
        )?;
        Ok(())
    })
}

pub(super) fn gateways(store: &SqlStore, seen_within: Duration) -> Result<Vec<GatewayInfo>> {
    let since = (store.clock)().0.saturating_sub(millis(seen_within));
    store.read_one(|db| {
        let rows = db.rows(
            "SELECT id, stats_url, last_seen FROM gateways WHERE last_seen >= ?1 ORDER BY id",
            p![since],
        )?;
        all(rows, |r| {
            Ok(GatewayInfo {
                id: r.text(0)?,
                stats_url: r.text(1)?,
                last_seen: r.ts(2)?,
            })
        })
    })
}

pub(super) fn routes_version(store: &SqlStore) -> Result<u64> {
    store.read_one(|db| {
        db.row("SELECT version FROM routes_version WHERE id = 1", &[])?
            .map_or(Ok(0), |r| r.u64(0))
    })
}

pub(super) fn routes(store: &SqlStore) -> Result<Vec<ModelRoutes>> {
    // One snapshot: the routing of every model at one instant.
    store.read(|db| {
        let models = all(
            db.rows(
                &format!("SELECT {MODEL_COLS} FROM models WHERE deleted_at IS NULL ORDER BY name"),
                &[],
            )?,
            model_row,
        )?;
        models
            .into_iter()
            .map(|model| model_routes_in(db, model))
            .collect()
    })
}

pub(super) fn model_routes(store: &SqlStore, model: &str) -> Result<Option<ModelRoutes>> {
    store.read(|db| match get_model(db, model) {
        Ok(m) => model_routes_in(db, m).map(Some),
        Err(StoreError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    })
}
