//! rollgate's data plane. It routes inference requests to a model's
//! champion, sends a sticky weighted share to a candidate, mirrors traffic to
//! a shadow fire-and-forget, and measures every revision. It measures; it
//! never judges: verdicts are the controller's.
//!
//! **Architecture invariant:** a shadow can neither fail nor slow a user's
//! request: mirrors are sent after the champion answered, on spawned tasks
//! bounded by a semaphore, and dropped (and counted) when it is exhausted.

pub mod answers;
pub mod assign;
mod body;
pub mod config;
pub mod extract;
mod grpc;
mod metrics;
mod pool;
mod proxy;
mod recorder;
mod routing;
mod server;
mod stream;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use http::HeaderName;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
pub use rollgate_core::GatewaySnapshot;
use rollgate_net::Connector;
use tokio::sync::Semaphore;

pub use config::{
    ConfigError, GatewayConfig, Limits, MirrorConfig, MirroredUpstream, ModelRoute, Unroutable,
    Upstream, WeightedUpstream,
};
pub use proxy::{REQUEST_ID_HEADER, REVISION_HEADER};
pub use server::serve;

use recorder::Recorders;
use routing::RoutingTable;

/// Gateway-level counters (not any revision's).
#[derive(Debug, Default)]
struct Counters {
    in_flight: AtomicI64,
    overloaded: AtomicU64,
    /// Requests sent again because the upstream closed a pooled connection
    /// before answering.
    retried: AtomicU64,
    /// Requests whose body did not arrive within the body timeout (408).
    slow_clients: AtomicU64,
    /// Requests whose body was beyond the body limit, streamed upstream.
    streamed: AtomicU64,
    /// Requests in another protocol than their model's (400, not forwarded).
    wrong_protocol: AtomicU64,
    fallbacks: Mutex<HashMap<String, u64>>,
    /// Per model and revision: requests pinned by a tester.
    pinned: Mutex<BTreeMap<String, BTreeMap<String, u64>>>,
    /// Models that cannot be routed now, and why (logged once per reason).
    unroutable: Mutex<BTreeMap<String, String>>,
}

impl Counters {
    fn fallback(&self, model: &str) {
        let mut f = self.fallbacks.lock().unwrap_or_else(|p| p.into_inner());
        *f.entry(model.to_string()).or_default() += 1;
    }

    fn pinned(&self, model: &str, revision: &str) {
        let mut p = self.pinned.lock().unwrap_or_else(|p| p.into_inner());
        *p.entry(model.to_string())
            .or_default()
            .entry(revision.to_string())
            .or_default() += 1;
    }
}

struct Inner {
    id: String,
    boot: String,
    limits: Limits,
    key_header: HeaderName,
    /// Pins a request to a revision (see `GatewayConfig::pin_header`).
    pin_header: HeaderName,
    pin_cookie: Option<String>,
    routes: ArcSwap<RoutingTable>,
    /// Held by whoever changes the routes: a whole-table change and a
    /// one-model change must not overwrite each other.
    route_writes: Mutex<()>,
    recorders: Recorders,
    /// Answers recorded for labels (`ModelRoute::record_answers`).
    answers: answers::AnswerLog,
    client: Client<Connector, stream::Outgoing>,
    /// Never pools: for sending a request again on a fresh connection.
    fresh: Client<Connector, stream::Outgoing>,
    /// HTTP/2 only, for gRPC upstreams: with prior knowledge to `http://`
    /// (h2c), by ALPN to `https://`; one multiplexed connection per host.
    h2: Client<Connector, stream::Outgoing>,
    /// TLS on the listener, if configured.
    tls: Option<rollgate_net::ServerTls>,
    /// Connections to plain-HTTP upstreams, by `host:port`.
    pools: Mutex<HashMap<String, Arc<pool::Pool>>>,
    capacity: Arc<Semaphore>,
    mirror_slots: Arc<Semaphore>,
    counters: Counters,
}

impl Inner {
    /// The pool of a plain-HTTP upstream, made at its first use.
    fn pool(&self, d: &routing::Direct) -> Arc<pool::Pool> {
        Arc::clone(d.pool.get_or_init(|| {
            let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
            Arc::clone(pools.entry(d.addr.clone()).or_insert_with(|| {
                Arc::new(pool::Pool::new(
                    d.addr.clone(),
                    self.limits.connect_timeout,
                    self.limits.pool_idle_timeout,
                ))
            }))
        }))
    }

