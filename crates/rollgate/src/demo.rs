//! `rollgate demo`: the main job. From nothing but the toolchain: trains the
//! model zoo, starts four model servers, the gateway, the controller and the
//! admin API on free loopback ports with the embedded store, drives traffic,
//! and runs three rollouts: `retrained` (promoted), `broken-feature`
//! (refused in SHADOW, zero live exposure) and the champion's model behind a
//! ready-then-503 server (rolled back at the first canary step). Each
//! decision is shown with its evidence; the audit log is kept for inspection.
//! With `--data-plane nginx` the same rollouts run through a real nginx and
//! Prometheus (`demo_plane.rs`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;
use rollgate_core::{Phase, Plan, Timestamp};
use rollgate_gateway::GatewayConfig;
use rollgate_modelkit::model::{LinearModel, train_zoo};
use rollgate_modelkit::server::{Faults, ServerConfig};
use rollgate_modelkit::traffic::{TrafficConfig, run as run_traffic};
use rollgate_store::{DataPlaneRef, ModelSpec, RevisionSpec, SqlStore, Store};
use tokio::sync::watch;

use rollgate_core::words;

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Seed for training and traffic.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Requests per second through the gateway.
    #[arg(long, default_value_t = 400.0)]
    pub rps: f64,
    /// Shorter stages (1 s minimum instead of 3 s): for tests.
    #[arg(long)]
    pub quick: bool,
    /// Where to keep the models, the store and the audit export (default: a
    /// new directory under the system temp dir).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Decide the same three rollouts on in-process simulated traffic
    /// instead (no sockets, about a second).
    #[arg(long, conflicts_with = "data_plane")]
    pub simulated: bool,
    /// Serve the users through another data plane instead of rollgate's
    /// gateway: `nginx` (a real nginx whose weights the nginx adapter sets,
    /// mirroring to rollgate's gateway for SHADOW, and Prometheus scraping
    /// the model servers for the evidence; needs both installed).
    #[arg(long, value_enum, value_name = "KIND")]
    pub data_plane: Option<DemoDataPlane>,
}

/// The data planes `rollgate demo --data-plane` can run.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum DemoDataPlane {
    Nginx,
}

/// The demo's plan: the default gates, shorter clocks, a 2% error margin so a
/// 5% step at a few hundred requests per second decides in seconds.
fn demo_plan(quick: bool, shadow: bool) -> Plan {
    let mut p = Plan {
        min_stage_duration: Duration::from_secs(if quick { 1 } else { 3 }),
        evidence_timeout: Duration::from_secs(60),
        readiness_timeout: Duration::from_secs(10),
        ..Plan::default()
    };
    p.shadow.enabled = shadow;
    p.gates.error_rate.margin = 0.02;
    p
}

fn now() -> Timestamp {
    Timestamp(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
    )
}

fn label(p: &Phase) -> String {
    match p {
        Phase::Canary { weight_percent, .. } => format!("CANARY {weight_percent}%"),
        other => other.name().to_string(),
    }
}

async fn model_server(
    model: LinearModel,
    faults: Faults,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let cfg = ServerConfig {
        name: "fraud".into(),
        model,
        faults,
        tls: None,
    };
    tokio::spawn(rollgate_modelkit::server::serve(listener, cfg, wait(stop)));
    Ok(format!("http://{addr}"))
}

async fn wait(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|v| *v).await;
}

struct Outcome {
    name: &'static str,
    phase: Phase,
    seconds: f64,
    max_weight: u32,
}

