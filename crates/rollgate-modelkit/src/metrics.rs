//! The model server's Prometheus metrics, in the shape MLServer exposes
//! (checked against a running MLServer by `tests/metrics.rs`), so a
//! rollout whose evidence is read from Prometheus can run against
//! `rollgate serve` as against a real model server: per-model success and
//! failure counters, and per-endpoint request counts and latency
//! histograms with MLServer's buckets.
//!
//! One difference, on purpose: MLServer's `model_infer_request_duration`
//! is a summary (count and sum only); here it is a histogram, whose
//! `_count` and `_sum` answer the same queries and whose buckets can be
//! summed across servers.

use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// MLServer's REST latency buckets, in seconds.
const BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelLabels {
    model: String,
    version: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RestLabels {
    app_name: String,
    method: String,
    /// The route's template (`/v2/models/{model_name}/infer`), not the path.
    path: String,
    status_code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabels {
    app_name: String,
    method: String,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

fn histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

/// The server's metrics.
pub struct ServerMetrics {
    registry: Mutex<Registry>,
    success: Family<ModelLabels, Counter>,
    failure: Family<ModelLabels, Counter>,
    infer_duration: Histograms<ModelLabels>,
    requests: Family<RestLabels, Counter>,
    request_duration: Histograms<RestLabels>,
    in_progress: Family<MethodLabels, Gauge>,
}

impl std::fmt::Debug for ServerMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerMetrics").finish_non_exhaustive()
    }
}

impl Default for ServerMetrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let success = Family::<ModelLabels, Counter>::default();
        let failure = Family::<ModelLabels, Counter>::default();
        let infer_duration: Histograms<ModelLabels> = Family::new_with_constructor(histogram);
        let requests = Family::<RestLabels, Counter>::default();
        let request_duration: Histograms<RestLabels> = Family::new_with_constructor(histogram);
        registry.register(
            "model_infer_request_success",
            "Model infer request success count",
            success.clone(),
        );
        registry.register(
            "model_infer_request_failure",
            "Model infer request failure count",
            failure.clone(),
        );
        registry.register(
            "model_infer_request_duration",
            "Model infer request duration",
            infer_duration.clone(),
        );
        registry.register(
            "rest_server_requests",
            "Total number of requests",
            requests.clone(),
        );
        registry.register(
            "rest_server_request_duration_seconds",
            "Duration of requests in seconds",
            request_duration.clone(),
        );
        let in_progress = Family::<MethodLabels, Gauge>::default();
        registry.register(
            "rest_server_requests_in_progress",
            "Requests in progress",
            in_progress.clone(),
        );
        ServerMetrics {
            registry: Mutex::new(registry),
            in_progress,
            success,
            failure,
            infer_duration,
            requests,
            request_duration,
        }
    }
}

impl ServerMetrics {
    /// A request of `method` begins; [`ServerMetrics::record`] ends it.
    pub fn begin(&self, method: &str) {
        self.in_progress
            .get_or_create(&MethodLabels {
                app_name: "rollgate".into(),
                method: method.into(),
            })
            .inc();
    }

    /// One request (begun with [`ServerMetrics::begin`]) to `route` (a
    /// template) answered `status` after `took`;
    /// an inference of `model` also counts as its success or failure.
    pub fn record(
        &self,
        model: Option<&str>,
        method: &str,
        route: &str,
        status: u16,
        took: Duration,
    ) {
        let rest = RestLabels {
            app_name: "rollgate".into(),
            method: method.into(),
            path: route.into(),
            status_code: status.to_string(),
        };
        self.in_progress
            .get_or_create(&MethodLabels {
                app_name: "rollgate".into(),
                method: method.into(),
            })
            .dec();
        self.requests.get_or_create(&rest).inc();
        self.request_duration
            .get_or_create(&rest)
            .observe(took.as_secs_f64());
        if let Some(model) = model {
            let m = ModelLabels {
                model: model.into(),
                version: "None".into(),
            };
            if (200..300).contains(&status) {
                self.success.get_or_create(&m).inc();
            } else {
                self.failure.get_or_create(&m).inc();
            }
            self.infer_duration
                .get_or_create(&m)
                .observe(took.as_secs_f64());
        }
    }

    /// The registry as the scraper's `Accept` asks: body and content type.
    pub fn expose(&self, accept: Option<&str>) -> (String, &'static str) {
        let registry = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        rollgate_process::expose(&registry, accept)
    }
}
