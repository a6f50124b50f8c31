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
}

impl UpConfig {
    /// What the host lets the API name (`[data_planes]`, `[credentials]`).
    pub fn host(&self) -> anyhow::Result<Arc<rollgate_controller::host::Host>> {
        rollgate_controller::host::Host::new(self.data_planes.clone(), self.credentials.clone())
            .map(Arc::new)
            .map_err(anyhow::Error::msg)
    }
}

/// Where every decision is sent (docs/config.md, "Notifications").
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NotifyConfig {
    pub webhooks: Vec<rollgate_controller::notify::Webhook>,
}

/// Signed checkpoints of the audit chain (docs/api.md, "What the audit log
/// proves").
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuditConfig {
    /// Sign the chain's head after every pass that moved it.
    pub checkpoints: bool,
    /// The HMAC key (created if absent); default `<data>/audit.key`. Keep
    /// it off the database's disk for the checkpoints to mean more.
    pub checkpoint_key_file: Option<PathBuf>,
    /// Where checkpoints are appended outside the store (JSON Lines);
    /// default `<data>/checkpoints.jsonl`.
    pub checkpoint_sink: Option<PathBuf>,
    /// Evaluation records older than this lose their bodies (decisions are
    /// kept in full; the chain still verifies). Unset: kept for ever.
    #[serde(default, with = "humantime_serde")]
    pub retain_evaluations: Option<Duration>,
}

impl Default for AuditConfig {
    fn default() -> Self {
        AuditConfig {
            checkpoints: true,
            checkpoint_key_file: None,
            checkpoint_sink: None,
            retain_evaluations: None,
        }
    }
}

/// The checkpoint signer of `cfg`, resuming after the store's latest.
pub fn anchor(
    cfg: &AuditConfig,
    data: &Path,
    store: &dyn Store,
) -> anyhow::Result<Option<Arc<rollgate_controller::Anchor>>> {
    if !cfg.checkpoints {
        return Ok(None);
    }
    std::fs::create_dir_all(data)
        .with_context(|| format!("creating the data directory {}", data.display()))?;
    let key_file = cfg
        .checkpoint_key_file
        .clone()
        .unwrap_or_else(|| data.join("audit.key"));
    let key = rollgate_store::CheckpointKey::load_or_create(&key_file, rand::random)
        .map_err(anyhow::Error::msg)?;
    let sink = cfg
        .checkpoint_sink
        .clone()
        .unwrap_or_else(|| data.join("checkpoints.jsonl"));
    Ok(Some(Arc::new(rollgate_controller::Anchor::new(
        store,
        key,
        Some(sink),
    )?)))
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApiConfig {
    pub listen: SocketAddr,
    /// File holding the shared bearer token (else `ROLLGATE_TOKEN`).
    pub token_file: Option<PathBuf>,
    /// Every request must carry a token (named or shared): set it when only
    /// named tokens are used. Without a token required, requests without
    /// one are the `local` admin, which only a loopback address allows.
    pub require_token: bool,
    /// Accept OIDC tokens from this identity provider (`[api.oidc]`).
    pub oidc: Option<rollgate_controller::oidc::OidcConfig>,
    /// More `Host` names state-changing requests may use (e.g. a proxy's
    /// `rollgate.internal:443`), beside the API's own address.
    pub allowed_hosts: Vec<String>,
    /// Serve the API over TLS (HTTP/2 offered by ALPN); the certificate is
    /// reloaded when its files change.
    pub tls: Option<rollgate_net::ListenerTls>,
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 7070)),
            token_file: None,
            require_token: false,
            oidc: None,
            allowed_hosts: Vec::new(),
            tls: None,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ControllerConfig {
    /// How often each active rollout is reconciled.
    #[serde(with = "humantime_serde")]
    pub tick: Duration,
    /// Gateways silent for longer are not merged.
    #[serde(with = "humantime_serde")]
    pub gateway_ttl: Duration,
    /// How often gateways reload routes from the store and heartbeat.
    #[serde(with = "humantime_serde")]
    pub follow_interval: Duration,
    /// Several controllers may share a store: one leads by a lease of this
    /// length, renewed every third of it; a standby takes over within about
    /// this long (plus a renewal) after the leader dies.
    #[serde(with = "humantime_serde")]
    pub lease_ttl: Duration,
    /// At most this many rollouts are reconciled at once.
    pub concurrency: usize,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            tick: Duration::from_secs(1),
            gateway_ttl: Duration::from_secs(5),
            follow_interval: Duration::from_millis(500),
            lease_ttl: Duration::from_secs(6),
            concurrency: 16,
        }
    }
}

/// Reads a TOML file; errors carry the file, the line and the field.
pub fn read_toml<T: serde::de::DeserializeOwned>(path: &Path) -> anyhow::Result<T> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

pub fn token(cfg: &ApiConfig) -> anyhow::Result<Option<Arc<str>>> {
    if let Some(f) = &cfg.token_file {
        let t = std::fs::read_to_string(f)
            .with_context(|| format!("reading token file {}", f.display()))?;
        return Ok(Some(Arc::from(t.trim())));
    }
    Ok(std::env::var("ROLLGATE_TOKEN")
        .ok()
        .filter(|t| !t.trim().is_empty())
        .map(|t| Arc::from(t.trim())))
}

fn system_clock() -> Timestamp {
    Timestamp(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
    )
}

/// How the long-running commands log (to stderr).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines, coloured only on a terminal.
    #[default]
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// Installs the logger: level from `RUST_LOG` (default `info`), lines in
/// `format` on stderr; colour codes only when stderr is a terminal, never
/// into files or pipes.
pub fn init_logging(format: LogFormat) {
    use std::io::IsTerminal as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter);
    let _ = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        LogFormat::Json => builder.json().with_current_span(false).try_init(),
    };
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
fn broadcast_shutdown() -> (
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

async fn bind(addr: SocketAddr, what: &str) -> anyhow::Result<tokio::net::TcpListener> {
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
    pub log_format: LogFormat,
    /// `rollgate gateway --threads` (see `gateway::runtime`).
    pub threads: Option<u16>,
}

/// A gateway that follows the store (used by `rollgate gateway --data/--store`).
pub fn gateway_following_store(config: GatewayConfig, f: Follow) -> anyhow::Result<ExitCode> {
    init_logging(f.log_format);
    // (A gateway holds no lease; its sessions get the default lease's limits.)
    let store = open_store(
        &f.data,
        f.store.as_deref(),
        ControllerConfig::default().lease_ttl,
    )?;
    let (data, id, follow_every) = (f.data.as_path(), f.id, f.every);
    let advertise = f.advertise;
    crate::gateway::runtime(f.threads)?.block_on(async move {
        let (stop, wait) = broadcast_shutdown();
        let listener = bind(config.listen, "the gateway").await?;
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
        shutdown_signal().await;
        let _ = stop.send(true);
        running.join().await;
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(ExitCode::SUCCESS)
}
