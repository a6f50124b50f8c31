//! How each table's rows read back as the crate's types (a `*_COLS` list
//! and its reader side by side, so the columns and their order are written
//! once), and the lookups by key that every concern shares.

use rollgate_core::Timestamp;

use super::engine::{Db, Row, Val};
use crate::{
    ApiToken, AuditRecord, Checkpoint, Model, Result, Revision, RevisionState, Role, RolloutRecord,
    StoreError,
};

pub(super) const MODEL_COLS: &str = "name, spec, champion, created_at";
pub(super) fn model_row(r: &Row) -> Result<Model> {
    Ok(Model {
        name: r.text(0)?,
        spec: r.json(1)?,
        champion: r.opt_text(2)?,
        created_at: r.ts(3)?,
    })
}

pub(super) const REVISION_COLS: &str = "id, model, spec, state, rejections, blocked, created_at";
pub(super) fn revision_row(r: &Row) -> Result<Revision> {
    let state = r.text(3)?;
    Ok(Revision {
        id: r.text(0)?,
        model: r.text(1)?,
        spec: r.json(2)?,
        state: RevisionState::parse(&state).ok_or_else(|| {
            StoreError::Database(format!("stored data: unknown revision state {state:?}").into())
        })?,
        rejections: r.u32(4)?,
        blocked: r.bool(5)?,
        created_at: r.ts(6)?,
    })
}

pub(super) const ROLLOUT_COLS: &str = "id, spec, state, routing, version, created_at, updated_at";
pub(super) fn rollout_row(r: &Row) -> Result<RolloutRecord> {
    Ok(RolloutRecord {
        id: r.i64(0)?,
        spec: r.json(1)?,
        state: r.json(2)?,
        routing: r.json(3)?,
        version: r.u64(4)?,
        created_at: r.ts(5)?,
        updated_at: r.ts(6)?,
    })
}

pub(super) const AUDIT_COLS: &str =
    "seq, at, actor, model, rollout, kind, body, prev_hash, hash, body_digest, pruned";
pub(super) fn audit_row(r: &Row) -> Result<AuditRecord> {
    Ok(AuditRecord {
        seq: r.u64(0)?,
        at: r.ts(1)?,
        actor: r.text(2)?,
        model: r.text(3)?,
        rollout: r.opt_i64(4)?,
        kind: r.text(5)?,
        // A body that is not JSON (edited in the database) is shown as
        // what it is; its hash no longer matches, so verification names
        // the record instead of failing as a whole.
        body: {
            let text = r.text(6)?;
            serde_json::from_str(&text)
                .unwrap_or_else(|_| serde_json::json!({ "unreadable_body": text }))
        },
        prev_hash: r.text(7)?,
        hash: r.text(8)?,
        body_digest: r.opt_text(9)?,
        pruned: r.bool(10)?,
    })
}

/// A checkpoint row: `seq, hash, at, mac, key_id`.
pub(super) fn checkpoint_row(r: &Row) -> Result<Checkpoint> {
    Ok(Checkpoint {
        seq: r.u64(0)?,
        hash: r.text(1)?,
        at: r.ts(2)?,
        mac: r.text(3)?,
        key_id: r.opt_text(4)?,
    })
}

pub(super) const TOKEN_COLS: &str = "name, role, created_at, created_by, revoked_at";

/// A token row; an unknown role (a hand-edited database) is corrupt data.
pub(super) fn token_row(r: &Row) -> Result<ApiToken> {
    let role = r
        .text(1)?
        .parse::<Role>()
        .map_err(|e| StoreError::Invalid(format!("stored token: {e}")))?;
    Ok(ApiToken {
        name: r.text(0)?,
        role,
        created_at: r.ts(2)?,
        created_by: r.text(3)?,
        revoked_at: r.opt_u64(4)?.map(Timestamp),
    })
}

/// Every row, read by `f`.
pub(super) fn all<T>(rows: Vec<Row>, f: impl Fn(&Row) -> Result<T>) -> Result<Vec<T>> {
    rows.iter().map(f).collect()
}

/// The one row `sql` finds, read by `row`; `what` `name` not found else.
pub(super) fn one<T>(
    db: &mut dyn Db,
    sql: &str,
    params: &[Val],
    row: impl Fn(&Row) -> Result<T>,
    what: &'static str,
    name: &str,
) -> Result<T> {
    db.row(sql, params)?
        .map(|r| row(&r))
        .transpose()?
        .ok_or_else(|| StoreError::NotFound {
            what,
            name: name.to_string(),
        })
}

/// The model `name`, unless it was deleted.
pub(super) fn get_model(db: &mut dyn Db, name: &str) -> Result<Model> {
    let sql = format!("SELECT {MODEL_COLS} FROM models WHERE name = ?1 AND deleted_at IS NULL");
    one(db, &sql, p![name], model_row, "model", name)
}

pub(super) fn get_revision(db: &mut dyn Db, id: &str) -> Result<Revision> {
    let sql = format!("SELECT {REVISION_COLS} FROM revisions WHERE id = ?1");
    one(db, &sql, p![id], revision_row, "revision", id)
}

pub(super) fn get_rollout(db: &mut dyn Db, id: i64) -> Result<RolloutRecord> {
    let sql = format!("SELECT {ROLLOUT_COLS} FROM rollouts WHERE id = ?1");
    one(db, &sql, p![id], rollout_row, "rollout", &id.to_string())
}

/// The id of `model`'s active rollout, if it has one.
pub(super) fn active_rollout(db: &mut dyn Db, model: &str) -> Result<Option<i64>> {
    db.row(
        "SELECT id FROM rollouts WHERE model = ?1 AND active = 1",
        p![model],
    )?
    .map(|r| r.i64(0))
    .transpose()
}
