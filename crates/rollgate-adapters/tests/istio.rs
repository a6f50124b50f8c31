//! The Istio adapter against a real Kubernetes API server (the prebuilt
//! one of `tests/k8s`; `CI` fails without it, a local run skips), istiod
//! played by the test over a real nginx standing in for the mesh.

use std::sync::atomic::Ordering;
use std::time::Duration;

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use rollgate_adapters::kit::k8s::{ApiServer, RouteController, Translation};
use rollgate_adapters::kit::{self, Nginx, Proxy, Upstreams};
use rollgate_adapters::{AdapterError, HttpClient, for_plane};
use rollgate_store::{DataPlane, KubeAccess, MirrorTo};
use serde_json::json;

const NAMESPACE: &str = "models";

fn resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("networking.istio.io", "v1", "VirtualService"),
        "virtualservices",
    )
}

/// istiod: the first HTTP route's destinations and weights; the status
/// reports the generation as istiod's status reporting does (a string,
/// as protobuf's JSON writes an int64).
fn translation() -> Translation {
    Translation {
        resource: resource(),
        weights: |spec| {
            spec["http"][0]["route"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|r| {
                    (
                        r["destination"]["port"]["number"].as_u64().unwrap_or(0) as u16,
                        r["weight"].as_u64().unwrap_or(100) as u32,
                    )
                })
                .collect()
        },
        status: |_, generation| json!({ "observedGeneration": generation.to_string() }),
    }
}

fn plane(access: KubeAccess, require_status: bool) -> DataPlane {
    DataPlane::Istio {
        cluster: access,
        namespace: NAMESPACE.into(),
        name: "$model".into(),
        hosts: vec!["$model.models.svc.cluster.local".into()],
        gateways: vec!["mesh".into()],
        mirror: Some(MirrorTo {
            service: "rollgate-gateway.rollgate.svc.cluster.local".into(),
            port: 8080,
            namespace: None,
        }),
        require_status,
    }
}

fn percents(o: &DynamicObject) -> Vec<u64> {
    o.data["spec"]["http"][0]["route"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| r["weight"].as_u64().unwrap_or(0))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_istio_adapter_passes_the_kit_and_waits_for_istiod() {
    let Some(server) = ApiServer::start() else {
        return;
    };
    let upstreams = Upstreams::start_at("localhost").await;
    let Some(nginx) = Nginx::start(
        &upstreams.champion_url().replace("localhost", "127.0.0.1"),
        None,
    ) else {
        return;
    };
    let client = server.client().await;
    let istiod = RouteController::start(
        client.clone(),
        NAMESPACE,
        translation(),
        kit::MODEL,
        nginx.adapter(),
    );
    let http = HttpClient::new(Duration::from_secs(2));
    let peer = Proxy {
        adapter: for_plane(&plane(server.access(), true), &http),
        url: format!("http://{}/", nginx.addr),
    };
    kit::run(&peer, &upstreams).await;

    let api: Api<DynamicObject> = Api::namespaced_with(client, NAMESPACE, &resource());
    peer.adapter
        .apply(&upstreams.split(500, 20, "6.1"))
        .await
        .expect("5%");
    let o = api.get(kit::MODEL).await.expect("the virtual service");
    assert_eq!(percents(&o), vec![95, 5], "{o:?}");
    let http_route = &o.data["spec"]["http"][0];
    assert_eq!(
        http_route["mirror"]["host"], "rollgate-gateway.rollgate.svc.cluster.local",
        "every request mirrored to rollgate's gateway: {o:?}"
    );
    assert_eq!(http_route["mirrorPercentage"]["value"], 100.0);
    assert_eq!(
        o.data["spec"]["hosts"],
        json!(["m.models.svc.cluster.local"])
    );

    // istiod silent: not confirmed with status required, confirmed
    // without.
    istiod.silent.store(true, Ordering::SeqCst);
    match peer.adapter.apply(&upstreams.split(2_500, 21, "6.2")).await {
        Err(AdapterError::NotConfirmed { why, .. }) => eprintln!("istiod silent: {why}"),
        other => panic!("without istiod's report nothing is confirmed, got {other:?}"),
    }
    let lenient = for_plane(&plane(server.access(), false), &http);
    lenient
        .apply(&upstreams.split(5_000, 22, "6.3"))
        .await
        .expect("confirmed once the API server holds it, without status");
    let o = api.get(kit::MODEL).await.expect("the virtual service");
    assert_eq!(percents(&o), vec![50, 50]);
}
