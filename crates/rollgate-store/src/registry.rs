//! Models and their immutable revisions.

use std::collections::BTreeMap;

pub use rollgate_core::Protocol;
use rollgate_core::Timestamp;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::kube_plane::{self, KubeAccess, MirrorTo, RouteTemplate};
use crate::{Result, StoreError};

mod source;
pub use source::{RegistrySource, RegistryVersion, UPSTREAM_TAG, VERSION_MARK};

/// How the gateway talks to a model and reads its predictions.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(default, deny_unknown_fields)]
pub struct ModelSpec {
    pub protocol: Protocol,
    /// For `protocol = "json"`: the gateway path the model is served on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub json_path: Option<String>,
    /// JSON pointer to a sticky key in request bodies (when no key header).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_field: Option<String>,
    /// JSON pointer to the predictions in a response (protocol default if unset).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_pointer: Option<String>,
    /// A champion answer at or above this confidence is "high-confidence".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub confidence_threshold: Option<f64>,
    /// For `protocol = "oip_v2"`: the output tensor holding predictions, by
    /// name (e.g. `predict_proba`), whatever its position.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// Read the model's evidence from a Prometheus server scraping its
    /// model servers instead of from rollgate's gateways (whose shadow
    /// pairs still count). Unset: the gateways'.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus: Option<PrometheusEvidence>,
    /// The data plane that splits the model's traffic when it is not
    /// rollgate's gateway, by the name the controller's config declares it
    /// under (`[data_planes.NAME]`): the controller sets its weights
    /// through an adapter and waits for it to confirm each routing before
    /// the stage's clock starts. Unset: rollgate's gateways route it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_plane: Option<DataPlaneRef>,
    /// Whether testers may pin their own requests to the candidate or
    /// shadow with the gateway's pin header or cookie (default: no).
    /// Pinned requests are served and counted apart, never as evidence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinning: Option<bool>,
    /// A model registry (MLflow's) whose alias starts this model's
    /// rollouts and hears their verdicts (docs/config.md, "MLflow").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registry: Option<RegistrySource>,
}

/// A model's data plane as its spec names it. Adapters write files and
/// run commands on the controller's host, so only the host's config
/// defines one (`[data_planes.NAME]`); a spec refers to it by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(untagged)]
pub enum DataPlaneRef {
    /// The name of a data plane the controller's config declares.
    Named(String),
    /// The definition itself, as specs stored before data planes had
    /// names hold it: refused on every write, and honoured on reading only
    /// while the config declares an identical data plane (else the model
    /// is isolated: its adapter never runs).
    Inline(Box<DataPlane>),
}

/// Where an operator declares what an API caller may only name.
pub const DECLARE_DATA_PLANES: &str = "declare it in the controller's config as \
     [data_planes.NAME] and name it here (\"data_plane\": \"NAME\"; docs/config.md, \
     \"Another data plane\")";

