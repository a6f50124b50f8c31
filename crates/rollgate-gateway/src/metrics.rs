//! Prometheus exposition, rendered from one stats snapshot at scrape time:
//! the hot path records once (into the sharded recorders) and scrapes read
//! the same numbers the controller sees.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use std::collections::BTreeSet;

use crate::{GatewaySnapshot, Inner};

/// A snapshot, and the `(model, revision)` pairs routed now: only their
/// series are exported.
#[derive(Debug)]
struct SnapshotCollector(GatewaySnapshot, BTreeSet<(String, String)>);

/// Bucket bounds of the latency histograms, in seconds (Prometheus's
/// defaults): fixed, so every gateway's series can be summed in PromQL.
const LATENCY_BOUNDS_S: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// A revision's latency as a Prometheus histogram, read off the recorder's
/// fine log-linear buckets (each counted at its upper edge, so `_sum` and
/// the bucket a value lands in are exact to that resolution, about 1%).
#[derive(Debug)]
struct LatencyBuckets {
    sum_s: f64,
    count: u64,
    /// `(upper bound, count in this bucket)`, the last one `+Inf`.
    buckets: Vec<(f64, u64)>,
}

impl LatencyBuckets {
    fn of(h: &rollgate_core::LatencyHistogram) -> LatencyBuckets {
        let mut buckets: Vec<(f64, u64)> = LATENCY_BOUNDS_S
            .iter()
            .map(|&b| (b, 0))
            .chain(std::iter::once((f64::MAX, 0)))
            .collect();
        let (mut sum_s, mut count) = (0.0, 0);
        for (value_us, n) in h.buckets() {
            let v = value_us as f64 / 1e6;
            sum_s += v * n as f64;
            count += n;
            let i = LATENCY_BOUNDS_S
                .iter()
                .position(|&b| v <= b)
                .unwrap_or(LATENCY_BOUNDS_S.len());
            buckets[i].1 += n;
        }
        LatencyBuckets {
            sum_s,
            count,
            buckets,
        }
    }
}

impl EncodeMetric for LatencyBuckets {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_histogram::<NoLabelSet>(self.sum_s, self.count, &self.buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

type Labels = Vec<(&'static str, String)>;

fn family<M: EncodeMetric>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: Vec<(Labels, M)>,
) -> Result<(), std::fmt::Error> {
    if rows.is_empty() {
        return Ok(());
    }
    let metric_type = rows[0].1.metric_type();
    let mut m = enc.encode_descriptor(name, help, None, metric_type)?;
    for (labels, metric) in rows {
        metric.encode(m.encode_family(&labels)?)?;
    }
    Ok(())
}

impl Collector for SnapshotCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        RevisionRows::of(&self.0, &self.1).encode(&mut enc)?;
        encode_gateway_families(&self.0, &mut enc)
    }
}

/// The rows of each revision's families (and each shadow's pairs), for the
/// `(model, revision)` pairs routed now.
struct RevisionRows {
    requests: Vec<(Labels, ConstCounter)>,
    failures: Vec<(Labels, ConstCounter)>,
    client_errors: Vec<(Labels, ConstCounter)>,
    latency: Vec<(Labels, LatencyBuckets)>,
    pairs: Vec<(Labels, ConstCounter)>,
    agreements: Vec<(Labels, ConstCounter)>,
    flips: Vec<(Labels, ConstCounter)>,
    drops: Vec<(Labels, ConstCounter)>,
}

impl RevisionRows {
    fn of(s: &GatewaySnapshot, routed_now: &BTreeSet<(String, String)>) -> RevisionRows {
        let rev =
            |model: &str, r: &str| vec![("model", model.to_string()), ("revision", r.to_string())];
        let mut requests = Vec::new();
        let mut failures = Vec::new();
        let mut client_errors = Vec::new();
        let mut latency = Vec::new();
        let mut pairs = Vec::new();
        let mut agreements = Vec::new();
        let mut flips = Vec::new();
        let mut drops = Vec::new();
        let routed = |model: &String, r: &String| routed_now.contains(&(model.clone(), r.clone()));
        for (model, snap) in &s.models {
            for (r, st) in snap.revisions().iter().filter(|(r, _)| routed(model, r)) {
                requests.push((rev(model, r), ConstCounter::new(st.requests())));
                client_errors.push((rev(model, r), ConstCounter::new(st.client_errors())));
                for class in rollgate_core::FailureClass::ALL {
                    let mut l = rev(model, r);
                    l.push(("class", class.as_str().to_string()));
                    failures.push((l, ConstCounter::new(st.failures().get(class))));
                }
                latency.push((rev(model, r), LatencyBuckets::of(st.latency())));
            }
            for (shadow, p) in snap.pairs().iter().filter(|(r, _)| routed(model, r)) {
                pairs.push((rev(model, shadow), ConstCounter::new(p.pairs())));
                agreements.push((rev(model, shadow), ConstCounter::new(p.agreements())));
                flips.push((rev(model, shadow), ConstCounter::new(p.confident_flips())));
                drops.push((rev(model, shadow), ConstCounter::new(p.mirror_dropped())));
            }
        }
        RevisionRows {
            requests,
            failures,
            client_errors,
            latency,
            pairs,
            agreements,
            flips,
            drops,
        }
    }

