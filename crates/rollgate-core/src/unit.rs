//! The statistical unit: what was randomised, and what that costs a test.
//!
//! Traffic is split per *key* (a sticky user), not per request, so the
//! candidate serves a fixed set of users with their own failure rates,
//! volumes and latencies. Requests of one user are correlated; a test
//! that counts requests as independent learns the two user sets'
//! difference at a rate linear in traffic and, when users differ, rolls
//! back an identical candidate. Likewise a request with 32 instances gives
//! 32 correlated shadow pairs.
//!
//! The remedy here is a **design effect**: the gateway keeps each
//! revision's totals per *unit group* (keys whose assignment bucket is
//! `u mod UNITS`; disjoint sets of independently hashed keys, so the groups'
//! totals are independent), and shadow pairs' per-request moments. From
//! them, a cluster-robust (linearisation, "sandwich") variance of a rate or
//! a mean, divided by the variance the test assumes for independent
//! requests, is the design effect `D ≥ 1`. Each test then *tempers* its
//! likelihood ratios by `η = 1/D` (equivalently: counts divided by `D`).
//!
//! Why tempering is safe: for `η ≤ 1`, a mixture of likelihood ratios
//! raised to `η` is at most the untempered mixture raised to `η` (the power
//! mean is concave), so the tempered e-value crosses `1/α` only where the
//! untempered one crosses `(1/α)^(1/η) ≥ 1/α`. With independent requests
//! the guarantee is therefore exactly the untempered test's, *whatever*
//! `D` is estimated. With correlated requests the log-likelihood ratio's
//! variance is inflated by `D`, and dividing by `D` restores the scale the
//! mixture boundary assumes (the cluster-robust asymptotic argument of
//! Waudby-Smith, Arbour, Sinha, Kennedy & Ramdas, "Time-uniform central
//! limit theory and asymptotic confidence sequences", Ann. Statist. 2024).
//! As traffic grows with a fixed set of users, `D` grows with it, so the
//! tempered evidence saturates at what the users can show, instead of
//! growing without bound.
//!
//! Memory stays bounded and snapshots stay mergeable: `UNITS` groups per
//! revision (sums add across gateways), and six integer sums per pair
//! stats.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Unit groups per revision. Enough groups for the variance estimate to
/// have 60+ degrees of freedom; few enough that every group holds several
/// users of the smallest canary (5% of 10,000 buckets: ~8 buckets each).
pub const UNITS: u32 = 64;

/// Fewer groups with data than this and no variance is estimated (it
/// would be noise): a count takes each group as at most one unit, and a
/// stage may not pass on such evidence.
pub const MIN_UNITS: usize = 8;

/// The unit group of an assignment bucket.
pub fn unit_of(bucket: u32) -> u16 {
    (bucket % UNITS) as u16
}

/// Fixed-point scale of `ln(latency)`: integer sums stay exact under merge
/// and subtraction. 1/256 in `ln` is 0.4%, far below latency's spread.
pub const LOG_SCALE: f64 = 256.0;

/// One unit group's totals for one revision.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(default, deny_unknown_fields)]
pub struct UnitTotals {
    /// Requests with an outcome (successes and failures).
    pub requests: u64,
    pub failures: u64,
    pub client_errors: u64,
    /// Successes with a latency.
    pub latencies: u64,
    /// Σ round(256 · ln latency_µs).
    pub log_latency: u64,
    /// Σ of its squares.
    pub log_latency_sq: u64,
}

/// A latency as it enters [`UnitTotals::log_latency`].
pub fn log_latency(latency_us: u64) -> u64 {
    (LOG_SCALE * (latency_us.max(1) as f64).ln()).round() as u64
}

impl UnitTotals {
    pub fn record_success(&mut self, latency_us: u64) {
        self.requests += 1;
        self.record_latency(latency_us, 1);
    }

    /// `n` successes with the same latency (already counted in `requests`).
    pub fn record_latency(&mut self, latency_us: u64, n: u64) {
        self.record_log_latency(log_latency(latency_us), n);
    }

