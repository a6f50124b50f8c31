//! The compiled routing table: immutable, swapped atomically as a whole
//! (`ArcSwap`), so a request sees one consistent table from start to end and
//! a change never drops a request in flight.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rollgate_core::{PairStats, Protocol, RevisionStats};

use crate::config::{ModelRoute, Upstream};
use crate::recorder::{Recorders, Sharded};

/// One revision's upstream, ready to use.
#[derive(Debug)]
pub struct Target {
    pub revision: String,
    /// `revision` as the header value answers carry (`None` if it cannot
    /// be one), made once rather than per answer.
    pub revision_header: Option<http::HeaderValue>,
    /// `http://host:port`, no trailing slash.
    pub base: String,
    pub timeout: Duration,
    pub stats: Arc<Sharded<RevisionStats>>,
    /// `(model, served name)` when the upstream serves the model under
    /// another name.
    pub rename: Option<(String, String)>,
    /// Sent upstream with every request, over the client's.
    pub headers: Vec<(http::HeaderName, http::HeaderValue)>,
    /// A plain-HTTP upstream, reached through its own connection pool;
    /// `None` for `https://` (the pooled TLS client).
    pub direct: Option<Direct>,
    /// The gRPC endpoint's base URL, no trailing slash.
    pub grpc: Option<String>,
}

/// How a plain-HTTP upstream is reached directly.
#[derive(Debug)]
pub struct Direct {
    /// `host:port` to connect to.
    pub addr: String,
    /// The `Host` header (unless the revision sets its own).
    pub host: http::HeaderValue,
    /// The base URL's path, without a trailing `/`.
    pub prefix: String,
    /// The gateway's pool for `addr` (shared by every routing table),
    /// looked up at the target's first request.
    pub pool: std::sync::OnceLock<Arc<crate::pool::Pool>>,
}

impl Direct {
    fn of(base: &str) -> Option<Direct> {
        let uri: http::Uri = base.parse().ok()?;
        if uri.scheme_str() != Some("http") {
            return None;
        }
        let authority = uri.authority()?;
        let port = authority.port_u16().unwrap_or(80);
        Some(Direct {
            addr: format!("{}:{port}", authority.host()),
            host: http::HeaderValue::from_str(authority.as_str()).ok()?,
            prefix: uri.path().trim_end_matches('/').to_string(),
            pool: std::sync::OnceLock::new(),
        })
    }
}

impl Target {
    fn new(
        model: &str,
        epoch: &str,
        u: &Upstream,
        default_timeout: Duration,
        rec: &Recorders,
    ) -> Target {
        let base = u.url.trim_end_matches('/').to_string();
        Target {
            direct: Direct::of(&base),
            grpc: u
                .grpc_url
                .as_ref()
                .map(|g| g.trim_end_matches('/').to_string()),
            revision: u.revision.clone(),
            revision_header: http::HeaderValue::from_str(&u.revision).ok(),
            base,
            timeout: u.timeout.unwrap_or(default_timeout),
            stats: rec.revision(model, epoch, &u.revision),
            rename: u
                .served_name
                .as_ref()
                .filter(|n| n.as_str() != model)
                .map(|n| (model.to_string(), n.clone())),
            // Validated with the route: invalid ones cannot get here.
            headers: u
                .headers
                .iter()
                .filter_map(|(k, v)| {
                    Some((
                        http::HeaderName::from_bytes(k.as_bytes()).ok()?,
                        http::HeaderValue::from_str(v).ok()?,
                    ))
                })
                .collect(),
        }
    }

    /// The upstream path of a request for `path_q`: the model's name
    /// replaced by the served name in `/v1/models/…` and `/v2/models/…`.
    pub fn upstream_path(&self, path_q: &str) -> String {
        let Some((model, served)) = &self.rename else {
            return path_q.to_string();
        };
        for family in ["/v1/models/", "/v2/models/"] {
            if let Some(rest) = path_q.strip_prefix(family)
                && let Some(after) = rest.strip_prefix(model.as_str())
                && (after.is_empty() || after.starts_with([':', '/', '?']))
            {
                return format!("{family}{served}{after}");
            }
        }
        path_q.to_string()
    }
}

