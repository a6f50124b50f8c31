//! The Gateway API adapter against a real Kubernetes API server (the
//! prebuilt one of `tests/k8s`; `CI` fails without it, a local run skips),
//! the route's controller played by the test over a real nginx standing
//! in for the Gateway's data plane.

use std::sync::atomic::Ordering;
use std::time::Duration;

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use rollgate_adapters::kit::k8s::{self, ApiServer, Cluster, RouteController};
use rollgate_adapters::kit::{self, Proxy, Upstreams};
use rollgate_adapters::{AdapterError, HttpClient, for_plane};
use rollgate_store::{DataPlane, KubeAccess, ParentRef, RouteTemplate};
use serde_json::json;

const NAMESPACE: &str = "models";

fn route(name: &str, hostnames: &[&str]) -> RouteTemplate {
    RouteTemplate {
        name: name.into(),
        parent_refs: vec![ParentRef {
            name: "inference".into(),
            namespace: None,
            section_name: None,
        }],
        hostnames: hostnames.iter().map(|h| h.to_string()).collect(),
        path_prefix: Some("/v2/models/$model".into()),
    }
}

fn plane(access: KubeAccess, routes: Vec<RouteTemplate>, require_status: bool) -> DataPlane {
    DataPlane::GatewayApi {
        cluster: access,
        namespace: NAMESPACE.into(),
        routes,
        mirror: None,
        require_status,
        controller_name: Some(k8s::STAND_IN.into()),
    }
}

async fn object(api: &Api<DynamicObject>, name: &str) -> DynamicObject {
    api.get(name).await.expect("the route")
}

