//! The store's logic, written once over a minimal SQL interface ([`Db`]) so
//! that the embedded engine (SQLite, `sqlite.rs`) and the shared one
//! (PostgreSQL, `postgres.rs`) run the same transactions, and the
//! conformance suite tests both.
//!
//! Statements are written with `?N` placeholders and in the common subset of
//! the two dialects; each engine keeps its own migrations, and its schema
//! enforces the invariants on its own, whatever the code does: one champion
//! and one candidate per model, one active rollout per model, an audit table
//! that refuses UPDATE and DELETE.
//!
//! Writes are serialised (SQLite: one IMMEDIATE transaction at a time;
//! PostgreSQL: a transaction-scoped advisory lock), because the audit log is
//! one hash chain: each record names the one before it.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rollgate_core::{Effect, Plan, RolloutSpec, RolloutState, Routing, Timestamp};

use crate::audit::{AuditFilter, AuditRecord, ChainReport, GENESIS, verify_chain};
use crate::checkpoint::Checkpoint;
use crate::registry::{Model, ModelSpec, Revision, RevisionSpec, RevisionState};
use crate::tokens::{ApiToken, Role, valid_token_name};
use crate::{
    Fence, GatewayInfo, Lease, ModelRoutes, Result, RolloutRecord, Store, StoreError,
    TransitionWrite,
};

/// A value bound to or read from a statement: the three types the schema
/// uses (integers, text and NULL), the same in both engines.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Val {
    Null,
    Int(i64),
    Text(String),
}

impl From<i64> for Val {
    fn from(v: i64) -> Self {
        Val::Int(v)
    }
}
impl From<u64> for Val {
    fn from(v: u64) -> Self {
        // Timestamps, versions and sequence numbers; beyond i64 nothing exists.
        Val::Int(i64::try_from(v).unwrap_or(i64::MAX))
    }
}
impl From<u32> for Val {
    fn from(v: u32) -> Self {
        Val::Int(i64::from(v))
    }
}
impl From<bool> for Val {
    fn from(v: bool) -> Self {
        Val::Int(i64::from(v))
    }
}
impl From<&str> for Val {
    fn from(v: &str) -> Self {
        Val::Text(v.to_string())
    }
}
impl From<String> for Val {
    fn from(v: String) -> Self {
        Val::Text(v)
    }
}
impl From<&String> for Val {
    fn from(v: &String) -> Self {
        Val::Text(v.clone())
    }
}
impl<T: Into<Val>> From<Option<T>> for Val {
    fn from(v: Option<T>) -> Self {
        v.map_or(Val::Null, Into::into)
    }
}

/// Binds values: `p![a, b]` is `&[Val::from(a), Val::from(b)]`.
macro_rules! p {
    ($($v:expr),* $(,)?) => { &[$($crate::sql::Val::from($v)),*] };
}

/// One result row.
#[derive(Debug)]
pub(crate) struct Row(pub(crate) Vec<Val>);

fn bad_column(i: usize, want: &str, got: &Val) -> StoreError {
    StoreError::Database(format!("stored data: column {i} is {got:?}, expected {want}").into())
}

impl Row {
    fn get(&self, i: usize) -> &Val {
        self.0.get(i).unwrap_or(&Val::Null)
    }
    fn i64(&self, i: usize) -> Result<i64> {
        match self.get(i) {
            Val::Int(v) => Ok(*v),
            v => Err(bad_column(i, "an integer", v)),
        }
    }
    fn u64(&self, i: usize) -> Result<u64> {
        let v = self.i64(i)?;
        u64::try_from(v).map_err(|_| bad_column(i, "a non-negative integer", &Val::Int(v)))
    }
    fn u32(&self, i: usize) -> Result<u32> {
        let v = self.i64(i)?;
        u32::try_from(v).map_err(|_| bad_column(i, "a small integer", &Val::Int(v)))
    }
    fn bool(&self, i: usize) -> Result<bool> {
        Ok(self.i64(i)? != 0)
    }
    fn opt_u64(&self, i: usize) -> Result<Option<u64>> {
        match self.get(i) {
            Val::Null => Ok(None),
            _ => self.u64(i).map(Some),
        }
    }
    fn opt_i64(&self, i: usize) -> Result<Option<i64>> {
        match self.get(i) {
            Val::Null => Ok(None),
            _ => self.i64(i).map(Some),
        }
    }
    fn text(&self, i: usize) -> Result<String> {
        match self.get(i) {
            Val::Text(s) => Ok(s.clone()),
            v => Err(bad_column(i, "text", v)),
        }
    }
    fn opt_text(&self, i: usize) -> Result<Option<String>> {
        match self.get(i) {
            Val::Null => Ok(None),
            _ => self.text(i).map(Some),
        }
    }
    fn ts(&self, i: usize) -> Result<Timestamp> {
        self.u64(i).map(Timestamp)
    }
    fn json<T: serde::de::DeserializeOwned>(&self, i: usize) -> Result<T> {
        Ok(serde_json::from_str(&self.text(i)?)?)
    }
}