/// An external data plane and how the controller sets its weights. Each
/// adapter confirms the routing version it applied, and is sent
/// champion-only routing before a rollback is committed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum DataPlane {
    /// POST the desired weights and routing version to `url`, again with
    /// back-off until a 2xx answer names that version (`{"version": ...}`).
    Webhook {
        url: String,
        /// A file holding a bearer token for the receiver (read at every
        /// call; never stored here).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        bearer_token_file: Option<String>,
    },
    /// Write an nginx include file (`split_clients` on the sticky key, one
    /// `upstream` per revision) atomically, run `reload_command`, and
    /// confirm by reading the version nginx serves at `confirm_url`.
    Nginx {
        include_file: String,
        /// The reload command and its arguments (run without a shell),
        /// e.g. `["nginx", "-s", "reload"]`.
        reload_command: Vec<String>,
        /// A URL served by the reloaded nginx that answers the routing
        /// version (`return 200 $rollgate_<model>_version;`).
        confirm_url: String,
        /// The nginx variable the split hashes (the sticky key).
        #[serde(default = "default_nginx_key")]
        key: String,
    },
    /// Write Envoy's file-based dynamic configuration atomically (the
    /// model's `RouteConfiguration`, `weighted_clusters` chosen by a hash
    /// of the sticky key header, in `routes_file`; a cluster per revision
    /// in `clusters_file`, shared by models) for Envoy's file watch, and
    /// confirm from the admin's `/config_dump` that the routing version is
    /// in force.
    Envoy {
        /// The RDS file of the model's route configuration (the listener's
        /// `rds.config_source.path_config_source.path`).
        routes_file: String,
        /// The CDS file (`dynamic_resources.cds_config`): the adapter
        /// keeps its own clusters in it (`rollgate_<model>_<revision>`)
        /// and leaves every other cluster as it is.
        clusters_file: String,
        /// Envoy's admin address, e.g. `http://127.0.0.1:9901`.
        admin_url: String,
        /// The route configuration's name (the listener's
        /// `rds.route_config_name`); `rollgate_<model>` when absent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        route_config_name: Option<String>,
        /// The request header the split hashes (the sticky key).
        #[serde(default = "default_key_header")]
        key_header: String,
        /// A cluster of Envoy's own that reaches rollgate's gateway: every
        /// request is mirrored to it, so a plan may have a SHADOW stage.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mirror_cluster: Option<String>,
    },
    /// Server-side apply one Gateway API `HTTPRoute` per template in
    /// `routes` (field manager `rollgate`; fields other managers own are
    /// never forced), the revisions' Services weighted in basis points on
    /// one rule, and confirm that every parent's controller accepted the
    /// route's new generation (`status.parents[].conditions`).
    GatewayApi {
        #[serde(default)]
        cluster: KubeAccess,
        namespace: String,
        routes: Vec<RouteTemplate>,
        /// Every request mirrored here (`RequestMirror`): rollgate's
        /// gateway, so a plan may have a SHADOW stage.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mirror: Option<MirrorTo>,
        /// Wait for the parents' controllers to accept each generation
        /// (default); `false`: confirmed once the API server holds it.
        #[serde(default = "yes")]
        require_status: bool,
        /// Only this controller's status counts (`controllerName`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        controller_name: Option<String>,
    },
    /// Server-side apply one Istio `VirtualService` per model (field
    /// manager `rollgate`), its route weighted by destination host in
    /// percent, and confirm from its `status.observedGeneration` that
    /// istiod has taken the new generation.
    Istio {
        #[serde(default)]
        cluster: KubeAccess,
        namespace: String,
        /// The VirtualService's name; `$model` is the model's.
        #[serde(default = "default_object_name")]
        name: String,
        /// The hosts the VirtualService answers for (`$model` filled in).
        hosts: Vec<String>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        gateways: Vec<String>,
        /// Every request mirrored to this host and port (`mirror`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mirror: Option<MirrorTo>,
        /// Wait for istiod's `status.observedGeneration` (default; needs
        /// istiod's status reporting); `false`: confirmed once the API
        /// server holds it.
        #[serde(default = "yes")]
        require_status: bool,
    },
    /// Server-side apply each model's KServe `InferenceService` (field
    /// manager `rollgate`): the live revisions' own predictors
    /// (`RevisionSpec::predictor`), the candidate's share as the
    /// predictor's `canaryTrafficPercent` (Knative mode) or a `spec.canary`
    /// entry (Standard mode), and confirm from KServe's status that the
    /// split is in force (`status.components.predictor.traffic`, or
    /// `status.canaryStatuses`; never `status.observedGeneration`, which
    /// KServe copies from a child object).
    Kserve {
        #[serde(default)]
        cluster: KubeAccess,
        namespace: String,
        /// The InferenceService's name; `$model` is the model's.
        #[serde(default = "default_object_name")]
        name: String,
        /// KServe's deployment mode of the InferenceService.
        #[serde(default)]
        mode: KserveMode,
        /// Wait for KServe's status to show each split (default);
        /// `false`: confirmed once the API server holds it.
        #[serde(default = "yes")]
        require_status: bool,
        /// Fields of `GUARDED_PREDICTOR_FIELDS` a revision's predictor may
        /// hold (a container image, a command, a service account, a
        /// Secret by reference, ...): none by default, since whoever
        /// registers revisions would choose what runs in the cluster.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        allow_predictor_fields: Vec<String>,
    },
}

/// How KServe deploys an InferenceService, and so how it splits traffic.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum KserveMode {
    /// Knative revisions (`Serverless` before KServe 0.15): the latest
    /// revision gets `canaryTrafficPercent`, the last one rolled out the rest.
    #[default]
    #[serde(alias = "serverless")]
    Knative,
    /// Deployments (`RawDeployment` before): each `spec.canary` entry its
    /// own Deployment and share (KServe 0.20 and later).
    #[serde(alias = "raw_deployment")]
    Standard,
}