/// A model's routes, compiled.
#[derive(Debug)]
pub struct Route {
    pub name: String,
    /// The routing epoch its requests are counted in (`""`: none).
    pub epoch: String,
    pub protocol: Protocol,
    pub salt: String,
    pub key_field: Option<String>,
    /// Split per request at random, not by key.
    pub per_request: bool,
    /// `None` for a generic JSON model with no pointer: predictions are not read.
    pub output_pointer: Option<String>,
    /// OIP V2: the output tensor read, by name.
    pub output: Option<String>,
    pub read_predictions: bool,
    pub confidence_threshold: f64,
    pub numeric_tolerance: f64,
    pub fallback_to_champion: bool,
    pub champion: Target,
    pub candidate: Option<(Target, u32)>,
    pub shadow: Option<(Target, u32, Arc<Sharded<PairStats>>)>,
    /// Only copies of another data plane's requests arrive: see
    /// `ModelRoute::mirror_only`.
    pub mirror_only: bool,
    /// Testers may pin requests to a revision (`ModelRoute::pinning`).
    pub pinning: bool,
    /// Answers are recorded for labels (`ModelRoute::record_answers`).
    pub record_answers: bool,
}

impl Route {
    /// The revision a tester's pin names: `candidate` (the live candidate,
    /// else the shadow: in SHADOW the candidate is only mirrored),
    /// `shadow`, or a routed revision's id. `None`: none is routed now.
    pub fn pinned(&self, pin: &str) -> Option<&Target> {
        let candidate = self.candidate.as_ref().map(|(t, _)| t);
        let shadow = self.shadow.as_ref().map(|(t, _, _)| t);
        if pin.eq_ignore_ascii_case("candidate") {
            return candidate.or(shadow);
        }
        if pin.eq_ignore_ascii_case("shadow") {
            return shadow;
        }
        [Some(&self.champion), candidate, shadow]
            .into_iter()
            .flatten()
            .find(|t| t.revision == pin)
    }
}

#[derive(Debug, Default, Clone)]
pub struct RoutingTable {
    by_name: HashMap<String, Arc<Route>>,
    by_path: HashMap<String, Arc<Route>>,
    /// Models that could not be routed, by name and by path (with the
    /// model's name): why.
    unroutable: HashMap<String, String>,
    unroutable_paths: HashMap<String, (String, String)>,
}

impl RoutingTable {
    /// Compiles validated routes; `unroutable` are answered with their reason.
    pub fn compile(
        models: &[ModelRoute],
        unroutable: &[crate::config::Unroutable],
        default_timeout: Duration,
        rec: &Recorders,
    ) -> RoutingTable {
        let mut t = RoutingTable::default();
        for u in unroutable {
            t.insert_unroutable(u);
        }
        for m in models {
            t.insert(m, default_timeout, rec);
        }
        rec.retire_except(&t.live());
        t
    }

    /// This table with model `name` replaced by `change` (a route, a reason
    /// it cannot be routed, or nothing: removed), every other model's
    /// compiled route shared, not rebuilt. A route whose path another model
    /// serves is unroutable, as in a full compile.
    pub fn with_model(
        &self,
        name: &str,
        change: Option<Result<&ModelRoute, &crate::config::Unroutable>>,
        default_timeout: Duration,
        rec: &Recorders,
    ) -> RoutingTable {
        let mut t = self.clone();
        t.by_name.remove(name);
        t.by_path.retain(|_, r| r.name != name);
        t.unroutable.remove(name);
        t.unroutable_paths.retain(|_, (m, _)| m != name);
        match change {
            Some(Ok(m)) => match m.json_path.as_ref().filter(|p| t.by_path.contains_key(*p)) {
                Some(p) => t.insert_unroutable(&crate::config::Unroutable {
                    model: m.name.clone(),
                    json_path: m.json_path.clone(),
                    reason: format!("path {p:?} is already served by another model"),
                }),
                None => t.insert(m, default_timeout, rec),
            },
            Some(Err(u)) => t.insert_unroutable(u),
            None => {}
        }
        let live = t.by_name.get(name).map(|r| r.epoch.as_str());
        rec.retire_model_except(name, live);
        t
    }

