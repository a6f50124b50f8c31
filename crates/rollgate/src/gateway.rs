//! `rollgate gateway --config FILE`: the data plane as its own process.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use rollgate_gateway::{Gateway, GatewayConfig, serve};

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
    log_format: crate::serve::LogFormat,
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
        return crate::serve::gateway_following_store(
            config,
            crate::serve::Follow {
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
    crate::serve::init_logging(args.log_format);
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
