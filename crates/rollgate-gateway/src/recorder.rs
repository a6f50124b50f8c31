//! Recording on the hot path: sharded, so concurrent requests rarely touch
//! the same lock, and each shard is a core `RevisionStats`/`PairStats`, so
//! every shard (and their merge) keeps `failures <= requests`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use rollgate_core::{PairStats, RevisionStats, Snapshot};

const SHARDS: usize = 16;

fn shard_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SHARD: usize = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
    }
    SHARD.with(|s| *s)
}

/// A poisoned shard still holds valid counters: recover it rather than
/// losing measurements (a panic mid-record cannot break the invariants,
/// since each record call updates one struct under one lock).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Debug, Default)]
pub struct Sharded<T> {
    shards: [Mutex<T>; SHARDS],
}

impl<T: Default> Sharded<T> {
    pub fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        f(&mut lock(&self.shards[shard_index()]))
    }

    pub fn fold(&self, mut f: impl FnMut(&T)) {
        for s in &self.shards {
            f(&lock(s));
        }
    }
}

/// Recorders keyed by (model, revision).
type ByRevision<T> = Mutex<HashMap<(String, String), Arc<Sharded<T>>>>;

/// Every recorder of the gateway, by model and revision. Recorders outlive
/// routing changes: a route holds `Arc`s to them, the registry keeps them.
#[derive(Debug, Default)]
pub struct Recorders {
    revisions: ByRevision<RevisionStats>,
    pairs: ByRevision<PairStats>,
}

impl Recorders {
    pub fn revision(&self, model: &str, revision: &str) -> Arc<Sharded<RevisionStats>> {
        Arc::clone(
            lock(&self.revisions)
                .entry((model.to_string(), revision.to_string()))
                .or_default(),
        )
    }

    pub fn pairs(&self, model: &str, shadow: &str) -> Arc<Sharded<PairStats>> {
        Arc::clone(
            lock(&self.pairs)
                .entry((model.to_string(), shadow.to_string()))
                .or_default(),
        )
    }

    /// Cumulative stats of every model, merged over shards.
    pub fn snapshot(&self) -> std::collections::BTreeMap<String, Snapshot> {
        let mut out: std::collections::BTreeMap<String, Snapshot> = Default::default();
        let revisions: Vec<_> = lock(&self.revisions)
            .iter()
            .map(|(k, v)| (k.clone(), Arc::clone(v)))
            .collect();
        for ((model, rev), rec) in revisions {
            let snap = out.entry(model).or_default();
            let dst = snap.revision_mut(&rev);
            rec.fold(|s| dst.merge(s));
        }
        let pairs: Vec<_> = lock(&self.pairs)
            .iter()
            .map(|(k, v)| (k.clone(), Arc::clone(v)))
            .collect();
        for ((model, shadow), rec) in pairs {
            let snap = out.entry(model).or_default();
            let dst = snap.pairs_mut(&shadow);
            rec.fold(|p| dst.merge(p));
        }
        out
    }
}
