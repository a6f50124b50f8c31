//! The embedded store: one SQLite file in WAL mode with `synchronous=FULL`,
//! so a committed transaction survives a killed process (and a power cut).
//!
//! Invariants the schema enforces on its own, whatever the code does:
//! one champion and one candidate per model (partial unique indexes), one
//! active rollout per model, and an audit table that refuses UPDATE and
//! DELETE (triggers).

use std::path::Path;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use rollgate_core::{Effect, Plan, RolloutSpec, RolloutState, Routing, Timestamp};
use rusqlite::{Connection, OptionalExtension, Row, Transaction, TransactionBehavior, params};

use crate::audit::{AuditFilter, AuditRecord, ChainReport, GENESIS, verify_chain};
use crate::checkpoint::Checkpoint;
use crate::registry::{Model, ModelSpec, Revision, RevisionSpec, RevisionState};
use crate::tokens::{ApiToken, Role, valid_token_name};
use crate::{GatewayInfo, ModelRoutes, Result, RolloutRecord, Store, StoreError, TransitionWrite};

/// Schema migrations, applied in order; `PRAGMA user_version` records how
/// many have run. Append only: never edit a released migration.
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE models (
    name TEXT PRIMARY KEY,
    spec TEXT NOT NULL,
    champion TEXT,
    created_at INTEGER NOT NULL
);
CREATE TABLE revisions (
    id TEXT PRIMARY KEY,
    model TEXT NOT NULL REFERENCES models(name),
    spec TEXT NOT NULL,
    state TEXT NOT NULL,
    rejections INTEGER NOT NULL DEFAULT 0,
    blocked INTEGER NOT NULL DEFAULT 0,
    created_at INTEGER NOT NULL
);
CREATE UNIQUE INDEX one_champion_per_model ON revisions(model) WHERE state = 'champion';
CREATE UNIQUE INDEX one_candidate_per_model ON revisions(model) WHERE state = 'candidate';
CREATE TABLE rollouts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    model TEXT NOT NULL REFERENCES models(name),
    spec TEXT NOT NULL,
    state TEXT NOT NULL,
    phase TEXT NOT NULL,
    active INTEGER NOT NULL,
    routing TEXT NOT NULL,
    version INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);
CREATE UNIQUE INDEX one_active_rollout_per_model ON rollouts(model) WHERE active = 1;
CREATE TABLE audit (
    seq INTEGER PRIMARY KEY,
    at INTEGER NOT NULL,
    actor TEXT NOT NULL,
    model TEXT NOT NULL,
    rollout INTEGER,
    kind TEXT NOT NULL,
    body TEXT NOT NULL,
    prev_hash TEXT NOT NULL,
    hash TEXT NOT NULL
);
CREATE INDEX audit_by_rollout ON audit(rollout, seq);
CREATE INDEX audit_by_model ON audit(model, seq);
CREATE TRIGGER audit_is_append_only_update BEFORE UPDATE ON audit
    BEGIN SELECT RAISE(ABORT, 'audit log is append-only'); END;
CREATE TRIGGER audit_is_append_only_delete BEFORE DELETE ON audit
    BEGIN SELECT RAISE(ABORT, 'audit log is append-only'); END;
"#,
    r#"
CREATE TABLE gateways (
    id TEXT PRIMARY KEY,
    stats_url TEXT NOT NULL,
    last_seen INTEGER NOT NULL
);
"#,
    // Deleted models are kept (their revisions remember rejections), hidden.
    r#"
ALTER TABLE models ADD COLUMN deleted_at INTEGER;
"#,
    // Named API tokens: the secret's hash only.
    r#"
CREATE TABLE tokens (
    name TEXT PRIMARY KEY,
    role TEXT NOT NULL CHECK (role IN ('viewer', 'operator', 'admin')),
    hash TEXT NOT NULL UNIQUE,
    created_at INTEGER NOT NULL,
    created_by TEXT NOT NULL,
    revoked_at INTEGER
);
"#,
    // Signed checkpoints of the audit chain's head, append-only like it.
    r#"
CREATE TABLE checkpoints (
    seq INTEGER PRIMARY KEY,
    hash TEXT NOT NULL,
    at INTEGER NOT NULL,
    mac TEXT NOT NULL
);
CREATE TRIGGER checkpoints_are_append_only_update BEFORE UPDATE ON checkpoints
    BEGIN SELECT RAISE(ABORT, 'checkpoints are append-only'); END;
CREATE TRIGGER checkpoints_are_append_only_delete BEFORE DELETE ON checkpoints
    BEGIN SELECT RAISE(ABORT, 'checkpoints are append-only'); END;
