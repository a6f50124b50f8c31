//! Anytime-valid inference: bounds that stay valid however often they are
//! looked at, for the `sequential` policy.
//!
//! The core fact is Ville's inequality: a nonnegative (super)martingale
//! `M_t` with `M_0 = 1` under the null exceeds `1/α` at *any* time with
//! probability at most `α`. So a rollout may be evaluated after every
//! snapshot, at any weight, without spending `α` again.
//!
//! - [`robbins_cs`]: the beta-binomial mixture confidence sequence for a
//!   Bernoulli rate (Robbins, "Statistical methods related to the law of the
//!   iterated logarithm", Ann. Math. Stat. 1970): with a uniform prior the
//!   mixture likelihood ratio against `p` is `B(k+1, n−k+1) / (p^k (1−p)^(n−k))`.
//! - [`ConditionalBinomial`]: the error-count e-process of Lindon & Malek
//!   ("Anytime-valid inference for multinomial count data", NeurIPS 2022):
//!   given that a failure happened, under the null it came from the candidate
//!   with probability equal to the candidate's exposure share (scaled by the
//!   allowed rate ratio). The shared, time-varying load cancels, so a shared
//!   outage cannot reject, and weights may change between steps.
//! - [`BetaBinomialMixture`]: Howard, Ramdas, McAuliffe & Sekhon's
//!   beta-binomial mixture boundary for sums of observations in `[−g, h]`
//!   ("Time-uniform, nonparametric, nonasymptotic confidence sequences",
//!   Ann. Statist. 2021), tuned to a design sample size. On the indicators
//!   `1{X ≤ q}` it gives the quantile confidence sequences of Howard &
//!   Ramdas ("Sequential estimation of quantiles with applications to
//!   A/B-testing and best-arm identification", Bernoulli 2022), and on a
//!   rate it gives a one-sided test against a budget. Its values are checked
//!   against the authors' own `confseq` package (golden vectors in
//!   `tests/data/confseq_golden.json`, written by `bench/golden/confseq_vectors.py`).

use serde::{Deserialize, Serialize};
use statrs::function::beta::{beta_reg, ln_beta};

use crate::stats::Interval;

/// The anytime-valid `1 − α` confidence sequence for a Bernoulli rate after
/// `k` successes in `n` trials: every `p` whose mixture likelihood ratio
/// `ln M(p) = ln B(k+1, n−k+1) − k ln p − (n−k) ln(1−p)` is below `1/α`.
/// The interval contains `k/n`; with `n = 0` it is `[0, 1]`.
pub fn robbins_cs(k: u64, n: u64, alpha: f64) -> Interval {
    robbins_cs_tempered(k, n, 1.0, alpha)
}

/// [`robbins_cs`] on counts divided by a design effect `d ≥ 1` (see
/// [`crate::unit`]): the sequence of `k/d` successes in `n/d` trials.
pub fn robbins_cs_tempered(k: u64, n: u64, d: f64, alpha: f64) -> Interval {
    if n == 0 {
        return Interval {
            lower: 0.0,
            upper: 1.0,
        };
    }
    let k = k.min(n);
    let d = d.max(1.0);
    let (kf, mf) = (k as f64 / d, (n - k) as f64 / d);
    let threshold = (1.0 / alpha.clamp(1e-300, 1.0)).ln();
    let ln_b = ln_beta(kf + 1.0, mf + 1.0);
    Interval {
        // Below k/n, in y = −ln p the ratio is the upper edge's with the
        // roles of successes and failures swapped.
        lower: if k == 0 {
            0.0
        } else {
            (-robbins_edge(mf, kf, ln_b, threshold)).exp()
        },
        upper: if k == n {
            1.0
        } else {
            -(-robbins_edge(kf, mf, ln_b, threshold)).exp_m1()
        },
    }
}

/// The upper edge of Robbins' sequence with `k` successes and `m ≥ 1`
/// failures, as `y = −ln(1 − p)`.
///
/// In `y` the log ratio is `g(y) = ln_b + k·h(y) + m·y` with
/// `h(y) = −ln(1 − e^(−y))`: convex, increasing beyond its minimum at
/// `k/n`, and close to linear far out. Newton's method from a point beyond
/// the crossing therefore stays beyond it (the tangent of a convex function
/// lies below it) and converges fast: a few steps instead of a bisection's
/// thirty, and the edge it returns is never inside the sequence.
fn robbins_edge(k: f64, m: f64, ln_b: f64, threshold: f64) -> f64 {
    let g = |y: f64| ln_b - k * (-(-y).exp_m1()).ln() + m * y - threshold;
    let slope = |y: f64| m - k / y.exp_m1();
    // h > 0, so g(y) ≥ ln_b + m·y − threshold: this start is at or beyond
    // the crossing.
    let mut y = ((threshold - ln_b) / m).max(f64::MIN_POSITIVE);
    for _ in 0..100 {
        let (excess, d) = (g(y), slope(y));
        if !(excess > 0.0 && d > 0.0) {
            break;
        }
        let next = y - excess / d;
        if next.is_nan() || next >= y || y - next <= 1e-12 * y {
            break;
        }
        y = next;
    }
    y
}