fn yes() -> bool {
    true
}

fn default_object_name() -> String {
    "$model".into()
}

fn default_nginx_key() -> String {
    "$http_x_rollgate_key".into()
}

fn default_key_header() -> String {
    "x-rollgate-key".into()
}

impl DataPlane {
    /// The adapter's name, as `kind` spells it.
    pub fn kind(&self) -> &'static str {
        match self {
            DataPlane::Webhook { .. } => "webhook",
            DataPlane::Nginx { .. } => "nginx",
            DataPlane::Envoy { .. } => "envoy",
            DataPlane::GatewayApi { .. } => "gateway_api",
            DataPlane::Istio { .. } => "istio",
            DataPlane::Kserve { .. } => "kserve",
        }
    }

    /// The checks a data plane's definition must pass, with `at` naming
    /// where it is written (e.g. `data_planes.edge`).
    pub fn validate(&self, at: &str) -> Result<()> {
        let bad = |m: String| Err(StoreError::Invalid(format!("{at}.{m}")));
        match self {
            DataPlane::Webhook { url, .. } => {
                if let Err(e) = rollgate_core::spec::check_upstream_url("url", url) {
                    return bad(e.to_string());
                }
            }
            DataPlane::Nginx {
                include_file,
                reload_command,
                confirm_url,
                key,
            } => {
                if !include_file.starts_with('/') {
                    return bad(format!(
                        "include_file: an absolute path, got {include_file:?}"
                    ));
                }
                if reload_command.first().is_none_or(|c| c.trim().is_empty()) {
                    return bad(
                        "reload_command: a command, e.g. [\"nginx\", \"-s\", \"reload\"]".into(),
                    );
                }
                if let Err(e) = rollgate_core::spec::check_upstream_url("confirm_url", confirm_url)
                {
                    return bad(e.to_string());
                }
                let var_ok = key.len() > 1
                    && key.starts_with('$')
                    && key[1..]
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_');
                if !var_ok {
                    return bad(format!(
                        "key: an nginx variable such as $http_x_user, got {key:?}"
                    ));
                }
            }
            DataPlane::Envoy {
                routes_file,
                clusters_file,
                admin_url,
                route_config_name,
                key_header,
                mirror_cluster,
            } => check_envoy(
                &|m| StoreError::Invalid(format!("{at}.{m}")),
                [routes_file, clusters_file],
                admin_url,
                [route_config_name, mirror_cluster],
                key_header,
            )?,
            DataPlane::GatewayApi {
                cluster,
                namespace,
                routes,
                mirror,
                ..
            } => {
                let bad = |m: String| StoreError::Invalid(format!("{at}.{m}"));
                kube_plane::check(&bad, cluster, namespace, mirror.as_ref())?;
                kube_plane::check_routes(&bad, routes)?;
            }
            DataPlane::Istio {
                cluster,
                namespace,
                name,
                hosts,
                mirror,
                ..
            } => {
                let bad = |m: String| StoreError::Invalid(format!("{at}.{m}"));
                kube_plane::check(&bad, cluster, namespace, mirror.as_ref())?;
                kube_plane::check_virtual_service(&bad, name, hosts, mirror.as_ref())?;
            }
            DataPlane::Kserve {
                cluster,
                namespace,
                name,
                allow_predictor_fields,
                ..
            } => {
                let bad = |m: String| StoreError::Invalid(format!("{at}.{m}"));
                kube_plane::check(&bad, cluster, namespace, None)?;
                kube_plane::check_object_name(&bad, name)?;
                kube_plane::check_allowed_fields(&bad, allow_predictor_fields)?;
            }
        }
        Ok(())
    }
}

