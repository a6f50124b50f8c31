//! Confidence bounds for the fixed-horizon (`windowed`) gates.
//!
//! Every gate compares a candidate with the champion on small samples, so
//! point estimates are never enough: a gate fails only when a bound says the
//! candidate is worse, and passes only when a bound says it is not.
//!
//! - Wilson score interval for one proportion (Wilson 1927; Brown, Cai &
//!   DasGupta, "Interval Estimation for a Binomial Proportion", Stat. Sci.
//!   2001). Always inside [0, 1], sane at 0 and n failures, unlike the Wald
//!   interval.
//! - Newcombe's hybrid score interval for a difference of two proportions
//!   (Newcombe, "Interval estimation for the difference between independent
//!   proportions", Stat. Med. 1998, method 10), built from the two Wilson
//!   intervals.
//! - Nearest-rank percentiles and a distribution-free confidence interval
//!   for a quantile from order statistics (e.g. Conover, "Practical
//!   Nonparametric Statistics", 3rd ed., §3.2): the number of sample values
//!   below the true `p`-quantile is Binomial(n, p), whatever the
//!   distribution.

use serde::{Deserialize, Serialize};
use statrs::distribution::{Binomial, ContinuousCDF, Discrete, DiscreteCDF, Normal};

/// A closed interval `[lower, upper]`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Interval {
    pub lower: f64,
    pub upper: f64,
}

impl Interval {
    /// Whether `x` lies inside the closed interval.
    pub fn contains(&self, x: f64) -> bool {
        self.lower <= x && x <= self.upper
    }
}

/// The two-sided standard-normal quantile `z` for a `1 - alpha` interval.
///
/// `alpha` must be in (0, 1); the plan validates it before it gets here, and
/// out-of-range values are clamped so this function cannot fail.
pub fn z_two_sided(alpha: f64) -> f64 {
    thread_local! {
        /// The last level asked for and its z: gates ask for the same few
        /// levels on every look, and the inverse normal CDF is not cheap.
        static LAST: std::cell::Cell<(u64, f64)> = const { std::cell::Cell::new((u64::MAX, 0.0)) };
    }
    let alpha = alpha.clamp(1e-12, 1.0 - 1e-12);
    let (bits, z) = LAST.get();
    if bits == alpha.to_bits() {
        return z;
    }
    // Normal::new(0, 1) cannot fail; the fallback is the textbook 95% value.
    let z = Normal::new(0.0, 1.0)
        .map(|n| n.inverse_cdf(1.0 - alpha / 2.0))
        .unwrap_or(1.959_963_984_540_054);
    LAST.set((alpha.to_bits(), z));
    z
}

/// Wilson score interval for `k` successes (or failures) in `n` trials.
///
/// With no trials there is no information: the interval is all of [0, 1].
pub fn wilson(k: u64, n: u64, z: f64) -> Interval {
    if n == 0 {
        return Interval {
            lower: 0.0,
            upper: 1.0,
        };
    }
    let k = k.min(n) as f64;
    let n = n as f64;
    let p = k / n;
    let z2 = z * z;
    let denom = 1.0 + z2 / n;
    let centre = (p + z2 / (2.0 * n)) / denom;
    let half = z / denom * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt();
    Interval {
        lower: (centre - half).max(0.0),
        upper: (centre + half).min(1.0),
    }
}

/// Newcombe's hybrid score interval for `p1 - p2`, where `p1 = k1/n1` (the
/// candidate) and `p2 = k2/n2` (the champion).
pub fn newcombe(k1: u64, n1: u64, k2: u64, n2: u64, z: f64) -> Interval {
    let p1 = rate(k1, n1);
    let p2 = rate(k2, n2);
    let w1 = wilson(k1, n1, z);
    let w2 = wilson(k2, n2, z);
    let d = p1 - p2;
    Interval {
        lower: (d - ((p1 - w1.lower).powi(2) + (w2.upper - p2).powi(2)).sqrt()).max(-1.0),
        upper: (d + ((w1.upper - p1).powi(2) + (p2 - w2.lower).powi(2)).sqrt()).min(1.0),
    }
}

/// `k / n`, or 0 when `n` is 0. Callers hold `k <= n`, so this is at most 1.
pub fn rate(k: u64, n: u64) -> f64 {
    if n == 0 {
        0.0
    } else {
        k.min(n) as f64 / n as f64
    }
}

