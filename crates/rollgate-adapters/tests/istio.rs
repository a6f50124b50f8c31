//! The Istio adapter against a real Kubernetes API server (the prebuilt
//! one of `tests/k8s`; `CI` fails without it, a local run skips), istiod
//! played by the test over a real nginx standing in for the mesh.

use std::sync::atomic::Ordering;
use std::time::Duration;

use kube::api::{Api, DynamicObject};
use rollgate_adapters::kit::k8s::{self, Cluster};
use rollgate_adapters::kit::{self, Proxy};
use rollgate_adapters::{AdapterError, HttpClient, for_plane};
use rollgate_store::{DataPlane, KubeAccess, MirrorTo};
use serde_json::json;

const NAMESPACE: &str = "models";

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
    let Some(cluster) = Cluster::start(NAMESPACE, k8s::virtual_services()).await else {
        return;
    };
    let Cluster {
        controller: istiod,
        nginx,
        upstreams,
        server,
    } = &cluster;
    let client = server.client().await;
    let http = HttpClient::new(Duration::from_secs(2));
    let peer = Proxy {
        adapter: for_plane(&plane(server.access(), true), &http),
        url: format!("http://{}/", nginx.addr),
    };
    kit::run(&peer, upstreams).await;

    let api: Api<DynamicObject> =
        Api::namespaced_with(client, NAMESPACE, &k8s::virtual_services().resource);
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

    // istiod's analysis reports the new generation with an error (a host
    // it cannot resolve): not in force.
    let generation = o.metadata.generation.unwrap_or(0) + 1;
    let reporter = api.clone();
    let report = tokio::spawn(async move {
        for _ in 0..200 {
            let now = reporter.get(kit::MODEL).await.ok();
            if now.and_then(|o| o.metadata.generation) >= Some(generation) {
                let status = json!({ "status": {
                    "observedGeneration": generation.to_string(),
                    "validationMessages": [{ "type": { "code": "IST0101" }, "level": "ERROR",
                        "documentationUrl": "https://istio.io/latest/docs/reference/config/analysis/ist0101/" }],
                }});
                let params = kube::api::PatchParams::default();
                let patch = kube::api::Patch::Merge(&status);
                reporter
                    .patch_status(kit::MODEL, &params, &patch)
                    .await
                    .expect("status");
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    });
    match peer.adapter.apply(&upstreams.split(500, 23, "6.4")).await {
        Err(AdapterError::NotConfirmed { why, .. }) => {
            assert!(why.contains("istiod reports an error"), "{why}");
        }
        other => panic!("an error istiod reports is not a routing in force, got {other:?}"),
    }
    report.await.expect("the report");
}