    /// `n` latencies given as [`log_latency`] values.
    pub fn record_log_latency(&mut self, l: u64, n: u64) {
        self.latencies += n;
        self.log_latency = self.log_latency.saturating_add(n.saturating_mul(l));
        self.log_latency_sq = self
            .log_latency_sq
            .saturating_add(n.saturating_mul(l.saturating_mul(l)));
    }

    pub fn record_failures(&mut self, n: u64) {
        self.requests += n;
        self.failures += n;
    }

    pub fn record_client_error(&mut self) {
        self.client_errors += 1;
    }

    pub fn merge(&mut self, o: &UnitTotals) {
        self.requests += o.requests;
        self.failures += o.failures;
        self.client_errors += o.client_errors;
        self.latencies += o.latencies;
        self.log_latency = self.log_latency.saturating_add(o.log_latency);
        self.log_latency_sq = self.log_latency_sq.saturating_add(o.log_latency_sq);
    }

    /// `self − earlier`, or `None` if any counter went backwards.
    pub fn since(&self, e: &UnitTotals) -> Option<UnitTotals> {
        Some(UnitTotals {
            requests: self.requests.checked_sub(e.requests)?,
            failures: self.failures.checked_sub(e.failures)?,
            client_errors: self.client_errors.checked_sub(e.client_errors)?,
            latencies: self.latencies.checked_sub(e.latencies)?,
            log_latency: self.log_latency.checked_sub(e.log_latency)?,
            log_latency_sq: self.log_latency_sq.checked_sub(e.log_latency_sq)?,
        })
    }

    pub fn is_empty(&self) -> bool {
        *self == UnitTotals::default()
    }
}

/// A revision's totals by unit group.
pub type Units = BTreeMap<u16, UnitTotals>;

/// The leverage-corrected (CR3, jackknife) sandwich sum
/// `(G−1)/G · Σ_u ((k_u − r·n_u) / (1 − h_u))²` of a ratio `r = Σk/Σn` over
/// groups `(n_u, k_u)`, with `h_u = n_u/Σn` the group's leverage and `G`
/// the groups holding data; `None` with fewer than [`MIN_UNITS`] of them.
///
/// Why the leverage: a group's residual is measured against a ratio it
/// helped make, so one holding a share `h` of the arm has its residual
/// shrunk by `1 − h` — a bot at `h = 0.7` would have its variance
/// underestimated tenfold by the plain (CR1) sandwich. The jackknife
/// divides that back out; with groups of equal size it equals CR1.
/// Also returns the sum's [`degrees_of_freedom`].
fn sandwich(groups: impl Iterator<Item = (f64, f64)>) -> Option<(f64, f64)> {
    let groups: Vec<(f64, f64)> = groups.filter(|&(n, _)| n > 0.0).collect();
    if groups.len() < MIN_UNITS {
        return None;
    }
    let (n, k) = groups
        .iter()
        .fold((0.0, 0.0), |(a, b), &(n, k)| (a + n, b + k));
    let r = k / n;
    let g = groups.len() as f64;
    let ss: f64 = groups
        .iter()
        .map(|&(nu, ku)| {
            // At least one other group holds data, so `1 − h > 0`.
            let h = (nu / n).min(1.0 - 1e-12);
            ((ku - r * nu) / (1.0 - h)).powi(2)
        })
        .sum();
    let df = degrees_of_freedom(groups.iter().map(|&(nu, _)| nu), g);
    Some((ss * (g - 1.0) / g, df))
}

