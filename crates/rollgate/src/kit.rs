//! `rollgate train`, `rollgate serve`, `rollgate traffic`: the model kit.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use rollgate_modelkit::model::{LinearModel, ZooEntry, train_zoo};
use rollgate_modelkit::server::{Faults, ServerConfig, serve};
use rollgate_modelkit::traffic::{TrafficConfig, TrafficReport, run};

#[derive(Args, Debug)]
pub struct TrainArgs {
    /// Directory for the model files.
    #[arg(long)]
    out: PathBuf,
    /// Seed of the synthetic task (the same seed trains the same zoo).
    #[arg(long, default_value_t = 7)]
    seed: u64,
}

pub fn train(args: &TrainArgs) -> anyhow::Result<ExitCode> {
    print_zoo(&train_zoo(&args.out, args.seed)?);
    Ok(ExitCode::SUCCESS)
}

/// The zoo as a table: each model's holdout accuracy and how it compares
/// with the champion (also printed by the demo).
pub fn print_zoo(zoo: &[ZooEntry]) {
    println!(
        "{:<16} {:>9} {:>10} {:>22}  FILE",
        "MODEL", "HOLDOUT", "AGREEMENT", "CONFIDENT FLIPS"
    );
    for e in zoo {
        println!(
            "{:<16} {:>8.1}% {:>9.1}% {:>9.1}% of {:>6}  {}",
            e.model.name,
            e.model.holdout_accuracy * 100.0,
            e.vs_champion.agreement * 100.0,
            e.vs_champion.confident_flip_rate * 100.0,
            e.vs_champion.confident,
            e.file
        );
    }
    println!(
        "(agreement and flips are against the champion on the holdout set; confident = champion at >= 90%)"
    );
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// A model file written by `rollgate train`.
    #[arg(long)]
    model: PathBuf,
    /// Address to serve on.
    #[arg(long, default_value = "127.0.0.1:9001")]
    listen: SocketAddr,
    /// The model name in request paths.
    #[arg(long, default_value = "fraud")]
    name: String,
    /// Share of predictions answered 500.
    #[arg(long, default_value_t = 0.0)]
    failure_rate: f64,
    /// Added latency of every prediction, in ms.
    #[arg(long, default_value_t = 0)]
    latency_ms: u64,
    /// Extra latency for a tail share of predictions, in ms.
    #[arg(long, default_value_t = 0)]
    tail_latency_ms: u64,
    /// Share of predictions that get the tail latency.
    #[arg(long, default_value_t = 0.0)]
    tail_fraction: f64,
    /// Readiness passes, every prediction answers 503.
    #[arg(long)]
    ready_then_503: bool,
    /// Serve HTTPS with this PEM certificate chain (needs --tls-key).
    #[arg(long, requires = "tls_key", value_name = "FILE")]
    tls_cert: Option<PathBuf>,
    /// The certificate's PEM private key.
    #[arg(long, requires = "tls_cert", value_name = "FILE")]
    tls_key: Option<PathBuf>,
}

pub fn serve_model(args: &ServeArgs) -> anyhow::Result<ExitCode> {
    for (name, v) in [
        ("--failure-rate", args.failure_rate),
        ("--tail-fraction", args.tail_fraction),
    ] {
        if !(0.0..=1.0).contains(&v) {
            eprintln!("rollgate: {name} must be in [0, 1], got {v}");
            return Ok(ExitCode::from(2));
        }
    }
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert_file), Some(key_file)) => {
            let tls = rollgate_net::ListenerTls {
                cert_file: cert_file.clone(),
                key_file: key_file.clone(),
                client_ca_file: None,
            };
            match tls.server() {
                Ok(t) => Some(t),
                Err(e) => {
                    eprintln!("rollgate: {e}");
                    return Ok(ExitCode::from(2));
                }
            }
        }
        _ => None,
    };
    let model = LinearModel::load(&args.model)?;
    let scheme = crate::assemble::scheme(tls.is_some());
    let cfg = ServerConfig {
        tls,
        name: args.name.clone(),
        model,
        faults: Faults {
            failure_rate: args.failure_rate,
            latency: Duration::from_millis(args.latency_ms),
            tail_latency: Duration::from_millis(args.tail_latency_ms),
            tail_fraction: args.tail_fraction,
            ready_then_503: args.ready_then_503,
        },
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("binding {}", args.listen))?;
        println!(
            "rollgate serve: model {} at {scheme}://{}",
            args.name,
            listener.local_addr()?
        );
        serve(listener, cfg, crate::serve::shutdown_signal()).await?;
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(ExitCode::SUCCESS)
}

#[derive(Args, Debug)]
pub struct TrafficArgs {
    /// Gateway base URL, e.g. http://127.0.0.1:8080.
    #[arg(long)]
    url: String,
    /// The model requests are for.
    #[arg(long, default_value = "fraud")]
    model: String,
    /// Requests per second (open loop: sent on schedule, answered or not).
    #[arg(long, default_value_t = 100.0)]
    rps: f64,
    /// Seconds.
    #[arg(long, default_value_t = 30)]
    duration: u64,
    /// Distinct sticky keys (users) the requests carry.
    #[arg(long, default_value_t = 10_000)]
    keys: u64,
    /// Seed of the request stream.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Send Open Inference Protocol V2 requests.
    #[arg(long)]
    v2: bool,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

pub fn print_report(r: &TrafficReport) {
    let ms = |v: Option<f64>| v.map_or("-".into(), |x| format!("{x:.2}ms"));
    println!(
        "sent {} in {:.1}s ({:.0}/s): ok {}, non-2xx {:?}, errors {}, skipped {}; latency p50 {} p95 {} p99 {}",
        r.sent,
        r.elapsed_s,
        r.sent as f64 / r.elapsed_s.max(1e-9),
        r.ok,
        r.statuses,
        r.errors,
        r.skipped,
        ms(r.p50_ms),
        ms(r.p95_ms),
        ms(r.p99_ms)
    );
}

pub fn traffic(args: &TrafficArgs) -> anyhow::Result<ExitCode> {
    if !(args.rps > 0.0 && args.rps.is_finite()) {
        eprintln!("rollgate: --rps must be positive");
        return Ok(ExitCode::from(2));
    }
    let path = if args.v2 {
        format!("/v2/models/{}/infer", args.model)
    } else {
        format!("/v1/models/{}:predict", args.model)
    };
    let cfg = TrafficConfig {
        url: format!("{}{}", args.url.trim_end_matches('/'), path),
        rps: args.rps,
        duration: Duration::from_secs(args.duration),
        keys: args.keys,
        seed: args.seed,
        max_in_flight: 1024,
        v2: args.v2,
        progress: !args.json && std::io::IsTerminal::is_terminal(&std::io::stderr()),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let report = rt.block_on(run(cfg, crate::serve::shutdown_signal()));
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_report(&report);
    }
    Ok(ExitCode::SUCCESS)
}