/// The checks of an Envoy data plane's files, admin URL and names.
fn check_envoy(
    bad: &dyn Fn(String) -> StoreError,
    [routes_file, clusters_file]: [&String; 2],
    admin_url: &str,
    [route_config_name, mirror_cluster]: [&Option<String>; 2],
    key_header: &str,
) -> Result<()> {
    for (field, path) in [
        ("routes_file", routes_file),
        ("clusters_file", clusters_file),
    ] {
        if !path.starts_with('/') {
            return Err(bad(format!("{field}: an absolute path, got {path:?}")));
        }
    }
    if routes_file == clusters_file {
        return Err(bad(
            "clusters_file: a file of its own, not the routes_file".into()
        ));
    }
    if let Err(e) = rollgate_core::spec::check_upstream_url("admin_url", admin_url) {
        return Err(bad(e.to_string()));
    }
    for (field, name) in [
        ("route_config_name", route_config_name),
        ("mirror_cluster", mirror_cluster),
    ] {
        if name.as_ref().is_some_and(|n| n.trim().is_empty()) {
            return Err(bad(format!("{field}: a name, or absent")));
        }
    }
    let header_ok = !key_header.is_empty()
        && key_header
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !header_ok {
        return Err(bad(format!(
            "key_header: a header name, got {key_header:?}"
        )));
    }
    Ok(())
}

/// Evidence from Prometheus: which raw counters count a revision's
/// successes, failures and latency, and how long a request may take. Each
/// selector is a PromQL series selector (no functions, no range) in which
/// `$model`, `$revision`, `$served_name` (the revision's served name, else
/// the model's) and `$instance` (the `host:port` of the revision's
/// upstream) are replaced; each must name `$revision` or `$instance`, so
/// that it tells the champion's series from the candidate's. The defaults
/// are MLServer's metric names on a server that exposes them on its
/// serving port (`rollgate serve` does; MLServer's own `metrics_port`
/// needs a `revision` label from the scrape config, `docs/config.md`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(default, deny_unknown_fields)]
pub struct PrometheusEvidence {
    /// The Prometheus server's base URL, `http://` or `https://`.
    pub url: String,
    /// A credential the controller's config declares for this URL
    /// (`[credentials.NAME]`): its file is read at every look (a rotated
    /// token is used without a restart) and sent as a bearer token to
    /// this URL only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credential: Option<String>,
    /// Specs stored before credentials had names named the file itself:
    /// refused on every write, honoured on reading only while the config
    /// declares a credential for that file and this URL.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bearer_token_file: Option<String>,
    /// Requests that succeeded.
    pub successes: String,
    /// Requests that failed by the model server's fault (5xx).
    pub failures: String,
    /// A latency histogram's `_bucket` series, if there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_buckets: Option<String>,
    /// The unit of that histogram's `le` bounds: Prometheus's convention
    /// is seconds, but the meshes publish milliseconds (Istio's
    /// `istio_request_duration_milliseconds`, Linkerd's
    /// `response_latency_ms`, Envoy's `envoy_cluster_upstream_rq_time`).
    pub latency_unit: LatencyUnit,
    /// The labels that name one scrape target: each target's counters are
    /// differenced on their own (a restart resets only its own).
    pub target_labels: Vec<String>,
    /// Prometheus's scrape interval for these targets.
    pub scrape_interval_ms: u64,
    /// The longest a request takes, plus the time a routing change takes
    /// to reach the data plane: what an epoch's counts wait for before
    /// they start (a request finishing earlier may have arrived under the
    /// split before).
    pub horizon_ms: u64,
}

impl Default for PrometheusEvidence {
    fn default() -> Self {
        PrometheusEvidence {
            url: String::new(),
            credential: None,
            bearer_token_file: None,
            successes:
                r#"model_infer_request_success_total{model="$served_name",instance="$instance"}"#
                    .into(),
            failures:
                r#"model_infer_request_failure_total{model="$served_name",instance="$instance"}"#
                    .into(),
            latency_buckets: None,
            latency_unit: LatencyUnit::Seconds,
            target_labels: vec!["job".into(), "instance".into()],
            scrape_interval_ms: 15_000,
            horizon_ms: DEFAULT_TIMEOUT_MS + 5_000,
        }
    }
}

