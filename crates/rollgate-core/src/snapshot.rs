//! The gateway's measurements, as plain data.
//!
//! Every counter is cumulative since the gateway started, so snapshots are
//! **mergeable** (two replicas add up to the snapshot of the union) and
//! **diffable** (a window is a later snapshot minus an earlier one). A rate is
//! only ever computed from one snapshot, taken at one instant, and the types
//! enforce `failures <= requests`: a rate can never exceed 1. (The field
//! bug this prevents: a 1.0016 error rate from two Prometheus queries taken a
//! moment apart.)

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::histogram::{HistogramError, LatencyHistogram};
use crate::unit::{RequestMoments, UnitTotals, Units};

/// A snapshot broke one of its invariants, or a window went backwards.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SnapshotError {
    #[error("{what}: {part} ({part_count}) exceeds {whole} ({whole_count})")]
    Inconsistent {
        what: String,
        part: &'static str,
        part_count: u64,
        whole: &'static str,
        whole_count: u64,
    },
    #[error("{what}: counter {field} went backwards (a gateway restarted?)")]
    CounterReset { what: String, field: &'static str },
    #[error("{what}: {source}")]
    Histogram {
        what: String,
        #[source]
        source: HistogramError,
    },
}

/// Why a request counted against a revision failed. A client's bad request
/// is not here: it is not the revision's fault (see
/// [`RevisionStats::client_errors`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureClass {
    /// The upstream answered 5xx.
    Upstream5xx,
    /// The upstream did not answer in time.
    Timeout,
    /// The upstream could not be reached.
    Connect,
    /// The upstream answered 2xx with output the protocol cannot read.
    InvalidOutput,
}

impl FailureClass {
    pub const ALL: [FailureClass; 4] = [
        FailureClass::Upstream5xx,
        FailureClass::Timeout,
        FailureClass::Connect,
        FailureClass::InvalidOutput,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FailureClass::Upstream5xx => "upstream_5xx",
            FailureClass::Timeout => "timeout",
            FailureClass::Connect => "connect",
            FailureClass::InvalidOutput => "invalid_output",
        }
    }
}

/// Failures counted against a revision, by class.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailureCounts {
    #[serde(default)]
    pub upstream_5xx: u64,
    #[serde(default)]
    pub timeout: u64,
    #[serde(default)]
    pub connect: u64,
    #[serde(default)]
    pub invalid_output: u64,
}

impl FailureCounts {
    pub fn total(&self) -> u64 {
        self.upstream_5xx + self.timeout + self.connect + self.invalid_output
    }

    pub fn get(&self, class: FailureClass) -> u64 {
        match class {
            FailureClass::Upstream5xx => self.upstream_5xx,
            FailureClass::Timeout => self.timeout,
            FailureClass::Connect => self.connect,
            FailureClass::InvalidOutput => self.invalid_output,
        }
    }

    fn slot(&mut self, class: FailureClass) -> &mut u64 {
        match class {
            FailureClass::Upstream5xx => &mut self.upstream_5xx,
            FailureClass::Timeout => &mut self.timeout,
            FailureClass::Connect => &mut self.connect,
            FailureClass::InvalidOutput => &mut self.invalid_output,
        }
    }

    pub fn add(&mut self, class: FailureClass, n: u64) {
        *self.slot(class) += n;
    }
}

