//! The answers log: what a label sent later must be joined with. For a
//! model whose rollout judges quality from labels
//! (`ModelRoute::record_answers`), each arm's answer to a request (one
//! prediction: a batched request cannot be labelled as one) is recorded
//! under the request's id, with its revision, routing epoch, unit group
//! and time. The log is a bounded queue the store follower drains into
//! the store every cycle ([`crate::Gateway::take_answers`]); it is never
//! served over HTTP (answers are users' data). While the store cannot take
//! them they wait here; beyond [`ANSWERS_KEPT`] the oldest are dropped,
//! and counted (`rollgate_answers_dropped_total`).
//!
//! Written by hand: a `VecDeque` under one lock, held for a push or a
//! drain; only models that asked for it pay (a lock and the id's copy per
//! answer).

use std::collections::VecDeque;
use std::sync::Mutex;

pub use rollgate_core::labels::AnswerRecord;

/// Records kept waiting for the store; beyond it the oldest go.
pub const ANSWERS_KEPT: usize = 200_000;

/// The longest label: a class is kept to one byte past it (a longer one
/// can never match a label, and counts as wrong).
pub const MAX_CLASS: usize = 128;

#[derive(Debug, Default)]
struct Queue {
    next: u64,
    dropped: u64,
    records: VecDeque<AnswerRecord>,
}

/// The bounded queue.
#[derive(Debug)]
pub struct AnswerLog {
    queue: Mutex<Queue>,
    kept: usize,
}

impl AnswerLog {
    pub fn new(kept: usize) -> Self {
        AnswerLog {
            queue: Mutex::new(Queue {
                next: 1,
                ..Queue::default()
            }),
            kept: kept.max(1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends `record`, numbering it; the oldest goes beyond capacity.
    pub fn push(&self, mut record: AnswerRecord) {
        let mut q = self.lock();
        record.seq = q.next;
        q.next += 1;
        if q.records.len() >= self.kept {
            q.records.pop_front();
            q.dropped += 1;
        }
        q.records.push_back(record);
    }

    /// The oldest `max` records, taken out.
    pub fn take(&self, max: usize) -> Vec<AnswerRecord> {
        let mut q = self.lock();
        let n = max.min(q.records.len());
        q.records.drain(..n).collect()
    }

    /// Records taken but not stored, back in front of the queue (within
    /// its capacity: beyond it the oldest are dropped, and counted).
    pub fn put_back(&self, records: Vec<AnswerRecord>) {
        let mut q = self.lock();
        for r in records.into_iter().rev() {
            if q.records.len() >= self.kept {
                q.dropped += 1;
                continue;
            }
            q.records.push_front(r);
        }
    }

    /// Records dropped so far for want of room.
    pub fn dropped(&self) -> u64 {
        self.lock().dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: &str) -> AnswerRecord {
        AnswerRecord {
            seq: 0,
            request_id: id.into(),
            model: "m".into(),
            epoch: "1.1".into(),
            revision: "r".into(),
            unit: 0,
            at_ms: 0,
            class: Some("1".into()),
            value: None,
        }
    }

    fn ids(v: &[AnswerRecord]) -> Vec<&str> {
        v.iter().map(|a| a.request_id.as_str()).collect()
    }

    #[test]
    fn the_queue_drains_in_order_keeps_what_was_put_back_and_counts_what_it_drops() {
        let log = AnswerLog::new(3);
        for i in 0..5 {
            log.push(rec(&format!("r{i}")));
        }
        assert_eq!(log.dropped(), 2, "r0 and r1 had no room");
        let taken = log.take(2);
        assert_eq!(ids(&taken), ["r2", "r3"]);
        // The store refused them: back in front, in order.
        log.put_back(taken);
        assert_eq!(ids(&log.take(10)), ["r2", "r3", "r4"]);
        for i in 5..9 {
            log.push(rec(&format!("r{i}")));
        }
        assert_eq!(log.dropped(), 3, "r5 went for r8");
        log.put_back(vec![rec("old")]);
        assert_eq!(log.dropped(), 4, "no room to put it back");
        assert_eq!(ids(&log.take(10)), ["r6", "r7", "r8"]);
    }
}
