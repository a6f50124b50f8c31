//! The Kubernetes side of the kit (features `testing` and `kubernetes`): a
//! real API server of its own per test ([`ApiServer`], started by
//! `tests/k8s/start.sh` from the prebuilt binaries) and the route's
//! controller, played by the test ([`RouteController`]): it follows the
//! routing objects, programs a real nginx standing in for the route's
//! data plane through rollgate's nginx adapter, and only then reports the
//! object's generation in its status, as Envoy Gateway or istiod would.
//! Nothing runs workloads on that API server: the test is the controller.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::Client;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
};
use rollgate_store::KubeAccess;
use serde_json::Value;

use super::MODEL;
use crate::{Adapter, Arm, Desired};

/// `tests/k8s/` of the repository.
fn scripts() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/k8s"))
}

/// A Kubernetes API server for custom resources on 127.0.0.1 with the
/// CRDs of `tests/k8s/crds` installed, stopped (and its data removed)
/// when dropped.
#[derive(Debug)]
pub struct ApiServer {
    pub url: String,
    /// Its self-signed certificate (PEM).
    pub ca: String,
    dir: String,
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        let _ = Command::new(scripts().join("ctl.sh"))
            .args(["stop", &self.dir])
            .status();
    }
}

impl ApiServer {
    /// A server of this test's own; `None` (locally, with a note) where
    /// the prebuilt binaries are absent, a failure in CI saying how to
    /// get them.
    pub fn start() -> Option<ApiServer> {
        let out = Command::new(scripts().join("start.sh"))
            .output()
            .expect("tests/k8s/start.sh runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            if std::env::var_os("CI").is_none() && stderr.contains("ROLLGATE_K8S_BIN_DIR") {
                eprintln!("skipped: needs the Kubernetes API server: {stderr}");
                return None;
            }
            panic!("tests/k8s/start.sh failed: {stderr}");
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        let var = |name: &str| {
            stdout
                .lines()
                .find_map(|l| l.strip_prefix(&format!("export {name}=")))
                .unwrap_or_else(|| panic!("start.sh printed no {name}: {stdout}"))
                .to_string()
        };
        Some(ApiServer {
            url: var("ROLLGATE_K8S_URL"),
            ca: var("ROLLGATE_K8S_CA"),
            dir: var("ROLLGATE_K8S_DIR"),
        })
    }

    /// Stops the API server and starts it again (etcd, and so every
    /// object, kept), waiting until it is ready.
    pub fn restart_api(&self) {
        let status = Command::new(scripts().join("ctl.sh"))
            .args(["restart-api", &self.dir])
            .status()
            .expect("ctl.sh runs");
        assert!(status.success(), "the API server restarted");
    }

    /// How a data plane declaration reaches it.
    pub fn access(&self) -> KubeAccess {
        KubeAccess {
            url: Some(self.url.clone()),
            ca_file: Some(self.ca.clone()),
            ..KubeAccess::default()
        }
    }

    /// A client of the test's own (not the adapter's).
    pub async fn client(&self) -> Client {
        let mut config = kube::Config::new(self.url.parse().expect("url"));
        config.root_cert_file = Some(self.ca.clone().into());
        Client::try_from(config).expect("client")
    }
}

/// What an adapter's test against a route controller stands on: a real
/// API server, two upstreams named as Services (`localhost`), a real
/// nginx standing in for the route's data plane (seeded with the
/// champion), and the route's controller programming that nginx from the
/// object named [`MODEL`] in `namespace`. Dropped in that order reversed.
#[derive(Debug)]
pub struct Cluster {
    pub controller: RouteController,
    pub nginx: super::Nginx,
    pub upstreams: super::Upstreams,
    pub server: ApiServer,
}

impl Cluster {
    /// `None` (locally, with a note) where the API server's binaries or
    /// nginx are absent; a failure in CI.
    pub async fn start(namespace: &str, what: Translation) -> Option<Cluster> {
        let server = ApiServer::start()?;
        let upstreams = super::Upstreams::start_at("localhost").await;
        let champion = upstreams.champion_url().replace("localhost", "127.0.0.1");
        let nginx = super::Nginx::start(&champion, None)?;
        let client = server.client().await;
        let controller =
            RouteController::start(client.clone(), namespace, what, MODEL, nginx.adapter());
        Some(Cluster {
            controller,
            nginx,
            upstreams,
            server,
        })
    }
}

