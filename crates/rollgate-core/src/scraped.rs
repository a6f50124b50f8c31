//! Evidence from a data plane rollgate does not carry: raw cumulative
//! counters scraped by Prometheus, turned into the same per-epoch counts
//! the gateway reports, so every gate and safety rule applies unchanged.
//!
//! What the gateway gets by construction, scraped counters give only with
//! care (the lessons of seed 000):
//!
//! - **One instant.** Every query of one look is read at the same `time=`,
//!   so successes, failures and latency describe the same requests.
//! - **Raw samples, differenced here.** `increase()` extrapolates to
//!   fractional requests; here an epoch's count is the sum of the
//!   differences between consecutive raw samples, and a sample below its
//!   predecessor is a counter reset (the target restarted): what it counts
//!   is new. Stale markers and non-finite values are not samples.
//! - **The window never reaches back before the epoch.** A counter counts
//!   requests when they *finish*; the gateway counts them by the epoch they
//!   *arrived* in. A request finishing up to `horizon` (the longest a
//!   request can take, plus the time a routing change takes to apply) after
//!   an epoch began may have arrived before it, so an epoch's count starts
//!   at its first sample at or after `began + horizon` and ends at its last
//!   sample at or before the next epoch began. What finishes in between is
//!   lost, never counted under the wrong split.
//! - **Evidence covers the look, or it is not evidence.** Every series a
//!   look reads (each revision's successes, failures and latency buckets,
//!   per target) must have a sample within `fresh` (two scrape intervals)
//!   of the look's time. One that stopped — its target removed, its scrapes
//!   failing, Prometheus not scraping — makes the whole look stale
//!   ([`Exposure::stale`], naming the revision and the series): no counts
//!   at all, so the stage waits and fails safe at its deadline if the
//!   series never returns. Before that, what it counted up to its last
//!   sample would stand for the whole stage on its side alone, while the
//!   other arm went on counting.
//! - **Both arms over the same window.** A fresh look cuts every window at
//!   the newest instant every series it reads has reached (the oldest of
//!   their newest samples): the champion's and the candidate's counts end
//!   at the same time, never one a scrape ahead of the other.
//! - **Nothing is evidence of health.** A series without two samples in a
//!   window adds nothing; so a stage without evidence starves and fails
//!   safe at its deadline, as it does through the gateway.
//!
//! The controller reads the samples; this module is pure.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::exposure::{Epoch, Exposure, StaleSeries};
use crate::histogram::LatencyHistogram;
use crate::snapshot::{FailureCounts, RevisionStats, Snapshot};
use crate::types::Timestamp;

/// One counter series' raw samples, oldest first: `(when, value)`.
pub type Samples = Vec<(Timestamp, f64)>;

/// What one scrape target reported for one revision, per counter.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TargetSamples {
    /// Requests that succeeded (may be several series, e.g. one per status
    /// code: their counts add up).
    pub successes: Vec<Samples>,
    /// Requests that failed (the revision's fault: 5xx).
    pub failures: Vec<Samples>,
    /// A latency histogram's cumulative buckets: upper bound in seconds
    /// (`le`, `f64::INFINITY` for `+Inf`), and its samples.
    pub latency_buckets: Vec<(f64, Samples)>,
}

/// The samples of one look, per revision and scrape target (the target's
/// identifying labels, e.g. `job="models",instance="10.0.0.7:8082"`).
pub type Scrape = BTreeMap<String, BTreeMap<String, TargetSamples>>;

/// When an epoch's count may start and end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpochWindow {
    pub epoch: Epoch,
    /// The first instant whose completions surely arrived in this epoch.
    pub from: Timestamp,
    /// When the next epoch began (`None`: this one is current).
    pub until: Option<Timestamp>,
}

/// The windows of the epochs a look reads: the current one and the one
/// before (whose last requests may still be scraped; older ones were final
/// by the look after the next began). Each epoch began at the given
/// instant, and a request finishing `horizon` after may still have arrived
/// before.
pub fn windows(began: &BTreeMap<Epoch, Timestamp>, horizon: Duration) -> Vec<EpochWindow> {
    let mut out: Vec<EpochWindow> = Vec::with_capacity(2);
    let mut epochs = began.iter().skip(began.len().saturating_sub(2)).peekable();
    while let Some((&epoch, &at)) = epochs.next() {
        out.push(EpochWindow {
            epoch,
            from: at.plus(horizon),
            until: epochs.peek().map(|(_, next)| **next),
        });
    }
    out
}

