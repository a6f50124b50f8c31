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
//!
//! This file holds [`SqlStore`]: how it opens, how it runs one piece of
//! work once in a transaction at one instant, and which module each
//! [`Store`] operation lives in. Beside it:
//! - `engine.rs`: what an engine provides, and every way the two differ;
//! - `rows.rs`: each table's rows read back as the crate's types;
//! - `registry.rs`: models, revisions and the champion;
//! - `rollouts.rs`: rollouts and their transitions, `group_commit.rs`
//!   batching concurrent ones;
//! - `audit.rs`: the audit chain, notification cursors and checkpoints;
//! - `gateways.rs`: heartbeats and what gateways route;
//! - `lease.rs`: leases and the fencing check;
//! - `tokens.rs`: API tokens.
//!
//! The crate root's `registry.rs`, `audit.rs`, `checkpoint.rs` and `tokens.rs`
//! define the types these modules store, and their rules; the modules here
//! hold only the transactions.

// First: its `p!` macro binds values in every module below.
#[macro_use]
mod engine;

mod audit;
mod gateways;
mod group_commit;
mod lease;
mod registry;
mod rollouts;
mod rows;
mod tokens;

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rollgate_core::{Plan, Timestamp};

pub(crate) use engine::{Db, Engine, Row, TxMemo, Val, Work};
use group_commit::GroupCommit;

use crate::{
    ApiToken, AuditFilter, AuditRecord, ChainReport, Checkpoint, Fence, GatewayInfo, Lease, Model,
    ModelRoutes, ModelSpec, Result, Revision, RevisionSpec, Role, RolloutRecord, Store, StoreError,
    TransitionWrite,
};

type Clock = Box<dyn Fn() -> Timestamp + Send + Sync>;

fn system_clock() -> Timestamp {
    Timestamp(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
    )
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The [`Store`]: rollgate's logic over a SQL engine. Open it with
/// [`SqlStore::open_dir`] (embedded SQLite, the default) or
/// [`SqlStore::connect`] (a PostgreSQL URL), or [`SqlStore::open`] for either.
pub struct SqlStore {
    engine: Box<dyn Engine>,
    clock: Clock,
    group: GroupCommit,
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
        let work = |db: &mut dyn Db| -> Result<T> {
            let out = f(db, now)?;
            audit::flush_audit(db)?;
            if db.memo().routes_changed {
                db.exec(
                    "UPDATE routes_version SET version = version + 1 WHERE id = 1",
                    &[],
                )?;
            }
            Ok(out)
        };
        run_once(
            |w| self.engine.write(w),
            work,
            "the engine ran no transaction",
        )
    }

    /// Runs `f`, one statement on the lease table, outside the writers'
    /// serialisation: a take-over never waits behind a rollout commit or a
    /// heartbeat, only (PostgreSQL) behind a fenced write reading the
    /// lease's row, which the server ends if its client is cut off.
    fn lease_statement<T>(&self, f: impl FnOnce(&mut dyn Db, Timestamp) -> Result<T>) -> Result<T> {
        let now = (self.clock)();
        run_once(
            |w| self.engine.lease(w),
            |db| f(db, now),
            "the engine ran no statement",
        )
    }

    /// Runs `f` on one consistent snapshot.
    fn read<T>(&self, f: impl FnOnce(&mut dyn Db) -> Result<T>) -> Result<T> {
        run_once(|w| self.engine.read(w), f, "the engine ran no transaction")
    }

    /// Runs `f`, which runs exactly one statement.
    fn read_one<T>(&self, f: impl FnOnce(&mut dyn Db) -> Result<T>) -> Result<T> {
        run_once(
            |w| self.engine.read_one(w),
            f,
            "the engine ran no transaction",
        )
    }
}

/// Runs `f` through `run` (one of the engine's ways to run work) at most
/// once, however often the engine calls back, and returns what it returned;
/// `missing` is the error if the engine never called.
fn run_once<T>(
    run: impl FnOnce(Work) -> Result<()>,
    f: impl FnOnce(&mut dyn Db) -> Result<T>,
    missing: &'static str,
) -> Result<T> {
    let mut f = Some(f);
    let mut out = None;
    run(&mut |db| {
        if let Some(f) = f.take() {
            out = Some(f(db)?);
        }
        Ok(())
    })?;
    out.ok_or_else(|| StoreError::Database(missing.into()))
}

/// Each operation lives with its concern; this table says where.
impl Store for SqlStore {
    fn create_model(&self, name: &str, spec: &ModelSpec, actor: &str) -> Result<Model> {
        registry::create_model(self, name, spec, actor)
    }

    fn update_model(&self, name: &str, spec: &ModelSpec, actor: &str) -> Result<Model> {
        registry::update_model(self, name, spec, actor)
    }

    fn delete_model(&self, name: &str, actor: &str, reason: &str) -> Result<()> {
        registry::delete_model(self, name, actor, reason)
    }

    fn model(&self, name: &str) -> Result<Model> {
        registry::model(self, name)
    }

