//! Notifications: every decision sent to webhooks, in order, from the
//! audit log.
//!
//! **The audit log is the outbox.** A decision is durable once its audit
//! record is committed (in the same transaction as the decision itself);
//! each receiver has a cursor in the store, the last record it was sent.
//! The leading controller sends each receiver the records after its cursor,
//! one at a time and in order, and moves the cursor after a 2xx. So a
//! restart, a new leader or a receiver down for an hour loses nothing: the
//! receiver gets every decision afterwards, in order. Delivery is at least
//! once — a controller killed between a 2xx and the cursor's write sends
//! that record again — so every notification carries its decision's id
//! (the audit `seq`, also in `x-rollgate-delivery`) for the receiver to
//! drop a repeat.
//!
//! Signed with HMAC-SHA256 over `timestamp.body` (`x-rollgate-signature:
//! sha256=…`, `x-rollgate-timestamp`), retried with exponential back-off
//! and full jitter up to `max_backoff`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};

use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rollgate_core::Timestamp;
use rollgate_store::{AuditFilter, AuditRecord};
use serde::{Deserialize, Serialize};

use crate::reconcile::{Context, blocking};

/// The audit kinds sent when a receiver names none: every decision and
/// registry change a person would want to hear of (not evaluations, not
/// token changes).
pub const DEFAULT_KINDS: [&str; 13] = [
    "rollout_created",
    "started",
    "advanced",
    "awaiting_approval",
    "approved",
    "paused",
    "resumed",
    "promoted",
    "rolled_back",
    "aborted",
    "revision_rejected",
    "revision_unblocked",
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

/// What cannot send a notification; the receiver's fault unless said.
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    #[error("receiver answered {0}")]
    Status(u16),
    #[error("receiver unreachable: {0}")]
    Unreachable(String),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("store: {0}")]
    Store(String),
}

struct Receiver {
    hook: Webhook,
    uri: http::Uri,
    secret: Option<Vec<u8>>,
}

/// The configured receivers and their delivery state.
pub struct Notifier {
    receivers: Vec<Receiver>,
    client: Client<rollgate_net::Connector, Full<Bytes>>,
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

    fn note(&self, name: &str, f: impl FnOnce(&mut Delivery)) {
        if let Some(d) = self.lock().get_mut(name) {
            f(d);
        }
    }
}

/// Sends every receiver its notifications while this controller leads,
/// until `shutdown` resolves.
pub async fn run(
    ctx: Context,
    notifier: Arc<Notifier>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..notifier.receivers.len() {
        ctx.metrics.receiver(&notifier.receivers[i].hook.name);
        tasks.spawn(deliver(ctx.clone(), Arc::clone(&notifier), i));
    }
    shutdown.await;
    tasks.abort_all();
}

