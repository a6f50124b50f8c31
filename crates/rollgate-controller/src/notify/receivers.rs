//! The webhook receivers the config declares (`[[notify.webhooks]]`),
//! checked once, and each one's delivery as this controller saw it: what
//! the controller's [`Context`](crate::context::Context) holds of
//! notifications. It imports nothing of the controller, so the context can
//! hold it and the delivery loop can take the context.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rollgate_core::Timestamp;
use serde::{Deserialize, Serialize};

/// The audit kinds sent when a receiver names none: every decision and
/// registry change a person would want to hear of (not evaluations, not
/// token changes).
pub const DEFAULT_KINDS: [&str; 15] = [
    "rollout_created",
    "started",
    "advanced",
    "awaiting_approval",
    "approved",
    "paused",
    "resumed",
    "promoted",
    "watch_ended",
    "rolled_back",
    "aborted",
    "revision_rejected",
    "revision_unblocked",
    "registry_conflict",
    "champion_set",
];

/// How a notification's body is shaped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    /// rollgate's JSON: the decision's id, kind, model, rollout, actor,
    /// time, a one-line summary and the audit record's body (its verdict
    /// and evidence).
    #[default]
    Json,
    /// `{"text": …}`: what Slack's (and Mattermost's, Teams' workflow)
    /// incoming webhooks take.
    Slack,
}

/// One webhook receiver (`[[notify.webhooks]]`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Webhook {
    /// Names its cursor in the store: keep it when changing the URL.
    pub name: String,
    /// `http://` or `https://`.
    pub url: String,
    #[serde(default)]
    pub format: Format,
    /// Audit kinds to send (default [`DEFAULT_KINDS`]).
    #[serde(default)]
    pub kinds: Vec<String>,
    /// A file holding the HMAC key (its bytes, trimmed); unsigned without.
    #[serde(default)]
    pub secret_file: Option<std::path::PathBuf>,
    /// One attempt's limit.
    #[serde(default = "default_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// The longest wait between attempts (back-off doubles from 1 s).
    #[serde(default = "default_max_backoff", with = "humantime_serde")]
    pub max_backoff: Duration,
}

fn default_timeout() -> Duration {
    Duration::from_secs(10)
}

fn default_max_backoff() -> Duration {
    Duration::from_secs(300)
}

/// A receiver's delivery, as the API and `/metrics` show it.
#[derive(Debug, Clone, Default, Serialize, utoipa::ToSchema)]
pub struct Delivery {
    pub name: String,
    /// The last audit record it was sent (or skipped as not its kind).
    pub cursor: Option<u64>,
    /// Notifications it answered with a 2xx since this controller started.
    pub delivered: u64,
    /// Attempts that failed since this controller started.
    pub failures: u64,
    /// Failed attempts since its last success (0: healthy).
    pub failing_for: u32,
    pub last_error: Option<String>,
    pub last_delivered_at: Option<Timestamp>,
}

pub(super) struct Receiver {
    pub(super) hook: Webhook,
    pub(super) uri: http::Uri,
    pub(super) secret: Option<Vec<u8>>,
}

/// The configured receivers and their delivery state.
pub struct Notifier {
    pub(super) receivers: Vec<Receiver>,
    pub(super) client: Client<rollgate_net::Connector, Full<Bytes>>,
    status: Mutex<BTreeMap<String, Delivery>>,
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifier")
            .field("receivers", &self.receivers.len())
            .finish_non_exhaustive()
    }
}

impl Notifier {
    /// Checks the receivers (names unique, URLs http(s), secrets readable).
    pub fn new(hooks: &[Webhook]) -> Result<Notifier, String> {
        let mut receivers = Vec::new();
        let mut status = BTreeMap::new();
        for (i, hook) in hooks.iter().enumerate() {
            let at = format!("notify.webhooks[{i}]");
            if hook.name.trim().is_empty() || status.contains_key(&hook.name) {
                return Err(format!("{at}.name: must be non-empty and unique"));
            }
            if hook.name.starts_with("registry:") {
                // The cursors of registries' write-backs share the table.
                return Err(format!(
                    "{at}.name: \"registry:\" names are the model registries' cursors"
                ));
            }
            let uri: http::Uri = hook.url.parse().map_err(|e| format!("{at}.url: {e}"))?;
            if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
                return Err(format!(
                    "{at}.url: must be http:// or https://, got {}",
                    hook.url
                ));
            }
            if let Some(k) = hook.kinds.iter().find(|k| k.trim().is_empty()) {
                return Err(format!("{at}.kinds: {k:?} is not a kind"));
            }
            let secret = match &hook.secret_file {
                None => None,
                Some(p) => Some(
                    std::fs::read(p)
                        .map_err(|e| format!("{at}.secret_file {}: {e}", p.display()))?
                        .trim_ascii()
                        .to_vec(),
                ),
            };
            status.insert(
                hook.name.clone(),
                Delivery {
                    name: hook.name.clone(),
                    ..Delivery::default()
                },
            );
            receivers.push(Receiver {
                hook: hook.clone(),
                uri,
                secret,
            });
        }
        let https = rollgate_net::public_connector(HttpConnector::new());
        Ok(Notifier {
            receivers,
            client: Client::builder(TokioExecutor::new()).build(https),
            status: Mutex::new(status),
        })
    }

    /// Every receiver's delivery, by name.
    pub fn deliveries(&self) -> Vec<Delivery> {
        self.lock().values().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Delivery>> {
        self.status.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn note(&self, name: &str, f: impl FnOnce(&mut Delivery)) {
        if let Some(d) = self.lock().get_mut(name) {
            f(d);
        }
    }
}

pub(super) fn wants(hook: &Webhook, kind: &str) -> bool {
    if hook.kinds.is_empty() {
        DEFAULT_KINDS.contains(&kind)
    } else {
        hook.kinds.iter().any(|k| k == kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receivers_are_checked() {
        let hook = |name: &str, url: &str| Webhook {
            name: name.into(),
            url: url.into(),
            format: Format::Json,
            kinds: vec![],
            secret_file: None,
            timeout: default_timeout(),
            max_backoff: default_max_backoff(),
        };
        assert!(Notifier::new(&[hook("a", "http://127.0.0.1:9/x")]).is_ok());
        let e = Notifier::new(&[hook("a", "ftp://x"), hook("b", "http://x")]).expect_err("ftp");
        assert!(e.contains("notify.webhooks[0].url"), "{e}");
        let e = Notifier::new(&[hook("a", "http://x"), hook("a", "http://y")]).expect_err("dup");
        assert!(e.contains("notify.webhooks[1].name"), "{e}");
    }
}