impl PrometheusEvidence {
    fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(StoreError::Invalid(format!("model.prometheus.{m}")));
        if let Err(e) = rollgate_core::spec::check_upstream_url("url", &self.url) {
            return bad(e.to_string());
        }
        if self.bearer_token_file.is_some() {
            return bad(
                "bearer_token_file: a spec cannot name a file on the controller's host; \
                 declare the token in the controller's config as [credentials.NAME] (its file \
                 and the URL it may be sent to) and name it in \"credential\" (docs/config.md, \
                 \"Evidence from Prometheus\")"
                    .into(),
            );
        }
        if self
            .credential
            .as_ref()
            .is_some_and(|c| c.trim().is_empty())
        {
            return bad("credential: a name declared as [credentials.NAME], or absent".into());
        }
        let selectors = [
            ("successes", Some(&self.successes)),
            ("failures", Some(&self.failures)),
            ("latency_buckets", self.latency_buckets.as_ref()),
        ];
        for (field, selector) in selectors {
            if let Some(s) = selector
                && let Err(why) = check_selector(s)
            {
                return bad(format!("{field}: {why}"));
            }
            if let Some(s) = selector
                && !(s.contains("$revision") || s.contains("$instance"))
            {
                return bad(format!(
                    "{field}: {s:?} names neither $revision nor $instance, so it would count \
                     the champion's requests as the candidate's"
                ));
            }
        }
        if let Some(named) = self
            .latency_buckets
            .as_deref()
            .and_then(LatencyUnit::named_by)
            && named != self.latency_unit
        {
            let (said, set, off) = match named {
                LatencyUnit::Milliseconds => ("milliseconds", "\"ms\"", "long"),
                LatencyUnit::Seconds => ("seconds", "\"s\"", "short"),
            };
            return bad(format!(
                "latency_unit: the histogram's name says {said}; set latency_unit = {set}, \
                 or every latency reads 1000 times too {off}"
            ));
        }
        if self.target_labels.is_empty() {
            return bad("target_labels: name at least one label (e.g. instance)".into());
        }
        if self.scrape_interval_ms < 100 {
            return bad("scrape_interval_ms: at least 100".into());
        }
        Ok(())
    }
}

/// The unit of a latency histogram's bucket bounds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum LatencyUnit {
    /// `le` in seconds (`*_seconds_bucket`, `rollgate serve`, MLServer).
    #[default]
    #[serde(rename = "s")]
    Seconds,
    /// `le` in milliseconds (Istio, Linkerd, Envoy, Knative).
    #[serde(rename = "ms")]
    Milliseconds,
}

impl LatencyUnit {
    /// A bucket bound in seconds.
    pub fn seconds(self, le: f64) -> f64 {
        match self {
            LatencyUnit::Seconds => le,
            LatencyUnit::Milliseconds => le / 1000.0,
        }
    }

    /// The unit a metric's name says, if it says one (`_seconds`,
    /// `_milliseconds`, `_ms`, as Prometheus's naming rules and the
    /// meshes spell them).
    fn named_by(selector: &str) -> Option<LatencyUnit> {
        let name = selector.split('{').next().unwrap_or_default();
        let name = name.strip_suffix("_bucket").unwrap_or(name);
        if name.ends_with("_milliseconds") || name.ends_with("_ms") || name.contains("_ms_") {
            Some(LatencyUnit::Milliseconds)
        } else if name.ends_with("_seconds") || name.contains("_seconds_") {
            Some(LatencyUnit::Seconds)
        } else {
            None
        }
    }
}

/// A series selector as Prometheus reads one before a range: a metric name
/// and/or one `{...}` of matchers, nothing else.
fn check_selector(s: &str) -> std::result::Result<(), String> {
    let s = s.trim();
    let (name, matchers) = match s.find('{') {
        Some(i) => (&s[..i], Some(&s[i..])),
        None => (s, None),
    };
    let name_ok = name.chars().enumerate().all(|(i, c)| {
        c.is_ascii_alphabetic() || c == '_' || c == ':' || (i > 0 && c.is_ascii_digit())
    });
    if !name_ok || (name.is_empty() && matchers.is_none()) {
        return Err(format!(
            "{s:?} is not a series selector (metric{{label=\"value\"}})"
        ));
    }
    if let Some(m) = matchers
        && !m.ends_with('}')
    {
        return Err(format!("{s:?}: the matchers {{...}} end the selector"));
    }
    Ok(())
}

