//! What a notification says: its body in the receiver's format, the line a
//! person reads, and the signature over it.

use rollgate_store::AuditRecord;

use super::receivers::Format;

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
                | rollgate_core::RollbackReason::RoutingNotApplied { .. }
                | rollgate_core::RollbackReason::TooFewKeys { .. } => vec![],
                rollgate_core::RollbackReason::LabelTimeout { .. } => {
                    vec![rollgate_core::GateKind::Quality]
                }
                rollgate_core::RollbackReason::Breach { gates, .. }
                | rollgate_core::RollbackReason::GrossBreach { gates }
                | rollgate_core::RollbackReason::EvidenceTimeout { gates }
                | rollgate_core::RollbackReason::MetricsMissing { gates }
                | rollgate_core::RollbackReason::AnytimeBreach { gates }
                | rollgate_core::RollbackReason::WatchRegression { gates } => gates.clone(),
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
        rollgate_core::Phase::Watching { .. } => {
            Some("watching it against the previous champion on labels".into())
        }
        _ => e.note.clone(),
    });
    // An operator's reason; what a registry's record says.
    let note = ["reason", "problem", "written"]
        .iter()
        .find_map(|k| rec.body.get(*k).and_then(|r| r.as_str()))
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
