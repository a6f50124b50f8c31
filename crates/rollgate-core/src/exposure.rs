//! Evidence that matches the exposure.
//!
//! A test may only compare what was exposed alike. Three things in a real
//! deployment break "one cumulative snapshot since the rollout began":
//!
//! - a request that finishes after a routing change was routed by the old
//!   split, so gateways count each request under the **routing epoch** in
//!   force when it *arrived* (every routing change of a rollout starts a new
//!   epoch), and an increment the tests consume comes from one epoch only;
//! - a gateway that restarts starts its counters again, and one that drops
//!   out of the live set and returns brings its whole history at once, so
//!   every gateway process (its id and boot) is its own **series**, differenced
//!   on its own: a restart starts a new series, a returning series adds only
//!   what is new, and nothing already counted is lost or counted twice;
//! - load and latency drift with time, and the arms cover time differently
//!   from stage to stage, so two-sample comparisons are made **within** an
//!   epoch (where both arms share the same stretch of time at a fixed split)
//!   and never pool across epochs.
//!
//! The [`Ledger`] is part of the rollout's state, so a restarted controller
//! continues exactly where the last one committed.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::snapshot::Snapshot;
pub use crate::types::Epoch;
use crate::types::Timestamp;

/// What one gateway process reported for a rollout's model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SeriesReport {
    /// Cumulative counts per routing epoch of arrival.
    Epochs { epochs: BTreeMap<Epoch, Snapshot> },
    /// Cumulative counts not split by epoch (a gateway that does not report
    /// epochs, a test): each increment is counted in the epoch current at
    /// the look, i.e. at completion. Valid only while no request straddles
    /// a routing change.
    Pooled { total: Snapshot },
}

/// Everything the gateways that answered reported for one rollout, by
/// series (a gateway process: its id and boot, e.g. `"gw-1/3f2a…"`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Exposure {
    pub series: BTreeMap<String, SeriesReport>,
    /// A series the look compares stopped before the look's time (a scrape
    /// target gone, a scrape paused): the counts do not cover the look, so
    /// they are no evidence for it ([`crate::scraped`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stale: Option<StaleSeries>,
}

/// A series that stopped: which revision, which series, and its newest
/// sample.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StaleSeries {
    pub revision: String,
    /// The series, e.g. `failures of job="models",instance="10.0.0.7:8082"`.
    pub series: String,
    /// When its newest sample was taken.
    pub newest: Timestamp,
}

impl Exposure {
    /// One series of cumulative counts, not split by epoch.
    pub fn pooled(total: Snapshot) -> Exposure {
        Exposure {
            series: BTreeMap::from([("pooled".to_string(), SeriesReport::Pooled { total })]),
            stale: None,
        }
    }

    /// Adds a series reported per epoch.
    pub fn with_epochs(
        mut self,
        series: impl Into<String>,
        epochs: BTreeMap<Epoch, Snapshot>,
    ) -> Exposure {
        self.series
            .insert(series.into(), SeriesReport::Epochs { epochs });
        self
    }

    /// Adds the shadow pairs of `gateways`' per-epoch series, without
    /// their counts of the revisions (which come from elsewhere, e.g.
    /// scraped counters: only a gateway can pair answers).
    pub fn with_pairs_of(mut self, gateways: &Exposure) -> Exposure {
        for (id, report) in &gateways.series {
            if let SeriesReport::Epochs { epochs } = report {
                let pairs = epochs.iter().map(|(e, s)| (*e, s.pairs_only())).collect();
                self = self.with_epochs(id.clone(), pairs);
            }
        }
        self
    }
}

/// What one series has contributed so far, per epoch.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct SeriesLedger {
    epochs: BTreeMap<Epoch, Snapshot>,
    /// Pooled series only: the last cumulative total seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    last_total: Option<Snapshot>,
    last_seen: Timestamp,
}

/// The champion's counts in one look, for outage detection on recent
/// evidence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct RecentLook {
    at: Timestamp,
    requests: u64,
    failures: u64,
}

