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
//!
//! Here is the delivery loop; `receivers` holds what the config declares
//! and what each receiver was sent, `message` what a notification says.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use rollgate_store::{AuditFilter, AuditRecord};

use crate::context::{Context, blocking};

mod message;
pub(crate) mod receivers;

pub use message::{payload, signature, summary};
pub use receivers::{DEFAULT_KINDS, Delivery, Format, Notifier, Webhook};

use receivers::{Receiver, wants};

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
    let store_err = |e: crate::context::Error| NotifyError::Store(e.to_string());
    let cursor = {
        let name = name.clone();
        blocking(&ctx.store, move |st| cursor_of(st, &name))
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

/// The audit cursor `name` reads from: the one stored, or for a reader
/// new to the log the head, stored now (it hears from now on, not the
/// whole past). Notification receivers and registries' write-backs alike.
pub(crate) fn cursor_of(
    st: &dyn rollgate_store::Store,
    name: &str,
) -> Result<u64, rollgate_store::StoreError> {
    Ok(match st.notify_cursor(name)? {
        Some(c) => c,
        None => {
            let head = st.audit_head()?.map_or(0, |(seq, _)| seq);
            st.set_notify_cursor(name, head)?;
            head
        }
    })
}

async fn move_cursor(ctx: &Context, name: &str, seq: u64) -> Result<(), NotifyError> {
    let name = name.to_string();
    blocking(&ctx.store, move |st| st.set_notify_cursor(&name, seq))
        .await
        .map_err(|e| NotifyError::Store(e.to_string()))
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
}
