//! The declarations of data planes rollgate drives through a Kubernetes
//! API server (`DataPlane::GatewayApi`, `DataPlane::Istio`,
//! `DataPlane::Kserve`): how to reach
//! the cluster, and what of the routing objects the operator decides
//! (names, parents, hosts). The objects' weights are the adapter's.

use serde::{Deserialize, Serialize};

use crate::{Result, StoreError};

/// How the controller reaches a Kubernetes API server. All absent: the
/// pod's service account when running in a cluster, else `$KUBECONFIG` or
/// `~/.kube/config` (its current context).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(default, deny_unknown_fields)]
pub struct KubeAccess {
    /// A kubeconfig file to read instead of the inferred one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubeconfig: Option<String>,
    /// The kubeconfig context to use (its current context if absent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
    /// The API server's URL (`https://host:port`), over any kubeconfig's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// A PEM file of the CA that signed the API server's certificate (with
    /// `url`): trusted instead of the system's roots.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
    /// A file holding a bearer token (with `url`), read when the client
    /// is made; never stored here.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_file: Option<String>,
}

/// A Gateway API `HTTPRoute` rollgate writes for each model it routes
/// (one or several per model: a route per Gateway, say). `$model` in the
/// name, the path prefix and the hostnames stands for the model's name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RouteTemplate {
    /// The route's name, e.g. `"$model"` or `"$model-internal"`.
    pub name: String,
    /// The Gateways (or other parents) the route attaches to.
    pub parent_refs: Vec<ParentRef>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hostnames: Vec<String>,
    /// The route matches requests under this path (all if absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_prefix: Option<String>,
}

/// A route's parent, as Gateway API's `ParentReference` names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ParentRef {
    pub name: String,
    /// The parent's namespace (the route's if absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// A listener of the Gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub section_name: Option<String>,
}

/// Where a Kubernetes data plane mirrors every request so that rollgate's
/// gateway can measure a SHADOW stage: a Service and its port (the
/// gateway serving the model mirror-only).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct MirrorTo {
    /// The Service's name (Gateway API) or host (Istio).
    pub service: String,
    pub port: u16,
    /// The Service's namespace (the route's if absent; Gateway API).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// Predictor fields that choose what runs in the cluster, under which
/// identity, or which Secrets it reads: an API caller registers revisions,
/// so a predictor holding one is routed only where the operator's
/// declaration allows it (`allow_predictor_fields`).
pub const GUARDED_PREDICTOR_FIELDS: [&str; 18] = [
    "image",
    "command",
    "containers",
    "initContainers",
    "serviceAccountName",
    "serviceAccount",
    "automountServiceAccountToken",
    "volumes",
    "hostNetwork",
    "hostPID",
    "hostIPC",
    "securityContext",
    "nodeName",
    "imagePullSecrets",
    "workerSpec",
    "envFrom",
    "secretKeyRef",
    "secret",
];