"#,
    // Retention: bodies hashed by digest; an old evaluation's body may be
    // pruned, nothing else may change.
    r#"
ALTER TABLE audit ADD COLUMN body_digest TEXT;
ALTER TABLE audit ADD COLUMN pruned INTEGER NOT NULL DEFAULT 0;
CREATE INDEX audit_by_kind_at ON audit(kind, at) WHERE pruned = 0;
DROP TRIGGER audit_is_append_only_update;
CREATE TRIGGER audit_is_append_only_update BEFORE UPDATE ON audit
    WHEN NOT (OLD.kind = 'evaluated' AND OLD.pruned = 0 AND OLD.body_digest IS NOT NULL
              AND NEW.pruned = 1 AND NEW.body = '{"pruned":true}'
              AND NEW.seq IS OLD.seq AND NEW.at IS OLD.at AND NEW.actor IS OLD.actor
              AND NEW.model IS OLD.model AND NEW.rollout IS OLD.rollout
              AND NEW.kind IS OLD.kind AND NEW.prev_hash IS OLD.prev_hash
              AND NEW.hash IS OLD.hash AND NEW.body_digest IS OLD.body_digest)
    BEGIN SELECT RAISE(ABORT, 'audit log is append-only (only old evaluations may be pruned)'); END;
"#,
];

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Database(Box::new(e))
    }
}

type Clock = Box<dyn Fn() -> Timestamp + Send + Sync>;

/// The default [`Store`]: an embedded SQLite database.
pub struct SqliteStore {
    conn: Mutex<Connection>,
    clock: Clock,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore").finish_non_exhaustive()
    }
}

fn system_clock() -> Timestamp {
    Timestamp(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
    )
}

impl SqliteStore {
    /// Opens (creating if needed) `rollgate.db` in the data directory `dir`.
    pub fn open_dir(dir: &Path) -> Result<SqliteStore> {
        std::fs::create_dir_all(dir).map_err(|e| {
            StoreError::Invalid(format!(
                "cannot create data directory {}: {e}",
                dir.display()
            ))
        })?;
        Self::open_file(&dir.join("rollgate.db"))
    }

    /// Opens (creating if needed) the database file at `path` and migrates it.
    pub fn open_file(path: &Path) -> Result<SqliteStore> {
        let mut conn = Connection::open(path)?;
        conn.busy_timeout(std::time::Duration::from_secs(10))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        migrate(&mut conn)?;
        Ok(SqliteStore {
            conn: Mutex::new(conn),
            clock: Box::new(system_clock),
        })
    }

    /// Replaces the wall clock (tests pass a fixed or stepping one).
    pub fn with_clock(mut self, clock: impl Fn() -> Timestamp + Send + Sync + 'static) -> Self {
        self.clock = Box::new(clock);
        self
    }

    /// Runs `f` in one IMMEDIATE transaction: it commits if `f` returns Ok,
    /// and rolls back (leaving no partial state) if it returns Err.
    fn write<T>(&self, f: impl FnOnce(&Transaction, Timestamp) -> Result<T>) -> Result<T> {
        let mut conn = self
            .conn
            .lock()
            .map_err(|_| StoreError::Conflict("store lock poisoned by an earlier panic".into()))?;
        let now = (self.clock)();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let out = f(&tx, now)?;
        tx.commit()?;
        Ok(out)
    }

    fn read<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        let conn = self
            .conn
            .lock()
            .map_err(|_| StoreError::Conflict("store lock poisoned by an earlier panic".into()))?;
        f(&conn)
    }
}