    fn insert_unroutable(&mut self, u: &crate::config::Unroutable) {
        self.unroutable
            .entry(u.model.clone())
            .or_insert_with(|| u.reason.clone());
        if let Some(p) = &u.json_path {
            self.unroutable_paths
                .entry(p.clone())
                .or_insert_with(|| (u.model.clone(), u.reason.clone()));
        }
    }

    fn insert(&mut self, m: &ModelRoute, default_timeout: Duration, rec: &Recorders) {
        let epoch = m.epoch.as_deref().unwrap_or("");
        let route = Arc::new(Route {
            name: m.name.clone(),
            epoch: epoch.to_string(),
            protocol: m.protocol,
            salt: m.salt.clone().unwrap_or_else(|| m.name.clone()),
            key_field: m.key_field.clone(),
            per_request: m.assignment == rollgate_core::plan::Assignment::PerRequest,
            output_pointer: m.output_pointer.clone(),
            output: m.output.clone(),
            read_predictions: m.protocol != Protocol::Json || m.output_pointer.is_some(),
            confidence_threshold: m.confidence_threshold,
            numeric_tolerance: m.numeric_tolerance,
            fallback_to_champion: m.fallback_to_champion,
            champion: Target::new(&m.name, epoch, &m.champion, default_timeout, rec),
            mirror_only: m.mirror_only,
            pinning: m.pinning && !m.mirror_only,
            record_answers: m.record_answers && m.epoch.is_some(),
            candidate: m.candidate.as_ref().filter(|_| !m.mirror_only).map(|c| {
                (
                    Target::new(&m.name, epoch, &c.upstream, default_timeout, rec),
                    c.weight_bp,
                )
            }),
            shadow: m.shadow.as_ref().map(|s| {
                (
                    Target::new(&m.name, epoch, &s.upstream, default_timeout, rec),
                    s.mirror_bp,
                    rec.pairs(&m.name, epoch, &s.upstream.revision),
                )
            }),
        });
        if let Some(p) = &m.json_path {
            self.by_path.insert(p.clone(), Arc::clone(&route));
        }
        self.by_name.insert(m.name.clone(), route);
    }

    /// The `(model, epoch)` pairs this table counts requests in.
    fn live(&self) -> std::collections::BTreeSet<(String, String)> {
        self.by_name
            .values()
            .map(|r| (r.name.clone(), r.epoch.clone()))
            .collect()
    }

    /// The `(model, revision)` pairs this table routes to: champions,
    /// candidates and shadows. Metrics show only these, so a revision that
    /// left the table (a rejected candidate) stops being exported.
    pub fn routed(&self) -> std::collections::BTreeSet<(String, String)> {
        self.by_name
            .values()
            .flat_map(|r| {
                std::iter::once(&r.champion)
                    .chain(r.candidate.as_ref().map(|(t, _)| t))
                    .chain(r.shadow.as_ref().map(|(t, _, _)| t))
                    .map(|t| (r.name.clone(), t.revision.clone()))
            })
            .collect()
    }

    /// Why model `name` cannot be routed, if it cannot.
    pub fn unroutable_reason(&self, name: &str) -> Option<&str> {
        self.unroutable.get(name).map(String::as_str)
    }

    pub fn model(&self, name: &str) -> Option<&Arc<Route>> {
        self.by_name.get(name)
    }

    pub fn json_path(&self, path: &str) -> Option<&Arc<Route>> {
        self.by_path.get(path)
    }

    /// Why the model `name` (not routed) cannot be routed.
    pub fn unroutable(&self, name: &str) -> Option<&str> {
        self.unroutable.get(name).map(String::as_str)
    }

    /// Why the model on `path` (not routed) cannot be routed.
    pub fn unroutable_path(&self, path: &str) -> Option<&str> {
        self.unroutable_paths.get(path).map(|(_, r)| r.as_str())
    }
}

#[cfg(test)]
mod incremental {
    use super::*;
    use crate::config::{Upstream, WeightedUpstream, partition_routes};
    use proptest::prelude::*;

