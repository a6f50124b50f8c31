//! One assembly of the long-running parts for every entry point: `up`,
//! `controller`, `gateway --data` and the demo each start the subset they
//! run, the same way. The gateway and the controller meet here and in the
//! store, never in each other's crates.

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rollgate_controller::{ApiState, Context, ControllerMetrics, HttpClient};
use rollgate_core::Timestamp;
use rollgate_gateway::{Gateway, GatewayConfig};
use rollgate_store::Store;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::config::{ApiConfig, AuditConfig, ControllerConfig};
use crate::follow::PushToGateway;

/// A gateway that follows the store.
pub struct GatewayPart {
    pub listener: TcpListener,
    pub config: GatewayConfig,
    /// Names it in its stats and heartbeats (default: `gateway-<addr>`).
    pub id: Option<String>,
    /// The base URL the controller reaches its stats at (default: its
    /// listen address).
    pub advertise: Option<String>,
    pub follow_every: Duration,
}

/// The controller and the admin API.
pub struct ControlPart {
    pub listener: TcpListener,
    pub api: ApiConfig,
    pub controller: ControllerConfig,
    pub audit: AuditConfig,
    pub notify: crate::config::NotifyConfig,
    /// The data planes and credentials model specs may name.
    pub host: Arc<rollgate_controller::host::Host>,
    /// What readiness probes and gateway stats calls trust and present
    /// (the gateways' `upstream_tls`).
    pub upstream_tls: rollgate_net::ClientTls,
    pub clock: Arc<dyn Fn() -> Timestamp + Send + Sync>,
}

/// What one process runs on `store` (its data directory: `data`).
pub struct Assembly<'a> {
    pub store: Arc<dyn Store>,
    pub data: &'a Path,
    pub gateway: Option<GatewayPart>,
    pub control: Option<ControlPart>,
}

/// The started parts.
pub struct Running {
    /// The gateway's address and handle, if one runs.
    pub gateway: Option<(SocketAddr, Gateway)>,
    /// The admin API's address, if it runs.
    pub api: Option<SocketAddr>,
    /// Every task; each ends when the shutdown signal fires.
    pub tasks: Vec<JoinHandle<()>>,
}

