//! What a simulation is asked to run: the two arms, the traffic and its
//! faults (outages, timeouts, restarts, drift), and what a correct gate
//! does with it. Plain data, read from the committed scenario files.

use std::time::Duration;

use rollgate_core::Plan;
use serde::{Deserialize, Serialize};

use crate::users::{Assignment, Users};

/// The champion's revision name in every simulated rollout.
pub const CHAMPION: &str = "champion";
/// The candidate's revision name in every simulated rollout.
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
    /// Traffic on for this many seconds, then off as long, and so on (a
    /// batch client, a business-hours tenant).
    pub on_off: Option<u64>,
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

impl Default for Scenario {
    fn default() -> Self {
        Scenario::identical("unnamed", 100.0)
    }
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
            on_off: None,
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
    pub(crate) fn at(&self, t: f64) -> f64 {
        if t <= self.from_s {
            1.0
        } else if t >= self.to_s {
            self.factor
        } else {
            1.0 + (self.factor - 1.0) * (t - self.from_s) / (self.to_s - self.from_s)
        }
    }
}

/// How the model servers are scraped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ScrapeModel {
    /// Prometheus's scrape interval.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// The model's `horizon_ms`: how long after an epoch began its counts
    /// start.
    #[serde(with = "humantime_serde")]
    pub horizon: Duration,
    /// Seconds at which the candidate's model server restarts: its
    /// counters start again from zero.
    pub target_restarts: Vec<u64>,
    /// Seconds `[from, to)` during which the candidate's target is not
    /// scraped (it went stale; `to` past the run's end: it disappeared).
    pub stale: Option<(u64, u64)>,
    /// Seconds `[from, to)` during which nothing is scraped (Prometheus
    /// paused).
    pub paused: Option<(u64, u64)>,
}

impl Default for ScrapeModel {
    fn default() -> Self {
        ScrapeModel {
            interval: Duration::from_secs(15),
            horizon: Duration::from_secs(35),
            target_restarts: Vec::new(),
            stale: None,
            paused: None,
        }
    }
}
