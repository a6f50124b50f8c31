//! rollgate's durable state: the model registry, rollout records and the
//! append-only, hash-chained audit log.
//!
//! One [`Store`] interface, implemented once ([`SqlStore`]) over two
//! engines: embedded SQLite (WAL, one host; the default) and PostgreSQL
//! (shared by gateways and controllers on many hosts), each with its own
//! versioned migrations. The interface speaks in domain terms only (no SQL),
//! and the conformance tests in `tests/` are written once against it and run
//! on both engines.
//!
//! Every state change is one transaction: a rollout transition, its registry
//! effects and its audit records commit together or not at all. Rollout
//! writers compare-and-swap on a version number, so two controllers can never
//! both advance one rollout; a controller's commits also carry the fencing
//! token of the lease it leads by, so one that paused and lost the lease can
//! never commit again.

mod audit;
mod checkpoint;
mod kube_plane;
mod labels;
mod pg_tls;
mod postgres;
mod registry;
#[macro_use]
mod sql;
mod sqlite;
mod tokens;

pub use audit::{
    AuditFilter, AuditRecord, ChainBreak, ChainReport, PRUNED_BODY, body_digest, verify_chain,
    write_jsonl,
};
pub use checkpoint::{
    AnchorProblem, AnchorReport, Checkpoint, CheckpointKey, append_to_sink, checkpoint_head,
    key_fits_store, read_sink, verify_anchors, verify_store_anchors,
};
pub use kube_plane::{
    GUARDED_PREDICTOR_FIELDS, KubeAccess, MirrorTo, ParentRef, RouteTemplate, is_dns_label,
};
pub use labels::{AnswerRow, LabelCounts, LabelIn, MAX_LABEL_TEXT};
pub use postgres::{SessionLimits, scratch_database};
pub use registry::{
    DECLARE_DATA_PLANES, DataPlane, DataPlaneRef, KserveMode, LatencyUnit, Model, ModelSpec,
    PrometheusEvidence, Protocol, RegistrySource, RegistryVersion, Revision, RevisionSpec,
    RevisionState, UPSTREAM_TAG, VERSION_MARK,
};
pub use sql::store::SqlStore;
pub use tokens::{
    ApiToken, RESERVED_ACTORS, Role, is_reserved_actor, secret_hash, valid_token_name,
};

use rollgate_core::{Effect, RolloutSpec, RolloutState, Routing, Timestamp};
use serde::{Deserialize, Serialize};

/// Errors of the store. User mistakes (unknown names, conflicts, rejected
/// candidates) are kept apart from internal failures so an API can map them
/// to 4xx and 5xx.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{what} {name:?} not found")]
    NotFound { what: &'static str, name: String },
    #[error("{0}")]
    Conflict(String),
    #[error(
        "revision {revision} was rejected ({rejections} rollback(s)); unblock it with a reason first"
    )]
    Rejected { revision: String, rejections: u32 },
    #[error("rollout {id} changed underneath (expected version {expected}, found {found})")]
    VersionConflict { id: i64, expected: u64, found: u64 },
    /// A write made under a lease that another holder has since taken.
    #[error("lease {lease:?} token {token} was superseded (now {current:?}): another holder leads")]
    Fenced {
        lease: String,
        token: u64,
        current: Option<u64>,
    },
    #[error("invalid input: {0}")]
    Invalid(String),
    /// The backing database failed. Boxed so that no implementation's error
    /// type leaks into the interface.
    #[error("database: {0}")]
    Database(Box<dyn std::error::Error + Send + Sync>),
    #[error("stored data is unreadable: {0}")]
    Corrupt(#[from] serde_json::Error),
}

pub type Result<T> = std::result::Result<T, StoreError>;

/// A durable rollout: what it is about, where it stands, and the routing
/// it implies. `version` increases by one with every transition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RolloutRecord {
    pub id: i64,
    pub spec: RolloutSpec,
    pub state: RolloutState,
    pub routing: Routing,
    pub version: u64,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

