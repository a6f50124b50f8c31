//! The Envoy adapter: the model's routing as Envoy's own file-based
//! dynamic configuration. A cluster per revision goes into the CDS file
//! (shared by models: only this model's clusters are rewritten), then the
//! model's `RouteConfiguration` into its RDS file (`weighted_clusters`
//! chosen by a hash of the sticky key header, so a user stays on one arm
//! while the weights hold), each replaced in one rename for Envoy's file
//! watch. Confirmed from the admin's `/config_dump`: the clusters active
//! before the routes name them, then the routes' `version_info`. The
//! routes file records the routing's generation in the route
//! configuration's metadata, read back before each write.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::{Value, json};

use crate::error::not_older;
use crate::{Adapter, AdapterError, Desired, HttpClient, ident, write_atomically};

const CLUSTER_TYPE: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const ROUTES_TYPE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";

/// The CDS file is read, changed and written by every Envoy-routed model:
/// one at a time.
static CLUSTERS_FILE: Mutex<()> = Mutex::new(());

/// A model's Envoy, as its `DataPlane::Envoy` declares it: where its
/// routing goes.
#[derive(Debug)]
pub(crate) struct Envoy {
    pub http: HttpClient,
    pub routes_file: String,
    pub clusters_file: String,
    /// Without a trailing `/`.
    pub admin_url: String,
    pub route_config_name: Option<String>,
    pub key_header: String,
    /// Every request mirrored to this cluster (rollgate's gateway).
    pub mirror_cluster: Option<String>,
}

impl Adapter for Envoy {
    fn kind(&self) -> &'static str {
        "envoy"
    }

    fn send<'a>(&'a self, desired: &'a Desired) -> BoxFuture<'a, Result<(), AdapterError>> {
        Box::pin(self.apply_and_confirm(desired))
    }

    /// The routes file, then the clusters file.
    fn seed_files(&self, desired: &Desired) -> Result<Vec<(String, String)>, AdapterError> {
        let (routes, clusters) =
            seed(desired, self.route_config_name.as_deref(), &self.key_header)?;
        Ok(vec![
            (self.routes_file.clone(), format!("{routes:#}\n")),
            (self.clusters_file.clone(), format!("{clusters:#}\n")),
        ])
    }
}

fn cluster_name(model: &str, revision: &str) -> String {
    format!("rollgate_{}_{}", ident(model), ident(revision))
}

/// One STRICT_DNS cluster for a revision's `http://host:port` upstream.
fn cluster(name: &str, upstream: &str) -> Result<Value, AdapterError> {
    let unroutable = |why: &str| AdapterError::Unroutable {
        upstream: upstream.to_string(),
        why: why.to_string(),
    };
    let authority = upstream
        .strip_prefix("http://")
        .ok_or_else(|| unroutable("the Envoy adapter proxies plain http:// upstreams"))?
        .split('/')
        .next()
        .unwrap_or_default();
    let (host, port) = authority
        .rsplit_once(':')
        .and_then(|(h, p)| Some((h.trim_matches(['[', ']']), p.parse::<u16>().ok()?)))
        .unwrap_or((authority, 80));
    if host.is_empty() {
        return Err(unroutable("no host"));
    }
    Ok(json!({
        "@type": CLUSTER_TYPE,
        "name": name,
        "type": "STRICT_DNS",
        "connect_timeout": "2s",
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": {"socket_address": {"address": host, "port_value": port}}}}
        ]}]},
    }))
}