fn weights(o: &DynamicObject) -> Vec<u64> {
    o.data["spec"]["rules"][0]["backendRefs"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|b| b["weight"].as_u64().unwrap_or(0))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_api_adapter_passes_the_kit_and_keeps_others_fields() {
    let Some(cluster) = Cluster::start(NAMESPACE, k8s::http_routes()).await else {
        return;
    };
    let Cluster {
        controller,
        nginx,
        upstreams,
        server,
    } = &cluster;
    let client = server.client().await;
    let plane = plane(
        server.access(),
        vec![route("$model", &["$model.example.com"])],
        true,
    );
    let http = HttpClient::new(Duration::from_secs(2));
    let peer = Proxy {
        adapter: for_plane(&plane, &http),
        url: format!("http://{}/", nginx.addr),
    };
    kit::run(&peer, upstreams).await;

    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), NAMESPACE, &k8s::http_routes().resource);
    let o = object(&api, kit::MODEL).await;
    assert_eq!(weights(&o), vec![10_000], "champion-only at the end: {o:?}");
    assert_eq!(
        o.data["spec"]["hostnames"],
        json!(["m.example.com"]),
        "$model filled in"
    );
    assert!(
        controller.programmed.lock().expect("the log").len() >= 4,
        "the controller put every generation in force"
    );

    // Someone labels the route: kept through the next apply.
    let labelled = json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": kit::MODEL, "labels": {"team": "fraud"}},
    });
    api.patch(
        kit::MODEL,
        &PatchParams::apply("platform-team"),
        &Patch::Apply(&labelled),
    )
    .await
    .expect("another manager's label");
    let split = upstreams.split(2_500, 20, "5.1");
    peer.adapter.apply(&split).await.expect("a split applies");
    let o = object(&api, kit::MODEL).await;
    assert_eq!(weights(&o), vec![7_500, 2_500], "{o:?}");
    assert_eq!(o.metadata.labels.unwrap_or_default()["team"], "fraud");

    // Someone edits the weights by hand (another field manager takes the
    // field): rollgate's next apply is refused with the conflict named,
    // and the hand-set weights are not overwritten.
    let mut edited = o.data["spec"].clone();
    edited["rules"][0]["backendRefs"][0]["weight"] = json!(1);
    let hand = json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": kit::MODEL}, "spec": edited,
    });
    api.patch(
        kit::MODEL,
        &PatchParams::apply("kubectl-edit").force(),
        &Patch::Apply(&hand),
    )
    .await
    .expect("a hand edit");
    match peer.adapter.apply(&upstreams.split(5_000, 21, "5.2")).await {
        Err(AdapterError::Kubernetes { code: 409, why, .. }) => {
            eprintln!("a hand edit: {why}");
            assert!(
                why.contains("kubectl-edit"),
                "the conflict names the manager: {why}"
            );
        }
        other => panic!("a field another manager owns is a conflict (409), got {other:?}"),
    }
    let o = object(&api, kit::MODEL).await;
    assert_eq!(weights(&o)[0], 1, "the hand edit is not overwritten: {o:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_route_leaves_every_route_as_it_was() {
    let Some(server) = ApiServer::start() else {
        return;
    };
    let upstreams = Upstreams::start_at("localhost").await;
    let client = server.client().await;
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), NAMESPACE, &k8s::http_routes().resource);
    let http = HttpClient::new(Duration::from_secs(2));
    let good = route("$model-public", &["$model.example.com"]);
    let adapter = for_plane(&plane(server.access(), vec![good.clone()], false), &http);
    adapter
        .apply(&upstreams.champion_only(1))
        .await
        .expect("champion-only, without status");
    // A second route whose hostname the schema refuses (upper case).
    let bad = route("$model-internal", &["Internal.$model"]);
    let both = for_plane(&plane(server.access(), vec![good, bad], false), &http);
    match both.apply(&upstreams.split(500, 2, "1.1")).await {
        Err(AdapterError::Kubernetes { code: 422, why, .. }) => {
            eprintln!("refused: {why}");
            assert!(why.contains("spec.hostnames"), "the field is named: {why}");
        }
        other => panic!("a hostname the schema refuses is a 422, got {other:?}"),
    }
    let o = object(&api, "m-public").await;
    assert_eq!(weights(&o), vec![10_000], "nothing half-applied: {o:?}");
    assert!(
        api.get_opt("m-internal").await.expect("get").is_none(),
        "the refused route was not created"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_controller_confirms_nothing_and_a_restarted_api_server_loses_nothing() {
    let Some(cluster) = Cluster::start(NAMESPACE, k8s::http_routes()).await else {
        return;
    };
    let Cluster {
        controller,
        nginx,
        upstreams,
        server,
    } = &cluster;
    let client = server.client().await;
    let routes = vec![
        route("$model", &["$model.example.com"]),
        route("$model-internal", &["$model.internal"]),
    ];
    let http = HttpClient::new(Duration::from_secs(2));
    let adapter = for_plane(&plane(server.access(), routes, true), &http);
    adapter
        .apply(&upstreams.champion_only(1))
        .await
        .expect("both routes accepted");

    controller.silent.store(true, Ordering::SeqCst);
    match adapter.apply(&upstreams.split(500, 2, "1.1")).await {
        Err(AdapterError::NotConfirmed { why, .. }) => {
            eprintln!("silent: {why}");
            assert!(why.contains("not reported generation"), "{why}");
        }
        other => panic!("without the controller's report nothing is confirmed, got {other:?}"),
    }
    controller.silent.store(false, Ordering::SeqCst);

    server.restart_api();
    adapter
        .apply(&upstreams.split(2_500, 3, "1.2"))
        .await
        .expect("applied and confirmed after the API server restarted");
    let api: Api<DynamicObject> =
        Api::namespaced_with(client, NAMESPACE, &k8s::http_routes().resource);
    for name in ["m", "m-internal"] {
        let o = object(&api, name).await;
        assert_eq!(weights(&o), vec![7_500, 2_500], "{name}: {o:?}");
        assert_eq!(
            o.metadata.annotations.unwrap_or_default()["rollgate.dev/generation"],
            "3"
        );
    }
    let by = kit::get(&format!("http://{}/", nginx.addr), "user-1").await;
    assert!(by.is_some(), "the stand-in data plane answers");
}

/// Two controllers (a new leader and a cut-off former one) writing the
/// same routes at once: whatever the interleaving, the higher generation
/// is what the routes hold, and the lower is refused as stale or
/// confirmed before the higher replaced it; never the other way round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_writers_leave_the_newer_routing() {
    let Some(server) = ApiServer::start() else {
        return;
    };
    let upstreams = Upstreams::start_at("localhost").await;
    let client = server.client().await;
    let controller = RouteController::start(
        client.clone(),
        NAMESPACE,
        k8s::http_routes(),
        "none",
        Box::new(k8s::AtOnce),
    );
    let http = HttpClient::new(Duration::from_secs(2));
    let api: Api<DynamicObject> =
        Api::namespaced_with(client, NAMESPACE, &k8s::http_routes().resource);
    // Even rounds race on creating the routes (new names), odd rounds on
    // routes both writers read.
    for round in 0..8u64 {
        let prefix = format!("r{}", round / 2);
        let routes = vec![
            route(&format!("$model-{prefix}"), &["$model.example.com"]),
            route(&format!("$model-{prefix}-internal"), &["$model.internal"]),
        ];
        let (old, new) = (
            for_plane(&plane(server.access(), routes.clone(), true), &http),
            for_plane(&plane(server.access(), routes, true), &http),
        );
        let (older, newer) = (10 + 2 * round, 11 + 2 * round);
        let stale = upstreams.split(500, older, &format!("{older}.1"));
        let fresh = upstreams.split(2_500, newer, &format!("{newer}.1"));
        let (a, b) = tokio::join!(old.apply(&stale), new.apply(&fresh));
        b.expect("the newer routing is applied and confirmed");
        match a {
            Ok(()) | Err(AdapterError::Stale { .. }) => {}
            other => panic!("round {round}: the older routing: {other:?}"),
        }
        for name in [format!("m-{prefix}"), format!("m-{prefix}-internal")] {
            let o = object(&api, &name).await;
            assert_eq!(
                weights(&o),
                vec![7_500, 2_500],
                "round {round}, {name}: {o:?}"
            );
            let annotations = o.metadata.annotations.unwrap_or_default();
            assert_eq!(annotations["rollgate.dev/generation"], newer.to_string());
        }
        match old.apply(&stale).await {
            Err(AdapterError::Stale { have, want }) => assert_eq!((have, want), (newer, older)),
            other => panic!("round {round}: a lower generation afterwards is stale: {other:?}"),
        }
    }
    drop(controller);
}