/// One revision's measurements. Fields are private so that every value in
/// existence satisfies the invariants; build one with the `record_*` methods
/// or [`RevisionStats::from_parts`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RevisionStatsWire", into = "RevisionStatsWire")]
pub struct RevisionStats {
    requests: u64,
    /// Requests sent to the revision, counted when they arrive (before any
    /// outcome): `arrived − requests − client_errors` is what has no
    /// outcome yet (in flight, or abandoned). Not checked against
    /// `requests`: shards record arrival and outcome apart.
    arrived: u64,
    failures: FailureCounts,
    client_errors: u64,
    latency: LatencyHistogram,
    predictions: BTreeMap<String, u64>,
    /// The same outcomes by unit group of the request's key (see
    /// [`crate::unit`]): what the tests' design effects are estimated
    /// from. Empty from a source that does not group (then `D = 1`).
    units: Units,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RevisionStatsWire {
    requests: u64,
    #[serde(default)]
    arrived: u64,
    #[serde(default)]
    failures: FailureCounts,
    #[serde(default)]
    client_errors: u64,
    #[serde(default)]
    latency: LatencyHistogram,
    #[serde(default)]
    predictions: BTreeMap<String, u64>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    units: Units,
}

impl TryFrom<RevisionStatsWire> for RevisionStats {
    type Error = SnapshotError;
    fn try_from(w: RevisionStatsWire) -> Result<Self, SnapshotError> {
        let mut s = RevisionStats::from_parts(
            w.requests,
            w.failures,
            w.client_errors,
            w.latency,
            w.predictions,
        )?;
        s.arrived = w.arrived;
        s.units = w.units;
        Ok(s)
    }
}

impl From<RevisionStats> for RevisionStatsWire {
    fn from(s: RevisionStats) -> Self {
        RevisionStatsWire {
            requests: s.requests,
            arrived: s.arrived,
            failures: s.failures,
            client_errors: s.client_errors,
            latency: s.latency,
            predictions: s.predictions,
            units: s.units,
        }
    }
}

impl RevisionStats {
    /// Builds stats from counters, checking `failures <= requests` and
    /// `latency samples <= successes`.
    pub fn from_parts(
        requests: u64,
        failures: FailureCounts,
        client_errors: u64,
        latency: LatencyHistogram,
        predictions: BTreeMap<String, u64>,
    ) -> Result<Self, SnapshotError> {
        let s = RevisionStats {
            requests,
            arrived: 0,
            failures,
            client_errors,
            latency,
            predictions,
            units: Units::new(),
        };
        s.check(&"revision")?;
        Ok(s)
    }

    fn check(&self, what: &dyn std::fmt::Display) -> Result<(), SnapshotError> {
        if self.failures.total() > self.requests {
            return Err(SnapshotError::Inconsistent {
                what: what.to_string(),
                part: "failures",
                part_count: self.failures.total(),
                whole: "requests",
                whole_count: self.requests,
            });
        }
        if self.latency.len() > self.successes() {
            return Err(SnapshotError::Inconsistent {
                what: what.to_string(),
                part: "latency samples",
                part_count: self.latency.len(),
                whole: "successes",
                whole_count: self.successes(),
            });
        }
        Ok(())
    }

    /// A request that succeeded, with its latency and (if the output was
    /// read) the predicted class of each instance.
    pub fn record_success<'a>(
        &mut self,
        latency_us: u64,
        classes: impl IntoIterator<Item = &'a str>,
    ) {
        self.requests += 1;
        self.latency.record(latency_us);
        for class in classes {
            self.count_prediction(class, 1);
        }
    }

    /// A request that failed, counted against this revision.
    pub fn record_failure(&mut self, class: FailureClass) {
        self.record_failures(class, 1);
    }

    /// Successful requests with these latencies and no predictions read
    /// (aggregated recording).
    pub fn record_latencies(&mut self, latencies_us: impl IntoIterator<Item = u64>) {
        self.requests += self.latency.record_all(latencies_us);
    }

    /// Successful requests given as `(latency_us, count)`: aggregated
    /// recording, e.g. by the simulator.
    pub fn record_latency_counts(&mut self, counts: impl IntoIterator<Item = (u64, u64)>) {
        self.requests += self.latency.record_counts(counts);
    }

    /// `n` requests that failed alike (aggregated recording, e.g. by the
    /// simulator).
    pub fn record_failures(&mut self, class: FailureClass, n: u64) {
        self.requests += n;
        self.failures.add(class, n);
    }

    /// `n` more predictions of `class` from requests already recorded as
    /// successes (aggregated recording).
    pub fn record_predictions(&mut self, class: &str, n: u64) {
        if n > 0 {
            self.count_prediction(class, n);
        }
    }

    /// Adds `n` to `class`'s count; allocates only for a class not seen yet.
    fn count_prediction(&mut self, class: &str, n: u64) {
        match self.predictions.get_mut(class) {
            Some(count) => *count += n,
            None => {
                self.predictions.insert(class.to_string(), n);
            }
        }
    }

    /// The totals of unit group `unit`, for recording beside the
    /// revision's own (see [`crate::unit`]).
    pub fn unit_mut(&mut self, unit: u16) -> &mut UnitTotals {
        self.units.entry(unit).or_default()
    }

    /// Totals by unit group.
    pub fn units(&self) -> &Units {
        &self.units
    }

    /// A request the client got wrong (4xx): not counted in `requests`.
    pub fn record_client_error(&mut self) {
        self.client_errors += 1;
    }

    /// `n` requests the client got wrong (4xx).
    pub fn record_client_errors(&mut self, n: u64) {
        self.client_errors += n;
    }

