//! Synthetic traffic for rollgate's real state machine and gates.
//!
//! A seeded, deterministic stand-in for the gateway: Poisson arrivals,
//! sticky keys hashed into buckets, per-arm failure probability, lognormal
//! latency, and paired answers with a chosen disagreement and
//! high-confidence-flip rate. It records exactly what a gateway records
//! (a cumulative [`Snapshot`]) and feeds it to [`rollgate_core::step`] once a
//! tick, applying the routing effects it returns. No clock, no network.

use std::time::Duration;

use rand::{RngCore, SeedableRng};
use rand_distr::{Binomial, Distribution, Poisson};
use rand_xoshiro::Xoshiro256PlusPlus;
use std::collections::{BTreeMap, VecDeque};

use rollgate_core::{
    AuditEvent, Effect, Epoch, Exposure, FailureClass, Input, LatencyHistogram, Observation, Phase,
    Plan, RevisionStats, RolloutSpec, RolloutState, Routing, SeriesReport, Snapshot, Timestamp,
    step,
};
use serde::{Deserialize, Serialize};
use statrs::distribution::{ContinuousCDF, LogNormal};

/// The simulator's random numbers: xoshiro256++, a small fast generator
/// with a fixed, documented algorithm (runs stay reproducible across
/// crate versions); not for anything secret.
type Rng = Xoshiro256PlusPlus;

pub mod baseline;
pub mod matrix;
mod scrape;
mod users;

pub use scrape::ScrapeModel;

pub use users::{Assignment, Users};
use users::{Crowd, UnitAcc, User, any_unit, uniform};

pub const CHAMPION: &str = "champion";
pub const CANDIDATE: &str = "candidate";

/// How one revision behaves.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ArmModel {
    /// Probability that a request fails (5xx).
    pub failure: f64,
    /// Median latency of successes, in milliseconds (lognormal).
    pub median_ms: f64,
    /// Lognormal shape: the spread of latency.
    pub sigma: f64,
    /// This arm's own share of requests that hang until the scenario's
    /// `timeout` and then fail (beside the scenario's shared `timeout_rate`).
    pub hang: f64,
    /// Share of successes answered with class "fraud" (the rest "ok").
    pub fraud: f64,
    /// Probability that a request is answered 4xx (the model refusing
    /// what it should serve, e.g. 404 for a renamed model).
    pub client_error: f64,
}

impl Default for ArmModel {
    fn default() -> Self {
        ArmModel::HEALTHY
    }
}

impl Default for Scenario {
    fn default() -> Self {
        Scenario::identical("unnamed", 100.0)
    }
}

impl ArmModel {
    pub const HEALTHY: ArmModel = ArmModel {
        failure: 0.0,
        median_ms: 20.0,
        sigma: 0.25,
        hang: 0.0,
        fraud: 0.3,
        client_error: 0.0,
    };
}

/// What a correct gate does with a scenario.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Expect {
    /// The candidate is no worse: a breach rollback is a false rollback
    /// (starving for evidence is reported apart: it is fail-safe, not wrong).
    #[default]
    Promote,
    /// The candidate is worse: promoting it is wrong.
    Stop,
    /// Not enough evidence (traffic stops): promoting is wrong, a fail-safe
    /// rollback is right.
    NoPromote,
    /// A shared outage: promoting or rolling back are both wrong.
    Hold,
}

