//! deploy/kubernetes/: every object is a Kubernetes API type of the stated
//! version (k8s-openapi's Kubernetes 1.36 types), written back without
//! losing a field (a misspelt or misplaced field would be dropped, so it
//! fails here rather than in a cluster); the objects refer to each other
//! consistently (selectors, ports, volumes, the ConfigMap); and both
//! Deployments' command lines run the real binary: the controller on the
//! ConfigMap's `controller.toml` (its files moved to a temporary
//! directory) answers its probes without a token and writes only with
//! one, sent to the names clients use; the gateway answers its probes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::common::*;

fn deploy() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/kubernetes"
    ))
}

/// Every document of every file the kustomization lists, with its file.
fn objects() -> Vec<(String, Value)> {
    let kustomization: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(deploy().join("kustomization.yaml")).expect("kustomization"),
    )
    .expect("kustomization.yaml is YAML");
    let mut out = Vec::new();
    for file in kustomization["resources"].as_array().expect("resources") {
        let file = file.as_str().expect("a file name");
        let text = std::fs::read_to_string(deploy().join(file)).expect(file);
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text).expect(file);
        out.extend(docs.into_iter().map(|d| (file.to_string(), d)));
    }
    out
}

/// `doc` read as `T` and written back: equal, or what `T` did not keep.
fn typed<T: DeserializeOwned + Serialize>(doc: &Value) -> Result<(), String> {
    let t: T = serde_json::from_value(doc.clone()).map_err(|e| e.to_string())?;
    let back = serde_json::to_value(&t).map_err(|e| e.to_string())?;
    if back == *doc {
        Ok(())
    } else {
        Err(format!("written back as {back:#}"))
    }
}

#[test]
fn every_manifest_is_a_kubernetes_object_of_its_version() {
    let listed: BTreeSet<String> = objects().into_iter().map(|(f, _)| f).collect();
    let present: BTreeSet<String> = std::fs::read_dir(deploy())
        .expect("deploy/kubernetes")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".yaml") && n != "kustomization.yaml")
        .collect();
    assert_eq!(listed, present, "the kustomization lists every manifest");
    let mut kinds = BTreeMap::new();
    for (file, doc) in objects() {
        let kind = doc["kind"].as_str().unwrap_or_default().to_string();
        let name = doc["metadata"]["name"].as_str().unwrap_or_default();
        let checked = match (
            doc["apiVersion"].as_str().unwrap_or_default(),
            kind.as_str(),
        ) {
            ("v1", "Namespace") => typed::<Namespace>(&doc),
            ("v1", "ServiceAccount") => typed::<ServiceAccount>(&doc),
            ("v1", "ConfigMap") => typed::<ConfigMap>(&doc),
            ("v1", "Service") => typed::<Service>(&doc),
            ("apps/v1", "Deployment") => typed::<Deployment>(&doc),
            ("rbac.authorization.k8s.io/v1", "ClusterRole") => typed::<ClusterRole>(&doc),
            ("rbac.authorization.k8s.io/v1", "RoleBinding") => typed::<RoleBinding>(&doc),
            // rollgate's own (generated: rollgate-operator's test keeps
            // them equal to the types).
            ("apiextensions.k8s.io/v1", "CustomResourceDefinition") => {
                typed::<CustomResourceDefinition>(&doc)
            }
            // Custom resources of other projects: their shape is checked
            // below, against what they must select.
            ("monitoring.coreos.com/v1", "PodMonitor") => Ok(()),
            ("gateway.networking.k8s.io/v1beta1", "ReferenceGrant") => Ok(()),
            (api, kind) => Err(format!("{api} {kind} is not a kind this test knows")),
        };
        if let Err(e) = checked {
            panic!("{file}: {kind} {name}: {e}");
        }
        if !matches!(
            kind.as_str(),
            "Namespace" | "ClusterRole" | "CustomResourceDefinition"
        ) {
            assert!(
                doc["metadata"]["namespace"].is_string(),
                "{file}: {kind} {name} names its namespace"
            );
        }
        *kinds.entry(kind).or_insert(0) += 1;
    }
    eprintln!("kinds: {kinds:?}");
}