impl Running {
    /// Waits for every part to stop.
    pub async fn join(self) {
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

/// `https` for a listener with TLS, else `http`.
pub fn scheme(tls: bool) -> &'static str {
    if tls { "https" } else { "http" }
}

/// Logs a part's failure: one part ending in error must not hide others.
async fn logged(part: &'static str, run: impl Future<Output = std::io::Result<()>>) {
    if let Err(e) = run.await {
        tracing::error!(%part, error = %e, "stopped with an error");
    }
}

/// Starts `a`'s parts; each stops when a future from `wait` resolves.
pub async fn start<W, F>(a: Assembly<'_>, wait: W) -> anyhow::Result<Running>
where
    W: Fn() -> F,
    F: Future<Output = ()> + Send + 'static,
{
    let mut tasks = Vec::new();
    let mut gateway = None;
    // The follower's withheld candidates, honoured by the controller's
    // pushes to the in-process gateway too.
    let withheld = crate::follow::Withheld::default();
    if let Some(g) = a.gateway {
        gateway = Some(start_gateway(g, &a.store, &withheld, &wait, &mut tasks).await?);
    }
    let mut api = None;
    if let Some(c) = a.control {
        let local = gateway
            .as_ref()
            .map(|(_, g)| PushToGateway(g.clone(), withheld));
        api = Some(start_control(c, &a.store, a.data, local, &wait, &mut tasks).await?);
    }
    Ok(Running {
        gateway,
        api,
        tasks,
    })
}

/// Starts a gateway that follows the store (serving once the store's
/// routes are loaded) and its follower; returns its address and handle.
async fn start_gateway<W, F>(
    g: GatewayPart,
    store: &Arc<dyn Store>,
    withheld: &crate::follow::Withheld,
    wait: &W,
    tasks: &mut Vec<JoinHandle<()>>,
) -> anyhow::Result<(SocketAddr, Gateway)>
where
    W: Fn() -> F,
    F: Future<Output = ()> + Send + 'static,
{
    let addr = g.listener.local_addr()?;
    let id = g.id.unwrap_or_else(|| format!("gateway-{addr}"));
    let tls = g.config.tls.is_some();
    let gw = Gateway::new(&GatewayConfig {
        id: id.clone(),
        models: vec![],
        ..g.config
    })?;
    // Serve only once the routes are loaded: a restarted gateway must
    // not answer 404 for models the store routes.
    // (Store calls block: off the async workers, as everywhere.)
    let (s, g2) = (Arc::clone(store), gw.clone());
    let loaded =
        tokio::task::spawn_blocking(move || crate::follow::sync_once(s.as_ref(), &g2)).await?;
    if let Err(e) = loaded {
        tracing::warn!(error = %e, "loading routes from the store failed; following it will retry");
    }
    let base = match g.advertise {
        Some(url) => url.trim_end_matches('/').to_string(),
        None => {
            if addr.ip().is_unspecified() {
                tracing::warn!(%addr, "listening on every address: set --advertise so controllers on other hosts reach this gateway's stats");
            }
            format!("{}://{addr}", scheme(tls))
        }
    };
    tasks.push(tokio::spawn(crate::follow::follow(
        Arc::clone(store),
        gw.clone(),
        id,
        format!("{base}/rollgate/stats"),
        g.follow_every,
        crate::follow::Withheld::clone(withheld),
        wait(),
    )));
    tasks.push(tokio::spawn(logged(
        "gateway",
        rollgate_gateway::serve(g.listener, gw.clone(), wait()),
    )));
    Ok((addr, gw))
}

/// Starts the controller (its notifications too, if any receiver is
/// configured) and the admin API; returns the API's address. `local`: the
/// in-process gateway, if one runs, for the controller's route pushes.
async fn start_control<W, F>(
    c: ControlPart,
    store: &Arc<dyn Store>,
    data: &Path,
    local: Option<PushToGateway>,
    wait: &W,
    tasks: &mut Vec<JoinHandle<()>>,
) -> anyhow::Result<SocketAddr>
where
    W: Fn() -> F,
    F: Future<Output = ()> + Send + 'static,
{
    let addr = c.listener.local_addr()?;
    let api_tls = match &c.api.tls {
        Some(t) => Some(t.server().map_err(|e| anyhow::anyhow!("[api.tls] {e}"))?),
        None => None,
    };
    let ctx = context(&c, store, data, local).await?;
    let state = api_state(&c, ctx.clone(), addr)?;
    rollgate_controller::api::check_binding(addr, &state).map_err(anyhow::Error::msg)?;
    if let Some(n) = ctx.notify.clone() {
        tasks.push(tokio::spawn(rollgate_controller::notify::run(
            ctx.clone(),
            n,
            wait(),
        )));
    }
    if !ctx.host.registries().is_empty() {
        tasks.push(tokio::spawn(rollgate_controller::registry::run(
            ctx.clone(),
            wait(),
        )));
    }
    tasks.push(tokio::spawn(rollgate_controller::run(ctx, wait())));
    tasks.push(tokio::spawn(logged(
        "admin API",
        rollgate_controller::api::serve(c.listener, state, api_tls, wait()),
    )));
    Ok(addr)
}

/// The controller's context from its config: the audit anchor (resumed
/// from the store), the HTTP client, retention, the lease, the notifier.
async fn context(
    c: &ControlPart,
    store: &Arc<dyn Store>,
    data: &Path,
    local: Option<PushToGateway>,
) -> anyhow::Result<Context> {
    Ok(Context {
        looks: Default::default(),
        registry_signals: Default::default(),
        anchor: {
            let (audit, data, store) = (c.audit.clone(), data.to_path_buf(), Arc::clone(store));
            tokio::task::spawn_blocking(move || {
                crate::config::anchor(&audit, &data, store.as_ref())
            })
            .await??
        },
        store: Arc::clone(store),
        http: HttpClient::with_tls(Duration::from_secs(2), &c.upstream_tls)
            .map_err(|e| anyhow::anyhow!("[gateway.upstream_tls] {e}"))?,
        gateway_ttl: c.controller.gateway_ttl,
        tick: c.controller.tick,
        clock: Arc::clone(&c.clock),
        local_gateway: local.map(|push| Arc::new(push) as _),
        metrics: Arc::new(ControllerMetrics::default()),
        retention: c
            .audit
            .retain_evaluations
            .map(|keep| Arc::new(rollgate_controller::Retention::new(keep))),
        leader: Arc::new(rollgate_controller::Leader::new(
            rollgate_controller::holder_id(),
            c.controller.lease_ttl,
        )),
        concurrency: c.controller.concurrency,
        stats: Default::default(),
        notify: if c.notify.webhooks.is_empty() {
            None
        } else {
            Some(Arc::new(
                rollgate_controller::notify::Notifier::new(&c.notify.webhooks)
                    .map_err(anyhow::Error::msg)?,
            ))
        },
        adapters: Default::default(),
        host: Arc::clone(&c.host),
    })
}

/// The admin API's state: who may call it (tokens, OIDC) and the names it
/// answers to at `addr`.
fn api_state(c: &ControlPart, ctx: Context, addr: SocketAddr) -> anyhow::Result<ApiState> {
    Ok(ApiState {
        ctx,
        token: crate::config::token(&c.api)?,
        require_token: c.api.require_token,
        oidc: match &c.api.oidc {
            Some(o) => Some(Arc::new(
                rollgate_controller::oidc::Oidc::new(o.clone()).map_err(anyhow::Error::msg)?,
            )),
            None => None,
        },
        allowed_hosts: rollgate_controller::api::allowed_hosts(addr, &c.api.allowed_hosts),
    })
}