impl RolloutRecord {
    pub fn is_active(&self) -> bool {
        !self.state.phase.is_terminal()
    }
}

/// A gateway that reported in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GatewayInfo {
    pub id: String,
    /// Where its `GET /rollgate/stats` is served.
    pub stats_url: String,
    pub last_seen: Timestamp,
}

/// A model's routing as stored: its champion and, during a rollout, the
/// candidate and the routing the rollout implies.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ModelRoutes {
    pub model: Model,
    pub champion: Option<Revision>,
    /// `(candidate, routing, rollout id)` while a rollout is active (while
    /// it watches after promotion, the revision is its previous champion,
    /// which the routing mirrors).
    pub rollout: Option<(Revision, Routing, i64)>,
    /// The active rollout's evidence series (a gateway process each) and
    /// when the last committed look that read each was: a gateway can tell
    /// whether the controller has judged the rollout on its counts since
    /// a time it could not reach the store.
    pub rollout_seen: std::collections::BTreeMap<String, Timestamp>,
    /// The active rollout judges quality from labels: gateways record
    /// each answer for them.
    pub record_answers: bool,
    /// The active rollout watches after promotion: its revision is the
    /// previous champion, mirrored, and testers' pins are off (a pin to
    /// "candidate" would reach the previous champion).
    #[serde(default)]
    pub watching: bool,
}

/// One rollout transition to commit: the new state and the effects the
/// state machine returned, guarded by the version it was computed from.
#[derive(Debug, Clone)]
pub struct TransitionWrite<'a> {
    pub rollout: i64,
    pub expected_version: u64,
    pub state: &'a RolloutState,
    pub effects: &'a [Effect],
    /// Who caused it: `controller` or an operator's name.
    pub actor: &'a str,
    /// The lease the writer leads by: the write lands only while its token
    /// is current. Operators' writes carry none (the version guards them).
    pub fence: Option<Fence>,
}

/// An audit record no state change carries.
#[derive(Debug, Clone)]
pub struct Note<'a> {
    pub model: &'a str,
    pub rollout: Option<i64>,
    pub kind: &'a str,
    pub actor: &'a str,
    pub body: serde_json::Value,
    /// A cursor (as notifications keep) moved to this record's `seq` in the
    /// same transaction: what an outbox reader did is recorded once.
    pub cursor: Option<(&'a str, u64)>,
}

/// A lease's fencing token: increases every time the lease changes holder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Fence {
    pub lease: String,
    pub token: u64,
}

/// A held lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Lease {
    pub fence: Fence,
    pub holder: String,
    pub expires_at: Timestamp,
}

/// Whether a store location names a PostgreSQL database (else it is a
/// SQLite data directory).
pub fn is_postgres_url(location: &str) -> bool {
    location.starts_with("postgres://") || location.starts_with("postgresql://")
}

/// The store interface. Methods are synchronous (an embedded database is);
/// async callers use `spawn_blocking`.
pub trait Store: Send + Sync {
    // --- registry -------------------------------------------------------
    /// Creates a model; the same spec again is a no-op, a different one a conflict.
    fn create_model(&self, name: &str, spec: &ModelSpec, actor: &str) -> Result<Model>;
    /// Changes a model's spec (validated like a new one). Refused while a
    /// rollout is active on the model.
    fn update_model(&self, name: &str, spec: &ModelSpec, actor: &str) -> Result<Model>;
    /// Deletes a model with no active rollout: it stops being routed and
    /// listed; its revisions stay (a model created again under the name
    /// remembers which were rejected), and the audit log keeps its history.
    fn delete_model(&self, name: &str, actor: &str, reason: &str) -> Result<()>;
    fn model(&self, name: &str) -> Result<Model>;
    fn models(&self) -> Result<Vec<Model>>;
    /// Registers an immutable revision. Its id is the hash of its normalised
    /// spec, so registering an equivalent spec again returns the same revision.
    fn register_revision(&self, model: &str, spec: &RevisionSpec, actor: &str) -> Result<Revision>;
    fn revision(&self, id: &str) -> Result<Revision>;
    fn revisions(&self, model: &str) -> Result<Vec<Revision>>;
    /// Makes `revision` the model's champion, archiving the previous one in
    /// the same transaction. Refused while a rollout is active on the model.
    fn set_champion(
        &self,
        model: &str,
        revision: &str,
        actor: &str,
        reason: &str,
    ) -> Result<Revision>;
    /// [`Store::set_champion`] only while the model has none, in one
    /// transaction (a registry seeding it never replaces a champion set
    /// meanwhile); `None` when it had one.
    fn seed_champion(
        &self,
        model: &str,
        revision: &str,
        actor: &str,
        reason: &str,
    ) -> Result<Option<Revision>>;
    /// Lets a rejected revision start a rollout again.
    fn unblock(&self, revision: &str, actor: &str, reason: &str) -> Result<Revision>;