    /// Records the models that cannot be routed; logs each new reason once.
    fn note_unroutable(&self, now: &[Unroutable]) {
        let mut known = self
            .counters
            .unroutable
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let next: BTreeMap<String, String> = now
            .iter()
            .map(|u| (u.model.clone(), u.reason.clone()))
            .collect();
        for (model, reason) in &next {
            if known.get(model) != Some(reason) {
                tracing::warn!(%model, %reason, "model cannot be routed; every other model keeps routing");
            }
        }
        *known = next;
    }

    fn snapshot(&self) -> GatewaySnapshot {
        let counted = self.recorders.snapshot();
        GatewaySnapshot {
            gateway: self.id.clone(),
            boot: self.boot.clone(),
            models: counted.models,
            epochs: counted.epochs,
            overloaded: self.counters.overloaded.load(Ordering::Relaxed),
            retried: self.counters.retried.load(Ordering::Relaxed),
            slow_clients: self.counters.slow_clients.load(Ordering::Relaxed),
            streamed_requests: self.counters.streamed.load(Ordering::Relaxed),
            wrong_protocol: self.counters.wrong_protocol.load(Ordering::Relaxed),
            answers_dropped: self.answers.dropped(),
            fallbacks: self
                .counters
                .fallbacks
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .map(|(k, v)| (k.clone(), *v))
                .collect(),
            in_flight: self.counters.in_flight.load(Ordering::Relaxed),
            pinned: self
                .counters
                .pinned
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            unroutable: self
                .counters
                .unroutable
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        }
    }
}

/// A handle to a gateway; cheap to clone.
#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway").finish_non_exhaustive()
    }
}

impl Gateway {
    /// Builds a gateway from a validated configuration. Needs a tokio runtime
    /// only once it serves.
    pub fn new(config: &GatewayConfig) -> Result<Gateway, ConfigError> {
        config.validate()?;
        let key_header = key_header(config)?;
        let pin_header = pin_header(config, &key_header)?;
        check_pin_cookie(config)?;
        let clients = Clients::new(config)?;
        let tls = match &config.tls {
            None => None,
            Some(t) => Some(t.server().map_err(|e| ConfigError {
                field: "tls".into(),
                message: e.to_string(),
            })?),
        };
        let recorders = Recorders::default();
        let table = RoutingTable::compile(
            &config.models,
            &[],
            config.limits.upstream_timeout,
            &recorders,
        );
        Ok(Gateway {
            inner: Arc::new(Inner {
                id: config.id.clone(),
                boot: format!("{:016x}", rand::random::<u64>()),
                limits: config.limits.clone(),
                key_header,
                pin_header,
                pin_cookie: config.pin_cookie.clone(),
                routes: ArcSwap::from_pointee(table),
                route_writes: Mutex::new(()),
                recorders,
                answers: answers::AnswerLog::new(answers::ANSWERS_KEPT),
                client: clients.pooled,
                fresh: clients.fresh,
                h2: clients.h2,
                tls,
                pools: Mutex::new(HashMap::new()),
                capacity: Arc::new(Semaphore::new(config.limits.max_concurrent)),
                mirror_slots: Arc::new(Semaphore::new(config.mirror.max_outstanding)),
                counters: Counters::default(),
            }),
        })
    }

    /// Replaces every route at once. Requests in flight finish on the table
    /// they started with; new requests see the new one.
    pub fn set_routes(&self, models: &[ModelRoute]) -> Vec<Unroutable> {
        let _writing = self
            .inner
            .route_writes
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let (valid, unroutable) = config::partition_routes(models);
        let table = RoutingTable::compile(
            &valid,
            &unroutable,
            self.inner.limits.upstream_timeout,
            &self.inner.recorders,
        );
        self.inner.routes.store(Arc::new(table));
        self.inner.note_unroutable(&unroutable);
        unroutable
    }

    /// Replaces model `name`'s route (`None`: no longer routed), leaving
    /// every other model's compiled route as it is: a routing change costs
    /// one model, not the table. Returns why it cannot be routed, if so.
    pub fn set_model_route(&self, name: &str, route: Option<&ModelRoute>) -> Option<String> {
        let _writing = self
            .inner
            .route_writes
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let (valid, bad) = match route {
            Some(m) => config::partition_routes(std::slice::from_ref(m)),
            None => (vec![], vec![]),
        };
        let change = valid.first().map(Ok).or_else(|| bad.first().map(Err));
        let table = self.inner.routes.load().with_model(
            name,
            change,
            self.inner.limits.upstream_timeout,
            &self.inner.recorders,
        );
        let reason = table.unroutable_reason(name).map(str::to_string);
        self.inner.routes.store(Arc::new(table));
        let mut known = self
            .inner
            .counters
            .unroutable
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        match &reason {
            Some(r) => {
                if known.get(name) != Some(r) {
                    tracing::warn!(model = %name, reason = %r, "model cannot be routed; every other model keeps routing");
                }
                known.insert(name.to_string(), r.clone());
            }
            None => {
                known.remove(name);
            }
        }
        reason
    }

