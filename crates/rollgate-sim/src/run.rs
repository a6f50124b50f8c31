//! The runner: one simulated rollout, tick by tick — the gateways'
//! arrivals, restarts and completions, what they report, and the
//! decider's looks — and how it ended.

use std::collections::{BTreeMap, VecDeque};
use std::iter::Peekable;
use std::time::Duration;

use rand::SeedableRng;
use rand_distr::{Distribution, Poisson};
use rollgate_core::{AuditEvent, Epoch, Exposure, Phase, Plan, Routing, Snapshot};
use serde::Serialize;

use crate::decider::{CoreDecider, Decider};
use crate::draw::{Rng, binomial};
use crate::scenario::Scenario;
use crate::scrape::Scraper;
use crate::serve::{Senders, Tick, serve_gateway};
use crate::traffic::{Arm, StickyKeys, Traffic, bucket};
use crate::users::{self, Assignment, Crowd, User};

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

/// Runs one rollout of `scenario` under `plan` (its own policy),
/// deterministically for `seed`.
pub fn simulate(plan: &Plan, scenario: &Scenario, seed: u64) -> SimResult {
    let traffic = Traffic::new(scenario);
    simulate_with(&mut CoreDecider::new(&scenario.plan(plan)), &traffic, seed)
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
    let scenario = traffic.scenario;
    let mut run = Run::new(traffic, seed);
    while run.now < scenario.max_duration && !run.phase.is_terminal() {
        run.now += scenario.tick;
        run.fleet.restart_due(run.now.as_secs());
        run.arrive();
        run.fleet.complete_due(run.now);
        let exposure = run.report();
        run.look(decider, &exposure);
    }
    run.end(decider.evaluations())
}

/// One rollout in progress: its clock, its gateways, how live traffic is
/// split, and what the decider has decided so far.
struct Run<'t> {
    scenario: &'t Scenario,
    seed: u64,
    champion: &'t Arm,
    candidate: &'t Arm,
    rng: Rng,
    /// Arrivals per tick (none for a rate that is not a number).
    arrivals: Option<Poisson<f64>>,
    /// Successes complete later (a slow model).
    delayed: bool,
    /// Some requests hang until the timeout.
    hanging: bool,
    split: Split,
    fleet: Fleet,
    scraper: Option<Scraper<'t>>,
    now: Duration,
    phase: Phase,
    audit: Vec<TimedEvent>,
    /// The candidate's live and mirrored requests so far.
    live: u64,
    mirrored: u64,
}

impl<'t> Run<'t> {
    /// The rollout before its first tick: champion only, pending.
    fn new(traffic: &'t Traffic, seed: u64) -> Self {
        let scenario = traffic.scenario;
        let tick_s = scenario.tick.as_secs_f64();
        Run {
            scenario,
            seed,
            champion: &traffic.champion,
            candidate: &traffic.candidate,
            rng: Rng::seed_from_u64(seed),
            arrivals: Poisson::new((scenario.rps * tick_s).max(1e-9)).ok(),
            delayed: !scenario.success_delay.is_zero(),
            hanging: scenario.timeout_rate > 0.0
                || scenario.champion.hang > 0.0
                || scenario.candidate.hang > 0.0,
            split: Split::new(scenario, seed),
            fleet: Fleet::new(scenario),
            scraper: scenario.scrape.as_ref().map(Scraper::new),
            now: Duration::ZERO,
            phase: Phase::Pending,
            audit: Vec::new(),
            live: 0,
            mirrored: 0,
        }
    }

