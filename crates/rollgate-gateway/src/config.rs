//! Gateway configuration (TOML) and the routes of each model.

use std::net::SocketAddr;
use std::time::Duration;

use rollgate_core::Protocol;
use rollgate_net::{ClientTls, ListenerTls};
use serde::{Deserialize, Serialize};

/// A bad configuration or route, naming the field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("gateway config `{field}`: {message}")]
pub struct ConfigError {
    pub field: String,
    pub message: String,
}

fn err(field: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.into(),
        message: message.into(),
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GatewayConfig {
    /// This gateway's id in its stats (with a boot id drawn at start, it
    /// names one series of counts for the controller).
    pub id: String,
    pub listen: SocketAddr,
    /// The header a sticky key is read from.
    pub key_header: String,
    /// The header a tester pins a request to a revision with: its value
    /// is `candidate`, `shadow` or a revision id routed for the model.
    /// Pinned requests are served by that revision and never counted as
    /// evidence (see `ModelRoute::pinning`).
    pub pin_header: String,
    /// A cookie that pins like `pin_header` (for browsers); unset: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pin_cookie: Option<String>,
    pub limits: Limits,
    pub mirror: MirrorConfig,
    /// TLS on the listener (HTTP/2 offered by ALPN); unset: plain HTTP
    /// (HTTP/1.1, or h2c with prior knowledge).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<ListenerTls>,
    /// What `https://` upstreams are verified against, and the client
    /// certificate presented to those that ask (mTLS).
    pub upstream_tls: ClientTls,
    pub models: Vec<ModelRoute>,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig {
            id: "gateway".into(),
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            key_header: "x-rollgate-key".into(),
            pin_header: "x-rollgate-pin".into(),
            pin_cookie: None,
            limits: Limits::default(),
            mirror: MirrorConfig::default(),
            tls: None,
            upstream_tls: ClientTls::default(),
            models: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Larger request bodies get 413.
    pub max_body_bytes: usize,
    /// Larger upstream response bodies count as invalid output (502).
    pub max_response_bytes: usize,
    /// Requests in flight beyond this get 503 at once. A request takes its
    /// slot only once its body has been read.
    pub max_concurrent: usize,
    /// Default upstream timeout (504, counted as `timeout`).
    #[serde(with = "humantime_serde")]
    pub upstream_timeout: Duration,
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// How long shutdown waits for in-flight requests.
    #[serde(with = "humantime_serde")]
    pub drain_timeout: Duration,
    /// Idle upstream connections are closed after this long: below the
    /// keep-alive timeouts servers commonly use (uvicorn's is 5 s), so the
    /// gateway never reuses a connection the server is about to close.
    #[serde(with = "humantime_serde")]
    pub pool_idle_timeout: Duration,
    /// A client must send a request's headers within this long of
    /// connecting or of its previous answer, or its connection is closed:
    /// slowloris clients and idle keep-alive connections go away.
    #[serde(with = "humantime_serde")]
    pub client_header_timeout: Duration,
    /// A client must send a request's whole body within this long of its
    /// headers, or gets 408 (it never holds a capacity slot meanwhile).
    #[serde(with = "humantime_serde")]
    pub client_body_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 1 << 20,
            max_response_bytes: 16 << 20,
            max_concurrent: 4096,
            upstream_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(2),
            drain_timeout: Duration::from_secs(30),
            pool_idle_timeout: Duration::from_secs(4),
            client_header_timeout: Duration::from_secs(10),
            client_body_timeout: Duration::from_secs(30),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MirrorConfig {
    /// Mirror requests outstanding at once (queued or in flight). Beyond
    /// this, mirrors are dropped and counted: a stalled shadow costs at most
    /// this many request bodies of memory, and never a user's latency.
    pub max_outstanding: usize,
}

impl Default for MirrorConfig {
    fn default() -> Self {
        MirrorConfig {
            max_outstanding: 1024,
        }
    }
}

/// One revision's upstream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Upstream {
    /// The revision id reported in stats and the response header.
    pub revision: String,
    /// Base URL, `http://host:port` (paths are appended).
    pub url: String,
    /// Overrides the default upstream timeout.
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub timeout: Option<Duration>,
    /// The name the upstream serves the model under, if not the model's:
    /// `/v1/models/{model}` and `/v2/models/{model}` are rewritten to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served_name: Option<String>,
    /// Headers sent upstream with every request, over the client's.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub headers: std::collections::BTreeMap<String, String>,
    /// Base URL of the revision's gRPC endpoint (the Open Inference
    /// Protocol's `GRPCInferenceService`): `http://` for HTTP/2 without TLS,
    /// `https://` for HTTP/2 over TLS. A gRPC call routed to a revision
    /// without one counts as a connect failure of that revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpc_url: Option<String>,
}

/// How one model is routed. A model has one champion and at most one
/// candidate (a live share) and one shadow (mirrored).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelRoute {
    pub name: String,
    #[serde(default)]
    pub protocol: Protocol,
    /// For `protocol = "json"`: the path this model is served on.
    #[serde(default)]
    pub json_path: Option<String>,
    /// JSON pointer into the request body for the sticky key, used when the
    /// key header is absent.
    #[serde(default)]
    pub key_field: Option<String>,
    /// Hash salt; defaults to the model name.
    #[serde(default)]
    pub salt: Option<String>,
    /// `per_request` splits each request at random, ignoring its key.
    #[serde(default)]
    pub assignment: rollgate_core::plan::Assignment,
    /// JSON pointer to the predictions in a response.
    #[serde(default)]
    pub output_pointer: Option<String>,
    /// OIP V2: the output tensor holding predictions, by name.
    #[serde(default)]
    pub output: Option<String>,
    /// A champion answer with at least this confidence is high-confidence.
    #[serde(default = "default_confidence")]
    pub confidence_threshold: f64,
    /// Numeric outputs within this absolute difference agree.
    #[serde(default = "default_tolerance")]
    pub numeric_tolerance: f64,
    /// A candidate that cannot be reached is retried on the champion (the
    /// candidate's failure is still counted, and so is the fallback).
    #[serde(default)]
    pub fallback_to_champion: bool,
    pub champion: Upstream,
    #[serde(default)]
    pub candidate: Option<WeightedUpstream>,
    #[serde(default)]
    pub shadow: Option<MirroredUpstream>,
    /// The routing epoch this route starts (the store follower sets
    /// `"<rollout>.<epoch>"`): each request is counted under the epoch in
    /// force when it arrived, so requests that finish after a routing
    /// change are never counted in the new split.
    #[serde(default)]
    pub epoch: Option<String>,
    /// Another data plane serves this model's users and sends the gateway
    /// a copy of each request: the gateway only measures a shadow. A copy
    /// it mirrors goes to the champion and the shadow and is paired; any
    /// other is refused (`421`) without reaching a model, so copies cost
    /// the champion nothing while no shadow runs. No candidate is routed.
    #[serde(default)]
    pub mirror_only: bool,
    /// Whether a tester may pin a request to a revision of this model
    /// (`pin_header`, `pin_cookie`), the candidate included before it has
    /// any share; off (the default): a pin is ignored and the request
    /// routed as any other. Whoever can send the header can pin, so turn
    /// it on only where untrusted clients cannot (an edge that strips it).
    #[serde(default)]
    pub pinning: bool,
    /// Each arm's answer to each request is recorded for labels sent
    /// later (`GET /rollgate/answers`): the model's rollout judges its
    /// quality from them.
    #[serde(default)]
    pub record_answers: bool,
}

fn default_confidence() -> f64 {
    0.9
}
fn default_tolerance() -> f64 {
    1e-6
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WeightedUpstream {
    #[serde(flatten)]
    pub upstream: Upstream,
    /// Share of live requests, in basis points (0..=10000).
    pub weight_bp: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MirroredUpstream {
    #[serde(flatten)]
    pub upstream: Upstream,
    /// Share of champion-served requests mirrored, in basis points (0..=10000).
    pub mirror_bp: u32,
}

fn check_upstream(field: &str, u: &Upstream) -> Result<(), ConfigError> {
    if u.revision.trim().is_empty() {
        return Err(err(format!("{field}.revision"), "must not be empty"));
    }
    rollgate_core::spec::check_upstream_url(&format!("{field}.url"), &u.url)
        .map_err(|e| err(e.field, e.message))?;
    if let Some(url) = &u.grpc_url {
        rollgate_core::spec::check_upstream_url(&format!("{field}.grpc_url"), url)
            .map_err(|e| err(e.field, e.message))?;
    }
    if let Some(n) = &u.served_name {
        rollgate_core::spec::check_model_name(n)
            .map_err(|e| err(format!("{field}.served_name"), e.message))?;
    }
    for (name, value) in &u.headers {
        rollgate_core::spec::check_header(name, value)
            .map_err(|e| err(format!("{field}.{}", e.field), e.message))?;
        if http::HeaderName::from_bytes(name.as_bytes()).is_err()
            || http::HeaderValue::from_str(value).is_err()
        {
            return Err(err(format!("{field}.headers.{name}"), "not a valid header"));
        }
    }
    Ok(())
}

impl ModelRoute {
    /// The shared spec validator (`rollgate_core::spec`), then what only
    /// a route has (tolerance, weights).
    pub fn validate(&self, i: usize) -> Result<(), ConfigError> {
        let f = |s: &str| format!("models[{i}].{s}");
        rollgate_core::spec::check_model_name(&self.name).map_err(|e| err(f("name"), e.message))?;
        rollgate_core::spec::check_model(&rollgate_core::spec::ModelShape {
            protocol: self.protocol,
            json_path: self.json_path.as_deref(),
            key_field: self.key_field.as_deref(),
            output_pointer: self.output_pointer.as_deref(),
            confidence_threshold: Some(self.confidence_threshold),
            output: self.output.as_deref(),
        })
        .map_err(|e| err(f(&e.field), e.message))?;
        if self.numeric_tolerance.is_nan() || self.numeric_tolerance < 0.0 {
            return Err(err(f("numeric_tolerance"), "must be >= 0"));
        }
        check_upstream(&f("champion"), &self.champion)?;
        if let Some(c) = &self.candidate {
            check_upstream(&f("candidate"), &c.upstream)?;
            if c.weight_bp > 10_000 {
                return Err(err(f("candidate.weight_bp"), "must be at most 10000"));
            }
        }
        if let Some(s) = &self.shadow {
            check_upstream(&f("shadow"), &s.upstream)?;
            if s.mirror_bp > 10_000 {
                return Err(err(f("shadow.mirror_bp"), "must be at most 10000"));
            }
        }
        Ok(())
    }
}

impl GatewayConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.limits.max_concurrent == 0 {
            return Err(err("limits.max_concurrent", "must be at least 1"));
        }
        if self.mirror.max_outstanding == 0 {
            return Err(err("mirror.max_outstanding", "must be at least 1"));
        }
        validate_routes(&self.models)
    }

    /// Reads the TLS files the config names: a missing or bad one is an
    /// error naming the field and the file, at start, not at the first
    /// connection.
    pub fn check_tls_files(&self) -> Result<(), ConfigError> {
        if let Some(t) = &self.tls {
            t.server().map_err(|e| err("tls", e.to_string()))?;
        }
        self.upstream_tls
            .validate()
            .map_err(|e| err("upstream_tls", e.to_string()))
    }
}

/// Checks every route and that names and JSON paths are unique.
pub fn validate_routes(models: &[ModelRoute]) -> Result<(), ConfigError> {
    let mut names = std::collections::HashSet::new();
    let mut paths = std::collections::HashSet::new();
    for (i, m) in models.iter().enumerate() {
        m.validate(i)?;
        if !names.insert(&m.name) {
            return Err(err(
                format!("models[{i}].name"),
                format!("duplicate model {:?}", m.name),
            ));
        }
        if let Some(p) = &m.json_path
            && !paths.insert(p)
        {
            return Err(err(
                format!("models[{i}].json_path"),
                format!("duplicate path {p:?}"),
            ));
        }
    }
    Ok(())
}

/// A model the gateway cannot route, and why. Its requests get 404 with
/// the reason; every other model keeps routing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unroutable {
    pub model: String,
    pub json_path: Option<String>,
    pub reason: String,
}

/// Splits routes into those that can be routed and those that cannot,
/// each judged on its own (a duplicate name or path loses to the first).
pub fn partition_routes(models: &[ModelRoute]) -> (Vec<ModelRoute>, Vec<Unroutable>) {
    let mut names = std::collections::HashSet::new();
    let mut paths = std::collections::HashSet::new();
    let (mut ok, mut bad) = (Vec::new(), Vec::new());
    for (i, m) in models.iter().enumerate() {
        let duplicate = if names.contains(&m.name) {
            Some(format!("duplicate model {:?}", m.name))
        } else {
            m.json_path
                .as_ref()
                .filter(|p| paths.contains(*p))
                .map(|p| format!("path {p:?} is already served by another model"))
        };
        match m
            .validate(i)
            .map_err(|e| e.to_string())
            .and(duplicate.map_or(Ok(()), Err))
        {
            Ok(()) => {
                names.insert(m.name.clone());
                if let Some(p) = &m.json_path {
                    paths.insert(p.clone());
                }
                ok.push(m.clone());
            }
            Err(reason) => bad.push(Unroutable {
                model: m.name.clone(),
                json_path: m.json_path.clone(),
                reason,
            }),
        }
    }
    (ok, bad)
}