/// What a route's controller reads and writes of one kind of object.
#[derive(Debug, Clone)]
pub struct Translation {
    pub resource: ApiResource,
    /// The weighted destinations an object routes to, in order, as
    /// `(port, weight)` (every destination is a server on 127.0.0.1), read
    /// from the object with the status about to be reported.
    pub weights: fn(&Value) -> Vec<(u16, u32)>,
    /// The status reporting generation `g` of the object `object` in force.
    pub status: fn(&Value, i64) -> Value,
}

/// The controller name the stand-in route controller reports.
pub const STAND_IN: &str = "example.net/stand-in";

/// A Gateway's controller reading `HTTPRoute`s: the first rule's backends
/// and weights; every parent accepts the generation and resolves its
/// references.
pub fn http_routes() -> Translation {
    Translation {
        resource: ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("gateway.networking.k8s.io", "v1", "HTTPRoute"),
            "httproutes",
        ),
        weights: |object| {
            object["spec"]["rules"][0]["backendRefs"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|b| {
                    let port = b["port"].as_u64().and_then(|p| u16::try_from(p).ok());
                    let weight = b["weight"].as_u64().unwrap_or(1);
                    (port.unwrap_or(0), u32::try_from(weight).unwrap_or(u32::MAX))
                })
                .collect()
        },
        status: |object, generation| {
            let parents: Vec<Value> = object["spec"]["parentRefs"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| {
                    let condition = |kind: &str| {
                        serde_json::json!({
                            "type": kind, "status": "True", "reason": kind, "message": "",
                            "observedGeneration": generation,
                            "lastTransitionTime": "2026-12-03T00:00:00Z",
                        })
                    };
                    serde_json::json!({
                        "parentRef": p,
                        "controllerName": STAND_IN,
                        "conditions": [condition("Accepted"), condition("ResolvedRefs")],
                    })
                })
                .collect();
            serde_json::json!({ "parents": parents })
        },
    }
}

/// istiod reading `VirtualService`s: the first HTTP route's destinations
/// and weights; the status reports the generation as istiod's status
/// reporting does (a string, as protobuf's JSON writes an int64).
pub fn virtual_services() -> Translation {
    Translation {
        resource: ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("networking.istio.io", "v1", "VirtualService"),
            "virtualservices",
        ),
        weights: |object| {
            object["spec"]["http"][0]["route"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|r| {
                    let port = r["destination"]["port"]["number"].as_u64();
                    let weight = r["weight"].as_u64().unwrap_or(100);
                    let port = port.and_then(|p| u16::try_from(p).ok()).unwrap_or(0);
                    (port, u32::try_from(weight).unwrap_or(u32::MAX))
                })
                .collect()
        },
        status: |_, generation| serde_json::json!({ "observedGeneration": generation.to_string() }),
    }
}

/// KServe's controller reading `InferenceService`s in Knative mode, as
/// KServe does (kserve/kserve `ksvc_reconciler.go`): each predictor is a
/// revision (named here by its container's port and a hash of its spec,
/// where Knative numbers them); with `canaryTrafficPercent` the latest
/// revision gets that share and the last one rolled out the rest, without
/// it (or before anything rolled out) the latest gets everything and is
/// then the one rolled out. Every revision is ready at once.
pub fn inference_services() -> Translation {
    Translation {
        resource: isvc_resource(),
        weights: |object| {
            let traffic = object["status"]["components"]["predictor"]["traffic"].as_array();
            // The last revision rolled out (the champion's) first.
            let mut traffic: Vec<&Value> = traffic.into_iter().flatten().collect();
            traffic.sort_by_key(|t| t["latestRevision"].as_bool().unwrap_or(false));
            traffic
                .into_iter()
                .map(|t| {
                    let name = t["revisionName"].as_str().unwrap_or_default();
                    let port = name.rsplit('-').nth(1).and_then(|p| p.parse().ok());
                    let percent = t["percent"].as_u64().unwrap_or(0);
                    (port.unwrap_or(0), u32::try_from(percent).unwrap_or(0))
                })
                .collect()
        },
        status: |object, _| {
            let name = object["metadata"]["name"].as_str().unwrap_or_default();
            let predictor = &object["spec"]["predictor"];
            let latest = revision_name(name, predictor);
            let was = &object["status"]["components"]["predictor"];
            let rolled_out = was["latestRolledoutRevision"].as_str().map(str::to_string);
            let share = predictor["canaryTrafficPercent"]
                .as_u64()
                .filter(|s| *s < 100);
            let entry = |revision: &str, latest: bool, percent: u64| {
                serde_json::json!({ "revisionName": revision, "latestRevision": latest,
                    "percent": percent, "tag": if latest { "latest" } else { "prev" } })
            };
            let (traffic, now_rolled_out) = match (share, &rolled_out) {
                (Some(share), Some(prev)) => (
                    vec![entry(&latest, true, share), entry(prev, false, 100 - share)],
                    prev.clone(),
                ),
                _ => (vec![entry(&latest, true, 100)], latest.clone()),
            };
            serde_json::json!({
                "components": { "predictor": {
                    "latestCreatedRevision": latest, "latestReadyRevision": latest,
                    "latestRolledoutRevision": now_rolled_out,
                    "previousRolledoutRevision": rolled_out,
                    "traffic": traffic,
                }},
                "conditions": ready_conditions(),
            })
        },
    }
}

