//! A mergeable, diffable latency histogram over microseconds.
//!
//! Backed by `hdrhistogram` with 2 significant digits (1% relative error,
//! about 20 KiB per histogram): two replicas' histograms add exactly, and a
//! window is an exact subtraction of an earlier cumulative histogram. The
//! serialised form lists only the non-empty buckets, so snapshots stay small
//! and round-trip to the identical histogram.

use std::sync::{Arc, OnceLock};

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::stats::{RankInterval, nearest_rank, quantile_ci_ranks};

/// Largest recordable latency: 10 minutes. Slower requests are clamped to it.
pub const MAX_LATENCY_US: u64 = 600_000_000;
const SIGNIFICANT_DIGITS: u8 = 2;

/// Latency of successful requests, in microseconds.
///
/// Copy-on-write: snapshots are cloned on every evaluation (stage
/// baselines, observations, windows), so a clone shares the ~20 KiB of
/// counts and only a write to a shared histogram copies them.
#[derive(Clone)]
pub struct LatencyHistogram {
    inner: Arc<Histogram<u64>>,
}

/// Bounds on one quantile of a histogram, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct QuantileBounds {
    /// Nearest-rank point estimate.
    pub estimate_us: u64,
    /// Lower confidence bound, or `None` if the sample cannot bound it.
    pub lower_us: Option<u64>,
    /// Upper confidence bound, or `None` if the sample cannot bound it.
    pub upper_us: Option<u64>,
}

/// A histogram was asked to hold something it cannot.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HistogramError {
    #[error("latency bucket {value_us}us is above the maximum {MAX_LATENCY_US}us")]
    OutOfRange { value_us: u64 },
    #[error("latency histogram would go negative: the later snapshot has fewer samples")]
    Underflow,
}

impl LatencyHistogram {
    pub fn new() -> Self {
        static EMPTY: OnceLock<Arc<Histogram<u64>>> = OnceLock::new();
        let empty = EMPTY.get_or_init(|| {
            // The bounds are constants that hdrhistogram accepts; this cannot fail.
            Arc::new(
                Histogram::new_with_bounds(1, MAX_LATENCY_US, SIGNIFICANT_DIGITS)
                    .expect("constant histogram bounds are valid"),
            )
        });
        LatencyHistogram {
            inner: Arc::clone(empty),
        }
    }

    /// Records one latency; 0 counts as 1us and anything above the range is
    /// clamped to [`MAX_LATENCY_US`].
    pub fn record(&mut self, latency_us: u64) {
        Arc::make_mut(&mut self.inner).saturating_record(latency_us.max(1));
    }

    /// Records every latency in `latencies_us` (as [`LatencyHistogram::record`]);
    /// returns how many.
    pub fn record_all(&mut self, latencies_us: impl IntoIterator<Item = u64>) -> u64 {
        let inner = Arc::make_mut(&mut self.inner);
        let mut n = 0;
        for us in latencies_us {
            inner.saturating_record(us.max(1));
            n += 1;
        }
        n
    }

    /// Records `count` samples of the same latency.
    pub fn record_n(&mut self, latency_us: u64, count: u64) {
        let v = latency_us.clamp(1, MAX_LATENCY_US);
        // In range by construction, so record_n cannot fail.
        let _ = Arc::make_mut(&mut self.inner).record_n(v, count);
    }

    /// Number of recorded samples.
    pub fn len(&self) -> u64 {
        self.inner.len()
    }