fn migrate(conn: &mut Connection) -> Result<()> {
    let done: usize = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if done > MIGRATIONS.len() {
        return Err(StoreError::Invalid(format!(
            "database schema version {done} is newer than this rollgate ({})",
            MIGRATIONS.len()
        )));
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(done) {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", i + 1)?;
        tx.commit()?;
    }
    Ok(())
}

/// Appends one audit record, chained to the last one, inside `tx`.
const TOKEN_COLS: &str = "name, role, created_at, created_by, revoked_at";

/// A token row; an unknown role (a hand-edited database) is corrupt data.
fn token_row(r: &Row) -> rusqlite::Result<Result<ApiToken>> {
    let role: String = r.get(1)?;
    let revoked: Option<u64> = r.get(4)?;
    Ok(role
        .parse::<Role>()
        .map_err(|e| StoreError::Invalid(format!("stored token: {e}")))
        .and_then(|role| {
            Ok(ApiToken {
                name: r.get(0)?,
                role,
                created_at: Timestamp(r.get(2)?),
                created_by: r.get(3)?,
                revoked_at: revoked.map(Timestamp),
            })
        }))
}

fn append_audit(
    tx: &Transaction,
    at: Timestamp,
    actor: &str,
    model: &str,
    rollout: Option<i64>,
    kind: &str,
    body: serde_json::Value,
) -> Result<()> {
    let last: Option<(u64, String)> = tx
        .query_row(
            "SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    let (prev_seq, prev_hash) = last.unwrap_or((0, GENESIS.to_string()));
    let mut rec = AuditRecord {
        seq: prev_seq + 1,
        at,
        actor: actor.to_string(),
        model: model.to_string(),
        rollout,
        kind: kind.to_string(),
        body_digest: Some(crate::audit::body_digest(&body)),
        body,
        pruned: false,
        prev_hash,
        hash: String::new(),
    };
    rec.hash = rec.compute_hash();
    tx.execute(
        "INSERT INTO audit (seq, at, actor, model, rollout, kind, body, prev_hash, hash, body_digest)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
        params![
            rec.seq,
            rec.at.0,
            rec.actor,
            rec.model,
            rec.rollout,
            rec.kind,
            rec.body.to_string(),
            rec.prev_hash,
            rec.hash,
            rec.body_digest
        ],
    )?;
    Ok(())
}

fn json_col<T: serde::de::DeserializeOwned>(r: &Row, i: usize) -> rusqlite::Result<T> {
    let s: String = r.get(i)?;
    serde_json::from_str(&s).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(i, rusqlite::types::Type::Text, Box::new(e))
    })
}

const MODEL_COLS: &str = "name, spec, champion, created_at";
fn model_row(r: &Row) -> rusqlite::Result<Model> {
    Ok(Model {
        name: r.get(0)?,
        spec: json_col(r, 1)?,
        champion: r.get(2)?,
        created_at: Timestamp(r.get(3)?),
    })
}

const REVISION_COLS: &str = "id, model, spec, state, rejections, blocked, created_at";
fn revision_row(r: &Row) -> rusqlite::Result<Revision> {
    let state: String = r.get(3)?;
    Ok(Revision {
        id: r.get(0)?,
        model: r.get(1)?,
        spec: json_col(r, 2)?,
        state: RevisionState::parse(&state).ok_or_else(|| {
            rusqlite::Error::FromSqlConversionFailure(3, rusqlite::types::Type::Text, state.into())
        })?,
        rejections: r.get(4)?,
        blocked: r.get(5)?,
        created_at: Timestamp(r.get(6)?),
    })
}

const ROLLOUT_COLS: &str = "id, spec, state, routing, version, created_at, updated_at";
fn rollout_row(r: &Row) -> rusqlite::Result<RolloutRecord> {
    Ok(RolloutRecord {
        id: r.get(0)?,
        spec: json_col(r, 1)?,
        state: json_col(r, 2)?,
        routing: json_col(r, 3)?,
        version: r.get(4)?,
        created_at: Timestamp(r.get(5)?),
        updated_at: Timestamp(r.get(6)?),
    })
}

const AUDIT_COLS: &str =
    "seq, at, actor, model, rollout, kind, body, prev_hash, hash, body_digest, pruned";
fn audit_row(r: &Row) -> rusqlite::Result<AuditRecord> {
    Ok(AuditRecord {
        seq: r.get(0)?,
        at: Timestamp(r.get(1)?),
        actor: r.get(2)?,
        model: r.get(3)?,
        rollout: r.get(4)?,
        kind: r.get(5)?,
        // A body that is not JSON (edited in the database) is shown as
        // what it is; its hash no longer matches, so verification names
        // the record instead of failing as a whole.
        body: {
            let text: String = r.get(6)?;
            serde_json::from_str(&text)
                .unwrap_or_else(|_| serde_json::json!({ "unreadable_body": text }))
        },
        prev_hash: r.get(7)?,
        hash: r.get(8)?,
        body_digest: r.get(9)?,
        pruned: r.get::<_, i64>(10)? != 0,
    })
}

fn get_model(c: &Connection, name: &str) -> Result<Model> {
    c.query_row(
        &format!("SELECT {MODEL_COLS} FROM models WHERE name = ?1 AND deleted_at IS NULL"),
        [name],
        model_row,
    )
    .optional()?
    .ok_or_else(|| StoreError::NotFound {
        what: "model",
        name: name.to_string(),
    })
}

fn get_revision(c: &Connection, id: &str) -> Result<Revision> {
    c.query_row(
        &format!("SELECT {REVISION_COLS} FROM revisions WHERE id = ?1"),
        [id],
        revision_row,
    )
    .optional()?
    .ok_or_else(|| StoreError::NotFound {
        what: "revision",
        name: id.to_string(),
    })
}

