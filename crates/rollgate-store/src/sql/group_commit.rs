//! Group commit of concurrent `apply` calls: whoever finds no commit in
//! progress commits every transition queued so far as one group; those
//! arriving meanwhile wait and form the next group. No timer and no added
//! latency: a lone writer commits at once. This file holds the queue and
//! its hand-over between threads; how a group commits (in one transaction,
//! or each transition on its own when that fails) is `rollouts.rs`'s.

use rollgate_core::{Effect, RolloutState};

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

impl GroupCommit {
    /// Commits `write`, with whatever other transitions are queued, as one
    /// group: `commit` commits a group and answers each of its
    /// transitions, in order.
    pub(super) fn apply(
        &self,
        write: &TransitionWrite,
        commit: impl Fn(&[TransitionWrite]) -> Vec<Result<RolloutRecord>>,
    ) -> Result<RolloutRecord> {
        let mut q = self.lock();
        let me = q.next;
        q.next += 1;
        q.waiting.push((me, OwnedWrite::of(write)));
        loop {
            if let Some(result) = q.results.remove(&me) {
                return result;
            }
            if q.committing {
                q = self.done.wait(q).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            q.committing = true;
            let group = std::mem::take(&mut q.waiting);
            drop(q);
            let mut ending = Committing {
                group: self,
                ids: group.iter().map(|(id, _)| *id).collect(),
                results: Vec::new(),
            };
            let writes: Vec<TransitionWrite> = group.iter().map(|(_, w)| w.borrowed()).collect();
            ending.results = ending.ids.iter().copied().zip(commit(&writes)).collect();
            drop(ending);
            q = self.lock();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}