    pub fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }

    /// Adds `other` into `self` (union of two sample sets).
    pub fn merge(&mut self, other: &LatencyHistogram) {
        if other.is_empty() {
            return;
        }
        // Same bounds on both sides, so add cannot fail.
        let _ = Arc::make_mut(&mut self.inner).add(&*other.inner);
    }

    /// `self - earlier`: the samples recorded after `earlier` was taken.
    pub fn window_since(&self, earlier: &LatencyHistogram) -> Result<Self, HistogramError> {
        let mut out = self.clone();
        if earlier.is_empty() {
            return Ok(out);
        }
        Arc::make_mut(&mut out.inner)
            .subtract(&*earlier.inner)
            .map_err(|_| HistogramError::Underflow)?;
        Ok(out)
    }

    /// The value at 1-based `rank` in sorted order, as the bucket's
    /// `(lowest, highest)` equivalent values. Bounds use the conservative end.
    fn value_at_rank(&self, rank: u64) -> Option<(u64, u64)> {
        let n = self.len();
        if rank == 0 || rank > n {
            return None;
        }
        // hdrhistogram's own scan finds the value at count ⌈q·n⌉; asking for
        // q = (rank − ½)/n lands on `rank` exactly despite rounding.
        let x = self.inner.value_at_quantile((rank as f64 - 0.5) / n as f64);
        Some((
            self.inner.lowest_equivalent(x),
            self.inner.highest_equivalent(x),
        ))
    }

    /// Nearest-rank percentile (see [`nearest_rank`]), reported as the
    /// highest value of its bucket.
    pub fn percentile_us(&self, p: f64) -> Option<u64> {
        let rank = nearest_rank(p, self.len())?;
        self.value_at_rank(rank).map(|(_, hi)| hi)
    }

    /// Point estimate and distribution-free `1 - alpha` bounds of the
    /// `p`-quantile. The lower bound takes the lowest value of its bucket and
    /// the upper bound the highest, so bucketing never narrows the interval.
    pub fn quantile_bounds(&self, p: f64, alpha: f64) -> Option<QuantileBounds> {
        self.quantile_rank_bounds(p, quantile_ci_ranks(p, self.len(), alpha))
    }

    /// Point estimate and bounds of the `p`-quantile at the given 1-based
    /// ranks (from an anytime-valid confidence sequence; `None` =
    /// unbounded), taking each bucket's conservative end.
    pub fn quantile_rank_bounds(&self, p: f64, ranks: RankInterval) -> Option<QuantileBounds> {
        let estimate_us = self.percentile_us(p)?;
        Some(QuantileBounds {
            estimate_us,
            lower_us: ranks
                .lower
                .and_then(|r| self.value_at_rank(r))
                .map(|(lo, _)| lo),
            upper_us: ranks
                .upper
                .and_then(|r| self.value_at_rank(r))
                .map(|(_, hi)| hi),
        })
    }

    /// Non-empty buckets as `(value_us, count)`, ascending.
    pub fn buckets(&self) -> Vec<(u64, u64)> {
        self.inner
            .iter_recorded()
            .map(|v| (v.value_iterated_to(), v.count_at_value()))
            .collect()
    }

    /// Rebuilds a histogram from [`LatencyHistogram::buckets`].
    pub fn from_buckets(buckets: &[(u64, u64)]) -> Result<Self, HistogramError> {
        let mut h = LatencyHistogram::new();
        for &(value_us, count) in buckets {
            if value_us > h.inner.highest_equivalent(MAX_LATENCY_US) {
                return Err(HistogramError::OutOfRange { value_us });
            }
            h.record_n(value_us, count);
        }
        Ok(h)
    }
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self::new()
    }
}

impl PartialEq for LatencyHistogram {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.buckets() == other.buckets()
    }
}

impl std::fmt::Debug for LatencyHistogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LatencyHistogram")
            .field("len", &self.len())
            .field("p50_us", &self.percentile_us(0.5))
            .field("p95_us", &self.percentile_us(0.95))
            .finish()
    }
}

#[derive(Serialize, Deserialize)]
struct Wire {
    /// `[value_us, count]` for each non-empty bucket.
    buckets: Vec<(u64, u64)>,
}

