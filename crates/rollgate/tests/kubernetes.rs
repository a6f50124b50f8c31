//! Rollouts whose traffic a Kubernetes route splits: the real controller
//! declares a `gateway_api` data plane on a real API server (the prebuilt
//! one of `tests/k8s`; `CI` fails without it, a local run skips), writes
//! each stage's `HTTPRoute` and waits for its status; the route's
//! controller is played by the test over a real nginx (rollgate's nginx
//! adapter programs it from the route), which mirrors to rollgate's
//! gateway for SHADOW. Evidence from a real Prometheus, as for every
//! other data plane. Every wait is bounded.

use std::collections::BTreeMap;

use kube::api::{Api, DynamicObject};
use rollgate_adapters::kit::Nginx;
use rollgate_adapters::kit::k8s::{self, ApiServer, RouteController};
use serde_json::json;

use crate::common::*;
use crate::data_plane::{AnsweredBy, Servers, the_rollouts_through};

/// Through an `HTTPRoute` the controller applies and a Gateway's
/// controller (the test's) confirms: the same rollouts as through nginx
/// and Envoy, every stage's weights written to the route and put in force
/// before its clock starts, champion-only before a rollback is visible.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_api_data_plane_with_prometheus_evidence() {
    let Some(server) = ApiServer::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    // Upstreams named `http://localhost:PORT`: a Service `localhost` and
    // its port, as the adapter writes backendRefs.
    let Some(mut servers) = Servers::start_at(dir.path(), "localhost") else {
        return;
    };
    let gw = start_gateway(dir.path());
    let champion = format!("http://{}", servers.champion.addr());
    let Some(nginx) = Nginx::start(&champion, Some(gw.addr())) else {
        return;
    };
    let kube = server.client().await;
    let route = k8s::http_routes();
    let controller =
        RouteController::start(kube.clone(), "models", route.clone(), "m", nginx.adapter());
    let gw_port = gw.addr().rsplit_once(':').map_or("0", |(_, p)| p);
    let plane = json!({
        "kind": "gateway_api",
        "cluster": { "url": server.url, "ca_file": server.ca },
        "namespace": "models",
        "controller_name": k8s::STAND_IN,
        "mirror": { "service": "localhost", "port": gw_port.parse::<u16>().expect("a port") },
        "routes": [{
            "name": "$model",
            "parent_refs": [{ "name": "inference" }],
            "path_prefix": "/v1/models/$model",
        }],
    });
    let ctl = start_controller_declaring(dir.path(), "edge", &plane);
    let c = client();
    let revs = servers.register(&c, &ctl).await;
    let port_of: BTreeMap<String, u16> = [
        (&revs.champion, &servers.champion),
        (&revs.identical, &servers.identical),
    ]
    .into_iter()
    .map(|(rev, p)| {
        let port = p.addr().rsplit_once(':').and_then(|(_, p)| p.parse().ok());
        (rev.clone(), port.unwrap_or(0))
    })
    .collect();
    let programmed = std::sync::Arc::clone(&controller.programmed);
    // What the Gateway's controller last put in force: the champion alone.
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

    // Each canary step reached the route in basis points, and the route
    // in place names rollgate's gateway as its mirror.
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
    let object = api.get("m").await.expect("the route");
    let filter = &object.data["spec"]["rules"][0]["filters"][0];
    assert_eq!(filter["type"], "RequestMirror", "{object:?}");
    assert_eq!(
        filter["requestMirror"]["backendRef"]["port"].as_u64(),
        gw_port.parse::<u64>().ok(),
        "{object:?}"
    );
    assert_eq!(
        object.data["spec"]["rules"][0]["matches"][0]["path"]["value"], "/v1/models/m",
        "{object:?}"
    );
}
