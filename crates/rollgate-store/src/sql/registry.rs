//! The registry's transactions: models (created, changed, deleted), their
//! immutable revisions, the champion hand-over and unblocking a rejected
//! revision. Each change is audited in the same transaction.

use rollgate_core::Timestamp;

use super::chain::append_audit;
use super::engine::Db;
use super::gateways::routes_changed;
use super::rows::{
    MODEL_COLS, REVISION_COLS, active_rollout, all, get_model, get_revision, model_row,
    revision_row,
};
use super::store::SqlStore;
use crate::{Model, ModelSpec, Result, Revision, RevisionSpec, RevisionState, StoreError};

fn valid_name(name: &str) -> Result<()> {
    rollgate_core::spec::check_model_name(name)
        .map_err(|e| StoreError::Invalid(format!("model {}", e.message)))
}

fn require_reason(reason: &str, what: &str) -> Result<String> {
    let r = reason.trim();
    if r.is_empty() {
        Err(StoreError::Invalid(format!(
            "{what} requires a non-empty reason"
        )))
    } else {
        Ok(r.to_string())
    }
}

/// The revision `id`, which must belong to `model`.
pub(super) fn revision_of(db: &mut dyn Db, model: &str, id: &str) -> Result<Revision> {
    let rev = get_revision(db, id)?;
    if rev.model != model {
        return Err(StoreError::Invalid(format!(
            "revision {id} belongs to model {:?}, not {model:?}",
            rev.model
        )));
    }
    Ok(rev)
}

/// A rejected revision stays out until an operator unblocks it.
pub(super) fn not_blocked(rev: &Revision) -> Result<()> {
    if rev.blocked {
        return Err(StoreError::Rejected {
            revision: rev.id.clone(),
            rejections: rev.rejections,
        });
    }
    Ok(())
}

pub(super) fn set_state(db: &mut dyn Db, revision: &str, state: RevisionState) -> Result<()> {
    db.exec(
        "UPDATE revisions SET state = ?2 WHERE id = ?1",
        p![revision, state.as_str()],
    )?;
    Ok(())
}

/// Champion hand-over inside the write: the old champion is archived in the
/// same transaction, so there is never a moment with two champions or none.
pub(super) fn promote_in(
    db: &mut dyn Db,
    now: Timestamp,
    model: &Model,
    to: &str,
    actor: &str,
    body: serde_json::Value,
    rollout: Option<i64>,
) -> Result<()> {
    if let Some(old) = &model.champion {
        set_state(db, old, RevisionState::Archived)?;
    }
    set_state(db, to, RevisionState::Champion)?;
    db.exec(
        "UPDATE models SET champion = ?2 WHERE name = ?1",
        p![&model.name, to],
    )?;
    append_audit(db, now, actor, &model.name, rollout, "champion_set", body)
}

/// A json model's path must not be another model's.
fn path_is_free(db: &mut dyn Db, name: &str, spec: &ModelSpec) -> Result<()> {
    let Some(path) = &spec.json_path else {
        return Ok(());
    };
    let rows = db.rows(
        "SELECT name, spec FROM models WHERE deleted_at IS NULL AND name != ?1",
        p![name],
    )?;
    for row in rows {
        let (other, spec): (String, ModelSpec) = (row.text(0)?, row.json(1)?);
        if spec.json_path.as_deref() == Some(path.as_str()) {
            return Err(StoreError::Invalid(format!(
                "model.json_path: {path:?} is already the path of model {other:?}"
            )));
        }
    }
    Ok(())
}

pub(super) fn create_model(
    store: &SqlStore,
    name: &str,
    spec: &ModelSpec,
    actor: &str,
) -> Result<Model> {
    valid_name(name)?;
    spec.validate()?;
    store.write(|db, now| {
        if let Ok(existing) = get_model(db, name) {
            return if existing.spec == *spec {
                Ok(existing)
            } else {
                Err(StoreError::Conflict(format!(
                    "model {name:?} exists with a different spec (change it with PUT /api/v1/models/{name})"
                )))
            };
        }
        path_is_free(db, name, spec)?;
        let deleted = db
            .row("SELECT 1 FROM models WHERE name = ?1", p![name])?
            .is_some();
        if deleted {
            // A deleted model created again: its revisions (and their
            // rejections) are still there; it starts without a champion.
            db.exec(
                "UPDATE models SET spec = ?2, champion = NULL, deleted_at = NULL WHERE name = ?1",
                p![name, serde_json::to_string(spec)?],
            )?;
        } else {
            db.exec(
                "INSERT INTO models (name, spec, champion, created_at) VALUES (?1, ?2, NULL, ?3)",
                p![name, serde_json::to_string(spec)?, now.0],
            )?;
        }
        routes_changed(db);
        append_audit(
            db,
            now,
            actor,
            name,
            None,
            "model_created",
            serde_json::to_value(spec)?,
        )?;
        get_model(db, name)
    })
}

pub(super) fn update_model(
    store: &SqlStore,
    name: &str,
    spec: &ModelSpec,
    actor: &str,
) -> Result<Model> {
    spec.validate()?;
    store.write(|db, now| {
        let before = get_model(db, name)?;
        if before.spec == *spec {
            return Ok(before);
        }
        if let Some(id) = active_rollout(db, name)? {
            return Err(StoreError::Conflict(format!(
                "model {name:?} has an active rollout ({id}); its spec changes once the rollout ends"
            )));
        }
        path_is_free(db, name, spec)?;
        db.exec(
            "UPDATE models SET spec = ?2 WHERE name = ?1",
            p![name, serde_json::to_string(spec)?],
        )?;
        routes_changed(db);
        append_audit(
            db,
            now,
            actor,
            name,
            None,
            "model_updated",
            serde_json::json!({ "from": before.spec, "to": spec }),
        )?;
        get_model(db, name)
    })
}

