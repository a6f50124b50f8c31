//! Evidence from a Prometheus server: one look reads every counter of the
//! rollout's revisions as raw samples (`selector[range]`), all at one
//! shared `time=`, and hands them to `rollgate_core::scraped`, which
//! differences them per scrape target and windows them by routing epoch.
//! Any failure (Prometheus unreachable, an error, a result that is not a
//! matrix) is no evidence for the look: never health.

use std::collections::BTreeMap;
use std::time::Duration;

use rollgate_core::scraped::{self, Samples, Scrape, TargetSamples};
use rollgate_core::{Exposure, RolloutState, Timestamp};
use rollgate_store::{Model, PrometheusEvidence, Revision};
use serde::Deserialize;

use crate::http::HttpClient;

/// Why a look read nothing from Prometheus.
#[derive(Debug, thiserror::Error)]
pub enum PromError {
    #[error("Prometheus at {0} did not answer")]
    Unreachable(String),
    #[error("Prometheus answered {status} to {query:?}: {body}")]
    Refused {
        status: u16,
        query: String,
        body: String,
    },
    #[error("Prometheus's answer to {query:?} is not a range vector: {why}")]
    Unreadable { query: String, why: String },
    #[error("{0}")]
    Token(String),
}

/// What Prometheus holds for `revisions` of `model`, per target and epoch,
/// read at `now`.
pub async fn exposure(
    http: &HttpClient,
    host: &crate::host::Host,
    cfg: &PrometheusEvidence,
    model: &Model,
    revisions: &[&Revision],
    state: &RolloutState,
    now: Timestamp,
) -> Result<Exposure, PromError> {
    let windows = scraped::windows(&state.epoch_began, Duration::from_millis(cfg.horizon_ms));
    let Some(earliest) = windows.iter().map(|w| w.from).min() else {
        return Ok(Exposure::default());
    };
    if earliest > now {
        // Still within the horizon: nothing that could be counted yet.
        return Ok(Exposure::default());
    }
    let token = host
        .prometheus_token(&model.name, cfg)
        .map_err(|e| PromError::Token(e.to_string()))?;
    // The range reaches back to the earliest window's start (and a scrape
    // before it, harmlessly: samples before a window are not counted).
    let range_s = now.since(earliest).as_millis().div_ceil(1000) as u64
        + cfg.scrape_interval_ms.div_ceil(1000);
    let look = Look {
        http,
        cfg,
        token: token.as_deref(),
        time: format!("{}.{:03}", now.0 / 1000, now.0 % 1000),
        range: format!("[{range_s}s]"),
    };
    let mut scrape = Scrape::new();
    for rev in revisions {
        let served = rev.spec.served_name.as_deref().unwrap_or(&model.name);
        let instance = rev
            .spec
            .upstream
            .parse::<http::Uri>()
            .ok()
            .and_then(|u| u.authority().map(|a| a.to_string()))
            .unwrap_or_default();
        let fill = |selector: &str| {
            selector
                .replace("$served_name", served)
                .replace("$instance", &instance)
                .replace("$revision", &rev.id)
                .replace("$model", &model.name)
        };
        let mut targets: BTreeMap<String, TargetSamples> = BTreeMap::new();
        for (labels, samples) in look.read(&fill(&cfg.successes)).await? {
            let t = targets.entry(target(&labels, cfg)).or_default();
            t.successes.push(samples);
        }
        for (labels, samples) in look.read(&fill(&cfg.failures)).await? {
            let t = targets.entry(target(&labels, cfg)).or_default();
            t.failures.push(samples);
        }
        if let Some(buckets) = &cfg.latency_buckets {
            for (labels, samples) in look.read(&fill(buckets)).await? {
                let le = labels.get("le").map_or(f64::NAN, |v| parse_float(v));
                let le = cfg.latency_unit.seconds(le);
                let t = targets.entry(target(&labels, cfg)).or_default();
                t.latency_buckets.push((le, samples));
            }
        }
        scrape.insert(rev.id.clone(), targets);
    }
    // Every series must reach within two scrape intervals of the look.
    let look = scraped::Look {
        now,
        fresh: Duration::from_millis(2 * cfg.scrape_interval_ms),
    };
    Ok(scraped::exposure(&scrape, &windows, look))
}

/// A scrape target's name: its identifying labels, in the configured order.
fn target(labels: &BTreeMap<String, String>, cfg: &PrometheusEvidence) -> String {
    cfg.target_labels
        .iter()
        .map(|l| format!("{l}={:?}", labels.get(l).map_or("", String::as_str)))
        .collect::<Vec<_>>()
        .join(",")
}

/// Prometheus writes sample values and `le` as strings (`"+Inf"`, `"NaN"`).
fn parse_float(v: &str) -> f64 {
    match v {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        _ => v.parse().unwrap_or(f64::NAN),
    }
}

/// One look's shared parameters.
struct Look<'a> {
    http: &'a HttpClient,
    cfg: &'a PrometheusEvidence,
    token: Option<&'a str>,
    time: String,
    range: String,
}

#[derive(Deserialize)]
struct Answer {
    status: String,
    #[serde(default)]
    data: Option<Data>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Data {
    result_type: String,
    result: Vec<Series>,
}

#[derive(Deserialize)]
struct Series {
    metric: BTreeMap<String, String>,
    #[serde(default)]
    values: Vec<(f64, String)>,
}

impl Look<'_> {
    /// The raw samples of every series `selector` matches, over the look's
    /// range ending at its time.
    async fn read(
        &self,
        selector: &str,
    ) -> Result<Vec<(BTreeMap<String, String>, Samples)>, PromError> {
        let query = format!("{selector}{}", self.range);
        let params = form_urlencoded::Serializer::new(String::new())
            .append_pair("query", &query)
            .append_pair("time", &self.time)
            .finish();
        let url = format!(
            "{}/api/v1/query?{params}",
            self.cfg.url.trim_end_matches('/')
        );
        let (status, body) = self
            .http
            .get_as(&url, self.token)
            .await
            .ok_or_else(|| PromError::Unreachable(self.cfg.url.clone()))?;
        let unreadable = |why: String| PromError::Unreadable {
            query: query.clone(),
            why,
        };
        let answer: Answer = match serde_json::from_slice(&body) {
            Ok(a) => a,
            Err(_) if status != 200 => {
                return Err(PromError::Refused {
                    status,
                    query,
                    body: String::from_utf8_lossy(&body).chars().take(300).collect(),
                });
            }
            Err(e) => return Err(unreadable(e.to_string())),
        };
        if status != 200 || answer.status != "success" {
            return Err(PromError::Refused {
                status,
                query,
                body: answer.error.unwrap_or_default(),
            });
        }
        let data = answer.data.ok_or_else(|| unreadable("no data".into()))?;
        if data.result_type != "matrix" {
            return Err(unreadable(format!("a {}", data.result_type)));
        }
        Ok(data
            .result
            .into_iter()
            .map(|s| {
                let samples = s
                    .values
                    .iter()
                    .map(|(t, v)| (Timestamp((t * 1000.0).round() as u64), parse_float(v)))
                    .collect();
                (s.metric, samples)
            })
            .collect())
    }
}