    /// `n` requests sent to the revision, before their outcome is known.
    pub fn record_arrivals(&mut self, n: u64) {
        self.arrived += n;
    }

    /// Requests sent to the revision (0 from a gateway that does not count
    /// arrivals).
    pub fn arrived(&self) -> u64 {
        self.arrived
    }

    /// Requests sent with no outcome counted yet: in flight, or abandoned
    /// (a client that went away, a gateway that was killed).
    pub fn unresolved(&self) -> u64 {
        self.arrived
            .saturating_sub(self.requests + self.client_errors)
    }

    /// Requests counted for the revision: successes plus failures.
    pub fn requests(&self) -> u64 {
        self.requests
    }

    pub fn failures(&self) -> &FailureCounts {
        &self.failures
    }

    pub fn failure_count(&self) -> u64 {
        self.failures.total()
    }

    pub fn successes(&self) -> u64 {
        self.requests - self.failures.total()
    }

    /// Requests rejected as the client's fault; never held against the revision.
    pub fn client_errors(&self) -> u64 {
        self.client_errors
    }

    /// Latency of successful requests.
    pub fn latency(&self) -> &LatencyHistogram {
        &self.latency
    }

    /// Predicted class counts (one per instance).
    pub fn predictions(&self) -> &BTreeMap<String, u64> {
        &self.predictions
    }

    /// `failures / requests` of this one snapshot; `None` with no requests.
    /// Never above 1: the constructor guarantees `failures <= requests`.
    pub fn error_rate(&self) -> Option<f64> {
        (self.requests > 0).then(|| self.failures.total() as f64 / self.requests as f64)
    }

    /// Adds another replica's stats for the same revision.
    pub fn merge(&mut self, other: &RevisionStats) {
        self.requests += other.requests;
        self.arrived += other.arrived;
        for class in FailureClass::ALL {
            self.failures.add(class, other.failures.get(class));
        }
        self.client_errors += other.client_errors;
        self.latency.merge(&other.latency);
        for (class, n) in &other.predictions {
            *self.predictions.entry(class.clone()).or_default() += n;
        }
        for (u, t) in &other.units {
            self.units.entry(*u).or_default().merge(t);
        }
    }

    /// What was recorded after `earlier`. Errors if any counter went backwards.
    /// `what` names the revision in an error (formatted only then).
    pub fn window_since(
        &self,
        earlier: &RevisionStats,
        what: &dyn std::fmt::Display,
    ) -> Result<Self, SnapshotError> {
        let sub = |later: u64, earlier: u64, field: &'static str| {
            later
                .checked_sub(earlier)
                .ok_or_else(|| SnapshotError::CounterReset {
                    what: what.to_string(),
                    field,
                })
        };
        let mut failures = FailureCounts::default();
        for class in FailureClass::ALL {
            *failures.slot(class) = sub(
                self.failures.get(class),
                earlier.failures.get(class),
                class.as_str(),
            )?;
        }
        let mut predictions = BTreeMap::new();
        for (class, &n) in &self.predictions {
            let before = earlier.predictions.get(class).copied().unwrap_or(0);
            let d = sub(n, before, "predictions")?;
            if d > 0 {
                predictions.insert(class.clone(), d);
            }
        }
        if earlier
            .predictions
            .keys()
            .any(|k| !self.predictions.contains_key(k))
        {
            return Err(SnapshotError::CounterReset {
                what: what.to_string(),
                field: "predictions",
            });
        }
        let latency = self
            .latency
            .window_since(&earlier.latency)
            .map_err(|source| SnapshotError::Histogram {
                what: what.to_string(),
                source,
            })?;
        let mut units = Units::new();
        for (u, t) in &self.units {
            let d = t
                .since(earlier.units.get(u).unwrap_or(&UnitTotals::default()))
                .ok_or_else(|| SnapshotError::CounterReset {
                    what: what.to_string(),
                    field: "units",
                })?;
            if !d.is_empty() {
                units.insert(*u, d);
            }
        }
        if earlier.units.keys().any(|u| !self.units.contains_key(u)) {
            return Err(SnapshotError::CounterReset {
                what: what.to_string(),
                field: "units",
            });
        }
        let out = RevisionStats {
            units,
            requests: sub(self.requests, earlier.requests, "requests")?,
            arrived: sub(self.arrived, earlier.arrived, "arrived")?,
            failures,
            client_errors: sub(self.client_errors, earlier.client_errors, "client_errors")?,
            latency,
            predictions,
        };
        out.check(what)?;
        Ok(out)
    }
}