impl Serialize for LatencyHistogram {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        Wire {
            buckets: self.buckets(),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for LatencyHistogram {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let wire = Wire::deserialize(d)?;
        LatencyHistogram::from_buckets(&wire.buckets).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn of(values: &[u64]) -> LatencyHistogram {
        let mut h = LatencyHistogram::new();
        for &v in values {
            h.record(v);
        }
        h
    }

    #[test]
    fn percentile_uses_nearest_rank() {
        let h = of(&(1..=100).map(|i| i * 1000).collect::<Vec<_>>());
        let p95 = h.percentile_us(0.95).expect("non-empty");
        // Rank 95 is 95 ms; the bucket's highest value is within 1%.
        assert!((95_000..=95_950).contains(&p95), "{p95}");
    }

    #[test]
    fn empty_histogram_has_no_percentile() {
        assert_eq!(LatencyHistogram::new().percentile_us(0.5), None);
        assert_eq!(LatencyHistogram::new().quantile_bounds(0.5, 0.05), None);
    }

    #[test]
    fn quantile_bounds_bracket_the_estimate() {
        let h = of(&(1..=1000).map(|i| i * 10).collect::<Vec<_>>());
        let b = h.quantile_bounds(0.5, 0.05).expect("non-empty");
        let (lo, hi) = (b.lower_us.expect("lower"), b.upper_us.expect("upper"));
        assert!(lo <= b.estimate_us && b.estimate_us <= hi);
        // The 95% median interval for n = 1000 spans about ranks 470..532.
        assert!((4_600..=4_800).contains(&lo), "{lo}");
        assert!((5_200..=5_400).contains(&hi), "{hi}");
    }

    #[test]
    fn rank_bounds_take_the_conservative_end_of_each_bucket() {
        let h = of(&(1..=1000).map(|i| i * 10).collect::<Vec<_>>());
        let b = h
            .quantile_rank_bounds(
                0.5,
                RankInterval {
                    lower: Some(400),
                    upper: Some(600),
                },
            )
            .expect("non-empty");
        let (lo, hi) = (b.lower_us.expect("lower"), b.upper_us.expect("upper"));
        assert!(lo <= b.estimate_us && b.estimate_us <= hi);
        // Ranks 400 and 600: about 4 ms and 6 ms, widened to bucket edges.
        assert!(
            (3_900..=4_000).contains(&lo) && (6_000..=6_100).contains(&hi),
            "{lo} {hi}"
        );
        let open = h
            .quantile_rank_bounds(
                0.95,
                RankInterval {
                    lower: None,
                    upper: None,
                },
            )
            .expect("non-empty");
        assert_eq!((open.lower_us, open.upper_us), (None, None));
    }

    #[test]
    fn serde_round_trip_is_exact() {
        let h = of(&[1, 2, 3, 250, 999, 1_000_000, 3, 3]);
        let json = serde_json::to_string(&h).expect("serialise");
        let back: LatencyHistogram = serde_json::from_str(&json).expect("deserialise");
        assert_eq!(h, back);
    }

    #[test]
    fn out_of_range_bucket_is_rejected() {
        let err = serde_json::from_str::<LatencyHistogram>(r#"{"buckets":[[999999999999,1]]}"#);
        assert!(err.is_err());
    }

    #[test]
    fn window_of_older_from_newer_underflows() {
        let older = of(&[1, 2, 3]);
        let newer = of(&[1]);
        assert_eq!(newer.window_since(&older), Err(HistogramError::Underflow));
    }

    proptest! {
        #[test]
        fn merge_equals_recording_the_union(a in proptest::collection::vec(0u64..2_000_000, 0..200),
                                            b in proptest::collection::vec(0u64..2_000_000, 0..200)) {
            let mut merged = of(&a);
            merged.merge(&of(&b));
            let union: Vec<u64> = a.iter().chain(b.iter()).copied().collect();
            prop_assert_eq!(&merged, &of(&union));
            prop_assert_eq!(merged.window_since(&of(&a)), Ok(of(&b)));
        }

        #[test]
        fn value_at_rank_is_the_sorted_value_in_its_bucket(v in proptest::collection::vec(1u64..5_000_000, 1..300)) {
            let h = of(&v);
            let mut sorted = v.clone();
            sorted.sort_unstable();
            for (i, &x) in sorted.iter().enumerate() {
                let (lo, hi) = h.value_at_rank(i as u64 + 1).expect("in range");
                prop_assert!(lo <= x && x <= hi, "rank {}: {} not in [{}, {}]", i + 1, x, lo, hi);
            }
            prop_assert_eq!(h.value_at_rank(0), None);
            prop_assert_eq!(h.value_at_rank(v.len() as u64 + 1), None);
        }
    }
}
