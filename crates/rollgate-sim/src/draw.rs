//! The random draws every traffic model shares: the generator, exact
//! binomials, and an alias table for discrete distributions.

use rand::RngCore;
use rand_distr::{Binomial, Distribution};
use rand_xoshiro::Xoshiro256PlusPlus;

/// The simulator's random numbers: xoshiro256++, a small fast generator
/// with a fixed, documented algorithm (runs stay reproducible across
/// crate versions); not for anything secret.
pub(crate) type Rng = Xoshiro256PlusPlus;

/// Draws from Binomial(n, p), exactly; trivial cases without a sampler.
pub(crate) fn binomial(rng: &mut Rng, n: u64, p: f64) -> u64 {
    if n == 0 || p <= 0.0 {
        return 0;
    }
    if p >= 1.0 {
        return n;
    }
    Binomial::new(n, p).map_or(0, |b| b.sample(rng))
}

/// Walker's alias table (Vose's construction): a discrete distribution
/// drawn with one 64-bit random number — the high half picks a column, the
/// low half decides between it and its alias.
///
/// Written here rather than `rand_distr::weighted::WeightedAliasIndex`,
/// which draws two numbers (one by rejection) per sample: the latency draw
/// is the simulator's innermost loop.
#[derive(Debug)]
pub(crate) struct AliasTable {
    /// Probability (scaled to 2^32) of keeping each column.
    keep: Vec<u64>,
    alias: Vec<u32>,
}

impl AliasTable {
    /// `weights` non-negative with a positive sum.
    pub(crate) fn new(weights: &[f64]) -> Self {
        let k = weights.len().max(1);
        let total: f64 = weights.iter().sum();
        let mut scaled: Vec<f64> = weights.iter().map(|w| w * k as f64 / total).collect();
        scaled.resize(k, 0.0);
        let (mut small, mut large): (Vec<usize>, Vec<usize>) =
            (0..k).partition(|&i| scaled[i] < 1.0);
        let mut keep = vec![1u64 << 32; k];
        let mut alias: Vec<u32> = (0..k as u32).collect();
        while let (Some(s), Some(&l)) = (small.pop(), large.last()) {
            keep[s] = (scaled[s] * 4_294_967_296.0) as u64;
            alias[s] = l as u32;
            scaled[l] -= 1.0 - scaled[s];
            if scaled[l] < 1.0 {
                large.pop();
                small.push(l);
            }
        }
        // What is left is 1 up to rounding: kept whole.
        AliasTable { keep, alias }
    }

    pub(crate) fn sample(&self, rng: &mut Rng) -> usize {
        let u = rng.next_u64();
        let column = (((u >> 32) * self.keep.len() as u64) >> 32) as usize;
        if (u & 0xffff_ffff) < self.keep[column] {
            column
        } else {
            self.alias[column] as usize
        }
    }

    /// The probability of drawing each index (for tests).
    #[cfg(test)]
    fn probabilities(&self) -> Vec<f64> {
        let k = self.keep.len() as f64;
        let mut p = vec![0.0; self.keep.len()];
        for (i, (&keep, &alias)) in self.keep.iter().zip(&self.alias).enumerate() {
            let kept = keep as f64 / 4_294_967_296.0;
            p[i] += kept / k;
            p[alias as usize] += (1.0 - kept) / k;
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    #[test]
    fn alias_table_draws_each_index_with_its_weight() {
        let weights = [0.0, 1.0, 2.5, 0.25, 6.25, 0.0, 1e-9];
        let table = AliasTable::new(&weights);
        let total: f64 = weights.iter().sum();
        for (p, w) in table.probabilities().iter().zip(weights) {
            assert!((p - w / total).abs() < 1e-9, "{p} vs {}", w / total);
        }
        let mut rng = Rng::seed_from_u64(9);
        let mut seen = [0u64; 7];
        for _ in 0..100_000 {
            seen[table.sample(&mut rng)] += 1;
        }
        assert_eq!((seen[0], seen[5]), (0, 0));
        assert!(
            (seen[4] as f64 / 100_000.0 - 0.625).abs() < 0.01,
            "{seen:?}"
        );
    }
}