/// The RDS file for `desired`: one virtual host, one route, the live arms
/// weighted in basis points and picked by the hash of `key_header` (a
/// request without it is placed at random); each answer names the
/// revision that served it in `x-rollgate-revision`, as rollgate's
/// gateway does, and the routing version in `x-rollgate-routing`; every
/// request is mirrored to `mirror_cluster` if given. The generation is
/// recorded in the configuration's metadata (`filter_metadata.rollgate`).
fn render_routes(
    desired: &Desired,
    name: &str,
    key_header: &str,
    mirror_cluster: Option<&str>,
) -> Value {
    let clusters: Vec<Value> = desired
        .arms
        .iter()
        .filter(|a| a.weight_bp > 0)
        .map(|a| {
            json!({
                "name": cluster_name(&desired.model, &a.revision),
                "weight": a.weight_bp,
                "response_headers_to_add": [{
                    "header": {"key": "x-rollgate-revision", "value": a.revision},
                    "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
                }],
            })
        })
        .collect();
    let mut route = json!({
        "hash_policy": [{"header": {"header_name": key_header}}],
        "weighted_clusters": {"use_hash_policy": true, "clusters": clusters},
    });
    if let Some(cluster) = mirror_cluster {
        route["request_mirror_policies"] = json!([{"cluster": cluster}]);
    }
    json!({
        "version_info": desired.version,
        "resources": [{
            "@type": ROUTES_TYPE,
            "name": name,
            "metadata": {"filter_metadata": {"rollgate": {"generation": desired.generation}}},
            // The version in the configuration itself, not only beside it:
            // Envoy keeps a configuration whose content did not change
            // (SHADOW's routing is the champion's, under a new version),
            // and `/config_dump` would go on showing the old version.
            "response_headers_to_add": [{
                "header": {"key": "x-rollgate-routing", "value": desired.version},
                "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
            }],
            "virtual_hosts": [{"name": "rollgate", "domains": ["*"], "routes": [{
                "match": {"prefix": "/"},
                "route": route,
            }]}],
        }],
    })
}

/// The files a data plane needs before it first starts, routing `desired`
/// (the champion, before rollgate writes them): the routes file, then the
/// clusters file.
fn seed(
    desired: &Desired,
    route_config_name: Option<&str>,
    key_header: &str,
) -> Result<(Value, Value), AdapterError> {
    let name = route_config_name.map_or_else(
        || format!("rollgate_{}", ident(&desired.model)),
        String::from,
    );
    let routes = render_routes(desired, &name, key_header, None);
    let clusters = merge_clusters(None, desired, &BTreeSet::new())?;
    Ok((routes, clusters))
}

/// The generation a routes file records (0 if it records none: a seed
/// from before generations, or a file that is not one of rollgate's).
fn generation_of(routes: &Value) -> u64 {
    routes["resources"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["metadata"]["filter_metadata"]["rollgate"]["generation"].as_u64())
        .max()
        .unwrap_or(0)
}

/// The cluster names a routes file routes to.
fn routed_clusters(routes: &Value) -> BTreeSet<String> {
    routes["resources"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|r| r["virtual_hosts"].as_array().into_iter().flatten())
        .flat_map(|v| v["routes"].as_array().into_iter().flatten())
        .flat_map(|r| {
            r["route"]["weighted_clusters"]["clusters"]
                .as_array()
                .into_iter()
                .flatten()
        })
        .filter_map(|c| c["name"].as_str().map(str::to_string))
        .collect()
}

/// The CDS file with this model's clusters made `wanted` plus those its
/// current routes still name (they are removed at the next change, once
/// no route names them), and every other cluster as it was.
fn merge_clusters(
    current: Option<Value>,
    desired: &Desired,
    still_routed: &BTreeSet<String>,
) -> Result<Value, AdapterError> {
    let mine = format!("rollgate_{}_", ident(&desired.model));
    let mut wanted = Vec::new();
    let mut names = BTreeSet::new();
    for arm in &desired.arms {
        let name = cluster_name(&desired.model, &arm.revision);
        wanted.push(cluster(&name, &arm.upstream)?);
        names.insert(name);
    }
    let mut resources: Vec<Value> = current
        .as_ref()
        .and_then(|c| c["resources"].as_array())
        .into_iter()
        .flatten()
        .filter(|r| {
            let name = r["name"].as_str().unwrap_or_default();
            !names.contains(name) && (!name.starts_with(&mine) || still_routed.contains(name))
        })
        .cloned()
        .collect();
    resources.extend(wanted);
    Ok(json!({"version_info": desired.version, "resources": resources}))
}

fn read_json(path: &str) -> Option<Value> {
    std::fs::read(path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
}

/// The CDS file as it is: `None` if there is none yet; an error if it
/// cannot be read as JSON, so that clusters of others in it are never
/// overwritten by a file holding only this model's.
fn read_clusters(path: &str) -> Result<Option<Value>, AdapterError> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(AdapterError::Io(format!("{path}: {e}"))),
    };
    serde_json::from_slice(&bytes).map(Some).map_err(|e| {
        AdapterError::Io(format!(
            "{path} is not a JSON discovery response ({e}); left as it is"
        ))
    })
}

impl Envoy {
    /// The name of the route configuration of `model`.
    fn route_config_name(&self, model: &str) -> String {
        self.route_config_name
            .as_deref()
            .map_or_else(|| format!("rollgate_{}", ident(model)), str::to_string)
    }