/// How many the counter counted within `[from, until]`: the differences
/// between consecutive raw samples both inside it; a sample below its
/// predecessor is a reset, and counts its own value. Non-finite and
/// negative values are skipped (Prometheus's stale marker is a NaN).
pub fn counted(samples: &[(Timestamp, f64)], from: Timestamp, until: Option<Timestamp>) -> u64 {
    let mut previous: Option<f64> = None;
    let mut total = 0.0;
    for &(at, v) in samples {
        if at < from || until.is_some_and(|u| at > u) || !v.is_finite() || v < 0.0 {
            continue;
        }
        if let Some(p) = previous {
            total += if v >= p { v - p } else { v };
        }
        previous = Some(v);
    }
    // Counters of requests count whole requests; a float sum of them is
    // rounded, never truncated down by representation error.
    total.round() as u64
}

/// When a look reads, and how old its newest samples may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Look {
    /// The look's time (every query's `time=`).
    pub now: Timestamp,
    /// Every series read must have a sample at most this old (two scrape
    /// intervals: one may be under way at the look).
    pub fresh: Duration,
}

/// The newest usable sample of each series of `scrape`:
/// `(revision, series named with its target, when)`.
fn newest_samples(scrape: &Scrape) -> Vec<(&str, String, Timestamp)> {
    let newest = |samples: &Samples| {
        samples
            .iter()
            .rev()
            .find(|(_, v)| v.is_finite() && *v >= 0.0)
            .map(|(at, _)| *at)
    };
    let mut out = Vec::new();
    for (revision, targets) in scrape {
        for (target, s) in targets {
            let kinds = s
                .successes
                .iter()
                .map(|x| ("successes", x))
                .chain(s.failures.iter().map(|x| ("failures", x)))
                .chain(
                    s.latency_buckets
                        .iter()
                        .map(|(_, x)| ("latency_buckets", x)),
                );
            for (kind, samples) in kinds {
                if let Some(at) = newest(samples) {
                    out.push((revision.as_str(), format!("{kind} of {target}"), at));
                }
            }
        }
    }
    out
}

/// One look's scrape as per-epoch counts: each `(revision, target)` is a
/// series of its own (`prometheus/<target>/<revision>`), reporting its
/// counts in every window, cut where every series has reached. A series
/// whose newest sample is older than `look.fresh` makes the look stale (no
/// counts). Latency samples beyond the successes (a
/// histogram that also times failures) are scaled down to them, bucket by
/// bucket; each bucket's samples are counted at its upper bound (`+Inf` at
/// twice the largest finite bound), so latency is never understated.
pub fn exposure(scrape: &Scrape, windows: &[EpochWindow], look: Look) -> Exposure {
    let mut out = Exposure::default();
    let mut cut: Option<Timestamp> = None;
    for (revision, series, newest) in newest_samples(scrape) {
        if look.now.since(newest) > look.fresh {
            out.stale = Some(StaleSeries {
                revision: revision.to_string(),
                series,
                newest,
            });
            return out;
        }
        cut = Some(cut.map_or(newest, |c| c.min(newest)));
    }
    let windows: Vec<EpochWindow> = windows
        .iter()
        .map(|w| EpochWindow {
            until: match (w.until, cut) {
                (Some(u), Some(c)) => Some(u.min(c)),
                (u, c) => u.or(c),
            },
            ..*w
        })
        .collect();
    for (revision, targets) in scrape {
        for (target, samples) in targets {
            let epochs: BTreeMap<Epoch, Snapshot> = windows
                .iter()
                .map(|w| (w.epoch, snapshot(revision, samples, w)))
                .collect();
            out = out.with_epochs(format!("prometheus/{target}/{revision}"), epochs);
        }
    }
    out
}

fn snapshot(revision: &str, s: &TargetSamples, w: &EpochWindow) -> Snapshot {
    let sum = |series: &[Samples]| -> u64 {
        series
            .iter()
            .map(|x| counted(x, w.from, w.until))
            .sum::<u64>()
    };
    let successes = sum(&s.successes);
    let failures = sum(&s.failures);
    let latency = latency(&s.latency_buckets, w, successes);
    let mut snap = Snapshot::default();
    if let Ok(stats) = RevisionStats::from_parts(
        successes + failures,
        FailureCounts {
            upstream_5xx: failures,
            ..FailureCounts::default()
        },
        0,
        latency,
        BTreeMap::new(),
    ) {
        *snap.revision_mut(revision) = stats;
    }
    snap
}