/// Runs one rollout to its end, printing each phase change as it happens.
async fn rollout(
    store: &Arc<dyn Store>,
    name: &'static str,
    story: &str,
    candidate: &str,
    plan: &Plan,
) -> anyhow::Result<Outcome> {
    println!("\n== {name}: {story}");
    let (s, c, p) = (Arc::clone(store), candidate.to_string(), plan.clone());
    let rec =
        tokio::task::spawn_blocking(move || s.create_rollout("fraud", &c, &p, "demo")).await??;
    let started = Instant::now();
    let mut last = label(&rec.state.phase);
    let mut max_weight = 0;
    println!(
        "  t={:>5.1}s  rollout {} of {} started: {}",
        0.0, rec.id, candidate, last
    );
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (s, id) = (Arc::clone(store), rec.id);
        let r = tokio::task::spawn_blocking(move || s.rollout(id)).await??;
        max_weight = max_weight.max(r.routing.candidate_weight_bp);
        let now_label = label(&r.state.phase);
        if now_label != last {
            println!(
                "  t={:>5.1}s  {} -> {}",
                started.elapsed().as_secs_f64(),
                last,
                now_label
            );
            last = now_label;
        }
        if r.state.phase.is_terminal() {
            println!(
                "  {}",
                words::rollout_phase_line(&r.spec.plan, &r.state.phase)
            );
            if let rollgate_core::Phase::RolledBack { reason } = &r.state.phase {
                println!("  {}", words::rejection_line(reason, &r.spec.plan));
            }
            if r.state.phase == (rollgate_core::Phase::Promoted { manual: false }) {
                println!("  {}", words::promotion_line(&r.spec.plan));
            }
            if let Some(v) = &r.state.last_verdict {
                println!("  evidence ({} s into the stage):", v.elapsed_ms / 1000);
                for line in words::verdict_lines(v) {
                    println!("    {line}");
                }
            }
            return Ok(Outcome {
                name,
                phase: r.state.phase,
                seconds: started.elapsed().as_secs_f64(),
                max_weight,
            });
        }
        if started.elapsed() > Duration::from_secs(180) {
            anyhow::bail!("rollout {} did not finish in 180 s", rec.id);
        }
    }
}