/// One open transaction (or connection) of an engine.
pub(crate) trait Db {
    /// Runs a statement; returns how many rows it changed.
    fn exec(&mut self, sql: &str, params: &[Val]) -> Result<u64>;
    /// Runs a query; returns every row.
    fn rows(&mut self, sql: &str, params: &[Val]) -> Result<Vec<Row>>;
    /// What this transaction remembers between statements.
    fn memo(&mut self) -> &mut TxMemo;
    /// The database's own clock in epoch milliseconds, as an SQL
    /// expression, for the lease: hosts whose clocks disagree then agree
    /// on when a lease expires. `None`: the store's clock is the only one
    /// (an embedded database on one host), bound as a parameter.
    fn clock_sql(&self) -> Option<&'static str> {
        None
    }
    /// What a fenced write's read of its lease row appends so that a
    /// take-over waits for the write to end (PostgreSQL: `FOR SHARE`):
    /// no write commits under a token after the token was replaced.
    fn share_lock_sql(&self) -> &'static str {
        ""
    }
}

/// What a write transaction remembers between its statements, to save
/// round trips (they dominate on a networked database).
#[derive(Debug, Default)]
pub(crate) struct TxMemo {
    /// The audit chain's head as this transaction left it.
    audit_head: Option<(u64, String)>,
    /// Audit records appended, written in one statement at commit.
    pending_audit: Vec<AuditRecord>,
    /// Rollouts a batch read in one query, before applying to each.
    rollouts: std::collections::HashMap<i64, RolloutRecord>,
    /// Whether anything gateways route changed (the version moves once,
    /// at the end).
    routes_changed: bool,
}

impl dyn Db + '_ {
    /// The first row, if any.
    fn row(&mut self, sql: &str, params: &[Val]) -> Result<Option<Row>> {
        Ok(self.rows(sql, params)?.into_iter().next())
    }
}

/// What a [`Db`] callback does inside an engine's transaction.
pub(crate) type Work<'a> = &'a mut dyn FnMut(&mut dyn Db) -> Result<()>;

/// A database engine: how to run a serialised write transaction and a
/// consistent read.
pub(crate) trait Engine: Send + Sync {
    /// Runs `work` in one write transaction, serialised with every other
    /// writer; commits if it returns Ok and rolls back entirely if not.
    fn write(&self, work: Work) -> Result<()>;
    /// Runs `work` on one consistent snapshot of the database.
    fn read(&self, work: Work) -> Result<()>;
    /// Runs `work`, which runs one statement: no snapshot to hold, so a
    /// networked engine saves the round trips of a transaction.
    fn read_one(&self, work: Work) -> Result<()> {
        self.read(work)
    }
    /// Runs `work`, one statement on the lease table, atomically but not
    /// serialised with the writers (PostgreSQL); by default as a write.
    fn lease(&self, work: Work) -> Result<()> {
        self.write(work)
    }
    /// `sqlite` or `postgres`.
    fn name(&self) -> &'static str;
}

pub(crate) type Clock = Box<dyn Fn() -> Timestamp + Send + Sync>;

pub(crate) fn system_clock() -> Timestamp {
    Timestamp(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
    )
}

/// The [`Store`]: rollgate's logic over a SQL engine. Open it with
/// [`SqlStore::open_dir`] (embedded SQLite, the default) or
/// [`SqlStore::connect`] (a PostgreSQL URL), or [`SqlStore::open`] for either.
pub struct SqlStore {
    engine: Box<dyn Engine>,
    clock: Clock,
    group: GroupCommit,
}

/// Group commit of concurrent `apply` calls: whoever finds no commit in
/// progress commits every transition queued so far in one transaction
/// (`apply_batch`); those arriving meanwhile wait and form the next group.
/// No timer and no added latency: a lone writer commits at once. A group
/// is all-or-nothing, so when it fails (one version conflict, say) each of
/// its transitions is applied on its own and gets its own answer.
#[derive(Default)]
struct GroupCommit {
    queue: std::sync::Mutex<Queue>,
    done: std::sync::Condvar,
}

#[derive(Default)]
struct Queue {
    next: u64,
    waiting: Vec<(u64, OwnedWrite)>,
    results: std::collections::HashMap<u64, Result<RolloutRecord>>,
    committing: bool,
}

/// A transition queued for a group (owned: another thread commits it).
struct OwnedWrite {
    rollout: i64,
    expected_version: u64,
    state: RolloutState,
    effects: Vec<Effect>,
    actor: String,
    fence: Option<Fence>,
}

impl OwnedWrite {
    fn of(w: &TransitionWrite) -> OwnedWrite {
        OwnedWrite {
            rollout: w.rollout,
            expected_version: w.expected_version,
            state: w.state.clone(),
            effects: w.effects.to_vec(),
            actor: w.actor.to_string(),
            fence: w.fence.clone(),
        }
    }

    fn borrowed(&self) -> TransitionWrite<'_> {
        TransitionWrite {
            rollout: self.rollout,
            expected_version: self.expected_version,
            state: &self.state,
            effects: &self.effects,
            actor: &self.actor,
            fence: self.fence.clone(),
        }
    }
}

impl GroupCommit {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Ends a group's commit however it ends: with its results, or (if the
/// commit panicked) with an error for each of its transitions, so no thread
/// waiting on it waits for ever.
struct Committing<'a> {
    group: &'a GroupCommit,
    ids: Vec<u64>,
    results: Vec<(u64, Result<RolloutRecord>)>,
}

impl Drop for Committing<'_> {
    fn drop(&mut self) {
        let mut q = self.group.lock();
        let mut results = std::mem::take(&mut self.results);
        if results.is_empty() {
            results = self
                .ids
                .iter()
                .map(|id| {
                    let e = StoreError::Database("the group commit failed".into());
                    (*id, Err(e))
                })
                .collect();
        }
        q.results.extend(results);
        q.committing = false;
        self.group.done.notify_all();
    }
}

