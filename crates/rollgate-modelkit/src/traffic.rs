//! An open-loop load generator: requests leave at a fixed rate whatever the
//! server does (a closed loop would slow down with the server and hide its
//! latency), with sticky keys and features drawn from the task.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rollgate_core::LatencyHistogram;
use serde::Serialize;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::task;

#[derive(Debug, Clone)]
pub struct TrafficConfig {
    /// The full prediction URL, e.g. `http://127.0.0.1:8080/v1/models/fraud:predict`.
    pub url: String,
    pub rps: f64,
    pub duration: Duration,
    /// Distinct sticky keys (`x-rollgate-key: user-N`).
    pub keys: u64,
    pub seed: u64,
    /// Requests in flight beyond this are skipped (and counted).
    pub max_in_flight: usize,
    /// Send OIP V2 bodies instead of KServe V1.
    pub v2: bool,
    pub progress: bool,
}

/// What happened.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TrafficReport {
    pub sent: u64,
    pub ok: u64,
    /// Answers other than 2xx, by status.
    pub statuses: BTreeMap<u16, u64>,
    /// Connection errors and timeouts.
    pub errors: u64,
    /// Not sent because `max_in_flight` requests were outstanding.
    pub skipped: u64,
    pub elapsed_s: f64,
    pub p50_ms: Option<f64>,
    pub p95_ms: Option<f64>,
    pub p99_ms: Option<f64>,
}

#[derive(Default)]
struct Tally {
    ok: u64,
    statuses: BTreeMap<u16, u64>,
    errors: u64,
    latency: LatencyHistogram,
}

fn body(rng: &mut StdRng, v2: bool) -> String {
    let x = task::features(rng);
    let nums: Vec<String> = x.iter().map(|v| format!("{v:.4}")).collect();
    if v2 {
        format!(
            r#"{{"inputs":[{{"name":"x","shape":[1,{}],"datatype":"FP64","data":[{}]}}]}}"#,
            x.len(),
            nums.join(",")
        )
    } else {
        format!(r#"{{"instances":[[{}]]}}"#, nums.join(","))
    }
}

/// The body of synthetic request number `n`: features drawn like the
/// traffic generator's, the same for the same `n`.
pub fn body_of(n: u64, v2: bool) -> String {
    body(&mut StdRng::seed_from_u64(n), v2)
}

/// Sends traffic until the duration ends or `stop` resolves.
pub async fn run(cfg: TrafficConfig, stop: impl Future<Output = ()>) -> TrafficReport {
    let client: HttpClient = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(cfg.max_in_flight.max(1))
        .build(HttpConnector::new());
    let tally = Arc::new(Mutex::new(Tally::default()));
    let slots = Arc::new(Semaphore::new(cfg.max_in_flight.max(1)));
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let bar = cfg.progress.then(|| progress_bar(cfg.duration));
    let (mut sent, mut skipped) = (0u64, 0u64);
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = &mut stop => break,
        }
        let elapsed = started.elapsed();
        if elapsed >= cfg.duration {
            break;
        }
        let due = (elapsed.as_secs_f64() * cfg.rps) as u64;
        while sent + skipped < due {
            let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
                skipped += 1;
                continue;
            };
            sent += 1;
            let req = request(&cfg, &mut rng);
            tokio::spawn(send(client.clone(), req, Arc::clone(&tally), slot));
        }
        if let Some(b) = &bar {
            show_progress(b, elapsed, sent, &tally);
        }
    }
    // Let requests in flight finish (bounded).
    let _ = tokio::time::timeout(
        Duration::from_secs(10),
        slots.acquire_many(cfg.max_in_flight.max(1) as u32),
    )
    .await;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    report(&tally, sent, skipped, started)
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// The next request: a sticky key drawn among `cfg.keys`, then its
/// features.
fn request(cfg: &TrafficConfig, rng: &mut StdRng) -> http::Result<http::Request<Full<Bytes>>> {
    let key = rng.random_range(0..cfg.keys.max(1));
    http::Request::builder()
        .method("POST")
        .uri(&cfg.url)
        .header("content-type", "application/json")
        .header("x-rollgate-key", format!("user-{key}"))
        .body(Full::new(Bytes::from(body(rng, cfg.v2))))
}

/// Sends one request and counts what came of it (within 30 s), holding
/// its in-flight slot until then.
async fn send(
    client: HttpClient,
    req: http::Result<http::Request<Full<Bytes>>>,
    tally: Arc<Mutex<Tally>>,
    slot: OwnedSemaphorePermit,
) {
    let _slot = slot;
    let Ok(req) = req else { return };
    let t0 = Instant::now();
    let result = tokio::time::timeout(Duration::from_secs(30), async {
        let resp = client.request(req).await.ok()?;
        let status = resp.status().as_u16();
        resp.into_body().collect().await.ok()?;
        Some(status)
    })
    .await;
    let mut t = tally.lock().unwrap_or_else(|p| p.into_inner());
    match result {
        Ok(Some(s)) if (200..300).contains(&s) => {
            t.ok += 1;
            t.latency.record(t0.elapsed().as_micros() as u64);
        }
        Ok(Some(s)) => *t.statuses.entry(s).or_default() += 1,
        _ => t.errors += 1,
    }
}

/// A progress bar over the run's seconds.
fn progress_bar(duration: Duration) -> indicatif::ProgressBar {
    let b = indicatif::ProgressBar::new(duration.as_secs().max(1));
    b.set_style(
        indicatif::ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len}s {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    b
}

fn show_progress(b: &indicatif::ProgressBar, elapsed: Duration, sent: u64, tally: &Mutex<Tally>) {
    b.set_position(elapsed.as_secs());
    let t = tally.lock().unwrap_or_else(|p| p.into_inner());
    b.set_message(format!(
        "sent {sent}  ok {}  non-2xx {}  errors {}",
        t.ok,
        t.statuses.values().sum::<u64>(),
        t.errors
    ));
}

/// What happened, once the run is over.
fn report(tally: &Mutex<Tally>, sent: u64, skipped: u64, started: Instant) -> TrafficReport {
    let t = tally.lock().unwrap_or_else(|p| p.into_inner());
    let ms = |q| t.latency.percentile_us(q).map(|us| us as f64 / 1000.0);
    TrafficReport {
        sent,
        ok: t.ok,
        statuses: t.statuses.clone(),
        errors: t.errors,
        skipped,
        elapsed_s: started.elapsed().as_secs_f64(),
        p50_ms: ms(0.5),
        p95_ms: ms(0.95),
        p99_ms: ms(0.99),
    }
}