    /// The routing's clusters written and active, then its routes written
    /// and in force; nothing written over routes of a higher generation
    /// (checked before each write).
    async fn apply_and_confirm(&self, desired: &Desired) -> Result<(), AdapterError> {
        let wanted: BTreeSet<String> = desired
            .arms
            .iter()
            .map(|a| cluster_name(&desired.model, &a.revision))
            .collect();
        self.write_clusters(desired)?;
        // Routes that name a cluster Envoy does not have yet answer 503:
        // wait for the clusters first.
        let url = format!(
            "{}/config_dump?resource=dynamic_active_clusters",
            self.admin_url
        );
        confirm(&self.http, &url, |dump| {
            let active: BTreeSet<&str> = configs(dump)
                .filter_map(|c| c["cluster"]["name"].as_str())
                .collect();
            wanted.iter().all(|w| active.contains(w.as_str()))
        })
        .await
        .map_err(|got| AdapterError::OtherVersion {
            want: format!("clusters {wanted:?}"),
            got,
        })?;
        let name = self.route_config_name(&desired.model);
        self.write_routes(desired, &name)?;
        let url = format!(
            "{}/config_dump?resource=dynamic_route_configs",
            self.admin_url
        );
        confirm(&self.http, &url, |dump| {
            configs(dump).any(|c| {
                c["route_config"]["name"] == name.as_str() && c["version_info"] == desired.version
            })
        })
        .await
        .map_err(|got| AdapterError::OtherVersion {
            want: desired.version.clone(),
            got,
        })
    }

    /// This model's clusters into the shared CDS file (one model at a
    /// time), unless its routes file holds a higher generation.
    fn write_clusters(&self, desired: &Desired) -> Result<(), AdapterError> {
        let _one = CLUSTERS_FILE.lock().unwrap_or_else(|p| p.into_inner());
        let routes = read_json(&self.routes_file);
        not_older(routes.as_ref().map_or(0, generation_of), desired.generation)?;
        let still_routed = routes.map(|r| routed_clusters(&r)).unwrap_or_default();
        let clusters = merge_clusters(read_clusters(&self.clusters_file)?, desired, &still_routed)?;
        write_atomically(&self.clusters_file, clusters.to_string().as_bytes())
            .map_err(|e| AdapterError::Io(format!("{}: {e}", self.clusters_file)))
    }

    /// The model's routes file, unless it holds a higher generation by
    /// now.
    fn write_routes(&self, desired: &Desired, name: &str) -> Result<(), AdapterError> {
        let have = read_json(&self.routes_file).map_or(0, |r| generation_of(&r));
        not_older(have, desired.generation)?;
        let routes = render_routes(
            desired,
            name,
            &self.key_header,
            self.mirror_cluster.as_deref(),
        );
        write_atomically(&self.routes_file, routes.to_string().as_bytes())
            .map_err(|e| AdapterError::Io(format!("{}: {e}", self.routes_file)))
    }
}

fn configs(dump: &Value) -> impl Iterator<Item = &Value> {
    dump["configs"].as_array().into_iter().flatten()
}

