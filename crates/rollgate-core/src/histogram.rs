//! A mergeable, diffable latency histogram over microseconds.
//!
//! Log-linear buckets with 2 significant digits (at most 1% relative
//! error), the same buckets as `hdrhistogram` at `sigfig = 2`: two
//! replicas' histograms add exactly, and a window is an exact subtraction
//! of an earlier cumulative histogram. The serialised form lists only the
//! non-empty buckets, so snapshots stay small and round-trip to the
//! identical histogram.
//!
//! Written here rather than wrapping `hdrhistogram` (which it replaced,
//! and which the tests still check the buckets against): gates read
//! several quantile ranks of windows (now − stage start) on every look,
//! and the simulator looks millions of times. `hdrhistogram` re-derives
//! every bucket's value and rescans its min/max on each subtraction and
//! always spans the full 10-minute range; plain counts that grow only as
//! far as the slowest request make a window a vector subtraction and a
//! rank lookup one short scan.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::stats::{RankInterval, nearest_rank, quantile_ci_ranks};

/// Largest recordable latency: 10 minutes. Slower requests are clamped to it.
pub const MAX_LATENCY_US: u64 = 600_000_000;

/// Sub-buckets per power of two: 256 ≥ 2·10², two significant digits.
const SUB_BUCKET_BITS: u32 = 8;
const HALF_SUB_BUCKETS: usize = 1 << (SUB_BUCKET_BITS - 1);

/// The bucket that holds `v` (in `1..=MAX_LATENCY_US`): values below 256
/// have their own bucket; above, each power of two `[2^k, 2^(k+1))` is cut
/// into 128 equal buckets.
fn index_of(v: u64) -> usize {
    let v = v.clamp(1, MAX_LATENCY_US);
    // 0 for v < 256, else the power of two above the sub-bucket range.
    let shift = 64 - SUB_BUCKET_BITS - (v | 0xff).leading_zeros();
    shift as usize * HALF_SUB_BUCKETS + (v >> shift) as usize
}

/// `(lowest, highest)` value of bucket `i`.
fn bucket_bounds(i: usize) -> (u64, u64) {
    let shift = (i / HALF_SUB_BUCKETS).saturating_sub(1);
    let sub = if i < 2 * HALF_SUB_BUCKETS {
        i
    } else {
        i % HALF_SUB_BUCKETS + HALF_SUB_BUCKETS
    };
    let low = (sub as u64) << shift;
    (low, low + (1u64 << shift) - 1)
}

/// Latency of successful requests, in microseconds.
///
/// Copy-on-write: snapshots are cloned on every evaluation (stage
/// baselines, observations, windows), so a clone shares the counts and only
/// a write to a shared histogram copies them. A window shares both
/// cumulative histograms and subtracts as it reads: taking one is two
/// pointer copies and a check, not a copy of the counts.
#[derive(Clone, Default)]
pub struct LatencyHistogram {
    counts: Arc<Counts>,
    /// For a window: the earlier cumulative counts, no bucket above
    /// `counts`' (checked when the window is taken).
    minus: Option<Arc<Counts>>,
}

#[derive(Clone, Default)]
struct Counts {
    total: u64,
    /// Count per bucket index, up to the highest non-empty bucket or
    /// beyond (trailing zeros carry no meaning).
    buckets: Vec<u64>,
    /// Every bucket below this one is empty: scans start here (latencies
    /// sit far above the first buckets).
    low: usize,
}

impl Counts {
    fn add(&mut self, index: usize, count: u64) {
        if self.total == 0 || index < self.low {
            self.low = index;
        }
        if index >= self.buckets.len() {
            self.buckets.resize(index + 1, 0);
        }
        self.buckets[index] = self.buckets[index].saturating_add(count);
        self.total = self.total.saturating_add(count);
    }

    /// The non-empty prefix of the buckets.
    fn used(&self) -> &[u64] {
        let end = self
            .buckets
            .iter()
            .rposition(|&c| c > 0)
            .map_or(0, |i| i + 1);
        &self.buckets[..end]
    }