/// Paired champion/shadow answers to mirrored requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "PairStatsWire", into = "PairStatsWire")]
pub struct PairStats {
    pairs: u64,
    agreements: u64,
    champion_confident: u64,
    confident_flips: u64,
    mirror_dropped: u64,
    /// Per-request moments of disagreements over pairs, and of flips over
    /// confident pairs: a request's instances are one unit (see
    /// [`crate::unit`]).
    disagreement_moments: RequestMoments,
    flip_moments: RequestMoments,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PairStatsWire {
    pairs: u64,
    agreements: u64,
    champion_confident: u64,
    confident_flips: u64,
    #[serde(default)]
    mirror_dropped: u64,
    #[serde(default, skip_serializing_if = "is_default")]
    disagreement_moments: RequestMoments,
    #[serde(default, skip_serializing_if = "is_default")]
    flip_moments: RequestMoments,
}

fn is_default<T: Default + PartialEq>(t: &T) -> bool {
    *t == T::default()
}

impl TryFrom<PairStatsWire> for PairStats {
    type Error = SnapshotError;
    fn try_from(w: PairStatsWire) -> Result<Self, SnapshotError> {
        let p = PairStats {
            pairs: w.pairs,
            agreements: w.agreements,
            champion_confident: w.champion_confident,
            confident_flips: w.confident_flips,
            mirror_dropped: w.mirror_dropped,
            disagreement_moments: w.disagreement_moments,
            flip_moments: w.flip_moments,
        };
        p.check(&"pairs")?;
        Ok(p)
    }
}

impl From<PairStats> for PairStatsWire {
    fn from(p: PairStats) -> Self {
        PairStatsWire {
            pairs: p.pairs,
            agreements: p.agreements,
            champion_confident: p.champion_confident,
            confident_flips: p.confident_flips,
            mirror_dropped: p.mirror_dropped,
            disagreement_moments: p.disagreement_moments,
            flip_moments: p.flip_moments,
        }
    }
}

impl PairStats {
    fn check(&self, what: &dyn std::fmt::Display) -> Result<(), SnapshotError> {
        let bad = |part, part_count, whole, whole_count| {
            Err(SnapshotError::Inconsistent {
                what: what.to_string(),
                part,
                part_count,
                whole,
                whole_count,
            })
        };
        if self.agreements > self.pairs {
            return bad("agreements", self.agreements, "pairs", self.pairs);
        }
        if self.champion_confident > self.pairs {
            return bad(
                "champion_confident",
                self.champion_confident,
                "pairs",
                self.pairs,
            );
        }
        if self.confident_flips > self.champion_confident {
            return bad(
                "confident_flips",
                self.confident_flips,
                "champion_confident",
                self.champion_confident,
            );
        }
        // A flip is a disagreement, so flips can never outnumber disagreements.
        if self.confident_flips > self.pairs - self.agreements {
            return bad(
                "confident_flips",
                self.confident_flips,
                "disagreements",
                self.pairs - self.agreements,
            );
        }
        Ok(())
    }

    /// One paired comparison. `champion_confident`: the champion's answer
    /// had confidence at or above the high-confidence threshold. A flip is a
    /// disagreement on such a pair.
    pub fn record_pair(&mut self, agreed: bool, champion_confident: bool) {
        self.pairs += 1;
        self.agreements += u64::from(agreed);
        self.champion_confident += u64::from(champion_confident);
        self.confident_flips += u64::from(champion_confident && !agreed);
    }

    /// `n` paired comparisons alike (aggregated recording).
    pub fn record_pairs(&mut self, n: u64, agreed: bool, champion_confident: bool) {
        self.pairs += n;
        self.agreements += if agreed { n } else { 0 };
        self.champion_confident += if champion_confident { n } else { 0 };
        self.confident_flips += if champion_confident && !agreed { n } else { 0 };
    }

    /// The pairs of one mirrored request, `(agreed, champion confident)`
    /// per instance: counted per instance, and as one request for the
    /// tests' design effect.
    pub fn record_request(&mut self, instances: &[(bool, bool)]) {
        let (mut x, mut c, mut y) = (0, 0, 0);
        for &(agreed, confident) in instances {
            self.record_pair(agreed, confident);
            x += u64::from(!agreed);
            c += u64::from(confident);
            y += u64::from(confident && !agreed);
        }
        let m = instances.len() as u64;
        self.disagreement_moments.record(m, x, 1);
        self.flip_moments.record(c, y, 1);
    }

