//! A seeded synthetic "transaction risk" task: twelve standard-normal
//! features, six of them informative, labels drawn from a logistic model.
//! Real enough that a model trained without its strongest feature stays
//! plausible on holdout accuracy while changing many confident decisions.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, StandardNormal};

pub const FEATURES: usize = 12;

/// The true log-odds weights; features 6..12 are noise.
pub const TRUE_WEIGHTS: [f64; FEATURES] =
    [2.5, -1.5, 1.2, 1.0, -0.8, 0.6, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
pub const TRUE_INTERCEPT: f64 = -0.5;

/// The feature the broken model is trained without.
pub const BROKEN_FEATURE: usize = 0;

/// One draw of features.
pub fn features(rng: &mut impl Rng) -> [f64; FEATURES] {
    let mut x = [0.0; FEATURES];
    for v in &mut x {
        *v = StandardNormal.sample(rng);
    }
    x
}

fn sigmoid(z: f64) -> f64 {
    1.0 / (1.0 + (-z).exp())
}

/// `n` labelled samples, deterministic for `seed`.
pub fn sample(n: usize, seed: u64) -> (Vec<[f64; FEATURES]>, Vec<bool>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut xs = Vec::with_capacity(n);
    let mut ys = Vec::with_capacity(n);
    for _ in 0..n {
        let x = features(&mut rng);
        let z = TRUE_INTERCEPT + x.iter().zip(TRUE_WEIGHTS).map(|(a, w)| a * w).sum::<f64>();
        ys.push(rng.random_bool(sigmoid(z)));
        xs.push(x);
    }
    (xs, ys)
}