/// Rate ratios (candidate ÷ champion) the alternative mixes over: a grid on
/// the log scale from just above the null to 100× it.
const GRID: usize = 24;

pub(crate) fn log_sum_exp(xs: &[f64]) -> f64 {
    let max = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if max == f64::NEG_INFINITY {
        return max;
    }
    max + xs.iter().map(|l| (l - max).exp()).sum::<f64>().ln()
}

fn log_mean_exp(xs: &[f64]) -> f64 {
    log_sum_exp(xs) - (xs.len().max(1) as f64).ln()
}

/// The one-sided conditional-binomial mixture e-process for "the candidate's
/// failure rate per request is at most `r0` times the champion's": a
/// product of factors, one per [`update`](Self::update), mixed uniformly
/// over a grid of alternatives. [`below`](Self::below) tests the other
/// side, "at least `r0` times", to show non-inferiority.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ConditionalBinomial {
    /// The null's boundary rate ratio.
    pub r0: f64,
    /// `ln` of the likelihood ratio of each grid alternative against `r0`.
    pub log_lr: Vec<f64>,
    /// The alternatives lie below `r0` (a test of "at least `r0`").
    #[serde(default)]
    pub below: bool,
    /// The grid's widest alternative over (or under) `r0`.
    #[serde(default = "default_span")]
    pub span: f64,
}

fn default_span() -> f64 {
    100.0
}

impl ConditionalBinomial {
    /// Null "ratio ≤ `r0`", alternatives above it.
    pub fn new(r0: f64) -> Self {
        Self::spanning(r0, default_span())
    }

    /// Null "ratio ≤ `r0`", alternatives from just above it to `span`
    /// times it: a narrower span puts the mixture's weight nearer the null,
    /// on the regressions users meet (a third more mistakes, not a hundred
    /// times as many), and shows them sooner.
    pub fn spanning(r0: f64, span: f64) -> Self {
        ConditionalBinomial {
            r0: r0.max(1e-9),
            log_lr: vec![0.0; GRID],
            below: false,
            span: span.max(1.0 + 1e-6),
        }
    }

    /// Null "ratio ≥ `r0`", alternatives from `r0/1.21` down to `r0/100`:
    /// rejecting it shows the candidate's rate below `r0` times the
    /// champion's.
    pub fn below(r0: f64) -> Self {
        ConditionalBinomial {
            below: true,
            ..Self::new(r0)
        }
    }

    /// Multiplies in one factor: `champion_failures` and
    /// `candidate_failures` while the candidate had `candidate_share` of
    /// the requests (its exposure, in (0, 1)).
    pub fn update(
        &mut self,
        champion_failures: u64,
        candidate_failures: u64,
        candidate_share: f64,
    ) {
        if champion_failures + candidate_failures == 0 {
            return;
        }
        let rho = candidate_share.clamp(1e-9, 1.0 - 1e-9);
        let theta = |r: f64| r * rho / (r * rho + 1.0 - rho);
        let t0 = theta(self.r0);
        let (a, b) = (champion_failures as f64, candidate_failures as f64);
        let step = self
            .span
            .powf(if self.below { -1.0 } else { 1.0 } / GRID as f64);
        let mut r1 = self.r0;
        for i in 0..GRID {
            // The grid's alternatives, r0 · span^((i+1)/GRID) (span 100:
            // 1.21×r0, 1.47×r0, …, 100×r0), by multiplication.
            r1 *= step;
            let t1 = theta(r1);
            self.log_lr[i] += b * (t1 / t0).ln() + a * ((1.0 - t1) / (1.0 - t0)).ln();
        }
    }

    /// `ln` of the mixture (uniform over the grid) e-value.
    pub fn log_e_value(&self) -> f64 {
        self.log_e_value_tempered(1.0)
    }

    /// `ln` of the mixture of the likelihood ratios raised to `eta` in
    /// (0, 1] (a design effect `1/eta`, see [`crate::unit`]): it crosses
    /// `1/α` only where the untempered mixture crosses `(1/α)^(1/eta)`.
    pub fn log_e_value_tempered(&self, eta: f64) -> f64 {
        let eta = eta.clamp(1e-6, 1.0);
        let tempered: Vec<f64> = self.log_lr.iter().map(|l| l * eta).collect();
        log_mean_exp(&tempered)
    }

    /// Whether the null is rejected at level `alpha` (Ville's inequality).
    pub fn rejects(&self, alpha: f64) -> bool {
        self.log_e_value() >= (1.0 / alpha).ln()
    }
}

/// The weight of the component of a [start mixture](start_mixture) started
/// at the origin.
pub const BASE_WEIGHT: f64 = 0.9;