impl ModelSpec {
    /// The shared spec validator (`rollgate_core::spec`): the same rules
    /// the gateway applies to a route.
    pub fn validate(&self) -> Result<()> {
        rollgate_core::spec::check_model(&rollgate_core::spec::ModelShape {
            protocol: self.protocol,
            json_path: self.json_path.as_deref(),
            key_field: self.key_field.as_deref(),
            output_pointer: self.output_pointer.as_deref(),
            confidence_threshold: self.confidence_threshold,
            output: self.output.as_deref(),
        })
        .map_err(|e| StoreError::Invalid(format!("model.{e}")))?;
        if let Some(p) = &self.prometheus {
            p.validate()?;
        }
        if let Some(r) = &self.registry {
            r.validate()?;
        }
        if self.data_plane.is_some() && self.prometheus.is_none() {
            // rollgate's gateways see only the copies they mirror.
            return Err(StoreError::Invalid(
                "model.prometheus: a model routed by another data plane takes its evidence \
                 from Prometheus: set prometheus"
                    .into(),
            ));
        }
        match &self.data_plane {
            None => Ok(()),
            Some(DataPlaneRef::Named(name)) if name.trim().is_empty() => Err(StoreError::Invalid(
                format!("model.data_plane: a name, or absent; {DECLARE_DATA_PLANES}"),
            )),
            Some(DataPlaneRef::Named(_)) => Ok(()),
            Some(DataPlaneRef::Inline(plane)) => Err(StoreError::Invalid(format!(
                "model.data_plane: a spec cannot hold a {} data plane's files, commands or \
                 credentials (they act on the controller's host); {DECLARE_DATA_PLANES}",
                plane.kind()
            ))),
        }
    }
}

/// A registered model and its current champion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Model {
    pub name: String,
    pub spec: ModelSpec,
    pub champion: Option<String>,
    pub created_at: Timestamp,
}

/// Request timeout a revision gets when none is given.
pub const DEFAULT_TIMEOUT_MS: u64 = 30_000;

/// What a revision is: where it serves, what it runs, and how.
///
/// Identity is the hash of the normalised spec, where absent, empty and
/// default values are the same thing: a platform that omits an empty list or
/// a zero default must not make an unchanged revision look new (the drift
/// loop in the seeds).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(default, deny_unknown_fields)]
pub struct RevisionSpec {
    /// Base URL of the model server, `http://` or `https://`.
    pub upstream: String,
    /// Base URL of the model server's gRPC endpoint (the Open Inference
    /// Protocol's), if it has one: `http://` (HTTP/2 without TLS) or
    /// `https://`. MLServer's is its `grpc_port`; rollgate's own model
    /// server answers gRPC on its one port.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grpc_upstream: Option<String>,
    /// The model artifact (path, URI or digest), for the record.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub artifact: Option<String>,
    /// Readiness probe path (protocol default if unset).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub readiness_path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Headers the gateway sends upstream with every request (e.g. `Host`,
    /// an auth token), over the client's of the same name.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// Headers whose values are secret: never shown by the API or written
    /// to the audit log (`authorization`, `proxy-authorization`, `cookie`
    /// and `x-api-key` always are).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub secret_headers: Vec<String>,
    /// The name the model server serves this model under, when it is not
    /// the model's (KServe's default is the InferenceService's name): the
    /// gateway rewrites `/v1/models/{model}` and `/v2/models/{model}` to it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub served_name: Option<String>,
    /// Environment of the model server (recorded with the revision).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// `env` names whose values are secret, beside those that look secret
    /// ([`SECRET_ENV_MARKS`]): never shown by the API or written to the
    /// audit log.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secret_env: Vec<String>,
    /// The KServe predictor this revision deploys (`spec.predictor` of an
    /// `InferenceService`: model format, storage URI, runtime, resources),
    /// for a `kserve` data plane: rolling back writes the champion's back
    /// exactly. Nulls and empty lists are dropped when it is registered
    /// (KServe reports neither); `canaryTrafficPercent` and `name` are the
    /// adapter's.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub predictor: Option<serde_json::Value>,
    /// The registry version it was registered from, when a registry's
    /// alias started it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub registry_version: Option<RegistryVersion>,
}

/// An `env` name containing one of these (in any case) is always secret.
pub const SECRET_ENV_MARKS: [&str; 6] =
    ["TOKEN", "SECRET", "PASSWORD", "PASSWD", "KEY", "CREDENTIAL"];

/// Header names whose values are always secret.
const ALWAYS_SECRET: [&str; 4] = [
    "authorization",
    "proxy-authorization",
    "cookie",
    "x-api-key",
];

/// What a secret value is shown as.
pub const REDACTED: &str = "<redacted>";

/// Serialises a revision's spec with its secret header values redacted:
/// what the API answers and the audit log records.
pub fn redacted<S: serde::Serializer>(
    spec: &RevisionSpec,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    spec.redacted().serialize(s)
}

fn blank_to_none(s: &Option<String>) -> Option<String> {
    s.as_deref()
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(str::to_string)
}