    /// `n` mirrored requests alike, each of `instances` pairs of which
    /// `disagreements` disagree, `confident` have a confident champion and
    /// `flips` of those disagree (aggregated recording, e.g. by the
    /// simulator). Counts beyond their whole are clamped.
    pub fn record_requests(
        &mut self,
        n: u64,
        instances: u64,
        disagreements: u64,
        confident: u64,
        flips: u64,
    ) {
        let c = confident.min(instances);
        let y = flips.min(c).min(disagreements);
        let unsure = (disagreements - y).min(instances - c);
        self.record_pairs(n * y, false, true);
        self.record_pairs(n * (c - y), true, true);
        self.record_pairs(n * unsure, false, false);
        self.record_pairs(n * (instances - c - unsure), true, false);
        self.disagreement_moments.record(instances, y + unsure, n);
        self.flip_moments.record(c, y, n);
    }

    /// The design effect of the disagreement rate, the request as the unit.
    pub fn disagreement_design_effect(&self) -> f64 {
        self.disagreement_moments
            .design_effect(self.pairs - self.agreements, self.pairs)
    }

    /// The design effect of the flip rate, the request as the unit.
    pub fn flip_design_effect(&self) -> f64 {
        self.flip_moments
            .design_effect(self.confident_flips, self.champion_confident)
    }

    /// A mirror request dropped because the mirror queue was full.
    pub fn record_drop(&mut self) {
        self.mirror_dropped += 1;
    }

    pub fn pairs(&self) -> u64 {
        self.pairs
    }
    pub fn agreements(&self) -> u64 {
        self.agreements
    }
    pub fn champion_confident(&self) -> u64 {
        self.champion_confident
    }
    pub fn confident_flips(&self) -> u64 {
        self.confident_flips
    }
    pub fn mirror_dropped(&self) -> u64 {
        self.mirror_dropped
    }

    pub fn merge(&mut self, o: &PairStats) {
        self.pairs += o.pairs;
        self.agreements += o.agreements;
        self.champion_confident += o.champion_confident;
        self.confident_flips += o.confident_flips;
        self.mirror_dropped += o.mirror_dropped;
        self.disagreement_moments.merge(&o.disagreement_moments);
        self.flip_moments.merge(&o.flip_moments);
    }

    pub fn window_since(
        &self,
        e: &PairStats,
        what: &dyn std::fmt::Display,
    ) -> Result<Self, SnapshotError> {
        let sub = |a: u64, b: u64, field: &'static str| {
            a.checked_sub(b).ok_or_else(|| SnapshotError::CounterReset {
                what: what.to_string(),
                field,
            })
        };
        let out = PairStats {
            pairs: sub(self.pairs, e.pairs, "pairs")?,
            agreements: sub(self.agreements, e.agreements, "agreements")?,
            champion_confident: sub(
                self.champion_confident,
                e.champion_confident,
                "champion_confident",
            )?,
            confident_flips: sub(self.confident_flips, e.confident_flips, "confident_flips")?,
            mirror_dropped: sub(self.mirror_dropped, e.mirror_dropped, "mirror_dropped")?,
            disagreement_moments: self
                .disagreement_moments
                .since(&e.disagreement_moments)
                .ok_or_else(|| SnapshotError::CounterReset {
                    what: what.to_string(),
                    field: "disagreement_moments",
                })?,
            flip_moments: self.flip_moments.since(&e.flip_moments).ok_or_else(|| {
                SnapshotError::CounterReset {
                    what: what.to_string(),
                    field: "flip_moments",
                }
            })?,
        };
        out.check(what)?;
        Ok(out)
    }
}

/// One model's measurements at one instant: stats per revision id, and
/// champion/shadow pairs keyed by the shadow revision id.
///
/// Copy-on-write: the controller clones snapshots on every look (the
/// observation, stage baselines, the sequential test's origin), so a clone
/// shares the maps and only a write to a shared snapshot copies them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(from = "SnapshotData", into = "SnapshotData")]
pub struct Snapshot {
    data: Arc<SnapshotData>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SnapshotData {
    #[serde(default)]
    revisions: BTreeMap<String, RevisionStats>,
    #[serde(default)]
    pairs: BTreeMap<String, PairStats>,
}

impl From<SnapshotData> for Snapshot {
    fn from(data: SnapshotData) -> Self {
        Snapshot {
            data: Arc::new(data),
        }
    }
}

impl From<Snapshot> for SnapshotData {
    fn from(s: Snapshot) -> Self {
        Arc::unwrap_or_clone(s.data)
    }
}

impl Snapshot {
    /// Stats per revision id.
    pub fn revisions(&self) -> &BTreeMap<String, RevisionStats> {
        &self.data.revisions
    }