/// `ln` of an e-process mixed over start times, from the `ln` e-values of
/// its components in order: the one started at the origin (weight
/// [`BASE_WEIGHT`]), then the `k`-th restart (weight
/// `(1 − BASE_WEIGHT)/(k(k+1))`). Each component is a test supermartingale
/// from its start (1 before it), and a start chosen from past data only is
/// allowed; the weights sum to at most 1, so the mixture is a test
/// supermartingale too and Ville's inequality holds for it.
///
/// Why: a stretch where both arms fail alike (a shared outage) is evidence
/// *for* the null and crushes every alternative of a component that saw
/// it; a component started after it is not crushed.
pub fn start_mixture(log_e: impl IntoIterator<Item = f64>) -> f64 {
    let terms: Vec<f64> = log_e
        .into_iter()
        .enumerate()
        .map(|(k, l)| {
            let w = if k == 0 {
                BASE_WEIGHT
            } else {
                let k = k as f64;
                (1.0 - BASE_WEIGHT) / (k * (k + 1.0))
            };
            w.ln() + l
        })
        .collect();
    log_sum_exp(&terms)
}

/// Howard et al.'s beta-binomial mixture supermartingale for a sum `s` of
/// centred observations in `[−g, h]` with intrinsic time `v = g·h·n`.
///
/// For Bernoulli(p) indicators `g = p`, `h = 1 − p` and `s = k − n·p`; the
/// mixture is then the likelihood ratio of a Beta prior (centred on `p`,
/// concentration chosen so the boundary is tightest at `v_opt`) against
/// `p`. The one-sided mixture puts its prior only on rates above `p`: it
/// detects upward deviations and is about `ln 2` tighter than the two-sided
/// one, which bounds both directions at once.
///
/// Written here rather than taken from a crate: no Rust crate implements
/// these boundaries; `confseq` (C++/Python) is the reference.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BetaBinomialMixture {
    g: f64,
    h: f64,
    r: f64,
    one_sided: bool,
    normalizer: f64,
    /// `ln g`, `ln h`, `ln(g + h)`: constants of every evaluation.
    logs: (f64, f64, f64),
}

/// The normal-mixture precision that makes the boundary tightest at `v`
/// for level `alpha` (two-sided), as in Howard et al., Proposition 3.
fn best_rho(v: f64, alpha: f64) -> f64 {
    let l = (1.0 / alpha).ln();
    v / (2.0 * l + (1.0 + 2.0 * l).ln())
}

/// `ln ∫_0^x t^(a−1) (1−t)^(b−1) dt`: the complete beta function at `x = 1`.
fn ln_incomplete_beta(a: f64, b: f64, x: f64) -> f64 {
    if x >= 1.0 {
        ln_beta(a, b)
    } else {
        beta_reg(a, b, x).ln() + ln_beta(a, b)
    }
}

impl BetaBinomialMixture {
    /// `g, h > 0`, `v_opt > 0`, `alpha_opt` in (0, 1).
    pub fn new(v_opt: f64, alpha_opt: f64, g: f64, h: f64, one_sided: bool) -> Self {
        let rho = if one_sided {
            best_rho(v_opt, 2.0 * alpha_opt)
        } else {
            best_rho(v_opt, alpha_opt)
        };
        let r = (rho - g * h).max(1e-3 * g * h);
        let x = if one_sided { h / (g + h) } else { 1.0 };
        BetaBinomialMixture {
            g,
            h,
            r,
            one_sided,
            normalizer: ln_incomplete_beta(r / (g * (g + h)), r / (h * (g + h)), x),
            logs: (g.ln(), h.ln(), (g + h).ln()),
        }
    }

    /// The mixture for Bernoulli(`p`) indicators, tuned for `n_opt` of them.
    pub fn bernoulli(p: f64, n_opt: f64, alpha_opt: f64, one_sided: bool) -> Self {
        let p = p.clamp(1e-9, 1.0 - 1e-9);
        Self::new(
            p * (1.0 - p) * n_opt.max(1.0),
            alpha_opt,
            p,
            1.0 - p,
            one_sided,
        )
    }

    /// `ln` of the mixture supermartingale at sum `s` and intrinsic time `v`.
    pub fn log_value(&self, s: f64, v: f64) -> f64 {
        let (g, h, r) = (self.g, self.h, self.r);
        let x = if self.one_sided { h / (g + h) } else { 1.0 };
        let (ln_g, ln_h, ln_gh) = self.logs;
        v / (g * h) * ln_gh
            - ((v + h * s) / (h * (g + h))) * ln_g
            - ((v - g * s) / (g * (g + h))) * ln_h
            + ln_incomplete_beta(
                (r + v - g * s) / (g * (g + h)),
                (r + v + h * s) / (h * (g + h)),
                x,
            )
            - self.normalizer
    }

    /// The `ln` e-value of `k` successes in `n` Bernoulli(p) trials, where
    /// `p = g` (as built by [`BetaBinomialMixture::bernoulli`]).
    pub fn log_value_counts(&self, k: u64, n: u64) -> f64 {
        let (k, n) = (k.min(n) as f64, n as f64);
        self.log_value(k - n * self.g, n * self.g * self.h)
    }
}