impl RevisionSpec {
    /// Whether the header `name`'s value is secret.
    pub fn is_secret(&self, name: &str) -> bool {
        ALWAYS_SECRET.iter().any(|s| s.eq_ignore_ascii_case(name))
            || self
                .secret_headers
                .iter()
                .any(|s| s.eq_ignore_ascii_case(name))
    }

    /// Whether the `env` variable `name`'s value is secret.
    pub fn is_secret_env(&self, name: &str) -> bool {
        let upper = name.to_ascii_uppercase();
        SECRET_ENV_MARKS.iter().any(|m| upper.contains(m))
            || self.secret_env.iter().any(|s| s.eq_ignore_ascii_case(name))
    }

    /// The spec with every secret header and `env` value replaced by
    /// [`REDACTED`].
    pub fn redacted(&self) -> RevisionSpec {
        let mut out = self.clone();
        for (k, v) in out.headers.iter_mut() {
            if self.is_secret(k) {
                *v = REDACTED.to_string();
            }
        }
        for (k, v) in out.env.iter_mut() {
            if self.is_secret_env(k) {
                *v = REDACTED.to_string();
            }
        }
        out
    }

    /// The canonical form: trimmed, empty and default values removed.
    pub fn normalised(&self) -> Result<RevisionSpec> {
        let upstream = self.upstream.trim().trim_end_matches('/').to_string();
        rollgate_core::spec::check_upstream_url("revision.upstream", &upstream)
            .map_err(|e| StoreError::Invalid(e.to_string()))?;
        let grpc_upstream =
            blank_to_none(&self.grpc_upstream).map(|u| u.trim_end_matches('/').to_string());
        if let Some(u) = &grpc_upstream {
            rollgate_core::spec::check_upstream_url("revision.grpc_upstream", u)
                .map_err(|e| StoreError::Invalid(e.to_string()))?;
        }
        let readiness_path = blank_to_none(&self.readiness_path);
        if let Some(p) = &readiness_path
            && !p.starts_with('/')
        {
            return Err(StoreError::Invalid(format!(
                "revision.readiness_path must start with '/', got {p:?}"
            )));
        }
        for (name, value) in &self.headers {
            rollgate_core::spec::check_header(name, value)
                .map_err(|e| StoreError::Invalid(format!("revision.{e}")))?;
        }
        let served_name = blank_to_none(&self.served_name);
        if let Some(n) = &served_name {
            rollgate_core::spec::check_model_name(n)
                .map_err(|e| StoreError::Invalid(format!("revision.served_name {}", e.message)))?;
        }
        let mut secret_headers: Vec<String> = self
            .secret_headers
            .iter()
            .map(|h| h.trim().to_ascii_lowercase())
            .filter(|h| !h.is_empty())
            .collect();
        secret_headers.sort();
        secret_headers.dedup();
        let mut secret_env: Vec<String> = self
            .secret_env
            .iter()
            .map(|e| e.trim().to_string())
            .filter(|e| !e.is_empty())
            .collect();
        secret_env.sort();
        secret_env.dedup();
        if self.timeout_ms == Some(0) {
            return Err(StoreError::Invalid(
                "revision.timeout_ms must be positive".into(),
            ));
        }
        let predictor = match &self.predictor {
            None => None,
            Some(p) => Some(check_predictor(p, &self.secret_env)?),
        };
        Ok(RevisionSpec {
            predictor,
            upstream,
            grpc_upstream,
            artifact: blank_to_none(&self.artifact),
            readiness_path,
            timeout_ms: self.timeout_ms.filter(|&t| t != DEFAULT_TIMEOUT_MS),
            headers: self.headers.clone(),
            secret_headers,
            served_name,
            env: self.env.clone(),
            secret_env,
            registry_version: self.registry_version.clone(),
        })
    }

    /// `r` + 16 hex digits of SHA-256 over the model name and the canonical
    /// JSON of the normalised spec.
    pub fn identity(&self, model: &str) -> Result<String> {
        let canonical = serde_json::to_string(&self.normalised()?)?;
        let digest = Sha256::digest(format!("{model}\n{canonical}"));
        Ok(format!("r{}", hex::encode(&digest[..8])))
    }
}