/// KServe's controller reading `InferenceService`s in Standard mode (0.20's
/// `spec.canary`, kserve/kserve `components/predictor.go`): the predictor
/// gets what the canaries leave, each canary its `trafficPercent`; every
/// canary reported ready at its share in `status.canaryStatuses`.
pub fn standard_inference_services() -> Translation {
    Translation {
        resource: isvc_resource(),
        weights: |object| {
            let port = |p: &Value| {
                let port = p["model"]["ports"][0]["containerPort"].as_u64();
                port.and_then(|p| u16::try_from(p).ok()).unwrap_or(0)
            };
            let canaries = object["spec"]["canary"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let shares: Vec<(u16, u32)> = canaries
                .iter()
                .map(|c| {
                    let share = c["trafficPercent"].as_u64().unwrap_or(0);
                    (port(&c["predictor"]), u32::try_from(share).unwrap_or(0))
                })
                .collect();
            let rest = 100u32.saturating_sub(shares.iter().map(|(_, s)| s).sum());
            let mut out = vec![(port(&object["spec"]["predictor"]), rest)];
            out.extend(shares);
            out
        },
        status: |object, _| {
            let canaries = object["spec"]["canary"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let reported: Vec<Value> = canaries
                .iter()
                .map(|c| {
                    serde_json::json!({ "name": c["predictor"]["name"], "ready": true,
                    "trafficPercent": c["trafficPercent"] })
                })
                .collect();
            serde_json::json!({ "canaryStatuses": reported, "conditions": ready_conditions() })
        },
    }
}

fn isvc_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("serving.kserve.io", "v1beta1", "InferenceService"),
        "inferenceservices",
    )
}

fn ready_conditions() -> Value {
    let condition = |kind: &str| {
        serde_json::json!({ "type": kind, "status": "True",
            "lastTransitionTime": "2026-12-04T00:00:00Z" })
    };
    serde_json::json!([condition("PredictorReady"), condition("Ready")])
}

/// The stand-in's name of the Knative revision of `predictor` (its share
/// aside): `<isvc>-predictor-<port>-<hash>`.
fn revision_name(isvc: &str, predictor: &Value) -> String {
    use std::hash::{Hash, Hasher};
    let mut spec = predictor.clone();
    spec.as_object_mut()
        .map(|o| o.remove("canaryTrafficPercent"));
    let port = spec["model"]["ports"][0]["containerPort"]
        .as_u64()
        .unwrap_or(0);
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    spec.to_string().hash(&mut hasher);
    format!("{isvc}-predictor-{port}-{:08x}", hasher.finish() as u32)
}

/// A route controller's data plane that is in force at once: for tests
/// and benchmarks of the API server's side alone.
#[derive(Debug)]
pub struct AtOnce;

impl Adapter for AtOnce {
    fn kind(&self) -> &'static str {
        "at-once"
    }

    fn send<'a>(
        &'a self,
        _: &'a Desired,
    ) -> futures::future::BoxFuture<'a, Result<(), crate::AdapterError>> {
        Box::pin(async { Ok(()) })
    }

    fn seed_files(&self, _: &Desired) -> Result<Vec<(String, String)>, crate::AdapterError> {
        Ok(Vec::new())
    }
}

