//! How long a stage's routing takes to be applied and confirmed through a
//! real Kubernetes API server (the prebuilt one of `tests/k8s`): the
//! Gateway API, Istio and KServe adapters' `apply` timed from the call to its
//! confirmation, with a route controller that reports each generation as
//! soon as it sees it (it lists the objects every 25 ms), and without
//! waiting for status (the API server's part alone), side by side in one
//! run. Prints a Markdown table (bench/results/k8s-routing.md).
//!
//! `cargo bench -p rollgate-adapters --bench k8s_routing` (needs
//! `ROLLGATE_K8S_BIN_DIR` or `../shared/k8s/bin`; `ROLLGATE_BENCH_APPLIES`
//! applies per case, default 200).

use std::time::{Duration, Instant};

use rollgate_adapters::kit::Upstreams;
use rollgate_adapters::kit::k8s::{self, ApiServer, RouteController};
use rollgate_adapters::{Adapter, HttpClient, for_plane};
use rollgate_store::{DataPlane, KserveMode, ParentRef, RouteTemplate};

fn gateway_api(server: &ApiServer, require_status: bool) -> DataPlane {
    DataPlane::GatewayApi {
        cluster: server.access(),
        namespace: "bench".into(),
        routes: vec![RouteTemplate {
            name: "$model".into(),
            parent_refs: vec![ParentRef {
                name: "inference".into(),
                namespace: None,
                section_name: None,
            }],
            hostnames: vec!["$model.example.com".into()],
            path_prefix: None,
        }],
        mirror: None,
        require_status,
        controller_name: Some(k8s::STAND_IN.into()),
    }
}

fn istio(server: &ApiServer) -> DataPlane {
    DataPlane::Istio {
        cluster: server.access(),
        namespace: "bench".into(),
        name: "$model".into(),
        hosts: vec!["$model.bench.svc.cluster.local".into()],
        gateways: Vec::new(),
        mirror: None,
        require_status: true,
    }
}

fn kserve(server: &ApiServer, namespace: &str, mode: KserveMode) -> DataPlane {
    DataPlane::Kserve {
        cluster: server.access(),
        namespace: namespace.into(),
        name: "$model".into(),
        mode,
        allow_predictor_fields: Vec::new(),
        require_status: true,
    }
}

/// `n` applies of a rollout's stages in turn (5%, 25%, 50%, then
/// champion-only), each a new generation: the seconds each took.
async fn timed(adapter: &dyn Adapter, upstreams: &Upstreams, n: u64, from: u64) -> Vec<f64> {
    let mut took = Vec::new();
    for i in 0..n {
        let generation = from + i;
        let desired = match i % 4 {
            0 => upstreams.split(500, generation, &format!("{generation}.1")),
            1 => upstreams.split(2_500, generation, &format!("{generation}.2")),
            2 => upstreams.split(5_000, generation, &format!("{generation}.3")),
            _ => upstreams.champion_only(generation),
        };
        let start = Instant::now();
        let applied = tokio::time::timeout(Duration::from_secs(20), adapter.apply(&desired)).await;
        match applied {
            Ok(Ok(())) => took.push(start.elapsed().as_secs_f64()),
            other => panic!("apply {i} of {}: {other:?}", adapter.kind()),
        }
    }
    took
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let Some(server) = ApiServer::start() else {
        eprintln!("no Kubernetes API server binaries: set ROLLGATE_K8S_BIN_DIR");
        std::process::exit(2);
    };
    let n: u64 = std::env::var("ROLLGATE_BENCH_APPLIES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let upstreams = Upstreams::start_at("localhost").await;
    let client = server.client().await;
    let _routes = RouteController::start(
        client.clone(),
        "bench",
        k8s::http_routes(),
        "none",
        Box::new(k8s::AtOnce),
    );
    let _istiod = RouteController::start(
        client.clone(),
        "bench",
        k8s::virtual_services(),
        "none",
        Box::new(k8s::AtOnce),
    );
    let _knative = RouteController::start(
        client.clone(),
        "bench-knative",
        k8s::inference_services(),
        "none",
        Box::new(k8s::AtOnce),
    );
    let _standard = RouteController::start(
        client,
        "bench-standard",
        k8s::standard_inference_services(),
        "none",
        Box::new(k8s::AtOnce),
    );
    let http = HttpClient::new(Duration::from_secs(2));
    let cases = [
        ("gateway_api, status required", gateway_api(&server, true)),
        ("gateway_api, API server only", gateway_api(&server, false)),
        ("istio, status required", istio(&server)),
        (
            "kserve (Knative), status required",
            kserve(&server, "bench-knative", KserveMode::Knative),
        ),
        (
            "kserve (Standard), status required",
            kserve(&server, "bench-standard", KserveMode::Standard),
        ),
    ];
    println!("| case | applies | p50 ms | p90 ms | p99 ms | max ms |");
    println!("|---|---|---|---|---|---|");
    // The cases share model `m`'s objects: each starts at a higher generation.
    for (round, (name, plane)) in cases.iter().enumerate() {
        let adapter = for_plane(plane, &http);
        // A first apply creates the object with the champion alone (KServe
        // splits only after something rolled out): not a stage's routing.
        let first = upstreams.champion_only(1 + round as u64 * 100_000);
        let created = tokio::time::timeout(Duration::from_secs(20), adapter.apply(&first)).await;
        assert!(matches!(created, Ok(Ok(()))), "{name}: {created:?}");
        let mut took = timed(adapter.as_ref(), &upstreams, n, 2 + round as u64 * 100_000).await;
        took.sort_by(f64::total_cmp);
        let ms = |q: f64| quantile(&took, q) * 1_000.0;
        let max = took.last().copied().unwrap_or(0.0) * 1_000.0;
        println!(
            "| {name} | {n} | {:.0} | {:.0} | {:.0} | {max:.0} |",
            ms(0.5),
            ms(0.9),
            ms(0.99)
        );
    }
}