/// A rollout scenario: traffic, both arms, and how the candidate's answers
/// relate to the champion's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    #[serde(default)]
    pub expect: Expect,
    /// Mean arrivals per second (Poisson).
    pub rps: f64,
    pub champion: ArmModel,
    pub candidate: ArmModel,
    /// Share of requests on which the champion is highly confident.
    pub confident_share: f64,
    /// P(candidate disagrees | champion confident): high-confidence flips.
    pub flip_rate: f64,
    /// P(candidate disagrees | champion not confident).
    pub unconfident_disagreement: f64,
    /// Seconds `[from, to)` during which both arms fail every request.
    pub shared_outage: Option<(u64, u64)>,
    /// From this second on, no traffic arrives.
    pub traffic_stops_at: Option<u64>,
    /// Distinct request keys (users); assignment is sticky per key.
    pub keys: u64,
    /// Whether the plan's SHADOW stage runs (default: as the plan says).
    /// `false` starts at the first canary step, as for a model with no
    /// shadow traffic.
    pub shadow: Option<bool>,
    /// Share of requests (both arms alike) that hang until the gateway's
    /// `timeout` and then fail: they complete long after they arrived,
    /// across routing changes.
    pub timeout_rate: f64,
    /// The gateway's upstream timeout for hanging requests.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Successes complete this long after they arrive (a slow model); fast
    /// failures complete at once.
    #[serde(with = "humantime_serde")]
    pub success_delay: Duration,
    /// Gateways sharing the traffic, each its own series of counts.
    pub gateways: u32,
    /// Seconds at which gateway 0 restarts: its counters start again from
    /// zero and its requests in flight are lost.
    pub gateway_restarts: Vec<u64>,
    /// Every this many seconds the last gateway drops out of the live set
    /// for `flap_for` seconds, then returns with its whole history.
    pub flap_every: Option<u64>,
    pub flap_for: u64,
    /// Both arms' latency scaled by a shared factor that ramps linearly
    /// from 1 at `from_s` to `factor` at `to_s` (a step when equal).
    pub shared_slowdown: Option<Slowdown>,
    /// The candidate behaves as the champion until this second, and as
    /// `candidate` from then on.
    pub candidate_changes_at: Option<u64>,
    /// Canary steps for this scenario (default: the plan's).
    pub steps: Option<Vec<u32>>,
    /// Whether the prediction-shift gate runs (default: as the plan says).
    pub prediction_shift: Option<bool>,
    /// The plan's minimum stage duration for this scenario.
    #[serde(with = "humantime_serde")]
    pub min_stage_duration: Option<Duration>,
    /// Users who differ (default: all alike, each arm's own `failure`).
    /// With users, a request fails with its user's propensity *and* its
    /// arm's `failure`.
    pub users: Option<Users>,
    /// Per key (sticky, the default) or per request.
    pub assignment: Assignment,
    /// Instances per request (shadow pairs per mirrored request).
    pub batch: u32,
    /// Intra-request correlation of the pairs' disagreements (beta-binomial).
    pub batch_correlation: f64,
    /// Controller evaluation interval.
    #[serde(with = "humantime_serde")]
    pub tick: Duration,
    /// Give up after this long (the result is then unfinished).
    #[serde(with = "humantime_serde")]
    pub max_duration: Duration,
    /// The evidence is scraped from the model servers by Prometheus
    /// (counted at completion, sampled, windowed by time) instead of
    /// reported by the gateways.
    pub scrape: Option<ScrapeModel>,
}

impl Scenario {
    /// `plan` with this scenario's overrides.
    pub fn plan(&self, plan: &Plan) -> Plan {
        let mut p = plan.clone();
        if let Some(shadow) = self.shadow {
            p.shadow.enabled = shadow;
        }
        if let Some(steps) = &self.steps {
            p.steps = steps.clone();
        }
        if let Some(on) = self.prediction_shift {
            p.gates.prediction_shift.enabled = on;
        }
        if let Some(d) = self.min_stage_duration {
            p.min_stage_duration = d;
            p.evidence_timeout = p.evidence_timeout.max(d);
        }
        p
    }

    /// An identical candidate at `rps`: same arm, same answers.
    pub fn identical(name: &str, rps: f64) -> Scenario {
        Scenario {
            name: name.to_string(),
            expect: Expect::Promote,
            rps,
            champion: ArmModel::HEALTHY,
            candidate: ArmModel::HEALTHY,
            confident_share: 0.5,
            flip_rate: 0.0,
            unconfident_disagreement: 0.0,
            shared_outage: None,
            traffic_stops_at: None,
            shadow: None,
            keys: 10_000,
            timeout_rate: 0.0,
            timeout: Duration::from_secs(30),
            success_delay: Duration::ZERO,
            gateways: 1,
            gateway_restarts: Vec::new(),
            flap_every: None,
            flap_for: 5,
            shared_slowdown: None,
            candidate_changes_at: None,
            steps: None,
            prediction_shift: None,
            min_stage_duration: None,
            users: None,
            assignment: Assignment::Sticky,
            batch: 1,
            batch_correlation: 0.0,
            tick: Duration::from_secs(1),
            max_duration: Duration::from_secs(3600),
            scrape: None,
        }
    }
}