impl std::fmt::Debug for SqlStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlStore")
            .field("engine", &self.engine.name())
            .finish_non_exhaustive()
    }
}

impl SqlStore {
    pub(crate) fn with_engine(engine: Box<dyn Engine>) -> SqlStore {
        SqlStore {
            engine,
            clock: Box::new(system_clock),
            group: GroupCommit::default(),
        }
    }

    /// Commits `write`, with whatever other transitions are queued, as one
    /// group (see [`GroupCommit`]).
    fn apply_grouped(&self, write: &TransitionWrite) -> Result<RolloutRecord> {
        let mut q = self.group.lock();
        let me = q.next;
        q.next += 1;
        q.waiting.push((me, OwnedWrite::of(write)));
        loop {
            if let Some(result) = q.results.remove(&me) {
                return result;
            }
            if q.committing {
                q = self.group.done.wait(q).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            q.committing = true;
            let group = std::mem::take(&mut q.waiting);
            drop(q);
            let mut ending = Committing {
                group: &self.group,
                ids: group.iter().map(|(id, _)| *id).collect(),
                results: Vec::new(),
            };
            ending.results = self.commit_group(&group);
            drop(ending);
            q = self.group.lock();
        }
    }

    fn commit_group(&self, group: &[(u64, OwnedWrite)]) -> Vec<(u64, Result<RolloutRecord>)> {
        let one = |w: &OwnedWrite| self.write(|db, now| apply_in(db, now, &w.borrowed()));
        if group.len() > 1 {
            let writes: Vec<TransitionWrite> = group.iter().map(|(_, w)| w.borrowed()).collect();
            if let Ok(records) = self.apply_batch(&writes) {
                return group
                    .iter()
                    .zip(records)
                    .map(|((id, _), r)| (*id, Ok(r)))
                    .collect();
            }
        }
        group.iter().map(|(id, w)| (*id, one(w))).collect()
    }

    /// Opens the store at `location`: a `postgres://` (or `postgresql://`)
    /// URL, or else the SQLite data directory.
    pub fn open(location: &str) -> Result<SqlStore> {
        SqlStore::open_with(location, crate::SessionLimits::default())
    }

    /// [`SqlStore::open`], a PostgreSQL store's sessions carrying `limits`.
    pub fn open_with(location: &str, limits: crate::SessionLimits) -> Result<SqlStore> {
        if crate::is_postgres_url(location) {
            SqlStore::connect_with(location, limits)
        } else {
            SqlStore::open_dir(std::path::Path::new(location))
        }
    }

    /// `sqlite` or `postgres`.
    pub fn engine(&self) -> &'static str {
        self.engine.name()
    }

    /// Replaces the wall clock (tests pass a fixed or stepping one).
    pub fn with_clock(mut self, clock: impl Fn() -> Timestamp + Send + Sync + 'static) -> Self {
        self.clock = Box::new(clock);
        self
    }

    /// Runs `f` in one serialised write transaction at one instant.
    fn write<T>(&self, f: impl FnOnce(&mut dyn Db, Timestamp) -> Result<T>) -> Result<T> {
        let now = (self.clock)();
        let mut f = Some(f);
        let mut out = None;
        self.engine.write(&mut |db| {
            if let Some(f) = f.take() {
                out = Some(f(db, now)?);
                flush_audit(db)?;
                if db.memo().routes_changed {
                    db.exec(
                        "UPDATE routes_version SET version = version + 1 WHERE id = 1",
                        &[],
                    )?;
                }
            }
            Ok(())
        })?;
        out.ok_or_else(|| StoreError::Database("the engine ran no transaction".into()))
    }

    /// Runs `f`, one statement on the lease table, outside the writers'
    /// serialisation: a take-over never waits behind a rollout commit or a
    /// heartbeat, only (PostgreSQL) behind a fenced write reading the
    /// lease's row, which the server ends if its client is cut off.
    fn lease_statement<T>(&self, f: impl FnOnce(&mut dyn Db, Timestamp) -> Result<T>) -> Result<T> {
        let now = (self.clock)();
        let mut f = Some(f);
        let mut out = None;
        self.engine.lease(&mut |db| {
            if let Some(f) = f.take() {
                out = Some(f(db, now)?);
            }
            Ok(())
        })?;
        out.ok_or_else(|| StoreError::Database("the engine ran no statement".into()))
    }

    /// Runs `f` on one consistent snapshot.
    fn read<T>(&self, f: impl FnOnce(&mut dyn Db) -> Result<T>) -> Result<T> {
        self.read_with(false, f)
    }

    /// Runs `f`, which runs exactly one statement.
    fn read_one<T>(&self, f: impl FnOnce(&mut dyn Db) -> Result<T>) -> Result<T> {
        self.read_with(true, f)
    }

    fn read_with<T>(&self, one: bool, f: impl FnOnce(&mut dyn Db) -> Result<T>) -> Result<T> {
        let mut f = Some(f);
        let mut out = None;
        let mut work = |db: &mut dyn Db| {
            if let Some(f) = f.take() {
                out = Some(f(db)?);
            }
            Ok(())
        };
        if one {
            self.engine.read_one(&mut work)?;
        } else {
            self.engine.read(&mut work)?;
        }
        out.ok_or_else(|| StoreError::Database("the engine ran no transaction".into()))
    }
}

