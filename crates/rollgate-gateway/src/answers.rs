//! The answers log: what a label sent later must be joined with. For a
//! model whose rollout judges quality from labels
//! (`ModelRoute::record_answers`), each arm's answer to a request (one
//! prediction: a batched request cannot be labelled as one) is recorded
//! under the request's id, with its revision, routing epoch, unit group
//! and time. The log is a bounded ring the controller reads by sequence
//! number (`GET /rollgate/answers?after=SEQ`) and keeps in its store;
//! a record the controller did not read before the ring wrapped is lost,
//! and the page says how many were.
//!
//! Written by hand: a `VecDeque` under one lock, held for a push; only
//! models that asked for it pay (a lock and the id's copy per answer).

use std::collections::VecDeque;
use std::sync::Mutex;

/// Records kept; beyond it the oldest go.
pub const ANSWERS_KEPT: usize = 200_000;

/// Records one page holds at most.
pub const PAGE_MAX: usize = 10_000;

pub use rollgate_core::labels::{AnswerRecord, AnswersPage};

#[derive(Debug, Default)]
struct Ring {
    next: u64,
    records: VecDeque<AnswerRecord>,
}

/// The bounded log.
#[derive(Debug)]
pub struct AnswerLog {
    ring: Mutex<Ring>,
    kept: usize,
}

impl AnswerLog {
    pub fn new(kept: usize) -> Self {
        AnswerLog {
            ring: Mutex::new(Ring {
                next: 1,
                records: VecDeque::new(),
            }),
            kept: kept.max(1),
        }
    }

    /// Appends `record`, numbering it; the oldest goes beyond capacity.
    pub fn push(&self, mut record: AnswerRecord) {
        let mut ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        record.seq = ring.next;
        ring.next += 1;
        if ring.records.len() >= self.kept {
            ring.records.pop_front();
        }
        ring.records.push_back(record);
    }

    /// The records after `after`, at most `limit` (and [`PAGE_MAX`]).
    pub fn page(&self, gateway: &str, boot: &str, after: u64, limit: usize) -> AnswersPage {
        let ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let first = ring.records.front().map_or(ring.next, |r| r.seq);
        let skip = after.saturating_add(1).saturating_sub(first);
        let answers = ring
            .records
            .iter()
            .skip(usize::try_from(skip).unwrap_or(usize::MAX))
            .take(limit.min(PAGE_MAX))
            .cloned()
            .collect();
        AnswersPage {
            gateway: gateway.to_string(),
            boot: boot.to_string(),
            first,
            next: ring.next,
            answers,
        }
    }
}

/// `after` and `limit` from a query string (`after=12&limit=500`);
/// missing or unreadable values take 0 and [`PAGE_MAX`].
pub fn page_query(query: Option<&str>) -> (u64, usize) {
    let (mut after, mut limit) = (0, PAGE_MAX);
    for pair in query.unwrap_or("").split('&') {
        match pair.split_once('=') {
            Some(("after", v)) => after = v.parse().unwrap_or(0),
            Some(("limit", v)) => limit = v.parse().unwrap_or(PAGE_MAX),
            _ => {}
        }
    }
    (after, limit)
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

    #[test]
    fn pages_follow_the_sequence_and_a_wrapped_ring_says_what_it_lost() {
        let log = AnswerLog::new(3);
        for i in 0..5 {
            log.push(rec(&format!("r{i}")));
        }
        let p = log.page("g", "b", 0, 10);
        assert_eq!((p.first, p.next), (3, 6), "records 1 and 2 were lost");
        let ids: Vec<_> = p.answers.iter().map(|a| a.request_id.as_str()).collect();
        assert_eq!(ids, ["r2", "r3", "r4"]);
        let p = log.page("g", "b", 4, 10);
        assert_eq!(p.answers.len(), 1);
        assert_eq!(p.answers[0].seq, 5);
        assert!(log.page("g", "b", 5, 10).answers.is_empty());
        assert_eq!(log.page("g", "b", 0, 2).answers.len(), 2);
        assert!(log.page("g", "b", u64::MAX, 2).answers.is_empty());
    }

    #[test]
    fn a_query_reads_after_and_limit_and_ignores_the_rest() {
        assert_eq!(page_query(Some("after=12&limit=5&x=1")), (12, 5));
        assert_eq!(page_query(Some("after=-1")), (0, PAGE_MAX));
        assert_eq!(page_query(None), (0, PAGE_MAX));
    }
}
