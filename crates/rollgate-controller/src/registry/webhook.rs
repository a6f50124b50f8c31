//! MLflow's webhooks, when configured, only make the follower faster: a
//! delivery that verifies wakes its registry's poll at once. It never acts
//! by itself on what the payload says (the poll reads the aliases, the
//! source of truth), so a forged or replayed delivery can at most cause
//! one more read — and one that does not verify causes nothing.
//!
//! MLflow signs `delivery_id.timestamp.payload` with HMAC-SHA256 under
//! the webhook's secret and sends `X-MLflow-Signature: v1,<base64>`,
//! `X-MLflow-Timestamp` (Unix seconds) and `X-MLflow-Delivery-Id`. Here:
//! the signature, a timestamp within [`WINDOW`] of the controller's clock,
//! and each delivery id once (MLflow retries a delivery with the same id).

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// How far a delivery's timestamp may be from the controller's clock.
pub const WINDOW_SECS: u64 = 300;

/// How many delivery ids are remembered (the oldest forgotten first; one
/// older than [`WINDOW_SECS`] is refused by its timestamp anyway).
const REMEMBERED: usize = 10_000;

/// Why a delivery is refused: the sender's fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("missing header {0}")]
    Missing(&'static str),
    #[error("X-MLflow-Signature does not verify under the registry's webhook secret")]
    BadSignature,
    #[error("X-MLflow-Timestamp {0} is not within {WINDOW_SECS} s of the controller's clock")]
    Stale(String),
}

/// The headers a delivery carries.
#[derive(Debug, Clone, Copy)]
pub struct Delivery<'a> {
    pub id: Option<&'a str>,
    pub timestamp: Option<&'a str>,
    pub signature: Option<&'a str>,
    pub body: &'a [u8],
}

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// The MAC of `id.timestamp.body` under `secret`.
fn mac(secret: &[u8], id: &str, timestamp: &str, body: &[u8]) -> HmacSha256 {
    use hmac::Mac;
    let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

/// The signature MLflow sends for a delivery's id, timestamp and body.
pub fn sign(secret: &[u8], id: &str, timestamp: &str, body: &[u8]) -> String {
    use base64::Engine as _;
    use hmac::Mac;
    let tag = mac(secret, id, timestamp, body).finalize().into_bytes();
    format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(tag)
    )
}

/// Checks a delivery against `secret` at `now` (Unix seconds); its id.
pub fn verify<'a>(secret: &[u8], d: &Delivery<'a>, now: u64) -> Result<&'a str, Refused> {
    use base64::Engine as _;
    use hmac::Mac;
    let id = d.id.ok_or(Refused::Missing("X-MLflow-Delivery-Id"))?;
    let ts = d.timestamp.ok_or(Refused::Missing("X-MLflow-Timestamp"))?;
    let sig = d.signature.ok_or(Refused::Missing("X-MLflow-Signature"))?;
    let tag = sig
        .strip_prefix("v1,")
        .and_then(|b64| {
            base64::engine::general_purpose::STANDARD
                .decode(b64.trim())
                .ok()
        })
        .ok_or(Refused::BadSignature)?;
    // In constant time.
    mac(secret, id, ts, d.body)
        .verify_slice(&tag)
        .map_err(|_| Refused::BadSignature)?;
    let at: u64 = ts.trim().parse().map_err(|_| Refused::Stale(ts.into()))?;
    if at.abs_diff(now) > WINDOW_SECS {
        return Err(Refused::Stale(ts.into()));
    }
    Ok(id)
}

/// Delivery ids seen, bounded.
#[derive(Debug, Default)]
struct Seen {
    order: VecDeque<String>,
    set: HashSet<String>,
}

/// What the webhook endpoint and the followers share: a wake-up per
/// registry, and the delivery ids already taken.
#[derive(Debug, Default)]
pub struct Signals {
    wake: Mutex<BTreeMap<String, Arc<Notify>>>,
    seen: Mutex<Seen>,
}