/// The degrees of freedom of a sandwich over groups of sizes `n_u`: under
/// the working model of independent requests a group's squared residual
/// has a variance proportional to its size, and a sum of such terms has
/// Satterthwaite's `(Σn_u)² / Σn_u²` degrees of freedom — the inverse
/// Herfindahl index of the groups' volumes — at most `G − 1`.
///
/// Why from the volumes and not from the residuals themselves: a
/// plug-in `(Σe²)² / Σe⁴` is as noisy as the variance it qualifies (low
/// as often as high); the volumes are what makes a few groups hold the
/// evidence (heavy keys), and they are known.
fn degrees_of_freedom(sizes: impl Iterator<Item = f64>, groups: f64) -> f64 {
    let (sum, squares) = sizes.fold((0.0, 0.0), |(s, q), n| (s + n, q + n * n));
    if squares <= 0.0 {
        return 1.0;
    }
    (sum * sum / squares).clamp(1.0, (groups - 1.0).max(1.0))
}

/// The fewest degrees of freedom the small-sample factor is taken at.
const MIN_DF: f64 = 3.0;

/// The tail at which a studentised count is calibrated: about where an
/// e-process at a rollout's `α` crosses its boundary (z ≈ 3.1).
const SMALL_SAMPLE_TAIL: f64 = 0.001;

/// How much a variance estimated with `df` degrees of freedom is inflated
/// so that a statistic divided by its root crosses the normal boundary at
/// [`SMALL_SAMPLE_TAIL`] no more often than with the variance known:
/// `(t_df / z)²` at that tail. About 1.1 with 60 degrees of freedom, 1.8
/// with 10, 3.6 with 5, 52 with 2.
///
/// Why: a sandwich over a few heavy groups is a sum of a few squares,
/// itself a noisy estimate — low as often as high — and a count divided
/// by the root of a low one looks like evidence. Tempering by the
/// inflated effect is the Student-t correction in the e-process's terms
/// (docs/statistics.md, "The statistical unit").
pub fn small_sample_factor(df: f64) -> f64 {
    use statrs::distribution::{ContinuousCDF, Normal, StudentsT};
    let z = Normal::standard().inverse_cdf(1.0 - SMALL_SAMPLE_TAIL);
    match StudentsT::new(0.0, 1.0, df.max(1.0)) {
        Ok(t) => (t.inverse_cdf(1.0 - SMALL_SAMPLE_TAIL) / z)
            .powi(2)
            .max(1.0),
        Err(_) => 1.0,
    }
}

/// One arm's count on the Poisson scale: the variance of the count `K`
/// given the arm's traffic, over `K` (what a test of independent requests
/// takes it to be). Returns `(D, N, K)` with `N` the arm's trials.
///
/// With [`MIN_UNITS`] groups holding data or more, the variance is the
/// leverage-corrected sandwich. With fewer there is no variance to
/// estimate, and the requests are not taken as independent either: each
/// group counts as at most one unit, its weight its share of the count,
/// so `D = Σk_u² / K`: failures one per group (distinct keys) keep
/// `D = 1`, failures all from one group (one key) are worth one failure.
/// That can only make a rollback harder; a stage may not *pass* below
/// [`MIN_UNITS`] groups either (`policy::sequential`'s unit floor), or a
/// stage holding one key could pass a candidate it cannot judge.
fn count_effect(units: &Units, pick: fn(&UnitTotals) -> (u64, u64)) -> (f64, f64, f64) {
    let groups: Vec<(f64, f64)> = units
        .values()
        .map(|u| {
            let (n, k) = pick(u);
            (n as f64, k as f64)
        })
        .filter(|&(n, _)| n > 0.0)
        .collect();
    if groups.is_empty() {
        // Nothing counted per key (the arm has no traffic yet, or its
        // source keeps no unit groups: Prometheus counters, an older
        // gateway): requests are taken as independent, the assumption such
        // evidence states (docs/statistics.md).
        return (1.0, 0.0, 0.0);
    }
    let (n, k) = groups
        .iter()
        .fold((0.0, 0.0), |(a, b), &(n, k)| (a + n, b + k));
    if k == 0.0 {
        return (1.0, n, k);
    }
    match sandwich(groups.into_iter()) {
        // Bounded: below MIN_DF degrees of freedom the factor stays at
        // MIN_DF's (about 11), so one key holding nearly all of an arm's
        // volume (df ≈ 1, factor ~10⁴) weakens the count, not erases it.
        Some((var, df)) => (var * small_sample_factor(df.max(MIN_DF)) / k, n, k),
        None => {
            // Each group taken as one unit: the variance if every group's
            // count moved as one.
            let squares: f64 = units.values().map(|u| (pick(u).1 as f64).powi(2)).sum();
            (squares / k, n, k)
        }
    }
}