    // --- rollouts -------------------------------------------------------
    /// Starts a rollout of `candidate` against the model's champion. One
    /// active rollout per model; the candidate must not be rejected or the
    /// champion itself.
    fn create_rollout(
        &self,
        model: &str,
        candidate: &str,
        plan: &rollgate_core::Plan,
        actor: &str,
    ) -> Result<RolloutRecord>;
    fn rollout(&self, id: i64) -> Result<RolloutRecord>;
    /// All rollouts, newest first; only active ones if `active_only`.
    fn rollouts(&self, active_only: bool) -> Result<Vec<RolloutRecord>>;
    /// Commits one transition with its effects, atomically, if the rollout's
    /// version is still `expected_version`.
    fn apply(&self, write: TransitionWrite) -> Result<RolloutRecord>;
    /// Commits several transitions in one transaction (group commit). All or
    /// none: one version conflict aborts the batch.
    fn apply_batch(&self, writes: &[TransitionWrite]) -> Result<Vec<RolloutRecord>>;

    // --- gateways -------------------------------------------------------
    /// Records that gateway `id` is alive and serves its stats at `stats_url`.
    fn heartbeat(&self, id: &str, stats_url: &str) -> Result<()>;
    /// Gateways whose last heartbeat is at most `seen_within` old.
    fn gateways(&self, seen_within: std::time::Duration) -> Result<Vec<GatewayInfo>>;
    /// What every gateway must route, read at one instant.
    fn routes(&self) -> Result<Vec<ModelRoutes>>;
    /// What gateways must route for one model (`None`: it is not there,
    /// or was deleted).
    fn model_routes(&self, model: &str) -> Result<Option<ModelRoutes>>;
    /// A counter every change to [`Store::routes`] increases: a follower
    /// polls it and reads the routes only when it moved.
    fn routes_version(&self) -> Result<u64>;

    // --- leases ---------------------------------------------------------
    /// Takes lease `name` for `holder` until `ttl` from now, or renews it if
    /// `holder` has it. `None` while another holder's lease is unexpired.
    /// The token increases with every change of holder.
    fn acquire_lease(
        &self,
        name: &str,
        holder: &str,
        ttl: std::time::Duration,
    ) -> Result<Option<Lease>>;
    /// Ends a lease now (if `fence` still holds it), so another takes over
    /// at once.
    fn release_lease(&self, fence: &Fence) -> Result<()>;
    /// The lease `name` as stored (expired or not).
    fn lease(&self, name: &str) -> Result<Option<Lease>>;

    // --- API tokens -----------------------------------------------------
    /// Adds a named token; only the hash of its secret is stored. Names are
    /// never reused, even after a revocation.
    fn create_token(
        &self,
        name: &str,
        role: Role,
        secret_hash: &str,
        actor: &str,
    ) -> Result<ApiToken>;
    /// Every token, revoked ones included, by name.
    fn tokens(&self) -> Result<Vec<ApiToken>>;
    /// Revokes a token: it stops working at once.
    fn revoke_token(&self, name: &str, actor: &str) -> Result<ApiToken>;
    /// The unrevoked token whose secret hashes to `secret_hash`.
    fn token_by_hash(&self, secret_hash: &str) -> Result<Option<ApiToken>>;