/// The nearest-rank rule: the `p`-percentile of `n` sorted values is the
/// value at 1-based rank `ceil(p * n)`, at least 1. It always names a value
/// a request really had (no interpolation). `None` when `n == 0`.
pub fn nearest_rank(p: f64, n: u64) -> Option<u64> {
    if n == 0 {
        return None;
    }
    let p = p.clamp(0.0, 1.0);
    // The epsilon keeps e.g. 0.95 * 100 (= 95.00000000000001) at rank 95.
    let rank = (p * n as f64 - 1e-9).ceil().max(1.0) as u64;
    Some(rank.min(n))
}

/// A distribution-free `1 - alpha` confidence interval for the `p`-quantile
/// of a sample of size `n`, as 1-based ranks into the sorted sample.
///
/// `P(X_(l) <= q_p <= X_(u)) >= P(l <= B <= u - 1)` with `B ~ Binomial(n, p)`.
/// We take the largest `l` with `P(B < l) <= alpha/2` and the smallest `u`
/// with `P(B >= u) <= alpha/2`. A side is `None` when the sample is too small
/// to bound it (the bound would lie outside the sample).
pub fn quantile_ci_ranks(p: f64, n: u64, alpha: f64) -> RankInterval {
    let (lower, upper) = crate::memo::ranks([p.to_bits(), alpha.to_bits(), 0], n, || {
        let r = binomial_ranks(p, n, alpha);
        (r.lower, r.upper)
    });
    RankInterval { lower, upper }
}

fn binomial_ranks(p: f64, n: u64, alpha: f64) -> RankInterval {
    let none = RankInterval {
        lower: None,
        upper: None,
    };
    if n == 0 || !(0.0..=1.0).contains(&p) {
        return none;
    }
    // Degenerate rates: B is always 0 (p = 0) or always n (p = 1).
    if p == 0.0 {
        return RankInterval {
            lower: None,
            upper: Some(1),
        };
    }
    if p == 1.0 {
        return RankInterval {
            lower: Some(n),
            upper: None,
        };
    }
    let Ok(b) = Binomial::new(p, n) else {
        return none;
    };
    let tail = alpha / 2.0;
    // Start each walk at its normal approximation.
    let (mean, sd) = (n as f64 * p, (n as f64 * p * (1.0 - p)).sqrt());
    let z = z_two_sided(alpha);
    let start = |x: f64| CdfWalk::new(&b, x.clamp(0.0, (n - 1) as f64) as u64);
    // Largest l in 1..=n with cdf(l - 1) <= tail; cdf is non-decreasing.
    let lower = last_cdf_at_or_below(start(mean - z * sd), tail).map(|x| x + 1);
    // Smallest u in 1..=n with 1 - cdf(u - 1) <= tail.
    let upper = first_cdf_at_or_above(start(mean + z * sd), 1.0 - tail).map(|x| x + 1);
    RankInterval {
        lower: lower.filter(|&l| l >= 1 && l <= n),
        upper: upper.filter(|&u| u >= 1 && u <= n),
    }
}

/// Binomial(n, p)'s CDF at `x`, walked one value at a time: one
/// incomplete-beta evaluation to start, then each step adds or removes one
/// probability mass, got from its neighbour by a ratio. A search that
/// starts near its answer costs a few multiplications instead of a CDF
/// evaluation per probe. `p` in (0, 1), `x < n`.
#[derive(Debug, Clone, Copy)]
struct CdfWalk {
    n: u64,
    /// `p / (1 − p)`.
    odds: f64,
    x: u64,
    cdf: f64,
    pmf: f64,
}

impl CdfWalk {
    fn new(b: &Binomial, x: u64) -> Self {
        let p = b.p();
        CdfWalk {
            n: b.n(),
            odds: p / (1.0 - p),
            x,
            cdf: b.cdf(x),
            pmf: b.pmf(x),
        }
    }

    /// The walk at `x + 1` (`x + 1 < n`).
    fn up(self) -> Self {
        let (n, x) = (self.n as f64, self.x as f64);
        let pmf = self.pmf * (n - x) / (x + 1.0) * self.odds;
        CdfWalk {
            x: self.x + 1,
            cdf: self.cdf + pmf,
            pmf,
            ..self
        }
    }