pub(super) fn delete_model(store: &SqlStore, name: &str, actor: &str, reason: &str) -> Result<()> {
    let reason = require_reason(reason, "deleting a model")?;
    store.write(|db, now| {
        let model = get_model(db, name)?;
        if let Some(id) = active_rollout(db, name)? {
            return Err(StoreError::Conflict(format!(
                "model {name:?} has an active rollout ({id}); abort it first"
            )));
        }
        db.exec(
            "UPDATE models SET champion = NULL, deleted_at = ?2 WHERE name = ?1",
            p![name, now.0],
        )?;
        db.exec(
            "UPDATE revisions SET state = 'archived' WHERE model = ?1 AND state = 'champion'",
            p![name],
        )?;
        routes_changed(db);
        append_audit(
            db,
            now,
            actor,
            name,
            None,
            "model_deleted",
            serde_json::json!({ "reason": reason, "spec": model.spec, "champion": model.champion }),
        )?;
        Ok(())
    })
}

pub(super) fn model(store: &SqlStore, name: &str) -> Result<Model> {
    store.read_one(|db| get_model(db, name))
}

pub(super) fn models(store: &SqlStore) -> Result<Vec<Model>> {
    store.read_one(|db| {
        let rows = db.rows(
            &format!("SELECT {MODEL_COLS} FROM models WHERE deleted_at IS NULL ORDER BY name"),
            &[],
        )?;
        all(rows, model_row)
    })
}

pub(super) fn register_revision(
    store: &SqlStore,
    model: &str,
    spec: &RevisionSpec,
    actor: &str,
) -> Result<Revision> {
    let normalised = spec.normalised()?;
    let id = spec.identity(model)?;
    store.write(|db, now| {
        get_model(db, model)?;
        if let Ok(existing) = get_revision(db, &id) {
            return Ok(existing);
        }
        db.exec(
            "INSERT INTO revisions (id, model, spec, state, created_at) VALUES (?1, ?2, ?3, 'available', ?4)",
            p![&id, model, serde_json::to_string(&normalised)?, now.0],
        )?;
        append_audit(
            db,
            now,
            actor,
            model,
            None,
            "revision_registered",
            serde_json::json!({ "revision": id, "spec": normalised.redacted() }),
        )?;
        get_revision(db, &id)
    })
}

pub(super) fn revision(store: &SqlStore, id: &str) -> Result<Revision> {
    store.read_one(|db| get_revision(db, id))
}

pub(super) fn revisions(store: &SqlStore, model: &str) -> Result<Vec<Revision>> {
    store.read(|db| {
        get_model(db, model)?;
        let rows = db.rows(
            &format!(
                "SELECT {REVISION_COLS} FROM revisions WHERE model = ?1 ORDER BY created_at, id"
            ),
            p![model],
        )?;
        all(rows, revision_row)
    })
}

pub(super) fn set_champion(
    store: &SqlStore,
    model: &str,
    revision: &str,
    actor: &str,
    reason: &str,
) -> Result<Revision> {
    set_champion_if(store, model, revision, actor, reason, false)
        .and_then(|r| r.ok_or_else(|| StoreError::Database("no champion set".into())))
}

/// Sets the champion; with `only_first`, only if the model has none (in
/// the same transaction): `None` when it had one.
pub(super) fn set_champion_if(
    store: &SqlStore,
    model: &str,
    revision: &str,
    actor: &str,
    reason: &str,
    only_first: bool,
) -> Result<Option<Revision>> {
    let reason = require_reason(reason, "setting the champion")?;
    store.write(|db, now| {
        let m = get_model(db, model)?;
        if only_first && m.champion.is_some() {
            return Ok(None);
        }
        let rev = revision_of(db, model, revision)?;
        if let Some(id) = active_rollout(db, model)? {
            return Err(StoreError::Conflict(format!(
                "rollout {id} is active on model {model:?}; promote or abort it instead"
            )));
        }
        not_blocked(&rev)?;
        if m.champion.as_deref() == Some(revision) {
            return Ok(Some(rev));
        }
        let body = serde_json::json!({ "from": m.champion, "to": revision, "reason": reason });
        promote_in(db, now, &m, revision, actor, body, None)?;
        routes_changed(db);
        get_revision(db, revision).map(Some)
    })
}

pub(super) fn unblock(
    store: &SqlStore,
    revision: &str,
    actor: &str,
    reason: &str,
) -> Result<Revision> {
    let reason = require_reason(reason, "unblocking a revision")?;
    store.write(|db, now| {
        let rev = get_revision(db, revision)?;
        if !rev.blocked {
            return Err(StoreError::Conflict(format!("revision {revision} is not blocked")));
        }
        db.exec(
            "UPDATE revisions SET blocked = 0, state = 'available' WHERE id = ?1",
            p![revision],
        )?;
        append_audit(
            db,
            now,
            actor,
            &rev.model,
            None,
            "revision_unblocked",
            serde_json::json!({ "revision": revision, "rejections": rev.rejections, "reason": reason }),
        )?;
        get_revision(db, revision)
    })
}
