//! The KServe adapter against a real Kubernetes API server (the prebuilt
//! one of `tests/k8s`; `CI` fails without it, a local run skips), KServe's
//! controller played by the test (Knative mode and Standard mode) over a
//! real nginx standing in for the revisions' traffic.

use std::sync::atomic::Ordering;
use std::time::Duration;

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use rollgate_adapters::kit::k8s::{self, Cluster};
use rollgate_adapters::kit::{self, Proxy, Upstreams};
use rollgate_adapters::{Adapter, AdapterError, Desired, HttpClient, for_plane};
use rollgate_store::{DataPlane, KserveMode, KubeAccess};
use serde_json::{Value, json};

const NAMESPACE: &str = "models";

fn plane(access: KubeAccess, mode: KserveMode, require_status: bool) -> DataPlane {
    DataPlane::Kserve {
        cluster: access,
        namespace: NAMESPACE.into(),
        name: "$model".into(),
        mode,
        allow_predictor_fields: Vec::new(),
        require_status,
    }
}

async fn object(api: &Api<DynamicObject>) -> DynamicObject {
    api.get(kit::MODEL).await.expect("the InferenceService")
}

/// `o`'s predictor without what the adapter adds to a revision's own.
fn predictor_as_written(o: &DynamicObject) -> Value {
    let mut p = o.data["spec"]["predictor"].clone();
    if let Some(p) = p.as_object_mut() {
        p.remove("canaryTrafficPercent");
        p.remove("name");
    }
    p
}

/// `desired` with the candidate's share taken away and the candidate
/// deployed dark (a SHADOW stage).
fn shadow(upstreams: &Upstreams, generation: u64, version: &str) -> Desired {
    let mut d = upstreams.split(0, generation, version);
    d.shadow = Some(d.arms.remove(1));
    d
}

/// 5%, 25% and 50% applied in turn (generations 21–23): each stage's
/// share and the object as it was right after.
async fn stages(
    adapter: &dyn Adapter,
    upstreams: &Upstreams,
    api: &Api<DynamicObject>,
) -> Vec<(u32, DynamicObject)> {
    let mut out = Vec::new();
    for (i, bp) in [500u32, 2_500, 5_000].into_iter().enumerate() {
        let version = format!("7.{}", i + 1);
        applied(adapter, &upstreams.split(bp, 21 + i as u64, &version)).await;
        out.push((bp, object(api).await));
    }
    out
}

async fn applied(adapter: &dyn Adapter, d: &Desired) {
    if let Err(e) = adapter.apply(d).await {
        panic!(
            "{} (generation {}) not confirmed: {e}",
            d.version, d.generation
        );
    }
}