    /// Whether `earlier` has no bucket above ours: `self − earlier` is a
    /// histogram.
    fn covers(&self, earlier: &Counts) -> bool {
        let theirs = earlier.used();
        if theirs.len() > self.buckets.len() || earlier.total > self.total {
            return false;
        }
        // Branch-free, so the compiler vectorises it: a window is taken on
        // every look.
        let mut under = false;
        let from = earlier.low.min(theirs.len());
        for (&c, &e) in self.buckets[from..].iter().zip(&theirs[from..]) {
            under |= c < e;
        }
        !under
    }

    /// `self − earlier`, which [`Counts::covers`] holds for.
    fn subtract(&mut self, earlier: &Counts) {
        for (c, &e) in self.buckets.iter_mut().zip(&earlier.buckets) {
            *c -= e;
        }
        self.total -= earlier.total;
    }
}

/// Sum of `s[i..i + 8]`, the part of it that exists.
fn chunk_sum(s: &[u64], i: usize) -> u64 {
    match s.get(i..i + 8) {
        Some(chunk) => chunk.iter().sum(),
        None => s.get(i..).map_or(0, |rest| rest.iter().sum()),
    }
}

/// Bounds on one quantile of a histogram, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
        Self::default()
    }

    /// The counts, for writing: a window becomes a histogram of its own.
    fn counts_mut(&mut self) -> &mut Counts {
        if let Some(earlier) = self.minus.take() {
            Arc::make_mut(&mut self.counts).subtract(&earlier);
        }
        Arc::make_mut(&mut self.counts)
    }

    /// A histogram that owns its counts (no window left to subtract).
    fn settled(&self) -> LatencyHistogram {
        let mut h = self.clone();
        h.counts_mut();
        h
    }

    /// The count of bucket `i`.
    fn at(&self, i: usize) -> u64 {
        let c = self.counts.buckets.get(i).copied().unwrap_or(0);
        c - self
            .minus
            .as_ref()
            .map_or(0, |m| m.buckets.get(i).copied().unwrap_or(0))
    }

    /// The latencies this histogram cannot tell apart from `latency_us`
    /// (its bucket), after clamping to `1..=MAX_LATENCY_US`.
    pub fn equivalent_range(latency_us: u64) -> std::ops::RangeInclusive<u64> {
        let (lo, hi) = bucket_bounds(index_of(latency_us));
        lo..=hi
    }

    /// Records one latency; 0 counts as 1us and anything above the range is
    /// clamped to [`MAX_LATENCY_US`].
    pub fn record(&mut self, latency_us: u64) {
        self.record_counts([(latency_us, 1)]);
    }

    /// Records every latency in `latencies_us` (as [`LatencyHistogram::record`]);
    /// returns how many.
    pub fn record_all(&mut self, latencies_us: impl IntoIterator<Item = u64>) -> u64 {
        self.record_counts(latencies_us.into_iter().map(|us| (us, 1)))
    }

    /// Records `count` samples of the same latency.
    pub fn record_n(&mut self, latency_us: u64, count: u64) {
        self.record_counts([(latency_us, count)]);
    }

    /// Records `(latency_us, count)` pairs; returns how many samples. Every
    /// other way of recording comes here.
    pub fn record_counts(&mut self, counts: impl IntoIterator<Item = (u64, u64)>) -> u64 {
        let into = self.counts_mut();
        let mut n = 0;
        for (us, count) in counts {
            if count > 0 {
                into.add(index_of(us), count);
                n += count;
            }
        }
        n
    }

    /// Number of recorded samples.
    pub fn len(&self) -> u64 {
        self.counts.total - self.minus.as_ref().map_or(0, |m| m.total)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Adds `other` into `self` (union of two sample sets).
    pub fn merge(&mut self, other: &LatencyHistogram) {
        if other.is_empty() {
            return;
        }
        let other = other.settled();
        let theirs = other.counts.used();
        let counts = self.counts_mut();
        if counts.total == 0 || other.counts.low < counts.low {
            counts.low = other.counts.low;
        }
        if counts.buckets.len() < theirs.len() {
            counts.buckets.resize(theirs.len(), 0);
        }
        for (mine, &c) in counts.buckets.iter_mut().zip(theirs) {
            *mine = mine.saturating_add(c);
        }
        counts.total = counts.total.saturating_add(other.counts.total);
    }

    /// `self - earlier`: the samples recorded after `earlier` was taken.
    pub fn window_since(&self, earlier: &LatencyHistogram) -> Result<Self, HistogramError> {
        if earlier.is_empty() {
            return Ok(self.clone());
        }
        if self.minus.is_some() || earlier.minus.is_some() {
            // A window of a window: rare, settle both first.
            return self.settled().window_since(&earlier.settled());
        }
        if Arc::ptr_eq(&self.counts, &earlier.counts) {
            // Nothing recorded since: an empty window.
            return Ok(LatencyHistogram::default());
        }
        if !self.counts.covers(&earlier.counts) {
            return Err(HistogramError::Underflow);
        }
        Ok(LatencyHistogram {
            counts: Arc::clone(&self.counts),
            minus: Some(Arc::clone(&earlier.counts)),
        })
    }

    /// The value at 1-based `rank` in sorted order, as the bucket's
    /// `(lowest, highest)` equivalent values. Bounds use the conservative end.
    fn value_at_rank(&self, rank: u64) -> Option<(u64, u64)> {
        let [v] = self.values_at_ranks([Some(rank)]);
        v
    }

    /// [`LatencyHistogram::value_at_rank`] for several ranks in one scan.
    fn values_at_ranks<const N: usize>(&self, ranks: [Option<u64>; N]) -> [Option<(u64, u64)>; N] {
        let mut out = [None; N];
        let mut order: [usize; N] = std::array::from_fn(|i| i);
        order.sort_unstable_by_key(|&i| ranks[i]);
        let (now, earlier) = (
            &self.counts.buckets[..],
            self.minus.as_ref().map_or(&[][..], |m| &m.buckets[..]),
        );
        // Seen = cumulative now − cumulative earlier, below bucket i.
        let (mut i, mut seen) = (self.counts.low, 0u64);
        for slot in order {
            let Some(rank) = ranks[slot].filter(|&r| r >= 1 && r <= self.len()) else {
                continue;
            };
            // Skip whole chunks first (summed branch-free), then buckets.
            while i + 8 <= now.len() {
                let sum = chunk_sum(now, i) - chunk_sum(earlier, i);
                if seen + sum >= rank {
                    break;
                }
                seen += sum;
                i += 8;
            }
            while i < now.len() && seen + self.at(i) < rank {
                seen += self.at(i);
                i += 1;
            }
            out[slot] = (i < now.len()).then(|| bucket_bounds(i));
        }
        out
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
        let [lower, estimate, upper] =
            self.values_at_ranks([ranks.lower, nearest_rank(p, self.len()), ranks.upper]);
        Some(QuantileBounds {
            estimate_us: estimate?.1,
            lower_us: lower.map(|(lo, _)| lo),
            upper_us: upper.map(|(_, hi)| hi),
        })
    }

    /// Non-empty buckets as `(value_us, count)`, ascending; `value_us` is
    /// the highest value of the bucket.
    pub fn buckets(&self) -> Vec<(u64, u64)> {
        (0..self.counts.buckets.len())
            .map(|i| (i, self.at(i)))
            .filter(|&(_, c)| c > 0)
            .map(|(i, c)| (bucket_bounds(i).1, c))
            .collect()
    }

    /// Rebuilds a histogram from [`LatencyHistogram::buckets`].
    pub fn from_buckets(buckets: &[(u64, u64)]) -> Result<Self, HistogramError> {
        let top = bucket_bounds(index_of(MAX_LATENCY_US)).1;
        let mut h = LatencyHistogram::new();
        for &(value_us, count) in buckets {
            if value_us > top {
                return Err(HistogramError::OutOfRange { value_us });
            }
            h.record_n(value_us, count);
        }
        Ok(h)
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
    fn ranks_follow_writes_after_a_lookup() {
        let mut h = of(&[10, 20, 30]);
        let shared = h.clone();
        assert_eq!(h.percentile_us(1.0), Some(30));
        h.record(1_000_000);
        let top = LatencyHistogram::equivalent_range(1_000_000);
        assert_eq!(h.percentile_us(1.0), Some(*top.end()));
        assert_eq!(shared.percentile_us(1.0), Some(30));
        let mut merged = shared.clone();
        merged.merge(&of(&[5]));
        assert_eq!(merged.percentile_us(0.0), Some(5));
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

    fn reference(values: &[u64]) -> hdrhistogram::Histogram<u64> {
        let mut h = hdrhistogram::Histogram::new_with_bounds(1, MAX_LATENCY_US, 2).expect("bounds");
        for &v in values {
            h.saturating_record(v.clamp(1, MAX_LATENCY_US));
        }
        h
    }

    #[test]
    fn bucket_edges_match_hdrhistogram_at_every_power_of_two() {
        let h = reference(&[]);
        let mut v = 1u64;
        while v <= MAX_LATENCY_US {
            for x in [v - 1, v, v + 1].into_iter().filter(|&x| x >= 1) {
                let (lo, hi) = bucket_bounds(index_of(x));
                assert_eq!(
                    (lo, hi),
                    (h.lowest_equivalent(x), h.highest_equivalent(x)),
                    "{x}"
                );
            }
            v *= 2;
        }
        let top = bucket_bounds(index_of(MAX_LATENCY_US)).1;
        assert_eq!(top, h.highest_equivalent(MAX_LATENCY_US));
        assert_eq!(
            LatencyHistogram::from_buckets(&[(top + 1, 1)]),
            Err(HistogramError::OutOfRange { value_us: top + 1 })
        );
    }

    proptest! {
        #[test]
        fn buckets_and_ranks_match_hdrhistogram(v in proptest::collection::vec(0u64..2 * MAX_LATENCY_US, 1..300)) {
            let (ours, theirs) = (of(&v), reference(&v));
            let want: Vec<(u64, u64)> = theirs
                .iter_recorded()
                .map(|b| (b.value_iterated_to(), b.count_at_value()))
                .collect();
            prop_assert_eq!(ours.buckets(), want);
            prop_assert_eq!(ours.len(), theirs.len());
            let n = v.len() as u64;
            for rank in 1..=n {
                let x = theirs.value_at_quantile((rank as f64 - 0.5) / n as f64);
                let want = (theirs.lowest_equivalent(x), theirs.highest_equivalent(x));
                prop_assert_eq!(ours.value_at_rank(rank), Some(want), "rank {}", rank);
            }
        }

        #[test]
        fn merge_equals_recording_the_union(a in proptest::collection::vec(0u64..2_000_000, 0..200),
                                            b in proptest::collection::vec(0u64..2_000_000, 0..200)) {
            let mut merged = of(&a);
            merged.merge(&of(&b));
            let union: Vec<u64> = a.iter().chain(b.iter()).copied().collect();
            prop_assert_eq!(&merged, &of(&union));
            prop_assert_eq!(merged.window_since(&of(&a)), Ok(of(&b)));
        }

        /// A window reads, writes, merges and windows again exactly like a
        /// histogram of the samples it holds.
        #[test]
        fn a_window_behaves_as_its_samples(a in proptest::collection::vec(1u64..2_000_000, 0..100),
                                           b in proptest::collection::vec(1u64..2_000_000, 0..100),
                                           c in proptest::collection::vec(1u64..2_000_000, 0..100)) {
            let cat = |xs: &[&[u64]]| xs.concat();
            let (ab, abc) = (of(&cat(&[&a, &b])), of(&cat(&[&a, &b, &c])));
            let (w_bc, w_b) = (abc.window_since(&of(&a)).expect("grows"), ab.window_since(&of(&a)).expect("grows"));
            prop_assert_eq!(&w_bc, &of(&cat(&[&b, &c])));
            prop_assert_eq!(w_bc.window_since(&w_b), Ok(of(&c)));
            let mut written = w_b.clone();
            written.record_all(c.iter().copied());
            prop_assert_eq!(&written, &of(&cat(&[&b, &c])));
            let mut merged = of(&c);
            merged.merge(&w_b);
            prop_assert_eq!(&merged, &of(&cat(&[&b, &c])));
            let mut sorted = cat(&[&b, &c]);
            sorted.sort_unstable();
            for (i, &x) in sorted.iter().enumerate() {
                let (lo, hi) = w_bc.value_at_rank(i as u64 + 1).expect("in range");
                prop_assert!(lo <= x && x <= hi);
            }
            prop_assert_eq!(of(&a).window_since(&abc).is_err(), !b.is_empty() || !c.is_empty());
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