/// One receiver's loop: send what is due, wait when caught up, back off
/// on failure.
async fn deliver(ctx: Context, n: Arc<Notifier>, i: usize) {
    let name = n.receivers[i].hook.name.clone();
    let mut failing_for = 0u32;
    loop {
        if ctx.leader.fence().is_none() {
            tokio::time::sleep(ctx.tick).await;
            continue;
        }
        match send_due(&ctx, &n, i).await {
            Ok(()) => {
                failing_for = 0;
                tokio::time::sleep(ctx.tick).await;
            }
            Err(e) => {
                failing_for = failing_for.saturating_add(1);
                let store_fault = matches!(e, NotifyError::Store(_));
                tracing::warn!(receiver = %name, error = %e, failing_for, "notification not delivered; retrying");
                if !store_fault {
                    ctx.metrics.notification_failed(&name);
                }
                n.note(&name, |d| {
                    d.failures += u64::from(!store_fault);
                    d.failing_for = failing_for;
                    d.last_error = Some(e.to_string());
                });
                let wait = backoff(failing_for, n.receivers[i].hook.max_backoff, rand::random());
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// Full jitter: uniform in `[0, min(max, 1 s · 2^(failures−1))]` (`u` in
/// [0, 1)), at least 100 ms. Receivers that come back are not stampeded.
pub fn backoff(failures: u32, max: Duration, u: f64) -> Duration {
    let cap = Duration::from_secs(1)
        .saturating_mul(1u32 << failures.saturating_sub(1).min(20))
        .min(max);
    cap.mul_f64(u.clamp(0.0, 1.0))
        .max(Duration::from_millis(100).min(max))
}

/// Sends receiver `i` every record after its cursor that it wants, in
/// order, moving the cursor after each; stops at the first failure.
async fn send_due(ctx: &Context, n: &Notifier, i: usize) -> Result<(), NotifyError> {
    let r = &n.receivers[i];
    let name = r.hook.name.clone();
    let store_err = |e: crate::reconcile::Error| NotifyError::Store(e.to_string());
    let cursor = {
        let name = name.clone();
        blocking(&ctx.store, move |st| {
            Ok(match st.notify_cursor(&name)? {
                Some(c) => c,
                None => {
                    // A new receiver hears from now on, not the whole past.
                    let head = st.audit_head()?.map_or(0, |(seq, _)| seq);
                    st.set_notify_cursor(&name, head)?;
                    head
                }
            })
        })
        .await
        .map_err(store_err)?
    };
    let head = blocking(&ctx.store, |st| st.audit_head())
        .await
        .map_err(store_err)?
        .map_or(0, |(seq, _)| seq);
    ctx.metrics
        .notifications_behind(&name, head.saturating_sub(cursor));
    n.note(&name, |d| d.cursor = Some(cursor));
    let mut cursor = cursor;
    loop {
        let filter = AuditFilter {
            after_seq: Some(cursor),
            limit: Some(200),
            ..AuditFilter::default()
        };
        let page = blocking(&ctx.store, move |st| st.audit(&filter))
            .await
            .map_err(store_err)?;
        let Some(last) = page.last().map(|r| r.seq) else {
            return Ok(());
        };
        for rec in &page {
            if wants(&r.hook, &rec.kind) {
                if rec.seq > cursor + 1 {
                    // Skipped records first, so a failure below resumes here.
                    move_cursor(ctx, &name, rec.seq - 1).await?;
                }
                post(n, r, rec, ctx).await?;
                move_cursor(ctx, &name, rec.seq).await?;
                ctx.metrics.notification_sent(&name);
                let at = (ctx.clock)();
                n.note(&name, |d| {
                    d.delivered += 1;
                    d.failing_for = 0;
                    d.last_error = None;
                    d.last_delivered_at = Some(at);
                    d.cursor = Some(rec.seq);
                });
            }
            cursor = rec.seq;
        }
        move_cursor(ctx, &name, last).await?;
        n.note(&name, |d| d.cursor = Some(last));
        ctx.metrics
            .notifications_behind(&name, head.saturating_sub(last));
    }
}

async fn move_cursor(ctx: &Context, name: &str, seq: u64) -> Result<(), NotifyError> {
    let name = name.to_string();
    blocking(&ctx.store, move |st| st.set_notify_cursor(&name, seq))
        .await
        .map_err(|e| NotifyError::Store(e.to_string()))
}

fn wants(hook: &Webhook, kind: &str) -> bool {
    if hook.kinds.is_empty() {
        DEFAULT_KINDS.contains(&kind)
    } else {
        hook.kinds.iter().any(|k| k == kind)
    }
}

/// The notification of one audit record.
pub fn payload(format: Format, rec: &AuditRecord) -> serde_json::Value {
    let text = summary(rec);
    match format {
        Format::Slack => serde_json::json!({ "text": text }),
        Format::Json => serde_json::json!({
            "id": rec.seq,
            "kind": rec.kind,
            "at": rec.at,
            "model": rec.model,
            "rollout": rec.rollout,
            "actor": rec.actor,
            "summary": text,
            "body": rec.body,
        }),
    }
}

/// One line a person reads: what happened, to what, and why.
pub fn summary(rec: &AuditRecord) -> String {
    let what = match rec.rollout {
        Some(id) => format!("{}: rollout {id}", rec.model),
        None => rec.model.clone(),
    };
    let event: Option<rollgate_core::AuditEvent> = serde_json::from_value(rec.body.clone()).ok();
    let why = event.as_ref().and_then(|e| match &e.to {
        rollgate_core::Phase::RolledBack { reason } => {
            let gates = match reason {
                rollgate_core::RollbackReason::ReadinessTimeout
                | rollgate_core::RollbackReason::ApprovalTimeout { .. }
                | rollgate_core::RollbackReason::RoutingNotApplied { .. } => vec![],
                rollgate_core::RollbackReason::Breach { gates, .. }
                | rollgate_core::RollbackReason::GrossBreach { gates }
                | rollgate_core::RollbackReason::EvidenceTimeout { gates }
                | rollgate_core::RollbackReason::MetricsMissing { gates }
                | rollgate_core::RollbackReason::AnytimeBreach { gates } => gates.clone(),
            };
            let gates: Vec<String> = gates
                .iter()
                .filter_map(|g| serde_json::to_value(g).ok())
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect();
            Some(if gates.is_empty() {
                reason.code().to_string()
            } else {
                format!("{} ({})", reason.code(), gates.join(", "))
            })
        }
        rollgate_core::Phase::Canary { weight_percent, .. } => {
            Some(format!("now at {weight_percent}%"))
        }
        _ => e.note.clone(),
    });
    let note = rec
        .body
        .get("reason")
        .and_then(|r| r.as_str())
        .map(str::to_string);
    // A dry run's decisions were recorded, not taken: said first.
    let dry = if event.as_ref().is_some_and(|e| e.dry_run) {
        "[dry run] "
    } else {
        ""
    };
    match why.or(note).filter(|w| !w.is_empty()) {
        Some(w) => format!(
            "{dry}{what} {} by {}: {w}",
            rec.kind.replace('_', " "),
            rec.actor
        ),
        None => format!(
            "{dry}{what} {} by {}",
            rec.kind.replace('_', " "),
            rec.actor
        ),
    }
}

/// `sha256=` and the HMAC-SHA256 of `timestamp.body` under `key`, hex.
pub fn signature(key: &[u8], timestamp: &str, body: &[u8]) -> String {
    use hmac::{Hmac, Mac};
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

async fn post(
    n: &Notifier,
    r: &Receiver,
    rec: &AuditRecord,
    ctx: &Context,
) -> Result<(), NotifyError> {
    let body = serde_json::to_vec(&payload(r.hook.format, rec)).unwrap_or_default();
    let ts = ((ctx.clock)().0 / 1000).to_string();
    let mut req = http::Request::post(r.uri.clone())
        .header(http::header::CONTENT_TYPE, "application/json")
        .header("x-rollgate-delivery", rec.seq.to_string())
        .header("x-rollgate-event", rec.kind.as_str())
        .header("x-rollgate-timestamp", &ts);
    if let Some(key) = &r.secret {
        req = req.header("x-rollgate-signature", signature(key, &ts, &body));
    }
    let req = req
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| NotifyError::Unreachable(e.to_string()))?;
    let call = async {
        let resp = n
            .client
            .request(req)
            .await
            .map_err(|e| NotifyError::Unreachable(e.to_string()))?;
        let status = resp.status();
        // Drain (bounded) so the connection can be reused.
        let _ = http_body_util::Limited::new(resp.into_body(), 64 * 1024)
            .collect()
            .await;
        if status.is_success() {
            Ok(())
        } else {
            Err(NotifyError::Status(status.as_u16()))
        }
    };
    tokio::time::timeout(r.hook.timeout, call)
        .await
        .map_err(|_| NotifyError::Timeout(r.hook.timeout))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap_with_full_jitter() {
        let max = Duration::from_secs(300);
        assert_eq!(backoff(1, max, 1.0), Duration::from_secs(1));
        assert_eq!(backoff(4, max, 1.0), Duration::from_secs(8));
        assert_eq!(backoff(30, max, 1.0), max);
        assert_eq!(backoff(4, max, 0.5), Duration::from_secs(4));
        assert_eq!(backoff(4, max, 0.0), Duration::from_millis(100));
        assert_eq!(
            backoff(9, Duration::from_millis(50), 0.9),
            Duration::from_millis(50)
        );
    }

    #[test]
    fn a_signature_is_the_hmac_of_timestamp_dot_body() {
        let s = signature(b"Jefe", "what do ya want ", b" for nothing?");
        assert_eq!(s.len(), "sha256=".len() + 64);
        let other = signature(b"Jefe", "what do ya want ", b" for nothing!");
        assert_ne!(s, other);
        use hmac::{Hmac, Mac};
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice(b"Jefe").expect("key");
        mac.update(b"what do ya want . for nothing?");
        assert_eq!(
            s,
            format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
        );
    }

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