/// A latency change shared by both arms.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Slowdown {
    pub from_s: f64,
    pub to_s: f64,
    pub factor: f64,
}

impl Slowdown {
    /// The latency factor at second `t`.
    fn at(&self, t: f64) -> f64 {
        if t <= self.from_s {
            1.0
        } else if t >= self.to_s {
            self.factor
        } else {
            1.0 + (self.factor - 1.0) * (t - self.from_s) / (self.to_s - self.from_s)
        }
    }
}

/// How a simulated rollout ended.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SimResult {
    pub scenario: String,
    pub seed: u64,
    /// The final phase (not terminal if `max_duration` ran out).
    pub phase: Phase,
    /// Simulated time from start to the final phase.
    pub seconds: f64,
    /// Live requests the candidate served (its exposure).
    pub candidate_live_requests: u64,
    /// Mirrored requests the candidate answered in the shadow stage.
    pub candidate_mirrored_requests: u64,
    pub evaluations: u64,
    /// Every audit record the rollout produced, in order.
    pub audit: Vec<TimedEvent>,
}

/// An audit record and the simulated second it was written at.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TimedEvent {
    pub at_s: f64,
    pub event: AuditEvent,
}

/// SplitMix64: a fixed, well-mixed stand-in for the gateway's salted key
/// hash, so that assignment is sticky per key.
fn bucket(key: u64, salt: u64) -> u32 {
    let mut z = key ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ((z ^ (z >> 31)) % 10_000) as u32
}

