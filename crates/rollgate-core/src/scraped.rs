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
//! - **Nothing is evidence of health.** A series without two samples in a
//!   window adds nothing; a target that went away (stale) adds nothing; so
//!   a stage without evidence starves and fails safe at its deadline, as it
//!   does through the gateway.
//!
//! The controller reads the samples; this module is pure.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::exposure::{Epoch, Exposure};
use crate::histogram::LatencyHistogram;
use crate::rollout::Timestamp;
use crate::snapshot::{FailureCounts, RevisionStats, Snapshot};

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

/// One look's scrape as per-epoch counts: each `(revision, target)` is a
/// series of its own (`prometheus/<target>/<revision>`), reporting its
/// counts in every window. Latency samples beyond the successes (a
/// histogram that also times failures) are scaled down to them, bucket by
/// bucket; each bucket's samples are counted at its upper bound (`+Inf` at
/// twice the largest finite bound), so latency is never understated.
pub fn exposure(scrape: &Scrape, windows: &[EpochWindow]) -> Exposure {
    let mut out = Exposure::default();
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
        let e = exposure(&scrape, &windows(&began, Duration::from_secs(2)));
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