/// How many series the ledger keeps apart; older silent ones are archived
/// (their counts kept, no longer updatable), so the state stays bounded
/// however often gateways restart.
pub const MAX_SERIES: usize = 32;

/// The rollout's evidence: what every series contributed to every epoch.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Ledger {
    series: BTreeMap<String, SeriesLedger>,
    /// Archived series' counts, per epoch.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    archived: BTreeMap<Epoch, Snapshot>,
    #[serde(default, skip_serializing_if = "VecDeque::is_empty")]
    recent: VecDeque<RecentLook>,
}

impl Ledger {
    /// Takes one look's reports. Returns what is new since the last look,
    /// per epoch. `current` is the epoch in force now (pooled series are
    /// counted there). A counter that went backwards within a series adds
    /// nothing for that epoch: evidence is lost, never invented.
    pub fn absorb(
        &mut self,
        exposure: &Exposure,
        current: Epoch,
        now: Timestamp,
    ) -> BTreeMap<Epoch, Snapshot> {
        let mut new: BTreeMap<Epoch, Snapshot> = BTreeMap::new();
        for (id, report) in &exposure.series {
            let s = self.series.entry(id.clone()).or_default();
            s.last_seen = now;
            match report {
                SeriesReport::Epochs { epochs } => {
                    for (&e, snap) in epochs.iter().filter(|(e, _)| (1..=current).contains(*e)) {
                        let seen = s.epochs.entry(e).or_default();
                        if let Ok(d) = snap.window_since(seen)
                            && !d.is_empty()
                        {
                            new.entry(e).or_default().merge(&d);
                            *seen = snap.clone();
                        }
                    }
                }
                SeriesReport::Pooled { total } => {
                    let d = match &s.last_total {
                        None => Ok(total.clone()),
                        Some(last) => total.window_since(last),
                    };
                    // A pooled series that went backwards restarted: its
                    // counts start again from here.
                    if let Ok(d) = &d
                        && !d.is_empty()
                    {
                        new.entry(current).or_default().merge(d);
                        s.epochs.entry(current).or_default().merge(d);
                    }
                    s.last_total = Some(total.clone());
                }
            }
        }
        self.archive_beyond(MAX_SERIES);
        new
    }

    /// Each series and when the last look that read it was: a gateway can
    /// tell from the committed state whether the controller has judged
    /// the rollout on its counts since a given time.
    pub fn seen(&self) -> impl Iterator<Item = (&str, Timestamp)> {
        self.series.iter().map(|(id, s)| (id.as_str(), s.last_seen))
    }

    /// Takes the counts a rollout starts from: what pooled series counted
    /// before the first stage is not the rollout's evidence. (Epoch series
    /// need nothing: the rollout's epochs start at zero.)
    pub fn baseline(&mut self, exposure: &Exposure) {
        for (id, report) in &exposure.series {
            if let SeriesReport::Pooled { total } = report {
                self.series.entry(id.clone()).or_default().last_total = Some(total.clone());
            }
        }
    }

    fn archive_beyond(&mut self, keep: usize) {
        while self.series.len() > keep {
            let Some(oldest) = self
                .series
                .iter()
                .min_by_key(|(_, s)| s.last_seen)
                .map(|(k, _)| k.clone())
            else {
                return;
            };
            if let Some(s) = self.series.remove(&oldest) {
                for (e, snap) in s.epochs {
                    self.archived.entry(e).or_default().merge(&snap);
                }
            }
        }
    }

    /// Everything counted in epoch `e`, over every series.
    pub fn epoch(&self, e: Epoch) -> Snapshot {
        let mut out = self.archived.get(&e).cloned().unwrap_or_default();
        for s in self.series.values() {
            if let Some(snap) = s.epochs.get(&e) {
                out.merge(snap);
            }
        }
        out
    }

    /// The epochs with any evidence, in order.
    pub fn epochs(&self) -> Vec<Epoch> {
        let mut es: Vec<Epoch> = self
            .series
            .values()
            .flat_map(|s| s.epochs.keys().copied())
            .chain(self.archived.keys().copied())
            .collect();
        es.sort_unstable();
        es.dedup();
        es
    }