    /// Up to `max` of the answers recorded for labels, oldest first, taken
    /// out of the gateway's queue (its store follower keeps them).
    pub fn take_answers(&self, max: usize) -> Vec<answers::AnswerRecord> {
        self.inner.answers.take(max)
    }

    /// Answers taken that could not be stored, queued again in front.
    pub fn put_back_answers(&self, records: Vec<answers::AnswerRecord>) {
        self.inner.answers.put_back(records);
    }

    /// Cumulative measurements, as served at `GET /rollgate/stats`.
    pub fn snapshot(&self) -> GatewaySnapshot {
        self.inner.snapshot()
    }

    /// Prometheus text exposition, as `GET /metrics` serves a scraper
    /// that does not ask for OpenMetrics.
    pub fn metrics_text(&self) -> String {
        metrics::expose(&self.inner, None).0
    }
}

/// The sticky key's header, as configured.
fn key_header(config: &GatewayConfig) -> Result<HeaderName, ConfigError> {
    HeaderName::from_bytes(config.key_header.to_ascii_lowercase().as_bytes()).map_err(|_| {
        ConfigError {
            field: "key_header".into(),
            message: format!("{:?} is not a valid header name", config.key_header),
        }
    })
}

/// The pin header, as configured: the gateway's own, never one HTTP or the
/// request's routing already gives a meaning.
fn pin_header(config: &GatewayConfig, key_header: &HeaderName) -> Result<HeaderName, ConfigError> {
    const TAKEN: &[&str] = &[
        "accept",
        "accept-encoding",
        "authorization",
        "connection",
        "content-encoding",
        "content-length",
        "content-type",
        "cookie",
        "host",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "user-agent",
    ];
    HeaderName::from_bytes(config.pin_header.to_ascii_lowercase().as_bytes())
        .ok()
        .filter(|h| {
            h != key_header && !TAKEN.contains(&h.as_str()) && !h.as_str().starts_with("grpc-")
        })
        .ok_or_else(|| ConfigError {
            field: "pin_header".into(),
            message: format!(
                "{:?} is not a header name of its own (not key_header, not one HTTP \
                 or gRPC uses)",
                config.pin_header
            ),
        })
}

/// The pin cookie's name, if one is configured, is a valid cookie name.
fn check_pin_cookie(config: &GatewayConfig) -> Result<(), ConfigError> {
    if let Some(c) = &config.pin_cookie
        && (c.is_empty()
            || !c
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)))
    {
        return Err(ConfigError {
            field: "pin_cookie".into(),
            message: format!("{c:?} is not a valid cookie name"),
        });
    }
    Ok(())
}

/// The clients upstreams are reached with (beyond plain-HTTP REST
/// upstreams' own pools), all over one connector: TLS to `https://`
/// upstreams as configured, `TCP_NODELAY`, the connect timeout.
struct Clients {
    /// Pooled.
    pooled: Client<Connector, stream::Outgoing>,
    /// Never pools: for sending a request again on a fresh connection.
    fresh: Client<Connector, stream::Outgoing>,
    /// HTTP/2 only, for gRPC upstreams.
    h2: Client<Connector, stream::Outgoing>,
}

impl Clients {
    fn new(config: &GatewayConfig) -> Result<Clients, ConfigError> {
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        http.set_connect_timeout(Some(config.limits.connect_timeout));
        let connector =
            rollgate_net::connector(http, &config.upstream_tls).map_err(|e| ConfigError {
                field: "upstream_tls".into(),
                message: e.to_string(),
            })?;
        let pooled = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(config.limits.pool_idle_timeout)
            .pool_max_idle_per_host(1024)
            .build(connector.clone());
        let fresh = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(0)
            .build(connector.clone());
        let h2 = Client::builder(TokioExecutor::new())
            .http2_only(true)
            .pool_idle_timeout(config.limits.pool_idle_timeout)
            .build(connector);
        Ok(Clients { pooled, fresh, h2 })
    }
}