/// The design effect of one arm's count (e.g. its own failure rate), at
/// least 1.
pub fn count_design_effect(units: &Units, pick: fn(&UnitTotals) -> (u64, u64)) -> f64 {
    count_effect(units, pick).0.max(1.0)
}

/// The design effect of comparing two arms' counts (failures, or client
/// errors) by the candidate's share of them: `(1 − p)·D_c + p·D_h` with
/// `p` the candidate's share of the trials, at least 1. `pick` gives a
/// group's `(trials, count)`.
///
/// Why these weights: given both counts' total, the candidate's count
/// `K_c` is binomial under independence with variance `K·p(1−p)` at the
/// null; with each arm overdispersed by its own `D`, `K_c − p·K` has
/// variance `K·p(1−p)·((1−p)·D_c + p·D_h)`. The weights are the arms'
/// exposures, fixed by the split, not their observed counts: weighting by
/// `1/K` would lean on the arm with fewer failures, so a heavy failing key
/// in the other arm would barely move the effect — exactly when it must.
pub fn ratio_design_effect(candidate: &Units, champion: &Units, pick: Pick) -> f64 {
    ratio_design_effect_each((candidate, pick), (champion, pick))
}

/// Picks one count and its exposure out of a unit's totals.
pub type Pick = fn(&UnitTotals) -> (u64, u64);

/// [`ratio_design_effect`] with each arm's count picked its own way (the
/// quality gate counts the champion's unlabelled answers with its wrong
/// ones, and not the candidate's).
pub fn ratio_design_effect_each(
    (candidate, pick_c): (&Units, Pick),
    (champion, pick_h): (&Units, Pick),
) -> f64 {
    let (dc, nc, _) = count_effect(candidate, pick_c);
    let (dh, nh, _) = count_effect(champion, pick_h);
    let p = if nc + nh > 0.0 { nc / (nc + nh) } else { 0.5 };
    ((1.0 - p) * dc.max(1.0) + p * dh.max(1.0)).max(1.0)
}

/// The design effect of one arm's mean log latency: its sandwich variance
/// over `σ²/n`, at least 1 (applied to the arm's quantile sequences); 1
/// with fewer than [`MIN_UNITS`] groups holding data.
pub fn latency_design_effect(units: &Units) -> f64 {
    let s = |x: u64| x as f64 / LOG_SCALE;
    let (mut n, mut sum, mut sq) = (0.0, 0.0, 0.0);
    for u in units.values() {
        n += u.latencies as f64;
        sum += s(u.log_latency);
        sq += s(u.log_latency_sq) / LOG_SCALE;
    }
    if n < 2.0 {
        return 1.0;
    }
    let variance = sq / n - (sum / n).powi(2);
    let groups = units
        .values()
        .map(|u| (u.latencies as f64, s(u.log_latency)));
    match sandwich(groups) {
        Some((var, _)) if variance > 1e-12 => (var / (variance * n)).max(1.0),
        _ => 1.0,
    }
}

/// Per-request moments of a count over instances (shadow pairs): with
/// request `r` holding `m_r` instances of which `x_r` count, the sums
/// `Σm`, `Σx`, `Σx²`, `Σx·m`, `Σm²` and the number of requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(default, deny_unknown_fields)]
pub struct RequestMoments {
    pub requests: u64,
    pub x_sq: u64,
    pub x_m: u64,
    pub m_sq: u64,
}

impl RequestMoments {
    /// `n` requests of `m` instances, `x` of which count.
    pub fn record(&mut self, m: u64, x: u64, n: u64) {
        if m == 0 {
            return;
        }
        self.requests += n;
        self.x_sq += n * x * x;
        self.x_m += n * x * m;
        self.m_sq += n * m * m;
    }

