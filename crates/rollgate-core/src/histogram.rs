//! A mergeable, diffable latency histogram over microseconds.
//!
//! Backed by `hdrhistogram` with 2 significant digits (1% relative error,
//! about 20 KiB per histogram): two replicas' histograms add exactly, and a
//! window is an exact subtraction of an earlier cumulative histogram. The
//! serialised form lists only the non-empty buckets, so snapshots stay small
//! and round-trip to the identical histogram.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::stats::{RankInterval, nearest_rank, quantile_ci_ranks};

/// Largest recordable latency: 10 minutes. Slower requests are clamped to it.
pub const MAX_LATENCY_US: u64 = 600_000_000;
const SIGNIFICANT_DIGITS: u8 = 2;

/// Latency of successful requests, in microseconds.
#[derive(Clone)]
pub struct LatencyHistogram {
    inner: Histogram<u64>,
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
        // The bounds are constants that hdrhistogram accepts; this cannot fail.
        let inner = Histogram::new_with_bounds(1, MAX_LATENCY_US, SIGNIFICANT_DIGITS)
            .expect("constant histogram bounds are valid");
        LatencyHistogram { inner }
    }

    /// Records one latency; 0 counts as 1us and anything above the range is
    /// clamped to [`MAX_LATENCY_US`].
    pub fn record(&mut self, latency_us: u64) {
        self.inner.saturating_record(latency_us.max(1));
    }

    /// Records `count` samples of the same latency.
    pub fn record_n(&mut self, latency_us: u64, count: u64) {
        let v = latency_us.clamp(1, MAX_LATENCY_US);
        // In range by construction, so record_n cannot fail.
        let _ = self.inner.record_n(v, count);
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
        // Same bounds on both sides, so add cannot fail.
        let _ = self.inner.add(&other.inner);
    }

    /// `self - earlier`: the samples recorded after `earlier` was taken.
    pub fn window_since(&self, earlier: &LatencyHistogram) -> Result<Self, HistogramError> {
        let mut out = self.clone();
        out.inner
            .subtract(&earlier.inner)
            .map_err(|_| HistogramError::Underflow)?;
        Ok(out)
    }

    /// The value at 1-based `rank` in sorted order, as the bucket's
    /// `(lowest, highest)` equivalent values. Bounds use the conservative end.
    fn value_at_rank(&self, rank: u64) -> Option<(u64, u64)> {
        if rank == 0 || rank > self.len() {
            return None;
        }
        let mut seen = 0u64;
        for v in self.inner.iter_recorded() {
            seen += v.count_at_value();
            if seen >= rank {
                let x = v.value_iterated_to();
                return Some((
                    self.inner.lowest_equivalent(x),
                    self.inner.highest_equivalent(x),
                ));
            }
        }
        None
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
        let estimate_us = self.percentile_us(p)?;
        let RankInterval { lower, upper } = quantile_ci_ranks(p, self.len(), alpha);
        Some(QuantileBounds {
            estimate_us,
            lower_us: lower.and_then(|r| self.value_at_rank(r)).map(|(lo, _)| lo),
            upper_us: upper.and_then(|r| self.value_at_rank(r)).map(|(_, hi)| hi),
        })
    }

    /// Bounds of the `p`-quantile given a CDF band of half-width `eps`
    /// (`sup |F̂ − F| <= eps`): the empirical `(p − eps)`- and
    /// `(p + eps)`-quantiles. A side the band cannot bound is `None`.
    pub fn quantile_band_bounds(&self, p: f64, eps: f64) -> Option<QuantileBounds> {
        let estimate_us = self.percentile_us(p)?;
        let n = self.len() as f64;
        let lower_rank = ((p - eps) * n - 1e-9).ceil();
        let upper_rank = ((p + eps) * n - 1e-9).ceil();
        Some(QuantileBounds {
            estimate_us,
            lower_us: (p - eps > 0.0)
                .then(|| self.value_at_rank(lower_rank.max(1.0) as u64))
                .flatten()
                .map(|(lo, _)| lo),
            upper_us: (p + eps < 1.0)
                .then(|| self.value_at_rank(upper_rank as u64))
                .flatten()
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
    fn band_bounds_widen_with_the_band_and_bracket_the_estimate() {
        let h = of(&(1..=1000).map(|i| i * 10).collect::<Vec<_>>());
        let narrow = h.quantile_band_bounds(0.5, 0.01).expect("non-empty");
        let wide = h.quantile_band_bounds(0.5, 0.1).expect("non-empty");
        let (nl, nu) = (
            narrow.lower_us.expect("lower"),
            narrow.upper_us.expect("upper"),
        );
        let (wl, wu) = (wide.lower_us.expect("lower"), wide.upper_us.expect("upper"));
        assert!(wl <= nl && nl <= narrow.estimate_us && narrow.estimate_us <= nu && nu <= wu);
        // Ranks 400 and 600 for eps = 0.1: about 4 ms and 6 ms.
        assert!(
            (3_900..=4_000).contains(&wl) && (6_000..=6_100).contains(&wu),
            "{wl} {wu}"
        );
        // A band reaching past the top cannot bound the tail.
        assert_eq!(
            h.quantile_band_bounds(0.95, 0.1).and_then(|b| b.upper_us),
            None
        );
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
    }
}