    /// The walk at `x − 1` (`x > 0`).
    fn down(self) -> Self {
        let (n, x) = (self.n as f64, self.x as f64);
        CdfWalk {
            x: self.x - 1,
            cdf: self.cdf - self.pmf,
            pmf: self.pmf * x / (n - x + 1.0) / self.odds,
            ..self
        }
    }
}

/// Largest `x` in `0..n` with `cdf(x) <= target`, walking from `w`.
fn last_cdf_at_or_below(mut w: CdfWalk, target: f64) -> Option<u64> {
    if w.cdf <= target {
        while w.x + 1 < w.n {
            let next = w.up();
            if next.cdf > target {
                break;
            }
            w = next;
        }
        return Some(w.x);
    }
    while w.x > 0 {
        w = w.down();
        if w.cdf <= target {
            return Some(w.x);
        }
    }
    None
}

/// Smallest `x` in `0..n` with `cdf(x) >= target`, walking from `w`.
fn first_cdf_at_or_above(mut w: CdfWalk, target: f64) -> Option<u64> {
    if w.cdf >= target {
        while w.x > 0 {
            let prev = w.down();
            if prev.cdf < target {
                break;
            }
            w = prev;
        }
        return Some(w.x);
    }
    while w.x + 1 < w.n {
        w = w.up();
        if w.cdf >= target {
            return Some(w.x);
        }
    }
    None
}

