//! How long one controller pass takes over many active rollouts.
//!
//! `cargo bench -p rollgate-controller --bench reconcile` sets up 1,000
//! models, each with an active rollout, in SQLite and — when
//! `ROLLGATE_TEST_POSTGRES` names a server (`tests/postgres/start.sh`) — in
//! PostgreSQL, and a stand-in gateway on 127.0.0.1 serving stats for every
//! model (3 routing epochs each, both arms) and answering readiness probes.
//! Each measured pass reconciles every rollout as the run loop does: one
//! read of the active list, one fetch of the gateway's stats, and per
//! rollout a store read, a readiness probe over HTTP, the state machine and
//! a commit when it moved. Prints a Markdown table and a JSON line.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use rollgate_controller::{
    CONTROLLER_LEASE, Context, ControllerMetrics, HttpClient, Leader, Schedule, pass,
};
use rollgate_core::{GatewaySnapshot, Plan, Snapshot, epoch_label};
use rollgate_store::{ModelSpec, RevisionSpec, SqlStore, Store};

const ROLLOUTS: usize = 1_000;
const PASSES: usize = 5;

/// A stand-in gateway: its stats at `/rollgate/stats`, 200 to any other GET.
async fn stand_in(stats: Arc<Vec<u8>>) -> String {
    let app = Router::new()
        .route(
            "/rollgate/stats",
            get(move || {
                let stats = Arc::clone(&stats);
                async move { stats.as_ref().clone() }
            }),
        )
        .fallback(get(|| async { "{}" }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}")
}

/// The gateway's snapshot: every model's rollout with three epochs of
/// healthy traffic on both arms.
fn snapshot(rollouts: &[(String, i64, String, String)]) -> GatewaySnapshot {
    let mut epochs = std::collections::BTreeMap::new();
    for (model, id, champion, candidate) in rollouts {
        let mut by_epoch = std::collections::BTreeMap::new();
        for e in 0..3u32 {
            let mut s = Snapshot::default();
            for i in 0..200u64 {
                s.revision_mut(champion)
                    .record_success(20_000 + i * 13, ["ok"]);
                s.revision_mut(candidate)
                    .record_success(20_500 + i * 11, ["ok"]);
            }
            by_epoch.insert(epoch_label(*id, e), s);
        }
        epochs.insert(model.clone(), by_epoch);
    }
    GatewaySnapshot {
        gateway: "bench-gw".into(),
        boot: "b1".into(),
        models: Default::default(),
        epochs,
        overloaded: 0,
        retried: 0,
        slow_clients: 0,
        streamed_requests: 0,
        wrong_protocol: 0,
        answers_dropped: 0,
        fallbacks: Default::default(),
        unroutable: Default::default(),
        pinned: Default::default(),
        in_flight: 0,
    }
}

struct Row {
    engine: &'static str,
    passes: Vec<f64>,
    commits: u64,
}

async fn run(store: SqlStore, upstream_base: &str) -> Row {
    let engine = store.engine();
    let store: Arc<dyn Store> = Arc::new(store);
    let upstream = upstream_base.to_string();
    let s = Arc::clone(&store);
    let rollouts = tokio::task::spawn_blocking(move || {
        let mut out = Vec::new();
        for m in 0..ROLLOUTS {
            let name = format!("m{m}");
            s.create_model(&name, &ModelSpec::default(), "bench")
                .expect("model");
            let revs: Vec<String> = (0..2)
                .map(|n| {
                    let spec = RevisionSpec {
                        upstream: upstream.clone(),
                        headers: [("x-arm".to_string(), n.to_string())].into(),
                        ..RevisionSpec::default()
                    };
                    s.register_revision(&name, &spec, "bench").expect("rev").id
                })
                .collect();
            s.set_champion(&name, &revs[0], "bench", "bench")
                .expect("champion");
            let r = s
                .create_rollout(&name, &revs[1], &Plan::default(), "bench")
                .expect("rollout");
            out.push((name, r.id, revs[0].clone(), revs[1].clone()));
        }
        out
    })
    .await
    .expect("setup");
    let stats = Arc::new(serde_json::to_vec(&snapshot(&rollouts)).expect("json"));
    let stats_bytes = stats.len();
    let gateway = stand_in(stats).await;
    let (s, url) = (Arc::clone(&store), format!("{gateway}/rollgate/stats"));
    let lease = tokio::task::spawn_blocking(move || {
        s.heartbeat("bench-gw", &url).expect("heartbeat");
        s.acquire_lease(CONTROLLER_LEASE, "bench", Duration::from_secs(3600))
            .expect("lease")
            .expect("free")
    })
    .await
    .expect("lease");
    let ctx = Context {
        looks: Default::default(),
        registry_signals: Default::default(),
        store: Arc::clone(&store),
        http: HttpClient::new(Duration::from_secs(5)),
        gateway_ttl: Duration::from_secs(3600),
        tick: Duration::from_secs(1),
        clock: Arc::new(rollgate_store_clock),
        local_gateway: None,
        metrics: Arc::new(ControllerMetrics::default()),
        anchor: None,
        retention: None,
        leader: Arc::new(Leader::holding(&lease, Duration::from_secs(3600))),
        concurrency: 16,
        stats: Default::default(),
        notify: None,
        adapters: Default::default(),
        host: Default::default(),
    };
    let versions = |store: Arc<dyn Store>| async move {
        tokio::task::spawn_blocking(move || {
            store
                .rollouts(true)
                .expect("rollouts")
                .iter()
                .map(|r| r.version)
                .sum::<u64>()
        })
        .await
        .expect("versions")
    };
    // A first pass moves every rollout out of PENDING (a commit each).
    let mut schedule = Schedule::default();
    pass(&ctx, &mut schedule).await.expect("warm-up pass");
    let before = versions(Arc::clone(&store)).await;
    let mut passes = Vec::new();
    for _ in 0..PASSES {
        // Every rollout due: the worst case of one tick.
        let mut schedule = Schedule::default();
        let started = Instant::now();
        let n = pass(&ctx, &mut schedule).await.expect("pass");
        passes.push(started.elapsed().as_secs_f64());
        assert_eq!(n, ROLLOUTS, "every rollout reconciled");
    }
    let commits = versions(Arc::clone(&store)).await - before;
    eprintln!("stats snapshot: {stats_bytes} bytes");
    Row {
        engine,
        passes,
        commits,
    }
}

fn rollgate_store_clock() -> rollgate_core::Timestamp {
    rollgate_core::Timestamp(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
    )
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut rows = Vec::new();
    let sqlite = SqlStore::open_dir(dir.path()).expect("sqlite");
    rows.push(rt.block_on(async {
        let up = stand_in(Arc::new(Vec::new())).await;
        run(sqlite, &up).await
    }));
    match std::env::var("ROLLGATE_TEST_POSTGRES") {
        Ok(server) => {
            let url = rollgate_store::scratch_database(&server, "rg_bench_reconcile")
                .expect("scratch database");
            let pg = SqlStore::connect(&url).expect("postgres");
            rows.push(rt.block_on(async {
                let up = stand_in(Arc::new(Vec::new())).await;
                run(pg, &up).await
            }));
        }
        Err(_) => eprintln!("PostgreSQL skipped: ROLLGATE_TEST_POSTGRES is unset"),
    }
    println!(
        "| engine | rollouts | passes | median pass (s) | max pass (s) | per rollout (ms) | commits in the passes |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let mut json = Vec::new();
    for r in &rows {
        let mut sorted = r.passes.clone();
        sorted.sort_by(f64::total_cmp);
        let median = sorted[sorted.len() / 2];
        let max = sorted[sorted.len() - 1];
        println!(
            "| {} | {ROLLOUTS} | {} | {median:.3} | {max:.3} | {:.3} | {} |",
            r.engine,
            r.passes.len(),
            median * 1000.0 / ROLLOUTS as f64,
            r.commits
        );
        json.push(format!(
            "{{\"engine\":\"{}\",\"rollouts\":{ROLLOUTS},\"passes_s\":{:?},\"commits\":{}}}",
            r.engine, r.passes, r.commits
        ));
    }
    println!("\nJSON: [{}]", json.join(","));
}
