//! Users who differ, and the unit groups a gateway counts them in.
//!
//! A real split is per key: the candidate serves a fixed set of users,
//! each with their own failure propensity, volume and latency. Here each
//! run draws its users, and a request is simulated one by one: a user drawn
//! by volume from those its arm serves, then its outcome from that user's
//! propensities. (Homogeneous traffic keeps the aggregated draws of
//! [`crate::simulate_with`]; only the unit group of each request is drawn
//! one by one.)

use rand::{RngCore, SeedableRng};
use rand_distr::{Beta, Distribution, LogNormal};
use rollgate_core::{RevisionStats, UNITS, UnitTotals};
use serde::{Deserialize, Serialize};

use crate::draw::{AliasTable, Rng};

/// How the users of a scenario differ.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Users {
    /// Failure propensity of most users.
    pub failure: f64,
    /// This share of users fails at `heavy_failure` instead.
    pub heavy_share: f64,
    pub heavy_failure: f64,
    /// Propensities drawn from Beta(a, b) instead of the two levels above.
    pub beta: Option<(f64, f64)>,
    /// Lognormal σ of each user's request volume (0: all alike; 1.5 is
    /// heavy-tailed: the top 1% of users send about a quarter of requests).
    pub volume_sigma: f64,
    /// Lognormal σ of each user's latency factor (0: none).
    pub latency_sigma: f64,
    /// One more key, a bot, that sends this share of all requests (0: no
    /// bot): a heavy key whose volume and failure propensity are chosen
    /// together.
    pub bot_share: f64,
    /// The bot's failure propensity.
    pub bot_failure: f64,
    /// Lognormal σ of each user's factor on the answering arm's share of
    /// class "fraud" (0: every user alike): users whose inputs differ, so
    /// a sticky arm's users have their own class mix.
    pub class_sigma: f64,
}

impl Default for Users {
    fn default() -> Self {
        Users {
            failure: 0.0,
            heavy_share: 0.0,
            heavy_failure: 0.0,
            beta: None,
            volume_sigma: 0.0,
            latency_sigma: 0.0,
            bot_share: 0.0,
            bot_failure: 0.0,
            class_sigma: 0.0,
        }
    }
}

/// How traffic is split between the arms: the plan's own setting.
pub use rollgate_core::plan::Assignment;

/// One drawn user.
#[derive(Debug, Clone, Copy)]
pub(crate) struct User {
    pub failure: f64,
    pub volume: f64,
    /// Factor on the arm's latency.
    pub latency: f64,
    /// The factor as it adds to a [`rollgate_core::unit::log_latency`].
    pub latency_log: i64,
    pub bucket: u32,
    /// Factor on the arm's share of class "fraud" in this user's answers
    /// (mean 1 over users; exactly 1 when users' class mixes are alike).
    pub class_factor: f64,
}