    fn models(&self) -> Result<Vec<Model>> {
        registry::models(self)
    }

    fn register_revision(&self, model: &str, spec: &RevisionSpec, actor: &str) -> Result<Revision> {
        registry::register_revision(self, model, spec, actor)
    }

    fn revision(&self, id: &str) -> Result<Revision> {
        registry::revision(self, id)
    }

    fn revisions(&self, model: &str) -> Result<Vec<Revision>> {
        registry::revisions(self, model)
    }

    fn set_champion(
        &self,
        model: &str,
        revision: &str,
        actor: &str,
        reason: &str,
    ) -> Result<Revision> {
        registry::set_champion(self, model, revision, actor, reason)
    }

    fn unblock(&self, revision: &str, actor: &str, reason: &str) -> Result<Revision> {
        registry::unblock(self, revision, actor, reason)
    }

    fn create_rollout(
        &self,
        model: &str,
        candidate: &str,
        plan: &Plan,
        actor: &str,
    ) -> Result<RolloutRecord> {
        rollouts::create_rollout(self, model, candidate, plan, actor)
    }

    fn rollout(&self, id: i64) -> Result<RolloutRecord> {
        rollouts::rollout(self, id)
    }

    fn rollouts(&self, active_only: bool) -> Result<Vec<RolloutRecord>> {
        rollouts::rollouts(self, active_only)
    }

    fn apply(&self, write: TransitionWrite) -> Result<RolloutRecord> {
        group_commit::apply(self, &write)
    }

    fn apply_batch(&self, writes: &[TransitionWrite]) -> Result<Vec<RolloutRecord>> {
        rollouts::apply_batch(self, writes)
    }

    fn heartbeat(&self, id: &str, stats_url: &str) -> Result<()> {
        gateways::heartbeat(self, id, stats_url)
    }

    fn gateways(&self, seen_within: Duration) -> Result<Vec<GatewayInfo>> {
        gateways::gateways(self, seen_within)
    }

    fn routes(&self) -> Result<Vec<ModelRoutes>> {
        gateways::routes(self)
    }

    fn model_routes(&self, model: &str) -> Result<Option<ModelRoutes>> {
        gateways::model_routes(self, model)
    }

    fn routes_version(&self) -> Result<u64> {
        gateways::routes_version(self)
    }

    fn acquire_lease(&self, name: &str, holder: &str, ttl: Duration) -> Result<Option<Lease>> {
        lease::acquire_lease(self, name, holder, ttl)
    }

    fn release_lease(&self, fence: &Fence) -> Result<()> {
        lease::release_lease(self, fence)
    }

    fn lease(&self, name: &str) -> Result<Option<Lease>> {
        lease::lease(self, name)
    }

    fn create_token(
        &self,
        name: &str,
        role: Role,
        secret_hash: &str,
        actor: &str,
    ) -> Result<ApiToken> {
        tokens::create_token(self, name, role, secret_hash, actor)
    }

    fn tokens(&self) -> Result<Vec<ApiToken>> {
        tokens::tokens(self)
    }

    fn revoke_token(&self, name: &str, actor: &str) -> Result<ApiToken> {
        tokens::revoke_token(self, name, actor)
    }

    fn token_by_hash(&self, secret_hash: &str) -> Result<Option<ApiToken>> {
        tokens::token_by_hash(self, secret_hash)
    }

    fn audit(&self, filter: &AuditFilter) -> Result<Vec<AuditRecord>> {
        audit::audit(self, filter)
    }

    fn audit_sample(&self, rollout: i64, points: u64) -> Result<(Vec<AuditRecord>, u64)> {
        audit::audit_sample(self, rollout, points)
    }

    fn prune_evaluations(&self, before: Timestamp) -> Result<u64> {
        audit::prune_evaluations(self, before)
    }

    fn audit_head(&self) -> Result<Option<(u64, String)>> {
        audit::audit_head(self)
    }

    fn notify_cursor(&self, receiver: &str) -> Result<Option<u64>> {
        audit::notify_cursor(self, receiver)
    }

    fn set_notify_cursor(&self, receiver: &str, seq: u64) -> Result<()> {
        audit::set_notify_cursor(self, receiver, seq)
    }

    fn audit_hashes(&self, seqs: &[u64]) -> Result<BTreeMap<u64, String>> {
        audit::audit_hashes(self, seqs)
    }

    fn add_checkpoint(&self, checkpoint: &Checkpoint) -> Result<()> {
        audit::add_checkpoint(self, checkpoint)
    }

    fn checkpoints(&self) -> Result<Vec<Checkpoint>> {
        audit::checkpoints(self)
    }

    fn latest_checkpoint(&self) -> Result<Option<Checkpoint>> {
        audit::latest_checkpoint(self)
    }

    fn claim_checkpoint_signer(&self, key_id: &str) -> Result<String> {
        audit::claim_checkpoint_signer(self, key_id)
    }

    fn verify_audit(&self) -> Result<ChainReport> {
        audit::verify_audit(self)
    }
}