pub fn run(args: &DemoArgs) -> anyhow::Result<ExitCode> {
    if args.simulated {
        return crate::sim_demo::run(args.rps, args.seed);
    }
    let tools = match args.data_plane.map(|_| crate::demo_plane::tools()) {
        None => None,
        Some(Ok(tools)) => Some(tools),
        Some(Err(missing)) => {
            eprintln!("rollgate: {missing}");
            return Ok(ExitCode::from(2));
        }
    };
    let dir = match &args.dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("rollgate-demo-{}", std::process::id())),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    println!("rollgate demo: everything under {}", dir.display());
    println!(
        "\n-- training the model zoo (linfa logistic regression, seed {})",
        args.seed
    );
    let zoo = train_zoo(&dir.join("models"), args.seed)?;
    crate::kit::print_zoo(&zoo);
    let model = |n: &str| {
        zoo.iter()
            .find(|e| e.model.name == n)
            .map(|e| e.model.clone())
            .context("zoo entry")
    };
    let (champion, retrained, broken) = (
        model("champion")?,
        model("retrained")?,
        model("broken-feature")?,
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let outcomes = rt.block_on(demo(
        args,
        &dir,
        tools.as_ref(),
        champion,
        retrained,
        broken,
    ))?;

    let ok = print_summary(&outcomes);
    let db = dir.join("data").join("rollgate.db");
    println!("\nThe audit log (every evaluation, its counts, bounds and reasons, hash-chained):");
    println!("  exported:  {}", dir.join("audit.jsonl").display());
    println!("  database:  {}", db.display());
    println!(
        "  inspect:   rollgate up --data {} &  then  rollgate audit --rollout 2",
        dir.join("data").display()
    );
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Prints each rollout's end and its live exposure; whether each ended as
/// the demo expects (`retrained` promoted, the other two rolled back).
fn print_summary(outcomes: &[Outcome]) -> bool {
    println!("\n-- summary");
    let expected = [
        ("retrained", "PROMOTED"),
        ("broken-feature", "ROLLED_BACK"),
        ("ready-then-503", "ROLLED_BACK"),
    ];
    let mut ok = true;
    for (o, (name, want)) in outcomes.iter().zip(expected) {
        let live = if o.max_weight == 0 {
            "zero live exposure".to_string()
        } else {
            format!("at most {}% of live traffic", o.max_weight / 100)
        };
        println!(
            "  {:<15} {:<12} after {:>5.1}s, {live}",
            o.name,
            o.phase.name(),
            o.seconds
        );
        ok &= o.name == name && o.phase.name() == want;
    }
    ok
}

/// The demo after training: the model servers and rollgate (and with
/// `--data-plane`, nginx and Prometheus) started, the model registered,
/// traffic driven through the three rollouts, everything stopped and the
/// audit log exported.
async fn demo(
    args: &DemoArgs,
    dir: &Path,
    tools: Option<&crate::demo_plane::Tools>,
    champion: LinearModel,
    retrained: LinearModel,
    broken: LinearModel,
) -> anyhow::Result<Vec<Outcome>> {
    let (stop, rx) = watch::channel(false);
    // nginx is declared to the controller before either starts.
    let layout = match tools {
        Some(t) => Some(crate::demo_plane::layout(t, dir)?),
        None => None,
    };
    let host = declared_host(layout.as_ref())?;
    println!("\n-- starting model servers, gateway, controller and admin API on 127.0.0.1");
    let urls = start_model_servers(champion, retrained, broken, &rx).await?;
    let store: Arc<dyn Store> = Arc::new(SqlStore::open_dir(&dir.join("data"))?);
    let running = start_rollgate(&store, dir, host, &rx).await?;
    let Some((gw_addr, gateway)) = running.gateway.clone() else {
        anyhow::bail!("the demo's gateway did not start");
    };
    let api_addr = running.api.map_or(String::new(), |a| a.to_string());
    println!("  model servers {}", urls.join(" "));
    println!("  gateway http://{gw_addr}   admin API http://{api_addr}");
    // Another data plane serves the users: the model's evidence comes from
    // Prometheus and its weights go to nginx; the gateway only measures
    // SHADOW on the copies nginx mirrors to it.
    let authority = |u: &String| u.trim_start_matches("http://").to_string();
    let plane = match (tools, &layout) {
        (Some(tools), Some(layout)) => Some(crate::demo_plane::start(
            tools,
            layout,
            &authority(&urls[0]),
            &urls.iter().map(authority).collect::<Vec<_>>(),
            &gw_addr.to_string(),
        )?),
        _ => None,
    };
    let model_spec = model_spec(plane.as_ref());

    let servers = urls.len();
    let ids = register(&store, model_spec, urls).await?;
    wait_until_routed(&gateway).await;
    if let Some(p) = &plane {
        p.scraped(servers).await?;
    }
    let users = plane
        .as_ref()
        .map_or_else(|| gw_addr.to_string(), |p| p.users.clone());
    let traffic = start_traffic(args, &users, &stop);

    let outcomes = three_rollouts(&store, &ids, args.quick).await?;

    let _ = stop.send(true);
    if let Ok(report) = traffic.await {
        print!("\n-- traffic: ");
        crate::kit::print_report(&report);
    }
    // nginx and Prometheus stopped.
    drop(plane);
    running.join().await;
    export_audit(&store, dir).await?;
    Ok(outcomes)
}

/// What the demo's controller may route through: the nginx data plane when
/// there is one, nothing else.
fn declared_host(
    layout: Option<&crate::demo_plane::Layout>,
) -> anyhow::Result<rollgate_controller::host::Host> {
    rollgate_controller::host::Host::new(
        layout
            .iter()
            .map(|l| (crate::demo_plane::PLANE.to_string(), l.data_plane.clone()))
            .collect(),
        Default::default(),
    )
    .map_err(anyhow::Error::msg)
}

/// The four model servers, by URL: the champion, `retrained`,
/// `broken-feature`, and the champion's model behind a ready-then-503 server.
async fn start_model_servers(
    champion: LinearModel,
    retrained: LinearModel,
    broken: LinearModel,
    rx: &watch::Receiver<bool>,
) -> anyhow::Result<[String; 4]> {
    Ok([
        model_server(champion.clone(), Faults::default(), rx.clone()).await?,
        model_server(retrained, Faults::default(), rx.clone()).await?,
        model_server(broken, Faults::default(), rx.clone()).await?,
        model_server(
            champion,
            Faults {
                ready_then_503: true,
                ..Faults::default()
            },
            rx.clone(),
        )
        .await?,
    ])
}

/// rollgate on `store`: a gateway following it, the controller (ticking
/// every 250 ms) and the admin API, each on a free loopback port.
async fn start_rollgate(
    store: &Arc<dyn Store>,
    dir: &Path,
    host: rollgate_controller::host::Host,
    rx: &watch::Receiver<bool>,
) -> anyhow::Result<crate::assemble::Running> {
    let data = dir.join("data");
    crate::assemble::start(
        crate::assemble::Assembly {
            store: Arc::clone(store),
            data: &data,
            gateway: Some(crate::assemble::GatewayPart {
                listener: tokio::net::TcpListener::bind("127.0.0.1:0").await?,
                config: GatewayConfig::default(),
                id: Some("demo-gateway".into()),
                advertise: None,
                follow_every: Duration::from_millis(200),
            }),
            control: Some(crate::assemble::ControlPart {
                listener: tokio::net::TcpListener::bind("127.0.0.1:0").await?,
                api: crate::config::ApiConfig::default(),
                controller: crate::config::ControllerConfig {
                    tick: Duration::from_millis(250),
                    ..Default::default()
                },
                audit: crate::config::AuditConfig {
                    checkpoints: false,
                    ..Default::default()
                },
                notify: Default::default(),
                host: Arc::new(host),
                upstream_tls: Default::default(),
                clock: Arc::new(now),
            }),
        },
        || wait(rx.clone()),
    )
    .await
}

/// The model's spec: rollgate's defaults, or with another data plane its
/// name and Prometheus as the evidence.
fn model_spec(plane: Option<&crate::demo_plane::ExternalPlane>) -> ModelSpec {
    match plane {
        Some(p) => {
            println!(
                "  nginx http://{} (serves the users; mirrors to the gateway)   Prometheus {}",
                p.users, p.prometheus_url
            );
            ModelSpec {
                prometheus: Some(p.evidence()),
                data_plane: Some(DataPlaneRef::Named(crate::demo_plane::PLANE.into())),
                ..ModelSpec::default()
            }
        }
        None => ModelSpec::default(),
    }
}

/// Registry: the model, a revision for each server (immutable), the first
/// one champion. Returns the revisions' ids.
async fn register(
    store: &Arc<dyn Store>,
    model_spec: ModelSpec,
    urls: [String; 4],
) -> anyhow::Result<Vec<String>> {
    let s = Arc::clone(store);
    tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<String>> {
        s.create_model("fraud", &model_spec, "demo")?;
        let ids = urls
            .iter()
            .map(|u| {
                let spec = RevisionSpec {
                    upstream: u.clone(),
                    ..RevisionSpec::default()
                };
                Ok(s.register_revision("fraud", &spec, "demo")?.id)
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        s.set_champion("fraud", &ids[0], "demo", "the demo's first champion")?;
        Ok(ids)
    })
    .await?
}

/// The gateway picks its routes up from the store within its follow
/// interval: traffic starts once it serves the model, so that no request
/// meets a 404 (bounded: after 5 s traffic starts regardless).
async fn wait_until_routed(gateway: &rollgate_gateway::Gateway) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !gateway.snapshot().models.contains_key("fraud") && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The users: `--rps` requests a second to `users` (host:port) over 10,000
/// sticky keys, until `stop` (at most 600 s).
fn start_traffic(
    args: &DemoArgs,
    users: &str,
    stop: &watch::Sender<bool>,
) -> tokio::task::JoinHandle<rollgate_modelkit::traffic::TrafficReport> {
    println!(
        "  traffic: {} requests/s to http://{users}/v1/models/fraud:predict, 10,000 sticky keys",
        args.rps
    );
    tokio::spawn(run_traffic(
        TrafficConfig {
            url: format!("http://{users}/v1/models/fraud:predict"),
            rps: args.rps,
            duration: Duration::from_secs(600),
            keys: 10_000,
            seed: args.seed,
            max_in_flight: 512,
            v2: false,
            progress: false,
        },
        wait(stop.subscribe()),
    ))
}

/// The three rollouts, one after the other: `retrained`, `broken-feature`
/// and `ready-then-503` (`ids`: the revisions as registered).
async fn three_rollouts(
    store: &Arc<dyn Store>,
    ids: &[String],
    quick: bool,
) -> anyhow::Result<Vec<Outcome>> {
    let mut outcomes = Vec::new();
    outcomes.push(
        rollout(
            store,
            "retrained",
            "same recipe, another sample: a healthy new version",
            &ids[1],
            &demo_plan(quick, true),
        )
        .await?,
    );
    outcomes.push(
        rollout(
            store,
            "broken-feature",
            "trained with its strongest feature dead: plausible accuracy, different answers",
            &ids[2],
            &demo_plan(quick, true),
        )
        .await?,
    );
    outcomes.push(
        rollout(
            store,
            "ready-then-503",
            "the champion's model behind a server that passes readiness, then answers 503 (plan without SHADOW)",
            &ids[3],
            &demo_plan(quick, false),
        )
        .await?,
    );
    Ok(outcomes)
}

/// Exports the audit log to `audit.jsonl` under `dir` and says whether its
/// chain is intact.
async fn export_audit(store: &Arc<dyn Store>, dir: &Path) -> anyhow::Result<()> {
    let s = Arc::clone(store);
    let out = dir.join("audit.jsonl");
    let verified =
        tokio::task::spawn_blocking(move || -> anyhow::Result<rollgate_store::ChainReport> {
            let records = s.audit(&rollgate_store::AuditFilter::default())?;
            let file = std::fs::File::create(&out)?;
            rollgate_store::write_jsonl(&records, std::io::BufWriter::new(file))?;
            Ok(s.verify_audit()?)
        })
        .await??;
    println!(
        "  audit chain: {} records, {}",
        verified.records,
        if verified.is_intact() {
            "intact"
        } else {
            "BROKEN"
        }
    );
    Ok(())
}