/// Whether `k` successes in `n` trials show, anytime-validly at level
/// `alpha`, that the rate is above `p0` (one-sided beta-binomial mixture,
/// tuned for `n_opt` trials). Under "rate ≤ p0" this is ever true with
/// probability at most `alpha`.
pub fn rate_exceeds(k: u64, n: u64, p0: f64, alpha: f64, n_opt: f64) -> bool {
    if n == 0 || p0 >= 1.0 {
        return false;
    }
    if p0 <= 0.0 {
        return k > 0;
    }
    // The one-sided mixture grows with k (its prior is on rates above p0),
    // so the test is a count threshold per n.
    let key = [p0.to_bits(), alpha.to_bits(), n_opt.to_bits()];
    crate::memo::threshold(key, n, || {
        let mixture = BetaBinomialMixture::bernoulli(p0, n_opt, alpha, true);
        let threshold = (1.0 / alpha).ln();
        let rejects = |k: u64| mixture.log_value_counts(k, n) >= threshold;
        if !rejects(n) {
            return None;
        }
        // Largest count that does not reject, searched from a normal guess.
        let sd = (n as f64 * p0 * (1.0 - p0)).sqrt();
        let guess = (n as f64 * p0 + 3.0 * sd) as u64;
        Some(if rejects(0) {
            0
        } else {
            last_true(n, |j| !rejects(j), guess) + 1
        })
    })
    .is_some_and(|t| k >= t)
}

/// [`rate_exceeds`] on counts divided by a design effect `d ≥ 1` (see
/// [`crate::unit`]): the mixture at `(s/d, v/d)`, which is its likelihood
/// ratios raised to `1/d`.
pub fn rate_exceeds_tempered(k: u64, n: u64, d: f64, p0: f64, alpha: f64, n_opt: f64) -> bool {
    if d <= 1.0 || n == 0 || p0 <= 0.0 || p0 >= 1.0 {
        return rate_exceeds(k, n, p0, alpha, n_opt);
    }
    let mixture = BetaBinomialMixture::bernoulli(p0, n_opt, alpha, true);
    let (k, n) = (k.min(n) as f64, n as f64);
    let (s, v) = (k - n * p0, n * p0 * (1.0 - p0));
    mixture.log_value(s / d, v / d) >= (1.0 / alpha).ln()
}

/// [`quantile_cs_ranks`] with the count below the quantile's variance
/// inflated by a design effect `d ≥ 1`: the ranks of the sequence at
/// `n/d` observations, their distance from `n·p` scaled back by `d`.
pub fn quantile_cs_ranks_tempered(
    p: f64,
    n: u64,
    d: f64,
    alpha: f64,
    n_opt: f64,
) -> crate::stats::RankInterval {
    if d <= 1.0 {
        return quantile_cs_ranks(p, n, alpha, n_opt);
    }
    let m = (n as f64 / d).floor() as u64;
    let r = quantile_cs_ranks(p, m, alpha, n_opt);
    let (centre, scaled) = (n as f64 * p, m as f64 * p);
    let back = |rank: u64| centre + d * (rank as f64 - scaled);
    crate::stats::RankInterval {
        lower: r
            .lower
            .map(|k| back(k).floor())
            .filter(|&k| k >= 1.0)
            .map(|k| k as u64),
        upper: r
            .upper
            .map(|k| back(k).ceil())
            .filter(|&k| k <= n as f64)
            .map(|k| k as u64),
    }
}

/// Ranks bounding the `p`-quantile after `n` observations, anytime-valid at
/// level `alpha` (Howard & Ramdas 2022, Theorem 1, with the two-sided
/// beta-binomial mixture tuned for `n_opt`). With probability at least
/// `1 − alpha`, at every `n` at once, the true quantile `q` lies between the
/// order statistics at these 1-based ranks (`None`: unbounded on that side).
///
/// For a continuous quantity the count `S` of observations below `q` is a
/// Bernoulli(p) sum; the mixture keeps `S − n·p` inside `[−d, u]` at all
/// times, and `S ≤ a` gives `q ≤ X_(a+1)`, `S ≥ b` gives `q ≥ X_(b)`.
/// (Latency is continuous; histogram buckets are a monotone rounding, and
/// the caller takes each bucket's conservative end.)
pub fn quantile_cs_ranks(p: f64, n: u64, alpha: f64, n_opt: f64) -> crate::stats::RankInterval {
    let key = [p.to_bits(), alpha.to_bits(), n_opt.to_bits()];
    let (lower, upper) = crate::memo::ranks(key, n, || {
        let r = mixture_ranks(p, n, alpha, n_opt);
        (r.lower, r.upper)
    });
    crate::stats::RankInterval { lower, upper }
}

