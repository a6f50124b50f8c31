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
use statrs::distribution::{Binomial, ContinuousCDF, DiscreteCDF, Normal};

/// A closed interval `[lower, upper]`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
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
    let alpha = alpha.clamp(1e-12, 1.0 - 1e-12);
    // Normal::new(0, 1) cannot fail; the fallback is the textbook 95% value.
    Normal::new(0.0, 1.0)
        .map(|n| n.inverse_cdf(1.0 - alpha / 2.0))
        .unwrap_or(1.959_963_984_540_054)
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
    if n == 0 || !(0.0..=1.0).contains(&p) {
        return RankInterval {
            lower: None,
            upper: None,
        };
    }
    let Ok(b) = Binomial::new(p, n) else {
        return RankInterval {
            lower: None,
            upper: None,
        };
    };
    let tail = alpha / 2.0;
    // Start each search at its normal approximation.
    let (mean, sd) = (n as f64 * p, (n as f64 * p * (1.0 - p)).sqrt());
    let z = z_two_sided(alpha);
    let guess = |x: f64| x.clamp(0.0, n as f64) as u64;
    // Largest l in 1..=n with cdf(l - 1) <= tail; cdf is non-decreasing.
    let lower = last_at_or_below(n, |x| b.cdf(x), tail, guess(mean - z * sd)).map(|x| x + 1);
    // Smallest u in 1..=n with 1 - cdf(u - 1) <= tail.
    let upper = first_at_or_above(n, |x| b.cdf(x), 1.0 - tail, guess(mean + z * sd)).map(|x| x + 1);
    RankInterval {
        lower: lower.filter(|&l| l >= 1 && l <= n),
        upper: upper.filter(|&u| u >= 1 && u <= n),
    }
}

/// 1-based ranks of a quantile confidence interval; `None` = unbounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankInterval {
    pub lower: Option<u64>,
    pub upper: Option<u64>,
}

/// Largest `x` in `0..n` for which `holds` is true, for `holds` true up to
/// some point and false after it; `None` if it is false at 0. The search
/// gallops out from `guess` and then bisects, so a good guess costs a few
/// evaluations instead of `2·log2(n)` (each is a binomial CDF here).
fn last_where(n: u64, holds: impl Fn(u64) -> bool, guess: u64) -> Option<u64> {
    if n == 0 || !holds(0) {
        return None;
    }
    // Invariant: holds(lo), and the answer is at most hi.
    let (mut lo, mut hi) = (0u64, n - 1);
    let g = guess.min(n - 1);
    let mut step = 1u64;
    if holds(g) {
        lo = g;
        while lo < hi {
            let probe = lo.saturating_add(step).min(hi);
            if holds(probe) {
                lo = probe;
                step = step.saturating_mul(2);
            } else {
                hi = probe - 1;
                break;
            }
        }
    } else {
        hi = g - 1; // g > 0, as holds(0)
        while lo < hi {
            let probe = g.saturating_sub(step).max(lo);
            if holds(probe) {
                lo = probe;
                break;
            }
            hi = probe - 1;
            step = step.saturating_mul(2);
        }
    }
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if holds(mid) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    Some(lo)
}

/// Largest `x` in `0..n` with `f(x) <= target`, for non-decreasing `f`.
fn last_at_or_below(n: u64, f: impl Fn(u64) -> f64, target: f64, guess: u64) -> Option<u64> {
    last_where(n, |x| f(x) <= target, guess)
}

/// Smallest `x` in `0..n` with `f(x) >= target`, for non-decreasing `f`.
fn first_at_or_above(n: u64, f: impl Fn(u64) -> f64, target: f64, guess: u64) -> Option<u64> {
    match last_where(n, |x| f(x) < target, guess) {
        None => (n > 0).then_some(0),
        Some(x) if x + 1 < n => Some(x + 1),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const Z95: f64 = 1.959_963_984_540_054;

    proptest! {
        /// The galloping search finds exactly what a linear scan finds,
        /// from any starting guess.
        #[test]
        fn last_where_matches_a_linear_scan(n in 0u64..300, cut in 0u64..320, guess in 0u64..400) {
            let holds = |x: u64| x < cut;
            let scan = (0..n).rev().find(|&x| holds(x));
            prop_assert_eq!(last_where(n, holds, guess), scan);
            let f = |x: u64| x as f64;
            let t = cut as f64;
            prop_assert_eq!(first_at_or_above(n, f, t, guess), (0..n).find(|&x| f(x) >= t));
            prop_assert_eq!(last_at_or_below(n, f, t, guess), (0..n).rev().find(|&x| f(x) <= t));
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