    pub fn merge(&mut self, o: &RequestMoments) {
        self.requests += o.requests;
        self.x_sq += o.x_sq;
        self.x_m += o.x_m;
        self.m_sq += o.m_sq;
    }

    pub fn since(&self, e: &RequestMoments) -> Option<RequestMoments> {
        Some(RequestMoments {
            requests: self.requests.checked_sub(e.requests)?,
            x_sq: self.x_sq.checked_sub(e.x_sq)?,
            x_m: self.x_m.checked_sub(e.x_m)?,
            m_sq: self.m_sq.checked_sub(e.m_sq)?,
        })
    }

    /// The design effect of the rate `k/n` (`k = Σx`, `n = Σm`) with the
    /// request as the unit: `R/(R−1) · Σ(x_r − p·m_r)² / (n·p(1−p))`, at
    /// least 1; 1 when no request moments were recorded (older gateways)
    /// or the rate is 0 or 1.
    pub fn design_effect(&self, k: u64, n: u64) -> f64 {
        if self.requests < 2 || n == 0 || k == 0 || k >= n {
            return 1.0;
        }
        let (kf, nf, r) = (k as f64, n as f64, self.requests as f64);
        let p = kf / nf;
        let ss = self.x_sq as f64 - 2.0 * p * self.x_m as f64 + p * p * self.m_sq as f64;
        (ss.max(0.0) * r / (r - 1.0) / (nf * p * (1.0 - p))).max(1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng, rngs::StdRng};

    fn units_of(groups: &[(u64, u64)]) -> Units {
        groups
            .iter()
            .enumerate()
            .map(|(i, &(n, k))| {
                (
                    i as u16,
                    UnitTotals {
                        requests: n,
                        failures: k,
                        ..UnitTotals::default()
                    },
                )
            })
            .collect()
    }

    /// Independent requests: the design effect is about 1.
    #[test]
    fn independent_requests_have_no_design_effect() {
        let mut rng = StdRng::seed_from_u64(3);
        let groups: Vec<(u64, u64)> = (0..64)
            .map(|_| {
                let n = 500;
                (n, (0..n).filter(|_| rng.random_bool(0.02)).count() as u64)
            })
            .collect();
        let (d, _, _) = count_effect(&units_of(&groups), |u| (u.requests, u.failures));
        assert!((0.6..1.5).contains(&d), "{d}");
    }

    /// Users who differ: a few fail often. The count's variance is far
    /// above Poisson, and grows with the traffic per user.
    #[test]
    fn heterogeneous_users_inflate_the_variance_with_traffic() {
        let effect = |per_user: u64, seed: u64| {
            let mut rng = StdRng::seed_from_u64(seed);
            let groups: Vec<(u64, u64)> = (0..64)
                .map(|_| {
                    (0..8).fold((0, 0), |(n, k), _| {
                        let p = if rng.random_bool(0.05) { 0.3 } else { 0.005 };
                        let f = (0..per_user).filter(|_| rng.random_bool(p)).count() as u64;
                        (n + per_user, k + f)
                    })
                })
                .collect();
            count_effect(&units_of(&groups), |u| (u.requests, u.failures)).0
        };
        let (few, many) = (effect(20, 1), effect(400, 1));
        assert!(few > 1.5, "{few}");
        assert!(many > 5.0 * few, "{many} vs {few}");
    }

    /// Fewer groups than [`MIN_UNITS`]: no variance is estimated, and the
    /// requests are not taken as independent either: a count is worth the
    /// spread of its groups (one failure per group: `D = 1`; all from one
    /// group: one failure's worth). Enough groups and no counts: 1; no
    /// groups at all (a source without unit groups): 1.
    #[test]
    fn too_few_groups_count_each_group_once() {
        let pick = |u: &UnitTotals| (u.requests, u.failures);
        let one_group = units_of(&[(100, 50), (100, 0)]);
        assert_eq!(count_design_effect(&one_group, pick), 50.0);
        let spread = units_of(&[(10, 1), (10, 1), (10, 1)]);
        assert_eq!(count_design_effect(&spread, pick), 1.0);
        // Two failures in one group and one in another: Σk² / K = 5 / 3.
        let mixed = units_of(&[(10, 2), (10, 1)]);
        assert!((count_design_effect(&mixed, pick) - 5.0 / 3.0).abs() < 1e-12);
        let d = ratio_design_effect(&one_group, &spread, pick);
        let p = 200.0 / 230.0;
        assert!((d - ((1.0 - p) * 50.0 + p)).abs() < 1e-9, "{d}");
        let none = units_of(&[(100, 0); 10]);
        assert_eq!(ratio_design_effect(&none, &none, pick), 1.0);
        assert_eq!(ratio_design_effect(&Units::new(), &Units::new(), pick), 1.0);
    }

    /// One group holding most of an arm's traffic and failures (a bot): the
    /// plain sandwich shrinks its residual by `1 − h`; the leverage-corrected
    /// one does not, so the effect is far larger — and with equal groups
    /// the two agree.
    #[test]
    fn a_dominant_group_is_not_shrunk_by_its_own_weight() {
        let pick = |u: &UnitTotals| (u.requests, u.failures);
        // 63 ordinary groups of 100 requests failing 1, and a bot group of
        // 20,000 requests (76% of the arm) failing 30%.
        let mut groups = vec![(100, 1); 63];
        groups.push((20_000, 6_000));
        let (d, _, k) = count_effect(&units_of(&groups), pick);
        // The plain (CR1) sandwich, for comparison.
        let (n, kk) = groups
            .iter()
            .fold((0.0, 0.0), |(a, b), &(n, k)| (a + n as f64, b + k as f64));
        let r = kk / n;
        let cr1: f64 = groups
            .iter()
            .map(|&(nu, ku)| (ku as f64 - r * nu as f64).powi(2))
            .sum::<f64>()
            * 64.0
            / 63.0
            / k;
        assert!(d > 10.0 * cr1, "leverage-corrected {d} vs plain {cr1}");
        // Equal groups: the same as the plain sandwich (before the
        // small-sample factor, which with 63 degrees of freedom is ~1.09).
        let even: Vec<(u64, u64)> = (0..64).map(|i| (100, i % 5)).collect();
        let (_, _, k) = count_effect(&units_of(&even), pick);
        let groups = even.iter().map(|&(n, k)| (n as f64, k as f64));
        let d = sandwich(groups).map(|(v, _)| v / k).expect("64 groups");
        let r = even.iter().map(|g| g.1).sum::<u64>() as f64 / 6400.0;
        let cr1 = even
            .iter()
            .map(|&(nu, ku)| (ku as f64 - r * nu as f64).powi(2))
            .sum::<f64>()
            * 64.0
            / 63.0
            / k;
        assert!((d - cr1).abs() < 1e-9 * cr1.max(1.0), "{d} vs {cr1}");
    }

    /// The arms' effects are combined by exposure, not by their counts: a
    /// heavy failing key in the small (candidate) arm moves the combined
    /// effect however clean the champion is.
    #[test]
    fn the_arms_are_weighted_by_exposure_not_by_their_counts() {
        let pick = |u: &UnitTotals| (u.requests, u.failures);
        // Candidate: 5% of traffic, its failures concentrated in one group.
        let mut candidate = vec![(50, 0); 63];
        candidate.push((1_850, 550));
        // Champion: 95%, failures spread evenly.
        let champion: Vec<(u64, u64)> = (0..64).map(|i| (1_500, 5 + i % 3)).collect();
        let (c, h) = (units_of(&candidate), units_of(&champion));
        let dc = count_design_effect(&c, pick);
        let dh = count_design_effect(&h, pick);
        let d = ratio_design_effect(&c, &h, pick);
        let p = 5_000.0 / (5_000.0 + 96_000.0);
        assert!(dc > 50.0 && dh < 2.0, "{dc} {dh}");
        assert!((d - ((1.0 - p) * dc + p * dh)).abs() < 1e-9 * d, "{d}");
        // What 1/K weights would have said: close to the clean champion's.
        let (kc, kh) = (550.0, champion.iter().map(|g| g.1).sum::<u64>() as f64);
        let by_counts = (dc / kc + dh / kh) / (1.0 / kc + 1.0 / kh);
        assert!(d > 2.0 * by_counts, "{d} vs {by_counts}");
    }

    /// The small-sample factor: none to speak of with many groups, large
    /// with a few, falling as they grow.
    #[test]
    fn few_degrees_of_freedom_inflate_the_variance() {
        let f = small_sample_factor;
        assert!((1.0..1.15).contains(&f(63.0)), "{}", f(63.0));
        assert!((1.6..2.0).contains(&f(10.0)), "{}", f(10.0));
        assert!(f(2.0) > 40.0, "{}", f(2.0));
        let mut last = f64::INFINITY;
        for df in 1..=200 {
            let now = f(f64::from(df));
            assert!(now <= last && now >= 1.0, "df {df}: {now} after {last}");
            last = now;
        }
        // The degrees of freedom are the inverse Herfindahl of the volumes.
        assert_eq!(degrees_of_freedom([10.0; 64].into_iter(), 64.0), 63.0);
        let one_heavy = degrees_of_freedom([1.0; 63].into_iter().chain([630.0]), 64.0);
        assert!((1.0..1.3).contains(&one_heavy), "{one_heavy}");
    }

    /// The factor is bounded: one key holding nearly all of an arm's
    /// volume (df ≈ 1, where the factor would be ~10⁴) weakens the count
    /// by the factor at MIN_DF degrees of freedom (about 11), no more.
    #[test]
    fn the_small_sample_factor_is_bounded() {
        let pick = |u: &UnitTotals| (u.requests, u.failures);
        let mut groups = vec![(10, 1); 9];
        groups.push((100_000, 30_000));
        let (d, _, k) = count_effect(&units_of(&groups), pick);
        let raw = sandwich(groups.iter().map(|&(n, k)| (n as f64, k as f64)))
            .map(|(v, _)| v / k)
            .expect("10 groups");
        let most = small_sample_factor(MIN_DF);
        assert!((10.0..12.0).contains(&most), "{most}");
        assert!(
            (d / raw - most).abs() < 1e-9 * most,
            "{d} vs {raw} x {most}"
        );
    }

    /// Calibration under heavy keys, as the error test compares the arms:
    /// 10,000 keys whose volumes are lognormal with σ = 4 (a few keys carry
    /// most of the traffic), 10% of keys failing 30% and the rest 1%, 5% of
    /// them (by hash bucket) in the candidate's arm, the arms identical.
    /// The candidate's count given both arms' total, studentised by the
    /// combined design effect, `(K_c − p·K)/√(K·p(1−p)·D)`, should exceed
    /// the normal quantile at [`SMALL_SAMPLE_TAIL`] about that often;
    /// without the small-sample factor it does so many times more (a
    /// sandwich of a few heavy groups is low as often as high).
    #[test]
    fn heavy_keys_studentised_by_the_design_effect_stay_calibrated() {
        use rand_distr::{Binomial, Distribution, LogNormal};
        let volumes = LogNormal::new(1.0, 4.0).expect("valid");
        let mut rng = StdRng::seed_from_u64(11);
        let pick = |u: &UnitTotals| (u.requests, u.failures);
        let raw = |units: &Units| {
            let (_, n, k) = count_effect(units, pick);
            let groups = units
                .values()
                .map(|u| (u.requests as f64, u.failures as f64));
            let var = sandwich(groups).map_or(k, |(v, _)| v);
            ((var / k.max(1.0)).max(1.0), n, k)
        };
        let z = 3.09;
        let (runs, mut with, mut without) = (2_000, 0, 0);
        for _ in 0..runs {
            let (mut candidate, mut champion) = (Units::new(), Units::new());
            for _ in 0..10_000 {
                let n = (volumes.sample(&mut rng) as u64).clamp(1, 10_000_000);
                let p = if rng.random_bool(0.1) { 0.3 } else { 0.01 };
                let k = Binomial::new(n, p).expect("valid").sample(&mut rng);
                let bucket = rng.random_range(0..10_000u32);
                let arm = if bucket < 500 {
                    &mut candidate
                } else {
                    &mut champion
                };
                let t = arm.entry(unit_of(bucket)).or_default();
                t.requests += n;
                t.failures += k;
            }
            let ((dc, nc, kc), (dh, nh, kh)) = (raw(&candidate), raw(&champion));
            let p = nc / (nc + nh);
            let (k, excess) = (kc + kh, kc - p * (kc + kh));
            let scale = k * p * (1.0 - p);
            let d_raw = ((1.0 - p) * dc + p * dh).max(1.0);
            let d = ratio_design_effect(&candidate, &champion, pick);
            with += usize::from(excess > z * (scale * d).sqrt());
            without += usize::from(excess > z * (scale * d_raw).sqrt());
        }
        let (with, without) = (with as f64 / runs as f64, without as f64 / runs as f64);
        // Seeded: 0.35% with, 1.45% without (nominal 0.1% at one look; the
        // e-process's boundary sits higher).
        assert!(with <= 0.006, "with the factor: {with}");
        assert!(
            without >= 3.0 * with.max(0.001),
            "without: {without}, with: {with}"
        );
    }

    #[test]
    fn a_batch_that_moves_together_counts_as_one() {
        // 100 requests of 32 instances; each request's instances all agree
        // or all disagree: 32 pairs carry one request's information.
        let mut m = RequestMoments::default();
        m.record(32, 32, 10);
        m.record(32, 0, 90);
        let d = m.design_effect(320, 3200);
        assert!((d - 32.0 * 100.0 / 99.0).abs() < 1e-6, "{d}");
        // Independent instances within requests: no effect.
        let mut ind = RequestMoments::default();
        let mut rng = StdRng::seed_from_u64(1);
        let mut k = 0;
        for _ in 0..2000 {
            let x = (0..32).filter(|_| rng.random_bool(0.1)).count() as u64;
            k += x;
            ind.record(32, x, 1);
        }
        let d = ind.design_effect(k, 64_000);
        assert!((0.85..1.2).contains(&d), "{d}");
    }

    #[test]
    fn latency_effect_sees_users_with_their_own_latency() {
        let mut rng = StdRng::seed_from_u64(8);
        let build = |rng: &mut StdRng, user_sd: f64| -> Units {
            (0..64u16)
                .map(|g| {
                    let mut t = UnitTotals::default();
                    for _ in 0..8 {
                        let shift: f64 = user_sd * (rng.random::<f64>() - 0.5) * 3.46;
                        for _ in 0..200 {
                            let noise: f64 = 0.25 * (rng.random::<f64>() - 0.5) * 3.46;
                            t.record_success((20_000.0 * (shift + noise).exp()) as u64);
                        }
                    }
                    (g, t)
                })
                .collect()
        };
        let flat = latency_design_effect(&build(&mut rng, 0.0));
        let varied = latency_design_effect(&build(&mut rng, 0.5));
        assert!(flat < 1.5, "{flat}");
        assert!(varied > 20.0, "{varied}");
    }

    #[test]
    fn since_is_the_inverse_of_merge() {
        let mut a = UnitTotals::default();
        a.record_success(1000);
        a.record_failures(2);
        let mut b = a;
        let mut more = UnitTotals::default();
        more.record_success(5000);
        more.record_client_error();
        b.merge(&more);
        assert_eq!(b.since(&a), Some(more));
        assert_eq!(a.since(&b), None);
    }
}
