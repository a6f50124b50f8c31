//! Gateway API: one `HTTPRoute` (`gateway.networking.k8s.io/v1`) per
//! template of the data plane, for each model. The route has one rule:
//! the live revisions' Services as `backendRefs` weighted in basis points
//! (a weight is relative: 500 against 9,500 is 5%), every request mirrored
//! to rollgate's gateway when the data plane declares a mirror. In force
//! when every parent the route names reports `Accepted` for the route's
//! generation (`status.parents[].conditions[].observedGeneration`).

use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use rollgate_store::{MirrorTo, RouteTemplate};
use serde_json::{Value, json};

use super::{Service, Shape, fill};
use crate::{AdapterError, Desired};

/// A Gateway API data plane's routes.
#[derive(Debug)]
pub(crate) struct HttpRoutes {
    pub routes: Vec<RouteTemplate>,
    pub mirror: Option<MirrorTo>,
    /// Only this controller's reports count.
    pub controller_name: Option<String>,
}

impl Shape for HttpRoutes {
    fn kind(&self) -> &'static str {
        "gateway_api"
    }

    fn resource(&self) -> ApiResource {
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("gateway.networking.k8s.io", "v1", "HTTPRoute"),
            "httproutes",
        )
    }

    fn objects(&self, desired: &Desired) -> Result<Vec<(String, Value)>, AdapterError> {
        let mut backends = Vec::with_capacity(desired.arms.len());
        for arm in desired.arms.iter().filter(|a| a.weight_bp > 0) {
            let service = Service::of(&arm.upstream)?;
            let mut backend = json!({
                "name": service.name,
                "port": service.port,
                "weight": arm.weight_bp,
            });
            if let Some(ns) = service.namespace {
                backend["namespace"] = json!(ns);
            }
            backends.push(backend);
        }
        let mut rule = json!({ "backendRefs": backends });
        if let Some(m) = &self.mirror {
            let mut target = json!({ "name": m.service, "port": m.port });
            if let Some(ns) = &m.namespace {
                target["namespace"] = json!(ns);
            }
            rule["filters"] = json!([{
                "type": "RequestMirror",
                "requestMirror": { "backendRef": target },
            }]);
        }
        let model = &desired.model;
        Ok(self
            .routes
            .iter()
            .map(|t| {
                let mut rule = rule.clone();
                if let Some(prefix) = &t.path_prefix {
                    rule["matches"] = json!([{
                        "path": { "type": "PathPrefix", "value": fill(prefix, model) },
                    }]);
                }
                let parents: Vec<Value> = t
                    .parent_refs
                    .iter()
                    .map(|p| {
                        let mut parent = json!({ "name": p.name });
                        if let Some(ns) = &p.namespace {
                            parent["namespace"] = json!(ns);
                        }
                        if let Some(s) = &p.section_name {
                            parent["sectionName"] = json!(s);
                        }
                        parent
                    })
                    .collect();
                let mut spec = json!({ "parentRefs": parents, "rules": [rule] });
                if !t.hostnames.is_empty() {
                    let hosts: Vec<String> = t.hostnames.iter().map(|h| fill(h, model)).collect();
                    spec["hostnames"] = json!(hosts);
                }
                (fill(&t.name, model), spec)
            })
            .collect())
    }

    fn in_force(&self, object: &DynamicObject, generation: i64) -> Result<(), String> {
        let parents = object.data["spec"]["parentRefs"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let reports = object.data["status"]["parents"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for parent in &parents {
            let name = parent["name"].as_str().unwrap_or_default();
            let report = reports.iter().find(|r| {
                same_parent(&r["parentRef"], parent)
                    && self
                        .controller_name
                        .as_deref()
                        .is_none_or(|c| r["controllerName"] == c)
            });
            let Some(report) = report else {
                return Err(format!(
                    "no controller has reported on parent {name:?} (is the Gateway's controller running?)"
                ));
            };
            // Both must hold at this generation: a route accepted with a
            // backend it cannot resolve does not serve that backend.
            for kind in ["Accepted", "ResolvedRefs"] {
                match condition(report, kind, generation) {
                    Some(c) if c["status"] == "True" => {}
                    Some(c) => {
                        return Err(format!(
                            "parent {name:?} reports {kind} not true for generation {generation}: {} {}",
                            c["reason"].as_str().unwrap_or_default(),
                            c["message"].as_str().unwrap_or_default()
                        ));
                    }
                    None => {
                        return Err(format!(
                            "parent {name:?} has not reported generation {generation} yet ({kind})"
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}

/// A parent's condition `kind` if it reports generation `generation` or a
/// later one.
fn condition<'a>(report: &'a Value, kind: &str, generation: i64) -> Option<&'a Value> {
    report["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind && c["observedGeneration"].as_i64().unwrap_or(0) >= generation)
}

/// Whether a status entry's `parentRef` is the spec's `parent` (the
/// defaults of group, kind and namespace aside).
fn same_parent(reported: &Value, parent: &Value) -> bool {
    ["name", "namespace", "sectionName"].iter().all(|f| {
        parent[f].is_null()
            || reported[f] == parent[f]
            || (*f == "namespace" && reported[f].is_null())
    })
}