const TOKEN_COLS: &str = "name, role, created_at, created_by, revoked_at";

/// A token row; an unknown role (a hand-edited database) is corrupt data.
fn token_row(r: &Row) -> Result<ApiToken> {
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

/// Appends one audit record, chained to the last one, inside the write.
fn append_audit(
    db: &mut dyn Db,
    at: Timestamp,
    actor: &str,
    model: &str,
    rollout: Option<i64>,
    kind: &str,
    body: serde_json::Value,
) -> Result<()> {
    let head = match db.memo().audit_head.take() {
        Some(head) => Some(head),
        None => audit_head_in(db)?,
    };
    let (prev_seq, prev_hash) = head.unwrap_or_else(|| (0, GENESIS.to_string()));
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
    let memo = db.memo();
    memo.audit_head = Some((rec.seq, rec.hash.clone()));
    memo.pending_audit.push(rec);
    Ok(())
}

/// Writes the transaction's audit records, many rows per statement (one
/// round trip per hundred records instead of one each).
fn flush_audit(db: &mut dyn Db) -> Result<()> {
    const COLS: usize = 10;
    let pending = std::mem::take(&mut db.memo().pending_audit);
    for chunk in pending.chunks(100) {
        let rows: Vec<String> = (0..chunk.len())
            .map(|r| {
                let ps: Vec<String> = (1..=COLS).map(|c| format!("?{}", r * COLS + c)).collect();
                format!("({})", ps.join(", "))
            })
            .collect();
        let mut params = Vec::with_capacity(chunk.len() * COLS);
        for rec in chunk {
            params.extend([
                Val::from(rec.seq),
                Val::from(rec.at.0),
                Val::from(&rec.actor),
                Val::from(&rec.model),
                Val::from(rec.rollout),
                Val::from(&rec.kind),
                Val::from(rec.body.to_string()),
                Val::from(&rec.prev_hash),
                Val::from(&rec.hash),
                Val::from(rec.body_digest.clone()),
            ]);
        }
        db.exec(
            &format!(
                "INSERT INTO audit (seq, at, actor, model, rollout, kind, body, prev_hash, hash, body_digest) VALUES {}",
                rows.join(", ")
            ),
            &params,
        )?;
    }
    Ok(())
}

fn audit_head_in(db: &mut dyn Db) -> Result<Option<(u64, String)>> {
    db.row("SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1", &[])?
        .map(|r| Ok((r.u64(0)?, r.text(1)?)))
        .transpose()
}

const MODEL_COLS: &str = "name, spec, champion, created_at";
fn model_row(r: &Row) -> Result<Model> {
    Ok(Model {
        name: r.text(0)?,
        spec: r.json(1)?,
        champion: r.opt_text(2)?,
        created_at: r.ts(3)?,
    })
}

const REVISION_COLS: &str = "id, model, spec, state, rejections, blocked, created_at";
fn revision_row(r: &Row) -> Result<Revision> {
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

const ROLLOUT_COLS: &str = "id, spec, state, routing, version, created_at, updated_at";
fn rollout_row(r: &Row) -> Result<RolloutRecord> {
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

const AUDIT_COLS: &str =
    "seq, at, actor, model, rollout, kind, body, prev_hash, hash, body_digest, pruned";
fn audit_row(r: &Row) -> Result<AuditRecord> {
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

fn all<T>(rows: Vec<Row>, f: impl Fn(&Row) -> Result<T>) -> Result<Vec<T>> {
    rows.iter().map(f).collect()
}

/// The one row `sql` finds, read by `row`; `what` `name` not found else.
fn one<T>(
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

fn get_model(db: &mut dyn Db, name: &str) -> Result<Model> {
    let sql = format!("SELECT {MODEL_COLS} FROM models WHERE name = ?1 AND deleted_at IS NULL");
    one(db, &sql, p![name], model_row, "model", name)
}

fn get_revision(db: &mut dyn Db, id: &str) -> Result<Revision> {
    let sql = format!("SELECT {REVISION_COLS} FROM revisions WHERE id = ?1");
    one(db, &sql, p![id], revision_row, "revision", id)
}

fn get_rollout(db: &mut dyn Db, id: i64) -> Result<RolloutRecord> {
    let sql = format!("SELECT {ROLLOUT_COLS} FROM rollouts WHERE id = ?1");
    one(db, &sql, p![id], rollout_row, "rollout", &id.to_string())
}

/// The revision `id`, which must belong to `model`.
fn revision_of(db: &mut dyn Db, model: &str, id: &str) -> Result<Revision> {
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
fn not_blocked(rev: &Revision) -> Result<()> {
    if rev.blocked {
        return Err(StoreError::Rejected {
            revision: rev.id.clone(),
            rejections: rev.rejections,
        });
    }
    Ok(())
}

fn set_state(db: &mut dyn Db, revision: &str, state: RevisionState) -> Result<()> {
    db.exec(
        "UPDATE revisions SET state = ?2 WHERE id = ?1",
        p![revision, state.as_str()],
    )?;
    Ok(())
}

fn active_rollout(db: &mut dyn Db, model: &str) -> Result<Option<i64>> {
    db.row(
        "SELECT id FROM rollouts WHERE model = ?1 AND active = 1",
        p![model],
    )?
    .map(|r| r.i64(0))
    .transpose()
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

/// Champion hand-over inside the write: the old champion is archived in the
/// same transaction, so there is never a moment with two champions or none.
fn promote_in(
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

/// The fencing check: a write made under a lease lands only while that
/// lease's token is still the current one.
fn check_fence(db: &mut dyn Db, fence: &Fence) -> Result<()> {
    let sql = format!(
        "SELECT token FROM leases WHERE name = ?1{}",
        db.share_lock_sql()
    );
    let current = db
        .row(&sql, p![&fence.lease])?
        .map(|r| r.u64(0))
        .transpose()?;
    if current != Some(fence.token) {
        return Err(StoreError::Fenced {
            lease: fence.lease.clone(),
            token: fence.token,
            current,
        });
    }
    Ok(())
}

fn apply_in(db: &mut dyn Db, now: Timestamp, w: &TransitionWrite) -> Result<RolloutRecord> {
    if let Some(fence) = &w.fence {
        check_fence(db, fence)?;
    }
    let current = match db.memo().rollouts.remove(&w.rollout) {
        Some(prefetched) => prefetched,
        None => get_rollout(db, w.rollout)?,
    };
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
                let model = get_model(db, &spec.model)?;
                let body = serde_json::json!({
                    "from": model.champion, "to": spec.candidate, "rollout": w.rollout
                });
                promote_in(
                    db,
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
                db.exec(
                    "UPDATE revisions SET state = 'rejected', rejections = rejections + 1, blocked = 1
                     WHERE id = ?1",
                    p![&spec.candidate],
                )?;
                let rev = get_revision(db, &spec.candidate)?;
                append_audit(
                    db,
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
                    db,
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
        db.exec(
            "UPDATE revisions SET state = 'available' WHERE id = ?1 AND state = 'candidate'",
            p![&spec.candidate],
        )?;
    }
    let version = current.version + 1;
    db.exec(
        "UPDATE rollouts SET state = ?2, phase = ?3, active = ?4, routing = ?5, version = ?6, updated_at = ?7
         WHERE id = ?1",
        p![
            w.rollout,
            serde_json::to_string(w.state)?,
            w.state.phase.name(),
            !terminal,
            serde_json::to_string(&routing)?,
            version,
            now.0
        ],
    )?;
    // What gateways route: the routing, the champion (promotion), the
    // candidate while active (rejection, the end of the rollout).
    if routing != current.routing
        || terminal
        || w.effects
            .iter()
            .any(|e| matches!(e, Effect::PromoteCandidate | Effect::RejectCandidate))
    {
        routes_changed(db);
    }
    Ok(RolloutRecord {
        state: w.state.clone(),
        routing,
        version,
        updated_at: now,
        ..current
    })
}

/// Every change to what gateways route bumps one counter (once per
/// transaction), so a follower polls one row and reads the routes only when
/// they changed.
fn routes_changed(db: &mut dyn Db) {
    db.memo().routes_changed = true;
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

/// What gateways route for `model`: its champion and active rollout.
fn model_routes_in(db: &mut dyn Db, model: Model) -> Result<ModelRoutes> {
    let champion = match &model.champion {
        Some(id) => Some(get_revision(db, id)?),
        None => None,
    };
    let (rollout, rollout_seen) = match active_rollout(db, &model.name)? {
        Some(id) => {
            let r = get_rollout(db, id)?;
            let candidate = get_revision(db, &r.spec.candidate)?;
            let seen = r
                .state
                .evidence
                .seen()
                .map(|(s, at)| (s.to_string(), at))
                .collect();
            (Some((candidate, r.routing, r.id)), seen)
        }
        None => (None, Default::default()),
    };
    Ok(ModelRoutes {
        model,
        champion,
        rollout,
        rollout_seen,
    })
}

fn valid_name(name: &str) -> Result<()> {
    rollgate_core::spec::check_model_name(name)
        .map_err(|e| StoreError::Invalid(format!("model {}", e.message)))
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Store for SqlStore {
    fn create_model(&self, name: &str, spec: &ModelSpec, actor: &str) -> Result<Model> {
        valid_name(name)?;
        spec.validate()?;
        self.write(|db, now| {
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

    fn update_model(&self, name: &str, spec: &ModelSpec, actor: &str) -> Result<Model> {
        spec.validate()?;
        self.write(|db, now| {
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

    fn delete_model(&self, name: &str, actor: &str, reason: &str) -> Result<()> {
        let reason = require_reason(reason, "deleting a model")?;
        self.write(|db, now| {
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

    fn model(&self, name: &str) -> Result<Model> {
        self.read_one(|db| get_model(db, name))
    }

    fn models(&self) -> Result<Vec<Model>> {
        self.read_one(|db| {
            let rows = db.rows(
                &format!("SELECT {MODEL_COLS} FROM models WHERE deleted_at IS NULL ORDER BY name"),
                &[],
            )?;
            all(rows, model_row)
        })
    }

    fn register_revision(&self, model: &str, spec: &RevisionSpec, actor: &str) -> Result<Revision> {
        let normalised = spec.normalised()?;
        let id = spec.identity(model)?;
        self.write(|db, now| {
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

    fn revision(&self, id: &str) -> Result<Revision> {
        self.read_one(|db| get_revision(db, id))
    }

    fn revisions(&self, model: &str) -> Result<Vec<Revision>> {
        self.read(|db| {
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

    fn set_champion(
        &self,
        model: &str,
        revision: &str,
        actor: &str,
        reason: &str,
    ) -> Result<Revision> {
        let reason = require_reason(reason, "setting the champion")?;
        self.write(|db, now| {
            let m = get_model(db, model)?;
            let rev = revision_of(db, model, revision)?;
            if let Some(id) = active_rollout(db, model)? {
                return Err(StoreError::Conflict(format!(
                    "rollout {id} is active on model {model:?}; promote or abort it instead"
                )));
            }
            not_blocked(&rev)?;
            if m.champion.as_deref() == Some(revision) {
                return Ok(rev);
            }
            let body = serde_json::json!({ "from": m.champion, "to": revision, "reason": reason });
            promote_in(db, now, &m, revision, actor, body, None)?;
            routes_changed(db);
            get_revision(db, revision)
        })
    }

    fn unblock(&self, revision: &str, actor: &str, reason: &str) -> Result<Revision> {
        let reason = require_reason(reason, "unblocking a revision")?;
        self.write(|db, now| {
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

    fn create_rollout(
        &self,
        model: &str,
        candidate: &str,
        plan: &Plan,
        actor: &str,
    ) -> Result<RolloutRecord> {
        plan.validate()
            .map_err(|e| StoreError::Invalid(e.to_string()))?;
        self.write(|db, now| {
            let m = get_model(db, model)?;
            let rev = revision_of(db, model, candidate)?;
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
            if let Some(id) = active_rollout(db, model)? {
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
            set_state(db, candidate, RevisionState::Candidate)?;
            let id = db
                .row(
                    "INSERT INTO rollouts (model, spec, state, phase, active, routing, version, created_at, updated_at)
                     VALUES (?1, ?2, ?3, ?4, 1, ?5, 0, ?6, ?6) RETURNING id",
                    p![
                        model,
                        serde_json::to_string(&spec)?,
                        serde_json::to_string(&state)?,
                        state.phase.name(),
                        serde_json::to_string(&Routing::CHAMPION_ONLY)?,
                        now.0
                    ],
                )?
                .ok_or_else(|| StoreError::Database("INSERT returned no id".into()))?
                .i64(0)?;
            routes_changed(db);
            append_audit(
                db,
                now,
                actor,
                model,
                Some(id),
                "rollout_created",
                serde_json::json!({ "champion": spec.champion, "candidate": candidate, "plan": plan }),
            )?;
            get_rollout(db, id)
        })
    }

    fn rollout(&self, id: i64) -> Result<RolloutRecord> {
        self.read_one(|db| get_rollout(db, id))
    }

    fn rollouts(&self, active_only: bool) -> Result<Vec<RolloutRecord>> {
        self.read_one(|db| {
            let rows = db.rows(
                &format!(
                    "SELECT {ROLLOUT_COLS} FROM rollouts WHERE (?1 = 0 OR active = 1) ORDER BY id DESC"
                ),
                p![active_only],
            )?;
            all(rows, rollout_row)
        })
    }

    fn apply(&self, write: TransitionWrite) -> Result<RolloutRecord> {
        self.apply_grouped(&write)
    }

    fn apply_batch(&self, writes: &[TransitionWrite]) -> Result<Vec<RolloutRecord>> {
        self.write(|db, now| {
            // One read for the batch's rollouts (a rollout twice in a batch
            // is read again after its first write).
            let mut ids: Vec<i64> = writes.iter().map(|w| w.rollout).collect();
            ids.sort_unstable();
            ids.dedup();
            for chunk in ids.chunks(100) {
                let ps: Vec<String> = (1..=chunk.len()).map(|i| format!("?{i}")).collect();
                let params: Vec<Val> = chunk.iter().map(|&id| Val::from(id)).collect();
                let rows = db.rows(
                    &format!(
                        "SELECT {ROLLOUT_COLS} FROM rollouts WHERE id IN ({})",
                        ps.join(", ")
                    ),
                    &params,
                )?;
                for r in all(rows, rollout_row)? {
                    db.memo().rollouts.insert(r.id, r);
                }
            }
            writes.iter().map(|w| apply_in(db, now, w)).collect()
        })
    }

    fn audit(&self, filter: &AuditFilter) -> Result<Vec<AuditRecord>> {
        self.read_one(|db| {
            let rows = db.rows(
                &format!(
                    "SELECT {AUDIT_COLS} FROM audit
                     WHERE (CAST(?1 AS TEXT) IS NULL OR model = ?1)
                       AND (CAST(?2 AS BIGINT) IS NULL OR rollout = ?2) AND seq > ?3
                     ORDER BY seq LIMIT ?4"
                ),
                p![
                    filter.model.as_deref(),
                    filter.rollout,
                    filter.after_seq.unwrap_or(0),
                    filter.limit.unwrap_or(u64::MAX)
                ],
            )?;
            all(rows, audit_row)
        })
    }

    fn audit_sample(&self, rollout: i64, points: u64) -> Result<(Vec<AuditRecord>, u64)> {
        self.read_one(|db| {
            let evaluated = db
                .row(
                    "SELECT COUNT(*) FROM audit WHERE rollout = ?1 AND kind = 'evaluated'",
                    p![rollout],
                )?
                .map_or(Ok(0), |r| r.u64(0))?;
            let every = evaluated.div_ceil(points.max(1)).max(1);
            // Numbered in order, evaluations are kept at every `every`-th
            // and the last; a failing one's canonical body says so (the
            // caller reads the parsed outcome; this only keeps it).
            let rows = db.rows(
                &format!(
                    "SELECT {AUDIT_COLS} FROM audit WHERE rollout = ?1 AND (kind <> 'evaluated' OR seq IN (
                       SELECT seq FROM (
                         SELECT seq, body, ROW_NUMBER() OVER (ORDER BY seq) AS n FROM audit
                         WHERE rollout = ?1 AND kind = 'evaluated') numbered
                       WHERE n % ?2 = 0 OR n = ?3 OR body LIKE '%\"outcome\":\"fail\"%'))
                     ORDER BY seq"
                ),
                p![rollout, every, evaluated],
            )?;
            Ok((all(rows, audit_row)?, evaluated))
        })
    }

    fn heartbeat(&self, id: &str, stats_url: &str) -> Result<()> {
        self.write(|db, now| {
            db.exec(
                "INSERT INTO gateways (id, stats_url, last_seen) VALUES (?1, ?2, ?3)
                 ON CONFLICT(id) DO UPDATE SET stats_url = excluded.stats_url, last_seen = excluded.last_seen",
                p![id, stats_url, now.0],
            )?;
            Ok(())
        })
    }

    fn gateways(&self, seen_within: Duration) -> Result<Vec<GatewayInfo>> {
        let since = (self.clock)().0.saturating_sub(millis(seen_within));
        self.read_one(|db| {
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

    fn notify_cursor(&self, receiver: &str) -> Result<Option<u64>> {
        self.read_one(|db| {
            db.row(
                "SELECT seq FROM notify_cursors WHERE receiver = ?1",
                p![receiver],
            )?
            .map(|r| r.u64(0))
            .transpose()
        })
    }

    fn set_notify_cursor(&self, receiver: &str, seq: u64) -> Result<()> {
        self.write(|db, now| {
            db.exec(
                "INSERT INTO notify_cursors (receiver, seq, updated_at) VALUES (?1, ?2, ?3)
                 ON CONFLICT(receiver) DO UPDATE SET seq = excluded.seq, updated_at = excluded.updated_at
                 WHERE notify_cursors.seq < excluded.seq",
                p![receiver, seq, now.0],
            )?;
            Ok(())
        })
    }

    fn routes_version(&self) -> Result<u64> {
        self.read_one(|db| {
            db.row("SELECT version FROM routes_version WHERE id = 1", &[])?
                .map_or(Ok(0), |r| r.u64(0))
        })
    }

    fn routes(&self) -> Result<Vec<ModelRoutes>> {
        // One snapshot: the routing of every model at one instant.
        self.read(|db| {
            let models = all(
                db.rows(
                    &format!(
                        "SELECT {MODEL_COLS} FROM models WHERE deleted_at IS NULL ORDER BY name"
                    ),
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

    fn model_routes(&self, model: &str) -> Result<Option<ModelRoutes>> {
        self.read(|db| match get_model(db, model) {
            Ok(m) => model_routes_in(db, m).map(Some),
            Err(StoreError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        })
    }

    fn acquire_lease(&self, name: &str, holder: &str, ttl: Duration) -> Result<Option<Lease>> {
        // Takes the lease if it is free or expired (a new token), or
        // renews it for its holder (the same token: nobody held it in
        // between), in one statement on the database's clock where there
        // is one.
        self.lease_statement(|db, now| {
            let clock = db.clock_sql();
            let at = clock.unwrap_or("?4");
            let sql = format!(
                "INSERT INTO leases (name, holder, token, expires_at) VALUES (?1, ?2, 1, {at} + ?3) \
                 ON CONFLICT (name) DO UPDATE SET \
                 token = CASE WHEN leases.holder = excluded.holder \
                 THEN leases.token ELSE leases.token + 1 END, \
                 holder = excluded.holder, expires_at = excluded.expires_at \
                 WHERE leases.holder = excluded.holder OR leases.expires_at <= {at} \
                 RETURNING token, expires_at"
            );
            let params = p![name, holder, millis(ttl), now.0];
            let params = if clock.is_some() {
                &params[..3]
            } else {
                &params[..]
            };
            db.row(&sql, params)?
                .map(|r| {
                    Ok(Lease {
                        fence: Fence {
                            lease: name.to_string(),
                            token: r.u64(0)?,
                        },
                        holder: holder.to_string(),
                        expires_at: r.ts(1)?,
                    })
                })
                .transpose()
        })
    }

    fn release_lease(&self, fence: &Fence) -> Result<()> {
        self.lease_statement(|db, now| {
            match db.clock_sql() {
                Some(at) => db.exec(
                    &format!("UPDATE leases SET expires_at = {at} WHERE name = ?1 AND token = ?2"),
                    p![&fence.lease, fence.token],
                )?,
                None => db.exec(
                    "UPDATE leases SET expires_at = ?3 WHERE name = ?1 AND token = ?2",
                    p![&fence.lease, fence.token, now.0],
                )?,
            };
            Ok(())
        })
    }

    fn lease(&self, name: &str) -> Result<Option<Lease>> {
        self.read_one(|db| {
            db.row(
                "SELECT holder, token, expires_at FROM leases WHERE name = ?1",
                p![name],
            )?
            .map(|r| {
                Ok(Lease {
                    fence: Fence {
                        lease: name.to_string(),
                        token: r.u64(1)?,
                    },
                    holder: r.text(0)?,
                    expires_at: r.ts(2)?,
                })
            })
            .transpose()
        })
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
                "token name {name:?}: use 1-64 of A-Z a-z 0-9 . _ @ -, and none of \
                 rollgate's own actor names ({})",
                crate::tokens::RESERVED_ACTORS.join(", ")
            )));
        }
        self.write(|db, now| {
            if db
                .row("SELECT 1 FROM tokens WHERE name = ?1", p![name])?
                .is_some()
            {
                return Err(StoreError::Conflict(format!(
                    "token name {name:?} is taken (names are never reused, even revoked ones)"
                )));
            }
            db.exec(
                "INSERT INTO tokens (name, role, hash, created_at, created_by) VALUES (?1, ?2, ?3, ?4, ?5)",
                p![name, role.as_str(), secret_hash, now.0, actor],
            )?;
            append_audit(
                db,
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
        self.read_one(|db| {
            let rows = db.rows(
                &format!("SELECT {TOKEN_COLS} FROM tokens ORDER BY name"),
                &[],
            )?;
            all(rows, token_row)
        })
    }

    fn revoke_token(&self, name: &str, actor: &str) -> Result<ApiToken> {
        self.write(|db, now| {
            let changed = db.exec(
                "UPDATE tokens SET revoked_at = ?2 WHERE name = ?1 AND revoked_at IS NULL",
                p![name, now.0],
            )?;
            let token = db
                .row(
                    &format!("SELECT {TOKEN_COLS} FROM tokens WHERE name = ?1"),
                    p![name],
                )?
                .map(|r| token_row(&r))
                .transpose()?
                .ok_or_else(|| StoreError::NotFound {
                    what: "token",
                    name: name.to_string(),
                })?;
            if changed == 1 {
                append_audit(
                    db,
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
        self.read_one(|db| {
            db.row(
                &format!("SELECT {TOKEN_COLS} FROM tokens WHERE hash = ?1 AND revoked_at IS NULL"),
                p![secret_hash],
            )?
            .map(|r| token_row(&r))
            .transpose()
        })
    }

    fn prune_evaluations(&self, before: Timestamp) -> Result<u64> {
        self.write(|db, _| {
            db.exec(
                "UPDATE audit SET body = ?2, pruned = 1
                 WHERE kind = 'evaluated' AND pruned = 0 AND at < ?1 AND body_digest IS NOT NULL",
                p![before.0, crate::audit::PRUNED_BODY],
            )
        })
    }

    fn audit_head(&self) -> Result<Option<(u64, String)>> {
        self.read_one(audit_head_in)
    }

    fn audit_hashes(&self, seqs: &[u64]) -> Result<std::collections::BTreeMap<u64, String>> {
        self.read(|db| {
            let mut out = std::collections::BTreeMap::new();
            for &seq in seqs {
                if let Some(r) = db.row("SELECT hash FROM audit WHERE seq = ?1", p![seq])? {
                    out.insert(seq, r.text(0)?);
                }
            }
            Ok(out)
        })
    }

    fn add_checkpoint(&self, cp: &Checkpoint) -> Result<()> {
        self.write(|db, _| {
            db.exec(
                "INSERT INTO checkpoints (seq, hash, at, mac, key_id) VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (seq) DO NOTHING",
                p![cp.seq, &cp.hash, cp.at.0, &cp.mac, cp.key_id.as_deref()],
            )?;
            Ok(())
        })
    }

    fn checkpoints(&self) -> Result<Vec<Checkpoint>> {
        self.read_one(|db| {
            let rows = db.rows(
                "SELECT seq, hash, at, mac, key_id FROM checkpoints ORDER BY seq",
                &[],
            )?;
            all(rows, |r| {
                Ok(Checkpoint {
                    seq: r.u64(0)?,
                    hash: r.text(1)?,
                    at: r.ts(2)?,
                    mac: r.text(3)?,
                    key_id: r.opt_text(4)?,
                })
            })
        })
    }

    fn latest_checkpoint(&self) -> Result<Option<Checkpoint>> {
        self.read_one(|db| {
            db.row(
                "SELECT seq, hash, at, mac, key_id FROM checkpoints ORDER BY seq DESC LIMIT 1",
                &[],
            )?
            .map(|r| {
                Ok(Checkpoint {
                    seq: r.u64(0)?,
                    hash: r.text(1)?,
                    at: r.ts(2)?,
                    mac: r.text(3)?,
                    key_id: r.opt_text(4)?,
                })
            })
            .transpose()
        })
    }

    fn claim_checkpoint_signer(&self, key_id: &str) -> Result<String> {
        self.write(|db, _| {
            db.exec(
                "INSERT INTO audit_signer (id, key_id) VALUES (1, ?1) ON CONFLICT (id) DO NOTHING",
                p![key_id],
            )?;
            db.row("SELECT key_id FROM audit_signer WHERE id = 1", &[])?
                .ok_or_else(|| StoreError::Database("the signer row vanished".into()))?
                .text(0)
        })
    }

    fn verify_audit(&self) -> Result<ChainReport> {
        let records = self.read_one(|db| {
            let rows = db.rows(&format!("SELECT {AUDIT_COLS} FROM audit ORDER BY seq"), &[])?;
            all(rows, audit_row)
        })?;
        Ok(verify_chain(&records))
    }
}
