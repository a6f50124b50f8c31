//! Group commit of concurrent `apply` calls: whoever finds no commit in
//! progress commits every transition queued so far in one transaction
//! (`apply_batch`); those arriving meanwhile wait and form the next group.
//! No timer and no added latency: a lone writer commits at once. A group
//! is all-or-nothing, so when it fails (one version conflict, say) each of
//! its transitions is applied on its own and gets its own answer.

use rollgate_core::{Effect, RolloutState};

use super::SqlStore;
use super::rollouts::{apply_batch, apply_in};
use crate::{Fence, Result, RolloutRecord, StoreError, TransitionWrite};

/// The queue of transitions waiting for a group, and whether one commits.
#[derive(Default)]
pub(super) struct GroupCommit {
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

/// Commits `write`, with whatever other transitions are queued, as one
/// group (see [`GroupCommit`]).
pub(super) fn apply(store: &SqlStore, write: &TransitionWrite) -> Result<RolloutRecord> {
    let mut q = store.group.lock();
    let me = q.next;
    q.next += 1;
    q.waiting.push((me, OwnedWrite::of(write)));
    loop {
        if let Some(result) = q.results.remove(&me) {
            return result;
        }
        if q.committing {
            q = store.group.done.wait(q).unwrap_or_else(|p| p.into_inner());
            continue;
        }
        q.committing = true;
        let group = std::mem::take(&mut q.waiting);
        drop(q);
        let mut ending = Committing {
            group: &store.group,
            ids: group.iter().map(|(id, _)| *id).collect(),
            results: Vec::new(),
        };
        ending.results = commit_group(store, &group);
        drop(ending);
        q = store.group.lock();
    }
}

fn commit_group(
    store: &SqlStore,
    group: &[(u64, OwnedWrite)],
) -> Vec<(u64, Result<RolloutRecord>)> {
    let one = |w: &OwnedWrite| store.write(|db, now| apply_in(db, now, &w.borrowed()));
    if group.len() > 1 {
        let writes: Vec<TransitionWrite> = group.iter().map(|(_, w)| w.borrowed()).collect();
        if let Ok(records) = apply_batch(store, &writes) {
            return group
                .iter()
                .zip(records)
                .map(|((id, _), r)| (*id, Ok(r)))
                .collect();
        }
    }
    group.iter().map(|(id, w)| (*id, one(w))).collect()
}
