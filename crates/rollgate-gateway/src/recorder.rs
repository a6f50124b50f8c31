//! Recording on the hot path: sharded, so concurrent requests rarely touch
//! the same lock, and each shard is a core `RevisionStats`/`PairStats`, so
//! every shard (and their merge) keeps `failures <= requests`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
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

/// Recorders keyed by (model, epoch, revision); epoch `""` is none.
type ByRevision<T> = Mutex<HashMap<(String, String, String), Arc<Sharded<T>>>>;

/// Epochs of a model no longer routed whose counts stay reported (their
/// late completions still arrive); older ones are folded into the model's
/// retired totals, which keeps memory bounded and the pooled counters
/// monotone.
const RETIRED_EPOCHS_KEPT: usize = 8;

/// Every recorder of the gateway, by model, routing epoch and revision.
/// Recorders outlive routing changes: a route holds `Arc`s to them (so a
/// request records into the epoch it arrived in), the registry keeps them.
#[derive(Debug, Default)]
pub struct Recorders {
    revisions: ByRevision<RevisionStats>,
    pairs: ByRevision<PairStats>,
    /// Per model: epochs retired, oldest first.
    retired: Mutex<HashMap<String, Vec<String>>>,
    /// Per model: counts of epochs folded away.
    folded: Mutex<BTreeMap<String, Snapshot>>,
}

/// Every recorder of `map`, copied out so that no lock is held while
/// they are folded.
type Registered<T> = Vec<((String, String, String), Arc<Sharded<T>>)>;

/// The snapshot of `model`'s `epoch` in `epochs`, created empty if new.
fn epoch_of(
    epochs: &mut BTreeMap<String, BTreeMap<String, Snapshot>>,
    model: String,
    epoch: String,
) -> &mut Snapshot {
    epochs.entry(model).or_default().entry(epoch).or_default()
}

fn registered<T>(map: &ByRevision<T>) -> Registered<T> {
    lock(map)
        .iter()
        .map(|(k, v)| (k.clone(), Arc::clone(v)))
        .collect()
}

/// Removes `model`'s recorders of `epoch`, handing each to `take`.
fn drain_epoch<T>(
    map: &ByRevision<T>,
    model: &str,
    epoch: &str,
    mut take: impl FnMut(&str, &Sharded<T>),
) {
    lock(map).retain(|(m, e, id), rec| {
        let keep = !(m == model && e == epoch);
        if !keep {
            take(id, rec);
        }
        keep
    });
}

fn key(model: &str, epoch: &str, id: &str) -> (String, String, String) {
    (model.to_string(), epoch.to_string(), id.to_string())
}

/// What the gateway has counted: per model pooled over epochs, and per
/// model and epoch.
#[derive(Debug, Default)]
pub struct Counted {
    pub models: BTreeMap<String, Snapshot>,
    pub epochs: BTreeMap<String, BTreeMap<String, Snapshot>>,
}

impl Recorders {
    pub fn revision(
        &self,
        model: &str,
        epoch: &str,
        revision: &str,
    ) -> Arc<Sharded<RevisionStats>> {
        Arc::clone(
            lock(&self.revisions)
                .entry(key(model, epoch, revision))
                .or_default(),
        )
    }

    pub fn pairs(&self, model: &str, epoch: &str, shadow: &str) -> Arc<Sharded<PairStats>> {
        Arc::clone(
            lock(&self.pairs)
                .entry(key(model, epoch, shadow))
                .or_default(),
        )
    }

    /// As [`Recorders::retire_except`] for one model (`live`: the epoch it
    /// is routed under, `None` if it is not): what a change of one model's
    /// route costs, whatever the number of models.
    pub fn retire_model_except(&self, model: &str, live: Option<&str>) {
        let known: BTreeSet<String> = lock(&self.revisions)
            .keys()
            .chain(lock(&self.pairs).keys())
            .filter(|(m, _, _)| m == model)
            .map(|(_, e, _)| e.clone())
            .collect();
        let mut retired = lock(&self.retired);
        let list = retired.entry(model.to_string()).or_default();
        for epoch in known.iter().filter(|e| Some(e.as_str()) != live) {
            if !list.contains(epoch) {
                list.push(epoch.clone());
            }
        }
        list.retain(|e| Some(e.as_str()) != live);
        while list.len() > RETIRED_EPOCHS_KEPT {
            let epoch = list.remove(0);
            self.fold(model, &epoch);
        }
    }

    /// Notes the epochs now routed; epochs no longer routed are retired,
    /// and beyond [`RETIRED_EPOCHS_KEPT`] per model folded away.
    pub fn retire_except(&self, live: &BTreeSet<(String, String)>) {
        let known: BTreeSet<(String, String)> = lock(&self.revisions)
            .keys()
            .chain(lock(&self.pairs).keys())
            .map(|(m, e, _)| (m.clone(), e.clone()))
            .collect();
        let mut retired = lock(&self.retired);
        for (model, epoch) in known.difference(live) {
            let list = retired.entry(model.clone()).or_default();
            if !list.contains(epoch) {
                list.push(epoch.clone());
            }
        }
        // An epoch routed again (a restarted controller re-sends it) is live.
        for (model, list) in retired.iter_mut() {
            list.retain(|e| !live.contains(&(model.clone(), e.clone())));
        }
        for (model, list) in retired.iter_mut() {
            while list.len() > RETIRED_EPOCHS_KEPT {
                let epoch = list.remove(0);
                self.fold(model, &epoch);
            }
        }
    }

    fn fold(&self, model: &str, epoch: &str) {
        let mut out = Snapshot::default();
        drain_epoch(&self.revisions, model, epoch, |rev, rec| {
            let dst = out.revision_mut(rev);
            rec.fold(|s| dst.merge(s));
        });
        drain_epoch(&self.pairs, model, epoch, |shadow, rec| {
            let dst = out.pairs_mut(shadow);
            rec.fold(|p| dst.merge(p));
        });
        lock(&self.folded)
            .entry(model.to_string())
            .or_default()
            .merge(&out);
    }

    /// Cumulative stats of every model, merged over shards: pooled per
    /// model (with folded epochs) and per model and epoch.
    pub fn snapshot(&self) -> Counted {
        let mut out = Counted::default();
        for ((model, epoch, rev), rec) in registered(&self.revisions) {
            let dst = epoch_of(&mut out.epochs, model, epoch).revision_mut(&rev);
            rec.fold(|s| dst.merge(s));
        }
        for ((model, epoch, shadow), rec) in registered(&self.pairs) {
            let dst = epoch_of(&mut out.epochs, model, epoch).pairs_mut(&shadow);
            rec.fold(|p| dst.merge(p));
        }
        for (model, epochs) in &out.epochs {
            let pooled = out.models.entry(model.clone()).or_default();
            for s in epochs.values() {
                pooled.merge(s);
            }
        }
        for (model, folded) in lock(&self.folded).iter() {
            out.models.entry(model.clone()).or_default().merge(folded);
        }
        out
    }
}