/// A uniform draw in [0, 1).
pub(crate) fn uniform(rng: &mut Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// A unit group drawn uniformly (homogeneous traffic: a request's key is
/// uniform over keys, so its group is too).
pub(crate) fn any_unit(rng: &mut Rng) -> usize {
    (((rng.next_u64() >> 32) * u64::from(UNITS)) >> 32) as usize
}

impl Users {
    /// `count` users for one run, deterministically for `seed`, with their
    /// sticky buckets from `bucket`.
    pub(crate) fn draw(&self, count: u64, seed: u64, bucket: impl Fn(u64) -> u32) -> Vec<User> {
        let mut rng = Rng::seed_from_u64(seed ^ 0x05ee_d0f0_5e75);
        let beta = self.beta.and_then(|(a, b)| Beta::new(a, b).ok());
        let lognormal = |sigma: f64| LogNormal::new(0.0, sigma.max(1e-12)).ok();
        let (volume, latency) = (lognormal(self.volume_sigma), lognormal(self.latency_sigma));
        // Mean 1 over users: the arms' class shares stay as the scenario says.
        let class =
            LogNormal::new(-self.class_sigma.powi(2) / 2.0, self.class_sigma.max(1e-12)).ok();
        let mut users: Vec<User> = (0..count.max(1))
            .map(|k| {
                let mut u = User {
                    failure: match &beta {
                        Some(b) => b.sample(&mut rng),
                        None if uniform(&mut rng) < self.heavy_share => self.heavy_failure,
                        None => self.failure,
                    },
                    volume: match (&volume, self.volume_sigma > 0.0) {
                        (Some(v), true) => v.sample(&mut rng),
                        _ => 1.0,
                    },
                    latency: match (&latency, self.latency_sigma > 0.0) {
                        (Some(l), true) => l.sample(&mut rng),
                        _ => 1.0,
                    },
                    bucket: bucket(k),
                    latency_log: 0,
                    class_factor: 1.0,
                };
                u.latency_log = (rollgate_core::unit::LOG_SCALE * u.latency.ln()).round() as i64;
                // Drawn last and only when asked for: other scenarios' draws
                // stay as they were.
                if let (Some(c), true) = (&class, self.class_sigma > 0.0) {
                    u.class_factor = c.sample(&mut rng);
                }
                u
            })
            .collect();
        // The bot is a key of its own beyond the others (their draws stay
        // as they were), with the volume that makes its share.
        if self.bot_share > 0.0 && self.bot_share < 1.0 {
            let others: f64 = users.iter().map(|u| u.volume).sum();
            users.push(User {
                failure: self.bot_failure,
                volume: others * self.bot_share / (1.0 - self.bot_share),
                latency: 1.0,
                latency_log: 0,
                bucket: bucket(count.max(1)),
                class_factor: 1.0,
            });
        }
        users
    }
}

/// The users one arm serves, drawn by volume.
#[derive(Debug)]
pub(crate) struct Crowd {
    members: Vec<u32>,
    table: AliasTable,
    /// Assignment is per request: the unit group is the request's, not
    /// the user's.
    random_unit: bool,
}

impl Crowd {
    /// The users `keep` selects; `None` if there are none.
    pub(crate) fn of(
        users: &[User],
        keep: impl Fn(&User) -> bool,
        random_unit: bool,
    ) -> Option<Crowd> {
        let members: Vec<u32> = (0..users.len() as u32)
            .filter(|&i| keep(&users[i as usize]))
            .collect();
        if members.is_empty() {
            return None;
        }
        let weights: Vec<f64> = members.iter().map(|&i| users[i as usize].volume).collect();
        Some(Crowd {
            table: AliasTable::new(&weights),
            members,
            random_unit,
        })
    }

    /// A request's user and unit group.
    pub(crate) fn draw<'u>(&self, rng: &mut Rng, users: &'u [User]) -> (&'u User, usize) {
        let user = &users[self.members[self.table.sample(rng)] as usize];
        let unit = if self.random_unit {
            any_unit(rng)
        } else {
            rollgate_core::unit_of(user.bucket) as usize
        };
        (user, unit)
    }
}

/// The share of traffic `users` with `keep` send.
pub(crate) fn volume_share(users: &[User], keep: impl Fn(&User) -> bool) -> f64 {
    let total: f64 = users.iter().map(|u| u.volume).sum();
    let kept: f64 = users.iter().filter(|u| keep(u)).map(|u| u.volume).sum();
    if total > 0.0 { kept / total } else { 0.0 }
}

/// One serve call's totals per unit group, added to a revision at the end.
pub(crate) struct UnitAcc(Vec<UnitTotals>);

impl UnitAcc {
    pub(crate) fn new() -> Self {
        UnitAcc(vec![UnitTotals::default(); UNITS as usize])
    }

    pub(crate) fn success(&mut self, unit: usize, log_latency: u64) {
        let t = &mut self.0[unit];
        t.requests += 1;
        t.record_log_latency(log_latency, 1);
    }

    pub(crate) fn failures(&mut self, unit: usize, n: u64) {
        self.0[unit].record_failures(n);
    }

    pub(crate) fn client_errors(&mut self, unit: usize, n: u64) {
        self.0[unit].client_errors += n;
    }

    pub(crate) fn flush(&mut self, stats: &mut RevisionStats) {
        for (u, t) in self.0.iter_mut().enumerate() {
            if !t.is_empty() {
                stats.unit_mut(u as u16).merge(t);
                *t = UnitTotals::default();
            }
        }
    }
}

/// A draw from the beta-binomial: `n` trials sharing one rate drawn from a
/// Beta with mean `p` and intra-class correlation `rho` (0: binomial).
pub(crate) fn beta_binomial(rng: &mut Rng, n: u64, p: f64, rho: f64) -> u64 {
    if n == 0 || p <= 0.0 {
        return 0;
    }
    let q = if rho > 0.0 && p < 1.0 {
        let k = (1.0 - rho) / rho;
        Beta::new(p * k, (1.0 - p) * k).map_or(p, |b| b.sample(rng))
    } else {
        p
    };
    crate::draw::binomial(rng, n, q)
}