/// 1-based ranks of a quantile confidence interval; `None` = unbounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankInterval {
    pub lower: Option<u64>,
    pub upper: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const Z95: f64 = 1.959_963_984_540_054;

    proptest! {
        /// The walked CDF search finds exactly the ranks a scan of the
        /// exact binomial CDF finds.
        #[test]
        fn quantile_ranks_match_a_scan_of_the_cdf(n in 1u64..1500, p in 0.01f64..0.995, alpha in 0.0005f64..0.2) {
            let b = Binomial::new(p, n).expect("valid");
            let tail = alpha / 2.0;
            let lower = (0..n).rev().find(|&x| b.cdf(x) <= tail).map(|x| x + 1);
            let upper = (0..n).find(|&x| b.cdf(x) >= 1.0 - tail).map(|x| x + 1);
            let r = quantile_ci_ranks(p, n, alpha);
            prop_assert_eq!(r.lower, lower);
            prop_assert_eq!(r.upper, upper);
        }
    }

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    #[test]
    fn z_matches_the_normal_table() {
        assert!(close(z_two_sided(0.05), Z95, 1e-6));
        assert!(close(z_two_sided(0.01), 2.575_829, 1e-5));
    }

    /// The reference values in shared/STATISTICS.md.
    #[test]
    fn wilson_zero_failures_upper_bounds_match_reference() {
        for (n, expected) in [
            (20, 0.161),
            (50, 0.071),
            (100, 0.037),
            (200, 0.019),
            (500, 0.0076),
            (1000, 0.0038),
        ] {
            let upper = wilson(0, n, Z95).upper;
            assert!(close(upper, expected, 0.0006), "n={n}: {upper}");
        }
    }

    #[test]
    fn wilson_half_failing_lower_bounds_match_reference() {
        assert!(close(wilson(5, 10, Z95).lower, 0.237, 0.001));
        assert!(close(wilson(10, 20, Z95).lower, 0.299, 0.001));
    }

    #[test]
    fn wilson_with_no_trials_knows_nothing() {
        assert_eq!(
            wilson(0, 0, Z95),
            Interval {
                lower: 0.0,
                upper: 1.0
            }
        );
    }

    /// The lesson in STATISTICS.md: one error against a clean champion puts
    /// the lower bound just above zero, which is why gates need a margin.
    #[test]
    fn newcombe_single_error_against_clean_champion_is_barely_positive() {
        let d = newcombe(1, 100, 0, 1000, Z95);
        assert!(close(d.lower, 0.0009, 0.0002), "{d:?}");
        assert!(d.lower > 0.0 && d.lower < 0.01);
    }

    #[test]
    fn newcombe_of_identical_arms_straddles_zero() {
        let d = newcombe(10, 1000, 10, 1000, Z95);
        assert!(d.lower < 0.0 && d.upper > 0.0);
        assert!(close(d.lower, -d.upper, 1e-12));
    }

    #[test]
    fn nearest_rank_follows_ceil_p_n() {
        assert_eq!(nearest_rank(0.95, 100), Some(95));
        assert_eq!(nearest_rank(0.5, 100), Some(50));
        assert_eq!(nearest_rank(0.5, 101), Some(51));
        assert_eq!(nearest_rank(0.0, 10), Some(1));
        assert_eq!(nearest_rank(1.0, 10), Some(10));
        assert_eq!(nearest_rank(0.5, 0), None);
    }

    #[test]
    fn median_ci_of_small_sample_matches_binomial_table() {
        // n = 10, 95%: the classic interval for the median is [X(2), X(9)]
        // (coverage 1 - 2 * P(B <= 1) = 0.9785).
        let r = quantile_ci_ranks(0.5, 10, 0.05);
        assert_eq!(r.lower, Some(2));
        assert_eq!(r.upper, Some(9));
    }

    #[test]
    fn tail_quantile_of_tiny_sample_has_no_upper_bound() {
        // With 20 values there is no order statistic that bounds p95 above.
        let r = quantile_ci_ranks(0.95, 20, 0.05);
        assert_eq!(r.upper, None);
        assert!(r.lower.is_some());
    }

    proptest! {
        #[test]
        fn wilson_is_inside_unit_interval_and_covers_the_estimate(k in 0u64..2000, extra in 0u64..2000, alpha in 0.001f64..0.5) {
            let n = k + extra;
            let z = z_two_sided(alpha);
            let w = wilson(k, n, z);
            prop_assert!(0.0 <= w.lower && w.lower <= w.upper && w.upper <= 1.0);
            if n > 0 {
                prop_assert!(w.contains(rate(k, n)) || (w.lower - rate(k, n)).abs() < 1e-12 || (w.upper - rate(k, n)).abs() < 1e-12);
            }
        }

        #[test]
        fn wilson_is_monotone_in_failures(k in 0u64..999, n in 1000u64..3000) {
            let a = wilson(k, n, Z95);
            let b = wilson(k + 1, n, Z95);
            prop_assert!(b.lower >= a.lower - 1e-12 && b.upper >= a.upper - 1e-12);
        }

        #[test]
        fn newcombe_is_monotone_in_candidate_failures(k1 in 0u64..499, n1 in 500u64..2000, k2 in 0u64..500, n2 in 500u64..2000) {
            let a = newcombe(k1, n1, k2, n2, Z95);
            let b = newcombe(k1 + 1, n1, k2, n2, Z95);
            prop_assert!(b.lower >= a.lower - 1e-12, "{a:?} {b:?}");
            prop_assert!(b.upper >= a.upper - 1e-12, "{a:?} {b:?}");
        }

        #[test]
        fn newcombe_covers_the_point_difference(k1 in 0u64..500, e1 in 0u64..500, k2 in 0u64..500, e2 in 0u64..500) {
            let (n1, n2) = (k1 + e1, k2 + e2);
            let d = newcombe(k1, n1, k2, n2, Z95);
            let point = rate(k1, n1) - rate(k2, n2);
            prop_assert!(d.lower <= point + 1e-12 && point <= d.upper + 1e-12);
            prop_assert!(-1.0 <= d.lower && d.upper <= 1.0);
        }

        #[test]
        fn quantile_ranks_bracket_the_nearest_rank(n in 1u64..5000, p in 0.01f64..0.99, alpha in 0.001f64..0.2) {
            let r = quantile_ci_ranks(p, n, alpha);
            let point = nearest_rank(p, n).unwrap_or(1);
            if let Some(l) = r.lower { prop_assert!(l <= point + 1, "l={l} point={point}"); }
            if let Some(u) = r.upper { prop_assert!(u + 1 >= point, "u={u} point={point}"); }
            if let (Some(l), Some(u)) = (r.lower, r.upper) { prop_assert!(l < u); }
        }
    }

    /// Coverage of the order-statistic interval, checked exactly against the
    /// binomial rather than by simulation.
    #[test]
    fn quantile_interval_has_its_nominal_coverage() {
        for n in [30u64, 100, 1000] {
            for p in [0.5, 0.9, 0.95] {
                let r = quantile_ci_ranks(p, n, 0.05);
                let (Some(l), Some(u)) = (r.lower, r.upper) else {
                    continue;
                };
                let b = Binomial::new(p, n).expect("valid binomial");
                // P(l <= B <= u - 1)
                let coverage = b.cdf(u - 1) - if l == 0 { 0.0 } else { b.cdf(l - 1) };
                assert!(coverage >= 0.95 - 1e-9, "n={n} p={p} coverage={coverage}");
            }
        }
    }
}