    fn encode(self, enc: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        family(
            enc,
            "rollgate_requests",
            "Requests counted for a revision (successes and failures).",
            self.requests,
        )?;
        family(
            enc,
            "rollgate_failures",
            "Failures counted against a revision, by class.",
            self.failures,
        )?;
        family(
            enc,
            "rollgate_client_errors",
            "Client errors (4xx), never counted against a revision.",
            self.client_errors,
        )?;
        family(
            enc,
            "rollgate_latency_seconds",
            "Latency of successes since start.",
            self.latency,
        )?;
        family(
            enc,
            "rollgate_shadow_pairs",
            "Mirrored requests answered by both champion and shadow.",
            self.pairs,
        )?;
        family(
            enc,
            "rollgate_shadow_agreements",
            "Pairs whose answers agreed.",
            self.agreements,
        )?;
        family(
            enc,
            "rollgate_shadow_confident_flips",
            "Disagreements on the champion's high-confidence answers.",
            self.flips,
        )?;
        family(
            enc,
            "rollgate_mirror_dropped",
            "Mirrors dropped because the mirror pool was full.",
            self.drops,
        )?;
        Ok(())
    }
}

/// The gateway's own families: fallbacks and pins per model, its refusals
/// and retries, the models it cannot route, requests in flight.
fn encode_gateway_families(
    s: &GatewaySnapshot,
    enc: &mut DescriptorEncoder,
) -> Result<(), std::fmt::Error> {
    let fallbacks = s
        .fallbacks
        .iter()
        .map(|(m, n)| (vec![("model", m.clone())], ConstCounter::new(*n)))
        .collect();
    family(
        enc,
        "rollgate_fallbacks",
        "Unreachable-candidate requests retried on the champion.",
        fallbacks,
    )?;
    let pinned = s
        .pinned
        .iter()
        .flat_map(|(m, revs)| {
            revs.iter().map(move |(r, n)| {
                (
                    vec![("model", m.clone()), ("revision", r.clone())],
                    ConstCounter::new(*n),
                )
            })
        })
        .collect();
    family(
        enc,
        "rollgate_pinned_requests",
        "Requests a tester pinned to a revision (served; never evidence for a gate).",
        pinned,
    )?;
    family(
        enc,
        "rollgate_overloaded",
        "Requests refused at capacity (503).",
        vec![(vec![], ConstCounter::new(s.overloaded))],
    )?;
    family(
        enc,
        "rollgate_upstream_retries",
        "Requests sent again because the upstream closed a pooled connection before answering.",
        vec![(vec![], ConstCounter::new(s.retried))],
    )?;
    family(
        enc,
        "rollgate_slow_clients",
        "Requests whose body did not arrive within the body timeout (408).",
        vec![(vec![], ConstCounter::new(s.slow_clients))],
    )?;
    family(
        enc,
        "rollgate_streamed_requests",
        "Requests whose body was beyond the body limit and was streamed to the revision serving it.",
        vec![(vec![], ConstCounter::new(s.streamed_requests))],
    )?;
    family(
        enc,
        "rollgate_answers_dropped",
        "Answers recorded for labels dropped before the store could take them (the queue was full).",
        vec![(vec![], ConstCounter::new(s.answers_dropped))],
    )?;
    family(
        enc,
        "rollgate_wrong_protocol",
        "Requests in another protocol than their model's (400, never forwarded).",
        vec![(vec![], ConstCounter::new(s.wrong_protocol))],
    )?;
    let unroutable = s
        .unroutable
        .keys()
        .map(|m| (vec![("model", m.clone())], ConstGauge::new(1i64)))
        .collect();
    family(
        enc,
        "rollgate_model_unroutable",
        "Models the gateway cannot route (1 while so; see the log or /rollgate/stats for why).",
        unroutable,
    )?;
    family(
        enc,
        "rollgate_in_flight",
        "Requests in flight.",
        vec![(vec![], ConstGauge::new(s.in_flight))],
    )?;
    Ok(())
}

pub(crate) fn expose(inner: &Inner, accept: Option<&str>) -> (String, &'static str) {
    let mut registry = Registry::default();
    let routed = inner.routes.load().routed();
    registry.register_collector(Box::new(SnapshotCollector(inner.snapshot(), routed)));
    rollgate_process::register(&mut registry);
    rollgate_process::expose(&registry, accept)
}