/// The window's latency samples from cumulative buckets, at most
/// `successes` of them.
fn latency(buckets: &[(f64, Samples)], w: &EpochWindow, successes: u64) -> LatencyHistogram {
    let mut bounds: Vec<(f64, u64)> = buckets
        .iter()
        .filter(|(le, _)| !le.is_nan())
        .map(|(le, samples)| (*le, counted(samples, w.from, w.until)))
        .collect();
    bounds.sort_by(|a, b| a.0.total_cmp(&b.0));
    let largest_finite = bounds
        .iter()
        .rev()
        .find(|(le, _)| le.is_finite())
        .map_or(1.0, |(le, _)| *le);
    // Cumulative to per bucket; a bucket below the one under it (samples
    // of different scrapes) counts nothing.
    let mut per_bucket = Vec::with_capacity(bounds.len());
    let mut below = 0u64;
    for (le, cumulative) in bounds {
        let at_us = if le.is_finite() {
            le
        } else {
            largest_finite * 2.0
        } * 1e6;
        per_bucket.push((at_us.ceil() as u64, cumulative.saturating_sub(below)));
        below = below.max(cumulative);
    }
    let timed: u64 = per_bucket.iter().map(|(_, n)| n).sum();
    let mut h = LatencyHistogram::default();
    if timed <= successes {
        h.record_counts(per_bucket);
    } else {
        // Scaled down, rounding each bucket down: never more than the
        // successes.
        h.record_counts(
            per_bucket
                .into_iter()
                .map(|(us, n)| (us, (n as u128 * successes as u128 / timed as u128) as u64)),
        );
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn t(s: u64) -> Timestamp {
        Timestamp(s * 1000)
    }

    #[test]
    fn raw_differences_with_resets_and_stale_markers() {
        let s = vec![
            (t(0), 5.0),
            (t(1), 8.0),
            (t(2), f64::NAN), // stale marker
            (t(3), 10.0),
            (t(4), 2.0), // reset: 2 new
            (t(5), 7.0),
        ];
        assert_eq!(counted(&s, t(0), None), 3 + 2 + 2 + 5);
        // The window starts at its first sample, not before.
        assert_eq!(counted(&s, t(1), None), 2 + 2 + 5);
        assert_eq!(counted(&s, t(1), Some(t(3))), 2);
        // One sample in the window is no evidence.
        assert_eq!(counted(&s, t(5), None), 0);
        assert_eq!(counted(&[], t(0), None), 0);
    }

    #[test]
    fn epochs_begin_a_horizon_late_and_end_when_the_next_begins() {
        let began = BTreeMap::from([(0, t(0)), (1, t(10)), (2, t(40))]);
        let w = windows(&began, Duration::from_secs(5));
        assert_eq!(
            w,
            vec![
                EpochWindow {
                    epoch: 1,
                    from: t(15),
                    until: Some(t(40))
                },
                EpochWindow {
                    epoch: 2,
                    from: t(45),
                    until: None
                },
            ]
        );
    }

    #[test]
    fn a_scrape_becomes_per_epoch_counts_per_target() {
        let ramp = |per_s: f64| {
            (0..=60)
                .map(|s| (t(s), per_s * s as f64))
                .collect::<Samples>()
        };
        let target = TargetSamples {
            successes: vec![ramp(9.0)],
            failures: vec![ramp(1.0)],
            latency_buckets: vec![
                (0.05, ramp(4.0)),
                (0.1, ramp(8.0)),
                (f64::INFINITY, ramp(10.0)), // failures timed too
            ],
        };
        let scrape = Scrape::from([(
            "rev-b".to_string(),
            BTreeMap::from([("instance=\"a\"".to_string(), target)]),
        )]);
        let began = BTreeMap::from([(1, t(0)), (2, t(30))]);
        let look = Look {
            now: t(60),
            fresh: Duration::from_secs(2),
        };
        let e = exposure(&scrape, &windows(&began, Duration::from_secs(2)), look);
        let crate::exposure::SeriesReport::Epochs { epochs } =
            &e.series["prometheus/instance=\"a\"/rev-b"]
        else {
            panic!("per epoch");
        };
        // Epoch 1: samples 2..=30 (28 s); epoch 2: 32..=60 (28 s).
        for e in [1, 2] {
            let r = epochs[&e].revision("rev-b");
            assert_eq!(r.requests(), 280);
            assert_eq!(r.failure_count(), 28);
            // 280 timed, 252 successes: scaled down, never above them.
            assert!(r.latency().len() <= 252 && r.latency().len() >= 249);
        }
    }

    /// Two targets scraped every second: the champion's up to `champion`,
    /// the candidate's up to `candidate` (its target removed after).
    fn two_arms(champion: u64, candidate: u64) -> Scrape {
        let ramp = |until: u64| TargetSamples {
            successes: vec![(0..=until).map(|s| (t(s), 10.0 * s as f64)).collect()],
            failures: vec![(0..=until).map(|s| (t(s), 0.0)).collect()],
            latency_buckets: vec![],
        };
        Scrape::from([
            (
                "champ".to_string(),
                BTreeMap::from([("i=\"a\"".to_string(), ramp(champion))]),
            ),
            (
                "cand".to_string(),
                BTreeMap::from([("i=\"b\"".to_string(), ramp(candidate))]),
            ),
        ])
    }

    fn requests(e: &Exposure, revision: &str, target: &str) -> u64 {
        match &e.series[&format!("prometheus/{target}/{revision}")] {
            crate::exposure::SeriesReport::Epochs { epochs } => {
                epochs[&1].revision(revision).requests()
            }
            other => panic!("{other:?}"),
        }
    }

    /// A target removed mid-stage: while its newest sample is within two
    /// scrape intervals the look counts both arms up to it (the same
    /// window for both); past that, the look is stale, names the series,
    /// and counts nothing.
    #[test]
    fn a_series_that_stopped_is_no_evidence_and_both_arms_end_together() {
        let began = BTreeMap::from([(1, t(0))]);
        let w = windows(&began, Duration::from_secs(1));
        let look = |now| Look {
            now: t(now),
            fresh: Duration::from_secs(2),
        };
        let fresh = exposure(&two_arms(40, 38), &w, look(40));
        assert_eq!(fresh.stale, None);
        assert_eq!(requests(&fresh, "cand", "i=\"b\""), 370, "1..=38 s");
        assert_eq!(
            requests(&fresh, "champ", "i=\"a\""),
            370,
            "cut where the candidate's series ends, not 390"
        );
        let stale = exposure(&two_arms(45, 38), &w, look(45));
        assert_eq!(
            stale.stale,
            Some(StaleSeries {
                revision: "cand".into(),
                series: "successes of i=\"b\"".into(),
                newest: t(38),
            })
        );
        assert!(stale.series.is_empty(), "no counts from a stale look");
        // The champion's series stopping is the same.
        let stale = exposure(&two_arms(38, 45), &w, look(45));
        assert_eq!(stale.stale.map(|s| s.revision), Some("champ".into()));
    }

    proptest! {
        /// Whatever each arm's series last reached, a look either is stale
        /// (one of them is older than `fresh`) and counts nothing, or
        /// counts both arms over the same window: equal counts for equal
        /// traffic, never past the older of the two newest samples.
        #[test]
        fn a_look_never_counts_past_what_every_series_covers(
            champion in 1u64..60, candidate in 1u64..60, fresh in 1u64..10,
        ) {
            let now = champion.max(candidate);
            let began = BTreeMap::from([(1, t(0))]);
            let e = exposure(
                &two_arms(champion, candidate),
                &windows(&began, Duration::ZERO),
                Look { now: t(now), fresh: Duration::from_secs(fresh) },
            );
            let oldest = champion.min(candidate);
            if now - oldest > fresh {
                prop_assert!(e.stale.is_some());
                prop_assert!(e.series.is_empty());
            } else {
                prop_assert!(e.stale.is_none());
                let (h, c) = (requests(&e, "champ", "i=\"a\""), requests(&e, "cand", "i=\"b\""));
                prop_assert_eq!(h, c);
                prop_assert_eq!(c, 10 * oldest);
            }
        }
    }

    proptest! {
        /// However a counter is sampled and reset, the count is never more
        /// than what happened after the first sample (exactly that without
        /// resets: a counter that restarts and passes its old value between
        /// two scrapes hides what it lost), and windows that tile the time
        /// add up to the whole.
        #[test]
        fn counts_are_never_invented_and_windows_add_up(
            steps in prop::collection::vec((0u64..50, prop::bool::weighted(0.1)), 1..60),
            cut in 0usize..60,
        ) {
            let mut value = 0.0;
            let mut samples = Vec::new();
            for (i, &(inc, reset)) in steps.iter().enumerate() {
                if reset { value = 0.0; }
                value += inc as f64;
                samples.push((t(i as u64), value));
            }
            let whole = counted(&samples, t(0), None);
            let after_first: u64 = steps[1..].iter().map(|(inc, _)| inc).sum();
            prop_assert!(whole <= after_first);
            if !steps[1..].iter().any(|&(_, reset)| reset) {
                prop_assert_eq!(whole, after_first);
            }
            let cut = t(cut.min(steps.len() - 1) as u64);
            let left = counted(&samples, t(0), Some(cut));
            let right = counted(&samples, cut, None);
            prop_assert_eq!(left + right, whole);
        }
    }
}