    /// One tick of traffic: this second's conditions, then its arrivals,
    /// served and recorded on every gateway.
    fn arrive(&mut self) {
        let scenario = self.scenario;
        let second = self.now.as_secs();
        let stopped = scenario.traffic_stops_at.is_some_and(|t| second >= t)
            || scenario
                .on_off
                .is_some_and(|period| (second / period.max(1)) % 2 == 1);
        let outage = scenario
            .shared_outage
            .is_some_and(|(from, to)| (from..to).contains(&second));
        let slowdown = scenario
            .shared_slowdown
            .map_or(1.0, |s| s.at(self.now.as_secs_f64()));
        let candidate = match scenario.candidate_changes_at {
            Some(at) if second < at => self.champion,
            _ => self.candidate,
        };
        let n = if stopped {
            0
        } else {
            self.arrivals
                .as_ref()
                .map_or(0, |p| p.sample(&mut self.rng) as u64)
        };
        let split = &self.split;
        let tick = Tick {
            scenario,
            routing: split.routing,
            share: split.share,
            champion: self.champion,
            candidate,
            outage,
            slowdown,
            to_cand: Senders::of(split.candidate_crowd.as_ref(), &split.users),
            to_champ: Senders::of(split.champion_crowd.as_ref(), &split.users),
            delayed: self.delayed,
            hanging: self.hanging,
        };
        let (live, mirrored) = self.fleet.serve(&mut self.rng, &tick, n, self.now);
        self.live += live;
        self.mirrored += mirrored;
    }

    /// What the gateways report this tick, or, when the evidence is
    /// scraped, what Prometheus reads of the model servers.
    fn report(&mut self) -> Exposure {
        let mut exposure = self.fleet.exposure(self.scenario, self.now.as_secs());
        if let Some(s) = self.scraper.as_mut() {
            s.tick(self.fleet.counts(), self.now);
            exposure = s.exposure(&exposure, self.now);
        }
        exposure
    }

    /// One look of the decider: the routing it sets, the phase and its
    /// audit records.
    fn look(&mut self, decider: &mut dyn Decider, exposure: &Exposure) {
        let (r, p, events) = decider.observe(exposure, self.now);
        if let Some(r) = r {
            if let Some(s) = self.scraper.as_mut() {
                s.routed(r.epoch, self.now);
            }
            self.split.route(r);
        }
        self.phase = p;
        let at_s = self.now.as_secs_f64();
        self.audit
            .extend(events.into_iter().map(|event| TimedEvent { at_s, event }));
    }

    /// How the rollout ended, after `evaluations` looks of the decider.
    fn end(self, evaluations: u64) -> SimResult {
        SimResult {
            scenario: self.scenario.name.clone(),
            seed: self.seed,
            phase: self.phase,
            seconds: self.now.as_secs_f64(),
            candidate_live_requests: self.live,
            candidate_mirrored_requests: self.mirrored,
            evaluations,
            audit: self.audit,
        }
    }
}

/// How live traffic is split between the arms under the routing in force.
struct Split {
    routing: Routing,
    /// The probability that a live request goes to the candidate.
    share: f64,
    /// Assignment per request rather than per key.
    per_request: bool,
    keys: StickyKeys,
    /// The run's users when they differ (else none).
    users: Vec<User>,
    /// The users each arm serves at the current weight.
    candidate_crowd: Option<Crowd>,
    champion_crowd: Option<Crowd>,
}

impl Split {
    /// Champion only, with the run's keys and users drawn for `seed`.
    fn new(scenario: &Scenario, seed: u64) -> Self {
        let per_request = scenario.assignment == Assignment::PerRequest;
        let users: Vec<User> = scenario.users.as_ref().map_or_else(Vec::new, |u| {
            u.draw(scenario.keys, seed, |k| bucket(k, seed))
        });
        let (candidate_crowd, champion_crowd) = crowds(&users, per_request, 0);
        Split {
            routing: Routing::CHAMPION_ONLY,
            share: 0.0,
            per_request,
            keys: StickyKeys::new(scenario.keys, seed),
            users,
            candidate_crowd,
            champion_crowd,
        }
    }

    /// Applies the decider's routing `r`: a new weight moves the share and
    /// the crowds.
    fn route(&mut self, r: Routing) {
        let w = r.candidate_weight_bp;
        if w != self.routing.candidate_weight_bp {
            self.share = if self.per_request {
                f64::from(w) / 10_000.0
            } else if self.users.is_empty() {
                self.keys.share(w)
            } else {
                users::volume_share(&self.users, |u| u.bucket < w)
            };
            (self.candidate_crowd, self.champion_crowd) = crowds(&self.users, self.per_request, w);
        }
        self.routing = r;
    }
}