/// A DNS-1123 label: what Kubernetes accepts as a namespace's or a
/// Service's name.
pub fn is_dns_label(s: &str) -> bool {
    (1..=63).contains(&s.len())
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// The checks shared by the Kubernetes data planes, with `bad` naming
/// where the error is.
pub(crate) fn check(
    bad: &dyn Fn(String) -> StoreError,
    access: &KubeAccess,
    namespace: &str,
    mirror: Option<&MirrorTo>,
) -> Result<()> {
    if !is_dns_label(namespace) {
        return Err(bad(format!(
            "namespace: a Kubernetes namespace name (lower-case letters, digits, '-'), got {namespace:?}"
        )));
    }
    if let Some(url) = &access.url
        && !(url.starts_with("https://") || url.starts_with("http://"))
    {
        return Err(bad(format!(
            "cluster.url: the API server's https:// URL, got {url:?}"
        )));
    }
    for (field, path) in [
        ("kubeconfig", &access.kubeconfig),
        ("ca_file", &access.ca_file),
        ("token_file", &access.token_file),
    ] {
        if let Some(p) = path
            && !p.starts_with('/')
        {
            return Err(bad(format!("cluster.{field}: an absolute path, got {p:?}")));
        }
    }
    if access.url.is_none() && (access.ca_file.is_some() || access.token_file.is_some()) {
        return Err(bad(
            "cluster.url: ca_file and token_file go with the API server's url".into(),
        ));
    }
    if let Some(m) = mirror
        && (m.service.trim().is_empty() || m.port == 0)
    {
        return Err(bad(format!(
            "mirror: a Service and a port, got {:?}:{}",
            m.service, m.port
        )));
    }
    Ok(())
}

/// The checks of a Gateway API data plane's routes.
pub(crate) fn check_routes(
    bad: &dyn Fn(String) -> StoreError,
    routes: &[RouteTemplate],
) -> Result<()> {
    if routes.is_empty() {
        return Err(bad(
            "routes: at least one HTTPRoute, e.g. [{ name = \"$model\", parent_refs = [{ name = \"inference\" }] }]"
                .into(),
        ));
    }
    let mut names = std::collections::BTreeSet::new();
    for (i, r) in routes.iter().enumerate() {
        // A model's name fills `$model`: the rest must be a name already.
        let sample = r.name.replace("$model", "m");
        if !is_dns_label(&sample) {
            return Err(bad(format!(
                "routes[{i}].name: a Kubernetes name once $model is filled in, got {:?}",
                r.name
            )));
        }
        if !names.insert(&r.name) {
            return Err(bad(format!(
                "routes[{i}].name: {:?} twice: each route its own name",
                r.name
            )));
        }
        if r.parent_refs.is_empty() || r.parent_refs.iter().any(|p| p.name.trim().is_empty()) {
            return Err(bad(format!(
                "routes[{i}].parent_refs: at least one Gateway, each by name"
            )));
        }
        if let Some(p) = &r.path_prefix
            && !p.starts_with('/')
        {
            return Err(bad(format!(
                "routes[{i}].path_prefix: a path starting with '/', got {p:?}"
            )));
        }
    }
    Ok(())
}

/// A KServe data plane's `allow_predictor_fields`: each one of
/// [`GUARDED_PREDICTOR_FIELDS`].
pub(crate) fn check_allowed_fields(
    bad: &dyn Fn(String) -> StoreError,
    allowed: &[String],
) -> Result<()> {
    match allowed
        .iter()
        .find(|a| !GUARDED_PREDICTOR_FIELDS.contains(&a.as_str()))
    {
        Some(a) => Err(bad(format!(
            "allow_predictor_fields: {a:?} is not guarded (only {GUARDED_PREDICTOR_FIELDS:?} are)"
        ))),
        None => Ok(()),
    }
}

/// An object's name (`name`): a Kubernetes name once `$model` is filled.
pub(crate) fn check_object_name(bad: &dyn Fn(String) -> StoreError, name: &str) -> Result<()> {
    if !is_dns_label(&name.replace("$model", "m")) {
        return Err(bad(format!(
            "name: a Kubernetes name once $model is filled in, got {name:?}"
        )));
    }
    Ok(())
}

/// The checks of an Istio data plane's VirtualService.
pub(crate) fn check_virtual_service(
    bad: &dyn Fn(String) -> StoreError,
    name: &str,
    hosts: &[String],
    mirror: Option<&MirrorTo>,
) -> Result<()> {
    if mirror.is_some_and(|m| m.namespace.is_some()) {
        return Err(bad(
            "mirror.namespace: Istio names the mirror by host (e.g. \"rollgate-gateway.rollgate.svc.cluster.local\")"
                .into(),
        ));
    }
    check_object_name(bad, name)?;
    if hosts.is_empty() || hosts.iter().any(|h| h.trim().is_empty()) {
        return Err(bad(
            "hosts: at least one host the VirtualService answers for".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::DataPlane;

    fn plane(v: &Value) -> std::result::Result<(), String> {
        let plane: DataPlane = serde_json::from_value(v.clone()).map_err(|e| e.to_string())?;
        plane.validate("data_planes.k8s").map_err(|e| e.to_string())
    }

    /// `good` with `pointer` set to `value`.
    fn with(good: &Value, pointer: &str, value: Value) -> Value {
        let mut v = good.clone();
        let (parent, key) = pointer.rsplit_once('/').expect("a pointer");
        match v.pointer_mut(parent).expect("the parent") {
            Value::Object(o) => {
                o.insert(key.to_string(), value);
            }
            Value::Array(a) => a[key.parse::<usize>().expect("an index")] = value,
            _ => panic!("{pointer}"),
        }
        v
    }

    #[test]
    fn a_gateway_api_plane_needs_a_namespace_routes_and_parents() {
        let good = json!({
            "kind": "gateway_api",
            "namespace": "models",
            "routes": [{ "name": "$model", "parent_refs": [{ "name": "inference" }] }],
        });
        assert_eq!(plane(&good), Ok(()));
        let route = good["routes"][0].clone();
        for (pointer, value, says) in [
            ("/namespace", json!("Models"), "data_planes.k8s.namespace"),
            ("/routes", json!([]), "routes: at least one"),
            ("/routes/0/name", json!("$model_x"), "routes[0].name"),
            ("/routes/0/parent_refs", json!([]), "routes[0].parent_refs"),
            (
                "/routes/0/path_prefix",
                json!("v2"),
                "routes[0].path_prefix",
            ),
            ("/routes/1", route, "twice"),
            (
                "/cluster",
                json!({ "token_file": "/t" }),
                "ca_file and token_file go with",
            ),
            (
                "/cluster",
                json!({ "kubeconfig": "kc" }),
                "cluster.kubeconfig: an absolute path",
            ),
            (
                "/cluster",
                json!({ "url": "ftp://x" }),
                "cluster.url: the API server's",
            ),
            (
                "/mirror",
                json!({ "service": "gw", "port": 0 }),
                "mirror: a Service and a port",
            ),
            ("/weights", json!({}), "unknown field"),
        ] {
            let v = if pointer == "/routes/1" {
                let mut v = good.clone();
                v["routes"].as_array_mut().expect("routes").push(value);
                v
            } else {
                with(&good, pointer, value)
            };
            let err = plane(&v).expect_err(pointer);
            assert!(err.contains(says), "{pointer}: {says:?} in {err}");
        }
    }

    #[test]
    fn an_istio_plane_needs_hosts_and_a_name() {
        let good = json!({
            "kind": "istio",
            "namespace": "models",
            "hosts": ["$model.models.svc.cluster.local"],
        });
        assert_eq!(plane(&good), Ok(()));
        for (pointer, value, says) in [
            ("/hosts", json!([]), "data_planes.k8s.hosts"),
            ("/hosts", json!([" "]), "data_planes.k8s.hosts"),
            ("/name", json!("VS"), "data_planes.k8s.name"),
            (
                "/mirror",
                json!({ "service": "gw", "port": 80, "namespace": "x" }),
                "mirror.namespace",
            ),
        ] {
            let err = plane(&with(&good, pointer, value)).expect_err(pointer);
            assert!(err.contains(says), "{pointer}: {says:?} in {err}");
        }
    }

    #[test]
    fn a_kserve_plane_needs_a_namespace_and_names_its_mode() {
        let good = json!({ "kind": "kserve", "namespace": "models" });
        assert_eq!(plane(&good), Ok(()));
        for mode in ["knative", "serverless", "standard", "raw_deployment"] {
            assert_eq!(plane(&with(&good, "/mode", json!(mode))), Ok(()), "{mode}");
        }
        for (pointer, value, says) in [
            ("/namespace", json!("a.b"), "data_planes.k8s.namespace"),
            ("/name", json!("$model.v1"), "data_planes.k8s.name"),
            ("/mode", json!("modelmesh"), "unknown variant"),
            (
                "/allow_predictor_fields",
                json!(["model"]),
                "allow_predictor_fields",
            ),
            ("/canary", json!(10), "unknown field"),
        ] {
            let err = plane(&with(&good, pointer, value)).expect_err(pointer);
            assert!(err.contains(says), "{pointer}: {says:?} in {err}");
        }
    }

    #[test]
    fn dns_labels_are_what_kubernetes_accepts() {
        for ok in ["a", "models", "m-1", &"a".repeat(63)] {
            assert!(is_dns_label(ok), "{ok}");
        }
        for bad in ["", "-a", "a-", "A", "a.b", "a_b", &"a".repeat(64)] {
            assert!(!is_dns_label(bad), "{bad}");
        }
    }
}