    // --- audit ----------------------------------------------------------
    fn audit(&self, filter: &AuditFilter) -> Result<Vec<AuditRecord>>;
    /// A rollout's records for reading at a glance: every one but its
    /// evaluations, and of those about `points` evenly spaced (the last
    /// always) plus every one that failed a gate. Returns them in order,
    /// with how many evaluation records the rollout has. Its bodies are
    /// read only for the records returned: a long rollout has tens of
    /// thousands of evaluations.
    fn audit_sample(&self, rollout: i64, points: u64) -> Result<(Vec<AuditRecord>, u64)>;
    /// Retention: prunes the bodies of evaluation records written before
    /// `before` (their digests keep the chain whole; decisions are never
    /// pruned). Returns how many.
    fn prune_evaluations(&self, before: Timestamp) -> Result<u64>;
    /// The chain's last record, `(seq, hash)`.
    fn audit_head(&self) -> Result<Option<(u64, String)>>;
    /// Appends an audit record that no state change carries (a registry's
    /// conflict, a verdict written back to it): chained and notified like
    /// every other. With a cursor, only if the cursor is behind `seq`
    /// (moved in the same transaction); whether it was appended.
    fn note(&self, note: Note<'_>) -> Result<bool>;

    /// The audit record notification receiver `receiver` was last sent
    /// (its cursor), if it has one. The audit log is the outbox: a receiver
    /// is sent the records after its cursor, in order.
    fn notify_cursor(&self, receiver: &str) -> Result<Option<u64>>;

    /// Moves `receiver`'s cursor to `seq` (never back).
    fn set_notify_cursor(&self, receiver: &str, seq: u64) -> Result<()>;
    /// The hashes of the records at `seqs` that exist.
    fn audit_hashes(&self, seqs: &[u64]) -> Result<std::collections::BTreeMap<u64, String>>;
    /// Keeps a signed checkpoint of the chain (once per seq).
    fn add_checkpoint(&self, checkpoint: &Checkpoint) -> Result<()>;
    /// Every checkpoint kept, in order.
    fn checkpoints(&self) -> Result<Vec<Checkpoint>>;
    /// The latest checkpoint, if any.
    fn latest_checkpoint(&self) -> Result<Option<Checkpoint>>;
    /// Claims `key_id` as the one key that signs this store's checkpoints
    /// if none is claimed yet; returns the key id claimed (this one or
    /// another's).
    fn claim_checkpoint_signer(&self, key_id: &str) -> Result<String>;

    /// Keeps answers the gateways recorded for labels (each once: one
    /// already kept is skipped); returns how many were new.
    fn record_answers(&self, rows: &[AnswerRow]) -> Result<u64>;
    /// Keeps a batch of labels for `model`'s answers, in one transaction
    /// with one `labels_received` audit record of its counts: each label
    /// applied (an answer has its id), unknown (kept; no answer has its id
    /// yet), a duplicate, or a conflict (not kept). `NotFound` if the
    /// model is not.
    fn add_labels(&self, model: &str, batch: &[LabelIn], actor: &str) -> Result<LabelCounts>;
    /// Every answer recorded for `rollout`, with its request's label if one
    /// came.
    fn labelled_answers(&self, rollout: i64) -> Result<Vec<rollgate_core::labels::Recorded>>;
    /// Retention: removes answers recorded, and labels received, before
    /// `before`, but none an active rollout reads. Returns how many rows
    /// went.
    fn prune_answers(&self, before: Timestamp) -> Result<u64>;
    /// Walks the hash chain and reports the first broken link, if any.
    fn verify_audit(&self) -> Result<ChainReport>;
}
