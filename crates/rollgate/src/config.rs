//! What the operator's configuration file declares for the control plane
//! (`rollgate up`, `rollgate controller`), read and checked: the API, the
//! controller's cadence and lease, the audit anchor, notifications.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use rollgate_store::Store;
use serde::{Deserialize, Serialize};

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
