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
    /// `http://host:port`, no trailing slash.
    pub base: String,
    pub timeout: Duration,
    pub stats: Arc<Sharded<RevisionStats>>,
    /// `(model, served name)` when the upstream serves the model under
    /// another name.
    pub rename: Option<(String, String)>,
    /// Sent upstream with every request, over the client's.
    pub headers: Vec<(http::HeaderName, http::HeaderValue)>,
}

impl Target {
    fn new(
        model: &str,
        epoch: &str,
        u: &Upstream,
        default_timeout: Duration,
        rec: &Recorders,
    ) -> Target {
        Target {
            revision: u.revision.clone(),
            base: u.url.trim_end_matches('/').to_string(),
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
}

#[derive(Debug, Default)]
pub struct RoutingTable {
    by_name: HashMap<String, Arc<Route>>,
    by_path: HashMap<String, Arc<Route>>,
    /// Models that could not be routed, by name and by path: why.
    unroutable: HashMap<String, String>,
    unroutable_paths: HashMap<String, String>,
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
            t.unroutable
                .entry(u.model.clone())
                .or_insert_with(|| u.reason.clone());
            if let Some(p) = &u.json_path {
                t.unroutable_paths
                    .entry(p.clone())
                    .or_insert_with(|| u.reason.clone());
            }
        }
        let mut live = std::collections::BTreeSet::new();
        for m in models {
            let epoch = m.epoch.as_deref().unwrap_or("");
            live.insert((m.name.clone(), epoch.to_string()));
            let route = Arc::new(Route {
                name: m.name.clone(),
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
                candidate: m.candidate.as_ref().map(|c| {
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
                t.by_path.insert(p.clone(), Arc::clone(&route));
            }
            t.by_name.insert(m.name.clone(), route);
        }
        rec.retire_except(&live);
        t
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
        self.unroutable_paths.get(path).map(String::as_str)
    }
}