fn get_rollout(c: &Connection, id: i64) -> Result<RolloutRecord> {
    c.query_row(
        &format!("SELECT {ROLLOUT_COLS} FROM rollouts WHERE id = ?1"),
        [id],
        rollout_row,
    )
    .optional()?
    .ok_or_else(|| StoreError::NotFound {
        what: "rollout",
        name: id.to_string(),
    })
}

/// The revision `id`, which must belong to `model`.
fn revision_of(c: &Connection, model: &str, id: &str) -> Result<Revision> {
    let rev = get_revision(c, id)?;
    if rev.model != model {
        return Err(StoreError::Invalid(format!(
            "revision {id} belongs to model {:?}, not {model:?}",
            rev.model
        )));
    }
    Ok(rev)
}

/// A rejected revision stays out until an operator unblocks it.
fn not_blocked(rev: &Revision) -> Result<()> {
    if rev.blocked {
        return Err(StoreError::Rejected {
            revision: rev.id.clone(),
            rejections: rev.rejections,
        });
    }
    Ok(())
}

fn set_state(tx: &Transaction, revision: &str, state: RevisionState) -> Result<()> {
    tx.execute(
        "UPDATE revisions SET state = ?2 WHERE id = ?1",
        params![revision, state.as_str()],
    )?;
    Ok(())
}