/// The objects of `kind`.
fn of(kind: &str) -> Vec<Value> {
    objects()
        .into_iter()
        .map(|(_, d)| d)
        .filter(|d| d["kind"] == kind)
        .collect()
}

/// Whether `selector` (matchLabels or a plain map) selects `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    let wanted = selector.get("matchLabels").unwrap_or(selector);
    wanted
        .as_object()
        .is_some_and(|w| !w.is_empty() && w.iter().all(|(k, v)| labels[k] == *v))
}

/// The named container ports of the Deployment whose pods `selector` picks.
fn ports_selected(selector: &Value) -> Vec<String> {
    let deployments = of("Deployment");
    let picked: Vec<&Value> = deployments
        .iter()
        .filter(|d| selects(selector, &d["spec"]["template"]["metadata"]["labels"]))
        .collect();
    assert_eq!(picked.len(), 1, "{selector} picks one Deployment");
    picked[0]["spec"]["template"]["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|c| c["ports"].as_array().cloned().unwrap_or_default())
        .filter_map(|p| p["name"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn the_manifests_refer_to_each_other_consistently() {
    for d in of("Deployment") {
        let name = &d["metadata"]["name"];
        let pod = &d["spec"]["template"];
        assert!(
            selects(&d["spec"]["selector"], &pod["metadata"]["labels"]),
            "{name}: its selector picks its pods"
        );
        let account = pod["spec"]["serviceAccountName"]
            .as_str()
            .expect("an account");
        assert!(
            of("ServiceAccount")
                .iter()
                .any(|a| a["metadata"]["name"] == account),
            "{name}: service account {account}"
        );
        assert_eq!(
            pod["spec"]["securityContext"]["runAsNonRoot"], true,
            "{name}"
        );
        assert_eq!(
            pod["spec"]["securityContext"]["runAsUser"], 65532,
            "{name}: the image's user"
        );
        let volumes: Vec<&Value> = pod["spec"]["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .collect();
        for c in pod["spec"]["containers"].as_array().expect("containers") {
            assert_eq!(
                c["securityContext"]["readOnlyRootFilesystem"], true,
                "{name}"
            );
            assert_eq!(
                c["securityContext"]["allowPrivilegeEscalation"], false,
                "{name}"
            );
            assert!(
                c["resources"]["requests"].is_object(),
                "{name}: resource requests"
            );
            assert!(
                c["readinessProbe"].is_object() && c["livenessProbe"].is_object(),
                "{name}"
            );
            let ports: Vec<&str> = c["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| p["name"].as_str())
                .collect();
            for probe in ["readinessProbe", "livenessProbe"] {
                let port = c[probe]["httpGet"]["port"].as_str().expect("a named port");
                assert!(ports.contains(&port), "{name}: {probe} on port {port}");
            }
            for m in c["volumeMounts"].as_array().into_iter().flatten() {
                assert!(
                    volumes.iter().any(|v| v["name"] == m["name"]),
                    "{name}: volume {} mounted",
                    m["name"]
                );
            }
        }
        for v in &volumes {
            if let Some(cm) = v["configMap"]["name"].as_str() {
                assert!(
                    of("ConfigMap").iter().any(|m| m["metadata"]["name"] == cm),
                    "{name}: ConfigMap {cm}"
                );
            }
        }
    }
    for s in of("Service") {
        let ports = ports_selected(&s["spec"]["selector"]);
        for p in s["spec"]["ports"].as_array().expect("ports") {
            let target = p["targetPort"].as_str().expect("a named target port");
            assert!(
                ports.iter().any(|n| n == target),
                "{}: targetPort {target}",
                s["metadata"]["name"]
            );
        }
    }
    for m in of("PodMonitor") {
        let ports = ports_selected(&m["spec"]["selector"]);
        for e in m["spec"]["podMetricsEndpoints"]
            .as_array()
            .expect("endpoints")
        {
            let port = e["port"].as_str().expect("a port name");
            assert!(
                ports.iter().any(|n| n == port),
                "{}: port {port}",
                m["metadata"]["name"]
            );
        }
    }
    for b in of("RoleBinding") {
        let role = &b["roleRef"]["name"];
        assert!(
            of("ClusterRole")
                .iter()
                .any(|r| r["metadata"]["name"] == *role),
            "{role}"
        );
    }
    // The routing role grants what the Kubernetes adapters call.
    let routing = of("ClusterRole");
    for rule in routing[0]["rules"].as_array().expect("rules") {
        assert_eq!(
            rule["verbs"],
            serde_json::json!(["get", "create", "patch"]),
            "{rule}"
        );
    }
    // The operator follows the namespace its role is bound in, and the
    // role covers both of rollgate's kinds and their status.
    let operator = of("Deployment")
        .into_iter()
        .find(|d| d["metadata"]["name"] == "rollgate-operator")
        .expect("the operator's Deployment");
    let args: Vec<&str> = operator["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let followed = args
        .windows(2)
        .find(|w| w[0] == "--namespace")
        .map(|w| w[1])
        .expect("--namespace");
    assert!(
        of("RoleBinding")
            .iter()
            .any(|b| b["metadata"]["name"] == "rollgate-operator"
                && b["metadata"]["namespace"] == followed),
        "the operator's role is bound where it looks ({followed})"
    );
    // Exactly the verbs the operator calls, and no write of a spec.
    let role = of("ClusterRole")
        .into_iter()
        .find(|r| r["metadata"]["name"] == "rollgate-operator")
        .expect("the operator's role");
    let granted: BTreeMap<String, Value> = role["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .flat_map(|r| {
            let verbs = r["verbs"].clone();
            r["resources"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|x| x.as_str().map(str::to_string))
                .map(move |x| (x, verbs.clone()))
                .collect::<Vec<_>>()
        })
        .collect();
    let plurals: Vec<String> = of("CustomResourceDefinition")
        .iter()
        .filter_map(|c| c["spec"]["names"]["plural"].as_str().map(str::to_string))
        .collect();
    assert_eq!(plurals, ["models", "modelrollouts"]);
    let want = serde_json::json!({
        "models": ["get", "list", "watch"],
        "modelrollouts": ["list", "watch", "patch"],
        "models/status": ["get", "patch"],
        "modelrollouts/status": ["get", "patch"],
    });
    assert_eq!(serde_json::to_value(&granted).expect("json"), want);
    let grant = &of("ReferenceGrant")[0];
    assert!(
        of("Service")
            .iter()
            .any(|s| s["metadata"]["name"] == grant["spec"]["to"][0]["name"]),
        "the grant names rollgate's gateway Service"
    );
}

/// The ConfigMap's `controller.toml` with its paths moved into `dir`.
fn controller_toml(dir: &std::path::Path) -> String {
    let cm = of("ConfigMap")
        .into_iter()
        .find(|m| m["metadata"]["name"] == "rollgate-controller")
        .expect("the controller's ConfigMap");
    let toml = cm["data"]["controller.toml"]
        .as_str()
        .expect("controller.toml");
    let token = write(dir, "token", "a-shared-token-for-the-test\n");
    toml.replace("0.0.0.0:7070", "127.0.0.1:0")
        .replace("/run/secrets/rollgate-api/token", &token)
        .replace(
            "/run/secrets/rollgate-audit/key",
            &dir.join("audit.key").to_string_lossy(),
        )
        .replace("/var/lib/rollgate", &dir.join("data").to_string_lossy())
}

/// The Deployment's container command line and plain environment, with
/// `swap` applied to every argument (paths and addresses moved to the
/// test's, `$(VAR)` filled in).
fn command_line(d: &Value, swap: &dyn Fn(&str) -> String) -> (Vec<String>, Vec<(String, String)>) {
    let c = &d["spec"]["template"]["spec"]["containers"][0];
    let args = c["args"].as_array().expect("args").iter();
    let args = args
        .map(|a| swap(a.as_str().expect("an argument")))
        .collect();
    let env = c["env"].as_array().into_iter().flatten();
    let env = env
        .filter_map(|e| {
            Some((
                e["name"].as_str()?.to_string(),
                e["value"].as_str()?.to_string(),
            ))
        })
        .collect();
    (args, env)
}

fn probe(d: &Value, kind: &str) -> String {
    d["spec"]["template"]["spec"]["containers"][0][kind]["httpGet"]["path"]
        .as_str()
        .expect("a probe path")
        .to_string()
}

/// `method path` to `addr` with `Host: host` and the bearer `token`.
async fn as_host(addr: &str, method: &str, path: &str, host: &str, token: &str, body: &str) -> u16 {
    let req = hyper::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .header("host", host)
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(
            body.to_string(),
        )))
        .expect("a request");
    let answer = tokio::time::timeout(std::time::Duration::from_secs(10), client().request(req));
    answer
        .await
        .expect("within 10 s")
        .expect("an answer")
        .status()
        .as_u16()
}

/// Both Deployments' own command lines and environment (paths, the
/// listen address and the pod's fields moved to the test's; the store is
/// the SQLite one in the data directory instead of the Secret's URL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_runs_on_its_config_map_and_both_answer_their_probes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write(dir.path(), "controller.toml", &controller_toml(dir.path()));
    let data = dir.path().join("data").to_string_lossy().into_owned();
    let deployments = of("Deployment");
    let named = |n: &str| {
        deployments
            .iter()
            .find(|d| d["metadata"]["name"] == n)
            .expect(n)
            .clone()
    };
    let (controller, gateway) = (named("rollgate-controller"), named("rollgate-gateway"));
    let (args, env) = command_line(&controller, &|a| {
        a.replace("/etc/rollgate/controller.toml", &cfg)
            .replace("/var/lib/rollgate", &data)
    });
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let ctl = spawn(&args, &env);
    let c = client();
    for kind in ["readinessProbe", "livenessProbe"] {
        let path = probe(&controller, kind);
        let (s, v, _) = request(
            &c,
            "GET",
            &format!("http://{}{path}", ctl.addr()),
            None,
            None,
        )
        .await;
        assert_eq!(
            s, 200,
            "the controller's {kind} {path}, without a token: {v}"
        );
    }
    // The API wants the token the config names, and answers writes sent
    // to the names clients use (the Service's, a port-forward's).
    let (s, _, _) = request(
        &c,
        "GET",
        &format!("http://{}/api/v1/models", ctl.addr()),
        None,
        None,
    )
    .await;
    assert_eq!(s, 401, "require_token");
    let token = "a-shared-token-for-the-test";
    for (i, host) in ["rollgate-api.rollgate.svc:7070", "localhost:7070"]
        .iter()
        .enumerate()
    {
        let body = format!(r#"{{"name": "m{i}", "spec": {{}}}}"#);
        let s = as_host(ctl.addr(), "POST", "/api/v1/models", host, token, &body).await;
        assert_eq!(s, 201, "a write through {host}");
    }
    let s = as_host(
        ctl.addr(),
        "POST",
        "/api/v1/models",
        "elsewhere:7070",
        token,
        "{}",
    )
    .await;
    assert_eq!(s, 403, "a name not declared");

    let (args, mut env) = command_line(&gateway, &|a| {
        a.replace("0.0.0.0:8080", "127.0.0.1:0")
            .replace("$(POD_IP)", "127.0.0.1")
            .replace("$(POD_NAME)", "rollgate-gateway-0")
    });
    env.push(("ROLLGATE_STORE".into(), data.clone()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let gw = spawn(&args, &env);
    for kind in ["readinessProbe", "livenessProbe"] {
        let path = probe(&gateway, kind);
        let (s, v, _) = request(
            &c,
            "GET",
            &format!("http://{}{path}", gw.addr()),
            None,
            None,
        )
        .await;
        assert_eq!(s, 200, "the gateway's {kind} {path}: {v}");
    }
}