/// The users each arm serves at `weight_bp`: the candidate's and the
/// champion's.
fn crowds(users: &[User], per_request: bool, weight_bp: u32) -> (Option<Crowd>, Option<Crowd>) {
    let to_candidate = |u: &User| !per_request && u.bucket < weight_bp;
    (
        Crowd::of(users, |u| per_request || to_candidate(u), per_request),
        Crowd::of(users, |u| per_request || !to_candidate(u), per_request),
    )
}

/// The simulated gateways: their counts, the requests still in flight, and
/// the restarts to come.
struct Fleet {
    gws: Vec<SimGateway>,
    pending: VecDeque<Pending>,
    /// Seconds at which gateway 0 restarts, in order.
    restarts: Peekable<std::vec::IntoIter<u64>>,
}

impl Fleet {
    fn new(scenario: &Scenario) -> Self {
        let gateways = scenario.gateways.max(1) as usize;
        let mut restarts = scenario.gateway_restarts.clone();
        restarts.sort_unstable();
        Fleet {
            gws: (0..gateways).map(|_| SimGateway::default()).collect(),
            pending: VecDeque::new(),
            restarts: restarts.into_iter().peekable(),
        }
    }

    /// Gateway 0 restarts as often as it was due to by `second`: its
    /// counters start again from zero.
    fn restart_due(&mut self, second: u64) {
        while self.restarts.next_if(|&r| r <= second).is_some() {
            let g = &mut self.gws[0];
            g.boot += 1;
            g.epochs.clear();
        }
    }

    /// Serves a tick's `n` arrivals, each gateway drawing its share, and
    /// queues what completes later; returns the candidate's live and
    /// mirrored requests among them.
    fn serve(&mut self, rng: &mut Rng, tick: &Tick, mut n: u64, now: Duration) -> (u64, u64) {
        let gateways = self.gws.len();
        let (mut live, mut mirrored) = (0, 0);
        let epoch = tick.routing.epoch;
        for (g, gw) in self.gws.iter_mut().enumerate() {
            let here = binomial(rng, n, 1.0 / (gateways - g) as f64);
            n -= here;
            let served = serve_gateway(rng, tick, gw.epochs.entry(epoch).or_default(), here);
            live += served.live;
            mirrored += served.mirrored;
            let scenario = tick.scenario;
            for (counts, after) in [
                (served.later, scenario.success_delay),
                (served.hung, scenario.timeout),
            ] {
                if !counts.is_empty() {
                    self.pending.push_back(Pending {
                        due: now + after,
                        gateway: g,
                        boot: gw.boot,
                        epoch,
                        counts,
                    });
                }
            }
        }
        (live, mirrored)
    }

    /// Completions that are due at `now`, recorded into their gateway's
    /// epoch unless it restarted since.
    fn complete_due(&mut self, now: Duration) {
        // The two delays are fixed, so the queue is sorted up to the
        // interleaving of its two kinds.
        if !self.pending.is_empty() {
            let (due, rest): (Vec<Pending>, Vec<Pending>) =
                self.pending.drain(..).partition(|p| p.due <= now);
            self.pending.extend(rest);
            for p in due {
                let gw = &mut self.gws[p.gateway];
                if gw.boot == p.boot {
                    gw.epochs.entry(p.epoch).or_default().merge(&p.counts);
                }
            }
        }
    }

    /// The report at `second`: every gateway in the live set, as its own
    /// series.
    fn exposure(&self, scenario: &Scenario, second: u64) -> Exposure {
        let gateways = self.gws.len();
        let flapping = |g: usize| {
            g + 1 == gateways
                && gateways > 1
                && scenario.flap_every.is_some_and(|every| {
                    let every = every.max(1);
                    second >= every && second % every < scenario.flap_for
                })
        };
        let mut exposure = Exposure::default();
        for (g, gw) in self.gws.iter().enumerate().filter(|(g, _)| !flapping(*g)) {
            exposure = exposure.with_epochs(format!("gw{g}/{}", gw.boot), gw.epochs.clone());
        }
        exposure
    }

    /// Everything every gateway has counted (what the model servers'
    /// counters see).
    fn counts(&self) -> impl Iterator<Item = &Snapshot> {
        self.gws.iter().flat_map(|g| g.epochs.values())
    }
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

#[cfg(test)]
mod tests;