impl Signals {
    /// Registry `name`'s wake-up.
    pub fn wake_of(&self, name: &str) -> Arc<Notify> {
        let mut w = self.wake.lock().unwrap_or_else(|p| p.into_inner());
        Arc::clone(w.entry(name.to_string()).or_default())
    }

    /// Takes delivery `id` for registry `name`: wakes its poll the first
    /// time; `false` for a repeat.
    pub fn deliver(&self, name: &str, id: &str) -> bool {
        let key = format!("{name}\n{id}");
        {
            let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            if !seen.set.insert(key.clone()) {
                return false;
            }
            seen.order.push_back(key);
            while seen.order.len() > REMEMBERED {
                if let Some(old) = seen.order.pop_front() {
                    seen.set.remove(&old);
                }
            }
        }
        self.wake_of(name).notify_one();
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BODY: &[u8] = br#"{"entity": "model_version_alias", "action": "created"}"#;

    fn delivery<'a>(sig: &'a str, ts: &'a str) -> Delivery<'a> {
        Delivery {
            id: Some("d1"),
            timestamp: Some(ts),
            signature: Some(sig),
            body: BODY,
        }
    }

    #[test]
    fn a_signed_fresh_delivery_verifies_and_nothing_else_does() {
        let now = 1_800_000_000;
        let ts = now.to_string();
        let good = sign(b"s3cret", "d1", &ts, BODY);
        assert!(good.starts_with("v1,"));
        assert_eq!(verify(b"s3cret", &delivery(&good, &ts), now), Ok("d1"));
        // Another secret, body, id or timestamp: refused.
        assert_eq!(
            verify(b"other", &delivery(&good, &ts), now),
            Err(Refused::BadSignature)
        );
        let mut tampered = delivery(&good, &ts);
        tampered.body = br#"{"entity": "model_version_alias", "action": "deleted"}"#;
        assert_eq!(
            verify(b"s3cret", &tampered, now),
            Err(Refused::BadSignature)
        );
        let mut other_id = delivery(&good, &ts);
        other_id.id = Some("d2");
        assert_eq!(
            verify(b"s3cret", &other_id, now),
            Err(Refused::BadSignature)
        );
        // Signed, but old (a replay) or from the future.
        let old = (now - WINDOW_SECS - 1).to_string();
        let signed_old = sign(b"s3cret", "d1", &old, BODY);
        assert_eq!(
            verify(b"s3cret", &delivery(&signed_old, &old), now),
            Err(Refused::Stale(old.clone()))
        );
        let edge = (now - WINDOW_SECS).to_string();
        let signed_edge = sign(b"s3cret", "d1", &edge, BODY);
        assert!(verify(b"s3cret", &delivery(&signed_edge, &edge), now).is_ok());
        // Missing headers are named.
        let mut bare = delivery(&good, &ts);
        bare.signature = None;
        assert_eq!(
            verify(b"s3cret", &bare, now),
            Err(Refused::Missing("X-MLflow-Signature"))
        );
    }

    #[test]
    fn the_signature_is_mlflows() {
        // What MLflow 3.17 sent for this body, id and time under "s3cret"
        // (captured from a real server, tests/mlflow/start.sh).
        let body = br#"{"entity": "model_version_alias", "action": "created", "timestamp": "2026-12-05T05:24:41.688380+00:00", "data": {"name": "fraud", "alias": "challenger", "version": "1"}}"#;
        assert_eq!(
            sign(
                b"s3cret",
                "b6095526-6a55-4f91-b706-87c3ed19dea0",
                "1796448281",
                body
            ),
            "v1,563XPVZaMcMm9z3iN66nhW4H17XEtaU4jN1nJOZSytM="
        );
    }

    #[test]
    fn each_delivery_wakes_once() {
        let s = Signals::default();
        assert!(s.deliver("mlflow", "d1"));
        assert!(!s.deliver("mlflow", "d1"));
        assert!(s.deliver("other", "d1"));
        for i in 0..REMEMBERED + 5 {
            s.deliver("mlflow", &format!("n{i}"));
        }
        let seen = s.seen.lock().expect("seen");
        assert_eq!(seen.order.len(), REMEMBERED);
        assert_eq!(seen.set.len(), REMEMBERED);
    }
}
