//! The store's logic, written once over a minimal SQL interface ([`Db`](engine::Db)) so
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
//! This file is the top of `sql/`: it declares the modules, says how a
//! [`SqlStore`] opens (either engine) and which module each [`Store`]
//! operation lives in; nothing below imports it, and the modules below
//! import one another one way only. Beside it:
//! - `engine.rs`: what an engine provides, and every way the two differ;
//! - `store.rs`: [`SqlStore`] itself, and how it runs one piece of work
//!   once in a transaction at one instant;
//! - `chain.rs`: appending records to the audit chain inside a write;
//! - `rows.rs`: each table's rows read back as the crate's types;
//! - `registry.rs`: models, revisions and the champion;
//! - `rollouts.rs`: rollouts and their transitions, `group_commit.rs`
//!   queueing concurrent ones into groups;
//! - `audit.rs`: reading the audit chain, notification cursors and
//!   checkpoints;
//! - `gateways.rs`: heartbeats and what gateways route;
//! - `lease.rs`: leases and the fencing check;
//! - `tokens.rs`: API tokens;
//! - `labels.rs`: answers recorded for labels, and the labels.
//!
//! The crate root's `registry.rs`, `audit.rs`, `checkpoint.rs` and `tokens.rs`
//! define the types these modules store, and their rules; the modules here
//! hold only the transactions.

// First: its `p!` macro binds values in every module below.
#[macro_use]
pub(crate) mod engine;

mod audit;
mod chain;
mod gateways;
mod group_commit;
mod labels;
mod lease;
mod registry;
mod rollouts;
mod rows;
pub(crate) mod store;
mod tokens;

use std::collections::BTreeMap;
use std::time::Duration;

use rollgate_core::{Plan, Timestamp};

use crate::{
    ApiToken, AuditFilter, AuditRecord, ChainReport, Checkpoint, Fence, GatewayInfo, Lease, Model,
    ModelRoutes, ModelSpec, Result, Revision, RevisionSpec, Role, RolloutRecord, SessionLimits,
    Store, TransitionWrite,
};
use store::SqlStore;

/// How a store opens, whichever engine `location` names (each engine's own
/// constructors are in its file).
impl SqlStore {
    /// Opens the store at `location`: a `postgres://` (or `postgresql://`)
    /// URL, or else the SQLite data directory.
    pub fn open(location: &str) -> Result<SqlStore> {
        SqlStore::open_with(location, SessionLimits::default())
    }

    /// [`SqlStore::open`], a PostgreSQL store's sessions carrying `limits`.
    pub fn open_with(location: &str, limits: SessionLimits) -> Result<SqlStore> {
        if crate::is_postgres_url(location) {
            SqlStore::connect_with(location, limits)
        } else {
            SqlStore::open_dir(std::path::Path::new(location))
        }
    }
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

    fn seed_champion(
        &self,
        model: &str,
        revision: &str,
        actor: &str,
        reason: &str,
    ) -> Result<Option<Revision>> {
        registry::set_champion_if(self, model, revision, actor, reason, true)
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
        rollouts::apply(self, &write)
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

    fn note(&self, note: crate::Note<'_>) -> Result<bool> {
        audit::note(self, note)
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

    fn record_answers(&self, rows: &[crate::AnswerRow]) -> Result<u64> {
        labels::record_answers(self, rows)
    }

    fn add_labels(
        &self,
        model: &str,
        batch: &[crate::LabelIn],
        actor: &str,
    ) -> Result<crate::LabelCounts> {
        labels::add_labels(self, model, batch, actor)
    }

    fn labelled_answers(&self, rollout: i64) -> Result<Vec<rollgate_core::labels::Recorded>> {
        labels::labelled_answers(self, rollout)
    }

    fn prune_answers(&self, before: Timestamp) -> Result<u64> {
        labels::prune_answers(self, before)
    }
}
