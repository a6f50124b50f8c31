//! What the controller's tasks share: the [`Context`] that the reconcile
//! loop, the notifications' delivery loop and the API each take, the parts
//! of it defined here (a pass's gateway stats, audit retention, the audit
//! anchor, the route push), and [`blocking`], how async code calls the
//! store, with its [`Error`]. It names none of the tasks that take it: they
//! import it, it imports none of them.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use rollgate_core::Timestamp;
use rollgate_store::{ModelRoutes, Store, StoreError};

use crate::http::HttpClient;
use crate::lead::Leader;
use crate::metrics::ControllerMetrics;

/// A store call from async code that failed: the store's error, or its
/// task's.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("store task failed: {0}")]
    Join(String),
}

/// What a pass needs. Cheap to clone.
#[derive(Clone)]
pub struct Context {
    pub store: Arc<dyn Store>,
    pub http: HttpClient,
    /// Gateways whose heartbeat is older than this are not merged.
    pub gateway_ttl: Duration,
    /// How often an active rollout is reconciled.
    pub tick: Duration,
    pub clock: Arc<dyn Fn() -> Timestamp + Send + Sync>,
    /// The in-process gateway of `rollgate up`: it gets routing pushed at
    /// once instead of at its next poll.
    pub local_gateway: Option<Arc<dyn RoutePush>>,
    pub metrics: Arc<ControllerMetrics>,
    /// Signs the audit chain's head after every pass that moved it.
    pub anchor: Option<Arc<Anchor>>,
    /// Prunes old evaluation records' bodies.
    pub retention: Option<Arc<Retention>>,
    /// Whether this controller leads (holds the store's lease); only the
    /// leader reconciles, and its commits carry the lease's fence.
    pub leader: Arc<Leader>,
    /// At most this many rollouts are reconciled at once.
    pub concurrency: usize,
    /// Gateway stats, fetched once per pass and shared by its rollouts.
    pub stats: Arc<PassStats>,
    /// Webhook receivers of every decision (their delivery is shown by the
    /// API); none configured: `None`.
    pub notify: Option<Arc<crate::notify::receivers::Notifier>>,
    /// The routing each external data plane confirmed
    /// (`ModelSpec::data_plane`).
    pub adapters: Arc<crate::adapter::Applier>,
    /// The data planes and credentials the operator's config declares: all
    /// a model spec may name of the host.
    pub host: Arc<crate::host::Host>,
    /// Looks not committed yet, by rollout (they changed nothing).
    pub looks: Arc<Looks>,
    /// Registry webhooks' wake-ups and the deliveries already taken.
    pub registry_signals: Arc<crate::registry::webhook::Signals>,
}

/// Looks at a rollout that changed nothing but the count of looks: they
/// are committed with the next look that is (at the latest every
/// [`Looks::COMMIT_EVERY_TICKS`] ticks), so an idle rollout costs a store
/// write every few seconds, not every tick. Kept by the process: a
/// controller that stops loses its uncommitted count (never a decision).
#[derive(Debug, Default)]
pub struct Looks(std::sync::Mutex<std::collections::HashMap<i64, u64>>);

impl Looks {
    /// An unchanged look is committed at least this many ticks after the
    /// rollout's last commit.
    pub const COMMIT_EVERY_TICKS: u32 = 10;

    /// Notes one uncommitted look at `rollout`.
    pub fn skipped(&self, rollout: i64) {
        *self.lock().entry(rollout).or_insert(0) += 1;
    }

    /// The uncommitted looks at `rollout`, forgotten (they are committed now).
    pub fn take(&self, rollout: i64) -> u64 {
        self.lock().remove(&rollout).unwrap_or(0)
    }

    /// Forgets rollouts no longer active.
    pub fn keep_only(&self, active: &[i64]) {
        let active: std::collections::HashSet<&i64> = active.iter().collect();
        self.lock().retain(|id, _| active.contains(id));
    }

    /// The uncommitted looks at `rollout`.
    pub fn pending(&self, rollout: i64) -> u64 {
        self.lock().get(&rollout).copied().unwrap_or(0)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<i64, u64>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("tick", &self.tick)
            .finish_non_exhaustive()
    }
}