#[derive(Debug)]
struct Arm {
    model: ArmModel,
    latency: LatencyModel,
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
struct LatencyModel {
    /// The lowest latency of each bucket with any probability.
    values: Vec<u64>,
    /// Each value as it enters a unit group's log-latency sums.
    logs: Vec<u64>,
    alias: AliasTable,
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
    fn record(
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

/// Runs one rollout of `scenario` under `plan` (its own policy),
/// deterministically for `seed`.
pub fn simulate(plan: &Plan, scenario: &Scenario, seed: u64) -> SimResult {
    let traffic = Traffic::new(scenario);
    simulate_with(&mut CoreDecider::new(&scenario.plan(plan)), &traffic, seed)
}

/// Decides a rollout from what the gateways report: rollgate's state
/// machine, or a baseline rebuilt from another system's published rules.
pub trait Decider {
    /// One look at `now`: the routing to apply, the phase, and audit records.
    fn observe(
        &mut self,
        exposure: &Exposure,
        now: Duration,
    ) -> (Option<Routing>, Phase, Vec<AuditEvent>);
    fn evaluations(&self) -> u64;
}

/// rollgate's own state machine and gates (either policy).
#[derive(Debug)]
pub struct CoreDecider {
    spec: RolloutSpec,
    state: RolloutState,
}

impl CoreDecider {
    pub fn new(plan: &Plan) -> CoreDecider {
        CoreDecider {
            spec: RolloutSpec {
                model: "sim".into(),
                champion: CHAMPION.into(),
                candidate: CANDIDATE.into(),
                plan: plan.clone(),
            },
            state: RolloutState::new(Timestamp(0)),
        }
    }
}

impl CoreDecider {
    /// The rollout as the state machine left it (what `rollout status`
    /// reads).
    pub fn rollout(&self) -> (&RolloutSpec, &RolloutState) {
        (&self.spec, &self.state)
    }
}

impl Decider for CoreDecider {
    fn observe(
        &mut self,
        exposure: &Exposure,
        now: Duration,
    ) -> (Option<Routing>, Phase, Vec<AuditEvent>) {
        let obs = Observation {
            candidate_ready: true,
            exposure: Some(exposure.clone()),
            // The simulated gateways count by epoch of arrival.
            routing_applied: None,
        };
        let Ok(t) = step(
            &self.spec,
            &self.state,
            Input::Observe(obs),
            Timestamp(now.as_millis() as u64),
        ) else {
            // Observations never err; report no change rather than loop.
            return (None, self.state.phase.clone(), vec![]);
        };
        let mut routing = None;
        let mut audit = Vec::new();
        for e in t.effects {
            match e {
                Effect::SetRouting { routing: r } => routing = Some(r),
                Effect::Audit { event } => audit.push(*event),
                Effect::PromoteCandidate | Effect::RejectCandidate => {}
            }
        }
        self.state = t.state;
        (routing, self.state.phase.clone(), audit)
    }

    fn evaluations(&self) -> u64 {
        self.state.evaluations
    }
}

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

/// The scenario's keys' sticky buckets for one run's salt, hashed once
/// (on the first weight change) and counted for each weight after.
struct StickyKeys {
    count: u64,
    salt: u64,
    buckets: Vec<u16>,
}

impl StickyKeys {
    fn new(count: u64, salt: u64) -> Self {
        StickyKeys {
            count: count.max(1),
            salt,
            buckets: Vec::new(),
        }
    }

    /// The share of keys whose bucket is below `weight_bp`: the probability
    /// that a request (from a uniformly drawn key) goes to the candidate.
    fn share(&mut self, weight_bp: u32) -> f64 {
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

/// A scenario with its arms' latency models built, shared by all its runs.
#[derive(Debug)]
pub struct Traffic<'a> {
    scenario: &'a Scenario,
    champion: Arm,
    candidate: Arm,
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

/// Every series' counts pooled into one snapshot, for deciders that do not
/// split by series or epoch (the baselines).
pub fn pooled(exposure: &Exposure) -> Snapshot {
    let mut out = Snapshot::default();
    for r in exposure.series.values() {
        match r {
            SeriesReport::Epochs { epochs } => epochs.values().for_each(|s| out.merge(s)),
            SeriesReport::Pooled { total } => out.merge(total),
        }
    }
    out
}

/// One simulated gateway process: its boot (a restart starts a new series)
/// and its counts per routing epoch of arrival.
#[derive(Debug, Default)]
struct SimGateway {
    boot: u32,
    epochs: BTreeMap<Epoch, Snapshot>,
}

/// Counts that complete later: recorded into their gateway's epoch when
/// due, unless the gateway restarted meanwhile (then they are lost, as a
/// killed process loses its requests in flight).
#[derive(Debug)]
struct Pending {
    due: Duration,
    gateway: usize,
    boot: u32,
    epoch: Epoch,
    counts: Snapshot,
}

/// Where one tick's requests on one gateway are recorded: failures at
/// once, successes and hung requests when they complete.
struct Sinks<'a> {
    now: &'a mut Snapshot,
    later: Option<&'a mut Snapshot>,
    hung: Option<&'a mut Snapshot>,
    timeout_rate: f64,
    /// Shared latency factor (1 = none).
    slowdown: f64,
}

/// Runs one rollout of `traffic` with `decider`, deterministically for `seed`.
///
/// Each tick's requests are drawn in aggregate: a Poisson count, split by
/// binomials over the gateways, into the candidate's live share (each
/// request's key is drawn uniformly, so it is the candidate's with the
/// keys' bucket share), the mirrored share, failures and answer agreement.
/// This has exactly the distribution of drawing every request on its own,
/// at a cost per tick instead of per request. Each gateway counts a request
/// under the routing epoch in force when it arrived, when it completes.
pub fn simulate_with(decider: &mut dyn Decider, traffic: &Traffic, seed: u64) -> SimResult {
    let mut rng = Rng::seed_from_u64(seed);
    let Traffic {
        scenario,
        champion,
        candidate,
    } = traffic;
    let tick_s = scenario.tick.as_secs_f64();
    let arrivals = Poisson::new((scenario.rps * tick_s).max(1e-9)).ok();
    let mut keys = StickyKeys::new(scenario.keys, seed);
    let per_request = scenario.assignment == Assignment::PerRequest;
    let users: Vec<User> = scenario.users.as_ref().map_or_else(Vec::new, |u| {
        u.draw(scenario.keys, seed, |k| bucket(k, seed))
    });
    // The users each arm serves at the current weight.
    let crowds = |weight_bp: u32| {
        let to_candidate = |u: &User| !per_request && u.bucket < weight_bp;
        (
            Crowd::of(&users, |u| per_request || to_candidate(u), per_request),
            Crowd::of(&users, |u| per_request || !to_candidate(u), per_request),
        )
    };
    let (mut candidate_crowd, mut champion_crowd) = crowds(0);
    let gateways = scenario.gateways.max(1) as usize;
    let mut gws: Vec<SimGateway> = (0..gateways).map(|_| SimGateway::default()).collect();
    let mut pending: VecDeque<Pending> = VecDeque::new();
    let delayed = !scenario.success_delay.is_zero();
    let hanging = scenario.timeout_rate > 0.0
        || scenario.champion.hang > 0.0
        || scenario.candidate.hang > 0.0;

    let mut routing = Routing::CHAMPION_ONLY;
    let mut share = 0.0;
    let mut phase = Phase::Pending;
    let mut audit = Vec::new();
    let (mut live, mut mirrored) = (0u64, 0u64);
    let mut now = Duration::ZERO;
    let mut restarts = scenario.gateway_restarts.clone();
    restarts.sort_unstable();
    let mut restarts = restarts.into_iter().peekable();
    let mut scraper = scenario.scrape.as_ref().map(scrape::Scraper::new);

    while now < scenario.max_duration && !phase.is_terminal() {
        now += scenario.tick;
        let second = now.as_secs();
        while restarts.next_if(|&r| r <= second).is_some() {
            let g = &mut gws[0];
            g.boot += 1;
            g.epochs.clear();
        }
        let stopped = scenario.traffic_stops_at.is_some_and(|t| second >= t);
        let outage = scenario
            .shared_outage
            .is_some_and(|(from, to)| (from..to).contains(&second));
        let slowdown = scenario
            .shared_slowdown
            .map_or(1.0, |s| s.at(now.as_secs_f64()));
        let candidate = match scenario.candidate_changes_at {
            Some(at) if second < at => champion,
            _ => candidate,
        };
        let mut n = if stopped {
            0
        } else {
            arrivals.as_ref().map_or(0, |p| p.sample(&mut rng) as u64)
        };
        let (to_cand, to_champ) = (
            Senders::of(candidate_crowd.as_ref(), &users),
            Senders::of(champion_crowd.as_ref(), &users),
        );
        for (g, gw) in gws.iter_mut().enumerate() {
            let here = binomial(&mut rng, n, 1.0 / (gateways - g) as f64);
            n -= here;
            let to_candidate = binomial(&mut rng, here, share);
            let to_champion = here - to_candidate;
            let mirror = binomial(
                &mut rng,
                to_champion,
                f64::from(routing.mirror_bp) / 10_000.0,
            );
            live += to_candidate;
            mirrored += mirror;
            let epoch = routing.epoch;
            let (mut later, mut hung) = (Snapshot::default(), Snapshot::default());
            let mut sinks = Sinks {
                now: gw.epochs.entry(epoch).or_default(),
                later: delayed.then_some(&mut later),
                hung: hanging.then_some(&mut hung),
                timeout_rate: scenario.timeout_rate,
                slowdown,
            };
            serve(
                &mut rng,
                &mut sinks,
                CANDIDATE,
                candidate,
                to_candidate,
                outage,
                to_cand,
            );
            serve(
                &mut rng,
                &mut sinks,
                CHAMPION,
                champion,
                to_champion - mirror,
                outage,
                to_champ,
            );
            // Mirrored requests: the shadow's failures are independent of
            // the champion's; a pair needs both answers. (With users who
            // differ, the shadow's requests come from the same crowd, not
            // the same users: their propensities are the crowd's.)
            let champion_ok = serve(
                &mut rng, &mut sinks, CHAMPION, champion, mirror, outage, to_champ,
            );
            let pairs = serve(
                &mut rng,
                &mut sinks,
                CANDIDATE,
                candidate,
                champion_ok,
                outage,
                to_champ,
            );
            serve(
                &mut rng,
                &mut sinks,
                CANDIDATE,
                candidate,
                mirror - champion_ok,
                outage,
                to_champ,
            );
            let pair_sink = sinks.later.as_deref_mut().unwrap_or(sinks.now);
            record_pairs(&mut rng, pair_sink, scenario, pairs);
            for (counts, after) in [(later, scenario.success_delay), (hung, scenario.timeout)] {
                if !counts.is_empty() {
                    pending.push_back(Pending {
                        due: now + after,
                        gateway: g,
                        boot: gw.boot,
                        epoch,
                        counts,
                    });
                }
            }
        }
        // Completions that are due: the two delays are fixed, so the queue
        // is sorted up to the interleaving of its two kinds.
        if !pending.is_empty() {
            let (due, rest): (Vec<Pending>, Vec<Pending>) =
                pending.drain(..).partition(|p| p.due <= now);
            pending.extend(rest);
            for p in due {
                let gw = &mut gws[p.gateway];
                if gw.boot == p.boot {
                    gw.epochs.entry(p.epoch).or_default().merge(&p.counts);
                }
            }
        }
        // The report: every gateway in the live set, as its own series.
        let flapping = |g: usize| {
            g + 1 == gateways
                && gateways > 1
                && scenario.flap_every.is_some_and(|every| {
                    let every = every.max(1);
                    second >= every && second % every < scenario.flap_for
                })
        };
        let mut exposure = Exposure::default();
        for (g, gw) in gws.iter().enumerate().filter(|(g, _)| !flapping(*g)) {
            exposure = exposure.with_epochs(format!("gw{g}/{}", gw.boot), gw.epochs.clone());
        }
        if let Some(s) = scraper.as_mut() {
            s.tick(gws.iter().flat_map(|g| g.epochs.values()), now);
            exposure = s.exposure(&exposure, now);
        }

        let (r, p, events) = decider.observe(&exposure, now);
        if let Some(r) = r {
            if let Some(s) = scraper.as_mut() {
                s.routed(r.epoch, now);
            }
            let w = r.candidate_weight_bp;
            if w != routing.candidate_weight_bp {
                share = if per_request {
                    f64::from(w) / 10_000.0
                } else if users.is_empty() {
                    keys.share(w)
                } else {
                    users::volume_share(&users, |u| u.bucket < w)
                };
                (candidate_crowd, champion_crowd) = crowds(w);
            }
            routing = r;
        }
        phase = p;
        audit.extend(events.into_iter().map(|event| TimedEvent {
            at_s: now.as_secs_f64(),
            event,
        }));
    }
    SimResult {
        scenario: scenario.name.clone(),
        seed,
        phase,
        seconds: now.as_secs_f64(),
        candidate_live_requests: live,
        candidate_mirrored_requests: mirrored,
        evaluations: decider.evaluations(),
        audit,
    }
}

/// Who a serve call's requests come from.
#[derive(Clone, Copy)]
enum Senders<'a> {
    /// Users all alike: outcomes drawn in aggregate, unit groups uniform.
    Alike,
    /// Users who differ: each request from a user drawn by volume.
    Crowd(&'a Crowd, &'a [User]),
}

impl<'a> Senders<'a> {
    fn of(crowd: Option<&'a Crowd>, users: &'a [User]) -> Self {
        crowd.map_or(Senders::Alike, |c| Senders::Crowd(c, users))
    }
}

/// Serves `count` requests on `arm`, recording them; returns how many
/// succeeded.
fn serve(
    rng: &mut Rng,
    sinks: &mut Sinks,
    rev: &str,
    arm: &Arm,
    count: u64,
    outage: bool,
    senders: Senders,
) -> u64 {
    if count == 0 {
        return 0;
    }
    sinks.now.revision_mut(rev).record_arrivals(count);
    let p_hang = 1.0 - (1.0 - sinks.timeout_rate) * (1.0 - arm.model.hang);
    let mut units = UnitAcc::new();
    let successes = match senders {
        Senders::Alike => {
            let hung = binomial(rng, count, p_hang);
            let count = count - hung;
            let refused = binomial(rng, count, arm.model.client_error);
            record_client_errors(rng, sinks, rev, refused, &mut units);
            let count = count - refused;
            let failures = if outage {
                count
            } else {
                binomial(rng, count, arm.model.failure)
            };
            record_failures(rng, sinks, rev, (hung, failures), &mut units);
            count - failures
        }
        Senders::Crowd(crowd, users) => {
            // One request at a time: its user, then its outcome.
            let (mut hung, mut failed) = (UnitAcc::new(), UnitAcc::new());
            let (mut n_hung, mut n_failed) = (0, 0);
            let mut latencies = Vec::new();
            let f = sinks.slowdown;
            let f_log = (rollgate_core::unit::LOG_SCALE * f.ln()).round() as i64;
            for _ in 0..count {
                let (user, unit) = crowd.draw(rng, users);
                if p_hang > 0.0 && uniform(rng) < p_hang {
                    n_hung += 1;
                    hung.failures(unit, 1);
                } else if arm.model.client_error > 0.0 && uniform(rng) < arm.model.client_error {
                    let stats = sinks.now.revision_mut(rev);
                    stats.record_client_error();
                    stats.unit_mut(unit as u16).record_client_error();
                } else if outage
                    || uniform(rng) < 1.0 - (1.0 - user.failure) * (1.0 - arm.model.failure)
                {
                    n_failed += 1;
                    failed.failures(unit, 1);
                } else {
                    let b = arm.latency.alias.sample(rng);
                    let v = (arm.latency.values[b] as f64 * user.latency * f) as u64;
                    let l = arm.latency.logs[b] as i64 + user.latency_log + f_log;
                    latencies.push(v.max(1));
                    units.success(unit, l.max(0) as u64);
                }
            }
            if n_hung > 0 {
                let sink = sinks.hung.as_deref_mut().unwrap_or(sinks.now);
                let stats = sink.revision_mut(rev);
                stats.record_failures(FailureClass::Timeout, n_hung);
                hung.flush(stats);
            }
            let stats = sinks.now.revision_mut(rev);
            stats.record_failures(FailureClass::Upstream5xx, n_failed);
            failed.flush(stats);
            let n = latencies.len() as u64;
            let stats = sinks
                .later
                .as_deref_mut()
                .unwrap_or(sinks.now)
                .revision_mut(rev);
            stats.record_latencies(latencies);
            units.flush(stats);
            n
        }
    };
    let stats = sinks
        .later
        .as_deref_mut()
        .unwrap_or(sinks.now)
        .revision_mut(rev);
    if matches!(senders, Senders::Alike) {
        arm.latency
            .record(rng, stats, successes, sinks.slowdown, &mut units);
        units.flush(stats);
    }
    let fraud = binomial(rng, successes, arm.model.fraud);
    stats.record_predictions("fraud", fraud);
    stats.record_predictions("ok", successes - fraud);
    successes
}

/// Records `n` client errors (4xx) of users all alike, each in a unit
/// group drawn uniformly.
fn record_client_errors(rng: &mut Rng, sinks: &mut Sinks, rev: &str, n: u64, units: &mut UnitAcc) {
    if n == 0 {
        return;
    }
    let stats = sinks.now.revision_mut(rev);
    stats.record_client_errors(n);
    (0..n).for_each(|_| units.client_errors(any_unit(rng), 1));
    units.flush(stats);
}

/// Records `hung` timeouts and `failures` 5xx of users all alike, each in
/// a unit group drawn uniformly.
fn record_failures(
    rng: &mut Rng,
    sinks: &mut Sinks,
    rev: &str,
    (hung, failures): (u64, u64),
    units: &mut UnitAcc,
) {
    if hung > 0 {
        let sink = sinks.hung.as_deref_mut().unwrap_or(sinks.now);
        let stats = sink.revision_mut(rev);
        stats.record_failures(FailureClass::Timeout, hung);
        (0..hung).for_each(|_| units.failures(any_unit(rng), 1));
        units.flush(stats);
    }
    let stats = sinks.now.revision_mut(rev);
    stats.record_failures(FailureClass::Upstream5xx, failures);
    (0..failures).for_each(|_| units.failures(any_unit(rng), 1));
    units.flush(stats);
}

/// Compares the pairs of `requests` mirrored requests answered by both,
/// `scenario.batch` instances each: the champion is confident on a share
/// of them; the candidate flips some confident answers and disagrees on
/// some of the rest, correlated within a request by
/// `batch_correlation`.
fn record_pairs(rng: &mut Rng, snapshot: &mut Snapshot, scenario: &Scenario, requests: u64) {
    if requests == 0 {
        return;
    }
    let p = snapshot.pairs_mut(CANDIDATE);
    let (m, rho) = (u64::from(scenario.batch.max(1)), scenario.batch_correlation);
    if m == 1 {
        // One instance per request: aggregate draws, exactly.
        let confident = binomial(rng, requests, scenario.confident_share);
        let flips = binomial(rng, confident, scenario.flip_rate);
        let unsure = requests - confident;
        let disagree = binomial(rng, unsure, scenario.unconfident_disagreement);
        p.record_requests(flips, 1, 1, 1, 1);
        p.record_requests(confident - flips, 1, 0, 1, 0);
        p.record_requests(disagree, 1, 1, 0, 0);
        p.record_requests(unsure - disagree, 1, 0, 0, 0);
        return;
    }
    for _ in 0..requests {
        let c = binomial(rng, m, scenario.confident_share);
        let y = users::beta_binomial(rng, c, scenario.flip_rate, rho);
        let x = users::beta_binomial(rng, m - c, scenario.unconfident_disagreement, rho);
        p.record_requests(1, m, y + x, c, y);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quick() -> Plan {
        Plan {
            min_stage_duration: Duration::from_secs(10),
            evidence_timeout: Duration::from_secs(120),
            ..Plan::default()
        }
    }

    #[test]
    fn same_seed_same_result() {
        let s = Scenario::identical("same", 200.0);
        assert_eq!(simulate(&quick(), &s, 3), simulate(&quick(), &s, 3));
    }

    #[test]
    fn identical_candidate_is_promoted() {
        let r = simulate(&quick(), &Scenario::identical("identical", 300.0), 1);
        assert_eq!(r.phase, Phase::Promoted { manual: false });
        assert!(r.candidate_live_requests > 0);
    }

    #[test]
    fn broken_feature_is_refused_in_shadow_with_zero_exposure() {
        let s = Scenario {
            flip_rate: 0.12,
            unconfident_disagreement: 0.2,
            ..Scenario::identical("broken-feature", 300.0)
        };
        let r = simulate(&quick(), &s, 2);
        assert!(matches!(r.phase, Phase::RolledBack { .. }), "{:?}", r.phase);
        assert_eq!(r.candidate_live_requests, 0);
        assert!(r.candidate_mirrored_requests > 0);
    }

    #[test]
    fn traffic_that_stops_never_promotes() {
        let s = Scenario {
            traffic_stops_at: Some(5),
            ..Scenario::identical("stops", 300.0)
        };
        let r = simulate(&quick(), &s, 4);
        assert!(matches!(r.phase, Phase::RolledBack { .. }), "{:?}", r.phase);
    }

    #[test]
    fn latency_model_matches_the_lognormal_quantiles() {
        let t = LatencyModel::lognormal(20_000.0, 0.25);
        let mut rng = Rng::seed_from_u64(5);
        let mut few = RevisionStats::default();
        for _ in 0..2_000 {
            t.record(&mut rng, &mut few, 10, 1.0, &mut UnitAcc::new());
        }
        let mut many = RevisionStats::default();
        t.record(&mut rng, &mut many, 200_000, 1.0, &mut UnitAcc::new());
        for (stats, n) in [(few, 20_000), (many, 200_000)] {
            assert_eq!(stats.requests(), n);
            for (p, z) in [(0.05, -1.6449), (0.5, 0.0), (0.95, 1.6449), (0.99, 2.3263)] {
                let want = 20_000.0 * (0.25f64 * z).exp();
                let got = stats.latency().percentile_us(p).expect("samples") as f64;
                // Within the histogram's 1% buckets and the sampling error.
                assert!((got / want - 1.0).abs() < 0.02, "p{p}: {got} vs {want}");
            }
        }
        let mut point = RevisionStats::default();
        LatencyModel::lognormal(20_000.0, 0.0).record(
            &mut rng,
            &mut point,
            100,
            1.0,
            &mut UnitAcc::new(),
        );
        let range = LatencyHistogram::equivalent_range(20_000);
        assert_eq!(point.latency().buckets(), vec![(*range.end(), 100)]);
    }

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

    #[test]
    fn sticky_buckets_are_stable_and_spread() {
        assert_eq!(bucket(42, 7), bucket(42, 7));
        let below: usize = (0..10_000u64).filter(|&k| bucket(k, 7) < 1000).count();
        assert!((800..1200).contains(&below), "{below}");
    }
}
