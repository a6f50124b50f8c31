//! The traffic models of one scenario: each arm's failures and latency as
//! the gateway's histogram sees them, and the keys' sticky buckets.

use rollgate_core::{LatencyHistogram, RevisionStats};
use statrs::distribution::{ContinuousCDF, LogNormal};

use crate::draw::{AliasTable, Rng};
use crate::scenario::{ArmModel, Scenario};
use crate::users::{UnitAcc, any_unit};

/// A scenario with its arms' latency models built, shared by all its runs.
#[derive(Debug)]
pub struct Traffic<'a> {
    pub(crate) scenario: &'a Scenario,
    pub(crate) champion: Arm,
    pub(crate) candidate: Arm,
}

impl<'a> Traffic<'a> {
    pub fn new(scenario: &'a Scenario) -> Self {
        Traffic {
            scenario,
            champion: Arm::new(scenario.champion),
            candidate: Arm::new(scenario.candidate),
        }
    }
}

#[derive(Debug)]
pub(crate) struct Arm {
    pub(crate) model: ArmModel,
    pub(crate) latency: LatencyModel,
}

impl Arm {
    fn new(model: ArmModel) -> Arm {
        Arm {
            model,
            latency: LatencyModel::lognormal(model.median_ms * 1000.0, model.sigma),
        }
    }
}

/// Latency of one arm as the gateway's histogram sees it: the probability
/// that a lognormal latency (in whole µs) lands in each histogram bucket,
/// drawn with an alias table. Exactly the distribution of drawing the
/// latency and bucketing it, at one random number per request, which
/// matters at 1,000 rps × thousands of runs.
#[derive(Debug)]
pub(crate) struct LatencyModel {
    /// The lowest latency of each bucket with any probability.
    pub(crate) values: Vec<u64>,
    /// Each value as it enters a unit group's log-latency sums.
    pub(crate) logs: Vec<u64>,
    pub(crate) alias: AliasTable,
}

impl LatencyModel {
    /// Buckets holding all but 10⁻¹² of the lognormal's mass on each side
    /// (the rest goes to the edge buckets).
    fn lognormal(median_us: f64, sigma: f64) -> Self {
        let median_us = median_us.max(1.0);
        // sigma = 0 is a point mass at the median (statrs needs sigma > 0).
        let dist = LogNormal::new(median_us.ln(), sigma).ok();
        // Latency x is recorded as ⌊x⌋ µs (at least 1): bucket [lo, hi]
        // holds x in [lo, hi + 1).
        let cdf = |us: f64| match &dist {
            Some(d) => d.cdf(us),
            None => f64::from(u8::from(us > median_us)),
        };
        let at = |p: f64| dist.as_ref().map_or(median_us, |d| d.inverse_cdf(p)) as u64;
        let (first, last) = (at(1e-12).max(1), at(1.0 - 1e-12).max(1));
        let (mut values, mut weights) = (Vec::new(), Vec::new());
        let mut lo = *LatencyHistogram::equivalent_range(first).start();
        loop {
            let hi = *LatencyHistogram::equivalent_range(lo).end();
            let top = hi >= last || hi >= rollgate_core::MAX_LATENCY_US;
            let below = if values.is_empty() {
                0.0
            } else {
                cdf(lo as f64)
            };
            let upto = if top { 1.0 } else { cdf(hi as f64 + 1.0) };
            values.push(lo);
            weights.push((upto - below).max(0.0));
            if top {
                break;
            }
            lo = hi + 1;
        }
        LatencyModel {
            logs: values
                .iter()
                .map(|&v| rollgate_core::unit::log_latency(v))
                .collect(),
            values,
            alias: AliasTable::new(&weights),
        }
    }

    /// Records `n` successes' latencies, scaled by `factor`, into `stats`
    /// and their unit groups (drawn uniformly) into `units`: one by one
    /// when fewer than half the buckets or scaled, else counted per bucket
    /// first and recorded a bucket at a time.
    pub(crate) fn record(
        &self,
        rng: &mut Rng,
        stats: &mut RevisionStats,
        n: u64,
        factor: f64,
        units: &mut UnitAcc,
    ) {
        if factor != 1.0 || 2 * n < self.values.len() as u64 {
            let latencies: Vec<u64> = (0..n)
                .map(|_| {
                    let b = self.alias.sample(rng);
                    let v = if factor == 1.0 {
                        self.values[b]
                    } else {
                        (self.values[b] as f64 * factor) as u64
                    };
                    let l = if factor == 1.0 {
                        self.logs[b]
                    } else {
                        rollgate_core::unit::log_latency(v)
                    };
                    units.success(any_unit(rng), l);
                    v
                })
                .collect();
            stats.record_latencies(latencies);
            return;
        }
        let mut per_bucket = vec![0u64; self.values.len()];
        for _ in 0..n {
            let b = self.alias.sample(rng);
            per_bucket[b] += 1;
            units.success(any_unit(rng), self.logs[b]);
        }
        stats.record_latency_counts(self.values.iter().copied().zip(per_bucket));
    }
}

/// SplitMix64: a fixed, well-mixed stand-in for the gateway's salted key
/// hash, so that assignment is sticky per key.
pub(crate) fn bucket(key: u64, salt: u64) -> u32 {
    let mut z = key ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ((z ^ (z >> 31)) % 10_000) as u32
}

/// The sticky bucket of the bot (`Users::bot_share`) of a run with `keys`
/// keys and `seed`: it serves the candidate at weight `w` basis points iff
/// this is below `w` (the bot is the key after the others).
pub fn bot_bucket(keys: u64, seed: u64) -> u32 {
    bucket(keys.max(1), seed)
}

/// The scenario's keys' sticky buckets for one run's salt, hashed once
/// (on the first weight change) and counted for each weight after.
pub(crate) struct StickyKeys {
    count: u64,
    salt: u64,
    buckets: Vec<u16>,
}

impl StickyKeys {
    pub(crate) fn new(count: u64, salt: u64) -> Self {
        StickyKeys {
            count: count.max(1),
            salt,
            buckets: Vec::new(),
        }
    }

    /// The share of keys whose bucket is below `weight_bp`: the probability
    /// that a request (from a uniformly drawn key) goes to the candidate.
    pub(crate) fn share(&mut self, weight_bp: u32) -> f64 {
        if weight_bp == 0 {
            return 0.0;
        }
        if self.buckets.is_empty() {
            let salt = self.salt;
            self.buckets = (0..self.count).map(|k| bucket(k, salt) as u16).collect();
        }
        let hit = self
            .buckets
            .iter()
            .filter(|&&b| u32::from(b) < weight_bp)
            .count();
        hit as f64 / self.count as f64
    }
}

#[cfg(test)]
mod tests;
