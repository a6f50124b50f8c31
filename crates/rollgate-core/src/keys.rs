//! Few keys: when a sticky split cannot judge a stage per key.
//!
//! With `assignment = "sticky"` the key (a user, a tenant) is the unit, and
//! a stage may pass only once the candidate's requests come from at least
//! [`MIN_UNITS`] unit groups ([`crate::unit`]), so from at least that many
//! keys. A stage at `w`% of a model whose traffic carries `K` keys gives
//! the candidate about `w·K/100` of them: with 12 keys a 5% stage holds
//! 0.6 keys on average and can never pass. This module says so — from a
//! key count the plan declares (`plan.keys`, checked by the validator) or
//! one estimated from the unit groups the rollout's traffic occupies — and
//! what would work instead: whole-key steps large enough to hold
//! [`MIN_UNITS`] keys, or assignment per request.

use crate::unit::{MIN_UNITS, UNITS};

/// Keys behind `occupied` of the [`UNITS`] unit groups (keys hash into
/// groups uniformly; `K` keys occupy `UNITS·(1 − (1 − 1/UNITS)^K)` groups
/// on average, inverted here). `None` when every group is occupied: a few
/// hundred keys or more, enough for any step of 5% or more to hold
/// [`MIN_UNITS`] of them.
pub fn estimate(occupied: usize) -> Option<u64> {
    let units = f64::from(UNITS);
    let g = occupied as f64;
    if occupied == 0 || g >= units {
        return None;
    }
    let k = (1.0 - g / units).ln() / (1.0 - 1.0 / units).ln();
    Some(k.round().max(g) as u64)
}

/// Whether an estimate of `keys` from occupied groups counts the model's
/// keys rather than its requests: ten requests per key, and no occupied
/// group rarer than [`RARE_GROUP`] requests. With few requests every
/// request may be a new key (a quiet model with many users looks like one
/// with few); with heavy-tailed volumes a few keys send most requests, and
/// the rest show up once or twice each — groups that hold a request or two
/// say keys remain unseen (Good–Turing's reading of singletons). Measured
/// (occupancy simulated, 300 runs each): 1,000 to 10,000 keys with
/// lognormal volumes of σ 3–4 and 600–5,000 requests never pass this
/// check with a hopeless 5% stage (without the rarity test: up to 61 of
/// 100); 12 keys sending 2,000 requests pass it in every run.
pub fn seen_all(keys: u64, requests: u64, rarest_group: u64) -> bool {
    requests >= keys.saturating_mul(10) && rarest_group >= RARE_GROUP
}

/// An occupied group holding fewer requests than this is a sign of keys
/// not yet seen ([`seen_all`]).
pub const RARE_GROUP: u64 = 5;

/// The keys a stage at `weight_percent` holds on average.
pub fn in_stage(keys: u64, weight_percent: u32) -> f64 {
    keys as f64 * f64::from(weight_percent) / 100.0
}

/// Whether a stage at `weight_percent` cannot reach the per-key floor with
/// `keys` keys: fewer than [`MIN_UNITS`] of them fall to the candidate on
/// average.
pub fn too_few(keys: u64, weight_percent: u32) -> bool {
    in_stage(keys, weight_percent) < MIN_UNITS as f64
}

/// Whether a stage at `weight_percent` is *clearly* beyond reach: on
/// average fewer than half the keys it needs. Such a stage fails at once
/// after its minimum duration (by when its keys have had time to show)
/// instead of waiting for its deadline; a borderline one waits, since luck
/// of the hash may still give it enough.
pub fn hopeless(keys: u64, weight_percent: u32) -> bool {
    in_stage(keys, weight_percent) < MIN_UNITS as f64 / 2.0
}

/// The smallest step, in whole percent, that holds [`MIN_UNITS`] of `keys`
/// on average; `None` when no step (at most 99%) does: only assignment
/// per request can judge such a model.
pub fn least_step(keys: u64) -> Option<u32> {
    if keys < MIN_UNITS as u64 {
        return None;
    }
    let percent = (MIN_UNITS as u64 * 100).div_ceil(keys);
    // Steps are at most 99%: a model with exactly MIN_UNITS keys has none.
    (percent <= 99).then_some(percent as u32)
}

/// What to do instead, in words, for `keys` keys.
pub fn advice(keys: u64) -> String {
    match least_step(keys) {
        Some(step) => format!(
            "use steps of at least {step}% (each holding {MIN_UNITS} keys), or split per \
             request (assignment = \"per_request\") if the model needs no stickiness"
        ),
        None => "split per request (assignment = \"per_request\"): with fewer keys than a \
                 stage needs, no sticky step can be judged"
            .to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The estimate inverts the expected occupancy: each key count's
    /// expected occupied groups map back to (about) that count.
    #[test]
    fn the_estimate_inverts_occupancy() {
        for keys in [1u64, 5, 12, 20, 50, 100, 200] {
            let occupied =
                f64::from(UNITS) * (1.0 - (1.0 - 1.0 / f64::from(UNITS)).powf(keys as f64));
            let back = estimate(occupied.round() as usize).expect("some groups free");
            let error = (back as f64 - keys as f64).abs() / keys as f64;
            assert!(
                error < 0.25,
                "{keys} keys -> {occupied:.1} groups -> {back}"
            );
        }
        assert_eq!(estimate(0), None);
        assert_eq!(estimate(UNITS as usize), None);
        // Never fewer keys than groups holding them.
        for g in 1..UNITS as usize {
            assert!(estimate(g).expect("free groups") >= g as u64);
        }
    }

    #[test]
    fn twelve_keys_cannot_be_judged_below_two_thirds() {
        for w in [5, 25, 50] {
            assert!(too_few(12, w), "{w}%");
        }
        assert!(hopeless(12, 5) && hopeless(12, 25) && !hopeless(12, 50));
        assert_eq!(least_step(12), Some(67));
        assert!(!too_few(12, 67));
        assert_eq!(least_step(7), None);
        assert_eq!(least_step(8), None);
        assert_eq!(least_step(9), Some(89));
        assert_eq!(least_step(200), Some(4));
        assert!(!too_few(200, 5) && too_few(100, 5));
        assert!(advice(12).contains("67%") && advice(3).contains("per_request"));
        // A quiet model: 60 requests in 40 groups say nothing about keys.
        let quiet = estimate(40).expect("free groups");
        assert!(!seen_all(quiet, 60, 1) && seen_all(12, 120, 8));
        // Heavy keys: requests enough, but a group holding one request
        // says light keys remain unseen.
        assert!(!seen_all(20, 600, 1) && !seen_all(20, 600, 4) && seen_all(20, 600, 5));
    }
}