    /// Paired answers per shadow revision id.
    pub fn pairs(&self) -> &BTreeMap<String, PairStats> {
        &self.data.pairs
    }

    /// Stats of one revision; a revision never seen has all-zero stats.
    pub fn revision(&self, id: &str) -> &RevisionStats {
        static NEVER_SEEN: std::sync::LazyLock<RevisionStats> =
            std::sync::LazyLock::new(RevisionStats::default);
        self.data.revisions.get(id).unwrap_or(&NEVER_SEEN)
    }

    /// Paired stats for a shadow revision, if any pair was recorded.
    pub fn pairs_for(&self, shadow: &str) -> Option<&PairStats> {
        self.data.pairs.get(shadow)
    }

    pub fn revision_mut(&mut self, id: &str) -> &mut RevisionStats {
        let data = Arc::make_mut(&mut self.data);
        // Looked up first: the common case allocates no key.
        if !data.revisions.contains_key(id) {
            data.revisions
                .insert(id.to_string(), RevisionStats::default());
        }
        data.revisions.get_mut(id).expect("inserted above")
    }

    pub fn pairs_mut(&mut self, shadow: &str) -> &mut PairStats {
        let data = Arc::make_mut(&mut self.data);
        if !data.pairs.contains_key(shadow) {
            data.pairs.insert(shadow.to_string(), PairStats::default());
        }
        data.pairs.get_mut(shadow).expect("inserted above")
    }

    /// Adds another gateway replica's snapshot.
    /// The shadow pairs alone, without any revision's counts (when the
    /// revisions are counted elsewhere).
    pub fn pairs_only(&self) -> Snapshot {
        let mut out = Snapshot::default();
        for (shadow, p) in self.pairs() {
            out.pairs_mut(shadow).merge(p);
        }
        out
    }

    pub fn merge(&mut self, other: &Snapshot) {
        for (id, s) in &other.data.revisions {
            self.revision_mut(id).merge(s);
        }
        for (id, p) in &other.data.pairs {
            self.pairs_mut(id).merge(p);
        }
    }

    /// Whether nothing at all was recorded (every counter zero).
    pub fn is_empty(&self) -> bool {
        self.data.revisions.values().all(|r| {
            r.requests == 0
                && r.arrived == 0
                && r.client_errors == 0
                && r.latency.is_empty()
                && r.predictions.values().all(|&n| n == 0)
        }) && self
            .data
            .pairs
            .values()
            .all(|p| p.pairs == 0 && p.mirror_dropped == 0)
    }

    /// The sum of several replicas' snapshots.
    pub fn merged<'a>(snapshots: impl IntoIterator<Item = &'a Snapshot>) -> Snapshot {
        let mut out = Snapshot::default();
        for s in snapshots {
            out.merge(s);
        }
        out
    }

    /// What happened between `earlier` and `self`. A revision present in
    /// `earlier` but missing now means the counters were reset.
    pub fn window_since(&self, earlier: &Snapshot) -> Result<Snapshot, SnapshotError> {
        let (now, before) = (&self.data, &earlier.data);
        for id in before.revisions.keys() {
            if !now.revisions.contains_key(id) {
                return Err(SnapshotError::CounterReset {
                    what: format!("revision {id}"),
                    field: "requests",
                });
            }
        }
        for id in before.pairs.keys() {
            if !now.pairs.contains_key(id) {
                return Err(SnapshotError::CounterReset {
                    what: format!("pairs {id}"),
                    field: "pairs",
                });
            }
        }
        let mut out = SnapshotData::default();
        for (id, later) in &now.revisions {
            let w = match before.revisions.get(id) {
                Some(e) => later.window_since(e, &format_args!("revision {id}"))?,
                None => later.clone(),
            };
            out.revisions.insert(id.clone(), w);
        }
        for (id, later) in &now.pairs {
            let w = match before.pairs.get(id) {
                Some(e) => later.window_since(e, &format_args!("pairs {id}"))?,
                None => *later,
            };
            out.pairs.insert(id.clone(), w);
        }
        Ok(out.into())
    }
}

#[cfg(test)]
mod tests;