/// Runs a blocking store call off the async runtime.
pub async fn blocking<T: Send + 'static>(
    store: &Arc<dyn Store>,
    f: impl FnOnce(&dyn Store) -> Result<T, StoreError> + Send + 'static,
) -> Result<T, Error> {
    let s = Arc::clone(store);
    tokio::task::spawn_blocking(move || f(s.as_ref()))
        .await
        .map_err(|e| Error::Join(e.to_string()))?
        .map_err(Error::from)
}

/// The gateways' stats as fetched in one pass: `(stats URL, snapshot if it
/// answered)`.
pub type GatewayStats = Arc<Vec<(String, Option<rollgate_core::GatewaySnapshot>)>>;

/// Gateway stats fetched once per pass of the run loop and shared by every
/// rollout reconciled in it: one fetch and one parse per gateway per pass,
/// not per rollout (with 1,000 rollouts that is the difference between
/// 1,000 snapshots of every model and one).
#[derive(Debug, Default)]
pub struct PassStats {
    /// The run loop's pass; 0 outside it (a reconcile called on its own
    /// always fetches fresh stats).
    pass: std::sync::atomic::AtomicU64,
    cached: tokio::sync::Mutex<Option<(u64, GatewayStats)>>,
}

impl PassStats {
    /// Starts a new pass: stats are fetched afresh for it.
    pub fn next_pass(&self) {
        self.pass.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// The gateways' stats for this pass: fetched with `fetch` once per
    /// pass (outside the run loop's passes, every time).
    pub(crate) async fn for_pass<F>(&self, fetch: impl FnOnce() -> F) -> Result<GatewayStats, Error>
    where
        F: Future<Output = Result<GatewayStats, Error>>,
    {
        let pass = self.pass.load(std::sync::atomic::Ordering::SeqCst);
        if pass == 0 {
            return fetch().await;
        }
        // Held while fetching: the pass's other rollouts wait for this fetch
        // instead of starting their own.
        let mut cached = self.cached.lock().await;
        if let Some((p, stats)) = cached.as_ref()
            && *p == pass
        {
            return Ok(Arc::clone(stats));
        }
        let stats = fetch().await?;
        *cached = Some((pass, Arc::clone(&stats)));
        Ok(stats)
    }
}

/// Audit retention: evaluation records older than `keep` lose their bodies
/// (their digests keep the chain whole; decisions are never pruned).
#[derive(Debug)]
pub struct Retention {
    pub keep: Duration,
    last: std::sync::Mutex<Option<tokio::time::Instant>>,
}

/// Retention runs at most this often.
pub const PRUNE_EVERY: Duration = Duration::from_secs(60);

impl Retention {
    pub fn new(keep: Duration) -> Retention {
        Retention {
            keep,
            last: std::sync::Mutex::new(None),
        }
    }
}

impl Retention {
    /// Whether a prune is due (none ran in the last [`PRUNE_EVERY`]); if
    /// so, it counts as run from now.
    pub(crate) fn due(&self) -> bool {
        let Ok(mut last) = self.last.lock() else {
            return false;
        };
        let now = tokio::time::Instant::now();
        if last.is_some_and(|t| now.duration_since(t) < PRUNE_EVERY) {
            return false;
        }
        *last = Some(now);
        true
    }
}

/// Where the controller pushes routing at once, beside what gateways read
/// from the store (the binary implements it for its in-process gateway:
/// the controller knows no gateway).
pub trait RoutePush: Send + Sync {
    /// Applies one model's routes (`None`: it is no longer routed), as
    /// read from the store or about to be, leaving every other model as
    /// it is: a commit changes one model, so it costs one.
    fn push_model(&self, model: &str, routes: Option<&ModelRoutes>);
}

/// Signed checkpoints of the audit chain (see `rollgate_store::Checkpoint`):
/// the key, the sink outside the store, and the last seq signed.
#[derive(Debug)]
pub struct Anchor {
    pub key: rollgate_store::CheckpointKey,
    pub sink: Option<std::path::PathBuf>,
    pub last: std::sync::Mutex<Option<u64>>,
}

impl Anchor {
    /// An anchor that resumes after the store's latest checkpoint.
    pub fn new(
        store: &dyn Store,
        key: rollgate_store::CheckpointKey,
        sink: Option<std::path::PathBuf>,
    ) -> Result<Anchor, StoreError> {
        rollgate_store::key_fits_store(store, &key).map_err(StoreError::Invalid)?;
        let last = store.latest_checkpoint()?.map(|c| c.seq);
        Ok(Anchor {
            key,
            sink,
            last: std::sync::Mutex::new(last),
        })
    }
}
