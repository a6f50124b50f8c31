//! Anytime-valid inference: bounds that stay valid however often they are
//! looked at, for the `sequential` policy (issue 7; not wired into the
//! state machine yet).
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

use serde::{Deserialize, Serialize};
use statrs::function::beta::ln_beta;

use crate::stats::Interval;

/// `ln M(p)` of the uniform-prior beta-binomial mixture against `p`.
fn robbins_log_ratio(k: u64, n: u64, p: f64) -> f64 {
    let (k, n) = (k as f64, n as f64);
    let p = p.clamp(1e-300, 1.0 - 1e-16);
    ln_beta(k + 1.0, n - k + 1.0) - k * p.ln() - (n - k) * (1.0 - p).ln()
}

/// The anytime-valid `1 − α` confidence sequence for a Bernoulli rate after
/// `k` successes in `n` trials: every `p` whose mixture likelihood ratio is
/// below `1/α`. The interval contains `k/n`; with `n = 0` it is `[0, 1]`.
pub fn robbins_cs(k: u64, n: u64, alpha: f64) -> Interval {
    if n == 0 {
        return Interval {
            lower: 0.0,
            upper: 1.0,
        };
    }
    let k = k.min(n);
    let threshold = (1.0 / alpha.clamp(1e-300, 1.0)).ln();
    let inside = |p: f64| robbins_log_ratio(k, n, p) < threshold;
    let centre = k as f64 / n as f64;
    // The log ratio is convex in p with its minimum at k/n: bisect each side.
    let edge = |mut inner: f64, mut outer: f64| {
        if inside(outer) {
            return outer;
        }
        for _ in 0..100 {
            let mid = 0.5 * (inner + outer);
            if inside(mid) {
                inner = mid;
            } else {
                outer = mid;
            }
        }
        inner
    };
    Interval {
        lower: if k == 0 { 0.0 } else { edge(centre, 0.0) },
        upper: if k == n { 1.0 } else { edge(centre, 1.0) },
    }
}

/// Rate ratios (candidate ÷ champion) the alternative mixes over: a grid on
/// the log scale from just above the null to 100× it.
const GRID: usize = 24;

/// The one-sided conditional-binomial mixture e-process for "the candidate's
/// failure rate per request is at most `r0` times the champion's".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConditionalBinomial {
    /// The null's largest rate ratio, `1 + margin`.
    pub r0: f64,
    /// `ln` of the likelihood ratio of each grid alternative against `r0`.
    pub log_lr: Vec<f64>,
}

impl ConditionalBinomial {
    pub fn new(r0: f64) -> Self {
        ConditionalBinomial {
            r0: r0.max(1e-9),
            log_lr: vec![0.0; GRID],
        }
    }

    fn alternative(&self, i: usize) -> f64 {
        // r0 · 100^((i+1)/GRID): 1.21×r0, 1.47×r0, …, 100×r0.
        self.r0 * 100f64.powf((i as f64 + 1.0) / GRID as f64)
    }

    /// Adds the failures seen since the last update: `champion_failures`
    /// and `candidate_failures`, while the candidate had `candidate_share`
    /// of the requests (its exposure, in (0, 1)).
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
        for i in 0..GRID {
            let t1 = theta(self.alternative(i));
            self.log_lr[i] += b * (t1 / t0).ln() + a * ((1.0 - t1) / (1.0 - t0)).ln();
        }
    }

    /// `ln` of the mixture (uniform over the grid) e-value.
    pub fn log_e_value(&self) -> f64 {
        let max = self
            .log_lr
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = self.log_lr.iter().map(|l| (l - max).exp()).sum();
        max + (sum / GRID as f64).ln()
    }

    /// Whether the null is rejected at level `alpha` (Ville's inequality).
    pub fn rejects(&self, alpha: f64) -> bool {
        self.log_e_value() >= (1.0 / alpha).ln()
    }
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

    /// Time-uniform coverage, checked by simulation: the fraction of
    /// Bernoulli streams whose sequence ever excludes the true rate within
    /// 2,000 looks stays below α.
    #[test]
    fn robbins_cs_covers_the_true_rate_at_all_times() {
        let mut rng = StdRng::seed_from_u64(11);
        let (alpha, p, runs) = (0.1, 0.05, 400);
        let mut ever_missed = 0;
        for _ in 0..runs {
            let mut k = 0;
            for n in 1..=2000u64 {
                k += u64::from(rng.random_bool(p));
                if n % 10 == 0 && !robbins_cs(k, n, alpha).contains(p) {
                    ever_missed += 1;
                    break;
                }
            }
        }
        assert!(
            (ever_missed as f64) / (runs as f64) <= alpha,
            "{ever_missed}/{runs}"
        );
    }

    /// Simulated failures of two arms with a load that changes over time and
    /// weights that change between steps.
    fn run(candidate_rate: f64, champion_rate: f64, seed: u64) -> (bool, u64) {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut e = ConditionalBinomial::new(1.0);
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
    fn a_shared_outage_does_not_reject() {
        // Both arms fail everything: failures split by exposure, as under H0.
        let mut e = ConditionalBinomial::new(1.0);
        for _ in 0..100 {
            e.update(950, 50, 0.05);
        }
        assert!(!e.rejects(0.01), "{}", e.log_e_value());
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