    /// Everything counted in epochs `from..=to`, pooled. Pooling across
    /// epochs is for counting (sample floors, display) and for tests that
    /// stay valid under pooling, never for two-sample comparisons.
    pub fn pooled(&self, from: Epoch, to: Epoch) -> Snapshot {
        let mut out = Snapshot::default();
        for e in self
            .epochs()
            .into_iter()
            .filter(|e| (from..=to).contains(e))
        {
            out.merge(&self.epoch(e));
        }
        out
    }

    /// Notes the champion's counts of one look and forgets looks older than
    /// `window`.
    pub fn note_champion(&mut self, now: Timestamp, requests: u64, failures: u64, window: u64) {
        self.recent.push_back(RecentLook {
            at: now,
            requests,
            failures,
        });
        while self
            .recent
            .front()
            .is_some_and(|l| now.0.saturating_sub(l.at.0) > window)
        {
            self.recent.pop_front();
        }
    }

    /// The champion's `(requests, failures)` over the looks of the last
    /// `window` milliseconds.
    pub fn recent_champion(&self, now: Timestamp, window: u64) -> (u64, u64) {
        self.recent
            .iter()
            .filter(|l| now.0.saturating_sub(l.at.0) <= window)
            .fold((0, 0), |(r, f), l| (r + l.requests, f + l.failures))
    }

    /// The ledger as far as counts go: without what a look changes when it
    /// counted nothing (each series' last look, looks that counted no
    /// request). Two ledgers alike here hold the same evidence.
    pub fn counted(&self) -> Ledger {
        let mut out = self.clone();
        for s in out.series.values_mut() {
            s.last_seen = Timestamp(0);
        }
        out.recent.retain(|l| l.requests > 0 || l.failures > 0);
        out
    }

    /// How many series are kept apart (archived ones not counted).
    pub fn series_count(&self) -> usize {
        self.series.len()
    }
}

/// A gateway's measurements at one instant, cumulative since it started:
/// what `GET /rollgate/stats` answers, and what the controller reads into
/// a rollout's [`Exposure`]. The wire format between the data plane and the
/// control plane, so it lives here, where both meet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GatewaySnapshot {
    /// The gateway's id.
    #[serde(default)]
    pub gateway: String,
    /// Drawn at every start: with the id, it names one series of counts, so
    /// a restarted gateway is a new series, never counters going backwards.
    #[serde(default)]
    pub boot: String,
    /// Per model: stats per revision and shadow pairs, over every epoch.
    pub models: BTreeMap<String, Snapshot>,
    /// Per model and routing epoch of arrival (`""`: outside any rollout).
    #[serde(default)]
    pub epochs: BTreeMap<String, BTreeMap<String, Snapshot>>,
    /// Requests refused because the gateway was at capacity.
    pub overloaded: u64,
    /// Requests sent again on a fresh connection because the upstream
    /// closed a pooled one before answering.
    #[serde(default)]
    pub retried: u64,
    /// Requests whose body did not arrive in time (408).
    #[serde(default)]
    pub slow_clients: u64,
    /// Requests whose body was beyond the body limit and was streamed to
    /// the revision serving it (nothing needed it whole).
    #[serde(default)]
    pub streamed_requests: u64,
    /// Requests in another protocol than their model's (400).
    #[serde(default)]
    pub wrong_protocol: u64,
    /// Answers recorded for labels dropped before the store could take
    /// them (the gateway's queue was full).
    #[serde(default)]
    pub answers_dropped: u64,
    /// Per model: candidate requests retried on the champion.
    pub fallbacks: BTreeMap<String, u64>,
    /// Models that cannot be routed, and why.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub unroutable: BTreeMap<String, String>,
    /// Per model and revision: requests a tester pinned to a revision
    /// with the pin header or cookie. Served, and counted only here: never
    /// evidence for a gate.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pinned: BTreeMap<String, BTreeMap<String, u64>>,
    pub in_flight: i64,
}