    fn upstream(rev: u8) -> Upstream {
        Upstream {
            revision: if rev == 9 {
                String::new() // invalid: the model is unroutable
            } else {
                format!("r{rev}")
            },
            url: format!("http://127.0.0.1:{}", 9000 + u16::from(rev)),
            timeout: None,
            served_name: None,
            headers: Default::default(),
            grpc_url: None,
        }
    }

    fn route(model: u8, champion: u8, candidate: Option<u16>, epoch: u8) -> ModelRoute {
        ModelRoute {
            name: format!("m{model}"),
            // JSON models may have a path: one per model (the store never
            // gives two models one path).
            protocol: if model.is_multiple_of(2) {
                Protocol::Json
            } else {
                Protocol::default()
            },
            json_path: model.is_multiple_of(2).then(|| format!("/p{model}")),
            key_field: None,
            salt: None,
            assignment: Default::default(),
            output_pointer: None,
            output: None,
            confidence_threshold: 0.9,
            numeric_tolerance: 1e-6,
            fallback_to_champion: false,
            pinning: true,
            record_answers: false,
            champion: upstream(champion),
            candidate: candidate.map(|w| WeightedUpstream {
                upstream: upstream(5),
                weight_bp: u32::from(w),
            }),
            shadow: None,
            epoch: (epoch > 0).then(|| format!("1.{epoch}")),
            mirror_only: false,
        }
    }

    /// What a table routes, in a comparable form.
    fn describe(t: &RoutingTable) -> Vec<String> {
        let mut out: Vec<String> = t
            .by_name
            .values()
            .map(|r| {
                format!(
                    "{} epoch={} champion={} candidate={:?}",
                    r.name,
                    r.epoch,
                    r.champion.revision,
                    r.candidate.as_ref().map(|(c, w)| (c.revision.clone(), *w))
                )
            })
            .chain(
                t.by_path
                    .iter()
                    .map(|(p, r)| format!("path {p} -> {}", r.name)),
            )
            // (The reason names the model's index in the list it came in.)
            .chain(t.unroutable.keys().map(|m| format!("unroutable {m}")))
            .chain(
                t.unroutable_paths
                    .iter()
                    .map(|(p, (m, _))| format!("unroutable path {p} of {m}")),
            )
            .collect();
        out.sort();
        out
    }

    proptest! {
        /// Changing one model at a time gives the table a full compile of
        /// the same routes gives, whatever the order of changes.
        #[test]
        fn one_model_at_a_time_equals_a_full_compile(
            ops in prop::collection::vec(
                (0u8..6, prop::option::of((0u8..10, prop::option::of(0u16..10_000), 0u8..3))),
                1..40,
            )
        ) {
            let rec = Recorders::default();
            let timeout = Duration::from_secs(1);
            let mut table = RoutingTable::default();
            let mut desired = std::collections::BTreeMap::new();
            for (model, change) in ops {
                let name = format!("m{model}");
                let new = change.map(|(c, w, e)| route(model, c, w, e));
                let (ok, bad) = match &new {
                    Some(m) => partition_routes(std::slice::from_ref(m)),
                    None => (vec![], vec![]),
                };
                let change = ok.first().map(Ok).or_else(|| bad.first().map(Err));
                table = table.with_model(&name, change, timeout, &rec);
                match new {
                    Some(m) => desired.insert(name, m),
                    None => desired.remove(&name),
                };
                let all: Vec<ModelRoute> = desired.values().cloned().collect();
                let (ok, bad) = partition_routes(&all);
                let full = RoutingTable::compile(&ok, &bad, timeout, &rec);
                prop_assert_eq!(describe(&table), describe(&full));
            }
        }
    }

    #[test]
    fn a_path_another_model_serves_makes_the_newcomer_unroutable() {
        let rec = Recorders::default();
        let t = Duration::from_secs(1);
        let a = route(0, 0, None, 0);
        let mut b = route(2, 1, None, 0);
        b.json_path = a.json_path.clone();
        let table = RoutingTable::default()
            .with_model("m0", Some(Ok(&a)), t, &rec)
            .with_model("m2", Some(Ok(&b)), t, &rec);
        assert!(table.model("m0").is_some());
        assert!(table.model("m2").is_none());
        assert!(
            table
                .unroutable_reason("m2")
                .is_some_and(|r| r.contains("already served")),
            "{table:?}"
        );
    }
}
