//! `rollgate gateway --config FILE`: the data plane as its own process.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use rollgate_gateway::{Gateway, GatewayConfig, serve};

use crate::assemble::{self, Assembly, GatewayPart};

#[derive(Args, Debug)]
pub struct GatewayArgs {
    /// Gateway config (TOML): listen address, limits, mirror pool, routes.
    /// Optional with --data or --store (routes then come from the store).
    #[arg(long, required_unless_present_any = ["data", "store"])]
    config: Option<PathBuf>,
    /// Overrides `listen` from the config.
    #[arg(long)]
    listen: Option<std::net::SocketAddr>,
    /// Threads serving requests (default: one per core). `1` runs the
    /// whole gateway on one thread, the cheapest way to use one core (a
    /// sidecar, a one-CPU pod).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    threads: Option<u16>,
    /// Follow routes from the store in this data directory (and heartbeat),
    /// instead of the config's static `models`.
    #[arg(long)]
    data: Option<PathBuf>,
    /// Follow routes from this store: a `postgres://` URL (gateways on
    /// other hosts) or a SQLite data directory.
    #[arg(long, env = "ROLLGATE_STORE")]
    store: Option<String>,
    /// Gateway id for heartbeats (default: derived from the listen address).
    #[arg(long)]
    id: Option<String>,
    /// The base URL the controller reaches this gateway's stats at (default:
    /// `http://<listen address>`).
    #[arg(long)]
    advertise: Option<String>,
    /// Log lines on stderr: `text` (coloured only on a terminal) or `json`.
    #[arg(long, value_enum, default_value_t, env = "ROLLGATE_LOG_FORMAT")]
    log_format: crate::logging::LogFormat,
}

/// The gateway's runtime for `threads` (`None`: one per core). One thread
/// is tokio's current-thread runtime, not one worker of the multi-thread
/// one: no work stealing and no wake-ups across threads; measured, 22%
/// less core time per proxied request (`bench/results/gateway.md`, "One
/// thread").
pub(crate) fn runtime(threads: Option<u16>) -> anyhow::Result<tokio::runtime::Runtime> {
    let mut rt = match threads {
        Some(1) => tokio::runtime::Builder::new_current_thread(),
        Some(n) => {
            let mut rt = tokio::runtime::Builder::new_multi_thread();
            rt.worker_threads(usize::from(n));
            rt
        }
        None => tokio::runtime::Builder::new_multi_thread(),
    };
    rt.enable_all().build().context("starting the runtime")
}

/// Reads and validates a TOML config; errors name the line and the field.
pub fn load_config(path: &std::path::Path) -> anyhow::Result<GatewayConfig> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let config: GatewayConfig =
        toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    config
        .validate()
        .and_then(|()| config.check_tls_files())
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok(config)
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

pub fn run(args: &GatewayArgs) -> anyhow::Result<ExitCode> {
    let loaded = match &args.config {
        Some(path) => load_config(path),
        None => Ok(GatewayConfig::default()),
    };
    let mut config = match loaded {
        Ok(c) => c,
        Err(e) => {
            eprintln!("rollgate: {e:#}");
            return Ok(ExitCode::from(2));
        }
    };
    if let Some(l) = args.listen {
        config.listen = l;
    }
    if args.data.is_some() || args.store.is_some() {
        return gateway_following_store(
            config,
            Follow {
                data: args
                    .data
                    .clone()
                    .unwrap_or_else(|| PathBuf::from("rollgate-data")),
                store: args.store.clone(),
                id: args.id.clone(),
                advertise: args.advertise.clone(),
                every: std::time::Duration::from_millis(500),
                log_format: args.log_format,
                threads: args.threads,
            },
        );
    }
    crate::logging::init_logging(args.log_format);
    runtime(args.threads)?.block_on(async {
        let gateway = Gateway::new(&config)?;
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("binding {}", config.listen))?;
        tracing::info!(listen = %listener.local_addr()?, models = config.models.len(), "gateway serving");
        serve(listener, gateway, shutdown_signal()).await?;
        tracing::info!("gateway stopped");
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(ExitCode::SUCCESS)
}

/// Where a gateway follows the store from (`rollgate gateway --data/--store`).
#[derive(Debug, Clone)]
pub struct Follow {
    pub data: PathBuf,
    pub store: Option<String>,
    pub id: Option<String>,
    /// The URL the controller reaches this gateway at (default: its listen
    /// address), for gateways behind NAT or listening on 0.0.0.0.
    pub advertise: Option<String>,
    pub every: Duration,
    pub log_format: crate::logging::LogFormat,
    /// `rollgate gateway --threads` (see `gateway::runtime`).
    pub threads: Option<u16>,
}

/// A gateway that follows the store (used by `rollgate gateway --data/--store`).
pub fn gateway_following_store(config: GatewayConfig, f: Follow) -> anyhow::Result<ExitCode> {
    crate::logging::init_logging(f.log_format);
    // (A gateway holds no lease; its sessions get the default lease's limits.)
    let store = crate::serve::open_store(
        &f.data,
        f.store.as_deref(),
        crate::config::ControllerConfig::default().lease_ttl,
    )?;
    let (data, id, follow_every) = (f.data.as_path(), f.id, f.every);
    let advertise = f.advertise;
    runtime(f.threads)?.block_on(async move {
        let (stop, wait) = crate::serve::broadcast_shutdown();
        let listener = crate::serve::bind(config.listen, "the gateway").await?;
        let running = assemble::start(
            Assembly {
                store,
                data,
                gateway: Some(GatewayPart {
                    listener,
                    config: config.clone(),
                    id,
                    advertise,
                    follow_every,
                }),
                control: None,
            },
            wait,
        )
        .await?;
        if let Some((addr, _)) = &running.gateway {
            println!(
                "rollgate gateway: {}://{addr} following the store",
                assemble::scheme(config.tls.is_some())
            );
        }
        crate::serve::shutdown_signal().await;
        let _ = stop.send(true);
        running.join().await;
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(ExitCode::SUCCESS)
}