/// Reads `url` (a config dump) until `done` holds, about 5 s at most
/// (bounded by the caller's timeout as well); what was read last if not.
async fn confirm(
    http: &HttpClient,
    url: &str,
    done: impl Fn(&Value) -> bool,
) -> Result<(), String> {
    let mut last = String::from("no answer");
    for _ in 0..50 {
        match http.get(url).await {
            Some((200, body)) => match serde_json::from_slice::<Value>(&body) {
                Ok(dump) if done(&dump) => return Ok(()),
                Ok(_) => last = "not yet in force".into(),
                Err(e) => last = format!("an unreadable config dump: {e}"),
            },
            Some((status, _)) => last = format!("the admin answered {status}"),
            None => {}
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Arm;

    fn desired(model: &str, candidate: Option<(&str, u32)>) -> Desired {
        let share = candidate.map_or(0, |(_, w)| w);
        let mut arms = vec![Arm {
            role: "champion",
            revision: "r1".into(),
            upstream: "http://127.0.0.1:9001".into(),
            weight_bp: 10_000 - share,
            predictor: None,
        }];
        if let Some((rev, w)) = candidate {
            arms.push(Arm {
                role: "candidate",
                revision: rev.into(),
                upstream: "http://model.internal:9002/".into(),
                weight_bp: w,
                predictor: None,
            });
        }
        Desired {
            model: model.into(),
            version: "7.3".into(),
            rollout: Some(7),
            epoch: 3,
            generation: 41,
            shadow: None,
            arms,
        }
    }

    #[test]
    fn routes_weigh_live_arms_by_the_key_hash() {
        let r = render_routes(&desired("fraud", Some(("r2", 2_000))), "rc", "x-user", None);
        assert_eq!(r["version_info"], "7.3");
        assert_eq!(
            r["resources"][0]["response_headers_to_add"][0]["header"]["value"],
            "7.3"
        );
        let route = &r["resources"][0]["virtual_hosts"][0]["routes"][0]["route"];
        assert_eq!(route["hash_policy"][0]["header"]["header_name"], "x-user");
        assert_eq!(route["weighted_clusters"]["use_hash_policy"], true);
        let arms: Vec<(&str, u64, &str)> = route["weighted_clusters"]["clusters"]
            .as_array()
            .expect("clusters")
            .iter()
            .map(|c| {
                (
                    c["name"].as_str().unwrap_or_default(),
                    c["weight"].as_u64().unwrap_or_default(),
                    c["response_headers_to_add"][0]["header"]["value"]
                        .as_str()
                        .unwrap_or_default(),
                )
            })
            .collect();
        assert_eq!(
            arms,
            [
                ("rollgate_fraud_r1", 8000, "r1"),
                ("rollgate_fraud_r2", 2000, "r2")
            ]
        );
        // A zero-weight arm is not routed at all.
        let champion_only = render_routes(&desired("fraud", None), "rc", "x-user", Some("gw"));
        assert_eq!(routed_clusters(&champion_only).len(), 1);
        let route = &champion_only["resources"][0]["virtual_hosts"][0]["routes"][0]["route"];
        assert_eq!(route["request_mirror_policies"], json!([{"cluster": "gw"}]));
        assert!(
            r["resources"][0]["virtual_hosts"][0]["routes"][0]["route"]
                .get("request_mirror_policies")
                .is_none()
        );
    }

    #[test]
    fn clusters_of_other_models_are_kept_and_unrouted_ones_of_this_model_dropped() {
        let before = json!({"resources": [
            {"name": "user_cluster"},
            {"name": "rollgate_other_r9"},
            {"name": "rollgate_fraud_r0"},
            {"name": "rollgate_fraud_r5"},
        ]});
        let still: BTreeSet<String> = ["rollgate_fraud_r5".to_string()].into();
        let after = merge_clusters(Some(before), &desired("fraud", Some(("r2", 500))), &still)
            .expect("merge");
        let names: Vec<&str> = after["resources"]
            .as_array()
            .expect("resources")
            .iter()
            .filter_map(|r| r["name"].as_str())
            .collect();
        assert_eq!(
            names,
            [
                "user_cluster",
                "rollgate_other_r9",
                "rollgate_fraud_r5",
                "rollgate_fraud_r1",
                "rollgate_fraud_r2"
            ]
        );
        let r2 = &after["resources"][4]["load_assignment"]["endpoints"][0]["lb_endpoints"][0];
        assert_eq!(
            r2["endpoint"]["address"]["socket_address"],
            json!({"address": "model.internal", "port_value": 9002})
        );
    }

    #[test]
    fn a_clusters_file_that_is_not_json_is_left_as_it_is() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("cds.json");
        let path = path.to_string_lossy();
        assert!(matches!(read_clusters(&path), Ok(None)), "none yet");
        std::fs::write(&*path, "resources:\n- a YAML file of the team's").expect("write");
        assert!(matches!(read_clusters(&path), Err(AdapterError::Io(_))));
        std::fs::write(&*path, r#"{"resources": []}"#).expect("write");
        assert!(matches!(read_clusters(&path), Ok(Some(_))));
    }

    #[test]
    fn the_routes_record_their_generation() {
        let r = render_routes(&desired("fraud", None), "rc", "x-user", None);
        assert_eq!(generation_of(&r), 41);
        // A seed's routes from before generations: 0.
        let seed =
            json!({"version_info": "seed", "resources": [{"@type": ROUTES_TYPE, "name": "rc"}]});
        assert_eq!(generation_of(&seed), 0);
    }

    #[test]
    fn https_upstreams_are_refused() {
        let mut d = desired("fraud", Some(("r2", 100)));
        d.arms[1].upstream = "https://model:443".into();
        assert!(matches!(
            merge_clusters(None, &d, &BTreeSet::new()),
            Err(AdapterError::Unroutable { .. })
        ));
    }
}
