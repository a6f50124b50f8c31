//! The long-running parts: `rollgate up`, `rollgate controller`, and
//! `rollgate gateway` (static routes, or following the store with `--data`).
//! The same parts run in one process or several without changing their
//! interfaces: they meet in the store.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::assemble::{self, Assembly, ControlPart, GatewayPart};
use crate::config::{ApiConfig, AuditConfig, ControllerConfig, NotifyConfig, read_toml};
use crate::logging::{LogFormat, init_logging};
use anyhow::Context as _;
use clap::Args;
use rollgate_core::Timestamp;
use rollgate_gateway::GatewayConfig;
use rollgate_store::{SqlStore, Store};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

/// `rollgate up` / `rollgate controller` configuration (TOML).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UpConfig {
    /// Where the store is: a `postgres://` URL shared by several hosts, or a
    /// SQLite data directory (default: `--data`). `--store` overrides it.
    pub store: Option<String>,
    pub api: ApiConfig,
    pub controller: ControllerConfig,
    /// The gateway; its `models` are ignored: routes come from the store.
    pub gateway: GatewayConfig,
    pub audit: AuditConfig,
    pub notify: NotifyConfig,
    /// The data planes model specs may name (`[data_planes.NAME]`): their
    /// adapters write these files and run these commands on this host.
    pub data_planes: std::collections::BTreeMap<String, rollgate_store::DataPlane>,
    /// Secret files model specs may name (`[credentials.NAME]`), each sent
    /// only to the URL declared with it.
    pub credentials: std::collections::BTreeMap<String, rollgate_controller::host::Credential>,
    /// Model registries model specs may follow (`[registries.NAME]`).
    pub registries:
        std::collections::BTreeMap<String, rollgate_controller::registry::RegistryConfig>,
}

impl UpConfig {
    /// What the host lets the API name (`[data_planes]`, `[credentials]`).
    pub fn host(&self) -> anyhow::Result<Arc<rollgate_controller::host::Host>> {
        rollgate_controller::host::Host::new(self.data_planes.clone(), self.credentials.clone())
            .and_then(|h| h.with_registries(self.registries.clone()))
            .map(Arc::new)
            .map_err(anyhow::Error::msg)
    }
}

fn system_clock() -> Timestamp {
    Timestamp(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
    )
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = ctrl_c => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = ctrl_c.await;
        }
    }
}

/// Opens the store at `location` (a `postgres://` URL or a SQLite data
/// directory), else the SQLite database in `data`; a PostgreSQL session
/// carries the limits of controllers leading by a lease of `lease_ttl`.
pub fn open_store(
    data: &Path,
    location: Option<&str>,
    lease_ttl: Duration,
) -> anyhow::Result<Arc<dyn Store>> {
    let limits = rollgate_store::SessionLimits::for_lease(lease_ttl);
    let store = match location {
        Some(l) => {
            SqlStore::open_with(l, limits).with_context(|| "opening the store".to_string())?
        }
        None => SqlStore::open_dir(data)
            .with_context(|| format!("opening the store in {}", data.display()))?,
    };
    tracing::info!(engine = store.engine(), "store open");
    Ok(Arc::new(store))
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")
}

/// A shutdown signal several tasks can wait on.
pub(crate) fn broadcast_shutdown() -> (
    watch::Sender<bool>,
    impl Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Clone,
) {
    let (tx, rx) = watch::channel(false);
    let wait = move || {
        let mut rx = rx.clone();
        Box::pin(async move {
            let _ = rx.wait_for(|v| *v).await;
        }) as std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
    };
    (tx, wait)
}

#[derive(Args, Debug)]
pub struct UpArgs {
    /// Config file (TOML): [api], [controller], [gateway].
    #[arg(long)]
    config: Option<PathBuf>,
    /// Data directory: the embedded store's database (unless --store names
    /// another), the audit key and checkpoints.
    #[arg(long, default_value = "rollgate-data")]
    data: PathBuf,
    /// The store: a `postgres://` URL (shared by gateways and controllers on
    /// many hosts) or a SQLite data directory. Default: the one in --data.
    #[arg(long, env = "ROLLGATE_STORE")]
    store: Option<String>,
    /// Log lines on stderr: `text` (coloured only on a terminal) or `json`.
    #[arg(long, value_enum, default_value_t, env = "ROLLGATE_LOG_FORMAT")]
    log_format: LogFormat,
}

/// An `up`/`controller` config file, read and checked (what only a
/// running part would otherwise find wrong, e.g. a webhook's URL).
fn read_up_config(path: &Path) -> anyhow::Result<UpConfig> {
    let c: UpConfig = read_toml(path)?;
    rollgate_controller::notify::Notifier::new(&c.notify.webhooks)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    c.host()
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    c.gateway
        .check_tls_files()
        .map_err(|e| anyhow::anyhow!("{}: [gateway] {e}", path.display()))?;
    if let Some(t) = &c.api.tls {
        t.server()
            .map_err(|e| anyhow::anyhow!("{}: [api.tls] {e}", path.display()))?;
    }
    Ok(c)
}

