//! Rollouts whose traffic a Kubernetes route splits: the real controller
//! declares a `gateway_api`, `istio` or `kserve` data plane on a real API server
//! (the prebuilt one of `tests/k8s`; `CI` fails without it, a local run
//! skips), writes each stage's object and waits for its status; the
//! route's controller is played by the test over a real nginx (rollgate's
//! nginx adapter programs it from the object), which mirrors to
//! rollgate's gateway for SHADOW. Evidence from a real Prometheus, as for
//! every other data plane. Every wait is bounded.

use std::collections::BTreeMap;

use kube::api::{Api, DynamicObject};
use rollgate_adapters::kit::Nginx;
use rollgate_adapters::kit::k8s::{self, ApiServer, RouteController, Translation};
use serde_json::{Value, json};

use crate::common::*;
use crate::data_plane::{AnsweredBy, Servers, the_rollouts_through};

/// The rollouts every data plane must get right (identical promoted
/// through SHADOW and two canary steps, +100 ms and ready-then-503 rolled
/// back, a vanished target failing safe), through the object `plane`
/// describes (its `cluster` and `mirror` filled in here) and `route`'s
/// controller: every stage's weights put in force before its clock
/// starts, champion-only before a rollback is visible. `check` then reads
/// the model's object as it was left.
async fn rollouts_through(plane: Value, route: Translation, check: impl Fn(&DynamicObject, u16)) {
    let Some(server) = ApiServer::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    // Upstreams named `http://localhost:PORT`: a Service `localhost` and
    // its port, as the adapters write destinations.
    let Some(mut servers) = Servers::start_at(dir.path(), "localhost") else {
        return;
    };
    let gw = start_gateway(dir.path());
    let champion = format!("http://{}", servers.champion.addr());
    let Some(nginx) = Nginx::start(&champion, Some(gw.addr())) else {
        return;
    };
    let kube = server.client().await;
    let controller =
        RouteController::start(kube.clone(), "models", route.clone(), "m", nginx.adapter());
    let port = |addr: &str| {
        addr.rsplit_once(':')
            .and_then(|(_, p)| p.parse::<u16>().ok())
    };
    let gw_port = port(gw.addr()).expect("the gateway's port");
    let mut plane = plane;
    plane["cluster"] = json!({ "url": server.url, "ca_file": server.ca });
    plane["namespace"] = json!("models");
    // KServe has no mirror: the stand-in's nginx mirrors for it, as
    // rollgate's gateway in front of an InferenceService would see copies.
    if plane["kind"] != "kserve" {
        plane["mirror"] = json!({ "service": "localhost", "port": gw_port });
    }
    let ctl = start_controller_declaring(dir.path(), "edge", &plane);
    let c = client();
    let revs = servers.register(&c, &ctl).await;
    let port_of: BTreeMap<String, u16> = [
        (&revs.champion, &servers.champion),
        (&revs.identical, &servers.identical),
    ]
    .into_iter()
    .map(|(rev, p)| (rev.clone(), port(p.addr()).unwrap_or(0)))
    .collect();
    let programmed = std::sync::Arc::clone(&controller.programmed);
    // What the route's controller last put in force: the champion alone.
    let champion_only = |champion: &str| {
        let log = programmed.lock().unwrap_or_else(|p| p.into_inner());
        let last = log.iter().rev().find(|(name, _, _)| name == "m");
        last.is_some_and(|(_, _, weights)| {
            weights.len() == 1 && Some(&weights[0].0) == port_of.get(champion)
        })
    };
    the_rollouts_through(
        &mut servers,
        &ctl,
        &revs,
        &nginx.addr,
        AnsweredBy::Upstream,
        true,
        champion_only,
    )
    .await;

    // Each canary step of the plan (20%, 50%) reached the object and was
    // put in force.
    let log = controller
        .programmed
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    for step in [2_000, 5_000] {
        assert!(
            log.iter()
                .any(|(_, _, w)| w.len() == 2 && w[1].1 == step && w[0].1 == 10_000 - step),
            "a {step} bp stage put in force: {log:?}"
        );
    }
    let api: Api<DynamicObject> = Api::namespaced_with(kube, "models", &route.resource);
    check(&api.get("m").await.expect("the model's object"), gw_port);
}

/// Through an `HTTPRoute` the controller applies and a Gateway's
/// controller (the test's) confirms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_api_data_plane_with_prometheus_evidence() {
    let plane = json!({
        "kind": "gateway_api",
        "controller_name": k8s::STAND_IN,
        "routes": [{
            "name": "$model",
            "parent_refs": [{ "name": "inference" }],
            "path_prefix": "/v1/models/$model",
        }],
    });
    rollouts_through(plane, k8s::http_routes(), |route, gw_port| {
        let rule = &route.data["spec"]["rules"][0];
        let filter = &rule["filters"][0];
        assert_eq!(filter["type"], "RequestMirror", "{route:?}");
        let mirrored_to = &filter["requestMirror"]["backendRef"];
        assert_eq!(mirrored_to["port"].as_u64(), Some(u64::from(gw_port)));
        assert_eq!(rule["matches"][0]["path"]["value"], "/v1/models/m");
    })
    .await;
}

/// Through a `VirtualService` the controller applies and istiod (the
/// test's) confirms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_istio_data_plane_with_prometheus_evidence() {
    let plane = json!({
        "kind": "istio",
        "hosts": ["$model.models.svc.cluster.local"],
    });
    rollouts_through(plane, k8s::virtual_services(), |vs, gw_port| {
        let http = &vs.data["spec"]["http"][0];
        assert_eq!(http["mirror"]["host"], "localhost", "{vs:?}");
        assert_eq!(
            http["mirror"]["port"]["number"].as_u64(),
            Some(u64::from(gw_port))
        );
        assert_eq!(http["mirrorPercentage"]["value"], 100.0);
        assert_eq!(vs.data["spec"]["hosts"][0], "m.models.svc.cluster.local");
    })
    .await;
}

/// Through an `InferenceService` (Knative mode) whose predictor the
/// controller writes from each revision's own and KServe (the test's)
/// splits between the latest revision and the last one rolled out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kserve_data_plane_with_prometheus_evidence() {
    let plane = json!({ "kind": "kserve" });
    rollouts_through(plane, k8s::inference_services(), |isvc, _| {
        let predictor = &isvc.data["spec"]["predictor"];
        assert!(
            predictor["model"]["storageUri"]
                .as_str()
                .is_some_and(|u| u.starts_with("s3://rollgate-e2e/")),
            "a revision's own predictor: {isvc:?}"
        );
        // No rollout left: no canary share (none, or 0 after a rollback).
        let share = &predictor["canaryTrafficPercent"];
        assert!(
            share.is_null() || share == 0,
            "champion-only at the end: {isvc:?}"
        );
        let traffic = &isvc.data["status"]["components"]["predictor"]["traffic"];
        let latest: u64 = traffic
            .as_array()
            .into_iter()
            .flatten()
            .filter(|t| t["latestRevision"] == true)
            .filter_map(|t| t["percent"].as_u64())
            .sum();
        assert_eq!(
            latest,
            share.as_u64().unwrap_or(100),
            "KServe's split: {isvc:?}"
        );
    })
    .await;
}