/// One generation a route's controller put in force: the object's name,
/// its generation and the weights by port.
pub type Programmed = (String, i64, Vec<(u16, u32)>);

/// A route's controller, played by the test until dropped.
#[derive(Debug)]
pub struct RouteController {
    /// While set, it programs the data plane but reports nothing (a
    /// controller that is not running, as far as status shows).
    pub silent: Arc<AtomicBool>,
    /// Every generation it put in force.
    pub programmed: Arc<Mutex<Vec<Programmed>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RouteController {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RouteController {
    /// Follows the objects of `what` in `namespace`, putting each new
    /// generation of the object named `routed` into `data_plane` (the
    /// others are reported without routing anything).
    pub fn start(
        client: Client,
        namespace: &str,
        what: Translation,
        routed: &str,
        data_plane: Box<dyn Adapter>,
    ) -> RouteController {
        let silent = Arc::new(AtomicBool::new(false));
        let programmed = Arc::new(Mutex::new(Vec::new()));
        let api: Api<DynamicObject> = Api::namespaced_with(client, namespace, &what.resource);
        let (quiet, record, routed) = (
            Arc::clone(&silent),
            Arc::clone(&programmed),
            routed.to_string(),
        );
        let task = tokio::spawn(async move {
            let mut done: HashMap<String, i64> = HashMap::new();
            loop {
                tokio::time::sleep(Duration::from_millis(25)).await;
                // The API server may be restarting: read again later.
                let Ok(list) = api.list(&ListParams::default()).await else {
                    continue;
                };
                for object in list {
                    let name = object.metadata.name.clone().unwrap_or_default();
                    let generation = object.metadata.generation.unwrap_or(0);
                    if done.get(&name).is_some_and(|g| *g >= generation) {
                        continue;
                    }
                    let mut whole = serde_json::to_value(&object).unwrap_or_default();
                    whole["metadata"]["generation"] = generation.into();
                    let status = (what.status)(&whole, generation);
                    whole["status"] = status.clone();
                    let weights = basis_points(&(what.weights)(&whole));
                    if name == routed {
                        let desired = desired(&object, generation, &weights);
                        if let Err(e) = data_plane.apply(&desired).await {
                            eprintln!("the stand-in data plane refused {name}@{generation}: {e}");
                            continue;
                        }
                    }
                    if quiet.load(Ordering::SeqCst) {
                        continue;
                    }
                    let status = serde_json::json!({ "status": status });
                    let patched = api
                        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                        .await;
                    if patched.is_ok() {
                        done.insert(name.clone(), generation);
                        record
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push((name, generation, weights));
                    }
                }
            }
        });
        RouteController {
            silent,
            programmed,
            task,
        }
    }
}

/// Relative weights as basis points adding up to 10,000 (the first takes
/// what rounding leaves); destinations of weight 0 dropped.
fn basis_points(weights: &[(u16, u32)]) -> Vec<(u16, u32)> {
    let live: Vec<(u16, u32)> = weights.iter().copied().filter(|(_, w)| *w > 0).collect();
    let total: u64 = live.iter().map(|(_, w)| u64::from(*w)).sum();
    let mut out: Vec<(u16, u32)> = live
        .iter()
        .map(|(p, w)| (*p, (u64::from(*w) * 10_000 / total.max(1)) as u32))
        .collect();
    let rest: u32 = out.iter().skip(1).map(|(_, w)| w).sum();
    if let Some(first) = out.first_mut() {
        first.1 = 10_000 - rest;
    }
    out
}

/// The routing the stand-in data plane puts in force for generation
/// `generation` of `object`.
fn desired(object: &DynamicObject, generation: i64, weights: &[(u16, u32)]) -> Desired {
    Desired {
        model: MODEL.into(),
        version: format!(
            "{}@{generation}",
            object.metadata.name.as_deref().unwrap_or_default()
        ),
        rollout: None,
        epoch: 0,
        generation: generation.max(0) as u64,
        shadow: None,
        arms: weights
            .iter()
            .enumerate()
            .map(|(i, (port, w))| Arm {
                role: if i == 0 { "champion" } else { "candidate" },
                revision: format!("port-{port}"),
                upstream: format!("http://127.0.0.1:{port}"),
                weight_bp: *w,
                predictor: None,
            })
            .collect(),
    }
}
