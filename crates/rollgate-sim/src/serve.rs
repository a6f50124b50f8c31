//! How one tick's requests are served and recorded: each gateway's share
//! split between the arms and the mirror, each request's outcome (failure,
//! timeout, refusal, latency, answer) drawn in aggregate for users all
//! alike or one by one for users who differ, and recorded where a gateway
//! records it — at once, or when the request completes.

use rollgate_core::{FailureClass, Routing, Snapshot};

use crate::draw::{Rng, binomial};
use crate::scenario::{CANDIDATE, CHAMPION, Scenario};
use crate::traffic::Arm;
use crate::users::{self, Crowd, UnitAcc, User, any_unit, uniform};

/// One tick's traffic conditions, the same on every gateway.
pub(crate) struct Tick<'a> {
    pub(crate) scenario: &'a Scenario,
    /// The routing in force: requests arrive under its epoch.
    pub(crate) routing: Routing,
    /// The probability that a live request goes to the candidate.
    pub(crate) share: f64,
    pub(crate) champion: &'a Arm,
    /// The candidate as it behaves this second.
    pub(crate) candidate: &'a Arm,
    /// Both arms fail every request.
    pub(crate) outage: bool,
    /// Shared latency factor (1 = none).
    pub(crate) slowdown: f64,
    /// Who sends the candidate's live requests, and the champion's (and
    /// the mirror's).
    pub(crate) to_cand: Senders<'a>,
    pub(crate) to_champ: Senders<'a>,
    /// Successes complete later (a slow model).
    pub(crate) delayed: bool,
    /// Some requests hang until the timeout.
    pub(crate) hanging: bool,
}

/// What one gateway served in a tick.
pub(crate) struct Served {
    /// The candidate's live requests.
    pub(crate) live: u64,
    /// Requests mirrored to the candidate.
    pub(crate) mirrored: u64,
    /// Counts of successes that complete after `success_delay`.
    pub(crate) later: Snapshot,
    /// Counts of hung requests, which fail at the `timeout`.
    pub(crate) hung: Snapshot,
}

/// Serves one gateway's `here` requests of `tick`: split between the
/// candidate's live share, the champion and the mirror, recorded into
/// `counts` (the gateway's counts for the routing epoch of arrival) except
/// those that complete later, which are returned.
pub(crate) fn serve_gateway(
    rng: &mut Rng,
    tick: &Tick,
    counts: &mut Snapshot,
    here: u64,
) -> Served {
    let Tick {
        scenario,
        champion,
        candidate,
        outage,
        to_cand,
        to_champ,
        ..
    } = *tick;
    let to_candidate = binomial(rng, here, tick.share);
    let to_champion = here - to_candidate;
    let mirror = binomial(
        rng,
        to_champion,
        f64::from(tick.routing.mirror_bp) / 10_000.0,
    );
    let (mut later, mut hung) = (Snapshot::default(), Snapshot::default());
    let mut sinks = Sinks {
        now: counts,
        later: tick.delayed.then_some(&mut later),
        hung: tick.hanging.then_some(&mut hung),
        timeout_rate: scenario.timeout_rate,
        slowdown: tick.slowdown,
    };
    serve(
        rng,
        &mut sinks,
        CANDIDATE,
        candidate,
        to_candidate,
        outage,
        to_cand,
    );
    serve(
        rng,
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
        rng, &mut sinks, CHAMPION, champion, mirror, outage, to_champ,
    );
    let pairs = serve(
        rng,
        &mut sinks,
        CANDIDATE,
        candidate,
        champion_ok,
        outage,
        to_champ,
    );
    serve(
        rng,
        &mut sinks,
        CANDIDATE,
        candidate,
        mirror - champion_ok,
        outage,
        to_champ,
    );
    let pair_sink = sinks.later.as_deref_mut().unwrap_or(sinks.now);
    record_pairs(rng, pair_sink, scenario, pairs);
    Served {
        live: to_candidate,
        mirrored: mirror,
        later,
        hung,
    }
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

/// Who a serve call's requests come from.
#[derive(Clone, Copy)]
pub(crate) enum Senders<'a> {
    /// Users all alike: outcomes drawn in aggregate, unit groups uniform.
    Alike,
    /// Users who differ: each request from a user drawn by volume.
    Crowd(&'a Crowd, &'a [User]),
}

impl<'a> Senders<'a> {
    pub(crate) fn of(crowd: Option<&'a Crowd>, users: &'a [User]) -> Self {
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
    // Class "fraud" answers drawn per request for users with their own
    // class mix; the rest of the successes take the arm's share.
    let mut own_class = (0, 0);
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
            let (n, classes) = serve_crowd(
                rng,
                sinks,
                rev,
                arm,
                (count, outage, p_hang),
                (crowd, users),
                &mut units,
            );
            own_class = classes;
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
    let fraud = own_class.1 + binomial(rng, successes - own_class.0, arm.model.fraud);
    stats.record_predictions("fraud", fraud);
    stats.record_predictions("ok", successes - fraud);
    successes
}

/// Serves `count` requests of users who differ, one at a time: its user,
/// then its outcome. Returns the successes, and of them those whose class
/// was drawn from the user's own mix with how many were "fraud".
fn serve_crowd(
    rng: &mut Rng,
    sinks: &mut Sinks,
    rev: &str,
    arm: &Arm,
    (count, outage, p_hang): (u64, bool, f64),
    (crowd, users): (&Crowd, &[User]),
    units: &mut UnitAcc,
) -> (u64, (u64, u64)) {
    let mut own_class = (0, 0);
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
        } else if outage || uniform(rng) < 1.0 - (1.0 - user.failure) * (1.0 - arm.model.failure) {
            n_failed += 1;
            failed.failures(unit, 1);
        } else {
            let b = arm.latency.alias.sample(rng);
            let v = (arm.latency.values[b] as f64 * user.latency * f) as u64;
            let l = arm.latency.logs[b] as i64 + user.latency_log + f_log;
            latencies.push(v.max(1));
            units.success(unit, l.max(0) as u64);
            if user.class_factor != 1.0 {
                own_class.0 += 1;
                let p = (arm.model.fraud * user.class_factor).min(1.0);
                own_class.1 += u64::from(uniform(rng) < p);
            }
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
    (n, own_class)
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