fn mixture_ranks(p: f64, n: u64, alpha: f64, n_opt: f64) -> crate::stats::RankInterval {
    let none = crate::stats::RankInterval {
        lower: None,
        upper: None,
    };
    if n == 0 || !(p > 0.0 && p < 1.0) {
        return none;
    }
    let mixture = BetaBinomialMixture::bernoulli(p, n_opt, alpha, false);
    let threshold = (1.0 / alpha).ln();
    // Counts the sequence allows: a convex function below the threshold on
    // an interval around n·p, searched for on the integers from the normal
    // mixture's boundary (Robbins 1970) as a first guess.
    let inside = |k: u64| mixture.log_value_counts(k, n) < threshold;
    let (nf, rho) = (n as f64, mixture.r + mixture.g * mixture.h);
    let v = nf * p * (1.0 - p);
    let spread = ((v + rho) * ((v + rho) / (rho * alpha * alpha)).ln()).sqrt();
    let (below, above) = ((nf * p).floor() as u64, (nf * p).ceil() as u64);
    // Largest count S may reach, and smallest.
    let a_hi = below + last_true(n - below, |j| inside(below + j), spread as u64);
    let b_lo = above - last_true(above, |j| inside(above - j), spread as u64);
    crate::stats::RankInterval {
        lower: (b_lo >= 1).then_some(b_lo),
        upper: (a_hi < n).then_some(a_hi + 1),
    }
}