/// Starts the cluster and the adapter, and puts the champion in first (an
/// InferenceService serves its champion before any canary: KServe splits
/// between the latest revision and the last one rolled out).
async fn started(
    what: k8s::Translation,
    mode: KserveMode,
) -> Option<(Cluster, Proxy, Api<DynamicObject>)> {
    let resource = what.resource.clone();
    let cluster = Cluster::start(NAMESPACE, what).await?;
    let http = HttpClient::new(Duration::from_secs(2));
    let peer = Proxy {
        adapter: for_plane(&plane(cluster.server.access(), mode, true), &http),
        url: format!("http://{}/", cluster.nginx.addr),
    };
    let client = cluster.server.client().await;
    let api: Api<DynamicObject> = Api::namespaced_with(client, NAMESPACE, &resource);
    applied(peer.adapter.as_ref(), &cluster.upstreams.champion_only(5)).await;
    Some((cluster, peer, api))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kserve_adapter_passes_the_kit_in_knative_mode_and_restores_the_champion() {
    let Some((cluster, peer, api)) = started(k8s::inference_services(), KserveMode::Knative).await
    else {
        return;
    };
    let (upstreams, adapter) = (&cluster.upstreams, peer.adapter.as_ref());
    kit::run(&peer, upstreams).await;

    let o = object(&api).await;
    assert_eq!(
        o.metadata.annotations.clone().unwrap_or_default()["serving.kserve.io/deploymentMode"],
        "Knative"
    );

    // SHADOW: the candidate deployed dark, every request to the champion.
    applied(adapter, &shadow(upstreams, 20, "7.0")).await;
    let o = object(&api).await;
    assert_eq!(
        predictor_as_written(&o),
        upstreams.predictor("candidate"),
        "{o:?}"
    );
    assert_eq!(o.data["spec"]["predictor"]["canaryTrafficPercent"], 0);
    let traffic = &o.data["status"]["components"]["predictor"]["traffic"];
    assert_eq!(
        traffic[1]["percent"], 100,
        "the last rolled out serves all: {traffic}"
    );

    // 5/25/50%: the object's share is the stage's at every step.
    for (bp, o) in stages(adapter, upstreams, &api).await {
        assert_eq!(
            o.data["spec"]["predictor"]["canaryTrafficPercent"],
            bp / 100,
            "{o:?}"
        );
        assert_eq!(predictor_as_written(&o), upstreams.predictor("candidate"));
    }

    // A rollback: the champion's predictor back byte for byte, everything
    // to the champion's revision at once.
    applied(adapter, &upstreams.champion_only(24)).await;
    let o = object(&api).await;
    assert_eq!(
        serde_json::to_string(&predictor_as_written(&o)).ok(),
        serde_json::to_string(&upstreams.predictor("champion")).ok(),
        "the champion's predictor exactly"
    );
    assert_eq!(o.data["spec"]["predictor"]["canaryTrafficPercent"], 0);
    let by = kit::get(&peer.url, "user-1").await;
    assert_eq!(by.as_deref(), Some("champion"));
    // Sent again (a retry, a restarted controller): the share stays 0, or
    // KServe would send everything to the latest *ready* revision, which
    // may still be the candidate's.
    applied(adapter, &upstreams.champion_only(24)).await;
    let o = object(&api).await;
    assert_eq!(o.data["spec"]["predictor"]["canaryTrafficPercent"], 0);

    // KServe silent: not confirmed while status is required.
    cluster.controller.silent.store(true, Ordering::SeqCst);
    match adapter.apply(&upstreams.split(500, 25, "8.1")).await {
        Err(AdapterError::NotConfirmed { why, .. }) => eprintln!("KServe silent: {why}"),
        other => panic!("without KServe's report nothing is confirmed, got {other:?}"),
    }
    cluster.controller.silent.store(false, Ordering::SeqCst);

    // The API server restarted mid-rollout: nothing lost.
    cluster.server.restart_api();
    applied(adapter, &upstreams.split(2_500, 26, "8.2")).await;
    let o = object(&api).await;
    assert_eq!(o.data["spec"]["predictor"]["canaryTrafficPercent"], 25);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kserve_defaulting_is_not_drift_and_another_writer_is_not_overwritten() {
    let Some((cluster, peer, api)) = started(k8s::inference_services(), KserveMode::Knative).await
    else {
        return;
    };
    let (upstreams, adapter) = (&cluster.upstreams, peer.adapter.as_ref());
    // A champion whose predictor holds what KServe omits when it writes
    // the object back (a zero probe delay).
    let mut champion = upstreams.champion_only(10);
    champion.arms[0].predictor = Some(json!({ "model": {
        "modelFormat": { "name": "sklearn" }, "storageUri": "s3://rollgate-kit/champion",
        "ports": upstreams.predictor("champion")["model"]["ports"].clone(),
        "readinessProbe": { "initialDelaySeconds": 0, "periodSeconds": 5 },
    }}));
    // No canary in force: no share (the latest revision, once up, gets
    // everything).
    applied(adapter, &champion).await;
    applied(adapter, &champion).await;
    let o = object(&api).await;
    assert!(
        o.data["spec"]["predictor"]["canaryTrafficPercent"].is_null(),
        "{o:?}"
    );
    // KServe's defaulting, as its Go types write the object back: the
    // zero dropped, under KServe's own manager.
    let kserve = PatchParams {
        field_manager: Some("kserve-controller".into()),
        ..PatchParams::default()
    };
    let strip = json!({ "spec": { "predictor": { "model": { "readinessProbe": { "initialDelaySeconds": null } } } } });
    api.patch(kit::MODEL, &kserve, &Patch::Merge(&strip))
        .await
        .expect("KServe's write");
    let before = object(&api).await.metadata.generation;
    for _ in 0..3 {
        applied(adapter, &champion).await;
    }
    let after = object(&api).await;
    assert_eq!(
        after.metadata.generation, before,
        "no write over KServe's defaults: {after:?}"
    );
    assert!(
        after.data["spec"]["predictor"]["model"]["readinessProbe"]["initialDelaySeconds"].is_null()
    );

    // A predictor the schema refuses: a clear error, nothing written.
    let mut bad = upstreams.split(500, 11, "9.1");
    bad.arms[1].predictor = Some(json!({ "minReplicas": -1,
        "model": { "modelFormat": { "name": "sklearn" }, "storageUri": "s3://m/v2" } }));
    let generation = object(&api).await.metadata.generation;
    match adapter.apply(&bad).await {
        Err(AdapterError::Kubernetes { code: 422, why, .. }) => {
            assert!(
                why.contains("minReplicas"),
                "the error names the field: {why}"
            )
        }
        other => panic!("a refused predictor is an error, got {other:?}"),
    }
    assert_eq!(
        object(&api).await.metadata.generation,
        generation,
        "nothing half-applied"
    );
    // A predictor choosing what runs (an image) is refused unless the
    // data plane's declaration allows it.
    let mut image = upstreams.split(500, 12, "9.2");
    image.arms[1].predictor = Some(json!({ "model": { "modelFormat": { "name": "sklearn" },
        "storageUri": "s3://m/v2", "image": "registry.example/evil:1" } }));
    match adapter.apply(&image).await {
        Err(AdapterError::Unroutable { why, .. }) => {
            assert!(
                why.contains("\"image\"") && why.contains("allow_predictor_fields"),
                "{why}"
            )
        }
        other => panic!("a guarded field is refused, got {other:?}"),
    }
    // A revision without a predictor cannot be routed through KServe.
    let mut none = upstreams.split(500, 12, "9.2");
    none.arms[1].predictor = None;
    match adapter.apply(&none).await {
        Err(AdapterError::Unroutable { why, .. }) => assert!(why.contains("no KServe predictor")),
        other => panic!("a revision without a predictor is unroutable, got {other:?}"),
    }

    // Someone else changes the model itself: that is drift, and rollgate
    // neither confirms it nor overwrites their field.
    let edit =
        json!({ "spec": { "predictor": { "model": { "storageUri": "s3://elsewhere/v9" } } } });
    let kubectl = PatchParams {
        field_manager: Some("kubectl-edit".into()),
        ..PatchParams::default()
    };
    api.patch(kit::MODEL, &kubectl, &Patch::Merge(&edit))
        .await
        .expect("the edit");
    match adapter.apply(&champion).await {
        Err(AdapterError::Kubernetes { code: 409, why, .. }) => {
            assert!(
                why.contains("kubectl-edit"),
                "the conflict names the other writer: {why}"
            )
        }
        other => panic!("another writer's field is not overwritten, got {other:?}"),
    }
    let o = object(&api).await;
    assert_eq!(
        o.data["spec"]["predictor"]["model"]["storageUri"],
        "s3://elsewhere/v9"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kserve_adapter_passes_the_kit_in_standard_mode_with_spec_canary() {
    let Some((cluster, peer, api)) =
        started(k8s::standard_inference_services(), KserveMode::Standard).await
    else {
        return;
    };
    let (upstreams, adapter) = (&cluster.upstreams, peer.adapter.as_ref());
    kit::run(&peer, upstreams).await;

    applied(adapter, &shadow(upstreams, 20, "7.0")).await;
    let o = object(&api).await;
    let canary = &o.data["spec"]["canary"];
    assert_eq!(canary[0]["trafficPercent"], 0, "deployed dark: {o:?}");
    assert_eq!(canary[0]["predictor"]["name"], "r-candidate");
    assert_eq!(o.data["spec"]["predictor"]["name"], "r-champion");
    for (bp, o) in stages(adapter, upstreams, &api).await {
        assert_eq!(
            o.data["spec"]["canary"][0]["trafficPercent"],
            bp / 100,
            "{o:?}"
        );
        let status = &o.data["status"]["canaryStatuses"][0];
        assert_eq!(
            status["trafficPercent"],
            bp / 100,
            "KServe's report: {status}"
        );
    }
    // A rollback: the canary entry gone, the champion's predictor exactly.
    applied(adapter, &upstreams.champion_only(24)).await;
    let o = object(&api).await;
    assert!(o.data["spec"]["canary"].is_null(), "{o:?}");
    assert_eq!(
        serde_json::to_string(&predictor_as_written(&o)).ok(),
        serde_json::to_string(&upstreams.predictor("champion")).ok()
    );
    // A promotion from a canary stage: the candidate's predictor is the
    // predictor, named by its revision, once KServe no longer reports the
    // canary.
    applied(adapter, &upstreams.split(5_000, 25, "7.9")).await;
    let mut promoted = upstreams.champion_only(26);
    promoted.arms[0] = upstreams.split(10_000, 26, "x").arms.remove(1);
    applied(adapter, &promoted).await;
    let o = object(&api).await;
    assert_eq!(o.data["spec"]["predictor"]["name"], "r-candidate");
    assert_eq!(predictor_as_written(&o), upstreams.predictor("candidate"));
    assert_eq!(
        kit::get(&peer.url, "user-2").await.as_deref(),
        Some("candidate")
    );
}