/// A revision's KServe predictor in its canonical form: a JSON object
/// with nulls and empty lists dropped at every depth (KServe reports
/// neither; an empty map stays, as `emptyDir: {}` means something), and
/// without the fields the adapter writes.
fn check_predictor(
    predictor: &serde_json::Value,
    secret_env: &[String],
) -> Result<serde_json::Value> {
    let bad = |m: &str| Err(StoreError::Invalid(format!("revision.predictor {m}")));
    let Some(fields) = predictor.as_object() else {
        return bad("must be an object (an InferenceService's spec.predictor)");
    };
    for owned in ["canaryTrafficPercent", "name"] {
        if fields.contains_key(owned) {
            return bad(&format!(
                "must not set {owned}: the kserve data plane writes it for each stage"
            ));
        }
    }
    if let Some(name) = secret_in_env(predictor, secret_env) {
        return bad(&format!(
            "sets the secret-looking env {name:?} to a literal value: refer to a Secret \
             (valueFrom.secretKeyRef), which the revision never holds"
        ));
    }
    let canonical = without_empties(predictor).unwrap_or_default();
    if canonical.as_object().is_none_or(|o| o.is_empty()) {
        return bad("is empty: say what it serves (e.g. model.storageUri)");
    }
    Ok(canonical)
}

/// The name of an `env` entry (at any depth) that holds a literal value
/// under a secret-looking name ([`SECRET_ENV_MARKS`]) or one of the
/// revision's `secret_env`.
fn secret_in_env(value: &serde_json::Value, secret_env: &[String]) -> Option<String> {
    use serde_json::Value;
    match value {
        Value::Object(o) => o.iter().find_map(|(k, v)| {
            let literal = |e: &Value| {
                let name = e["name"].as_str()?.to_ascii_uppercase();
                let marked = SECRET_ENV_MARKS.iter().any(|m| name.contains(m))
                    || secret_env.iter().any(|s| s.eq_ignore_ascii_case(&name));
                (marked && !e["value"].is_null()).then_some(name)
            };
            let here = (k == "env").then(|| v.as_array()?.iter().find_map(literal));
            here.flatten().or_else(|| secret_in_env(v, secret_env))
        }),
        Value::Array(a) => a.iter().find_map(|v| secret_in_env(v, secret_env)),
        _ => None,
    }
}

/// `value` without nulls and empty lists (at every depth); `None` if
/// nothing is left of it.
pub fn without_empties(value: &serde_json::Value) -> Option<serde_json::Value> {
    use serde_json::Value;
    match value {
        Value::Null => None,
        Value::Array(a) => {
            let kept: Vec<Value> = a.iter().filter_map(without_empties).collect();
            (!kept.is_empty()).then_some(Value::Array(kept))
        }
        Value::Object(o) => {
            let kept: serde_json::Map<String, Value> = o
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), without_empties(v)?)))
                .collect();
            Some(Value::Object(kept))
        }
        other => Some(other.clone()),
    }
}

/// Where a revision stands in its model's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum RevisionState {
    /// Registered, not serving.
    Available,
    /// Serves the model's traffic. Exactly one per model once set.
    Champion,
    /// Under an active rollout. At most one per model.
    Candidate,
    /// A former champion.
    Archived,
    /// Rolled back; blocked from new rollouts until unblocked.
    Rejected,
}

impl RevisionState {
    pub fn as_str(self) -> &'static str {
        match self {
            RevisionState::Available => "available",
            RevisionState::Champion => "champion",
            RevisionState::Candidate => "candidate",
            RevisionState::Archived => "archived",
            RevisionState::Rejected => "rejected",
        }
    }

    pub fn parse(s: &str) -> Option<RevisionState> {
        Some(match s {
            "available" => RevisionState::Available,
            "champion" => RevisionState::Champion,
            "candidate" => RevisionState::Candidate,
            "archived" => RevisionState::Archived,
            "rejected" => RevisionState::Rejected,
            _ => return None,
        })
    }
}

/// An immutable revision and its registry state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Revision {
    pub id: String,
    pub model: String,
    /// Serialised with secret header values redacted.
    #[serde(serialize_with = "redacted")]
    pub spec: RevisionSpec,
    pub state: RevisionState,
    /// How many rollouts of it rejected it (showed it worse, or it never
    /// became ready), ever.
    pub rejections: u32,
    /// Blocked from new rollouts until an operator unblocks it.
    pub blocked: bool,
    pub created_at: Timestamp,
}

#[cfg(test)]
mod tests;
