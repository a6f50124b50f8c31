//! How soon a gateway following a shared PostgreSQL store applies a routing
//! change after its commit.
//!
//! `ROLLGATE_TEST_POSTGRES=postgres://… cargo bench -p rollgate --bench follow`
//! starts `rollgate gateway --store URL` (its own process, reaching the
//! database over TCP), then 200 times: commits a new model with a champion
//! (its upstream a closed port) and polls the gateway every 2 ms until the
//! model is routed (502 from the dead upstream instead of 404 for an
//! unknown model). Commits are spread over the follow interval at random so
//! they do not fall in phase with its polls. Prints the latency
//! distribution as a Markdown table and a JSON line.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rollgate_store::{ModelSpec, RevisionSpec, SqlStore, Store};

const CHANGES: usize = 200;

fn main() {
    let Ok(server) = std::env::var("ROLLGATE_TEST_POSTGRES") else {
        eprintln!("skipped: set ROLLGATE_TEST_POSTGRES (tests/postgres/start.sh starts one)");
        return;
    };
    let url = rollgate_store::scratch_database(&server, "rg_bench_follow").expect("scratch");
    let store = SqlStore::connect(&url).expect("connect");
    let mut gateway = Command::new(env!("CARGO_BIN_EXE_rollgate"))
        .args(["gateway", "--store", &url, "--listen", "127.0.0.1:0"])
        .env("RUST_LOG", "error")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn gateway");
    let mut lines = BufReader::new(gateway.stdout.take().expect("stdout")).lines();
    let first = lines.next().expect("a line").expect("stdout");
    let addr = first
        .split_whitespace()
        .find_map(|w| w.strip_prefix("http://"))
        .expect("the gateway's address")
        .to_string();
    std::thread::spawn(move || for _ in lines {});

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let client: Client<_, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let status = |model: String| {
        let client = client.clone();
        let uri = format!("http://{addr}/v1/models/{model}:predict");
        rt.block_on(async move {
            let req = hyper::Request::post(uri)
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from_static(br#"{"instances":[[1]]}"#)))
                .expect("request");
            match tokio::time::timeout(Duration::from_secs(5), client.request(req)).await {
                Ok(Ok(r)) => {
                    let s = r.status().as_u16();
                    let _ = r.into_body().collect().await;
                    s
                }
                _ => 0,
            }
        })
    };
    let mut latencies = Vec::with_capacity(CHANGES);
    for k in 0..CHANGES {
        let name = format!("m{k}");
        assert_eq!(status(name.clone()), 404, "unknown before its commit");
        std::thread::sleep(Duration::from_millis(rand::random::<u64>() % 500));
        store
            .create_model(&name, &ModelSpec::default(), "bench")
            .expect("model");
        let rev = store
            .register_revision(
                &name,
                &RevisionSpec {
                    upstream: "http://127.0.0.1:9".into(),
                    ..RevisionSpec::default()
                },
                "bench",
            )
            .expect("revision");
        store
            .set_champion(&name, &rev.id, "bench", "bench")
            .expect("champion");
        let committed = Instant::now();
        loop {
            if status(name.clone()) != 404 {
                latencies.push(committed.elapsed().as_secs_f64() * 1000.0);
                break;
            }
            assert!(
                committed.elapsed() < Duration::from_secs(30),
                "the gateway never applied {name}"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    let _ = gateway.kill();
    let _ = gateway.wait();
    latencies.sort_by(f64::total_cmp);
    let q = |p: f64| latencies[((latencies.len() as f64 - 1.0) * p).round() as usize];
    println!("| changes | p50 (ms) | p90 (ms) | p99 (ms) | max (ms) |");
    println!("|---:|---:|---:|---:|---:|");
    println!(
        "| {CHANGES} | {:.0} | {:.0} | {:.0} | {:.0} |",
        q(0.5),
        q(0.9),
        q(0.99),
        q(1.0)
    );
    println!(
        "\nJSON: {{\"changes\":{CHANGES},\"p50_ms\":{:.1},\"p90_ms\":{:.1},\"p99_ms\":{:.1},\"max_ms\":{:.1}}}",
        q(0.5),
        q(0.9),
        q(0.99),
        q(1.0)
    );
}