/// Store, gateway, controller and admin API in one process.
pub fn up(args: &UpArgs) -> anyhow::Result<ExitCode> {
    let cfg: UpConfig = match &args.config {
        // A bad file is the user's input error: exit 2, as documented.
        Some(p) => match read_up_config(p) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("rollgate: {e:#}");
                return Ok(ExitCode::from(2));
            }
        },
        None => UpConfig::default(),
    };
    init_logging(args.log_format);
    let store = open_store(
        &args.data,
        args.store.as_deref().or(cfg.store.as_deref()),
        cfg.controller.lease_ttl,
    )?;
    runtime()?.block_on(async move {
        let (stop, wait) = broadcast_shutdown();
        let gateway = bind(cfg.gateway.listen, "the gateway").await?;
        let api = bind(cfg.api.listen, "the API").await?;
        let gw_addr = gateway.local_addr()?;
        let running = assemble::start(
            Assembly {
                store,
                data: &args.data,
                gateway: Some(GatewayPart {
                    listener: gateway,
                    config: cfg.gateway.clone(),
                    id: Some(format!("up-{gw_addr}")),
                    advertise: None,
                    follow_every: cfg.controller.follow_interval,
                }),
                control: Some(control_part(&cfg, api)?),
            },
            wait,
        )
        .await?;
        let api_addr = running.api.map_or(String::new(), |a| a.to_string());
        tracing::info!(gateway = %gw_addr, api = %api_addr, "rollgate up");
        println!(
            "rollgate up: gateway {}://{gw_addr}  admin API {}://{api_addr}",
            assemble::scheme(cfg.gateway.tls.is_some()),
            assemble::scheme(cfg.api.tls.is_some())
        );
        shutdown_signal().await;
        let _ = stop.send(true);
        running.join().await;
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(ExitCode::SUCCESS)
}

/// The controller and API of `cfg`, on the wall clock.
fn control_part(cfg: &UpConfig, listener: tokio::net::TcpListener) -> anyhow::Result<ControlPart> {
    Ok(ControlPart {
        listener,
        host: cfg.host()?,
        api: cfg.api.clone(),
        controller: cfg.controller.clone(),
        audit: cfg.audit.clone(),
        notify: cfg.notify.clone(),
        upstream_tls: cfg.gateway.upstream_tls.clone(),
        clock: Arc::new(system_clock),
    })
}

pub(crate) async fn bind(addr: SocketAddr, what: &str) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {what} on {addr}"))
}

#[derive(Args, Debug)]
pub struct ControllerArgs {
    /// Data directory: the embedded store's database (unless --store names
    /// another), the audit key and checkpoints.
    #[arg(long, default_value = "rollgate-data")]
    data: PathBuf,
    /// The store: a `postgres://` URL or a SQLite data directory. Several
    /// controllers may share one: one leads, the others stand by.
    #[arg(long, env = "ROLLGATE_STORE")]
    store: Option<String>,
    /// Log lines on stderr: `text` (coloured only on a terminal) or `json`.
    #[arg(long, value_enum, default_value_t, env = "ROLLGATE_LOG_FORMAT")]
    log_format: LogFormat,
    /// Config file (TOML): [api], [controller].
    #[arg(long)]
    config: Option<PathBuf>,
    /// Overrides [api].listen.
    #[arg(long)]
    api_listen: Option<SocketAddr>,
}

/// The controller and admin API as their own process.
pub fn controller(args: &ControllerArgs) -> anyhow::Result<ExitCode> {
    let mut cfg: UpConfig = match &args.config {
        // A bad file is the user's input error: exit 2, as documented.
        Some(p) => match read_up_config(p) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("rollgate: {e:#}");
                return Ok(ExitCode::from(2));
            }
        },
        None => UpConfig::default(),
    };
    if let Some(l) = args.api_listen {
        cfg.api.listen = l;
    }
    init_logging(args.log_format);
    let store = open_store(
        &args.data,
        args.store.as_deref().or(cfg.store.as_deref()),
        cfg.controller.lease_ttl,
    )?;
    runtime()?.block_on(async move {
        let (stop, wait) = broadcast_shutdown();
        let api = bind(cfg.api.listen, "the API").await?;
        let running = assemble::start(
            Assembly {
                store,
                data: &args.data,
                gateway: None,
                control: Some(control_part(&cfg, api)?),
            },
            wait,
        )
        .await?;
        let addr = running.api.map_or(String::new(), |a| a.to_string());
        println!(
            "rollgate controller: admin API {}://{addr}",
            assemble::scheme(cfg.api.tls.is_some())
        );
        shutdown_signal().await;
        let _ = stop.send(true);
        running.join().await;
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(ExitCode::SUCCESS)
}