/// The routing epoch label gateways count under: rollout id and epoch.
pub fn epoch_label(rollout: i64, epoch: Epoch) -> String {
    format!("{rollout}.{epoch}")
}

/// The epoch of `rollout` a label names, if it is one of that rollout's.
pub fn epoch_of(label: &str, rollout: i64) -> Option<Epoch> {
    let (r, e) = label.split_once('.')?;
    (r.parse::<i64>().ok()? == rollout)
        .then(|| e.parse().ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FailureClass, PairStats};

    fn snap(req: u64, fail: u64) -> Snapshot {
        let mut s = Snapshot::default();
        let r = s.revision_mut("a");
        for _ in 0..req - fail {
            r.record_success(1000, std::iter::empty::<&str>());
        }
        for _ in 0..fail {
            r.record_failure(FailureClass::Timeout);
        }
        s
    }

    #[test]
    fn pairs_are_taken_from_gateways_without_their_counts() {
        let mut counted = snap(10, 2);
        counted.pairs_mut("a").record_pairs(7, true, false);
        let gateways = Exposure::default().with_epochs("gw/1", BTreeMap::from([(3, counted)]));
        let e = Exposure::default().with_pairs_of(&gateways);
        let SeriesReport::Epochs { epochs } = &e.series["gw/1"] else {
            panic!("per epoch");
        };
        assert!(epochs[&3].revisions().is_empty());
        assert_eq!(epochs[&3].pairs_for("a").map(PairStats::pairs), Some(7));
    }

    fn epochs(pairs: &[(Epoch, u64, u64)]) -> BTreeMap<Epoch, Snapshot> {
        pairs.iter().map(|&(e, r, f)| (e, snap(r, f))).collect()
    }

    fn requests(s: &Snapshot) -> u64 {
        s.revision("a").requests()
    }

    #[test]
    fn late_completions_stay_in_their_epoch() {
        let mut l = Ledger::default();
        l.absorb(
            &Exposure::default().with_epochs("g/1", epochs(&[(1, 10, 0)])),
            1,
            Timestamp(0),
        );
        // After the switch to epoch 2, epoch 1 still completes requests.
        let new = l.absorb(
            &Exposure::default().with_epochs("g/1", epochs(&[(1, 12, 2), (2, 5, 0)])),
            2,
            Timestamp(1000),
        );
        assert_eq!(requests(&new[&1]), 2);
        assert_eq!(new[&1].revision("a").failure_count(), 2);
        assert_eq!(requests(&new[&2]), 5);
        assert_eq!(requests(&l.epoch(1)), 12);
    }

    #[test]
    fn a_restart_is_a_new_series_and_nothing_is_lost_or_double_counted() {
        let mut l = Ledger::default();
        let mut t = 0;
        let mut look = |l: &mut Ledger, e: Exposure| {
            t += 1000;
            l.absorb(&e, 2, Timestamp(t))
        };
        look(
            &mut l,
            Exposure::default().with_epochs("g/boot1", epochs(&[(2, 40, 0)])),
        );
        // The gateway restarts: a new boot starts at zero.
        let new = look(
            &mut l,
            Exposure::default().with_epochs("g/boot2", epochs(&[(2, 3, 0)])),
        );
        assert_eq!(requests(&new[&2]), 3);
        assert_eq!(requests(&l.epoch(2)), 43);
        // A flapping series returns with its whole history: only the new part counts.
        look(
            &mut l,
            Exposure::default().with_epochs("g/boot1", epochs(&[(2, 40, 0)])),
        );
        let new = look(
            &mut l,
            Exposure::default()
                .with_epochs("g/boot1", epochs(&[(2, 45, 0)]))
                .with_epochs("g/boot2", epochs(&[(2, 3, 0)])),
        );
        assert_eq!(requests(&new[&2]), 5);
        assert_eq!(requests(&l.epoch(2)), 48);
    }

    #[test]
    fn counters_going_backwards_add_nothing() {
        let mut l = Ledger::default();
        l.absorb(&Exposure::pooled(snap(10, 1)), 1, Timestamp(0));
        let new = l.absorb(&Exposure::pooled(snap(4, 0)), 1, Timestamp(1));
        assert!(new.is_empty());
        let new = l.absorb(&Exposure::pooled(snap(6, 0)), 1, Timestamp(2));
        assert_eq!(requests(&new[&1]), 2);
        assert_eq!(requests(&l.epoch(1)), 12);
        let mut l2 = Ledger::default();
        l2.absorb(
            &Exposure::default().with_epochs("g", epochs(&[(1, 10, 0)])),
            1,
            Timestamp(0),
        );
        let new = l2.absorb(
            &Exposure::default().with_epochs("g", epochs(&[(1, 3, 0)])),
            1,
            Timestamp(1),
        );
        assert!(new.is_empty());
        assert_eq!(requests(&l2.epoch(1)), 10);
    }

    #[test]
    fn pooled_series_count_in_the_current_epoch() {
        let mut l = Ledger::default();
        l.absorb(&Exposure::pooled(snap(10, 0)), 1, Timestamp(0));
        l.absorb(&Exposure::pooled(snap(15, 0)), 2, Timestamp(1));
        assert_eq!(requests(&l.epoch(1)), 10);
        assert_eq!(requests(&l.epoch(2)), 5);
        assert_eq!(requests(&l.pooled(1, 2)), 15);
        assert_eq!(l.epochs(), vec![1, 2]);
    }

    #[test]
    fn epochs_from_the_future_are_ignored() {
        let mut l = Ledger::default();
        let new = l.absorb(
            &Exposure::default().with_epochs("g", epochs(&[(3, 10, 0)])),
            2,
            Timestamp(0),
        );
        assert!(new.is_empty());
    }

    #[test]
    fn series_beyond_the_cap_are_archived_with_their_counts() {
        let mut l = Ledger::default();
        for i in 0..(MAX_SERIES as u64 + 5) {
            l.absorb(
                &Exposure::default().with_epochs(format!("g/{i}"), epochs(&[(1, 1, 0)])),
                1,
                Timestamp(i),
            );
        }
        assert_eq!(l.series_count(), MAX_SERIES);
        assert_eq!(requests(&l.epoch(1)), MAX_SERIES as u64 + 5);
    }

    #[test]
    fn recent_champion_forgets_old_looks() {
        let mut l = Ledger::default();
        for t in 0..20u64 {
            l.note_champion(Timestamp(t * 1000), 10, u64::from(t >= 15) * 10, 5000);
        }
        // Looks at 14..=19 s are within 5 s of 19 s.
        assert_eq!(l.recent_champion(Timestamp(19_000), 5000), (60, 50));
    }

    #[test]
    fn a_look_that_counted_nothing_leaves_the_counted_ledger_alike() {
        let mut l = Ledger::default();
        l.absorb(
            &Exposure::default().with_epochs("g/1", epochs(&[(1, 5, 1)])),
            1,
            Timestamp(1_000),
        );
        l.note_champion(Timestamp(1_000), 5, 1, 60_000);
        let before = l.clone();
        // The same counts seen again later, the champion's look counting none.
        l.absorb(
            &Exposure::default().with_epochs("g/1", epochs(&[(1, 5, 1)])),
            1,
            Timestamp(2_000),
        );
        l.note_champion(Timestamp(2_000), 0, 0, 60_000);
        assert_ne!(l, before, "the look is noted");
        assert_eq!(l.counted(), before.counted(), "but nothing was counted");
        // A request counted is a difference.
        l.note_champion(Timestamp(3_000), 1, 0, 60_000);
        assert_ne!(l.counted(), before.counted());
        let mut more = before.clone();
        more.absorb(
            &Exposure::default().with_epochs("g/1", epochs(&[(1, 6, 1)])),
            1,
            Timestamp(3_000),
        );
        assert_ne!(more.counted(), before.counted());
    }
}