/// Largest `j` in `0..=max` with `holds(j)`, for `holds` true from 0 up to
/// some point and false after it (`holds(0)` is taken as true). Gallops
/// out from `guess`, then bisects: a good guess costs a few evaluations
/// instead of `log2(max)`.
fn last_true(max: u64, holds: impl Fn(u64) -> bool, guess: u64) -> u64 {
    // Invariant: holds(lo) (or lo = 0), and the answer is at most hi.
    let (mut lo, mut hi) = (0u64, max);
    let g = guess.clamp(1, max.max(1)).min(max);
    let mut step = 1u64;
    if g > 0 && holds(g) {
        lo = g;
        while lo < hi {
            let probe = lo.saturating_add(step).min(hi);
            if !holds(probe) {
                hi = probe - 1;
                break;
            }
            lo = probe;
            step = step.saturating_mul(2);
        }
    } else if g > 0 {
        hi = g - 1;
        loop {
            let probe = g.saturating_sub(step);
            if probe <= lo {
                break;
            }
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
    lo
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    #[test]
    fn robbins_cs_with_no_data_knows_nothing() {
        assert_eq!(
            robbins_cs(0, 0, 0.05),
            Interval {
                lower: 0.0,
                upper: 1.0
            }
        );
    }

    #[test]
    fn robbins_cs_zero_failures_has_a_closed_form_upper_bound() {
        // k = 0: ln M(p) = −ln(n+1) − n ln(1−p) = ln(1/α)  ⇒  p = 1 − (α/(n+1))^(1/n).
        for n in [10u64, 100, 1000] {
            let alpha = 0.05f64;
            let exact = 1.0 - (alpha / (n + 1) as f64).powf(1.0 / n as f64);
            let cs = robbins_cs(0, n, alpha);
            assert!(
                (cs.upper - exact).abs() < 1e-9,
                "n={n}: {} vs {exact}",
                cs.upper
            );
            assert_eq!(cs.lower, 0.0);
        }
    }

    #[test]
    fn robbins_cs_is_wider_than_the_fixed_horizon_wilson_interval() {
        let z = crate::stats::z_two_sided(0.05);
        for (k, n) in [(5u64, 100u64), (50, 1000), (1, 20)] {
            let w = crate::stats::wilson(k, n, z);
            let cs = robbins_cs(k, n, 0.05);
            assert!(
                cs.lower <= w.lower && cs.upper >= w.upper,
                "{k}/{n}: {cs:?} vs {w:?}"
            );
        }
    }

    /// Robbins' edges by bisection on `p` (the definition, slowly).
    fn robbins_by_bisection(k: u64, n: u64, alpha: f64) -> Interval {
        let (kf, mf) = (k as f64, (n - k) as f64);
        let ln_b = ln_beta(kf + 1.0, mf + 1.0);
        let t = (1.0 / alpha).ln();
        let inside = |p: f64| ln_b - kf * p.ln() - mf * (1.0 - p).ln() < t;
        let edge = |mut inner: f64, mut outer: f64| {
            for _ in 0..200 {
                let mid = 0.5 * (inner + outer);
                if inside(mid) {
                    inner = mid;
                } else {
                    outer = mid;
                }
            }
            outer
        };
        let c = kf / n as f64;
        Interval {
            lower: if k == 0 { 0.0 } else { edge(c, 0.0) },
            upper: if k == n { 1.0 } else { edge(c, 1.0) },
        }
    }

    proptest! {
        /// Newton's edges are the bisection's, from outside.
        #[test]
        fn robbins_cs_matches_bisection_from_outside(k in 0u64..3000, extra in 0u64..100_000, alpha in 1e-6f64..0.5) {
            let n = (k + extra).max(1);
            let (fast, slow) = (robbins_cs(k, n, alpha), robbins_by_bisection(k, n, alpha));
            // Equal to 1e-9 (relative, for tiny lower edges): both sit on
            // the crossing up to the rounding of a log ratio of large terms.
            let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.max(1e-6);
            prop_assert!(close(fast.upper, slow.upper), "{:?} {:?}", fast, slow);
            prop_assert!(close(fast.lower, slow.lower), "{:?} {:?}", fast, slow);
        }

        /// The memoised count threshold decides as the mixture does.
        #[test]
        fn rate_exceeds_is_the_mixture_test(n in 1u64..2000, p0 in 0.005f64..0.5, alpha in 0.0005f64..0.2, frac in 0.0f64..1.0) {
            let k = (frac * n as f64) as u64;
            let direct = BetaBinomialMixture::bernoulli(p0, 100.0, alpha, true).log_value_counts(k, n)
                >= (1.0 / alpha).ln();
            prop_assert_eq!(rate_exceeds(k, n, p0, alpha, 100.0), direct);
        }

        #[test]
        fn last_true_matches_a_scan(max in 0u64..300, cut in 0u64..320, guess in 0u64..400) {
            let holds = |j: u64| j <= cut;
            let scan = (0..=max).rev().find(|&j| holds(j)).unwrap_or(0);
            prop_assert_eq!(last_true(max, holds, guess), scan);
        }

        /// The integer search gives the ranks of the counts strictly inside
        /// the mixture boundary, found by scanning every count.
        #[test]
        fn quantile_cs_ranks_match_a_scan(n in 1u64..3000, p in prop::sample::select(vec![0.5, 0.9, 0.95, 0.99]), alpha in 0.0005f64..0.2) {
            let m = BetaBinomialMixture::bernoulli(p, 100.0, alpha, false);
            let t = (1.0 / alpha).ln();
            let inside: Vec<u64> = (0..=n).filter(|&k| m.log_value_counts(k, n) < t).collect();
            let (lo, hi) = (inside[0], inside[inside.len() - 1]);
            let r = quantile_cs_ranks(p, n, alpha, 100.0);
            prop_assert_eq!(r.lower, (lo >= 1).then_some(lo));
            prop_assert_eq!(r.upper, (hi < n).then_some(hi + 1));
        }
    }

    proptest! {
        #[test]
        fn robbins_cs_contains_the_estimate_and_shrinks_with_data(k in 0u64..500, extra in 1u64..500, alpha in 0.001f64..0.2) {
            let n = k + extra;
            let cs = robbins_cs(k, n, alpha);
            let p = k as f64 / n as f64;
            prop_assert!(cs.lower <= p + 1e-12 && p <= cs.upper + 1e-12);
            prop_assert!(0.0 <= cs.lower && cs.upper <= 1.0);
            let bigger = robbins_cs(k * 4, n * 4, alpha);
            prop_assert!(bigger.upper - bigger.lower <= cs.upper - cs.lower + 1e-12);
        }
    }

    /// Of 400 Bernoulli(`p`) streams of 2,000 observations, looked at after
    /// every 10, how many ever satisfy `alarm(k, n)`.
    fn streams_ever(seed: u64, p: f64, alarm: impl Fn(u64, u64) -> bool) -> usize {
        let mut rng = StdRng::seed_from_u64(seed);
        (0..STREAMS)
            .filter(|_| {
                let mut k = 0;
                (1..=2000u64).any(|n| {
                    k += u64::from(rng.random_bool(p));
                    n % 10 == 0 && alarm(k, n)
                })
            })
            .count()
    }

    const STREAMS: usize = 400;

    /// Time-uniform coverage, checked by simulation: the fraction of
    /// Bernoulli streams whose sequence ever excludes the true rate within
    /// 2,000 looks stays below α.
    #[test]
    fn robbins_cs_covers_the_true_rate_at_all_times() {
        let (alpha, p) = (0.1, 0.05);
        let ever_missed = streams_ever(11, p, |k, n| !robbins_cs(k, n, alpha).contains(p));
        assert!(
            (ever_missed as f64) / (STREAMS as f64) <= alpha,
            "{ever_missed}/{STREAMS}"
        );
    }

    /// Simulated failures of two arms with a load that changes over time and
    /// weights that change between steps.
    fn run(candidate_rate: f64, champion_rate: f64, seed: u64) -> (bool, u64) {
        run_with_margin(candidate_rate, champion_rate, 1.0, seed)
    }

    fn run_with_margin(
        candidate_rate: f64,
        champion_rate: f64,
        max_ratio: f64,
        seed: u64,
    ) -> (bool, u64) {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut e = ConditionalBinomial::new(max_ratio);
        let mut candidate_requests = 0;
        for tick in 0..600u64 {
            let weight = [0.05, 0.25, 0.5][(tick / 200) as usize];
            let load = if (100..160).contains(&tick) { 3.0 } else { 1.0 };
            let n = 200u64;
            let nb = (0..n).filter(|_| rng.random_bool(weight)).count() as u64;
            let na = n - nb;
            candidate_requests += nb;
            let fa = (0..na)
                .filter(|_| rng.random_bool((champion_rate * load).min(1.0)))
                .count() as u64;
            let fb = (0..nb)
                .filter(|_| rng.random_bool((candidate_rate * load).min(1.0)))
                .count() as u64;
            e.update(fa, fb, nb as f64 / n as f64);
            if e.rejects(0.01) {
                return (true, candidate_requests);
            }
        }
        (false, candidate_requests)
    }

    #[test]
    fn an_equivalent_candidate_is_rarely_rejected_despite_weight_changes_and_load_spikes() {
        let rejected = (0..200).filter(|&s| run(0.01, 0.01, s).0).count();
        assert!(rejected <= 2, "{rejected}/200 at alpha 1%");
    }

    #[test]
    fn a_failing_candidate_is_rejected_within_few_requests() {
        let mut needed: Vec<u64> = (0..50)
            .map(|s| {
                let (rejected, n) = run(1.0, 0.01, 1000 + s);
                assert!(rejected);
                n
            })
            .collect();
        needed.sort_unstable();
        // With every candidate request failing, a handful of them suffices.
        assert!(needed[25] <= 40, "median {} candidate requests", needed[25]);
    }

    #[test]
    fn the_margin_lets_a_candidate_within_it_through() {
        // 1.5× the champion's failures: rejected without a margin, not with
        // a 2× margin (the null then includes it).
        let without = (0..40).filter(|&s| run(0.03, 0.02, 300 + s).0).count();
        let with = (0..40)
            .filter(|&s| run_with_margin(0.03, 0.02, 2.0, 300 + s).0)
            .count();
        assert!(without >= 30, "{without}/40 rejected without a margin");
        assert!(with <= 1, "{with}/40 rejected with a 2x margin");
    }

    #[test]
    fn a_shared_outage_does_not_reject() {
        // Both arms fail everything: failures split by exposure, as under H0.
        let mut e = ConditionalBinomial::new(1.0);
        for _ in 0..100 {
            e.update(950, 50, 0.05);
        }
        assert!(!e.rejects(0.01), "{}", e.log_e_value());
    }

    /// Time-uniform coverage of the quantile sequence, by simulation: the
    /// fraction of lognormal streams whose median or p95 sequence ever
    /// excludes the true quantile within 3,000 observations stays below α.
    #[test]
    fn quantile_cs_covers_the_true_quantile_at_all_times() {
        use rand_distr::{Distribution, LogNormal};
        let mut rng = StdRng::seed_from_u64(17);
        let dist = LogNormal::new(0.0, 1.0).expect("valid");
        let alpha = 0.1;
        let (runs, mut missed) = (300, 0);
        for _ in 0..runs {
            let mut xs: Vec<f64> = Vec::new();
            let mut ever = false;
            for n in 1..=3000usize {
                xs.push(dist.sample(&mut rng));
                if n % 25 != 0 {
                    continue;
                }
                let mut sorted = xs.clone();
                sorted.sort_by(f64::total_cmp);
                for (p, z) in [(0.5, 0.0f64), (0.95, 1.6449)] {
                    let truth = z.exp();
                    let r = quantile_cs_ranks(p, n as u64, alpha / 2.0, 100.0);
                    let lower_ok = r.lower.is_none_or(|k| sorted[k as usize - 1] <= truth);
                    let upper_ok = r.upper.is_none_or(|k| sorted[k as usize - 1] >= truth);
                    ever |= !(lower_ok && upper_ok);
                }
            }
            missed += usize::from(ever);
        }
        assert!(
            (missed as f64) / (runs as f64) <= alpha,
            "{missed}/{runs} streams ever missed"
        );
    }

    #[test]
    fn quantile_cs_ranks_narrow_with_data_and_bracket_the_quantile() {
        for p in [0.5, 0.95] {
            let mut last_share = f64::INFINITY;
            for n in [200u64, 1_000, 10_000, 100_000] {
                let r = quantile_cs_ranks(p, n, 0.001, 100.0);
                let (lo, hi) = (r.lower.expect("lower"), r.upper.expect("upper"));
                let at = (p * n as f64) as u64;
                assert!(lo <= at && at <= hi, "p={p} n={n}: [{lo}, {hi}]");
                // The bracket, as a share of the sample, shrinks with data.
                let share = (hi - lo) as f64 / n as f64;
                assert!(share < last_share, "p={p} n={n}: {share} >= {last_share}");
                last_share = share;
            }
        }
        // Too few observations to bound the tail from above.
        assert_eq!(quantile_cs_ranks(0.95, 20, 0.001, 100.0).upper, None);
        assert_eq!(quantile_cs_ranks(0.5, 0, 0.001, 100.0).lower, None);
    }

    /// The one-sided test's false rejections, by simulation: streams at
    /// exactly the budget, looked at after every 10 observations.
    #[test]
    fn rate_exceeds_rarely_rejects_a_rate_at_the_budget() {
        let (alpha, p0) = (0.05, 0.05);
        let rejected = streams_ever(23, p0, |k, n| rate_exceeds(k, n, p0, alpha, 100.0));
        assert!(
            (rejected as f64) / (STREAMS as f64) <= alpha,
            "{rejected}/{STREAMS}"
        );
    }

    #[test]
    fn rate_exceeds_detects_a_rate_well_above_the_budget() {
        // 12% flips against a 2% budget: a few dozen pairs suffice.
        assert!(rate_exceeds(12, 100, 0.02, 0.0025, 100.0));
        assert!(!rate_exceeds(3, 100, 0.02, 0.0025, 100.0));
        assert!(!rate_exceeds(0, 0, 0.02, 0.0025, 100.0));
        assert!(rate_exceeds(1, 1, 0.0, 0.0025, 100.0));
        assert!(!rate_exceeds(5, 5, 1.0, 0.0025, 100.0));
    }

    /// Both arms fail alike for a while (a shared outage), then the
    /// candidate fails `after` of its requests. With `restart`, a second
    /// component starts when the outage ends (tick 60), mixed by
    /// [`start_mixture`]. Returns whether it rejected, and after how many
    /// ticks past the outage.
    fn outage_then(after: f64, restart: bool, seed: u64) -> (bool, u64) {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut base = ConditionalBinomial::new(1.0);
        let mut later = ConditionalBinomial::new(1.0);
        for tick in 0..400u64 {
            let outage = tick < 60;
            let (n, rho) = (100u64, 0.5);
            let nb = (0..n).filter(|_| rng.random_bool(rho)).count() as u64;
            let na = n - nb;
            let fail = |rng: &mut StdRng, m: u64, p: f64| {
                if outage {
                    m
                } else {
                    (0..m).filter(|_| rng.random_bool(p)).count() as u64
                }
            };
            let (fa, fb) = (fail(&mut rng, na, 0.01), fail(&mut rng, nb, after));
            base.update(fa, fb, nb as f64 / n as f64);
            if tick >= 60 {
                later.update(fa, fb, nb as f64 / n as f64);
            }
            let e = if restart && tick >= 60 {
                start_mixture([base.log_e_value(), later.log_e_value()])
            } else {
                start_mixture([base.log_e_value()])
            };
            if e >= (1.0f64 / 0.01).ln() {
                return (true, tick.saturating_sub(60));
            }
        }
        (false, 0)
    }

    #[test]
    fn a_restart_after_an_outage_catches_a_candidate_that_fails_after_it() {
        // Without a restart the outage crushed every alternative: a
        // candidate failing half its requests afterwards is seen late. A
        // component started when the outage ends catches it within a few
        // ticks.
        let median = |restart| {
            let mut ticks: Vec<u64> = (0..40)
                .map(|s| {
                    let (rejected, t) = outage_then(0.5, restart, 50 + s);
                    assert!(rejected, "seed {s}");
                    t
                })
                .collect();
            ticks.sort_unstable();
            ticks[20]
        };
        let (with, without) = (median(true), median(false));
        assert!(with <= 3, "median {with} ticks after the outage");
        assert!(
            without >= 5 * with.max(1),
            "without a restart {without}, with {with}"
        );
    }

    #[test]
    fn restarts_keep_the_error_below_alpha() {
        // An equivalent candidate (both 1%) with a component started every
        // 10 ticks (60 of them): the mixture over start times is still a
        // test supermartingale, so false rejections stay below α = 1%.
        let rejected = (0..300)
            .filter(|&s| {
                let mut rng = StdRng::seed_from_u64(900 + s);
                let mut components: Vec<ConditionalBinomial> = Vec::new();
                (0..600u64).any(|tick| {
                    if tick % 10 == 0 {
                        components.push(ConditionalBinomial::new(1.0));
                    }
                    let nb = (0..200).filter(|_| rng.random_bool(0.25)).count() as u64;
                    let na = 200 - nb;
                    let fa = (0..na).filter(|_| rng.random_bool(0.01)).count() as u64;
                    let fb = (0..nb).filter(|_| rng.random_bool(0.01)).count() as u64;
                    for c in &mut components {
                        c.update(fa, fb, nb as f64 / 200.0);
                    }
                    start_mixture(components.iter().map(ConditionalBinomial::log_e_value))
                        >= (1.0f64 / 0.01).ln()
                })
            })
            .count();
        assert!(rejected <= 3, "{rejected}/300 at alpha 1%");
    }

    #[test]
    fn state_round_trips_through_json() {
        let mut e = ConditionalBinomial::new(1.5);
        e.update(3, 9, 0.25);
        let back: ConditionalBinomial =
            serde_json::from_str(&serde_json::to_string(&e).expect("ser")).expect("de");
        assert_eq!(back, e);
    }
}