fn active_rollout(c: &Connection, model: &str) -> Result<Option<i64>> {
    Ok(c.query_row(
        "SELECT id FROM rollouts WHERE model = ?1 AND active = 1",
        [model],
        |r| r.get(0),
    )
    .optional()?)
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

/// Champion hand-over inside `tx`: the old champion is archived in the same
/// transaction, so there is never a moment with two champions or none.
fn promote_in(
    tx: &Transaction,
    now: Timestamp,
    model: &Model,
    to: &str,
    actor: &str,
    body: serde_json::Value,
    rollout: Option<i64>,
) -> Result<()> {
    if let Some(old) = &model.champion {
        set_state(tx, old, RevisionState::Archived)?;
    }
    set_state(tx, to, RevisionState::Champion)?;
    tx.execute(
        "UPDATE models SET champion = ?2 WHERE name = ?1",
        params![model.name, to],
    )?;
    append_audit(tx, now, actor, &model.name, rollout, "champion_set", body)
}

fn apply_in(tx: &Transaction, now: Timestamp, w: &TransitionWrite) -> Result<RolloutRecord> {
    let current = get_rollout(tx, w.rollout)?;
    if current.version != w.expected_version {
        return Err(StoreError::VersionConflict {
            id: w.rollout,
            expected: w.expected_version,
            found: current.version,
        });
    }
    let spec = &current.spec;
    let mut routing = current.routing;
    for effect in w.effects {
        match effect {
            Effect::SetRouting { routing: r } => routing = *r,
            Effect::PromoteCandidate => {
                let model = get_model(tx, &spec.model)?;
                let body = serde_json::json!({
                    "from": model.champion, "to": spec.candidate, "rollout": w.rollout
                });
                promote_in(
                    tx,
                    now,
                    &model,
                    &spec.candidate,
                    w.actor,
                    body,
                    Some(w.rollout),
                )?;
                routing = Routing::CHAMPION_ONLY;
            }
            Effect::RejectCandidate => {
                tx.execute(
                    "UPDATE revisions SET state = 'rejected', rejections = rejections + 1, blocked = 1
                     WHERE id = ?1",
                    [&spec.candidate],
                )?;
                let rev = get_revision(tx, &spec.candidate)?;
                append_audit(
                    tx,
                    now,
                    w.actor,
                    &spec.model,
                    Some(w.rollout),
                    "revision_rejected",
                    serde_json::json!({ "revision": rev.id, "rejections": rev.rejections }),
                )?;
            }
            Effect::Audit { event } => {
                let kind = serde_json::to_value(event.kind)?;
                let kind = kind.as_str().unwrap_or("event").to_string();
                append_audit(
                    tx,
                    now,
                    w.actor,
                    &spec.model,
                    Some(w.rollout),
                    &kind,
                    serde_json::to_value(event)?,
                )?;
            }
        }
    }
    let terminal = w.state.phase.is_terminal();
    if terminal {
        // An aborted rollout frees its candidate; promoted and rejected ones
        // were moved by their effects.
        tx.execute(
            "UPDATE revisions SET state = 'available' WHERE id = ?1 AND state = 'candidate'",
            [&spec.candidate],
        )?;
    }
    let version = current.version + 1;
    tx.execute(
        "UPDATE rollouts SET state = ?2, phase = ?3, active = ?4, routing = ?5, version = ?6, updated_at = ?7
         WHERE id = ?1",
        params![
            w.rollout,
            serde_json::to_string(w.state)?,
            w.state.phase.name(),
            !terminal,
            serde_json::to_string(&routing)?,
            version,
            now.0
        ],
    )?;
    Ok(RolloutRecord {
        state: w.state.clone(),
        routing,
        version,
        updated_at: now,
        ..current
    })
}

/// A json model's path must not be another model's.
fn path_is_free(c: &Connection, name: &str, spec: &ModelSpec) -> Result<()> {
    let Some(path) = &spec.json_path else {
        return Ok(());
    };
    let mut st =
        c.prepare("SELECT name, spec FROM models WHERE deleted_at IS NULL AND name != ?1")?;
    let rows = st.query_map([name], |r| {
        Ok((r.get::<_, String>(0)?, json_col::<ModelSpec>(r, 1)?))
    })?;
    for row in rows {
        let (other, spec) = row?;
        if spec.json_path.as_deref() == Some(path.as_str()) {
            return Err(StoreError::Invalid(format!(
                "model.json_path: {path:?} is already the path of model {other:?}"
            )));
        }
    }
    Ok(())
}

fn valid_name(name: &str) -> Result<()> {
    rollgate_core::spec::check_model_name(name)
        .map_err(|e| StoreError::Invalid(format!("model {}", e.message)))
}

impl Store for SqliteStore {
    fn create_model(&self, name: &str, spec: &ModelSpec, actor: &str) -> Result<Model> {
        valid_name(name)?;
        spec.validate()?;
        self.write(|tx, now| {
            if let Ok(existing) = get_model(tx, name) {
                return if existing.spec == *spec {
                    Ok(existing)
                } else {
                    Err(StoreError::Conflict(format!(
                        "model {name:?} exists with a different spec (change it with PUT /api/v1/models/{name})"
                    )))
                };
            }
            path_is_free(tx, name, spec)?;
            let deleted: bool = tx
                .query_row("SELECT 1 FROM models WHERE name = ?1", [name], |_| Ok(()))
                .optional()?
                .is_some();
            if deleted {
                // A deleted model created again: its revisions (and their
                // rejections) are still there; it starts without a champion.
                tx.execute(
                    "UPDATE models SET spec = ?2, champion = NULL, deleted_at = NULL WHERE name = ?1",
                    params![name, serde_json::to_string(spec)?],
                )?;
            } else {
                tx.execute(
                    "INSERT INTO models (name, spec, champion, created_at) VALUES (?1, ?2, NULL, ?3)",
                    params![name, serde_json::to_string(spec)?, now.0],
                )?;
            }
            append_audit(
                tx,
                now,
                actor,
                name,
                None,
                "model_created",
                serde_json::to_value(spec)?,
            )?;
            get_model(tx, name)
        })
    }

    fn update_model(&self, name: &str, spec: &ModelSpec, actor: &str) -> Result<Model> {
        spec.validate()?;
        self.write(|tx, now| {
            let before = get_model(tx, name)?;
            if before.spec == *spec {
                return Ok(before);
            }
            if let Some(id) = active_rollout(tx, name)? {
                return Err(StoreError::Conflict(format!(
                    "model {name:?} has an active rollout ({id}); its spec changes once the rollout ends"
                )));
            }
            path_is_free(tx, name, spec)?;
            tx.execute(
                "UPDATE models SET spec = ?2 WHERE name = ?1",
                params![name, serde_json::to_string(spec)?],
            )?;
            append_audit(
                tx,
                now,
                actor,
                name,
                None,
                "model_updated",
                serde_json::json!({ "from": before.spec, "to": spec }),
            )?;
            get_model(tx, name)
        })
    }

    fn delete_model(&self, name: &str, actor: &str, reason: &str) -> Result<()> {
        let reason = require_reason(reason, "deleting a model")?;
        self.write(|tx, now| {
            let model = get_model(tx, name)?;
            if let Some(id) = active_rollout(tx, name)? {
                return Err(StoreError::Conflict(format!(
                    "model {name:?} has an active rollout ({id}); abort it first"
                )));
            }
            tx.execute(
                "UPDATE models SET champion = NULL, deleted_at = ?2 WHERE name = ?1",
                params![name, now.0],
            )?;
            tx.execute(
                "UPDATE revisions SET state = 'archived' WHERE model = ?1 AND state = 'champion'",
                [name],
            )?;
            append_audit(
                tx,
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

    fn model(&self, name: &str) -> Result<Model> {
        self.read(|c| get_model(c, name))
    }

    fn models(&self) -> Result<Vec<Model>> {
        self.read(|c| {
            let mut st = c.prepare(&format!(
                "SELECT {MODEL_COLS} FROM models WHERE deleted_at IS NULL ORDER BY name"
            ))?;
            let rows = st.query_map([], model_row)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    fn register_revision(&self, model: &str, spec: &RevisionSpec, actor: &str) -> Result<Revision> {
        let normalised = spec.normalised()?;
        let id = spec.identity(model)?;
        self.write(|tx, now| {
            get_model(tx, model)?;
            if let Ok(existing) = get_revision(tx, &id) {
                return Ok(existing);
            }
            tx.execute(
                "INSERT INTO revisions (id, model, spec, state, created_at) VALUES (?1, ?2, ?3, 'available', ?4)",
                params![id, model, serde_json::to_string(&normalised)?, now.0],
            )?;
            append_audit(
                tx,
                now,
                actor,
                model,
                None,
                "revision_registered",
                serde_json::json!({ "revision": id, "spec": normalised.redacted() }),
            )?;
            get_revision(tx, &id)
        })
    }

    fn revision(&self, id: &str) -> Result<Revision> {
        self.read(|c| get_revision(c, id))
    }

    fn revisions(&self, model: &str) -> Result<Vec<Revision>> {
        self.read(|c| {
            get_model(c, model)?;
            let mut st = c.prepare(&format!(
                "SELECT {REVISION_COLS} FROM revisions WHERE model = ?1 ORDER BY created_at, id"
            ))?;
            let rows = st.query_map([model], revision_row)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    fn set_champion(
        &self,
        model: &str,
        revision: &str,
        actor: &str,
        reason: &str,
    ) -> Result<Revision> {
        let reason = require_reason(reason, "setting the champion")?;
        self.write(|tx, now| {
            let m = get_model(tx, model)?;
            let rev = revision_of(tx, model, revision)?;
            if let Some(id) = active_rollout(tx, model)? {
                return Err(StoreError::Conflict(format!(
                    "rollout {id} is active on model {model:?}; promote or abort it instead"
                )));
            }
            not_blocked(&rev)?;
            if m.champion.as_deref() == Some(revision) {
                return Ok(rev);
            }
            let body = serde_json::json!({ "from": m.champion, "to": revision, "reason": reason });
            promote_in(tx, now, &m, revision, actor, body, None)?;
            get_revision(tx, revision)
        })
    }

    fn unblock(&self, revision: &str, actor: &str, reason: &str) -> Result<Revision> {
        let reason = require_reason(reason, "unblocking a revision")?;
        self.write(|tx, now| {
            let rev = get_revision(tx, revision)?;
            if !rev.blocked {
                return Err(StoreError::Conflict(format!("revision {revision} is not blocked")));
            }
            tx.execute(
                "UPDATE revisions SET blocked = 0, state = 'available' WHERE id = ?1",
                [revision],
            )?;
            append_audit(
                tx,
                now,
                actor,
                &rev.model,
                None,
                "revision_unblocked",
                serde_json::json!({ "revision": revision, "rejections": rev.rejections, "reason": reason }),
            )?;
            get_revision(tx, revision)
        })
    }

    fn create_rollout(
        &self,
        model: &str,
        candidate: &str,
        plan: &Plan,
        actor: &str,
    ) -> Result<RolloutRecord> {
        plan.validate()
            .map_err(|e| StoreError::Invalid(e.to_string()))?;
        self.write(|tx, now| {
            let m = get_model(tx, model)?;
            let rev = revision_of(tx, model, candidate)?;
            let Some(champion) = m.champion.clone() else {
                return Err(StoreError::Conflict(format!(
                    "model {model:?} has no champion yet; set one first"
                )));
            };
            if champion == candidate {
                return Err(StoreError::Conflict(format!(
                    "revision {candidate} is already the champion of {model:?}"
                )));
            }
            not_blocked(&rev)?;
            if let Some(id) = active_rollout(tx, model)? {
                return Err(StoreError::Conflict(format!(
                    "rollout {id} is already active on model {model:?}"
                )));
            }
            let spec = RolloutSpec {
                model: model.to_string(),
                champion,
                candidate: candidate.to_string(),
                plan: plan.clone(),
            };
            let state = RolloutState::new(now);
            set_state(tx, candidate, RevisionState::Candidate)?;
            tx.execute(
                "INSERT INTO rollouts (model, spec, state, phase, active, routing, version, created_at, updated_at)
                 VALUES (?1, ?2, ?3, ?4, 1, ?5, 0, ?6, ?6)",
                params![
                    model,
                    serde_json::to_string(&spec)?,
                    serde_json::to_string(&state)?,
                    state.phase.name(),
                    serde_json::to_string(&Routing::CHAMPION_ONLY)?,
                    now.0
                ],
            )?;
            let id = tx.last_insert_rowid();
            append_audit(
                tx,
                now,
                actor,
                model,
                Some(id),
                "rollout_created",
                serde_json::json!({ "champion": spec.champion, "candidate": candidate, "plan": plan }),
            )?;
            get_rollout(tx, id)
        })
    }

    fn rollout(&self, id: i64) -> Result<RolloutRecord> {
        self.read(|c| get_rollout(c, id))
    }

    fn rollouts(&self, active_only: bool) -> Result<Vec<RolloutRecord>> {
        self.read(|c| {
            let mut st = c.prepare(&format!(
                "SELECT {ROLLOUT_COLS} FROM rollouts WHERE (?1 = 0 OR active = 1) ORDER BY id DESC"
            ))?;
            let rows = st.query_map([active_only], rollout_row)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    fn apply(&self, write: TransitionWrite) -> Result<RolloutRecord> {
        self.write(|tx, now| apply_in(tx, now, &write))
    }

    fn apply_batch(&self, writes: &[TransitionWrite]) -> Result<Vec<RolloutRecord>> {
        self.write(|tx, now| writes.iter().map(|w| apply_in(tx, now, w)).collect())
    }

    fn audit(&self, filter: &AuditFilter) -> Result<Vec<AuditRecord>> {
        self.read(|c| {
            let mut st = c.prepare(&format!(
                "SELECT {AUDIT_COLS} FROM audit
                 WHERE (?1 IS NULL OR model = ?1) AND (?2 IS NULL OR rollout = ?2) AND seq > ?3
                 ORDER BY seq LIMIT ?4"
            ))?;
            let rows = st.query_map(
                params![
                    filter.model,
                    filter.rollout,
                    // Beyond SQLite's integers nothing can follow.
                    filter.after_seq.unwrap_or(0).min(i64::MAX as u64) as i64,
                    filter.limit.map_or(-1, |l| l.min(i64::MAX as u64) as i64)
                ],
                audit_row,
            )?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    fn heartbeat(&self, id: &str, stats_url: &str) -> Result<()> {
        self.write(|tx, now| {
            tx.execute(
                "INSERT INTO gateways (id, stats_url, last_seen) VALUES (?1, ?2, ?3)
                 ON CONFLICT(id) DO UPDATE SET stats_url = excluded.stats_url, last_seen = excluded.last_seen",
                params![id, stats_url, now.0],
            )?;
            Ok(())
        })
    }

    fn gateways(&self, seen_within: std::time::Duration) -> Result<Vec<GatewayInfo>> {
        let since = (self.clock)()
            .0
            .saturating_sub(seen_within.as_millis() as u64);
        self.read(|c| {
            let mut st = c.prepare(
                "SELECT id, stats_url, last_seen FROM gateways WHERE last_seen >= ?1 ORDER BY id",
            )?;
            let rows = st.query_map([since], |r| {
                Ok(GatewayInfo {
                    id: r.get(0)?,
                    stats_url: r.get(1)?,
                    last_seen: Timestamp(r.get(2)?),
                })
            })?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    fn routes(&self) -> Result<Vec<ModelRoutes>> {
        // One read transaction: the routing of every model at one instant.
        let mut conn = self
            .conn
            .lock()
            .map_err(|_| StoreError::Conflict("store lock poisoned by an earlier panic".into()))?;
        let tx = conn.transaction()?;
        let models: Vec<Model> = {
            let mut st = tx.prepare(&format!(
                "SELECT {MODEL_COLS} FROM models WHERE deleted_at IS NULL ORDER BY name"
            ))?;
            let rows = st.query_map([], model_row)?;
            rows.collect::<rusqlite::Result<Vec<_>>>()?
        };
        let mut out = Vec::with_capacity(models.len());
        for model in models {
            let champion = match &model.champion {
                Some(id) => Some(get_revision(&tx, id)?),
                None => None,
            };
            let rollout = match active_rollout(&tx, &model.name)? {
                Some(id) => {
                    let r = get_rollout(&tx, id)?;
                    Some((get_revision(&tx, &r.spec.candidate)?, r.routing, r.id))
                }
                None => None,
            };
            out.push(ModelRoutes {
                model,
                champion,
                rollout,
            });
        }
        tx.commit()?;
        Ok(out)
    }

    fn create_token(
        &self,
        name: &str,
        role: Role,
        secret_hash: &str,
        actor: &str,
    ) -> Result<ApiToken> {
        if !valid_token_name(name) {
            return Err(StoreError::Invalid(format!(
                "token name {name:?}: use 1-64 of A-Z a-z 0-9 . _ @ -"
            )));
        }
        self.write(|tx, now| {
            let taken: bool = tx
                .query_row("SELECT 1 FROM tokens WHERE name = ?1", [name], |_| Ok(true))
                .optional()?
                .unwrap_or(false);
            if taken {
                return Err(StoreError::Conflict(format!(
                    "token name {name:?} is taken (names are never reused, even revoked ones)"
                )));
            }
            tx.execute(
                "INSERT INTO tokens (name, role, hash, created_at, created_by) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![name, role.as_str(), secret_hash, now.0, actor],
            )?;
            append_audit(
                tx,
                now,
                actor,
                "",
                None,
                "token_created",
                serde_json::json!({ "name": name, "role": role }),
            )?;
            Ok(ApiToken {
                name: name.to_string(),
                role,
                created_at: now,
                created_by: actor.to_string(),
                revoked_at: None,
            })
        })
    }

    fn tokens(&self) -> Result<Vec<ApiToken>> {
        self.read(|c| {
            let mut st = c.prepare(&format!("SELECT {TOKEN_COLS} FROM tokens ORDER BY name"))?;
            let rows = st.query_map([], token_row)?;
            rows.collect::<rusqlite::Result<Vec<_>>>()?
                .into_iter()
                .collect()
        })
    }

    fn revoke_token(&self, name: &str, actor: &str) -> Result<ApiToken> {
        self.write(|tx, now| {
            let changed = tx.execute(
                "UPDATE tokens SET revoked_at = ?2 WHERE name = ?1 AND revoked_at IS NULL",
                params![name, now.0],
            )?;
            let token = tx
                .query_row(
                    &format!("SELECT {TOKEN_COLS} FROM tokens WHERE name = ?1"),
                    [name],
                    token_row,
                )
                .optional()?
                .ok_or_else(|| StoreError::NotFound {
                    what: "token",
                    name: name.to_string(),
                })??;
            if changed == 1 {
                append_audit(
                    tx,
                    now,
                    actor,
                    "",
                    None,
                    "token_revoked",
                    serde_json::json!({ "name": name, "role": token.role }),
                )?;
            }
            Ok(token)
        })
    }

    fn token_by_hash(&self, secret_hash: &str) -> Result<Option<ApiToken>> {
        self.read(|c| {
            c.query_row(
                &format!("SELECT {TOKEN_COLS} FROM tokens WHERE hash = ?1 AND revoked_at IS NULL"),
                [secret_hash],
                token_row,
            )
            .optional()?
            .transpose()
        })
    }

    fn prune_evaluations(&self, before: Timestamp) -> Result<u64> {
        self.write(|tx, _| {
            let n = tx.execute(
                "UPDATE audit SET body = ?2, pruned = 1
                 WHERE kind = 'evaluated' AND pruned = 0 AND at < ?1 AND body_digest IS NOT NULL",
                params![before.0, crate::audit::PRUNED_BODY],
            )?;
            Ok(n as u64)
        })
    }

    fn audit_head(&self) -> Result<Option<(u64, String)>> {
        self.read(|c| {
            Ok(c.query_row(
                "SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?)
        })
    }

    fn audit_hashes(&self, seqs: &[u64]) -> Result<std::collections::BTreeMap<u64, String>> {
        self.read(|c| {
            let mut st = c.prepare("SELECT hash FROM audit WHERE seq = ?1")?;
            let mut out = std::collections::BTreeMap::new();
            for &seq in seqs {
                if let Some(h) = st.query_row([seq], |r| r.get(0)).optional()? {
                    out.insert(seq, h);
                }
            }
            Ok(out)
        })
    }

    fn add_checkpoint(&self, cp: &Checkpoint) -> Result<()> {
        self.write(|tx, _| {
            tx.execute(
                "INSERT OR IGNORE INTO checkpoints (seq, hash, at, mac) VALUES (?1, ?2, ?3, ?4)",
                params![cp.seq, cp.hash, cp.at.0, cp.mac],
            )?;
            Ok(())
        })
    }

    fn checkpoints(&self) -> Result<Vec<Checkpoint>> {
        self.read(|c| {
            let mut st = c.prepare("SELECT seq, hash, at, mac FROM checkpoints ORDER BY seq")?;
            let rows = st.query_map([], |r| {
                Ok(Checkpoint {
                    seq: r.get(0)?,
                    hash: r.get(1)?,
                    at: Timestamp(r.get(2)?),
                    mac: r.get(3)?,
                })
            })?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    fn verify_audit(&self) -> Result<ChainReport> {
        let records = self.read(|c| {
            let mut st = c.prepare(&format!("SELECT {AUDIT_COLS} FROM audit ORDER BY rowid"))?;
            let rows = st.query_map([], audit_row)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })?;
        Ok(verify_chain(&records))
    }
}
